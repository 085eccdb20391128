#!/usr/bin/env bash
# End-to-end speed of the CUDA trainer: GPT-2 124M (configs/d12.json) from scratch on the default corpus, one
# GPU, AdamW-DDP and DeMo (top-k 32) at the same batch. Prints, per run, the median step time over the steps
# after warm-up, tokens/s and MFU (llm.c's estimate: 6N + 6LCT flops per token against the GPU's dense bf16
# peak, so the figures compare with llm.c's printout), the optimizer's own time per step, and DeMo's step time
# relative to AdamW's (issue target: within 5%). The first two runs use the trainer's defaults (flash
# attention; on Hopper both GELU epilogues); then both optimizers with --attention matmul (cuBLASLt +
# softmax attention), and AdamW with --gelu_fusion forward (the forward GELU epilogue only), so every default is
# timed against its alternative, and DeMo with its other kernel choices: --demo_dct tensor (the compress
# kernel's DCTs on the tensor cores), --demo_momentum_domain dct (the momentum in the DCT domain) and both, and
# --optimizer topk (the same kernels without their DCTs) against DeMo. When
# LLMC_UPSTREAM names a built llm.c train_gpt2cu, it runs that too, at the same batch and data, for a same-GPU
# baseline. AdamW also runs with --flash_dq shares_last (the flash backward's per-pair dQ shares summed by the
# last key tile to write, not by a second kernel: the same bits), --flash_dq atomic (dQ summed across blocks in
# L2 by atomic adds instead of through the shares) and --flash_dq shares_bf16 (the shares in bf16: half their
# traffic), with --matmul_tune true (each matmul's algorithm the fastest of cuBLASLt's
# candidates), with --cuda_graph true (each micro-step one CUDA graph; DeMo too) and with --bias_grad epilogue
# (the qkv and fc bias gradients from cuBLASLt's BGRADB epilogue, not a column reduction). BENCH_QUICK=1 runs only
# the default-attention runs (AdamW, its three dQ runs, its tuned matmuls, graphs and bias epilogue, DeMo's four
# kernel choices and graphs, and topk), for
# short GPU sessions. BENCH_DEMO_TUNINGS="2 8" adds a DeMo run per listed tuning of the DeMo kernels
# (--demo_kernel_tuning: the kernel lab's candidates in whole steps), right
# after the default DeMo run.
#   dev/cuda/bench_train_gpt.sh [B=16] [T=1024] [steps=30]
# Needs ./train_gpt (make train_gpt) and data/default (data/prepare_default.sh). Exit 77 without a GPU.
set -euo pipefail
cd "$(dirname "$0")/../.."
B=${1:-16} T=${2:-1024} STEPS=${3:-30}
PEAK_TFLOPS=${PEAK_TFLOPS:-989.4}   # H100/H200 SXM dense bf16, the figure llm.c uses for MFU
PY=${PYTHON:-python3}
out=${BENCH_OUT:-build/bench-train-gpt}

if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then
  echo "no CUDA device: train_gpt benchmark skipped"
  exit 77
fi
[[ -x ./train_gpt ]] || { echo "bench_train_gpt: error: ./train_gpt not built (make train_gpt)" >&2; exit 1; }
ls data/default/default_train_*.bin >/dev/null 2>&1 ||
  { echo "bench_train_gpt: error: no shards in data/default (bash data/prepare_default.sh)" >&2; exit 1; }
mkdir -p "$out"

