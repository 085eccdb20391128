#!/usr/bin/env bash
# Compares the C++ OLMo, AdamW and DeMo with the independent PyTorch OLMo (dev/reference/olmo_reference.py, its
# DeMo steps from dev/reference/demo_reference.py) through check_model_vs_torch.cpp: logits, loss, every gradient
# and 10 AdamW steps on a tiny OLMo with LayerNorm and with RMSNorm (L=2, H=4, C=64, B=4, T=32, the NeoX
# vocabulary of 50280 in 50304 rows), the RMSNorm one with targets -1 (no target: every row's last, as OLMo's rows
# end, and all of row 1; torch's ignore_index), and on the 300M model's width with two layers (C=1024, H=8, B=2,
# T=64);
# and 10 DeMo steps of the tiny RMSNorm model on 1 and 2 simulated ranks, each rank on its own batch. The
# reference files go to build/reference/olmo_*/ and are written again only when missing or older than a
# generator or this script. Skips when /usr/bin/python3 has no torch.
set -euo pipefail
cd "$(dirname "$0")/../.."

python=/usr/bin/python3
generator=dev/reference/olmo_reference.py
binary=build/test/check_model_vs_torch
if ! "$python" -c "import torch" 2>/dev/null; then
  echo "SKIP: $python cannot import torch (Debian's python3-torch provides it)"
  exit 77
fi
if [[ ! -x "$binary" ]]; then
  echo "error: $binary is not built (make $binary)"
  exit 1
fi
# Another process may share the two cores: OpenMP threads that spin while they wait then make both sides ~3x
# slower. Waiting passively changes no result.
export OMP_WAIT_POLICY=passive

# generate NAME ARGS...: writes build/reference/NAME/ with the generator's ARGS unless it is up to date
generate() {
  local name="$1" dir="build/reference/$1" newest
  shift
  newest=$(ls -t "$generator" dev/reference/demo_reference.py dev/reference/gpt2_reference.py "$0" | head -1)
  if [[ -f "$dir/model.bin" && -f "$dir/state.bin" && "$dir/state.bin" -nt "$newest" ]]; then
    echo "reference $name: up to date in $dir"
    return
  fi
  echo "reference $name: writing $dir ($*)"
  rm -rf "$dir"
  "$python" "$generator" "$@" --seed 1337 --out-dir "$dir"
}

generate olmo_tiny_ln --norm layernorm
generate olmo_tiny_rms --norm rmsnorm --demo-ranks 1 2
generate olmo_tiny_rms_masked --norm rmsnorm --mask-targets
# lr 1e-5: at 1e-4 this width memorises the 128 tokens within 6 steps, and losses near 0 compare badly
generate olmo_w1024 --norm layernorm --channels 1024 --heads 8 --layers 2 --batch 2 --seq 64 --lr 1e-5
"$binary" build/reference/olmo_tiny_ln build/reference/olmo_tiny_rms build/reference/olmo_tiny_rms_masked \
  build/reference/olmo_w1024
