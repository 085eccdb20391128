#!/usr/bin/env bash
# Checks scripts/replication.sh's logic without training: a stand-in trainer (no MPI: MPIRUN=none, NP=1) writes
# a val loss that is a parabola in log2(lr) with its minimum at 0.016 for AdamW and 0.001 for DeMo, both
# outside the default sweep grid (2e-3, 4e-3, 8e-3). The sweep must grow the grid on the right side until the
# best rate is inside it (and no further), run the five full runs at the chosen rates with the right DeMo
# settings, write the table and plots, and skip every finished run when started again. Then: a sweep point
# whose run diverges (the stand-in trainer's null loss, "diverged" line and exit 3 at lr >= FAKE_DIVERGE_LR)
# counts as the worst point and the replication goes on; a run folder made with another STEPS is refused with
# a one-line error; a trainer failure (exit 1) stops it; the documented smoke command has its own RUNS and OUT.
set -uo pipefail
cd "$(dirname "$0")/../.."
TMP=build/test-tmp/replication
rm -rf "$TMP" && mkdir -p "$TMP"
TMP=$(cd "$TMP" && pwd)
failures=0
check() {  # check <description> <command...>
  local what=$1
  shift
  if "$@"; then echo "ok    $what"; else echo "FAIL  $what"; failures=$((failures + 1)); fi
}

cat >"$TMP/fake_trainer" <<'EOF'
#!/usr/bin/env bash
echo "$*" >>"$FAKE_LOG.args"
lr= out= steps= opt= topk=32 values=fp32
while [[ $# -gt 0 ]]; do
  case $1 in
    --lr) lr=$2; shift ;; --out_dir) out=$2; shift ;; --steps) steps=$2; shift ;; --optimizer) opt=$2; shift ;;
    --demo_topk) topk=$2; shift ;; --demo_values) values=$2; shift ;;
  esac
  shift
done
echo "$out" >>"$FAKE_LOG"
mkdir -p "$out"
[[ -n ${FAKE_FAIL:-} ]] && { echo "error: stand-in failure" >&2; exit 1; }
best=0.001; [[ $opt == adamw ]] && best=0.016
val=$(awk -v lr="$lr" -v b="$best" 'BEGIN { x = log(lr / b) / log(2); printf "%.6f", 4 + x * x }')
printf '{"optimizer":"%s","lr":%s,"weight_decay":0,"steps":%s,"demo_topk":%s,"demo_values":"%s","_run":{"world_size":1}}\n' \
  "$opt" "$lr" "$steps" "$topk" "$values" >"$out/config.json"
: >"$out/metrics.jsonl"
for ((s = 1; s <= steps; s++)); do
  printf '{"type":"train","step":%d,"loss":%s,"tokens":%d,"step_ms":10,"comm_ms":1,"bytes_sent":100,"payload_bytes":50,"tok_per_s":1000}\n' \
    "$s" "$val" $((s * 512)) >>"$out/metrics.jsonl"
done
if [[ -n ${FAKE_DIVERGE_LR:-} ]] && awk -v a="$lr" -v b="$FAKE_DIVERGE_LR" 'BEGIN { exit !(a >= b) }'; then
  printf '{"type":"train","step":%d,"loss":null,"grad_norm":null}\n{"type":"diverged","step":%d,"loss":null}\n' \
    "$((steps + 1))" "$((steps + 1))" >>"$out/metrics.jsonl"  # (as the trainer: no val line, exit status 3)
  echo "error: step $((steps + 1)): the loss is nan: training diverged" >&2
  exit 3
fi
printf '{"type":"val","step":%d,"val_loss":%s,"tokens":%d}\n' "$steps" "$val" $((steps * 512)) >>"$out/metrics.jsonl"
EOF
chmod +x "$TMP/fake_trainer"

run_replication() {  # run_replication [VAR=value...]: the variables below can be overridden
  env FAKE_LOG="$TMP/launches" MPIRUN=none NP=1 TRAINER="$TMP/fake_trainer" RUNS="$TMP/runs" OUT="$TMP/out" \
    FAKE_DIVERGE_LR=0.03 STEPS=6 WARMUP=1 VAL_EVERY=3 SWEEP_STEPS=3 SWEEP_WARMUP=1 "$@" \
    bash scripts/replication.sh >"$TMP/log" 2>&1
}
run_replication
rc=$?
check "replication.sh succeeds with a stand-in trainer (rc $rc)" test "$rc" -eq 0
check "AdamW's best rate 0.016 (grid grown upwards)" grep -qx "adamw 0.016" "$TMP/runs/best_lr.txt"
check "DeMo's best rate 0.001 (grid grown downwards)" grep -qx "demo 0.001" "$TMP/runs/best_lr.txt"
check "the AdamW sweep went one point past its best (0.032)" test -f "$TMP/runs/sweep_adamw_lr0.032/metrics.jsonl"
# (That point diverges: FAKE_DIVERGE_LR=0.03. It counts as the worst point, and the replication goes on.)
check "the diverged sweep run is reported as diverged" grep -q "sweep_adamw_lr0.032: val diverged" "$TMP/log"
check "... the sweep table says so" grep -q "diverged at step 4" "$TMP/out/sweep/table.md"
check "... and no further (no 0.064)" test ! -e "$TMP/runs/sweep_adamw_lr0.064"
check "the DeMo sweep went one point below its best (0.0005)" test -f "$TMP/runs/sweep_demo_k32_lr0.0005/metrics.jsonl"
check "... and no further (no 0.00025)" test ! -e "$TMP/runs/sweep_demo_k32_lr0.00025"
check "full AdamW run at 0.016" grep -q '"lr":0.016,' "$TMP/runs/adamw/config.json"
check "DeMo k=8 run at 0.001 with top-k 8" grep -q '"lr":0.001,.*"demo_topk":8,' "$TMP/runs/demo_k8/config.json"
check "DeMo k=1 run with top-k 1" grep -q '"demo_topk":1,' "$TMP/runs/demo_k1/config.json"
check "1-bit run: top-k 32, sign values" grep -q '"demo_topk":32,"demo_values":"sign"' "$TMP/runs/demo_k32_sign/config.json"
check "full runs have 6 steps" grep -q '"type":"val","step":6,' "$TMP/runs/demo_k1/metrics.jsonl"
check "table lists the five full runs" test "$(grep -c '^| \(adamw\|demo_k32\|demo_k8\|demo_k1\|demo_k32_sign\) |' "$TMP/out/table.md" 2>/dev/null)" -eq 5
check "loss plots written" test -s "$TMP/out/loss_vs_step.png" -a -s "$TMP/out/loss_vs_bytes_sent.png"
check "sweep table written" test -s "$TMP/out/sweep/table.md"
launches=$(wc -l <"$TMP/launches")
run_replication
check "a second start re-launches nothing (finished and diverged runs skipped)" \
  test "$(wc -l <"$TMP/launches")" -eq "$launches"


