// The element-wise / row-wise model kernels of the GLM-4.5 and GLM-5 forwards on the GPU, BF16
// activations with f32 math, each the same formula as its CPU reference in model/ops.h:
//   - rms_norm_bf16: y = rms_norm(s) with s = x (+ residual, rounded to bf16 and written back to
//     residual), exactly model::rms_norm on the bf16 values of s (w in f32, as the CPU model loads it);
//   - rope_bf16: NeoX half-split (GLM-4.5, partial: the first rotary_dim dims of each head) or
//     interleaved (GLM-5) RoPE in place, cos/sin from a host-built table (model::rope_cos_sin of each
//     position), positions from a device array; bit for bit model::rope_neox / rope_interleaved on the
//     bf16 inputs (products and sums are done with __fmul_rn/__fadd_rn so nvcc cannot fuse them);
//   - embedding_bf16: out[t] = table[ids[t]], zeros + kDeviceErrorTokenId for an id outside the vocab;
//   - argmax_rows: per row the index of the largest logit, lowest index on ties, exactly
//     engine::argmax_token / model::argmax (a NaN never wins; a NaN at index 0 gives 0, as on the CPU).
// All pointers are device memory; every launcher is asynchronous on `stream`, checks its arguments on
// the host (fp4moe::Error naming the values) and throws on a launch error. error_flag (device uint32_t,
// kernels/cuda/ops/device_errors.h) must be non-null where taken.
// Tested by tests/kernels/test_cuda_ops.cpp (GPU vs the CPU functions) and test_cuda_ops_host.cpp.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>

namespace fp4moe::cuda {

// Rows [n_rows, dim] with a row stride of `row_stride` elements for x, y and residual alike.
// residual may be null (plain norm). y may alias x (each element is read before it is written by
// the same thread); y must not alias residual.
void rms_norm_bf16(const __nv_bfloat16* x, __nv_bfloat16* residual, const float* w, int64_t n_rows,
                   int64_t dim, int64_t row_stride, float eps, __nv_bfloat16* y, cudaStream_t stream);

enum class RopeStyle { kNeox, kInterleaved };

// The RoPE angles of a batch of rows as the fused launches take them (the arguments rope_bf16 takes one by
// one): row t's position positions[t] and the cos / sin tables [n_positions, rotary_dim / 2] f32.
struct RopeAngles {
  const int32_t* positions = nullptr;
  const float* cos = nullptr;
  const float* sin = nullptr;
  int64_t n_positions = 0;
  RopeStyle style = RopeStyle::kInterleaved;
  bool complete() const { return positions != nullptr && cos != nullptr && sin != nullptr && n_positions >= 1; }
};

// In place on x: token t's head h starts at x + t * token_stride + h * head_stride; dims
// [offset, offset + rotary_dim) rotate by the angles of positions[t]: cos_table/sin_table are
// [n_positions, rotary_dim / 2] f32. A position outside [0, n_positions) sets kDeviceErrorRopePosition
// and leaves that token unchanged.
void rope_bf16(__nv_bfloat16* x, int64_t n_tokens, int64_t n_heads, int64_t token_stride,
               int64_t head_stride, int64_t offset, int64_t rotary_dim, RopeStyle style,
               const int32_t* positions, const float* cos_table, const float* sin_table,
               int64_t n_positions, uint32_t* error_flag, cudaStream_t stream);

// out [n_tokens, dim] = table [vocab, dim] rows ids[t].
void embedding_bf16(const __nv_bfloat16* table, int64_t vocab, int64_t dim, const int32_t* ids,
                    int64_t n_tokens, __nv_bfloat16* out, uint32_t* error_flag, cudaStream_t stream);

// out[r] = argmax of logits[r * row_stride + 0 .. n_cols), n_cols >= 1. One CTA per row.
void argmax_rows(const float* logits, int64_t n_rows, int64_t n_cols, int64_t row_stride, int32_t* out,
                 cudaStream_t stream);
void argmax_rows(const __nv_bfloat16* logits, int64_t n_rows, int64_t n_cols, int64_t row_stride,
                 int32_t* out, cudaStream_t stream);

// The argmax reduction's order, shared by the kernel and checked on the CPU: a candidate (v, i)
// beats the current best (bv, bi) when it is larger, or equal with a lower index. NaN candidates
// are dropped before they reach this (the kernel's load), so the strict order is total.
struct ArgmaxCandidate {
  float value;
  int32_t index;
};
__host__ __device__ inline bool argmax_beats(ArgmaxCandidate a, ArgmaxCandidate b) {
  return a.value > b.value || (a.value == b.value && a.index < b.index);
}
// The start of the reduction: loses to every non-NaN value (an index past any vocabulary, so a
// real -inf at any index beats it).
__host__ __device__ inline ArgmaxCandidate argmax_identity() { return {-INFINITY, 0x7fffffff}; }

// argmax_rows (f32) with each row cut into argmax_split_parts(n_rows, n_cols) column ranges, one CTA each
// (a few rows of a 150k vocabulary fill the GPU instead of a few SMs), their candidates reduced by a
// second kernel. `workspace` holds kArgmaxWorkspaceCandidates candidates (4 KB; any n_rows, n_cols).
// `non_finite` (null: not wanted) gets per row 1 when the row holds a NaN or an Inf, else 0: what the model's
// step reads to fail the sequence whose logits went non-finite (the CPU models check every row they compute).
inline constexpr int64_t kArgmaxWorkspaceCandidates = 512;
inline constexpr int64_t kArgmaxMinColsPerPart = 4096;
inline constexpr int64_t kArgmaxMaxParts = 64;
// Parts per row: 1 once the rows alone give 512 CTAs or a row has < 2 x 4096 columns; at most 64,
// and n_rows x parts <= kArgmaxWorkspaceCandidates.
int64_t argmax_split_parts(int64_t n_rows, int64_t n_cols);
void argmax_rows(const float* logits, int64_t n_rows, int64_t n_cols, int64_t row_stride, int32_t* out,
                 ArgmaxCandidate* workspace, uint32_t* non_finite, cudaStream_t stream);

}  // namespace fp4moe::cuda
