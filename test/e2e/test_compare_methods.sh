#!/usr/bin/env bash
# Checks scripts/compare_methods.py. First its logic, with a stand-in trainer (no MPI, one process) whose val loss
# is a parabola in log2(lr) (minimum at 0.016 for AdamW-DDP, 0.001 for the others, so AdamW's grid must grow twice
# on the right and DeMo's once on the left), falls as 10/step, and sits 0.05 higher for DeMo; every step takes
# the same compute_ms and bytes_sent per method. From those constants the test computes on its own when DeMo
# first reaches AdamW's loss at the target step, the bytes sent until then and the emulated time at 100 Mbit/s
# and 1 Gbit/s, and compares them with the table. Then: a second start runs nothing; a run folder finished with
# another command is refused; an optimizer the trainer lacks is refused before anything runs. Last, a real
# 4-step smoke run of train_gpt_cpu at 2 ranks, whose AdamW bytes per step must be the ring all-reduce's
# 2(W-1)/W * 4 * n for the tiny model's n = 3,323,648 parameters.
set -uo pipefail
cd "$(dirname "$0")/../.."
TMP=build/test-tmp/compare_methods
rm -rf "$TMP" && mkdir -p "$TMP"
TMP=$(cd "$TMP" && pwd)
PY=/usr/bin/python3
failures=0
check() {  # check <description> <command...>
  local what=$1
  shift
  if "$@"; then echo "ok    $what"; else echo "FAIL  $what"; failures=$((failures + 1)); fi
}

cat >"$TMP/fake_trainer" <<'EOF'
#!/usr/bin/python3
import json, math, os, sys
args = sys.argv[1:]
opt = dict(zip(args[::2], args[1::2]))
names = os.environ.get("FAKE_OPTIMIZERS", "adamw,demo").split(",")
if opt.get("--optimizer") not in names:
    sys.exit(print(f"error: --optimizer: '{opt.get('--optimizer')}' is not one of: {', '.join(names)}", file=sys.stderr) or 1)
with open(os.environ["FAKE_LOG"], "a") as f:
    f.write(opt["--out_dir"] + " " + opt["--lr"] + "\n")
out, steps, every, lr = opt["--out_dir"], int(opt["--steps"]), int(opt["--val_every"]), float(opt["--lr"])
adamw = opt["--optimizer"] == "adamw"
x = math.log2(lr / (0.016 if adamw else 0.001))
compute, sent = (100.0, 4000000) if adamw else (120.0, 50000)
os.makedirs(out, exist_ok=True)
json.dump({"optimizer": opt["--optimizer"], "lr": lr, "steps": steps, "_run": {"world_size": 1}},
          open(os.path.join(out, "config.json"), "w"))
with open(os.path.join(out, "metrics.jsonl"), "w") as f:
    for s in range(1, steps + 1):
        val = 4 + x * x + (0 if adamw else 0.05) + 10 / s
        f.write(json.dumps({"type": "train", "step": s, "loss": val, "tokens": 512 * s, "step_ms": compute + 1,
                            "compute_ms": compute, "comm_ms": 1, "bytes_sent": sent}) + "\n")
        if s % every == 0 or s == steps:
            f.write(json.dumps({"type": "val", "step": s, "val_loss": val}) + "\n")
EOF
chmod +x "$TMP/fake_trainer"

compare() {  # compare [args...]: the stand-in comparison of AdamW-DDP and DeMo at the high budget
  FAKE_LOG="$TMP/launches" $PY scripts/compare_methods.py --trainer "$TMP/fake_trainer" --mpirun none --np 1 \
    --runs "$TMP/runs" --out "$TMP/out" --methods demo --budgets high --steps 20 --sweep-steps 6 --val-every 2 \
    --target-step 10 "$@" >"$TMP/log" 2>&1
}
compare
check "the stand-in comparison runs" test $? -eq 0 || tail -5 "$TMP/log"
check "AdamW's grid grew twice to the right, DeMo's once to the left" \
  $PY - "$TMP/launches" <<'EOF'
