"""End-to-end checks of the CPU trainer on the default corpus (run by test/e2e/test_train_cpu.sh).

Each check runs ./train_gpt_cpu (under mpirun where it says so) on the tiny config and asserts on what it wrote:
determinism run after run, bit-identical losses after a checkpoint/resume for both optimizers and for 1 and 2
ranks (and DeMo with --demo_delay 1), AdamW-DDP with 2 ranks x batch B matching 1 rank x batch 2B, refusal of a
resume with another world size (its DeMo momenta redistributed, or --reset_momentum), AdamW-DDP's overlapped all-reduce giving the
bits of the all-reduce after the backward, model TFLOP/s and MFU in the metrics against flops counted here,
one-line errors with a non-zero exit and no hang for bad input (numbers that are not plain decimals, range errors
naming the config file that set the value, floats shown as given), one warning line each for settings that run but
probably do not do what was meant, a rank killed mid-run ending the whole job (then resumed), and a rank that
stops without dying ending it after --comm_timeout; an out_dir's history kept whole (a run that would write among
another history's checkpoints refused unless --overwrite, state files that disagree with their checkpoint or
other training shards refused naming the file); checkpoint markers recording each file's XXH64 as xxhsum computes
it, and a resume on a corrupt file refused before any rank reports it or deletes anything; a stop signal ending a
run at a step with a checkpoint, from which --resume auto gives the uninterrupted losses; a resume that changes the
learning-rate schedule (a wsd cool-down) following the new one.
Failures are collected and reported together.
"""
import json
import math
import os
import shutil
import signal
import struct
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TMP = os.path.join(ROOT, "build", "test-tmp", "train")
TRAINER = os.path.join(ROOT, "train_gpt_cpu")
BASE = ["--config", "configs/tiny.json", "--batch_size", "4", "--seq_len", "32", "--val_every", "3",
        "--val_batches", "2", "--lr", "1e-3", "--warmup_steps", "2"]
MPI_ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMPI_MCA_rmaps_base_oversubscribe="1", OMP_NUM_THREADS="1")
failures = []


def check(cond, what):
    print(("ok    " if cond else "FAIL  ") + what, flush=True)
    if not cond:
        failures.append(what)


def run(args, ranks=None, expect_ok=True, timeout=300, env=None):
    if ranks is None:
        cmd = [TRAINER] + args + ["--threads", "2"]
    else:
        cmd = ["mpirun", "-np", str(ranks), TRAINER] + args + ["--threads", "1"]
    p = subprocess.run(cmd, cwd=ROOT, env=dict(MPI_ENV, **(env or {})), capture_output=True, text=True, timeout=timeout)
    if expect_ok and p.returncode != 0:
        print(p.stdout[-3000:], p.stderr[-3000:])
        raise SystemExit(f"command failed ({p.returncode}): {' '.join(cmd)}")
    return p


def losses(out_dir):
    out = {}
    with open(os.path.join(out_dir, "metrics.jsonl")) as f:
        for line in f:
            j = json.loads(line)
            if j.get("type") == "train":
                out[j["step"]] = j["loss"]
            elif j.get("type") == "val":
                out[f"val{j['step']}"] = j["val_loss"]
    return out


def fresh(name):
    d = os.path.join(TMP, name)
    shutil.rmtree(d, ignore_errors=True)
    return d


def bad_input_checks_after_start(shard_dir, train_bytes, adamw_run):
    """Validation data, sizes and model files that a run refuses (or reports) before it trains, not mid-run."""
    def shard(name, tokens):  # an llm.c token shard of these uint16 ids
        path = os.path.join(shard_dir, name)
        with open(path, "wb") as f:
            f.write(struct.pack("<256i", 20240520, 1, len(tokens), *([0] * 253)))
            f.write(struct.pack(f"<{len(tokens)}H", *tokens))
        return path
    default_tokens = list(struct.unpack("<1000H", train_bytes[1024:3024]))
    # an out-of-range id in the first validation batch: refused at the start, before any step
    oov_val = shard("oov_val_000.bin", [60000] + default_tokens[1:])
    p = run(BASE + ["--steps", "3", "--val_data", oov_val, "--out_dir", fresh("oov-val")], None, expect_ok=False)
    lines = [l for l in p.stderr.splitlines() if l.strip() and not l.startswith("warning:")]
    check(p.returncode == 1 and len(lines) == 1 and "oov_val_000.bin: token id 60000 at position 0 is out of range"
          in lines[0] and "step 1" not in p.stdout, f"a bad token id in the validation batches stops the run before "
          f"its first step: {p.stderr.strip()[:200]}")
    # --val_batches above what the validation shard holds (1000 tokens: 7 windows of 4 x 32 + 1): the 7 batches,
    # with a warning; the logged val loss is eval_gpt's over those 7
    small_val = shard("small_val_000.bin", default_tokens)
    out = fresh("val-held")
    p = run(BASE + ["--steps", "2", "--val_data", small_val, "--val_batches", "200", "--out_dir", out], None)
    warned = "warning: --val_batches 200: " + small_val + " holds 7 batches of 4 x 32 tokens per rank" in p.stderr
    e = subprocess.run(["./eval_gpt", "--model", out, "--data", small_val, "--batch_size", "4", "--seq_len", "32",
                        "--batches", "7", "--threads", "2", "--json"], cwd=ROOT, capture_output=True, text=True)
    evaluated = json.loads(e.stdout)["loss"] if e.returncode == 0 else float("nan")
    logged = losses(out).get("val2", float("nan"))
    check(warned and abs(evaluated - logged) <= 1e-6 * logged,
          f"--val_batches 200 on a shard of 7 batches: a warning, and validation reads the 7 (logged {logged}, "
          f"eval_gpt --batches 7 {evaluated}): {p.stderr.strip()[:160]}")
    # a model file with a NaN weight: refused when read, naming the tensor
    model = os.path.join(adamw_run, "checkpoints", "step_00000003", "model.bin")
    nan_model = os.path.join(shard_dir, "nan_model.bin")
    blob = bytearray(open(model, "rb").read())
    blob[1024 + 4 * 5:1024 + 4 * 6] = struct.pack("<f", float("nan"))  # wte's sixth weight
    open(nan_model, "wb").write(blob)
    out = fresh("nan-model")
    for args, needle in [
        (["--init_from", nan_model], "nan_model.bin: parameter 5 (wte.weight) is nan"),
        (["--threads", "5000"], "--threads must be <= 4096 (got 5000"),
        (["--sample_tokens", "2000000"], "--sample_tokens must be <= 1000000"),
        (["--num_layers", "5000", "--dry_run"], "num_layers 5000 is over 4096"),
        # 4000 layers of 65536 x 65536 weights: more than any address space holds (a dry run does not allocate)
        (["--num_layers", "4000", "--channels", "65536", "--num_heads", "1"], "error: out of host memory"),
    ]:
        # (not through run(), whose --threads would come last)
        p = subprocess.run([TRAINER] + BASE + args + ["--out_dir", out, "--steps", "1"], cwd=ROOT, env=MPI_ENV,
                           capture_output=True, text=True, timeout=60)
        lines = [l for l in p.stderr.splitlines() if l.strip() and not l.startswith("warning:")]
        check(p.returncode == 1 and len(lines) == 1 and needle in lines[0],
              f"{' '.join(args)}: one-line error: {p.stderr.strip()[:160]}")
    p = run(BASE + ["--num_layers", "4000", "--channels", "65536", "--num_heads", "1", "--dry_run", "--out_dir", out],
            None, expect_ok=False, timeout=60)
    check(p.returncode == 0 and "4000" in p.stdout, "a dry run of a model too large to allocate reports it")
    # --resume with a checkpoint and --init_from: the checkpoint wins, and the run says so
    p = run(BASE + ["--steps", "4", "--out_dir", fresh("resume-init"), "--init_from", model, "--resume",
                    os.path.dirname(model)], None, expect_ok=False)
    check(p.returncode == 0 and "(--init_from " + model + " not read)" in p.stdout,
          "--resume of a checkpoint with --init_from: its model is not read, and the resume line says so")


