#!/usr/bin/env bash
# --demo_indices entropy (Elias-Fano coded chunk indices, llmc/optim/demo/codec.h) through train_gpt_cpu on 2 ranks:
# the indices are lossless, so DeMo's losses and gradient norms are those of --demo_indices auto bit for bit, and
# --optimizer topk's with sign values and --demo_delay 1 too, while every step sends fewer bytes; a delayed run's
# checkpoint (its pending round is an entropy-coded bucket) resumes bit for bit; the dry run reports the entropy
# columns; --help lists the value; a bad value and the CUDA trainer are refused in one line.
set -uo pipefail
cd "$(dirname "$0")/../.."
source test/support/checks.sh
command -v mpirun >/dev/null || { echo "SKIP: mpirun not installed"; exit 77; }
[[ -x train_gpt_cpu ]] || { echo "SKIP: make train_gpt_cpu first"; exit 77; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 OMP_NUM_THREADS=1
data/prepare_default.sh >/dev/null
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
base=(--config configs/tiny.json --shuffle false --val_every 0 --sample_every 0 --lr 4e-3 --threads 1 --steps 4)
run() { local out=$1; shift; mpirun -np 2 ./train_gpt_cpu "${base[@]}" --out_dir "$tmp/$out" "$@" >"$tmp/$out.log" 2>&1; }
run demo_auto --optimizer demo --checkpoint_every -1 || fail "demo auto run: $(tail -3 "$tmp/demo_auto.log")"
run demo_ef --optimizer demo --demo_indices entropy --checkpoint_every -1 --weight_check_every 1 ||
  fail "demo entropy run: $(tail -3 "$tmp/demo_ef.log")"
topk=(--optimizer topk --demo_values sign --demo_delay 1 --demo_topk 8)
run topk_auto "${topk[@]}" --checkpoint_every -1 || fail "topk auto run: $(tail -3 "$tmp/topk_auto.log")"
run topk_ef "${topk[@]}" --demo_indices entropy --checkpoint_every 2 || fail "topk entropy run: $(tail -3 "$tmp/topk_ef.log")"
run resumed "${topk[@]}" --demo_indices entropy --checkpoint_every -1 --resume "$tmp/topk_ef/checkpoints/step_00000002" ||
  fail "resumed run: $(tail -3 "$tmp/resumed.log")"
/usr/bin/python3 - "$tmp" <<'PY' || failures=$((failures + 1))
import json, sys
tmp = sys.argv[1]
def steps(name):
    with open(f"{tmp}/{name}/metrics.jsonl") as f:
        return [r for r in map(json.loads, f) if r.get("type") == "train"]
ok = True
def check(cond, what):
    global ok
    print(("ok    " if cond else "FAIL  ") + what)
    ok = ok and cond
def same(a, b):
    return len(a) == len(b) == 4 and all(x["loss"] == y["loss"] and x["grad_norm"] == y["grad_norm"] for x, y in zip(a, b))
for auto, ef, what in (("demo_auto", "demo_ef", "demo, fp32 values, k 32"), ("topk_auto", "topk_ef", "topk, sign values, k 8, delay 1")):
    a, e = steps(auto), steps(ef)
    check(same(a, e), f"{what}: entropy indices give auto's losses and grad norms bit for bit ({e[-1]['loss']:.6f})")
    fewer = all(y["bytes_sent"] < x["bytes_sent"] for x, y in zip(a, e) if x["bytes_sent"] > 0)
    check(fewer and any(x["bytes_sent"] > 0 for x in a),
          f"{what}: fewer bytes per step ({e[-1]['bytes_sent']} against {a[-1]['bytes_sent']})")
resumed, straight = steps("resumed"), steps("topk_ef")
check([r["step"] for r in resumed] == [3, 4] and all(a["loss"] == b["loss"] and a["grad_norm"] == b["grad_norm"]
                                                    for a, b in zip(resumed, straight[2:])),
      "delayed topk with entropy indices resumed at step 2: steps 3-4 bit-identical to the straight run")
sys.exit(0 if ok else 1)
PY
dry=$(./train_gpt_cpu "${base[@]}" --optimizer demo --demo_indices entropy --dry_run 2>&1)
check "the dry run reports the entropy columns" grep -q "fp32+ef" <<<"$dry"
check "--help lists --demo_indices entropy" bash -c './train_gpt_cpu --help | grep -- "--demo_indices" | grep -q entropy'
expect_error "--demo_indices: 'huffman' is not one of: auto, packed12, entropy" \
  ./train_gpt_cpu "${base[@]}" --demo_indices huffman --out_dir "$tmp/x"
for gpu in ./train_gpt build/emu/train_gpt; do
  [[ -x $gpu ]] && expect_error "--demo_indices entropy: train_gpt's DeMo kernels" "$gpu" "${base[@]}" --optimizer demo \
    --demo_indices entropy --out_dir "$tmp/y"
done
echo "$failures failure(s)"
[[ $failures -eq 0 ]]
