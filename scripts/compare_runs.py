#!/usr/bin/python3
"""Compares training runs (DeMo vs AdamW-DDP and variants) from their run folders.

Each folder holds the trainer's config.json (resolved config plus "_run": world size, code version...) and
metrics.jsonl (one JSON object per line: "train" steps, "val" losses, samples). This draws train and val
loss against steps, tokens, bytes sent per rank (log x) and training time, and prints a Markdown table:
final losses, bytes sent per rank, throughput and the share of step time spent in communication. Runs still
in progress (or cut off mid-line by a crash) are read up to their last complete line.

  /usr/bin/python3 scripts/compare_runs.py runs/300m_adamw runs/300m_demo_k8 --out runs/compare \\
      --table runs/compare/table.md --smooth 20 --target-val-loss 3.5
"""
import argparse
import json
import math
import os
import statistics
import sys

PLOTS = [  # file name, x quantity, axis label, log x
    ("loss_vs_step.png", "step", "optimizer step", False),
    ("loss_vs_tokens.png", "tokens", "tokens (all ranks)", False),
    ("loss_vs_bytes_sent.png", "bytes", "cumulative bytes sent per rank", True),
    ("loss_vs_time.png", "seconds", "training time", False),
]
MISSING = "—"


class UserError(Exception):
    """A problem with the input, reported as one line and exit status 1."""


# ---- reading runs ----------------------------------------------------------------------------------------

def read_jsonl(path):
    """Returns (records, warnings). A last line that is not complete JSON is a run cut off mid-write and is
    dropped quietly; an unreadable line in the middle is skipped with a warning."""
    with open(path, "r", encoding="utf-8", errors="replace") as f:
        lines = f.read().split("\n")
    while lines and not lines[-1].strip():
        lines.pop()
    records, warnings = [], []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError:
            if number < len(lines):
                warnings.append(f"{path}:{number}: not a JSON line, skipped")
            continue
        if isinstance(record, dict):
            records.append(record)
    return records, warnings


def number(value, default=math.nan):
    """A metrics field as a float; null (how JSON writes a NaN loss) or junk gives `default`."""
    try:
        return float(value)
    except (TypeError, ValueError):
        return default


