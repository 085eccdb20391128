#!/usr/bin/python3
"""Compares training runs (DeMo vs AdamW-DDP and variants) from their run folders.

Each folder holds the trainer's config.json (resolved config plus "_run": world size, code version...) and
metrics.jsonl (one JSON object per line: "train" steps, "val" losses, samples). This draws train and val
loss against steps, tokens, bytes sent per rank (log x) and training time, and prints a Markdown table:
final losses, bytes sent per rank, throughput and the share of step time spent in communication. Runs still
in progress (or cut off mid-line by a crash) are read up to their last complete line. A run whose metrics hold
a null or non-finite loss (or a "diverged" line: the trainer stops such a run with exit status 3) is reported
as diverged at its first such step, never as the mean of its finite losses; one that a stop signal or its time
limit ended (a "stopped" line after its last step) says so in its steps column; a field a run's lines lack is shown
as "—".

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
    """Returns (records, warnings). A last line without its newline that is not complete JSON is a run cut off
    mid-write and is dropped quietly; any other line that is not a JSON object is skipped with a warning."""
    try:
        with open(path, "r", encoding="utf-8", errors="replace") as f:
            text = f.read()
    except OSError as e:
        raise UserError(f"{path}: cannot read ({e.strerror or e.__class__.__name__})")
    torn = not text.endswith("\n")  # the last line is still being written (or the writer crashed)
    lines = text.split("\n")
    while lines and not lines[-1].strip():
        lines.pop()
    records, warnings = [], []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except (ValueError, RecursionError):
            if not (torn and number == len(lines)):
                warnings.append(f"{path}:{number}: not a JSON line, skipped")
            continue
        if isinstance(record, dict):
            records.append(record)
        else:
            warnings.append(f"{path}:{number}: not a JSON object, skipped")
    return records, warnings


def number(value, default=math.nan):
    """A metrics field as a float; null (how JSON writes a NaN loss) or junk gives `default`."""
    if isinstance(value, bool):
        return default
    try:
        return float(value)
    except (TypeError, ValueError, OverflowError):
        return default


def step_of(record):
    """A line's step as an int, or None when it is missing, not a whole number or not finite."""
    value = record.get("step")
    if isinstance(value, bool):
        return None
    if isinstance(value, float) and math.isfinite(value) and value == int(value):
        value = int(value)
    return value if isinstance(value, int) else None


def not_finite(record, key):
    """True when the line has the field and it is null (how JSON writes NaN and infinity) or not finite."""
    if key not in record:
        return False
    return not math.isfinite(number(record[key]))


def cumulative(records, key):
    """Running sum of a per-step field; all NaN when no line has the field (unknown, not zero)."""
    if not any(key in r for r in records):
        return [math.nan] * len(records)
    out, total = [], 0.0
    for r in records:
        x = number(r.get(key), 0.0)
        total += x if math.isfinite(x) else 0.0
        out.append(total)
    return out


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
        except (OSError, ValueError, RecursionError) as e:
            self.warnings.append(f"{config_path}: unreadable ({e.__class__.__name__}); settings unknown")
        if not isinstance(self.config, dict):
            self.warnings.append(f"{config_path}: not a JSON object; settings unknown")
            self.config = {}
        records, warnings = read_jsonl(metrics_path)
        self.warnings += warnings

        train, val = {}, {}
        self.diverged_step = None  # the first step with a non-finite loss, norm or val loss, or a "diverged" line
        diverged_at = []
        stops = []  # (step, why) of "stopped" lines: a stop signal or the time limit ended the run (or a part) there
        for r in records:
            kind = r.get("type")
            if kind not in ("train", "val", "diverged", "stopped"):
                continue
            step = step_of(r)
            if step is None:
                self.warnings.append(f"{metrics_path}: a {kind} line without a valid step, skipped")
                continue
            if kind == "train":
                train[step] = r
            elif kind == "val":
                val[step] = r
            elif kind == "stopped":
                stops.append((step, r.get("why") if isinstance(r.get("why"), str) else "no reason given"))
            else:
                diverged_at.append(step)
        self.train = [train[s] for s in sorted(train)]
        self.val = [val[s] for s in sorted(val)]
        diverged_at += [s for s in sorted(train) if not_finite(train[s], "loss") or not_finite(train[s], "grad_norm")]
        diverged_at += [s for s in sorted(val) if not_finite(val[s], "val_loss")]
        if diverged_at:
            self.diverged_step = min(diverged_at)
        if not self.train and not self.val:
            self.warnings.append(f"{metrics_path}: no train or val lines (yet)")
        # the run's last word, when it was a stop: no train or val line after it (a resumed run has them)
        last_step = max(list(train) + list(val), default=0)
        self.stopped = max(stops) if stops and max(stops)[0] >= last_step else None

        # Per train step: cumulative bytes this rank sent and cumulative step time (NaN when never logged).
        self.steps = sorted(train)
        self.loss = [number(r.get("loss")) for r in self.train]
        self.tokens = [number(r.get("tokens")) for r in self.train]
        self.bytes = cumulative(self.train, "bytes_sent")
        self.seconds = [ms / 1e3 for ms in cumulative(self.train, "step_ms")]
        # Val points take the train series' cumulative values at their step (the last train step <= it).
        self.val_steps = sorted(val)
        self.val_loss = [number(r.get("val_loss")) for r in self.val]
        self.val_tokens, self.val_bytes, self.val_seconds = [], [], []
        i = -1
        for step, r in zip(self.val_steps, self.val):
            while i + 1 < len(self.steps) and self.steps[i + 1] <= step:
                i += 1
            self.val_tokens.append(number(r.get("tokens"), self.tokens[i] if i >= 0 else math.nan))
            self.val_bytes.append(self.bytes[i] if i >= 0 else math.nan)
            self.val_seconds.append(self.seconds[i] if i >= 0 else math.nan)
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
        run = self.config.get("_run")
        size = run.get("world_size") if isinstance(run, dict) else None
        return size if isinstance(size, int) and not isinstance(size, bool) else None

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


