"""The CUDA trainer on the emulated device (build/emu*/train_gpt: train_gpt.cu compiled by g++, its kernels run
by emu/block_emulator.h, the CUDA runtime, cuBLASLt and NCCL served by emu/{runtime,cublas,nccl}.cpp), checked against
the CPU trainer on the tiny config with a vocabulary of 1001 tokens and the default corpus folded into it (run
by test/emulated/test_emulated_gpu.sh, which writes the PyTorch references first).

- OLMo (--arch olmo on the tiny shape: configs/tiny_olmo.json at the small vocabulary; LayerNorm and RMSNorm):
  the fp32 build gives the CPU trainer's losses to summation-order noise with AdamW and DeMo on 1 and 2 ranks
  (the bytes exactly), the bf16 build to bf16 precision with both attentions (flash on RoPE'd q and k, one head
  of 64), --cuda_graph keeps its bits, and its resume is bit-identical with both optimizers.
- The GPU tests (test/gpu/gpu_test_gpt2.cu, test/gpu/gpu_test_demo.cu: see test/emulated/test_emulated_gpu.sh) and the NCCL
  transport's checker (dev/cuda/nccl_transport.cu) at 1, 2 and 3 ranks.
- fp32 build: per-step losses and gradient norms of AdamW and DeMo, 1 rank and 2 ranks (the NCCL transport's
  code over MPI), match ./train_gpt_cpu to summation-order noise, and the byte counters match exactly; AdamW's
  all-reduce overlapped with the backward (the default) gives the bits of the one after it, with and without
  gradient accumulation; --grad_wire bf16 gives the CPU trainer's losses and bytes on every path; so do
  DeMo's 1-bit and bf16 values, 12-bit indices, EMA momentum and non-64 chunk shapes (2 ranks), and, with
  gradient accumulation, the validation losses, the --choices accuracies and the text samples;
  --transport mpi (buckets and gradients through pinned host memory) gives the NCCL path's losses, and its
  overlapped all-reduce (through the host, on MPI's reducer thread) the bits and bytes of the one after the
  backward.
- bf16 build: losses match the CPU trainer to bf16 precision for both attentions (flash needs head size 64:
  one head of width 64) and every GELU fusion level; matmul.cuh's fallbacks, driven by the emulated cuBLASLt
  refusing every epilogue or every problem, train as closely and agree with each other bit for bit; with
  --matmul_tune true (each new problem's candidate algorithms run and timed first) the bits of the untuned run, and
  with --cuda_graph true (each micro-step's kernels captured into a graph and replayed; also for DeMo over 1 and 2
  ranks and with 2 micro-steps per step) the bits of the run without; with --flash_dq shares_last (flash's dQ
  shares summed in the backward kernel by the last key tile to write) the bits of the shares' sum kernel; with
  --bias_grad epilogue (the qkv and fc bias gradients from the emulated cuBLASLt's BGRADB epilogue, counted)
  the CPU trainer's losses, and under the epilogue refusal the column reduction's bits.
- DeMo with the momentum in the DCT domain (--demo_momentum_domain dct, with fp32 and tensor-core DCTs) trains as
  the CPU trainer to rounding; its checkpoints record the domain (its own resume is bit-identical, the CPU
  trainer resumes it converted).
- --optimizer topk (DeMo without the transform: the kernels' IDENTITY instantiations) gives the CPU trainer's topk
  losses and bytes on 1 and 2 ranks (fp32), and a bf16 run resumes bit for bit.
- DeMo with the kernel lab's tunings (--demo_kernel_tuning 0, 1, 2, 3 in fp32, 0 and 1 in bf16) gives the
  default kernels' bits (tuning 3: --demo_dct tensor's); tunings 0, 2 and 3 run the exact apply, the default
  the lean I/O one.
- The fp32 DeMo run and the bf16 flash-attention run give the same bits with every launch's threads run in
  shuffled and warp-by-warp order (LLMC_EMU_ORDER), as they must: a missing barrier would show.
- A run resumed from its own checkpoint continues with bit-identical losses (AdamW and DeMo); a checkpoint
  of the CPU trainer resumes on the emulated GPU trainer and continues at the CPU trainer's losses.
- DeMo with --demo_delay 1 (each step's update applied at the next step, its all-gather overlapping that step's
  compute), 2 ranks over NCCL and over MPI: the CPU trainer's delayed losses and bytes per step, with eager
  updates (the default: each rank's working weights take its own share at once) and, over NCCL, without
  (--demo_eager false); its checkpoints carry the pending round, so a bf16 run resumes bit for bit and a CPU
  checkpoint continues on the GPU trainer (both rewriting the working weights from the pending round).
- The 2-rank runs give the same bits and bytes in other stream orders (LLMC_EMU_STREAMS=eager, first_ahead,
  last_ahead), as they must if every dependency between the compute, communication and copy streams is in place.
- Host waits per step: one on one rank, and it leaves the GPU the next step's micro-steps to run (none idles it)
  unless something is due after the step; on 2 ranks the step's end does not idle it either, only the
  collective's end inside the optimizer's step does; a batch that fails to load meanwhile (on 1 or 2 ranks) is
  reported after the step, as the CPU trainer reports it.
- A rank killed mid-run ends the 2-rank job (then --resume auto finishes it); a stopped rank ends it after
  --comm_timeout; a damaged bucket over NCCL stops it with the CPU decoder's message; a stop signal to one rank
  stops both at a step with a checkpoint, and the resumed run gives the straight run's bits; so does
  --time_limit_minutes (one rank), and --checkpoint_every_minutes adds checkpoints.
The commands run concurrently, as many at a time as the machine has cores (Pool), and the checks are evaluated
once the runs they read have ended, then printed in order; failures are reported together at the end.
"""
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "e2e"))
import train_cpu_checks as cpu_checks  # noqa: E402 (the CPU trainer's checks: test/e2e)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TMP = os.path.join(ROOT, "build", "test-tmp", "emulated")
CPU = os.path.join(ROOT, "train_gpt_cpu")
EMU = {"bf16": os.path.join(ROOT, "build", "emu", "train_gpt"),
       "fp32": os.path.join(ROOT, "build", "emu-fp32", "train_gpt")}
# configs/tiny.json with 1001 tokens (odd, as GPT-2's 50257) in 1152 wte rows (a multiple of 64, 48 and 128), and the
# default corpus's shards with every token id taken mod 1001 (write_small_vocabulary): at 50257 tokens the
# classifier and DeMo's compression of wte were most of the emulated device's time. The kernels' strides over
# long rows are checked in test_llmc_kernels_emu and test_demo_kernels_emu.
VOCAB, PADDED_VOCAB = 1001, 1152
CONFIG = os.path.join(TMP, "tiny-vocab1001.json")
DATA = os.path.join(TMP, "vocab1001-data")
BASE = ["--config", CONFIG, "--train_data", os.path.join(DATA, "default_train_*.bin"),
        "--val_data", os.path.join(DATA, "default_val_*.bin"), "--tokenizer", os.path.join(DATA, "tokenizer.bin"),
        "--batch_size", "4", "--seq_len", "32", "--lr",
        "1e-3", "--warmup_steps", "1", "--val_every", "0", "--val_batches", "1", "--sample_every", "0",
        "--checkpoint_every", "0"]


def write_small_vocabulary():
    """Writes CONFIG and DATA (see BASE): the default corpus's shards, headers kept, token ids mod VOCAB, and a
    tokenizer of GPT-2's first VOCAB - 1 tokens and its end-of-text token as the last, which starts samples (the
    config's eos_token_id; the padding token too)."""
    config = {k: v for k, v in json.load(open(os.path.join(ROOT, "configs", "tiny.json"))).items()
              if not k.startswith("_")}
    with open(CONFIG, "w") as f:
        json.dump(dict(config, vocab_size=VOCAB, padded_vocab_size=PADDED_VOCAB, eos_token_id=VOCAB - 1,
                       pad_token_id=VOCAB - 1), f)
    os.makedirs(DATA, exist_ok=True)
    source = os.path.join(ROOT, "data", "default")
    for name in sorted(os.listdir(source)):
        if re.fullmatch(r"default_(train|val)_\d+\.bin", name):
            raw = open(os.path.join(source, name), "rb").read()
            tokens = np.frombuffer(raw, dtype=np.uint16, offset=1024) % VOCAB
            with open(os.path.join(DATA, name), "wb") as f:
                f.write(raw[:1024] + tokens.astype(np.uint16).tobytes())
    raw = open(os.path.join(source, "tokenizer.bin"), "rb").read()
    magic, version, count, eot = np.frombuffer(raw, dtype=np.uint32, count=4)
    entries, at = [], 1024
    for _ in range(count):
        entries.append(raw[at:at + 1 + raw[at]])
        at += 1 + raw[at]
    header = np.zeros(256, dtype=np.uint32)
    header[:4] = [magic, 2, VOCAB, VOCAB - 1]
    with open(os.path.join(DATA, "tokenizer.bin"), "wb") as f:
        f.write(header.tobytes() + b"".join(entries[:VOCAB - 1]) + entries[eot])
ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
           OMPI_MCA_rmaps_base_oversubscribe="1", OMP_NUM_THREADS="1")
for knob in ("LLMC_EMU_CUBLASLT_NO_EPILOGUE", "LLMC_EMU_CUBLASLT_NO_ALGO", "LLMC_EMU_ORDER", "LLMC_EMU_STREAMS",
             "LLMC_EMU_HOST_WAITS", "LLMC_EMU_NCCL_CORRUPT", "LLMC_EMU_CUBLASLT_COUNTS"):
    ENV.pop(knob, None)


