#!/usr/bin/env bash
# MPI tests of the optimizers: 1, 2 and 4 ranks on this host must reproduce the one-process simulation
# (test_mpi_optimizers); the overlapped collectives (DeMo's delayed all-gather, AdamW-DDP's all-reduce during
# the backward) also run without their helper threads, and every all-gather also in the rounds that gathers
# over 2 GiB take.
# Skips when Open MPI's mpirun is not installed.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v mpirun >/dev/null || { echo "SKIP: mpirun not installed"; exit 77; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export OMP_NUM_THREADS=1
for np in 1 2 4; do
  echo "== $np rank(s)"
  timeout 300 mpirun -np "$np" build/test/test_mpi_optimizers
done
# the overlapped collectives without helper threads (MPI_Iallgatherv, and the all-reduce inside finish():
# what an MPI without MPI_THREAD_MULTIPLE gets)
echo "== 2 ranks, LLMC_MPI_COMM_THREAD=0"
LLMC_MPI_COMM_THREAD=0 timeout 300 mpirun -np 2 build/test/test_mpi_optimizers
# all-gathers too large for one MPI call (over 2 GiB) go in rounds, and all-reduces in rounds of 2^24 elements;
# limits of 1000 bytes and 1000 elements make every buffer here take several, on both overlapped paths
export LLMC_MPI_GATHER_SLICE=1000 LLMC_MPI_REDUCE_SLICE=1000
echo "== 3 ranks, LLMC_MPI_GATHER_SLICE=1000 LLMC_MPI_REDUCE_SLICE=1000"
timeout 300 mpirun -np 3 build/test/test_mpi_optimizers
echo "== 3 ranks, the same with LLMC_MPI_COMM_THREAD=0"
LLMC_MPI_COMM_THREAD=0 timeout 300 mpirun -np 3 build/test/test_mpi_optimizers
