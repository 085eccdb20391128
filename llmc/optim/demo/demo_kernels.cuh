// The CUDA kernels of DeMo: one thread block per chunk, everything of a chunk in shared memory, the math from
// llmc/optim/demo/chunk_math.h (the same functions the host reference and test_demo_chunk_math run, so the fp32
// kernels' output is bit-identical to demo::cm::compress_plan_host / apply_plan_host apart from denormals, which
// --use_fast_math flushes to zero). test/emulated/test_demo_kernels_emu.cpp runs these kernels on the CPU
// (emu/block_emulator.h) against that reference in every `make test`; dev/cuda/demo_*.cu do it on a GPU.
//
//  - demo_compress_kernel: reads the chunk's momentum and fp32 gradient once (each thread keeps the updated
//    momentum of its elements in registers), momentum update (clip scale, lr-scaled or EMA), 2-D DCT-II as
//    two folded passes (the DCT-II symmetry halves the multiply-adds) over shared memory with the bases in
//    shared memory, top-k by |E| (ties to the lower index; block_select_topk: one shared-memory histogram of
//    the top 11 bits of |E|'s fp32 bits, then an exact ranking among the few keys of the k-th largest's bin;
//    cm::RadixSelect, at most 4 histogram rounds over 8-bit digits, when that bin is crowded by ties; the 64 x 64
//    tunings with register_topk apply the same rule to the coefficients each thread holds in registers),
//    placement of the selection in index order (warp ballots and one scan of per-warp counts), value
//    quantization (fp32 / bf16 RNE / sign with the per-chunk
//    mean |v| summed in double in index order), packing into the bucket at codec.h's offsets (bit-packed
//    parts with atomicOr into a zeroed bucket; the host writes the 32-byte header once), sparse decode of the
//    transmitted (dequantized) values and the error feedback, and ONE write of the momentum. Top-k,
//    quantization and packing are fused in this kernel: StepTimings::topk is reported as 0 and everything is
//    in StepTimings::transform.
//  - demo_apply_kernel: reads every rank's items of the chunk (W x k), scatter-mean per coefficient (ranks
//    summed in rank order), inverse DCT of the ascending list of sent coefficients, sign, decoupled weight
//    decay and p -= lr * sign on the fp32 master weights, and the floatX copy (nearest or stochastic
//    rounding as CudaAdamW). Out-of-range or non-ascending indices (a corrupt bucket) set an error flag the
//    host turns into an llmc::Error. With ApplyParams::keep_master the master weights are only read and the
//    floatX copy gets the update (eager delayed updates: one rank's own bucket, world 1, no weight decay);
//    with decay_after the decay follows the update (--demo_delay 1's order), with keep_params the floatX copy
//    is left alone (eager updates rewrite it from the own share).
// Both come in two instantiations per launch (cm::launch_tables): FIXED = 64 for the tensors with 64 x 64
// chunks (every GPT-2 matrix; all sizes compile-time constants) and FIXED = 0 for any other shape, each group
// with its own shared-memory layout. The 64 x 64 kernels also come in tunings (kTunings); those with tensor_dct
// run the dense products on the tensor cores (3xTF32, see "The tensor-core path" below; --demo_dct tensor
// picks them in the trainer), agreeing with the host reference to rounding instead of bit for bit.
// --optimizer topk (no transform) runs IDENTITY instantiations of both (launch_identity_compress / _apply): the
// coefficients are the momentum itself (no DCT passes, no bases), the decode puts the values at their indices; the
// top-k, quantization, packing and apply are the same code, so the bucket bits are the CPU module's.
//
// Work split of the dense products (cm::MatmulJob): a thread computes a 4 x 4 register tile, 4 consecutive
// output rows (A read as one float4, the same for the 16 lanes of a half warp) by 4 columns 16 apart (16
// consecutive lanes read consecutive columns: no bank conflicts); 8 x 2 tiles for 64 x 64 chunks (run_jobs).
// Chunks up to 64 x 64 use 256 threads,
// up to 128 x 128 1024 threads (every thread owns at most 8 row pairs / 16 elements of the chunk). A chunk and
// its scratch live in shared memory: 96 x 96 fits an H100 (227 KiB per block), 128 x 128 (~262 KiB) does not
// and is refused at setup by prepare_kernels with a message naming --demo_chunk.
//
// The kernels, one file each in kernels/: tunings.h (launch configuration, the tunings table), block_topk.cuh
// (block scan and per-chunk top-k), dct_products.cuh (the fp32 and tensor-core products, the sparse decode),
// compress.cuh, apply.cuh and launch.cuh (layouts, device tables, launch_compress / launch_apply).
#pragma once
#include "llmc/optim/demo/kernels/tunings.h"
#include "llmc/optim/demo/kernels/block_topk.cuh"
#include "llmc/optim/demo/kernels/dct_products.cuh"
#include "llmc/optim/demo/kernels/compress.cuh"
#include "llmc/optim/demo/kernels/apply.cuh"
#include "llmc/optim/demo/kernels/launch.cuh"
