#!/usr/bin/env bash
# --optimizer topk (DeMo without the transform) through train_gpt_cpu on 2 ranks (the step itself is checked against
# dev/reference/demo_reference.py's identity transform by test_demo_reference.sh: cases r1/r2/r4_topk_*): the loss
# falls, every rank's weights agree after every step, the bytes per step equal DeMo's (the same wire format and k),
# a checkpoint resumed at step 3 gives the straight run's bits, and the refusals are one line each (train_gpt's
# too: the DCT kernels' options with topk, a random transform).
set -uo pipefail
cd "$(dirname "$0")/../.."
source test/support/checks.sh
command -v mpirun >/dev/null || { echo "SKIP: mpirun not installed"; exit 77; }
[[ -x train_gpt_cpu ]] || { echo "SKIP: make train_gpt_cpu first"; exit 77; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 OMP_NUM_THREADS=1
data/prepare_default.sh >/dev/null
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
base=(--config configs/tiny.json --shuffle false --val_every 0 --sample_every 0 --lr 4e-3 --threads 1 --steps 6)
run() { local out=$1; shift; mpirun -np 2 ./train_gpt_cpu "${base[@]}" --out_dir "$tmp/$out" "$@" >"$tmp/$out.log" 2>&1; }
run topk --optimizer topk --weight_check_every 1 --checkpoint_every 3 || fail "topk run: $(tail -3 "$tmp/topk.log")"
run demo --optimizer demo --checkpoint_every -1 || fail "demo run: $(tail -3 "$tmp/demo.log")"
run resumed --optimizer topk --checkpoint_every -1 --resume "$tmp/topk/checkpoints/step_00000003" ||
  fail "resumed run: $(tail -3 "$tmp/resumed.log")"
/usr/bin/python3 - "$tmp" <<'PY' || failures=$((failures + 1))
import json, sys
tmp = sys.argv[1]
def steps(name):
    with open(f"{tmp}/{name}/metrics.jsonl") as f:
        return [r for r in map(json.loads, f) if r.get("type") == "train"]
topk, demo, resumed = steps("topk"), steps("demo"), steps("resumed")
ok = True
def check(cond, what):
    global ok
    print(("ok    " if cond else "FAIL  ") + what)
    ok = ok and cond
check(len(topk) == 6 and topk[-1]["loss"] < topk[0]["loss"] - 0.1,
      f"topk on 2 ranks learns: loss {topk[0]['loss']:.3f} -> {topk[-1]['loss']:.3f} (weights compared every step)")
check(all(a["bytes_sent"] == b["bytes_sent"] for a, b in zip(topk, demo)) and len(topk) == len(demo),
      f"topk sends DeMo's bytes per step ({topk[-1]['bytes_sent']})")
check(any(a["loss"] != b["loss"] for a, b in zip(topk[1:], demo[1:])), "topk's losses are not DeMo's")
check([r["step"] for r in resumed] == [4, 5, 6] and all(a["loss"] == b["loss"] and a["grad_norm"] == b["grad_norm"]
                                                       for a, b in zip(resumed, topk[3:])),
      "topk resumed at step 3: steps 4-6 bit-identical to the straight run")
sys.exit(0 if ok else 1)
PY
expect_error "--optimizer topk has no transform" ./train_gpt_cpu "${base[@]}" --optimizer topk --demo_transform random --out_dir "$tmp/x"
# topk's refusal is topk's alone: every optimizer's options are validated on every run, and DeMo takes a transform
check "train_gpt_cpu --optimizer demo --demo_transform random passes (a dry run)" bash -c '"$@" >/dev/null' _ \
  ./train_gpt_cpu "${base[@]}" --optimizer demo --demo_transform random --dry_run true --out_dir "$tmp/z"
expect_error "--optimizer topk has no transform" ./train_gpt_cpu "${base[@]}" --optimizer topk --demo_transform random \
  --dry_run true --out_dir "$tmp/x"
# train_gpt runs topk (checked against train_gpt_cpu by test/emulated/emulated_gpu_checks.py); what its kernels do
# not run is refused in one line before any GPU work, so on any machine
for gpu in ./train_gpt build/emu/train_gpt; do
  [[ -x $gpu ]] || continue
  expect_error "--demo_transform random: train_gpt's DeMo kernels run the DCT or no transform" "$gpu" "${base[@]}" \
    --optimizer demo --demo_transform random --out_dir "$tmp/y"
  expect_error "--demo_momentum_domain dct: --optimizer topk has no transform" "$gpu" "${base[@]}" --optimizer topk \
    --demo_momentum_domain dct --out_dir "$tmp/y"
  expect_error "--demo_dct tensor: --optimizer topk has no DCTs" "$gpu" "${base[@]}" --optimizer topk --demo_dct tensor \
    --out_dir "$tmp/y"
done
echo "$failures failure(s)"
[[ $failures -eq 0 ]]
