// The split-K merge of the attention kernels, one definition for paged_attention.cu (bf16 output)
// and mla_decode.cu / mla_prefill.cu (f32 latent): a thread per (row, dim) merges the splits' normalized
// outputs o_s [n_rows, n_splits, dim] and log-sum-exps lse_s [n_rows, n_splits] into
// out[row, d] = sum_s e^{lse_s - M} o_s[d] / sum_s e^{lse_s - M} (split_merge.h, CPU-checked by
// tests/kernels/test_cuda_ops_host.cpp; on the GPU by the attention tests with forced splits).
// Include only from .cu files.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/error.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/ops/split_merge.h"

namespace fp4moe::cuda {

// A block merges kSplitMergeThreads dims of one row, a thread one dim (grid: rows x ceil(dim / 128)).
// (It was a warp a row looping over the dims with one load in flight: at batch 1 GLM-5's 64 rows x 512
// dims x ~64 splits took ~119 us a layer on an H100, twenty-ninth session.)
inline constexpr int kSplitMergeThreads = 128;

__device__ __forceinline__ void split_merge_store(float* p, float v) { *p = v; }
__device__ __forceinline__ void split_merge_store(__nv_bfloat16* p, float v) { *p = __float2bfloat16_rn(v); }

template <typename Out>
__global__ void __launch_bounds__(kSplitMergeThreads)
    split_merge_rows_kernel(const float* __restrict__ part_o, const float* __restrict__ part_lse, int n_splits, int dim,
                            Out* __restrict__ out) {
  const int64_t row = blockIdx.x;
  const int d = static_cast<int>(blockIdx.y) * kSplitMergeThreads + static_cast<int>(threadIdx.x);
  if (d >= dim) return;
  const float* lse = part_lse + row * n_splits;
  const float mx = split_lse_max(lse, n_splits);
  split_merge_store(out + row * dim + d, split_merge_value(lse, part_o + row * n_splits * dim, n_splits, dim, mx, d));
}

// Launches the merge of n_rows rows on `stream` (no-op for n_rows == 0); throws on a launch error.
template <typename Out>
void launch_split_merge(const float* part_o, const float* part_lse, int64_t n_rows, int n_splits, int dim, Out* out,
                        cudaStream_t stream) {
  if (n_rows == 0) return;
  FP4MOE_CHECK(n_rows <= 0x7FFFFFFF && dim >= 1 && n_splits >= 1)
      << "split merge: n_rows=" << n_rows << " (at most 2^31 - 1), dim=" << dim << ", n_splits=" << n_splits;
  const dim3 grid(static_cast<unsigned>(n_rows),
                  static_cast<unsigned>((dim + kSplitMergeThreads - 1) / kSplitMergeThreads));
  split_merge_rows_kernel<Out><<<grid, kSplitMergeThreads, 0, stream>>>(part_o, part_lse, n_splits, dim, out);
  FP4MOE_CUDA_CHECK(cudaGetLastError());
}

}  // namespace fp4moe::cuda
