#!/usr/bin/env bash
# Elastic resume (docs/checkpoints.md, "Another number of ranks"): train_gpt_cpu on tiny GPT-2 with DeMo, a
# checkpoint of N ranks continued on M and back on N, for (N, M) in (1, 2), (2, 4), (4, 2), (2, 1):
#  - a resume onto M ranks with no step left saves the redistributed checkpoint: its model.bin is the old one byte
#    for byte, and each new rank's momentum is the rule applied to the old ranks' (elastic_checks.py reads the state
#    files and applies the rule with numpy, bit for bit; the mean over ranks kept); the mirror chain checks M -> N;
#  - over N -> M -> N the training windows the trainer traces (LLMC_TRACE_WINDOWS) are each read once and are
#    exactly the first windows of the first shard (--shuffle false), and the run ends at the step it should;
#  - with --shuffle on, a 2 -> 1 chain reads the same windows as one uninterrupted rank; a 1 -> 2 resume after an
#    odd number of windows skips one, says so, and repeats none; AdamW 2 -> 1 carries rank 0's moments;
#  - refused with one line: --demo_delay 1 saved mid-run, signum (no redistribution); sharded states are refused
#    by their fixed --shard_group_size and by the redistribution (test_reshard);
#  - the loss 2 -> 1 ranks after the redistribution and after --reset_momentum, printed (ELASTIC_K=N for longer
#    legs, the figures of docs/checkpoints.md).
# Skips without mpirun, the binary or /usr/bin/python3 with numpy.
set -uo pipefail
cd "$(dirname "$0")/../.."
source test/support/checks.sh
command -v mpirun >/dev/null || { echo "SKIP: mpirun not installed"; exit 77; }
py=/usr/bin/python3
[[ -x train_gpt_cpu ]] || { echo "SKIP: make train_gpt_cpu first"; exit 77; }
"$py" -c "import numpy" 2>/dev/null || { echo "SKIP: $py lacks numpy"; exit 77; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export OMP_NUM_THREADS=1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
data/prepare_default.sh >/dev/null

base=(--config configs/tiny.json --batch_size 4 --seq_len 32 --val_every 0 --lr 3e-3 --warmup_steps 2
      --threads 1 --sample_every 0 --optimizer demo)
# run NP LOG ARGS...: the trainer on NP ranks, tracing its windows, stdout and stderr to LOG
run() {
  local np=$1 log=$2
  shift 2
  LLMC_TRACE_WINDOWS=1 timeout 300 mpirun -np "$np" ./train_gpt_cpu "${base[@]}" "$@" >"$log" 2>&1 ||
    { fail "mpirun -np $np train_gpt_cpu $*"; tail -n 5 "$log"; return 1; }
}
# pycheck DESCRIPTION ARGS...: elastic_checks.py ARGS must pass; its line joins the description
pycheck() {
  local what=$1 out
  shift
  if out=$("$py" test/e2e/elastic_checks.py "$@" 2>&1); then pass "$what: $out"; else fail "$what: $out"; fi
}
ck() { printf '%s/checkpoints/step_%08d' "$1" "$2"; }
k=${ELASTIC_K:-2}  # steps per leg (even): the windows consumed (k*N, k*(N+M)) are multiples of both world sizes

for pair in "1 2" "2 4" "4 2" "2 1"; do
  read -r n m <<<"$pair"
  d=$tmp/chain_${n}_$m
  run "$n" "$d.a.log" --shuffle false --steps $k --out_dir "$d/a" || continue
  # onto M with no step left: the redistributed checkpoint, then k steps on M ranks
  run "$m" "$d.b0.log" --shuffle false --steps $k --out_dir "$d/b" --resume "$(ck "$d/a" $k)" || continue
  check "$n -> $m: the weights carry over (model.bin byte for byte)" cmp -s "$(ck "$d/a" $k)/model.bin" "$(ck "$d/b" $k)/model.bin"
  check "$n -> $m: the 'resumed from' line names the change and the rule" \
    grep -q "world size changed: $n -> $m ranks; data re-sliced; momenta: " "$d.b0.log"
  pycheck "$n -> $m" rule "$(ck "$d/a" $k)" "$(ck "$d/b" $k)"
  run "$m" "$d.b.log" --shuffle false --steps $((2 * k)) --out_dir "$d/b" --resume auto || continue
  # back onto N, k steps (M -> N's redistribution is checked in the mirror chain)
  run "$n" "$d.c.log" --shuffle false --steps $((3 * k)) --out_dir "$d/c" --resume "$(ck "$d/b" $((2 * k)))" || continue
  check "$m -> $n: the 'resumed from' line names the change" grep -q "world size changed: $m -> $n ranks; data re-sliced" "$d.c.log"
  pycheck "$n -> $m -> $n" windows $((k * (2 * n + m))) "$d".{a,b,c}.log
  check "$n -> $m -> $n: the run ends at step $((3 * k))" test -d "$(ck "$d/c" $((3 * k)))"
done

# shuffled: 2 ranks then 1 read what one rank reads uninterrupted (the window order does not depend on the ranks)
d=$tmp/shuffled
if run 2 "$d.a.log" --steps 2 --out_dir "$d/a" && run 1 "$d.b.log" --steps 4 --out_dir "$d/b" --resume "$(ck "$d/a" 2)" &&
   run 1 "$d.ref.log" --steps 6 --out_dir "$d/ref"; then
  pycheck "--shuffle on, 2 -> 1" windows "@$d.ref.log" "$d".{a,b}.log
fi
# 3 windows consumed, then 2 ranks: the 4th window is skipped to a whole group, none repeated
d=$tmp/odd
if run 1 "$d.a.log" --shuffle false --steps 3 --out_dir "$d/a" &&
   run 2 "$d.b.log" --shuffle false --steps 5 --out_dir "$d/b" --resume "$(ck "$d/a" 3)"; then
  check "1 -> 2 after 3 windows: the line says '1 window(s) skipped'" grep -q "1 window(s) skipped to a whole group of 2" "$d.b.log"
  pycheck "1 -> 2 after 3 windows" windows 0-2,4-7 "$d".{a,b}.log
fi
# AdamW: every rank's moments are the same; carried from rank 0
d=$tmp/adamw
if run 2 "$d.a.log" --optimizer adamw --steps 2 --out_dir "$d/a" &&
   run 1 "$d.b.log" --optimizer adamw --steps 2 --out_dir "$d/b" --resume "$(ck "$d/a" 2)"; then
  pycheck "adamw" rule "$(ck "$d/a" 2)" "$(ck "$d/b" 2)"
fi

# refused: the first stderr line is the trainer's error (mpirun adds its own after it)
refused() {  # refused NEEDLE CHECKPOINT ARGS...: 1 rank resuming CHECKPOINT must stop with one error line naming NEEDLE
  local needle=$1 from=$2
  shift 2
  timeout 120 ./train_gpt_cpu "${base[@]}" --out_dir "$tmp/refused" --resume "$from" "$@" >/dev/null 2>"$tmp/stderr"
  local rc=$?
  if [[ $rc -ne 0 && $(grep -c . "$tmp/stderr") -eq 1 ]] && grep -q "^error: .*$needle" "$tmp/stderr"; then
    pass "refuses: $(cat "$tmp/stderr")"
  else
    fail "expected one error line naming '$needle' (exit $rc: $(head -c 300 "$tmp/stderr"))"
  fi
}
d=$tmp/delayed
if run 2 "$d.log" --demo_delay 1 --steps 3 --checkpoint_every 2 --keep_checkpoints 0 --out_dir "$d"; then
  refused "state_rank0.bin: DeMo state holds a delayed round not yet applied" "$(ck "$d" 2)" --demo_delay 1 --steps 3
fi
d=$tmp/signum
if run 2 "$d.log" --optimizer signum --steps 1 --out_dir "$d"; then
  refused "its optimizer state (signum) cannot be redistributed" "$(ck "$d" 1)" --optimizer signum --steps 2
fi

# the loss after 2 -> 1 ranks from chain 2 1's checkpoint at step k: its 1-rank leg (the redistributed momenta)
# against --reset_momentum over the same steps (ELASTIC_K=N for longer legs: docs/checkpoints.md's figures)
d=$tmp/chain_2_1
if run 1 "$d.r.log" --shuffle false --steps $((2 * k)) --out_dir "$d/r" --resume "$(ck "$d/a" $k)" --reset_momentum; then
  check "--reset_momentum says so and re-slices the data too" \
    grep -q "with a fresh optimizer state (world size changed: 2 -> 1 ranks; data re-sliced; --reset_momentum)" "$d.r.log"
  echo "      2 -> 1 ranks at step $k; (step, loss) at the end: redistributed momenta" \
       "$("$py" test/e2e/elastic_checks.py loss "$d/b"), --reset_momentum $("$py" test/e2e/elastic_checks.py loss "$d/r")"
fi
[[ $failures -eq 0 ]] && echo "all elastic-resume checks passed" || echo "$failures check(s) failed"
[[ $failures -eq 0 ]]
