// The GPU router's per-token routing function (kernels/cuda/moe/route_math.h, host+device) run on
// the CPU against moe::route: on the host both use the same expf and the same summation order, so
// the expert indices (in order) and the weights must be bit-identical. Cases: GLM-5 (E=256 top-8,
// one group), DeepSeek-style groups (E=64, 8 groups, top-4 groups; masked fill 0 and -inf), the
// tiny golden configs (E=16 top-4), softmax with and without normalization, and logits rounded to
// few values so that ties are frequent (the tie-break toward the lower index must match).
// Also the GPU layer's host-only plan (moe/gpu_moe_plan.h): the scratch sizes vs the elements each
// kernel of forward(n) writes (the NVFP4 layout has no gate_up buffers since the SwiGLU is in the GEMM
// epilogue; the cuBLAS peer's gate_up writes [R, 2I]), the tokens per expert the GEMM config is chosen
// for, and the tile imbalance of uniform routing that the choice's comment quotes (simulated).
// Run: build/tests/moe/test_gpu_route_math.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "kernels/cuda/moe/route_math.h"
#include "core/error.h"
#include "moe/config.h"
#include "moe/gpu_moe_plan.h"
#include "moe/router.h"
#include "testing/testing.h"

namespace fp4moe::moe {
namespace {

cuda::moe::RouteParams params_of(const MoeConfig& c) {
  cuda::moe::RouteParams p;
  p.n_experts = c.n_experts;
  p.top_k = c.top_k;
  p.n_group = c.n_group;
  p.topk_group = c.topk_group;
  p.sigmoid = c.scoring == ScoringFunc::kSigmoid;
  p.has_bias = p.sigmoid && c.correction_bias;
  p.norm_topk_prob = c.norm_topk_prob;
  p.routed_scaling_factor = c.routed_scaling_factor;
  p.masked_fill_value = c.masked_fill_value;
  return p;
}

MoeConfig config(int E, int k, int n_group, int topk_group, ScoringFunc scoring, bool norm, float scale,
                 float fill) {
  MoeConfig c;
  c.hidden = 64;
  c.moe_intermediate = 64;
  c.n_experts = E;
  c.top_k = k;
  c.n_group = n_group;
  c.topk_group = topk_group;
  c.scoring = scoring;
  c.correction_bias = scoring == ScoringFunc::kSigmoid;
  c.norm_topk_prob = norm;
  c.routed_scaling_factor = scale;
  c.masked_fill_value = fill;
  return c;
}

// `levels` > 0 rounds the logits to multiples of 1/levels (frequent ties).
void check_same_as_cpu(const MoeConfig& cfg, int64_t n_tokens, int levels, uint64_t seed) {
  SCOPED_TRACE(cfg.to_string() + " levels " + std::to_string(levels) + " seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd(0.0f, 2.0f);
  const int E = cfg.n_experts, K = cfg.top_k;
  std::vector<float> logits(static_cast<size_t>(n_tokens * E)), bias(static_cast<size_t>(E));
  for (float& v : logits) v = levels > 0 ? std::round(nd(rng) * levels) / levels : nd(rng);
  for (float& v : bias) v = levels > 0 ? std::round(nd(rng) * 0.05f * levels) / levels : nd(rng) * 0.05f;
  std::vector<int32_t> want_idx(static_cast<size_t>(n_tokens * K)), got_idx(want_idx.size());
  std::vector<float> want_w(want_idx.size()), got_w(want_idx.size());
  route(cfg, logits.data(), bias.data(), n_tokens, want_idx.data(), want_w.data());
  const cuda::moe::RouteParams p = params_of(cfg);
  constexpr int kStride = 3;  // the kernel's interleaved scratch, exercised on the host
  std::vector<float> scratch(static_cast<size_t>(E * kStride));
  for (int64_t t = 0; t < n_tokens; ++t) {
    cuda::moe::route_token(p, logits.data() + t * E, bias.data(), scratch.data() + 1, kStride,
                           got_idx.data() + t * K, got_w.data() + t * K);
  }
  for (size_t i = 0; i < want_idx.size(); ++i) {
    ASSERT_EQ(got_idx[i], want_idx[i]) << "token " << i / K << " slot " << i % K;
    ASSERT_EQ(got_w[i], want_w[i]) << "token " << i / K << " slot " << i % K;  // bit-identical on the host
  }
}

TEST(GpuRouteMath, Glm5SigmoidOneGroupTop8) {
  const uint64_t seed = testing::test_seed();
  check_same_as_cpu(config(256, 8, 1, 1, ScoringFunc::kSigmoid, true, 2.5f, -INFINITY), 200, 0, seed);
  check_same_as_cpu(config(256, 8, 1, 1, ScoringFunc::kSigmoid, true, 2.5f, -INFINITY), 200, 4, seed + 1);
}

TEST(GpuRouteMath, GroupedTopKFillZeroAndMinusInf) {
  const uint64_t seed = testing::test_seed();
  for (float fill : {0.0f, -INFINITY}) {
    check_same_as_cpu(config(64, 4, 8, 4, ScoringFunc::kSigmoid, true, 1.5f, fill), 300, 0, seed);
    check_same_as_cpu(config(64, 6, 8, 2, ScoringFunc::kSigmoid, true, 1.0f, fill), 300, 2, seed + 7);
    // k equal to the experts of the chosen groups: every unmasked expert is picked.
    check_same_as_cpu(config(32, 8, 8, 2, ScoringFunc::kSigmoid, false, 1.0f, fill), 100, 0, seed + 3);
    // Two experts per group (group score = the sum of both), ties frequent.
    check_same_as_cpu(config(16, 3, 8, 3, ScoringFunc::kSigmoid, true, 2.0f, fill), 100, 3, seed + 5);
  }
}

TEST(GpuRouteMath, TinyGoldenConfig) {
  check_same_as_cpu(config(16, 4, 1, 1, ScoringFunc::kSigmoid, true, 2.5f, 0.0f), 500, 0, testing::test_seed());
}

TEST(GpuRouteMath, Softmax) {
  const uint64_t seed = testing::test_seed();
  check_same_as_cpu(config(64, 6, 1, 1, ScoringFunc::kSoftmax, true, 1.0f, 0.0f), 300, 0, seed);
  check_same_as_cpu(config(64, 6, 1, 1, ScoringFunc::kSoftmax, false, 1.0f, 0.0f), 300, 0, seed + 1);
  check_same_as_cpu(config(8, 2, 1, 1, ScoringFunc::kSoftmax, true, 1.0f, 0.0f), 300, 2, seed + 2);
}

// --- the GPU layer's host-side plan -----------------------------------------------------------------

GpuMoeScratchPlan plan_of(int64_t T, int64_t K, int64_t E, int64_t H, int64_t I, int64_t Is, bool bf16) {
  GpuMoeScratchPlan p;
  p.max_tokens = T;
  p.top_k = K;
  p.n_experts = E;
  p.hidden = H;
  p.inter = I;
  p.shared_inter = Is;
  p.has_shared = Is > 0;
  p.bf16_gate_up = bf16;
  return p;
}

TEST(GpuMoePlan, ScratchSizesAndWriteExtents) {
  for (bool bf16 : {false, true}) {
    SCOPED_TRACE(bf16 ? "bf16 cuBLAS" : "nvfp4 swiglu epilogue");
    const GpuMoeScratchPlan p = plan_of(300, 4, 16, 256, 128, 128, bf16);
    const GpuMoeScratchPlan::Sizes c = p.capacity();
    EXPECT_EQ(c.logits, 300 * 16);
    EXPECT_EQ(c.topk, 300 * 4);
    EXPECT_EQ(c.offsets, 17);
    EXPECT_EQ(c.rows, 1200);
    EXPECT_EQ(c.xp, 1200 * 256);
    EXPECT_EQ(c.act, 1200 * 128);  // SwiGLU output [R, I]
    EXPECT_EQ(c.down_out, 1200 * 256);
    EXPECT_EQ(c.gu, bf16 ? 1200 * 2 * 128 : 0);
    EXPECT_EQ(c.shared_gu, bf16 ? 300 * 2 * 128 : 0);
    EXPECT_EQ(c.shared_act, 300 * 128);
    EXPECT_EQ(c.shared_out, 300 * 256);
    for (int64_t n = 0; n <= 300; ++n) p.check(n);  // every extent fits for every token count
    const GpuMoeScratchPlan::Sizes w7 = p.writes(7);
    EXPECT_EQ(w7.act, 28 * 128);
    EXPECT_EQ(w7.shared_act, 7 * 128);
    EXPECT_THROW(p.check(301), Error);
    EXPECT_THROW(p.check(-1), Error);
  }
  // No shared expert: nothing is written to the shared buffers.
  const GpuMoeScratchPlan ns = plan_of(64, 8, 32, 6144, 2048, 0, false);
  EXPECT_EQ(ns.capacity().shared_act, 0);
  EXPECT_EQ(ns.capacity().shared_out, 0);
  ns.check(64);
}

TEST(GpuMoePlan, TokensPerExpertForTheConfig) {
  // Routed experts: the mean rows per expert, at least 1.
  EXPECT_EQ(gpu_moe_tokens_per_expert(64, 8, 32), 16);
  EXPECT_EQ(gpu_moe_tokens_per_expert(1, 8, 32), 1);
  EXPECT_EQ(gpu_moe_tokens_per_expert(7, 4, 16), 2);
  EXPECT_EQ(gpu_moe_tokens_per_expert(4096, 8, 256), 128);
  EXPECT_EQ(gpu_moe_tokens_per_expert(0, 8, 32), 1);
  // The shared expert: n itself up to 16, 16-token tiles up to 128 tokens (enough CTAs), then n.
  EXPECT_EQ(gpu_moe_tokens_per_expert(1, 1, 1), 1);
  EXPECT_EQ(gpu_moe_tokens_per_expert(7, 1, 1), 7);
  EXPECT_EQ(gpu_moe_tokens_per_expert(64, 1, 1), 16);
  EXPECT_EQ(gpu_moe_tokens_per_expert(128, 1, 1), 16);
  EXPECT_EQ(gpu_moe_tokens_per_expert(129, 1, 1), 129);
  EXPECT_EQ(gpu_moe_tokens_per_expert(0, 1, 1), 1);
  EXPECT_THROW(gpu_moe_tokens_per_expert(4, 0, 8), Error);
  EXPECT_THROW(gpu_moe_tokens_per_expert(-1, 1, 8), Error);
}

// The imbalance the comment of gpu_moe_tokens_per_expert quotes: with uniform random top-8 of 32
// and 64 tokens, ~43% of the experts get more than the mean (16) rows, i.e. a second 16-token tile.
TEST(GpuMoePlan, UniformRoutingSplitsExpertsAboveTheMean) {
  std::mt19937_64 rng(testing::test_seed());
  const int64_t tokens = 64, k = 8, e = 32;
  int64_t tiles = 0, active = 0;
  std::vector<int> experts(static_cast<size_t>(e));
  for (int rep = 0; rep < 500; ++rep) {
    std::vector<int64_t> count(static_cast<size_t>(e), 0);
    for (int64_t t = 0; t < tokens; ++t) {
      std::iota(experts.begin(), experts.end(), 0);
      for (int64_t s = 0; s < k; ++s) {  // partial Fisher-Yates: k distinct experts
        std::uniform_int_distribution<int64_t> pick(s, e - 1);
        std::swap(experts[s], experts[pick(rng)]);
        ++count[experts[s]];
      }
    }
    for (int64_t v : count) {
      tiles += (v + 15) / 16;
      active += v > 0 ? 1 : 0;
    }
  }
  const double per_expert = static_cast<double>(tiles) / static_cast<double>(active);
  EXPECT_NEAR(per_expert, 1.433, 0.02) << "16-token tiles per active expert (Binomial(64, 1/4): 1.433)";
}

// The row-class ladder with the H200 defaults' token tiles (w4a16_default_config: 8, 16, 32, 64, 128,
// 256 rows -> tiles 8 .. 256; ids stand in for the configs).
TEST(GpuMoePlan, RowClassLadder) {
  auto tile = [](int64_t rows) -> std::pair<int, int32_t> {
    int32_t t = 8;
    int id = 0;
    while (t < rows && t < 256) {
      t *= 2;
      ++id;
    }
    return {id, t};
  };
  auto describe = [](const std::vector<GpuMoeRowClass>& cs) {
    std::string s;
    for (const GpuMoeRowClass& c : cs) {
      s += std::to_string(c.config_id) + ":" + std::to_string(c.min_rows) + "-" +
           (c.max_rows == std::numeric_limits<int32_t>::max() ? std::string("") : std::to_string(c.max_rows)) + " ";
    }
    return s;
  };
  // GLM-5 shard at batch 64 (16 rows a expert: the streaming n16 tile): 17-32 on the 32-row tile.
  EXPECT_EQ(describe(gpu_moe_row_class_ladder(1, 16, 64, tile)), "1:0-16 2:17-32 3:33- ");
  // No expert can pass 30 rows: no top class.
  EXPECT_EQ(describe(gpu_moe_row_class_ladder(1, 16, 30, tile)), "1:0-16 2:17-32 ");
  // An 8-row routed tile: 9-16 on the streaming n16 tile, then 32, then 64 (the most classes).
  const auto eight = gpu_moe_row_class_ladder(0, 8, 64, tile);
  EXPECT_EQ(describe(eight), "0:0-8 1:9-16 2:17-32 3:33- ");
  EXPECT_EQ(eight.size(), kGpuMoeMaxRowClasses);
  EXPECT_EQ(describe(gpu_moe_row_class_ladder(2, 32, 512, tile)), "2:0-32 3:33-64 4:65- ");
  EXPECT_EQ(describe(gpu_moe_row_class_ladder(4, 128, 4096, tile)), "4:0-128 5:129- ");
  // One class: the top tile is the routed one, or no expert can outgrow the routed tile.
  EXPECT_EQ(describe(gpu_moe_row_class_ladder(5, 256, 4096, tile)), "5:0- ");
  EXPECT_EQ(describe(gpu_moe_row_class_ladder(1, 16, 16, tile)), "1:0- ");
  // Always a partition of [0, inf) into at most kGpuMoeMaxRowClasses ranges.
  for (int32_t t0 = 8; t0 <= 256; t0 *= 2) {
    for (int64_t n : {1, 9, 17, 33, 100, 1000, 100000}) {
      const auto cs = gpu_moe_row_class_ladder(tile(t0).first, t0, n, tile);
      ASSERT_LE(cs.size(), kGpuMoeMaxRowClasses) << t0 << " " << n;
      EXPECT_EQ(cs.front().min_rows, 0);
      for (size_t i = 1; i < cs.size(); ++i) EXPECT_EQ(cs[i].min_rows, cs[i - 1].max_rows + 1) << describe(cs);
      EXPECT_GE(int64_t{cs.back().max_rows}, std::min<int64_t>(n, std::numeric_limits<int32_t>::max())) << describe(cs);
    }
  }
}

}  // namespace
}  // namespace fp4moe::moe
