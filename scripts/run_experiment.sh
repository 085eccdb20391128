#!/usr/bin/env bash
# The one launch driver for the DeMo-paper experiments and their variants. It resolves the paper's schedule
# and batch, the MPI launch (hostfile, ranks per node) and the run folder from defaults < environment
# variables < options, prints the resolved mpirun command, appends it to <out_dir>/launch.txt and runs it.
# scripts/paper/*.sh call it with their model shape, optimizer and top-k; `--help` lists every setting.
set -euo pipefail

readonly PROG=run_experiment
readonly PAPER_BATCH_SEQS=2048      # global batch: 2048 sequences of 2048 tokens = 4,194,304 tokens per step
readonly PAPER_SEQ_LEN=2048
readonly PAPER_MICRO_BATCH=8
readonly PAPER_TOKENS=100000000000  # 100B tokens -> 23,842 steps at 4,194,304 tokens per step
readonly PAPER_RANKS=64             # 8 nodes x 8 GPUs

die() {
  echo "$PROG: error: $*" >&2
  exit 2
}

usage() {
  cat <<'EOF'
usage: scripts/run_experiment.sh [options] [--dry-run] [-- trainer flags...]
       scripts/paper/<experiment>.sh [options] [--dry-run] [-- trainer flags...]

Launches one training run with mpirun, with the DeMo paper's schedule and batch unless told otherwise.
Every setting is an environment variable; the option of the same name (lower case, '-' for '_') overrides
it, e.g. NP=4 or --np 4. Relative paths are relative to the repository root (the driver runs from there).

launch:
  NP                 ranks in all [NP, else the hostfile's total slots, else 64]
  HOSTFILE           Open MPI hostfile ('host slots=N' lines) [none: ranks start on this machine]
  RANKS_PER_NODE     ranks per node, passed as --map-by ppr:N:node [the hostfile's first slots= value]
  MPIRUN             launcher [mpirun]; 'none' runs the trainer directly (NP must be 1)
  MPIRUN_ARGS        extra launcher words, split on spaces, e.g. "-x NCCL_DEBUG=INFO"
  TRAINER            trainer binary [./train_gpt]; ./train_gpt_cpu takes the same flags
  DATA_DIR           folder of token shards *_train_*.bin and *_val_*.bin [data/default]
  TRAIN_DATA         training data: a glob, or @FILE for a list file (a path per line), of llm.c shards
                     or OLMo token files; replaces DATA_DIR's glob [DATA_DIR/*_train_*.bin]
  VAL_DATA           validation data, as TRAIN_DATA; '' for none [DATA_DIR/*_val_*.bin]
  DATA_FORMAT        llmc, olmo or auto (by the files: llm.c shards carry a header) [auto]
  MEMMAP_DTYPE       token type of OLMo files: uint8, uint16, uint32, uint64 [uint16]
  EOS_TOKEN_ID       end-of-text id of the data's tokenizer [the model config's, else its family's:
                     GPT-2 50256, OLMo 50279]
  TOKENIZER          tokenizer for text samples: tokenizer.json, or an llm.c tokenizer.bin
                     [DATA_DIR/tokenizer.json, else DATA_DIR/tokenizer.bin, when there]
  RUNS_DIR           parent of run folders [runs]
  RUN_NAME           (--name) run folder name: out_dir = RUNS_DIR/RUN_NAME [set by the paper script]
  RESUME             'auto' continues from the newest checkpoint in out_dir, if any; 'none' starts over
                     (deleting out_dir's checkpoints: --overwrite);
                     anything else is a checkpoint directory [auto]
  DRY_RUN            1 (or --dry-run): print the resolved command and exit without running

model and optimizer:
  MODEL_CONFIG       (--model) JSON config giving the model (the paper's OLMo) [configs/paper_300m.json]
  OPTIMIZER          adamw (AdamW-DDP, betas 0.9/0.95) or demo (decay 0.999, chunk 64) [required]
  TOPK               DeMo coefficients sent per 64x64 chunk [32]
  LR                 peak learning rate [4e-4]
  WEIGHT_DECAY       decoupled weight decay [demo: 0, adamw: 0.1]

batch and schedule (paper: 2048 x 2048 tokens per step, micro-batch 8, 100B tokens):
  BATCH              global batch in sequences per optimizer step [2048]
  MICRO_BATCH        sequences per rank per forward/backward (batch_size) [8]
  SEQ_LEN            tokens per sequence [2048, or the model config's max_seq_len if smaller]
  TOTAL_BATCH        tokens per optimizer step; replaces BATCH x SEQ_LEN (0 = MICRO_BATCH x SEQ_LEN x NP)
  TOKENS             training tokens, giving the default STEPS [100000000000]
  STEPS              optimizer steps [ceil(TOKENS / tokens per step) = 23842 for the paper]
  WARMUP             warmup steps, rising from 0.1 x LR; cosine decay to 0.1 x LR follows [250]
  VAL_EVERY          validation every N steps [STEPS / 100, at least 1]
  VAL_BATCHES        validation micro-batches per rank [8]
  CHECKPOINT_EVERY   checkpoint every N steps (one is always written at the end) [1000]

Flags after '--' go to the trainer last, so they override anything above (./train_gpt_cpu --help lists them).
The trainer writes config.json and metrics.jsonl into out_dir; this driver adds launch.txt (every launch
command, appended) and train.log (the console output).

examples:
  HOSTFILE=scripts/paper/hostfile.example scripts/paper/300m_demo_k8.sh --dry-run
  NP=4 TRAINER=./train_gpt_cpu MODEL_CONFIG=configs/tiny.json STEPS=20 BATCH=32 MICRO_BATCH=8 \
      RUNS_DIR=runs/tiny scripts/paper/300m_demo_k8.sh -- --val_every 5
EOF
}

# ---- settings: defaults < environment < options --------------------------------------------------------
readonly SETTINGS=(NP HOSTFILE RANKS_PER_NODE MPIRUN MPIRUN_ARGS TRAINER DATA_DIR TRAIN_DATA VAL_DATA DATA_FORMAT
                   MEMMAP_DTYPE EOS_TOKEN_ID TOKENIZER RUNS_DIR RUN_NAME RESUME
                   DRY_RUN MODEL_CONFIG OPTIMIZER TOPK LR WEIGHT_DECAY BATCH MICRO_BATCH SEQ_LEN TOTAL_BATCH
                   TOKENS STEPS WARMUP VAL_EVERY VAL_BATCHES CHECKPOINT_EVERY)
# Settings whose default is derived from others (NP, SEQ_LEN, STEPS...) stay unset until resolved below.
: "${MPIRUN:=mpirun}" "${TRAINER:=./train_gpt}" "${DATA_DIR:=data/default}" "${RUNS_DIR:=runs}"
: "${RESUME:=auto}" "${DRY_RUN:=0}" "${MODEL_CONFIG:=configs/paper_300m.json}" "${TOPK:=32}"
: "${LR:=4e-4}" "${BATCH:=$PAPER_BATCH_SEQS}" "${MICRO_BATCH:=$PAPER_MICRO_BATCH}" "${TOKENS:=$PAPER_TOKENS}"
: "${WARMUP:=250}" "${VAL_BATCHES:=8}" "${CHECKPOINT_EVERY:=1000}"

# Options: --np 4, --np=4, --name/--model as short forms of --run-name/--model-config.
extra_args=()
while (($# > 0)); do
  arg=$1
  shift
  case $arg in
    --) extra_args=("$@"); break ;;
    -h | --help) usage; exit 0 ;;
    --dry-run) DRY_RUN=1; continue ;;
    --dry-run=*) die "--dry-run takes no value (use --dry-run, or DRY_RUN=1)" ;;
    --*=*) key=${arg%%=*} value=${arg#*=} has_value=1 ;;
    --?*) key=$arg value= has_value=0 ;;
    *) die "unexpected argument '$arg' (options look like --np 4; trainer flags go after --)" ;;
  esac
  case $key in
    --name) var=RUN_NAME ;;
    --model) var=MODEL_CONFIG ;;
    *)
      var=${key#--}
      var=${var//-/_}
      var=${var^^}
      [[ " ${SETTINGS[*]} " == *" $var "* && $var != DRY_RUN ]] || die "unknown option '$key' (see --help)"
      ;;
  esac
  if ((!has_value)); then
    (($# > 0)) || die "$key needs a value"
    value=$1
    shift
  fi
  declare "$var=$value"
done

# ---- validation ------------------------------------------------------------------------------------------
cd "$(dirname "${BASH_SOURCE[0]}")/.."

is_count() { [[ $1 =~ ^0*[1-9][0-9]{0,14}$ ]]; }  # 1 and up (15 digits keep every product in 64 bits)
is_count_or_zero() { [[ $1 =~ ^[0-9]{1,15}$ ]]; }
is_number() { [[ $1 =~ ^([0-9]+\.?[0-9]*|\.[0-9]+)([eE][-+]?[0-9]+)?$ ]]; }
is_positive_number() { is_number "$1" && awk -v x="$1" 'BEGIN { exit !(x + 0 > 0) }'; }
need() {  # need <check> <NAME> <what>: checks the setting NAME's value (and writes whole numbers as decimal)
  local check=$1 name=$2 what=$3
  "$check" "${!name}" || die "$name must be $what, got '${!name}'"
  [[ $check == is_number || $check == is_positive_number ]] || declare -g "$name=$((10#${!name}))"
}

[[ -n ${OPTIMIZER:-} ]] || die "OPTIMIZER is not set (use --optimizer adamw or --optimizer demo)"
[[ $OPTIMIZER == adamw || $OPTIMIZER == demo ]] || die "OPTIMIZER must be adamw or demo, got '$OPTIMIZER'"
[[ $DRY_RUN == 0 || $DRY_RUN == 1 ]] || die "DRY_RUN must be 0 or 1, got '$DRY_RUN'"
[[ -v NP ]] && need is_count NP "a whole number >= 1"
[[ -v RANKS_PER_NODE ]] && need is_count RANKS_PER_NODE "a whole number >= 1"
need is_count TOPK "a whole number >= 1"
need is_count BATCH "a whole number of sequences >= 1"
need is_count MICRO_BATCH "a whole number of sequences >= 1"
[[ -v SEQ_LEN ]] && need is_count SEQ_LEN "a whole number of tokens >= 1"
[[ -v TOTAL_BATCH ]] && need is_count_or_zero TOTAL_BATCH "a whole number of tokens (0 = one micro-batch per rank)"
need is_count TOKENS "a whole number of tokens >= 1"
[[ -v STEPS ]] && need is_count STEPS "a whole number >= 1"
need is_count_or_zero WARMUP "a whole number >= 0"
[[ -v VAL_EVERY ]] && need is_count_or_zero VAL_EVERY "a whole number >= 0"
need is_count_or_zero VAL_BATCHES "a whole number >= 0"
need is_count_or_zero CHECKPOINT_EVERY "a whole number >= 0"
need is_positive_number LR "a positive number"
[[ -v WEIGHT_DECAY ]] && need is_number WEIGHT_DECAY "a number >= 0"
[[ -f $MODEL_CONFIG ]] || die "MODEL_CONFIG '$MODEL_CONFIG' is not a file (paths are relative to $(pwd))"
[[ -n $RUNS_DIR ]] || die "RUNS_DIR must not be empty"
[[ -v TRAIN_DATA ]] || TRAIN_DATA="$DATA_DIR/*_train_*.bin"
[[ -v VAL_DATA ]] || VAL_DATA="$DATA_DIR/*_val_*.bin"
[[ -n $TRAIN_DATA ]] || die "TRAIN_DATA must not be empty"
[[ ! -v DATA_FORMAT || $DATA_FORMAT =~ ^(llmc|olmo|auto)$ ]] || die "DATA_FORMAT must be llmc, olmo or auto, got '$DATA_FORMAT'"
[[ ! -v MEMMAP_DTYPE || $MEMMAP_DTYPE =~ ^uint(8|16|32|64)$ ]] ||
  die "MEMMAP_DTYPE must be uint8, uint16, uint32 or uint64, got '$MEMMAP_DTYPE'"
[[ -v EOS_TOKEN_ID ]] && need is_count_or_zero EOS_TOKEN_ID "a token id >= 0"
if [[ ! -v TOKENIZER ]]; then
  TOKENIZER=
  for candidate in "$DATA_DIR/tokenizer.bin" "$DATA_DIR/tokenizer.json"; do  # (the later one wins)
    [[ -f $candidate ]] && TOKENIZER=$candidate
  done
fi
# The run folder's place must be a folder, or one that can be made (checked in dry runs too).
runs_dir_up=$RUNS_DIR
while [[ ! -e $runs_dir_up && $runs_dir_up == */* ]]; do runs_dir_up=${runs_dir_up%/*}; done
[[ -z $runs_dir_up || ! -e $runs_dir_up || -d $runs_dir_up ]] ||
  die "RUNS_DIR '$RUNS_DIR' cannot hold run folders: '$runs_dir_up' is not a folder"

# Hostfile: one host per line, 'name slots=N' (a line without slots= counts 1, as Open MPI does).
hosts=0 hostfile_slots=0 first_host_slots=
if [[ -n ${HOSTFILE:-} ]]; then
  [[ -f $HOSTFILE ]] || die "HOSTFILE '$HOSTFILE' does not exist"
  while read -r line || [[ -n $line ]]; do  # (the last line may lack its newline)
    line=${line%%#*}
    [[ $line =~ [^[:space:]] ]] || continue
    slots=1
    if [[ $line =~ (^|[[:space:]])slots=([0-9]+) ]]; then
      ((${#BASH_REMATCH[2]} <= 9)) || die "HOSTFILE '$HOSTFILE': slots=${BASH_REMATCH[2]} is too large"
      slots=$((10#${BASH_REMATCH[2]}))
    fi
    hosts=$((hosts + 1)) hostfile_slots=$((hostfile_slots + slots))
    [[ -n $first_host_slots ]] || first_host_slots=$slots
  done <"$HOSTFILE"
  ((hosts > 0)) || die "HOSTFILE '$HOSTFILE' lists no hosts"
fi
np_given=0
[[ -v NP ]] && np_given=1
if [[ ! -v NP ]]; then
  if ((hosts > 0)); then NP=$hostfile_slots; else NP=$PAPER_RANKS; fi
fi
if [[ ! -v RANKS_PER_NODE && -n $first_host_slots ]]; then RANKS_PER_NODE=$first_host_slots; fi
if ((hosts > 0)) && [[ -v RANKS_PER_NODE ]] && ((NP > hosts * RANKS_PER_NODE)); then
  die "NP=$NP ranks do not fit $hosts host(s) x RANKS_PER_NODE=$RANKS_PER_NODE"
fi
if [[ $MPIRUN == none ]] && ((NP != 1)); then die "MPIRUN=none runs a single process, but NP=$NP"; fi

# Sequence length: the paper's 2048 unless the model's positions are fewer (a scaled-down shape).
model_max_seq_len=$(sed -n 's/.*"max_seq_len"[[:space:]]*:[[:space:]]*\([0-9][0-9]*\).*/\1/p' "$MODEL_CONFIG" | head -n 1)
: "${model_max_seq_len:=1024}"  # the trainer's default when the file does not set it
if [[ ! -v SEQ_LEN ]]; then
  SEQ_LEN=$PAPER_SEQ_LEN
  if ((model_max_seq_len < SEQ_LEN)); then
    SEQ_LEN=$model_max_seq_len
    echo "$PROG: note: SEQ_LEN=$SEQ_LEN, the max_seq_len of $MODEL_CONFIG" >&2
  fi
fi

# Trainer flags after '--' that change the batch geometry make the driver's batch checks moot, but not its
# tokens per step: STEPS (from TOKENS) and the plan's token count take them from those flags' last values.
batch_from_trainer_args=0
trainer_micro_batch=$MICRO_BATCH trainer_seq_len=$SEQ_LEN trainer_total_batch=
for ((i = 0; i < ${#extra_args[@]}; i++)); do
  arg=${extra_args[i]}
  key=${arg%%=*}
  key=${key//-/_}
  case $key in __batch_size | __seq_len | __total_batch_size) ;; *) continue ;; esac
  if [[ $arg == *=* ]]; then value=${arg#*=}; else value=${extra_args[i + 1]:-}; fi
  [[ $value =~ ^[0-9]{1,15}$ ]] || die "trainer flag ${arg%%=*} after -- needs a whole number, got '$value'"
  value=$((10#$value))
  case $key in
    __batch_size) trainer_micro_batch=$value ;;
    __seq_len) trainer_seq_len=$value ;;
    __total_batch_size) trainer_total_batch=$value ;;
  esac
  batch_from_trainer_args=1
done

# Products of settings (up to 15 digits each) must stay far from bash's 64-bit limit: at most 2^62.
readonly PRODUCT_LIMIT=4611686018427387904
product() {  # product <what> <factor...>: prints the product, or stops with an error when it is too large
  local what=$1 result=1 factor
  shift
  for factor in "$@"; do
    ((factor == 0 || result <= PRODUCT_LIMIT / factor)) || die "$what is too large (over 2^62)"
    result=$((result * factor))
  done
  echo "$result"
}

# Batch geometry: tokens per step = MICRO_BATCH x SEQ_LEN x NP x accumulation steps.
tokens_per_micro=$(product "MICRO_BATCH x SEQ_LEN x NP = $MICRO_BATCH x $SEQ_LEN x $NP" "$MICRO_BATCH" "$SEQ_LEN" "$NP")
if [[ -v TOTAL_BATCH ]]; then
  total_batch=$TOTAL_BATCH
  ((total_batch > 0)) || total_batch=$tokens_per_micro
  batch_source="TOTAL_BATCH=$TOTAL_BATCH tokens"
else
  total_batch=$(product "BATCH x SEQ_LEN = $BATCH x $SEQ_LEN tokens" "$BATCH" "$SEQ_LEN")
  batch_source="BATCH=$BATCH sequences x $SEQ_LEN tokens"
  if ((!batch_from_trainer_args && BATCH % (MICRO_BATCH * NP) != 0)); then
    die "BATCH=$BATCH sequences is not a multiple of MICRO_BATCH x NP = $MICRO_BATCH x $NP (set BATCH, MICRO_BATCH or NP)"
  fi
fi
if ((!batch_from_trainer_args && total_batch % tokens_per_micro != 0)); then
  die "$batch_source is not a multiple of MICRO_BATCH x SEQ_LEN x NP = $tokens_per_micro tokens"
fi
accumulation=$((total_batch / tokens_per_micro))
tokens_per_step=$total_batch  # what the trainer will take, with the flags after '--'
if [[ -n $trainer_total_batch ]]; then
  tokens_per_step=$trainer_total_batch
  if ((tokens_per_step == 0)); then  # the trainer's 0: one micro-batch per rank
    tokens_per_step=$(product "--batch_size x --seq_len x NP = $trainer_micro_batch x $trainer_seq_len x $NP" \
      "$trainer_micro_batch" "$trainer_seq_len" "$NP")
  fi
fi
((tokens_per_step > 0)) || die "the flags after -- give 0 tokens per step"
[[ -v STEPS ]] || STEPS=$(((TOKENS + tokens_per_step - 1) / tokens_per_step))
total_tokens=$(product "STEPS x tokens per step = $STEPS x $tokens_per_step" "$STEPS" "$tokens_per_step")
if [[ ! -v VAL_EVERY ]]; then
  VAL_EVERY=$((STEPS / 100))
  ((VAL_EVERY >= 1)) || VAL_EVERY=1
fi
if [[ ! -v WEIGHT_DECAY ]]; then
  if [[ $OPTIMIZER == demo ]]; then WEIGHT_DECAY=0; else WEIGHT_DECAY=0.1; fi
fi
if [[ ! -v RUN_NAME ]]; then
  if [[ $OPTIMIZER == demo ]]; then RUN_NAME=demo_k$TOPK; else RUN_NAME=adamw; fi
fi
[[ -n $RUN_NAME && $RUN_NAME != */* && $RUN_NAME != . && $RUN_NAME != .. ]] ||
  die "RUN_NAME must be a plain folder name (no '/', not '.' or '..'), got '$RUN_NAME'"
out_dir=${RUNS_DIR%/}/$RUN_NAME

# ---- the command -----------------------------------------------------------------------------------------
launcher=()
if [[ $MPIRUN != none ]]; then
  launcher=("$MPIRUN" -np "$NP")
  [[ -n ${HOSTFILE:-} ]] && launcher+=(--hostfile "$HOSTFILE")
  [[ -v RANKS_PER_NODE ]] && launcher+=(--map-by "ppr:$RANKS_PER_NODE:node")
  # More ranks than cores on this machine (a scaled-down run): let Open MPI start them anyway.
  # (Only for an NP given explicitly: the default 64 with no hostfile is a launch inside a cluster allocation.)
  if [[ $np_given == 1 && -z ${HOSTFILE:-} && ! -v RANKS_PER_NODE ]] && ((NP > $(nproc))); then
    launcher+=(--oversubscribe)
  fi
  launcher+=(--bind-to none)  # each rank's trainer picks its own thread count
  if [[ -n ${MPIRUN_ARGS:-} ]]; then
    read -r -a mpirun_words <<<"$MPIRUN_ARGS"
    launcher+=("${mpirun_words[@]}")
  fi
fi

trainer_args=(
  --config "$MODEL_CONFIG"
  --train_data "$TRAIN_DATA" --val_data "$VAL_DATA"
  --out_dir "$out_dir"
  --total_batch_size "$total_batch" --batch_size "$MICRO_BATCH" --seq_len "$SEQ_LEN" --steps "$STEPS"
  --lr "$LR" --warmup_steps "$WARMUP" --warmup_start_frac 0.1 --final_lr_frac 0.1 --grad_clip 1
  --optimizer "$OPTIMIZER" --weight_decay "$WEIGHT_DECAY"
)
if [[ $OPTIMIZER == demo ]]; then
  trainer_args+=(--demo_topk "$TOPK" --demo_chunk 64 --demo_decay 0.999)
else
  trainer_args+=(--beta1 0.9 --beta2 0.95)
fi
[[ -v DATA_FORMAT ]] && trainer_args+=(--data_format "$DATA_FORMAT")
[[ -v MEMMAP_DTYPE ]] && trainer_args+=(--memmap_dtype "$MEMMAP_DTYPE")
[[ -v EOS_TOKEN_ID ]] && trainer_args+=(--eos_token_id "$EOS_TOKEN_ID")
[[ -n $TOKENIZER ]] && trainer_args+=(--tokenizer "$TOKENIZER")
trainer_args+=(--val_every "$VAL_EVERY" --val_batches "$VAL_BATCHES" --checkpoint_every "$CHECKPOINT_EVERY")
# 'none' starts over: the trainer may then delete the checkpoints an earlier run left in out_dir
if [[ $RESUME == none ]]; then trainer_args+=(--overwrite); elif [[ -n $RESUME ]]; then trainer_args+=(--resume "$RESUME"); fi
command=(${launcher[@]+"${launcher[@]}"} "$TRAINER" "${trainer_args[@]}" ${extra_args[@]+"${extra_args[@]}"})

# Shell-quotes only the words that need it, so the printed line pastes back into a shell unchanged.
quote_words() {
  local out= word
  for word in "$@"; do
    if [[ $word =~ ^[A-Za-z0-9_./:=,+@%-]+$ ]]; then out+="$word "
    else out+="'${word//\'/\'\\\'\'}' "
    fi
  done
  printf '%s\n' "${out% }"
}

if [[ $OPTIMIZER == demo ]]; then
  optimizer_text="DeMo top-$TOPK per 64x64 chunk, decay 0.999, weight decay $WEIGHT_DECAY"
else
  optimizer_text="AdamW-DDP betas 0.9/0.95, weight decay $WEIGHT_DECAY"
fi
ranks_text="$NP ranks"
((NP == 1)) && ranks_text="1 rank"
[[ -v RANKS_PER_NODE ]] && ranks_text+=", $RANKS_PER_NODE per node"
[[ -n ${HOSTFILE:-} ]] && ranks_text+=", hostfile $HOSTFILE ($hosts hosts, $hostfile_slots slots)"
if ((batch_from_trainer_args)); then
  batch_text="$tokens_per_step tokens/step, the batch set by the trainer flags after --"
else
  batch_text="$total_batch tokens/step = $MICRO_BATCH x $SEQ_LEN tokens x $NP ranks x $accumulation accumulation"
fi
human_count() { awk -v n="$1" 'BEGIN { if (n >= 1e9) printf "%.1fB", n / 1e9; else if (n >= 1e6) printf "%.1fM", n / 1e6;
                                       else if (n >= 1e3) printf "%.1fk", n / 1e3; else printf "%d", n }'; }
plan=(
  "# run $RUN_NAME: $OPTIMIZER on $MODEL_CONFIG -> $out_dir"
  "# $optimizer_text; lr $LR, warmup $WARMUP steps from 0.1 x lr, cosine to 0.1 x lr, clip 1"
  "# $ranks_text; $batch_text; $STEPS steps ($(human_count "$total_tokens") tokens)"
  "# data: train $TRAIN_DATA, val ${VAL_DATA:-none}; format ${DATA_FORMAT:-auto}${MEMMAP_DTYPE:+ ($MEMMAP_DTYPE)}${EOS_TOKEN_ID:+, eos $EOS_TOKEN_ID}"
)
((WARMUP * 2 > STEPS)) && plan+=("# note: the $WARMUP warmup steps are over half of the $STEPS steps (set WARMUP)")
if ((DRY_RUN)); then
  printf '%s\n' "${plan[@]}"
  quote_words "${command[@]}"
  exit 0
fi

# ---- run -------------------------------------------------------------------------------------------------
if [[ $TRAINER == */* ]]; then
  [[ -x $TRAINER ]] || die "trainer '$TRAINER' is not built (make train_gpt, or TRAINER=./train_gpt_cpu after make)"
else
  command -v "$TRAINER" >/dev/null || die "trainer '$TRAINER' is not on PATH"
fi
if [[ $MPIRUN != none ]]; then command -v "$MPIRUN" >/dev/null || die "launcher '$MPIRUN' is not installed"; fi
printf '%s\n' "${plan[@]}"
quote_words "${command[@]}"
if [[ ! ( $TRAIN_DATA == @* && -f ${TRAIN_DATA#@} ) ]] && ! compgen -G "$TRAIN_DATA" >/dev/null; then
  echo "$PROG: warning: nothing matches TRAIN_DATA $TRAIN_DATA here (data/prepare_default.sh makes data/default;" \
       "on a cluster the data must exist at this path on every node)" >&2
fi
mkdir -p "$out_dir" 2>/dev/null || die "cannot create the run folder '$out_dir' (RUNS_DIR=$RUNS_DIR)"
{
  echo "# $(date -u '+%Y-%m-%dT%H:%M:%SZ') on $(hostname) in $(pwd), by ${LAUNCHED_BY:-scripts/run_experiment.sh}"
  quote_words "${command[@]}"
} 2>/dev/null >>"$out_dir/launch.txt" || die "cannot write '$out_dir/launch.txt'"
"${command[@]}" 2>&1 | tee -a "$out_dir/train.log"
exit "${PIPESTATUS[0]}"
