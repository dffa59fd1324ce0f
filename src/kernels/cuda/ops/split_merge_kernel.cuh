// The split-K merge of the attention kernels, one definition for paged_attention.cu (bf16 output),
// mla_decode.cu / mla_prefill.cu (f32 latent) and mla_decode.cu's bf16 hi / lo parts of the latent for
// mla_project_v (SplitMergeBf16Parts): a thread per (row, dim) merges the splits' normalized
// outputs o_s [n_rows, n_splits, dim] and log-sum-exps lse_s [n_rows, n_splits] into
// out[row, d] = sum_s e^{lse_s - M} o_s[d] / sum_s e^{lse_s - M} (split_merge.h, CPU-checked by
// tests/kernels/test_cuda_ops_host.cpp; on the GPU by the attention tests with forced splits, the parts sink bit
// for bit by tests/kernels/test_cuda_mla_fusions.cpp).
// Include only from .cu files.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <type_traits>

#include "core/error.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/ops/bf16_parts.cuh"
#include "kernels/cuda/ops/split_merge.h"

namespace fp4moe::cuda {

// A block merges kSplitMergeThreads dims of one row, a thread one dim (grid: rows x ceil(dim / 128)).
// (It was a warp a row looping over the dims with one load in flight: at batch 1 GLM-5's 64 rows x 512
// dims x ~64 splits took ~119 us a layer on an H100, twenty-ninth session.)
inline constexpr int kSplitMergeThreads = 128;

// Where a merged value goes: out[row, d] of a [n_rows, dim] array (f32, or rounded to bf16)...
template <typename T>
struct SplitMergeRows {
  T* out;
  __device__ __forceinline__ void operator()(int64_t row, int d, int dim, float v) const {
    if constexpr (std::is_same_v<T, float>) {
      out[row * dim + d] = v;
    } else {
      static_assert(std::is_same_v<T, __nv_bfloat16>, "the merge writes f32 or bf16 rows");
      out[row * dim + d] = __float2bfloat16_rn(v);
    }
  }
};
// ... or, for MLA's latent, mla_project_v's bf16 rows: element i = row x dim + d of a [n_seqs, seq_elems] latent
// (seq_elems = n_heads x rank) as its two parts (bf16_parts.cuh) on the value the f32 path stores.
struct SplitMergeBf16Parts {
  __nv_bfloat16* parts;
  int64_t seq_elems;
  __device__ __forceinline__ void operator()(int64_t row, int d, int dim, float v) const {
    const int64_t at = bf16_parts_index(row * dim + d, seq_elems);
    bf16_hi_lo(v, parts[at], parts[at + seq_elems]);
  }
};

template <typename Sink>
__global__ void __launch_bounds__(kSplitMergeThreads)
    split_merge_rows_kernel(const float* __restrict__ part_o, const float* __restrict__ part_lse, int n_splits, int dim,
                            Sink sink) {
  const int64_t row = blockIdx.x;
  const int d = static_cast<int>(blockIdx.y) * kSplitMergeThreads + static_cast<int>(threadIdx.x);
  if (d >= dim) return;
  const float* lse = part_lse + row * n_splits;
  const float mx = split_lse_max(lse, n_splits);
  sink(row, d, dim, split_merge_value(lse, part_o + row * n_splits * dim, n_splits, dim, mx, d));
}

// Launches the merge of n_rows rows into `sink` (SplitMergeRows, SplitMergeBf16Parts) on `stream` (no-op for
// n_rows == 0); throws on a launch error.
template <typename Sink>
void launch_split_merge_to(const float* part_o, const float* part_lse, int64_t n_rows, int n_splits, int dim, Sink sink,
                           cudaStream_t stream) {
  if (n_rows == 0) return;
  FP4MOE_CHECK(n_rows <= 0x7FFFFFFF && dim >= 1 && n_splits >= 1)
      << "split merge: n_rows=" << n_rows << " (at most 2^31 - 1), dim=" << dim << ", n_splits=" << n_splits;
  const dim3 grid(static_cast<unsigned>(n_rows),
                  static_cast<unsigned>((dim + kSplitMergeThreads - 1) / kSplitMergeThreads));
  split_merge_rows_kernel<Sink><<<grid, kSplitMergeThreads, 0, stream>>>(part_o, part_lse, n_splits, dim, sink);
  FP4MOE_CUDA_CHECK(cudaGetLastError());
}

// The merge into out [n_rows, dim] (f32 or bf16).
template <typename Out>
void launch_split_merge(const float* part_o, const float* part_lse, int64_t n_rows, int n_splits, int dim, Out* out,
                        cudaStream_t stream) {
  launch_split_merge_to(part_o, part_lse, n_rows, n_splits, dim, SplitMergeRows<Out>{out}, stream);
}

}  // namespace fp4moe::cuda
