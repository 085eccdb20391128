#!/usr/bin/env bash
# dev/cuda/profile_step.sh --table (the per-kernel and per-part tables of an `ncu --csv` profile) on a small
# hand-written CSV whose totals are worked out here: the program's own output before the CSV is skipped, rows
# of other metrics are ignored, units (ns, us) are converted, calls of one kernel are summed under its name
# without the parameter list, and kernels land in their part of the model. Then dev/cuda/profile_kernel.sh
# --table (one kernel's stall samples and instructions per function and per line, from `ncu --page source --csv`)
# on a hand-written source CSV and a small source file: a file's summary row (line 0) is not counted again, the
# build machine's path is found under the source root by its suffix, lines go to the function that encloses them
# (a __launch_bounds__ kernel's name is on its next line), and the stall reasons are shares of each row's samples.
set -uo pipefail
cd "$(dirname "$0")/../.."
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

mkdir -p "$TMP/src/demo"
cat >"$TMP/src/demo/k.cuh" <<'SRC'
// a kernel file
template <int N>
__device__ __forceinline__ int helper(int x) {
    return x + N;
}
template <int T>
__global__ void __launch_bounds__(256, f(T))
    my_kernel(int* out) {
    out[0] = helper<1>(0);
    __syncthreads();
}
SRC
cat >"$TMP/source.csv" <<'CSV'
==PROF== Connected to process 1 (this line is ncu's own output)
"File Path","/far/away/tree/demo/k.cuh"
"Function Name","void my_kernel<(int)1>(int *)"
"Line No","Source","Address","Source","Warp Stall Sampling (All Samples)","Warp Stall Sampling (Not-issued Samples)","Instructions Executed","stall_barrier","stall_long_sb","stall_wait","stall_barrier (Not Issued)"
"0","","","","100","90","1,000","60","20","20","60"
"4","    return x + N;","0x10","IADD3 R1, R1, 0x1","30","30","600","0","20","10","0"
"9","    out[0] = helper<1>(0);","0x20","STG.E [R2], R1","10","5","300","0","0","10","0"
"10","    __syncthreads();","0x30","BAR.SYNC.DEFER_BLOCKING 0x0","60","55","100","60","0","0","60"
CSV
out=$(PYTHON=$PY dev/cuda/profile_kernel.sh --table "$TMP/source.csv" "$TMP/src" 2 2>&1)
rc=$?
echo "$out"
[[ $rc -eq 0 ]] && echo "ok    exit 0" || { echo "FAIL  exit $rc"; failures=$((failures + 1)); }
# 30 + 10 + 60 = 100 samples, 600 + 300 + 100 = 1000 instructions (the line-0 summary row not added again)
expect "totals without the summary row" '^100 warp stall samples, 1,000 warp instructions executed'
expect "helper: 30% of samples, 60% of instructions, long_sb 20 of 30" \
  '^helper \(k\.cuh\) +30\.0% +60\.0%  long_sb 67%, wait 33%$'
expect "the kernel: lines 9-10, 70% / 40%, barrier 60 of 70" \
  '^my_kernel \(k\.cuh\) +70\.0% +40\.0%  barrier 86%, wait 14%$'
expect "top line with its source text" '^k\.cuh:10 +60\.0% +10\.0%  \[barrier 100%\]  __syncthreads\(\);$'
expect "stall reasons over the kernel" '^stall reasons over the kernel: barrier 60%, long_sb 20%, wait 20%$'
bad=$(PYTHON=$PY dev/cuda/profile_kernel.sh --table "$TMP/step.csv" 2>&1)
rc=$?
[[ $rc -ne 0 ]] && grep -q "not ncu --page source --csv output" <<<"$bad" && echo "ok    a CSV without source rows is refused" ||
  { echo "FAIL  a CSV without source rows: exit $rc, $bad"; failures=$((failures + 1)); }

[[ $failures -eq 0 ]] && echo PASS || { echo "$failures check(s) failed"; exit 1; }
