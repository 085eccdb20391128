"""Signum with majority vote through train_gpt_cpu (test_signum.sh runs this): on the tiny config, 2 ranks x 10 steps
lower the loss; bytes_sent and payload_bytes per step in metrics.jsonl are the 1-bit model's, ceil(n / 8) bytes of
signs per rank and (W - 1) of them sent, with n computed here from the config's shape (at 1, 2 and 4 ranks, every
rank's weights compared after every step); a checkpoint at step 5 and --resume give the straight run's losses and
norms bit for bit; the dry run reports the same bytes; bad values give one-line errors."""
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.chdir(ROOT)
TMP = tempfile.mkdtemp(prefix="signum_")
failures = 0
BASE = ["--config", "configs/tiny.json", "--optimizer", "signum", "--shuffle", "false", "--val_every", "0",
        "--lr", "4e-3", "--threads", "1", "--sample_every", "0", "--checkpoint_every", "-1"]


def check(ok, what):
    global failures
    print(("ok    " if ok else "FAIL  ") + what)
    if not ok:
        failures += 1


def train(name, np, *flags, steps=10, expect_ok=True):
    out = os.path.join(TMP, name)
    cmd = ["mpirun", "-np", str(np), "./train_gpt_cpu", *BASE, "--steps", str(steps), "--out_dir", out, *flags]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if expect_ok and p.returncode != 0:
        check(False, f"{name}: exit {p.returncode}: {p.stderr[-500:]}")
    return out, p


def steps_of(out):
    try:
        with open(os.path.join(out, "metrics.jsonl")) as f:
            return [r for r in map(json.loads, f) if r.get("type") == "train"]
    except FileNotFoundError:
        return []


# GPT-2's parameters for the tiny config, the vocabulary padded to a multiple of 128 as the trainer pads it
with open("configs/tiny.json") as f:
    shape = json.load(f)
L, C, T, V = shape["num_layers"], shape["channels"], shape["max_seq_len"], 50257
Vp = (V + 127) // 128 * 128
n = Vp * C + T * C + L * (12 * C * C + 13 * C) + 2 * C
bits = math.ceil(n / 8)

# --- 2 ranks, 10 steps: the loss falls, 1 bit per element on the wire, all four phases timed
straight, p = train("straight", 2, "--weight_check_every", "1")
s = steps_of(straight)
check(len(s) == 10 and s[-1]["loss"] < s[0]["loss"] - 0.5,
      f"2 ranks: loss {s[0]['loss'] if s else 0:.4f} -> {s[-1]['loss'] if s else 0:.4f} over {len(s)} steps")
check(len(s) == 10 and all(x["payload_bytes"] == bits and x["bytes_sent"] == bits and x["bytes_recv"] == bits
                           for x in s),
      f"2 ranks: payload_bytes = bytes_sent = bytes_recv = ceil({n} / 8) = {bits} at every step "
      f"({s[-1]['bytes_sent'] if s else None} logged)")
check(bool(s) and all(s[-1]["opt_ms"][k] > 0 for k in ("clip", "transform", "exchange", "apply")),
      f"2 ranks: timings per phase {s[-1]['opt_ms'] if s else None}")
check("optimizer signum" in p.stdout, "the banner names the optimizer")

# --- 1 and 4 ranks: (W - 1) x the signs sent, every rank's weights compared after every step
for np in (1, 4):
    out, p = train(f"np{np}", np, "--weight_check_every", "1", steps=3)
    r = steps_of(out)
    check(len(r) == 3 and all(x["payload_bytes"] == bits and x["bytes_sent"] == (np - 1) * bits for x in r),
          f"{np} rank(s): bytes_sent = {np - 1} x {bits} at every step ({r[-1]['bytes_sent'] if r else None} logged), "
          f"weights identical on every rank")

# --- checkpoint at step 5, resume to 10: the straight run's losses and norms, bit for bit
ck = ["--checkpoint_every", "5", "--weight_check_every", "1"]
resumed, _ = train("resumed", 2, *ck, steps=5)
_, p = train("resumed", 2, *ck, "--resume", "auto")
a, b = steps_of(straight), steps_of(resumed)
same = len(a) == len(b) == 10 and all(x["loss"] == y["loss"] and x["grad_norm"] == y["grad_norm"] for x, y in zip(a, b))
check(same and "resumed from" in p.stdout, "5 steps + checkpoint + --resume to 10 equal 10 straight, bit for bit")

# --- the dry run reports the same bytes
p = subprocess.run(["mpirun", "-np", "2", "./train_gpt_cpu", *BASE, "--dry_run"], capture_output=True, text=True,
                   timeout=120)
m = re.search(r"all-gather sent, \(W-1\) x payload\s+([\d.]+) MB", p.stdout)
check(m is not None and abs(float(m.group(1)) * 1e6 - bits) < 1,
      f"dry run at 2 ranks: {m.group(0) if m else p.stdout[-300:]}")


# --- one-line errors (one process: nothing but the trainer's own line on stderr)
def refused(needle, *flags, what, np=1):
    cmd = ["./train_gpt_cpu", *BASE, "--steps", "2", "--out_dir", os.path.join(TMP, "refused"), *flags]
    if np > 1:
        cmd = ["mpirun", "-np", str(np)] + cmd
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    lines = [l for l in p.stderr.splitlines() if l.strip()]
    ok = p.returncode != 0 and any(needle in l for l in lines) and (np > 1 or len(lines) == 1)
    check(ok, f"{what}: {next((l for l in lines if needle in l), p.stderr[-300:]).strip()}")


refused("--signum_beta must be in [0, 1) (got 1)", "--signum_beta", "1", what="beta 1")
refused("--signum_beta must be in [0, 1) (got -0.1)", "--signum_beta", "-0.1", what="beta below 0")
refused("--signum_beta", "--signum_beta", "fast", what="beta not a number")
refused("--weight_decay must be >= 0", "--weight_decay", "-1", what="negative weight decay")
refused("--optimizer signum runs flat only", "--shard_group_size", "2", np=2, what="no sharded step")
# a Signum checkpoint does not resume as DeMo (the blob's own check: test_mpi_signum)
refused('but "signum" in the checkpoint', "--optimizer", "demo", "--steps", "10", "--resume",
        os.path.join(resumed, "checkpoints", "step_00000005"),
        what="a Signum checkpoint with --optimizer demo", np=2)

shutil.rmtree(TMP, ignore_errors=True)
print(f"{failures} failure(s)")
sys.exit(1 if failures else 0)
