"""End-to-end checks of the OLMo family on the CPU trainer and tools (run by test/e2e/test_train_olmo.sh).

A short real training run of configs/tiny_olmo.json on the default corpus whose train and validation losses fall;
determinism and bit-identical checkpoint/resume for AdamW and DeMo on 1 and 2 ranks (and RMSNorm); --init_from
taking the family and shape from the model file's header, and a file of the other family refused naming both
shapes; the paper configs' dry runs giving the paper's parameter and chunk counts; eval_gpt reproducing a run's
logged validation loss from its checkpoint; sample_gpt continuing a prompt with an OLMo model, the same tokens
run after run; one-line errors for bad family keys. Failures are collected and reported together.
"""
import json
import os
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import train_cpu_checks  # noqa: E402  (the CPU trainer checks' helpers)
from train_cpu_checks import ROOT, check, failures, losses, run  # noqa: E402

TMP = os.path.join(ROOT, "build", "test-tmp", "olmo")
BASE = ["--config", "configs/tiny_olmo.json", "--batch_size", "4", "--seq_len", "32", "--val_every", "3",
        "--val_batches", "2", "--lr", "3e-3", "--warmup_steps", "2"]


def fresh(name):
    d = os.path.join(TMP, name)
    shutil.rmtree(d, ignore_errors=True)
    return d


def training_run_learns():
    out = fresh("learns")
    run(BASE + ["--steps", "60", "--val_every", "20", "--val_batches", "4", "--warmup_steps", "5", "--out_dir", out,
                "--seq_len", "64", "--checkpoint_every", "0"])
    l = losses(out)
    first, last = l[1], sum(l[k] for k in range(56, 61)) / 5
    check(last < first - 2.0, f"tiny OLMo, 60 steps on the default corpus: train loss {first:.3f} -> {last:.3f} "
                              "(mean of the last 5)")
    check(l["val60"] < l["val20"] < 10.0, f"... validation loss falls: {l['val20']:.3f} at step 20, "
                                         f"{l['val60']:.3f} at step 60")
    return out, first


def resume_case(optimizer, ranks, extra=(), suffix=""):
    return train_cpu_checks.resume_case(optimizer, ranks, extra, "-olmo" + suffix, base=BASE)


def init_from_checks(source, fresh_loss):
    model = os.path.join(source, "checkpoints", "step_00000060", "model.bin")
    # no model key given: the header's family and shape
    out = fresh("init-header")
    p = run(["--init_from", model, "--steps", "2", "--batch_size", "2", "--seq_len", "16", "--val_every", "0",
             "--val_batches", "1", "--out_dir", out])
    config = json.load(open(os.path.join(out, "config.json")))
    check(config.get("arch") == "olmo" and config.get("num_layers") == 2 and config.get("channels") == 64
          and "model olmo L=2 H=4 C=64" in p.stdout,
          f"--init_from FILE alone takes the model from FILE's header ({config.get('arch')}, "
          f"{config.get('num_layers')} layers, width {config.get('channels')})")
    first = losses(out)[1]
    check(first < fresh_loss - 2.0, f"... and starts from its trained weights (first loss {first:.3f}, a fresh model's "
                                    f"{fresh_loss:.3f})")
    # a GPT-2 config given: one line naming the file and both shapes
    p = run(["--config", "configs/tiny.json", "--init_from", model, "--steps", "1", "--out_dir", fresh("init-gpt2")],
            expect_ok=False)
    lines = [l for l in p.stderr.splitlines() if l.strip()]
    check(p.returncode == 1 and len(lines) == 1 and model + ": checkpoint shape olmo L=2" in lines[0]
          and "disagrees with config gpt2 L=2" in lines[0],
          f"an OLMo file for a GPT-2 config: one line naming the file and both shapes: {p.stderr.strip()[:220]}")


def paper_dry_runs():
    for config, params, chunks in [("configs/paper_300m.json", "319,946,752", "78,112"),
                                   ("configs/paper_1b.json", "1,176,764,416", "287,296")]:
        p = run(["--config", config, "--optimizer", "demo", "--dry_run", "--out_dir", fresh("dry")], expect_ok=False)
        check(p.returncode == 0 and f": {params} parameters in 65 tensors" in p.stdout
              and f"parameters {params}, chunk 64: {chunks} chunks" in p.stdout,
              f"{config} --dry_run: {params} parameters, {chunks} DeMo chunks")
        p = run(["--config", config, "--optimizer", "adamw", "--dry_run", "--out_dir", fresh("dry")], expect_ok=False)
        check(p.returncode == 0 and f": {params} parameters" in p.stdout, f"... and with AdamW too")


def tool_checks(two_rank_run):
    # eval_gpt's loss on a run's last checkpoint equals the run's logged val loss (2 batches on each of 2 ranks)
    p = subprocess.run(["./eval_gpt", "--model", two_rank_run, "--batch_size", "4", "--seq_len", "32", "--batches", "4",
                        "--threads", "2", "--json"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    logged = losses(two_rank_run)["val6"]
    evaluated = json.loads(p.stdout)["loss"] if p.returncode == 0 else float("nan")
    check(abs(evaluated - logged) <= 1e-6 * logged,
          f"eval_gpt on an OLMo run's checkpoint: {evaluated}, its logged val loss {logged}: {p.stderr.strip()[:160]}")
    outputs = []
    for _ in range(2):
        p = subprocess.run(["./sample_gpt", "--model", two_rank_run, "--prompt", "The President said", "--tokens", "12",
                            "--temperature", "0", "--threads", "2"], cwd=ROOT, capture_output=True, text=True,
                           timeout=120)
        outputs.append((p.returncode, p.stdout))
    check(outputs[0][0] == 0 and outputs[0] == outputs[1] and "The President said" in outputs[0][1],
          f"sample_gpt continues a prompt with an OLMo model, greedily the same text twice: {outputs[0][1][-160:]!r}")


def bad_input_checks():
    for args, needle in [(["--arch", "llama"], "--arch: 'llama' is not one of: gpt2, olmo"),
                         (["--norm", "rmsnorm"], "norm rmsnorm is an olmo option"),
                         (["--arch", "olmo", "--num_heads", "64"], "RoPE needs an even head size"),
                         (["--arch", "olmo", "--rope_theta", "1"], "rope_theta must be a finite number > 1")]:
        p = run(["--config", "configs/tiny.json"] + args + ["--steps", "1", "--out_dir", fresh("bad")], expect_ok=False)
        lines = [l for l in p.stderr.splitlines() if l.strip()]
        check(p.returncode == 1 and len(lines) == 1 and needle in lines[0],
              f"{' '.join(args)}: one-line error: {p.stderr.strip()[:160]}")


def main():
    os.makedirs(TMP, exist_ok=True)
    paper_dry_runs()
    bad_input_checks()
    trained, fresh_loss = training_run_learns()
    adamw1 = resume_case("adamw", None)
    resume_case("demo", None)
    resume_case("adamw", None, ["--norm", "rmsnorm"], "-rmsnorm")
    init_from_checks(trained, fresh_loss)
    if shutil.which("mpirun"):
        demo2 = resume_case("demo", 2)
        resume_case("adamw", 2)
        tool_checks(demo2)
    else:
        print("note: no mpirun, the 2-rank checks did not run")
        tool_checks(adamw1)
    if failures:
        print(f"{len(failures)} check(s) failed")
        sys.exit(1)
    print("all OLMo CPU checks passed")


if __name__ == "__main__":
    main()
