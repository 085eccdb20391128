#!/usr/bin/env bash
# `make bench`: the CPU benchmarks in one go, each printing its own figures. The model step (GPT-2 124M
# forward + backward + AdamW at B=4,T=64 and B=8,T=256), then the DeMo optimizer step on the same shapes split
# into transform / top-k / exchange / apply, bucket bytes per encoding and its share of forward+backward at
# 2048 tokens, then the index encodings' bits and ns per index. Timings need a quiet machine: the 1-minute
# load average is printed before each part.
set -euo pipefail
cd "$(dirname "$0")/../.."
echo "== load: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "== GPT-2 124M training step (bench_model_cpu)"
build/bench/bench_model_cpu "$@"
echo
echo "== load: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "== DeMo optimizer step on GPT-2 124M shapes (bench_demo)"
build/bench/bench_demo
echo
echo "== DeMo index encodings: bits per index and ns per index (bench_demo_indices)"
build/bench/bench_demo_indices
