#!/usr/bin/python3
"""Bandwidth study: wall-clock time-to-loss of DeMo vs AdamW-DDP over slow links on emulated hosts.

For every link rate (--rates) and optimizer setting (--settings), trains the same small GPT-2 on the same
data, seed and token budget across --hosts emulated hosts (scripts/bandwidth_lab.sh: one network namespace
per host, tbf-limited links both ways, one MPI rank per host), each run in STUDY/<rate>/<setting>/. Then,
per rate, it writes STUDY/<rate>/table.md (time to a target val loss, steps/s, MB/step per rank, share of
step time spent communicating, interface-measured vs counted bytes) and STUDY/<rate>/loss_vs_time.png (val
and train loss vs wall-clock seconds), and runs scripts/compare_runs.py on the rate's runs (plots in
STUDY/<rate>/compare/). STUDY/summary.md collects the tables, STUDY/study.json every number and command.

Wall-clock is the sum of the trainer's step_ms (what compare_runs.py uses): validation, checkpoints and
process start are left out, so every setting is timed on its training steps alone. The full wall time of
each lab invocation is in the tables too ("run wall s").

  /usr/bin/python3 scripts/bandwidth_study.py --rates 100mbit 1gbit              # the full study (~1 h)
  /usr/bin/python3 scripts/bandwidth_study.py --rates 100mbit --steps 10 --settings adamw_fp32 demo_k32_fp32
  /usr/bin/python3 scripts/bandwidth_study.py --rates 1gbit --link-delay 20ms     # WAN-like: 40 ms round trips
  /usr/bin/python3 scripts/bandwidth_study.py --dry-run                           # print the commands

Settings are names: adamw_fp32, adamw_bf16 (AdamW-DDP with fp32 / bf16 gradients on the wire: --grad_wire)
and demo_k<TOPK>_<fp32|bf16|sign> (DeMo with --demo_topk TOPK --demo_values ...), with a `_delay` suffix for
--demo_delay 1 (the exchange overlapping the next step, eager updates) or `_stale` for --demo_delay 1
--demo_eager false. `--settings all` is the
eleven of topk 32, 8, 1 x fp32, bf16, sign plus both AdamW. Needs root (network namespaces); see
docs/BANDWIDTH.md.

A run whose loss, gradient norm or val loss stops being finite (null in metrics.jsonl, a "diverged" line, the
trainer's exit status 3) is reported as diverged at that step, not as failed and not with the mean of its
finite losses; it does not set the target val loss. A field its metrics lack shows as "—". Arguments are
checked against bandwidth_lab.sh's limits before anything runs (one-line error, exit status 2).
"""
import argparse
import glob
import json
import math
import os
import re
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LAB = os.path.join(REPO, "scripts", "bandwidth_lab.sh")
COMPARE = os.path.join(REPO, "scripts", "compare_runs.py")

DEFAULT_SETTINGS = ["adamw_fp32", "adamw_bf16", "demo_k32_fp32", "demo_k32_bf16", "demo_k32_sign",
                    "demo_k8_bf16", "demo_k8_sign", "demo_k1_bf16"]
ALL_SETTINGS = ["adamw_fp32", "adamw_bf16"] + [f"demo_k{k}_{v}" for k in (32, 8, 1) for v in ("fp32", "bf16", "sign")]


DIVERGED_EXIT = 3  # the trainer's exit status when the loss or gradient norm is not finite
# bandwidth_lab.sh's limits (kept in step with its checks, so that no run gets as far as the lab to be refused)
LAB_MAX_HOSTS = 250
LAB_MIN_RATE_BPS = 8000
LAB_MAX_DELAY_US = 10_000_000
LAB_RATE = re.compile(r"([0-9]+(?:\.[0-9]+)?)([kmgtKMGT]?)bit")
LAB_DELAY = re.compile(r"([0-9]+(?:\.[0-9]+)?)(us|ms|s)")


class UserError(Exception):
    """A problem with the arguments or the environment: one line, exit status 2."""


