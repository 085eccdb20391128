#!/usr/bin/env bash
# Oracle tests of the GPT-2 tokenizer and the data-prep tool, against js-tiktoken (node) as ground truth:
#   (a) build/prepro_gpt2's shards agree token for token with js-tiktoken's "gpt2" encoding (EOT before each
#       document) on the whole default corpus and on hand-written edge cases, invalid UTF-8 included (both sides
#       read it as a standard UTF-8 decoder does: each maximal ill-formed subpart becomes U+FFFD); with 1 thread
#       and with the default thread count;
#   (b) decode(encode(x)) == x for every document (Python decoding through tokenizer.bin, and build/test/test_bpe
#       through both Gpt2Bpe::decode and TokenizerDecoder);
#   (c) every shard is valid (header, size, numbering) and their concatenation is EOT + tokens of each document in
#       order;
#   (d) bad input (missing or corrupt encoder.json, wrong-magic or truncated tokenizer file, bad flags, missing
#       documents) gives exit status 1 and a one-line "error: ..." naming the file;
#   (e) a rerun into the same --out-dir: one that fails (or is killed) leaves the earlier dataset byte for byte,
#       one that succeeds with fewer shards leaves no stale shard, and --file-list may be a pipe;
#   (f) the same documents as JSON Lines (written by Python's json module: \u escapes with surrogate pairs, and raw
#       UTF-8; CRLF and blank lines; other fields around the text; mixed with text files) give the same shards as
#       (a) checks against js-tiktoken, and malformed lines are refused naming FILE:LINE;
#   (g) the same JSON Lines and text files compressed by the gzip and zstd tools (several members or frames, split
#       mid-line) give those shards again, and cut, corrupt or mislabelled compressed files are refused.
# Prepares the default corpus first if needed (data/prepare_default.sh is idempotent). Skips (77) without node.
# Expects build/prepro_gpt2 and build/test/test_bpe from `make` (builds them if missing).
set -uo pipefail
cd "$(dirname "$0")/../.."
export LC_ALL=C.UTF-8  # bash expands the \u escapes of the edge cases below to UTF-8 only in a UTF-8 locale

command -v node >/dev/null || { echo "SKIP: node is not installed"; exit 77; }
python=/usr/bin/python3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
source test/support/checks.sh

bash data/prepare_default.sh || { echo "FAIL  data/prepare_default.sh"; exit 1; }
for target in build/prepro_gpt2 build/test/test_bpe; do
  [[ -x $target ]] || make "$target" >/dev/null || { echo "FAIL  make $target"; exit 1; }
done
gpt2=data/cache/gpt2
docs=data/cache/docs/documents.txt

