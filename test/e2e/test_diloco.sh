#!/usr/bin/env bash
# DiLoCo (--optimizer diloco), in two parts.
# 1. The optimizer against the PyTorch reference (dev/reference/diloco_reference.py, torch.optim.AdamW inner and
#    torch.optim.SGD(nesterov=True) outer): build/test/test_mpi_diloco writes cases for 1, 2 and 4 ranks and the
#    fp32, bf16 and int8 wires, the reference runs them, and mpirun -np 1/2/4 compares every rank's weights after
#    every step (tolerances in test/unit/test_mpi_diloco.cpp), with bit-identical ranks after each sync, the byte
#    counters, a mid-round save/load and the refused blobs.
# 2. train_gpt_cpu on 2 ranks, tiny GPT-2, 20 steps, H = 5: the loss falls; bytes_sent is non-zero only at the sync
#    steps and equals the ring model (the dry run's figure; fp32: 4 n bytes for W = 2) for each wire; a checkpoint at
#    step 7 (mid-round) resumed gives bit-identical losses; --weight_check_every 1 passes; bad values give one-line
#    errors (the CUDA trainer's DiLoCo: test/emulated/test_diloco_emu.sh).
# Skips without mpirun, the binaries, or /usr/bin/python3 with numpy and torch.
set -uo pipefail
cd "$(dirname "$0")/../.."
source test/support/checks.sh
command -v mpirun >/dev/null || { echo "SKIP: mpirun not installed"; exit 77; }
bin=build/test/test_mpi_diloco
py=/usr/bin/python3
[[ -x "$bin" && -x train_gpt_cpu ]] || { echo "SKIP: make train_gpt_cpu $bin first"; exit 77; }
"$py" -c "import numpy, torch" 2>/dev/null || { echo "SKIP: $py lacks numpy/torch"; exit 77; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export OMP_NUM_THREADS=1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
data/prepare_default.sh >/dev/null

# ---- 1. against the reference
cases=()
for name in $("$bin" --write-cases "$tmp/cases"); do cases+=("$tmp/cases/$name"); done
check "the reference ran ${#cases[@]} cases" "$py" dev/reference/diloco_reference.py "${cases[@]}"
for np in 1 2 4; do
  if timeout 300 mpirun -np "$np" "$bin" --check-cases "$tmp/cases" >"$tmp/np$np.log" 2>&1; then
    pass "$np rank(s): DiLoCo matches the reference on fp32/bf16/int8 wires, ranks agree after syncs"
  else
    fail "$np rank(s): test_mpi_diloco --check-cases"; tail -n 20 "$tmp/np$np.log"
  fi
  grep "rank(s): local" "$tmp/np$np.log" | sed 's/^/      /'
done

# ---- 2. the trainer
base=(--config configs/tiny.json --batch_size 4 --seq_len 32 --val_every 0 --lr 3e-3 --warmup_steps 2
      --optimizer diloco --diloco_inner_steps 5 --threads 1)
train() { timeout 300 mpirun -np 2 ./train_gpt_cpu "${base[@]}" "$@"; }
metric() {  # metric DIR FIELD: "step value" per train line
  "$py" -c 'import json,sys
for l in open(sys.argv[1] + "/metrics.jsonl"):
    j = json.loads(l)
    if j.get("type") == "train": print(j["step"], repr(j[sys.argv[2]]))' "$1" "$2"
}
# fp32: 20 steps (the loss, the checkpoints, the weight check); bf16 and int8: 10 steps (two syncs), for the bytes
for wire in fp32 bf16 int8; do
  out=$tmp/run_$wire
  steps=10 extra=()
  [[ $wire == fp32 ]] && steps=20 extra=(--checkpoint_every 7 --keep_checkpoints 0 --weight_check_every 1)
  if ! train --steps $steps --diloco_wire "$wire" --out_dir "$out" "${extra[@]}" >"$tmp/$wire.log" 2>&1; then
    fail "$wire: $steps steps on 2 ranks"; tail -n 15 "$tmp/$wire.log"; continue
  fi
  want=$(train --steps $steps --diloco_wire "$wire" --out_dir "$tmp/dry" --dry_run 2>&1 |
         sed -n 's/.*sent per sync.*(\([0-9]*\) bytes; \([0-9]*\) parameters).*/\1 \2/p')
  read -r sync_bytes nparams <<<"$want"
  metric "$out" bytes_sent >"$tmp/bytes"
  bad=$(awk -v b="$sync_bytes" '{ want = ($1 % 5 == 0) ? b : 0; if ($2 != want) print }' "$tmp/bytes")
  check "$wire: bytes_sent is $sync_bytes at the steps divisible by 5 and 0 at the others" test -n "$sync_bytes" -a -z "$bad"
  [[ -z $bad ]] || echo "      $(head -n 3 <<<"$bad" | tr '\n' ' ')"
  if [[ $wire == fp32 ]]; then
    check "fp32: the ring model's 2(W-1)/W * 4n = 4n bytes for n = $nparams" test "$sync_bytes" = "$((4 * nparams))"
  fi
  metric "$out" loss >"$tmp/loss_$wire"
  read -r first last <<<"$(awk 'NR == 1 { f = $2 } { l = $2 } END { print f, l }' "$tmp/loss_$wire")"
  check "$wire: the loss falls over $steps steps ($first -> $last)" "$py" -c "import sys; sys.exit(not $last < $first - 0.5)"
done
# the fp32 run had --weight_check_every 1: a rank whose global weights differed would have ended it with an error
check "--weight_check_every 1: the global weights agreed at every step (all 20 steps ran)" \
  test "$(wc -l <"$tmp/loss_fp32")" -eq 20

# a checkpoint at step 7 (two steps into the second round) resumed: steps 8-20 bit-identical
ck=$tmp/run_fp32/checkpoints/step_00000007
if [[ -d $ck ]] && train --steps 20 --out_dir "$tmp/resumed" --resume "$ck" >"$tmp/resume.log" 2>&1; then
  metric "$tmp/resumed" loss >"$tmp/loss_resumed"
  check "a mid-round checkpoint (step 7) resumed gives bit-identical losses at steps 8-20" \
    cmp -s "$tmp/loss_resumed" <(awk '$1 > 7' "$tmp/loss_fp32")
else
  fail "resume from $ck"; tail -n 10 "$tmp/resume.log"
fi
# another world size with --reset_momentum: a fresh DiLoCo from the checkpoint's global weights (the last sync's)
one_rank() { timeout 300 ./train_gpt_cpu "${base[@]}" --steps 10 --out_dir "$tmp/one" "$@" >"$tmp/one.log" 2>&1; }
check "the 2-rank checkpoint continues on 1 rank with --reset_momentum" one_rank --resume "$ck" --reset_momentum
# refused resumes: under mpirun the first line of stderr is the trainer's one-line error (mpirun adds its own)
expect_error_mpi() {
  local needle=$1
  shift
  train "$@" >/dev/null 2>"$tmp/stderr"
  local rc=$?
  if [[ $rc -ne 0 ]] && head -n 1 "$tmp/stderr" | grep -q "^error" && head -n 1 "$tmp/stderr" | grep -qF -- "$needle"; then
    pass "rejects: $(head -n 1 "$tmp/stderr")"
  else
    fail "expected an error line naming '$needle' from: $* (exit $rc, stderr: $(head -c 300 "$tmp/stderr"))"
  fi
}
expect_error_mpi 'optimizer is "adamw" here (--optimizer) but "diloco"' --steps 20 --out_dir "$tmp/resumed2" \
  --resume "$ck" --optimizer adamw
expect_error_mpi "diloco_inner_steps is 4 here" --steps 20 --out_dir "$tmp/resumed3" --resume "$ck" \
  --diloco_inner_steps 4

# bad values: one line each, before any training
one=(./train_gpt_cpu "${base[@]}" --steps 2 --out_dir "$tmp/bad")
expect_error "--diloco_inner_steps must be >= 1 (got 0)" "${one[@]}" --diloco_inner_steps 0
expect_error "--diloco_outer_lr must be > 0 (got -1)" "${one[@]}" --diloco_outer_lr -1
expect_error "--diloco_outer_momentum must be in [0, 1) (got 1)" "${one[@]}" --diloco_outer_momentum 1
expect_error "--diloco_wire" "${one[@]}" --diloco_wire fp16
expect_error "--shard_group_size" "${one[@]}" --shard_group_size 2
./train_gpt_cpu "${base[@]}" --steps 12 --out_dir "$tmp/warn" --dry_run >/dev/null 2>"$tmp/warn.err"
check "--steps 12 with H = 5 warns that the last 2 steps end unsynced" \
  grep -q "warning: steps 12 is not a multiple of diloco_inner_steps 5: the last 2 steps end unsynced" "$tmp/warn.err"
# the CUDA trainer's DiLoCo: test/emulated/test_diloco_emu.sh

[[ $failures -eq 0 ]] && echo "all DiLoCo checks passed" || echo "$failures check(s) failed"
[[ $failures -eq 0 ]]