class ArgumentParser(argparse.ArgumentParser):
    """argparse with its usage errors on one line (the usage is in --help), exit status 2."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


SHARD = re.compile(r"(.*)_s(\d+)")


def setting_flags(name, args):
    """Trainer flags of a setting name (and raises UserError for an unknown one). A suffix _s<S> shards over
    nodes of S ranks (--shard_group_size S: hybrid AdamW, FlexDeMo)."""
    m = SHARD.fullmatch(name)
    if m and not re.fullmatch(r"demo_k\d+_(fp32|bf16|sign)", name):
        return setting_flags(m.group(1), args) + ["--shard_group_size", m.group(2)]
    m = re.fullmatch(r"adamw_(fp32|bf16)", name)
    if m:
        flags = ["--optimizer", "adamw", "--lr", f"{args.lr_adamw:g}", "--weight_decay", f"{args.wd_adamw:g}"]
        if m.group(1) == "bf16" or args.always_grad_wire:
            flags += ["--grad_wire", m.group(1)]
        return flags
    m = re.fullmatch(r"demo_k(\d+)_(fp32|bf16|sign)(_delay|_stale)?", name)
    if m:
        flags = ["--optimizer", "demo", "--demo_topk", m.group(1), "--demo_values", m.group(2),
                 "--lr", f"{args.lr_demo:g}", "--weight_decay", f"{args.wd_demo:g}"]
        delay = {None: [], "_delay": ["--demo_delay", "1"], "_stale": ["--demo_delay", "1", "--demo_eager", "false"]}
        return flags + delay[m.group(3)]
    raise UserError(f"unknown setting '{name}' "
                    "(adamw_fp32, adamw_bf16 or demo_k<TOPK>_<fp32|bf16|sign>[_delay|_stale])")


def label_of(name):
    m = SHARD.fullmatch(name)
    if m and not re.fullmatch(r"demo_k\d+_(fp32|bf16|sign)", name):
        return label_of(m.group(1)) + f" S={m.group(2)}"
    m = re.fullmatch(r"demo_k(\d+)_([a-z0-9]+)(_delay|_stale)?", name)
    if m:
        suffix = {None: "", "_delay": " delayed", "_stale": " delayed stale"}[m.group(3)]
        return f"DeMo k={m.group(1)} {m.group(2)}" + suffix
    return "AdamW-DDP " + name.split("_", 1)[1]


def parse_args(argv):
    p = ArgumentParser(prog="bandwidth_study.py", description=__doc__.split("\n\n")[0],
                       formatter_class=argparse.RawDescriptionHelpFormatter,
                       epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("--rates", nargs="+", default=["100mbit", "1gbit"], metavar="RATE",
                   help="link rates, as bandwidth_lab.sh takes them (10mbit, 100mbit, 1gbit, none) [100mbit 1gbit]")
    p.add_argument("--settings", nargs="+", default=DEFAULT_SETTINGS, metavar="NAME",
                   help="optimizer settings, or 'all' [%(default)s]")
    p.add_argument("--hosts", type=int, default=4, help="emulated hosts, one rank each [4]")
    p.add_argument("--slots", type=int, default=1,
                   help="ranks per host (bandwidth_lab.sh --slots; ranks of a host talk through shared memory) [1]")
    p.add_argument("--link-delay", default="0ms", metavar="D",
                   help="one-way delay between hosts at every rate, bandwidth_lab.sh's --delay (20ms: a 40 ms "
                        "round trip; not the _delay settings' --demo_delay) [0ms]")
    p.add_argument("--out", default=os.path.join(REPO, "runs", "bandwidth_study"),
                   help="study folder [runs/bandwidth_study]")
    p.add_argument("--model-config", default=os.path.join(REPO, "configs", "tiny.json"),
                   help="JSON config of the model shape [configs/tiny.json]")
    p.add_argument("--steps", type=int, default=250, help="optimizer steps (the same token budget for every run) [250]")
    p.add_argument("--batch-size", type=int, default=4, help="sequences per rank per step [4]")
    p.add_argument("--seq-len", type=int, default=64, help="tokens per sequence [64]")
    p.add_argument("--lr-adamw", type=float, default=8e-3, help="AdamW peak learning rate [8e-3]")
    p.add_argument("--lr-demo", type=float, default=8e-3, help="DeMo peak learning rate [8e-3]")
    p.add_argument("--wd-adamw", type=float, default=0.1, help="AdamW weight decay [0.1]")
    p.add_argument("--wd-demo", type=float, default=0.0, help="DeMo weight decay [0, as scripts/run_experiment.sh]")
    p.add_argument("--warmup-steps", type=int, default=20, help="linear warmup steps [20]")
    p.add_argument("--val-every", type=int, default=10, help="validation every N steps (time-to-loss resolution) [10]")
    p.add_argument("--val-batches", type=int, default=8, help="validation batches per rank [8]")
    p.add_argument("--threads", type=int, default=1, help="OpenMP threads per rank [1: 4 ranks share 2 cores]")
    p.add_argument("--seed", type=int, default=1337, help="seed of init and data order, the same for all runs [1337]")
    p.add_argument("--train-data", help="glob of train shards [the trainer's default: data/default]")
    p.add_argument("--val-data", help="glob of val shards [the trainer's default: data/default]")
    p.add_argument("--trainer", default=os.path.join(REPO, "train_gpt_cpu"), help="trainer binary [./train_gpt_cpu]")
    p.add_argument("--trainer-flags", default="", metavar="'FLAGS'",
                   help="extra trainer flags, one shell-quoted string")
    p.add_argument("--target-val-loss", type=float,
                   help="target of the time-to-loss columns [per rate: the worst final val loss of its runs]")
    p.add_argument("--timeout", type=float, default=1800, help="seconds before a run is stopped [1800]")
    p.add_argument("--skip-done", action="store_true",
                   help="keep runs whose folder already holds a finished run (metrics up to --steps and iface.json)")
    p.add_argument("--always-grad-wire", action="store_true",
                   help="pass --grad_wire fp32 to AdamW fp32 runs too (by default only bf16 passes the flag)")
    p.add_argument("--keep-checkpoints", action="store_true",
                   help="keep each run's final checkpoint (by default deleted: ~100 MB per run, not used here)")
    p.add_argument("--no-compare", action="store_true", help="do not run scripts/compare_runs.py")
    p.add_argument("--dry-run", action="store_true", help="print the commands and exit")
    args = p.parse_args(argv)
    if args.settings == ["all"]:
        args.settings = list(ALL_SETTINGS)
    for name, value in (("--hosts", args.hosts), ("--slots", args.slots), ("--steps", args.steps), ("--batch-size", args.batch_size),
                        ("--seq-len", args.seq_len), ("--threads", args.threads), ("--val-every", args.val_every),
                        ("--val-batches", args.val_batches)):
        if value < 1:
            raise UserError(f"{name} must be >= 1, got {value}")
    if args.hosts > LAB_MAX_HOSTS:
        raise UserError(f"--hosts must be 1..{LAB_MAX_HOSTS} (bandwidth_lab.sh's limit), got {args.hosts}")
    if args.warmup_steps < 0:
        raise UserError(f"--warmup-steps must be >= 0, got {args.warmup_steps}")
    if not (math.isfinite(args.timeout) and args.timeout > 0):
        raise UserError(f"--timeout must be a number of seconds > 0, got {args.timeout:g}")
    for name, value, least in (("--lr-adamw", args.lr_adamw, None), ("--lr-demo", args.lr_demo, None),
                               ("--wd-adamw", args.wd_adamw, 0.0), ("--wd-demo", args.wd_demo, 0.0)):
        if not math.isfinite(value) or (value <= 0 if least is None else value < least):
            raise UserError(f"{name} must be a finite number {'> 0' if least is None else '>= 0'}, got {value:g}")
    if args.target_val_loss is not None and not math.isfinite(args.target_val_loss):
        raise UserError(f"--target-val-loss must be a finite number, got {args.target_val_loss:g}")
    if len(set(args.settings)) != len(args.settings):
        raise UserError("--settings lists a name twice")
    if len(set(args.rates)) != len(args.rates):
        raise UserError("--rates lists a rate twice")
    for rate in args.rates:
        if rate == "none":
            continue
        m = LAB_RATE.fullmatch(rate)
        if not m:
            raise UserError(f"--rates: '{rate}' is not like 10mbit, 100mbit, 1gbit or none (as bandwidth_lab.sh "
                            "takes it: lower-case 'bit' and 'none')")
        scale = {"": 1, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}[m.group(2).lower()]
        if round(float(m.group(1)) * scale) < LAB_MIN_RATE_BPS:
            raise UserError(f"--rates: '{rate}' is below bandwidth_lab.sh's minimum of 8kbit")
    m = LAB_DELAY.fullmatch(args.link_delay)
    if not m:
        raise UserError(f"--link-delay: '{args.link_delay}' is not like 500us, 20ms or 0.1s")
    if round(float(m.group(1)) * {"us": 1, "ms": 1e3, "s": 1e6}[m.group(2)]) > LAB_MAX_DELAY_US:
        raise UserError(f"--link-delay: '{args.link_delay}' is above bandwidth_lab.sh's maximum of 10s")
    try:
        args.extra_trainer_flags = shlex.split(args.trainer_flags)
    except ValueError as e:
        raise UserError(f"--trainer-flags: {args.trainer_flags!r} is not a shell-quoted string ({e})")
    # (The trainer runs in the repository root, so relative paths are taken from there.)
    if not os.path.isfile(os.path.join(REPO, args.model_config)):
        raise UserError(f"--model-config: {args.model_config} is not a file (relative to {REPO})")
    for name, pattern in (("--train-data", args.train_data), ("--val-data", args.val_data)):
        if pattern is not None and not args.dry_run and not glob.glob(os.path.join(REPO, pattern)):
            raise UserError(f"{name}: no file matches {pattern} (relative to {REPO})")
    args.out = os.path.abspath(args.out)
    if os.path.exists(args.out) and not os.path.isdir(args.out):
        raise UserError(f"--out {args.out}: exists and is not a folder")
    return args


def trainer_flags(args, setting, out_dir):
    flags = ["--config", args.model_config, "--batch_size", str(args.batch_size), "--seq_len", str(args.seq_len),
             "--steps", str(args.steps), "--warmup_steps", str(args.warmup_steps), "--val_every", str(args.val_every),
             "--val_batches", str(args.val_batches), "--sample_every", "0", "--checkpoint_every", "0",
             "--keep_checkpoints", "1", "--threads", str(args.threads), "--seed", str(args.seed),
             "--log_every", "10", "--out_dir", out_dir, "--overwrite"]
    if args.train_data:
        flags += ["--train_data", args.train_data]
    if args.val_data:
        flags += ["--val_data", args.val_data]
    return flags + setting_flags(setting, args) + args.extra_trainer_flags


def lab_command(args, rate, setting, out_dir):
    return (["bash", LAB, "--hosts", str(args.hosts), "--slots", str(args.slots), "--rate", rate, "--delay",
             args.link_delay, "--quiet", "--iface-json", os.path.join(out_dir, "iface.json"), "--", "lab-mpirun",
             "-np", str(args.hosts * args.slots), "--map-by", "slot", args.trainer] + trainer_flags(args, setting, out_dir))


# ---- reading a run ----------------------------------------------------------------------------------------

def number(value):
    """A metrics field as a float: NaN when it is missing, null (how JSON writes NaN and infinity) or junk."""
    if isinstance(value, bool):
        return math.nan
    try:
        return float(value)
    except (TypeError, ValueError, OverflowError):
        return math.nan


def step_of(record):
    """A line's step as an int, or None when it is missing, not a whole number or not finite."""
    value = record.get("step")
    if isinstance(value, float) and math.isfinite(value) and value == int(value):
        value = int(value)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def read_run(out_dir):
    """Train and val records of a run folder (last line per step wins; lines that are not JSON objects with a
    step, such as a torn last line, are skipped) and the steps of its "diverged" lines."""
    train, val, diverged = {}, {}, []
    path = os.path.join(out_dir, "metrics.jsonl")
    if not os.path.isfile(path):
        return [], [], []
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            lines = f.read().split("\n")
    except OSError:
        return [], [], []
    for line in lines:
        try:
            r = json.loads(line)
        except (ValueError, RecursionError):
            continue
        step = step_of(r) if isinstance(r, dict) else None
        if step is None:
            continue
        if r.get("type") == "train":
            train[step] = r
        elif r.get("type") == "val":
            val[step] = r
        elif r.get("type") == "diverged":
            diverged.append(step)
    return [train[s] for s in sorted(train)], [val[s] for s in sorted(val)], diverged


