#!/usr/bin/env bash
# Packs the CUDA trainer, every GPU checker and what they need into one archive for a GPU machine that is not
# this one: a short-lived lease with a CUDA driver and NCCL but without this machine's MPI, OpenBLAS or
# compiler. Builds here (no GPU needed) a copy of the working tree (tracked files as they are now, uncommitted
# changes included) with `make cuda USE_MPI=0` (one process, NCCL with one rank; the MPI transport is left out)
# and a portable host ISA (x86-64-v2: the GPU machine's processor is not this one), then puts into
# build/gpu-bundle.tar.xz:
#   - the built tree: ./train_gpt, ./train_gpt_fp32, build/cuda/, build/cuda-fp32/, the scripts, configs and
#     reference generator the checks use, and data/default (the default corpus' shards) when it exists here;
#   - lib/: the shared libraries the binaries load that are neither CUDA's (cuBLAS, cuBLASLt), NCCL nor the C
#     runtime (OpenBLAS and its Fortran runtime, libgomp), for LD_LIBRARY_PATH on the GPU machine.
# On the GPU machine: tar xJf gpu-bundle.tar.xz && gpu-bundle/dev/cuda/gpu_session.sh [budget seconds].
# About 6 minutes on 2 cores and 20 MB (12 MB without the corpus).
#   dev/cuda/gpu_bundle.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
work=build/gpu-bundle
rm -rf "$work" && mkdir -p "$work/tree"
[[ -x /usr/local/cuda/bin/nvcc || -n ${NVCC:-} ]] || { echo "gpu_bundle: error: no nvcc (set NVCC)" >&2; exit 1; }

# the working tree as it is: tracked files plus untracked ones git does not ignore
git ls-files -z --cached --others --exclude-standard | while IFS= read -r -d '' f; do
  [[ -f $f ]] && printf '%s\0' "$f"
done | tar -c --null -T - | tar -x -C "$work/tree"
echo "gpu_bundle: building in $work/tree (make cuda USE_MPI=0)" >&2
make -C "$work/tree" -j"$(nproc)" USE_MPI=0 OPT="-O3 -march=x86-64-v2" cuda >"$work/build.log" 2>&1 ||
  { tail -20 "$work/build.log" >&2; echo "gpu_bundle: error: the build failed (log: $work/build.log)" >&2; exit 1; }

stage=$work/stage/gpu-bundle
mkdir -p "$stage/lib" "$stage/build"
(cd "$work/tree" && tar -c --exclude='build' --exclude='*.o' --exclude='*.d' .) | tar -x -C "$stage"
cp -r "$work/tree/build/cuda" "$work/tree/build/cuda-fp32" "$stage/build/"
[[ -d data/default ]] && cp -r data/default "$stage/data/"
# shared libraries the GPU machine may lack: everything ldd resolves here except CUDA's, NCCL and the C runtime
for bin in "$stage/train_gpt" "$stage"/build/cuda/*; do ldd "$bin"; done | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}' |
  sort -u | while read -r name path; do
    case $name in
      libcublas*|libcudart*|libnccl*|libc.so*|libm.so*|libdl.so*|librt.so*|libpthread.so*|libgcc_s.so*|libstdc++.so*|ld-linux*) ;;
      *) cp -L "$path" "$stage/lib/$name" ;;
    esac
  done
tar -cJf build/gpu-bundle.tar.xz -C "$work/stage" gpu-bundle
echo "gpu_bundle: build/gpu-bundle.tar.xz ($(du -h build/gpu-bundle.tar.xz | cut -f1); libraries: $(ls "$stage/lib" | tr '\n' ' '))"
echo "gpu_bundle: on the GPU machine: tar xJf gpu-bundle.tar.xz && gpu-bundle/dev/cuda/gpu_session.sh [budget seconds]"