def finite(values):
    return [x for x in values if math.isfinite(x)]


def summarize(run, last_n, target):
    """One table row (a dict of column -> text). What the run's lines do not hold stays "—"; a diverged run
    says so in the train loss column instead of a mean of its finite losses."""
    row = {k: MISSING for k in COLUMNS}
    row.update({"run": run.table_name, "settings": run.long_settings()})
    if target is not None:
        row.update({"to_steps": "not reached", "to_tokens": "not reached", "to_time": "not reached"})
        for i, loss in enumerate(run.val_loss):
            if loss <= target:  # (NaN never is)
                row["to_steps"] = str(run.val_steps[i])
                row["to_tokens"] = human_count(run.val_tokens[i]) if math.isfinite(run.val_tokens[i]) else MISSING
                row["to_time"] = human_seconds(run.val_seconds[i]) if math.isfinite(run.val_seconds[i]) else MISSING
                break
    if not run.train and not run.val:
        row.update({k: MISSING for k in TARGET_COLUMNS})
        return row
    planned = run.config.get("steps")
    done = max(run.steps[-1] if run.steps else 0, run.val_steps[-1] if run.val_steps else 0)
    planned_ok = isinstance(planned, int) and not isinstance(planned, bool)
    row["steps"] = f"{done}/{planned}" if planned_ok and done < planned else f"{done}"
    if run.stopped is not None:
        row["steps"] += f" (stopped: {run.stopped[1]})"
    tokens = finite(run.tokens + run.val_tokens)
    if tokens:
        row["tokens"] = human_count(max(tokens))
    if run.val:
        last = run.val_loss[-1]
        if not math.isfinite(last):
            row["val"] = "diverged"
        elif run.diverged_step is not None:
            row["val"] = f"{last:.4f} (step {run.val_steps[-1]}, before it diverged)"
        else:
            row["val"] = f"{last:.4f}"
    if run.diverged_step is not None:
        row["train"] = f"diverged at step {run.diverged_step}"
    else:
        tail = finite(run.loss[-last_n:])
        if tail:
            row["train"] = f"{statistics.fmean(tail):.4f}"
    if not run.train:
        return row
    n = len(run.train)
    if math.isfinite(run.bytes[-1]):
        row["mb"] = f"{run.bytes[-1] / 1e6:,.2f}"
        row["mb_step"] = f"{run.bytes[-1] / 1e6 / n:,.3f}"
    payload = finite(number(r.get("payload_bytes")) for r in run.train)
    if payload:
        row["payload_step"] = f"{sum(payload) / 1e6 / len(payload):,.3f}"
    rates = finite(number(r.get("tok_per_s")) for r in run.train)
    if rates:
        row["tok_s"] = f"{statistics.median(rates):,.0f}"
    step_ms = sum(finite(number(r.get("step_ms")) for r in run.train))
    comm = finite(number(r.get("comm_ms")) for r in run.train)
    if comm and step_ms > 0:
        row["comm"] = f"{100 * sum(comm) / step_ms:.1f}%"
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
        "rank's own bucket or gradient per step, the quantity the DeMo paper reports. comm share: total comm_ms / "
        "total step_ms. time: sum of step_ms (validation and checkpoints excluded). —: not in the run's metrics. "
        "diverged at step N: the first step whose loss, gradient norm or val loss was not finite (null). "
        "stopped: a stop signal or the time limit ended the run there (--resume auto continues it).",
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
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise UserError(f"{sys.executable} has no matplotlib (use /usr/bin/python3, or --no-plots)")

    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    written = []
    for file_name, quantity, axis_label, log_x in PLOTS:
        fig, (ax_train, ax_val) = plt.subplots(1, 2, figsize=(13, 4.8))
        scale, unit = 1.0, ""
        if quantity == "seconds":
            longest = max((r.seconds[-1] for r in runs if r.seconds and math.isfinite(r.seconds[-1])), default=0.0)
            scale, unit = (3600.0, "h") if longest >= 36000 else (60.0, "min") if longest >= 600 else (1.0, "s")
            axis_label += f" ({unit}, sum of step_ms)"
        skipped = []
        for index, run in enumerate(runs):
            color = colors[index % len(colors)]
            x_train, x_val = run.series(quantity)
            # Points whose x is unknown (a field the run never logged) or not on a log axis are left out.
            train = [(x / scale, y) for x, y in zip(x_train, run.loss) if math.isfinite(x) and not (log_x and x <= 0)]
            val = [(x / scale, y) for x, y in zip(x_val, run.val_loss) if math.isfinite(x) and not (log_x and x <= 0)]
            label = run.label + (f" (diverged at step {run.diverged_step})" if run.diverged_step is not None else "")
            if not train and not val:
                skipped.append(label)
                continue
            if train:
                xs, ys = zip(*train)
                if smooth > 1:
                    ax_train.plot(xs, ys, color=color, alpha=0.25, linewidth=0.8)
                    ax_train.plot(xs, moving_average(ys, smooth), color=color, linewidth=1.6, label=label)
                else:
                    ax_train.plot(xs, ys, color=color, linewidth=1.2, label=label)
            if val:
                xs, ys = zip(*val)
                ax_val.plot(xs, ys, "o-", color=color, markersize=3, linewidth=1.4, label=label)
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
        try:
            fig.savefig(path, dpi=110)
        except OSError as e:
            raise UserError(f"--out {out_dir}: cannot write {file_name} ({e.strerror or e.__class__.__name__})")
        finally:
            plt.close(fig)
        written.append(path)
    return written


