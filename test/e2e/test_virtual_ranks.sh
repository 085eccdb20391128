#!/usr/bin/env bash
# Virtual ranks (docs/training.md, "Virtual ranks"): P processes x --virtual_ranks V of train_gpt_cpu (tiny GPT-2)
# against P*V real MPI ranks, the oracle (an independent path: MPI's messages instead of the lanes' rendezvous).
# virtual_checks.py compares metrics.jsonl (loss, grad norm, tokens and byte counts of every line) and the final
# checkpoint (model.bin byte for byte, every rank's state file field by field, the optimizer state byte for byte):
#  - DeMo 4x1 vs 1x4 vs 2x2 with --demo_values fp32 --demo_delay 0 and sign with delay 1 (VIRTUAL_FULL=1: also
#    sign with delay 0 and fp32 with delay 1, which the resume's runs cover too);
#  - AdamW-DDP (overlapped all-reduce) 4x1 vs 1x4 (VIRTUAL_FULL=1: 2x2, and --grad_wire bf16);
#  - signum, powersgd, sparseloco 2x1 vs 1x2 (VIRTUAL_FULL=1: topk, diloco, randomk too);
#  - resume: a 1x4 DeMo checkpoint of step 2 (--demo_delay 1) resumed on 4 real ranks, and a 4x1 one resumed as
#    1x4, end at the bits of the uninterrupted 4-step runs;
#  - a virtual rank that fails (a corrupt state file of its own) ends the process with one line naming it;
#  - one-line refusals: --virtual_ranks 0, too many, and 2 with --shard_group_size 2 (and by train_gpt, where
#    built); the dry run's memory line.
# Skips without mpirun, the binary or /usr/bin/python3.
set -uo pipefail
cd "$(dirname "$0")/../.."
source test/support/checks.sh
command -v mpirun >/dev/null || { echo "SKIP: mpirun not installed"; exit 77; }
py=/usr/bin/python3
[[ -x train_gpt_cpu ]] || { echo "SKIP: make train_gpt_cpu first"; exit 77; }
[[ -x $py ]] || { echo "SKIP: no $py"; exit 77; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export OMP_NUM_THREADS=1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
data/prepare_default.sh >/dev/null

base=(--config configs/tiny.json --batch_size 4 --seq_len 32 --val_every 0 --lr 3e-3 --warmup_steps 2
      --threads 1 --sample_every 0 --steps 3)
# run P V DIR ARGS...: P processes (mpirun when P > 1) x V virtual ranks into DIR, stdout and stderr to DIR.log
run() {
  local p=$1 v=$2 dir=$3
  shift 3
  local cmd=(./train_gpt_cpu "${base[@]}" --virtual_ranks "$v" --out_dir "$dir" "$@")
  [[ $p -gt 1 ]] && cmd=(mpirun -np "$p" "${cmd[@]}")
  timeout 300 "${cmd[@]}" >"$dir.log" 2>&1 || { fail "${p}x$v: ${cmd[*]}"; tail -n 3 "$dir.log"; return 1; }
}
# same WHAT A B: virtual_checks.py's comparison of runs (or checkpoints: MODE ckpt) A and B must pass
same() {
  local what=$1 mode=same out
  shift
  [[ $1 == ckpt ]] && { mode=ckpt; shift; }
  if out=$("$py" test/e2e/virtual_checks.py "$mode" "$1" "$2" 2>&1); then pass "$what: $out"; else fail "$what: $out"; fi
}

# DeMo: 2 value encodings x 2 delays, 4 real ranks against 1 process x 4 (and 2 x 2 for two of them)
full=${VIRTUAL_FULL:-0}
for values in fp32 sign; do
  for delay in 0 1; do
    [[ $full == 1 || $values$delay == fp320 || $values$delay == sign1 ]] || continue
    d=$tmp/demo_${values}_$delay
    args=(--optimizer demo --demo_values "$values" --demo_delay "$delay")
    run 4 1 "$d.4x1" "${args[@]}" || continue
    run 1 4 "$d.1x4" "${args[@]}" && same "DeMo $values delay $delay: 1x4 = 4x1" "$d.4x1" "$d.1x4"
    if [[ $values$delay == fp320 || $values$delay == sign1 ]]; then
      run 2 2 "$d.2x2" "${args[@]}" && same "DeMo $values delay $delay: 2x2 = 4x1" "$d.4x1" "$d.2x2"
    fi
  done
done

# AdamW-DDP: the overlapped all-reduce (every element summed in rank order), fp32 and bf16 on the wire
d=$tmp/adamw
if run 4 1 "$d.4x1" --optimizer adamw; then
  run 1 4 "$d.1x4" --optimizer adamw && same "AdamW-DDP: 1x4 = 4x1" "$d.4x1" "$d.1x4"
  [[ $full == 1 ]] && run 2 2 "$d.2x2" --optimizer adamw && same "AdamW-DDP: 2x2 = 4x1" "$d.4x1" "$d.2x2"
fi
if [[ $full == 1 ]] && run 4 1 "$d.bf16.4x1" --optimizer adamw --grad_wire bf16; then
  run 1 4 "$d.bf16.1x4" --optimizer adamw --grad_wire bf16 && same "AdamW-DDP bf16 wire: 1x4 = 4x1" "$d.bf16.4x1" "$d.bf16.1x4"
fi

# the other optimizers on 2 ranks (the DiLoCo family syncs every 2 steps, so within the run)
others=(signum powersgd sparseloco)
[[ $full == 1 ]] && others+=(topk diloco randomk)
for opt in "${others[@]}"; do
  d=$tmp/$opt
  args=(--optimizer "$opt" --diloco_inner_steps 2)
  run 2 1 "$d.2x1" "${args[@]}" && run 1 2 "$d.1x2" "${args[@]}" && same "$opt: 1x2 = 2x1" "$d.2x1" "$d.1x2"
done

# resume across the two kinds of ranks: checkpoints at step 2, runs of 4 steps
ck() { printf '%s/checkpoints/step_%08d' "$1" "$2"; }
d=$tmp/resume
long=(--optimizer demo --demo_delay 1 --steps 4 --checkpoint_every 2 --keep_checkpoints 0)
if run 4 1 "$d.4x1" "${long[@]}" && run 1 4 "$d.1x4" "${long[@]}"; then
  same "DeMo 4 steps with checkpoints: 1x4 = 4x1" "$d.4x1" "$d.1x4"
  run 4 1 "$d.v2r" "${long[@]}" --resume "$(ck "$d.1x4" 2)" &&
    same "a 1x4 checkpoint resumed on 4 real ranks ends at the 4x1 run's bits" ckpt "$(ck "$d.4x1" 4)" "$(ck "$d.v2r" 4)"
  run 1 4 "$d.r2v" "${long[@]}" --resume "$(ck "$d.4x1" 2)" &&
    same "a 4x1 checkpoint resumed as 1x4 ends at the 4x1 run's bits" ckpt "$(ck "$d.4x1" 4)" "$(ck "$d.r2v" 4)"
fi

# one virtual rank fails (its state file corrupt): one line naming it, exit 1, and the other lanes do not hang
if [[ -d $(ck "$d.4x1" 4) ]]; then
  cp -r "$(ck "$d.4x1" 4)" "$tmp/corrupt"
  printf 'garbage' | dd of="$tmp/corrupt/state_rank2.bin" bs=1 seek=100 conv=notrunc 2>/dev/null
  timeout 60 ./train_gpt_cpu "${base[@]}" --optimizer demo --demo_delay 1 --steps 5 --virtual_ranks 4 \
    --resume "$tmp/corrupt" --out_dir "$tmp/corrupt_run" >/dev/null 2>"$tmp/corrupt.err"
  rc=$?
  if [[ $rc -eq 1 && $(grep -c . "$tmp/corrupt.err") -eq 1 ]] && grep -q "^error (rank [0-9]): .*state_rank2.bin" "$tmp/corrupt.err"; then
    pass "a failing virtual rank ends the process with its one line: $(cut -c1-80 "$tmp/corrupt.err")..."
  else
    fail "a corrupt state_rank2.bin under --virtual_ranks 4: exit $rc, stderr: $(head -c 300 "$tmp/corrupt.err")"
  fi
fi

expect_error virtual_ranks ./train_gpt_cpu "${base[@]}" --virtual_ranks 0 --out_dir "$tmp/bad0"
expect_error virtual_ranks ./train_gpt_cpu "${base[@]}" --virtual_ranks 2000 --out_dir "$tmp/bad1"
expect_error shard_group_size ./train_gpt_cpu "${base[@]}" --virtual_ranks 2 --shard_group_size 2 --out_dir "$tmp/bad2"
[[ -x train_gpt ]] && expect_error "train_gpt does not simulate ranks" ./train_gpt "${base[@]}" --virtual_ranks 2 --out_dir "$tmp/cuda"
if ./train_gpt_cpu "${base[@]}" --virtual_ranks 4 --dry_run --out_dir "$tmp/dry" >"$tmp/dry.log" 2>&1; then
  check "the dry run names the virtual ranks' memory" grep -q "virtual ranks: 4 per process, memory ~4 x" "$tmp/dry.log"
else
  fail "--virtual_ranks 4 --dry_run"
fi

[[ $failures -eq 0 ]] && echo "all virtual-rank checks passed" || echo "$failures check(s) failed"
exit $((failures > 0))
