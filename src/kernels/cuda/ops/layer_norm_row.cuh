// The LayerNorm (weight + bias) of one bf16 row by one warp, shared by layer_norm.cu's kernel and
// dsa_indexer.cu's key append (one definition of the arithmetic, so both give the same bits): three
// passes over the row held by each lane (sum -> mean, centered sum of squares -> variance, normalize),
// each product / sum rounded explicitly (__fmul_rn / __fadd_rn) so nvcc cannot contract them into FMAs;
// only the summation order differs from model::layer_norm.
// Tested through its kernels: tests/kernels/test_cuda_layer_norm.cpp and test_cuda_mla_fusions.cpp.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "kernels/cuda/warp_reduce.cuh"

namespace fp4moe::cuda {

// y[i] = (x[i] - mean) * inv * w[i] + b[i] for i < dim; x, y: the row's first element (y may alias x: each
// lane reads its elements before it writes them). Called by all 32 lanes of a warp.
__device__ __forceinline__ void layer_norm_warp_row(const __nv_bfloat16* x, const float* __restrict__ w,
                                                    const float* __restrict__ b, int64_t dim, float eps,
                                                    __nv_bfloat16* y, int lane) {
  float sum = 0.0f;
  for (int64_t i = lane; i < dim; i += 32) sum = __fadd_rn(sum, __bfloat162float(x[i]));
  const float mean = __fdiv_rn(warp_sum(sum), static_cast<float>(dim));
  float sq = 0.0f;
  for (int64_t i = lane; i < dim; i += 32) {
    const float d = __fsub_rn(__bfloat162float(x[i]), mean);
    sq = __fadd_rn(sq, __fmul_rn(d, d));
  }
  const float var = __fdiv_rn(warp_sum(sq), static_cast<float>(dim));
  // model::layer_norm: inv = 1 / sqrt(var + eps) (IEEE div and sqrt).
  const float inv = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(var, eps)));
  for (int64_t i = lane; i < dim; i += 32) {
    const float d = __fsub_rn(__bfloat162float(x[i]), mean);
    y[i] = __float2bfloat16_rn(__fadd_rn(__fmul_rn(__fmul_rn(d, inv), w[i]), b[i]));  // (x-m)*inv*w + b
  }
}

}  // namespace fp4moe::cuda
