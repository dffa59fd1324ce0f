// Tensor-parallel Linears (dist/tp_linear.h) simulated on 2 and 4 fake ranks against the unsharded
// kernels::cpu::linear_forward, F32/BF16/NVFP4 weights with a bias, fresh random data:
//  - column-parallel (+ all-gather) equals the unsharded output exactly: each output element is
//    the same dot product over the same K, computed by the same kernel;
//  - row-parallel (+ all-reduce) differs only by the summation order of each dot product. The
//    kernel sums 8 lanes of K/8 products each, so |fl(dot) - dot| <= (K/8 + 3) u S with
//    S = sum_k |x_k w_k| and u = 2^-24; the sharded sum adds tp partials (each with the same bound
//    on its K/tp slice) and the bias, so the two differ by at most 2 (K/8 + tp + 4) u (S + |b|).
// Slicing: NVFP4 column slices off the 16-element blocks are refused with the numbers.
// Run: build/tests/dist/test_dist --gtest_filter='TpLinear*'.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "core/error.h"
#include "dist/fake_communicator.h"
#include "dist/tp_linear.h"
#include "moe/weights.h"
#include "testing/testing.h"

namespace fp4moe::dist {
namespace {

using kernels::cpu::WeightFormat;

std::vector<float> random_x(int64_t m, int64_t k, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> n(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(m * k));
  for (auto& v : x) v = n(rng);
  return x;
}

struct Case {
  WeightFormat format;
  int tp;
};

class TpLinear : public ::testing::TestWithParam<Case> {};

TEST_P(TpLinear, ColumnParallelIsExact) {
  const auto [format, tp] = GetParam();
  const uint64_t seed = testing::test_seed();
  const int64_t out = 96, in = 128, m = 7;
  const LinearWeight w = moe::random_linear(format, out, in, seed, /*bias=*/true);
  const auto x = random_x(m, in, seed + 1);
  std::vector<float> want(static_cast<size_t>(m * out));
  kernels::cpu::linear_forward(w, x.data(), m, want.data());
  std::vector<std::vector<float>> got(static_cast<size_t>(tp), std::vector<float>(static_cast<size_t>(m * out)));
  run_ranks(tp, [&](Communicator& c) {
    const auto shard = ColumnParallelLinear::shard(w, tp, c.rank());
    EXPECT_EQ(shard.out_range, column_parallel_rows(out, tp, c.rank()));
    shard.forward_gather(x.data(), m, got[static_cast<size_t>(c.rank())].data(), c);
  });
  for (int r = 0; r < tp; ++r) {
    for (size_t i = 0; i < want.size(); ++i) {
      ASSERT_EQ(got[static_cast<size_t>(r)][i], want[i]) << weight_format_name(format) << " tp " << tp << " rank " << r
                                                         << " row " << i / out << " col " << i % out;
    }
  }
}

TEST_P(TpLinear, RowParallelWithinSummationBound) {
  const auto [format, tp] = GetParam();
  const uint64_t seed = testing::test_seed() + 10;
  const int64_t out = 64, in = 256, m = 5;
  const LinearWeight w = moe::random_linear(format, out, in, seed, /*bias=*/true);
  const auto x = random_x(m, in, seed + 1);
  std::vector<float> want(static_cast<size_t>(m * out));
  kernels::cpu::linear_forward(w, x.data(), m, want.data());
  std::vector<std::vector<float>> got(static_cast<size_t>(tp), std::vector<float>(static_cast<size_t>(m * out)));
  run_ranks(tp, [&](Communicator& c) {
    const auto shard = RowParallelLinear::shard(w, tp, c.rank());
    EXPECT_EQ(shard.local.has_bias(), c.rank() == 0);
    const auto xs = take_columns(x.data(), m, in, shard.in_range);
    shard.forward(xs.data(), m, got[static_cast<size_t>(c.rank())].data(), c);
  });
  const std::vector<float> wd = kernels::cpu::dequantize(w);
  const double u = std::ldexp(1.0, -24);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t o = 0; o < out; ++o) {
      double s = std::abs(w.bias[static_cast<size_t>(o)]);
      for (int64_t k = 0; k < in; ++k) s += std::abs(static_cast<double>(x[i * in + k]) * wd[o * in + k]);
      const double bound = 2.0 * (in / 8 + tp + 4) * u * s;
      for (int r = 0; r < tp; ++r) {
        const float g = got[static_cast<size_t>(r)][static_cast<size_t>(i * out + o)];
        ASSERT_LE(std::abs(static_cast<double>(g) - want[static_cast<size_t>(i * out + o)]), bound)
            << weight_format_name(format) << " tp " << tp << " rank " << r << " row " << i << " out " << o;
        ASSERT_EQ(g, got[0][static_cast<size_t>(i * out + o)]) << "ranks disagree at rank " << r;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Formats, TpLinear,
                         ::testing::Values(Case{WeightFormat::kF32, 2}, Case{WeightFormat::kBF16, 2},
                                           Case{WeightFormat::kNVFP4, 2}, Case{WeightFormat::kF32, 4},
                                           Case{WeightFormat::kBF16, 4}, Case{WeightFormat::kNVFP4, 4}));

TEST(TpLinearSlicing, SlicesEqualTheDequantizedSubmatrix) {
  const uint64_t seed = testing::test_seed() + 20;
  for (WeightFormat f : {WeightFormat::kF32, WeightFormat::kBF16, WeightFormat::kNVFP4}) {
    const LinearWeight w = moe::random_linear(f, 12, 64, seed, true);
    const auto full = kernels::cpu::dequantize(w);
    const LinearWeight rows = slice_rows(w, {3, 9});
    const LinearWeight cols = slice_cols(w, {16, 48}, true);
    const auto dr = kernels::cpu::dequantize(rows), dc = kernels::cpu::dequantize(cols);
    for (int64_t r = 0; r < 6; ++r) {
      for (int64_t k = 0; k < 64; ++k) ASSERT_EQ(dr[r * 64 + k], full[(r + 3) * 64 + k]) << weight_format_name(f);
      EXPECT_EQ(rows.bias[static_cast<size_t>(r)], w.bias[static_cast<size_t>(r + 3)]);
    }
    for (int64_t r = 0; r < 12; ++r) {
      for (int64_t k = 0; k < 32; ++k) ASSERT_EQ(dc[r * 32 + k], full[r * 64 + 16 + k]) << weight_format_name(f);
    }
    EXPECT_EQ(cols.bias, w.bias);
    EXPECT_FALSE(slice_cols(w, {0, 16}, false).has_bias());
  }
  const LinearWeight q = moe::random_linear(WeightFormat::kNVFP4, 4, 64, seed, false);
  try {
    slice_cols(q, {8, 40}, false);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("NVFP4 column slice [8, 40) must start and end at multiples of the 16-element "
                                         "block"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(slice_rows(q, {2, 9}), Error);  // past the 4 rows
  EXPECT_NO_THROW(slice_cols(moe::random_linear(WeightFormat::kBF16, 4, 64, seed), {8, 40}, false));
  // Row-parallel sharding of an NVFP4 [*, 48] over 2 ranks (24 columns each) is refused.
  EXPECT_THROW(RowParallelLinear::shard(moe::random_linear(WeightFormat::kNVFP4, 4, 48, seed), 2, 0), Error);
}

}  // namespace
}  // namespace fp4moe::dist
