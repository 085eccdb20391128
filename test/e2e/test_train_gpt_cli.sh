#!/usr/bin/env bash
# The CUDA trainer's command line, checked on machines without a GPU (CI): ./train_gpt has the CPU trainer's
# flags and help (one config schema: the help texts are identical but for the program name), bad flags,
# values and config files get the same one-line errors and a non-zero exit before any GPU work, and with no
# GPU the trainer says so in one line and exits non-zero instead of crashing; a bad value of a kernel switch (the
# cuda and comm groups: --attention, --gelu_fusion, --flash_dq, --matmul_tune, --cuda_graph, --bias_grad, --demo_dct,
# --demo_momentum_domain, --demo_kernel_tuning, --ddp_overlap, --transport) is refused before any GPU work. Skips when
# ./train_gpt is not built (no CUDA toolkit). Everything after the parser is checked on a GPU (make gpu-check).
set -uo pipefail
cd "$(dirname "$0")/../.."
if [[ ! -x ./train_gpt ]]; then
  echo "SKIP: ./train_gpt not built (needs the CUDA toolkit: make train_gpt)"
  exit 77
fi
TMP=build/test-tmp/train_gpt_cli
rm -rf "$TMP" && mkdir -p "$TMP"
source test/support/checks.sh
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

# Kernel switches are checked before the GPU is touched.
run ./train_gpt --attention fast --steps 1 --out_dir "$TMP/run"
check "--attention fast -> one-line error" one_line_error "--attention: 'fast' is not one of: auto, flash, matmul"
run ./train_gpt --config configs/tiny.json --attention flash --steps 1 --out_dir "$TMP/run"
check "--attention flash on head size 16 -> one-line error" one_line_error \
  "--attention flash: flash attention needs head size 64"
run ./train_gpt --gelu_fusion 3 --steps 1 --out_dir "$TMP/run"
check "--gelu_fusion 3 -> one-line error" one_line_error "--gelu_fusion: '3' is not one of: auto, none, forward, both"
run ./train_gpt --demo_dct bf16 --steps 1 --out_dir "$TMP/run"
check "--demo_dct bf16 -> one-line error" one_line_error "--demo_dct: 'bf16' is not one of: fp32, tensor"
for bad in 13 -2; do
  run ./train_gpt --demo_kernel_tuning "$bad" --steps 1 --out_dir "$TMP/run"
  check "--demo_kernel_tuning $bad -> one-line error" one_line_error \
    "--demo_kernel_tuning must be -1 or a row of demo::kTunings, 0 to 12 (got $bad)"
done
for bad in x 1.5 ""; do
  run ./train_gpt --demo_kernel_tuning "$bad" --steps 1 --out_dir "$TMP/run"
  check "--demo_kernel_tuning '$bad' -> one-line error" one_line_error "--demo_kernel_tuning: expected an integer, got '$bad'"
done
run ./train_gpt --demo_kernel_tuning 4 --demo_dct fp32 --steps 1 --out_dir "$TMP/run"
check "--demo_kernel_tuning 4 with --demo_dct fp32 -> one-line error" one_line_error \
  "--demo_kernel_tuning 4 runs the DCTs on the tensor cores but --demo_dct asks otherwise (give one of them)"
for bad in DCT spatial, ""; do
  run ./train_gpt --demo_momentum_domain "$bad" --steps 1 --out_dir "$TMP/run"
  check "--demo_momentum_domain '$bad' -> one-line error" one_line_error \
    "--demo_momentum_domain: '$bad' is not one of: spatial, dct"
done
run ./train_gpt --demo_kernel_tuning 5 --demo_momentum_domain dct --steps 1 --out_dir "$TMP/run"
check "--demo_kernel_tuning 5 with --demo_momentum_domain dct -> one-line error" one_line_error \
  "--demo_kernel_tuning 5 keeps the momentum spatial but --demo_momentum_domain asks otherwise (give one of them)"
for bad in 2 yes ""; do
  for knob in ddp_overlap matmul_tune cuda_graph stochastic_rounding; do
    run ./train_gpt --$knob "$bad" --steps 1 --out_dir "$TMP/run"
    check "--$knob '$bad' -> one-line error" one_line_error "--$knob: expected true or false, got '$bad'"
  done
done
for bad in fused Epilogue ""; do
  run ./train_gpt --bias_grad "$bad" --steps 1 --out_dir "$TMP/run"
  check "--bias_grad '$bad' -> one-line error" one_line_error "--bias_grad: '$bad' is not one of: reduce, epilogue"
done
run ./train_gpt --flash_dq ordered --steps 1 --out_dir "$TMP/run"
check "--flash_dq ordered (retired) -> one-line error" one_line_error \
  "--flash_dq: 'ordered' is not one of: shares, shares_last, shares_bf16, atomic"
run ./train_gpt --transport gloo --steps 1 --out_dir "$TMP/run"
check "--transport gloo -> one-line error" one_line_error "--transport: 'gloo' is not one of: nccl, mpi"
# an optimizer of the CPU trainer only (Signum) is refused before the GPU is looked for
run ./train_gpt --config configs/tiny.json --optimizer signum --steps 1 --out_dir "$TMP/run"
check "--optimizer signum -> one-line error" one_line_error \
  "--optimizer: 'signum' has no CUDA implementation (train_gpt_cpu runs it)"
for knob in LLMC_ATTENTION LLMC_TRANSPORT LLMC_DEMO_MOMENTUM; do  # retired as environment variables: ignored
  export "$knob=bogus"
  run ./train_gpt --steps 1 --out_dir "$TMP/run"
  unset "$knob"
  check "$knob in the environment is no switch any more" bash -c '[[ "$0" != *"$1"* ]]' "$err" "$knob"
done

if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then
  echo "(a GPU is present: the no-GPU message is not checked here)"
else
  run ./train_gpt --steps 1 --out_dir "$TMP/run"
  check "no GPU: one-line error, non-zero exit" one_line_error "no CUDA device found"
  check "no GPU: nothing written to stdout" test -z "$out"
fi

[[ $failures -eq 0 ]] && echo "all train_gpt CLI checks passed" || echo "$failures check(s) failed"
[[ $failures -eq 0 ]]