# Compares the shards DIR/NAME_* with the oracle's tokens, validating each shard, and checks the round trip of
# each document through DIR/tokenizer.bin. Prints the first disagreement with its document and context.
compare_with_oracle() {  # DIR NAME ORACLE.bin OFFSETS.tsv
  "$python" - "$@" <<'PY'
import bisect, glob, os, struct, sys
from array import array

shard_dir, name, oracle_path, offsets_path = sys.argv[1:5]

def fail(message):
    print(message)
    sys.exit(1)

def read_shard(path):
    data = open(path, 'rb').read()
    if len(data) < 1024:
        fail(f'{path}: shorter than the 1024-byte header')
    magic, version, count = struct.unpack('<3i', data[:12])
    if magic != 20240520 or version != 1 or len(data) != 1024 + 2 * count:
        fail(f'{path}: bad header (magic {magic}, version {version}, {count} tokens, {len(data)} bytes)')
    tokens = array('H')
    tokens.frombytes(data[1024:])
    if sys.byteorder != 'little':
        tokens.byteswap()
    return tokens

train = sorted(glob.glob(os.path.join(shard_dir, f'{name}_train_*.bin')))
expected_names = [f'{name}_train_{i:06d}.bin' for i in range(1, len(train) + 1)]
if [os.path.basename(p) for p in train] != expected_names or not train:
    fail(f'{shard_dir}: training shards are not numbered 000001..: {[os.path.basename(p) for p in train]}')
ours = array('H')
for path in [os.path.join(shard_dir, f'{name}_val_000000.bin')] + train:
    ours.extend(read_shard(path))

oracle = array('H')
oracle.frombytes(open(oracle_path, 'rb').read())
starts, paths = [], []
for line in open(offsets_path):
    start, path = line.rstrip('\n').split('\t', 1)
    starts.append(int(start))
    paths.append(path)

tok = open(os.path.join(shard_dir, 'tokenizer.bin'), 'rb').read()
magic, version, count, eot = struct.unpack('<4I', tok[:16])
if magic != 20240328 or version != 2 or count != 50257 or eot != 50256:
    fail(f'{shard_dir}/tokenizer.bin: bad header')
token_bytes, pos = [], 1024
for _ in range(count):
    length = tok[pos]
    token_bytes.append(tok[pos + 1:pos + 1 + length])
    pos += 1 + length
if pos != len(tok):
    fail(f'{shard_dir}/tokenizer.bin: size mismatch')

def text_of(tokens):
    return b''.join(token_bytes[t] for t in tokens)

if ours != oracle:
    n = min(len(ours), len(oracle))
    i = next((k for k in range(n) if ours[k] != oracle[k]), n)
    doc = bisect.bisect_right(starts, i) - 1
    lo = max(starts[doc], i - 8)
    print(f'shards ({len(ours)} tokens) differ from js-tiktoken ({len(oracle)} tokens) at token {i}, '
          f'token {i - starts[doc]} of {paths[doc]}')
    print(f'  ours:   {list(ours[lo:i + 8])} {text_of(ours[lo:i + 8])!r}')
    print(f'  oracle: {list(oracle[lo:i + 8])} {text_of(oracle[lo:i + 8])!r}')
    sys.exit(1)

starts.append(len(ours))
for d, path in enumerate(paths):
    tokens = ours[starts[d]:starts[d + 1]]
    expected = open(path, 'rb').read().decode('utf-8', errors='replace').encode('utf-8')
    if tokens[0] != 50256 or text_of(tokens[1:]) != expected:
        fail(f'{path}: decode(encode(text)) differs from the text (or no EOT before it)')
print(f'{len(paths)} documents, {len(ours)} tokens: shards valid, equal to js-tiktoken, round trips exact')
PY
}

# ---- (a)-(c) on the whole default corpus ---------------------------------------------------------------------
if node dev/reference/tiktoken_encode.js --eot-before-each --out "$tmp/corpus.bin" --offsets "$tmp/corpus.tsv" \
     --file-list "$docs" && compare_with_oracle data/default default "$tmp/corpus.bin" "$tmp/corpus.tsv"; then
  pass "default corpus agrees with js-tiktoken (default threads)"
else
  fail "default corpus vs js-tiktoken"
fi
if build/prepro_gpt2 --encoder $gpt2/encoder.json --vocab $gpt2/vocab.bpe --out-dir "$tmp/one_thread" --name c \
     --threads 1 --shard-tokens 700000 --file-list "$docs" >/dev/null &&
   compare_with_oracle "$tmp/one_thread" c "$tmp/corpus.bin" "$tmp/corpus.tsv" >/dev/null; then
  pass "default corpus agrees with js-tiktoken (--threads 1, other shard size)"
else
  fail "default corpus with --threads 1"
fi