class Lazy:
    """A value computed once, when first asked for: a run's outcome, asked for by the checks that read it."""

    def __init__(self, compute):
        self._compute = compute
        self._lock = threading.Lock()
        self._done = False
        self._value = None

    def get(self):
        with self._lock:
            if not self._done:
                self._value = self._compute()
                self._done = True
        return self._value

    def tail(self, n):
        """The last n steps' metrics (None if the run failed)."""
        return Lazy(lambda: self.get()[-n:] if self.get() else None)

    def __getitem__(self, i):  # a failed run's None raises here, and the check reading it fails
        return self.get()[i]


def value(x):
    return x.get() if isinstance(x, Lazy) else x


class Pool:
    """Runs the checks' commands concurrently on this machine's cores (LLMC_TEST_JOBS overrides the count), each
    taking `cost` cores (its ranks, or its OpenMP threads): the earliest submitted that fits starts first, once the
    commands it reads from (`after`: a checkpoint to resume, say) have ended. The emulated device runs a kernel on
    one core, so two one-rank runs on two cores take the time of one."""

    def __init__(self):
        self.slots = max(1, int(os.environ.get("LLMC_TEST_JOBS") or len(os.sched_getaffinity(0))))
        self.free = self.slots
        self.waiting = {}  # submission index -> cost, of the commands ready to start
        self.cond = threading.Condition()
        self.jobs = []

    def submit(self, name, cmd, env, cost, after=(), timeout=600, prepare=None):
        """A Lazy of the finished subprocess.CompletedProcess (output captured); a command that could not run or
        ran past `timeout` seconds reads as exit status -1 with the reason in its stderr."""
        index, cost = len(self.jobs), min(cost, self.slots)
        outcome = {}

        def fits():
            return self.free >= cost and all(c > self.free for i, c in self.waiting.items() if i < index)

        def work():
            for job in after:
                job.get()
            with self.cond:
                self.waiting[index] = cost
                self.cond.wait_for(fits)
                del self.waiting[index]
                self.free -= cost
            start = time.time()
            try:
                if prepare:
                    prepare()
                # errors="replace": a printed sample may hold a token's partial UTF-8 sequence
                outcome["p"] = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True,
                                              errors="replace", timeout=timeout)
            except (OSError, ValueError, subprocess.SubprocessError) as e:
                outcome["p"] = subprocess.CompletedProcess(cmd, -1, "", f"{name}: could not run: {e}")
            finally:
                with self.cond:
                    self.free += cost
                    self.cond.notify_all()
            print(f"      ran {name} in {time.time() - start:.1f} s", flush=True)

        thread = threading.Thread(target=work, daemon=True)
        self.jobs.append(thread)
        thread.start()
        return Lazy(lambda: (thread.join(), outcome["p"])[1])

    def drain(self):
        """Waits for every command submitted so far (before a check that times a job must have the cores)."""
        for thread in list(self.jobs):
            thread.join()


POOL = Pool()
checks = []  # (thunk -> (ok, text), output to show first or None), reported in order by report()


def check(cond, what, show=None):
    """Records a check: `cond` a bool or a callable (evaluated at report(), after the runs it reads have ended);
    `what` a string or a callable giving it."""
    checks.append((lambda: (bool(cond() if callable(cond) else cond), what() if callable(what) else what), show))


def report():
    """Evaluates the recorded checks in order and prints them; the number that failed."""
    failed = 0
    for thunk, show in checks:
        try:
            if show:
                print(show(), flush=True)
            ok, text = thunk()
        except Exception as e:  # a check reading a failed run's metrics
            ok, text = False, f"check raised {type(e).__name__}: {e}"
        failed += not ok
        print(("ok    " if ok else "FAIL  ") + text, flush=True)
    return failed


def split_knobs(knobs):
    """A run's knobs as flags and environment: a lower-case name is a config key (attention="flash": --attention
    flash), an upper-case one an environment variable of the emulated device (LLMC_EMU_ORDER)."""
    knobs = knobs or {}
    flags = [x for k, v in knobs.items() if k.islower() for x in ("--" + k, str(v))]
    return flags, {k: v for k, v in knobs.items() if not k.islower()}


def launch(trainer, name, args, ranks=None, knobs=None, timeout=600, fresh=True, after=()):
    """Submits a trainer run (on `ranks` MPI ranks) into TMP/name (emptied first unless not `fresh`) with ENV and
    `knobs` (split_knobs): a Lazy of the finished process, its output captured."""
    out = os.path.join(TMP, name)
    flags, env = split_knobs(knobs)
    cmd = [trainer] + BASE + args + flags + ["--out_dir", out]
    if ranks:
        cmd = ["mpirun", "-np", str(ranks)] + cmd + ["--threads", "1"]
    else:
        cmd += ["--threads", "2"]
    # the emulated device's host is one thread; the CPU trainer's --threads 2 takes two cores
    cost = ranks or (2 if trainer == CPU else 1)
    return POOL.submit(name, cmd, dict(ENV, **env), cost, after, timeout,
                       prepare=(lambda: shutil.rmtree(out, ignore_errors=True)) if fresh else None)


class Run(Lazy):
    """A submitted trainer run: its train metrics (one dict per step), or None (its output's tail printed) if
    it failed."""

    def __init__(self, name, process):
        self.name, self.process = name, process
        super().__init__(self._finish)

    def _finish(self):
        p = self.process.get()
        if p.returncode != 0:
            print(f"      {self.name}: exit {p.returncode}\n" + (p.stdout + p.stderr)[-1500:], flush=True)
            return None
        return metrics(os.path.join(TMP, self.name))

    def metrics(self, kind):
        """Its metrics of another kind (val, sample), or None if it failed."""
        return metrics(os.path.join(TMP, self.name), kind) if self.get() is not None else None

    def recorded(self, key):
        """What its config.json records for `key`: what the run resolved (_run.key), else the config key (None if
        it failed)."""
        if self.get() is None:
            return None
        with open(os.path.join(TMP, self.name, "config.json")) as f:
            doc = json.load(f)
        return doc["_run"].get(key, doc.get(key))


def run(trainer, name, args, ranks=None, knobs=None, fresh=True, after=()):
    """launch(), as a Run."""
    return Run(name, launch(trainer, name, args, ranks, knobs, fresh=fresh, after=after))


def steps_logged(name):
    """How many train steps run `name` logged (0 without metrics)."""
    out = os.path.join(TMP, name)
    return len(metrics(out)) if os.path.exists(os.path.join(out, "metrics.jsonl")) else 0


def metrics(out, kind="train"):
    with open(os.path.join(out, "metrics.jsonl")) as f:
        rows = [json.loads(line) for line in f]
    return [r for r in rows if r.get("type") == kind]


def close(a, b, key, rel):
    a, b = value(a), value(b)
    if a is None or b is None or len(a) != len(b):
        return False, float("inf")
    worst = max(abs(x[key] - y[key]) / max(abs(y[key]), 1e-12) for x, y in zip(a, b))
    return worst <= rel, worst


def compare(what, got, want, key, rel):
    def thunk():
        ok, worst = close(got, want, key, rel)
        return ok, f"{what}: {key} within {rel:g} relative (worst {worst:.2e})"
    checks.append((thunk, None))


def same(what, a, b, keys=("loss", "grad_norm")):
    def equal():
        x, y = value(a), value(b)
        return x is not None and y is not None and len(x) == len(y) and all(
            p[k] == q[k] for p, q in zip(x, y) for k in keys)
    check(equal, what)


def gpu_tests():
    """The GPU tests (test/gpu/gpu_test_*.cu) on the emulated device, against the PyTorch references that
    test/emulated/test_emulated_gpu.sh wrote into TMP/tiny, TMP/tiny_masked and TMP/hs64, and the NCCL transport's
    checker (its collectives over MPI) at 1, 2 and 3 ranks (3: the ring model's rounding). Each prints its own
    comparisons, shown with its check; `expect` names the path it must have taken. The longest are submitted
    first."""
    emu, fp32 = os.path.join(ROOT, "build", "emu"), os.path.join(ROOT, "build", "emu-fp32")
    tiny, hs64 = os.path.join(TMP, "tiny"), os.path.join(TMP, "hs64")  # hs64: head size 64, flash attention's
    masked = os.path.join(TMP, "tiny_masked")  # targets -1: every row's last position and all of row 1
    tests = (
        # bf16 DeMo: the trainer checks below
        (None, {}, f"{fp32}/gpu_test_demo", tiny),
        ("DCT domain", {"demo_momentum_domain": "dct"}, f"{fp32}/gpu_test_demo", tiny),
        ("attention flash", {}, f"{emu}/gpu_test_gpt2", hs64),
        ("attention flash (atomic dQ)", {"flash_dq": "atomic"}, f"{emu}/gpu_test_gpt2", hs64),
        # the bf16 dQ shares, with the micro-steps as a CUDA graph (the graph keeps the bits: the trainer checks)
        ("attention flash (bf16 dQ shares), GELU fusion level 2, micro-steps as a CUDA graph",
         {"flash_dq": "shares_bf16", "cuda_graph": "true"}, f"{emu}/gpu_test_gpt2", hs64),
        # the defaults (the emulated device reports sm_90: both GELU epilogues) and the GELU as separate kernels
        # (the default before sm_90)
        ("attention matmul, GELU fusion level 2", {}, f"{emu}/gpu_test_gpt2", tiny),
        ("GELU fusion level 0", {"gelu_fusion": "none"}, f"{emu}/gpu_test_gpt2", tiny),
        # the qkv and fc bias gradients from cuBLASLt's BGRADB epilogue (the emulated cuBLASLt's own sums)
        ("bias gradients from the BGRADB epilogue", {"bias_grad": "epilogue"}, f"{emu}/gpu_test_gpt2", tiny),
        ("bias gradients from the BGRADB epilogue", {"bias_grad": "epilogue"}, f"{fp32}/gpu_test_gpt2", tiny),
        (None, {}, f"{fp32}/gpu_test_gpt2", tiny),
        # positions without a target: the classifier's zero rows, the loss and its scale over the others
        ("micro-steps as a CUDA graph", {"cuda_graph": "true"}, f"{emu}/gpu_test_gpt2", masked),
        (None, {}, f"{fp32}/gpu_test_gpt2", masked))
    commands = [(expect, [binary, ref] + split_knobs(knobs)[0], 1) for expect, knobs, binary, ref in tests]
    commands += [(None, ["mpirun", "-np", str(n), f"{emu}/nccl_transport"], n) for n in (1, 2, 3)]
    for expect, cmd, cost in commands:
        shown = " ".join(os.path.relpath(c, ROOT) if c.startswith(ROOT) else c for c in cmd)
        process = POOL.submit(shown, cmd, ENV, cost)
        check(lambda p=process, e=expect: p.get().returncode == 0 and (e is None or e in p.get().stdout),
              f"GPU test: {shown}" + (f" (ran with '{expect}')" if expect else ""),
              show=lambda p=process, s=shown: f"== {s}\n" + (p.get().stdout + p.get().stderr).rstrip())


