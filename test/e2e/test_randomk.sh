#!/usr/bin/env bash
# --optimizer randomk (DeMo without the transform, k seeded-random coefficients per chunk, all-reduced), in two parts.
# 1. The optimizer against the PyTorch reference (dev/reference/randomk_reference.py, which reimplements the index
#    rule from randomk.h's text): build/test/test_mpi_randomk writes cases for 1, 2 and 4 ranks (fp32 and bf16
#    variants), the reference runs them, and mpirun -np 1/2/4 compares the drawn positions (exactly), the weights and
#    every rank's momentum after every step, with bit-identical weights and positions on every rank, the byte
#    counters, a save/load at step 3 and the refused blobs (tolerances in test/unit/test_mpi_randomk.cpp).
# 2. train_gpt_cpu --optimizer randomk on 2 ranks, tiny GPT-2, 6 steps: the loss falls with the weights compared every
#    step; bytes_sent per step is the dry run's ring figure; a checkpoint at step 3 resumed gives bit-identical
#    losses; --help lists randomk_seed; bad values and unsupported DeMo options are refused in one line (and stay
#    legal for --optimizer demo); train_gpt (CUDA, or the emulated device's build) refuses randomk in one line.
# Skips without mpirun, the binaries, or /usr/bin/python3 with numpy and torch.
set -uo pipefail
cd "$(dirname "$0")/../.."
source test/support/checks.sh
command -v mpirun >/dev/null || { echo "SKIP: mpirun not installed"; exit 77; }
bin=build/test/test_mpi_randomk
py=/usr/bin/python3
[[ -x "$bin" && -x train_gpt_cpu ]] || { echo "SKIP: make train_gpt_cpu $bin first"; exit 77; }
"$py" -c "import numpy, torch" 2>/dev/null || { echo "SKIP: $py lacks numpy/torch"; exit 77; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export OMP_NUM_THREADS=1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
data/prepare_default.sh >/dev/null

# ---- 1. against the reference
cases=()
for name in $("$bin" --write-cases "$tmp/cases"); do cases+=("$tmp/cases/$name"); done
check "the reference ran ${#cases[@]} cases" "$py" dev/reference/randomk_reference.py "${cases[@]}"
for np in 1 2 4; do
  if timeout 300 mpirun -np "$np" "$bin" --check-cases "$tmp/cases" >"$tmp/np$np.log" 2>&1; then
    pass "$np rank(s): randomk matches the reference (positions, weights, momenta), ranks agree, bytes, resume"
  else
    fail "$np rank(s): test_mpi_randomk --check-cases"; tail -n 20 "$tmp/np$np.log"
  fi
  grep "rank(s): positions" "$tmp/np$np.log" | sed 's/^/      /'
done

# ---- 2. the trainer
base=(--config configs/tiny.json --shuffle false --val_every 0 --sample_every 0 --lr 4e-3 --threads 1 --steps 6
      --optimizer randomk)
run() { local out=$1; shift; timeout 300 mpirun -np 2 ./train_gpt_cpu "${base[@]}" --out_dir "$tmp/$out" "$@" >"$tmp/$out.log" 2>&1; }
run straight --weight_check_every 1 --checkpoint_every 3 --keep_checkpoints 0 ||
  fail "randomk run: $(tail -3 "$tmp/straight.log")"
run resumed --checkpoint_every -1 --resume "$tmp/straight/checkpoints/step_00000003" ||
  fail "resumed run: $(tail -3 "$tmp/resumed.log")"
mpirun -np 2 ./train_gpt_cpu "${base[@]}" --out_dir "$tmp/dry" --dry_run >"$tmp/dry.txt" 2>&1
want=$(sed -n 's/.*all-reduce sent (ring.*(\([0-9]*\) bytes).*/\1/p' "$tmp/dry.txt")
"$py" - "$tmp" "$want" <<'PY' || failures=$((failures + 1))
import json, sys
tmp, want = sys.argv[1], sys.argv[2]
def steps(name):
    with open(f"{tmp}/{name}/metrics.jsonl") as f:
        return [r for r in map(json.loads, f) if r.get("type") == "train"]
straight, resumed = steps("straight"), steps("resumed")
ok = True
def check(cond, what):
    global ok
    print(("ok    " if cond else "FAIL  ") + what)
    ok = ok and cond
check(len(straight) == 6 and straight[-1]["loss"] < straight[0]["loss"] - 0.05,
      f"randomk on 2 ranks learns: loss {straight[0]['loss']:.3f} -> {straight[-1]['loss']:.3f} "
      "(weights compared every step)")
check(want.isdigit() and int(want) > 0 and all(r["bytes_sent"] == int(want) for r in straight),
      f"bytes_sent every step is the dry run's ring all-reduce figure ({want or 'missing'})")
check([r["step"] for r in resumed] == [4, 5, 6] and all(a["loss"] == b["loss"] and a["grad_norm"] == b["grad_norm"]
                                                       for a, b in zip(resumed, straight[3:])),
      "resumed at step 3: steps 4-6 bit-identical to the straight run")
sys.exit(0 if ok else 1)
PY
# the dry run's payload: S values of 4 bytes, and the ring's 2 (W-1)/W of it at W = 2 is the payload itself
payload=$(sed -n 's/.*drawn values (payload), \([0-9]*\) of.*/\1/p' "$tmp/dry.txt")
check "the ring model at 2 ranks: 4 x $payload values = $want bytes" test "$((4 * ${payload:-0}))" = "${want:-x}"

# a resume with another seed is refused (randomk_seed is fixed on resume)
mpirun -np 2 ./train_gpt_cpu "${base[@]}" --out_dir "$tmp/reseed" --resume "$tmp/straight/checkpoints/step_00000003" \
  --randomk_seed 5 >/dev/null 2>"$tmp/reseed.err"
check "a resume with another --randomk_seed is refused: $(head -n 1 "$tmp/reseed.err")" \
  grep -q "^error.*randomk_seed" "$tmp/reseed.err"

./train_gpt_cpu --help >"$tmp/help" 2>&1
check "--help lists randomk_seed and --optimizer randomk" grep -q "randomk_seed" "$tmp/help"
one=(./train_gpt_cpu "${base[@]}" --steps 2 --out_dir "$tmp/bad")
expect_error "--randomk_seed must be >= 0 (got -1)" "${one[@]}" --randomk_seed -1
expect_error "--demo_values: --optimizer randomk all-reduces fp32 or bf16 values" "${one[@]}" --demo_values sign
expect_error "--demo_indices: --optimizer randomk sends no indices" "${one[@]}" --demo_indices packed12
expect_error "--demo_delay: --optimizer randomk runs --demo_delay 0 only" "${one[@]}" --demo_delay 1
expect_error "--demo_transform: --optimizer randomk has no transform" "${one[@]}" --demo_transform identity
expect_error "--shard_group_size: --optimizer randomk runs flat only" "${one[@]}" --shard_group_size 2
# randomk's (and topk's) refusals are their own: DeMo still takes those options (validate_config runs every
# family's check, whatever --optimizer says)
quiet() { "$@" >/dev/null 2>&1; }
check "--optimizer demo keeps --demo_values sign --demo_delay 1 --demo_indices packed12 --demo_transform random" \
  quiet ./train_gpt_cpu "${base[@]}" --optimizer demo --demo_values sign --demo_delay 1 --demo_indices packed12 \
  --demo_transform random --out_dir "$tmp/demo_dry" --dry_run
for cuda in ./train_gpt build/emu/train_gpt; do
  [[ -x $cuda ]] || continue
  expect_error "--optimizer: 'randomk' has no CUDA implementation (train_gpt_cpu runs it)" \
    "$cuda" "${base[@]}" --out_dir "$tmp/cuda"
done

[[ $failures -eq 0 ]] && echo "all randomk checks passed" || echo "$failures check(s) failed"
[[ $failures -eq 0 ]]
