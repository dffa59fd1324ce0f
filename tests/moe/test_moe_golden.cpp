// The MoE block of each golden tiny model (two BF16, two NVFP4) alone: golden moe_in -> moe_out
// within 1e-4 * max|moe_out|, router logits close, top-k experts equal as sets per token and
// weights within 1e-5 (../shared/golden/README.md). Run: build/tests/moe/test_moe --gtest_filter='MoeGolden*'.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "format/safetensors.h"
#include "moe/config.h"
#include "moe/moe_layer.h"
#include "testing/testing.h"

namespace fp4moe::moe {
namespace {

std::vector<float> read_f32(const format::SafetensorsFile& f, const std::string& name, const Shape& shape) {
  const TensorView v = f.view(name);
  EXPECT_EQ(v.dtype, DType::kF32) << name;
  EXPECT_EQ(v.shape, shape) << name;
  auto s = v.as<float>();
  return {s.begin(), s.end()};
}

std::vector<int64_t> read_i64(const format::SafetensorsFile& f, const std::string& name) {
  const TensorView v = f.view(name);
  EXPECT_EQ(v.dtype, DType::kI64) << name;
  auto s = v.as<int64_t>();
  return {s.begin(), s.end()};
}

class MoeGolden : public ::testing::TestWithParam<std::string> {};

TEST_P(MoeGolden, MoeBlockMatches) {
  const auto dir = testing::shared_path("golden/models/" + GetParam());
  nlohmann::json config;
  std::ifstream(dir / "config.json") >> config;
  const MoeConfig cfg = moe_config_from_hf(config);
  SCOPED_TRACE(GetParam() + ": " + cfg.to_string());
  format::TensorStore store(dir);
  format::SafetensorsFile golden(dir / "golden.safetensors");
  const int64_t layer_index = read_i64(golden, "moe_layer").at(0);
  const std::string prefix = "model.layers." + std::to_string(layer_index) + ".mlp";
  const MoeLayer layer = MoeLayer::load(store, prefix, cfg);

  const int64_t H = cfg.hidden, E = cfg.n_experts, K = cfg.top_k;
  const std::vector<float> x = read_f32(golden, "moe_in", {2, 16, H});
  const std::vector<float> want = read_f32(golden, "moe_out", {2, 16, H});
  const std::vector<float> want_logits = read_f32(golden, "router_logits", {32, E});
  const std::vector<float> want_w = read_f32(golden, "topk_weights", {32, K});
  const std::vector<int64_t> want_idx = read_i64(golden, "topk_idx");
  const int64_t n = 32;
  ASSERT_EQ(static_cast<int64_t>(want_idx.size()), n * K);

  std::vector<float> y(n * H, NAN);
  MoeTrace trace;
  layer.forward(x.data(), n, y.data(), &trace);

  float max_logit = 0, max_logit_diff = 0;
  for (size_t i = 0; i < want_logits.size(); ++i) {
    max_logit = std::max(max_logit, std::abs(want_logits[i]));
    max_logit_diff = std::max(max_logit_diff, std::abs(want_logits[i] - trace.router_logits[i]));
  }
  EXPECT_LE(max_logit_diff, 1e-5f * std::max(1.0f, max_logit)) << "router logits";

  for (int64_t t = 0; t < n; ++t) {
    // Compare as sets; weights matched by expert id.
    std::map<int64_t, float> want_by_expert, got_by_expert;
    for (int64_t s = 0; s < K; ++s) {
      want_by_expert[want_idx[t * K + s]] = want_w[t * K + s];
      got_by_expert[trace.topk_idx[t * K + s]] = trace.topk_weights[t * K + s];
    }
    std::set<int64_t> want_set, got_set;
    for (auto& [e, w] : want_by_expert) want_set.insert(e);
    for (auto& [e, w] : got_by_expert) got_set.insert(e);
    ASSERT_EQ(got_set, want_set) << "token " << t;
    for (auto& [e, w] : want_by_expert) {
      EXPECT_NEAR(got_by_expert[e], w, 1e-5f) << "token " << t << " expert " << e;
    }
  }

  float max_out = 0, max_diff = 0;
  int64_t worst = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    max_out = std::max(max_out, std::abs(want[i]));
    const float d = std::abs(want[i] - y[i]);
    if (d > max_diff) {
      max_diff = d;
      worst = static_cast<int64_t>(i);
    }
  }
  std::printf("[%s] moe_out max|diff| %.3e (%.2e of max|moe_out| %.3e), router logits max|diff| %.3e\n",
              GetParam().c_str(), max_diff, max_diff / max_out, max_out, max_logit_diff);
  EXPECT_LE(max_diff, 1e-4f * max_out) << "worst at token " << worst / H << " h " << worst % H << ": got " << y[worst]
                                      << ", want " << want[worst];
}

INSTANTIATE_TEST_SUITE_P(Models, MoeGolden,
                         ::testing::Values("glm4_moe_tiny", "glm4_moe_tiny_nvfp4", "glm5_tiny", "glm5_tiny_nvfp4"));

}  // namespace
}  // namespace fp4moe::moe