def resume_case(optimizer, ranks, extra=(), suffix="", base=None):
    """base: the run's first flags (BASE, the tiny GPT-2, unless given)."""
    tag = f"{optimizer}{suffix}-np{ranks or 1}"
    a, b, c = fresh(tag + "-a"), fresh(tag + "-b"), fresh(tag + "-c")
    common = (base or BASE) + ["--optimizer", optimizer, "--steps", "6", "--checkpoint_every", "3", "--keep_checkpoints", "0"]
    common += list(extra)
    run(common + ["--out_dir", a], ranks)
    run(common + ["--out_dir", b], ranks)
    la, lb = losses(a), losses(b)
    check(len(la) == 8 and la == lb, f"{tag}: two identical runs give bit-identical losses")
    run(common + ["--out_dir", c, "--resume", os.path.join(a, "checkpoints", "step_00000003")], ranks)
    lc = losses(c)
    same = all(lc.get(k) == la[k] for k in (4, 5, 6, "val6"))
    check(same and 3 not in lc, f"{tag}: resumed at step 3, steps 4-6 and val loss bit-identical "
                                f"({[la[k] for k in (4, 5, 6)]} vs {[lc.get(k) for k in (4, 5, 6)]})")
    # Resuming in place (auto) truncates the log back to the checkpoint and reproduces the rest.
    shutil.rmtree(os.path.join(a, "checkpoints", "step_00000006"))
    run(common + ["--out_dir", a, "--resume", "auto"], ranks)
    check(losses(a) == la, f"{tag}: --resume auto in the same directory rewrites identical history")
    return a


def cooldown_resume_check(source):
    """A run resumed from a checkpoint with another schedule (the warmup-stable-decay way: train at lr, cool down
    later): accepted, and its learning rates follow the new shape from the next step."""
    out = fresh("cooldown")
    common = BASE + ["--optimizer", "adamw", "--steps", "6", "--checkpoint_every", "3", "--keep_checkpoints", "0"]
    run(common + ["--out_dir", out, "--resume", os.path.join(source, "checkpoints", "step_00000003"),
                  "--lr_schedule", "wsd", "--lr_decay_frac", "0.5"])
    lrs = {r["step"]: r["lr"] for r in map(json.loads, open(os.path.join(out, "metrics.jsonl")))
           if r.get("type") == "train"}
    # 0-based steps 3..5 decay from lr 1e-3 to the floor 1e-4 in three equal parts
    expected = {4: 1e-3 - 0.9e-3 / 3, 5: 1e-3 - 0.9e-3 * 2 / 3, 6: 1e-4}
    check(sorted(lrs) == [4, 5, 6] and all(abs(lrs[k] - v) < 1e-9 for k, v in expected.items()),
          f"a resume may change the schedule: cosine run cooled down by wsd from step 3 (lr {lrs})")


def children(pid):
    """PIDs whose parent is `pid` (from /proc: no procps needed)."""
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = open(f"/proc/{entry}/stat").read()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(entry))
    return out


def alive(pid):
    """Running (a zombie waiting for its parent to reap it counts as gone)."""
    try:
        return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def start_two_ranks(out_dir, args, step, trainer=TRAINER):
    """Starts `args` under mpirun with 2 ranks of `trainer` and returns (the mpirun process, the rank PIDs) once
    step `step` is logged, or (process, None) after a failed check."""
    cmd = ["mpirun", "-np", "2", trainer] + args + ["--threads", "1", "--out_dir", out_dir]
    p = subprocess.Popen(cmd, cwd=ROOT, env=MPI_ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                         start_new_session=True)
    deadline = time.time() + 120
    while time.time() < deadline and p.poll() is None:
        try:
            if max([k for k in losses(out_dir) if isinstance(k, int)], default=0) >= step:
                break
        except (OSError, ValueError):
            pass
        time.sleep(0.05)
    ranks = children(p.pid)
    if p.poll() is not None or len(ranks) != 2:
        p.kill()
        check(False, f"could not catch a 2-rank run at step {step} (ranks {ranks})")
        return p, None
    return p, ranks


def wait_for_job_end(p, ranks, limit):
    """(mpirun's exit status or None if it hung, its stderr, seconds taken, ranks still running); cleans up."""
    start = time.time()
    try:
        _, err = p.communicate(timeout=limit)
        code = p.returncode
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        _, err = p.communicate()
        code = None
    survivors = [r for r in ranks if alive(r)]
    for r in survivors:
        os.kill(r, signal.SIGKILL)
    return code, err, time.time() - start, survivors


def rank_dies_mid_run():
    """A rank killed mid-run (SIGKILL: no chance to report anything) takes the job down: mpirun exits non-zero
    within seconds, no rank is left blocked in a collective, and --resume auto continues from the last complete
    checkpoint."""
    out_dir = fresh("killed")
    # 60 steps: enough left after step 5 for the kill to land mid-run (~0.1 s a step), few for the resume to redo
    args = BASE + ["--optimizer", "demo", "--steps", "60", "--checkpoint_every", "2", "--keep_checkpoints", "2",
                   "--val_every", "0"]
    p, ranks = start_two_ranks(out_dir, args, 5)
    if ranks is None:
        return
    os.kill(ranks[-1], signal.SIGKILL)
    code, _, took, survivors = wait_for_job_end(p, ranks, 60)
    check(code not in (None, 0) and not survivors,
          f"a rank killed at step >= 5 ends the job: mpirun exit {code} after {took:.1f} s, surviving ranks {survivors}")
    done = sorted(d for d in os.listdir(os.path.join(out_dir, "checkpoints"))
                  if os.path.exists(os.path.join(out_dir, "checkpoints", d, "COMPLETE")))
    r = run(args + ["--out_dir", out_dir, "--resume", "auto"], 2, expect_ok=False)
    steps = sorted(k for k in losses(out_dir) if isinstance(k, int))
    check(r.returncode == 0 and bool(done) and steps == list(range(1, 61)),
          f"--resume auto after the kill continues from {done[-1] if done else 'no checkpoint'} to step 60 "
          f"(exit {r.returncode}, {len(steps)} logged steps)")


def rank_hangs_mid_run():
    """A rank that stops without dying (SIGSTOP) would block the other in its next collective forever; with
    --comm_timeout 5 the waiting rank reports it and exits, and mpirun ends the job, the stopped rank included."""
    out_dir = fresh("stopped")
    args = BASE + ["--optimizer", "adamw", "--steps", "300", "--val_every", "0", "--comm_timeout", "5"]
    p, ranks = start_two_ranks(out_dir, args, 3)
    if ranks is None:
        return
    os.kill(ranks[-1], signal.SIGSTOP)
    code, err, took, survivors = wait_for_job_end(p, ranks, 60)
    line = next((l for l in err.splitlines() if "did not complete" in l), err.strip()[-200:])
    check(code not in (None, 0) and not survivors and "did not complete within 5 s (--comm_timeout)" in err,
          f"a stopped rank ends the job after --comm_timeout 5: mpirun exit {code} after {took:.1f} s, "
          f"surviving ranks {survivors}: {line}")


