// The f32 MoE router, transcribing transformers' route_tokens_to_experts step by step. See router.h.
#include "moe/router.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "core/error.h"

namespace fp4moe::moe {

namespace {

// Indices of the k largest values (ties: lower index first), in descending order of value.
void top_k_indices(const float* v, int n, int k, int* out, std::vector<int>& scratch) {
  scratch.resize(static_cast<size_t>(n));
  std::iota(scratch.begin(), scratch.end(), 0);
  std::partial_sort(scratch.begin(), scratch.begin() + k, scratch.end(),
                    [v](int a, int b) { return ranks_before(v[a], a, v[b], b); });
  std::copy(scratch.begin(), scratch.begin() + k, out);
}

}  // namespace

void route(const MoeConfig& cfg, const float* logits, const float* correction_bias, int64_t n_tokens,
           int32_t* topk_idx, float* topk_weights) {
  cfg.validate();
  const int E = cfg.n_experts;
  const int K = cfg.top_k;
  const bool sigmoid = cfg.scoring == ScoringFunc::kSigmoid;
  FP4MOE_CHECK(!(sigmoid && cfg.correction_bias) || correction_bias != nullptr)
      << "route: the config (" << cfg.to_string() << ") needs e_score_correction_bias [" << E << "], got none";

  std::vector<float> scores(E), choice(E), group_scores(cfg.n_group);
  std::vector<int> chosen(K), groups(cfg.topk_group), scratch;
  std::vector<char> group_on(cfg.n_group);
  const int per_group = cfg.experts_per_group();

  for (int64_t t = 0; t < n_tokens; ++t) {
    const float* lt = logits + t * E;
    if (sigmoid) {
      for (int e = 0; e < E; ++e) scores[e] = 1.0f / (1.0f + std::exp(-lt[e]));
      for (int e = 0; e < E; ++e) choice[e] = scores[e] + (cfg.correction_bias ? correction_bias[e] : 0.0f);
      // Group score: sum of the two best biased scores of the group (topk(2).sum()).
      for (int g = 0; g < cfg.n_group; ++g) {
        const float* c = choice.data() + g * per_group;
        if (per_group == 1) {
          group_scores[g] = c[0];
          continue;
        }
        float best = -INFINITY, second = -INFINITY;
        for (int j = 0; j < per_group; ++j) {
          if (c[j] > best) {
            second = best;
            best = c[j];
          } else if (c[j] > second) {
            second = c[j];
          }
        }
        group_scores[g] = best + second;
      }
      top_k_indices(group_scores.data(), cfg.n_group, cfg.topk_group, groups.data(), scratch);
      std::fill(group_on.begin(), group_on.end(), 0);
      for (int g : groups) group_on[g] = 1;
      for (int e = 0; e < E; ++e) {
        if (!group_on[e / per_group]) choice[e] = cfg.masked_fill_value;
      }
      top_k_indices(choice.data(), E, K, chosen.data(), scratch);
    } else {
      float mx = -INFINITY;
      for (int e = 0; e < E; ++e) mx = std::max(mx, lt[e]);
      float sum = 0.0f;
      for (int e = 0; e < E; ++e) {
        scores[e] = std::exp(lt[e] - mx);
        sum += scores[e];
      }
      for (int e = 0; e < E; ++e) scores[e] /= sum;
      top_k_indices(scores.data(), E, K, chosen.data(), scratch);
    }

    int32_t* idx = topk_idx + t * K;
    float* w = topk_weights + t * K;
    float sum = 0.0f;
    for (int s = 0; s < K; ++s) {
      idx[s] = chosen[s];
      w[s] = scores[chosen[s]];  // unbiased score
      sum += w[s];
    }
    if (cfg.norm_topk_prob) {
      const float denom = sigmoid ? sum + 1e-20f : sum;
      for (int s = 0; s < K; ++s) w[s] /= denom;
    }
    for (int s = 0; s < K; ++s) w[s] *= cfg.routed_scaling_factor;
  }
}

}  // namespace fp4moe::moe
