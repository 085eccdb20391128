#!/usr/bin/env bash
# SparseLoCo (--optimizer sparseloco), in two parts.
# 1. The optimizer against the PyTorch reference (dev/reference/sparseloco_reference.py: torch.optim.AdamW inner,
#    error feedback, per-chunk top-k, templar's 2-bit quantizer, median-norm clip, torch.optim.SGD(nesterov=True)
#    outer): build/test/test_mpi_sparseloco writes cases for 1, 2 and 4 ranks (2-bit, fp32 values, 2-bit top-8 of
#    16 x 16 chunks), the reference runs them, and mpirun -np 1/2/4 compares every rank's weights after every step
#    (tolerances in test/unit/test_mpi_sparseloco.cpp), with the global weights bit-identical on every rank at every
#    step, the message size the reference counts (also GPT-2 124M's), the packings' round trips, a mid-round
#    save/load and the refused blobs.
# 2. train_gpt_cpu on 2 ranks, tiny GPT-2, 12 steps, H = 4: the loss at each round's first step falls; bytes_sent
#    is the dry run's figure at the sync steps and 0 between them; --weight_check_every 1 passes; a checkpoint at step 6
#    (mid-round) resumed gives bit-identical losses; --help lists the keys; bad values and --diloco_wire give one-line
#    errors; the dry run's warnings; train_gpt (or build/emu/train_gpt) refuses --diloco_wire int8 with it in one
#    line (test/emulated/test_diloco_emu.sh runs it against this trainer).
# Skips without mpirun, the binaries, or /usr/bin/python3 with numpy and torch.
set -uo pipefail
cd "$(dirname "$0")/../.."
source test/support/checks.sh
command -v mpirun >/dev/null || { echo "SKIP: mpirun not installed"; exit 77; }
bin=build/test/test_mpi_sparseloco
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
check "the reference ran ${#cases[@]} cases" "$py" dev/reference/sparseloco_reference.py "${cases[@]}"
for np in 1 2 4; do
  if timeout 300 mpirun -np "$np" "$bin" --check-cases "$tmp/cases" >"$tmp/np$np.log" 2>&1; then
    pass "$np rank(s): SparseLoCo matches the reference (2-bit, fp32, top-8 of 16x16), global weights agree every step"
  else
    fail "$np rank(s): test_mpi_sparseloco --check-cases"; tail -n 20 "$tmp/np$np.log"
  fi
  grep -E "rank\(s\): local|GPT-2 124M" "$tmp/np$np.log" | sed 's/^/      /'
done

# ---- 2. the trainer
base=(--config configs/tiny.json --batch_size 4 --seq_len 32 --val_every 0 --lr 3e-3 --warmup_steps 2
      --optimizer sparseloco --diloco_inner_steps 4 --threads 1)
train() { timeout 300 mpirun -np 2 ./train_gpt_cpu "${base[@]}" "$@"; }
metric() {  # metric DIR FIELD: "step value" per train line
  "$py" -c 'import json,sys
for l in open(sys.argv[1] + "/metrics.jsonl"):
    j = json.loads(l)
    if j.get("type") == "train": print(j["step"], repr(j[sys.argv[2]]))' "$1" "$2"
}
# 12 steps (the loss, the checkpoints, the weight check, the bytes); the fp32-values ablation's bytes are
# test_mpi_sparseloco's
out=$tmp/run_2bit
if train --steps 12 --out_dir "$out" --checkpoint_every 6 --keep_checkpoints 0 --weight_check_every 1 \
     >"$tmp/2bit.log" 2>&1; then
  train --steps 12 --out_dir "$tmp/dry" --dry_run >"$tmp/dry.txt" 2>&1
  want=$(sed -n 's/.*sent per sync.*(\([0-9]*\) bytes; \([0-9]*\) parameters).*/\1 \2/p' "$tmp/dry.txt")
  read -r sync_bytes nparams <<<"$want"
  metric "$out" bytes_sent >"$tmp/bytes"
  bad=$(awk -v b="$sync_bytes" '{ want = ($1 % 4 == 0) ? b : 0; if ($2 != want) print }' "$tmp/bytes")
  check "bytes_sent is the dry run's $sync_bytes at the steps divisible by 4 and 0 at the others" \
    test -n "$sync_bytes" -a -z "$bad"
  [[ -z $bad ]] || echo "      $(head -n 3 <<<"$bad" | tr '\n' ' ')"
  grep -E "^  (values sent|message|sent per|DiLoCo fp32|AdamW-DDP)" "$tmp/dry.txt" | sed 's/^/    /'
  check "a message is under 1/100 of the fp32 all-reduce's 4n = $((4 * nparams)) bytes" \
    test "$((sync_bytes * 100))" -lt "$((4 * nparams))"
  metric "$out" loss >"$tmp/loss_2bit"
  # a round's first step sees the last sync's global weights: their loss falls from round to round
  read -r l1 l5 l9 <<<"$(awk '$1 == 1 { a = $2 } $1 == 5 { b = $2 } $1 == 9 { c = $2 } END { print a, b, c }' \
                         "$tmp/loss_2bit")"
  check "the global weights' loss falls from round to round (steps 1, 5, 9: $l1, $l5, $l9)" \
    "$py" -c "import sys; sys.exit(not $l9 < $l5 < $l1 - 0.05)"
