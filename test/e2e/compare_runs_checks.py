"""Checks of scripts/compare_runs.py on hand-made run folders (run by test/e2e/test_compare_runs.sh).

Three synthetic runs with known numbers: a finished AdamW run (4 ranks), a DeMo run still in progress whose
metrics end in a torn line and hold one corrupt line in the middle, and a single-rank run that sent no bytes,
has no validation yet and logged one NaN loss (JSON null), so it diverged. The expected table values are computed
here from the same lists that were written, not by the script's code; PNGs are checked for signature, header and
size. Then edge cases: diverged runs (the trainer's "diverged" line, a null val loss), a run with only val lines,
an empty metrics.jsonl, lines without the optional fields, a bad complete last line, damaged config.json and
steps; bad arguments and output places must give a one-line error, a non-zero exit and no traceback. Failures
are collected and reported together.
"""
import json
import os
import re
import shutil
import statistics
import struct
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "scripts", "compare_runs.py")
TMP = os.path.join(ROOT, "build", "test-tmp", "compare_runs")
PYTHON = "/usr/bin/python3"
failures = []


def check(cond, what):
    print(("ok    " if cond else "FAIL  ") + what, flush=True)
    if not cond:
        failures.append(what)


def config(optimizer, world, steps, **extra):
    c = {"num_layers": 2, "num_heads": 4, "channels": 64, "optimizer": optimizer, "steps": steps, "lr": 4e-4,
         "weight_decay": 0.1 if optimizer == "adamw" else 0.0, "beta1": 0.9, "beta2": 0.95,
         "demo_decay": 0.999, "demo_topk": 32, "demo_chunk": 64, "demo_momentum": "lr", "demo_alpha": 1.0,
         "demo_values": "fp32", "demo_indices": "auto"}
    c.update(extra)
    c["_run"] = {"code_version": "test", "trainer": "train_gpt_cpu", "world_size": world, "grad_accum_steps": 1,
                 "tokens_per_step": 4096, "argv": []}
    return c


def train_line(step, loss, step_ms, comm_ms, bytes_sent):
    return {"type": "train", "step": step, "loss": loss, "lr": 4e-4, "grad_norm": 1.0, "tokens": step * 4096,
            "step_ms": step_ms, "compute_ms": step_ms - comm_ms, "comm_ms": comm_ms,
            "tok_per_s": 4096 / (step_ms / 1e3), "bytes_sent": bytes_sent, "bytes_recv": bytes_sent,
            "payload_bytes": bytes_sent // 3, "cum_bytes_sent": 0,
            "opt_ms": {"clip": 0, "transform": 0, "topk": 0, "exchange": 0, "apply": 0}}


def make_run(name, cfg, train, val, tail=""):
    """Writes a run folder; `train` is a list of train_line args, `val` of (step, val_loss)."""
    folder = os.path.join(TMP, name)
    os.makedirs(folder)
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    lines = [json.dumps(train_line(*t)) for t in train]
    for step, loss in val:  # after the train line of its step, as the trainer writes it
        index = next(i for i, t in enumerate(train) if t[0] == step)
        lines.insert(index + 1 + sum(1 for s, _ in val if s < step),
                     json.dumps({"type": "val", "step": step, "val_loss": loss, "tokens": step * 4096}))
    with open(os.path.join(folder, "metrics.jsonl"), "w") as f:
        f.write("\n".join(lines) + "\n" + tail)
    return folder


# ---- the synthetic runs and what the table must say about them -------------------------------------------
shutil.rmtree(TMP, ignore_errors=True)
os.makedirs(TMP)

adamw_train = [(s, 5.0 - 0.05 * s, 100.0 + s, 20.0, 1_000_000 + 1000 * s) for s in range(1, 41)]
adamw_val = [(s, 5.1 - 0.05 * s) for s in (10, 20, 30, 40)]
adamw = make_run("adamw_np4", config("adamw", 4, 40), adamw_train, adamw_val)

demo_train = [(s, 6.0 - 0.04 * s, 50.0 + 2 * (s % 3), 2.0 + s % 2, 10_000 + s) for s in range(1, 31)]
demo_val = [(s, 6.2 - 0.04 * s) for s in (10, 20, 30)]
demo = make_run("demo_k8", config("demo", 4, 50, demo_topk=8, demo_values="bf16"), demo_train, demo_val,
                tail='{"type": "train", "step": 31, "loss": 4.7, "lr"')  # torn mid-write
