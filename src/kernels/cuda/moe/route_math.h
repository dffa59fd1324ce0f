// The MoE routing decision for one token as a host+device function, so that the GPU router kernel
// (moe_kernels.cu, one thread per token) and the CPU test run the very same code. It transcribes
// moe/router.cpp step by step: sigmoid scores + e_score_correction_bias, group score = best +
// second best biased score of the group, top `topk_group` groups, other experts set to
// masked_fill_value, top-k, weights from the unbiased scores, / (sum + 1e-20) when normalizing,
// * routed_scaling_factor; or softmax over all experts, top-k, / sum, * scaling.
// Top-k order is the CPU's partial_sort order (larger value first, ties to the lower index),
// found without a "taken" array: the i-th pick is the best element ranking after the (i-1)-th.
// Sums run in the CPU's order, so on the host the result is bit-identical to moe::route; on the
// device expf differs from glibc's by <= 2 ulp (weights within ~1e-6 relative).
// Tested by tests/moe/test_gpu_route_math.cpp (CPU, vs moe::route, bit-exact) and on the GPU by
// tests/moe/test_gpu_moe_layer.cpp (RouterKernel*).
#pragma once

#include <cmath>
#include <cstdint>

#if defined(__CUDACC__)
#define FP4MOE_ROUTE_HD __host__ __device__ __forceinline__
#else
#define FP4MOE_ROUTE_HD inline
#endif

namespace fp4moe::cuda::moe {

// Groups are tracked in a 64-bit mask.
constexpr int kMaxRouteGroups = 64;

// The routing fields of moe::MoeConfig, as plain values a kernel can take by value.
struct RouteParams {
  int n_experts = 0;
  int top_k = 0;
  int n_group = 1;
  int topk_group = 1;
  int sigmoid = 1;         // 1: sigmoid + bias, grouped; 0: softmax
  int has_bias = 0;        // sigmoid: add e_score_correction_bias for the choice
  int norm_topk_prob = 1;  // divide the k weights by their sum
  float routed_scaling_factor = 1.0f;
  float masked_fill_value = 0.0f;
};

// (a at index ia) ranks before (b at index ib): the CPU comparator of moe/router.cpp.
FP4MOE_ROUTE_HD bool route_ranks_before(float a, int ia, float b, int ib) { return a > b || (a == b && ia < ib); }

FP4MOE_ROUTE_HD float route_sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

// The sigmoid router's choice value of expert e: sigmoid(logit) + its correction bias.
FP4MOE_ROUTE_HD float route_sigmoid_choice(const RouteParams& p, float logit, const float* bias, int e) {
  return route_sigmoid(logit) + (p.has_bias ? bias[e] : 0.0f);
}

// A pick's final weight from its unbiased score w and the sum over the top_k picks: / sum (+ 1e-20
// for the sigmoid router) when norm_topk_prob, then x routed_scaling_factor.
FP4MOE_ROUTE_HD float route_final_weight(const RouteParams& p, float w, float sum) {
  if (p.norm_topk_prob) w /= p.sigmoid ? sum + 1e-20f : sum;
  return w * p.routed_scaling_factor;
}

// Sum of the two largest values of the group (exactly the CPU loop; one expert: its value).
FP4MOE_ROUTE_HD float route_group_score(const float* choice, int stride, int first, int per_group) {
  if (per_group == 1) return choice[first * stride];
  float best = -INFINITY, second = -INFINITY;
  for (int j = 0; j < per_group; ++j) {
    const float c = choice[(first + j) * stride];
    if (c > best) {
      second = best;
      best = c;
    } else if (c > second) {
      second = c;
    }
  }
  return best + second;
}

// Routes one token. logits [E] contiguous; bias [E] (read only when p.has_bias); choice: scratch of
// E floats at choice[e * stride] (strided so that a block's tokens interleave in shared memory).
// Writes idx[k] (descending choice order) and w[k]. NaN logits give an unspecified routing whose
// indices are still in [0, E).
FP4MOE_ROUTE_HD void route_token(const RouteParams& p, const float* logits, const float* bias, float* choice, int stride,
                           int32_t* idx, float* w) {
  const int n_experts = p.n_experts;
  if (p.sigmoid) {
    for (int e = 0; e < n_experts; ++e) {
      choice[e * stride] = route_sigmoid_choice(p, logits[e], bias, e);
    }
    const int per_group = n_experts / p.n_group;
    uint64_t groups_on = 0;
    int prev_g = -1;
    float prev_score = 0.0f;
    for (int r = 0; r < p.topk_group; ++r) {
      int best_g = -1;
      float best_score = 0.0f;
      for (int g = 0; g < p.n_group; ++g) {
        const float score = route_group_score(choice, stride, g * per_group, per_group);
        if (r > 0 && !route_ranks_before(prev_score, prev_g, score, g)) continue;  // already chosen
        if (best_g < 0 || route_ranks_before(score, g, best_score, best_g)) {
          best_g = g;
          best_score = score;
        }
      }
      if (best_g < 0) break;  // only with NaN scores
      groups_on |= uint64_t{1} << best_g;
      prev_g = best_g;
      prev_score = best_score;
    }
    for (int e = 0; e < n_experts; ++e) {
      if (((groups_on >> (e / per_group)) & 1) == 0) choice[e * stride] = p.masked_fill_value;
    }
  } else {
    float mx = -INFINITY;
    for (int e = 0; e < n_experts; ++e) mx = mx < logits[e] ? logits[e] : mx;  // std::max(mx, l)
    float sum = 0.0f;
    for (int e = 0; e < n_experts; ++e) sum += expf(logits[e] - mx);
    for (int e = 0; e < n_experts; ++e) choice[e * stride] = expf(logits[e] - mx) / sum;
  }

  int prev = -1;
  float prev_v = 0.0f;
  for (int s = 0; s < p.top_k; ++s) {
    int best = -1;
    float best_v = 0.0f;
    for (int e = 0; e < n_experts; ++e) {
      const float v = choice[e * stride];
      if (s > 0 && !route_ranks_before(prev_v, prev, v, e)) continue;  // ranks before an earlier pick
      if (best < 0 || route_ranks_before(v, e, best_v, best)) {
        best = e;
        best_v = v;
      }
    }
    if (best < 0) best = s % n_experts;  // only with NaN scores: keep the index in range
    idx[s] = best;
    prev = best;
    prev_v = best_v;
  }

  float sum = 0.0f;
  for (int s = 0; s < p.top_k; ++s) {
    // The unbiased score: sigmoid recomputed from the logit (the same value as before), or the softmax
    // probability (the choice itself; softmax choices are never masked).
    w[s] = p.sigmoid ? route_sigmoid(logits[idx[s]]) : choice[idx[s] * stride];
    sum += w[s];
  }
  for (int s = 0; s < p.top_k; ++s) w[s] = route_final_weight(p, w[s], sum);
}

}  // namespace fp4moe::cuda::moe
