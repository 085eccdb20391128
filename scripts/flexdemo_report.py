#!/usr/bin/python3
"""FlexDeMo study report: table and plots of a bandwidth_study.py run on hosts with several ranks each.

Reads STUDY/study.json (scripts/bandwidth_study.py --slots S with _s<S> settings) and writes, to --out, table.md
(per rate: time to the target val loss, host 0's eth0 bytes and the trainer's inter-host counters) and per
rate loss_vs_time.png and loss_vs_inter_bytes.png. The x axis of the second is host 0's eth0 tx bytes spread
evenly over the steps (every step sends the same), so it is what crossed the slow link, headers included.

  /usr/bin/python3 scripts/flexdemo_report.py runs/flexdemo_study --out docs/bandwidth_study/flexdemo
"""
import argparse
import json
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def time_to(run, target):
    """(seconds, step) of the first val point at or below target."""
    for loss, sec, step in zip(run.get("val_loss") or [], run.get("val_seconds") or [], run.get("val_steps") or []):
        if loss is not None and loss <= target:
            return sec, step
    return None, None


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("study", help="folder with study.json")
    p.add_argument("--out", required=True, help="folder for table.md and the plots")
    args = p.parse_args(argv)
    with open(os.path.join(args.study, "study.json")) as f:
        study = json.load(f)
    slots = study["args"]["slots"]
    os.makedirs(args.out, exist_ok=True)
    lines = []
    for rate, r in study["rates"].items():
        runs = [s for s in r["runs"] if s.get("steps")]
        target = r["target_val_loss"]
        base = time_to(runs[0], target)[0] if runs else None
        lines += [f"### {rate} per link", "",
                  "| setting | final val | time to val ≤ %.4f (s) | step | vs first row | step ms (median) | comm share "
                  "| h0 eth0 tx MB | h0 eth0 tx MB/step | rank 0 inter-host counter MB/step | rank 0 intra MB/step |"
                  % target, "|---|---|---|---|---|---|---|---|---|---|---|"]
        fig_t, ax_t = plt.subplots(figsize=(6.5, 4.5))
        fig_b, ax_b = plt.subplots(figsize=(6.5, 4.5))
        for s in runs:
            t, step = time_to(s, target)
            metrics = [json.loads(x) for x in open(os.path.join(s["out_dir"], "metrics.jsonl"))]
            train = [m for m in metrics if m.get("type") == "train"]
            inter = sum(m.get("bytes_sent_inter", 0) for m in train) / len(train) / 1e6
            intra = sum(m.get("bytes_sent_intra", 0) for m in train) / len(train) / 1e6
            tx = s.get("iface_h0_tx_bytes") or 0
            lines.append("| %s | %.4f | %s | %s | %s | %.0f | %.1f%% | %.1f | %.2f | %.3f | %.3f |" % (
                s["label"], s["final_val_loss"], "%.1f" % t if t else "not reached", step or "—",
                "%.2fx" % (base / t) if t and base else "—", s["step_ms_median"], 100 * s["comm_fraction"],
                tx / 1e6, tx / 1e6 / s["steps"], inter, intra))
            style = "-" if s["setting"].startswith("adamw") else "--"
            ax_t.plot(s["val_seconds"], s["val_loss"], style, marker="o", markersize=3, label=s["label"])
            per_step = tx / s["steps"] / 1e6
            ax_b.plot([st * per_step for st in s["val_steps"]], s["val_loss"], style, marker="o", markersize=3,
                      label=s["label"])
        for ax, fig, xlabel, name in ((ax_t, fig_t, "seconds (sum of step_ms)", "loss_vs_time"),
                                      (ax_b, fig_b, "MB sent by host 0 over its slow link (eth0)", "loss_vs_inter_bytes")):
            ax.axhline(target, color="gray", linewidth=0.8, linestyle=":")
            if name == "loss_vs_inter_bytes":
                ax.set_xscale("log")
            ax.set_xlabel(xlabel)
            ax.set_ylabel("val loss")
            ax.set_title(f"{len(runs) and study['args']['hosts']} hosts x {slots} ranks, {rate} (dotted: target)")
            ax.grid(True, alpha=0.3)
            ax.legend(fontsize=8)
            fig.tight_layout()
            fig.savefig(os.path.join(args.out, f"{rate}_{name}.png"), dpi=110)
            plt.close(fig)
        lines += ["", f"![loss vs time at {rate}]({rate}_loss_vs_time.png) "
                  f"![loss vs inter-host bytes at {rate}]({rate}_loss_vs_inter_bytes.png)", ""]
    with open(os.path.join(args.out, "table.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
