// The expert-parallel MoE (dist/ep_moe.h) simulated with FakeCommunicator ranks against the
// single-rank moe::MoeLayer::forward:
//  - random layers (MoeLayer::random, NVFP4 and BF16 experts, grouped sigmoid routing, shared
//    expert) on 2 and 4 ranks (ep = world, and ep 2 x moe-tp 2), tokens split unevenly over the
//    ranks (37, 3 and 0 tokens, so some ranks hold none), both strategies;
//  - the golden glm4_moe_tiny_nvfp4 MoE block (moe_in -> moe_out), each rank loading only its
//    experts from the checkpoint (EpMoeLayer::load), on 2 and 4 ranks;
//  - world size 1 is bit-identical to MoeLayer::forward, and the two strategies agree exactly;
//  - a rank that fails makes the others' forward throw instead of hanging;
//  - the strategy rule and its refusals.
// Tolerance against the single-rank layer: the routed sum is regrouped (per-rank partial sums in
// slot order, then summed in rank order: at most K + W additions reordered), so each output
// element differs by at most 2 (K + W + 2) u S with S = sum over the token's slots of |w * out|
// and u = 2^-24 (the standard bound for two summation orders of the same terms), plus 2 u |y|
// for the final + shared. With moe-tp > 1 each expert's down_proj dot product is also split over
// the moe-tp ranks: + 2 (I/8 + moe_tp + 4) u T with T = sum over slots of |w| sum_i |a_i d_hi|
// (the CPU Linear sums 8 lanes of I/8 products; see test_tp_linear.cpp).
// Run: build/tests/dist/test_dist --gtest_filter='EpMoe*'.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "dist/ep_moe.h"
#include "dist/fake_communicator.h"
#include "format/safetensors.h"
#include "testing/testing.h"