def run_finished(out_dir, steps):
    train, _, diverged = read_run(out_dir)
    return (bool(train) and not diverged and step_of(train[-1]) >= steps
            and all(math.isfinite(number(r.get("loss"))) for r in train)
            and os.path.isfile(os.path.join(out_dir, "iface.json")))


def total(records, key):
    """Sum of a per-step field, or None when a line lacks it (unknown, not zero)."""
    values = [number(r.get(key)) for r in records]
    return sum(values) if values and all(math.isfinite(x) for x in values) else None


def summarize_run(out_dir, setting, wall_s, exit_code, hosts):
    """Numbers of one run; what its metrics lack is None. "diverged" is set when a loss, gradient norm or val
    loss is not finite, a "diverged" line is there or the trainer exited with status 3 ("diverged_step": the
    first such step, when known)."""
    train, val, diverged_lines = read_run(out_dir)
    s = {"setting": setting, "label": label_of(setting), "out_dir": out_dir, "wall_s": wall_s, "exit_code": exit_code,
         "steps": len(train)}
    bad = list(diverged_lines)
    bad += [step_of(r) for r in train if "loss" in r and not math.isfinite(number(r["loss"]))]
    bad += [step_of(r) for r in train if "grad_norm" in r and not math.isfinite(number(r["grad_norm"]))]
    bad += [step_of(v) for v in val if "val_loss" in v and not math.isfinite(number(v["val_loss"]))]
    s["diverged"] = bool(bad) or exit_code == DIVERGED_EXIT
    s["diverged_step"] = min(bad) if bad else None
    if not train:
        return s
    step_ms = [number(r.get("step_ms")) for r in train]
    timed = all(math.isfinite(x) for x in step_ms)
    cum, t = [], 0.0
    for ms in step_ms:
        t += ms / 1e3 if timed else 0.0
        cum.append(t)
    step_at = {step_of(r): i for i, r in enumerate(train)}
    s["train_steps"] = [step_of(r) for r in train]
    s["train_loss"] = [number(r.get("loss")) for r in train]
    s["train_seconds"] = cum if timed else None
    s["val_steps"] = [step_of(v) for v in val]
    s["val_loss"] = [number(v.get("val_loss")) for v in val]
    # A val point's time: the cumulative step time of the last train step at or before it.
    s["val_seconds"] = [cum[step_at[st]] if st in step_at else
                        max([cum[i] for t_st, i in step_at.items() if t_st <= st], default=0.0)
                        for st in s["val_steps"]] if timed else None
    sum_step = sum(step_ms) if timed else None
    sum_comm = total(train, "comm_ms")
    n = len(train)
    s["train_seconds_total"] = sum_step / 1e3 if timed else None
    s["steps_per_s"] = n / (sum_step / 1e3) if timed and sum_step > 0 else None
    s["step_ms_median"] = statistics.median(step_ms) if timed else None
    s["comm_ms_mean"] = sum_comm / n if sum_comm is not None else None
    s["comm_fraction"] = sum_comm / sum_step if sum_comm is not None and timed and sum_step > 0 else None
    s["counter_sent_bytes"] = total(train, "bytes_sent")
    s["counter_recv_bytes"] = total(train, "bytes_recv")
    s["counter_inter_bytes"] = total(train, "bytes_sent_inter")  # rank 0's bytes to other nodes (sharded runs)
    s["mb_per_step"] = s["counter_sent_bytes"] / n / 1e6 if s["counter_sent_bytes"] is not None else None
    payload = total(train, "payload_bytes")
    s["payload_mb_per_step"] = payload / n / 1e6 if payload is not None else None
    last_val = s["val_loss"][-1] if val else math.nan
    s["final_val_loss"] = last_val if math.isfinite(last_val) and not s["diverged"] else None
    tail = [x for x in s["train_loss"][-10:] if math.isfinite(x)]
    s["final_train_loss"] = statistics.fmean(tail) if tail and not s["diverged"] else None
    iface_path = os.path.join(out_dir, "iface.json")
    if os.path.isfile(iface_path):
        try:
            with open(iface_path) as f:
                h = json.load(f)["hosts"]
            s["iface_h0_tx_bytes"] = h[0]["tx_bytes"]
            s["iface_h0_rx_bytes"] = h[0]["rx_bytes"]
            s["iface_mean_tx_bytes"] = sum(x["tx_bytes"] for x in h) / len(h)
            s["iface_hosts"] = h
        except (OSError, ValueError, KeyError, IndexError, TypeError, ZeroDivisionError):
            s["iface_h0_tx_bytes"] = None
            print(f"warning: {iface_path}: unreadable, its columns are left empty", file=sys.stderr)
    return s


