// Router: grouped sigmoid top-k (n_group > 1, both masked_fill values) and softmax top-k against
// a naive transcription of the HF code (full sorts), on fresh random logits; config parsing.
// Run: build/tests/moe/test_moe --gtest_filter='Router*'.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <set>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "moe/config.h"
#include "moe/router.h"
#include "testing/testing.h"

namespace fp4moe::moe {
namespace {

// Indices sorted by value descending (stable: lower index first on ties).
std::vector<int> argsort_desc(const std::vector<float>& v) {
  std::vector<int> idx(v.size());
  std::iota(idx.begin(), idx.end(), 0);
  std::stable_sort(idx.begin(), idx.end(), [&](int a, int b) { return v[a] > v[b]; });
  return idx;
}

// One token, the HF route_tokens_to_experts written out with full sorts.
void naive_route(const MoeConfig& c, const float* logits, const float* bias, std::vector<int>& idx,
                 std::vector<float>& w) {
  const int E = c.n_experts;
  std::vector<float> s(E);
  if (c.scoring == ScoringFunc::kSigmoid) {
    for (int e = 0; e < E; ++e) s[e] = 1.0f / (1.0f + std::exp(-logits[e]));
    std::vector<float> choice(E);
    for (int e = 0; e < E; ++e) choice[e] = s[e] + (bias ? bias[e] : 0.0f);
    const int per = E / c.n_group;
    std::vector<float> gs(c.n_group);
    for (int g = 0; g < c.n_group; ++g) {
      std::vector<float> grp(choice.begin() + g * per, choice.begin() + (g + 1) * per);
      std::sort(grp.begin(), grp.end(), std::greater<float>());
      gs[g] = per >= 2 ? grp[0] + grp[1] : grp[0];
    }
    std::vector<int> gorder = argsort_desc(gs);
    std::set<int> chosen_groups(gorder.begin(), gorder.begin() + c.topk_group);
    for (int e = 0; e < E; ++e) {
      if (!chosen_groups.count(e / per)) choice[e] = c.masked_fill_value;
    }
    std::vector<int> order = argsort_desc(choice);
    idx.assign(order.begin(), order.begin() + c.top_k);
  } else {
    const float mx = *std::max_element(logits, logits + E);
    float sum = 0;
    for (int e = 0; e < E; ++e) sum += (s[e] = std::exp(logits[e] - mx));
    for (int e = 0; e < E; ++e) s[e] /= sum;
    std::vector<int> order = argsort_desc(s);
    idx.assign(order.begin(), order.begin() + c.top_k);
  }
  w.resize(c.top_k);
  double sum = 0;
  for (int k = 0; k < c.top_k; ++k) sum += (w[k] = s[idx[k]]);
  for (int k = 0; k < c.top_k; ++k) {
    if (c.norm_topk_prob) w[k] = static_cast<float>(w[k] / (sum + (c.scoring == ScoringFunc::kSigmoid ? 1e-20 : 0.0)));
    w[k] *= c.routed_scaling_factor;
  }
}

void check_against_naive(const MoeConfig& c, int64_t n_tokens, std::mt19937_64& rng) {
  SCOPED_TRACE(c.to_string());
  std::normal_distribution<float> nd(0.0f, 2.0f);
  std::vector<float> logits(n_tokens * c.n_experts), bias(c.n_experts);
  for (auto& v : logits) v = nd(rng);
  for (auto& v : bias) v = 0.3f * nd(rng);
  std::vector<int32_t> idx(n_tokens * c.top_k);
  std::vector<float> w(n_tokens * c.top_k);
  route(c, logits.data(), bias.data(), n_tokens, idx.data(), w.data());
  std::vector<int> ref_idx;
  std::vector<float> ref_w;
  for (int64_t t = 0; t < n_tokens; ++t) {
    naive_route(c, logits.data() + t * c.n_experts, c.correction_bias ? bias.data() : nullptr, ref_idx, ref_w);
    for (int k = 0; k < c.top_k; ++k) {
      ASSERT_EQ(idx[t * c.top_k + k], ref_idx[k]) << "token " << t << " slot " << k;
      ASSERT_NEAR(w[t * c.top_k + k], ref_w[k], 1e-6f * std::max(1.0f, std::abs(ref_w[k])))
          << "token " << t << " slot " << k;
    }
  }
}

MoeConfig sigmoid_config(int E, int k, int n_group, int topk_group, float fill) {
  MoeConfig c;
  c.hidden = 16;
  c.moe_intermediate = 16;
  c.n_experts = E;
  c.top_k = k;
  c.n_group = n_group;
  c.topk_group = topk_group;
  c.routed_scaling_factor = 2.5f;
  c.masked_fill_value = fill;
  return c;
}

TEST(Router, GroupedSigmoidMatchesNaiveReference) {
  std::mt19937_64 rng(testing::test_seed());
  const float inf = std::numeric_limits<float>::infinity();
  for (float fill : {0.0f, -inf}) {
    check_against_naive(sigmoid_config(256, 8, 8, 4, fill), 64, rng);   // DeepSeek-V3 shape
    check_against_naive(sigmoid_config(256, 8, 1, 1, fill), 64, rng);   // GLM-5 shape
    check_against_naive(sigmoid_config(160, 8, 1, 1, fill), 16, rng);   // GLM-4.5 shape
    check_against_naive(sigmoid_config(64, 6, 16, 3, fill), 64, rng);
    check_against_naive(sigmoid_config(16, 4, 2, 1, fill), 64, rng);
  }
  MoeConfig no_norm = sigmoid_config(32, 4, 4, 2, 0.0f);
  no_norm.norm_topk_prob = false;
  no_norm.routed_scaling_factor = 1.0f;
  check_against_naive(no_norm, 32, rng);
}

// NaN scores rank below every number (a strict weak order, where the plain '>' made partial_sort undefined): a
// token whose logits are partly NaN gets valid, distinct experts, the finite ones first.
TEST(Router, NanScoresRankLastAndExpertsStayValid) {
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  EXPECT_TRUE(ranks_before(1.0f, 5, nan, 0));
  EXPECT_FALSE(ranks_before(nan, 0, 1.0f, 5));
  EXPECT_TRUE(ranks_before(nan, 0, nan, 1));  // NaN ties: lower index first
  EXPECT_FALSE(ranks_before(nan, 1, nan, 0));
  EXPECT_TRUE(ranks_before(-inf, 0, nan, 1));  // -inf ties NaN: by index
  const MoeConfig cfg = sigmoid_config(16, 4, 1, 1, 0.0f);
  std::vector<float> logits(16, nan), bias(16, 0.0f);
  logits[3] = 1.0f;
  logits[9] = 2.0f;
  std::vector<int32_t> idx(4);
  std::vector<float> w(4);
  route(cfg, logits.data(), bias.data(), 1, idx.data(), w.data());
  EXPECT_EQ(idx[0], 9);
  EXPECT_EQ(idx[1], 3);
  for (int32_t e : idx) EXPECT_TRUE(e >= 0 && e < 16) << e;
  EXPECT_EQ(std::set<int32_t>(idx.begin(), idx.end()).size(), 4u);
}

TEST(Router, SoftmaxTopKMatchesNaiveReference) {
  std::mt19937_64 rng(testing::test_seed() + 1);
  for (bool norm : {false, true}) {
    MoeConfig c;
    c.hidden = 8;
    c.moe_intermediate = 8;
    c.n_experts = 128;
    c.top_k = 8;
    c.scoring = ScoringFunc::kSoftmax;
    c.correction_bias = false;
    c.norm_topk_prob = norm;
    check_against_naive(c, 64, rng);
    c.n_experts = 8;
    c.top_k = 2;
    check_against_naive(c, 64, rng);
  }
}

TEST(Router, MaskedFillValueDecidesBetweenMaskedAndNegativeExperts) {
  // Scores s = sigmoid(l) ~ [0.9, 0.1, 0.2, 0.2]; bias makes experts 1..3 negative. Group 0
  // (experts 0,1) wins; group 1 is masked. With fill 0.0 the masked expert 2 (0.0) beats expert 1
  // (-0.4), exactly as glm4_moe does; with -inf (glm_moe_dsa) expert 1 is chosen.
  const float l[4] = {std::log(9.0f), -std::log(9.0f), -std::log(4.0f), -std::log(4.0f)};
  const float bias[4] = {0.0f, -0.5f, -0.5f, -0.5f};
  int32_t idx[2];
  float w[2];
  MoeConfig c = sigmoid_config(4, 2, 2, 1, 0.0f);
  route(c, l, bias, 1, idx, w);
  EXPECT_EQ(std::set<int>(idx, idx + 2), (std::set<int>{0, 2}));
  EXPECT_NEAR(w[0] + w[1], 2.5f, 1e-6f);
  c.masked_fill_value = -std::numeric_limits<float>::infinity();
  route(c, l, bias, 1, idx, w);
  EXPECT_EQ(std::set<int>(idx, idx + 2), (std::set<int>{0, 1}));
  EXPECT_NEAR(w[0], 0.9f / 1.0f * 2.5f, 1e-5f);  // unbiased scores 0.9 and 0.1, normalized
  EXPECT_NEAR(w[1], 0.1f / 1.0f * 2.5f, 1e-5f);
}

TEST(Router, ConfigFromHfAndValidation) {
  nlohmann::json j = {{"model_type", "glm_moe_dsa"}, {"hidden_size", 6144}, {"moe_intermediate_size", 2048},
                      {"n_routed_experts", 256}, {"num_experts_per_tok", 8}, {"n_group", 1}, {"topk_group", 1},
                      {"norm_topk_prob", true}, {"routed_scaling_factor", 2.5}, {"n_shared_experts", 1}};
  MoeConfig c = moe_config_from_hf(j);
  EXPECT_EQ(c.n_experts, 256);
  EXPECT_EQ(c.top_k, 8);
  EXPECT_EQ(c.shared_intermediate(), 2048);
  EXPECT_TRUE(std::isinf(c.masked_fill_value) && c.masked_fill_value < 0);
  j["model_type"] = "glm4_moe";
  EXPECT_EQ(moe_config_from_hf(j).masked_fill_value, 0.0f);
  j.erase("n_routed_experts");
  try {
    moe_config_from_hf(j);
    FAIL() << "missing n_routed_experts accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("missing field 'n_routed_experts'"), std::string::npos) << e.what();
  }
  nlohmann::json q = {{"model_type", "qwen3_moe"}, {"hidden_size", 2048}, {"moe_intermediate_size", 768},
                      {"num_experts", 128}, {"num_experts_per_tok", 8}, {"norm_topk_prob", true}};
  MoeConfig qc = moe_config_from_hf(q);
  EXPECT_EQ(qc.scoring, ScoringFunc::kSoftmax);
  EXPECT_EQ(qc.n_shared_experts, 0);

  MoeConfig bad = sigmoid_config(10, 2, 3, 1, 0.0f);
  try {
    bad.validate();
    FAIL() << "E=10 with n_group=3 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("n_experts=10 is not divisible by n_group=3"), std::string::npos) << e.what();
  }
  bad = sigmoid_config(16, 9, 4, 2, 0.0f);
  EXPECT_THROW(bad.validate(), Error);  // 9 > 2 groups x 4 experts
}

}  // namespace
}  // namespace fp4moe::moe
