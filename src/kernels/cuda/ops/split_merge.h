// The merge of split-K attention partials, shared by the GQA and MLA decode kernels: split s of a
// row wrote its normalized output o_s and log-sum-exp lse_s (-inf when it saw no key); the row's
// output is sum_s e^{lse_s - M} o_s / sum_s e^{lse_s - M} with M = max_s lse_s, and 0 when every
// split was empty (a padded entry). Host+device, so tests/kernels/test_cuda_ops_host.cpp checks the
// formula on the CPU (random rows cut into splits, merged, vs one softmax over the whole row); the
// kernels are tested through test_cuda_paged_attention.cpp, test_cuda_mla_decode.cpp and
// test_cuda_mla_fusions.cpp (the merge writing mla_project_v's bf16 parts).
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/cuda/ops/attention_geometry.h"  // FP4MOE_ATTN_HD

namespace fp4moe::cuda {

// The largest lse of a row (-inf when all splits are empty).
FP4MOE_ATTN_HD inline float split_lse_max(const float* lse, int n_splits) {
  float mx = -INFINITY;
  for (int sp = 0; sp < n_splits; ++sp) mx = fmaxf(mx, lse[sp]);
  return mx;
}

// One split's term: weight e^{l - mx} (0 for an empty split: l = -inf, mx finite) into den, w o into num
// unless the split is empty (selected away, so even a non-finite o of it cannot reach the sum).
FP4MOE_ATTN_HD inline void split_merge_add(float l, float o, float mx, float& num, float& den) {
  const float w = expf(l - mx);
  den += w;
  const float term = fmaf(w, o, num);
  num = l == -INFINITY ? num : term;
}

// Merged value of dim d: part_o holds the row's splits back to back, `dim` floats each. The splits in
// order, their loads 8 at a time ahead of the sums (the GPU then has 16 loads in flight, not one
// round trip a split: the merge kernel is latency-bound at small batch); the same sums either way.
inline constexpr int kSplitMergeLoadsAhead = 8;
FP4MOE_ATTN_HD inline float split_merge_value(const float* lse, const float* part_o, int n_splits, int dim, float mx,
                                              int d) {
  if (mx == -INFINITY) return 0.0f;
  float num = 0.0f, den = 0.0f;
  int sp = 0;
  for (; sp + kSplitMergeLoadsAhead <= n_splits; sp += kSplitMergeLoadsAhead) {
    float l[kSplitMergeLoadsAhead], o[kSplitMergeLoadsAhead];
    for (int j = 0; j < kSplitMergeLoadsAhead; ++j) {
      l[j] = lse[sp + j];
      o[j] = part_o[static_cast<int64_t>(sp + j) * dim + d];
    }
    for (int j = 0; j < kSplitMergeLoadsAhead; ++j) split_merge_add(l[j], o[j], mx, num, den);
  }
  for (; sp < n_splits; ++sp) split_merge_add(lse[sp], part_o[static_cast<int64_t>(sp) * dim + d], mx, num, den);
  return num / den;  // den >= 1: the split holding the maximum contributes e^0
}

}  // namespace fp4moe::cuda