else
  fail "12 steps on 2 ranks"; tail -n 15 "$tmp/2bit.log"
fi
check "--weight_check_every 1: the global weights agreed at every step (all 12 steps ran)" \
  test "$(wc -l <"$tmp/loss_2bit" 2>/dev/null || echo 0)" -eq 12

# a checkpoint at step 6 (two steps into the second round, after a sync: error feedback in the blob) resumed
ck=$tmp/run_2bit/checkpoints/step_00000006
if [[ -d $ck ]] && train --steps 12 --out_dir "$tmp/resumed" --resume "$ck" >"$tmp/resume.log" 2>&1; then
  metric "$tmp/resumed" loss >"$tmp/loss_resumed"
  check "a mid-round checkpoint (step 6) resumed gives bit-identical losses at steps 7-12" \
    cmp -s "$tmp/loss_resumed" <(awk '$1 > 6' "$tmp/loss_2bit")
else
  fail "resume from $ck"; tail -n 10 "$tmp/resume.log"
fi
# refused resumes: under mpirun the first line of stderr is the trainer's one-line error (mpirun adds its own)
expect_error_mpi() {
  local needle=$1
  shift
  train "$@" >/dev/null 2>"$tmp/stderr"
  local rc=$?
  local first
  first=$(head -n 1 "$tmp/stderr")
  if [[ $rc -ne 0 ]] && grep -q "^error" <<<"$first" && grep -qF -- "$needle" <<<"$first"; then
    pass "rejects: $(head -n 1 "$tmp/stderr")"
  else
    fail "expected an error line naming '$needle' from: $* (exit $rc, stderr: $(head -c 300 "$tmp/stderr"))"
  fi
}
expect_error_mpi 'optimizer is "diloco" here (--optimizer) but "sparseloco"' --steps 12 --out_dir "$tmp/resumed2" \
  --resume "$ck" --optimizer diloco

# --help, bad values: one line each, before any training
help=$(./train_gpt_cpu --help 2>&1)
for k in sparseloco_topk sparseloco_chunk sparseloco_ef_decay sparseloco_values; do
  check "--help lists --$k" grep -q -- "--$k" <<<"$help"
done
one=(./train_gpt_cpu "${base[@]}" --steps 2 --out_dir "$tmp/bad")
expect_error "--sparseloco_topk must be in [1, 4096] (got 0)" "${one[@]}" --sparseloco_topk 0
expect_error "--sparseloco_chunk must be in [1, 64] (got 65)" "${one[@]}" --sparseloco_chunk 65
expect_error "--sparseloco_ef_decay must be in [0, 1] (got 1.5)" "${one[@]}" --sparseloco_ef_decay 1.5
expect_error "--sparseloco_values" "${one[@]}" --sparseloco_values int4
expect_error "--diloco_wire does not apply to --optimizer sparseloco" "${one[@]}" --diloco_wire int8
expect_error "--shard_group_size" "${one[@]}" --shard_group_size 2
# warnings of a dry run: an unsynced tail (as DiLoCo's), a top-k that keeps everything
dry() { ./train_gpt_cpu "${base[@]}" --out_dir "$tmp/warn" --dry_run "$@" 2>&1 >/dev/null; }
check "--steps 10 with H = 4 warns that the last 2 steps end unsynced" \
  grep -q "warning: steps 10 is not a multiple of diloco_inner_steps 4: the last 2 steps end unsynced" <(dry --steps 10)
check "--sparseloco_topk 4096 warns that nothing is sparsified" \
  grep -q "warning: sparseloco_topk 4096 selects every element" <(dry --steps 8 --sparseloco_topk 4096)
# the CUDA trainer, on a GPU build or on the emulated device, whichever is built
for cuda in ./train_gpt build/emu/train_gpt; do
  [[ -x $cuda ]] || continue
  expect_error "--diloco_wire does not apply to --optimizer sparseloco" \
    "$cuda" "${base[@]}" --steps 2 --out_dir "$tmp/cuda" --diloco_wire int8
done

[[ $failures -eq 0 ]] && echo "all SparseLoCo checks passed" || echo "$failures check(s) failed"
[[ $failures -eq 0 ]]
