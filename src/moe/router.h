// The MoE router in f32, exactly as Hugging Face computes it (../shared/spec/nvfp4-and-glm.md §4.5):
// sigmoid scores, + e_score_correction_bias for the choice, group score = sum of the top-2 biased
// scores in each group, top `topk_group` groups, other experts set to masked_fill_value, top-k,
// weights gathered from the UNBIASED scores, / (sum + 1e-20) when norm_topk_prob, * routed_scaling_factor.
// Softmax family: softmax over all experts (f32), top-k, / sum when norm_topk_prob, * scaling.
// Ties are broken toward the lower expert index; each token's k experts are returned in descending
// order of their choice score. Tested by tests/moe/test_router.cpp (vs a naive reference).
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>

#include "moe/config.h"

namespace fp4moe::moe {

// The order of a top-k over scores: higher first, ties to the lower index, and a NaN ranked as -inf, so that the
// comparison is a strict weak order even when a sequence's scores went NaN (std::partial_sort / nth_element with
// a NaN-broken comparator is undefined behaviour: the sublayer's finite check reports the NaN afterwards).
inline bool ranks_before(float va, int64_t a, float vb, int64_t b) {
  constexpr float kLow = -std::numeric_limits<float>::infinity();
  const float x = std::isnan(va) ? kLow : va, y = std::isnan(vb) ? kLow : vb;
  return x > y || (x == y && a < b);
}

// logits [n_tokens, E] (f32 router logits), correction_bias [E] (sigmoid family with
// cfg.correction_bias; else may be nullptr). Writes topk_idx [n_tokens, k] and topk_weights [n_tokens, k].
void route(const MoeConfig& cfg, const float* logits, const float* correction_bias, int64_t n_tokens,
           int32_t* topk_idx, float* topk_weights);

}  // namespace fp4moe::moe
