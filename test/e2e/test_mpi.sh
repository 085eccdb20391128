#!/usr/bin/env bash
# MPI tests of the optimizers: 1, 2 and 4 ranks on this host must reproduce the one-process simulation
# (test_mpi_optimizers); the overlapped collectives (DeMo's delayed all-gather, AdamW-DDP's all-reduce during
# the backward) also run without their helper threads, and every all-reduce also in the slices that buffers
# over 2^24 elements take.
# Skips when Open MPI's mpirun is not installed.
set -euo pipefail
cd "$(dirname "$0")/../.."
command -v mpirun >/dev/null || { echo "SKIP: mpirun not installed"; exit 77; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export OMP_NUM_THREADS=1
for np in 1 2 4; do
  echo "== $np rank(s)"
  timeout 300 mpirun -np "$np" build/test/test_mpi_optimizers
done
# the overlapped collectives without helper threads (the all-gather's messages posted in start() and waited for
# in finish(), the all-reduce inside finish(): what an MPI without MPI_THREAD_MULTIPLE gets)
echo "== 2 ranks, --mpi_helper_threads false"
timeout 300 mpirun -np 2 build/test/test_mpi_optimizers --mpi_helper_threads false
# all-reduces go in slices of 2^24 elements, and every message in pieces of at most 64 KB; limits of 1000
# elements and 100 bytes (25 floats, 50 bf16 values) make every buffer here take several of both, on both
# overlapped paths, with 3 overlapped starts in flight instead of 2
small=(--mpi_reduce_slice 1000 --mpi_message_bytes 100 --mpi_reduce_jobs 3)
echo "== 3 ranks, ${small[*]}"
timeout 300 mpirun -np 3 build/test/test_mpi_optimizers "${small[@]}"
echo "== 3 ranks, the same with --mpi_helper_threads false"
timeout 300 mpirun -np 3 build/test/test_mpi_optimizers "${small[@]}" --mpi_helper_threads false
