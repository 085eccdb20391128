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
#     runtime (OpenBLAS and its Fortran runtime, libgomp), for LD_LIBRARY_PATH on the GPU machine;
#   - mpi/ (when this machine has Open MPI): mpi/train_gpt_fp32, the fp32 trainer built with MPI, and this
#     machine's Open MPI runtime, relocated (mpirun, orted, their plugins and help files, PMIx's plugins, and
#     every library they load but the C runtime, in mpi/lib), so that several ranks can share the lease's GPU
#     over the MPI transport: dev/cuda/gpu_session.sh runs dev/cuda/multi_gpu_check.sh with SHARED_GPU=1 on it
#     (the multi-rank paths on a real GPU when only one is lent). Its environment: mpi/env.sh.
# On the GPU machine: tar xJf gpu-bundle.tar.xz && gpu-bundle/dev/cuda/gpu_session.sh [budget seconds].
# About 8 minutes on 2 cores and 30 MB (about 22 MB without the corpus).
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
with_mpi=0
if command -v mpicxx >/dev/null && command -v orterun >/dev/null; then
  with_mpi=1
  echo "gpu_bundle: building train_gpt_fp32 with MPI in $work/tree-mpi" >&2
  mkdir -p "$work/tree-mpi"
  (cd "$work/tree" && tar -c --exclude='./build' --exclude='./train_gpt' --exclude='./train_gpt_fp32' .) |
    tar -x -C "$work/tree-mpi"
  make -C "$work/tree-mpi" -j"$(nproc)" USE_MPI=1 OPT="-O3 -march=x86-64-v2" train_gpt_fp32 >"$work/build-mpi.log" 2>&1 ||
    { tail -20 "$work/build-mpi.log" >&2; echo "gpu_bundle: error: the MPI build failed (log: $work/build-mpi.log)" >&2; exit 1; }
fi

stage=$work/stage/gpu-bundle
mkdir -p "$stage/lib" "$stage/build"
(cd "$work/tree" && tar -c --exclude='build' --exclude='*.o' --exclude='*.d' .) | tar -x -C "$stage"
cp -r "$work/tree/build/cuda" "$work/tree/build/cuda-fp32" "$stage/build/"
[[ -d data/default ]] && cp -r data/default "$stage/data/"
# bundle_libs DEST FILE...: the shared libraries the GPU machine may lack into DEST: everything ldd resolves here
# for the FILEs except CUDA's, NCCL, the C runtime and what $stage/lib already holds
bundle_libs() {
  local dest=$1
  shift
  for f in "$@"; do ldd "$f" 2>/dev/null; done | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}' |
    sort -u | while read -r name path; do
      case $name in
        libcublas*|libcudart*|libnccl*|libc.so*|libm.so*|libdl.so*|librt.so*|libpthread.so*|libgcc_s.so*|libstdc++.so*|ld-linux*) ;;
        *) [[ -f $stage/lib/$name ]] || cp -L "$path" "$dest/$name" ;;
      esac
    done
}
bundle_libs "$stage/lib" "$stage/train_gpt" "$stage"/build/cuda/*

# Open MPI, relocated: OPAL_PREFIX=mpi finds the plugins and help files at the paths they have under /usr here,
# PMIx's plugins are named by PMIX_MCA_mca_base_component_path, and mpi/lib comes first on LD_LIBRARY_PATH (a
# GPU machine's own libmpi would not match these plugins).
if ((with_mpi)); then
  m=$stage/mpi
  prefix=$(ompi_info --path prefix --parsable | cut -d: -f3)      # /usr
  pkglib=$(ompi_info --path pkglibdir --parsable | cut -d: -f3)    # /usr/lib/<triplet>/openmpi/lib/openmpi3
  pkgdata=$(ompi_info --path pkgdatadir --parsable | cut -d: -f3)  # /usr/share/openmpi
  plugins=$m${pkglib#"$prefix"}
  pmix_plugins=$(dirname "$(readlink -f "$(ldconfig -p | awk '/libpmix.so.2 / {print $NF; exit}')")")/pmix
  mkdir -p "$m/bin" "$m/lib" "${plugins%/*}" "$(dirname "$m${pkgdata#"$prefix"}")" "$m/pmix"
  cp "$work/tree-mpi/train_gpt_fp32" "$m/"
  cp "$(readlink -f "$(command -v orterun)")" "$m/bin/mpirun"
  cp "$(command -v orted)" "$m/bin/"
  cp -a "$pkglib" "${plugins%/*}/"
  cp -a "$pkgdata" "$(dirname "$m${pkgdata#"$prefix"}")/"
  [[ -d $pmix_plugins ]] && cp -a "$pmix_plugins" "$m/pmix/"
  bundle_libs "$m/lib" "$m/train_gpt_fp32" "$m"/bin/* "$plugins"/*.so "$m"/pmix/pmix/*.so
  cat >"$m/env.sh" <<'ENV'
# source mpi/env.sh (from the bundle's root): the bundled Open MPI first on PATH and LD_LIBRARY_PATH
m=$PWD/mpi
export OPAL_PREFIX=$m PMIX_MCA_mca_base_component_path=$m/pmix/pmix PATH=$m/bin:$PATH
export LD_LIBRARY_PATH=$m/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
ENV
fi
tar -cJf build/gpu-bundle.tar.xz -C "$work/stage" gpu-bundle
echo "gpu_bundle: build/gpu-bundle.tar.xz ($(du -h build/gpu-bundle.tar.xz | cut -f1); libraries: $(ls "$stage/lib" | tr '\n' ' '))"
echo "gpu_bundle: on the GPU machine: tar xJf gpu-bundle.tar.xz && gpu-bundle/dev/cuda/gpu_session.sh [budget seconds]"