summarize() {  # summarize <label> <metrics.jsonl>
  "$PY" - "$1" "$2" "$B" "$T" "$PEAK_TFLOPS" <<'EOF'
import json, statistics, sys
label, path, B, T, peak = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5])
rows = [json.loads(l) for l in open(path) if '"type":"train"' in l]
rows = rows[5:] if len(rows) > 10 else rows[1:]          # drop warm-up steps (allocation, cuBLASLt autotune)
ms = statistics.median(r["step_ms"] for r in rows)
opt = {k: statistics.median(r.get("opt_ms", {}).get(k, 0.0) for r in rows) for k in rows[0].get("opt_ms", {})}
N, L, C = 124475904, 12, 768                             # d12 parameters (padded vocab, as llm.c counts them)
flops_per_token = 6 * N + 6 * L * C * T
tok_s = B * T / (ms / 1000)
mfu = flops_per_token * tok_s / (peak * 1e12)
opt_s = " ".join(f"{k} {v:.2f}" for k, v in opt.items() if v > 0)
# the trainer's own figure (its median step's mfu: against its peak table or --peak_tflops), a cross-check
own = statistics.median(r["mfu"] for r in rows) if all("mfu" in r for r in rows) else None
own_s = f" (trainer: {100 * own:.1f}%)" if own is not None else ""
print(f"RESULT {label}: step {ms:.2f} ms | {tok_s:,.0f} tok/s | MFU {100 * mfu:.1f}%{own_s} | optimizer ms: {opt_s}")
print(f"STEPMS {label} {ms:.4f}")
EOF
}

run_ours() {  # run_ours <label> <optimizer> [flags]: the flags (kernel switches too) pass through to train_gpt
  local label=$1 opt=$2; shift 2
  rm -rf "${out:?}/$label"
  ./train_gpt --config configs/d12.json --batch_size "$B" --seq_len "$T" --steps "$STEPS" \
    --optimizer "$opt" --val_every 0 --val_data= --sample_every 0 --checkpoint_every -1 --log_every 10 \
    --out_dir "$out/$label" "$@" >"$out/$label.log" 2>&1 ||
    { echo "bench_train_gpt: train_gpt $label failed:"; tail -5 "$out/$label.log"; return 1; }
  summarize "train_gpt $label" "$out/$label/metrics.jsonl" | tee -a "$out/summary.txt"
  grep -o 'activations [0-9]* MiB' "$out/$label.log" | head -1 | sed "s/^/MEMORY train_gpt $label: /"
}
ratio() {  # ratio <label a> <label b> <what>: b's step time over a's
  local a b
  a=$(awk -v l="$1" '$1 == "STEPMS" && $3 == l {print $4}' "$out/summary.txt")
  b=$(awk -v l="$2" '$1 == "STEPMS" && $3 == l {print $4}' "$out/summary.txt")
  awk -v a="$a" -v b="$b" -v w="$3" 'BEGIN { printf "RESULT %s = %.4f (%+.1f%%)\n", w, b / a, 100 * (b / a - 1) }'
}

: >"$out/summary.txt"
nvidia-smi -L
run_ours adamw adamw
run_ours demo demo --demo_topk 32
ratio adamw demo "DeMo step / AdamW step (target within +5%)"
run_ours adamw-lastdq adamw --flash_dq shares_last
ratio adamw adamw-lastdq "AdamW step with --flash_dq shares_last / with the dQ shares' sum kernel (default)"
run_ours adamw-atomicdq adamw --flash_dq atomic
ratio adamw adamw-atomicdq "AdamW step with --flash_dq atomic / with the dQ shares (default)"
run_ours adamw-bf16dq adamw --flash_dq shares_bf16
ratio adamw adamw-bf16dq "AdamW step with --flash_dq shares_bf16 / with the fp32 dQ shares (default)"
run_ours adamw-matmultune adamw --matmul_tune true
ratio adamw adamw-matmultune "AdamW step with --matmul_tune true / with cuBLASLt's first algorithms (default)"
run_ours adamw-cudagraph adamw --cuda_graph true
ratio adamw adamw-cudagraph "AdamW step with --cuda_graph true / with every kernel launched (default)"
run_ours adamw-biasgrad adamw --bias_grad epilogue
ratio adamw adamw-biasgrad "AdamW step with --bias_grad epilogue / with the bias gradients' column reductions (default)"
run_ours demo-cudagraph demo --demo_topk 32 --cuda_graph true
ratio demo demo-cudagraph "DeMo step with --cuda_graph true / with every kernel launched (default)"
for tuning in ${BENCH_DEMO_TUNINGS:-}; do
  run_ours "demo-tuning$tuning" demo --demo_topk 32 --demo_kernel_tuning $tuning
  ratio adamw "demo-tuning$tuning" "DeMo step with --demo_kernel_tuning=$tuning / AdamW step"
