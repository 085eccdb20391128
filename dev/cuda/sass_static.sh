#!/usr/bin/env bash
# Static SASS of the 64 x 64 DeMo compress kernels, for judging a kernel change on a machine without a GPU:
# compiles demo_compress_kernel<256, 64, T> for every tuning T of demo::kTunings to one sm_90 cubin, disassembles
# it, and prints per tuning the registers and spills ptxas reports and the instruction counts of the kernel's
# phases (cut at its barriers: prologue = loads, update, row fold; the last phase ends with the momentum write).
# The 64 x 64 kernel is unrolled almost everywhere, so a phase's static count is close to what each thread runs
# per chunk; it says nothing about latency, and only a GPU run (dev/cuda/demo_compress.cu) says what is faster.
#   dev/cuda/sass_static.sh [--phases T]   (--phases: the per-phase table of tuning T as well)
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
phases=-1
if [[ ${1:-} == --phases ]]; then phases=${2:?--phases needs a tuning number}; fi

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

tunings=$(grep -oP 'inline constexpr int kNumTunings = \K[0-9]+' demo/demo_kernels.cuh)
{
  echo '#include "demo/demo_kernels.cuh"'
  echo 'namespace demo {'
  for ((t = 0; t < tunings; t++)); do
    echo "template __global__ void demo_compress_kernel<256, cm::kFixedChunk, $t>(const CompressArgs);"
  done
  echo '}'
} > "$out/compress_tunings.cu"
"$NVCC" -std=c++20 -O3 --use_fast_math -arch=sm_90 -cubin -I. -Xptxas -v -o "$out/compress.cubin" \
  "$out/compress_tunings.cu" 2> "$out/ptxas.txt" || { cat "$out/ptxas.txt" >&2; exit 1; }
"$PY" - "$out/compress.cubin" "$out/compress.old-abi.cubin" <<'PYEOF'
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
"$nvdisasm" -c "$out/compress.old-abi.cubin" > "$out/compress.sass"
"$PY" - "$out/compress.sass" "$out/ptxas.txt" "$phases" <<'PYEOF'
import collections, re, sys
sass, ptxas, want = sys.argv[1], sys.argv[2], int(sys.argv[3])
res = {}
cur = None
for line in open(ptxas):
    m = re.search(r"Compiling entry function '(\S+)'", line)
    if m: cur = m.group(1)
    m = re.search(r'(\d+) bytes spill stores, (\d+) bytes spill loads', line)
    if m and cur: res.setdefault(cur, {})['spill'] = (int(m.group(1)), int(m.group(2)))
    m = re.search(r'Used (\d+) registers', line)
    if m and cur: res.setdefault(cur, {})['regs'] = int(m.group(1))
funcs, cur = {}, None
for line in open(sass):
    m = re.match(r'\s*\.text\.(\S+):', line)
    if m: cur = m.group(1); funcs[cur] = []; continue
    m = re.match(r'\s*/\*[0-9a-f]{4,}\*/\s+(.*?);', line)
    if m and cur: funcs[cur].append(re.sub(r'^@!?U?P[T0-9]+\s+', '', m.group(1).strip()).split()[0])
cls = lambda op: op.split('.')[0]
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
    r = res.get(name, {})
    print(f"{t:<7}{r.get('regs', 0):>5}{r.get('spill', (0, 0))[0]:>9}{len(ops):>7}{len(phases[0]):>9}{len(phases[-1]):>6}  "
          + ' '.join(f'{c[k]:>5}' for k in keys))
    if t == want:
        print(f"  phases of tuning {t} (in code order; the fallback paths sit after the main line):")
        for i, p in enumerate(phases):
            pc = collections.Counter(cls(op) for op in p)
            print(f"  {i:>3} {len(p):>6}  " + ' '.join(f'{pc[k]:>5}' for k in keys))
PYEOF
