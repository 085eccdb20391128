#!/usr/bin/env bash
# The CUDA trainer's command line, checked on machines without a GPU (CI): ./train_gpt has the CPU trainer's
# flags and help (one config schema: the help texts are identical but for the program name), bad flags,
# values and config files get the same one-line errors and a non-zero exit before any GPU work, and with no
# GPU the trainer says so in one line and exits non-zero instead of crashing; a bad LLMC_ATTENTION,
# LLMC_GELU_FUSION, LLMC_FLASH_DQ, LLMC_MATMUL_TUNE, LLMC_CUDA_GRAPH, LLMC_BIAS_GRAD, LLMC_DEMO_DCT,
# LLMC_DEMO_MOMENTUM, LLMC_DEMO_TUNING or LLMC_DDP_OVERLAP is refused before any GPU work. Skips when ./train_gpt is not built (no
# CUDA toolkit). Everything after the parser is checked on a GPU (make gpu-check).
set -uo pipefail
cd "$(dirname "$0")/.."
if [[ ! -x ./train_gpt ]]; then
  echo "SKIP: ./train_gpt not built (needs the CUDA toolkit: make train_gpt)"
  exit 77
fi
TMP=build/test-tmp/train_gpt_cli
rm -rf "$TMP" && mkdir -p "$TMP"
failures=0
check() {  # check <description> <command...>
  local what=$1
  shift
  if "$@"; then echo "ok    $what"; else echo "FAIL  $what"; failures=$((failures + 1)); fi
}
run() {  # run <trainer> <args...>: sets $out, $err, $rc
  local bin=$1
  shift
  out=$("$bin" "$@" 2>"$TMP/stderr")
  rc=$?
  err=$(cat "$TMP/stderr")
}
one_line_error() {  # one_line_error <needle>: exit != 0, exactly one line on stderr, holding <needle>
  [[ $rc -ne 0 && $(wc -l <<<"$err") -eq 1 && $err == "error: "* && $err == *"$1"* ]]
}

run ./train_gpt --help
gpu_help=$out gpu_rc=$rc
run ./train_gpt_cpu --help
check "--help exits 0" test "$gpu_rc" -eq 0
check "--help lists every flag of train_gpt_cpu, same text" \
  test "$(sed 's/^usage: train_gpt /usage: TRAINER /' <<<"$gpu_help")" == "$(sed 's/^usage: train_gpt_cpu /usage: TRAINER /' <<<"$out")"
check "--help is not empty" test "$(wc -l <<<"$gpu_help")" -gt 20

for trainer in ./train_gpt ./train_gpt_cpu; do
  run "$trainer" --bogus_flag 1
  check "$trainer: unknown flag -> one-line error" one_line_error "--bogus_flag: unknown flag"
  run "$trainer" --optimizer sgd
  check "$trainer: bad --optimizer value -> one-line error" one_line_error "--optimizer: 'sgd' is not one of"
  run "$trainer" --config "$TMP/missing.json"
  check "$trainer: missing config file -> one-line error naming it" one_line_error "missing.json"
  echo '{"steps": 3,' >"$TMP/broken.json"
  run "$trainer" --config "$TMP/broken.json"
  check "$trainer: malformed config file -> one-line error naming it" one_line_error "broken.json"
done

