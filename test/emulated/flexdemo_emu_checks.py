"""The sharded steps in the CUDA trainer on the emulated device (test_flexdemo_emu.sh runs this), against the CPU
trainer's (test/e2e/flexdemo_checks.py checks those against their flat twins): FlexDeMo and hybrid AdamW in 2 nodes
x 2 ranks and ZeRO-1 in 1 x 4 over the NCCL transport's sub-communicators (ncclCommSplit, grouped ncclReduce and
ncclBroadcast) at the CPU trainer's losses, norms and bytes by link; the host-staged MPI transport at the NCCL
transport's losses; --demo_replicate_every 2; every rank's weights compared after every step; a CPU checkpoint
continued on the GPU trainer; a bf16 run resumed bit for bit; a resume in other nodes refused in one line."""
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.chdir(ROOT)
TMP = tempfile.mkdtemp(prefix="flexdemo_emu_")
CPU, FP32, BF16 = "./train_gpt_cpu", "build/emu-fp32/train_gpt", "build/emu/train_gpt"
BASE = ["--config", "configs/tiny.json", "--shuffle", "false", "--val_every", "0", "--lr", "4e-3", "--threads", "1",
        "--sample_every", "0", "--checkpoint_every", "-1", "--weight_check_every", "1"]
failures = 0


def check(ok, what):
    global failures
    print(("ok    " if ok else "FAIL  ") + what, flush=True)
    if not ok:
        failures += 1


def train(trainer, name, *flags, steps=4, fresh=True, expect_ok=True):
    out = os.path.join(TMP, name)
    if fresh:
        subprocess.run(["rm", "-rf", out])
    cmd = ["mpirun", "-np", "4", trainer, *BASE, "--steps", str(steps), "--out_dir", out, *flags]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    if expect_ok and p.returncode != 0:
        check(False, f"{name}: exit {p.returncode}: {(p.stdout + p.stderr)[-800:]}")
    return out, p


def steps_of(out):
    path = os.path.join(out, "metrics.jsonl")
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [r for r in map(json.loads, f) if r.get("type") == "train"]


def worst(a, b, key):
    return max(abs(x[key] - y[key]) / max(abs(y[key]), 1e-12) for x, y in zip(a, b)) if a and len(a) == len(b) else 1.0


def compare(what, got, want, rel, norm_rel=1e-3, skip=0):
    """`got`'s steps against `want`'s after its first `skip`."""
    a, b = steps_of(got), steps_of(want)[skip:]
    wl, wn = worst(a, b, "loss"), worst(a, b, "grad_norm")
    check(len(a) == len(b) > 0 and wl <= rel and wn <= norm_rel,
          f"{what}: {len(a)} steps, loss within {rel:g} (worst {wl:.2e}), norm within {norm_rel:g} (worst {wn:.2e})")


def same_bytes(what, got, want):
    keys = ("bytes_sent", "bytes_sent_intra", "bytes_sent_inter", "bytes_recv", "payload_bytes")
    a, b = steps_of(got), steps_of(want)
    check(len(a) == len(b) > 0 and all(x[k] == y[k] for x, y in zip(a, b) for k in keys),
          f"{what}: {', '.join(keys)} per step equal the CPU trainer's "
          f"({a[-1]['bytes_sent_intra'] if a else '-'} intra, {a[-1]['bytes_sent_inter'] if a else '-'} inter)")


demo22 = ["--optimizer", "demo", "--shard_group_size", "2"]
adamw22 = ["--optimizer", "adamw", "--shard_group_size", "2"]
zero1 = ["--optimizer", "adamw", "--shard_group_size", "4"]
replicate = demo22 + ["--demo_replicate_every", "2"]

