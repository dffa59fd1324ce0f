// Glm4MoeForCausalLM against ../shared/golden/models/glm4_moe_tiny{,_nvfp4} (golden README
// tolerances: logits within 2e-3 * max|logits| per sequence, greedy tokens equal), plus the KV
// cache (prefill-then-decode == one full forward), batching (two sequences of different lengths
// == each alone), MoE traces, the Linear observer, and rollback of a failed step.
//   ctest --test-dir build -R Glm4Moe
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "format/safetensors.h"
#include "model/registry.h"
#include "model/golden_data.h"
#include "testing/testing.h"

namespace fp4moe::model {
namespace {

using golden::Golden;
using golden::read_golden;

float max_abs(const float* x, int64_t n) {
  float m = 0;
  for (int64_t i = 0; i < n; ++i) m = std::max(m, std::fabs(x[i]));
  return m;
}

float max_diff(const float* a, const float* b, int64_t n) {
  float m = 0;
  for (int64_t i = 0; i < n; ++i) m = std::max(m, std::fabs(a[i] - b[i]));
  return m;
}

int64_t argmax_of(const float* x, int64_t n) { return std::max_element(x, x + n) - x; }

class Glm4MoeGolden : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    dir_ = fp4moe::testing::shared_path("golden/models/" + GetParam());
    golden_ = read_golden(dir_);
    LoadOptions opts;
    opts.progress = false;
    lm_ = load_model(dir_, opts);
    ASSERT_EQ(lm_->vocab_size(), golden_.vocab);
  }
  std::filesystem::path dir_;
  Golden golden_;
  std::unique_ptr<CausalLM> lm_;
};

TEST_P(Glm4MoeGolden, PromptLogitsMatchGolden) {
  const int64_t V = golden_.vocab, S = golden_.prompt_len;
  for (int64_t b = 0; b < golden_.n_seq; ++b) {
    auto st = lm_->new_state();
    const auto& ids = golden_.input_ids[static_cast<size_t>(b)];
    std::vector<float> logits = lm_->forward_one(*st, ids, true);
    const float* ref = golden_.logits.data() + b * S * V;
    const float bound = 2e-3f * max_abs(ref, S * V);
    const float diff = max_diff(logits.data(), ref, S * V);
    EXPECT_LE(diff, bound) << GetParam() << " sequence " << b << ": max |logit diff| " << diff << " > " << bound;
    std::printf("%s sequence %lld: max |logit diff| %.3g = %.2g x max|logits| (bound 2e-3)\n", GetParam().c_str(),
                static_cast<long long>(b), diff, diff / (bound / 2e-3f));
    EXPECT_EQ(st->length(), S);
  }
}

TEST_P(Glm4MoeGolden, GreedyDecodeThroughKvCacheMatchesGolden) {
  const int64_t V = golden_.vocab, S = golden_.prompt_len, N = golden_.total_len;
  for (int64_t b = 0; b < golden_.n_seq; ++b) {
    const auto& want = golden_.greedy_ids[static_cast<size_t>(b)];
    ASSERT_TRUE(std::equal(golden_.input_ids[static_cast<size_t>(b)].begin(),
                           golden_.input_ids[static_cast<size_t>(b)].end(), want.begin()));
    const float* ref_seq = golden_.greedy_logits.data() + b * N * V;
    const float bound = 2e-3f * max_abs(ref_seq, N * V);
    auto st = lm_->new_state();
    std::vector<int32_t> prompt(want.begin(), want.begin() + S);
    std::vector<float> logits = lm_->forward_one(*st, prompt, false);
    for (int64_t i = 0; S + i < N; ++i) {
      const float* ref = ref_seq + (S - 1 + i) * V;  // logits that chose token S + i
      const float diff = max_diff(logits.data(), ref, V);
      EXPECT_LE(diff, bound) << GetParam() << " sequence " << b << " decode step " << i << ": max |diff| " << diff;
      const int32_t next = static_cast<int32_t>(argmax_of(logits.data(), V));
      ASSERT_EQ(next, want[static_cast<size_t>(S + i)]) << GetParam() << " sequence " << b << " greedy token " << i;
      if (S + i + 1 < N) logits = lm_->forward_one(*st, std::vector<int32_t>{next}, false);
    }
    EXPECT_EQ(st->length(), N - 1);
  }
}

