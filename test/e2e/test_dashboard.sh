#!/usr/bin/env bash
# Checks scripts/dashboard.py in headless Chromium (Debian's chromium): the page of a short real run (2 ranks,
# 6 steps) loads from disk without a script error and draws as many points in each chart as metrics.jsonl holds
# (counted here); a comparison page of that run and a copy with "diagnostics" lines and a diverged step draws
# both runs and a chart per diagnostics field, and says "diverged"; --watch rewrites the page of a run still
# being written (reloading itself while it goes) and stops by itself at its last planned step; bad folders get
# one-line errors. Skips when chromium is not installed.
set -uo pipefail
cd "$(dirname "$0")/../.."
command -v chromium >/dev/null || { echo "SKIP: chromium not installed (scripts/install_deps.sh installs it)"; exit 77; }
TMP=build/test-tmp/dashboard
rm -rf "$TMP" && mkdir -p "$TMP"
TMP=$(cd "$TMP" && pwd)
PY=/usr/bin/python3
failures=0
check() {  # check <description> <command...>
  local what=$1
  shift
  if "$@"; then echo "ok    $what"; else echo "FAIL  $what"; failures=$((failures + 1)); fi
}
dom() {  # dom PAGE: the page's DOM after its script ran
  timeout 90 chromium --headless --no-sandbox --disable-gpu --no-first-run --user-data-dir="$TMP/chrome" \
    --virtual-time-budget=5000 --dump-dom "file://$1" 2>>"$TMP/chromium.err"
}

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 OMP_NUM_THREADS=1
run="$TMP/run"
if command -v mpirun >/dev/null; then launch=(mpirun -np 2); else launch=(); fi
"${launch[@]}" ./train_gpt_cpu --config configs/tiny.json --batch_size 2 --seq_len 32 --steps 6 --val_every 3 \
  --val_batches 1 --optimizer demo --demo_topk 8 --checkpoint_every -1 --out_dir "$run" >"$TMP/train.log" 2>&1
check "the short run trains" test $? -eq 0 || tail -5 "$TMP/train.log"
$PY scripts/dashboard.py "$run" 2>"$TMP/dash.err"
check "the page is written next to metrics.jsonl" test -s "$run/dashboard.html"
dom "$run/dashboard.html" >"$TMP/run.dom"
check "it renders without a script error, offline" \
  bash -c "grep -q 'data-render=\"ok\"' '$TMP/run.dom' && grep -q '<div id=\"errors\"></div>' '$TMP/run.dom' && ! grep -qiE 'src=\"https?:|href=\"https?:' '$run/dashboard.html'"
check "each chart draws every point of metrics.jsonl" $PY - "$run/metrics.jsonl" "$TMP/run.dom" <<'EOF'
import json, re, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
train = [l for l in lines if l["type"] == "train"]
val = [l for l in lines if l["type"] == "val"]
charts = dict(re.findall(r'data-title="([^"]+)" data-series="([^"]*)"', open(sys.argv[2]).read()))
assert charts["loss"] == f"train:{len(train)};val:{len(val)}", charts
assert charts["learning rate"] == f"lr:{len(train)}", charts
inter = sum(1 for l in train if l["bytes_sent_inter"] > 0)  # (a log axis: zero bytes leave a gap)
intra = sum(1 for l in train if l["bytes_sent_intra"] > 0)
assert charts["bytes sent per step, by link"] == f"across nodes:{inter};within a node:{intra}", charts
phases = charts["step-time breakdown"].split(";")
assert phases[:3] == [f"step:{len(train)}", f"compute:{len(train)}", f"comm:{len(train)}"], phases
assert {p.split(":")[0] for p in phases[3:]} == {"opt " + k for k in train[0]["opt_ms"]}, phases
assert len(train) == 6 and len(val) == 2 and inter == 6
EOF
check "the summary says finished, 6/6 steps" bash -c "grep -q '<td>6/6</td><td>finished</td>' '$TMP/run.dom'"

# a comparison with diagnostics and a diverged run
other="$TMP/other"
mkdir -p "$other" && cp "$run/config.json" "$other/"
$PY - "$run/metrics.jsonl" "$other/metrics.jsonl" <<'EOF'
import json, sys
out = open(sys.argv[2], "w")
for line in open(sys.argv[1]):
    r = json.loads(line)
    if r["type"] == "train" and r["step"] == 5:
        out.write('{"type":"train","step":5,"loss":NaN,"grad_norm":null}\n{"type":"diverged","step":5}\n')
        break
    out.write(line)
    if r["type"] == "train":
        out.write(json.dumps({"type": "diagnostics", "step": r["step"], "energy": {"dct": 0.5 + r["step"] / 100,
                              "raw": 0.3}, "persistence": 0.1 * r["step"]}) + "\n")
EOF
$PY scripts/dashboard.py "$run" "$other" --out "$TMP/compare.html" 2>>"$TMP/dash.err"
dom "$TMP/compare.html" >"$TMP/compare.dom"
check "the comparison renders both runs and a chart per diagnostics field" $PY - "$TMP/compare.dom" <<'EOF'
import re, sys
dom = open(sys.argv[1]).read()
assert 'data-render="ok"' in dom and '<div id="errors"></div>' in dom, 'script error'
charts = dict(re.findall(r'data-title="([^"]+)" data-series="([^"]*)"', dom))
assert charts["loss"] == "run train:6;run val:2;other train:4;other val:1", charts
assert charts["diagnostics: energy.dct"] == "other:4" and charts["diagnostics: energy.raw"] == "other:4", charts
assert charts["diagnostics: persistence"] == "other:4", charts
assert "<td>diverged at step 5</td>" in dom, "no diverged status"
EOF

# --watch on a run being written: the page reloads itself while the run goes and the watcher stops at the end
live="$TMP/live"
mkdir -p "$live" && echo '{"optimizer":"adamw","lr":0.001,"steps":4}' >"$live/config.json"
$PY - "$live/metrics.jsonl" <<'EOF' &
import json, sys, time
with open(sys.argv[1], "w") as f:
    for s in range(1, 5):
        f.write(json.dumps({"type": "train", "step": s, "loss": 5 - s * 0.1, "lr": 0.001}) + "\n")
        f.flush()
        time.sleep(1.5)
EOF
writer=$!
timeout 60 $PY scripts/dashboard.py --watch 0.3 "$live" 2>>"$TMP/dash.err" &
watcher=$!
sleep 2
check "while the run goes the page reloads itself" grep -q 'http-equiv="refresh"' "$live/dashboard.html"
wait "$writer"
wait "$watcher"
check "the watcher stops by itself after the last planned step" test $? -eq 0
check "the final page no longer reloads and shows step 4" \
  bash -c "! grep -q 'http-equiv=\"refresh\"' '$live/dashboard.html' && grep -q '\"step\":\[1,2,3,4\]' '$live/dashboard.html'"

$PY scripts/dashboard.py "$TMP/nowhere" 2>"$TMP/err1"; rc1=$?
mkdir -p "$TMP/empty" && $PY scripts/dashboard.py "$TMP/empty" 2>"$TMP/err2"; rc2=$?
check "a missing folder and a folder without metrics get one-line errors" \
  bash -c "[[ $rc1 -eq 1 && $rc2 -eq 1 ]] && [[ \$(wc -l <'$TMP/err1') -eq 1 && \$(wc -l <'$TMP/err2') -eq 1 ]] && grep -q 'nowhere: no such run folder' '$TMP/err1' && grep -q 'no metrics.jsonl' '$TMP/err2'"
echo "$failures failure(s)"
[[ $failures -eq 0 ]]
