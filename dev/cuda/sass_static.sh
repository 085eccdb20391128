#!/usr/bin/env bash
# Static SASS of the hand-written kernels that are tuned by instruction count, for judging a kernel change on a
# machine without a GPU. Two tables, each from one sm_90 cubin, disassembled:
#   - the 64 x 64 DeMo compress kernels (default): demo_compress_kernel<256, 64, T> for every tuning T of
#     demo::kTunings, with the registers and spills ptxas reports and the instruction counts of the kernel's
#     phases (cut at its barriers: prologue = loads, update, row fold; the last phase ends with the momentum
#     write). The 64 x 64 kernel is unrolled almost everywhere, so a phase's static count is close to what each
#     thread runs per chunk;
#   - the flash attention kernels (--flash): the forward's four block shapes and the backward's key-tile kernel
#     for each dQ summation, with registers, spills and the counts of the instructions that matter there (the
#     tensor-core products, shared-memory fragment loads, async copies, integer arithmetic, local memory).
# Static counts say nothing about latency; only a GPU run (dev/cuda/demo_compress.cu, dev/cuda/attention.cu) says
# what is faster.
#   dev/cuda/sass_static.sh [--phases T | --flash]   (--phases: the per-phase table of tuning T as well)
# CUDA 13.0 here has no disassembler (no cuobjdump or nvdisasm); Debian's non-free nvidia-cuda-toolkit
# (CUDA 11.8) has nvdisasm, which decodes sm_90 code but rejects CUDA 13's ELF header (ABI version 8, a new
# e_flags layout). The script fetches that package once into build/sass/ (or uses NVDISASM=path) and rewrites
# the three header fields to the old layout on a copy of the cubin; the code bytes are untouched.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-/usr/bin/python3}
NVCC=${NVCC:-/usr/local/cuda/bin/nvcc}
out=build/sass
mkdir -p "$out"
phases=-1 mode=compress
case ${1:-} in
  --phases) phases=${2:?--phases needs a tuning number} ;;
  --flash) mode=flash ;;
  "") ;;
  *) echo "usage: dev/cuda/sass_static.sh [--phases T | --flash]" >&2; exit 1 ;;
esac

nvdisasm=${NVDISASM:-}
if [[ -z $nvdisasm ]]; then
  if command -v nvdisasm >/dev/null; then nvdisasm=$(command -v nvdisasm)
  elif [[ -x $out/toolkit/usr/bin/nvdisasm ]]; then nvdisasm=$out/toolkit/usr/bin/nvdisasm
  else
    echo "sass_static: fetching nvdisasm (Debian non-free nvidia-cuda-toolkit, ~84 MB) into $out/toolkit" >&2
    mkdir -p "$out/apt/lists/partial" "$out/toolkit"
    echo 'deb http://deb.debian.org/debian bookworm main contrib non-free' > "$out/apt/sources.list"
    apt_opts=(-o "Dir::Etc::sourcelist=$PWD/$out/apt/sources.list" -o Dir::Etc::sourceparts=/dev/null
              -o "Dir::State::Lists=$PWD/$out/apt/lists" -o "Dir::Cache::archives=$PWD/$out/apt")
    apt-get "${apt_opts[@]}" -o APT::Sandbox::User=root update >/dev/null || { echo "sass_static: apt-get update failed (network?)" >&2; exit 1; }
    (cd "$out/apt" && apt-get "${apt_opts[@]}" -o APT::Sandbox::User=root download nvidia-cuda-toolkit >/dev/null) ||
      { echo "sass_static: could not download nvidia-cuda-toolkit" >&2; exit 1; }
    dpkg-deb -x "$out"/apt/nvidia-cuda-toolkit_*.deb "$out/toolkit"
    rm -f "$out"/apt/nvidia-cuda-toolkit_*.deb
    nvdisasm=$out/toolkit/usr/bin/nvdisasm
  fi
fi

# disassemble NAME: $out/NAME.cu to $out/NAME.sass (sm_90), ptxas's report in $out/NAME.ptxas
disassemble() {
  "$NVCC" -std=c++20 -O3 --use_fast_math -arch=sm_90 -cubin -I. -Xptxas -v -o "$out/$1.cubin" "$out/$1.cu" \
    2> "$out/$1.ptxas" || { cat "$out/$1.ptxas" >&2; exit 1; }
  "$PY" - "$out/$1.cubin" "$out/$1.old-abi.cubin" <<'PYEOF'
import struct, sys
b = bytearray(open(sys.argv[1], 'rb').read())
flags = struct.unpack_from('<I', b, 48)[0]
sm = (flags >> 8) & 0xff                # CUDA 13: the SM version in bits 8-15 of e_flags
if b[7] != 0x41 or sm not in (80, 86, 89, 90):
    sys.exit(f'sass_static: unexpected cubin header (OS/ABI {b[7]:#x}, e_flags {flags:#x}): update the rewrite')
b[7], b[8] = 0x33, 7                    # OS/ABI and ABI version of CUDA <= 12
struct.pack_into('<I', b, 48, sm | 0x0500 | (sm << 16))  # old layout: SM, unified texture mode, virtual SM
open(sys.argv[2], 'wb').write(b)
PYEOF
  "$nvdisasm" -c "$out/$1.old-abi.cubin" > "$out/$1.sass"
}

