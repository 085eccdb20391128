#!/usr/bin/env bash
# MPI tests of the optimizers: 1, 2 and 4 ranks on this host must reproduce the one-process simulation
# (test_mpi_optimizers). Skips when Open MPI's mpirun is not installed.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v mpirun >/dev/null || { echo "SKIP: mpirun not installed"; exit 77; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export OMP_NUM_THREADS=1
for np in 1 2 4; do
  echo "== $np rank(s)"
  timeout 300 mpirun -np "$np" build/test/test_mpi_optimizers
done
