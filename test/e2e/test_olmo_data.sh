#!/usr/bin/env bash
# OLMo token files end to end, against numpy as the oracle (np.memmap of an OLMo file, np.fromfile of an llm.c shard
# after its 1024-byte header):
#   - build/convert_tokens: llm.c -> OLMo (uint16, uint32) and back, bit-exact both ways; an OLMo file split into
#     shards of --shard-tokens; ids of 65536 and above refused for llm.c shards;
#   - build/prepro_gpt2 --out-format olmo writes the llm.c output's tokens and split, uint16 and uint32; with a
#     hand-made byte-level BPE vocabulary of 65,793 tokens (ids above 65535, encoded here in Python) uint32 holds
#     them and llm.c shards or uint16 are refused with one line;
#   - the trainer: --data_format / --memmap_dtype / --eos_token_id validation, a --dry_run on OLMo files, one-line
#     errors for bad OLMo files when the data opens, a resume on the same llm.c shards with another memmap_dtype
#     allowed and one with another data_format refused;
#   - eval_gpt and sample_gpt take the format, dtype and eos of the model's run (its config.json), flags first;
#   - training on OLMo files (each instance's last target -1, "no target"): the run's val loss is eval_gpt's on its
#     checkpoint, and eval_gpt's loss on OLMo files is PyTorch's cross_entropy(ignore_index=-1) over the same
#     instances (test/e2e/model_tools_checks.py loss_olmo; skipped without torch).
set -uo pipefail
cd "$(dirname "$0")/../.."
python=/usr/bin/python3
"$python" -c "import numpy" 2>/dev/null || { echo "SKIP: $python cannot import numpy"; exit 77; }
for target in train_gpt_cpu eval_gpt sample_gpt build/convert_tokens build/prepro_gpt2; do
  [[ -x $target ]] || make "$target" >/dev/null || { echo "FAIL  make $target"; exit 1; }
