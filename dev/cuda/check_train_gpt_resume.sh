#!/usr/bin/env bash
# GPU check of the CUDA trainer's determinism and checkpoint/resume, for each optimizer: two identical runs
# of ./train_gpt give bit-identical losses, and a run resumed from its step-3 checkpoint gives steps 4-6 and
# the final val loss bit-identical to the uninterrupted run (master weights, optimizer state, data position
# and the stochastic-rounding stream all continue); AdamW once more with --attention flash, DeMo once more with
# its momentum in the DCT domain (--demo_momentum_domain dct) and with --demo_delay 1, eager and stale,
# --optimizer topk (DeMo's kernels without their DCTs) and DiLoCo (int8 wire, resumed mid-round).
# RESUME_OPTIMIZERS picks some of them. Small model
# (configs/tiny.json) on the default corpus.
# Exit 0 pass, 1 fail, 77 skipped (no GPU, no ./train_gpt or no data).
set -uo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-python3}
if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then
  echo "no CUDA device: train_gpt resume check skipped"; exit 77
fi
[[ -x ./train_gpt ]] && ls data/default/default_train_*.bin >/dev/null 2>&1 || { echo "no ./train_gpt or data/default: skipped"; exit 77; }
TMP=build/check-train-gpt-resume
rm -rf "$TMP" && mkdir -p "$TMP"
failures=0
losses() {  # losses <run dir>: train losses then the last val loss, one per line
  "$PY" -c 'import json,sys
rows=[json.loads(l) for l in open(sys.argv[1]+"/metrics.jsonl")]
print("\n".join(repr(r["loss"]) for r in rows if r["type"]=="train")); print([r["val_loss"] for r in rows if r["type"]=="val"][-1])' "$1"
}
for opt in ${RESUME_OPTIMIZERS:-adamw demo adamw-flash demo-dct demo-delay demo-stale topk diloco}; do
  common=(--config configs/tiny.json --batch_size 4 --seq_len 64 --steps 6 --optimizer "${opt%-*}" --lr 1e-3
          --val_every 0 --val_batches 2 --checkpoint_every 3 --keep_checkpoints 0 --log_every 6)
  # adamw-flash: --attention flash, which needs a head size of 64 (the tiny model with one head)
  if [[ $opt == *-flash ]]; then common+=(--attention flash --num_heads 1); else common+=(--attention matmul); fi
  # demo-dct: the momentum kept in the DCT domain (tuning 6), saved in that domain by the checkpoint
  [[ $opt == demo-dct ]] && common+=(--demo_momentum_domain dct)
  # demo-delay: --demo_delay 1, whose step-3 checkpoint holds a round not yet applied
  [[ $opt == demo-delay ]] && common+=(--demo_delay 1)
  # demo-stale: the same without the eager own share (--demo_eager false)
  [[ $opt == demo-stale ]] && common+=(--demo_delay 1 --demo_eager false)
  # diloco: rounds of 2 steps on the int8 wire, so the step-3 checkpoint is mid-round (local != global weights)
  [[ $opt == diloco ]] && common+=(--diloco_inner_steps 2 --diloco_wire int8)
  ./train_gpt "${common[@]}" --out_dir "$TMP/$opt-a" >"$TMP/$opt-a.log" 2>&1 &&
    ./train_gpt "${common[@]}" --out_dir "$TMP/$opt-b" >"$TMP/$opt-b.log" 2>&1 &&
    ./train_gpt "${common[@]}" --out_dir "$TMP/$opt-r" --resume "$TMP/$opt-a/checkpoints/step_00000003" >"$TMP/$opt-r.log" 2>&1
  rc=$?
  if ((rc != 0)); then echo "FAIL $opt: train_gpt exited $rc"; tail -3 "$TMP/$opt"-*.log; failures=$((failures + 1)); continue; fi
  a=$(losses "$TMP/$opt-a"); b=$(losses "$TMP/$opt-b"); r=$(losses "$TMP/$opt-r")
  if [[ $a == "$b" ]]; then echo "ok    $opt: two runs give bit-identical losses"; else echo "FAIL  $opt: reruns differ: $a vs $b"; failures=$((failures + 1)); fi
  tail_a=$(tail -n 4 <<<"$a"); tail_r=$(tail -n 4 <<<"$r")
  if [[ $tail_a == "$tail_r" ]]; then echo "ok    $opt: resumed at step 3, steps 4-6 and val loss bit-identical"
  else echo "FAIL  $opt: resumed run differs: $(echo $tail_a) vs $(echo $tail_r)"; failures=$((failures + 1)); fi
done
((failures == 0)) && echo PASS || { echo FAIL; exit 1; }
