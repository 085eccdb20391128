#!/usr/bin/env python3
"""Figures of --demo_diagnostics runs: every measure of the "diagnostics" lines of each run's metrics.jsonl against the
step, one panel per tensor group, and the energy compaction of the DCT, the raw entries and a random orthogonal basis
side by side (docs/conjectures.md explains the measures).

    scripts/plot_diagnostics.py RUN_DIR [RUN_DIR...] --out DIR

Writes DIR/energy.png, DIR/temporal.png, DIR/agreement.png, DIR/residual.png and DIR/table.md (the numbers at a few
steps). Needs matplotlib (Agg backend, no display)."""
import argparse
import json
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

FIGURES = {
    "energy": ["energy_topk_dct", "energy_topk_raw", "energy_topk_random"],
    "temporal": ["persistence", "tvar_sent", "tvar_residual"],
    "agreement": ["jaccard", "cos_sent", "cos_residual"],
    "residual": ["residual_ratio"],
}


def read_run(run):
    path = os.path.join(run, "metrics.jsonl") if os.path.isdir(run) else run
    if not os.path.exists(path):
        sys.exit(f"error: {path}: no metrics.jsonl")
    lines = []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line.startswith("{") and '"diagnostics"' in line:
                d = json.loads(line)
                if d.get("type") == "diagnostics":
                    lines.append(d)
    if not lines:
        sys.exit(f"error: {path}: no diagnostics lines (run with --demo_diagnostics N)")
    return lines


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    runs = {os.path.basename(os.path.normpath(r)): read_run(r) for r in args.runs}
    groups = sorted({g for lines in runs.values() for d in lines for g in d["groups"]})
    for name, fields in FIGURES.items():
        fig, axes = plt.subplots(1, len(groups), figsize=(4 * len(groups), 3.4), squeeze=False)
        for ax, group in zip(axes[0], groups):
            for run, lines in runs.items():
                for field in fields:
                    pts = [(d["step"], d["groups"][group][field]) for d in lines
                           if group in d["groups"] and field in d["groups"][group]]
                    if pts:
                        label = field if len(runs) == 1 else f"{run}: {field}"
                        ax.plot(*zip(*pts), marker=".", label=label)
            ax.set_title(group)
            ax.set_xlabel("step")
            ax.grid(alpha=0.3)
        axes[0][0].legend(fontsize=7)
        fig.suptitle(name + " (" + ", ".join(runs) + ")", fontsize=9)
        fig.tight_layout()
        fig.savefig(os.path.join(args.out, name + ".png"), dpi=90)
        plt.close(fig)
    # the numbers at the first, middle and last diagnostics step of each run
    fields = [f for fs in FIGURES.values() for f in fs]
    with open(os.path.join(args.out, "table.md"), "w") as f:
        for run, lines in runs.items():
            picks = sorted({0, len(lines) // 2, len(lines) - 1})
            f.write(f"{run}\n\n| step | group | " + " | ".join(fields) + " |\n")
            f.write("|---" * (len(fields) + 2) + "|\n")
            for i in picks:
                d = lines[i]
                for group in groups:
                    g = d["groups"].get(group, {})
                    cells = [f"{g[k]:.3f}" if k in g else "" for k in fields]
                    f.write(f"| {d['step']} | {group} | " + " | ".join(cells) + " |\n")
            f.write("\n")
    print(f"wrote {', '.join(n + '.png' for n in FIGURES)} and table.md in {args.out}")


if __name__ == "__main__":
    main()
