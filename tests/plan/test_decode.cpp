// Decode economics of GLM-5's MoE (E=256, top-8, H=6144, I=2048) on 8-way expert parallelism,
// checked against values computed by hand below (src/plan/decode.h has the formulas).
#include <gtest/gtest.h>

#include <cmath>
#include <utility>

#include "core/error.h"
#include "plan/decode.h"
#include "plan/gpu_table.h"

namespace fp4moe::plan {
namespace {

// Derivation (per MoE layer, per decode step, on one of the 8 EP ranks, 32 experts each):
//   weights per expert = (2I x H + I x H) x (0.5 + 1/16) = 37,748,736 x 0.5625 = 21,233,664 B
//   activation bytes per token, NVFP4 inputs (B200): GEMM1 H x 0.5625 + 2I x 2 = 3456 + 8192,
//     GEMM2 I x 0.5625 + H x 2 = 1152 + 12288  -> 25,088 B;  BF16 inputs (H200): 36,864 B
//   FLOPs per token = 2 x (2I x H + I x H) = 75,497,472
//   tokens on a rank = C x top_k / EP = C;  active experts = 32 x (1 - (31/32)^C)
//     C=16: (31/32)^16 = 0.601710 -> 12.745270;  C=64: 27.805311;  C=256: 31.990552;  C=1024: 32.0
//   B200: HBM 8000 GB/s, FP4 9000 TFLOPS. C=1: bytes = 21,233,664 + 25,088 = 21,258,752,
//     time = 21,258,752 / 8e12 = 2.657344 us (HBM-bound: compute is 0.0084 us),
//     AI = 75,497,472 / 21,258,752 = 3.551360, utilization = AI x 8e12 / 9e15 = 0.3157 %.
//   tokens per expert ~ Binomial(C, 1/32): mean C/32; p50 / p99 from its CDF, e.g. C=16:
//     P(0) = 0.6017 >= 0.5 -> p50 0; P(<=2) = 0.9874 < 0.99 <= P(<=3) = 0.9987 -> p99 3.
struct Expected {
  int64_t concurrency;
  double active, bytes, time_us, ai, utilization, mean;
  int p50, p99;
};

DecodeModel glm5() {
  DecodeModel m;
  m.n_experts = 256;
  m.top_k = 8;
  m.hidden = 6144;
  m.intermediate = 2048;
  m.ep = 8;
  return m;
}

void expect_rows(const GpuSpec& gpu, const std::vector<Expected>& rows) {
  for (const Expected& e : rows) {
    const DecodeRow r = decode_row(glm5(), gpu, e.concurrency);
    SCOPED_TRACE(gpu.name + " concurrency " + std::to_string(e.concurrency));
    EXPECT_NEAR(r.active_experts_per_rank, e.active, 1e-6);
    EXPECT_NEAR(r.tokens_per_rank, static_cast<double>(e.concurrency), 1e-9);
    EXPECT_NEAR(r.bytes, e.bytes, 1.0);
    EXPECT_NEAR(r.flops, 75497472.0 * e.concurrency, 1.0);
    EXPECT_NEAR(r.time_us, e.time_us, 1e-5);
    EXPECT_NEAR(r.arithmetic_intensity, e.ai, 1e-5);
    EXPECT_NEAR(r.utilization, e.utilization, 1e-6);
    EXPECT_NEAR(r.tokens_per_expert_mean, e.mean, 1e-12);
    EXPECT_EQ(r.tokens_per_expert_p50, e.p50);
    EXPECT_EQ(r.tokens_per_expert_p99, e.p99);
    EXPECT_EQ(r.bound, "hbm");
  }
}

TEST(Decode, Glm5OnB200Ep8) {
  expect_rows(require_gpu("b200"), {
                                       {1, 1.0, 21258752.0, 2.657344, 3.551360, 0.003157, 0.03125, 0, 1},
                                       {16, 12.745270, 271030194.9, 33.878774, 4.456919, 0.003962, 0.5, 0, 3},
                                       {64, 27.805311, 592014262.4, 74.001783, 8.161692, 0.007255, 2.0, 2, 6},
                                       {256, 31.990552, 685699156.1, 85.712395, 28.186345, 0.025055, 8.0, 8, 15},
                                       {1024, 32.0, 705167360.0, 88.145920, 109.632714, 0.097451, 32.0, 32, 46},
                                   });
}

TEST(Decode, Glm5OnH200Ep8) {
  // H200 has no FP4 tensor cores: BF16 peak 989 TFLOPS, BF16 activations (our W4A16 kernel).
  expect_rows(require_gpu("h200"), {
                                       {1, 1.0, 21270528.0, 4.431360, 3.549393, 0.017227, 0.03125, 0, 1},
                                       {16, 12.745270, 271218610.9, 56.503877, 4.453823, 0.021616, 0.5, 0, 3},
                                       {64, 27.805311, 592767926.4, 123.493318, 8.151315, 0.039561, 2.0, 2, 6},
                                       {256, 31.990552, 688713812.1, 143.482044, 28.062967, 0.136200, 8.0, 8, 15},
                                       {1024, 32.0, 717225984.0, 149.422080, 107.789474, 0.523144, 32.0, 32, 46},
                                   });
}

TEST(Decode, ConcurrencyForTarget) {
  // H200 reaches 50% between 256 and 1024 running requests; B200 not before ~10k.
  const int64_t h = concurrency_for_utilization(glm5(), require_gpu("h200"), 0.5);
  EXPECT_GT(h, 256);
  EXPECT_LE(h, 1024);
  EXPECT_GE(decode_row(glm5(), require_gpu("h200"), h).utilization, 0.5);
  EXPECT_LT(decode_row(glm5(), require_gpu("h200"), h - 1).utilization, 0.5);
  const int64_t b = concurrency_for_utilization(glm5(), require_gpu("b200"), 0.5);
  EXPECT_GT(b, 4096);
}

TEST(Decode, HistogramConcentratesLoad) {
  // All load on experts 0..7 (rank 0): rank 0 gets every token-expert pair, 8 active experts.
  DecodeModel m = glm5();
  m.routing.assign(256, 0.0);
  for (int e = 0; e < 8; ++e) m.routing[e] = 1.0;
  const DecodeRow r = decode_row(m, require_gpu("b200"), 64);
  EXPECT_NEAR(r.tokens_per_rank, 64.0 * 8, 1e-9);
  EXPECT_NEAR(r.active_experts_per_rank, 8.0, 1e-9);
}

TEST(Decode, RejectsBadModels) {
  DecodeModel m = glm5();
  m.ep = 7;
  EXPECT_THROW(decode_row(m, require_gpu("b200"), 1), Error);
  m = glm5();
  m.routing = {1.0, 2.0};
  EXPECT_THROW(decode_row(m, require_gpu("b200"), 1), Error);
  EXPECT_THROW(decode_row(glm5(), require_gpu("b200"), 0), Error);
  // Impossible histograms (they planned "every expert active at concurrency 1" or 99% utilisation at 64 requests).
  m = glm5();
  m.routing.assign(256, 1e308);  // the sum overflows
  EXPECT_THROW(decode_row(m, require_gpu("b200"), 1), Error);
  m.routing.assign(256, 0.0);
  m.routing[3] = 1.0;  // one expert with every routed token: a share of 1 > 1/8
  try {
    decode_row(m, require_gpu("b200"), 1);
    ADD_FAILURE() << "accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("routing histogram: expert 3 has 1 of 1 routed tokens (a share of 1), more "
                                         "than 1/topk = 0.125"),
              std::string::npos)
        << e.what();
  }
}

