#!/usr/bin/env bash
# --demo_diagnostics through train_gpt_cpu on 2 ranks (the numbers themselves are checked against a reference by
# test/unit/test_demo_diagnostics.cpp): a "diagnostics" line every N steps with every group and measure in range, none
# when off (and no cost), losses bit-identical on and off, the residual norms against the momenta a checkpoint at the
# same step holds, scripts/plot_diagnostics.py draws the run, and the refusals are one line (train_gpt's too).
set -uo pipefail
cd "$(dirname "$0")/../.."
source test/support/checks.sh
command -v mpirun >/dev/null || { echo "SKIP: mpirun not installed"; exit 77; }
[[ -x train_gpt_cpu ]] || { echo "SKIP: make train_gpt_cpu first"; exit 77; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 OMP_NUM_THREADS=1
data/prepare_default.sh >/dev/null
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
base=(--config configs/tiny.json --shuffle false --val_every 0 --sample_every 0 --threads 1 --steps 6
  --optimizer demo --demo_topk 8)
run() { local out=$1; shift; mpirun -np 2 ./train_gpt_cpu "${base[@]}" --out_dir "$tmp/$out" "$@" >"$tmp/$out.log" 2>&1; }
run on --demo_diagnostics 3 --checkpoint_every 3 || fail "diagnostics run: $(tail -3 "$tmp/on.log")"
run off --checkpoint_every -1 || fail "plain run: $(tail -3 "$tmp/off.log")"
/usr/bin/python3 - "$tmp" <<'PY' || failures=$((failures + 1))
import json, sys
tmp = sys.argv[1]
def lines(name):
    with open(f"{tmp}/{name}/metrics.jsonl") as f:
        return [json.loads(l) for l in f]
on, off = lines("on"), lines("off")
ok = True
def check(cond, what):
    global ok
    print(("ok    " if cond else "FAIL  ") + what)
    ok &= bool(cond)
diag = [l for l in on if l["type"] == "diagnostics"]
check([d["step"] for d in diag] == [3, 6], f"diagnostics lines at steps 3 and 6 (got {[d['step'] for d in diag]})")
check(not any(l["type"] == "diagnostics" for l in off), "no diagnostics lines when off")
check(all(l["opt_ms"]["diagnostics"] == 0.0 for l in off if l["type"] == "train"), "no diagnostics time when off")
check(all(l["opt_ms"]["diagnostics"] > 0.0 for l in on if l["type"] == "train" and l["step"] % 3 == 0),
      "diagnostics time in the due steps' breakdown")
loss = lambda ls: [l["loss"] for l in ls if l["type"] == "train"]
check(loss(on) == loss(off), "losses bit-identical with diagnostics on and off")
fields = {"energy_topk_dct", "energy_topk_raw", "energy_topk_random", "persistence", "tvar_sent", "tvar_residual",
          "jaccard", "cos_sent", "cos_residual", "momentum_norm", "residual_norm", "residual_ratio"}
for d in diag:
    check(d["transform"] == "dct" and d["ranks"] == 2 and d["window"] == 3, f"step {d['step']}: header")
    check(set(d["groups"]) == {"embeddings", "attention", "mlp", "vectors"}, f"step {d['step']}: groups")
    for g, v in d["groups"].items():
        check(set(v) == fields, f"step {d['step']} {g}: every measure")
        in01 = [k for k in fields - {"cos_sent", "cos_residual", "momentum_norm", "residual_norm"}
                if not 0.0 <= v[k] <= 1.0 + 1e-6]
        check(not in01 and -1 <= v["cos_sent"] <= 1 and -1 <= v["cos_residual"] <= 1 + 1e-9,
              f"step {d['step']} {g}: ranges {in01}")
json.dump(diag, open(f"{tmp}/diag.json", "w"))
sys.exit(0 if ok else 1)
PY
# The residual after error feedback is the momentum a checkpoint at that step holds (state_format.h, read as
# elastic_checks.py reads it): the groups' residual norms (each the root mean square over the ranks) must add up, in
# squares, to the ranks' mean |m_r|^2 recomputed from the checkpoint of step 6.
/usr/bin/python3 - "$tmp" <<'PY' || failures=$((failures + 1))
import json, sys
import numpy as np
sys.path.insert(0, "test/e2e")
from elastic_checks import demo_momentum, ranks
tmp = sys.argv[1]
d = [x for x in json.load(open(f"{tmp}/diag.json")) if x["step"] == 6][0]
states = ranks(f"{tmp}/on/checkpoints/step_00000006")
ref = np.mean([np.sum(demo_momentum(s["blob"])[1].astype(np.float64) ** 2) for s in states])
got = sum(g["residual_norm"] ** 2 for g in d["groups"].values())
ok = len(states) == 2 and abs(got - ref) <= 1e-9 * ref
print(("ok    " if ok else "FAIL  ") + f"residual norms against the checkpoint's momenta ({got:.6g} vs {ref:.6g})")
sys.exit(0 if ok else 1)
PY
if [[ -x ./train_gpt ]]; then
  expect_error "--demo_diagnostics: CPU trainer only for now" ./train_gpt "${base[@]}" --demo_diagnostics 2 \
    --out_dir "$tmp/g"
fi
expect_error "--demo_diagnostics must be >= 0 (got -2)" ./train_gpt_cpu "${base[@]}" --demo_diagnostics -2 \
  --out_dir "$tmp/x"
expect_error "--demo_diagnostics runs with flat DeMo only" ./train_gpt_cpu "${base[@]}" --demo_diagnostics 2 \
  --demo_delay 1 --out_dir "$tmp/x"
/usr/bin/python3 scripts/plot_diagnostics.py "$tmp/on" --out "$tmp/plots" >/dev/null &&
  [[ -s $tmp/plots/energy.png && -s $tmp/plots/temporal.png && -s $tmp/plots/agreement.png &&
     -s $tmp/plots/residual.png && -s $tmp/plots/table.md ]] && pass "plot_diagnostics.py draws the run" ||
  fail "plot_diagnostics.py draws the run"
echo "$failures failure(s)"
[[ $failures -eq 0 ]]
