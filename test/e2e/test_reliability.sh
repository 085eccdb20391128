#!/usr/bin/env bash
# What a hostile user found, each checked on the CPU trainer and the tools: one run per out_dir (a second is refused
# naming the holder, the first keeps its metrics whole), checkpoint deletion that unmarks first (checked in the
# order of the file-system calls, and by a kill in the middle of a prune), --resume auto falling back past a
# corrupt newest checkpoint (1 and 2 ranks), no checkpoint of diverged weights, eval_gpt and sample_gpt refusing a
# model whose forward pass is NaN, messages that name the file or flag, directory syncs after each checkpoint
# rename, and a requeued run that died before its first checkpoint starting afresh. The file-system calls are
# watched by test/support/fs_probe.c (LD_PRELOAD).
set -uo pipefail
cd "$(dirname "$0")/../.."
source test/support/checks.sh
data/prepare_default.sh >/dev/null
make -s train_gpt_cpu sample_gpt eval_gpt build/prepro_gpt2 build/test/libfs_probe.so >/dev/null
tmp=build/test-tmp/reliability
rm -rf "$tmp" && mkdir -p "$tmp"
probe=$PWD/build/test/libfs_probe.so
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
base=(--config configs/tiny.json --batch_size 4 --seq_len 32 --val_every 0 --sample_every 0 --lr 1e-3
      --warmup_steps 2 --lr_schedule constant --threads 1)
