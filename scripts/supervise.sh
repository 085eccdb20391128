#!/usr/bin/env bash
# Keeps a multi-host training job going when a host dies: launches it under mpirun on the hosts of a hostfile,
# and when the launch fails, asks every host whether it still answers (a one-process mpirun on it, with a
# timeout), drops the ones that do not, and relaunches from the last complete checkpoint on the survivors with
# --resume auto: a run of fewer ranks resumes the checkpoint through the elastic resume (docs/checkpoints.md).
# A bounded number of relaunches; one log line per event. A job that fails again with every host answering and
# no newer checkpoint is not a host failure (a bad flag, a bug): it is not relaunched. A diverged run (the
# trainer's exit status 3) is not relaunched either. Hangs are the trainer's --comm_timeout's business: a rank
# whose peer vanished without a word exits after that many seconds, which ends the launch.
#
#   scripts/supervise.sh --hostfile hosts.txt -- ./train_gpt_cpu --config configs/small.json --out_dir out/x \
#       --checkpoint_every 50 --comm_timeout 120
#
# Options:
#   --hostfile FILE     Open MPI hostfile ("host slots=N" lines, N = ranks on that host, default 1): the hosts to start on
#   --retries N         relaunches after failures, in all [3]
#   --probe-timeout S   seconds a host has to answer the probe [20]
#   --mpirun "CMD..."   the launcher, split on spaces [mpirun]; the supervisor adds --hostfile FILE --host H:N,... -np N
#   --log FILE          also append the event lines to FILE
#   --backoff S         seconds to wait before a relaunch [2]
# Exit status: the trainer's last (0 when it finished); 2 for usage errors.
set -uo pipefail

PROG=supervise
usage() { sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; }
die_usage() { echo "$PROG: error: $*" >&2; exit 2; }

hostfile="" retries=3 probe_timeout=20 mpirun_cmd="mpirun" log_file="" backoff=2
while [[ $# -gt 0 ]]; do
  case "$1" in
    --hostfile) hostfile="${2:-}"; shift 2 || die_usage "--hostfile needs a value" ;;
    --retries) retries="${2:-}"; shift 2 || die_usage "--retries needs a value" ;;
    --probe-timeout) probe_timeout="${2:-}"; shift 2 || die_usage "--probe-timeout needs a value" ;;
    --mpirun) mpirun_cmd="${2:-}"; shift 2 || die_usage "--mpirun needs a value" ;;
    --log) log_file="${2:-}"; shift 2 || die_usage "--log needs a value" ;;
    --backoff) backoff="${2:-}"; shift 2 || die_usage "--backoff needs a value" ;;
    -h|--help) usage; exit 0 ;;
    --) shift; break ;;
    *) die_usage "unknown option '$1' (the trainer's command goes after --)" ;;
  esac
