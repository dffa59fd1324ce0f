// The RMSNorm of one row on the GPU, shared by norm_rope.cu's kernels and mla_decode.cu's latent append
// (one definition of the arithmetic, so every caller gives the same bits): model::rms_norm's, IEEE div
// and sqrt, no fast-math, inv = 1 / sqrt(ss / dim + eps) and y = w * (s * inv).
// Tested through its kernels: tests/kernels/test_cuda_ops.cpp (RMSNorm vs the CPU) and test_cuda_mla_fusions.cpp.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "kernels/cuda/warp_reduce.cuh"

namespace fp4moe::cuda {

inline constexpr int kRmsNormCtaWarps = 8;  // the RMSNorm kernels' CTAs: 256 threads

__device__ __forceinline__ float rms_inv(float ss, int64_t dim, float eps) {
  return 1.0f / sqrtf(__fadd_rn(__fdiv_rn(ss, static_cast<float>(dim)), eps));
}
__device__ __forceinline__ float rms_scale(float w, float s, float inv) { return __fmul_rn(w, __fmul_rn(s, inv)); }

// The sum of every thread's `v` over the 256-thread CTA (warp sums, then warp 0..7 in order); all threads get it.
// warp_partial: kRmsNormCtaWarps floats of the CTA's shared memory.
__device__ __forceinline__ float cta_sum(float v, float* warp_partial) {
  v = warp_sum(v);
  if (threadIdx.x % 32 == 0) warp_partial[threadIdx.x / 32] = v;
  __syncthreads();
  float s = 0.0f;
#pragma unroll
  for (int k = 0; k < kRmsNormCtaWarps; ++k) s += warp_partial[k];
  return s;
}

// y = rms_norm(s) of one row with 16 B accesses, s = x (+ residual, rounded to bf16 and written back to
// residual); x, residual (or null), y: the row's first element, 16 B aligned; dim % 8 == 0. Called by the
// kThreadsPerRow threads of the row (32: a warp, no barrier; 256: the whole CTA, which must all call it),
// thread t of the row holding 8-element pieces t, t + kThreadsPerRow, ... (kVecs of them, dim / 8 <= kVecs x
// kThreadsPerRow) in registers between the two passes, so the row is read once (x, residual) and written
// once (residual, y), its loads all in flight together (element by element, the warp-per-row kernel
// waited out one load after another: ~9.5 us for one 512-wide row on an H100, twenty-ninth session); all
// loads of a thread precede its stores, so y may alias x. warp_partial: cta_sum's shared floats for a CTA a
// row; unused (nullptr will do) for a warp a row.
template <int kThreadsPerRow, int kVecs>
__device__ __forceinline__ void rms_norm_vec_row(const __nv_bfloat16* x, __nv_bfloat16* residual,
                                                 const float* __restrict__ w, int dim, float eps, __nv_bfloat16* y,
                                                 int t, float* warp_partial) {
  static_assert(kThreadsPerRow == 32 || kThreadsPerRow == 32 * kRmsNormCtaWarps, "a warp or the whole CTA per row");
  const int n_vec = dim / 8;
  uint4 v[kVecs];
  // The weights' pieces are loaded with the row, not after the sum: their latency (an HBM read at
  // decode, where a step's ~GB of weights has evicted them from L2) overlaps the row's.
  float4 wv[kVecs][2];
  float ss = 0.0f;
#pragma unroll
  for (int j = 0; j < kVecs; ++j) {
    const int i = t + j * kThreadsPerRow;
    if (i >= n_vec) break;
    wv[j][0] = __ldg(reinterpret_cast<const float4*>(w + 8 * i));
    wv[j][1] = __ldg(reinterpret_cast<const float4*>(w + 8 * i + 4));
    v[j] = *reinterpret_cast<const uint4*>(x + 8 * i);
    if (residual != nullptr) {
      const uint4 r = *reinterpret_cast<const uint4*>(residual + 8 * i);
      __nv_bfloat162* xv = reinterpret_cast<__nv_bfloat162*>(&v[j]);
      const __nv_bfloat162* rv = reinterpret_cast<const __nv_bfloat162*>(&r);
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float2 a = __bfloat1622float2(xv[e]), b = __bfloat1622float2(rv[e]);
        xv[e] = __floats2bfloat162_rn(__fadd_rn(a.x, b.x), __fadd_rn(a.y, b.y));
      }
      *reinterpret_cast<uint4*>(residual + 8 * i) = v[j];
    }
    const __nv_bfloat162* sv = reinterpret_cast<const __nv_bfloat162*>(&v[j]);
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float2 f = __bfloat1622float2(sv[e]);
      ss = __fmaf_rn(f.x, f.x, ss);
      ss = __fmaf_rn(f.y, f.y, ss);
    }
  }
  if constexpr (kThreadsPerRow == 32) {
    ss = warp_sum(ss);
  } else {
    ss = cta_sum(ss, warp_partial);
  }
  const float inv = rms_inv(ss, dim, eps);
#pragma unroll
  for (int j = 0; j < kVecs; ++j) {
    const int i = t + j * kThreadsPerRow;
    if (i >= n_vec) break;
    const float wf[8] = {wv[j][0].x, wv[j][0].y, wv[j][0].z, wv[j][0].w,
                         wv[j][1].x, wv[j][1].y, wv[j][1].z, wv[j][1].w};
    const __nv_bfloat162* sv = reinterpret_cast<const __nv_bfloat162*>(&v[j]);
    uint4 out;
    __nv_bfloat162* ov = reinterpret_cast<__nv_bfloat162*>(&out);
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float2 f = __bfloat1622float2(sv[e]);
      ov[e] = __floats2bfloat162_rn(rms_scale(wf[2 * e], f.x, inv), rms_scale(wf[2 * e + 1], f.y, inv));
    }
    *reinterpret_cast<uint4*>(y + 8 * i) = out;
  }
}

}  // namespace fp4moe::cuda
