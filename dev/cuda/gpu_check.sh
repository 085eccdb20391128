#!/usr/bin/env bash
# Runs every GPU checker and test binary in build/cuda/ (built by `make cuda`; this script builds nothing) and
# prints a summary table: name, PASS / FAIL / SKIP, wall time, and the binary's TIME lines (kernel timings).
# Without a GPU (no nvidia-smi, or it lists no device) it prints "no CUDA device: GPU checks skipped" and exits
# 0. Otherwise it exits 1 when any binary failed. Full logs: build/cuda-logs/<name>.log.
# Usage: dev/cuda/gpu_check.sh [name-filter]
set -u
cd "$(dirname "$0")/../.."
filter="${1:-}"

if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then
  echo "no CUDA device: GPU checks skipped"
  exit 0
fi

bins=()
for bin in build/cuda/*; do
  [[ -f "$bin" && -x "$bin" ]] || continue
  name=$(basename "$bin")
  [[ -n "$filter" && "$name" != *"$filter"* ]] && continue
  bins+=("$bin")
done
if [[ ${#bins[@]} -eq 0 ]]; then
  echo "no binaries in build/cuda${filter:+ matching '$filter'}: run 'make cuda' first"
  exit 1
fi

logdir=build/cuda-logs
mkdir -p "$logdir"
nvidia-smi -L
echo
passed=0; failed=0; skipped=0; failed_names=()
declare -a rows timings
for bin in "${bins[@]}"; do
  name=$(basename "$bin")
  log="$logdir/$name.log"
  start=$(date +%s.%N)
  "$bin" >"$log" 2>&1; rc=$?
  end=$(date +%s.%N)
  secs=$(awk -v a="$start" -v b="$end" 'BEGIN { printf "%.1f", b - a }')
  if [[ $rc -eq 0 ]]; then status=PASS; passed=$((passed+1))
  elif [[ $rc -eq 77 ]]; then status=SKIP; skipped=$((skipped+1))
  else status=FAIL; failed=$((failed+1)); failed_names+=("$name")
  fi
  rows+=("$(printf '%-22s %-5s %7ss' "$name" "$status" "$secs")")
  while IFS= read -r line; do timings+=("$(printf '%-22s %s' "$name" "${line#TIME }")"); done < <(grep '^TIME ' "$log")
  if [[ $status == FAIL ]]; then
    echo "FAIL $name (exit $rc); failing checks from $log:"
    grep -E 'FAIL|error' "$log" | head -n 20 | sed 's/^/    /'
  fi
done

echo
printf '%-22s %-5s %8s\n' "binary" "result" "wall"
printf '%s\n' "${rows[@]}"
if [[ ${#timings[@]} -gt 0 ]]; then
  echo
  echo "timings:"
  printf '  %s\n' "${timings[@]}"
fi
echo
[[ $failed -gt 0 ]] && echo "failed: ${failed_names[*]}"
echo "$passed passed, $failed failed, $skipped skipped"
[[ $failed -eq 0 ]]
