#!/usr/bin/env bash
# Runs every GPU checker and test binary in build/cuda/ and build/cuda-fp32/ (the fp32 build's GPU tests; all
# built by `make cuda`; this script builds nothing) and
# prints a summary table: name, PASS / FAIL / SKIP, wall time, and the binary's TIME lines (kernel timings).
# With ./train_gpt and data/default present it also runs the trainer's determinism and resume check
# (dev/cuda/check_train_gpt_resume.sh), on several GPUs the multi-GPU check (dev/cuda/multi_gpu_check.sh),
# and the end-to-end benchmark (dev/cuda/bench_train_gpt.sh).
# The GPU tests' PyTorch references (build/reference/tiny; build/reference/hs64, a head size of 64 for the
# flash attention run of gpu_test_gpt2 with --attention flash) are generated first if missing and a python3
# with torch is found.
# Without a GPU (no nvidia-smi, or it lists no device) it prints "no CUDA device: GPU checks skipped" and exits
# 0. Otherwise it exits 1 when any binary failed. Full logs: build/cuda-logs/<name>.log.
# Each binary gets GPU_CHECK_TIMEOUT seconds (default 180); a hang counts as a failure. GPU_CHECK_BENCH=0 leaves
# out the end-to-end benchmark (e.g. when it was run on its own first); GPU_CHECK_SKIP="name ..." leaves out
# those rows (dev/cuda/gpu_session.sh runs some first, on their own).
# Usage: dev/cuda/gpu_check.sh [name-filter]
set -u
cd "$(dirname "$0")/../.."
filter="${1:-}"
skipped_by_request() { [[ " ${GPU_CHECK_SKIP:-} " == *" $1 "* ]]; }
# build/cuda-fp32/ holds the GPU tests of the fp32 build (-DENABLE_FP32): their rows end in _fp32.
display_name() { if [[ $1 == build/cuda-fp32/* ]]; then echo "$(basename "$1")_fp32"; else basename "$1"; fi; }

if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then
  echo "no CUDA device: GPU checks skipped"
  exit 0
fi

bins=()
for bin in build/cuda/* build/cuda-fp32/*; do
  [[ -f "$bin" && -x "$bin" ]] || continue
  name=$(display_name "$bin")
  [[ -n "$filter" && "$name" != *"$filter"* ]] && continue
  skipped_by_request "$name" && continue
  bins+=("$bin")
done
if [[ ${#bins[@]} -eq 0 ]]; then
  echo "no binaries in build/cuda${filter:+ matching '$filter'}: run 'make cuda' first"
  exit 1
fi

logdir=build/cuda-logs
mkdir -p "$logdir"
nvidia-smi -L
echo
reference() {  # reference <name> <gpt2_reference.py flags...>: build/reference/<name> unless it exists
  local name=$1; shift
  [[ -f build/reference/$name/state.bin ]] && return
  for py in /usr/bin/python3 python3; do
    if "$py" -c 'import torch, numpy' 2>/dev/null; then
      echo "generating build/reference/$name with $py (PyTorch reference)"
      "$py" dev/reference/gpt2_reference.py "$@" --out-dir "build/reference/$name" \
        >"$logdir/reference-$name.log" 2>&1 || echo "reference generation failed: see $logdir/reference-$name.log"
      return
    fi
  done
}
reference tiny --config tiny --batch 4 --seq 32
# two heads of 64 and T = 96: one full and one partial 64-row flash tile
reference hs64 --config tiny --channels 128 --heads 2 --max-seq-len 128 --batch 4 --seq 96
passed=0; failed=0; skipped=0; failed_names=()
declare -a rows=() timings=()
for bin in "${bins[@]}"; do
  name=$(display_name "$bin")
  log="$logdir/$name.log"
  start=$(date +%s.%N)
  timeout "${GPU_CHECK_TIMEOUT:-180}" "$bin" >"$log" 2>&1; rc=$?
  [[ $rc -eq 124 ]] && echo "TIMEOUT after ${GPU_CHECK_TIMEOUT:-180} s" >>"$log"
  end=$(date +%s.%N)
  secs=$(awk -v a="$start" -v b="$end" 'BEGIN { printf "%.1f", b - a }')
  if [[ $rc -eq 0 ]]; then status=PASS; passed=$((passed+1))
  elif [[ $rc -eq 77 ]]; then status=SKIP; skipped=$((skipped+1))
  else status=FAIL; failed=$((failed+1)); failed_names+=("$name")
  fi
  rows+=("$(printf '%-22s %-5s %7ss' "$name" "$status" "$secs")")
  while IFS= read -r line; do timings+=("$(printf '%-22s %s' "$name" "${line#TIME }")"); done < <(grep '^TIME ' "$log")
  if [[ $status == FAIL ]]; then
    echo "FAIL $name (exit $rc); failing checks from $log:"
    grep -E 'FAIL|error|TIMEOUT' "$log" | head -n 20 | sed 's/^/    /'
  fi
done

# The whole model against PyTorch again under the environment knobs that change kernels (the binary above ran
# the defaults on a head size of 16, so the matmul attention): both attentions at head size 64 (flash with every
# dQ summation, --flash_dq: fp32 shares, summed by the last key tile, bf16 shares, atomic; with tuned matmul
# algorithms, --matmul_tune; with the micro-step as a CUDA graph, --cuda_graph; with the qkv and fc bias
# gradients from cuBLASLt's BGRADB epilogue, --bias_grad epilogue), then every GELU level (0 separate
# kernels, 1 the forward as a cuBLASLt epilogue, 2 the backward too; 2 is Hopper's default).
variant() {  # variant <row name> <binary> <args and kernel flags...>
  local name=$1 bin=$2
  shift 2
  [[ -x $bin && ( -z "$filter" || "$name" == *"$filter"* ) ]] || return 0
  skipped_by_request "$name" && return 0
  local start secs rc status
  start=$(date +%s.%N)
  timeout "${GPU_CHECK_TIMEOUT:-180}" "$bin" "$@" >"$logdir/$name.log" 2>&1; rc=$?
  secs=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
  if [[ $rc -eq 0 ]]; then status=PASS; passed=$((passed+1))
  elif [[ $rc -eq 77 ]]; then status=SKIP; skipped=$((skipped+1))
  else status=FAIL; failed=$((failed+1)); failed_names+=("$name")
    grep -E 'FAIL|error' "$logdir/$name.log" | head -n 20 | sed 's/^/    /'
  fi
  rows+=("$(printf '%-22s %-5s %7ss' "$name" "$status" "$secs")")
}
variant gpu_test_gpt2_flash build/cuda/gpu_test_gpt2 build/reference/hs64 --attention flash
variant gpu_test_gpt2_last_dq build/cuda/gpu_test_gpt2 build/reference/hs64 --flash_dq shares_last
variant gpu_test_gpt2_atomic_dq build/cuda/gpu_test_gpt2 build/reference/hs64 --flash_dq atomic
variant gpu_test_gpt2_bf16_dq build/cuda/gpu_test_gpt2 build/reference/hs64 --flash_dq shares_bf16
variant gpu_test_gpt2_matmul_tune build/cuda/gpu_test_gpt2 build/reference/hs64 --matmul_tune true
variant gpu_test_gpt2_cuda_graph build/cuda/gpu_test_gpt2 build/reference/hs64 --cuda_graph true
variant gpu_test_gpt2_bias_grad build/cuda/gpu_test_gpt2 build/reference/hs64 --bias_grad epilogue
variant gpu_test_gpt2_hs64_matmul build/cuda/gpu_test_gpt2 build/reference/hs64 --attention matmul
for fusion in none forward both; do
  variant gpu_test_gpt2_gelu_$fusion build/cuda/gpu_test_gpt2 build/reference/tiny --gelu_fusion $fusion
done
# DeMo with its compress kernel's DCTs on the tensor cores, and with the momentum in the DCT domain (the state
# blob converted on the way to the CPU optimizer and back), 10 steps against the CPU optimizer
variant gpu_test_demo_tensor build/cuda/gpu_test_demo build/reference/tiny --demo_dct tensor
variant gpu_test_demo_dct build/cuda/gpu_test_demo build/reference/tiny --demo_momentum_domain dct

# script_row <row name> <script>: a check script as one row (its exit 77 is a skip)
script_row() {
  local name=$1 script=$2 start rc secs status
  [[ -z "$filter" || "$name" == *"$filter"* ]] && ! skipped_by_request "$name" || return 0
  start=$(date +%s.%N)
  "$script" >"$logdir/$name.log" 2>&1; rc=$?
  secs=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
  if [[ $rc -eq 0 ]]; then status=PASS; passed=$((passed+1))
  elif [[ $rc -eq 77 ]]; then status=SKIP; skipped=$((skipped+1))
  else status=FAIL; failed=$((failed+1)); failed_names+=("$name"); grep FAIL "$logdir/$name.log" | head -5
  fi
  rows+=("$(printf '%-22s %-5s %7ss' "$name" "$status" "$secs")")
  grep '^RESULT ' "$logdir/$name.log" | sed 's/^RESULT /  /' >&2 || true
}
# The trainer itself: determinism and checkpoint/resume of ./train_gpt (skips without it), and on a machine with
# several GPUs the multi-rank checks and the scaling figures (dev/cuda/multi_gpu_check.sh; skips on one GPU).
script_row train_gpt_resume dev/cuda/check_train_gpt_resume.sh
script_row multi_gpu dev/cuda/multi_gpu_check.sh

echo
printf '%-22s %-5s %8s\n' "binary" "result" "wall"
printf '%s\n' "${rows[@]}"
if [[ ${#timings[@]} -gt 0 ]]; then
  echo
  echo "timings:"
  printf '  %s\n' "${timings[@]}"
fi
echo
bench_rc=0
if [[ -z "$filter" && ${GPU_CHECK_BENCH:-1} != 0 && -x ./train_gpt ]] && ls data/default/default_train_*.bin >/dev/null 2>&1; then
  echo "end-to-end benchmark (dev/cuda/bench_train_gpt.sh):"
  dev/cuda/bench_train_gpt.sh | grep -E '^(RESULT|MEMORY) ' | sed -E 's/^(RESULT|MEMORY) /  /'; bench_rc=${PIPESTATUS[0]}
  echo
fi
[[ $failed -gt 0 ]] && echo "failed: ${failed_names[*]}"
echo "$passed passed, $failed failed, $skipped skipped"
[[ $failed -eq 0 && ( $bench_rc -eq 0 || $bench_rc -eq 77 ) ]]