def two_ranks_at_step_3(name, args, what):
    """The 2-rank bf16 GPU trainer run `args` into TMP/name, caught at step 3 (cpu_checks.start_two_ranks):
    (mpirun's process, the rank PIDs), or (process, None) after a failed check naming `what` it was caught for."""
    out = os.path.join(TMP, name)
    shutil.rmtree(out, ignore_errors=True)
    p, ranks = cpu_checks.start_two_ranks(out, BASE + args, 3, trainer=EMU["bf16"])
    if ranks is None:
        check(False, f"GPU trainer, 2 ranks: could not catch the run at step 3 to {what} a rank")
    return p, ranks


def rank_dies_or_stops():
    # A rank that dies or stops mid-run on the GPU trainer over NCCL, as test/e2e/train_cpu_checks.py does on the CPU
    # trainer: killed (SIGKILL), the job ends within seconds with no rank left blocked in a collective, and
    # --resume auto continues from the last complete checkpoint to the end; stopped (SIGSTOP), the other rank's
    # collective gives up after --comm_timeout with the watchdog's message, and the job ends. Timed: run with
    # the pool drained.
    POOL.drain()
    args = ["--optimizer", "demo", "--steps", "12", "--checkpoint_every", "2", "--keep_checkpoints", "2"]
    p, ranks = two_ranks_at_step_3("rank-killed", args, "kill")
    if ranks is not None:
        os.kill(ranks[-1], signal.SIGKILL)
        code, _, took, survivors = cpu_checks.wait_for_job_end(p, ranks, 60)
        check(code not in (None, 0) and not survivors,
              f"GPU trainer, 2 ranks over NCCL: a rank killed at step >= 3 ends the job: mpirun exit {code} after "
              f"{took:.1f} s, surviving ranks {survivors}")
        resumed = run(EMU["bf16"], "rank-killed", args + ["--resume", "auto"], ranks=2, fresh=False).get()
        check(resumed is not None and [m["step"] for m in resumed] == list(range(1, 13)),
              "GPU trainer, 2 ranks: --resume auto after the kill continues to step 12 "
              f"({len(resumed) if resumed else 0} steps logged)")
    p, ranks = two_ranks_at_step_3("rank-stopped", ["--optimizer", "adamw", "--steps", "300", "--comm_timeout", "5"],
                                   "stop")
    if ranks is not None:
        os.kill(ranks[-1], signal.SIGSTOP)
        code, err, took, survivors = cpu_checks.wait_for_job_end(p, ranks, 60)
        line = next((l for l in err.splitlines() if "did not complete" in l), err.strip()[-200:])
        check(code not in (None, 0) and not survivors and "did not complete within 5 s (--comm_timeout)" in err,
              f"GPU trainer, 2 ranks over NCCL: a stopped rank ends the job after --comm_timeout 5: mpirun exit "
              f"{code} after {took:.1f} s, surviving ranks {survivors}: {line}")
    # --time_limit_minutes already past when the first step reports: the run stops after it (or the step queued
    # ahead of the report) with a checkpoint, exit 4 and a stopped line, as the CPU trainer does.
    limited = launch(EMU["fp32"], "time-limit",
                     ["--optimizer", "adamw", "--steps", "12", "--time_limit_minutes", "1e-4"])

    def time_limit_outcome():
        out = os.path.join(TMP, "time-limit")
        rows = [(r["step"], r["why"]) for r in metrics(out, "stopped")] if limited.get().returncode == 4 else []
        at = rows[0][0] if rows else 0
        complete = os.path.isfile(os.path.join(out, "checkpoints", f"step_{at:08d}", "COMPLETE"))
        return limited.get().returncode, rows, complete

    check(lambda: time_limit_outcome()[0] == 4 and time_limit_outcome()[2]
          and time_limit_outcome()[1] in ([(1, "time limit of 1e-4 minutes")], [(2, "time limit of 1e-4 minutes")]),
          lambda: f"GPU trainer, --time_limit_minutes 1e-4: stops after step 1 or 2 with a checkpoint and a "
                  f"stopped line (exit, stopped lines, checkpoint complete: {time_limit_outcome()})")

    # --checkpoint_every_minutes with a tiny interval: the request of a step's report reaches the step after the
    # next (that one is decided before the report), so one rank checkpoints every second step, as 2 CPU ranks do.
    every_minutes = launch(EMU["fp32"], "checkpoint-minutes", ["--optimizer", "adamw", "--steps", "6",
                                                               "--checkpoint_every_minutes", "1e-5",
                                                               "--keep_checkpoints", "0"])

    def checkpoint_steps():
        folder = os.path.join(TMP, "checkpoint-minutes", "checkpoints")
        if every_minutes.get().returncode != 0 or not os.path.isdir(folder):
            return None
        return sorted(int(n[5:]) for n in os.listdir(folder) if n.startswith("step_"))

    check(lambda: checkpoint_steps() == [2, 4, 6],
          lambda: f"GPU trainer, --checkpoint_every_minutes 1e-5: checkpoints at steps {checkpoint_steps()}")

    # A stop signal to one rank, with a --demo_delay round in flight and the next step queued ahead: both ranks
    # stop at the same step with a checkpoint of it and exit 4, and --resume auto gives the straight run's bits.
    args = ["--optimizer", "demo", "--demo_delay", "1", "--steps", "12"]
    straight = run(EMU["fp32"], "stop-straight", args, ranks=2).get()
    out = os.path.join(TMP, "stop-signal")
    shutil.rmtree(out, ignore_errors=True)
    p, ranks = cpu_checks.start_two_ranks(out, BASE + args, 3, trainer=EMU["fp32"])
    if ranks is not None:
        os.kill(ranks[-1], signal.SIGUSR1)
        code, err, took, survivors = cpu_checks.wait_for_job_end(p, ranks, 60)
        logged = metrics(out)
        at = logged[-1]["step"] if logged else 0
        ck = os.path.join(out, "checkpoints", f"step_{at:08d}")
        complete = os.path.isfile(os.path.join(ck, "COMPLETE"))
        stopped = [(r["step"], r["checkpoint"]) for r in metrics(out, "stopped")]
        check(code == 4 and 3 <= at < 12 and complete and not survivors and stopped == [(at, ck)],
              f"GPU trainer, 2 ranks: SIGUSR1 to one rank stops both after step {at} with a checkpoint and a "
              f"stopped line {stopped} (mpirun exit {code} after {took:.1f} s) {err.strip()[:160]}")
        resumed = run(EMU["fp32"], "stop-signal", args + ["--resume", "auto"], ranks=2, fresh=False).get()
        key = lambda rows: [(m["step"], m["loss"], m["grad_norm"]) for m in rows or []]
        check(resumed is not None and straight is not None and key(metrics(out)) == key(straight),
              "GPU trainer, 2 ranks: --resume auto after the stop gives the straight run's 12 steps bit for bit")


