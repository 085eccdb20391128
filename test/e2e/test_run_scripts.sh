#!/usr/bin/env bash
# Checks the experiment launch scripts (scripts/run_experiment.sh and scripts/paper/*.sh) without training:
# every paper script's dry run prints an mpirun line with the paper's ranks, batch, schedule, optimizer
# settings, trainer and out_dir; environment and option overrides and trainer flags after '--' reach the
# command; bad settings give a one-line error and a non-zero exit; a real launch (with a stand-in mpirun
# and trainer) runs exactly the printed command and records it in <out_dir>/launch.txt.
set -uo pipefail
cd "$(dirname "$0")/../.."
TMP=build/test-tmp/run_scripts
rm -rf "$TMP" && mkdir -p "$TMP"
TMP=$(cd "$TMP" && pwd)
failures=0

check() {  # check <description> <command...>: passes when the command succeeds
  local what=$1
  shift
  if "$@"; then echo "ok    $what"; else echo "FAIL  $what"; failures=$((failures + 1)); fi
}
# Runs a script with a clean environment plus the given VAR=value words; sets $out, $err, $rc.
launch() {
  local vars=()
  while [[ $# -gt 0 && $1 == *=* && $1 != -* ]]; do vars+=("$1"); shift; done
  out=$(env -i PATH="$PATH" HOME="${HOME:-/tmp}" ${vars[@]+"${vars[@]}"} bash "$@" 2>"$TMP/stderr")
  rc=$?
  err=$(cat "$TMP/stderr")
}
command_line() { grep -v '^#' <<<"$out" | head -n 1; }  # the first line after the plan
has() { [[ " $(command_line) " == *" $1 "* ]]; }                # the command holds these words, in order
lacks() { [[ " $(command_line) " != *" $1 "* ]]; }
ends_with() { [[ "$(command_line)" == *" $1" ]]; }
one_line_error() { [[ $rc -ne 0 && $(wc -l <<<"$err") -eq 1 && $err == "run_experiment: error: "* && -z $out ]]; }

# ---- every paper script, paper defaults ------------------------------------------------------------------
for size in 300m 1b; do
  for variant in adamw demo_k1 demo_k2 demo_k4 demo_k8 demo_k16 demo_k32; do
    name=${size}_$variant script=scripts/paper/$name.sh
    [[ -x $script ]] || { check "$script exists and is executable" false; continue; }
    if [[ $variant == demo_k4 || $variant == adamw ]]; then launch "$script" --dry-run; else launch DRY_RUN=1 "$script"; fi
    check "$name: dry run exits 0 and prints one command" test "$rc" -eq 0 -a "$(grep -vc '^#' <<<"$out")" -eq 1
    check "$name: mpirun with 64 ranks" has "mpirun -np 64"
    check "$name: trainer ./train_gpt with the ${size} shape" has "./train_gpt --config configs/paper_${size}.json"
    check "$name: out_dir runs/$name" has "--out_dir runs/$name"
    check "$name: paper batch 2048 x 2048 tokens, micro-batch 8" \
      has "--total_batch_size 4194304 --batch_size 8 --seq_len 2048 --steps 23842"
    check "$name: paper schedule" \
      has "--lr 4e-4 --warmup_steps 250 --warmup_start_frac 0.1 --final_lr_frac 0.1 --grad_clip 1"
    check "$name: default shards" has "--train_data 'data/default/*_train_*.bin' --val_data 'data/default/*_val_*.bin'"
    if [[ $variant == adamw ]]; then
      check "$name: AdamW-DDP, wd 0.1, betas 0.9/0.95" has "--optimizer adamw --weight_decay 0.1 --beta1 0.9 --beta2 0.95"
      check "$name: no DeMo settings" lacks "--demo_topk"
    else
      k=${variant#demo_k}
      check "$name: DeMo top-$k, wd 0, chunk 64, decay 0.999" \
        has "--optimizer demo --weight_decay 0 --demo_topk $k --demo_chunk 64 --demo_decay 0.999"
    fi
  done
done

# ---- cluster launch from a hostfile ----------------------------------------------------------------------
launch HOSTFILE=scripts/paper/hostfile.example scripts/paper/1b_demo_k16.sh --dry-run
check "hostfile.example (8 x 8 slots): -np 64, 8 ranks per node" \
  has "mpirun -np 64 --hostfile scripts/paper/hostfile.example --map-by ppr:8:node"
printf '# four nodes\nnodeA slots=4\nnodeB slots=4   # comment\n\nnodeC slots=4\nnodeD slots=4\n' >"$TMP/hosts"
launch HOSTFILE="$TMP/hosts" scripts/paper/300m_adamw.sh --dry-run
check "4 x 4 slots: -np 16, 4 per node" has "mpirun -np 16 --hostfile $TMP/hosts --map-by ppr:4:node"
launch HOSTFILE="$TMP/hosts" NP=8 RANKS_PER_NODE=3 scripts/paper/300m_adamw.sh --dry-run
check "NP and RANKS_PER_NODE override the hostfile" has "mpirun -np 8 --hostfile $TMP/hosts --map-by ppr:3:node"
launch HOSTFILE="$TMP/hosts" NP=32 scripts/paper/300m_adamw.sh --dry-run
check "NP beyond the hostfile's nodes x ranks per node: one-line error" one_line_error

# ---- scaling down: environment, options and trainer flags ------------------------------------------------
launch NP=4 TRAINER=./train_gpt_cpu MODEL_CONFIG=configs/tiny.json STEPS=20 BATCH=32 DATA_DIR=/shards \
  RUNS_DIR="$TMP/runs" scripts/paper/300m_demo_k8.sh --dry-run -- --val_every 5 --sample_every 'a b'
check "scaled down: exit 0" test "$rc" -eq 0
check "NP=4 gives -np 4" has "mpirun -np 4"
check "TRAINER and MODEL_CONFIG" has "./train_gpt_cpu --config configs/tiny.json"
check "DATA_DIR sets the shard globs" has "--train_data '/shards/*_train_*.bin' --val_data '/shards/*_val_*.bin'"
check "RUNS_DIR sets out_dir" has "--out_dir $TMP/runs/300m_demo_k8"
check "SEQ_LEN follows the model's max_seq_len, BATCH 32 x 64 tokens, STEPS" \
  has "--total_batch_size 2048 --batch_size 8 --seq_len 64 --steps 20"
check "the script's top-k stays" has "--demo_topk 8"
check "trainer flags after -- come last, quoted" ends_with "--val_every 5 --sample_every 'a b'"
check "the plan names the accumulation" grep -q "2048 tokens/step = 8 x 64 tokens x 4 ranks x 1 accumulation" <<<"$out"

# ---- OLMo token files: a list of paths, the format, the dtype, the end-of-text id, a tokenizer.json --------
printf '/dolma/part-000-00000.npy\n/dolma/part-001-00000.npy\n' >"$TMP/dolma_paths.txt"
launch TRAIN_DATA="@$TMP/dolma_paths.txt" VAL_DATA= DATA_FORMAT=olmo MEMMAP_DTYPE=uint16 EOS_TOKEN_ID=50279 \
  TOKENIZER=/tok/tokenizer.json scripts/paper/300m_demo_k8.sh --dry-run
check "OLMo data: exit 0" test "$rc" -eq 0
check "TRAIN_DATA and an empty VAL_DATA replace DATA_DIR's globs" has "--train_data @$TMP/dolma_paths.txt --val_data ''"
check "DATA_FORMAT, MEMMAP_DTYPE, EOS_TOKEN_ID and TOKENIZER reach the trainer" \
  has "--data_format olmo --memmap_dtype uint16 --eos_token_id 50279 --tokenizer /tok/tokenizer.json"
check "the plan names the data" grep -q "^# data: train @$TMP/dolma_paths.txt, val none; format olmo (uint16), eos 50279" <<<"$out"
mkdir -p "$TMP/datadir" && : >"$TMP/datadir/tokenizer.json"
launch DATA_DIR="$TMP/datadir" scripts/paper/300m_adamw.sh --dry-run
check "DATA_DIR/tokenizer.json is the default tokenizer" has "--tokenizer $TMP/datadir/tokenizer.json"
check "no data settings: the trainer decides the format" lacks "--data_format"
launch DATA_FORMAT=npy scripts/paper/300m_adamw.sh --dry-run
check "DATA_FORMAT=npy: one-line error" one_line_error
launch MEMMAP_DTYPE=int16 scripts/paper/300m_adamw.sh --dry-run
check "MEMMAP_DTYPE=int16: one-line error" one_line_error
launch EOS_TOKEN_ID=-1 scripts/paper/300m_adamw.sh --dry-run
check "EOS_TOKEN_ID=-1: one-line error" one_line_error

launch scripts/paper/300m_demo_k2.sh --np=2 --name mine --model configs/small.json --micro-batch 4 --batch 8 \
  --steps 3 --runs-dir "$TMP/r" --trainer ./train_gpt_cpu --topk 3 --lr 1e-3 --resume none --dry-run
check "options: --np=2 --micro-batch --batch --steps --lr" \
  has "mpirun -np 2"
check "options reach the command" \
  has "--out_dir $TMP/r/mine --total_batch_size 1024 --batch_size 4 --seq_len 128 --steps 3 --lr 1e-3"
check "--topk after the script's overrides it" has "--demo_topk 3"
check "--resume none leaves --resume out" lacks "--resume"
check "--resume none starts over with --overwrite" has "--overwrite"
launch TOTAL_BATCH=0 NP=2 MICRO_BATCH=2 SEQ_LEN=32 STEPS=5 WARMUP=1 VAL_EVERY=2 WEIGHT_DECAY=0.05 \
  scripts/paper/1b_adamw.sh --dry-run
check "TOTAL_BATCH=0 (one micro-batch per rank), SEQ_LEN, WARMUP, VAL_EVERY, WEIGHT_DECAY" \
  has "--total_batch_size 128 --batch_size 2 --seq_len 32 --steps 5 --lr 4e-4 --warmup_steps 1"
check "WEIGHT_DECAY and VAL_EVERY" has "--weight_decay 0.05 --beta1 0.9 --beta2 0.95"
check "VAL_EVERY" has "--val_every 2"
launch NP=3 BATCH=10 scripts/paper/300m_adamw.sh --dry-run -- --batch_size=2 --total-batch-size 60
check "batch flags after -- skip the driver's batch check" test "$rc" -eq 0
check "STEPS from TOKENS at the tokens per step after -- (100B / 60 tokens)" has "--steps 1666666667"
launch NP=3 TOKENS=1000 scripts/run_experiment.sh --optimizer adamw --dry-run -- \
  --seq_len 16 --total-batch-size=0 --batch_size 2
check "--total_batch_size 0 after --: 2 x 16 x 3 ranks a step, 1000 tokens in 11 steps" has "--steps 11"
check "the plan counts the tokens per step after --" grep -q "^# 3 ranks; 96 tokens/step, .*; 11 steps" <<<"$out"
launch scripts/run_experiment.sh --optimizer demo --dry-run
check "the driver alone: DeMo top-32 on the 300M shape into runs/demo_k32" \
  has "--config configs/paper_300m.json"
check "the driver alone: names the run demo_k32" has "--out_dir runs/demo_k32"
launch scripts/paper/300m_adamw.sh --help
check "--help exits 0 and lists the settings" test "$rc" -eq 0 -a -n "$(grep -e '^  NP ' <<<"$out")"

# ---- bad settings: one line on stderr, non-zero exit ------------------------------------------------------
bad() {  # bad <description> <launch words...>
  local what=$1
  shift
  launch "$@"
  check "$what: one-line error, exit $rc" one_line_error
}
bad "unknown option" scripts/paper/300m_demo_k8.sh --bogus 3 --dry-run
bad "unknown option without a value" scripts/paper/300m_demo_k8.sh --dry-run --bogus
bad "NP not a number" NP=four scripts/paper/300m_demo_k8.sh --dry-run
bad "NP zero" NP=0 scripts/paper/300m_demo_k8.sh --dry-run
bad "--np without a value" scripts/paper/300m_demo_k8.sh --dry-run --np
bad "a stray word" scripts/paper/300m_demo_k8.sh --dry-run oops
bad "unknown optimizer" scripts/paper/300m_demo_k8.sh --optimizer sgd --dry-run
bad "top-k not a number" scripts/paper/300m_demo_k8.sh --topk x --dry-run
bad "lr not a number" LR=fast scripts/paper/300m_adamw.sh --dry-run
bad "a batch flag after -- not a number" scripts/paper/300m_adamw.sh --dry-run -- --total_batch_size=lots
bad "BATCH not a multiple of MICRO_BATCH x NP" NP=3 scripts/paper/300m_adamw.sh --dry-run
bad "missing model config" MODEL_CONFIG=configs/nope.json scripts/paper/300m_adamw.sh --dry-run
bad "missing hostfile" HOSTFILE=/nonexistent/hosts scripts/paper/300m_adamw.sh --dry-run
bad "DRY_RUN not 0/1" DRY_RUN=yes scripts/paper/300m_adamw.sh
bad "trainer not built" TRAINER="$TMP/no_such_trainer" RUNS_DIR="$TMP/runs" scripts/paper/300m_adamw.sh
bad "RUN_NAME '..' (the run would land outside RUNS_DIR)" RUNS_DIR="$TMP/runs" \
  scripts/paper/300m_adamw.sh --name .. --dry-run
bad "RUN_NAME '.'" RUNS_DIR="$TMP/runs" RUN_NAME=. scripts/paper/300m_adamw.sh --dry-run
bad "RUN_NAME with a slash" scripts/paper/300m_adamw.sh --name a/b --dry-run
bad "--lr 0 (not positive)" scripts/paper/300m_adamw.sh --lr 0 --dry-run
bad "LR=0.0e5 (not positive)" LR=0.0e5 scripts/paper/300m_adamw.sh --dry-run
launch scripts/paper/300m_adamw.sh --lr 1e-9 --dry-run
check "--lr 1e-9 is positive: accepted" test "$rc" -eq 0
bad "--dry-run=1" scripts/paper/300m_adamw.sh --dry-run=1
check "... says --dry-run takes no value" grep -q -- "--dry-run takes no value" <<<"$err"
bad "RUNS_DIR under a file, dry run" RUNS_DIR=configs/tiny.json/x scripts/paper/300m_adamw.sh --dry-run
bad "RUNS_DIR under a file, launch" RUNS_DIR=configs/tiny.json/x MPIRUN=none NP=1 BATCH=8 TRAINER=/bin/true \
  scripts/paper/300m_adamw.sh
launch RUNS_DIR=/proc/run_scripts_test MPIRUN=none NP=1 BATCH=8 TRAINER=/bin/true scripts/paper/300m_adamw.sh
check "RUNS_DIR that cannot be created (after the plan is printed): one-line error, exit $rc" \
  test "$rc" -eq 2 -a "$(wc -l <<<"$err")" -eq 1 -a \
  -n "$(grep -x "run_experiment: error: cannot create the run folder '/proc/run_scripts_test/300m_adamw' .*" <<<"$err")"
bad "2^32 x 2^32 x 2^32 batch geometry (no bash overflow)" MICRO_BATCH=4294967296 BATCH=4294967296 \
  SEQ_LEN=4294967296 scripts/paper/300m_adamw.sh --dry-run
bad "BATCH x SEQ_LEN over 2^62" BATCH=999999999999999 SEQ_LEN=999999 MICRO_BATCH=1 NP=1 \
  scripts/paper/300m_adamw.sh --dry-run
bad "STEPS x tokens per step over 2^62" STEPS=999999999999999 scripts/paper/300m_adamw.sh --dry-run
printf 'nodeA slots=99999999999\n' >"$TMP/hosts_huge"
bad "a hostfile's slots= too large" HOSTFILE="$TMP/hosts_huge" scripts/paper/300m_adamw.sh --dry-run
launch MICRO_BATCH=1 BATCH=64 SEQ_LEN=1 NP=64 TOKENS=999999999999999 scripts/paper/300m_adamw.sh --dry-run
check "large but representable settings still run (rc $rc)" test "$rc" -eq 0 -a -n "$(command_line)"

# ---- a real launch, with a stand-in mpirun and trainer ----------------------------------------------------
cat >"$TMP/fake_mpirun" <<'EOF'
#!/usr/bin/env bash
# Stand-in for mpirun: records its arguments one per line and exits with $FAKE_RC.
printf '%s\n' "$@" >"$FAKE_ARGS"
echo "fake mpirun ran"
exit "${FAKE_RC:-0}"
EOF
printf '#!/bin/sh\nexit 0\n' >"$TMP/fake_trainer"
chmod +x "$TMP/fake_mpirun" "$TMP/fake_trainer"
real=(MPIRUN="$TMP/fake_mpirun" FAKE_ARGS="$TMP/args" TRAINER="$TMP/fake_trainer" NP=2 STEPS=2 BATCH=16
      RUNS_DIR="$TMP/runs")
launch "${real[@]}" scripts/paper/300m_demo_k1.sh -- --sample_every 'x y'
run_dir=$TMP/runs/300m_demo_k1
check "launch: exit 0" test "$rc" -eq 0
check "launch: the launcher got exactly the printed words" \
  test "$(command_line)" == \
  "$(/usr/bin/python3 -c 'import shlex,sys; print(shlex.join(l.rstrip("\n") for l in open(sys.argv[1])))' "$TMP/args" \
     | sed "s|^|$TMP/fake_mpirun |")"
check "launch: a trainer flag with a space stays one word" grep -qx 'x y' "$TMP/args"
check "launch: launch.txt holds the command" \
  test "$(grep -v '^#' "$run_dir/launch.txt" 2>/dev/null)" == "$(command_line)"
check "launch: launch.txt notes the script" grep -q "by scripts/paper/300m_demo_k1.sh" "$run_dir/launch.txt"
check "launch: the console output goes to train.log" grep -q "fake mpirun ran" "$run_dir/train.log"
launch "${real[@]}" FAKE_RC=3 scripts/paper/300m_demo_k1.sh
check "launch: a failing launcher's exit status comes back ($rc)" test "$rc" -eq 3
check "launch: a second launch appends to launch.txt" test "$(grep -vc '^#' "$run_dir/launch.txt")" -eq 2

echo
if ((failures)); then echo "$failures check(s) failed"; exit 1; fi
echo "all run script checks passed"