namespace fp4moe::dist {
namespace {

using kernels::cpu::WeightFormat;
using moe::MoeConfig;
using moe::MoeLayer;

moe::MoeConfig small_config() {
  MoeConfig c;
  c.hidden = 64;
  c.moe_intermediate = 32;
  c.n_experts = 16;
  c.top_k = 4;
  c.n_group = 4;
  c.topk_group = 2;
  c.routed_scaling_factor = 2.5f;
  c.n_shared_experts = 1;
  c.validate();
  return c;
}

std::vector<float> random_tokens(int64_t n, int64_t h, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(n * h));
  for (auto& v : x) v = nd(rng);
  return x;
}

// Runs the sharded layer on `tp` fake ranks with tokens split by token_range and returns the
// concatenated outputs and per-rank stats.
std::vector<float> run_sharded(const MoeLayer& full, const std::vector<float>& x, int64_t n, int tp, int ep,
                               MoeCommStrategy strategy, std::vector<EpMoeStats>* stats = nullptr,
                               const format::TensorStore* store = nullptr, const std::string& prefix = "") {
  const int64_t H = full.config().hidden;
  std::vector<float> y(static_cast<size_t>(n * H), NAN);
  std::vector<EpMoeStats> st(static_cast<size_t>(tp));
  run_ranks(tp, [&](Communicator& c) {
    const ParallelConfig p = ParallelConfig::make(tp, ep, c.rank());
    const EpMoeLayer layer =
        store != nullptr ? EpMoeLayer::load(*store, prefix, full.config(), p) : EpMoeLayer::from_layer(full, p);
    EXPECT_EQ(layer.experts(), expert_range(full.config().n_experts, ep, p.ep_rank()));
    const Range t = token_range(n, tp, c.rank());
    layer.forward(x.data() + t.begin * H, t.size(), y.data() + t.begin * H, c, strategy,
                  &st[static_cast<size_t>(c.rank())]);
  });
  if (stats != nullptr) *stats = st;
  return y;
}

// Per-element bound of the file comment, from the single-rank routing (trace).
std::vector<double> tolerance(const MoeLayer& full, const std::vector<float>& x, int64_t n, const moe::MoeTrace& trace,
                              const std::vector<float>& y, int world, int moe_tp) {
  const MoeConfig& cfg = full.config();
  const int64_t H = cfg.hidden, I = cfg.moe_intermediate;
  const int K = cfg.top_k;
  const double u = std::ldexp(1.0, -24);
  std::vector<double> bound(static_cast<size_t>(n * H));
  std::vector<float> o(static_cast<size_t>(H)), g(static_cast<size_t>(I)), up(static_cast<size_t>(I));
  for (int64_t t = 0; t < n; ++t) {
    std::vector<double> S(static_cast<size_t>(H), 0.0), T(static_cast<size_t>(H), 0.0);
    for (int s = 0; s < K; ++s) {
      const int e = trace.topk_idx[static_cast<size_t>(t * K + s)];
      const double w = std::abs(trace.topk_weights[static_cast<size_t>(t * K + s)]);
      const moe::GatedMlp& m = full.experts()[static_cast<size_t>(e)];
      m.forward(x.data() + t * H, 1, o.data());
      for (int64_t h = 0; h < H; ++h) S[h] += w * std::abs(o[h]);
      if (moe_tp > 1) {
        kernels::cpu::linear_forward(m.gate, x.data() + t * H, 1, g.data());
        kernels::cpu::linear_forward(m.up, x.data() + t * H, 1, up.data());
        const std::vector<float> d = kernels::cpu::dequantize(m.down);
        for (int64_t h = 0; h < H; ++h) {
          double acc = 0;
          for (int64_t i = 0; i < I; ++i) {
            const double a = g[i] / (1.0 + std::exp(-static_cast<double>(g[i]))) * up[i];
            acc += std::abs(a * d[h * I + i]);
          }
          T[h] += w * acc;
        }
      }
    }
    for (int64_t h = 0; h < H; ++h) {
      bound[static_cast<size_t>(t * H + h)] =
          u * (2.0 * (K + world + 2) * (S[h] + T[h]) + 2.0 * (I / 8 + moe_tp + 4) * T[h] +
               2.0 * std::abs(y[static_cast<size_t>(t * H + h)]));
    }
  }
  return bound;
}

void expect_within(const std::vector<float>& got, const std::vector<float>& want, const std::vector<double>& bound,
                   int64_t H, const std::string& what) {
  ASSERT_EQ(got.size(), want.size());
  double worst_ratio = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double d = std::abs(static_cast<double>(got[i]) - want[i]);
    ASSERT_LE(d, bound[i]) << what << ": token " << i / H << " h " << i % H << " got " << got[i] << " want " << want[i];
    if (bound[i] > 0) worst_ratio = std::max(worst_ratio, d / bound[i]);
  }
  std::printf("[%s] max |diff| / bound = %.3f\n", what.c_str(), worst_ratio);
}

struct RandomCase {
  WeightFormat format;
  int tp;
  int ep;
};

class EpMoeRandom : public ::testing::TestWithParam<RandomCase> {};

