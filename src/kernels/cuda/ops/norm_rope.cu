// RMSNorm (+ fused residual add), RoPE, embedding lookup and argmax on the GPU (see norm_rope.h).
//   rms_norm:  one warp per row for dim <= 1024 (8 rows per 256-thread CTA), else one 256-thread CTA
//              per row: with dim % 8 == 0 and 16 B aligned rows (up to dim 8192) 16 B accesses and the
//              row held in registers between the two passes (rms_norm_vec_row, rms_norm_row.cuh, which
//              mla_decode.cu's fused latent append shares; GLM-5 H = 6144: 3 pieces of 8 a thread, its
//              q_a norm, dim 2048: 1 a thread), otherwise element by element, the second pass re-reading
//              what the same thread wrote; either way y may alias x.
//   rope:      one thread per (token, head, rotated pair), grid-stride.
//   embedding: one 128-thread CTA per token (grid-stride), 16-byte copies when dim % 8 == 0.
//   argmax:    one 256-thread CTA per row, or per (row, column part) with a second one-warp-per-row
//              kernel over the parts' candidates; (value, index) pairs reduced with xor shuffles,
//              then across the 8 warps in shared memory, in the order argmax_beats defines (the
//              result does not depend on how the row is cut); a row's NaN / Inf flag rides along
//              (__syncthreads_or in a CTA, the index's sign bit in a part's candidate, __any_sync in
//              the merge).
// Tested by tests/kernels/test_cuda_ops.cpp.
#include <algorithm>

#include "core/error.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/launch_grid.h"
#include "kernels/cuda/ops/device_errors.h"
#include "kernels/cuda/ops/norm_rope.h"
#include "kernels/cuda/ops/rms_norm_row.cuh"
#include "kernels/cuda/ops/rope_math.cuh"
#include "kernels/cuda/warp_reduce.cuh"

