#!/usr/bin/env bash
# Tokenizer throughput: build/prepro_gpt2 (single thread and default threads) against js-tiktoken under node, on the
# default corpus (data/prepare_default.sh, run if needed). Ours is timed conservatively, as the whole process
# (vocabulary load, file reads, shard writes with fsync; best of 3 runs); js-tiktoken as encode calls only
# (library load and file reads excluded; one run, it takes a while). Prints both and the speed-up; the target
# is >= 10x on one thread. Usage: dev/bench/bench_tokenizer.sh
set -euo pipefail
cd "$(dirname "$0")/../.."

bash data/prepare_default.sh >/dev/null
[[ -x build/prepro_gpt2 ]] || make build/prepro_gpt2 >/dev/null
docs=data/cache/docs/documents.txt
gpt2=data/cache/gpt2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
bytes=$(xargs cat <"$docs" | wc -c)
cpus=$(nproc)
load=$(cut -d' ' -f1 /proc/loadavg)  # other work on the machine skews wall times; CPU seconds are printed too

best_run() {  # THREADS -> "wall_seconds cpu_seconds tokens" of the fastest of 3 whole-process runs
  local best="" cpu="" tokens=0 wall user sys
  for _ in 1 2 3; do
    /usr/bin/time -f '%e %U %S' -o "$tmp/time" build/prepro_gpt2 --encoder $gpt2/encoder.json \
      --vocab $gpt2/vocab.bpe --out-dir "$tmp/out" --name bench --threads "$1" --file-list "$docs" >"$tmp/log"
    read -r wall user sys <"$tmp/time"
    tokens=$(grep -oE -- '-> [0-9]+ tokens' "$tmp/log" | grep -oE '[0-9]+')
    if [[ -z $best ]] || awk -v a="$wall" -v b="$best" 'BEGIN { exit !(a < b) }'; then
      best=$wall
      cpu=$(awk -v u="$user" -v s="$sys" 'BEGIN { print u + s }')
    fi
  done
  echo "$best $cpu $tokens"
}

read -r ours1_s ours1_cpu ours_tokens < <(best_run 1)
read -r oursN_s oursN_cpu _ < <(best_run "$cpus")
node dev/reference/tiktoken_encode.js --bench --file-list "$docs" >"$tmp/js.log"
js_s=$(grep -oE 'encode [0-9.]+ s' "$tmp/js.log" | grep -oE '[0-9.]+')
js_tokens=$(grep -oE -- '-> [0-9]+ tokens' "$tmp/js.log" | grep -oE '[0-9]+')

awk -v bytes="$bytes" -v o1="$ours1_s" -v oN="$oursN_s" -v c1="$ours1_cpu" -v cN="$oursN_cpu" -v ot="$ours_tokens" \
    -v js="$js_s" -v jt="$js_tokens" -v load="$load" \
    -v cpus="$cpus" -v docs="$(wc -l <"$docs")" 'BEGIN {
  mb = bytes / 1e6
  printf "default corpus: %d documents, %.2f MB; %d CPUs, load average %s\n", docs, mb, cpus, load
  printf "%-34s %7.3f s %8.2f MB/s %7.2f M tokens/s  (CPU %.2f s)\n", "prepro_gpt2, 1 thread (process)", o1, mb / o1, ot / 1e6 / o1, c1
  printf "%-34s %7.3f s %8.2f MB/s %7.2f M tokens/s  (CPU %.2f s)\n", sprintf("prepro_gpt2, %d threads (process)", cpus), oN, mb / oN, ot / 1e6 / oN, cN
  printf "%-34s %7.3f s %8.2f MB/s %7.2f M tokens/s\n", "js-tiktoken (encode calls only)", js, mb / js, jt / 1e6 / js
  printf "speed-up over js-tiktoken: %.1fx on 1 thread, %.1fx on %d threads (target >= 10x)\n", js / o1, js / oN, cpus
}'