TEST_P(EpMoeRandom, MatchesSingleRankLayer) {
  const auto [format, tp, ep] = GetParam();
  const uint64_t seed = testing::test_seed();
  const MoeConfig cfg = small_config();
  const MoeLayer full = MoeLayer::random(cfg, format, seed);
  const int64_t H = cfg.hidden;
  for (int64_t n : {37, 3, 0}) {
    const std::string what = std::string(kernels::cpu::weight_format_name(format)) + " tp " + std::to_string(tp) +
                             " ep " + std::to_string(ep) + " tokens " + std::to_string(n);
    SCOPED_TRACE(what);
    const auto x = random_tokens(n, H, seed + static_cast<uint64_t>(n));
    std::vector<float> want(static_cast<size_t>(n * H), NAN);
    moe::MoeTrace trace;
    full.forward(x.data(), n, want.data(), &trace);
    const int moe_tp = tp / ep;
    const auto bound = tolerance(full, x, n, trace, want, tp, moe_tp);

    std::vector<EpMoeStats> st;
    const auto ag = run_sharded(full, x, n, tp, ep, MoeCommStrategy::kAllGather, &st);
    expect_within(ag, want, bound, H, what + " all-gather");
    int64_t computed = 0;
    for (const auto& s : st) {
      EXPECT_EQ(s.choice.strategy, MoeCommStrategy::kAllGather);
      EXPECT_EQ(s.n_tokens_total, n);
      computed += s.rows_computed;
    }
    EXPECT_EQ(computed, n * cfg.top_k * moe_tp) << "every (token, slot) runs once per moe-tp slice";

    if (moe_tp == 1) {
      const auto a2a = run_sharded(full, x, n, tp, ep, MoeCommStrategy::kAllToAll, &st);
      computed = 0;
      for (const auto& s : st) computed += s.rows_computed;
      EXPECT_EQ(computed, n * cfg.top_k);
      for (size_t i = 0; i < a2a.size(); ++i) {
        ASSERT_EQ(a2a[i], ag[i]) << what << ": all-to-all and all-gather differ at token " << i / H << " h " << i % H;
      }
    } else {
      EXPECT_THROW(run_sharded(full, x, n, tp, ep, MoeCommStrategy::kAllToAll), Error);
    }
    // kAuto at these sizes picks all-gather (fewer than kAllToAllMinTokens tokens).
    const auto au = run_sharded(full, x, n, tp, ep, MoeCommStrategy::kAuto, &st);
    EXPECT_EQ(st[0].choice.strategy, MoeCommStrategy::kAllGather) << st[0].choice.reason;
    for (size_t i = 0; i < au.size(); ++i) ASSERT_EQ(au[i], ag[i]) << what << " auto vs all-gather at " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Shards, EpMoeRandom,
                         ::testing::Values(RandomCase{WeightFormat::kNVFP4, 2, 2}, RandomCase{WeightFormat::kBF16, 2, 2},
                                           RandomCase{WeightFormat::kNVFP4, 4, 4}, RandomCase{WeightFormat::kBF16, 4, 4},
                                           RandomCase{WeightFormat::kNVFP4, 4, 2},
                                           RandomCase{WeightFormat::kBF16, 4, 2}));

TEST(EpMoeSingle, WorldOfOneIsBitIdentical) {
  const uint64_t seed = testing::test_seed() + 1;
  const MoeConfig cfg = small_config();
  for (WeightFormat f : {WeightFormat::kNVFP4, WeightFormat::kBF16}) {
    const MoeLayer full = MoeLayer::random(cfg, f, seed);
    const int64_t n = 29;
    const auto x = random_tokens(n, cfg.hidden, seed + 5);
    std::vector<float> want(static_cast<size_t>(n * cfg.hidden));
    full.forward(x.data(), n, want.data());
    for (MoeCommStrategy s : {MoeCommStrategy::kAllGather, MoeCommStrategy::kAllToAll}) {
      const auto got = run_sharded(full, x, n, 1, 1, s);
      for (size_t i = 0; i < want.size(); ++i) {
        ASSERT_EQ(got[i], want[i]) << moe_comm_strategy_name(s) << " " << weight_format_name(f) << " at " << i;
      }
    }
  }
}

TEST(EpMoeAuto, EightRanksLargeBatchPicksAllToAll) {
  // 300 tokens on ep 8 with top-4: all-to-all moves 1 - (7/8)^4 = 0.414 of all-gather's rows, so
  // kAuto picks it; the result equals the all-gather one exactly and the single rank within bound.
  const uint64_t seed = testing::test_seed() + 3;
  const MoeConfig cfg = small_config();
  const MoeLayer full = MoeLayer::random(cfg, WeightFormat::kNVFP4, seed);
  const int64_t n = 300;
  const auto x = random_tokens(n, cfg.hidden, seed + 1);
  std::vector<float> want(static_cast<size_t>(n * cfg.hidden));
  moe::MoeTrace trace;
  full.forward(x.data(), n, want.data(), &trace);
  std::vector<EpMoeStats> st;
  const auto au = run_sharded(full, x, n, 8, 8, MoeCommStrategy::kAuto, &st);
  // Each token goes once to each other rank owning one of its experts (deduplicated per rank).
  std::vector<int64_t> want_sent(8, 0);
  for (int r = 0; r < 8; ++r) {
    const Range tr = token_range(n, 8, r);
    for (int64_t t = tr.begin; t < tr.end; ++t) {
      std::vector<bool> hit(8, false);
      for (int s = 0; s < cfg.top_k; ++s) hit[expert_owner(cfg.n_experts, 8, trace.topk_idx[t * cfg.top_k + s])] = true;
      for (int p = 0; p < 8; ++p) want_sent[r] += (hit[p] && p != r) ? 1 : 0;
    }
  }
  for (int r = 0; r < 8; ++r) {
    EXPECT_EQ(st[r].choice.strategy, MoeCommStrategy::kAllToAll) << st[r].choice.reason;
    EXPECT_EQ(st[r].rows_sent, want_sent[r]) << "rank " << r;
  }
  const auto ag = run_sharded(full, x, n, 8, 8, MoeCommStrategy::kAllGather);
  for (size_t i = 0; i < ag.size(); ++i) ASSERT_EQ(au[i], ag[i]) << "at " << i;
  expect_within(au, want, tolerance(full, x, n, trace, want, 8, 1), cfg.hidden, "NVFP4 tp 8 ep 8 tokens 300 auto");
}

class EpMoeGolden : public ::testing::TestWithParam<std::pair<int, int>> {};

TEST_P(EpMoeGolden, Glm4TinyNvfp4MoeBlock) {
  const auto [tp, ep] = GetParam();
  const auto dir = testing::shared_path("golden/models/glm4_moe_tiny_nvfp4");
  nlohmann::json config;
  std::ifstream(dir / "config.json") >> config;
  const MoeConfig cfg = moe::moe_config_from_hf(config);
  format::TensorStore store(dir);
  format::SafetensorsFile golden(dir / "golden.safetensors");
  const int64_t layer_index = golden.view("moe_layer").as<int64_t>()[0];
  const std::string prefix = "model.layers." + std::to_string(layer_index) + ".mlp";
  const MoeLayer full = MoeLayer::load(store, prefix, cfg);
  const int64_t H = cfg.hidden, n = 32;
  const TensorView in_v = golden.view("moe_in"), out_v = golden.view("moe_out");
  ASSERT_EQ(in_v.shape, (Shape{2, 16, H}));
  ASSERT_EQ(out_v.shape, (Shape{2, 16, H}));
  const std::vector<float> x(in_v.as<float>().begin(), in_v.as<float>().end());
  const std::vector<float> moe_out(out_v.as<float>().begin(), out_v.as<float>().end());

  std::vector<float> want(static_cast<size_t>(n * H));
  moe::MoeTrace trace;
  full.forward(x.data(), n, want.data(), &trace);
  const auto bound = tolerance(full, x, n, trace, want, tp, tp / ep);
  const std::string what = "glm4_moe_tiny_nvfp4 tp " + std::to_string(tp) + " ep " + std::to_string(ep);
  std::vector<MoeCommStrategy> strategies{MoeCommStrategy::kAllGather};
  if (tp == ep) strategies.push_back(MoeCommStrategy::kAllToAll);
  for (MoeCommStrategy s : strategies) {
    const auto got = run_sharded(full, x, n, tp, ep, s, nullptr, &store, prefix);
    expect_within(got, want, bound, H, what + " " + std::string(moe_comm_strategy_name(s)));
    float max_out = 0, max_diff = 0;
    for (size_t i = 0; i < moe_out.size(); ++i) {
      max_out = std::max(max_out, std::abs(moe_out[i]));
      max_diff = std::max(max_diff, std::abs(moe_out[i] - got[i]));
    }
    EXPECT_LE(max_diff, 1e-4f * max_out) << what << " vs golden moe_out (README tolerance)";
  }
}

INSTANTIATE_TEST_SUITE_P(Ranks, EpMoeGolden,
                         ::testing::Values(std::pair<int, int>{2, 2}, std::pair<int, int>{4, 4},
                                           std::pair<int, int>{4, 2}));

TEST(EpMoeFailure, FailingRankMakesPeersThrowNotHang) {
  const MoeConfig cfg = small_config();
  const MoeLayer full = MoeLayer::random(cfg, WeightFormat::kBF16, testing::test_seed() + 2);
  const auto x = random_tokens(16, cfg.hidden, 3);
  std::vector<float> y(16 * static_cast<size_t>(cfg.hidden));
  const auto t0 = std::chrono::steady_clock::now();
  for (MoeCommStrategy s : {MoeCommStrategy::kAllGather, MoeCommStrategy::kAllToAll}) {
    try {
      run_ranks(
          4,
          [&](Communicator& c) {
            const EpMoeLayer layer = EpMoeLayer::from_layer(full, ParallelConfig::make(4, 4, c.rank()));
            if (c.rank() == 2) throw Error("rank 2 lost its GPU");
            const Range t = token_range(16, 4, c.rank());
            layer.forward(x.data() + t.begin * cfg.hidden, t.size(), y.data() + t.begin * cfg.hidden, c, s);
          },
          std::chrono::seconds(30));
      FAIL() << "expected an error";
    } catch (const Error& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("rank 2 failed: threw: rank 2 lost its GPU"), std::string::npos) << what;
      for (int r : {0, 1, 3}) {
        EXPECT_NE(what.find("rank " + std::to_string(r) + ": rank " + std::to_string(r) + ": all_gather"),
                  std::string::npos)
            << "rank " << r << " should fail in its first collective: " << what;
      }
    }
  }
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(10));
}

