#!/usr/bin/env bash
# FlexDeMo and sharded AdamW (--shard_group_size): the optimizer-level MPI test (test_mpi_flexdemo: the sharded steps
# against their flat twins, bit for bit, the transport's groups, the weight check, state round trips) on 2 and 4
# ranks, then the CPU trainer end to end (test/e2e/flexdemo_checks.py). Skips without mpirun.
set -euo pipefail
cd "$(dirname "$0")/../.."
command -v mpirun >/dev/null || { echo "SKIP: mpirun not installed"; exit 77; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export OMP_NUM_THREADS=1
for np in 2 4; do
  echo "== test_mpi_flexdemo, $np ranks"
  timeout 300 mpirun -np "$np" build/test/test_mpi_flexdemo
done
data/prepare_default.sh >/dev/null
exec /usr/bin/python3 test/e2e/flexdemo_checks.py
