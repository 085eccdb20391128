#!/usr/bin/env bash
# End-to-end speed of the CUDA trainer on the DeMo paper's 300M OLMo (configs/paper_300m.json) at its sequence
# length 2048 on one GPU: AdamW-DDP and DeMo (top-k 32), each at the largest micro-batch of B_LIST that fits (the
# first that starts). Prints per run the median step time after warm-up, tokens/s and the trainer's own MFU
# (llm.c's 6N + 6LCT flops per token against --peak_tflops), and DeMo's step time over AdamW's (issue targets:
# MFU >= 45%, DeMo within 3%). The data is the default corpus (GPT-2 token ids, all below OLMo's 50280).
#   dev/cuda/bench_olmo.sh [steps=20]        B_LIST="16 12 8 4" PEAK_TFLOPS=989.4 (H100/H200 SXM dense bf16)
# Needs ./train_gpt (make train_gpt) and data/default (data/prepare_default.sh). Exit 77 without a GPU.
set -euo pipefail
cd "$(dirname "$0")/../.."
STEPS=${1:-20} T=2048
PEAK_TFLOPS=${PEAK_TFLOPS:-989.4}
PY=${PYTHON:-python3}
out=${BENCH_OUT:-build/bench-olmo}
if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then
  echo "no CUDA device: OLMo benchmark skipped"
  exit 77
fi
[[ -x ./train_gpt ]] || { echo "bench_olmo: error: ./train_gpt not built (make train_gpt)" >&2; exit 1; }
mkdir -p "$out"
: >"$out/summary.txt"

run_at_largest_batch() {  # run_at_largest_batch <label> <optimizer> [flags]
  local label=$1 opt=$2 B; shift 2
  for B in ${B_LIST:-16 12 8 4}; do
    rm -rf "${out:?}/$label"
    if ./train_gpt --config configs/paper_300m.json --batch_size "$B" --seq_len "$T" --steps "$STEPS" \
        --optimizer "$opt" --val_every 0 --val_data= --sample_every 0 --checkpoint_every -1 --log_every 5 \
        --peak_tflops "$PEAK_TFLOPS" --out_dir "$out/$label" "$@" >"$out/$label.log" 2>&1; then
      "$PY" - "$label" "$out/$label/metrics.jsonl" "$B" <<'PY' | tee -a "$out/summary.txt"
import json, statistics, sys
label, path, B = sys.argv[1], sys.argv[2], int(sys.argv[3])
rows = [json.loads(l) for l in open(path) if '"type":"train"' in l]
rows = rows[5:] if len(rows) > 10 else rows[1:]
ms = statistics.median(r["step_ms"] for r in rows)
mfu = statistics.median(r["mfu"] for r in rows) if all("mfu" in r for r in rows) else float("nan")
print(f"RESULT olmo-300m {label} B={B} T=2048: step {ms:.1f} ms | {B * 2048 / (ms / 1000):,.0f} tok/s | "
      f"MFU {100 * mfu:.1f}%")
print(f"STEPMS {label} {ms:.4f}")
PY
      FIT_B=$B
      return 0
    fi
    grep -qi "out of memory\|cudaErrorMemoryAllocation\|cannot allocate" "$out/$label.log" ||
      { echo "bench_olmo: train_gpt $label B=$B failed:"; tail -5 "$out/$label.log"; return 1; }
    echo "bench_olmo: $label B=$B does not fit, trying a smaller micro-batch"
  done
  echo "bench_olmo: $label: no micro-batch of B_LIST fits"
  return 1
}

nvidia-smi -L
run_at_largest_batch adamw adamw
B_LIST=$FIT_B run_at_largest_batch demo demo --demo_topk 32  # the same batch, for a like-for-like ratio
a=$(awk '$1 == "STEPMS" && $2 == "adamw" {print $3}' "$out/summary.txt")
d=$(awk '$1 == "STEPMS" && $2 == "demo" {print $3}' "$out/summary.txt")
awk -v a="$a" -v d="$d" 'BEGIN { printf "RESULT olmo-300m DeMo step / AdamW step = %.4f (%+.1f%%; target within +3%%)\n", d / a, 100 * (d / a - 1) }'
