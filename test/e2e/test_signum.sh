#!/usr/bin/env bash
# Signum with majority vote (--optimizer signum): test_mpi_signum's cases against the PyTorch reference
# dev/reference/signum_reference.py at 1, 2 and 4 ranks (parameters after every step, every rank's momentum, every
# rank's weights bit for bit, exact ties), its unit tests on 2 and 4 ranks, then the CPU trainer end to end
# (test/e2e/signum_checks.py). Skips without mpirun, the binaries, or /usr/bin/python3 with numpy and torch.
set -euo pipefail
cd "$(dirname "$0")/../.."
bin=build/test/test_mpi_signum
py=/usr/bin/python3
command -v mpirun >/dev/null || { echo "SKIP: mpirun not installed"; exit 77; }
[[ -x "$bin" && -x train_gpt_cpu ]] || { echo "SKIP: $bin or train_gpt_cpu not built (make $bin train_gpt_cpu)"; exit 77; }
"$py" -c "import numpy, torch" 2>/dev/null || { echo "SKIP: $py lacks numpy/torch"; exit 77; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export OMP_NUM_THREADS=1
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
cases=()
for name in $("$bin" --write-cases "$dir"); do cases+=("$dir/$name"); done
"$py" dev/reference/signum_reference.py "${cases[@]}"
for np in 1 2 4; do
  echo "== reference cases, $np rank(s)"
  timeout 120 mpirun -np "$np" "$bin" --check-cases "$dir"
done
for np in 2 4; do
  echo "== test_mpi_signum, $np ranks"
  timeout 120 mpirun -np "$np" "$bin"
done
data/prepare_default.sh >/dev/null
exec "$py" test/e2e/signum_checks.py