# Kernel choices from the environment are checked before the GPU is touched.
LLMC_ATTENTION=fast run ./train_gpt --steps 1 --out_dir "$TMP/run"
check "LLMC_ATTENTION=fast -> one-line error" one_line_error "LLMC_ATTENTION must be auto, flash or matmul; got 'fast'"
LLMC_ATTENTION=flash run ./train_gpt --config configs/tiny.json --steps 1 --out_dir "$TMP/run"
check "LLMC_ATTENTION=flash on head size 16 -> one-line error" one_line_error "flash attention needs head size 64"
LLMC_GELU_FUSION=3 run ./train_gpt --steps 1 --out_dir "$TMP/run"
check "LLMC_GELU_FUSION=3 -> one-line error" one_line_error "LLMC_GELU_FUSION must be 0, 1 or 2; got '3'"
LLMC_DEMO_DCT=bf16 run ./train_gpt --steps 1 --out_dir "$TMP/run"
check "LLMC_DEMO_DCT=bf16 -> one-line error" one_line_error "LLMC_DEMO_DCT must be fp32 or tensor; got 'bf16'"
for bad in 13 -1 x 1.5 ""; do
  LLMC_DEMO_TUNING=$bad run ./train_gpt --steps 1 --out_dir "$TMP/run"
  check "LLMC_DEMO_TUNING='$bad' -> one-line error" one_line_error "LLMC_DEMO_TUNING must be a tuning number from 0 to 12 (demo::kTunings); got '$bad'"
done
LLMC_DEMO_TUNING=4 LLMC_DEMO_DCT=fp32 run ./train_gpt --steps 1 --out_dir "$TMP/run"
check "LLMC_DEMO_TUNING=4 with LLMC_DEMO_DCT=fp32 -> one-line error" one_line_error \
  "LLMC_DEMO_TUNING=4 runs the DCTs on the tensor cores but LLMC_DEMO_DCT=fp32 asks otherwise (unset one of them)"
for bad in DCT spatial, ""; do
  LLMC_DEMO_MOMENTUM=$bad run ./train_gpt --steps 1 --out_dir "$TMP/run"
  check "LLMC_DEMO_MOMENTUM='$bad' -> one-line error" one_line_error "LLMC_DEMO_MOMENTUM must be spatial or dct; got '$bad'"
done
LLMC_DEMO_TUNING=5 LLMC_DEMO_MOMENTUM=dct run ./train_gpt --steps 1 --out_dir "$TMP/run"
check "LLMC_DEMO_TUNING=5 with LLMC_DEMO_MOMENTUM=dct -> one-line error" one_line_error \
  "LLMC_DEMO_TUNING=5 keeps the momentum spatial but LLMC_DEMO_MOMENTUM=dct asks otherwise (unset one of them)"
for bad in 2 yes ""; do
  LLMC_DDP_OVERLAP=$bad run ./train_gpt --steps 1 --out_dir "$TMP/run"
  check "LLMC_DDP_OVERLAP='$bad' -> one-line error" one_line_error "LLMC_DDP_OVERLAP must be 0 or 1; got '$bad'"
  for knob in LLMC_MATMUL_TUNE LLMC_CUDA_GRAPH; do
    export "$knob=$bad"
    run ./train_gpt --steps 1 --out_dir "$TMP/run"
    unset "$knob"
    check "$knob='$bad' -> one-line error" one_line_error "$knob must be 0 or 1; got '$bad'"
  done
done
for bad in fused Epilogue ""; do
  LLMC_BIAS_GRAD=$bad run ./train_gpt --steps 1 --out_dir "$TMP/run"
  check "LLMC_BIAS_GRAD='$bad' -> one-line error" one_line_error "LLMC_BIAS_GRAD must be reduce or epilogue; got '$bad'"
done
LLMC_FLASH_DQ=ordered run ./train_gpt --steps 1 --out_dir "$TMP/run"
check "LLMC_FLASH_DQ=ordered (retired) -> one-line error" one_line_error \
  "LLMC_FLASH_DQ must be shares, shares_last, shares_bf16 or atomic; got 'ordered'"

if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then
  echo "(a GPU is present: the no-GPU message is not checked here)"
else
  run ./train_gpt --steps 1 --out_dir "$TMP/run"
  check "no GPU: one-line error, non-zero exit" one_line_error "no CUDA device found"
  check "no GPU: nothing written to stdout" test -z "$out"
fi

[[ $failures -eq 0 ]] && echo "all train_gpt CLI checks passed" || echo "$failures check(s) failed"
[[ $failures -eq 0 ]]