namespace fp4moe::cuda {

namespace {

constexpr int kCta = 256;
constexpr int kWarps = kRmsNormCtaWarps;
constexpr unsigned kFullMask = 0xffffffffu;
constexpr int64_t kMaxGrid = kGridStrideMaxCtas;  // grid-stride beyond this many CTAs

// kThreadsPerRow = 32: a warp per row (rows are warp-uniform, no __syncthreads); 256: a CTA per row.
template <int kThreadsPerRow>
__global__ void __launch_bounds__(kCta)
    rms_norm_kernel(const __nv_bfloat16* x, __nv_bfloat16* residual, const float* __restrict__ w,
                    int64_t n_rows, int64_t dim, int64_t row_stride, float eps, __nv_bfloat16* y) {
  static_assert(kThreadsPerRow == 32 || kThreadsPerRow == kCta, "a warp or the whole CTA per row");
  constexpr int kRowsPerCta = kCta / kThreadsPerRow;
  __shared__ float warp_partial[kWarps];
  const int t = static_cast<int>(threadIdx.x) % kThreadsPerRow;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kRowsPerCta + threadIdx.x / kThreadsPerRow;
  // Uniform per warp (32 threads per row) or per CTA (256 per row), so returning keeps every
  // remaining shuffle/barrier full.
  if (row >= n_rows) return;
  const int64_t base = row * row_stride;

  float ss = 0.0f;
  for (int64_t i = t; i < dim; i += kThreadsPerRow) {
    float s = __bfloat162float(x[base + i]);
    if (residual != nullptr) {
      const __nv_bfloat16 sb = __float2bfloat16_rn(__fadd_rn(s, __bfloat162float(residual[base + i])));
      residual[base + i] = sb;
      s = __bfloat162float(sb);
    }
    ss = __fmaf_rn(s, s, ss);
  }
  if constexpr (kThreadsPerRow == kCta) {
    ss = cta_sum(ss, warp_partial);
  } else {
    ss = warp_sum(ss);
  }
  const float inv = rms_inv(ss, dim, eps);
  for (int64_t i = t; i < dim; i += kThreadsPerRow) {
    const float s = __bfloat162float(residual != nullptr ? residual[base + i] : x[base + i]);
    y[base + i] = __float2bfloat16_rn(rms_scale(w[i], s, inv));
  }
}

// 16 B accesses (rms_norm_vec_row), a warp or a CTA a row.
template <int kThreadsPerRow, int kVecs>
__global__ void __launch_bounds__(kCta)
    rms_norm_vec_kernel(const __nv_bfloat16* x, __nv_bfloat16* residual, const float* __restrict__ w, int64_t n_rows,
                        int64_t dim, int64_t row_stride, float eps, __nv_bfloat16* y) {
  static_assert(kThreadsPerRow == 32 || kThreadsPerRow == kCta, "a warp or the whole CTA per row");
  constexpr int kRowsPerCta = kCta / kThreadsPerRow;
  __shared__ float warp_partial[kWarps];
  const int t = static_cast<int>(threadIdx.x) % kThreadsPerRow;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kRowsPerCta + threadIdx.x / kThreadsPerRow;
  if (row >= n_rows) return;  // uniform per warp (a warp a row) or per CTA
  const int64_t base = row * row_stride;
  rms_norm_vec_row<kThreadsPerRow, kVecs>(x + base, residual == nullptr ? nullptr : residual + base, w,
                                          static_cast<int>(dim), eps, y + base, t, warp_partial);
}

using RmsNormKernel = void (*)(const __nv_bfloat16*, __nv_bfloat16*, const float*, int64_t, int64_t, int64_t, float,
                               __nv_bfloat16*);

// rms_norm_vec_kernel with kThreadsPerRow threads a row for rows of `pieces` 8-element pieces: the
// instance holding ceil(pieces / kThreadsPerRow) a thread, or null past 4 a thread.
template <int kThreadsPerRow>
RmsNormKernel rms_norm_vec_for(int64_t pieces) {
  constexpr RmsNormKernel kByPieces[4] = {
      rms_norm_vec_kernel<kThreadsPerRow, 1>, rms_norm_vec_kernel<kThreadsPerRow, 2>,
      rms_norm_vec_kernel<kThreadsPerRow, 3>, rms_norm_vec_kernel<kThreadsPerRow, 4>};
  const int64_t per_thread = (pieces + kThreadsPerRow - 1) / kThreadsPerRow;
  return per_thread <= 4 ? kByPieces[per_thread - 1] : nullptr;
}

__global__ void __launch_bounds__(kCta)
    rope_kernel(__nv_bfloat16* x, int64_t n_tokens, int64_t n_heads, int64_t token_stride, int64_t head_stride,
                int64_t offset, int64_t half, bool neox, const int32_t* __restrict__ positions,
                const float* __restrict__ cos_table, const float* __restrict__ sin_table, int64_t n_positions,
                uint32_t* error_flag) {
  const int64_t total = n_tokens * n_heads * half;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; idx < total; idx += stride) {
    const int64_t i = idx % half;
    const int64_t th = idx / half;
    const int64_t h = th % n_heads;
    const int64_t tok = th / n_heads;
    const int64_t pos = positions[tok];
    if (pos < 0 || pos >= n_positions) {
      if (h == 0 && i == 0) atomicOr(error_flag, kDeviceErrorRopePosition);
      continue;
    }
    const float c = cos_table[pos * half + i];
    const float s = sin_table[pos * half + i];
    __nv_bfloat16* v = x + tok * token_stride + h * head_stride + offset;
    int64_t i1, i2;
    rope_pair_dims(neox, i, half, i1, i2);
    rope_rotate_pair(__bfloat162float(v[i1]), __bfloat162float(v[i2]), c, s, v[i1], v[i2]);
  }
}

constexpr int kEmbedCta = 128;

__global__ void __launch_bounds__(kEmbedCta)
    embedding_kernel(const __nv_bfloat16* __restrict__ table, int64_t vocab, int64_t dim,
                     const int32_t* __restrict__ ids, int64_t n_tokens, bool vec16, __nv_bfloat16* __restrict__ out,
                     uint32_t* error_flag) {
  for (int64_t tok = blockIdx.x; tok < n_tokens; tok += gridDim.x) {
    const int64_t id = ids[tok];
    const bool ok = id >= 0 && id < vocab;
    if (!ok && threadIdx.x == 0) atomicOr(error_flag, kDeviceErrorTokenId);
    __nv_bfloat16* o = out + tok * dim;
    if (vec16) {  // dim % 8 == 0 and both bases 16-byte aligned (checked by the launcher)
      const int64_t n_vec = dim / 8;
      const uint4* src = reinterpret_cast<const uint4*>(table + (ok ? id : 0) * dim);
      uint4* dst = reinterpret_cast<uint4*>(o);
      for (int64_t i = threadIdx.x; i < n_vec; i += blockDim.x) dst[i] = ok ? src[i] : make_uint4(0, 0, 0, 0);
    } else {
      const __nv_bfloat16* src = table + (ok ? id : 0) * dim;
      for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) o[i] = ok ? src[i] : __float2bfloat16_rn(0.0f);
    }
  }
}

