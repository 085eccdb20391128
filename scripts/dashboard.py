#!/usr/bin/python3
"""A self-contained HTML dashboard of one run or a comparison of runs, openable from disk (no server, no network).

Reads each run folder's metrics.jsonl and config.json (as the trainers write them) and writes one page with
inline data and script: train and val loss, learning rate, bytes sent per step by link (within a node / across
nodes), the step-time breakdown (compute and the optimizer's phases), and every "diagnostics" line's numbers,
plus a summary of each run (optimizer, progress, last losses, status). One run: RUN/dashboard.html; several:
--out (default: dashboard.html beside the first run folder).

With --watch SECONDS the page is rewritten every SECONDS until every run is over (its last planned step
logged, or a "diverged" or "stopped" line), or until the process --pid names exits; while the runs go, the page
reloads itself every SECONDS in the browser. Each write replaces the page atomically, so a reload never sees
half a page.

  /usr/bin/python3 scripts/dashboard.py out/small                         # out/small/dashboard.html
  /usr/bin/python3 scripts/dashboard.py --watch 10 out/small &            # beside a running trainer
  /usr/bin/python3 scripts/dashboard.py runs/methods/adamw_lr0.004 runs/methods/demo_k32_lr0.002 --out cmp.html
"""
import argparse
import html
import json
import math
import os
import sys
import time


class UserError(Exception):
    """A problem with the input, reported as one line and exit status 1."""


def clean(x):
    """x as strict JSON: non-finite floats become null (a diverged step shows as a gap)."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: clean(v) for k, v in x.items()}
    if isinstance(x, list):
        return [clean(v) for v in x]
    return x


def read_run(folder):
    path = os.path.join(folder, "metrics.jsonl")
    if not os.path.isfile(path):
        raise UserError(f"{folder}: no metrics.jsonl (not a run folder?)")
    config = {}
    try:
        with open(os.path.join(folder, "config.json"), encoding="utf-8") as f:
            config = json.load(f)
    except (OSError, ValueError):
        pass
    train, val, diag, events = {}, {}, [], []
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            try:
                r = json.loads(line, parse_constant=lambda c: None)  # NaN / Infinity: a diverged value
            except ValueError:
                continue  # a line being written (or cut off by a crash)
            if not isinstance(r, dict) or not isinstance(r.get("step"), int):
                continue
            kind = r.get("type")
            if kind == "train":
                train[r["step"]] = r  # a resumed run may repeat steps: the last line wins
            elif kind == "val":
                val[r["step"]] = r
            elif kind == "diagnostics":
                diag.append(r)
            elif kind in ("diverged", "stopped"):
                events.append({"type": kind, "step": r["step"], "why": r.get("why")})
    t = [train[s] for s in sorted(train)]
    opt_phases = sorted({k for r in t for k, v in (r.get("opt_ms") or {}).items() if isinstance(v, (int, float))})

    def col(key):
        return [r.get(key) for r in t]

    planned = config.get("steps") if isinstance(config.get("steps"), int) else None
    last = max(list(train) + list(val), default=0)
    status = "running"
    if events:
        status = events[-1]["type"]
    elif planned is not None and last >= planned:
        status = "finished"
    return clean({
        "name": os.path.basename(os.path.normpath(os.path.abspath(folder))),
        "optimizer": config.get("optimizer"), "lr_peak": config.get("lr"), "planned": planned,
        "world_size": (config.get("_run") or {}).get("world_size") if isinstance(config.get("_run"), dict) else None,
        "status": status, "events": events,
        "step": sorted(train), "loss": col("loss"), "lr": col("lr"), "step_ms": col("step_ms"),
        "compute_ms": col("compute_ms"), "comm_ms": col("comm_ms"), "tokens": col("tokens"),
        "bytes_intra": col("bytes_sent_intra"), "bytes_inter": col("bytes_sent_inter"), "bytes_sent": col("bytes_sent"),
        "opt_ms": {p: [(r.get("opt_ms") or {}).get(p) for r in t] for p in opt_phases},
        "val_step": sorted(val), "val_loss": [val[s].get("val_loss") for s in sorted(val)],
        "diagnostics": diag,
    })


PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">{refresh}
<title>{title}</title>
<style>
body {{ font: 14px system-ui, sans-serif; margin: 1.5em; color: #222; }}
h1 {{ font-size: 1.3em; }} h2 {{ font-size: 1.05em; margin: 1.2em 0 0.3em; }}
table {{ border-collapse: collapse; }} td, th {{ border: 1px solid #ccc; padding: 2px 8px; text-align: right; }}
th:first-child, td:first-child {{ text-align: left; }}
.charts {{ display: flex; flex-wrap: wrap; gap: 12px; }} .chart {{ border: 1px solid #ddd; }}
#errors {{ color: #b00; white-space: pre-wrap; }} .note {{ color: #666; }}
</style></head>
<body>
<h1>{title}</h1>
<p class="note">Written {written} by scripts/dashboard.py{live}.</p>
<div id="errors"></div>
<div id="summary"></div>
<div class="charts" id="charts"></div>
<script type="application/json" id="data">{data}</script>
<script>
{script}
</script>
</body></html>
"""

