#!/usr/bin/env bash
# Tests of the tools that read a trained model, against independent oracles. ./eval_gpt (the loss on token
# shards): its loss over every window, and over a few, equals PyTorch's on the same windows (two small shards
# crossed); on a checkpoint with the run's batch settings it is the val loss the run logged; several models give a
# line each; with --choices, each completion's summed and mean loss and the picks equal PyTorch's on HellaSwag-style
# examples, read as JSON Lines (tokenized here) and as llm.c's eval file (js-tiktoken's tokens). ./sample_gpt (text
# from a model file or checkpoint):
#   - greedy decoding picks PyTorch's most likely token at every step, past max_seq_len (sliding window), on a
#     random model written by the PyTorch reference and on one trained here (test/e2e/model_tools_checks.py);
#   - temperature, top-k and top-p draws follow PyTorch's renormalized probabilities (chi-square, 5 settings);
#   - the prompt is encoded as js-tiktoken encodes it (when node is installed);
#   - a run directory means its latest complete checkpoint; a damaged model.bin in a checkpoint is refused by
#     its checksum; the same seed gives the same text; --stop_at_eot ends a sample at end-of-text;
#   - bad flags and files give exit status 1 and one "error:" line naming them.
# Skips (77) without torch in /usr/bin/python3. Builds ./sample_gpt, ./eval_gpt and ./train_gpt_cpu if missing.
set -uo pipefail
cd "$(dirname "$0")/../.."
export LC_ALL=C.UTF-8
python=/usr/bin/python3
"$python" -c "import torch" 2>/dev/null || { echo "SKIP: $python cannot import torch"; exit 77; }
for target in sample_gpt eval_gpt train_gpt_cpu; do
  [[ -x $target ]] || make "$target" >/dev/null || { echo "FAIL  make $target"; exit 1; }
