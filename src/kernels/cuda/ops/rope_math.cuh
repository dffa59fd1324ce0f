// The RoPE arithmetic every GPU kernel that rotates a pair uses (norm_rope.cu's rope_kernel,
// mla_decode.cu's q_pe copy and latent append, dsa_indexer.cu's key append): bit for bit model::rope_neox /
// rope_interleaved on bf16 inputs, each product rounded as on the CPU (__fmul_rn / __fadd_rn, so nvcc cannot fuse them
// into FMAs). Tested through its kernels: tests/kernels/test_cuda_ops.cpp (RoPE vs the CPU) and
// test_cuda_mla_fusions.cpp.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

namespace fp4moe::cuda {

// The element indices of rotated pair i of a head's rotary dims: NeoX pairs i with i + half,
// interleaved 2 i with 2 i + 1.
__device__ __forceinline__ void rope_pair_dims(bool neox, int64_t i, int64_t half, int64_t& i1, int64_t& i2) {
  i1 = neox ? i : 2 * i;
  i2 = neox ? i + half : 2 * i + 1;
}

// (x1, x2) rotated by the angle with cosine c and sine s: x1' = x1 c - x2 s, x2' = x2 c + x1 s, in bf16.
__device__ __forceinline__ void rope_rotate_pair(float x1, float x2, float c, float s, __nv_bfloat16& y1,
                                                 __nv_bfloat16& y2) {
  y1 = __float2bfloat16_rn(__fsub_rn(__fmul_rn(x1, c), __fmul_rn(x2, s)));
  y2 = __float2bfloat16_rn(__fadd_rn(__fmul_rn(x2, c), __fmul_rn(x1, s)));
}

}  // namespace fp4moe::cuda