TEST(EpMoeStrategy, RuleAndRefusals) {
  const ParallelConfig ep8 = ParallelConfig::make(8, 8, 0);
  EXPECT_NEAR(all_to_all_traffic_fraction(8, 8), 1.0 - std::pow(7.0 / 8.0, 8), 1e-12);
  EXPECT_NEAR(all_to_all_traffic_fraction(8, 8), 0.656, 1e-3);
  EXPECT_NEAR(all_to_all_traffic_fraction(4, 8), 0.900, 1e-3);
  EXPECT_EQ(choose_moe_strategy(MoeCommStrategy::kAuto, 64, ep8, 8).strategy, MoeCommStrategy::kAllGather);
  EXPECT_EQ(choose_moe_strategy(MoeCommStrategy::kAuto, 255, ep8, 8).strategy, MoeCommStrategy::kAllGather);
  const StrategyChoice big = choose_moe_strategy(MoeCommStrategy::kAuto, 256, ep8, 8);
  EXPECT_EQ(big.strategy, MoeCommStrategy::kAllToAll);
  EXPECT_EQ(big.reason, "256 tokens >= 256 and all-to-all moves 0.656 of all-gather's rows (ep 8, top-8)");
  // ep 4 with top-8: all-to-all would save only 10%: all-gather.
  EXPECT_EQ(choose_moe_strategy(MoeCommStrategy::kAuto, 4096, ParallelConfig::make(4, 4), 8).strategy,
            MoeCommStrategy::kAllGather);
  // moe-tp > 1: all-gather, and all-to-all is refused with the numbers.
  const ParallelConfig mixed = ParallelConfig::make(8, 4, 0);
  EXPECT_EQ(choose_moe_strategy(MoeCommStrategy::kAuto, 4096, mixed, 8).strategy, MoeCommStrategy::kAllGather);
  try {
    choose_moe_strategy(MoeCommStrategy::kAllToAll, 10, mixed, 8);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--tp-size 8 --ep-size 4 splits each expert over 2 ranks"), std::string::npos)
        << e.what();
  }
  // An expert count the EP size does not divide.
  const MoeLayer full = MoeLayer::random(small_config(), WeightFormat::kBF16, 1);
  try {
    EpMoeLayer::from_layer(full, ParallelConfig::make(3, 3, 0));
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--ep-size 3 does not divide 16 experts"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace fp4moe::dist