def olmo_checks(steps):
    """OLMo (configs/tiny.json's shape with --arch olmo: configs/tiny_olmo.json at the small vocabulary; RoPE, no
    biases, LayerNorm without parameters or --norm rmsnorm, SwiGLU MLP) on the GPU trainer against the CPU
    trainer: the fp32 build to summation-order noise with both optimizers on 1 and 2 ranks (the bytes exactly),
    RMSNorm too; the bf16 build to bf16 precision with both attentions (flash on one head of 64, RoPE'd q and k)
    and --cuda_graph keeping the bits; resume bit-identical with both optimizers (RMSNorm's weights in DeMo's)."""
    olmo = steps + ["--arch", "olmo"]
    rms = olmo + ["--norm", "rmsnorm"]
    for opt, rel in (("adamw", 2e-5), ("demo", 1e-4)):
        for ranks in (None, 2):
            tag = f"{opt}-{ranks or 1}"
            args = olmo + ["--optimizer", opt]
            if opt == "adamw" and not ranks:  # the validation loss and a text sample (the forward without targets)
                args += ["--val_every", "4", "--sample_every", "4", "--sample_tokens", "8"]
            cpu = run(CPU, f"cpu-olmo-{tag}", args, ranks=ranks)
            emu = run(EMU["fp32"], f"fp32-olmo-{tag}", args, ranks=ranks)
            where = f"{ranks or 1} rank{'s' if ranks else ''}"
            compare(f"OLMo fp32 {opt}, {where}, vs CPU trainer", emu, cpu, "loss", rel)
            compare(f"OLMo fp32 {opt}, {where}, vs CPU trainer", emu, cpu, "grad_norm", 1e-3)
            if ranks:
                same(f"OLMo fp32 {opt}, 2 ranks: bytes sent and received per step equal the CPU trainer's", emu, cpu,
                     keys=("bytes_sent", "bytes_recv", "payload_bytes"))
            if opt == "adamw" and not ranks:
                compare("OLMo fp32 validation loss vs CPU trainer", Lazy(lambda r=emu: r.metrics("val")),
                        Lazy(lambda r=cpu: r.metrics("val")), "val_loss", 2e-5)
                texts = [Lazy(lambda r=r: [x["text"] for x in r.metrics("sample")] if r.get() else None)
                         for r in (emu, cpu)]
                check(lambda t=texts: t[0].get() is not None and len(t[0].get()) == 1 and t[0].get() == t[1].get(),
                      lambda t=texts: f"OLMo fp32 text sample at step 4 is the CPU trainer's ({t[0].get()!r})")
    rms_cpu = {}
    for opt, rel, ranks in (("adamw", 2e-5, None), ("demo", 1e-4, 2)):
        args = rms + ["--optimizer", opt]
        name = f"olmo-rmsnorm-{opt}-{ranks or 1}"
        rms_cpu[opt] = run(CPU, f"cpu-{name}", args, ranks=ranks)
        compare(f"OLMo --norm rmsnorm, fp32 {opt}, {ranks or 1} rank(s), vs CPU trainer",
                run(EMU["fp32"], f"fp32-{name}", args, ranks=ranks), rms_cpu[opt], "loss", rel)

    # bf16, one head of 64 (flash attention's shape): both attentions read the rotated q and k.
    one_head = olmo + ["--num_heads", "1"]
    cpu = run(CPU, "cpu-olmo-1head", one_head)
    bf16 = {}
    for attention in ("matmul", "flash"):
        bf16[attention] = run(EMU["bf16"], f"bf16-olmo-{attention}", one_head, knobs={"attention": attention})
        compare(f"OLMo bf16, {attention} attention, vs CPU trainer", bf16[attention], cpu, "loss", 3e-3)
    check(lambda r=bf16["flash"]: r.recorded("attention") == "flash", "the OLMo bf16 flash run records flash attention")
    graph = run(EMU["bf16"], "bf16-olmo-flash-cuda-graph", one_head, knobs={"attention": "flash", "cuda_graph": "true"})
    same("OLMo bf16, flash attention, --cuda_graph true: the bits without the graph", graph, bf16["flash"])
    compare("OLMo --norm rmsnorm, bf16 adamw, 1 rank, vs CPU trainer",
            run(EMU["bf16"], "bf16-olmo-rmsnorm-adamw-1", rms + ["--optimizer", "adamw"]), rms_cpu["adamw"], "loss",
            3e-3)

    # Resume: a run stopped at step 2 continues with the straight run's bits (bf16: stochastic rounding repeated).
    keep = ["--steps", "4", "--checkpoint_every", "2", "--keep_checkpoints", "0"]
    for opt, norm in (("adamw", "layernorm"), ("demo", "rmsnorm")):
        args = keep + ["--arch", "olmo", "--norm", norm, "--optimizer", opt]
        full = run(EMU["bf16"], f"bf16-olmo-{opt}-full", args)
        step2 = os.path.join(TMP, f"bf16-olmo-{opt}-full", "checkpoints", "step_00000002")
        resumed = run(EMU["bf16"], f"bf16-olmo-{opt}-resumed", args + ["--resume", step2], after=[full])
        same(f"OLMo bf16 {opt} (--norm {norm}): resumed at step 2, steps 3-4 bit-identical to the straight run",
             resumed, full.tail(2))


def topk_checks(steps, emu_demo1):
    """--optimizer topk (DeMo without the transform: the kernels' IDENTITY instantiations, no DCTs) against the CPU
    trainer's topk, 1 and 2 ranks: losses to DeMo's tolerance, the bytes per step the CPU trainer's, and not the
    losses of emu_demo1 (the fp32 DeMo run on 1 rank); a bf16 run resumed at step 2 gives the straight run's steps
    3-4 bit for bit."""
    topk = steps + ["--optimizer", "topk"]
    cpu_topk1 = run(CPU, "cpu-topk-1", topk)
    emu_topk1 = run(EMU["fp32"], "fp32-topk-1", topk)
    compare("fp32 topk, 1 rank, vs CPU trainer", emu_topk1, cpu_topk1, "loss", 1e-4)
    compare("fp32 topk, 1 rank, vs CPU trainer", emu_topk1, cpu_topk1, "grad_norm", 1e-3)
    check(lambda a=emu_topk1, b=emu_demo1: value(a) is not None and value(b) is not None and
          any(x["loss"] != y["loss"] for x, y in zip(value(a)[1:], value(b)[1:])),
          "fp32 topk, 1 rank: its losses are not DeMo's (no DCT)")
    cpu_topk2 = run(CPU, "cpu-topk-2", topk, ranks=2)
    emu_topk2 = run(EMU["fp32"], "fp32-topk-2", topk, ranks=2)
    compare("fp32 topk, 2 ranks (NCCL transport), vs CPU trainer", emu_topk2, cpu_topk2, "loss", 1e-4)
    same("fp32 topk, 2 ranks: bytes sent and received per step equal the CPU trainer's", emu_topk2, cpu_topk2,
         keys=("bytes_sent", "bytes_recv", "payload_bytes"))
    keep_topk = ["--steps", "4", "--checkpoint_every", "2", "--keep_checkpoints", "0", "--optimizer", "topk"]
    full = run(EMU["bf16"], "bf16-topk-full", keep_topk)
    step2 = os.path.join(TMP, "bf16-topk-full", "checkpoints", "step_00000002")
    resumed = run(EMU["bf16"], "bf16-topk-resumed", keep_topk + ["--resume", step2], after=[full])
    same("bf16 topk: resumed at step 2, steps 3-4 bit-identical to the straight run", resumed, full.tail(2))


def write_choices():
    """llm.c's eval file of 14 multiple-choice examples cut from the validation shard: a 20-token context, then its
    true next 4-11 tokens among 3 other spans (rows fit --seq_len 32 + 1); returns its path."""
    tokens = np.fromfile(os.path.join(DATA, "default_val_000000.bin"), dtype=np.uint16, offset=1024).astype(int)
    rng = np.random.default_rng(5)
    words = []
    for i in range(14):
        at = int(rng.integers(0, len(tokens) - 100))
        endings = [list(tokens[at + 20:at + 20 + int(rng.integers(4, 12))])]
        for _ in range(3):
            other = int(rng.integers(0, len(tokens) - 20))
            endings.append(list(tokens[other:other + int(rng.integers(4, 12))]))
        label = int(rng.integers(0, 4))
        endings[0], endings[label] = endings[label], endings[0]
        example = [65535, 0, i, label, 4, 20] + list(tokens[at:at + 20])
        for ending in endings:
            example += [len(ending)] + ending
        example[1] = 2 * len(example)
        words += example
    header = np.zeros(256, dtype=np.int32)
    header[:4] = [20240522, 1, 14, 0]
    path = os.path.join(TMP, "choices.bin")
    with open(path, "wb") as f:
        f.write(header.tobytes() + np.array(words, dtype=np.uint16).tobytes())
    return path


