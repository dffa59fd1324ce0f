// The MoE layer on fresh random weights and inputs (F32, BF16, NVFP4 experts) against a naive
// double-precision reference (dense loops over every token and chosen expert), plus the
// linear-input observer and the equality of the serial and expert-parallel paths.
// Run: build/tests/moe/test_moe --gtest_filter='MoeRandom*'.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <map>
#include <random>
#include <set>
#include <vector>

#include "kernels/cpu/linear.h"
#include "moe/moe_layer.h"
#include "moe/router.h"
#include "testing/testing.h"

namespace fp4moe::moe {
namespace {

using kernels::cpu::WeightFormat;

// y = W x in f64 with W dequantized by the kernel library's own dequantize (checked separately
// against the format library and the spec formula in test_linear).
std::vector<double> ref_linear(const kernels::cpu::LinearWeight& w, const std::vector<double>& x) {
  const std::vector<float> wd = kernels::cpu::dequantize(w);
  std::vector<double> y(w.out_features, 0.0);
  for (int64_t r = 0; r < w.out_features; ++r) {
    double acc = w.has_bias() ? w.bias[r] : 0.0;
    for (int64_t k = 0; k < w.in_features; ++k) acc += static_cast<double>(wd[r * w.in_features + k]) * x[k];
    y[r] = acc;
  }
  return y;
}

std::vector<double> ref_mlp(const GatedMlp& m, const std::vector<double>& x) {
  std::vector<double> g = ref_linear(m.gate, x), u = ref_linear(m.up, x);
  for (size_t i = 0; i < g.size(); ++i) g[i] = g[i] / (1.0 + std::exp(-g[i])) * u[i];
  return ref_linear(m.down, g);
}

void check_layer(const MoeConfig& cfg, WeightFormat fmt, int64_t n_tokens, uint64_t seed) {
  SCOPED_TRACE(::testing::Message() << cfg.to_string() << " " << kernels::cpu::weight_format_name(fmt) << " tokens "
                                    << n_tokens);
  MoeLayer layer = MoeLayer::random(cfg, fmt, seed);
  std::mt19937_64 rng(seed ^ 0x9E3779B97F4A7C15ull);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const int64_t H = cfg.hidden;
  std::vector<float> x(n_tokens * H);
  for (auto& v : x) v = nd(rng);
  std::vector<float> y(n_tokens * H, NAN);
  MoeTrace trace;
  layer.forward(x.data(), n_tokens, y.data(), &trace);
  trace.plan.validate();
  ASSERT_EQ(trace.plan.n_tokens, n_tokens);

  // Routing: logits close to f64, and the routing decision is the router's on those logits.
  const int E = cfg.n_experts, K = cfg.top_k;
  std::vector<int32_t> idx(n_tokens * K);
  std::vector<float> w(n_tokens * K);
  route(cfg, trace.router_logits.data(), layer.correction_bias().empty() ? nullptr : layer.correction_bias().data(),
        n_tokens, idx.data(), w.data());
  ASSERT_EQ(idx, trace.topk_idx);
  ASSERT_EQ(w, trace.topk_weights);

  double max_ref = 0, max_diff = 0;
  for (int64_t t = 0; t < n_tokens; ++t) {
    std::vector<double> xt(x.begin() + t * H, x.begin() + (t + 1) * H);
    std::vector<double> logits = ref_linear(layer.router(), xt);
    for (int e = 0; e < E; ++e) {
      ASSERT_NEAR(trace.router_logits[t * E + e], logits[e], 1e-5 * (1 + std::abs(logits[e]))) << "t " << t << " e " << e;
    }
    std::set<int> distinct(idx.begin() + t * K, idx.begin() + (t + 1) * K);
    ASSERT_EQ(static_cast<int>(distinct.size()), K) << "token " << t << " has a repeated expert";
    std::vector<double> ref(H, 0.0);
    for (int s = 0; s < K; ++s) {
      std::vector<double> o = ref_mlp(layer.experts()[idx[t * K + s]], xt);
      for (int64_t h = 0; h < H; ++h) ref[h] += static_cast<double>(w[t * K + s]) * o[h];
    }
    if (layer.shared()) {
      std::vector<double> o = ref_mlp(*layer.shared(), xt);
      for (int64_t h = 0; h < H; ++h) ref[h] += o[h];
    }
    for (int64_t h = 0; h < H; ++h) {
      max_ref = std::max(max_ref, std::abs(ref[h]));
      max_diff = std::max(max_diff, std::abs(ref[h] - static_cast<double>(y[t * H + h])));
    }
  }
  EXPECT_LE(max_diff, 1e-5 * max_ref) << "max |diff| " << max_diff << ", max |ref| " << max_ref;
}

MoeConfig config(int E, int k, int64_t H, int64_t I, int n_shared, int n_group = 1, int topk_group = 1) {
  MoeConfig c;
  c.hidden = H;
  c.moe_intermediate = I;
  c.n_experts = E;
  c.top_k = k;
  c.n_group = n_group;
  c.topk_group = topk_group;
  c.routed_scaling_factor = 2.5f;
  c.n_shared_experts = n_shared;
  return c;
}

TEST(MoeRandom, MatchesF64ReferenceAllFormats) {
  const uint64_t seed = testing::test_seed();
  for (WeightFormat fmt : {WeightFormat::kF32, WeightFormat::kBF16, WeightFormat::kNVFP4}) {
    for (int64_t n : {1, 5, 37}) {
      check_layer(config(8, 2, 64, 32, 1), fmt, n, seed + n);
      check_layer(config(64, 8, 128, 48, 2, 8, 4), fmt, n, seed + 100 + n);  // grouped, 2 shared
    }
  }
  MoeConfig softmax = config(16, 4, 96, 64, 0);
  softmax.scoring = ScoringFunc::kSoftmax;
  softmax.correction_bias = false;
  softmax.routed_scaling_factor = 1.0f;
  check_layer(softmax, WeightFormat::kBF16, 9, seed + 7);
  softmax.norm_topk_prob = false;
  check_layer(softmax, WeightFormat::kNVFP4, 9, seed + 8);
}

TEST(MoeRandom, ObserverSeesDispatchedRowsAndPathsAgreeBitForBit) {
  const uint64_t seed = testing::test_seed();
  MoeConfig cfg = config(32, 4, 64, 32, 1);
  MoeLayer layer = MoeLayer::random(cfg, WeightFormat::kNVFP4, seed, "model.layers.1.mlp");
  const int64_t n = 20;
  std::mt19937_64 rng(seed + 3);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> x(n * cfg.hidden);
  for (auto& v : x) v = nd(rng);
  std::vector<float> y_fast(x.size()), y_observed(x.size());
  MoeTrace trace;
  layer.forward(x.data(), n, y_fast.data(), &trace);  // expert-parallel when the pool has threads

  std::map<std::string, std::pair<int64_t, int64_t>> seen;  // module -> (rows, cols)
  layer.set_linear_input_observer([&](const std::string& module, const float* xin, int64_t rows, int64_t cols) {
    ASSERT_NE(xin, nullptr);
    auto [it, inserted] = seen.emplace(module, std::make_pair(rows, cols));
    ASSERT_TRUE(inserted) << module << " observed twice";
  });
  layer.forward(x.data(), n, y_observed.data());
  ASSERT_EQ(0, std::memcmp(y_fast.data(), y_observed.data(), y_fast.size() * 4))
      << "serial (observed) and expert-parallel forwards differ";

  EXPECT_EQ(seen.at("model.layers.1.mlp.gate"), std::make_pair(n, cfg.hidden));
  EXPECT_EQ(seen.at("model.layers.1.mlp.shared_experts.down_proj"), std::make_pair(n, cfg.moe_intermediate));
  size_t expected_modules = 1 + 3;
  for (int e = 0; e < cfg.n_experts; ++e) {
    const std::string p = "model.layers.1.mlp.experts." + std::to_string(e);
    const int64_t c = trace.plan.count(e);
    if (c == 0) {
      EXPECT_EQ(seen.count(p + ".gate_proj"), 0u) << "expert " << e << " has no tokens but was observed";
      continue;
    }
    expected_modules += 3;
    EXPECT_EQ(seen.at(p + ".gate_proj"), std::make_pair(c, cfg.hidden));
    EXPECT_EQ(seen.at(p + ".up_proj"), std::make_pair(c, cfg.hidden));
    EXPECT_EQ(seen.at(p + ".down_proj"), std::make_pair(c, cfg.moe_intermediate));
  }
  EXPECT_EQ(seen.size(), expected_modules);
}

TEST(MoeRandom, ZeroTokensAndShapeErrors) {
  MoeConfig cfg = config(8, 2, 32, 16, 1);
  MoeLayer layer = MoeLayer::random(cfg, WeightFormat::kBF16, 5);
  MoeTrace trace;
  layer.forward(nullptr, 0, nullptr, &trace);
  EXPECT_EQ(trace.plan.n_entries(), 0);
  std::vector<GatedMlp> experts(layer.experts().begin(), layer.experts().end() - 1);
  try {
    MoeLayer bad(cfg, "x.mlp", layer.router(), layer.correction_bias(), experts, layer.shared());
    FAIL() << "7 experts accepted for E=8";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("x.mlp.experts: expected 8 experts, found 7"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace fp4moe::moe