__device__ __forceinline__ float to_f32(float v) { return v; }
__device__ __forceinline__ float to_f32(__nv_bfloat16 v) { return __bfloat162float(v); }

// The warp's best candidate (argmax_beats order), in every lane.
__device__ __forceinline__ ArgmaxCandidate warp_argmax(ArgmaxCandidate best) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const ArgmaxCandidate other{__shfl_xor_sync(kFullMask, best.value, o), __shfl_xor_sync(kFullMask, best.index, o)};
    if (argmax_beats(other, best)) best = other;
  }
  return best;
}

// The best non-NaN candidate of x[begin, end) over the CTA and whether the range holds a NaN or an Inf; valid
// in thread 0. Ends with a barrier (warp_best is reused).
struct ArgmaxScan {
  ArgmaxCandidate best;
  bool non_finite;
};
template <typename T>
__device__ ArgmaxScan argmax_cta(const T* __restrict__ x, int64_t begin, int64_t end, ArgmaxCandidate* warp_best) {
  ArgmaxCandidate best = argmax_identity();
  int non_finite = 0;
  for (int64_t i = begin + threadIdx.x; i < end; i += kCta) {
    const ArgmaxCandidate c{to_f32(x[i]), static_cast<int32_t>(i)};
    non_finite |= !isfinite(c.value);
    if (!isnan(c.value) && argmax_beats(c, best)) best = c;
  }
  best = warp_argmax(best);
  if (threadIdx.x % 32 == 0) warp_best[threadIdx.x / 32] = best;
  const bool any_non_finite = __syncthreads_or(non_finite) != 0;
  if (threadIdx.x == 0) {
    for (int k = 1; k < kWarps; ++k) {
      if (argmax_beats(warp_best[k], best)) best = warp_best[k];
    }
  }
  __syncthreads();
  return {best, any_non_finite};
}

// A column part's candidate carries its part's non-finite flag in the index's sign bit (indices are < 2^31).
constexpr uint32_t kPartNonFiniteBit = 0x80000000u;

// The CPU loop starts from index 0 and only a strictly larger value replaces it: a NaN at 0 is
// never replaced, and an all-NaN row (identity left) also gives 0.
template <typename T>
__device__ __forceinline__ int32_t argmax_result(const T* __restrict__ row, ArgmaxCandidate best) {
  return (isnan(to_f32(row[0])) || best.index == 0x7fffffff) ? 0 : best.index;
}