SCRIPT = r"""
"use strict";
window.onerror = function (msg, src, line) {
  document.getElementById("errors").textContent += "script error: " + msg + " (line " + line + ")\n";
  document.body.setAttribute("data-render", "error");
};
const COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"];
const SVGNS = "http://www.w3.org/2000/svg";
function el(name, attrs, parent) {
  const e = document.createElementNS(SVGNS, name);
  for (const k in attrs) e.setAttribute(k, attrs[k]);
  if (parent) parent.appendChild(e);
  return e;
}
function fmt(v) {
  const a = Math.abs(v);
  if (a !== 0 && (a >= 1e5 || a < 1e-3)) return v.toExponential(1);
  return +v.toPrecision(4) + "";
}
function ticks(lo, hi, log) {
  if (log) {
    const out = [];
    for (let e = Math.floor(Math.log10(lo)); e <= Math.ceil(Math.log10(hi)); e++) out.push(Math.pow(10, e));
    const inside = out.filter(t => t >= lo / 1.0001 && t <= hi * 1.0001);
    return inside.length >= 2 ? inside : [lo, hi];  // less than a decade: label the ends
  }
  const span = hi - lo || 1, step = Math.pow(10, Math.floor(Math.log10(span / 5)));
  const s = [1, 2, 5, 10].map(m => m * step).find(m => span / m <= 6);
  const out = [];
  for (let t = Math.ceil(lo / s) * s; t <= hi + 1e-9 * span; t += s) out.push(t);
  return out;
}
// series: [{name, x: [...], y: [...], dots}]; null or non-finite y (or y <= 0 on a log axis) leaves a gap.
function chart(title, series, opts) {
  opts = opts || {};
  const W = 460, H = 280, L = 62, R = 12, T = 26, B = 40;
  const box = document.createElement("div");
  box.className = "chart";
  const svg = el("svg", {width: W, height: H, "data-title": title}, null);
  box.appendChild(svg);
  el("text", {x: W / 2, y: 16, "text-anchor": "middle", "font-weight": "bold"}, svg).textContent = title;
  const ok = (v, log) => v !== null && isFinite(v) && (!log || v > 0);
  let xs = [], ys = [];
  series.forEach(s => s.x.forEach((x, i) => { if (ok(x, false) && ok(s.y[i], opts.logy)) { xs.push(x); ys.push(s.y[i]); } }));
  const counts = [];
  if (!ys.length) {
    el("text", {x: W / 2, y: H / 2, "text-anchor": "middle", fill: "#888"}, svg).textContent = "no data yet";
    svg.setAttribute("data-series", "");
    document.getElementById("charts").appendChild(box);
    return;
  }
  let x0 = Math.min(...xs), x1 = Math.max(...xs), y0 = Math.min(...ys), y1 = Math.max(...ys);
  if (x0 === x1) { x0 -= 1; x1 += 1; }
  if (y0 === y1) { y0 = opts.logy ? y0 / 2 : y0 - 1; y1 = opts.logy ? y1 * 2 : y1 + 1; }
  const ly = v => Math.log10(v);
  const px = x => L + (x - x0) / (x1 - x0) * (W - L - R);
  const py = y => opts.logy ? T + (ly(y1) - ly(y)) / (ly(y1) - ly(y0)) * (H - T - B)
                            : T + (y1 - y) / (y1 - y0) * (H - T - B);
  el("rect", {x: L, y: T, width: W - L - R, height: H - T - B, fill: "none", stroke: "#999"}, svg);
  ticks(x0, x1, false).forEach(t => {
    el("line", {x1: px(t), x2: px(t), y1: H - B, y2: H - B + 4, stroke: "#999"}, svg);
    el("text", {x: px(t), y: H - B + 16, "text-anchor": "middle", "font-size": 11}, svg).textContent = fmt(t);
  });
  ticks(y0, y1, !!opts.logy).forEach(t => {
    el("line", {x1: L, x2: W - R, y1: py(t), y2: py(t), stroke: "#eee"}, svg);
    el("text", {x: L - 4, y: py(t) + 4, "text-anchor": "end", "font-size": 11}, svg).textContent = fmt(t);
  });
  el("text", {x: (L + W - R) / 2, y: H - 6, "text-anchor": "middle", "font-size": 12}, svg).textContent = opts.xlabel || "step";
  if (opts.ylabel) el("text", {x: 12, y: H / 2, transform: "rotate(-90 12 " + H / 2 + ")", "text-anchor": "middle", "font-size": 12}, svg).textContent = opts.ylabel;
  series.forEach((s, k) => {
    const color = s.color || COLORS[k % COLORS.length];
    let d = "", pen = false, n = 0;
    s.x.forEach((x, i) => {
      const y = s.y[i];
      if (!ok(x, false) || !ok(y, opts.logy)) { pen = false; return; }
      n++;
      if (s.dots) el("circle", {cx: px(x), cy: py(y), r: 2.5, fill: color}, svg);
      else { d += (pen ? "L" : "M") + px(x).toFixed(1) + " " + py(y).toFixed(1); pen = true; }
    });
    if (d) el("path", {d: d, fill: "none", stroke: color, "stroke-width": 1.5, "stroke-dasharray": s.dash || ""}, svg);
    counts.push(s.name + ":" + n);
    el("text", {x: L + 6, y: T + 14 + 13 * k, fill: color, "font-size": 11}, svg).textContent = s.name;
  });
  svg.setAttribute("data-series", counts.join(";"));
  document.getElementById("charts").appendChild(box);
}
function table(head, rows) {
  const t = document.createElement("table");
  const tr = t.insertRow();
  head.forEach(h => { const th = document.createElement("th"); th.textContent = h; tr.appendChild(th); });
  rows.forEach(r => { const row = t.insertRow(); r.forEach(c => { row.insertCell().textContent = c; }); });
  return t;
}
function median(a) {
  const v = a.filter(x => x !== null && isFinite(x)).sort((p, q) => p - q);
  return v.length ? v[Math.floor(v.length / 2)] : null;
}
function last(a) { for (let i = a.length - 1; i >= 0; i--) if (a[i] !== null) return a[i]; return null; }
function render(runs) {
  const many = runs.length > 1, tag = (r, what) => many ? r.name + " " + what : what;
  const summary = document.getElementById("summary");
  summary.appendChild(table(["run", "optimizer", "peak lr", "ranks", "steps", "status", "last loss", "last val loss", "MB sent"],
    runs.map(r => [r.name, r.optimizer || "?", r.lr_peak === null ? "?" : fmt(r.lr_peak), r.world_size || "?",
                   (r.step.length ? r.step[r.step.length - 1] : 0) + (r.planned ? "/" + r.planned : ""),
                   r.status + (r.events.length ? " at step " + r.events[r.events.length - 1].step : ""),
                   last(r.loss) === null ? "—" : last(r.loss).toFixed(4),
                   last(r.val_loss) === null ? "—" : last(r.val_loss).toFixed(4),
                   (r.bytes_sent.reduce((a, b) => a + (b || 0), 0) / 1e6).toFixed(2)])));
  const loss = [];
  runs.forEach((r, k) => {
    const c = COLORS[k % COLORS.length];
    loss.push({name: tag(r, "train"), x: r.step, y: r.loss, color: c});
    loss.push({name: tag(r, "val"), x: r.val_step, y: r.val_loss, color: c, dots: true});
  });
  chart("loss", loss, {ylabel: "loss"});
  chart("learning rate", runs.map(r => ({name: tag(r, "lr"), x: r.step, y: r.lr})), {ylabel: "lr"});
  const bytes = [];
  runs.forEach((r, k) => {
    const c = COLORS[k % COLORS.length];
    bytes.push({name: tag(r, "across nodes"), x: r.step, y: r.bytes_inter, color: c});
    bytes.push({name: tag(r, "within a node"), x: r.step, y: r.bytes_intra, color: c, dash: "4 3"});
  });
  chart("bytes sent per step, by link", bytes, {ylabel: "bytes", logy: true});
  if (many) {
    chart("step time", runs.map(r => ({name: r.name, x: r.step, y: r.step_ms})), {ylabel: "ms"});
  } else {
    const r = runs[0], phases = [{name: "step", x: r.step, y: r.step_ms}, {name: "compute", x: r.step, y: r.compute_ms},
                                 {name: "comm", x: r.step, y: r.comm_ms}];
    for (const p in r.opt_ms) phases.push({name: "opt " + p, x: r.step, y: r.opt_ms[p], dash: "4 3"});
    chart("step-time breakdown", phases, {ylabel: "ms", logy: true});
  }
  const phaseNames = [...new Set(runs.flatMap(r => Object.keys(r.opt_ms)))];
  const h2 = document.createElement("h2");
  h2.textContent = "median ms per step";
  summary.appendChild(h2);
  summary.appendChild(table(["run", "step", "compute", "comm"].concat(phaseNames),
    runs.map(r => [r.name].concat([r.step_ms, r.compute_ms, r.comm_ms].concat(phaseNames.map(p => r.opt_ms[p] || []))
                                  .map(a => { const m = median(a); return m === null ? "—" : m.toFixed(1); })))));
  // diagnostics: one chart per numeric field (nested objects flattened to a.b), one series per run
  const fields = {};
  runs.forEach(r => r.diagnostics.forEach(d => {
    (function walk(obj, prefix) {
      for (const k in obj) {
        if (prefix === "" && (k === "type" || k === "step")) continue;
        const v = obj[k], key = prefix + k;
        if (v !== null && typeof v === "object" && !Array.isArray(v)) walk(v, key + ".");
        else if (typeof v === "number") { (fields[key] = fields[key] || {})[r.name] = (fields[key][r.name] || []).concat([[d.step, v]]); }
      }
    })(d, "");
  }));
  Object.keys(fields).sort().forEach(f => chart("diagnostics: " + f,
    Object.keys(fields[f]).map(name => ({name: many ? name : f, x: fields[f][name].map(p => p[0]), y: fields[f][name].map(p => p[1])})),
    {ylabel: f}));
  document.body.setAttribute("data-render", document.body.getAttribute("data-render") || "ok");
}
render(JSON.parse(document.getElementById("data").textContent));
"""


