#!/usr/bin/env bash
# The small-scale DeMo vs AdamW-DDP replication that docs/replication/ reports: 4 MPI ranks of the CPU trainer
# on one machine, the small GPT-2 of configs/small.json, the default corpus (data/prepare_default.sh).
# MODEL_CONFIG, TRAINER_FLAGS (words added to every run) and run_experiment.sh's data settings (TRAIN_DATA,
# VAL_DATA, DATA_FORMAT, MEMMAP_DTYPE, EOS_TOKEN_ID) change the model and data: scripts/replication_olmo.sh
# runs it on the paper's architecture and OLMo token files.
#   1. Learning-rate sweep: AdamW-DDP and DeMo (top-k 32, fp32 values) each try the same grid of peak learning
#      rates on a short run (same schedule shape, SWEEP_STEPS steps); the lowest final val loss wins. When the
#      winner sits on the edge of the grid, the grid grows by one point (x2 or /2) on that side and the sweep
#      goes on, so no optimizer is judged on a truncated grid.
#   2. Full runs, same seed (same data order), same steps and batch: AdamW-DDP at its best rate; DeMo at top-k
#      32, 8 and 1 and top-k 32 with 1-bit (sign) values, all at DeMo's best rate (DeMo's update is the sign of
#      the decoded momentum, so its step size does not depend on k or on the value encoding).
#   3. scripts/compare_runs.py draws the plots and writes the table into OUT (default docs/replication).
# Every run goes through scripts/run_experiment.sh, so each folder holds config.json (resolved config + code
# version), metrics.jsonl, launch.txt and train.log. Runs resume from their checkpoints when restarted, and
# finished runs are skipped, so an interrupted replication continues where it stopped. A run folder made with
# other settings (steps, warmup, validation interval, batch, sequence length, learning rate: a smoke run's, say)
# is refused with a one-line error rather than resumed on another schedule; give such runs their own RUNS.
# A run that diverges (its loss stops being finite: the trainer exits with status 3) does not stop the
# replication: in a sweep it counts as the worst point of the grid, and it is not run again on a restart.
#
#   bash scripts/replication.sh              # ~2 h on 2 cores; RUNS=runs/replication OUT=docs/replication
#   STEPS=300 SWEEP_STEPS=60 RUNS=runs/replication_smoke OUT=runs/replication_smoke/report \
#     bash scripts/replication.sh            # a quick smoke version, kept apart from the real runs and report
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

: "${RUNS:=runs/replication}" "${OUT:=docs/replication}" "${TRAINER:=./train_gpt_cpu}" "${NP:=4}"
: "${STEPS:=1200}" "${WARMUP:=100}" "${VAL_EVERY:=50}"
: "${SWEEP_STEPS:=400}" "${SWEEP_WARMUP:=40}" "${SWEEP_LRS:=2e-3 4e-3 8e-3}"
: "${MICRO_BATCH:=4}" "${SEQ_LEN:=128}" "${MODEL_CONFIG:=configs/small.json}" "${TRAINER_FLAGS:=}"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1

