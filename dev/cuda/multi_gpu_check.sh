#!/usr/bin/env bash
# The CUDA trainer on several GPUs of one machine (one MPI rank per GPU), for the first lease of a multi-GPU
# machine: what the emulated device has shown with NCCL-over-MPI, checked on real NCCL, then timed.
#   correctness (tiny model, the fp32 build ./train_gpt_fp32, so sums differ only by order):
#     - AdamW-DDP, N ranks x batch B against 1 rank x batch N*B on the same rows (no shuffling): losses
#       within 1e-4 over 5 steps (the CPU trainer's test allows the same); through host memory
#       (--transport mpi) the overlapped all-reduce gives the bits of the one after the backward and the
#       NCCL run's losses within 1e-5;
#     - DeMo on N ranks: two runs give bit-identical losses; the MPI transport (--transport mpi, buckets
#       through host memory) gives the NCCL run's bits; --demo_delay 1 reruns bit-identically and resumes
#       from its step-3 checkpoint (a round in flight) bit for bit;
#     - the sharded steps with one node of N ranks (--shard_group_size N, weights compared every step): ZeRO-1
#       within 1e-4 of AdamW-DDP, FlexDeMo within 1e-3 of DeMo on 1 rank of N times the batch;
#   scaling (GPT-2 124M, configs/d12.json, bf16 ./train_gpt, B=16 T=1024 per rank, 20 steps, median after 5):
#     tokens/s on 1 and on N GPUs for AdamW-DDP (all-reduce overlapped with the backward), DeMo k=32 and DeMo
#     with --demo_delay 1; per-GPU efficiency and the median exposed communication (comm_ms) per step.
# Prints ok/FAIL lines and RESULT lines, then PASS or FAIL. Exit 0 pass, 1 fail, 77 skipped (fewer than two
# GPUs, or no trainer or data).
#   dev/cuda/multi_gpu_check.sh               every GPU nvidia-smi lists
#   GPUS=2 dev/cuda/multi_gpu_check.sh        the first two
#   SHARED_GPU=1 [RANKS=2] dev/cuda/multi_gpu_check.sh
#                                             RANKS ranks on one GPU (a lease of one): the correctness part over
#                                             the MPI transport only (NCCL refuses two ranks on one device), so
#                                             the multi-rank paths run on a real GPU with real stream concurrency
# TRAIN_GPT / TRAIN_GPT_FP32 name other binaries (e.g. build/emu/train_gpt and build/emu-fp32/train_gpt, the
# emulated device, with GPUS set: a dry run of this script on a machine without a GPU); SCALING=0 skips the
# timing part, SCALE_ARGS replaces its trainer flags.
set -uo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-python3}
BIN=${TRAIN_GPT:-./train_gpt}
BIN32=${TRAIN_GPT_FP32:-./train_gpt_fp32}
SHARED=${SHARED_GPU:-0}
every_run=()  # flags every run gets
if [[ -z ${GPUS:-} ]]; then
  command -v nvidia-smi >/dev/null 2>&1 || { echo "no nvidia-smi: multi-GPU check skipped"; exit 77; }
  GPUS=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
fi
if ((SHARED)); then
  ((GPUS >= 1)) || { echo "no GPU: skipped"; exit 77; }
  every_run=(--transport mpi)  # ranks on one device share no NCCL communicator
  SCALING=0
  [[ -x $BIN32 ]] || { echo "no $BIN32: skipped"; exit 77; }
  N=${RANKS:-2}
else
  ((GPUS >= 2)) || { echo "$GPUS GPU(s): the multi-GPU check needs two or more; skipped"; exit 77; }
  [[ -x $BIN && -x $BIN32 ]] || { echo "no $BIN / $BIN32: skipped"; exit 77; }
  N=$GPUS
fi
ls data/default/default_train_*.bin >/dev/null 2>&1 || { echo "no data/default: skipped"; exit 77; }
command -v mpirun >/dev/null || { echo "no mpirun: skipped"; exit 77; }
# A build without MPI (USE_MPI=0, as dev/cuda/gpu_bundle.sh makes it) is a world of one under mpirun.
if [[ -z ${TRAIN_GPT:-} && -z ${TRAIN_GPT_FP32:-} ]] && ! ldd "$BIN32" 2>/dev/null | grep -q libmpi; then
  echo "$BIN32 was built without MPI (USE_MPI=0): its ranks would not join; build it here with Open MPI (make cuda)"
  exit 77
fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
TMP=build/multi-gpu-check
rm -rf "$TMP" && mkdir -p "$TMP"
failures=0
ok() { echo "ok    $*"; }
bad() { echo "FAIL  $*"; failures=$((failures + 1)); }

train() {  # train <name> <ranks> <binary> [flags]: mpirun -np ranks binary flags, logged; 0 when it succeeded
  local name=$1 np=$2 bin=$3
  shift 3
  rm -rf "${TMP:?}/$name"
  if ! timeout 600 mpirun -np "$np" "$bin" --val_every 0 --val_batches 1 --sample_every 0 --out_dir "$TMP/$name" "$@" \
    "${every_run[@]}" >"$TMP/$name.log" 2>&1; then
    bad "$name: the trainer failed ($(grep -m1 '^error' "$TMP/$name.log" || tail -2 "$TMP/$name.log" | tr '\n' ' '))"
    return 1
  fi
}
losses() {  # losses <run>: the train losses, one per line, as Python prints them (exact)
  "$PY" -c 'import json,sys
print("\n".join(repr(json.loads(l)["loss"]) for l in open(sys.argv[1]) if "\"train\"" in l))' "$TMP/$1/metrics.jsonl"
}
same() {  # same <what> <run a> <run b> [last n steps]
  local a b
  a=$(losses "$2" | tail -n "${4:-1000}"); b=$(losses "$3" | tail -n "${4:-1000}")
  if [[ -n $a && $a == "$b" ]]; then ok "$1"; else bad "$1: $(echo $a) vs $(echo $b)"; fi
}

tiny=(--config configs/tiny.json --seq_len 64 --lr 1e-3 --warmup_steps 2 --log_every 10)