if [[ $mode == flash ]]; then
  {
    echo '#include "llmc/cuda/flash_attention.cuh"'
    echo 'namespace llmc::flash {'
    for shape in "1, 1" "2, 1" "1, 2" "2, 2"; do
      echo "template __global__ void flash_attention_forward_kernel<$shape>(bf16*, float*, const bf16*, int, int,"
      echo "    float);"
    done
    for dq in Shares SharesBf16 Atomic SharesLast; do
      echo "template __global__ void flash_attention_backward_kv_kernel<FlashDq::$dq>(bf16*, float*, unsigned*,"
      echo "    const bf16*, const bf16*, const float*, const float*, int, int, float, float);"
    done
    echo '}'
  } > "$out/flash.cu"
else
  tunings=$(grep -oP 'inline constexpr int kNumTunings = \K[0-9]+' llmc/optim/demo/demo_kernels.cuh)
  {
    echo '#include "llmc/optim/demo/demo_kernels.cuh"'
    echo 'namespace demo {'
    for ((t = 0; t < tunings; t++)); do
      echo "template __global__ void demo_compress_kernel<256, cm::kFixedChunk, $t>(const CompressArgs);"
    done
    echo '}'
  } > "$out/compress.cu"
fi
disassemble "$mode"
"$PY" - "$mode" "$out/$mode.sass" "$out/$mode.ptxas" "$phases" <<'PYEOF'
import collections, re, sys
mode, sass, ptxas, want = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
res, cur = {}, None
for line in open(ptxas):
    m = re.search(r"Compiling entry function '(\S+)'", line)
    if m: cur = m.group(1)
    m = re.search(r'(\d+) bytes spill stores, (\d+) bytes spill loads', line)
    if m and cur: res.setdefault(cur, {})['spill'] = int(m.group(1))
    m = re.search(r'Used (\d+) registers', line)
    if m and cur: res.setdefault(cur, {})['regs'] = int(m.group(1))
funcs, cur = {}, None  # kernel -> its opcodes with modifiers (BAR.SYNC...), predicates dropped
for line in open(sass):
    m = re.match(r'\s*\.text\.(\S+):', line)
    if m: cur = m.group(1); funcs[cur] = []; continue
    m = re.match(r'\s*/\*[0-9a-f]{4,}\*/\s+(.*?);', line)
    if m and cur: funcs[cur].append(re.sub(r'^@!?U?P[T0-9]+\s+', '', m.group(1).strip()).split()[0])
cls = lambda op: op.split('.')[0]
regs_spill = lambda name: (res.get(name, {}).get('regs', 0), res.get(name, {}).get('spill', 0))

if mode == 'flash':
    integer = ('IMAD', 'IADD3', 'LEA', 'ISETP', 'SHF', 'LOP3', 'SEL')
    print(f"{'kernel':<26}{'regs':>5}{'spill B':>9}{'total':>7}{'HMMA':>6}{'LDSM':>6}{'LDGSTS':>8}{'integer':>8}"
          f"{'LDL':>5}{'STL':>5}")
    def label(name):
        m = re.search(r'forward_kernelILi(\d)ELi(\d)E', name)
        if m: return f"forward RT {m.group(1)} QT {m.group(2)}"
        m = re.search(r'backward_kv_kernelILNS0_7FlashDqE(\d)E', name)
        if m: return "backward " + ['shares', 'shares_bf16', 'atomic', 'shares_last'][int(m.group(1))]
    for name in sorted(n for n in funcs if label(n)):
        ops = funcs[name]
        c = collections.Counter(cls(op) for op in ops)
        regs, spill = regs_spill(name)
        print(f"{label(name):<26}{regs:>5}{spill:>9}{len(ops):>7}{c['HMMA']:>6}"
              f"{c['LDSM']:>6}{c['LDGSTS']:>8}{sum(c[k] for k in integer):>8}{c['LDL']:>5}{c['STL']:>5}")
    sys.exit(0)

keys = ['LDG', 'STG', 'LDS', 'STS', 'LDL', 'STL', 'FFMA', 'HMMA', 'ATOMS', 'SHFL', 'IMAD', 'ISETP', 'BRA']
print(f"{'tuning':<7}{'regs':>5}{'spill B':>9}{'total':>7}{'prologue':>9}{'last':>6}  " + ' '.join(f'{k:>5}' for k in keys))
tuning_of = lambda n: int(re.search(r'compress_kernelILi256ELi64ELi(\d+)E', n).group(1))
for name in sorted((n for n in funcs if 'compress_kernelILi256ELi64ELi' in n), key=tuning_of):
    t = tuning_of(name)
    ops = funcs[name]
    phases = [[]]
    for op in ops:
        phases[-1].append(op)
        if op.startswith('BAR.SYNC'): phases.append([])
    phases = [p for p in phases if p]
    c = collections.Counter(cls(op) for op in ops)
    regs, spill = regs_spill(name)
    print(f"{t:<7}{regs:>5}{spill:>9}{len(ops):>7}{len(phases[0]):>9}{len(phases[-1]):>6}  "
          + ' '.join(f'{c[k]:>5}' for k in keys))
    if t == want:
        print(f"  phases of tuning {t} (in code order; the fallback paths sit after the main line):")
        for i, p in enumerate(phases):
            pc = collections.Counter(cls(op) for op in p)
            print(f"  {i:>3} {len(p):>6}  " + ' '.join(f'{pc[k]:>5}' for k in keys))
PYEOF
