#!/usr/bin/env bash
# MPI tests of the optimizers: 1, 2 and 4 ranks on this host must reproduce the one-process simulation
# (test_mpi_optimizers); the delayed DeMo's overlapped all-gather also runs without its helper thread, and
# every all-gather also in the rounds that gathers over 2 GiB take.
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
# the overlapped all-gather without its helper thread (MPI_Iallgatherv, what a build without
# MPI_THREAD_MULTIPLE gets)
echo "== 2 ranks, LLMC_MPI_GATHER_THREAD=0"
LLMC_MPI_GATHER_THREAD=0 timeout 300 mpirun -np 2 build/test/test_mpi_optimizers
# all-gathers too large for one MPI call (over 2 GiB) go in rounds; a 1000-byte limit makes every bucket here
# take several, on both overlapped paths
echo "== 3 ranks, LLMC_MPI_GATHER_SLICE=1000"
LLMC_MPI_GATHER_SLICE=1000 timeout 300 mpirun -np 3 build/test/test_mpi_optimizers
echo "== 3 ranks, LLMC_MPI_GATHER_SLICE=1000 LLMC_MPI_GATHER_THREAD=0"
LLMC_MPI_GATHER_SLICE=1000 LLMC_MPI_GATHER_THREAD=0 timeout 300 mpirun -np 3 build/test/test_mpi_optimizers