train() { ./train_gpt_cpu "${base[@]}" "$@"; }
# step -> loss lines of a run's metrics, "step loss" per line
losses() { /usr/bin/python3 -c '
import json, sys
for line in open(sys.argv[1]):
    m = json.loads(line)
    if m.get("type", "train") == "train" and "loss" in m: print(m["step"], m["loss"].hex() if isinstance(m["loss"], float) else m["loss"])
' "$1/metrics.jsonl"; }
flip_byte() { /usr/bin/python3 -c '
import sys
path, at = sys.argv[1], int(sys.argv[2])
b = bytearray(open(path, "rb").read()); b[at] ^= 0xFF; open(path, "wb").write(bytes(b))' "$1" "$2"; }

# The reference: 8 uninterrupted steps.
train --steps 8 --checkpoint_every -1 --out_dir "$tmp/ref" >/dev/null 2>&1 || fail "reference run"
losses "$tmp/ref" >"$tmp/ref.losses"

# 1. One trainer per out_dir.
out=$tmp/lock
./train_gpt_cpu "${base[@]}" --steps 60 --checkpoint_every 20 --keep_checkpoints 2 --out_dir "$out" >"$tmp/lock.first" 2>&1 &
first=$!
for _ in $(seq 300); do [[ -s $out/metrics.jsonl ]] && break; sleep 0.1; done
train --steps 60 --checkpoint_every 20 --resume auto --out_dir "$out" >/dev/null 2>"$tmp/lock.err"
rc=$?
if [[ $rc -eq 1 && $(grep -c . "$tmp/lock.err") -eq 1 ]] &&
   grep -qF "$out: in use by another run (pid $first on host $(hostname)" "$tmp/lock.err"; then
  pass "a second run on a busy out_dir is refused: $(cat "$tmp/lock.err")"
else
  fail "a second run on a busy out_dir: exit $rc, $(head -c 300 "$tmp/lock.err")"
fi
wait $first
check "the first run finishes with every step's metrics" \
  test "$(losses "$out" | awk '{print $1}' | tr '\n' ' ')" = "$(seq 1 60 | tr '\n' ' ')"
check "the lock is free once the run has ended" \
  train --steps 60 --resume auto --out_dir "$out" >/dev/null 2>&1

# 2. Deleting a checkpoint removes its marker first, durably; a kill midway leaves a usable out_dir.
out=$tmp/prune
FS_PROBE_LOG=$tmp/prune.log LD_PRELOAD=$probe train --steps 6 --checkpoint_every 2 --keep_checkpoints 1 \
  --out_dir "$out" >/dev/null 2>&1 || fail "run with pruning"
check "pruning: the marker goes first, synced, then the files (step 2 and 4)" /usr/bin/python3 -c '
import sys
import os
log = [(c, os.path.abspath(p)) for c, p in (l.split(" ", 1) for l in open(sys.argv[1]).read().splitlines())]
for step in ("00000002", "00000004"):
    d = os.path.abspath(sys.argv[2]) + "/checkpoints/step_" + step
    calls = [(c, p) for c, p in log if p.startswith(d) and c != "rename" and ".tmp" not in p]
    # the save: unlink COMPLETE (none yet), syncs; the prune: unlink COMPLETE, fsync dir, unlink files
    prune = calls[max(i for i, (c, p) in enumerate(calls) if c == "unlink" and p == d + "/COMPLETE"):]
    assert prune[1] == ("fsync", d), prune
    assert {p for c, p in prune[2:] if c == "unlink"} >= {d + "/model.bin", d + "/state_rank0.bin"}, prune
' "$tmp/prune.log" "$out"
out=$tmp/prune_kill
FS_PROBE_KILL=unlink:step_00000002/model.bin LD_PRELOAD=$probe train --steps 4 --checkpoint_every 2 \
  --keep_checkpoints 1 --out_dir "$out" >/dev/null 2>&1
check "killed while pruning step 2 (the probe's SIGKILL)" test -d "$out/checkpoints/step_00000002"
check "the half-deleted checkpoint has no marker" test ! -e "$out/checkpoints/step_00000002/COMPLETE"
check "sample_gpt reads the out_dir after that kill" ./sample_gpt --model "$out" --tokens 2 >/dev/null 2>&1
train --steps 8 --checkpoint_every 2 --keep_checkpoints 1 --resume auto --out_dir "$out" >"$tmp/prune_kill.out" 2>&1
check "--resume auto continues from step 4 after that kill" grep -q "resumed from .*step_00000004 at step 4" "$tmp/prune_kill.out"
check "and matches the uninterrupted losses" diff <(losses "$out") "$tmp/ref.losses"
check "and has pruned the half-deleted checkpoint" test ! -e "$out/checkpoints/step_00000002"

# 2b. --resume auto falls back past a corrupt newest checkpoint.
fallback() {  # NAME RANKS FILE-TO-CORRUPT (relative to step_00000006)
  local out=$tmp/fallback_$1 launch=()
  [[ $2 -gt 1 ]] && launch=(mpirun -np "$2")
  "${launch[@]}" ./train_gpt_cpu "${base[@]}" --steps 6 --checkpoint_every 2 --keep_checkpoints 0 --out_dir "$out" \
    >/dev/null 2>&1 || fail "$1: first run"
  flip_byte "$out/checkpoints/step_00000006/$3" 100
  "${launch[@]}" ./train_gpt_cpu "${base[@]}" --steps 8 --checkpoint_every 2 --keep_checkpoints 0 --resume auto \
    --out_dir "$out" >"$tmp/$1.out" 2>"$tmp/$1.err"
  local rc=$?
  if [[ $rc -eq 0 && $(grep -c "^warning: .*step_00000006/$3: XXH64 .*set aside as .*step_00000006.corrupt" "$tmp/$1.err") -eq 1 ]] &&
     grep -q "resumed from .*step_00000004 at step 4" "$tmp/$1.out"; then
    pass "$1: a corrupt $3 in the newest checkpoint: $(grep -c . "$tmp/$1.err") warning, resumed from step 4"
  else
    fail "$1: exit $rc; $(head -c 400 "$tmp/$1.err")"
  fi
  check "$1: the corrupt checkpoint is kept aside" test -f "$out/checkpoints/step_00000006.corrupt/COMPLETE"
  [[ $2 -eq 1 ]] && check "$1: losses match the uninterrupted run" diff <(losses "$out") "$tmp/ref.losses"
}
fallback model 1 model.bin
fallback state 1 state_rank0.bin
fallback rank1 2 state_rank1.bin
out=$tmp/fallback_model
flip_byte "$out/checkpoints/step_00000008/model.bin" 100  # the resumed run saved steps 6 and 8 again
expect_error "step_00000008/model.bin: XXH64" train --steps 8 --resume "$out/checkpoints/step_00000008" --out_dir "$out"
for s in 2 4 6; do [[ -d $out/checkpoints/step_0000000$s ]] && flip_byte "$out/checkpoints/step_0000000$s/model.bin" 100; done
train --steps 8 --resume auto --out_dir "$out" >/dev/null 2>"$tmp/none.err"
rc=$?
check "no intact checkpoint left: a warning for each, then one error (exit $rc): $(tail -n 1 "$tmp/none.err" | cut -c1-120)" \
  test $rc -eq 1 -a "$(grep -c "^warning: .*set aside as" "$tmp/none.err")" -eq 4 -a \
  "$(tail -n 1 "$tmp/none.err" | grep -c "^error: .*checkpoints: no intact checkpoint to resume")" -eq 1

# 3. No checkpoint of diverged weights.
out=$tmp/diverged
train --steps 3 --checkpoint_every 1 --keep_checkpoints 0 --out_dir "$out" >/dev/null 2>&1 || fail "diverged: first run"
# the loss of step 4 is computed before its update, so only the weights show the divergence
train --steps 6 --checkpoint_every 1 --keep_checkpoints 0 --lr 3e38 --resume auto --out_dir "$out" \
  >/dev/null 2>"$tmp/diverged.err"
rc=$?
check "lr 3e38 from step 4 ends the run as diverged (exit 3): $(tail -n 1 "$tmp/diverged.err")" test $rc -eq 3
loadable=0 broken=0
for ck in "$out"/checkpoints/step_*; do
  [[ -f $ck/COMPLETE ]] || continue
  if ./sample_gpt --model "$ck" --tokens 1 >/dev/null 2>&1; then loadable=$((loadable + 1)); else broken=$((broken + 1)); fi
done
check "every checkpoint left loads ($loadable do, $broken do not)" test $broken -eq 0 -a $loadable -eq 3
check "the weights were checked before the save" grep -q "are NaN or inf after the update, so no checkpoint was written" "$tmp/diverged.err"

# 4. A model whose forward pass is NaN: the tools fail as the trainer does.
/usr/bin/python3 -c '
import struct, sys
src, dst = sys.argv[1], sys.argv[2]
b = open(src, "rb").read()
n = (len(b) - 1024) // 4
open(dst, "wb").write(b[:1024] + struct.pack("<f", 3e38) * n)' "$tmp/prune_kill/checkpoints/step_00000008/model.bin" "$tmp/huge.bin"
expect_error "huge.bin: the loss of batch 1 is" ./eval_gpt --model "$tmp/huge.bin" --data "data/default/default_val_*.bin" \
  --batch_size 2 --seq_len 32 --batches 1
./sample_gpt --model "$tmp/huge.bin" --tokens 4 >"$tmp/huge.out" 2>"$tmp/huge.err"
rc=$?  # sample_gpt says what it loaded on stderr first
check "sample_gpt refuses it (exit $rc): $(tail -n 1 "$tmp/huge.err")" test $rc -eq 1 -a ! -s "$tmp/huge.out" -a \
  "$(tail -n 1 "$tmp/huge.err" | grep -c "^error: .*huge.bin: the forward pass gives NaN or inf logits")" -eq 1

# 5. Messages that name the file or the flag.
out=$tmp/state_msg
cp -r "$tmp/prune_kill" "$out" && rm -f "$out/.lock"
state=$out/checkpoints/step_00000008/state_rank0.bin
/usr/bin/python3 -c '
import json, struct, subprocess, sys
state, marker = sys.argv[1], sys.argv[2]
b = bytearray(open(state, "rb").read()); b[32:40] = struct.pack("<Q", 0xFFFFFFFF); open(state, "wb").write(bytes(b))
m = json.load(open(marker))
m["files"]["state_rank0.bin"]["xxh64"] = subprocess.check_output(["xxh64sum", state], text=True).split()[0]
open(marker, "w").write(json.dumps(m) + "\n")' "$state" "$out/checkpoints/step_00000008/COMPLETE"
expect_error "$state: data position: shard 4294967295 out of range" train --steps 10 --resume auto --out_dir "$out"
expect_error "--frobnicate: unknown flag" ./sample_gpt --model "$tmp/huge.bin" --frobnicate
expect_error "--frobnicate: unknown flag" ./eval_gpt --model "$tmp/huge.bin" --frobnicate
echo '{"body": "one document without a text field"}' >"$tmp/one.jsonl"
expect_error "one.jsonl:1: no string field 'text'" build/prepro_gpt2 --encoder data/cache/gpt2/encoder.json \
  --vocab data/cache/gpt2/vocab.bpe --out-dir "$tmp/prepro" --name one "$tmp/one.jsonl"

# 6. Each checkpoint's renames are made durable: its directory is synced after its files and after its marker.
check "the step directory is synced after the files' renames and after COMPLETE's" /usr/bin/python3 -c '
import sys
import os
log = [(c, os.path.abspath(p)) for c, p in (l.split(" ", 1) for l in open(sys.argv[1]).read().splitlines())]
d = os.path.abspath(sys.argv[2]) + "/checkpoints/step_00000006"
i = log.index(("rename", d + "/state_rank0.bin"))
j = log.index(("rename", d + "/COMPLETE"))
assert ("fsync", d) in log[i + 1:j], log[i:j]
assert log[j + 1] == ("fsync", d), log[j:j + 2]
' "$tmp/prune.log" "$tmp/prune"

# 7. A requeued run that died before its first checkpoint starts afresh; another run's metrics are still refused.
out=$tmp/requeue
./train_gpt_cpu "${base[@]}" --steps 300 --checkpoint_every 1000 --out_dir "$out" >/dev/null 2>&1 &
pid=$!
for _ in $(seq 300); do [[ $(grep -c . "$out/metrics.jsonl" 2>/dev/null) -ge 3 ]] && break; sleep 0.1; done
kill -9 $pid
wait $pid 2>/dev/null
expect_error "metrics.jsonl: holds another run's metrics" train --steps 8 --seed 7 --resume auto --out_dir "$out"
train --steps 8 --checkpoint_every 1000 --resume auto --out_dir "$out" >/dev/null 2>"$tmp/requeue.err"
check "the same run requeued with --resume auto starts afresh, with a warning" \
  grep -q "^warning: .*metrics.jsonl: the same run (config.json matches) ended before its first checkpoint" "$tmp/requeue.err"
check "and its metrics are the uninterrupted run's" diff <(losses "$out") "$tmp/ref.losses"

echo "$failures failure(s)"
[[ $failures -eq 0 ]]