done
[[ $# -gt 0 ]] || die_usage "no trainer command (give it after --)"
[[ -n $hostfile ]] || die_usage "--hostfile is required"
[[ -f $hostfile ]] || die_usage "--hostfile $hostfile: no such file"
[[ $retries =~ ^[0-9]+$ ]] || die_usage "--retries must be a whole number, got '$retries'"
[[ $probe_timeout =~ ^[0-9]+([.][0-9]+)?$ ]] || die_usage "--probe-timeout must be a number of seconds, got '$probe_timeout'"
[[ $backoff =~ ^[0-9]+([.][0-9]+)?$ ]] || die_usage "--backoff must be a number of seconds, got '$backoff'"
read -r -a launcher <<<"$mpirun_cmd"
[[ ${#launcher[@]} -gt 0 ]] || die_usage "--mpirun is empty"

# The hosts and their slots, in the hostfile's order (comments and blank lines skipped).
hosts=() slots=()
while read -r line; do
  line="${line%%#*}"
  read -r -a words <<<"$line"
  [[ ${#words[@]} -eq 0 ]] && continue
  n=1
  for w in "${words[@]:1}"; do [[ $w =~ ^slots=([0-9]+)$ ]] && n=${BASH_REMATCH[1]}; done
  [[ $n -ge 1 ]] || die_usage "$hostfile: host ${words[0]} has no slots"
  hosts+=("${words[0]}") slots+=("$n")
done <"$hostfile"
[[ ${#hosts[@]} -gt 0 ]] || die_usage "$hostfile: no hosts"

trainer=("$@")
out_dir=""
has_resume=0
for ((i = 0; i < ${#trainer[@]}; i++)); do
  case "${trainer[$i]}" in
    --out_dir|--out-dir) out_dir="${trainer[$((i + 1))]:-}" ;;
    --out_dir=*|--out-dir=*) out_dir="${trainer[$i]#*=}" ;;
    --resume|--resume=*) has_resume=1 ;;
  esac
done
[[ $has_resume -eq 1 ]] || trainer+=(--resume auto)

say() {
  local line
  line="$PROG: $(date -u +%Y-%m-%dT%H:%M:%SZ) $*"
  echo "$line" >&2
  [[ -n $log_file ]] && echo "$line" >>"$log_file"
  return 0
}
newest_checkpoint() {  # the step of out_dir's newest complete checkpoint, or 0
  local newest=0 d s
  [[ -n $out_dir && -d $out_dir/checkpoints ]] || { echo 0; return; }
  for d in "$out_dir"/checkpoints/step_*; do
    [[ -f $d/COMPLETE ]] || continue
    s=${d##*step_}
    s=$((10#$s))
    [[ $s -gt $newest ]] && newest=$s
  done
  echo "$newest"
}
host_list() {
  local out="" i
  for ((i = 0; i < ${#hosts[@]}; i++)); do out+="${out:+,}${hosts[$i]}:${slots[$i]}"; done
  echo "$out"
}

launches=0
while true; do
  np=0
  for n in "${slots[@]}"; do np=$((np + n)); done
  start_ckpt=$(newest_checkpoint)
  launches=$((launches + 1))
  from="a fresh start or --resume auto's choice"
  [[ $start_ckpt -gt 0 ]] && from="the checkpoint of step $start_ckpt"
  say "launch $launches: $np ranks on ${#hosts[@]} hosts ($(host_list)) from $from"
  t0=$(date +%s)
  "${launcher[@]}" --hostfile "$hostfile" --host "$(host_list)" -np "$np" "${trainer[@]}"
  rc=$?
  say "launch $launches ended with status $rc after $(( $(date +%s) - t0 )) s"
  if [[ $rc -eq 0 ]]; then
    say "finished"
    exit 0
  fi
  if [[ $rc -eq 3 ]]; then
    say "the run diverged (status 3): not relaunched"
    exit 3
  fi
  if [[ $((launches - 1)) -ge $retries ]]; then
    say "giving up after $retries relaunches"
    exit "$rc"
  fi
  alive_hosts=() alive_slots=()
  for ((i = 0; i < ${#hosts[@]}; i++)); do
    if timeout "$probe_timeout" "${launcher[@]}" --hostfile "$hostfile" --host "${hosts[$i]}:1" -np 1 true \
      >/dev/null 2>&1; then
      alive_hosts+=("${hosts[$i]}") alive_slots+=("${slots[$i]}")
    else
      say "host ${hosts[$i]} does not answer (its probe failed or took over $probe_timeout s): dropped"
    fi
  done
  if [[ ${#alive_hosts[@]} -eq 0 ]]; then
    say "no host answers: giving up"
    exit "$rc"
  fi
  if [[ ${#alive_hosts[@]} -eq ${#hosts[@]} && $(newest_checkpoint) -eq $start_ckpt && $launches -gt 1 ]]; then
    say "failed again with every host answering and no newer checkpoint: not a host failure, not relaunched"
    exit "$rc"
  fi
  hosts=("${alive_hosts[@]}") slots=("${alive_slots[@]}")
  sleep "$backoff"
done
