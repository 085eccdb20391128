#!/usr/bin/env bash
# DiLoCo (--optimizer diloco) in the CUDA trainer on the emulated device, 1 and 2 ranks, fp32 and int8 wires, against
# the CPU trainer, with checkpoints across the two trainers and a bf16 resume bit for bit; then sparseloco likewise:
# test/emulated/diloco_emu_checks.py. Skips without mpirun or the emulated programs (no CUDA headers).
set -euo pipefail
cd "$(dirname "$0")/../.."
command -v mpirun >/dev/null || { echo "SKIP: mpirun not installed"; exit 77; }
cuda_headers=$(dirname "${NVCC:-/usr/local/cuda/bin/nvcc}")/../include/cuda_runtime.h
for b in build/emu/train_gpt build/emu-fp32/train_gpt train_gpt_cpu; do
  if [[ ! -x "$b" ]]; then
    [[ -f "$cuda_headers" ]] || { echo "SKIP: no CUDA headers ($cuda_headers), so no emulated device"; exit 77; }
    echo "missing $b: run make first"; exit 1
  fi
done
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export OMP_NUM_THREADS=1
data/prepare_default.sh >/dev/null
exec /usr/bin/python3 test/emulated/diloco_emu_checks.py