done
bash data/prepare_default.sh >/dev/null || { echo "FAIL  data/prepare_default.sh"; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
source test/support/checks.sh
prompt="The President said that the Union"

# a random model (PyTorch's init) and one trained for 60 steps on the default corpus, checkpointed at 30 and 60
"$python" dev/reference/gpt2_reference.py --config tiny --steps 1 --out-dir "$tmp/random" >/dev/null ||
  { echo "FAIL  dev/reference/gpt2_reference.py"; exit 1; }
./train_gpt_cpu --config configs/tiny.json --steps 60 --lr 3e-3 --warmup_steps 5 --val_every 0 --checkpoint_every 30 \
  --keep_checkpoints 0 --out_dir "$tmp/run" >"$tmp/train.log" 2>&1 ||
  { tail -3 "$tmp/train.log"; echo "FAIL  training"; exit 1; }
trained=$tmp/run/checkpoints/step_00000060/model.bin

checks() { "$python" test/e2e/model_tools_checks.py "$@" || failures=$((failures + 1)); }
for model in "$tmp/random/model.bin" "$trained"; do checks greedy "$model" "$prompt"; done
checks distribution "$trained" "$prompt"

# ---- eval_gpt ----------------------------------------------------------------------------------------------
"$python" - "$tmp" <<'PY'
import sys
import numpy as np
tokens = np.fromfile("data/default/default_val_000000.bin", dtype=np.uint16, offset=1024)
for name, part in (("small_val_000000.bin", tokens[:1000]), ("small_val_000001.bin", tokens[1000:1700])):
    header = np.zeros(256, dtype=np.int32)
    header[:3] = [20240520, 1, len(part)]
    with open(f"{sys.argv[1]}/{name}", "wb") as f:
        f.write(header.tobytes() + part.astype(np.uint16).tobytes())
PY
checks loss "$trained" 'data/default/default_val_*.bin' 2 64 7
# two shards of 15 and 10 windows of 2 x 32 + 1 tokens: all 25, across the boundary
checks loss "$tmp/random/model.bin" "$tmp/small_val_*.bin" 2 32 0
logged=$("$python" -c 'import json, sys
print([json.loads(l)["val_loss"] for l in open(sys.argv[1]) if "\"val\"" in l][-1])' "$tmp/run/metrics.jsonl")
evaluated=$(./eval_gpt --model "$tmp/run" --batch_size 4 --seq_len 64 --batches 8 --json |
            "$python" -c 'import json, sys; print(json.load(sys.stdin)["loss"])')
if [[ -n $logged && $logged == "$evaluated" ]]; then
  pass "eval_gpt on the run's last checkpoint, with its B, T and val_batches, gives the val loss it logged ($logged)"
else
  fail "eval_gpt $evaluated vs the logged val loss $logged"
fi

# several models: a line each, each the loss it has alone; a missing one stops the tool before any evaluation
eval_loss() { ./eval_gpt --batches 5 --seq_len 32 --json "$@" | "$python" -c '
import json, sys; print(" ".join(str(json.loads(l)["loss"]) for l in sys.stdin))'; }
both=$(eval_loss --model "$trained" --model "$tmp/run/checkpoints/step_00000030")
if [[ $both == "$(eval_loss --model "$trained") $(eval_loss --model "$tmp/run/checkpoints/step_00000030")" &&
      $(./eval_gpt --model "$trained" --model "$tmp/nope" 2>/dev/null | wc -c) -eq 0 ]]; then
  pass "eval_gpt with two models prints each one's loss ($both); a missing second stops it before any"
else
  fail "eval_gpt with several models: $both"
fi

if command -v node >/dev/null; then
  printf '%s' $'Unicode: café naïve 中文 😀 — "quotes" it\'s  spaced\n\tand 1234567 numbers' >"$tmp/prompt.txt"
  if node dev/reference/tiktoken_encode.js --out "$tmp/prompt.bin" "$tmp/prompt.txt" &&
     ./sample_gpt --model "$trained" --prompt_file "$tmp/prompt.txt" --tokens 0 --json \
       >"$tmp/prompt.json" 2>/dev/null &&
     "$python" -c '
import json, sys
from array import array
oracle = array("H"); oracle.frombytes(open(sys.argv[1], "rb").read())
ours = json.load(open(sys.argv[2]))["prompt_tokens"]
sys.exit(0 if ours == list(oracle) and len(ours) > 10 else f"ours {ours} vs js-tiktoken {list(oracle)}")
' "$tmp/prompt.bin" "$tmp/prompt.json"; then
    pass "the prompt (unicode, emoji, contractions, spaces) is encoded as js-tiktoken encodes it"
  else
    fail "prompt encoding vs js-tiktoken"
  fi
fi

# eval_gpt --choices: HellaSwag-style examples made from the corpus (the true rest of a sentence among other
# sentences' rests; a few with 2 or 5 completions, some contexts too long for max_seq_len 64), as JSON Lines and as
# llm.c's eval file written here from js-tiktoken's tokens, against PyTorch
if command -v node >/dev/null; then
  "$python" - "$tmp" <<'PY'
import json, random, re, sys
random.seed(11)
paths = [l.strip() for l in open("data/cache/docs/documents.txt") if l.strip()]
sentences = []
for path in paths[:40]:
    text = " ".join(open(path, encoding="utf-8", errors="replace").read().split())
    sentences += [s for s in re.split(r"(?<=[.!?]) ", text) if 12 <= len(s.split()) <= 40]
random.shuffle(sentences)
examples = []
for i in range(36):
    words = sentences[i].split()
    cut = len(words) * 3 // 5
    ctx = " ".join(words[:cut])
    if i % 6 == 5:  # a context longer than max_seq_len: cropped
        ctx = " ".join(sentences[100 + i].split() + sentences[200 + i].split() + sentences[300 + i].split()) + " " + ctx
    count = 2 if i == 3 else 5 if i == 4 else 4
    others = [" ".join(sentences[400 + 4 * i + k].split()[cut:]) or f"and so on, {i} {k}" for k in range(count - 1)]
    if i == 7:
        others[0] = "caf\u00e9 \u2014 na\u00efve \U0001F600 it's"
    label = random.randrange(count)
    endings = others[:label] + [" ".join(words[cut:])] + others[label:]
    examples.append({"ind": i, "ctx": ctx, "split": "val", "label": label, "endings": endings})
with open(f"{sys.argv[1]}/choices.jsonl", "w") as f:
    for e in examples:
        f.write(json.dumps(e) + "\n")
json.dump(examples, open(f"{sys.argv[1]}/choices_text.json", "w"))
PY
  node -e '
const tiktoken = require(process.argv[1] + "/js-tiktoken");
const fs = require("fs");
const gpt2 = tiktoken.getEncoding("gpt2");
const encode = (text) => gpt2.encode(text, [], []);
const examples = JSON.parse(fs.readFileSync(process.argv[2]));
fs.writeFileSync(process.argv[3], JSON.stringify(examples.map((e) => ({
  label: e.label, context: encode(e.ctx), endings: e.endings.map((ending) => encode(" " + ending))}))));
' "$PWD/data/cache/node/node_modules" "$tmp/choices_text.json" "$tmp/choices_tokens.json"
  # llm.c's eval file format (dev/data/data_common.py: write_evalfile), written from js-tiktoken's tokens
  "$python" - "$tmp" <<'PY'
import json, sys
import numpy as np
examples = json.load(open(f"{sys.argv[1]}/choices_tokens.json"))
stream, longest = [], 0
for i, e in enumerate(examples):
    words = [65535, 0, i, e["label"], len(e["endings"]), len(e["context"])] + e["context"]
    for ending in e["endings"]:
        words += [len(ending)] + ending
    words[1] = 2 * len(words)
    longest = max(longest, words[1])
    stream += words
header = np.zeros(256, dtype=np.int32)
header[:4] = [20240522, 1, len(examples), longest]
with open(f"{sys.argv[1]}/choices.bin", "wb") as f:
    f.write(header.tobytes() + np.array(stream, dtype=np.uint16).tobytes())
PY
  for model in "$tmp/random/model.bin" "$trained"; do
    checks choices "$model" "$tmp/choices.jsonl" "$tmp/choices.bin" "$tmp/choices_tokens.json"
  done
  zstd -q -c "$tmp/choices.jsonl" >"$tmp/choices.jsonl.zst"
  choice_line() { ./eval_gpt --model "$trained" --json "$@" | "$python" -c 'import json, sys
line = json.load(sys.stdin)
print(",".join(f"\"{k}\":{line[k]}" for k in ("examples", "acc", "acc_norm", "cropped")))'; }
  if [[ $(choice_line --choices "$tmp/choices.jsonl.zst") == "$(choice_line --choices "$tmp/choices.jsonl")" &&
        $(choice_line --choices "$tmp/choices.bin" --examples 10) == *'"examples":10,'* ]]; then
    pass "eval_gpt --choices reads .jsonl.zst as .jsonl; --examples 10 scores 10"
  else
    fail "eval_gpt --choices on .jsonl.zst or with --examples"
  fi
  # the trainer's --choices (2 ranks, examples split between them, rows of its batch shape) logs at each validation
  # the accuracies eval_gpt finds on that step's checkpoint; eval_gpt --write_eval_file writes the eval file it reads
  ./eval_gpt --choices "$tmp/choices.jsonl" --write_eval_file "$tmp/written.bin" 2>/dev/null
  OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 OMP_NUM_THREADS=1 \
    mpirun -np 2 ./train_gpt_cpu --config configs/tiny.json --steps 20 --lr 3e-3 --warmup_steps 2 --val_every 10 \
    --checkpoint_every 10 --keep_checkpoints 0 --choices "$tmp/written.bin" --out_dir "$tmp/choices_run" \
    </dev/null >"$tmp/choices_run.log" 2>&1
  logged=$("$python" -c 'import json, sys
print(" ".join("%r,%r" % (r["acc"], r["acc_norm"]) for r in map(json.loads, open(sys.argv[1]))
               if r["type"] == "choices"))' "$tmp/choices_run/metrics.jsonl" 2>/dev/null)
  scored=""
  for step in 10 20; do
    scored+=" $(./eval_gpt --model "$tmp/choices_run/checkpoints/step_000000$step" --choices "$tmp/choices.bin" \
      --json | "$python" -c 'import json, sys; r = json.load(sys.stdin); print("%r,%r" % (r["acc"], r["acc_norm"]))')"
  done
  if cmp -s "$tmp/written.bin" "$tmp/choices.bin" && [[ -n $logged && " $logged" == "$scored" ]]; then
    pass "train_gpt_cpu --choices on 2 ranks logs eval_gpt's accuracies at steps 10 and 20 ($logged);" \
      "the eval file eval_gpt writes is the one written from js-tiktoken's tokens"
  else
    fail "train_gpt_cpu --choices logged '$logged', eval_gpt on its checkpoints '$scored'" \
      "(or --write_eval_file differs)"
  fi
fi

# --model: a run directory means its latest complete checkpoint; the same seed gives the same text
run_sample() { ./sample_gpt --prompt "$prompt" --tokens 20 --json --seed "${2:-5}" --model "$1" 2>/dev/null; }
if [[ -n $(run_sample "$tmp/run") && $(run_sample "$tmp/run") == "$(run_sample "$trained")" &&
      $(run_sample "$tmp/run/checkpoints/step_00000060") == "$(run_sample "$trained")" &&
      $(run_sample "$tmp/run") != "$(run_sample "$tmp/run/checkpoints/step_00000030")" &&
      $(run_sample "$trained" 5) != "$(run_sample "$trained" 6)" ]]; then
  pass "a run directory samples its latest checkpoint (step 60, not 30); one seed, one text; another, another"
else
  fail "--model as a run or checkpoint directory, or the seed"
fi
# the text output is the prompt, then the tokens' bytes
./sample_gpt --model "$trained" --prompt "$prompt" --tokens 20 --seed 5 2>/dev/null >"$tmp/text.out"
if "$python" -c '
import json, sys
line = json.loads(sys.argv[2])
text = open(sys.argv[1], encoding="utf-8", errors="replace").read()
expected = sys.argv[3] + line["text"] + "\n"
sys.exit(0 if text == expected else f"{text!r} vs {expected!r}")
' "$tmp/text.out" "$(run_sample "$trained")" "$prompt"; then
  pass "the text output is the prompt and the sampled tokens' text"
else
  fail "text output vs --json"
fi

# --stop_at_eot, on a model built so that end-of-text is always the most likely token: the final LayerNorm's
# output is a constant vector, and only EOT's embedding row points along it
"$python" - "$trained" "$tmp/eot_model.bin" <<'PY'
import sys
import numpy as np
data = bytearray(open(sys.argv[1], "rb").read())
header = np.frombuffer(bytes(data[:1024]), dtype=np.int32)
channels, padded = int(header[6]), int(header[7])
params = np.frombuffer(bytes(data[1024:]), dtype=np.float32).copy()
params[50256 * channels:50257 * channels] = 1.0   # wte[EOT]
params[-2 * channels:-channels] = 0.0              # ln_f weight
params[-channels:] = 0.1                           # ln_f bias
open(sys.argv[2], "wb").write(bytes(data[:1024]) + params.tobytes())
PY
eot_tokens() { ./sample_gpt --model "$tmp/eot_model.bin" --tokens 4 --json --temperature 0 "$@" 2>/dev/null |
               "$python" -c 'import json, sys; print(json.load(sys.stdin)["tokens"])'; }
if [[ $(eot_tokens --stop_at_eot) == "[50256]" && $(eot_tokens) == "[50256, 50256, 50256, 50256]" ]]; then
  pass "--stop_at_eot ends a sample at the first end-of-text token (without it: 4 of them)"
else
  fail "--stop_at_eot: $(eot_tokens --stop_at_eot) / $(eot_tokens)"
fi

# ---- bad input -------------------------------------------------------------------------------------------------
cp -r "$tmp/run/checkpoints/step_00000060" "$tmp/damaged"
printf '\x01' | dd of="$tmp/damaged/model.bin" bs=1 seek=5000 conv=notrunc status=none
expect_error "$tmp/damaged/model.bin" ./sample_gpt --model "$tmp/damaged"
head -c 5000 "$trained" >"$tmp/short.bin"
expect_error "$tmp/short.bin" ./sample_gpt --model "$tmp/short.bin"
expect_error "$tmp/nope" ./sample_gpt --model "$tmp/nope"
mkdir -p "$tmp/empty_dir"
expect_error "$tmp/empty_dir: neither a model file" ./sample_gpt --model "$tmp/empty_dir"
expect_error "--model is required" ./sample_gpt --tokens 3
expect_error "--top_p must be in (0, 1]" ./sample_gpt --model "$trained" --top_p 0
expect_error "--temperature must be >= 0" ./sample_gpt --model "$trained" --temperature -1
expect_error "--tokens: expected an integer" ./sample_gpt --model "$trained" --tokens 12x
expect_error "--top-k: expected an integer" ./sample_gpt --model "$trained" --top-k -3
expect_error "--bogus: unknown flag" ./sample_gpt --model "$trained" --bogus 1
expect_error "$tmp/nope/encoder.json" ./sample_gpt --model "$trained" --encoder "$tmp/nope/encoder.json"
if ./sample_gpt --help | grep -q '^usage: sample_gpt'; then pass "--help"; else fail "--help"; fi
expect_error "--seq_len 65 exceeds the model's max_seq_len 64" ./eval_gpt --model "$trained" --seq_len 65
expect_error "--batches 26: $tmp/small_val_*.bin holds only 25 batches" \
  ./eval_gpt --model "$trained" --data "$tmp/small_val_*.bin" --batch_size 2 --seq_len 32 --batches 26
expect_error "$tmp/none_*.bin: no files match" ./eval_gpt --model "$trained" --data "$tmp/none_*.bin"
expect_error "--batch_size: expected an integer in [1," ./eval_gpt --model "$trained" --batch_size 0
expect_error "$tmp/damaged/model.bin" ./eval_gpt --model "$tmp/damaged"
if ./eval_gpt --help | grep -q '^usage: eval_gpt'; then pass "eval_gpt --help"; else fail "eval_gpt --help"; fi
# a device that never ends, where a file is read whole: refused at a size limit, not read until memory runs out
expect_error "/dev/zero: larger than 67108864 bytes" ./sample_gpt --model "$trained" --prompt_file /dev/zero
expect_error "/dev/zero: larger than 268435456 bytes" ./sample_gpt --model "$trained" --encoder /dev/zero
expect_error "/dev/zero: larger than 268435456 bytes" ./eval_gpt --model "$trained" --choices /dev/zero
# a checkpoint directory without its COMPLETE marker: read (model.bin is written atomically), with a warning
cp -r "$tmp/run/checkpoints/step_00000060" "$tmp/unmarked" && rm "$tmp/unmarked/COMPLETE"
if ./eval_gpt --model "$tmp/unmarked" --batches 1 --seq_len 32 >/dev/null 2>"$tmp/unmarked.err" &&
   grep -q "^warning: $tmp/unmarked has no COMPLETE marker" "$tmp/unmarked.err"; then
  pass "a checkpoint directory without its marker is read with a warning"
else
  fail "a checkpoint directory without its marker: $(cat "$tmp/unmarked.err")"
fi
if [[ -f $tmp/choices.bin ]]; then
  # damaged eval files: each refused naming the file and the example
  "$python" - "$tmp" <<'PY'
import sys
import numpy as np
tmp = sys.argv[1]
raw = open(f"{tmp}/choices.bin", "rb").read()
header, words = np.frombuffer(raw[:1024], dtype=np.int32).copy(), np.frombuffer(raw[1024:], dtype=np.uint16).copy()
def write(name, h, w):
    open(f"{tmp}/{name}", "wb").write(h.astype(np.int32).tobytes() + w.astype(np.uint16).tobytes())
bad = header.copy(); bad[0] = 20240520; write("magic.bin", bad, words)
write("cut.bin", header, words[:len(words) - 3])
second = int(words[1]) // 2  # where example 1 starts
w = words.copy(); w[second + 3] = w[second + 4]; write("label.bin", header, w)
w = words.copy(); w[second + 6] = 60000; write("token.bin", header, w)
w = words.copy(); w[second] = 7; write("marker.bin", header, w)
w = words.copy(); w[second + 1] += 2; write("size.bin", header, w)
bad = header.copy(); bad[2] -= 1; write("extra.bin", bad, words)
PY
  expect_error "$tmp/magic.bin: bad magic 20240520" ./eval_gpt --model "$trained" --choices "$tmp/magic.bin"
  expect_error "$tmp/cut.bin: example 35: truncated" ./eval_gpt --model "$trained" --choices "$tmp/cut.bin"
  expect_error "$tmp/label.bin: example 1: label 4 is not one of its 4 completions" \
    ./eval_gpt --model "$trained" --choices "$tmp/label.bin"
  expect_error "$tmp/token.bin: example 1: token id 60000" ./eval_gpt --model "$trained" --choices "$tmp/token.bin"
  expect_error "$tmp/marker.bin: example 1: no start-of-example marker" \
    ./eval_gpt --model "$trained" --choices "$tmp/marker.bin"
  expect_error "$tmp/size.bin: example 1: its size field says" ./eval_gpt --model "$trained" --choices "$tmp/size.bin"
  expect_error "$tmp/extra.bin: " ./eval_gpt --model "$trained" --choices "$tmp/extra.bin"
  printf '{"ctx": "a", "endings": ["b", "c"], "label": 1}\n{"ctx": "a", "endings": ["b", "c"]}\n' >"$tmp/nolabel.jsonl"
  expect_error "$tmp/nolabel.jsonl:2: no integer field 'label'" \
    ./eval_gpt --model "$trained" --choices "$tmp/nolabel.jsonl"
  expect_error "--examples 37: $tmp/choices.bin holds only 36" \
    ./eval_gpt --model "$trained" --choices "$tmp/choices.bin" --examples 37
  expect_error "--batches does not apply to --choices" \
    ./eval_gpt --model "$trained" --choices "$tmp/choices.bin" --batches 3
  expect_error "--per_example applies only with --choices" ./eval_gpt --model "$trained" --per_example
fi

echo
if [[ $failures -eq 0 ]]; then echo "all model tool tests passed"; else echo "$failures model tool test(s) failed"; fi
[[ $failures -eq 0 ]]