TEST_P(Glm4MoeGolden, PrefillThenDecodeEqualsFullForward) {
  const int64_t V = golden_.vocab, N = golden_.total_len;
  const auto& ids = golden_.greedy_ids[1];
  auto full_state = lm_->new_state();
  const std::vector<float> full = lm_->forward_one(*full_state, ids, true);
  for (int64_t split : {int64_t{1}, int64_t{7}, N - 1}) {
    auto st = lm_->new_state();
    std::vector<float> got = lm_->forward_one(*st, std::span<const int32_t>(ids.data(), static_cast<size_t>(split)), true);
    for (int64_t t = split; t < N; ++t) {
      std::vector<float> step = lm_->forward_one(*st, std::span<const int32_t>(ids.data() + t, 1), false);
      got.insert(got.end(), step.begin(), step.end());
    }
    ASSERT_EQ(got.size(), full.size());
    const float bound = 1e-5f * max_abs(full.data(), N * V);
    EXPECT_LE(max_diff(got.data(), full.data(), N * V), bound) << "prefill " << split << " then decode";
  }
}

TEST_P(Glm4MoeGolden, BatchOfTwoSequencesEqualsEachAlone) {
  const int64_t V = golden_.vocab;
  const auto& a_ids = golden_.greedy_ids[0];
  const std::vector<int32_t> b_ids(golden_.greedy_ids[1].begin(), golden_.greedy_ids[1].begin() + 9);
  // Alone.
  auto sa = lm_->new_state(), sb = lm_->new_state();
  const std::vector<float> la = lm_->forward_one(*sa, std::span<const int32_t>(a_ids.data(), 16), true);
  const std::vector<float> lb = lm_->forward_one(*sb, b_ids, false);
  const std::vector<float> la2 = lm_->forward_one(*sa, std::span<const int32_t>(a_ids.data() + 16, 3), true);
  const std::vector<float> lb2 = lm_->forward_one(*sb, std::span<const int32_t>(a_ids.data(), 1), false);
  // Together: a prefill of 16 and b of 9 in one step, then a 3-token chunk and a 1-token decode.
  auto ta = lm_->new_state(), tb = lm_->new_state();
  std::vector<float> ga(16 * V), gb(V), ga2(3 * V), gb2(V);
  const SeqChunk step1[] = {{ta.get(), std::span<const int32_t>(a_ids.data(), 16), ga.data(), true},
                            {tb.get(), b_ids, gb.data(), false}};
  ForwardTrace trace;
  lm_->forward(step1, &trace);
  const SeqChunk step2[] = {{tb.get(), std::span<const int32_t>(a_ids.data(), 1), gb2.data(), false},
                            {ta.get(), std::span<const int32_t>(a_ids.data() + 16, 3), ga2.data(), true}};
  lm_->forward(step2);
  const float bound = 1e-5f * max_abs(la.data(), 16 * V);
  EXPECT_LE(max_diff(ga.data(), la.data(), 16 * V), bound);
  EXPECT_LE(max_diff(gb.data(), lb.data(), V), bound);
  EXPECT_LE(max_diff(ga2.data(), la2.data(), 3 * V), bound);
  EXPECT_LE(max_diff(gb2.data(), lb2.data(), V), bound);
  EXPECT_EQ(ta->length(), 19);
  EXPECT_EQ(tb->length(), 10);

  // The MoE layers saw all 25 tokens of step 1 at once: per layer the counts add to 25 * top-k.
  const ModelConfig& c = lm_->config();
  int64_t n_moe = 0;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) n_moe += c.is_moe_layer(l);
  ASSERT_EQ(static_cast<int64_t>(trace.moe_layers.size()), n_moe);
  for (const MoeLayerTrace& t : trace.moe_layers) {
    EXPECT_TRUE(c.is_moe_layer(t.layer));
    ASSERT_EQ(static_cast<int64_t>(t.tokens_per_expert.size()), c.n_routed_experts);
    int64_t sum = 0;
    for (int64_t n : t.tokens_per_expert) sum += n;
    EXPECT_EQ(sum, 25 * c.num_experts_per_tok) << "layer " << t.layer;
  }
}

TEST_P(Glm4MoeGolden, ObserverSeesEveryLinearInput) {
  std::map<std::string, int64_t> rows;
  lm_->set_linear_observer([&](const std::string& module, const float*, int64_t n, int64_t) { rows[module] += n; });
  auto st = lm_->new_state();
  lm_->forward_one(*st, golden_.input_ids[0], false);
  lm_->set_linear_observer({});
  const ModelConfig& c = lm_->config();
  const int64_t S = golden_.prompt_len;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l);
    for (const char* m : {".self_attn.q_proj", ".self_attn.k_proj", ".self_attn.v_proj", ".self_attn.o_proj"}) {
      EXPECT_EQ(rows[p + m], S) << p + m;
    }
    if (c.is_moe_layer(l)) {
      EXPECT_EQ(rows[p + ".mlp.gate"], S);
      int64_t routed = 0;
      for (int64_t e = 0; e < c.n_routed_experts; ++e) routed += rows[p + ".mlp.experts." + std::to_string(e) + ".up_proj"];
      EXPECT_EQ(routed, S * c.num_experts_per_tok) << p;
    } else {
      EXPECT_EQ(rows[p + ".mlp.down_proj"], S) << p;
    }
  }
  EXPECT_EQ(rows["lm_head"], 1);
  // Removed observer: nothing more is recorded.
  const size_t n_modules = rows.size();
  const int64_t q_rows = rows["model.layers.0.self_attn.q_proj"];
  lm_->forward_one(*st, std::vector<int32_t>{1}, false);
  EXPECT_EQ(rows.size(), n_modules);
  EXPECT_EQ(rows["model.layers.0.self_attn.q_proj"], q_rows);
}