# ---- main ------------------------------------------------------------------------------------------------

class ArgumentParser(argparse.ArgumentParser):
    """argparse with its usage errors on one line (the usage is in --help), exit status 2."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def parse_args(argv):
    p = ArgumentParser(
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
    if args.target_val_loss is not None and not math.isfinite(args.target_val_loss):
        p.error(f"--target-val-loss must be a finite number, got {args.target_val_loss}")
    if args.ylim is not None:
        low, high = args.ylim
        if not (math.isfinite(low) and math.isfinite(high) and low < high):
            p.error(f"--ylim needs two finite numbers LOW < HIGH, got {low:g} {high:g}")
    if args.labels is not None and len(args.labels.split(",")) != len(args.runs):
        p.error(f"--labels has {len(args.labels.split(','))} names for {len(args.runs)} runs")
    return args


def make_folders(wanted):
    """Creates the output folders [(flag, folder)], or raises UserError naming the flag, after removing the
    (empty) folders it created before the failure."""
    created = []
    try:
        for flag, folder in wanted:
            if os.path.exists(folder) and not os.path.isdir(folder):
                raise UserError(f"{flag} {folder}: exists and is not a folder")
            missing, up = [], os.path.abspath(folder)
            while not os.path.exists(up):
                missing.append(up)
                up = os.path.dirname(up)
            if not os.path.isdir(up):
                raise UserError(f"{flag} {folder}: {up} is not a folder")
            try:
                os.makedirs(folder, exist_ok=True)
            except OSError as e:
                raise UserError(f"{flag} {folder}: cannot create the folder ({e.strerror or e.__class__.__name__})")
            created += reversed(missing)
            if not os.access(folder, os.W_OK | os.X_OK):
                raise UserError(f"{flag} {folder}: not writable")
    except UserError:
        for folder in reversed(created):
            try:
                os.rmdir(folder)
            except OSError:
                pass
        raise


def main(argv):
    args = parse_args(argv)
    labels = args.labels.split(",") if args.labels is not None else None
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
    # Output places are made before anything is written, so a bad one leaves no table and no empty folder.
    folders = []
    if args.table:
        if os.path.isdir(args.table):
            raise UserError(f"--table {args.table}: is a folder (give a file name, e.g. table.md)")
        folders.append(("--table", os.path.dirname(os.path.abspath(args.table))))
    out_dir = None
    if not args.no_plots:
        out_dir = args.out or os.path.join(os.path.dirname(os.path.abspath(args.runs[0])), "compare")
        folders.append(("--out", out_dir))
    make_folders(folders)
    if args.table:
        try:
            with open(args.table, "w", encoding="utf-8") as f:
                f.write(table)
        except OSError as e:
            raise UserError(f"--table {args.table}: cannot write ({e.strerror or e.__class__.__name__})")
    sys.stdout.write(table)
    if out_dir is not None:
        for path in draw_plots(runs, out_dir, args.smooth, args.ylim):
            print(f"wrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except UserError as e:
        print(f"compare_runs.py: error: {e}", file=sys.stderr)
        sys.exit(1)
