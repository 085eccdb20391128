#!/usr/bin/env bash
# PowerSGD (--optimizer powersgd), in two parts.
# 1. The optimizer against the PyTorch reference (dev/reference/powersgd_reference.py: W ranks simulated by lists
#    of gradients, torch's clip and AdamW): build/test/test_mpi_powersgd writes cases for 1, 2 and 4 ranks (rank 4
#    warm-started; rank 1 with a fresh Q every step), the reference runs them, and mpirun -np 1/2/4 compares the
#    weights, the averaged approximation and every rank's error buffer after every step (tolerances in
#    test/unit/test_mpi_powersgd.cpp), with bit-identical ranks, the ring model's bytes, a resume and refused blobs.
# 2. train_gpt_cpu on 2 ranks, tiny GPT-2, 8 steps: the loss falls; bytes_sent every step is the dry run's figure;
#    --weight_check_every 1 passes; a checkpoint at step 4 resumed gives bit-identical losses; --help lists the keys;
#    bad values give one-line errors; train_gpt (CUDA; or build/emu/train_gpt) refuses powersgd in one line.
# Skips without mpirun, the binaries, or /usr/bin/python3 with numpy and torch.
set -uo pipefail
cd "$(dirname "$0")/../.."
source test/support/checks.sh
command -v mpirun >/dev/null || { echo "SKIP: mpirun not installed"; exit 77; }
bin=build/test/test_mpi_powersgd
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
check "the reference ran ${#cases[@]} cases" "$py" dev/reference/powersgd_reference.py "${cases[@]}"
for np in 1 2 4; do
  if timeout 120 mpirun -np "$np" "$bin" --check-cases "$tmp/cases" >"$tmp/np$np.log" 2>&1; then
    pass "$np rank(s): PowerSGD matches the reference (rank 4 warm, rank 1 fresh Q), ranks bit-identical"
  else
    fail "$np rank(s): test_mpi_powersgd --check-cases"; tail -n 20 "$tmp/np$np.log"
  fi
  grep "rank(s):" "$tmp/np$np.log" | sed 's/^/      /'
done

# ---- 2. the trainer
base=(--config configs/tiny.json --batch_size 4 --seq_len 32 --val_every 0 --lr 3e-3 --warmup_steps 2
      --optimizer powersgd --powersgd_rank 2 --threads 1)
train() { timeout 120 mpirun -np 2 ./train_gpt_cpu "${base[@]}" "$@"; }
metric() {  # metric DIR FIELD: "step value" per train line
  "$py" -c 'import json,sys
for l in open(sys.argv[1] + "/metrics.jsonl"):
    j = json.loads(l)
    if j.get("type") == "train": print(j["step"], repr(j[sys.argv[2]]))' "$1" "$2"
}
out=$tmp/run
if train --steps 8 --out_dir "$out" --checkpoint_every 4 --keep_checkpoints 0 --weight_check_every 1 \
    >"$tmp/run.log" 2>&1; then
  metric "$out" loss >"$tmp/loss"
  read -r first last <<<"$(awk 'NR == 1 { f = $2 } { l = $2 } END { print f, l }' "$tmp/loss")"
  check "the loss falls over 8 steps ($first -> $last)" "$py" -c "import sys; sys.exit(not $last < $first - 0.2)"
  check "--weight_check_every 1: the weights agreed at every step (all 8 steps ran)" test "$(wc -l <"$tmp/loss")" -eq 8
  train --steps 8 --out_dir "$tmp/dry" --dry_run >"$tmp/dry.log" 2>&1
  sent=$(sed -n 's/.*ring all-reduces sent.*(\([0-9]*\) bytes).*/\1/p' "$tmp/dry.log")
  nparams=$(sed -n 's/^model .*: \([0-9,]*\) parameters.*/\1/p' "$tmp/dry.log" | tr -d ,)
  adamw=$(sed -n 's/.*AdamW-DDP fp32 ring all-reduce sent *\([0-9.]*\) MB.*/\1/p' "$tmp/dry.log")
  metric "$out" bytes_sent >"$tmp/bytes"
  bad=$(awk -v b="$sent" '$2 != b' "$tmp/bytes")
  check "bytes_sent is the dry run's $sent bytes at every step" test -n "$sent" -a -z "$bad"
  [[ -z $bad ]] || echo "      $(head -n 3 <<<"$bad" | tr '\n' ' ')"
  check "the dry run's AdamW-DDP figure is 4n bytes at 2 ranks ($adamw MB) and PowerSGD sends under half of it" \
    "$py" -c "import sys; sys.exit(not (abs(float('$adamw') * 1e6 - 4 * $nparams) < 1e3 and $sent < float('$adamw') * 1e6 / 2))"
else
  fail "8 steps on 2 ranks"; tail -n 15 "$tmp/run.log"
fi
ck=$out/checkpoints/step_00000004
if [[ -d $ck ]] && train --steps 8 --out_dir "$tmp/resumed" --resume "$ck" >"$tmp/resume.log" 2>&1; then
  metric "$tmp/resumed" loss >"$tmp/loss_resumed"
  check "a checkpoint at step 4 resumed gives bit-identical losses at steps 5-8" \
    cmp -s "$tmp/loss_resumed" <(awk '$1 > 4' "$tmp/loss")
else
  fail "resume from $ck"; tail -n 10 "$tmp/resume.log"
fi
one=(./train_gpt_cpu "${base[@]}" --steps 2 --out_dir "$tmp/bad")
# a resume with another rank: under mpirun the first line of stderr is the trainer's one-line error
train --steps 8 --out_dir "$tmp/resumed2" --resume "$ck" --powersgd_rank 3 >/dev/null 2>"$tmp/stderr"
check "a resume with --powersgd_rank 3 is refused: $(head -n 1 "$tmp/stderr")" \
  grep -q "^error.*powersgd_rank is 3 here" <(head -n 1 "$tmp/stderr")
check "--help lists the PowerSGD keys" bash -c "./train_gpt_cpu --help | grep -q -- --powersgd_rank &&
  ./train_gpt_cpu --help | grep -q -- --powersgd_warm_start && ./train_gpt_cpu --help | grep -q -- --powersgd_seed"
expect_error "--powersgd_rank must be >= 1 (got 0)" "${one[@]}" --powersgd_rank 0
expect_error "--powersgd_seed must be >= 0 (got -3)" "${one[@]}" --powersgd_seed -3
expect_error "--powersgd_warm_start" "${one[@]}" --powersgd_warm_start maybe
expect_error "--shard_group_size" "${one[@]}" --shard_group_size 2
./train_gpt_cpu "${base[@]}" --powersgd_rank 1000 --steps 2 --out_dir "$tmp/warn" --dry_run >/dev/null 2>"$tmp/warn.err"
check "--powersgd_rank 1000 warns that it compresses nothing" grep -q "powersgd_rank 1000 compresses no tensor" "$tmp/warn.err"
for cuda in ./train_gpt build/emu/train_gpt; do
  [[ -x $cuda ]] || continue
  expect_error "--optimizer: 'powersgd' has no CUDA implementation (train_gpt_cpu runs it)" \
    "$cuda" "${base[@]}" --steps 2 --out_dir "$tmp/cuda"
done

[[ $failures -eq 0 ]] && echo "all PowerSGD checks passed" || echo "$failures check(s) failed"
[[ $failures -eq 0 ]]
