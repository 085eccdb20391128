"""DiLoCo in the CUDA trainer on the emulated device (test_diloco_emu.sh runs this), against the CPU trainer's (whose
DiLoCo test/e2e/test_diloco.sh checks against the PyTorch reference): tiny GPT-2, H = 2, 4 steps (two rounds) at 1
and 2 ranks on the fp32 and int8 wires (and bf16 on 2); the losses, norms, byte counters and the final global weights
(the step-4 model.bin) at the CPU trainer's; --weight_check_every 1 (the global weights bit-identical on every rank
after every step, or the run fails); the int8 wire over the host-staged MPI transport at the NCCL transport's bits; a
bf16 run checkpointed mid-round (step 3) and resumed bit for bit; the CUDA trainer's int8 mid-round checkpoint
continued by the CPU trainer and the CPU's by the CUDA trainer; refusals in one line. Then --optimizer sparseloco
(the CPU's SparseLocoWire on the host, top-16) the same way: 1 and 2 ranks against the CPU trainer, equal bytes, its
step-3 checkpoints across the trainers both ways, a bf16 CUDA resume bit for bit, its blob refused as diloco.

Tolerances: the fp32 build's kernels sum in other orders than the CPU's (matmuls, the norms), so the two trainers
agree to float rounding (2e-5 on the loss, as flexdemo_emu_checks.py's AdamW, 1e-3 on the norm), and the weights to
2e-5 of their largest magnitude. The int8 wire's rint can round a value of a block the other way when the
pseudo-gradients differ by a rounding, one quantum (absmax / 127) in that element, so it gets 1e-4 on the loss and
1e-3 on the weights; the bf16 wire likewise (one bf16 ulp of the delta where a sum rounds the other way). Those flips
are rare: at most 0.5% of the weights may differ by more than 1e-5 (a round moves them by about 4e-3; an int8 decode
that takes rank 0's scales for rank 1's values puts 11% of them beyond it)."""
import json
import os
import re
import subprocess
import sys
import tempfile

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.chdir(ROOT)
TMP = tempfile.mkdtemp(prefix="diloco_emu_")
# On a GPU (dev/cuda/gpu_session.sh) the same checks run the real trainers: DILOCO_FP32=./train_gpt_fp32
# DILOCO_BF16=./train_gpt DILOCO_RANKS=1 (one GPU: NCCL takes one rank per GPU).
CPU = "./train_gpt_cpu"
FP32 = os.environ.get("DILOCO_FP32", "build/emu-fp32/train_gpt")
BF16 = os.environ.get("DILOCO_BF16", "build/emu/train_gpt")
RANKS = [int(r) for r in os.environ.get("DILOCO_RANKS", "1 2").split()]
W = max(RANKS)  # the world of the checkpoint checks
# configs/tiny.json with 1001 tokens in 1152 wte rows over the default corpus's ids mod 1001, as
# emulated_gpu_checks.py does: at 50257 tokens the classifier is most of the emulated device's time.
CONFIG, DATA = os.path.join(TMP, "tiny-vocab1001.json"), os.path.join(TMP, "vocab1001-data")


def write_small_vocabulary():
    config = {k: v for k, v in json.load(open("configs/tiny.json")).items() if not k.startswith("_")}
    with open(CONFIG, "w") as f:
        json.dump(dict(config, vocab_size=1001, padded_vocab_size=1152, eos_token_id=1000, pad_token_id=1000), f)
    os.makedirs(DATA, exist_ok=True)
    for name in sorted(os.listdir("data/default")):
        if re.fullmatch(r"default_(train|val)_\d+\.bin", name):
            raw = open(os.path.join("data/default", name), "rb").read()
            tokens = np.frombuffer(raw, dtype=np.uint16, offset=1024) % 1001
            with open(os.path.join(DATA, name), "wb") as f:
                f.write(raw[:1024] + tokens.astype(np.uint16).tobytes())