// grid (parts, rows): part p of row r -> parts_out[r * parts + p] (its non-finite flag in kPartNonFiniteBit).
template <typename T>
__global__ void __launch_bounds__(kCta)
    argmax_part_kernel(const T* __restrict__ logits, int64_t n_cols, int64_t row_stride, int64_t cols_per_part,
                       ArgmaxCandidate* __restrict__ parts_out) {
  __shared__ ArgmaxCandidate warp_best[kWarps];
  const int64_t row = blockIdx.y, part = blockIdx.x;
  const int64_t begin = part * cols_per_part, end = min(begin + cols_per_part, n_cols);
  const ArgmaxScan scan = argmax_cta(logits + row * row_stride, begin, end, warp_best);
  if (threadIdx.x == 0) {
    ArgmaxCandidate c = scan.best;
    if (scan.non_finite) c.index = static_cast<int32_t>(static_cast<uint32_t>(c.index) | kPartNonFiniteBit);
    parts_out[row * gridDim.x + part] = c;
  }
}

// One warp per row over its `parts` candidates.
template <typename T>
__global__ void __launch_bounds__(kCta)
    argmax_merge_kernel(const T* __restrict__ logits, int64_t n_rows, int64_t row_stride, int64_t parts,
                        const ArgmaxCandidate* __restrict__ parts_in, int32_t* __restrict__ out,
                        uint32_t* __restrict__ non_finite) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32;
  if (row >= n_rows) return;
  const int lane = static_cast<int>(threadIdx.x % 32);
  ArgmaxCandidate best = argmax_identity();
  int flagged = 0;
  for (int64_t p = lane; p < parts; p += 32) {
    ArgmaxCandidate c = parts_in[row * parts + p];
    flagged |= (static_cast<uint32_t>(c.index) & kPartNonFiniteBit) != 0;
    c.index = static_cast<int32_t>(static_cast<uint32_t>(c.index) & ~kPartNonFiniteBit);
    if (argmax_beats(c, best)) best = c;
  }
  best = warp_argmax(best);
  const bool any_non_finite = __any_sync(kFullMask, flagged) != 0;
  if (lane == 0) {
    out[row] = argmax_result(logits + row * row_stride, best);
    if (non_finite != nullptr) non_finite[row] = any_non_finite ? 1u : 0u;
  }
}

template <typename T>
__global__ void __launch_bounds__(kCta)
    argmax_kernel(const T* __restrict__ logits, int64_t n_rows, int64_t n_cols, int64_t row_stride,
                  int32_t* __restrict__ out, uint32_t* __restrict__ non_finite) {
  __shared__ ArgmaxCandidate warp_best[kWarps];
  for (int64_t row = blockIdx.x; row < n_rows; row += gridDim.x) {
    const T* x = logits + row * row_stride;
    const ArgmaxScan scan = argmax_cta(x, 0, n_cols, warp_best);
    if (threadIdx.x == 0) {
      out[row] = argmax_result(x, scan.best);
      if (non_finite != nullptr) non_finite[row] = scan.non_finite ? 1u : 0u;
    }
  }
}

int grid_for(int64_t work, int64_t per_cta) { return grid_stride_ctas(work, per_cta, kMaxGrid); }

