// The split-K merge of the attention kernels, one definition for paged_attention.cu (bf16 output)
// and mla_decode.cu / mla_prefill.cu (f32 latent): one warp per row merges the splits' normalized
// outputs o_s [n_rows, n_splits, dim] and log-sum-exps lse_s [n_rows, n_splits] into
// out[row, d] = sum_s e^{lse_s - M} o_s[d] / sum_s e^{lse_s - M} (split_merge.h, CPU-checked by
// tests/kernels/test_cuda_ops_host.cpp; on the GPU by the attention tests with forced splits).
// Include only from .cu files.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/ops/split_merge.h"

namespace fp4moe::cuda {

inline constexpr int kSplitMergeWarps = 4;

__device__ __forceinline__ void split_merge_store(float* p, float v) { *p = v; }
__device__ __forceinline__ void split_merge_store(__nv_bfloat16* p, float v) { *p = __float2bfloat16_rn(v); }

template <typename Out>
__global__ void __launch_bounds__(kSplitMergeWarps * 32)
    split_merge_rows_kernel(const float* __restrict__ part_o, const float* __restrict__ part_lse, int64_t n_rows,
                            int n_splits, int dim, Out* __restrict__ out) {
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kSplitMergeWarps + threadIdx.x / 32;
  if (row >= n_rows) return;
  const float* lse = part_lse + row * n_splits;
  const float mx = split_lse_max(lse, n_splits);
  for (int d = lane; d < dim; d += 32) {
    split_merge_store(out + row * dim + d, split_merge_value(lse, part_o + row * n_splits * dim, n_splits, dim, mx, d));
  }
}

// Launches the merge of n_rows rows on `stream` (no-op for n_rows == 0); throws on a launch error.
template <typename Out>
void launch_split_merge(const float* part_o, const float* part_lse, int64_t n_rows, int n_splits, int dim, Out* out,
                        cudaStream_t stream) {
  if (n_rows == 0) return;
  const auto blocks = static_cast<unsigned>((n_rows + kSplitMergeWarps - 1) / kSplitMergeWarps);
  split_merge_rows_kernel<Out><<<blocks, kSplitMergeWarps * 32, 0, stream>>>(part_o, part_lse, n_rows, n_splits, dim,
                                                                             out);
  FP4MOE_CUDA_CHECK(cudaGetLastError());
}

}  // namespace fp4moe::cuda