done
# the default corpus (test/run_tests.sh prepares it first; a changed build/prepro_gpt2 would re-prepare it)
[[ -f data/default/default_train_000002.bin && -f data/cache/docs/documents.txt ]] || bash data/prepare_default.sh \
  >/dev/null || { echo "FAIL  data/prepare_default.sh"; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
source test/support/checks.sh
export OMP_NUM_THREADS=2
quiet() { "$@" >"$tmp/quiet.log" 2>&1 || { tail -n 3 "$tmp/quiet.log"; return 1; }; }

# numpy's view of both formats: "same A B": the tokens of A and B (each a .bin shard or a .npy file of DTYPE) equal
npcheck() { "$python" - "$@" <<'EOF'
import sys, numpy as np
def tokens(path, dtype):
    if path.endswith(".bin"):
        header = np.fromfile(path, dtype="<i4", count=256)
        assert header[0] == 20240520 and header[1] == 1, path
        t = np.fromfile(path, dtype="<u2", offset=1024)
        assert len(t) == header[2], path
        return t.astype(np.uint64)
    return np.asarray(np.memmap(path, dtype=np.dtype(dtype).newbyteorder("<"), mode="r")).astype(np.uint64)
cmd, dtype, *paths = sys.argv[1:]
if cmd == "same":   # paths: A B  (a file each, or A and the concatenation of the rest)
    a, rest = tokens(paths[0], dtype), np.concatenate([tokens(p, dtype) for p in paths[1:]])
    sys.exit(0 if len(a) > 0 and np.array_equal(a, rest) else 1)
if cmd == "max":    # prints the largest id
    print(int(max(tokens(p, dtype).max() for p in paths)))
EOF
}

# ---- the converter: llm.c -> OLMo -> llm.c ----
shards=(data/default/default_val_000000.bin data/default/default_train_000001.bin data/default/default_train_000002.bin)
for dtype in uint16 uint32; do
  out=$tmp/olmo_$dtype back=$tmp/back_$dtype
  build/convert_tokens --to olmo --memmap-dtype "$dtype" --out-dir "$out" "${shards[@]}" >/dev/null ||
    fail "convert_tokens --to olmo --memmap-dtype $dtype"
  ok=1
  for s in "${shards[@]}"; do
    name=$(basename "$s" .bin)
    npcheck same "$dtype" "$s" "$out/$name.npy" || ok=0
    item=$([[ $dtype == uint16 ]] && echo 2 || echo 4)
    [[ $(stat -c %s "$out/$name.npy") -eq $(( ($(stat -c %s "$s") - 1024) / 2 * item )) ]] || ok=0  # no header
  done
  check "convert_tokens --to olmo ($dtype): np.memmap of each file is its shard's tokens (np.fromfile past 1024 bytes)" \
    test $ok -eq 1
  build/convert_tokens --to llmc --memmap-dtype "$dtype" --out-dir "$back" "$out/*.npy" >/dev/null ||
    fail "convert_tokens --to llmc --memmap-dtype $dtype"
  ok=1
  for s in "${shards[@]}"; do cmp -s "$s" "$back/$(basename "$s")" || ok=0; done
  check "llm.c -> OLMo ($dtype) -> llm.c gives back the same bytes" test $ok -eq 1
done
# an OLMo file of more than --shard-tokens: shards NAME_000000.bin ... whose concatenation is the file
build/convert_tokens --to llmc --shard-tokens 100000 --out-dir "$tmp/split" \
  "$tmp/olmo_uint16/default_train_000001.npy" >/dev/null || fail "convert_tokens --shard-tokens"
pieces=("$tmp"/split/default_train_000001_*.bin)
check "an OLMo file of 1M tokens becomes ${#pieces[@]} shards of at most 100,000 tokens, the file in order" \
  npcheck same uint16 "$tmp/olmo_uint16/default_train_000001.npy" "${pieces[@]}"
"$python" -c "import numpy as np; np.array([5, 70000, 7], dtype='<u4').tofile('$tmp/wide.npy')"
expect_error "wide.npy: token id 70000 at position 1 does not fit llm.c's uint16 shards" \
  build/convert_tokens --to llmc --memmap-dtype uint32 --out-dir "$tmp/wide" "$tmp/wide.npy"
expect_error "default_val_000000.bin: already an llm.c shard" \
  build/convert_tokens --to llmc --out-dir "$tmp/x" data/default/default_val_000000.bin
expect_error "--memmap-dtype: 'int16' is not a token dtype" build/convert_tokens --to olmo --memmap-dtype int16 \
  --out-dir "$tmp/x" data/default/default_val_000000.bin
expect_error "default_val_000000.npy: 3 bytes is not a whole number of uint16 tokens" \
  bash -c "head -c 3 $tmp/olmo_uint16/default_val_000000.npy > $tmp/default_val_000000.npy &&
           build/convert_tokens --to llmc --out-dir $tmp/x $tmp/default_val_000000.npy"

# ---- prepro_gpt2 --out-format olmo: the llm.c output's tokens, uint16 and uint32 ----
docs=$tmp/docs.txt
head -n 40 data/cache/docs/documents.txt > "$docs"
bpe=(--encoder data/cache/gpt2/encoder.json --vocab data/cache/gpt2/vocab.bpe --file-list "$docs" --shard-tokens 50000)
build/prepro_gpt2 "${bpe[@]}" --out-dir "$tmp/pre_llmc" --name c >/dev/null || fail "prepro_gpt2 (llm.c shards)"
build/prepro_gpt2 "${bpe[@]}" --out-dir "$tmp/pre_16" --name c --out-format olmo >/dev/null || fail "prepro_gpt2 olmo"
build/prepro_gpt2 "${bpe[@]}" --out-dir "$tmp/pre_32" --name c --out-format olmo --memmap-dtype uint32 >/dev/null ||
  fail "prepro_gpt2 olmo uint32"
ok=1 n=0
for s in "$tmp"/pre_llmc/c_*.bin; do
  name=$(basename "$s" .bin) n=$((n + 1))
  npcheck same uint16 "$s" "$tmp/pre_16/$name.npy" && npcheck same uint32 "$s" "$tmp/pre_32/$name.npy" || ok=0
done
[[ $(ls "$tmp"/pre_16/c_*.npy | wc -l) -eq $n && $(ls "$tmp"/pre_16/c_*.bin 2>/dev/null | wc -l) -eq 0 ]] || ok=0
check "prepro_gpt2 --out-format olmo: the same $n files (val + train split) as the llm.c shards, uint16 and uint32" \
  test "$ok" -eq 1 -a "$n" -ge 3
expect_error "--out-format: expected llmc or olmo" \
  build/prepro_gpt2 "${bpe[@]}" --out-dir "$tmp/x" --name c --out-format npy
expect_error "--memmap-dtype: expected uint16 or uint32" \
  build/prepro_gpt2 "${bpe[@]}" --out-dir "$tmp/x" --name c --out-format olmo --memmap-dtype uint8

# A byte-level BPE of 65,793 tokens: the 256 bytes, every pair of bytes (the pairs of lowercase letters ranked last,
# so they get ids above 65535) and <|endoftext|>. Encoded here as GPT-2's BPE does on lowercase words: each
# pre-token (a word, with its leading space) merges its lowest-ranked adjacent pair of bytes first; a pair never
# merges further (no 3-byte tokens).
"$python" - "$tmp/wide_vocab" <<'EOF'
import json, os, sys, numpy as np
out = sys.argv[1]
os.makedirs(out, exist_ok=True)
bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
cs, n = bs[:], 0
for b in range(256):
    if b not in bs:
        bs.append(b); cs.append(256 + n); n += 1
u = {b: chr(c) for b, c in zip(bs, cs)}  # GPT-2's byte-to-unicode map
letters = set(range(ord("a"), ord("z") + 1))
pairs = sorted(((x, y) for x in range(256) for y in range(256)), key=lambda p: (p[0] in letters and p[1] in letters, p))
encoder = {u[b]: b for b in range(256)}
rank = {}
for r, (x, y) in enumerate(pairs):
    encoder[u[x] + u[y]] = 256 + r
    rank[(x, y)] = r
encoder["<|endoftext|>"] = len(encoder)
json.dump(encoder, open(f"{out}/encoder.json", "w"))
with open(f"{out}/vocab.bpe", "w") as f:
    f.write("#version: 0.2\n" + "".join(f"{u[x]} {u[y]}\n" for x, y in pairs))
text = "the quick brown fox jumps over the lazy dog and then some"
open(f"{out}/doc1.txt", "w").write(text)
open(f"{out}/doc2.txt", "w").write("zebra quiz")
def encode(word):
    syms = [bytes([b]) for b in word.encode()]
    while True:
        best = min((rank[(a[0], b[0])], i) for i, (a, b) in enumerate(zip(syms, syms[1:])) if len(a) == 1 == len(b)) \
            if any(len(a) == 1 == len(b) for a, b in zip(syms, syms[1:])) else None
        if best is None:
            return [encoder[u[s[0]]] if len(s) == 1 else encoder[u[s[0]] + u[s[1]]] for s in syms]
        i = best[1]
        syms[i:i + 2] = [syms[i] + syms[i + 1]]
ids = []
for doc in (text, "zebra quiz"):
    ids.append(encoder["<|endoftext|>"])
    for k, w in enumerate(doc.split(" ")):
        ids += encode(w if k == 0 else " " + w)
np.array(ids, dtype="<u4").tofile(f"{out}/expected.u32")

EOF
wide=(--encoder "$tmp/wide_vocab/encoder.json" --vocab "$tmp/wide_vocab/vocab.bpe" --val-tokens 3
      "$tmp/wide_vocab/doc1.txt" "$tmp/wide_vocab/doc2.txt")
if build/prepro_gpt2 "${wide[@]}" --out-dir "$tmp/pre_wide" --name w --out-format olmo --memmap-dtype uint32 \
    >"$tmp/wide.log" 2>&1; then
  what="prepro_gpt2 --memmap-dtype uint32, a 65,793-token vocabulary: the Python BPE's ids (above 65535 too), split 3 + rest"
  "$python" - "$tmp/pre_wide" "$tmp/wide_vocab/expected.u32" <<'EOF' && pass "$what" || fail "$what"
import sys, numpy as np
d, want = sys.argv[1], np.fromfile(sys.argv[2], dtype="<u4")
got = np.concatenate([np.memmap(f"{d}/w_val_000000.npy", dtype="<u4", mode="r"),
                      np.memmap(f"{d}/w_train_000001.npy", dtype="<u4", mode="r")])
sys.exit(0 if want.max() > 65535 and len(np.memmap(f"{d}/w_val_000000.npy", dtype="<u4", mode="r")) == 3
         and np.array_equal(got, want) else 1)
EOF
else
  fail "prepro_gpt2 --out-format olmo --memmap-dtype uint32 with the wide vocabulary: $(tail -n 2 "$tmp/wide.log")"
fi
expect_error \
  "encoder.json: 65793 tokens: id 65792 does not fit llm.c shards' uint16 ids; use --out-format olmo --memmap-dtype uint32" \
  build/prepro_gpt2 "${wide[@]}" --out-dir "$tmp/x" --name w
expect_error "does not fit OLMo files' uint16 ids; use --memmap-dtype uint32" \
  build/prepro_gpt2 "${wide[@]}" --out-dir "$tmp/x" --name w --out-format olmo
# the OLMo uint32 file with ids above 65535 is data for a model of that vocabulary, not for llm.c's
expect_error "token id 65" \
  build/convert_tokens --to llmc --memmap-dtype uint32 --out-dir "$tmp/x" "$tmp/pre_wide/w_train_000001.npy"

# ---- the trainer's keys ----
tiny=(--config configs/tiny.json --batch_size 2 --seq_len 32 --steps 2 --val_every 0 --sample_every 0 --threads 1)
expect_error "--data_format: 'npy' is not one of: auto, llmc, olmo" \
  ./train_gpt_cpu "${tiny[@]}" --data_format npy --dry_run
expect_error "--memmap_dtype: 'int32' is not one of: uint8, uint16, uint32, uint64" \
  ./train_gpt_cpu "${tiny[@]}" --memmap_dtype int32 --dry_run
expect_error "--eos_token_id 50257 is outside the vocabulary [0, 50257)" \
  ./train_gpt_cpu "${tiny[@]}" --eos_token_id 50257 --dry_run
expect_error "--pad_token_id -1 is outside the vocabulary" ./train_gpt_cpu "${tiny[@]}" --pad_token_id -1 --dry_run
expect_error "--eos_token_id 50279 (the default of arch olmo) is outside the vocabulary [0, 50257)" \
  ./train_gpt_cpu "${tiny[@]}" --arch olmo --dry_run
echo '{"eos_token_id": 70000}' > "$tmp/eos.json"
expect_error "$tmp/eos.json: key 'eos_token_id' 70000 is outside the vocabulary" \
  ./train_gpt_cpu "${tiny[@]}" --config "$tmp/eos.json" --dry_run
printf '%s\n' "# the default corpus as OLMo files" "default_train_000001.npy" "default_train_000002.npy" \
  > "$tmp/olmo_uint16/train.txt"
dry=(./train_gpt_cpu --config configs/tiny_olmo.json --data_format olmo --memmap_dtype uint16
     --train_data "@$tmp/olmo_uint16/train.txt" --val_data "$tmp/olmo_uint16/default_val_000000.npy" --dry_run)
check "./train_gpt_cpu --config configs/tiny_olmo.json --data_format olmo --train_data @list --dry_run runs" \
  bash -c "${dry[*]} > $tmp/dry.log 2>&1 && grep -q '\"data_format\": \"olmo\"' $tmp/dry.log"
grep -q '"eos_token_id": 50279' <(./train_gpt_cpu --config configs/paper_300m.json --dry_run 2>&1) &&
  grep -q '"pad_token_id": 1' <(./train_gpt_cpu --arch olmo --vocab_size 50280 --dry_run 2>&1) &&
  grep -q '"eos_token_id": 50256' <(./train_gpt_cpu "${tiny[@]}" --dry_run 2>&1) &&
  pass "eos/pad: paper_300m.json states 50279, --arch olmo defaults to pad 1, gpt2 to 50256" ||
  fail "eos/pad defaults in the dry run's resolved config"
# bad OLMo files stop the run with one line when its data opens (before any step)
head -c 1001 "$tmp/olmo_uint16/default_val_000000.npy" > "$tmp/odd.npy"
: > "$tmp/empty.npy"
run=(./train_gpt_cpu "${tiny[@]}" --out_dir "$tmp/bad_run" --data_format olmo)
expect_error "odd.npy: 1001 bytes is not a whole number of uint16 tokens" "${run[@]}" --train_data "$tmp/odd.npy"
expect_error "empty.npy: empty token file" "${run[@]}" --train_data "$tmp/empty.npy"
expect_error "fewer than one instance of seq_len 32" "${run[@]}" --train_data "$tmp/wide.npy" --memmap_dtype uint32
cp "$tmp/olmo_uint16/default_train_000001.npy" "$tmp/mixed_train_2.bin"
cp data/default/default_train_000001.bin "$tmp/mixed_train_1.bin"
expect_error "mixes llm.c shards ($tmp/mixed_train_1.bin) and OLMo token files ($tmp/mixed_train_2.bin)" \
  ./train_gpt_cpu "${tiny[@]}" --out_dir "$tmp/bad_run" --train_data "$tmp/mixed_train_*.bin"
expect_error "val_000000.npy: token id" "${run[@]}" --train_data "$tmp/wide.npy" \
  --val_data "$tmp/pre_wide/w_val_000000.npy" --memmap_dtype uint32 --seq_len 1 --batch_size 1 --val_batches 1

# resume: the llm.c run's dtype may change (it is not read), its format may not (the files would be other data)
./train_gpt_cpu "${tiny[@]}" --checkpoint_every 1 --out_dir "$tmp/run" >"$tmp/run.log" 2>&1 || fail "a 2-step tiny run"
step1=$tmp/run/checkpoints/step_00000001
check "resume of an llm.c run with another --memmap_dtype (not read) is allowed" \
  quiet ./train_gpt_cpu "${tiny[@]}" --out_dir "$tmp/run" --resume "$step1" --overwrite --memmap_dtype uint32
check "resume with --data_format llmc after auto (the same files, the same fingerprint) is allowed" \
  quiet ./train_gpt_cpu "${tiny[@]}" --out_dir "$tmp/run" --resume "$step1" --overwrite --data_format llmc
expect_error 'data_format is "olmo" here (--data_format) but "auto" in the checkpoint' \
  ./train_gpt_cpu "${tiny[@]}" --out_dir "$tmp/run" --resume "$step1" --overwrite --data_format olmo --val_data ''

# ---- eval_gpt and sample_gpt follow the run's config.json ----
model=$tmp/run/checkpoints/step_00000002
check "eval_gpt on the run's llm.c shards (its config: data_format auto)" \
  quiet ./eval_gpt --model "$model" --data data/default/default_val_000000.bin --seq_len 32 --batches 2
"$python" - "$tmp/run/config.json" <<'EOF'
import json, sys
c = json.load(open(sys.argv[1]))
c.update(data_format="olmo", memmap_dtype="uint64")
json.dump(c, open(sys.argv[1], "w"))
EOF
expect_error "default_val_000000.bin: 433948 bytes is not a whole number of uint64 tokens" \
  ./eval_gpt --model "$model" --data data/default/default_val_000000.bin --seq_len 32 --batches 2
check "eval_gpt --data_format llmc overrides the run's olmo" \
  quiet ./eval_gpt --model "$model" --data data/default/default_val_000000.bin --seq_len 32 --batches 2 \
  --data_format llmc
"$python" - "$tmp/run/config.json" <<'EOF'
import json, sys
c = json.load(open(sys.argv[1])); c.update(eos_token_id=99999); json.dump(c, open(sys.argv[1], "w"))
EOF
expect_error "its run's eos_token_id 99999 is outside the vocabulary of 50257" \
  ./sample_gpt --model "$tmp/run" --tokens 2

# ---- training and evaluation on OLMo files: the loss over the positions with a target ----
olmo_run=(./train_gpt_cpu "${tiny[@]}" --data_format olmo --memmap_dtype uint16 --out_dir "$tmp/olmo_run"
          --train_data "@$tmp/olmo_uint16/train.txt" --val_data "$tmp/olmo_uint16/default_val_000000.npy")
if "${olmo_run[@]}" >"$tmp/olmo_run.log" 2>&1; then
  logged=$("$python" -c 'import json, math, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
train = [l["loss"] for l in lines if l.get("type") == "train"]
assert len(train) == 2 and all(math.isfinite(x) for x in train), train
print([l["val_loss"] for l in lines if l.get("type") == "val"][-1])' "$tmp/olmo_run/metrics.jsonl")
  evaluated=$(./eval_gpt --model "$tmp/olmo_run" --data "$tmp/olmo_uint16/default_val_000000.npy" --batch_size 2 \
              --seq_len 32 --batches 8 --json |
              "$python" -c 'import json, sys; l = json.load(sys.stdin); print(l["loss"], l["targets"])')
  check "train_gpt_cpu on OLMo files: 2 finite train losses; eval_gpt on its checkpoint with its B, T and \
val_batches gives the val loss it logged ($logged), over 8 x 2 x 31 targets" \
    test -n "$logged" -a "$logged 496" == "$evaluated"
else
  fail "train_gpt_cpu on OLMo files: $(tail -n 2 "$tmp/olmo_run.log")"
fi
if "$python" -c "import torch" 2>/dev/null; then
  "$python" test/e2e/model_tools_checks.py loss_olmo "$tmp/olmo_run/checkpoints/step_00000002/model.bin" \
    "$tmp/olmo_uint16/default_val_000000.npy" 2 32 6 || failures=$((failures + 1))
fi

[[ $failures -eq 0 ]] && echo "all OLMo data checks passed" || echo "$failures check(s) failed"
[[ $failures -eq 0 ]]