# --- the GPU trainer's sharded steps at the CPU trainer's arithmetic (fp32: summation order alone separates
# them; DeMo's sign can flip on near-zero coefficients, so its tolerance is wider)
for name, flags, rel in (("demo_2x2", demo22, 1e-4), ("adamw_2x2", adamw22, 2e-5), ("zero1_1x4", zero1, 2e-5),
                         ("replicate2_2x2", replicate, 1e-4)):
    cpu, _ = train(CPU, "cpu_" + name, *flags, "--checkpoint_every", "2")  # the step-2 checkpoint for below
    gpu, p = train(FP32, "gpu_" + name, *flags)
    compare(f"fp32 {name} (NCCL sub-communicators, weights compared after every step) vs CPU trainer", gpu, cpu, rel)
    same_bytes(f"fp32 {name}", gpu, cpu)
    if name == "demo_2x2":
        check("(intra " in p.stdout and ", inter " in p.stdout, "the GPU trainer's progress line splits the bytes by link")
        s = steps_of(gpu)
        check(bool(s) and all(s[-1]["opt_ms"].get(k, 0) > 0 for k in ("reduce_scatter", "allgather")),
              f"the GPU trainer times the reduce-scatter and the all-gather: {s[-1]['opt_ms'] if s else None}")
    if name == "replicate2_2x2":
        s = steps_of(gpu)
        check(len(s) == 4 and all((x["bytes_sent_inter"] == 0) == (x["step"] % 2 == 1) for x in s),
              "--demo_replicate_every 2 on the GPU trainer: inter-node bytes at even steps only")

# --- the host-staged MPI transport's groups give the NCCL transport's numbers
for name, flags in (("demo_2x2", demo22), ("adamw_2x2", adamw22)):
    staged, _ = train(FP32, "staged_" + name, *flags, "--transport", "mpi")
    compare(f"fp32 {name}, --transport mpi vs the NCCL transport", staged, os.path.join(TMP, "gpu_" + name), 1e-6, 1e-6)

# --- checkpoints: the CPU trainer's step-2 checkpoint continued on the GPU trainer; a bf16 run resumed bit for bit
for name, flags in (("demo", demo22), ("adamw", adamw22), ("replicate2", replicate)):
    cpu = os.path.join(TMP, f"cpu_{name}_2x2")
    step2 = os.path.join(cpu, "checkpoints", "step_00000002")
    handover, _ = train(FP32, f"gpu_{name}_from_cpu", *flags, "--resume", step2)
    compare(f"the CPU trainer's 2x2 {name} step-2 checkpoint continued by the fp32 GPU trainer: steps 3-4",
            handover, cpu, 1e-4, skip=2)
    check([x["step"] for x in steps_of(handover)] == [3, 4], f"{name}: the GPU trainer resumed at step 3")

for name, flags in (("demo", demo22), ("adamw", adamw22)):
    straight, _ = train(BF16, f"bf16_{name}_straight", *flags, "--checkpoint_every", "2")
    step2 = os.path.join(straight, "checkpoints", "step_00000002")
    resumed, _ = train(BF16, f"bf16_{name}_resumed", *flags, "--resume", step2)
    a, b = steps_of(resumed), steps_of(straight)[2:]
    check(len(a) == len(b) == 2 and all(x["loss"] == y["loss"] and x["grad_norm"] == y["grad_norm"] for x, y in zip(a, b)),
          f"bf16 {name} 2x2 resumed at step 2: steps 3-4 bit-identical to the straight run")

step2 = os.path.join(TMP, "bf16_demo_straight", "checkpoints", "step_00000002")
_, p = train(BF16, "refused", "--optimizer", "demo", "--shard_group_size", "4", "--resume", step2, expect_ok=False)
line = next((l for l in p.stderr.splitlines() if "shard_group_size" in l), p.stderr[-300:])
check(p.returncode != 0 and "shard_group_size is 4 here" in p.stderr and "Segmentation" not in p.stderr,
      f"a checkpoint of nodes of 2 does not resume in nodes of 4 on the GPU trainer: {line.strip()}")

print(f"{failures} failure(s)")
sys.exit(1 if failures else 0)