# ---- (a)-(c) on hand-written edge cases --------------------------------------------------------------------------
edge=$tmp/edge
mkdir -p "$edge"
printf '%s' $'It\'s the cat\'s toy; IT\'S LOUD\'S! I\'ll, you\'d, we\'re, they\'ve, I\'m, don\'t. \'S \'s \'sup \'rex \'LL \'\'s x\' \'\n' \
  $'Multiple   spaces    before words.\tTabs\t\there.  \n\n\n   Indented line\r\nWindows line\r\n\r\n' \
  $'trailing spaces   \nnumbers: 1234567890 3.14159 1,000,000 0x1F 2nd 10th 007 -42 +7e10\n' \
  $'letters: café naïve résumé Ærøskøbing straße İstanbul ΑΒΓ δέλτα Кириллица 中文字符 日本語のテキスト 한국어 עברית العربية\n' \
  $'numbers: Ⅻ ⅷ ½ ¾ ² ³ ٠١٢٣٤٥٦٧٨٩ ۱۲۳ १२३ 𝟙𝟚 ⑤\n' \
  $'emoji: 😀😃 👍🏽 👨\u200d👩\u200d👧\u200d👦 🇺🇸 ❤️ x😀y\n' \
  $'punctuation: ...!!!??? --- (([[{{}}]])) "quoted" «guillemets» “curly” ‘single’ — – • … @#$%^&*_+=~`|\\/<>\n' \
  $'spaces: a\u00a0b c\u3000d e\u2003f g\u2009h \u202fi \u205f j \ufeffk \u2028 l \u2029 m \u0085 n \u180e o \u200b p\n' \
  $'special: <|endoftext|> in text and<|endoftext|>\n' \
  $'control: \x01\x02\x1b[0m \x1c\x1d\x1e\x1f \x7f end\n' >"$edge/01_mixed.txt"
{
  head -c 300 /dev/zero | tr '\0' 'a'; printf ' '
  head -c 500 /dev/zero | tr '\0' '!'; printf ' '
  head -c 200 /dev/zero | tr '\0' '7'; head -c 100 /dev/zero | tr '\0' ' '; printf 'word'
  head -c 50 /dev/zero | tr '\0' '\n'; printf 'x'; head -c 40 /dev/zero | tr '\0' '\t'; printf ' \n y'
  for i in $(seq 200); do printf 'ab'; done; printf '   '
} >"$edge/02_long_runs.txt"
printf '%s' $'\ufeffBOM at the start, whitespace at the end\n\n  ' >"$edge/03_bom.txt"
printf 'bad \xff\xfe bytes \xc3 truncated \xe2\x82 and \xed\xa0\x80 surrogate \xc0\xaf overlong \xf4\x90\x80\x80 big \x80 lone\n\xe4\xb8' >"$edge/04_invalid_utf8.txt"
printf ' \n\t  ' >"$edge/05_whitespace_only.txt"
: >"$edge/06_empty.txt"
printf "'" >"$edge/07_apostrophe.txt"
printf 'nul \x00 bytes\x00\x00 inside' >"$edge/08_nul.txt"
if build/prepro_gpt2 --encoder $gpt2/encoder.json --vocab $gpt2/vocab.bpe --out-dir "$tmp/edge_out" --name e \
     --shard-tokens 500 --val-tokens 100 "$edge"/*.txt >/dev/null &&
   node dev/reference/tiktoken_encode.js --eot-before-each --out "$tmp/edge.bin" --offsets "$tmp/edge.tsv" "$edge"/*.txt &&
   compare_with_oracle "$tmp/edge_out" e "$tmp/edge.bin" "$tmp/edge.tsv"; then
  pass "edge cases agree with js-tiktoken (contractions, spaces, unicode, emoji, invalid UTF-8, long runs)"
else
  fail "edge cases vs js-tiktoken"
fi

# ---- (b)+(c) again through the C++ decoders, plus unit tests ------------------------------------------------------
if build/test/test_bpe >"$tmp/test_bpe.log" 2>&1; then
  pass "build/test/test_bpe: $(grep 'round trips' "$tmp/test_bpe.log" | sed 's/^ *//')"
else
  cat "$tmp/test_bpe.log"
  fail "build/test/test_bpe"
fi

# ---- (d) bad input ---------------------------------------------------------------------------------------------
doc=$edge/01_mixed.txt
prepro() { build/prepro_gpt2 --out-dir "$tmp/bad_out" --name b "$@"; }
expect_error "$tmp/nope/encoder.json" prepro --encoder "$tmp/nope/encoder.json" --vocab $gpt2/vocab.bpe "$doc" "$doc"
printf '{"!": 0, "\\"": 1, "#": ' >"$tmp/corrupt_encoder.json"
expect_error "$tmp/corrupt_encoder.json" prepro --encoder "$tmp/corrupt_encoder.json" --vocab $gpt2/vocab.bpe "$doc" "$doc"
printf '[1, 2, 3]' >"$tmp/array_encoder.json"
expect_error "$tmp/array_encoder.json" prepro --encoder "$tmp/array_encoder.json" --vocab $gpt2/vocab.bpe "$doc" "$doc"
expect_error "$tmp/nope/vocab.bpe" prepro --encoder $gpt2/encoder.json --vocab "$tmp/nope/vocab.bpe" "$doc" "$doc"
head -c 1000 $gpt2/vocab.bpe >"$tmp/cut_vocab.bpe"
expect_error "$tmp/cut_vocab.bpe" prepro --encoder $gpt2/encoder.json --vocab "$tmp/cut_vocab.bpe" "$doc" "$doc"
head -n 1000 $gpt2/vocab.bpe >"$tmp/short_vocab.bpe"
expect_error "$tmp/short_vocab.bpe" prepro --encoder $gpt2/encoder.json --vocab "$tmp/short_vocab.bpe" "$doc" "$doc"
expect_error "$tmp/missing_doc.txt" prepro --encoder $gpt2/encoder.json --vocab $gpt2/vocab.bpe "$doc" "$tmp/missing_doc.txt"
expect_error "--bogus" prepro --encoder $gpt2/encoder.json --vocab $gpt2/vocab.bpe --bogus 1 "$doc"
expect_error "--shard-tokens" prepro --encoder $gpt2/encoder.json --vocab $gpt2/vocab.bpe --shard-tokens 12x "$doc"
expect_error "--val-tokens" prepro --encoder $gpt2/encoder.json --vocab $gpt2/vocab.bpe --val-tokens 100000 "$doc"
: >"$tmp/a_file"
expect_error "$tmp/a_file: exists and is not a directory" build/prepro_gpt2 --out-dir "$tmp/a_file" --name b \
  --encoder $gpt2/encoder.json --vocab $gpt2/vocab.bpe "$doc" "$doc"