write_small_vocabulary()
BASE = ["--config", CONFIG, "--train_data", os.path.join(DATA, "default_train_*.bin"),
        "--val_data", os.path.join(DATA, "default_val_*.bin"), "--shuffle", "false", "--val_every", "0", "--lr",
        "4e-3", "--threads", "1", "--sample_every", "0", "--checkpoint_every", "-1", "--weight_check_every", "1",
        "--batch_size", "2", "--seq_len", "32", "--total_batch_size", "128", "--optimizer", "diloco",
        "--diloco_inner_steps", "2"]
failures = 0


def check(ok, what):
    global failures
    print(("ok    " if ok else "FAIL  ") + what, flush=True)
    if not ok:
        failures += 1


def train(trainer, name, np_, *flags, steps=4, expect_ok=True):
    out = os.path.join(TMP, name)
    subprocess.run(["rm", "-rf", out])
    launcher = ["mpirun", "-np", str(np_)] if np_ > 1 else []
    cmd = [*launcher, trainer, *BASE, "--steps", str(steps), "--out_dir", out, *flags]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
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


def weights(out, step):
    path = os.path.join(out, "checkpoints", f"step_{step:08d}", "model.bin")
    return np.fromfile(path, dtype=np.float32, offset=1024) if os.path.exists(path) else None


def compare(what, got, want, rel, skip=0):
    a, b = steps_of(got), steps_of(want)[skip:]
    wl, wn = worst(a, b, "loss"), worst(a, b, "grad_norm")
    check(len(a) == len(b) > 0 and wl <= rel and wn <= 1e-3,
          f"{what}: {len(a)} steps, loss within {rel:g} (worst {wl:.2e}), norm within 1e-3 (worst {wn:.2e})")


KEYS = ("bytes_sent", "bytes_recv", "payload_bytes")
cpu_runs = {}
for np_ in RANKS:
    # bf16 (one rank: nothing rounds) where it rounds, on 2 ranks: the wire's rounding points are the CPU's
    for wire, rel, wrel in (("fp32", 2e-5, 2e-5), ("int8", 1e-4, 1e-3)) + ((("bf16", 1e-4, 1e-3),) if np_ > 1 else ()):
        name = f"{wire}_np{np_}"
        flags = ["--diloco_wire", wire, "--checkpoint_every", "3"]  # step 3 (mid-round) and the last, step 4
        cpu, _ = train(CPU, "cpu_" + name, np_, *flags)
        gpu, _ = train(FP32, "gpu_" + name, np_, *flags)
        cpu_runs[name] = cpu
        compare(f"fp32 build, {np_} rank(s), {wire} wire, weights compared every step vs CPU trainer", gpu, cpu, rel)
        a, b = steps_of(gpu), steps_of(cpu)
        check(len(a) == len(b) == 4 and all(x[k] == y[k] for x, y in zip(a, b) for k in KEYS) and
              all((x["bytes_sent"] > 0) == (np_ > 1 and x["step"] % 2 == 0) for x in a),
              f"{name}: {', '.join(KEYS)} per step equal the CPU trainer's, bytes sent at sync steps only "
              f"({[x['bytes_sent'] for x in a]})")
        wg, wc = weights(gpu, 4), weights(cpu, 4)
        ok = wg is not None and wc is not None and wg.shape == wc.shape
        err = float(np.max(np.abs(wg - wc)) / np.max(np.abs(wc))) if ok else 1.0
        off = float(np.mean(np.abs(wg - wc) > 1e-5)) if ok else 1.0  # 4x the fp32 builds' largest difference
        check(err <= wrel and off <= 0.005,
              f"{name}: step-4 global weights (model.bin) within {wrel:g} of the CPU's (worst {err:.2e}), "
              f"{off:.2%} off by more than 1e-5 (at most 0.5%: the wire's rounding flips)")
        if wire == "int8" and np_ == W:
            s = a[-1]["opt_ms"] if a else {}
            check(all(s.get(k, 0) > 0 for k in ("transform", "exchange", "apply")),
                  f"the sync step times its transform, exchange and apply: {s}")