class Run:
    """One run folder: its config and the train/val series, one entry per step (a repeated step keeps the
    line written last), with the cumulative quantities the plots use as x."""

    def __init__(self, folder):
        self.folder = folder
        self.name = os.path.basename(os.path.normpath(os.path.abspath(folder)))
        metrics_path = os.path.join(folder, "metrics.jsonl")
        if not os.path.isfile(metrics_path):
            what = "does not exist" if not os.path.isdir(folder) else "has no metrics.jsonl (not a run folder?)"
            raise UserError(f"{folder}: {what}")
        self.warnings = []
        self.config = {}
        config_path = os.path.join(folder, "config.json")
        try:
            with open(config_path, encoding="utf-8") as f:
                self.config = json.load(f)
        except (OSError, ValueError) as e:
            self.warnings.append(f"{config_path}: unreadable ({e.__class__.__name__}); settings unknown")
        records, warnings = read_jsonl(metrics_path)
        self.warnings += warnings

        train, val = {}, {}
        for r in records:
            try:
                if r.get("type") == "train":
                    train[int(r["step"])] = r
                elif r.get("type") == "val":
                    val[int(r["step"])] = r
            except (KeyError, TypeError, ValueError):
                self.warnings.append(f"{metrics_path}: a {r.get('type')} line without a step, skipped")
        self.train = [train[s] for s in sorted(train)]
        self.val = [val[s] for s in sorted(val)]

        # Per train step: cumulative bytes this rank sent and cumulative step time.
        self.steps = [int(r["step"]) for r in self.train]
        self.loss = [number(r.get("loss")) for r in self.train]
        self.tokens = [number(r.get("tokens"), 0.0) for r in self.train]
        self.bytes, self.seconds = [], []
        total_bytes = total_seconds = 0.0
        for r in self.train:
            total_bytes += number(r.get("bytes_sent"), 0.0)
            total_seconds += number(r.get("step_ms"), 0.0) / 1e3
            self.bytes.append(total_bytes)
            self.seconds.append(total_seconds)
        # Val points take the train series' cumulative values at their step (the last train step <= it).
        self.val_steps = [int(r["step"]) for r in self.val]
        self.val_loss = [number(r.get("val_loss")) for r in self.val]
        self.val_tokens, self.val_bytes, self.val_seconds = [], [], []
        i = -1
        for r in self.val:
            while i + 1 < len(self.steps) and self.steps[i + 1] <= int(r["step"]):
                i += 1
            self.val_tokens.append(number(r.get("tokens"), self.tokens[i] if i >= 0 else 0.0))
            self.val_bytes.append(self.bytes[i] if i >= 0 else 0.0)
            self.val_seconds.append(self.seconds[i] if i >= 0 else 0.0)
        self.label = self.name  # legend text
        self.table_name = self.name  # the table's run column: the folder's name, or the --labels name

    def series(self, quantity):
        """(x of train points, x of val points) for a plot quantity."""
        return {
            "step": (self.steps, self.val_steps),
            "tokens": (self.tokens, self.val_tokens),
            "bytes": (self.bytes, self.val_bytes),
            "seconds": (self.seconds, self.val_seconds),
        }[quantity]

    @property
    def world_size(self):
        return self.config.get("_run", {}).get("world_size")

    def short_settings(self):
        """Legend text: optimizer, top-k and value encoding for DeMo (gradient encoding for AdamW), world size."""
        c = self.config
        optimizer = c.get("optimizer")
        if optimizer == "demo":
            text = f"DeMo k={c.get('demo_topk', '?')} {c.get('demo_values', 'fp32')}"
            if c.get("demo_delay", 0) == 1:
                text += " delayed"
        elif optimizer == "adamw":
            text = "AdamW-DDP" + (f" {c['grad_wire']}" if c.get("grad_wire", "fp32") != "fp32" else "")
        else:
            return self.name
        if self.world_size is not None:
            text += f", {self.world_size} rank" + ("" if self.world_size == 1 else "s")
        return text

    def long_settings(self):
        """Table text: the settings that tell runs of a comparison apart."""
        c = self.config
        if not c:
            return "?"
        parts = []
        if c.get("optimizer") == "demo":
            parts.append(f"DeMo k={c.get('demo_topk')} chunk {c.get('demo_chunk')} {c.get('demo_values')}")
            if c.get("demo_indices", "auto") != "auto":
                parts.append(f"idx {c.get('demo_indices')}")
            parts.append(f"decay {c.get('demo_decay')}")
            if c.get("demo_momentum", "lr") != "lr":
                parts.append(f"momentum {c.get('demo_momentum')}")
            if c.get("demo_alpha", 1) != 1:
                parts.append(f"alpha {c.get('demo_alpha')}")
            if c.get("demo_delay", 0) == 1:
                parts.append("applied a step late")
        elif c.get("optimizer") == "adamw":
            parts.append(f"AdamW-DDP betas {c.get('beta1')}/{c.get('beta2')}")
            if c.get("grad_wire", "fp32") != "fp32":
                parts.append(f"{c.get('grad_wire')} gradients")
        else:
            parts.append(str(c.get("optimizer", "?")))
        parts.append(f"lr {c.get('lr'):g}" if isinstance(c.get("lr"), (int, float)) else "lr ?")
        parts.append(f"wd {c.get('weight_decay'):g}" if isinstance(c.get("weight_decay"), (int, float)) else "wd ?")
        if self.world_size is not None:
            parts.append(f"{self.world_size} rank" + ("" if self.world_size == 1 else "s"))
        if "num_layers" in c:
            parts.append(f"L{c.get('num_layers')} C{c.get('channels')}")
        return ", ".join(parts)


# ---- summaries -------------------------------------------------------------------------------------------

def human_count(n):
    for scale, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "k")):
        if abs(n) >= scale:
            return f"{n / scale:.3g}{suffix}"
    return f"{n:.0f}"


def human_seconds(s):
    if s < 60:
        return f"{s:.1f}s"
    t = int(round(s))
    if t < 3600:
        return f"{t // 60}m{t % 60:02d}s"
    return f"{t // 3600}h{t % 3600 // 60:02d}m"


