#!/usr/bin/env bash
# Compares the C++ GPT-2 and AdamW with the independent PyTorch reference (dev/reference/gpt2_reference.py) on
# a tiny model (B=4, T=32) and on GPT-2 124M (B=4, T=64). The reference files go to build/reference/<config>/
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

# generate CONFIG B T: writes build/reference/CONFIG/{model.bin,state.bin} unless they are up to date
generate() {
  local config="$1" batch="$2" seq="$3" dir="build/reference/$1"
  if [[ -f "$dir/model.bin" && -f "$dir/state.bin" && "$dir/state.bin" -nt "$generator" && "$dir/state.bin" -nt "$0" ]]; then
    echo "reference $config: up to date in $dir"
    return
  fi
  echo "reference $config: writing $dir (B=$batch T=$seq)"
  rm -f "$dir/model.bin" "$dir/state.bin"
  "$python" "$generator" --config "$config" --batch "$batch" --seq "$seq" --seed 1337 --out-dir "$dir"
}

generate tiny 4 32
generate d12 4 64
"$binary" build/reference/tiny build/reference/d12