# --- checkpoints across the trainers, mid-round (step 3: the local weights differ from the global ones)
for name in (f"int8_np{W}",):  # the int8 wire: the blob and the messages both cross
    wire = "int8"
    gpu_ck = os.path.join(TMP, "gpu_" + name, "checkpoints", "step_00000003")
    cpu_ck = os.path.join(cpu_runs[name], "checkpoints", "step_00000003")
    on_cpu, _ = train(CPU, f"cpu_from_gpu_{name}", W, "--diloco_wire", wire, "--resume", gpu_ck)
    compare(f"{name}: the CUDA trainer's step-3 checkpoint continued by the CPU trainer: step 4", on_cpu,
            cpu_runs[name], 1e-4, skip=3)
    on_gpu, _ = train(FP32, f"gpu_from_cpu_{name}", W, "--diloco_wire", wire, "--resume", cpu_ck)
    compare(f"{name}: the CPU trainer's step-3 checkpoint continued by the CUDA trainer: step 4", on_gpu,
            cpu_runs[name], 1e-4, skip=3)

# --- the host-staged MPI transport (the int8 messages through host memory) gives the NCCL transport's bits
if W > 1:
    staged, _ = train(FP32, "staged_int8", W, "--diloco_wire", "int8", "--transport", "mpi", "--checkpoint_every", "4")
    a, b = steps_of(staged), steps_of(os.path.join(TMP, f"gpu_int8_np{W}"))
    ws, wn = weights(staged, 4), weights(os.path.join(TMP, f"gpu_int8_np{W}"), 4)
    check(len(a) == len(b) == 4 and all(x["loss"] == y["loss"] for x, y in zip(a, b)) and ws is not None and
          wn is not None and ws.tobytes() == wn.tobytes(),
          "int8 wire, --transport mpi: the NCCL transport's losses and step-4 weights bit for bit")

# --- bf16 (stochastic rounding): a mid-round resume is bit-identical
straight, _ = train(BF16, "bf16_straight", W, "--diloco_wire", "int8", "--checkpoint_every", "3")
resumed, _ = train(BF16, "bf16_resumed", W, "--diloco_wire", "int8", "--checkpoint_every", "3", "--resume",
                   os.path.join(straight, "checkpoints", "step_00000003"))
a, b = steps_of(resumed), steps_of(straight)[3:]
same_model = weights(resumed, 4) is not None and weights(straight, 4) is not None and \
    weights(resumed, 4).tobytes() == weights(straight, 4).tobytes()
check(len(a) == len(b) == 1 and all(x["loss"] == y["loss"] and x["grad_norm"] == y["grad_norm"] for x, y in zip(a, b))
      and same_model, "bf16 2 ranks int8 resumed at step 3 (mid-round): step 4 and its model.bin bit-identical")

# --- SparseLoCo (--optimizer sparseloco): the CUDA trainer runs the CPU's SparseLocoWire on a host copy of the
# delta, so against the CPU trainer only the pseudo-gradient's float rounding differs (as on the fp32 wire); a
# rounding can still move an element across a 2-bit bin edge or the top-k's cut, whole values, hence the int8
# wire's tolerances (1e-4 on the loss, 1e-3 on the weights, at most 0.5% of them off by more than 1e-5).
SPARSE = ["--optimizer", "sparseloco", "--sparseloco_topk", "16", "--checkpoint_every", "3"]


def sparse_weights(what, got, want):
    """The step-4 model.bin of `got` against `want`'s: the step-4 sync's mean, so the error feedback, counts."""
    wg, wc = weights(got, 4), weights(want, 4)
    ok = wg is not None and wc is not None and wg.shape == wc.shape
    err = float(np.max(np.abs(wg - wc)) / np.max(np.abs(wc))) if ok else 1.0
    off = float(np.mean(np.abs(wg - wc) > 1e-5)) if ok else 1.0
    check(err <= 1e-3 and off <= 0.005,
          f"{what} within 1e-3 of the CPU's (worst {err:.2e}), {off:.2%} off by more than 1e-5 (at most 0.5%)")


