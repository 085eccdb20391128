#!/usr/bin/env bash
# The GPU checks and benchmarks in order of what they decide, under one time budget, for a short GPU lease
# (run inside the tree dev/cuda/gpu_bundle.sh packed, or any tree where `make cuda` has run):
#   1. the NCCL transport's checker (real NCCL: bf16 wire, overlapped all-reduce), and on a machine with several
#      GPUs dev/cuda/multi_gpu_check.sh (multi-rank correctness, then tokens/s on 1 and N GPUs); on one GPU, with
#      the bundle's Open MPI (mpi/), the same check's correctness part with two ranks sharing it over the MPI
#      transport (SHARED_GPU=1);
#   2. the attention, LayerNorm, OLMo (RoPE, SwiGLU, norms) and matmul labs (the flash backward with each dQ summation, --flash_dq, and
#      the forward's four block shapes; the fused LayerNorm backward; cuBLASLt's first against tuned algorithms,
#      --matmul_tune; the bias gradients by column reduction against the BGRADB epilogue, --bias_grad),
#      checked and timed;
#   3. the DeMo compress lab (every tuning of demo::kTunings in three formats, checked and timed);
#   4. the end-to-end benchmark, quick form (AdamW with each dQ summation, tuned matmuls and the bias epilogue,
#      and DeMo's four kernel settings; BENCH_DEMO_TUNINGS adds forced tunings), then the paper's 300M OLMo at
#      T=2048 (dev/cuda/bench_olmo.sh: AdamW and DeMo tokens/s and MFU);
#   5. dev/cuda/profile_kernel.sh on the DeMo compress (the default kernels; PROFILE_TUNINGS="7 8" profiles
#      those tunings instead): its stall samples per function and source line;
#   6. the trainer's determinism and resume check (DiLoCo's alone first, after step 1: its kernels on a real GPU);
#   7. the DeMo apply lab;
#   8. the PyTorch references, then the other rows of dev/cuda/gpu_check.sh (GPU_CHECK_SKIP: not those above;
#      not its benchmark).
# A step gets at most its own limit and never more than what is left of the budget (default 480 s; a step with
# under 25 s left is skipped). LD_LIBRARY_PATH gets NCCL's directory (the system's, or a Python wheel's),
# CUDA's, and the bundle's lib/ last, so the GPU machine's own libraries win; the reference generator (PyTorch)
# runs without it. Everything goes to stdout and to $LOGDIR/session.log (default build/gpu-session), with the
# checkers' own logs and the benchmark's summary in $LOGDIR/logs.tgz at the end.
#   dev/cuda/gpu_session.sh [budget seconds]
set -u
cd "$(dirname "$0")/../.."
budget=${1:-480}
logdir=${LOGDIR:-build/gpu-session}
mkdir -p "$logdir"
exec > >(tee -a "$logdir/session.log") 2>&1
t0=$(date +%s)
left() { echo $((budget - ($(date +%s) - t0))); }
step() {  # step NAME LIMIT COMMAND...: runs COMMAND for at most min(LIMIT, what is left - 5) seconds
  local name=$1 limit=$2 l s rc
  shift 2
  l=$(left)
  if ((l < 25)); then echo "=== $name: skipped (${l} s of the budget left)"; return; fi
  ((limit > l - 5)) && limit=$((l - 5))
  echo "=== $name (at most ${limit} s)"
  s=$(date +%s)
  timeout "$limit" "$@"
  rc=$?
  echo "=== $name: exit $rc after $(($(date +%s) - s)) s"
}

if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then
  echo "no CUDA device: GPU session skipped"
  exit 0
fi
nccl=$(find /usr/lib /usr/local /opt -name 'libnccl.so.2' 2>/dev/null | head -1)
export LD_LIBRARY_PATH=${nccl:+$(dirname "$nccl"):}/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}:$PWD/lib
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem,memory.total,driver_version --format=csv
echo "NCCL: ${nccl:-not found (the trainer will not start)}"
missing=$(ldd ./train_gpt 2>&1 | grep 'not found' || true)
[[ -z $missing ]] || echo "warning: ./train_gpt lacks libraries: $missing"

step nccl_transport 60 build/cuda/nccl_transport
step multi_gpu 420 dev/cuda/multi_gpu_check.sh  # exits at once on one GPU
if [[ -x mpi/train_gpt_fp32 && -f mpi/env.sh ]] && (($(nvidia-smi -L | grep -c '^GPU') == 1)); then
  step shared_gpu 150 bash -c 'source mpi/env.sh && SHARED_GPU=1 TRAIN_GPT_FP32=mpi/train_gpt_fp32 dev/cuda/multi_gpu_check.sh'
fi
RESUME_OPTIMIZERS=diloco step diloco_resume 45 dev/cuda/check_train_gpt_resume.sh  # train_gpt's DiLoCo kernels
step attention 60 build/cuda/attention
step layernorm 30 build/cuda/layernorm
step olmo_kernels 45 bash -c 'build/cuda/rope && build/cuda/swiglu && build/cuda/norms'
step matmul 60 build/cuda/matmul
step demo_compress 180 build/cuda/demo_compress
BENCH_QUICK=1 step bench_train_gpt 300 dev/cuda/bench_train_gpt.sh
step bench_olmo 150 dev/cuda/bench_olmo.sh 15
for tuning in ${PROFILE_TUNINGS:-default}; do
  if [[ $tuning == default ]]; then step profile_compress 90 dev/cuda/profile_kernel.sh demo_compress_kernel demo
  else step "profile_compress_$tuning" 90 dev/cuda/profile_kernel.sh demo_compress_kernel demo --demo_kernel_tuning "$tuning"
  fi
done
step train_gpt_resume 100 dev/cuda/check_train_gpt_resume.sh
step demo_apply 90 build/cuda/demo_apply
refs='python3 dev/reference/gpt2_reference.py --config tiny --batch 4 --seq 32 --out-dir build/reference/tiny &&
      python3 dev/reference/gpt2_reference.py --config tiny --channels 128 --heads 2 --max-seq-len 128 --batch 4 \
        --seq 96 --out-dir build/reference/hs64'
[[ -f build/reference/tiny/state.bin && -f build/reference/hs64/state.bin ]] ||
  step references 90 env -u LD_LIBRARY_PATH bash -c "$refs"
GPU_CHECK_SKIP="nccl_transport attention layernorm rope swiglu norms matmul demo_compress demo_apply train_gpt_resume multi_gpu" GPU_CHECK_BENCH=0 GPU_CHECK_TIMEOUT=90 \
  step gpu_check 600 dev/cuda/gpu_check.sh
tar -czf "$logdir/logs.tgz" build/cuda-logs build/bench-train-gpt/summary.txt build/bench-train-gpt/*.log \
  build/check-train-gpt-resume/*.log build/multi-gpu-check/*.log 2>/dev/null
echo "=== done after $(($(date +%s) - t0)) s of a ${budget} s budget; logs in $logdir"
