#!/usr/bin/env bash
# scripts/supervise.sh on the bandwidth lab's emulated hosts (scripts/bandwidth_lab.sh: one network namespace per
# host): a 3-host DeMo run of the CPU trainer loses host 2 mid-run (its processes killed, its link taken down);
# the supervisor must notice, drop that host (its probe times out), relaunch from the last complete checkpoint on
# the 2 survivors (elastic resume: 3 -> 2 ranks) and finish. Checked: the event lines, the relaunch's resumed
# step = the newest complete checkpoint when the host died, the elastic rule it took, metrics.jsonl continuous
# (every step 1..N once, in order, the steps after the resume by 2 ranks), the final model written. Then the refusals: a trainer failing with every host answering is
# relaunched once and then given up on; usage errors exit 2 with one line. Skips without root / namespaces.
set -uo pipefail
cd "$(dirname "$0")/../.."
TMP=build/test-tmp/supervise
rm -rf "$TMP" && mkdir -p "$TMP"
TMP=$(cd "$TMP" && pwd)
REPO=$(pwd)
command -v mpirun >/dev/null || { echo "SKIP: mpirun not installed"; exit 77; }
failures=0
check() {  # check <description> <command...>
  local what=$1
  shift
  if "$@"; then echo "ok    $what"; else echo "FAIL  $what"; failures=$((failures + 1)); fi
}

steps=16
cat >"$TMP/in_lab.sh" <<EOF
#!/usr/bin/env bash
# Runs inside the lab: the supervised job, and the killer of host 2 once step 6 is logged.
set -u
h0=\${LAB_PREFIX}_h0
mkdir -p "\$LAB_DIR/tmp/\$h0"
launcher="lab-exec 0 env TMPDIR=\$LAB_DIR/tmp/\$h0 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 mpirun \${LAB_MPI_FLAGS/--hostfile \$LAB_HOSTFILE/} -x OMP_NUM_THREADS=1"
(
  until [[ -f $TMP/run/metrics.jsonl ]] && grep -q '"type":"train","step":6,' $TMP/run/metrics.jsonl; do sleep 0.2; done
  newest=0
  for d in $TMP/run/checkpoints/step_*; do [[ -f \$d/COMPLETE ]] && newest=\$((10#\${d##*step_})); done
  echo "\$newest" >$TMP/killed_after_checkpoint
  ip netns pids \${LAB_PREFIX}_h2 | xargs -r kill -9
  ip netns exec \${LAB_PREFIX}_h2 ip link set eth0 down
) &
bash $REPO/scripts/supervise.sh --hostfile "\$LAB_HOSTFILE" --mpirun "\$launcher" --probe-timeout 8 --backoff 1 \
  --log $TMP/events.log -- $REPO/train_gpt_cpu --config $REPO/configs/tiny.json --batch_size 2 --seq_len 32 \
  --steps $steps --val_every 0 --val_batches 1 --optimizer demo --demo_topk 8 --checkpoint_every 2 \
  --comm_timeout 10 --out_dir $TMP/run --train_data "$REPO/data/default/default_train_*.bin" \
  --val_data "$REPO/data/default/default_val_*.bin" --tokenizer $REPO/data/default/tokenizer.bin
EOF
bash scripts/bandwidth_lab.sh --hosts 3 --rate 1gbit --quiet -- bash "$TMP/in_lab.sh" >"$TMP/lab.log" 2>&1
rc=$?
[[ $rc -eq 77 ]] && { echo "SKIP: $(tail -n 1 "$TMP/lab.log")"; exit 77; }
check "the supervised run finishes after losing a host" test "$rc" -eq 0 || tail -n 20 "$TMP/lab.log"
check "host 2 is dropped and the job relaunched on 2 hosts" \
  bash -c "grep -q 'host 10.77.0.3 does not answer (its probe failed or took over 8 s): dropped' '$TMP/events.log' &&
           grep -q 'launch 2: 2 ranks on 2 hosts' '$TMP/events.log' && grep -q 'finished' '$TMP/events.log' &&
           ! grep -q 'launch 3' '$TMP/events.log'"
check "metrics continuous: steps 1..$steps once each, the resumed part on 2 ranks from the last checkpoint" \
  /usr/bin/python3 - "$TMP/run/metrics.jsonl" "$TMP/killed_after_checkpoint" "$TMP/events.log" "$steps" <<'EOF'
import json, re, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
steps = [l["step"] for l in lines if l["type"] == "train"]
assert steps == list(range(1, int(sys.argv[4]) + 1)), steps
# The killer notes the newest complete checkpoint when it sees step 6; one more may complete before the kill lands.
seen = int(open(sys.argv[2]).read())
events = open(sys.argv[3]).read()
m = re.search(r"launch 2: 2 ranks on 2 hosts \(10.77.0.1:1,10.77.0.2:1\) from the checkpoint of step (\d+)", events)
assert m, events
resumed = int(m.group(1))
assert seen >= 2 and seen <= resumed <= seen + 4, (seen, resumed)
EOF
check "the relaunch resumed elastically: 3 -> 2 ranks, momenta the mean of the 3" \
  bash -c "grep -q 'world size changed: 3 -> 2 ranks; data re-sliced; momenta: mean of all 3 old ranks' '$TMP/lab.log' &&
           /usr/bin/python3 -c 'import json,sys; assert json.load(open(sys.argv[1]))[\"_run\"][\"world_size\"] == 2' '$TMP/run/config.json'"
check "the final checkpoint holds the last step" test -f "$TMP/run/checkpoints/step_$(printf %08d $steps)/COMPLETE"

# a job that fails with every host answering: relaunched once, then given up on (no newer checkpoint)
printf 'localhost slots=1\n' >"$TMP/hosts"
cat >"$TMP/fake_mpirun" <<'EOF'
#!/usr/bin/env bash
# a launcher whose hosts always answer (the probe runs `true`) and whose job always fails
for a in "$@"; do [[ $a == true ]] && exit 0; done
echo "fake job failing" >&2
exit 1
EOF
chmod +x "$TMP/fake_mpirun"
bash scripts/supervise.sh --hostfile "$TMP/hosts" --mpirun "$TMP/fake_mpirun" --backoff 0 -- ./train_gpt_cpu \
  --out_dir "$TMP/none" 2>"$TMP/fail.log"
rc=$?
check "a job failing on healthy hosts: relaunched once, then not again" \
  bash -c "[[ $rc -eq 1 ]] && grep -q 'launch 2:' '$TMP/fail.log' && ! grep -q 'launch 3:' '$TMP/fail.log' &&
           grep -q 'not a host failure' '$TMP/fail.log'"
bash scripts/supervise.sh --hostfile "$TMP/nothere" -- ./train_gpt_cpu 2>"$TMP/usage.log"
rc=$?
check "a missing hostfile: one line, status 2" \
  bash -c "[[ $rc -eq 2 && \$(wc -l <'$TMP/usage.log') -eq 1 ]] && grep -q 'nothere: no such file' '$TMP/usage.log'"
echo "$failures failure(s)"
[[ $failures -eq 0 ]]