def delay_checks():
    """--demo_delay 1 with 2 ranks, eager (the default) and stale (--demo_eager false): deterministic and
    resumable (checkpoints hold a round not yet applied, and the shared weights), a real change of the
    trajectory from step 2 on, the same traffic per round, and a resume with --demo_delay 0 refused. With one
    rank and no weight decay, eager delayed DeMo must train exactly as undelayed DeMo (its own share is the whole
    update), its checkpoint of step k+1 must hold the undelayed run's weights of step k, and its final checkpoint
    (the last round applied after the last step) the undelayed run's final weights."""
    delayed = resume_case("demo", 2, ["--demo_delay", "1"], "-delay")
    stale = resume_case("demo", 2, ["--demo_delay", "1", "--demo_eager", "false"], "-delay-stale")
    plain = os.path.join(TMP, "demo-np2-a")
    ld, ls, lp = losses(delayed), losses(stale), losses(plain)
    # step 1's forward runs before any update, so all agree; at step 2 the plain run has applied step 1's
    # update, the stale one only its weight decay, the eager one its own share: three different losses
    check(ld[1] == lp[1] == ls[1] and len({ld[2], ls[2], lp[2]}) == 3 and len({ld[6], ls[6], lp[6]}) == 3,
          f"--demo_delay 1 changes the trajectory after step 1, eager and stale differently "
          f"({[ld[k] for k in (1, 2, 6)]}, {[ls[k] for k in (1, 2, 6)]} vs {[lp[k] for k in (1, 2, 6)]})")

    one = BASE + ["--optimizer", "demo", "--steps", "4", "--weight_decay", "0", "--checkpoint_every", "1",
                  "--keep_checkpoints", "0"]
    run(one + ["--demo_delay", "1", "--out_dir", fresh("eager-np1")], None)
    run(one + ["--demo_delay", "0", "--out_dir", fresh("undelayed-np1")], None)
    le, lu = losses(os.path.join(TMP, "eager-np1")), losses(os.path.join(TMP, "undelayed-np1"))
    check(le == lu, f"one rank, no weight decay: eager delayed DeMo's losses equal undelayed DeMo's bit for bit "
                    f"({[le.get(k) for k in (1, 2, 4)]} vs {[lu.get(k) for k in (1, 2, 4)]})")

    def model(run_dir, step):
        return open(os.path.join(TMP, run_dir, "checkpoints", f"step_{step:08d}", "model.bin"), "rb").read()
    check(all(model("eager-np1", k + 1) == model("undelayed-np1", k) for k in (1, 2)) and
          model("eager-np1", 2) != model("eager-np1", 1),
          "one rank, no weight decay: the eager run's checkpoint of step k+1 holds the undelayed run's weights "
          "of step k (the shared weights, not the working ones)")
    check(model("eager-np1", 4) == model("undelayed-np1", 4) != model("eager-np1", 3),
          "one rank, no weight decay: after the last step the pending round is applied, so the eager run's final "
          "checkpoint holds the undelayed run's final weights")

    def traffic(out_dir):
        rows = [json.loads(l) for l in open(os.path.join(out_dir, "metrics.jsonl"))]
        return [(r["step"], r.get("bytes_sent"), r.get("bytes_recv")) for r in rows if r.get("type") == "train"]
    td, tp = traffic(delayed), traffic(plain)
    # the delayed run receives round t during step t+1: the same bytes per round, one step later; its last step
    # also finishes the last round's exchange
    def moved(rows, i):
        return sum(t[i] for t in rows)
    check([t[1:] for t in tp[:4]] == [t[1:] for t in td[1:5]] and len(td) == len(tp) == 6 and
          all(moved(td[5:], i) == moved(tp[4:], i) and moved(td, i) == moved(tp, i) for i in (1, 2)),
          f"--demo_delay 1 moves the same bytes per round, one step later, the last step two rounds "
          f"({td[:3]}, {td[-1]} vs {tp[:3]}, {tp[-1]})")
    ck = os.path.join(delayed, "checkpoints", "step_00000003")
    common = BASE + ["--optimizer", "demo", "--steps", "6", "--out_dir", fresh("delay-mismatch"), "--resume", ck]
    p = run(common, 2, expect_ok=False, timeout=60)
    check(p.returncode != 0 and "demo_delay is 0 here (the default) but 1 in the checkpoint" in p.stderr,
          "a --demo_delay 1 checkpoint resumed with --demo_delay 0 is refused: " + p.stderr.strip()[:200])
    p = run(BASE + ["--optimizer", "demo", "--demo_delay", "2", "--out_dir", fresh("bad")], None, expect_ok=False)
    check(p.returncode != 0 and "--demo_delay must be 0 or 1" in p.stderr, "--demo_delay 2 refused: " + p.stderr.strip()[:160])
    return delayed


def model_flops_per_token(config_path, seq_len):
    """llm.c's estimate, 6 N + 6 L C T, with N counted here from GPT-2's tensor shapes (not the trainer's layout)."""
    c = dict(vocab_size=50257, padded_vocab_size=50304)
    c.update({k: v for k, v in json.load(open(os.path.join(ROOT, config_path))).items() if not k.startswith("_")})
    L, C = c["num_layers"], c["channels"]
    n = c["padded_vocab_size"] * C + c["max_seq_len"] * C + L * (12 * C * C + 13 * C) + 2 * C
    return 6 * n + 6 * L * C * seq_len


def throughput_checks(two_rank_dir):
    """model_tflops = flops per token x tokens/s per rank, MFU against --peak_tflops, in the log and the progress."""
    flops = model_flops_per_token("configs/tiny.json", 32)
    out = fresh("mfu")
    p = run(BASE + ["--steps", "3", "--val_every", "0", "--peak_tflops", "0.1", "--out_dir", out])
    rows = [json.loads(l) for l in open(os.path.join(out, "metrics.jsonl"))]
    rows = [r for r in rows if r.get("type") == "train"]
    progress = [l for l in p.stdout.splitlines() if l.startswith("step ") and " | loss " in l]
    close = lambda a, b, rel=1e-9: abs(a - b) <= rel * abs(b)
    check(len(rows) == 3 and len(progress) == 3 and "MFU against 0.1 TFLOP/s per rank" in p.stdout,
          "--peak_tflops: 3 steps logged and printed, the banner names the peak")
    for r, line in zip(rows, progress):  # the peak is a float config key: MFU to its 7 digits
        check(close(r["model_tflops"], flops * r["tok_per_s"] / 1e12) and
              close(r["mfu"], r["model_tflops"] / 0.1, 1e-6) and f"| MFU {100 * r['mfu']:.1f}% |" in line,
              f"step {r['step']}: model_tflops {r['model_tflops']:.3e} = {flops} flops/token x {r['tok_per_s']:.0f} "
              f"tok/s, MFU {r['mfu']:.3f} in the log and '{line.split(' | ')[6]}' in the progress line")
    if two_rank_dir:
        rows = [json.loads(l) for l in open(os.path.join(two_rank_dir, "metrics.jsonl"))]
        rows = [r for r in rows if r.get("type") == "train"]
        check(rows and all(close(r["model_tflops"], flops * r["tok_per_s"] / 2 / 1e12) and "mfu" not in r
                           for r in rows),
              "2 ranks without --peak_tflops: model_tflops per rank (half the tokens/s each), no MFU")