def main():
    os.makedirs(TMP, exist_ok=True)
    write_small_vocabulary()
    print(f"running the checks' commands {POOL.slots} at a time (LLMC_TEST_JOBS); their checks follow them",
          flush=True)
    gpu_tests()
    steps = ["--steps", "4"]

    # fp32: the GPU trainer's arithmetic against the CPU trainer's, one and two ranks, both optimizers.
    # Summation order alone separates them; DeMo's sign() can flip on near-zero coefficients, so its
    # tolerance is wider.
    for opt, rel in (("adamw", 2e-5), ("demo", 1e-4)):
        cpu1 = run(CPU, f"cpu-{opt}-1", steps + ["--optimizer", opt])
        emu1 = run(EMU["fp32"], f"fp32-{opt}-1", steps + ["--optimizer", opt])
        if opt == "demo":
            emu_demo1, cpu_demo1 = emu1, cpu1
        compare(f"fp32 {opt}, 1 rank, vs CPU trainer", emu1, cpu1, "loss", rel)
        compare(f"fp32 {opt}, 1 rank, vs CPU trainer", emu1, cpu1, "grad_norm", 1e-3)
        cpu2 = run(CPU, f"cpu-{opt}-2", steps + ["--optimizer", opt], ranks=2)
        emu2 = run(EMU["fp32"], f"fp32-{opt}-2", steps + ["--optimizer", opt], ranks=2)
        compare(f"fp32 {opt}, 2 ranks (NCCL transport), vs CPU trainer", emu2, cpu2, "loss", rel)
        same(f"fp32 {opt}, 2 ranks: bytes sent and received per step equal the CPU trainer's", emu2, cpu2,
             keys=("bytes_sent", "bytes_recv", "payload_bytes"))
        staged = run(EMU["fp32"], f"fp32-{opt}-2-mpi", steps + ["--optimizer", opt], ranks=2,
                     knobs={"transport": "mpi"})
        compare(f"fp32 {opt}, 2 ranks, --transport mpi vs NCCL transport", staged, emu2, "loss", 1e-6)
        if opt == "adamw":
            adamw2, cpu_adamw2, staged_adamw2 = emu2, cpu2, staged
        else:
            demo2 = emu2

    # AdamW-DDP's all-reduce overlapped with the backward (the NCCL default: each layer's gradients all-reduced
    # as soon as the backward has finished them): the same bits as the all-reduce after the backward, also with
    # 2 micro-steps per step (only the last one's backward starts it). A range started before its gradients
    # are complete, or never waited for, would read or leave stale gradients (the emulated streams give them).
    plain = run(EMU["fp32"], "fp32-adamw-2-no-overlap", steps + ["--optimizer", "adamw"], ranks=2,
                knobs={"ddp_overlap": "false"})
    same("fp32 adamw, 2 ranks: --ddp_overlap false (all-reduce after the backward) gives the overlapped run's bits",
         plain, adamw2, keys=("loss", "grad_norm", "bytes_sent", "bytes_recv", "payload_bytes"))
    check(lambda r=adamw2: r.recorded("ddp_overlap") is True, "the default 2-rank AdamW run records ddp_overlap true")
    accum = steps + ["--optimizer", "adamw", "--total_batch_size", "512"]
    accum_overlap = run(EMU["fp32"], "fp32-adamw-2-accum", accum, ranks=2)
    accum_plain = run(EMU["fp32"], "fp32-adamw-2-accum-no-overlap", accum, ranks=2, knobs={"ddp_overlap": "false"})
    same("fp32 adamw, 2 ranks, 2 micro-steps: overlapped all-reduce gives --ddp_overlap false's bits", accum_overlap,
         accum_plain)
    # The same through host memory (--transport mpi: each layer's ranges copied to the host as the backward
    # finishes them and all-reduced on MPI's reducer thread, copied back in the step), with 1 and 2 micro-steps.
    mpi = {"transport": "mpi"}
    staged_plain = run(EMU["fp32"], "fp32-adamw-2-mpi-no-overlap", steps + ["--optimizer", "adamw"], ranks=2,
                       knobs=dict(mpi, ddp_overlap="false"))
    same("fp32 adamw, 2 ranks, --transport mpi: the overlapped all-reduce gives --ddp_overlap false's bits and "
         "bytes", staged_adamw2, staged_plain, keys=("loss", "grad_norm", "bytes_sent", "bytes_recv", "payload_bytes"))
    same("fp32 adamw, 2 ranks, --transport mpi: bytes per step equal the CPU trainer's", staged_adamw2, cpu_adamw2,
         keys=("bytes_sent", "bytes_recv", "payload_bytes"))
    check(lambda r=staged_adamw2: r.recorded("ddp_overlap") is True,
          "the 2-rank AdamW run over --transport mpi records ddp_overlap true")
    accum_staged = run(EMU["fp32"], "fp32-adamw-2-accum-mpi", accum, ranks=2, knobs=mpi)
    same("fp32 adamw, 2 ranks, 2 micro-steps, --transport mpi: overlapped all-reduce gives --ddp_overlap false's "
         "bits", accum_staged,
         run(EMU["fp32"], "fp32-adamw-2-accum-mpi-no-overlap", accum, ranks=2, knobs=dict(mpi, ddp_overlap="false")))
    # --grad_wire bf16 (gradients rounded to bf16 on the wire, partial sums rounded to bf16): the GPU trainer's
    # NCCL path (bf16 ncclAllReduce, overlapped or not) and its MPI path give the CPU trainer's arithmetic and
    # half the bytes.
    bf16_args = steps + ["--optimizer", "adamw", "--grad_wire", "bf16"]
    cpu_bf16 = run(CPU, "cpu-adamw-2-wire-bf16", bf16_args, ranks=2)
    wire = {mode: run(EMU["fp32"], f"fp32-adamw-2-wire-bf16-{mode}", bf16_args, ranks=2, knobs=env)
            for mode, env in (("overlap", None), ("no-overlap", {"ddp_overlap": "false"}),
                              ("mpi", {"transport": "mpi"}))}
    compare("fp32 adamw, 2 ranks, --grad_wire bf16 (NCCL, overlapped), vs CPU trainer", wire["overlap"], cpu_bf16,
            "loss", 2e-5)
    same("fp32 adamw, 2 ranks, --grad_wire bf16: bytes per step equal the CPU trainer's", wire["overlap"], cpu_bf16,
         keys=("bytes_sent", "bytes_recv", "payload_bytes"))
    check(lambda half=wire["overlap"], full=cpu_adamw2: value(half) is not None and value(full) is not None and
          all(2 * b["bytes_sent"] == f["bytes_sent"] for b, f in zip(value(half), value(full))),
          "fp32 adamw, 2 ranks, --grad_wire bf16 sends half the fp32 wire's bytes")
    same("fp32 adamw, 2 ranks, --grad_wire bf16: --ddp_overlap false gives the overlapped run's bits",
         wire["no-overlap"], wire["overlap"])
    same("fp32 adamw, 2 ranks, --grad_wire bf16: --transport mpi gives the NCCL transport's bits", wire["mpi"],
         wire["overlap"])

    # DeMo's compress with its DCTs on the tensor cores (--demo_dct tensor, 3xTF32) instead of the default fp32
    # multiply-adds: within DeMo's tolerance of the CPU trainer, and close to the default run.
    tensor = run(EMU["fp32"], "fp32-demo-1-dct-tensor", steps + ["--optimizer", "demo"], knobs={"demo_dct": "tensor"})
    compare("fp32 demo, 1 rank, --demo_dct tensor vs CPU trainer", tensor, cpu_demo1, "loss", 1e-4)
    compare("fp32 demo, 1 rank, --demo_dct tensor vs fp32 DCTs", tensor, emu_demo1, "loss", 1e-5)

    # The kernel lab's candidates in whole steps (--demo_kernel_tuning): the first kernels (tuning 0, with the apply
    # without lean I/O), lean I/O without the refetch (1) and RadixSelect alone (2) give the default kernels' bits
    # (RadixSelect, lean I/O, refetch, compact layout), and the first tensor-core kernels (3) --demo_dct tensor's.
    for tune, base, tag in (("0", emu_demo1, "fp32"), ("1", emu_demo1, "fp32"), ("2", emu_demo1, "fp32"),
                            ("3", tensor, "--demo_dct tensor")):
        lean = run(EMU["fp32"], f"fp32-demo-1-tuning{tune}", steps + ["--optimizer", "demo"], knobs={"demo_kernel_tuning": tune})
        same(f"fp32 demo, 1 rank, --demo_kernel_tuning={tune}: the default {tag} run's losses and norms", lean, base)

    # The DCT-domain momentum (--demo_momentum_domain dct: tuning 6 with fp32 DCTs, 12 with --demo_dct tensor; the
    # 64 x 64 chunks' momentum kept as C1 m C2^T, no decode in the compress): the same training to rounding; its
    # checkpoints record the domain, so its own resume continues bit for bit and the CPU trainer, reading the
    # momentum converted to its spatial form, continues at its own straight run's losses (the DCT-domain
    # momentum read as spatial would not).
    dct_runs = {}
    for name, knobs in (("dct", {"demo_momentum_domain": "dct"}),
                        ("dct-tensor", {"demo_momentum_domain": "dct", "demo_dct": "tensor"})):
        dct = dct_runs[name] = run(EMU["fp32"], f"fp32-demo-1-momentum-{name}", steps + ["--optimizer", "demo"],
                                   knobs=knobs)
        compare(f"fp32 demo, 1 rank, {' '.join(f'{k}={v}' for k, v in knobs.items())}, vs CPU trainer", dct,
                cpu_demo1, "loss", 1e-4)
    check(lambda r=dct_runs["dct"]: r.recorded("demo_momentum_domain") == "dct",
          "a --demo_momentum_domain dct run records _run.demo_momentum_domain dct in its config.json")
    keep_demo = ["--steps", "4", "--checkpoint_every", "2", "--keep_checkpoints", "0", "--optimizer", "demo"]
    dct = {"demo_momentum_domain": "dct"}
    full = run(EMU["fp32"], "fp32-demo-dct-full", keep_demo, knobs=dct)
    step2 = os.path.join(TMP, "fp32-demo-dct-full", "checkpoints", "step_00000002")
    resumed = run(EMU["fp32"], "fp32-demo-dct-resumed", keep_demo + ["--resume", step2], knobs=dct, after=[full])
    same("fp32 demo, --demo_momentum_domain dct: resumed at step 2, steps 3-4 bit-identical to the straight run", resumed,
         full.tail(2))
    cpu_full = run(CPU, "cpu-demo-full", keep_demo)
    cpu_resumed = run(CPU, "cpu-demo-from-dct", keep_demo + ["--resume", step2], after=[full])
    compare("the CPU trainer resumes the --demo_momentum_domain dct checkpoint: steps 3-4 vs its straight run", cpu_resumed,
            cpu_full.tail(2), "loss", 1e-4)

    # --demo_delay 1 (the update of step t applied at step t+1, so round t's all-gather overlaps step t+1's forward
    # and backward), 2 ranks: the GPU trainer's split exchange over NCCL (allgather_device_start / _finish, the
    # buckets on the device) and over the MPI transport (allgather_bytes_start / _finish through host memory)
    # trains as the CPU trainer's delayed DeMo, and counts round t's wire bytes at step t+1 as it does. The
    # checkpoints carry the pending round (this rank's bucket and lr, exchanged again at the first resumed step):
    # a bf16 run (stochastic rounding of the weights repeated on resume) resumed at step 2 continues bit for bit,
    # and the CPU trainer's step-2 checkpoint continues on the GPU trainer at the CPU trainer's losses. These run
    # with eager updates (the default: the working weights take this rank's own share of the round at once, and a
    # resume rewrites them from the checkpoint's pending round); --demo_eager false (stale: nothing until the
    # gathered round lands) is checked against the CPU trainer over NCCL, and differs from the eager run.
    delayed = steps + ["--optimizer", "demo", "--demo_delay", "1", "--checkpoint_every", "2", "--keep_checkpoints", "0"]
    cpu_delay = run(CPU, "cpu-demo-2-delay", delayed, ranks=2)
    emu_delays = {}
    for transport in ("nccl", "mpi"):
        emu_delay = run(EMU["fp32"], f"fp32-demo-2-delay-{transport}", delayed, ranks=2, knobs={"transport": transport})
        emu_delays[transport] = emu_delay
        compare(f"fp32 demo --demo_delay 1, 2 ranks ({transport} transport), vs CPU trainer", emu_delay, cpu_delay,
                "loss", 1e-4)
        same(f"fp32 demo --demo_delay 1, 2 ranks ({transport} transport): bytes per step equal the CPU trainer's",
             emu_delay, cpu_delay, keys=("bytes_sent", "bytes_recv", "payload_bytes"))
        if transport == "nccl":
            check(lambda d=emu_delay, u=demo2: d[0]["bytes_sent"] == 0 and d[1]["loss"] != u[1]["loss"],
                  "fp32 demo --demo_delay 1: nothing received at step 1, and step 2's loss differs from the undelayed "
                  "run's (step 1's update not yet applied)")
            eager_delay = emu_delay
    stale = steps + ["--optimizer", "demo", "--demo_delay", "1", "--demo_eager", "false"]
    cpu_stale = run(CPU, "cpu-demo-2-delay-stale", stale, ranks=2)
    emu_stale = run(EMU["fp32"], "fp32-demo-2-delay-stale", stale, ranks=2)
    compare("fp32 demo --demo_delay 1 --demo_eager false, 2 ranks (nccl transport), vs CPU trainer", emu_stale,
            cpu_stale, "loss", 1e-4)
    same("fp32 demo --demo_delay 1 --demo_eager false, 2 ranks: bytes per step equal the CPU trainer's", emu_stale,
         cpu_stale, keys=("bytes_sent", "bytes_recv", "payload_bytes"))
    check(lambda stale=emu_stale, eager=eager_delay: stale[0]["loss"] == eager[0]["loss"] and
          all(a["loss"] != b["loss"] for a, b in zip(value(stale)[1:], value(eager)[1:])),
          "fp32 demo --demo_delay 1: eager and stale (--demo_eager false) runs differ from step 2 on")
    full = run(EMU["bf16"], "bf16-demo-2-delay-full", delayed, ranks=2)
    step2 = os.path.join(TMP, "bf16-demo-2-delay-full", "checkpoints", "step_00000002")
    resumed = run(EMU["bf16"], "bf16-demo-2-delay-resumed", delayed + ["--resume", step2], ranks=2, after=[full])
    same("bf16 demo --demo_delay 1, 2 ranks: resumed at step 2 (pending round in the checkpoint), steps 3-4 "
         "bit-identical to the straight run", resumed, full.tail(2))
    step2 = os.path.join(TMP, "cpu-demo-2-delay", "checkpoints", "step_00000002")
    handover = run(EMU["fp32"], "fp32-demo-2-delay-from-cpu", delayed + ["--resume", step2], ranks=2,
                   after=[cpu_delay])
    compare("the CPU trainer's --demo_delay 1 step-2 checkpoint (2 ranks) continued by the fp32 GPU trainer: steps 3-4",
            handover, cpu_delay.tail(2), "loss", 1e-4)

    # The multi-stream runs above in other stream orders (LLMC_EMU_STREAMS). The default order runs a stream's work
    # only when something waits for it; eager runs every other stream's queued work first at each host wait (and
    # queried work at each query, so the MPI transport hands each layer's gradients to its reducer thread during
    # the backward, which the default order never does); first_ahead and last_ahead let the compute stream (created
    # first) or the communication / copy stream run ahead of the other. A GPU may run the streams in any of these
    # orders, so a dependency missing between them (a read or a write that does not wait for the other stream)
    # changes the bits in one of them, or, for a write to a collective's input before its end, stops the emulated
    # NCCL with a message; with none missing, every order gives the default order's losses, norms and byte counts.
    # All nine run in the eager order; the four whose communication overlaps the compute the most (AdamW's
    # all-reduce during the backward and delayed DeMo's all-gather during the next step, over either transport)
    # in first_ahead and last_ahead too.
    streams_runs = (("fp32-adamw-2", steps + ["--optimizer", "adamw"], {}, adamw2, True),
                    ("fp32-adamw-2-mpi", steps + ["--optimizer", "adamw"], mpi, staged_adamw2, True),
                    ("fp32-adamw-2-accum", accum, {}, accum_overlap, False),
                    ("fp32-adamw-2-accum-mpi", accum, mpi, accum_staged, False),
                    ("fp32-adamw-2-wire-bf16", bf16_args, {}, wire["overlap"], False),
                    ("fp32-demo-2", steps + ["--optimizer", "demo"], {}, demo2, False),
                    ("fp32-demo-2-delay-nccl", delayed, {}, emu_delays["nccl"], True),
                    ("fp32-demo-2-delay-mpi", delayed, mpi, emu_delays["mpi"], True),
                    ("fp32-demo-2-delay-stale", stale, {}, emu_stale, False))
    for name, args, env, reference, every_order in streams_runs:
        for order in ("eager", "first_ahead", "last_ahead") if every_order else ("eager",):
            other = run(EMU["fp32"], f"{name}-streams-{order}", args, ranks=2, knobs=dict(env, LLMC_EMU_STREAMS=order))
            same(f"{name}: LLMC_EMU_STREAMS={order} gives the default stream order's bits and bytes", other, reference,
                 keys=("loss", "grad_norm", "bytes_sent", "bytes_recv", "payload_bytes"))

    # Gradient accumulation (2 micro-steps), validation, multiple-choice accuracy and text samples: the fp32 GPU
    # trainer's validation losses, accuracies and samples (same logits to rounding, same sampling RNG) are the CPU
    # trainer's.
    extras = steps + ["--total_batch_size", "256", "--val_every", "2", "--val_batches", "2", "--sample_every", "2",
                      "--sample_tokens", "12", "--choices", write_choices(), "--choices_examples", "10"]
    cpu = run(CPU, "cpu-extras", extras)
    emu = run(EMU["fp32"], "fp32-extras", extras)
    compare("fp32, 2 micro-steps per step, vs CPU trainer", emu, cpu, "loss", 2e-5)
    compare("fp32 validation losses vs CPU trainer", Lazy(lambda r=emu: r.metrics("val")),
            Lazy(lambda r=cpu: r.metrics("val")), "val_loss", 2e-5)
    accuracies = [Lazy(lambda r=r: [(x["acc"], x["acc_norm"], x["examples"]) for x in r.metrics("choices")]
                       if r.get() else None) for r in (emu, cpu)]
    check(lambda a=accuracies: a[0].get() is not None and len(a[0].get()) == 2 and a[0].get() == a[1].get(),
          lambda a=accuracies: f"fp32 --choices accuracies at steps 2 and 4 are the CPU trainer's ({a[0].get()})")
    texts = [Lazy(lambda r=r: [x["text"] for x in r.metrics("sample")] if r.get() else None) for r in (emu, cpu)]
    check(lambda t=texts: t[0].get() is not None and len(t[0].get()) == 2 and t[0].get() == t[1].get(),
          lambda t=texts: f"fp32 text samples at steps 2 and 4 are the CPU trainer's ({t[0].get()!r})")

    # DeMo's other wire formats, momentum rule and awkward chunk shapes (--demo_chunk 48: 32 x 48 and 48 x 48
    # chunks of the 64-wide and 1152-row tensors), 2 ranks: the GPU kernels against the CPU module.
    for variant in (["--demo_values", "sign", "--demo_indices", "packed12"],
                    ["--demo_values", "bf16", "--demo_momentum", "ema"],
                    ["--demo_chunk", "48", "--demo_topk", "5"]):
        tag = " ".join(variant)
        args = steps + ["--optimizer", "demo"] + variant
        name = "demo" + "".join(variant).replace("--demo_", "-")
        cpu2 = run(CPU, f"cpu-{name}", args, ranks=2)
        emu2 = run(EMU["fp32"], f"fp32-{name}", args, ranks=2)
        compare(f"fp32 demo {tag}, 2 ranks, vs CPU trainer", emu2, cpu2, "loss", 1e-4)
        same(f"fp32 demo {tag}, 2 ranks: bytes per step equal the CPU trainer's", emu2, cpu2,
             keys=("bytes_sent", "bytes_recv", "payload_bytes"))

    topk_checks(steps, emu_demo1)

    # bf16: attention kinds and GELU fusion levels against the CPU trainer (one head of 64: flash's shape).
    one_head = steps + ["--num_heads", "1"]
    cpu = run(CPU, "cpu-1head", one_head)
    runs = {}
    for attention in ("matmul", "flash"):
        for level, fusion in (("0", "none"), ("1", "forward"), ("2", "both")):
            name = f"bf16-{attention}-gelu{level}"
            runs[name] = run(EMU["bf16"], name, one_head, knobs={"gelu_fusion": fusion, "attention": attention})
            compare(f"bf16, {attention} attention, --gelu_fusion {fusion}, vs CPU trainer", runs[name], cpu,
                    "loss", 3e-3)
    # cuBLASLt refusing every epilogue (bias, GELU, DGELU): matmul_lt's fallback must still train right, and
    # give the bits of the path that asks for no fused GELU at all under the same refusal.
    refused = {"LLMC_EMU_CUBLASLT_NO_EPILOGUE": "1"}
    fallback = run(EMU["bf16"], "bf16-no-epilogue-gelu2", one_head, knobs=dict(refused, gelu_fusion="both"))
    compare("bf16, every cuBLASLt epilogue refused (fallback path), vs CPU trainer", fallback, cpu, "loss", 3e-3)
    unfused = run(EMU["bf16"], "bf16-no-epilogue-gelu0", one_head, knobs=dict(refused, gelu_fusion="none"))
    same("bf16, every epilogue refused: --gelu_fusion both falls back to --gelu_fusion none's bits", fallback,
         unfused)
    # No cuBLASLt algorithm for anything: plain products go to cublasGemmStridedBatchedEx (which the emulation
    # computes as its cuBLASLt does), so the run keeps the bits of the run above.
    gemm = run(EMU["bf16"], "bf16-no-algo", one_head, knobs={"LLMC_EMU_CUBLASLT_NO_ALGO": "1", "gelu_fusion": "both"})
    same("bf16, no cuBLASLt algorithm at all: the cuBLAS GEMM fallback gives the same bits", gemm, fallback)
    # --bias_grad epilogue: the qkv and fc bias gradients from the BGRADB epilogue of their weight-gradient
    # products (summed in the emulated cuBLASLt's order, so other bits), and under the refusal above the column
    # reduction again, with its bits.
    epi = run(EMU["bf16"], "bf16-flash-biasgrad", one_head,
              knobs={"bias_grad": "epilogue", "attention": "flash", "gelu_fusion": "both",
                   "LLMC_EMU_CUBLASLT_COUNTS": "1"})
    # 2 per layer (qkv, fc) per micro-step: tiny.json has 2 layers, one micro-step per step
    bgradb = Lazy(lambda r=epi: re.search(r"BGRADB=(\d+)", r.process.get().stderr))
    check(lambda: bgradb.get() is not None and int(bgradb.get().group(1)) == 2 * 2 * 4,
          lambda: "bf16, --bias_grad epilogue: 16 weight-gradient products ran with BGRADB "
                  f"(got {bgradb.get() and bgradb.get().group(1)})")
    compare("bf16, flash attention, --bias_grad epilogue, vs CPU trainer", epi, cpu, "loss", 3e-3)
    compare("bf16, --bias_grad epilogue: the gradient norm of the column reduction's run", epi,
            runs["bf16-flash-gelu2"], "grad_norm", 1e-3)
    check(lambda r=epi: r.recorded("bias_grad") == "epilogue", "the --bias_grad epilogue run records it")
    same("bf16, every epilogue refused, --bias_grad epilogue: the column reduction's bits",
         run(EMU["bf16"], "bf16-no-epilogue-biasgrad", one_head,
             knobs=dict(refused, gelu_fusion="both", bias_grad="epilogue")), fallback)
    # Two knobs that must keep the bits, with either attention (the matmul attention's batched products too):
    # --matmul_tune true, where the candidates of each new problem (three here, all computing the same products)
    # are run and timed on the problem's own buffers before it runs for real; and --cuda_graph true, where each
    # micro-step's kernels are captured once and replayed (the emulated runtime records the stream's work and
    # refuses what a GPU cannot capture). The graph also for DeMo, with 2 micro-steps per step (the graph
    # replayed within a step), and over 2 ranks (DeMo takes no per-layer reports) below.
    for knob, tag, record in (("matmul_tune", "matmul-tune", "matmul_tune"),
                              ("cuda_graph", "cuda-graph", "cuda_graph")):
        for attention in ("matmul", "flash"):
            other = run(EMU["bf16"], f"bf16-{attention}-{tag}", one_head,
                        knobs={knob: "true", "attention": attention, "gelu_fusion": "both"})
            same(f"bf16, {attention} attention, --{knob}: the bits without it", other, runs[f"bf16-{attention}-gelu2"])
        check(lambda other=other, record=record: other.recorded(record) is True,
              f"the --{knob} run records {record} true")
    # --flash_dq shares_last: the flash backward's dQ shares summed by the last key tile to write each query
    # tile's, in the sum kernel's order: its bits.
    last = run(EMU["bf16"], "bf16-flash-shares-last", one_head,
               knobs={"flash_dq": "shares_last", "attention": "flash", "gelu_fusion": "both"})
    same("bf16, flash attention, --flash_dq shares_last: the bits of the shares' sum kernel", last,
         runs["bf16-flash-gelu2"])
    check(lambda: last.recorded("attention") == "flash (dQ shares summed by the last key tile)",
          "the --flash_dq shares_last run records its attention")
    same("fp32 demo, 1 rank, --cuda_graph true: the bits without the graph",
         run(EMU["fp32"], "fp32-demo-1-cuda-graph", steps + ["--optimizer", "demo"], knobs={"cuda_graph": "true"}),
         emu_demo1)
    accum1 = steps + ["--optimizer", "adamw", "--total_batch_size", "256"]
    same("fp32 adamw, 2 micro-steps per step, --cuda_graph true: the bits without the graph",
         run(EMU["fp32"], "fp32-adamw-1-accum-cuda-graph", accum1, knobs={"cuda_graph": "true"}),
         run(EMU["fp32"], "fp32-adamw-1-accum", accum1))
    same("fp32 demo, 2 ranks, --cuda_graph true: the bits and bytes without the graph",
         run(EMU["fp32"], "fp32-demo-2-cuda-graph", steps + ["--optimizer", "demo"], ranks=2,
             knobs={"cuda_graph": "true"}), demo2, keys=("loss", "grad_norm", "bytes_sent", "bytes_recv"))

    # Every launch with its threads run in another order between barriers (LLMC_EMU_ORDER): a missing barrier
    # anywhere in the step (the DeMo kernels, flash attention, the reductions) would change the bits.
    for order in ("shuffled", "warp"):
        demo = run(EMU["fp32"], f"fp32-demo-1-{order}", steps + ["--optimizer", "demo"],
                   knobs={"LLMC_EMU_ORDER": order})
        same(f"fp32 demo, threads in {order} order: the forward order's bits", demo, emu_demo1)
        flash = run(EMU["bf16"], f"bf16-flash-{order}", one_head,
                    knobs={"attention": "flash", "gelu_fusion": "both", "LLMC_EMU_ORDER": order})
        same(f"bf16 flash attention, threads in {order} order: the forward order's bits", flash,
             runs["bf16-flash-gelu2"])

    # Checkpoint / resume on the emulated device: bit-identical continuation (both optimizers).
    keep = ["--steps", "4", "--checkpoint_every", "2", "--keep_checkpoints", "0"]
    for opt in ("adamw", "demo"):
        full = run(EMU["bf16"], f"bf16-{opt}-full", keep + ["--optimizer", opt])
        step2 = os.path.join(TMP, f"bf16-{opt}-full", "checkpoints", "step_00000002")
        resumed = run(EMU["bf16"], f"bf16-{opt}-resumed", keep + ["--optimizer", opt, "--resume", step2],
                      after=[full])
        same(f"bf16 {opt}: resumed at step 2, steps 3-4 bit-identical to the straight run", resumed, full.tail(2))
        if opt == "demo":  # the lean apply's bf16 copy (stochastic rounding, 8-byte stores): the exact apply's bits
            for tune, what in (("0", "the exact compress and apply"), ("1", "lean I/O compress and apply")):
                other = run(EMU["bf16"], f"bf16-demo-tuning{tune}", keep + ["--optimizer", "demo"],
                            knobs={"demo_kernel_tuning": tune})
                same(f"bf16 demo, --demo_kernel_tuning={tune} ({what}): the default run's losses and norms", other, full)

    # Throughput: model TFLOP/s per rank from tokens/s (flops per token counted from GPT-2's shapes by
    # train_cpu_checks), MFU with --peak_tflops only (the emulated device is no GPU of the peak table), in the log,
    # the banner and the progress lines.
    flops = cpu_checks.model_flops_per_token(CONFIG, 32)
    peaked = run(EMU["bf16"], "bf16-peak", ["--steps", "2", "--peak_tflops", "0.01"])

    def throughput(rows, ranks, peak):  # the peak is a float config key: MFU to its 7 digits
        near = lambda a, b, rel: abs(a - b) <= rel * abs(b)
        return bool(rows) and all(near(r["model_tflops"], flops * r["tok_per_s"] / ranks / 1e12, 1e-9) and
                                  (near(r["mfu"], r["model_tflops"] / peak, 1e-6) if peak else "mfu" not in r)
                                  for r in rows)
    check(lambda r=peaked: throughput(value(r), 1, 0.01) and "MFU against 0.01 TFLOP/s per GPU (--peak_tflops)"
          in r.process.get().stdout and all(f"| MFU {100 * x['mfu']:.1f}% |" in r.process.get().stdout
                                            for x in value(r)),
          "bf16, --peak_tflops 0.01: model TFLOP/s = flops per token x tokens/s, MFU against the peak, in the log, "
          "the banner and the progress lines")
    check(lambda r=full: throughput(value(r), 1, None) and
          "MFU not reported: CPU (block emulator) has no known bf16 peak" in r.process.get().stdout,
          "bf16 without --peak_tflops on a device with no known peak: model TFLOP/s, no MFU, the banner says so")
    check(lambda r=adamw2: throughput(value(r), 2, None),
          "fp32, 2 ranks: model TFLOP/s per rank (half the tokens/s each), no MFU")

    # A checkpoint of the CPU trainer continues on the emulated GPU trainer (fp32) at the CPU trainer's losses.
    cpu_full = run(CPU, "cpu-handover", keep)
    step2 = os.path.join(TMP, "cpu-handover", "checkpoints", "step_00000002")
    handover = run(EMU["fp32"], "fp32-handover", keep + ["--resume", step2], after=[cpu_full])
    compare("CPU trainer's step-2 checkpoint resumed by the fp32 GPU trainer: steps 3-4", handover, cpu_full.tail(2),
            "loss", 2e-5)

    # Host waits per training step (LLMC_EMU_HOST_WAITS=1: the emulated runtime counts every synchronization or
    # copy into pageable memory that had queued device work to wait for, and those that left no work queued
    # behind them: on a GPU each of these idles it for a host round trip). 4 steps less 2, halved: the run's
    # setup, final evaluation and checkpoint cancel. On one rank a step is queued whole and waited for once, at
    # its end: the optimizers clip with the norm on the device, and the losses, the norm, DeMo's gathered headers,
    # error flags and kernel times are read after that wait (with --demo_delay 1 those of both its updates, the
    # pending round's apply and the own share). The next step's micro-steps are queued before that wait (nothing
    # is due after these steps but the last), so it leaves the GPU work to do: none of the waits idles it.
    # With several ranks each rank prints its own counts; the most any rank has is taken.
    waits = {}  # name -> Lazy of (host waits per step, of them leaving the GPU idle), or of None if a run failed

    def count_waits(name, args, ranks=None):
        runs = [launch(EMU["bf16"], f"waits-{name}-{n}", ["--steps", str(n)] + args, ranks=ranks,
                       knobs={"LLMC_EMU_HOST_WAITS": "1"}) for n in (2, 4)]

        def per_step():
            counts = []
            for p in (r.get() for r in runs):
                found = re.findall(r"emulated device: (\d+) host waits for device work \((\d+) left it idle\)",
                                   p.stderr)
                if p.returncode != 0 or len(found) != (ranks or 1):
                    return None
                counts.append((max(int(w) for w, _ in found), max(int(i) for _, i in found)))
            return (counts[1][0] - counts[0][0]) / 2, (counts[1][1] - counts[0][1]) / 2
        waits[name] = Lazy(per_step)
        check(lambda: waits[name].get() is not None,
              lambda: f"host waits per step, {name}: {waits[name].get()} (waits, of them leaving the GPU idle)")

    single = ("adamw", "demo", "demo-delay1", "demo-delay1-stale")
    for name, args in zip(single, (["--optimizer", "adamw"], ["--optimizer", "demo"],
                                   ["--optimizer", "demo", "--demo_delay", "1"],
                                   ["--optimizer", "demo", "--demo_delay", "1", "--demo_eager", "false"])):
        count_waits(name, args)
    check(lambda: all(waits[k].get()[0] == int(waits[k].get()[0]) for k in single),
          "host waits per step: the same count every step")
    check(lambda: all(waits[k].get() == (1, 0) for k in single),
          "host waits per step: one, the step's end, which leaves the GPU the next step's micro-steps to run, for "
          "AdamW, DeMo and DeMo with --demo_delay 1 (eager and stale)")
    # A step with a duty after it (here a checkpoint every step) is not queued ahead: its end idles the GPU.
    count_waits("adamw-checkpoint-every-step", ["--optimizer", "adamw", "--checkpoint_every", "1",
                                                "--keep_checkpoints", "0"])
    check(lambda: waits["adamw-checkpoint-every-step"].get()[1] >= 1,
          "host waits per step: a checkpoint after every step leaves the GPU idle at least once per step (nothing "
          "queued ahead of a checkpoint)")
    # 2 ranks over NCCL add a wait per step inside the optimizer's step, the collective's end (the all-gather's,
    # or the overlapped all-reduce's; the watchdog's), which idles the GPU: the bucket sizes are exchanged at the
    # first step only (a size exchange is a wait of its own). The step's end does not idle it: several ranks
    # queue the next step ahead too, the loss report's all-reduce running on the host beside it (before, each
    # step had two idle waits).
    for name, optimizer in (("demo-2ranks", "demo"), ("adamw-2ranks", "adamw")):
        count_waits(name, ["--optimizer", optimizer], ranks=2)
        check(lambda name=name: waits[name].get()[1] == 1 and 1 <= waits[name].get()[0] <= 2,
              lambda name=name, optimizer=optimizer:
              f"host waits per step, {optimizer} on 2 ranks over NCCL: one leaves the GPU idle (the collective's "
              f"end), the step's end does not ({waits[name].get()[0]} waits, {waits[name].get()[1]} idle)")

    # A batch that fails to load while the step before it runs (a token id out of range; the trainer reads and
    # queues each step's micro-steps during the last one's): the step that ran is still reported, then the run
    # stops with the loader's message, as the CPU trainer does. One rank: the third batch. Two ranks (rank r reads
    # the windows r, r + 2, ...; the GPU trainer with AdamW's all-reduce during the backward, whose collectives
    # the other rank must not enqueue alone): rank 1's second batch, the ranks' first step reported by the GPU
    # trainer (the ranks agree that a batch failed before anything of the next step is queued, and write the
    # step's lines then). The CPU trainer reads a batch when its micro-step begins, after the step before it has
    # reported; rank 0's line of that step waits for the next step's report (StepReporter: the sum of the loss
    # and norm travels meanwhile), and the job ends first: no step logged.
    train = os.path.join(DATA, "default_train_000001.bin")
    header = open(train, "rb").read(1024)
    clean = open(train, "rb").read()[1024:1024 + 2 * (8 * 128 + 1)]
    bad_dir = os.path.join(TMP, "bad-shard")
    os.makedirs(bad_dir, exist_ok=True)
    for position, ranks, steps_done in ((2 * 128 + 5, None, 2), (3 * 128 + 5, 2, 1)):
        tokens = bytearray(clean)
        tokens[2 * position:2 * position + 2] = (60000).to_bytes(2, "little")
        bad = os.path.join(bad_dir, f"bad{position}_train_000001.bin")
        with open(bad, "wb") as f:
            f.write(header[:8] + (8 * 128 + 1).to_bytes(4, "little") + header[12:] + tokens)
        where = " (rank 1)" if ranks else ""
        message = f"error{where}: {bad}: token id 60000 at position {position} is out of range (vocab_size {VOCAB})"
        for trainer, kind in ((EMU["bf16"], "gpu"), (CPU, "cpu")):
            name = f"bad-token-{kind}-{ranks or 1}"
            logged = 0 if kind == "cpu" and ranks else steps_done
            p = launch(trainer, name, ["--steps", "5", "--shuffle", "false", "--train_data", bad], ranks=ranks,
                       timeout=120)
            stopped = Lazy(lambda p=p, name=name: (p.get().returncode, p.get().stderr + p.get().stdout,
                                                   steps_logged(name)))
            check(lambda stopped=stopped, message=message, logged=logged:
                  stopped.get()[0] != 0 and message in stopped.get()[1] and stopped.get()[2] == logged,
                  lambda stopped=stopped, name=name, position=position, steps_done=steps_done, logged=logged:
                  f"{name}: a token out of range in batch {position // 128 + 1} of the shard stops the run after "
                  f"{steps_done} step(s) with the loader's message, {logged} logged (exit {stopped.get()[0]}, "
                  f"{stopped.get()[2]} logged)")

    # A damaged bucket over NCCL (LLMC_EMU_NCCL_CORRUPT=ROOT:OFFSET:SKIP inverts one byte of what the other ranks
    # receive from rank ROOT, from the SKIP+1-th bucket on): the receiving rank stops with the CPU decoder's
    # message, after the step's wait where the headers are checked, and the job ends (no hang, non-zero exit).
    # The header's magic (both delays), and the last byte of the bucket (the last tensor's last index: out of its
    # chunk), in the first round (its size exchange and broadcasts) and in the second (a plain all-gather of
    # buckets of known size); the steps finished before it are in the metrics.
    size = demo2[0]["payload_bytes"] if demo2.get() else 0
    magic = "DeMo bucket from rank 1: not a DeMo bucket (bad magic)"
    outside = "DeMo bucket from rank 1: coefficient index outside its chunk"
    for offset, delay, skip, message in ((0, "0", 0, magic), (0, "1", 0, magic), (0, "0", 1, magic),
                                         (0, "1", 1, magic), (size - 1, "0", 0, outside), (size - 1, "0", 1, outside)):
        name = f"corrupt-{offset}-{delay}-{skip}"
        p = launch(EMU["fp32"], name, steps + ["--optimizer", "demo", "--demo_delay", delay], ranks=2,
                   knobs={"LLMC_EMU_NCCL_CORRUPT": f"1:{offset}:{skip}"}, timeout=300)
        stopped = Lazy(lambda p=p, name=name: (p.get().returncode, p.get().stderr + p.get().stdout,
                                               steps_logged(name)))
        check(lambda stopped=stopped, message=message, done=skip + int(delay):
              size > 0 and stopped.get()[0] != 0 and f"error (rank 0): {message}" in stopped.get()[1] and
              stopped.get()[2] == done,
              lambda stopped=stopped, offset=offset, delay=delay, skip=skip, message=message:
              f"damaged bucket byte {offset} of round {skip + 1} over NCCL, --demo_delay {delay}: rank 0 stops with "
              f"'{message}' after {skip + int(delay)} step(s) (finished {stopped.get()[2]})")

    olmo_checks(steps)
    rank_dies_or_stops()  # last: timed, with the cores to itself
    POOL.drain()
    print(flush=True)
    failed = report()
    print()
    if failed:
        print(f"{failed} check(s) failed")
        return 1
    print("all emulated-device checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