template <typename T>
void argmax_launch(const char* what, const T* logits, int64_t n_rows, int64_t n_cols, int64_t row_stride, int32_t* out,
                   ArgmaxCandidate* workspace, uint32_t* non_finite, cudaStream_t stream) {
  FP4MOE_CHECK(n_rows >= 0 && n_cols >= 1 && n_cols <= 0x7ffffffe && row_stride >= n_cols)
      << what << ": rows=" << n_rows << ", cols=" << n_cols << ", row_stride=" << row_stride
      << " (need cols in [1, 2^31 - 2] and row_stride >= cols)";
  if (n_rows == 0) return;
  FP4MOE_CHECK(logits != nullptr && out != nullptr) << what << ": null pointer for rows=" << n_rows;
  const int64_t parts = workspace != nullptr ? argmax_split_parts(n_rows, n_cols) : 1;
  if (parts == 1) {
    argmax_kernel<T><<<grid_for(n_rows, 1), kCta, 0, stream>>>(logits, n_rows, n_cols, row_stride, out, non_finite);
  } else {
    const int64_t cols_per_part = (n_cols + parts - 1) / parts;
    argmax_part_kernel<T><<<dim3(static_cast<unsigned>(parts), static_cast<unsigned>(n_rows)), kCta, 0, stream>>>(
        logits, n_cols, row_stride, cols_per_part, workspace);
    FP4MOE_CUDA_CHECK(cudaGetLastError());
    argmax_merge_kernel<T><<<static_cast<unsigned>((n_rows + kWarps - 1) / kWarps), kCta, 0, stream>>>(
        logits, n_rows, row_stride, parts, workspace, out, non_finite);
  }
  FP4MOE_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

void rms_norm_bf16(const __nv_bfloat16* x, __nv_bfloat16* residual, const float* w, int64_t n_rows, int64_t dim,
                   int64_t row_stride, float eps, __nv_bfloat16* y, cudaStream_t stream) {
  FP4MOE_CHECK(n_rows >= 0 && dim >= 1 && row_stride >= dim && eps >= 0.0f)
      << "rms_norm_bf16: rows=" << n_rows << ", dim=" << dim << ", row_stride=" << row_stride << ", eps=" << eps;
  if (n_rows == 0) return;
  FP4MOE_CHECK(x != nullptr && w != nullptr && y != nullptr)
      << "rms_norm_bf16: null x, w or y for rows=" << n_rows << ", dim=" << dim;
  FP4MOE_CHECK(residual == nullptr || residual != y) << "rms_norm_bf16: y must not alias residual";
  auto aligned16 = [](const void* q) { return reinterpret_cast<uintptr_t>(q) % 16 == 0; };
  const bool vec_ok = dim % 8 == 0 && row_stride % 8 == 0 && aligned16(x) && aligned16(y) && aligned16(w) &&
                      (residual == nullptr || aligned16(residual));
  if (dim <= 1024) {
    FP4MOE_CHECK(n_rows <= kMaxGrid * kWarps) << "rms_norm_bf16: " << n_rows << " rows > " << kMaxGrid * kWarps
                                              << " (one warp a row, " << kMaxGrid << " CTAs; split the call)";
    // dim / 8 <= 128 pieces: at most 4 a lane
    if (const RmsNormKernel vec = vec_ok ? rms_norm_vec_for<32>(dim / 8) : nullptr) {
      vec<<<grid_for(n_rows, kWarps), kCta, 0, stream>>>(x, residual, w, n_rows, dim, row_stride, eps, y);
    } else {
      rms_norm_kernel<32>
          <<<grid_for(n_rows, kWarps), kCta, 0, stream>>>(x, residual, w, n_rows, dim, row_stride, eps, y);
    }
  } else {
    FP4MOE_CHECK(n_rows <= kMaxGrid) << "rms_norm_bf16: " << n_rows << " rows of dim " << dim << " > " << kMaxGrid
                                     << " CTAs (split the call)";
    if (const RmsNormKernel vec = vec_ok ? rms_norm_vec_for<kCta>(dim / 8) : nullptr) {
      vec<<<static_cast<int>(n_rows), kCta, 0, stream>>>(x, residual, w, n_rows, dim, row_stride, eps, y);
    } else {
      rms_norm_kernel<kCta>
          <<<static_cast<int>(n_rows), kCta, 0, stream>>>(x, residual, w, n_rows, dim, row_stride, eps, y);
    }
  }
  FP4MOE_CUDA_CHECK(cudaGetLastError());
}

void rope_bf16(__nv_bfloat16* x, int64_t n_tokens, int64_t n_heads, int64_t token_stride, int64_t head_stride,
               int64_t offset, int64_t rotary_dim, RopeStyle style, const int32_t* positions,
               const float* cos_table, const float* sin_table, int64_t n_positions, uint32_t* error_flag,
               cudaStream_t stream) {
  FP4MOE_CHECK(n_tokens >= 0 && n_heads >= 1 && rotary_dim >= 2 && rotary_dim % 2 == 0 && offset >= 0 &&
               offset + rotary_dim <= head_stride && (n_heads == 1 || head_stride * n_heads <= token_stride ||
                                                       n_tokens <= 1) && n_positions >= 1)
      << "rope_bf16: tokens=" << n_tokens << ", heads=" << n_heads << ", token_stride=" << token_stride
      << ", head_stride=" << head_stride << ", offset=" << offset << ", rotary_dim=" << rotary_dim
      << ", n_positions=" << n_positions
      << " (need even rotary_dim >= 2, offset + rotary_dim <= head_stride, heads inside a token)";
  if (n_tokens == 0) return;
  FP4MOE_CHECK(x != nullptr && positions != nullptr && cos_table != nullptr && sin_table != nullptr &&
               error_flag != nullptr)
      << "rope_bf16: null pointer for tokens=" << n_tokens << ", heads=" << n_heads;
  const int64_t half = rotary_dim / 2;
  rope_kernel<<<grid_for(n_tokens * n_heads * half, kCta), kCta, 0, stream>>>(
      x, n_tokens, n_heads, token_stride, head_stride, offset, half, style == RopeStyle::kNeox, positions,
      cos_table, sin_table, n_positions, error_flag);
  FP4MOE_CUDA_CHECK(cudaGetLastError());
}

void embedding_bf16(const __nv_bfloat16* table, int64_t vocab, int64_t dim, const int32_t* ids, int64_t n_tokens,
                    __nv_bfloat16* out, uint32_t* error_flag, cudaStream_t stream) {
  FP4MOE_CHECK(vocab >= 1 && dim >= 1 && n_tokens >= 0)
      << "embedding_bf16: vocab=" << vocab << ", dim=" << dim << ", tokens=" << n_tokens;
  if (n_tokens == 0) return;
  FP4MOE_CHECK(table != nullptr && ids != nullptr && out != nullptr && error_flag != nullptr)
      << "embedding_bf16: null pointer for vocab=" << vocab << ", dim=" << dim << ", tokens=" << n_tokens;
  const bool vec16 = dim % 8 == 0 && reinterpret_cast<uintptr_t>(table) % 16 == 0 &&
                     reinterpret_cast<uintptr_t>(out) % 16 == 0;
  embedding_kernel<<<grid_for(n_tokens, 1), kEmbedCta, 0, stream>>>(table, vocab, dim, ids, n_tokens, vec16, out,
                                                                     error_flag);
  FP4MOE_CUDA_CHECK(cudaGetLastError());
}

void argmax_rows(const float* logits, int64_t n_rows, int64_t n_cols, int64_t row_stride, int32_t* out,
                 cudaStream_t stream) {
  argmax_launch("argmax_rows(f32)", logits, n_rows, n_cols, row_stride, out, nullptr, nullptr, stream);
}

int64_t argmax_split_parts(int64_t n_rows, int64_t n_cols) {
  if (n_rows <= 0) return 1;
  const int64_t by_cols = n_cols / kArgmaxMinColsPerPart;
  const int64_t by_workspace = kArgmaxWorkspaceCandidates / n_rows;
  const int64_t parts = std::min({by_cols, by_workspace, kArgmaxMaxParts});
  return parts >= 2 ? parts : 1;
}

void argmax_rows(const float* logits, int64_t n_rows, int64_t n_cols, int64_t row_stride, int32_t* out,
                 ArgmaxCandidate* workspace, uint32_t* non_finite, cudaStream_t stream) {
  argmax_launch("argmax_rows(f32, split)", logits, n_rows, n_cols, row_stride, out, workspace, non_finite, stream);
}

void argmax_rows(const __nv_bfloat16* logits, int64_t n_rows, int64_t n_cols, int64_t row_stride, int32_t* out,
                 cudaStream_t stream) {
  argmax_launch("argmax_rows(bf16)", logits, n_rows, n_cols, row_stride, out, nullptr, nullptr, stream);
}

}  // namespace fp4moe::cuda