def summarize(run, last_n, target):
    """One table row (a dict of column -> text)."""
    row = {"run": run.table_name, "settings": run.long_settings()}
    if not run.train:
        row.update({k: MISSING for k in COLUMNS if k not in row})
        return row
    planned = run.config.get("steps")
    done = run.steps[-1]
    row["steps"] = f"{done}/{planned}" if isinstance(planned, int) and done < planned else f"{done}"
    row["tokens"] = human_count(run.tokens[-1])
    tail = [x for x in run.loss[-last_n:] if not math.isnan(x)]
    row["train"] = f"{statistics.fmean(tail):.4f}" if tail else MISSING
    row["val"] = f"{run.val_loss[-1]:.4f}" if run.val else MISSING  # (a diverged run shows nan)
    total_bytes = run.bytes[-1]
    row["mb"] = f"{total_bytes / 1e6:,.2f}"
    row["mb_step"] = f"{total_bytes / 1e6 / len(run.train):,.3f}"
    payload = sum(number(r.get("payload_bytes"), 0.0) for r in run.train)
    row["payload_step"] = f"{payload / 1e6 / len(run.train):,.3f}"
    rates = [x for x in (number(r.get("tok_per_s")) for r in run.train) if not math.isnan(x)]
    row["tok_s"] = f"{statistics.median(rates):,.0f}" if rates else MISSING
    step_ms = sum(number(r.get("step_ms"), 0.0) for r in run.train)
    comm_ms = sum(number(r.get("comm_ms"), 0.0) for r in run.train)
    row["comm"] = f"{100 * comm_ms / step_ms:.1f}%" if step_ms > 0 else MISSING
    if target is not None:
        row.update({"to_steps": "not reached", "to_tokens": "not reached", "to_time": "not reached"})
        for i, loss in enumerate(run.val_loss):
            if loss <= target:
                row["to_steps"] = str(run.val_steps[i])
                row["to_tokens"] = human_count(run.val_tokens[i])
                row["to_time"] = human_seconds(run.val_seconds[i])
                break
    return row


COLUMNS = {
    "run": "run",
    "settings": "optimizer / settings",
    "steps": "steps",
    "tokens": "tokens",
    "train": "train loss (last {n})",
    "val": "val loss",
    "mb": "MB sent/rank",
    "mb_step": "MB/step",
    "payload_step": "payload MB/step",
    "tok_s": "tok/s (median)",
    "comm": "comm share",
}
TARGET_COLUMNS = {"to_steps": "steps to val ≤ {x}", "to_tokens": "tokens to val ≤ {x}",
                  "to_time": "time to val ≤ {x}"}


def markdown_table(runs, last_n, target):
    columns = dict(COLUMNS)
    if target is not None:
        columns.update(TARGET_COLUMNS)
    headers = [h.format(n=last_n, x=f"{target:g}" if target is not None else "") for h in columns.values()]
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    for run in runs:
        row = summarize(run, last_n, target)
        lines.append("| " + " | ".join(row.get(k, MISSING).replace("|", "/") for k in columns) + " |")
    notes = [
        "",
        f"train loss: mean of the last {last_n} logged steps. MB sent/rank: sum of bytes_sent / 1e6 (this rank's "
        "traffic on a ring: about W-1 DeMo buckets, 2(W-1)/W of an AdamW gradient). payload MB/step: this "
        "rank's own bucket or gradient per step, the quantity the DeMo paper reports. comm share: total comm_ms / total step_ms. time: sum of step_ms (validation and "
        "checkpoints excluded).",
    ]
    return "\n".join(lines + notes) + "\n"


# ---- plots -----------------------------------------------------------------------------------------------

def moving_average(values, window):
    """Trailing mean over up to `window` points, skipping NaN (a diverged step does not blank the rest)."""
    out = []
    for i in range(len(values)):
        finite = [v for v in values[max(0, i + 1 - window):i + 1] if not math.isnan(v)]
        out.append(sum(finite) / len(finite) if finite else math.nan)
    return out