def diverged_text(s):
    return "diverged" + (f" at step {s['diverged_step']}" if s.get("diverged_step") is not None else "")


def time_to_target(s, target):
    """(seconds, step) of the first val point at or below target, or (None, None)."""
    for loss, sec, step in zip(s.get("val_loss") or [], s.get("val_seconds") or [], s.get("val_steps") or []):
        if loss <= target:  # (never true for NaN)
            return sec, step
    return None, None


# ---- per-rate report --------------------------------------------------------------------------------------

def fmt(x, spec, missing="—", suffix=""):
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return missing
    return format(x, spec) + suffix


def has_link_delay(args):
    return float(re.match(r"[\d.]+", args.link_delay).group()) > 0


def link_text(rate, args):
    link = "unlimited links" if rate == "none" else f"{rate} per link"
    return link + (f", {args.link_delay} one-way delay" if has_link_delay(args) else "")


def rate_table(rate, runs, target, target_given, args):
    baseline = next((r for r in runs if r["setting"] == "adamw_fp32"), None)
    base_t = time_to_target(baseline, target)[0] if baseline else None
    head = ["setting", "final val", f"time to val ≤ {fmt(target, '.4f')} (s)", "step", "vs AdamW fp32", "steps/s",
            "step ms (median)", "comm share", "MB/step/rank", "payload MB/step", "counter MB (rank 0 sent)",
            "iface MB (h0 tx)", "iface/counter", "run wall s", "load"]
    link = link_text(rate, args)
    hosts = f"{args.hosts} hosts" + (f" x {args.slots} ranks" if args.slots > 1 else "")
    lines = [f"### {link}, {hosts}", "",
             "| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    for s in runs:
        if not s.get("steps"):
            what = diverged_text(s) if s.get("diverged") else "run failed"
            lines.append(f"| {s['label']} | {what} (exit {s['exit_code']}) |" + " |" * (len(head) - 2))
            continue
        t, step = time_to_target(s, target)
        counter = s["counter_sent_bytes"] / 1e6 if s.get("counter_sent_bytes") is not None else None
        iface = s.get("iface_h0_tx_bytes")
        comm = s.get("comm_fraction")
        row = [s["label"], diverged_text(s) if s.get("diverged") else fmt(s.get("final_val_loss"), ".4f"),
               fmt(t, ".1f", "not reached"), fmt(step, "d", "—"),
               (f"{base_t / t:.2f}x" if t and base_t else "—"),
               fmt(s.get("steps_per_s"), ".3f"), fmt(s.get("step_ms_median"), ".0f"),
               fmt(100 * comm if comm is not None else None, ".1f", suffix="%"), fmt(s.get("mb_per_step"), ".3f"),
               fmt(s.get("payload_mb_per_step"), ".3f"), fmt(counter, ".2f"),
               fmt(iface / 1e6 if iface is not None else None, ".2f"),
               fmt(iface / 1e6 / counter if iface is not None and counter else None, ".3f"),
               fmt(s["wall_s"], ".0f"), fmt(s.get("loadavg_1min"), ".1f")]
        if s.get("diverged"):
            row[0] += f" ({diverged_text(s)}, exit {s['exit_code']}, {s['steps']}/{args.steps} steps)"
        elif s["exit_code"] != 0:
            row[0] += f" (exit {s['exit_code']}, {s['steps']}/{args.steps} steps)"
        lines.append("| " + " | ".join(row) + " |")
    how = ("given (--target-val-loss)" if target_given else
           "the worst final val loss of these runs (diverged ones left out), so every such run reaches it")
    lines += ["", f"Target val loss {fmt(target, '.4f')}: {how}. Time: sum of step_ms up to the first val point "
              "at or below "
              f"the target (val every {args.val_every} steps; validation, checkpoint and start-up time excluded). "
              "vs AdamW fp32: its time / this time. comm share: sum comm_ms / sum step_ms. MB/step/rank: rank 0's "
              "bytes_sent counter per step (ring model: all-reduce 2(W-1)/W n, all-gather W-1 buckets); payload: its "
              "own buffer. iface: bytes leaving host 0's eth0 while the job ran (headers, ACKs, MPI wireup and "
              "uncounted scalar reductions included). run wall s: the whole lab invocation. load: 1-minute load "
              f"average after the run; the {args.hosts * args.slots} ranks alone make about {args.hosts * args.slots * args.threads}, more "
              "means other work "
              "shared the cores and slowed the run. diverged: the loss, gradient norm or val loss stopped being "
              "finite (null in metrics.jsonl; the trainer's exit status 3); its numbers cover the steps before. "
              "—: not in the run's metrics.", ""]
    return "\n".join(lines)


def plot_rate(rate, runs, target, path, args):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_val, ax_train) = plt.subplots(1, 2, figsize=(13, 4.8))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, s in enumerate(runs):
        if not s.get("steps") or s.get("train_seconds") is None:  # (no step times: no x axis)
            continue
        c = colors[i % len(colors)]
        style = "-" if s["setting"].startswith("adamw") else "--"
        label = s["label"] + (f" ({diverged_text(s)})" if s.get("diverged") else "")
        if s["val_loss"]:
            ax_val.plot(s["val_seconds"], s["val_loss"], style, marker="o", markersize=3, color=c, label=label)
        w = max(1, min(10, len(s["train_loss"]) // 20))
        smooth = [statistics.fmean(s["train_loss"][max(0, j - w + 1):j + 1]) for j in range(len(s["train_loss"]))]
        ax_train.plot(s["train_seconds"], smooth, style, color=c, linewidth=1.3, label=label)
    if math.isfinite(target):
        ax_val.axhline(target, color="gray", linewidth=0.8, linestyle=":")
    link = link_text(rate, args)
    ax_val.set_title(f"val loss, {args.hosts}x{args.slots} ranks, {link} (dotted: target {fmt(target, '.4f')})")
    ax_train.set_title("train loss (moving average)")
    for ax in (ax_val, ax_train):
        ax.set_xlabel("wall-clock seconds (sum of step_ms)")
        ax.set_ylabel("loss")
        ax.grid(True, alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ---- running ------------------------------------------------------------------------------------------------

def trainer_has_flag(trainer, flag):
    try:
        out = subprocess.run([trainer, "--help"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return False
    return f"--{flag} " in out


def run_one(cmd, log_path, timeout):
    """Runs the lab command; returns (exit code, wall seconds). Ctrl-C reaches the lab too (same process group)
    and it tears itself down; we wait for that and re-raise."""
    start = time.monotonic()
    with open(log_path, "w") as log:
        log.write("$ " + shlex.join(cmd) + "\n")
        log.flush()
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=REPO)
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            print(f"  timeout after {timeout:.0f} s: stopping the run", flush=True)
            proc.send_signal(signal.SIGTERM)
            rc = proc.wait()
        except KeyboardInterrupt:
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
            raise
    return rc, time.monotonic() - start


def json_safe(x):
    """study.json without NaN or infinity (not JSON): null instead."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: json_safe(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [json_safe(v) for v in x]
    return x


def main(argv):
    args = parse_args(argv)
    notes = []
    if not args.dry_run:
        if not os.access(args.trainer, os.X_OK):
            raise UserError(f"{args.trainer}: not built (make train_gpt_cpu)")
        if any(s == "adamw_bf16" for s in args.settings) and not trainer_has_flag(args.trainer, "grad_wire"):
            args.settings = [s for s in args.settings if s != "adamw_bf16"]
            notes.append("adamw_bf16 left out: this trainer has no --grad_wire flag")
            print("note: " + notes[-1], file=sys.stderr)
        if not args.train_data and not glob.glob(os.path.join(REPO, "data", "default", "default_train_*.bin")):
            print("preparing the default corpus (data/prepare_default.sh)", file=sys.stderr)
            subprocess.run([os.path.join(REPO, "data", "prepare_default.sh")], check=True, cwd=REPO)
    for s in args.settings:
        setting_flags(s, args)  # validates names before anything runs

    study = {"args": vars(args), "notes": notes, "rates": {}}
    os.makedirs(args.out, exist_ok=True) if not args.dry_run else None
    total = len(args.rates) * len(args.settings)
    index = 0
    summary = [f"# Bandwidth study: DeMo vs AdamW-DDP on {args.hosts} emulated hosts", "",
               f"Model {os.path.relpath(os.path.join(REPO, args.model_config), REPO)}, {args.steps} steps of "
               f"{args.batch_size}x{args.seq_len} "
               f"tokens per rank ({args.steps * args.batch_size * args.seq_len * args.hosts * args.slots:,} tokens in all), seed "
               f"{args.seed}, lr AdamW {args.lr_adamw:g} / DeMo {args.lr_demo:g}, {args.threads} thread(s) per rank"
               + (f", {args.link_delay} one-way link delay." if has_link_delay(args) else "."), ""]
    summary += [f"Note: {n}" for n in notes] + ([""] if notes else [])
    for rate in args.rates:
        rate_dir = os.path.join(args.out, rate)
        runs = []
        for setting in args.settings:
            index += 1
            out_dir = os.path.join(rate_dir, setting)
            cmd = lab_command(args, rate, setting, out_dir)
            if args.dry_run:
                print(shlex.join(cmd))
                continue
            if args.skip_done and run_finished(out_dir, args.steps):
                print(f"[{index}/{total}] {rate} {setting}: already done, kept", flush=True)
                try:
                    with open(os.path.join(out_dir, "run.json")) as f:
                        record = json.load(f)
                except (OSError, ValueError):
                    record = {}
                record = record if isinstance(record, dict) else {}
                wall, rc, load = record.get("wall_s", math.nan), 0, record.get("loadavg_1min", math.nan)
            else:
                os.makedirs(out_dir, exist_ok=True)
                for stale in ("metrics.jsonl", "iface.json"):
                    if os.path.exists(os.path.join(out_dir, stale)):
                        os.remove(os.path.join(out_dir, stale))
                print(f"[{index}/{total}] {rate} {setting}: running (log {os.path.relpath(out_dir, REPO)}/train.log)",
                      flush=True)
                rc, wall = run_one(cmd, os.path.join(out_dir, "train.log"), args.timeout)
                load = os.getloadavg()[0]
                if not args.keep_checkpoints:
                    shutil.rmtree(os.path.join(out_dir, "checkpoints"), ignore_errors=True)
                with open(os.path.join(out_dir, "run.json"), "w") as f:
                    json.dump({"command": cmd, "exit_code": rc, "wall_s": wall, "loadavg_1min": load}, f, indent=2)
                if rc == 77:
                    raise UserError("the bandwidth lab needs root and network namespaces (see train.log)")
            s = summarize_run(out_dir, setting, wall, rc, args.hosts)
            s["loadavg_1min"] = load
            runs.append(s)
            if s.get("steps"):
                comm = s.get("comm_fraction")
                print(f"  exit {rc}, {fmt(wall, '.0f')} s wall: {s['steps']} steps, "
                      f"{fmt(s.get('steps_per_s'), '.3f')} steps/s, "
                      f"comm {fmt(100 * comm if comm is not None else None, '.1f', suffix='%')}, "
                      f"{fmt(s.get('mb_per_step'), '.3f')} MB/step, final val "
                      f"{diverged_text(s) if s['diverged'] else fmt(s.get('final_val_loss'), '.4f')}", flush=True)
            elif s["diverged"]:
                print(f"  exit {rc}: {diverged_text(s)} before its first step was logged", flush=True)
            else:
                print(f"  exit {rc}: no metrics (see {out_dir}/train.log)", flush=True)
        if args.dry_run:
            continue
        finished = [s for s in runs if s.get("final_val_loss") is not None]  # (diverged runs have none)
        if args.target_val_loss is not None:
            target, given = args.target_val_loss, True
        elif finished:
            # Rounded up to the 4 decimals the tables show, so the worst run reaches the printed target too.
            target, given = math.ceil(max(s["final_val_loss"] for s in finished) * 1e4) / 1e4, False
        else:
            target, given = math.nan, False
        if any(s.get("steps") for s in runs):
            table = rate_table(rate, runs, target, given, args)
            with open(os.path.join(rate_dir, "table.md"), "w") as f:
                f.write(table)
            summary += [table]
            try:
                plot_rate(rate, runs, target, os.path.join(rate_dir, "loss_vs_time.png"), args)
                summary += [f"![loss vs time at {rate}]({rate}/loss_vs_time.png)", ""]
            except ImportError as e:
                print(f"warning: no plot ({e}; run this with /usr/bin/python3, which has matplotlib)", file=sys.stderr)
            print("\n" + table, flush=True)
            if not args.no_compare and os.path.isfile(COMPARE):
                dirs = [s["out_dir"] for s in runs if s.get("steps")]
                python = "/usr/bin/python3" if os.access("/usr/bin/python3", os.X_OK) else sys.executable
                cmp_cmd = [python, COMPARE, *dirs, "--out", os.path.join(rate_dir, "compare"),
                           "--table", os.path.join(rate_dir, "compare_table.md"),
                           "--labels", ",".join(s["label"].replace(",", " ") for s in runs if s.get("steps"))]
                if math.isfinite(target):
                    cmp_cmd += ["--target-val-loss", f"{target:.6g}"]
                r = subprocess.run(cmp_cmd, cwd=REPO)
                if r.returncode != 0:
                    print(f"warning: compare_runs.py exited {r.returncode}", file=sys.stderr)
        else:
            summary += [f"### {rate}: no run produced metrics", ""]
        study["rates"][rate] = {"target_val_loss": target, "target_given": given, "runs": runs}
        with open(os.path.join(args.out, "study.json"), "w") as f:
            json.dump(json_safe(study), f, indent=1)
    if args.dry_run:
        return 0
    with open(os.path.join(args.out, "summary.md"), "w") as f:
        f.write("\n".join(summary) + "\n")
    print(f"\nwrote {os.path.relpath(args.out, os.getcwd())}/summary.md, study.json and per rate table.md, "
          "loss_vs_time.png, compare/")
    diverged = [f"{rate}/{s['setting']}" for rate, r in study["rates"].items() for s in r["runs"] if s["diverged"]]
    if diverged:  # a result (say, a learning rate too high for a setting), reported, not a failure of the study
        print("diverged runs: " + ", ".join(diverged), file=sys.stderr)
    failed = [f"{rate}/{s['setting']}" for rate, r in study["rates"].items() for s in r["runs"]
              if s["exit_code"] != 0 and not s["diverged"]]
    if failed:
        print("failed runs: " + ", ".join(failed), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except UserError as e:
        print(f"bandwidth_study.py: error: {e}", file=sys.stderr)
        sys.exit(2)
    except OSError as e:  # an output folder that cannot be made or written, a corpus script that cannot start
        where = f"{e.filename}: " if e.filename else ""
        print(f"bandwidth_study.py: error: {where}{e.strerror or e}", file=sys.stderr)
        sys.exit(1)
    except KeyboardInterrupt:
        print("\nbandwidth_study.py: interrupted (the lab of the current run has been torn down)", file=sys.stderr)
        sys.exit(130)
