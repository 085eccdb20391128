#!/usr/bin/env bash
# dev/cuda/profile_step.sh --table (the per-kernel and per-part tables of an `ncu --csv` profile) on a small
# hand-written CSV whose totals are worked out here: the program's own output before the CSV is skipped, rows
# of other metrics are ignored, units (ns, us) are converted, calls of one kernel are summed under its name
# without the parameter list, and kernels land in their part of the model.
set -uo pipefail
cd "$(dirname "$0")/.."
TMP=build/test-tmp/profile_table
rm -rf "$TMP" && mkdir -p "$TMP"
PY=/usr/bin/python3
"$PY" -c 'import csv' 2>/dev/null || PY=python3
cat >"$TMP/step.csv" <<'CSV'
step 4/5 | loss 9.1 | this line is train_gpt's own output
"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size","Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"
"0","1","train_gpt","h","void llmc::layernorm_forward_kernel<0>(__nv_bfloat16 *, const float *, int)","1","13","(256, 1, 1)","(2048, 1, 1)","0","9.0","Command line profiler metrics","gpu__time_duration.sum","ns","1,000"
"1","1","train_gpt","h","nvjet_sm90_tst_256x128_NNT","1","13","(384, 1, 1)","(2, 66, 1)","0","9.0","Command line profiler metrics","gpu__time_duration.sum","us","2"
"2","1","train_gpt","h","void llmc::layernorm_forward_kernel<0>(__nv_bfloat16 *, const float *, int)","1","13","(256, 1, 1)","(2048, 1, 1)","0","9.0","Command line profiler metrics","gpu__time_duration.sum","ns","3,000"
"3","1","train_gpt","h","void demo::demo_apply_kernel<256>(demo::ApplyArgs)","1","13","(256, 1, 1)","(32256, 1, 1)","0","9.0","Command line profiler metrics","gpu__time_duration.sum","ns","1,494,000"
"3","1","train_gpt","h","void demo::demo_apply_kernel<256>(demo::ApplyArgs)","1","13","(256, 1, 1)","(32256, 1, 1)","0","9.0","Command line profiler metrics","sm__cycles_elapsed.avg","cycle","999,999"
CSV
out=$(PYTHON=$PY dev/cuda/profile_step.sh --table "$TMP/step.csv" 2>&1)
rc=$?
echo "$out"
failures=0
expect() {  # expect <description> <regex matched against one output line>
  if grep -Eq "$2" <<<"$out"; then echo "ok    $1"; else echo "FAIL  $1"; failures=$((failures + 1)); fi
}
# 0.001 + 0.002 + 0.003 + 1.494 = 1.500 ms in 4 kernel launches
[[ $rc -eq 0 ]] && echo "ok    exit 0" || { echo "FAIL  exit $rc"; failures=$((failures + 1)); }
expect "4 launches, 1.500 ms in all" '^4 kernels, 1\.500 ms of kernel time'
expect "DeMo part: 1.494 ms, 99.6%" '^DeMo +1\.494 +99\.6%$'
expect "LayerNorm part: 0.004 ms, 0.3%" '^LayerNorm \+ residual +0\.004 +0\.3%$'
expect "matmul part from us: 0.002 ms, 0.1%" '^matmul \(cuBLASLt\) +0\.002 +0\.1%$'
expect "two calls summed under the name without parameters" '^llmc::layernorm_forward_kernel<0> +2 +0\.004 +0\.3%$'
[[ $failures -eq 0 ]] && echo PASS || { echo "$failures check(s) failed"; exit 1; }