[[ -x $TRAINER ]] || { echo "replication: error: trainer '$TRAINER' not found: run 'make train_gpt_cpu'" >&2; exit 1; }
if [[ -v TRAIN_DATA ]]; then
  [[ $TRAIN_DATA == @* && -f ${TRAIN_DATA#@} ]] || compgen -G "$TRAIN_DATA" >/dev/null ||
    { echo "replication: error: TRAIN_DATA $TRAIN_DATA matches no file" >&2; exit 1; }
else
  ls data/default/default_train_*.bin >/dev/null 2>&1 ||
    { echo "replication: error: no shards in data/default: run 'bash data/prepare_default.sh'" >&2; exit 1; }
fi
read -r -a trainer_flags <<<"$TRAINER_FLAGS"

final_val() {  # final_val <run dir>: the last val loss in its metrics.jsonl, "diverged", or nothing
  /usr/bin/python3 - "$1/metrics.jsonl" <<'EOF'
import json, math, sys
last, diverged = None, False
def finite(x):
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
try:
    for line in open(sys.argv[1], errors="replace"):
        try:
            r = json.loads(line)
        except ValueError:
            continue
        if not isinstance(r, dict):
            continue
        # The trainer writes a NaN or infinite loss as null, then a "diverged" line, and exits with status 3.
        if r.get("type") == "diverged" or (r.get("type") == "train" and "loss" in r and not finite(r["loss"])):
            diverged = True
        elif r.get("type") == "val" and "val_loss" in r:
            last = r["val_loss"]
            diverged |= not finite(last)
except OSError:
    pass
if diverged:
    print("diverged")
elif last is not None:
    print(last)
EOF
}

finished() {  # finished <run dir> <steps>: metrics.jsonl has the val loss of the last step, or the run diverged
  [[ -f $1/metrics.jsonl ]] || return 1
  grep -q "\"type\":\"val\",\"step\":$2," "$1/metrics.jsonl" || [[ $(final_val "$1") == diverged ]]
}

same_settings() {  # same_settings <run dir> key=value...: refuses a run folder whose config.json has other values
  [[ -f $1/config.json ]] || return 0
  /usr/bin/python3 - "$@" <<'EOF' || exit 1
import json, sys
folder, wanted = sys.argv[1], dict(arg.split("=", 1) for arg in sys.argv[2:])
try:
    with open(f"{folder}/config.json") as f:
        config = json.load(f)
except (OSError, ValueError):
    sys.exit(0)  # no readable settings: the trainer itself decides
config = config if isinstance(config, dict) else {}
def differs(have, want):
    try:
        return abs(float(have) - float(want)) > 1e-9 * max(1.0, abs(float(want)))
    except (TypeError, ValueError):
        return str(have) != want
other = [f"{k}={config[k]} (not {v})" for k, v in wanted.items() if k in config and differs(config[k], v)]
if other:
    print(f"replication: error: {folder} holds a run made with other settings ({', '.join(other)}); use another "
          "RUNS for these settings, or delete that folder", file=sys.stderr)
    sys.exit(1)
EOF
}

run() {  # run <name> <steps> <warmup> <val every> <optimizer> <lr> [trainer flags...]
  local name=$1 steps=$2 warmup=$3 val_every=$4 optimizer=$5 lr=$6 rc=0
  shift 6
  same_settings "$RUNS/$name" steps="$steps" warmup_steps="$warmup" val_every="$val_every" \
    batch_size="$MICRO_BATCH" seq_len="$SEQ_LEN" lr="$lr"
  if finished "$RUNS/$name" "$steps"; then
    echo "replication: $name already finished (val $(final_val "$RUNS/$name"))"
    return
  fi
  echo "replication: $name: $optimizer lr $lr, $steps steps $(date +%H:%M:%S)"
  NP=$NP TRAINER=$TRAINER MODEL_CONFIG=$MODEL_CONFIG RUNS_DIR=$RUNS OPTIMIZER=$optimizer LR=$lr \
    MICRO_BATCH=$MICRO_BATCH SEQ_LEN=$SEQ_LEN BATCH=$((MICRO_BATCH * NP)) STEPS=$steps WARMUP=$warmup \
    VAL_EVERY=$val_every VAL_BATCHES=8 CHECKPOINT_EVERY=500 \
    scripts/run_experiment.sh --name "$name" -- --sample_every 0 --log_every 50 \
    ${trainer_flags[@]+"${trainer_flags[@]}"} "$@" >/dev/null || rc=$?
  local val
  val=$(final_val "$RUNS/$name")
  if [[ $rc -ne 0 && $val != diverged ]]; then  # (a diverged run exits with status 3; anything else is a failure)
    echo "replication: error: $name failed (exit $rc; see $RUNS/$name/train.log)" >&2
    exit 1
  fi
  echo "replication: $name: val ${val:-none} $(date +%H:%M:%S)"
}

# sweep <family> <optimizer> [trainer flags...]: prints the best learning rate on stdout (progress on stderr)
sweep() {
  local family=$1 optimizer=$2
  shift 2
  local -a lrs=($(for x in $SWEEP_LRS; do awk -v x="$x" 'BEGIN { printf "%g\n", x }'; done))
  local best="" best_loss=""
  while :; do
    for lr in "${lrs[@]}"; do
      run "sweep_${family}_lr$lr" "$SWEEP_STEPS" "$SWEEP_WARMUP" "$SWEEP_STEPS" "$optimizer" "$lr" "$@" >&2
    done
    best="" best_loss=""
    for lr in "${lrs[@]}"; do
      loss=$(final_val "$RUNS/sweep_${family}_lr$lr")
      [[ -n $loss ]] || { echo "replication: error: sweep run $family lr $lr has no val loss" >&2; exit 1; }
      [[ $loss == diverged ]] && continue  # the worst point of the grid: never the best
      if [[ -z $best_loss ]] || awk -v a="$loss" -v b="$best_loss" 'BEGIN { exit !(a < b) }'; then
        best=$lr best_loss=$loss
      fi
    done
    if [[ -z $best ]]; then
      echo "replication: error: every $family sweep run diverged (lr ${lrs[*]}); set lower SWEEP_LRS" >&2
      exit 1
    fi
    local sorted=($(printf '%s\n' "${lrs[@]}" | sort -g))
    if [[ $best == "${sorted[0]}" && ${#lrs[@]} -lt 6 ]]; then
      lrs=("$(awk -v x="$best" 'BEGIN { printf "%g", x / 2 }')" "${lrs[@]}")
    elif [[ $best == "${sorted[-1]}" && ${#lrs[@]} -lt 6 ]]; then
      lrs+=("$(awk -v x="$best" 'BEGIN { printf "%g", x * 2 }')")
    else
      break
    fi
  done
  echo "replication: $family best lr $best (val $best_loss after $SWEEP_STEPS steps)" >&2
  echo "$best"
}

mkdir -p "$RUNS" "$OUT"
adamw_lr=$(sweep adamw adamw)
demo_lr=$(sweep demo_k32 demo --demo_topk 32)
printf 'adamw %s\ndemo %s\n' "$adamw_lr" "$demo_lr" >"$RUNS/best_lr.txt"

run adamw "$STEPS" "$WARMUP" "$VAL_EVERY" adamw "$adamw_lr"
run demo_k32 "$STEPS" "$WARMUP" "$VAL_EVERY" demo "$demo_lr" --demo_topk 32
run demo_k8 "$STEPS" "$WARMUP" "$VAL_EVERY" demo "$demo_lr" --demo_topk 8
run demo_k1 "$STEPS" "$WARMUP" "$VAL_EVERY" demo "$demo_lr" --demo_topk 1
run demo_k32_sign "$STEPS" "$WARMUP" "$VAL_EVERY" demo "$demo_lr" --demo_topk 32 --demo_values sign

/usr/bin/python3 scripts/compare_runs.py "$RUNS"/adamw "$RUNS"/demo_k32 "$RUNS"/demo_k8 "$RUNS"/demo_k1 \
  "$RUNS"/demo_k32_sign --out "$OUT" --table "$OUT/table.md" --smooth 20
/usr/bin/python3 scripts/compare_runs.py "$RUNS"/sweep_* --out "$OUT/sweep" --table "$OUT/sweep/table.md"
echo "replication: done; plots and table in $OUT"
