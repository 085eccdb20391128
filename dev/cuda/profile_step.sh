#!/usr/bin/env bash
# Where one training step of the CUDA trainer spends its GPU time: runs ./train_gpt on GPT-2 124M
# (configs/d12.json, default corpus) for a few steps with Nsight Compute timing every kernel of one step
# (LLMC_PROFILE_STEP brackets it with cudaProfilerStart/Stop), then prints the kernels by total time and the
# totals per part of the model (matmuls, attention, LayerNorm, ...) with their share of the step's kernel time.
# More train_gpt flags pass through, the kernel switches too (--attention matmul).
#   dev/cuda/profile_step.sh [optimizer=adamw] [B=16] [T=1024] [more train_gpt flags...]
#   dev/cuda/profile_step.sh --table FILE.csv     only the tables, from a CSV `ncu --csv` wrote earlier
# Needs ncu on PATH, ./train_gpt and data/default. Exit 77 without a GPU or ncu. The CSV stays in
# build/profile-step/<optimizer>.csv.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-python3}

table() {  # table <ncu csv>
  "$PY" - "$1" <<'EOF'
import csv, collections, re, sys
rows = []
with open(sys.argv[1], newline="") as f:
    lines = [l for l in f if l.startswith('"')]      # ncu prints the program's own output first
for r in csv.DictReader(lines):
    if r.get("Metric Name") != "gpu__time_duration.sum":
        continue
    scale = {"ns": 1e-6, "nsecond": 1e-6, "us": 1e-3, "usecond": 1e-3, "ms": 1.0, "msecond": 1.0}[r["Metric Unit"]]
    rows.append((r["Kernel Name"], float(r["Metric Value"].replace(",", "")) * scale))
if not rows:
    sys.exit(f"profile_step: no gpu__time_duration.sum rows in {sys.argv[1]}")

def short(name):  # "void ns::kernel<args>(params)" -> "ns::kernel<args>"
    name = re.sub(r"^void ", "", name)
    depth, out = 0, []
    for ch in name:                                   # drop the parameter list, keep template arguments
        if ch == "(" and depth == 0:
            break
        depth += ch == "<"
        depth -= ch == ">"
        out.append(ch)
    return "".join(out)

PARTS = [("matmul (cuBLASLt)", r"nvjet|gemm|cutlass|splitKreduce|cublas|matmul_bias|BiasGrad"),
         ("attention", r"flash_attention|softmax|permute"),
         ("DeMo", r"demo::"),
         ("AdamW", r"adamw"),
         ("norms / clip", r"norm_squared|global_norm|clip"),
         ("LayerNorm + residual", r"layernorm|residual|column_reduce"),
         ("GELU", r"gelu"),
         ("classifier", r"classifier"),
         ("embedding", r"encoder")]
def part(name):
    for label, pattern in PARTS:
        if re.search(pattern, name, re.I):
            return label
    return "other"

total = sum(ms for _, ms in rows)
per_kernel = collections.defaultdict(lambda: [0, 0.0])
per_part = collections.defaultdict(float)
for name, ms in rows:
    k = per_kernel[short(name)]
    k[0] += 1
    k[1] += ms
    per_part[part(name)] += ms
print(f"{len(rows)} kernels, {total:.3f} ms of kernel time in the profiled step")
print(f"\n{'part':<24} {'ms':>9} {'share':>7}")
for label, ms in sorted(per_part.items(), key=lambda kv: -kv[1]):
    print(f"{label:<24} {ms:9.3f} {100 * ms / total:6.1f}%")
print(f"\n{'kernel':<72} {'calls':>5} {'ms':>9} {'share':>7}")
for name, (n, ms) in sorted(per_kernel.items(), key=lambda kv: -kv[1][1])[:25]:
    print(f"{name[:72]:<72} {n:5d} {ms:9.3f} {100 * ms / total:6.1f}%")
EOF
}

if [[ ${1:-} == --table ]]; then
  table "${2:?usage: profile_step.sh --table FILE.csv}"
  exit
fi
OPT=${1:-adamw} B=${2:-16} T=${3:-1024}
shift $(( $# < 3 ? $# : 3 ))
if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then
  echo "no CUDA device: profile skipped"; exit 77
fi
command -v ncu >/dev/null 2>&1 || { echo "no ncu (Nsight Compute) on PATH: profile skipped"; exit 77; }
[[ -x ./train_gpt ]] || { echo "profile_step: error: ./train_gpt not built (make train_gpt)" >&2; exit 1; }
out=build/profile-step
rm -rf "${out:?}/$OPT" && mkdir -p "$out"  # the last profile's run: the trainer would refuse to start over its metrics
# Step 4: after cuBLASLt's heuristics and the allocations of the first steps.
LLMC_PROFILE_STEP=4 ncu --profile-from-start off --clock-control none --metrics gpu__time_duration.sum --csv \
  ./train_gpt --config configs/d12.json --batch_size "$B" --seq_len "$T" --steps 5 --optimizer "$OPT" \
  --val_every 0 --val_data= --sample_every 0 --checkpoint_every -1 --log_every 1 --out_dir "$out/$OPT" "$@" \
  >"$out/$OPT.csv" 2>"$out/$OPT.err" || { echo "profile_step: ncu/train_gpt failed:"; tail -5 "$out/$OPT.err"; exit 1; }
echo "train_gpt --optimizer $OPT, B=$B, T=$T${*:+, $*}:"
table "$out/$OPT.csv"