done
run_ours demo-tensordct demo --demo_topk 32 --demo_dct tensor
ratio adamw demo-tensordct "DeMo step with --demo_dct tensor / AdamW step"
run_ours demo-dctmomentum demo --demo_topk 32 --demo_momentum_domain dct
ratio adamw demo-dctmomentum "DeMo step with --demo_momentum_domain dct / AdamW step"
run_ours demo-tensordct-dctmomentum demo --demo_topk 32 --demo_dct tensor --demo_momentum_domain dct
ratio adamw demo-tensordct-dctmomentum "DeMo step with --demo_dct tensor --demo_momentum_domain dct / AdamW step"
run_ours topk topk --demo_topk 32
ratio demo topk "topk step (DeMo's kernels without their DCTs) / DeMo step"
[[ ${BENCH_QUICK:-0} == 1 ]] && exit 0
run_ours adamw-matmul adamw --attention matmul
run_ours demo-matmul demo --demo_topk 32 --attention matmul
ratio adamw-matmul demo-matmul "DeMo step / AdamW step, matmul attention (target within +5%)"
ratio adamw-matmul adamw "AdamW step with flash attention (default) / with matmul attention"
run_ours adamw-gelu1 adamw --gelu_fusion forward
ratio adamw-gelu1 adamw "AdamW step with both GELU epilogues (default on Hopper) / the forward one only"
run_ours demo-delay demo --demo_topk 32 --demo_delay 1
ratio demo demo-delay "DeMo step with --demo_delay 1 (eager) / without (one GPU hides nothing: the cost of its own-share apply)"
run_ours demo-delay-stale demo --demo_topk 32 --demo_delay 1 --demo_eager false
ratio demo demo-delay-stale "DeMo step with --demo_delay 1 --demo_eager false / without (the same passes: should be ~1)"

if [[ -n ${LLMC_UPSTREAM:-} && -x $LLMC_UPSTREAM ]]; then
  # llm.c's own trainer (train_gpt2cu, bf16, no cuDNN) on the same shards: d12 from scratch, same B and T, no
  # validation (-m 0), sampling or checkpoints. Its step times go through the same MFU formula as ours.
  "$LLMC_UPSTREAM" -i 'data/default/default_train_*.bin' -j 'data/default/default_val_*.bin' -e d12 \
    -b "$B" -t "$T" -d $((B * T)) -x "$STEPS" -v 100000 -m 0 -s 0 -n 0 -h 0 -o "$out/llmc" >"$out/llmc.log" 2>&1 ||
    { echo "bench_train_gpt: llm.c run failed:"; tail -5 "$out/llmc.log"; exit 1; }
  "$PY" - "$out/llmc.log" "$B" "$T" "$PEAK_TFLOPS" <<'EOF'
import re, statistics, sys
text = open(sys.argv[1]).read()
B, T, peak = int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
ms = [float(m.group(1)) for m in re.finditer(r"^step +\d+/\d+ \|.*?\|\s*([0-9.]+) ms", text, re.M)]
if ms:
    k = 5 if len(ms) > 10 else 1
    med = statistics.median(ms[k:])
    tok_s = B * T / (med / 1000)
    mfu = (6 * 124475904 + 6 * 12 * 768 * T) * tok_s / (peak * 1e12)
    print(f"RESULT llm.c train_gpt2cu: step {med:.2f} ms | {tok_s:,.0f} tok/s | MFU {100 * mfu:.1f}%")
    print(f"STEPMS llm.c {med:.4f}")
else:
    print("RESULT llm.c train_gpt2cu: no step lines in its log")
EOF
fi