def ddp_overlap_checks():
    """AdamW-DDP's all-reduce overlapped with the backward (--ddp_overlap, the default) against the
    all-reduce after the backward (--ddp_overlap false): 3 ranks, 2 micro-steps per step (only the last backward reports its
    gradients), fp32 and bf16 on the wire. The transport sums every element in rank order, so the runs must
    agree bit for bit: losses, gradient norms, bytes and the checkpointed weights. The run record says which
    one ran; a bad value is a one-line error."""
    args = BASE + ["--optimizer", "adamw", "--steps", "4", "--total_batch_size", str(2 * 3 * 4 * 32),
                   "--val_every", "2", "--checkpoint_every", "4"]

    def rows(out_dir):
        rs = [json.loads(l) for l in open(os.path.join(out_dir, "metrics.jsonl"))]
        return [(r["step"], r["loss"], r["grad_norm"], r["bytes_sent"], r["payload_bytes"]) for r in rs
                if r.get("type") == "train"]

    def record(out_dir):
        return json.load(open(os.path.join(out_dir, "config.json")))["_run"].get("ddp_overlap")

    def weights(out_dir):
        return open(os.path.join(out_dir, "checkpoints", "step_00000004", "model.bin"), "rb").read()
    for wire in ("fp32", "bf16"):
        on, off = fresh(f"overlap-{wire}-on"), fresh(f"overlap-{wire}-off")
        run(args + ["--grad_wire", wire, "--out_dir", on], 3)
        run(args + ["--grad_wire", wire, "--ddp_overlap", "false", "--out_dir", off], 3)
        check(rows(on) == rows(off) and losses(on) == losses(off) and len(rows(on)) == 4,
              f"AdamW-DDP, 3 ranks, 2 micro-steps, {wire} wire: overlapped all-reduce gives --ddp_overlap false's "
              f"losses, gradient norms and bytes bit for bit ({rows(on)[-1]} vs {rows(off)[-1]})")
        check(weights(on) == weights(off), f"... and the same checkpointed weights ({wire} wire)")
        check(record(on) is True and record(off) is False, "config.json's _run.ddp_overlap says which ran")
    p = run(BASE + ["--ddp_overlap", "yes", "--out_dir", fresh("bad-overlap")], None, expect_ok=False, timeout=60)
    lines = [l for l in p.stderr.splitlines() if l.strip()]
    check(p.returncode != 0 and len(lines) == 1 and "--ddp_overlap: expected true or false, got 'yes'" in lines[0],
          "--ddp_overlap yes: one-line error: " + p.stderr.strip()[:160])


def out_dir_history_checks(source):
    """source: a finished 1-rank AdamW run of resume_case (checkpoints at steps 3 and 6, 6 steps of metrics)."""
    common = BASE + ["--optimizer", "adamw", "--steps", "6", "--checkpoint_every", "3", "--keep_checkpoints", "0"]
    hist = fresh("hist")
    shutil.copytree(source, hist)
    ck = lambda step: os.path.join(hist, "checkpoints", f"step_{step:08d}")
    metrics = open(os.path.join(hist, "metrics.jsonl"), "rb").read()
    la = losses(hist)

    def refused(args, needle, what):
        p = run(common + args, None, expect_ok=False, timeout=60)
        lines = [l for l in p.stderr.splitlines() if l.strip()]
        check(p.returncode == 1 and len(lines) == 1 and needle in lines[0], f"{what}: {p.stderr.strip()[:220]}")

    refused(["--out_dir", hist], "holds another run's checkpoints (up to step 6)",
            "a fresh run into an out_dir with checkpoints is refused")
    refused(["--out_dir", hist, "--resume", ck(3)], "holds checkpoints after step 3, where this run resumes",
            "a resume from an older checkpoint of the out_dir is refused")
    check(open(os.path.join(hist, "metrics.jsonl"), "rb").read() == metrics and os.path.isdir(ck(6)),
          "the refused runs left metrics.jsonl and the checkpoints as they were")
    run(common + ["--out_dir", hist, "--resume", ck(3), "--overwrite"])
    check(losses(hist) == la and os.path.isfile(os.path.join(ck(6), "COMPLETE")),
          "--overwrite: the resume from step 3 replaces step 6 and gives its losses again")
    refused(["--out_dir", hist, "--resume", "auto", "--steps", "4"], "at step 6, past --steps 4",
            "a checkpoint past --steps is refused")
    refused(["--out_dir", fresh("hist-x"), "--resume", hist], "an out_dir, not a checkpoint directory",
            "--resume given an out_dir says so")
    shutil.copy(os.path.join(ck(6), "state_rank0.bin"), os.path.join(ck(3), "state_rank0.bin"))
    refused(["--out_dir", fresh("hist-y"), "--resume", ck(3)], "but its checkpoint's marker records",
            "a state file of another checkpoint is refused by its checksum")
    marker = json.load(open(os.path.join(ck(3), "COMPLETE")))
    del marker["files"]  # as written before checksums: the state's own step is what tells
    open(os.path.join(ck(3), "COMPLETE"), "w").write(json.dumps(marker) + "\n")
    refused(["--out_dir", fresh("hist-y"), "--resume", ck(3)], "state_rank0.bin: holds step 6 but its checkpoint's",
            "a state file of another checkpoint is refused by its step (a marker without checksums)")

    # A run without checkpoints: a fresh run into its out_dir is refused (its metrics kept), --overwrite replaces them.
    # (--resume auto too: a run with --checkpoint_every -1 did not die before its first checkpoint, it had none.)
    bare = fresh("hist-bare")
    bare_run = BASE + ["--optimizer", "adamw", "--steps", "2", "--checkpoint_every", "-1", "--out_dir", bare]
    run(bare_run)
    bare_metrics = open(os.path.join(bare, "metrics.jsonl"), "rb").read()
    p = run(bare_run + ["--steps", "3", "--resume", "auto"], None, expect_ok=False, timeout=60)
    check(p.returncode == 1 and "metrics.jsonl: holds another run's metrics, and no checkpoint continues that run"
          in p.stderr and open(os.path.join(bare, "metrics.jsonl"), "rb").read() == bare_metrics,
          f"a fresh run over metrics without a checkpoint is refused, the metrics kept: {p.stderr.strip()[:200]}")
    run(bare_run + ["--steps", "3", "--overwrite"])
    check(sorted(k for k in losses(bare) if isinstance(k, int)) == [1, 2, 3], "... and --overwrite starts them afresh")

    # Other files behind the same glob: a shard fewer.
    data = fresh("hist-data")
    os.makedirs(data)
    for f in os.listdir(os.path.join(ROOT, "data/default")):
        if "_train_" in f:
            os.symlink(os.path.join(ROOT, "data/default", f), os.path.join(data, f))
    run(common + ["--out_dir", fresh("hist-d"), "--train_data", os.path.join(data, "*_train_*.bin"), "--steps", "3"])
    os.remove(os.path.join(data, sorted(os.listdir(data))[-1]))
    refused(["--out_dir", os.path.join(TMP, "hist-d"), "--resume", "auto", "--train_data",
             os.path.join(data, "*_train_*.bin")], "the training shards are not the checkpoint's",
            "a resume on other training shards is refused")


