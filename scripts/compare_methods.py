#!/usr/bin/python3
"""Every low-communication method of this trainer on one model, data, seed and token budget, side by side.

Runs AdamW-DDP (the reference), DeMo and its variants (no sign step, a random orthogonal transform), top-k,
random-k, Signum, PowerSGD, DiLoCo and SparseLoCo on --np ranks of train_gpt_cpu, each at up to three byte
budgets per step ("high", "mid", "low": the sizes of DeMo's k=32, k=8 and k=1 buckets, and each method's
setting closest to them; a method that cannot get near a budget is not run at it). The settings are the
SETTINGS table below; the table of results states every run's measured bytes per step next to its budget's.

  1. Learning rates: one setting per method (its "sweep" row) tries a grid of peak rates on a run of
     --sweep-steps steps; the lowest final val loss wins, and when the winner sits on the edge of the grid the
     grid grows by one point (x2 or /2) on that side, up to --max-grow points, so no method is judged on a
     truncated grid. The method's other budgets reuse its rate (as docs/replication does for DeMo's k).
  2. Full runs of --steps steps for every setting at its method's rate, same seed (same initial weights and
     data order), same batch and schedule.
  3. OUT/table.md: final val loss, MB sent per rank per step, bytes sent until the run first reaches
     AdamW-DDP's val loss at step --target-step, compute per step and its overhead over AdamW-DDP's, and the
     emulated time to that loss at every --rates link rate. OUT/loss_vs_{step,bytes,time_<rate>}.png: val
     loss curves, one panel per budget. OUT/results.json: every number and command.

Emulated wall clock: a step takes its measured compute time (compute_ms: the step without the time inside
collectives) plus bytes_sent * 8 / rate, the transfer of what the rank sent over a full-duplex link of that
rate under the ring model the byte counters follow (every rank sends as much as it receives), plus
--latency-ms per step. --lab-check replays a few settings for --lab-steps steps on scripts/bandwidth_lab.sh's
emulated hosts at each rate (needs root) and writes measured vs modelled step times to OUT/lab_check.md.

Runs live in RUNS/<setting>[_lr<LR>]/ and are resumable: a finished run (its done.json matches its command)
is skipped, an interrupted one resumes from its last checkpoint. A run whose loss stops being finite (exit
status 3) counts as diverged: the worst point of a sweep, "diverged" in the table.

  /usr/bin/python3 scripts/compare_methods.py                     # everything (~3 h on 2 cores; resumable)
  /usr/bin/python3 scripts/compare_methods.py --dry-run           # print the commands
  /usr/bin/python3 scripts/compare_methods.py --methods adamw demo --budgets high --steps 20 --sweep-steps 10 \\
      --runs runs/methods_smoke --out runs/methods_smoke/report   # a smoke version
"""
import argparse
import importlib.util
import json
import math
import os
import re
import shlex
import statistics
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LAB = os.path.join(REPO, "scripts", "bandwidth_lab.sh")
MISSING = "—"


class UserError(Exception):
    """A problem with the arguments or the runs, reported as one line and exit status 1."""


