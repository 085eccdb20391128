#!/usr/bin/env bash
# Runs every test: the C++ test binaries (build/test/test_*, built from test/unit/test_*.cpp and
# test/emulated/test_*_emu.cpp) and the script tests
# (test/*/test_*.sh, which may call /usr/bin/python3 or node). Exit status 0 = pass, 77 = skipped (the test
# printed why), anything else = fail. Prints one line per test and a closing "N passed, N failed, N skipped".
# Usage: test/run_tests.sh [name-filter]
set -u
cd "$(dirname "$0")/.."
filter="${1:-}"
logdir=build/test-logs
# Transparent huge pages for every malloc of the programs and scripts run here (glibc 2.35+; other versions ignore
# it): on the CI VM a 4 KiB page fault costs ~10 us, and the Python/PyTorch checks allocate through malloc too. The
# trainers and tools advise their large arrays themselves (llmc/base/host_memory.h), with or without this.
export GLIBC_TUNABLES=${GLIBC_TUNABLES:-glibc.malloc.hugetlb=1}
mkdir -p "$logdir"
passed=0; failed=0; skipped=0; failed_names=()
# Shared fixture: the default corpus and the GPT-2 vocabulary files (idempotent, ~10 s the first time), so the
# C++ tests that read them run fully instead of skipping.
data/prepare_default.sh >"$logdir/prepare_default.log" 2>&1 || { echo "data/prepare_default.sh failed; see $logdir/prepare_default.log"; tail -n 5 "$logdir/prepare_default.log"; }
run_one() {
  local name="$1"; shift
  [[ -n "$filter" && "$name" != *"$filter"* ]] && return
  local log="$logdir/$name.log" start end rc
  start=$(date +%s.%N)
  "$@" >"$log" 2>&1; rc=$?
  end=$(date +%s.%N)
  local secs; secs=$(awk -v a="$start" -v b="$end" 'BEGIN { printf "%.1f", b - a }')
  if [[ $rc -eq 0 ]]; then passed=$((passed+1)); echo "PASS  $name (${secs}s)"
  elif [[ $rc -eq 77 ]]; then skipped=$((skipped+1)); echo "SKIP  $name: $(grep -m1 '^SKIP' "$log" | cut -c7-)"
  else failed=$((failed+1)); failed_names+=("$name"); echo "FAIL  $name (exit $rc, ${secs}s); last lines of $log:"; tail -n 15 "$log" | sed 's/^/      /'
  fi
}
for bin in build/test/test_*; do
  [[ -x "$bin" ]] && run_one "$(basename "$bin")" "$bin"
done
for script in test/*/test_*.sh; do
  [[ -f "$script" ]] && run_one "$(basename "$script" .sh)" bash "$script"
done
echo
[[ $failed -gt 0 ]] && echo "failed: ${failed_names[*]}"
echo "$passed passed, $failed failed, $skipped skipped"
[[ $failed -eq 0 && $passed -gt 0 ]]
