// An f32 value as mla_project_v's two bf16 parts, one definition for every kernel that writes them
// (mla_decode.cu's mla_split_bf16_kernel, the attention CTAs in mla_mma_attention.cuh, the split merge's
// SplitMergeBf16Parts), so each gives the same bits: hi = bf16(x), lo = bf16(x - hi) (~2^-17 relative
// together). Tested through those kernels: tests/kernels/test_cuda_mla_fusions.cpp compares each writer's
// mla_project_v output bit for bit with mla_split_bf16_kernel's.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

namespace fp4moe::cuda {

__device__ __forceinline__ void bf16_hi_lo(float x, __nv_bfloat16& hi, __nv_bfloat16& lo) {
  const __nv_bfloat16 h = __float2bfloat16_rn(x);
  hi = h;
  lo = __float2bfloat16_rn(__fsub_rn(x, __bfloat162float(h)));
}

// Element i of a [n_seqs, seq_elems] latent -> the index of its hi part in the parts rows [2 n_seqs,
// seq_elems] (row 2 s, the same column); its lo part is seq_elems further (row 2 s + 1).
__device__ __forceinline__ int64_t bf16_parts_index(int64_t i, int64_t seq_elems) {
  return i + (i / seq_elems) * seq_elems;
}

}  // namespace fp4moe::cuda