with open(os.path.join(demo, "metrics.jsonl")) as f:
    lines = f.read().split("\n")
lines.insert(5, "{this line is corrupt")  # a damaged line in the middle is skipped with a warning
with open(os.path.join(demo, "metrics.jsonl"), "w") as f:
    f.write("\n".join(lines))

single_train = [(s, 7.0 - 0.1 * s if s != 3 else None, 30.0, 0.0, 0) for s in range(1, 6)]  # null = a NaN loss
single = make_run("single_rank", config("adamw", 1, 100), single_train, [])

LAST = 5
TARGET = 4.5


def expected(train, val, planned, target):
    """The table values computed from the written lists."""
    steps_done = train[-1][0]
    step_ms = [t[2] for t in train]
    e = {
        "steps": f"{steps_done}/{planned}" if steps_done < planned else str(steps_done),
        "tokens": steps_done * 4096,
        "train": next((f"diverged at step {t[0]}" for t in train if t[1] is None), None)
        or statistics.fmean(t[1] for t in train[-LAST:]),
        "val": val[-1][1] if val else None,
        "mb": sum(t[4] for t in train) / 1e6,
        "mb_step": sum(t[4] for t in train) / 1e6 / len(train),
        "payload_step": sum(t[4] // 3 for t in train) / 1e6 / len(train),
        "tok_s": statistics.median(4096 / (ms / 1e3) for ms in step_ms),
        "comm": 100 * sum(t[3] for t in train) / sum(step_ms),
    }
    reached = [(s, v) for s, v in val if v <= target]
    if reached:
        s = reached[0][0]
        e["to_steps"], e["to_tokens"] = s, s * 4096
        e["to_time"] = sum(t[2] for t in train if t[0] <= s) / 1e3
    return e


EXPECTED = {
    "adamw_np4": expected(adamw_train, adamw_val, 40, TARGET),
    "demo_k8": expected(demo_train, demo_val, 50, TARGET),
    "single_rank": expected(single_train, [], 100, TARGET),
}


# ---- parsing the script's output --------------------------------------------------------------------------
def parse_count(text):
    m = re.fullmatch(r"([0-9.]+)([kMBT]?)", text)
    return float(m.group(1)) * {"": 1, "k": 1e3, "M": 1e6, "B": 1e9, "T": 1e12}[m.group(2)]


def parse_seconds(text):
    m = re.fullmatch(r"(?:(\d+)h)?(?:(\d+)m)?(?:([0-9.]+)s)?", text)
    h, mnt, s = (float(g) if g else 0.0 for g in m.groups())
    return 3600 * h + 60 * mnt + s


def parse_table(text):
    rows = [line for line in text.splitlines() if line.startswith("|")]
    split = lambda line: [cell.strip() for cell in line.strip("|").split("|")]
    headers = split(rows[0])
    return headers, {cells[0]: dict(zip(headers, cells)) for cells in map(split, rows[2:])}


def close(text, value, tolerance):
    try:
        return abs(float(text.replace(",", "").rstrip("%")) - value) <= tolerance
    except ValueError:
        return False


def run_script(*args):
    return subprocess.run([PYTHON, SCRIPT, *args], capture_output=True, text=True, timeout=120)


# ---- the main comparison ----------------------------------------------------------------------------------
out = os.path.join(TMP, "plots")
table_file = os.path.join(TMP, "table.md")
p = run_script(adamw, demo, single, "--out", out, "--table", table_file, "--last", str(LAST), "--smooth", "3",
               "--target-val-loss", str(TARGET))
check(p.returncode == 0, f"three runs compare with exit 0 (got {p.returncode}: {p.stderr.strip()[-500:]})")
check("not a JSON line" in p.stderr and p.stderr.count("not a JSON line") == 1,
      "the corrupt middle line gets one warning, the torn last line none")

for name in ("loss_vs_step.png", "loss_vs_tokens.png", "loss_vs_bytes_sent.png", "loss_vs_time.png"):
    path = os.path.join(out, name)
    ok = os.path.isfile(path)
    if ok:
        with open(path, "rb") as f:
            data = f.read()
        width, height = struct.unpack(">II", data[16:24]) if len(data) >= 24 else (0, 0)
        ok = (data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR" and data.rstrip(b"\0")[-8:-4] == b"IEND"
              and len(data) > 10_000 and width >= 600 and height >= 300)
    check(ok, f"{name}: a valid PNG of non-trivial size")

table_text = open(table_file).read() if os.path.isfile(table_file) else ""
check(table_text != "" and table_text == p.stdout, "--table writes the same table as printed")
headers, rows = parse_table(p.stdout)
check(set(rows) == set(EXPECTED), f"one row per run, named by folder ({sorted(rows)})")
col = {h: h for h in headers}
find = lambda prefix: next((h for h in headers if h.startswith(prefix)), None)
for name, e in EXPECTED.items():
    r = rows.get(name)
    if r is None:
        continue
    check(r[find("steps")] == e["steps"], f"{name}: steps {r[find('steps')]} == {e['steps']}")
    check(abs(parse_count(r[find("tokens")]) - e["tokens"]) <= 0.005 * e["tokens"],
          f"{name}: tokens {r[find('tokens')]} ~ {e['tokens']}")
    if isinstance(e["train"], str):
        check(r[find("train loss")] == e["train"], f"{name}: train loss '{r[find('train loss')]}' == '{e['train']}'")
    else:
        check(close(r[find("train loss")], e["train"], 6e-5),
              f"{name}: train loss (last {LAST}) {r[find('train loss')]} == {e['train']:.5f}")
    if e["val"] is None:
        check(r[find("val loss")] == "—", f"{name}: no val loss shown as a dash")
    else:
        check(close(r[find("val loss")], e["val"], 6e-5), f"{name}: val loss {r[find('val loss')]} == {e['val']:.5f}")
    check(close(r[find("MB sent")], e["mb"], 0.006), f"{name}: MB sent/rank {r[find('MB sent')]} == {e['mb']:.4f}")
    check(close(r[find("MB/step")], e["mb_step"], 0.0006),
          f"{name}: MB/step {r[find('MB/step')]} == {e['mb_step']:.5f}")
    check(close(r[find("payload MB/step")], e["payload_step"], 0.0006),
          f"{name}: payload MB/step {r[find('payload MB/step')]} == {e['payload_step']:.5f}")
    check(close(r[find("tok/s")], e["tok_s"], 0.6), f"{name}: median tok/s {r[find('tok/s')]} == {e['tok_s']:.1f}")
    check(close(r[find("comm")], e["comm"], 0.06), f"{name}: comm share {r[find('comm')]} == {e['comm']:.2f}%")
    if "to_steps" in e:
        check(r[find("steps to val")] == str(e["to_steps"]), f"{name}: steps to val <= {TARGET}: "
              f"{r[find('steps to val')]} == {e['to_steps']}")
        check(abs(parse_count(r[find("tokens to val")]) - e["to_tokens"]) <= 0.005 * e["to_tokens"],
              f"{name}: tokens to val <= {TARGET}: {r[find('tokens to val')]} ~ {e['to_tokens']}")
        check(abs(parse_seconds(r[find("time to val")]) - e["to_time"]) <= 0.051,
              f"{name}: time to val <= {TARGET}: {r[find('time to val')]} ~ {e['to_time']:.2f}s")
    else:
        check(r[find("steps to val")] == "not reached", f"{name}: target never reached says so")
settings = {name: r[find("optimizer")] for name, r in rows.items()}
check("AdamW-DDP" in settings.get("adamw_np4", "") and "4 ranks" in settings.get("adamw_np4", ""),
      f"settings from config.json: {settings.get('adamw_np4')}")
check("DeMo k=8" in settings.get("demo_k8", "") and "bf16" in settings.get("demo_k8", ""),
      f"DeMo settings show top-k and value encoding: {settings.get('demo_k8')}")

# ---- labels, in-progress edge cases and errors ------------------------------------------------------------
p = run_script(adamw, demo, "--labels", "baseline,compressed", "--no-plots")
_, rows = parse_table(p.stdout)
check(p.returncode == 0 and set(rows) == {"baseline", "compressed"}, f"--labels name the rows ({sorted(rows)})")

p = run_script(adamw, demo, "--labels", "only-one", "--no-plots")
check(p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1 and "--labels" in p.stderr,
      f"--labels with the wrong count: one-line error, exit 2, a bad option ({p.returncode}: {p.stderr.strip()})")

just_started = os.path.join(TMP, "just_started")
os.makedirs(just_started)
with open(os.path.join(just_started, "config.json"), "w") as f:
    json.dump(config("demo", 2, 10), f)
open(os.path.join(just_started, "metrics.jsonl"), "w").close()
p = run_script(just_started, adamw, "--out", os.path.join(TMP, "plots2"))
_, rows = parse_table(p.stdout)
check(p.returncode == 0 and rows.get("just_started", {}).get("steps") == "—"
      and os.path.isfile(os.path.join(TMP, "plots2", "loss_vs_time.png")),
      f"a run with no lines yet gets a row of dashes and the plots still come "
      f"({p.returncode}: {p.stderr.strip()[-300:]})")
check("just_started/metrics.jsonl: no train or val lines" in p.stderr,
      f"... and a warning that its metrics.jsonl holds no lines ({p.stderr.strip()[:300]})")

empty = os.path.join(TMP, "not_a_run")
os.makedirs(empty)
for folder in (empty, os.path.join(TMP, "does_not_exist")):
    p = run_script(adamw, folder, "--no-plots")
    lines = p.stderr.strip().splitlines()
    check(p.returncode == 1 and len(lines) == 1 and lines[0].startswith("compare_runs.py: error:")
          and folder in lines[0] and p.stdout == "",
          f"{os.path.basename(folder)}: one-line error, exit 1, no table ({p.returncode}: {p.stderr.strip()})")

# ---- diverged runs, partial metrics, damaged lines and configs ------------------------------------------
def write_run(name, lines, cfg=None, raw_config=None):
    """A run folder from literal metrics lines (dicts are dumped, strings written as they are)."""
    folder = os.path.join(TMP, name)
    os.makedirs(folder)
    with open(os.path.join(folder, "config.json"), "w") as f:
        f.write(raw_config if raw_config is not None else json.dumps(cfg or config("adamw", 1, 20)))
    with open(os.path.join(folder, "metrics.jsonl"), "w") as f:
        f.write("".join((json.dumps(x) if isinstance(x, dict) else x) + "\n" for x in lines))
    return folder


def one_row(folder, *extra):
    p = run_script(folder, "--no-plots", *extra)
    _, rows = parse_table(p.stdout) if p.stdout.startswith("|") else ([], {})
    return p, rows.get(os.path.basename(folder), {})


def cell(row, prefix):
    """The row's text in the column whose header starts with prefix ("" when there is none)."""
    return next((text for header, text in row.items() if header.startswith(prefix)), "")


def no_traceback(p):
    return "Traceback" not in p.stderr and "Error:" not in p.stderr.replace("error:", "")


# The trainer's divergence: step 6's train line with a null loss, then a "diverged" line, exit 3. Steps 1-5 are
# finite and low, so a mean of the finite last losses would look like a healthy run.
lines = [train_line(s, 3.0, 10.0, 1.0, 100) for s in range(1, 6)]
lines.insert(4, {"type": "val", "step": 4, "val_loss": 3.1, "tokens": 4 * 4096})
lines += [dict(train_line(6, None, 10.0, 1.0, 100), grad_norm=None),
          {"type": "diverged", "step": 6, "loss": None, "grad_norm": None, "why": "loss nan, grad_norm nan"}]
p, r = one_row(write_run("diverged_trainer", lines), "--last", "10", "--target-val-loss", "3.05")
check(p.returncode == 0 and cell(r, "train loss") == "diverged at step 6",
      f"diverged run: train loss says 'diverged at step 6', not a mean ({p.returncode}: {cell(r, 'train loss')})")
check("3.1000" in cell(r, "val loss") and "diverged" in cell(r, "val loss"),
      f"diverged run: its last val loss is marked as from before the divergence ({cell(r, 'val loss')})")
check(cell(r, "steps to val") == "not reached", "diverged run: a target its val never reached is not reached")
lines = [train_line(s, 3.0, 10.0, 1.0, 100) for s in range(1, 4)] + [train_line(4, 2.9, 10.0, 1.0, 100)]
lines[3]["grad_norm"] = None  # a norm of inf/NaN (written as null) diverges too, even with a finite loss
p, r = one_row(write_run("diverged_norm", lines))
check(cell(r, "train loss") == "diverged at step 4", f"a null grad_norm is a divergence ({cell(r, 'train loss')})")
# A stop signal's "stopped" line: the steps column says why the run ended early; once resumed past it, nothing.
stop = {"type": "stopped", "step": 5, "steps": 20, "why": "SIGTERM", "checkpoint": "out/checkpoints/step_00000005"}
lines = [train_line(s, 3.0, 10.0, 1.0, 100) for s in range(1, 6)] + [stop]
p, r = one_row(write_run("stopped", lines), "--last", "2")
check(p.returncode == 0 and cell(r, "steps") == "5/20 (stopped: SIGTERM)" and cell(r, "train loss") == "3.0000",
      f"a stopped run: steps '5/20 (stopped: SIGTERM)', its losses as usual ({cell(r, 'steps')}, "
      f"{cell(r, 'train loss')}) {p.stderr.strip()[:200]}")
lines += [train_line(s, 3.0, 10.0, 1.0, 100) for s in range(6, 21)]
p, r = one_row(write_run("stopped_resumed", lines))
check(p.returncode == 0 and cell(r, "steps") == "20",
      f"a stopped run resumed to its end: steps '20' ({cell(r, 'steps')})")
lines = [train_line(s, 3.0 - 0.1 * s, 10.0, 1.0, 100) for s in range(1, 5)]
lines += [{"type": "val", "step": 4, "val_loss": None, "tokens": 4 * 4096}]
p, r = one_row(write_run("diverged_val", lines))
check(cell(r, "val loss") == "diverged" and cell(r, "train loss") == "diverged at step 4",
      f"a null val loss: val 'diverged', run diverged at its step "
      f"({cell(r, 'val loss')}, {cell(r, 'train loss')})")
p = run_script(os.path.join(TMP, "diverged_trainer"), "--out", os.path.join(TMP, "plots_diverged"))
check(p.returncode == 0 and os.path.isfile(os.path.join(TMP, "plots_diverged", "loss_vs_time.png")),
      f"a diverged run still plots ({p.returncode}: {p.stderr.strip()[-300:]})")

# Only val lines (e.g. an evaluation-only run): the val loss and its step show.
p, r = one_row(write_run("val_only", [{"type": "val", "step": 10, "val_loss": 4.25, "tokens": 40960},
                                      {"type": "val", "step": 20, "val_loss": 4.125}]))
check(p.returncode == 0 and cell(r, "val loss") == "4.1250" and cell(r, "steps") == "20"
      and abs(parse_count(cell(r, "tokens")) - 40960) < 100,
      f"a run with only val lines shows its val loss, steps and tokens ({r})")

# Train lines without the optional fields: unknown is "—", not 0.
bare = [{"type": "train", "step": s, "loss": 5.0 - 0.1 * s} for s in range(1, 4)]
p, r = one_row(write_run("bare_fields", bare))
check(p.returncode == 0 and all(r.get(find(c)) == "—" for c in ("tokens", "MB sent", "MB/step", "payload MB/step",
                                                                  "tok/s", "comm")),
      f"missing tokens/bytes_sent/payload_bytes/tok_per_s/step_ms/comm_ms show as dashes ({r})")
check(close(cell(r, "train loss"), 4.8, 6e-5),
      f"... and its train loss is still the mean ({cell(r, 'train loss')})")
p = run_script(os.path.join(TMP, "bare_fields"), adamw, "--out", os.path.join(TMP, "plots_bare"))
check(p.returncode == 0 and os.path.isfile(os.path.join(TMP, "plots_bare", "loss_vs_bytes_sent.png")),
      f"runs without byte or time fields still plot ({p.returncode}: {p.stderr.strip()[-300:]})")

# A complete (newline-ended) bad last line is warned about like a bad middle line; a torn one is not.
lines = [train_line(s, 3.0, 10.0, 1.0, 100) for s in range(1, 4)]
p, r = one_row(write_run("bad_last_line", lines + ['{"type": "train", "step": 4, "loss"']))
check(p.returncode == 0 and "bad_last_line/metrics.jsonl:4: not a JSON line" in p.stderr and cell(r, "steps"),
      f"a complete but invalid last line gets a warning ({p.stderr.strip()})")
p, r = one_row(write_run("array_line", lines + ["[1, 2]"]))
check("array_line/metrics.jsonl:4: not a JSON object" in p.stderr,
      f"a line that is not an object: warning ({p.stderr.strip()})")

# Damaged config.json and steps: warnings, a row, exit 0, no traceback.
for name, raw in (("config_null", "null"), ("config_array", "[1, 2]"),
                  ("config_run_null", json.dumps(dict(config("demo", 2, 5), _run=None))),
                  ("config_run_array", json.dumps(dict(config("demo", 2, 5), _run=[4])))):
    p, r = one_row(write_run(name, lines, raw_config=raw))
    check(p.returncode == 0 and no_traceback(p) and cell(r, "steps") in ("3", "3/5"),
          f"config.json {raw[:40]}: a row, exit 0, no traceback ({p.returncode}: {p.stderr.strip()[-300:]})")
for name, bad_step in (("step_infinity", "Infinity"), ("step_nan", "NaN"), ("step_huge", "1e999"),
                       ("step_text", '"x"'), ("step_bool", "true"), ("step_null", "null")):
    p, r = one_row(write_run(name, lines + ['{"type": "train", "step": %s, "loss": 2.0}' % bad_step]))
    check(p.returncode == 0 and no_traceback(p) and cell(r, "steps") == "3/20"
          and "a train line without a valid step" in p.stderr,
          f'"step": {bad_step}: the line is skipped with a warning ({p.returncode}: {p.stderr.strip()[-300:]})')
p, r = one_row(write_run("huge_fields", [dict(train_line(1, 3.0, 10.0, 1.0, 100), tokens=10 ** 400, bytes_sent="x")]))
check(p.returncode == 0 and no_traceback(p) and cell(r, "MB sent") == "0.00",
      f"an integer too big for a float and a text field: no traceback ({p.returncode}: {p.stderr.strip()[-300:]})")

# ---- bad arguments and output places: one line, non-zero exit, nothing written ------------------------------
a_file = os.path.join(TMP, "a_file")
open(a_file, "w").close()
os.makedirs(os.path.join(TMP, "a_dir"))
for what, args, leftover in (
        ("--out is an existing file", ["--out", a_file], None),
        ("--out under a file", ["--out", os.path.join(a_file, "plots")], None),
        ("--out in /proc", ["--out", "/proc/compare_runs_test/x"], "/proc/compare_runs_test"),
        ("--table is a folder", ["--table", os.path.join(TMP, "a_dir"), "--no-plots"], None),
        ("--table under a file", ["--table", os.path.join(a_file, "t.md"), "--no-plots"], None),
        ("--table under a file, with plots", ["--table", os.path.join(a_file, "t.md"),
                                              "--out", os.path.join(TMP, "new_plots")], os.path.join(TMP, "new_plots")),
        ("--ylim nan 4", ["--ylim", "nan", "4", "--out", os.path.join(TMP, "ylim_plots")],
         os.path.join(TMP, "ylim_plots")),
        ("--ylim 4 3 (low above high)", ["--ylim", "4", "3", "--out", os.path.join(TMP, "ylim_plots")],
         os.path.join(TMP, "ylim_plots")),
        ("--target-val-loss nan", ["--target-val-loss", "nan", "--no-plots"], None),
        ("--smooth 0", ["--smooth", "0", "--no-plots"], None)):
    p = run_script(adamw, *args)
    lines_err = p.stderr.strip().splitlines()
    check(p.returncode != 0 and len(lines_err) == 1 and lines_err[0].startswith("compare_runs.py: error:")
          and p.stdout == "" and (leftover is None or not os.path.exists(leftover)),
          f"{what}: one-line error, exit {p.returncode}, no table" + (", no folder left" if leftover else "")
          + f" ({p.stderr.strip()[-300:]})")
check(os.path.isfile(a_file) and os.path.getsize(a_file) == 0, "the file given as --out is left as it was")

print()
if failures:
    print(f"{len(failures)} check(s) failed:")
    for f in failures:
        print("  " + f)
    sys.exit(1)
print("all compare_runs checks passed")
