#!/usr/bin/env bash
# Where one kernel of a training step spends its time, by function and source line: runs ./train_gpt on GPT-2 124M
# (configs/d12.json, B=4, T=1024, 5 steps) under Nsight Compute, profiles the first launch in step 4 whose name
# matches a regex with every section and the per-instruction source counters, and prints the kernel's headline
# figures (time, instructions, issue slots, occupancy, DRAM) and a table of its warp stall samples and executed
# instructions per function and per source line, with the top stall reasons of each. Functions are found in the
# source files this tree holds (a build machine's path is matched by its shortest suffix that names a file here), so
# inlined helpers (block_select_topk, tensor_dct_pass, ...) get their own rows. Needs a build with -lineinfo (the
# Makefile's NVCCFLAGS have it). More train_gpt flags pass through, the kernel switches too (--demo_kernel_tuning 7).
#   dev/cuda/profile_kernel.sh [REGEX=demo_compress_kernel] [optimizer=demo] [more train_gpt flags...]
#   dev/cuda/profile_kernel.sh --table FILE.csv [SOURCE_ROOT=.] [LINES=25]
#       only the table, from `ncu -i REPORT --page source --csv --print-source cuda,sass` output saved earlier
# The report, its source CSV and its details CSV stay in build/profile-kernel/. Exit 77 without a GPU or ncu.
set -uo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-/usr/bin/python3}
command -v "$PY" >/dev/null 2>&1 || PY=python3

table() {  # table <source csv> <source root> <lines>
  "$PY" - "$1" "$2" "$3" <<'PYEOF'
import collections, csv, os, re, sys

path, root, top_n = sys.argv[1], sys.argv[2], int(sys.argv[3])
rows, file, hdr, kernel = [], None, None, None
with open(path, newline="") as f:
    for rec in csv.reader(f):
        if not rec:
            continue
        if rec[0] == "File Path":
            file = rec[1]
        elif rec[0] == "Function Name":
            kernel = rec[1]
        elif rec[0] == "Line No":
            hdr = rec
        elif hdr is not None and file is not None:
            rows.append((file, rec))
if hdr is None:
    sys.exit(f"profile_kernel: {path}: no 'Line No' header (not ncu --page source --csv output)")

def num(s):
    try:
        return float(s.replace(",", ""))
    except ValueError:
        return 0.0

i_samples = hdr.index("Warp Stall Sampling (All Samples)")
i_instr = hdr.index("Instructions Executed")
stalls = [(i, h[len("stall_"):]) for i, h in enumerate(hdr) if h.startswith("stall_") and "Not Issued" not in h]

# a file's source: the shortest suffix of the build machine's path that names a file under root (demo/x.cuh for
# /elsewhere/tree/demo/x.cuh; one of two components or more before the bare name), else the path itself (CUDA's
# headers on the machine that profiled)
sources = {}
def source(p):
    if p not in sources:
        parts, sources[p] = p.strip("/").split("/"), None
        suffixes = [parts[k:] for k in range(len(parts) - 2, -1, -1)] + [parts[-1:]]
        for candidate in [os.path.join(root, *s) for s in suffixes] + [p]:
            if os.path.isfile(candidate):
                sources[p] = open(candidate, errors="replace").read().split("\n")
                break
    return sources[p]

# function starts: a definition at column 0 (template lines skipped); its name is the identifier before the first
# '(' that is not an attribute macro, on that line or, for `__global__ void __launch_bounds__(...)`, the next
NOT_NAMES = {"__launch_bounds__", "__align__", "alignas", "decltype", "sizeof", "alignof", "if", "for", "while",
             "switch", "return", "static_assert"}
starts = {}
def function_starts(p):
    if p not in starts:
        src, found = source(p), []
        for n, text in enumerate(src or [], 1):
            if text.startswith(("template", "#", "//", " ", "\t", "}", "{")) or text.rstrip().endswith(";"):
                continue
            text = re.sub(r"__launch_bounds__\s*\((?:[^()]|\([^()]*\))*\)", "", text)
            names = [m for m in re.findall(r"\b([A-Za-z_]\w*)\s*\(", text) if m not in NOT_NAMES]
            if not names and n < len(src):
                names = [m for m in re.findall(r"^\s+([A-Za-z_]\w*)\s*\(", src[n]) if m not in NOT_NAMES]
            if names:
                found.append((n, names[0]))
        starts[p] = found
    return starts[p]

def function_of(p, line):
    name = None
    for n, f in function_starts(p):
        if n > line:
            break
        name = f
    base = os.path.basename(p)
    return f"{name} ({base})" if name else base

by_func = collections.defaultdict(lambda: [0.0, 0.0, collections.Counter()])
by_line = collections.defaultdict(lambda: [0.0, 0.0, collections.Counter()])
total_stalls = collections.Counter()
S = I = 0.0
for p, r in rows:
    line = int(num(r[0]))
    if line <= 0:  # a file's summary row (its instructions' sums), not an instruction
        continue
    s, i = num(r[i_samples]), num(r[i_instr])
    S, I = S + s, I + i
    for acc in (by_func[function_of(p, line)], by_line[(p, line)]):
        acc[0] += s
        acc[1] += i
        for k, h in stalls:
            acc[2][h] += num(r[k])
    for k, h in stalls:
        total_stalls[h] += num(r[k])
if S <= 0 or I <= 0:
    sys.exit(f"profile_kernel: {path}: no stall samples or instructions in its rows")

def reasons(c, s, n=3):
    return ", ".join(f"{h} {100 * v / s:.0f}%" for h, v in c.most_common(n) if v > 0) if s > 0 else ""

print(f"kernel: {kernel or '?'}")
print(f"{S:,.0f} warp stall samples, {I:,.0f} warp instructions executed (per source line, summed)")
print(f"{'function':<48} {'samples':>8} {'instr':>7}  top stall reasons")
for name, (s, i, c) in sorted(by_func.items(), key=lambda kv: (-kv[1][0], kv[0])):
    if s / S < 0.005 and i / I < 0.005:
        continue
    print(f"{name:<48} {100 * s / S:7.1f}% {100 * i / I:6.1f}%  {reasons(c, s)}")
print(f"\ntop {top_n} source lines by stall samples:")
for (p, line), (s, i, c) in sorted(by_line.items(), key=lambda kv: (-kv[1][0], kv[0]))[:top_n]:
    src = source(p)
    text = src[line - 1].strip()[:70] if src and line <= len(src) else ""
    print(f"{os.path.basename(p)}:{line:<5} {100 * s / S:5.1f}% {100 * i / I:5.1f}%  [{reasons(c, s, 2)}]  {text}")
print("\nstall reasons over the kernel: " + reasons(total_stalls, S, 8))
PYEOF
}