TEST(Decode, BinomialQuantile) {
  EXPECT_EQ(binomial_quantile(16, 1.0 / 32, 0.5), 0);
  EXPECT_EQ(binomial_quantile(16, 1.0 / 32, 0.99), 3);
  EXPECT_EQ(binomial_quantile(10, 1.0, 0.5), 10);
  EXPECT_EQ(binomial_quantile(0, 0.5, 0.5), 0);
  // The walk from 12 standard deviations below the mean gives the quantile of the walk from 0 (the reference here).
  const auto from_zero = [](int64_t n, double p, double q) {
    double cdf = 0;
    for (int64_t x = 0; x <= n; ++x) {
      cdf += std::exp(std::lgamma(n + 1.0) - std::lgamma(x + 1.0) - std::lgamma(n - x + 1.0) + x * std::log(p) +
                      (n - x) * std::log1p(-p));
      if (cdf >= q - 1e-12) return x;
    }
    return n;
  };
  for (const auto& [n, p] : {std::pair<int64_t, double>{100000, 1.0 / 32},
                             {20000, 0.5},
                             {5000, 0.9},
                             {400, 0.4},
                             {100000, 1 - 1e-6},
                             {300, 0.999},
                             {1000, 0.02}}) {
    for (double q : {0.01, 0.5, 0.99}) {
      EXPECT_EQ(binomial_quantile(n, p, q), from_zero(n, p, q)) << "n=" << n << " p=" << p << " q=" << q;
    }
  }
  // The largest concurrency a decode row takes, in O(sd) steps: its median is the mean.
  const int64_t big = kMaxDecodeConcurrency;
  EXPECT_NEAR(static_cast<double>(binomial_quantile(big, 8.0 / 256, 0.5)), big * 8.0 / 256, 2.0);
}

// --concurrency past kMaxDecodeConcurrency (2^24) is refused naming it (2^40 ran for half an hour).
TEST(Decode, ConcurrencyIsBounded) {
  const DecodeModel m = glm5();
  EXPECT_GT(decode_row(m, require_gpu("h200"), kMaxDecodeConcurrency).time_us, 0);
  try {
    decode_row(m, require_gpu("h200"), kMaxDecodeConcurrency + 1);
    ADD_FAILURE() << "accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("concurrency must be in [1, 16777216] (got 16777217)"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace fp4moe::plan