def load_compare_runs():
    spec = importlib.util.spec_from_file_location("compare_runs", os.path.join(REPO, "scripts", "compare_runs.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# ---- the settings ----------------------------------------------------------------------------------------
# name, method, budget, trainer flags, lr family, sweep row. Budgets at 4 ranks on configs/small.json (7.3M
# parameters, 1,790 64x64 chunks), ring model: DeMo k=32 sends 1.07 MB per rank per step, k=8 0.27, k=1 0.034.
# random-k all-reduces values only (2(W-1)/W * 4 bytes each, 6 per value at W=4, against DeMo's all-gather of
# (W-1) * 6 = 18), so 3k of its values cost what k of DeMo's do. PowerSGD: 2(W-1)/W * 4 * r(n+m) per matrix,
# 0.35 MB per unit of rank here. DiLoCo: an fp32 all-reduce (43.5 MB) or bf16 (21.7 MB) every H steps.
# SparseLoCo: (W-1) * (12 + 2 bits) per coefficient every H steps (k=64 of 4096: 0.63 MB per sync, so H=3 is
# the mid budget and H=30 the low one). Signum sends (W-1) n/8 = 2.7 MB per step,
# more than any budget: it runs once, in the high panel, and the table says so.
SETTINGS = [
    ("adamw", "adamw", "all", ["--optimizer", "adamw", "--weight_decay", "0.1"], "adam", True),
    ("demo_k32", "demo", "high", ["--optimizer", "demo", "--demo_topk", "32"], "sign", True),
    ("demo_k8", "demo", "mid", ["--optimizer", "demo", "--demo_topk", "8"], "sign", False),
    ("demo_k1", "demo", "low", ["--optimizer", "demo", "--demo_topk", "1"], "sign", False),
    ("demo_nosign_k32", "demo_nosign", "high", ["--optimizer", "demo", "--demo_topk", "32", "--demo_sign", "false"],
     "unsigned", True),
    ("demo_nosign_k8", "demo_nosign", "mid", ["--optimizer", "demo", "--demo_topk", "8", "--demo_sign", "false"],
     "unsigned", False),
    ("demo_random_k32", "demo_random", "high", ["--optimizer", "demo", "--demo_topk", "32",
                                                "--demo_transform", "random"], "sign", True),
    ("demo_random_k8", "demo_random", "mid", ["--optimizer", "demo", "--demo_topk", "8",
                                              "--demo_transform", "random"], "sign", False),
    ("topk_k32", "topk", "high", ["--optimizer", "topk", "--demo_topk", "32"], "sign", True),
    ("topk_k8", "topk", "mid", ["--optimizer", "topk", "--demo_topk", "8"], "sign", False),
    ("topk_k1", "topk", "low", ["--optimizer", "topk", "--demo_topk", "1"], "sign", False),
    ("randomk_k96", "randomk", "high", ["--optimizer", "randomk", "--demo_topk", "96"], "sign", True),
    ("randomk_k24", "randomk", "mid", ["--optimizer", "randomk", "--demo_topk", "24"], "sign", False),
    ("randomk_k3", "randomk", "low", ["--optimizer", "randomk", "--demo_topk", "3"], "sign", False),
    ("signum", "signum", "high", ["--optimizer", "signum"], "sign", True),
    ("powersgd_r3", "powersgd", "high", ["--optimizer", "powersgd", "--powersgd_rank", "3",
                                         "--weight_decay", "0.1"], "adam", True),
    ("powersgd_r1", "powersgd", "mid", ["--optimizer", "powersgd", "--powersgd_rank", "1",
                                        "--weight_decay", "0.1"], "adam", False),
    ("diloco_h40", "diloco", "high", ["--optimizer", "diloco", "--diloco_inner_steps", "40",
                                      "--weight_decay", "0.1"], "adam", True),
    ("diloco_h80_bf16", "diloco", "mid", ["--optimizer", "diloco", "--diloco_inner_steps", "80",
                                          "--diloco_wire", "bf16", "--weight_decay", "0.1"], "adam", False),
    ("sparseloco_k64_h3", "sparseloco", "mid", ["--optimizer", "sparseloco", "--sparseloco_topk", "64",
                                                "--diloco_inner_steps", "3", "--weight_decay", "0.1"], "adam", True),
    ("sparseloco_k64_h30", "sparseloco", "low", ["--optimizer", "sparseloco", "--sparseloco_topk", "64",
                                                 "--diloco_inner_steps", "30", "--weight_decay", "0.1"], "adam",
     False),
]
BUDGETS = ["high", "mid", "low"]
BUDGET_REFERENCE = {"high": "demo_k32", "mid": "demo_k8", "low": "demo_k1"}  # the settings that define each budget
# Starting grids of peak learning rates. DeMo-like methods step by lr * sign(...); unsigned DeMo steps by
# lr * decode(momentum), whose size is ~lr * |g| / (1 - decay), so its rate sits near sqrt of the signed ones'.
LR_GRIDS = {"adam": [2e-3, 4e-3, 8e-3], "sign": [1e-3, 2e-3, 4e-3], "unsigned": [2.5e-2, 5e-2, 1e-1]}


def lr_text(lr):
    return f"{lr:.3g}"


class Setting:
    def __init__(self, name, method, budget, flags, lr_family, sweep):
        self.name, self.method, self.budget, self.flags = name, method, budget, flags
        self.lr_family, self.sweep = lr_family, sweep

    def optimizer(self):
        return self.flags[self.flags.index("--optimizer") + 1]


def selected_settings(args):
    settings = [Setting(*row) for row in SETTINGS]
    known = sorted({s.method for s in settings})
    for m in args.methods or []:
        if m not in known:
            raise UserError(f"--methods: '{m}' is not one of {', '.join(known)}")
    for b in args.budgets:
        if b not in BUDGETS:
            raise UserError(f"--budgets: '{b}' is not one of {', '.join(BUDGETS)}")
    wanted = set(args.methods or known) | {"adamw"}  # AdamW-DDP is the yardstick of every table
    return [s for s in settings if s.method in wanted and (s.budget == "all" or s.budget in args.budgets)]


# ---- running ---------------------------------------------------------------------------------------------

def trainer_command(args, setting, lr, steps, out_dir):
    warmup = max(1, round(steps * args.warmup_frac))
    words = [] if args.np == 1 and args.mpirun == "none" else [args.mpirun, "-np", str(args.np)]
    words += [args.trainer, "--config", args.model, "--batch_size", str(args.batch_size),
              "--seq_len", str(args.seq_len), "--steps", str(steps), "--warmup_steps", str(warmup),
              "--warmup_start_frac", "0.1", "--final_lr_frac", "0.1", "--lr", lr_text(lr), "--grad_clip", "1.0",
              "--seed", str(args.seed), "--val_every", str(args.val_every), "--val_batches", str(args.val_batches),
              "--sample_every", "0", "--log_every", "50", "--checkpoint_every", str(args.checkpoint_every),
              "--out_dir", out_dir]
    return words + setting.flags


def run_folder(args, setting, lr, kind):
    """kind: "" (a full run), "sweep" or "timing"."""
    return os.path.join(args.runs, (kind + "/" if kind else "") + f"{setting.name}_lr{lr_text(lr)}")


def run_once(args, setting, lr, steps, kind=""):
    """Runs (or resumes, or skips when done) one training run; returns (folder, status): ok | diverged."""
    folder = run_folder(args, setting, lr, kind)
    command = trainer_command(args, setting, lr, steps, folder)
    if kind == "timing":  # compute time only: no validation, no checkpoints, every step logged
        command += ["--val_every", "0", "--checkpoint_every", "-1", "--log_every", "1"]
    done_path = os.path.join(folder, "done.json")
    if os.path.isfile(done_path):
        with open(done_path, encoding="utf-8") as f:
            done = json.load(f)
        if done.get("command") == command:
            return folder, done["status"]
        raise UserError(f"{folder}: finished with another command (other settings?); give such runs their own --runs")
    if os.path.isdir(os.path.join(folder, "checkpoints")) and os.listdir(os.path.join(folder, "checkpoints")):
        command_run = command + ["--resume", "auto"]
    else:
        command_run = command
    print("+ " + shlex.join(command_run), flush=True)
    if args.dry_run:
        return folder, "dry-run"
    os.makedirs(folder, exist_ok=True)
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), OMPI_ALLOW_RUN_AS_ROOT="1",
               OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMPI_MCA_rmaps_base_oversubscribe="1")
    with open(os.path.join(folder, "train.log"), "a", encoding="utf-8") as log:
        rc = subprocess.call(command_run, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
    if rc not in (0, 3):
        raise UserError(f"{folder}: the trainer exited with status {rc}; see {folder}/train.log")
    status = "ok" if rc == 0 else "diverged"
    with open(done_path, "w", encoding="utf-8") as f:
        json.dump({"command": command, "status": status}, f)
    return folder, status


def final_val(cr, folder):
    run = cr.Run(folder)
    if run.diverged_step is not None or not run.val_loss or not math.isfinite(run.val_loss[-1]):
        return math.inf
    return run.val_loss[-1]


def sweep_lr(args, cr, setting, log):
    """The grid search of step 1: returns the winning rate (and logs every point)."""
    grid = sorted(LR_GRIDS[setting.lr_family])
    results = {}
    for _ in range(len(grid) + args.max_grow):
        for lr in grid:
            if lr not in results:
                folder, status = run_once(args, setting, lr, args.sweep_steps, "sweep")
                results[lr] = math.inf if status != "ok" or args.dry_run else final_val(cr, folder)
        best = min(grid, key=lambda lr: (results[lr], lr))
        grown = len(grid) - len(LR_GRIDS[setting.lr_family])
        if args.dry_run or grown >= args.max_grow or not math.isfinite(results[best]):
            break
        if best == grid[0]:
            grid.insert(0, grid[0] / 2)
        elif best == grid[-1]:
            grid.append(grid[-1] * 2)
        else:
            break
    log.append({"method": setting.method, "setting": setting.name, "grid": grid,
                "val_loss": {lr_text(lr): results.get(lr) for lr in grid}, "best": best})
    return best


# ---- the table and plots ---------------------------------------------------------------------------------

def summarize(cr, setting, lr, folder, rates, latency_ms):
    run = cr.Run(folder)
    n = len(run.train)
    compute = [cr.number(r.get("compute_ms")) for r in run.train]
    sent = [cr.number(r.get("bytes_sent"), 0.0) for r in run.train]
    row = {"setting": setting.name, "method": setting.method, "budget": setting.budget, "lr": lr,
           "folder": os.path.relpath(folder, REPO), "steps": run.steps, "val_steps": run.val_steps,
           "val_loss": run.val_loss, "diverged_step": run.diverged_step,
           "final_val": run.val_loss[-1] if run.val_loss else math.nan,
           "bytes_per_step": sum(sent) / n if n else math.nan,
           "compute_ms": statistics.median(compute[1:] or compute) if n else math.nan,
           "cum_bytes": [], "cum_time": {r: [] for r in rates}}
    total_b, total_t = 0.0, {r: 0.0 for r in rates}
    for c, b in zip(compute, sent):  # per train step: what the rank sent, and the step's emulated time per rate
        total_b += b
        row["cum_bytes"].append(total_b)
        for r, bits_per_s in rates.items():
            total_t[r] += (c if math.isfinite(c) else 0.0) / 1e3 + b * 8 / bits_per_s + latency_ms / 1e3
            row["cum_time"][r].append(total_t[r])
    return row


def retime(row, compute_ms, rates, latency_ms):
    """The row's emulated clocks redone with one compute time per step (a timing run's median)."""
    row["compute_ms_own_run"], row["compute_ms"] = row["compute_ms"], compute_ms
    total_b = [0.0] + row["cum_bytes"]
    for r, bits_per_s in rates.items():
        row["cum_time"][r] = [(i + 1) * (compute_ms / 1e3 + latency_ms / 1e3) + total_b[i + 1] * 8 / bits_per_s
                              for i in range(len(row["cum_bytes"]))]


def at_val_points(row, series):
    """The train series' cumulative value at each val point (the last train step <= it)."""
    out, i = [], -1
    for step in row["val_steps"]:
        while i + 1 < len(row["steps"]) and row["steps"][i + 1] <= step:
            i += 1
        out.append(series[i] if i >= 0 else math.nan)
    return out


def first_reaching(row, target):
    for i, loss in enumerate(row["val_loss"]):
        if math.isfinite(loss) and loss <= target:
            return i
    return None


def parse_rate(text):
    units = {"kbit": 1e3, "mbit": 1e6, "gbit": 1e9}
    for suffix, scale in units.items():
        if text.endswith(suffix):
            try:
                value = float(text[: -len(suffix)])
            except ValueError:
                break
            if value > 0:
                return value * scale
    raise UserError(f"--rates: '{text}' is not like 100mbit or 1gbit")


def human_bytes(b):
    if not math.isfinite(b):
        return MISSING
    for scale, unit in ((1e9, "GB"), (1e6, "MB"), (1e3, "kB")):
        if b >= scale:
            return f"{b / scale:,.2f} {unit}"
    return f"{b:,.0f} B"


def table(rows, rates, target_step):
    adamw = next(r for r in rows if r["method"] == "adamw")
    target = math.nan
    if target_step in adamw["val_steps"]:
        target = adamw["val_loss"][adamw["val_steps"].index(target_step)]
    budget_bytes = {b: next((r["bytes_per_step"] for r in rows if r["setting"] == ref), math.nan)
                    for b, ref in BUDGET_REFERENCE.items()}
    head = ["budget", "setting", "lr", "final val loss", "MB/step sent", "vs budget", f"bytes to AdamW's step-{target_step} loss",
            "compute ms/step", "overhead vs AdamW"] + [f"time to that loss at {r}" for r in rates]
    lines = [f"Target: AdamW-DDP's val loss at step {target_step}: " + (f"{target:.4f}" if math.isfinite(target) else
             "not measured (no val point there)"), "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    order = {b: i for i, b in enumerate(["all"] + BUDGETS)}
    for r in sorted(rows, key=lambda r: (order[r["budget"]], r["final_val"] if math.isfinite(r["final_val"]) else 9e9)):
        final = "diverged" if r["diverged_step"] is not None else (f"{r['final_val']:.4f}" if math.isfinite(r["final_val"])
                                                                  else MISSING)
        ref = budget_bytes.get(r["budget"], math.nan)
        vs = f"{r['bytes_per_step'] / ref:.2f}x" if math.isfinite(ref) and ref > 0 and r["budget"] != "all" else MISSING
        i = first_reaching(r, target) if math.isfinite(target) else None
        to_bytes = human_bytes(at_val_points(r, r["cum_bytes"])[i]) + f" (step {r['val_steps'][i]})" if i is not None \
            else "not reached"
        overhead = r["compute_ms"] - adamw["compute_ms"]
        cells = [r["budget"], r["setting"], lr_text(r["lr"]), final, f"{r['bytes_per_step'] / 1e6:,.4f}", vs, to_bytes,
                 f"{r['compute_ms']:,.0f}", f"{overhead:+,.0f} ms ({100 * overhead / adamw['compute_ms']:+.0f}%)"]
        for rate in rates:
            cells.append(f"{at_val_points(r, r['cum_time'][rate])[i]:,.1f} s" if i is not None else "not reached")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n", target


def draw(rows, out_dir, rates, target):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    budgets = [b for b in BUDGETS if any(r["budget"] == b for r in rows)]
    paths = []
    views = [("loss_vs_step.png", "optimizer step", None, False), ("loss_vs_bytes.png", "bytes sent per rank", "bytes", True)]
    views += [(f"loss_vs_time_{r}.png", f"emulated wall clock at {r} (s)", r, False) for r in rates]
    for file, xlabel, quantity, logx in views:
        fig, axes = plt.subplots(1, len(budgets), figsize=(6 * len(budgets), 4.5), squeeze=False, sharey=True)
        for ax, budget in zip(axes[0], budgets):
            for r in rows:
                if r["budget"] not in (budget, "all") or not r["val_steps"]:
                    continue
                if quantity is None:
                    x = r["val_steps"]
                elif quantity == "bytes":
                    x = at_val_points(r, r["cum_bytes"])
                else:
                    x = at_val_points(r, r["cum_time"][quantity])
                style = {"color": "black", "linewidth": 2} if r["method"] == "adamw" else {}
                ax.plot(x, r["val_loss"], marker=".", label=f"{r['setting']} (lr {lr_text(r['lr'])})", **style)
            if math.isfinite(target):
                ax.axhline(target, color="gray", linestyle=":", linewidth=1)
            if logx:
                ax.set_xscale("log")
            ax.set_title(f"budget {budget}")
            ax.set_xlabel(xlabel)
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)
        axes[0][0].set_ylabel("val loss")
        fig.tight_layout()
        path = os.path.join(out_dir, file)
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(path)
    return paths


# ---- the bandwidth-lab check -----------------------------------------------------------------------------

def lab_check(args, cr, rows, rates, settings_by_name):
    lines = ["| setting | rate | modelled ms/step | measured ms/step | measured / modelled |", "|---|---|---|---|---|"]
    checks = []
    for name in args.lab_settings:
        row = next((r for r in rows if r["setting"] == name), None)
        if row is None:
            raise UserError(f"--lab-settings: '{name}' has no full run in this comparison")
        setting = settings_by_name[name]
        for rate, bits_per_s in rates.items():
            folder = os.path.join(args.runs, "lab", f"{name}_{rate}")
            command = trainer_command(args, setting, row["lr"], args.lab_steps, folder)[3:]  # no local mpirun
            command += ["--checkpoint_every", "-1", "--val_every", "0", "--val_data", ""]
            lab = ["bash", LAB, "--hosts", str(args.np), "--rate", rate, "--quiet", "--", "lab-mpirun", "-np",
                   str(args.np), "-x", f"OMP_NUM_THREADS={args.threads}"] + command
            print("+ " + shlex.join(lab), flush=True)
            if args.dry_run:
                continue
            os.makedirs(folder, exist_ok=True)
            with open(os.path.join(folder, "train.log"), "w", encoding="utf-8") as log:
                rc = subprocess.call(lab, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
            if rc != 0:
                raise UserError(f"{folder}: the lab run exited with status {rc} (77: needs root); see its train.log")
            run = cr.Run(folder)
            skip = min(2, len(run.train) - 1)  # the first steps warm caches and connections
            measured = statistics.fmean(cr.number(r.get("step_ms")) for r in run.train[skip:])
            modelled = row["compute_ms"] + row["bytes_per_step"] * 8 / bits_per_s * 1e3 + args.latency_ms
            checks.append({"setting": name, "rate": rate, "modelled_ms": modelled, "measured_ms": measured})
            lines.append(f"| {name} | {rate} | {modelled:,.0f} | {measured:,.0f} | {measured / modelled:.2f} |")
    return "\n".join(lines) + "\n", checks


def trainer_optimizers(trainer):
    """The names --optimizer takes, from the trainer's refusal of a name it does not know."""
    path = trainer if os.path.isabs(trainer) else os.path.join(REPO, trainer)
    out = subprocess.run([path, "--optimizer", "?", "--steps", "1"], capture_output=True, text=True)
    found = re.search(r"is not one of: (.*)", out.stderr)
    if not found:
        raise UserError(f"{trainer}: cannot tell which optimizers it has ({out.stderr.strip()[:120]})")
    return [name.strip() for name in found.group(1).split(",")]


def finite_json(x):
    """x with every non-finite float as null (strict JSON)."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: finite_json(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [finite_json(v) for v in x]
    return x


# ---- main ------------------------------------------------------------------------------------------------

def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--runs", default="runs/methods", help="parent of the run folders [runs/methods]")
    p.add_argument("--out", default="docs/methods", help="table, plots and results.json [docs/methods]")
    p.add_argument("--methods", nargs="+", metavar="M", help="only these methods (AdamW-DDP always runs)")
    p.add_argument("--budgets", nargs="+", default=BUDGETS, metavar="B", help="high mid low [all three]")
    p.add_argument("--trainer", default="./train_gpt_cpu")
    p.add_argument("--mpirun", default="mpirun", help="launcher; 'none' runs the trainer directly (--np 1)")
    p.add_argument("--np", type=int, default=4, help="ranks [4]")
    p.add_argument("--threads", type=int, default=1, help="OMP_NUM_THREADS per rank [1]")
    p.add_argument("--model", default="configs/small.json", help="model config [configs/small.json]")
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--steps", type=int, default=400, help="steps of every full run [400]")
    p.add_argument("--sweep-steps", type=int, default=150, help="steps of every sweep run [150]")
    p.add_argument("--lr", action="append", default=[], metavar="METHOD=LR",
                   help="use this peak rate for METHOD instead of sweeping (repeatable), e.g. an earlier sweep's")
    p.add_argument("--max-grow", type=int, default=2, help="grid points a sweep may add at its edges [2]")
    p.add_argument("--warmup-frac", type=float, default=1 / 12, help="warmup share of the steps [1/12]")
    p.add_argument("--val-every", type=int, default=50)
    p.add_argument("--val-batches", type=int, default=8)
    p.add_argument("--checkpoint-every", type=int, default=100)
    p.add_argument("--timing-steps", type=int, default=0,
                   help="time every setting on a run of its own of this many steps, after the others, and use its "
                        "median compute time in the table and clocks (0: each full run's own) [0]")
    p.add_argument("--seed", type=int, default=1337)
    p.add_argument("--target-step", type=int, help="AdamW-DDP's val loss at this step is the target [--steps / 2]")
    p.add_argument("--rates", nargs="+", default=["100mbit", "1gbit"], help="emulated link rates [100mbit 1gbit]")
    p.add_argument("--latency-ms", type=float, default=0.0, help="added to every emulated step [0]")
    p.add_argument("--lab-check", action="store_true", help="measure --lab-settings on the bandwidth lab (root)")
    p.add_argument("--lab-settings", nargs="+", default=["adamw", "demo_k32", "diloco_h40"])
    p.add_argument("--lab-steps", type=int, default=12)
    p.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    args = p.parse_args(argv)
    for name in ("np", "steps", "sweep_steps", "val_every", "batch_size", "seq_len", "threads", "lab_steps"):
        if getattr(args, name) < 1:
            raise UserError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    args.fixed_lr = {}
    for item in args.lr:
        method, _, value = item.partition("=")
        try:
            args.fixed_lr[method] = float(value)
        except ValueError:
            raise UserError(f"--lr {item}: expected METHOD=LR, e.g. demo=0.002")
        if not args.fixed_lr[method] > 0:
            raise UserError(f"--lr {item}: the rate must be positive")
    if args.target_step is None:
        args.target_step = max(args.val_every, args.steps // 2 // args.val_every * args.val_every)
    if not os.path.isfile(os.path.join(REPO, args.trainer)) and not os.path.isfile(args.trainer):
        raise UserError(f"--trainer {args.trainer}: not found (run 'make train_gpt_cpu')")
    if not os.path.isfile(os.path.join(REPO, args.model)):
        raise UserError(f"--model {args.model}: no such file")
    args.runs = os.path.join(REPO, args.runs) if not os.path.isabs(args.runs) else args.runs
    args.out = os.path.join(REPO, args.out) if not os.path.isabs(args.out) else args.out
    return args


def main(argv):
    args = parse_args(argv)
    rates = {r: parse_rate(r) for r in args.rates}
    settings = selected_settings(args)
    known = trainer_optimizers(args.trainer)
    for s in settings:  # an optimizer this build lacks is refused before any run starts
        if s.optimizer() not in known:
            raise UserError(f"{s.name}: {args.trainer} has no --optimizer {s.optimizer()} (it has {', '.join(known)});"
                            " leave it out with --methods")
    cr = load_compare_runs()
    sweep_log, best_lr = [], {}
    for m in args.fixed_lr:
        if m not in {s.method for s in settings}:
            raise UserError(f"--lr {m}=...: '{m}' is not a method of this comparison")
    for s in settings:
        if s.method in args.fixed_lr:
            best_lr[s.method] = args.fixed_lr[s.method]
        elif s.sweep:
            best_lr[s.method] = sweep_lr(args, cr, s, sweep_log)
    if args.dry_run and sweep_log:
        print("# the full runs below show each grid's first rate; they run at the sweep's winner")
    rows = []
    for s in settings:
        if s.method not in best_lr:
            raise UserError(f"{s.name}: its method {s.method} has no sweep row among the selected settings")
        folder, status = run_once(args, s, best_lr[s.method], args.steps)
        if not args.dry_run:
            rows.append(summarize(cr, s, best_lr[s.method], folder, rates, args.latency_ms))
    if args.timing_steps:  # the compute times of short runs made after the others, on a machine left to them
        for s, row in zip(settings, rows or [None] * len(settings)):
            folder, status = run_once(args, s, best_lr[s.method], args.timing_steps, "timing")
            if row is not None:
                timed = summarize(cr, s, best_lr[s.method], folder, {}, 0.0)["compute_ms"]
                retime(row, timed, rates, args.latency_ms)
    if args.dry_run:
        return 0
    os.makedirs(args.out, exist_ok=True)
    text, target = table(rows, rates, args.target_step)
    sweep_lines = ["| method | grid (val loss at the sweep's last step) | chosen lr |", "|---|---|---|"]
    for entry in sweep_log:
        points = ", ".join(f"{lr}: " + (f"{v:.4f}" if v is not None and math.isfinite(v) else "diverged")
                           for lr, v in entry["val_loss"].items())
        sweep_lines.append(f"| {entry['method']} | {points} | {lr_text(entry['best'])} |")
    with open(os.path.join(args.out, "table.md"), "w", encoding="utf-8") as f:
        f.write(text + "\n## Learning-rate sweeps\n\n" + "\n".join(sweep_lines) + "\n")
    sys.stdout.write(text)
    results = {"args": {k: v for k, v in vars(args).items()}, "target_val_loss": target, "sweeps": sweep_log,
               "runs": rows}
    if args.lab_check:
        lab_text, checks = lab_check(args, cr, rows, rates, {s.name: s for s in settings})
        results["lab_check"] = checks
        with open(os.path.join(args.out, "lab_check.md"), "w", encoding="utf-8") as f:
            f.write(lab_text)
        sys.stdout.write("\n" + lab_text)
    with open(os.path.join(args.out, "results.json"), "w", encoding="utf-8") as f:
        json.dump(finite_json(results), f, indent=1)
    for path in draw(rows, args.out, rates, target):
        print(f"wrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except UserError as e:
        print(f"compare_methods.py: error: {e}", file=sys.stderr)
        sys.exit(1)