close() {  # close <what> <run a> <run b> <limit>: the 5 losses within limit of each other
  local diff
  diff=$("$PY" -c 'import sys
a=[float(x) for x in sys.argv[1].split()]; b=[float(x) for x in sys.argv[2].split()]
print(max(abs(x-y) for x,y in zip(a,b)) if len(a)==len(b)==5 else 1e9)' "$(losses "$2")" "$(losses "$3")")
  if "$PY" -c "import sys; sys.exit(0 if $diff < $4 else 1)"; then ok "$1 (max loss diff $diff)"
  else bad "$1: max loss diff $diff (limit $4)"; fi
}

# AdamW-DDP: N x B == 1 x N*B on the same rows
adamw=("${tiny[@]}" --optimizer adamw --batch_size 4 --steps 5 --shuffle=false)
train adamw-n "$N" "$BIN32" "${adamw[@]}" &&
  train adamw-1 1 "$BIN32" "${tiny[@]}" --optimizer adamw --batch_size $((4 * N)) --steps 5 --shuffle=false &&
  close "AdamW-DDP $N ranks x B=4 == 1 rank x B=$((4 * N))" adamw-n adamw-1 1e-4
# AdamW-DDP through host memory (--transport mpi: the overlapped all-reduce on MPI's reducer thread): the
# bits of the all-reduce after the backward, and the NCCL run's losses to rounding (other summation orders)
if train adamw-mpi "$N" "$BIN32" "${adamw[@]}" --transport mpi &&
  train adamw-mpi-after "$N" "$BIN32" "${adamw[@]}" --transport mpi --ddp_overlap false; then
  same "AdamW-DDP over --transport mpi on $N ranks: the overlapped all-reduce gives --ddp_overlap false's bits" \
    adamw-mpi adamw-mpi-after
  ((SHARED)) || [[ ! -f $TMP/adamw-n/metrics.jsonl ]] ||
    close "AdamW-DDP on $N ranks: --transport mpi == NCCL" adamw-mpi adamw-n 1e-5
fi

# DeMo: determinism, NCCL == MPI transport, and the delayed exchange with its resume
demo=("${tiny[@]}" --optimizer demo --batch_size 4 --steps 6)
train demo-a "$N" "$BIN32" "${demo[@]}" && train demo-b "$N" "$BIN32" "${demo[@]}" &&
  same "DeMo on $N ranks: two runs give bit-identical losses" demo-a demo-b
((SHARED)) || { train demo-mpi "$N" "$BIN32" "${demo[@]}" --transport mpi &&
  same "DeMo on $N ranks: the MPI transport gives the NCCL run's bits" demo-a demo-mpi; }
delayed=("${demo[@]}" --demo_delay 1 --checkpoint_every 3 --keep_checkpoints 0)
if train delay-a "$N" "$BIN32" "${delayed[@]}" && train delay-b "$N" "$BIN32" "${delayed[@]}"; then
  same "DeMo --demo_delay 1 on $N ranks: two runs give bit-identical losses" delay-a delay-b
  train delay-r "$N" "$BIN32" "${delayed[@]}" --resume "$TMP/delay-a/checkpoints/step_00000003" &&
    same "DeMo --demo_delay 1 on $N ranks: resumed at step 3 (a round in flight), steps 4-6 bit-identical" \
      delay-a delay-r 3
fi

# The sharded steps (--shard_group_size N: one node of every rank), every rank's weights compared after each step:
# ZeRO-1 gives AdamW-DDP's losses; FlexDeMo in one node of N ranks x B steps as DeMo on 1 rank x N*B (the node
# averages its gradients before the top-k)
train zero1-n "$N" "$BIN32" "${adamw[@]}" --shard_group_size "$N" --weight_check_every 1 &&
  [[ -f $TMP/adamw-n/metrics.jsonl ]] && close "ZeRO-1 on $N ranks == AdamW-DDP on $N ranks" zero1-n adamw-n 1e-4
flex=("${tiny[@]}" --optimizer demo --steps 5 --shuffle=false)
train flex-n "$N" "$BIN32" "${flex[@]}" --batch_size 4 --shard_group_size "$N" --weight_check_every 1 &&
  train flex-1 1 "$BIN32" "${flex[@]}" --batch_size $((4 * N)) &&
  close "FlexDeMo, one node of $N ranks x B=4 == DeMo on 1 rank x B=$((4 * N))" flex-n flex-1 1e-3

# Scaling: tokens/s on 1 and on N GPUs
if [[ ${SCALING:-1} == 1 ]]; then
  read -r -a d12 <<<"${SCALE_ARGS:---config configs/d12.json --batch_size 16 --seq_len 1024 --steps 20 --log_every 10 --checkpoint_every -1}"
  summary() {  # summary <run>: median step ms and comm ms after 5 warm-up steps
    "$PY" - "$TMP/$1/metrics.jsonl" <<'EOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"train"' in l][5:]
step = statistics.median(r["step_ms"] for r in rows)
comm = statistics.median(r["comm_ms"] for r in rows)
print(f"{step:.2f} {comm:.2f}")
EOF
  }
  for setting in adamw demo demo-delay; do
    flags=(--optimizer "${setting%-delay}")
    [[ $setting == demo* ]] && flags+=(--demo_topk 32)
    [[ $setting == demo-delay ]] && flags+=(--demo_delay 1)
    train "scale-$setting-1" 1 "$BIN" "${d12[@]}" "${flags[@]}" && train "scale-$setting-n" "$N" "$BIN" "${d12[@]}" "${flags[@]}" ||
      continue
    read -r ms1 comm1 <<<"$(summary "scale-$setting-1")"
    read -r msn commn <<<"$(summary "scale-$setting-n")"
    "$PY" -c 'import sys
s, n = sys.argv[1], int(sys.argv[2])
ms1, msn, c1, cn = map(float, sys.argv[3:7])
tok = float(sys.argv[7])
print(f"RESULT {s}: 1 GPU {ms1:.2f} ms/step ({tok / ms1 * 1e3:,.0f} tok/s), {n} GPUs {msn:.2f} ms/step "
      f"({n * tok / msn * 1e3:,.0f} tok/s), per-GPU efficiency {100 * ms1 / msn:.1f}%, comm_ms {c1:.2f} / {cn:.2f}")' \
      "$setting" "$N" "$ms1" "$msn" "$comm1" "$commn" "$("$PY" -c 'import json,sys
print(json.loads(open(sys.argv[1]).readline())["tokens"])' "$TMP/scale-$setting-1/metrics.jsonl")"
  done
fi
((failures == 0)) && echo PASS || { echo "FAIL ($failures)"; exit 1; }
