// DispatchPlan: token -> expert dispatch as a value. The n_tokens x top_k (token, slot) pairs are
// sorted by expert with a stable counting sort (within an expert: increasing token, then slot),
// giving per-expert offsets (E+1) and the inverse mapping back to (token, slot). The CPU MoE layer
// runs each expert on its contiguous range; the GPU grouped GEMM and the statistics reuse it.
// Tested by tests/moe/test_dispatch.cpp (random routing, empty experts, stability).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace fp4moe::moe {

struct DispatchPlan {
  int n_experts = 0;
  int top_k = 0;
  int64_t n_tokens = 0;
  std::vector<int64_t> offsets;   // [E+1]; expert e owns entries [offsets[e], offsets[e+1])
  std::vector<int32_t> token;     // [n_tokens*top_k] token of each entry, entries sorted by expert
  std::vector<int32_t> slot;      // [n_tokens*top_k] top-k slot (0..k-1) of each entry
  std::vector<int64_t> entry_of;  // [n_tokens*top_k] inverse: entry of pair (t, s) at t*top_k + s

  // topk_idx [n_tokens, top_k] with values in [0, n_experts); throws naming the token/slot otherwise.
  static DispatchPlan build(const int32_t* topk_idx, int64_t n_tokens, int top_k, int n_experts);

  int64_t n_entries() const { return n_tokens * top_k; }
  int64_t count(int expert) const { return offsets[expert + 1] - offsets[expert]; }
  std::vector<int64_t> counts() const;  // [E] tokens per expert (the histogram)
  int64_t max_tokens_per_expert() const;
  double mean_tokens_per_expert() const;  // over all E experts (= n_tokens*top_k / E)
  int n_active_experts() const;           // experts with at least one token
  // Checks every invariant (offsets monotone from 0 to n_entries, permutation, inverse, stable
  // order); throws fp4moe::Error describing the first violation.
  void validate() const;
  // "tokens 32 top-4 experts 16: active 14, max 15, mean 8.00"
  std::string summary() const;
};

}  // namespace fp4moe::moe