def wait_for_step(out_dir, step, p, limit=120):
    """Polls out_dir's metrics until `step` is logged or the process ends; the last step logged."""
    deadline, last = time.time() + limit, 0
    while time.time() < deadline and p.poll() is None:
        try:
            last = max([k for k in losses(out_dir) if isinstance(k, int)], default=0)
        except (OSError, ValueError):
            pass
        if last >= step:
            break
        time.sleep(0.02)
    return last


def stop_signal_checks():
    """A stop signal ends a run at a step, with a checkpoint of it and exit status 4, and --resume auto then gives
    the uninterrupted run's losses bit for bit: SIGTERM to a single process; with 2 ranks and --demo_delay 1 (a
    round in flight at the stop), SIGUSR1 to one rank only (the ranks agree on the step) and SIGUSR1 to mpirun
    (which passes it on to the ranks). --time_limit_minutes stops a run the same way, with 1 and 2 ranks."""
    steps = 80
    common = BASE + ["--optimizer", "adamw", "--steps", str(steps), "--val_every", "0", "--checkpoint_every", "0"]
    ref = fresh("stop-ref")
    run(common + ["--out_dir", ref, "--time_limit_minutes", "600"])  # a time limit far off changes nothing
    out = fresh("stop-1")
    p = subprocess.Popen([TRAINER] + common + ["--threads", "2", "--out_dir", out], cwd=ROOT, env=MPI_ENV,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for_step(out, 3, p)
    p.send_signal(signal.SIGTERM)
    stdout, stderr = p.communicate(timeout=120)
    at = max([k for k in losses(out) if isinstance(k, int)], default=0)
    ck = os.path.join(out, "checkpoints", f"step_{at:08d}")
    check(p.returncode == 4 and 3 <= at < steps and os.path.isfile(os.path.join(ck, "COMPLETE"))
          and f"stopped after step {at} of {steps} on SIGTERM; checkpoint {ck}: continue with --resume auto" in stdout
          and not stderr.strip(),
          f"SIGTERM: the run stops after step {at} with exit {p.returncode}, a checkpoint of it and one line "
          f"({stdout.strip().splitlines()[-1:] if stdout.strip() else stderr.strip()[:200]})")
    stopped = lambda d: [r for r in map(json.loads, open(os.path.join(d, "metrics.jsonl"))) if r["type"] == "stopped"]
    last = json.loads(open(os.path.join(out, "metrics.jsonl")).read().splitlines()[-1])
    expected = {"type": "stopped", "step": at, "steps": steps, "why": "SIGTERM", "checkpoint": ck}
    check(last == expected, f"... and metrics.jsonl ends with {expected} ({last})")
    run(common + ["--out_dir", out, "--resume", "auto"])
    check(losses(out) == losses(ref), f"... and --resume auto gives the uninterrupted run's {steps} losses bit for bit")
    check(stopped(out) == [expected], "... keeping the stopped line in the resumed run's metrics.jsonl")

    # --time_limit_minutes: a limit already past when step 1 reports stops the run after it (1 rank: the request
    # needs no wait), with a checkpoint, exit 4 and a stopped line; --resume auto then gives the same losses
    out = fresh("time-limit-1")
    p = run(common + ["--out_dir", out, "--time_limit_minutes", "0.0001"], expect_ok=False, timeout=120)
    ck = os.path.join(out, "checkpoints", "step_00000001")
    why = "time limit of 1e-4 minutes"
    check(p.returncode == 4 and os.path.isfile(os.path.join(ck, "COMPLETE"))
          and f"stopped after step 1 of {steps} on the {why}; checkpoint {ck}" in p.stdout
          and stopped(out) == [{"type": "stopped", "step": 1, "steps": steps, "why": why, "checkpoint": ck}],
          f"--time_limit_minutes 0.0001: the run stops after step 1 with exit {p.returncode}, a checkpoint and a "
          f"stopped line {stopped(out) if os.path.isfile(os.path.join(out, 'metrics.jsonl')) else None} "
          f"{p.stderr.strip()[:200]}")
    run(common + ["--out_dir", out, "--resume", "auto"])
    check(losses(out) == losses(ref), "... and --resume auto gives the uninterrupted run's losses bit for bit")

    demo = BASE + ["--optimizer", "demo", "--demo_delay", "1", "--steps", str(steps), "--val_every", "0",
                   "--checkpoint_every", "0"]
    ref2 = fresh("stop-ref2")
    run(demo + ["--out_dir", ref2], 2)
    for target in ("one rank", "mpirun"):
        out = fresh("stop-2-" + target.replace(" ", "-"))
        p, ranks = start_two_ranks(out, demo, 3)
        if ranks is None:
            continue
        os.kill(ranks[-1] if target == "one rank" else p.pid, signal.SIGUSR1)
        code, err, took, survivors = wait_for_job_end(p, ranks, 120)
        at = max([k for k in losses(out) if isinstance(k, int)], default=0)
        ck = os.path.join(out, "checkpoints", f"step_{at:08d}")
        files = sorted(os.listdir(ck)) if os.path.isdir(ck) else []
        check(code == 4 and 3 <= at < steps and not survivors
              and files == ["COMPLETE", "model.bin", "state_rank0.bin", "state_rank1.bin"],
              f"2 ranks, SIGUSR1 to {target}: both stop after step {at} (mpirun exit {code} after {took:.1f} s), "
              f"checkpoint {files} {err.strip()[:160]}")
        why = ["SIGUSR1 on rank 0"] + (["a stop signal on another rank"] if target == "one rank" else [])
        rows = stopped(out)
        check(len(rows) == 1 and rows[0]["step"] == at and rows[0]["why"] in why and rows[0]["checkpoint"] == ck,
              f"... and rank 0 writes one stopped line naming the step, the signal and the checkpoint {rows}")
        run(demo + ["--out_dir", out, "--resume", "auto"], 2)
        check(losses(out) == losses(ref2), f"... and --resume auto gives the uninterrupted run's losses bit for bit")

    # the time limit with 2 ranks: the ranks agree on the step as for a signal (one past, the request travelling
    # during the next step)
    out = fresh("time-limit-2")
    p = run(demo + ["--out_dir", out, "--time_limit_minutes", "0.0001"], 2, expect_ok=False, timeout=120)
    at = max([k for k in losses(out) if isinstance(k, int)], default=0)
    ck = os.path.join(out, "checkpoints", f"step_{at:08d}")
    files = sorted(os.listdir(ck)) if os.path.isdir(ck) else []
    rows = stopped(out)
    check(p.returncode == 4 and at in (1, 2)
          and files == ["COMPLETE", "model.bin", "state_rank0.bin", "state_rank1.bin"]
          and [(r["step"], r["why"]) for r in rows] == [(at, "time limit of 1e-4 minutes")],
          f"2 ranks, --time_limit_minutes 0.0001: both stop after step {at} (exit {p.returncode}) with a checkpoint "
          f"{files} and a stopped line {rows} {p.stderr.strip()[:160]}")
    run(demo + ["--out_dir", out, "--resume", "auto"], 2)
    check(losses(out) == losses(ref2), "... and --resume auto gives the uninterrupted run's losses bit for bit")


def checkpoint_minutes_checks():
    """--checkpoint_every_minutes adds a checkpoint at the first step that ends that long after the last one (or the
    start): a tiny interval gives one at every step on 1 rank, every second step on 2 ranks (the ranks learn of it
    one step later, and a request sent before a checkpoint was saved is spent by it); a long one adds none."""
    common = BASE + ["--steps", "6", "--val_every", "0", "--keep_checkpoints", "0"]
    saved = lambda d: sorted(int(n[5:]) for n in os.listdir(os.path.join(d, "checkpoints")) if n.startswith("step_"))
    for ranks, minutes, expected in ((None, "1e-5", [1, 2, 3, 4, 5, 6]), (2, "1e-5", [2, 4, 6]), (None, "600", [6])):
        out = fresh(f"ck-minutes-{ranks or 1}-{minutes}")
        run(common + ["--out_dir", out, "--checkpoint_every_minutes", minutes], ranks)
        got = saved(out)
        check(got == expected, f"--checkpoint_every_minutes {minutes} on {ranks or 1} rank(s): checkpoints at {got}")


def flip_byte(path):
    with open(path, "r+b") as f:
        f.seek(os.path.getsize(path) // 2)
        b = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([b[0] ^ 0x01]))


def checksum_checks(source, two_rank):
    """source: a finished 1-rank AdamW run of resume_case (checkpoints at steps 3 and 6); two_rank: a 2-rank DeMo
    one, or None. A checkpoint's marker records every file's size and XXH64 as `xxhsum -H64` computes them; a
    resume on a flipped bit or a truncated file stops with one line naming it and leaves the out_dir as it was;
    with 2 ranks, a corrupt file of rank 1 ends the job before rank 0 says "resumed" or --overwrite deletes the
    later checkpoint."""
    ck = lambda d, step: os.path.join(d, "checkpoints", f"step_{step:08d}")
    if shutil.which("xxhsum") is None:
        check(False, "xxhsum (Debian's xxhash) is installed, to check the markers' checksums against")
    else:
        wrong = []
        for step in (3, 6):
            d = ck(source, step)
            listed = json.load(open(os.path.join(d, "COMPLETE"))).get("files", {})
            names = sorted(f for f in os.listdir(d) if f != "COMPLETE")
            if sorted(listed) != names:
                wrong.append(f"step {step} lists {sorted(listed)}, holds {names}")
            for name in names:
                path = os.path.join(d, name)
                digest = subprocess.run(["xxhsum", "-H64", path], capture_output=True, text=True).stdout.split()[:1]
                entry = listed.get(name, {})
                if [entry.get("xxh64")] != digest or entry.get("bytes") != os.path.getsize(path):
                    wrong.append(f"{name} at step {step}: marker {entry}, xxhsum {digest}")
        check(not wrong, f"each marker lists its checkpoint's files with xxhsum's XXH64 and their sizes {wrong[:2]}")

    common = BASE + ["--optimizer", "adamw", "--steps", "6", "--checkpoint_every", "3", "--keep_checkpoints", "0"]
    sums = fresh("sums")
    shutil.copytree(source, sums)
    metrics = open(os.path.join(sums, "metrics.jsonl"), "rb").read()

    def refused(args, path, needle, what, ranks=None):
        p = run(args, ranks, expect_ok=False, timeout=120)
        lines = [l for l in p.stderr.splitlines() if l.strip() and path in l]
        check(p.returncode != 0 and lines and needle in lines[0] and "resume an older checkpoint" in lines[0]
              and "resumed" not in p.stdout, f"{what}: {p.stderr.strip()[:240]}")
        return p

    # an explicit --resume stops on a damaged file (--resume auto falls back to an older one: test_reliability.sh)
    model = os.path.join(ck(sums, 6), "model.bin")
    flip_byte(model)
    p = refused(common + ["--out_dir", sums, "--resume", ck(sums, 6)], model, ": XXH64 ",
                "a resume on a model.bin with one flipped bit stops naming it")
    check(p.returncode == 1 and len(p.stderr.strip().splitlines()) == 1
          and open(os.path.join(sums, "metrics.jsonl"), "rb").read() == metrics,
          "... with one line and exit 1, metrics.jsonl untouched")
    flip_byte(model)
    # model.bin is checked as it loads; one that fails to load (short, bad magic) is reported by its checksum
    whole = open(model, "rb").read()
    os.truncate(model, len(whole) - 4)
    refused(common + ["--out_dir", sums, "--resume", ck(sums, 6)], model, "bytes, but its checkpoint's marker records",
            "a resume on a truncated model.bin stops naming it by the size its marker records")
    open(model, "wb").write(b"\0" + whole[1:])
    refused(common + ["--out_dir", sums, "--resume", ck(sums, 6)], model, ": XXH64 ",
            "a resume on a model.bin with a damaged header stops naming it by its checksum")
    open(model, "wb").write(whole)
    state = os.path.join(ck(sums, 3), "state_rank0.bin")
    os.truncate(state, os.path.getsize(state) - 1)
    refused(common + ["--out_dir", fresh("sums-b"), "--resume", ck(sums, 3)], state,
            "bytes, but its checkpoint's marker records", "a resume on a truncated state file stops naming it")

    if two_rank:
        demo = BASE + ["--optimizer", "demo", "--steps", "6", "--checkpoint_every", "3", "--keep_checkpoints", "0"]
        sums2 = fresh("sums2")
        shutil.copytree(two_rank, sums2)
        metrics = open(os.path.join(sums2, "metrics.jsonl"), "rb").read()
        state1 = os.path.join(ck(sums2, 3), "state_rank1.bin")
        flip_byte(state1)
        refused(demo + ["--out_dir", sums2, "--resume", ck(sums2, 3), "--overwrite"], state1, ": XXH64 ",
                "2 ranks: rank 1's corrupt state file ends the job before rank 0 says it resumed", 2)
        check(os.path.isfile(os.path.join(ck(sums2, 6), "COMPLETE"))
              and open(os.path.join(sums2, "metrics.jsonl"), "rb").read() == metrics,
              "... and before --overwrite deletes step 6 or the metrics are cut back")


def divergence_check():
    """A learning rate that makes the loss blow up: the run stops at the first step whose loss or norm is not finite,
    with exit status 3 (diverged, not failed) and one error line, that step's lines and a "diverged" line in the
    metrics, and no checkpoint of it (the one before stays, for --resume auto). (Its lr x weight_decay >= 1 gets a
    warning line before training.)"""
    out = fresh("diverged")
    p = run(BASE + ["--steps", "12", "--lr", "1e6", "--grad_clip", "0", "--checkpoint_every", "1", "--val_every", "0",
                    "--out_dir", out], None, expect_ok=False, timeout=120)
    lines = [l for l in p.stderr.splitlines() if l.strip()]
    warned = lines[:1] if lines and lines[0].startswith("warning: lr 1e6 x weight_decay 0.1 >= 1: ") else []
    lines = lines[len(warned):]
    rows = [json.loads(l) for l in open(os.path.join(out, "metrics.jsonl"))]
    train = [r for r in rows if r["type"] == "train"]
    last = train[-1]["step"] if train else 0
    bad = lambda r: r["loss"] is None or r["grad_norm"] is None or not math.isfinite(r["loss"] * r["grad_norm"])
    ckdir = os.path.join(out, "checkpoints")
    saved = sorted(os.listdir(ckdir)) if os.path.isdir(ckdir) else []
    check(warned and p.returncode == 3 and len(lines) == 1 and f"step {last}: the loss is" in lines[0]
          and "diverged" in lines[0]
          and 1 < last < 12 and bad(train[-1]) and not any(bad(r) for r in train[:-1])
          and rows[-1] == {**rows[-1], "type": "diverged", "step": last}
          and saved and saved[-1] == f"step_{last - 1:08d}",
          f"a diverging run stops at its first non-finite step ({last}) with exit 3, a diverged line and no checkpoint "
          f"of it (exit {p.returncode}, checkpoints {saved[-2:]}): {p.stderr.strip()[:200]}")


def config_checks():
    """The command line's values as the trainer reports them: numbers that are not plain decimals refused, a range
    error naming the file and key that set the value (or the flag, when one came later), floats shown as given; and
    settings that run but probably do not do what was meant (lr x weight_decay >= 1, warmup_steps > steps, demo_topk
    above a chunk's elements) each get one "warning:" line on stderr from rank 0, with --dry_run and before training,
    and the run goes on."""
    bad_lr = os.path.join(fresh("config-files"), "bad_lr.json")
    os.makedirs(os.path.dirname(bad_lr))
    with open(bad_lr, "w") as f:
        f.write('{"lr": -0.0}')
    for args, needle in [
        (["--steps", " 5"], "--steps: expected an integer, got ' 5'"),
        (["--steps", "+5"], "--steps: expected an integer, got '+5'"),
        (["--lr", "0x1p-10"], "--lr: expected a number, got '0x1p-10'"),
        (["--lr", "nan"], "--lr: expected a number, got 'nan'"),
        (["--config", bad_lr], bad_lr + ": key 'lr' must be > 0 (got -0)"),
        (["--lr", "1", "--config", bad_lr], bad_lr + ": key 'lr' must be > 0 (got -0)"),
        (["--config", bad_lr, "--lr", "-2"], "--lr must be > 0 (got -2)"),
        (["--eps", "-1e-9"], "--eps must be > 0 (got -1e-9)"),
        (["--optimizer", "demo", "--demo_alpha", "1.0000001"], "--demo_alpha must be in (0, 1] (got 1.0000001)"),
    ]:
        p = run(BASE + args + ["--out_dir", fresh("bad-config")], None, expect_ok=False, timeout=60)
        lines = [l for l in p.stderr.splitlines() if l.strip()]
        check(p.returncode == 1 and lines == ["error: " + needle],
              f"{' '.join(args)}: one-line error {needle!r}: {p.stderr.strip()[:200]}")

    def warnings(p):
        return [l for l in p.stderr.splitlines() if l.startswith("warning: ")]
    odd = ["--lr", "2", "--weight_decay", "0.75", "--steps", "3", "--warmup_steps", "4", "--optimizer", "demo",
           "--demo_topk", "65", "--checkpoint_every", "-1", "--time_limit_minutes", "230",
           "--checkpoint_every_minutes", "30"]
    expected = [
        "warning: lr 2 x weight_decay 0.75 >= 1: decoupled weight decay multiplies the decayed weights by "
        "1 - lr x weight_decay = -0.5 at the peak learning rate: it flips their sign instead of shrinking them",
        "warning: warmup_steps 4 > steps 3: the learning rate is still warming up at the last step, where it reaches "
        "1.5, not lr 2",
        # tiny.json: C = 64, so every 1-D tensor's chunk holds 64 elements (2 layers x 8 + ln_f's 2)
        "warning: demo_topk 65 exceeds the elements of the DeMo chunks of 18 of 28 tensors (demo_chunk 64; smallest: "
        "1 x 64 in h.0.ln_1.weight): their k is clamped to a chunk's elements, so they send every coefficient",
        "warning: time_limit_minutes 230 with checkpoint_every -1: the run stops at its limit without a checkpoint "
        "to continue from",
        "warning: checkpoint_every_minutes 30 with checkpoint_every -1: no checkpoint is written",
    ]
    p = run(BASE + odd + ["--dry_run", "--out_dir", fresh("odd-dry")], None, expect_ok=False, timeout=60)
    check(p.returncode == 0 and warnings(p) == expected and p.stderr.strip().splitlines() == expected,
          f"--dry_run: one warning line per odd setting, exit 0 (exit {p.returncode}): {p.stderr.strip()[:600]}")
    if shutil.which("mpirun"):
        p = run(BASE + odd + ["--dry_run", "--out_dir", fresh("odd-dry2")], 2, expect_ok=False, timeout=60)
        check(p.returncode == 0 and warnings(p) == expected,
              f"2 ranks, --dry_run: the warnings once, from rank 0 (exit {p.returncode}): {p.stderr.strip()[:600]}")
    out = fresh("odd-run")
    p = run(BASE + ["--steps", "2", "--warmup_steps", "3", "--val_every", "0", "--out_dir", out], None,
            expect_ok=False, timeout=120)
    warmup = ("warning: warmup_steps 3 > steps 2: the learning rate is still warming up at the last step, where it "
              "reaches 0.0006666667, not lr 0.001")
    steps = sorted(k for k in losses(out) if isinstance(k, int))
    check(p.returncode == 0 and warnings(p) == [warmup] and steps == [1, 2],
          f"a run with warmup_steps > steps warns once and trains (exit {p.returncode}): {p.stderr.strip()[:300]}")
    p = run(BASE + ["--steps", "3", "--out_dir", fresh("plain-run")], None, expect_ok=False, timeout=120)
    check(p.returncode == 0 and p.stderr.strip() == "",
          f"a plain run prints nothing on stderr: {p.stderr.strip()[:300]}")


def main():
    os.makedirs(TMP, exist_ok=True)
    config_checks()
    have_mpi = shutil.which("mpirun") is not None

    adamw1 = resume_case("adamw", None)
    cooldown_resume_check(adamw1)
    resume_case("demo", None)
    out_dir_history_checks(adamw1)
    divergence_check()
    demo2 = None
    if have_mpi:
        demo2 = resume_case("demo", 2)
        resume_case("adamw", 2)
        delayed = delay_checks()
        ddp_overlap_checks()

        # Another world size: DeMo's momenta redistributed (test_elastic_resume checks how), or with
        # --reset_momentum a fresh optimizer state.
        ck = os.path.join(demo2, "checkpoints", "step_00000003")
        common = BASE + ["--optimizer", "demo", "--steps", "5"]
        p = run(common + ["--out_dir", fresh("ws"), "--resume", ck], None, expect_ok=False)
        check(p.returncode == 0 and "world size changed: 2 -> 1 ranks" in p.stdout and "momenta: mean of" in p.stdout,
              "world-size change redistributes the momenta: " + (p.stdout + p.stderr).strip()[-200:])
        p = run(common + ["--out_dir", fresh("ws2"), "--resume", ck, "--reset_momentum"], None, expect_ok=False)
        check(p.returncode == 0 and sorted(k for k in losses(os.path.join(TMP, "ws2")) if isinstance(k, int)) == [4, 5],
              "world-size change with --reset_momentum continues at step 4")
        sent = lambda d: {r["step"]: r["cum_bytes_sent"]
                          for r in map(json.loads, open(os.path.join(d, "metrics.jsonl"))) if r.get("type") == "train"}
        before, after = sent(demo2).get(3, 0), sent(os.path.join(TMP, "ws2")).get(4, -1)
        check(before > 0 and after >= before,
              f"... and its byte count goes on from rank 0's ({before} bytes at step 3, {after} at step 4)")
        # eval_gpt gives a run's logged val loss with --batches = its --val_batches (2) x its ranks (2): each rank
        # validates on its own batches
        p = subprocess.run(["./eval_gpt", "--model", demo2, "--batch_size", "4", "--seq_len", "32", "--batches", "4",
                            "--threads", "2", "--json"], cwd=ROOT, capture_output=True, text=True, timeout=120)
        logged = losses(demo2)["val6"]
        evaluated = json.loads(p.stdout)["loss"] if p.returncode == 0 else float("nan")
        check(abs(evaluated - logged) <= 1e-6 * logged,
              f"eval_gpt --batches 2 x 2 on a 2-rank run's last checkpoint: {evaluated}, its logged val loss {logged}")

        # AdamW-DDP: 2 ranks x B=2 equals 1 rank x B=4 on the same data (no shuffling: both read the same rows).
        ddp = BASE + ["--optimizer", "adamw", "--steps", "5", "--shuffle=false", "--val_batches", "0"]
        run(ddp + ["--batch_size", "2", "--out_dir", fresh("ddp2")], 2)
        run(ddp + ["--batch_size", "4", "--out_dir", fresh("ddp1")], None)
        l2, l1 = losses(os.path.join(TMP, "ddp2")), losses(os.path.join(TMP, "ddp1"))
        diff = max(abs(l2[k] - l1[k]) for k in range(1, 6))
        # Same math, different float summation order (per-rank means, then the all-reduce); Adam normalizes
        # updates, so differences stay at the level of rounding: 1e-4 on losses around 10.
        check(diff < 1e-4, f"AdamW-DDP 2 ranks x B=2 == 1 rank x B=4 (max loss diff {diff:.2e})")

        # Bad input under MPI: every rank says why, the job exits non-zero, nothing hangs.
        for args, needle in [
            (["--optimizer", "demo", "--demo_topk", "0"], "--demo_topk"),
            (["--optimizer", "demo", "--demo_decay", "1.5"], "--demo_decay"),
            (["--optimizer", "demo", "--demo_chunk", "0"], "--demo_chunk"),
            (["--total_batch_size", "200"], "--total_batch_size 200 is not a multiple"),
            (["--bogus_flag", "1"], "--bogus_flag: unknown flag"),
        ]:
            p = run(BASE + args + ["--out_dir", fresh("bad")], 2, expect_ok=False, timeout=60)
            check(p.returncode != 0 and p.stderr.count(needle) >= 1,
                  f"mpirun -np 2 {' '.join(args)}: clean error naming {needle}")
        # Ranks started with different configs (MPMD launch).
        cmd = ["mpirun", "-np", "1", TRAINER] + BASE + ["--lr", "1e-3", "--threads", "1", "--out_dir", fresh("mm"), ":",
               "-np", "1", TRAINER] + BASE + ["--lr", "2e-3", "--threads", "1", "--out_dir", fresh("mm")]
        p = subprocess.run(cmd, cwd=ROOT, env=MPI_ENV, capture_output=True, text=True, timeout=60)
        check(p.returncode != 0 and "rank 1 was started with --lr=0.002" in p.stderr,
              "mismatched configs across ranks are refused: " + p.stderr.strip()[:160])
        rank_dies_mid_run()
        rank_hangs_mid_run()
        stop_signal_checks()
        checkpoint_minutes_checks()

    throughput_checks(demo2)
    checksum_checks(adamw1, demo2)

    # Bad input, single process.
    shard_dir = fresh("badshards")
    os.makedirs(shard_dir)
    good = sorted(f for f in os.listdir(os.path.join(ROOT, "data/default")) if "_train_" in f)[0]
    data = open(os.path.join(ROOT, "data/default", good), "rb").read()
    open(os.path.join(shard_dir, "bad_train_000.bin"), "wb").write(b"\x00" * 4 + data[4:200000])
    os.mkfifo(os.path.join(shard_dir, "fifo_train_000.bin"))  # opening it to read would wait for a writer
    def tokenizer_file(name, tokens, eot):  # llm.c's tokenizer format, version 2, every token the text "a"
        path = os.path.join(shard_dir, name)
        with open(path, "wb") as f:
            f.write(struct.pack("<256I", 20240328, 2, tokens, eot, *([0] * 252)) + b"\x01a" * tokens)
        return path
    small_tokenizer = tokenizer_file("tokenizer1000.bin", 1000, 999)  # valid, but too few tokens
    for args, needle in [
        # without its magic the file is no llm.c shard: --data_format auto would read it as an OLMo token file
        (["--train_data", os.path.join(shard_dir, "bad_train_*.bin"), "--data_format", "llmc"],
         "bad_train_000.bin: bad magic"),
        (["--train_data", "no/such/*.bin"], "no/such/*.bin: no files match"),
        (["--train_data", os.path.join(shard_dir, "fifo_train_*.bin")], "fifo_train_000.bin: not a regular file"),
        (["--train_data", ""], "--train_data is empty"),
        (["--total_batch_size", "4611686018427387904", "--batch_size", "1", "--seq_len", "1"],
         "needs 4611686018427387904 micro-steps per step"),
        (["--dry_run", "--optimizer", "demo", "--demo_topk", "0"], "--demo_topk must be >= 1"),  # as a run checks
        (["--dry_run", "--beta1", "2"], "--beta1 must be in [0, 1)"),
        (["--sample_every", "1", "--tokenizer", small_tokenizer], "holds 1000 tokens, fewer than the 50257"),
        (["--sample_every", "1", "--eos_token_id", "50299"],  # samples start with it
         "--eos_token_id 50299 is outside the vocabulary [0, 50257)"),
        (["--init_from", "no_model.bin"], "no_model.bin: cannot open"),
        (["--resume", os.path.join(TMP, "nothing")], "checkpoint directory does not exist"),
        (["--lr", "abc"], "--lr: expected a number, got 'abc'"),
        (["--peak_tflops", "-1"], "--peak_tflops must be >= 0"),
        (["--config", "configs/nope.json"], "configs/nope.json: cannot open"),
    ]:
        p = run(BASE + args + ["--out_dir", fresh("bad1")], None, expect_ok=False, timeout=60)
        lines = [l for l in p.stderr.splitlines() if l.strip()]
        check(p.returncode != 0 and len(lines) == 1 and needle in lines[0], f"{' '.join(args)}: one-line error: {p.stderr.strip()[:160]}")
    bad_input_checks_after_start(shard_dir, data, os.path.join(TMP, "adamw-np1-a"))
    # A checkpoint whose shape disagrees with the config.
    model = os.path.join(TMP, "adamw-np1-a", "checkpoints", "step_00000003", "model.bin")
    p = run(BASE + ["--init_from", model, "--num_layers", "3", "--out_dir", fresh("bad2")], None, expect_ok=False)
    check(p.returncode != 0 and "model.bin" in p.stderr and "disagrees" in p.stderr,
          "model file of another shape refused: " + p.stderr.strip()[:200])

    print(f"{len(failures)} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
