#!/usr/bin/env bash
# Compares the C++ GPT-2 and AdamW with the independent PyTorch reference (dev/reference/gpt2_reference.py) on
# a tiny model (B=4, T=32), the same with targets -1 (no target: every row's last and all of row 1, torch's
# ignore_index) and on GPT-2 124M (B=4, T=64). The reference files go to build/reference/<name>/
# and are written again only when missing or older than the generator or this script (d12's take ~1 GB and
# the longest part of the run). Skips when /usr/bin/python3 has no torch. check_model_vs_torch.cpp compares.
set -euo pipefail
cd "$(dirname "$0")/../.."

python=/usr/bin/python3
generator=dev/reference/gpt2_reference.py
binary=build/test/check_model_vs_torch
if ! "$python" -c "import torch" 2>/dev/null; then
  echo "SKIP: $python cannot import torch (Debian's python3-torch provides it)"
  exit 77
fi
if [[ ! -x "$binary" ]]; then
  echo "error: $binary is not built (make $binary)"
  exit 1
fi

# generate NAME CONFIG B T [ARGS...]: writes build/reference/NAME/{model.bin,state.bin} unless they are up to date
generate() {
  local name="$1" config="$2" batch="$3" seq="$4" dir="build/reference/$1"
  shift 4
  if [[ -f "$dir/model.bin" && -f "$dir/state.bin" && "$dir/state.bin" -nt "$generator" && "$dir/state.bin" -nt "$0" ]]; then
    echo "reference $name: up to date in $dir"
    return
  fi
  echo "reference $name: writing $dir (B=$batch T=$seq $*)"
  rm -f "$dir/model.bin" "$dir/state.bin"
  "$python" "$generator" --config "$config" --batch "$batch" --seq "$seq" --seed 1337 --out-dir "$dir" "$@"
}

generate tiny tiny 4 32
generate tiny_masked tiny 4 32 --mask-targets
generate d12 d12 4 64
"$binary" build/reference/tiny build/reference/tiny_masked build/reference/d12