def write_page(folders, out, refresh_seconds):
    runs = [read_run(f) for f in folders]
    title = "run " + runs[0]["name"] if len(runs) == 1 else "runs: " + ", ".join(r["name"] for r in runs)
    live = refresh_seconds is not None and any(r["status"] == "running" for r in runs)
    data = json.dumps(runs, separators=(",", ":"), allow_nan=False).replace("</", "<\\/")
    page = PAGE.format(
        refresh=f'\n<meta http-equiv="refresh" content="{refresh_seconds:g}">' if live else "",
        title=html.escape(title), written=time.strftime("%Y-%m-%d %H:%M:%S"),
        live=f"; reloads every {refresh_seconds:g} s while the run goes" if live else "", data=data, script=SCRIPT)
    tmp = f"{out}.tmp{os.getpid()}"
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(page)
        os.replace(tmp, out)
    except OSError as e:
        raise UserError(f"{out}: cannot write ({e.strerror or e.__class__.__name__})")
    return runs


def alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0], epilog=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("runs", nargs="+", metavar="RUN_DIR", help="run folders (the trainer's out_dir)")
    p.add_argument("--out", metavar="FILE.html", help="the page [RUN_DIR/dashboard.html for one run, else beside them]")
    p.add_argument("--watch", type=float, metavar="SECONDS", help="rewrite every SECONDS until the runs are over")
    p.add_argument("--pid", type=int, help="with --watch: also stop when this process (the trainer) exits")
    args = p.parse_args(argv)
    if args.watch is not None and not args.watch > 0:
        raise UserError(f"--watch must be a positive number of seconds, got {args.watch:g}")
    for f in args.runs:
        if not os.path.isdir(f):
            raise UserError(f"{f}: no such run folder")
    out = args.out or (os.path.join(args.runs[0], "dashboard.html") if len(args.runs) == 1 else
                       os.path.join(os.path.dirname(os.path.abspath(args.runs[0])), "dashboard.html"))
    if os.path.isdir(out):
        raise UserError(f"--out {out}: is a folder (give a file name)")
    while True:
        if args.watch is not None and all(os.path.isfile(os.path.join(f, "metrics.jsonl")) is False for f in args.runs):
            time.sleep(args.watch)  # the trainer has not written its first line yet
            if args.pid is None or alive(args.pid):
                continue
        process_over = args.pid is not None and not alive(args.pid)
        runs = write_page(args.runs, out, None if process_over else args.watch)
        over = all(r["status"] != "running" for r in runs)
        if args.watch is None or over or process_over:
            break
        time.sleep(args.watch)
    print(f"wrote {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except UserError as e:
        print(f"dashboard.py: error: {e}", file=sys.stderr)
        sys.exit(1)