import sys
runs = [line.split() for line in open(sys.argv[1])]
sweeps = [(d.split("/")[-1], lr) for d, lr in runs if "/sweep/" in d]
adamw = [float(lr) for name, lr in sweeps if name.startswith("adamw")]
demo = [float(lr) for name, lr in sweeps if name.startswith("demo")]
assert adamw == [0.002, 0.004, 0.008, 0.016, 0.032], adamw
assert demo == [0.001, 0.002, 0.004, 0.0005], demo
full = [(d.split("/")[-1], float(lr)) for d, lr in runs if "/sweep/" not in d]
assert full == [("adamw_lr0.016", 0.016), ("demo_k32_lr0.001", 0.001)], full
EOF
check "the table's target, bytes and emulated times are the constants' (computed here)" \
  $PY - "$TMP/out/table.md" "$TMP/out/results.json" <<'EOF'
import json, math, sys
table = open(sys.argv[1]).read()
# AdamW at its best rate: 4 + 10/step; at step 10 that is 5.0. DeMo: 4.05 + 10/s <= 5 first at an even s >= 10.53.
assert "Target: AdamW-DDP's val loss at step 10: 5.0000" in table, table
s = next(s for s in range(2, 21, 2) if 4.05 + 10 / s <= 5.0)
assert s == 12
rows = {line.split("|")[2].strip(): [c.strip() for c in line.split("|")[1:-1]] for line in table.splitlines()
        if line.startswith("| high") or line.startswith("| all")}
demo = rows["demo_k32"]
assert demo[3] == f"{4.05 + 10 / 20:.4f}", demo
assert demo[4] == f"{50000 / 1e6:,.4f}", demo
assert demo[6] == f"{s * 50000 / 1e3:,.2f} kB (step {s})", demo
assert demo[8] == "+20 ms (+20%)", demo
for cell, rate in ((demo[9], 1e8), (demo[10], 1e9)):
    assert cell == f"{s * (0.120 + 50000 * 8 / rate):,.1f} s", (cell, rate)
adamw = rows["adamw"]
assert adamw[6] == f"{10 * 4000000 / 1e6:,.2f} MB (step 10)", adamw
assert adamw[9] == f"{10 * (0.100 + 4e6 * 8 / 1e8):,.1f} s", adamw
res = json.load(open(sys.argv[2]))
run = next(r for r in res["runs"] if r["setting"] == "demo_k32")
assert math.isclose(run["cum_time"]["100mbit"][-1], 20 * (0.120 + 50000 * 8 / 1e8), rel_tol=1e-12)
EOF
for png in loss_vs_step loss_vs_bytes loss_vs_time_100mbit loss_vs_time_1gbit; do
  check "$png.png written" test -s "$TMP/out/$png.png"
done
lines=$(wc -l <"$TMP/launches")
compare
check "a second start skips every finished run" test "$(wc -l <"$TMP/launches")" -eq "$lines"
compare --steps 22
check "a finished run with another command is refused in one line" \
  grep -q "error: .*adamw_lr0.016: finished with another command" "$TMP/log"
FAKE_OPTIMIZERS=adamw,demo compare --methods demo signum
check "an optimizer the trainer lacks is refused before any run" \
  bash -c "grep -q \"error: signum: .* has no --optimizer signum\" '$TMP/log' && test \$(wc -l <'$TMP/launches') -eq $lines"

# the real trainer: 4 steps of AdamW-DDP and DeMo on 2 ranks at given rates (no sweep)
if command -v mpirun >/dev/null && [[ -x ./train_gpt_cpu ]]; then
  $PY scripts/compare_methods.py --runs "$TMP/real" --out "$TMP/real/out" --methods demo --budgets high \
    --model configs/tiny.json --batch-size 2 --seq-len 32 --np 2 --steps 4 --val-every 2 --val-batches 1 \
    --checkpoint-every -1 --lr adamw=0.004 --lr demo=0.002 >"$TMP/real.log" 2>&1
  check "a real 2-rank comparison runs" test $? -eq 0 || tail -5 "$TMP/real.log"
  check "AdamW-DDP's bytes per step are the ring all-reduce's 2(W-1)/W * 4 * n" \
    $PY - "$TMP/real/out/results.json" <<'EOF'
import json, sys
runs = {r["setting"]: r for r in json.load(open(sys.argv[1]))["runs"]}
n, w = 3323648, 2
assert runs["adamw"]["bytes_per_step"] == 2 * (w - 1) / w * 4 * n, runs["adamw"]["bytes_per_step"]
assert 0 < runs["demo_k32"]["bytes_per_step"] < runs["adamw"]["bytes_per_step"] / 10
assert len(runs["demo_k32"]["val_loss"]) == 2
EOF
else
  echo "skip  the real comparison (no mpirun or train_gpt_cpu)"
fi
echo "$failures failure(s)"
[[ $failures -eq 0 ]]