# A refused run folder: the same RUNS with another STEPS (the sweeps match, the full runs do not).
launches=$(wc -l <"$TMP/launches")
run_replication STEPS=8
rc=$?
check "another STEPS on the same RUNS: refused (rc $rc)" test "$rc" -ne 0
check "... with one error line naming the folder and the steps" \
  test "$(grep -c 'error' "$TMP/log")" -eq 1 -a \
  -n "$(grep "replication: error: $TMP/runs/adamw holds a run made with other settings (steps=6 (not 8))" "$TMP/log")"
check "... and nothing launched" test "$(wc -l <"$TMP/launches")" -eq "$launches"
check "... and the finished run kept" grep -q '"type":"val","step":6,' "$TMP/runs/adamw/metrics.jsonl"

run_replication RUNS="$TMP/runs_alldiv" OUT="$TMP/out_alldiv" FAKE_DIVERGE_LR=0.0001
rc=$?
check "every sweep point diverged: one error line, rc $rc" \
  test "$rc" -ne 0 -a "$(grep -c "error: every adamw sweep run diverged" "$TMP/log")" -eq 1
run_replication RUNS="$TMP/runs_fail" OUT="$TMP/out_fail" FAKE_FAIL=1
rc=$?
check "a trainer failure (exit 1) stops the replication with an error naming the run (rc $rc)" \
  test "$rc" -ne 0 -a -n "$(grep 'replication: error: sweep_adamw_lr0.002 failed (exit 1' "$TMP/log")"

# Another model and data (what scripts/replication_olmo.sh sets): every run gets them.
run_replication RUNS="$TMP/runs_olmo" OUT="$TMP/out_olmo" FAKE_LOG="$TMP/launches_olmo" MODEL_CONFIG=configs/small_olmo.json \
  TRAINER_FLAGS="--vocab_size 50257 --eos_token_id 50256" TRAIN_DATA="@$TMP/fake_train.txt" DATA_FORMAT=olmo
rc=$?
check "TRAIN_DATA naming no file: refused (rc $rc)" \
  test "$rc" -ne 0 -a -n "$(grep "replication: error: TRAIN_DATA @$TMP/fake_train.txt matches no file" "$TMP/log")"
echo /data/part-0.npy >"$TMP/fake_train.txt"
run_replication RUNS="$TMP/runs_olmo" OUT="$TMP/out_olmo" FAKE_LOG="$TMP/launches_olmo" MODEL_CONFIG=configs/small_olmo.json \
  TRAINER_FLAGS="--vocab_size 50257 --eos_token_id 50256" TRAIN_DATA="@$TMP/fake_train.txt" DATA_FORMAT=olmo
rc=$?
check "MODEL_CONFIG, TRAINER_FLAGS and the data settings: rc $rc" test "$rc" -eq 0
check "... every launch has the model, the data and the flags" test "$(grep -c -- \
  "--config configs/small_olmo.json --train_data @$TMP/fake_train.txt .*--data_format olmo .*--vocab_size 50257 --eos_token_id 50256" \
  "$TMP/launches_olmo.args")" -eq "$(wc -l <"$TMP/launches_olmo")"

# The documented smoke command must not write into the full run's RUNS or OUT.
smoke=$(grep -A1 'STEPS=300 SWEEP_STEPS=60' scripts/replication.sh | tr -d '\\\n')
check "the header's smoke command sets its own RUNS and OUT ($smoke)" \
  eval '[[ $smoke =~ RUNS=([^ ]+) && ${BASH_REMATCH[1]} != runs/replication &&
          $smoke =~ OUT=([^ ]+) && ${BASH_REMATCH[1]} != docs/replication* ]]'

if ((failures)); then
  echo "$failures check(s) failed; log:"
  tail -20 "$TMP/log"
  exit 1
fi
echo "all replication checks passed"