if [[ ${1:-} == --table ]]; then
  [[ -f ${2:-} ]] || { echo "profile_kernel: --table needs a CSV file" >&2; exit 1; }
  table "$2" "${3:-.}" "${4:-25}"
  exit $?
fi
REGEX=${1:-demo_compress_kernel}
OPT=${2:-demo}
shift $(($# > 2 ? 2 : $#))
if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then
  echo "no CUDA device: kernel profile skipped"; exit 77
fi
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
[[ -n $NCU ]] || { echo "no ncu (Nsight Compute): kernel profile skipped"; exit 77; }
[[ -x ./train_gpt ]] || { echo "profile_kernel: error: ./train_gpt not built (make train_gpt)" >&2; exit 1; }
out=build/profile-kernel
rm -rf "$out/run" && mkdir -p "$out"  # the last profile's run: the trainer would refuse to start over its metrics
# step 4: after cuBLASLt's heuristics and the first steps' allocations; clocks as they run in training
LLMC_PROFILE_STEP=4 "$NCU" --profile-from-start off --clock-control none -k "regex:$REGEX" --launch-count 1 \
  --set full --import-source yes -f -o "$out/kernel" \
  ./train_gpt --config configs/d12.json --batch_size 4 --seq_len 1024 --steps 5 --optimizer "$OPT" \
  --val_every 0 --val_data= --sample_every 0 --checkpoint_every -1 --log_every 1 --out_dir "$out/run" "$@" \
  >"$out/ncu.log" 2>&1 || { echo "profile_kernel: ncu/train_gpt failed:"; tail -5 "$out/ncu.log"; exit 1; }
grep -q "No kernels were profiled" "$out/ncu.log" && { echo "profile_kernel: no kernel matched '$REGEX' in step 4"; exit 1; }
"$NCU" -i "$out/kernel.ncu-rep" --page details --csv >"$out/details.csv" 2>/dev/null
"$NCU" -i "$out/kernel.ncu-rep" --page source --csv --print-source cuda,sass >"$out/source.csv" 2>"$out/source.err" ||
  { echo "profile_kernel: ncu could not export the source counters:"; tail -3 "$out/source.err"; exit 1; }
"$PY" - "$out/details.csv" <<'PYEOF'
import csv, sys
want = ["Duration", "Executed Instructions", "Issue Slots Busy", "Registers Per Thread", "Achieved Occupancy",
        "DRAM Throughput", "Memory Throughput"]
seen = {}
for rec in csv.reader(open(sys.argv[1], newline="")):
    if len(rec) >= 3 and rec[-3] in want and rec[-3] not in seen:
        seen[rec[-3]] = f"{rec[-1]} {rec[-2]}"
print(" | ".join(f"{k} {seen[k]}" for k in want if k in seen))
PYEOF
table "$out/source.csv" . 25