expect_error "/dev/zero: larger than" prepro --encoder $gpt2/encoder.json --vocab $gpt2/vocab.bpe --file-list /dev/zero
cp data/default/tokenizer.bin "$tmp/wrong_magic.bin"
printf '\x00\x00\x00\x00' | dd of="$tmp/wrong_magic.bin" conv=notrunc status=none
expect_error "$tmp/wrong_magic.bin" build/test/test_bpe --load-tokenizer "$tmp/wrong_magic.bin"
head -c 200000 data/default/tokenizer.bin >"$tmp/truncated.bin"
expect_error "$tmp/truncated.bin" build/test/test_bpe --load-tokenizer "$tmp/truncated.bin"
head -c 512 data/default/tokenizer.bin >"$tmp/short_header.bin"
expect_error "$tmp/short_header.bin" build/test/test_bpe --load-tokenizer "$tmp/short_header.bin"
if build/prepro_gpt2 --help | grep -q '^usage: prepro_gpt2'; then pass "--help"; else fail "--help"; fi

# ---- (e) reruns into the same --out-dir ----------------------------------------------------------------------------
keep=$tmp/keep
files_md5() { (cd "$keep" && find . -path './.*' -prune -o -type f -print | sort | xargs md5sum); }  # not staging
prepro_keep() { build/prepro_gpt2 --encoder $gpt2/encoder.json --vocab $gpt2/vocab.bpe --out-dir "$keep" --name k "$@"; }
if prepro_keep --shard-tokens 500 --val-tokens 100 "$edge"/*.txt >/dev/null; then
  before=$(files_md5)
  shards_before=$(ls "$keep" | grep -c '^k_train_')
  prepro_keep --val-tokens 1000000 "$edge"/*.txt >/dev/null 2>&1  # fails after encoding: too few tokens
  rc_failed=$?
  # killed while writing: 40 times the default corpus (~5 s with one thread, shards written all along), killed
  # after 1 s, which leaves its staging directory behind
  (timeout -s KILL 1 build/prepro_gpt2 --encoder $gpt2/encoder.json --vocab $gpt2/vocab.bpe --out-dir "$keep" \
     --name k --threads 1 --shard-tokens 1000 --file-list <(for i in $(seq 40); do cat "$docs"; done)) >/dev/null 2>&1
  rc_killed=$?
  if [[ $rc_failed -eq 1 && $rc_killed -eq 137 && -d $keep/.k.staging && $(files_md5) == "$before" ]]; then
    pass "a failed and a killed rerun leave the earlier dataset as it was ($shards_before train shards)"
  else
    fail "rerun into the same --out-dir (failed rc $rc_failed, killed rc $rc_killed): the earlier dataset changed"
  fi
  if prepro_keep --shard-tokens 2000 --val-tokens 100 --file-list <(printf '%s\n' "$edge"/*.txt) >/dev/null &&
     [[ $(ls "$keep" | grep -c '^k_train_') -lt $shards_before && -z $(ls -A "$keep" | grep '^\.') ]] &&
     compare_with_oracle "$keep" k "$tmp/edge.bin" "$tmp/edge.tsv" >/dev/null; then
    pass "a rerun with fewer shards (documents from a pipe) leaves exactly its own shards, and no staging directory"
  else
    fail "a rerun with fewer shards, --file-list from a pipe"
  fi
else
  fail "prepro into $keep"
fi

# ---- (f) JSON Lines input ---------------------------------------------------------------------------------------
# to_jsonl OUT KEY ESCAPED FILE...: each FILE's text (invalid UTF-8 read as U+FFFD, as prepro_gpt2 reads a text
# file) as the field KEY of one line of OUT, between other fields; ESCAPED=1 writes non-ASCII as \u escapes
to_jsonl() {
  "$python" - "$@" <<'PY'
import json, sys
out, key, escaped, paths = sys.argv[1], sys.argv[2], sys.argv[3] == '1', sys.argv[4:]
with open(out, 'w', encoding='utf-8', newline='') as f:
    for i, path in enumerate(paths):
        text = open(path, 'rb').read().decode('utf-8', errors='replace')
        line = json.dumps({'id': i, key: text, 'meta': {'source': path, 'tags': ['a', 'b']}}, ensure_ascii=escaped)
        f.write(line + ('\r\n' if i % 3 == 1 else '\n') + ('\n  \t\n' if i % 4 == 2 else ''))
PY
}
mapfile -t corpus_docs <"$docs"
half=$(( ${#corpus_docs[@]} / 2 ))
if to_jsonl "$tmp/corpus_a.jsonl" text 1 "${corpus_docs[@]:0:half}" &&
   to_jsonl "$tmp/corpus_b.jsonl" text 0 "${corpus_docs[@]:half}" &&
   build/prepro_gpt2 --encoder $gpt2/encoder.json --vocab $gpt2/vocab.bpe --out-dir "$tmp/jsonl_corpus" --name j \
     --shard-tokens 900000 "$tmp/corpus_a.jsonl" "$tmp/corpus_b.jsonl" >/dev/null &&
   compare_with_oracle "$tmp/jsonl_corpus" j "$tmp/corpus.bin" "$tmp/corpus.tsv" >/dev/null; then
  pass "default corpus as two JSON Lines files (escaped and raw UTF-8) agrees with js-tiktoken"
else
  fail "default corpus as JSON Lines vs js-tiktoken"
fi
edge_docs=("$edge"/*.txt)
if to_jsonl "$tmp/edge_a.jsonl" body 1 "${edge_docs[@]:0:2}" &&
   to_jsonl "$tmp/edge_c.ndjson" body 0 "${edge_docs[@]:3}" &&
   build/prepro_gpt2 --encoder $gpt2/encoder.json --vocab $gpt2/vocab.bpe --out-dir "$tmp/jsonl_edge" --name e \
     --shard-tokens 500 --val-tokens 100 --text-key body "$tmp/edge_a.jsonl" "${edge_docs[2]}" "$tmp/edge_c.ndjson" \
     >/dev/null && compare_with_oracle "$tmp/jsonl_edge" e "$tmp/edge.bin" "$tmp/edge.tsv" >/dev/null; then
  pass "edge cases as JSON Lines (--text-key body, .jsonl and .ndjson, mixed with a text file) agree with js-tiktoken"
else
  fail "edge cases as JSON Lines vs js-tiktoken"
fi
prepro_bpe() { prepro --encoder $gpt2/encoder.json --vocab $gpt2/vocab.bpe "$@"; }
printf '{"text": "one"}\n{"text": 5}\n' >"$tmp/number.jsonl"
expect_error "$tmp/number.jsonl:2: no string field 'text'" prepro_bpe "$tmp/number.jsonl"
printf '{"text": "one"}\n\n{"body": "two"}\n' >"$tmp/other_key.jsonl"
expect_error "$tmp/other_key.jsonl:3: no string field 'text'" prepro_bpe "$tmp/other_key.jsonl"
printf '{"text": "one"}\r\n["two"]\r\n' >"$tmp/array.jsonl"
expect_error "$tmp/array.jsonl:2: expected a JSON object" prepro_bpe "$tmp/array.jsonl"
printf '{"text": "one"}\n{"text": "tw' >"$tmp/cut.jsonl"
expect_error "$tmp/cut.jsonl:2: malformed JSON" prepro_bpe "$tmp/cut.jsonl"
printf '{"text": "one \xff"}\n{"text": "two"}\n' >"$tmp/bad_utf8.jsonl"
expect_error "$tmp/bad_utf8.jsonl:1: malformed JSON" prepro_bpe "$tmp/bad_utf8.jsonl"
printf '\n  \n' >"$tmp/blank.jsonl"
expect_error "$tmp/blank.jsonl: no documents" prepro_bpe "$doc" "$tmp/blank.jsonl"

# ---- (g) compressed input --------------------------------------------------------------------------------------
# split_compress TOOL IN OUT: IN compressed by TOOL (gzip or zstd) as two members / frames, split mid-file
split_compress() {
  local bytes half
  bytes=$(stat -c %s "$2")
  half=$((bytes / 2 + 7))  # not at a line break
  { head -c "$half" "$2" | "$1" -q -c; tail -c +$((half + 1)) "$2" | "$1" -q -c; } >"$3"
}
if split_compress gzip "$tmp/corpus_a.jsonl" "$tmp/corpus_a.jsonl.gz" &&
   split_compress zstd "$tmp/corpus_b.jsonl" "$tmp/corpus_b.jsonl.zst" &&
   build/prepro_gpt2 --encoder $gpt2/encoder.json --vocab $gpt2/vocab.bpe --out-dir "$tmp/compressed_corpus" \
     --name z --shard-tokens 900000 "$tmp/corpus_a.jsonl.gz" "$tmp/corpus_b.jsonl.zst" >/dev/null &&
   compare_with_oracle "$tmp/compressed_corpus" z "$tmp/corpus.bin" "$tmp/corpus.tsv" >/dev/null; then
  pass "default corpus as .jsonl.gz and .jsonl.zst (two members / frames each, split mid-line) agrees with js-tiktoken"
else
  fail "default corpus as compressed JSON Lines vs js-tiktoken"
fi
if gzip -q -c "$tmp/edge_a.jsonl" >"$tmp/edge_a.jsonl.gz" && zstd -q -c "${edge_docs[2]}" >"$tmp/edge_2.txt.zst" &&
   zstd -q -c "$tmp/edge_c.ndjson" >"$tmp/edge_c.ndjson.zst" &&
   build/prepro_gpt2 --encoder $gpt2/encoder.json --vocab $gpt2/vocab.bpe --out-dir "$tmp/compressed_edge" --name e \
     --shard-tokens 500 --val-tokens 100 --text-key body "$tmp/edge_a.jsonl.gz" "$tmp/edge_2.txt.zst" \
     "$tmp/edge_c.ndjson.zst" >/dev/null &&
   compare_with_oracle "$tmp/compressed_edge" e "$tmp/edge.bin" "$tmp/edge.tsv" >/dev/null; then
  pass "edge cases as .jsonl.gz, .txt.zst and .ndjson.zst agree with js-tiktoken"
else
  fail "edge cases compressed vs js-tiktoken"
fi
gzip -q -c "$tmp/corpus_b.jsonl" | head -c 100000 >"$tmp/cut.jsonl.gz"
expect_error "$tmp/cut.jsonl.gz: truncated gzip data" prepro_bpe "$tmp/cut.jsonl.gz"
zstd -q -c "$tmp/corpus_b.jsonl" | head -c 100000 >"$tmp/cut.txt.zst"
expect_error "$tmp/cut.txt.zst: truncated Zstandard data" prepro_bpe "$doc" "$tmp/cut.txt.zst"
: >"$tmp/empty.jsonl.zst"
expect_error "$tmp/empty.jsonl.zst: truncated Zstandard data" prepro_bpe "$tmp/empty.jsonl.zst"
gzip -q -c "$tmp/corpus_b.jsonl" >"$tmp/flipped.jsonl.gz"
printf '\x55' | dd of="$tmp/flipped.jsonl.gz" bs=1 seek=50000 conv=notrunc status=none
expect_error "$tmp/flipped.jsonl.gz: corrupt gzip data" prepro_bpe "$tmp/flipped.jsonl.gz"
{ gzip -q -c "$doc"; printf 'trailing text'; } >"$tmp/trailing.txt.gz"
expect_error "$tmp/trailing.txt.gz: corrupt gzip data" prepro_bpe "$doc" "$tmp/trailing.txt.gz"
cp "$doc" "$tmp/not_gzip.txt.gz"
expect_error "$tmp/not_gzip.txt.gz: corrupt gzip data (zlib: incorrect header check)" prepro_bpe "$doc" \
  "$tmp/not_gzip.txt.gz"
zstd -q -c "$tmp/corpus_b.jsonl" >"$tmp/flipped.jsonl.zst"
printf '\x55' | dd of="$tmp/flipped.jsonl.zst" bs=1 seek=50000 conv=notrunc status=none
expect_error "$tmp/flipped.jsonl.zst: corrupt Zstandard data" prepro_bpe "$tmp/flipped.jsonl.zst"

echo
if [[ $failures -eq 0 ]]; then echo "all tokenizer tests passed"; else echo "$failures tokenizer test(s) failed"; fi
[[ $failures -eq 0 ]]
