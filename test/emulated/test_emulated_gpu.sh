#!/usr/bin/env bash
# The CUDA trainer without a GPU: `make emu` builds train_gpt.cu and the GPU tests (test/gpu_*.cu) with g++
# against the emulated device (kernels run by emu/block_emulator.h; CUDA runtime, cuBLASLt/cuBLAS and
# NCCL-over-MPI from emu/{runtime,cublas,nccl}.cpp). This runs
#  - the GPU tests: the CUDA GPT-2 against the independent PyTorch reference (logits, loss, every gradient, 10
#    AdamW steps; bf16 with both attentions, the three flash dQ summations, the DGELU epilogue and the micro-step
#    as a CUDA graph, and fp32; a batch with targets -1, bf16 and fp32) and
#    CudaDemo against the CPU DeMo optimizer (10 steps, fp32; also with LLMC_DEMO_MOMENTUM=dct, the state blob
#    converted both ways; and both with --demo_delay 1, eager and stale, the state blob's pending round moved both
#    ways);
#  - dev/cuda/nccl_transport.cu (the NCCL transport's collectives, bf16 wire, overlapped all-reduce and split
#    all-gather; allreduce_mean_wait; the host-staged transport's overlapped all-reduce, which waits for
#    neither the compute stream nor its copies back) at 1-3 ranks;
#  - the GPU trainer against the CPU trainer (both optimizers, 1 and 2 ranks over the NCCL and the MPI
#    transport, both attentions, every GELU fusion level and the epilogue fallback, resume, a CPU checkpoint
#    continued on the GPU trainer; DeMo's --demo_delay 1, eager and stale, likewise; --optimizer topk at 1 and 2
#    ranks and its resume).
# All of it is run by test/emulated/emulated_gpu_checks.py, as many commands at a time as the machine has cores
# (LLMC_TEST_JOBS=N sets the count), against the PyTorch references written here.
# Skips when the emulated programs are not built (no CUDA headers) or /usr/bin/python3 has no torch.
set -euo pipefail
cd "$(dirname "$0")/../.."

python=/usr/bin/python3
# Without the CUDA headers nothing here can be built (skip); with them, `make` (all) builds it, so a missing
# program is a build failure, not a reason to skip.
cuda_headers=$(dirname "${NVCC:-/usr/local/cuda/bin/nvcc}")/../include/cuda_runtime.h
for b in build/emu/train_gpt build/emu-fp32/train_gpt build/emu/gpu_test_gpt2 build/emu-fp32/gpu_test_gpt2 \
         build/emu-fp32/gpu_test_demo build/emu/nccl_transport train_gpt_cpu; do
  if [[ ! -x "$b" ]]; then
    [[ -f "$cuda_headers" ]] || { echo "SKIP: no CUDA headers ($cuda_headers), so no emulated device"; exit 77; }
    echo "error: $b is not built although the CUDA headers are installed (make emu)"
    exit 1
  fi
done
if ! "$python" -c "import torch" 2>/dev/null; then
  echo "SKIP: $python cannot import torch (Debian's python3-torch provides it)"
  exit 77
fi

refs=build/test-tmp/emulated
# reference NAME ARGS...: the PyTorch reference of dev/reference/gpt2_reference.py, written when missing, older
# than the script or made with other arguments
reference() {
  local dir="$refs/$1"; shift
  if [[ ! -f "$dir/state.bin" || dev/reference/gpt2_reference.py -nt "$dir/state.bin" ||
        "$(cat "$dir/arguments" 2>/dev/null)" != "$*" ]]; then
    rm -rf "$dir"
    "$python" dev/reference/gpt2_reference.py "$@" --seed 1337 --out-dir "$dir"
    echo "$*" > "$dir/arguments"
  fi
}
# A vocabulary of 1001 (odd, as GPT-2's 50257; padded to 1024): the classifier and the DeMo compression of wte
# were three quarters of these tests' emulated time at 50257, and the kernels' strides over long rows are
# checked in test_llmc_kernels_emu and test_demo_kernels_emu. On a GPU the tests take GPT-2's vocabulary.
vocab=(--vocab-size 1001 --padded-vocab-size 1024)
reference tiny --config tiny --batch 4 --seq 32 "${vocab[@]}"
# targets -1 (no target) at every row's last position and in all of row 1, which torch's ignore_index skips
reference tiny_masked --config tiny --batch 4 --seq 32 "${vocab[@]}" --mask-targets
# head size 64 (flash attention's tile), 96 positions: one full tile and a partial one; 2 rows are enough here
reference hs64 --config tiny --channels 128 --heads 2 --max-seq-len 128 --batch 2 --seq 96 "${vocab[@]}"

exec "$python" test/emulated/emulated_gpu_checks.py
