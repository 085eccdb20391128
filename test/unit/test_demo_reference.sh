#!/usr/bin/env bash
# DeMo optimizer vs the independent Python reference (dev/reference/demo_reference.py): the C++ test binary
# writes the cases (awkward shapes, 1/2/4 simulated ranks, 6 steps, every option), the reference runs them
# with dense float32 torch tensors, and the binary compares parameters and every rank's momentum (tolerances
# are explained in test/unit/test_demo_optimizer.cpp, check_case). Skips without the binary or without
# /usr/bin/python3 with numpy and torch.
set -eu
cd "$(dirname "$0")/../.."
bin=build/test/test_demo_optimizer
py=/usr/bin/python3
[[ -x "$bin" ]] || { echo "SKIP: $bin not built (make $bin)"; exit 77; }
"$py" -c "import numpy, torch" 2>/dev/null || { echo "SKIP: $py lacks numpy/torch"; exit 77; }
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
cases=()
for name in $("$bin" --write-cases "$dir"); do cases+=("$dir/$name"); done
OMP_NUM_THREADS=1 "$py" dev/reference/demo_reference.py "${cases[@]}"
"$bin" --check-cases "$dir"