TEST_P(Glm4MoeGolden, FailedStepLeavesStatesUnchanged) {
  const int64_t V = golden_.vocab;
  auto a = lm_->new_state(), b = lm_->new_state();
  lm_->forward_one(*a, golden_.input_ids[0], false);
  const std::vector<int32_t> good = {3, 4};
  const std::vector<int32_t> bad = {5, static_cast<int32_t>(V)};  // out of the vocabulary
  std::vector<float> la(V), lb(V);
  const SeqChunk step[] = {{a.get(), good, la.data(), false}, {b.get(), bad, lb.data(), false}};
  try {
    lm_->forward(step);
    FAIL() << "an out-of-vocabulary token was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("batch entry 1: token id " + std::to_string(V) + " at index 1"),
              std::string::npos)
        << e.what();
  }
  EXPECT_EQ(a->length(), golden_.prompt_len);
  EXPECT_EQ(b->length(), 0);
  // A failure in the middle of the step (after layer 0 cached its keys): rolled back too.
  lm_->set_linear_observer([](const std::string& module, const float*, int64_t, int64_t) {
    FP4MOE_CHECK(module != "model.layers.1.self_attn.q_proj") << "observer refuses " << module;
  });
  const SeqChunk step2[] = {{a.get(), good, la.data(), false}, {b.get(), good, lb.data(), false}};
  EXPECT_THROW(lm_->forward(step2), Error);
  lm_->set_linear_observer({});
  EXPECT_EQ(a->length(), golden_.prompt_len);
  EXPECT_EQ(b->length(), 0);
  // The state still decodes exactly like a fresh one fed the same tokens.
  auto fresh = lm_->new_state();
  std::vector<int32_t> ids = golden_.input_ids[0];
  ids.insert(ids.end(), good.begin(), good.end());
  const std::vector<float> want = lm_->forward_one(*fresh, ids, false);
  const std::vector<float> got = lm_->forward_one(*a, good, false);
  EXPECT_LE(max_diff(got.data(), want.data(), V), 1e-5f * max_abs(want.data(), V));
  // A state reused twice in one step, and a state of another model, are refused.
  const SeqChunk twice[] = {{a.get(), good, la.data(), false}, {a.get(), good, lb.data(), false}};
  EXPECT_THROW(lm_->forward(twice), Error);
}

TEST_P(Glm4MoeGolden, TruncateRewindsTheCache) {
  const int64_t V = golden_.vocab;
  auto st = lm_->new_state();
  const auto& ids = golden_.greedy_ids[0];
  lm_->forward_one(*st, std::span<const int32_t>(ids.data(), 20), false);
  st->truncate(12);
  EXPECT_EQ(st->length(), 12);
  const std::vector<float> got = lm_->forward_one(*st, std::span<const int32_t>(ids.data() + 12, 4), false);
  auto fresh = lm_->new_state();
  const std::vector<float> want = lm_->forward_one(*fresh, std::span<const int32_t>(ids.data(), 16), false);
  EXPECT_LE(max_diff(got.data(), want.data(), V), 1e-5f * max_abs(want.data(), V));
  EXPECT_THROW(st->truncate(17), Error);
  EXPECT_GT(st->bytes(), 0u);
}

TEST_P(Glm4MoeGolden, DescribeNamesTheWeightFormats) {
  const std::string d = lm_->describe();
  const bool nvfp4 = GetParam().find("nvfp4") != std::string::npos;
  EXPECT_EQ(d.find("NVFP4") != std::string::npos, nvfp4) << d;
  EXPECT_NE(d.find("Glm4MoeForCausalLM"), std::string::npos) << d;
  EXPECT_GT(lm_->weight_bytes(), 0u);
}

INSTANTIATE_TEST_SUITE_P(Models, Glm4MoeGolden, ::testing::Values("glm4_moe_tiny", "glm4_moe_tiny_nvfp4"));

}  // namespace
}  // namespace fp4moe::model