for np_ in RANKS:
    name = f"sparseloco_np{np_}"
    cpu, _ = train(CPU, "cpu_" + name, np_, *SPARSE)
    gpu, _ = train(FP32, "gpu_" + name, np_, *SPARSE)
    cpu_runs[name] = cpu
    compare(f"fp32 build, {np_} rank(s), sparseloco, weights compared every step vs CPU trainer", gpu, cpu, 1e-4)
    a, b = steps_of(gpu), steps_of(cpu)
    check(len(a) == len(b) == 4 and all(x[k] == y[k] for x, y in zip(a, b) for k in KEYS) and
          all((x["bytes_sent"] > 0) == (np_ > 1 and x["step"] % 2 == 0) for x in a),
          f"{name}: {', '.join(KEYS)} per step equal the CPU trainer's, bytes sent at sync steps only "
          f"({[x['bytes_sent'] for x in a]})")
    sparse_weights(f"{name}: step-4 global weights (model.bin)", gpu, cpu)
    if np_ == W:
        s = a[-1]["opt_ms"] if a else {}
        check(all(s.get(k, 0) > 0 for k in ("transform", "exchange", "apply")),
              f"sparseloco: the sync step times its transform, exchange and apply: {s}")
name = f"sparseloco_np{W}"
# mid-round (step 3): the blob's error feedback from the step-2 sync feeds step 4's
gpu_ck = os.path.join(TMP, "gpu_" + name, "checkpoints", "step_00000003")
cpu_ck = os.path.join(cpu_runs[name], "checkpoints", "step_00000003")
on_cpu, _ = train(CPU, f"cpu_from_gpu_{name}", W, *SPARSE, "--resume", gpu_ck)
compare(f"{name}: the CUDA trainer's step-3 checkpoint continued by the CPU trainer: step 4", on_cpu, cpu_runs[name],
        1e-4, skip=3)
sparse_weights(f"{name}: the CPU trainer's step 4 from the CUDA trainer's step 3 (its error feedback)", on_cpu,
               cpu_runs[name])
on_gpu, _ = train(FP32, f"gpu_from_cpu_{name}", W, *SPARSE, "--resume", cpu_ck)
compare(f"{name}: the CPU trainer's step-3 checkpoint continued by the CUDA trainer: step 4", on_gpu, cpu_runs[name],
        1e-4, skip=3)
sparse_weights(f"{name}: the CUDA trainer's step 4 from the CPU trainer's step 3 (its error feedback)", on_gpu,
               cpu_runs[name])
# the bf16 build (stochastic rounding) resumed at step 3: the step-4 sync from the blob's error feedback
sparse_straight, _ = train(BF16, f"bf16_straight_{name}", W, *SPARSE)
sparse_resumed, _ = train(BF16, f"bf16_resumed_{name}", W, *SPARSE, "--resume",
                          os.path.join(sparse_straight, "checkpoints", "step_00000003"))
a, b = steps_of(sparse_resumed), steps_of(sparse_straight)[3:]
wr, ws = weights(sparse_resumed, 4), weights(sparse_straight, 4)
check(len(a) == len(b) == 1 and all(x["loss"] == y["loss"] and x["grad_norm"] == y["grad_norm"] for x, y in zip(a, b))
      and wr is not None and ws is not None and wr.tobytes() == ws.tobytes(),
      f"{name}: bf16 CUDA trainer resumed at step 3 (mid-round): step 4 and its model.bin bit-identical")
_, p = train(FP32, "refused_sparse", W, *SPARSE, "--optimizer", "diloco", "--resume", gpu_ck, expect_ok=False)
check(p.returncode != 0 and "sparseloco" in p.stderr and "Segmentation" not in p.stderr,
      "a sparseloco checkpoint does not resume as diloco in the CUDA trainer")

# --- refusals
_, p = train(BF16, "refused", 1, "--shard_group_size", "2", expect_ok=False)
check(p.returncode != 0 and "diloco runs one replica per rank" in p.stderr and "Segmentation" not in p.stderr,
      "the CUDA trainer refuses --shard_group_size 2 with diloco in one line")
step3 = os.path.join(straight, "checkpoints", "step_00000003")
_, p = train(BF16, "refused_h", W, "--diloco_wire", "int8", "--diloco_inner_steps", "3", "--resume", step3,
             expect_ok=False)
check(p.returncode != 0 and "diloco_inner_steps" in p.stderr, "a checkpoint of H = 2 does not resume with H = 3")

print(f"{failures} failure(s)")
sys.exit(1 if failures else 0)