def draw_plots(runs, out_dir, smooth, ylim):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    os.makedirs(out_dir, exist_ok=True)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    written = []
    for file_name, quantity, axis_label, log_x in PLOTS:
        fig, (ax_train, ax_val) = plt.subplots(1, 2, figsize=(13, 4.8))
        scale, unit = 1.0, ""
        if quantity == "seconds":
            longest = max((r.seconds[-1] for r in runs if r.seconds), default=0.0)
            scale, unit = (3600.0, "h") if longest >= 36000 else (60.0, "min") if longest >= 600 else (1.0, "s")
            axis_label += f" ({unit}, sum of step_ms)"
        skipped = []
        for index, run in enumerate(runs):
            color = colors[index % len(colors)]
            x_train, x_val = run.series(quantity)
            train = [(x / scale, y) for x, y in zip(x_train, run.loss) if not (log_x and x <= 0)]
            val = [(x / scale, y) for x, y in zip(x_val, run.val_loss) if not (log_x and x <= 0)]
            if not train and not val:
                skipped.append(run.label)
                continue
            if train:
                xs, ys = zip(*train)
                if smooth > 1:
                    ax_train.plot(xs, ys, color=color, alpha=0.25, linewidth=0.8)
                    ax_train.plot(xs, moving_average(ys, smooth), color=color, linewidth=1.6, label=run.label)
                else:
                    ax_train.plot(xs, ys, color=color, linewidth=1.2, label=run.label)
            if val:
                xs, ys = zip(*val)
                ax_val.plot(xs, ys, "o-", color=color, markersize=3, linewidth=1.4, label=run.label)
        for ax, title in ((ax_train, "train loss" + (f" (moving average of {smooth})" if smooth > 1 else "")),
                          (ax_val, "val loss")):
            ax.set_title(title)
            ax.set_xlabel(axis_label)
            ax.set_ylabel("loss")
            ax.grid(True, alpha=0.3)
            if log_x:
                ax.set_xscale("log")
            if ylim:
                ax.set_ylim(*ylim)
            if ax.get_legend_handles_labels()[0]:
                ax.legend(fontsize=8)
        if skipped:
            fig.text(0.5, 0.01, "not shown (no points here): " + ", ".join(skipped), ha="center", fontsize=8)
        fig.tight_layout(rect=(0, 0.04 if skipped else 0, 1, 1))
        path = os.path.join(out_dir, file_name)
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    return written


# ---- main ------------------------------------------------------------------------------------------------

def parse_args(argv):
    p = argparse.ArgumentParser(
        prog="compare_runs.py",
        description="Plot and tabulate training runs (folders with config.json and metrics.jsonl).")
    p.add_argument("runs", nargs="+", metavar="RUN_DIR", help="run folders (the trainer's out_dir)")
    p.add_argument("--out", metavar="DIR",
                   help="folder for the PNG plots [compare/ next to the first run folder]")
    p.add_argument("--table", metavar="FILE.md", help="also write the Markdown table to this file")
    p.add_argument("--labels", metavar="A,B,...", help="comma-separated legend/table names, one per run "
                   "[from each config: optimizer, top-k, value encoding, world size]")
    p.add_argument("--smooth", type=int, default=1, metavar="N", help="moving average of N train steps [1: off]")
    p.add_argument("--last", type=int, default=10, metavar="N", help="final train loss = mean of the last N steps [10]")
    p.add_argument("--target-val-loss", type=float, metavar="X",
                   help="add columns: steps, tokens and time until val loss first reaches X or below")
    p.add_argument("--ylim", type=float, nargs=2, metavar=("LOW", "HIGH"), help="loss axis range")
    p.add_argument("--no-plots", action="store_true", help="only the table")
    args = p.parse_args(argv)
    if args.smooth < 1 or args.last < 1:
        p.error("--smooth and --last must be >= 1")
    return args


def main(argv):
    args = parse_args(argv)
    labels = args.labels.split(",") if args.labels is not None else None
    if labels is not None and len(labels) != len(args.runs):
        raise UserError(f"--labels has {len(labels)} names for {len(args.runs)} runs")
    runs = [Run(folder) for folder in args.runs]
    for run in runs:
        for warning in run.warnings:
            print(f"compare_runs.py: warning: {warning}", file=sys.stderr)
    if labels is not None:
        for run, label in zip(runs, labels):
            run.label = run.table_name = label.strip()
    else:
        labels = [run.short_settings() for run in runs]
        for run, label in zip(runs, labels):  # runs whose settings read the same also get their folder name
            run.label = label if labels.count(label) == 1 else f"{label} ({run.name})"

    table = markdown_table(runs, args.last, args.target_val_loss)
    sys.stdout.write(table)
    if args.table:
        os.makedirs(os.path.dirname(os.path.abspath(args.table)), exist_ok=True)
        with open(args.table, "w", encoding="utf-8") as f:
            f.write(table)
    if not args.no_plots:
        out_dir = args.out or os.path.join(os.path.dirname(os.path.abspath(args.runs[0])), "compare")
        for path in draw_plots(runs, out_dir, args.smooth, args.ylim):
            print(f"wrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except UserError as e:
        print(f"compare_runs.py: error: {e}", file=sys.stderr)
        sys.exit(1)
