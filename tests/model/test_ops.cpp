// The shared model ops against naive f64 formulas on fresh random inputs: RMSNorm, LayerNorm,
// NeoX partial RoPE, interleaved RoPE (and its equivalence to half-split RoPE on de-interleaved
// dims, which is how HF applies it), softmax, SiLU, embedding lookup, argmax.
//   ctest --test-dir build -R ModelOps
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "core/error.h"
#include "model/ops.h"
#include "testing/testing.h"

namespace fp4moe::model {
namespace {

std::vector<float> randn(std::mt19937_64& rng, size_t n, float scale = 1.0f) {
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

TEST(ModelOps, RmsNormMatchesFormula) {
  std::mt19937_64 rng(fp4moe::testing::test_seed());
  const int64_t rows = 5, dim = 96;
  const auto x = randn(rng, rows * dim, 3.0f);
  const auto w = randn(rng, dim);
  std::vector<float> y(x.size());
  rms_norm(x.data(), rows, dim, w.data(), 1e-5f, y.data());
  for (int64_t r = 0; r < rows; ++r) {
    double ss = 0;
    for (int64_t i = 0; i < dim; ++i) ss += double(x[r * dim + i]) * x[r * dim + i];
    const double inv = 1.0 / std::sqrt(ss / dim + 1e-5);
    for (int64_t i = 0; i < dim; ++i) {
      const double want = w[i] * x[r * dim + i] * inv;
      EXPECT_NEAR(y[r * dim + i], want, 1e-5 * (1 + std::fabs(want))) << "row " << r << " col " << i;
    }
  }
  // In place gives the same result.
  std::vector<float> z = x;
  rms_norm(z.data(), rows, dim, w.data(), 1e-5f, z.data());
  EXPECT_EQ(z, y);
}

TEST(ModelOps, LayerNormMatchesFormula) {
  std::mt19937_64 rng(fp4moe::testing::test_seed() + 1);
  const int64_t rows = 3, dim = 32;
  const auto x = randn(rng, rows * dim, 2.0f);
  const auto w = randn(rng, dim), b = randn(rng, dim);
  std::vector<float> y(x.size());
  layer_norm(x.data(), rows, dim, w.data(), b.data(), 1e-6f, y.data());
  for (int64_t r = 0; r < rows; ++r) {
    double mean = 0, var = 0;
    for (int64_t i = 0; i < dim; ++i) mean += x[r * dim + i];
    mean /= dim;
    for (int64_t i = 0; i < dim; ++i) var += (x[r * dim + i] - mean) * (x[r * dim + i] - mean);
    var /= dim;
    for (int64_t i = 0; i < dim; ++i) {
      const double want = (x[r * dim + i] - mean) / std::sqrt(var + 1e-6) * w[i] + b[i];
      EXPECT_NEAR(y[r * dim + i], want, 1e-5 * (1 + std::fabs(want)));
    }
  }
}

TEST(ModelOps, RopeInvFreqAndAngles) {
  const auto f = rope_inv_freq(16, 10000.0f);
  ASSERT_EQ(f.size(), 8u);
  for (int i = 0; i < 8; ++i) EXPECT_NEAR(f[i], std::pow(10000.0, -2.0 * i / 16), 1e-7 * (1 + f[i]));
  std::vector<float> c(8), s(8);
  rope_cos_sin(f, 37, c.data(), s.data());
  for (int i = 0; i < 8; ++i) {
    EXPECT_NEAR(c[i], std::cos(37.0 * f[i]), 2e-6);
    EXPECT_NEAR(s[i], std::sin(37.0 * f[i]), 2e-6);
  }
  EXPECT_THROW(rope_inv_freq(7, 10000.0f), Error);
}

// GLM-4.x: rotary dims are the first head_dim * 0.5 of each head, rotate_half pairs (i, i + rd/2).
TEST(ModelOps, NeoxPartialRopeMatchesFormula) {
  std::mt19937_64 rng(fp4moe::testing::test_seed() + 2);
  const int64_t heads = 3, D = 32, rd = 16, pos = 11;
  const auto x0 = randn(rng, heads * D);
  auto x = x0;
  const auto f = rope_inv_freq(rd, 10000.0f);
  std::vector<float> c(rd / 2), s(rd / 2);
  rope_cos_sin(f, pos, c.data(), s.data());
  rope_neox(x.data(), heads, D, 0, rd, c.data(), s.data());
  for (int64_t h = 0; h < heads; ++h) {
    const float* in = x0.data() + h * D;
    for (int64_t i = 0; i < D; ++i) {
      double want = in[i];
      if (i < rd) {
        const int64_t j = i % (rd / 2);
        const double a = pos * std::pow(10000.0, -2.0 * j / rd);
        const double rot = i < rd / 2 ? -in[i + rd / 2] : in[i - rd / 2];  // rotate_half
        want = in[i] * std::cos(a) + rot * std::sin(a);
      }
      EXPECT_NEAR(x[h * D + i], want, 1e-5) << "head " << h << " dim " << i;
    }
  }
}

TEST(ModelOps, InterleavedRopeMatchesFormulaAndHfDeinterleavedForm) {
  std::mt19937_64 rng(fp4moe::testing::test_seed() + 3);
  const int64_t heads = 2, stride = 24, off = 8, rd = 16, pos = 5;
  const auto x0 = randn(rng, heads * stride);
  auto x = x0;
  const auto f = rope_inv_freq(rd, 1e6f);
  std::vector<float> c(rd / 2), s(rd / 2);
  rope_cos_sin(f, pos, c.data(), s.data());
  rope_interleaved(x.data(), heads, stride, off, rd, c.data(), s.data());
  for (int64_t h = 0; h < heads; ++h) {
    const float* in = x0.data() + h * stride;
    for (int64_t i = 0; i < stride; ++i) {
      double want = in[i];
      if (i >= off && i < off + rd) {
        const int64_t k = i - off, p = k / 2;
        const double a = pos * std::pow(1e6, -2.0 * p / rd);
        want = k % 2 == 0 ? in[i] * std::cos(a) - in[i + 1] * std::sin(a) : in[i] * std::cos(a) + in[i - 1] * std::sin(a);
      }
      EXPECT_NEAR(x[h * stride + i], want, 1e-5) << "head " << h << " dim " << i;
    }
    // HF de-interleaves (evens then odds) and applies half-split RoPE: same values, permuted.
    std::vector<float> d(rd);
    for (int64_t p = 0; p < rd / 2; ++p) {
      d[p] = in[off + 2 * p];
      d[rd / 2 + p] = in[off + 2 * p + 1];
    }
    rope_neox(d.data(), 1, rd, 0, rd, c.data(), s.data());
    for (int64_t p = 0; p < rd / 2; ++p) {
      EXPECT_NEAR(d[p], x[h * stride + off + 2 * p], 1e-6);
      EXPECT_NEAR(d[rd / 2 + p], x[h * stride + off + 2 * p + 1], 1e-6);
    }
  }
}

TEST(ModelOps, SoftmaxSiluArgmax) {
  std::vector<float> v = {1.0f, 2.0f, -INFINITY, 0.5f};
  softmax_inplace(v.data(), 4);
  const double z = std::exp(1.0) + std::exp(2.0) + std::exp(0.5);
  EXPECT_NEAR(v[0], std::exp(1.0) / z, 1e-7);
  EXPECT_NEAR(v[1], std::exp(2.0) / z, 1e-7);
  EXPECT_EQ(v[2], 0.0f);
  std::vector<float> all_inf = {-INFINITY, -INFINITY};
  EXPECT_THROW(softmax_inplace(all_inf.data(), 2), Error);
  EXPECT_NEAR(silu(1.5f), 1.5 / (1 + std::exp(-1.5)), 1e-7);
  const float g[] = {1.0f, -2.0f}, u[] = {3.0f, 0.5f};
  float o[2];
  silu_mul(g, u, 2, o);
  EXPECT_NEAR(o[1], -2.0 / (1 + std::exp(2.0)) * 0.5, 1e-7);
  const float a[] = {1, 5, 5, 2};
  EXPECT_EQ(argmax(a, 4), 1);
}

TEST(ModelOps, EmbeddingLookupAndRangeError) {
  std::vector<uint16_t> table(4 * 3);
  for (size_t i = 0; i < table.size(); ++i) table[i] = f32_to_bf16(static_cast<float>(i) * 0.5f);
  const TensorView t{DType::kBF16, {4, 3}, {reinterpret_cast<const uint8_t*>(table.data()), table.size() * 2}};
  const std::vector<int32_t> ids = {2, 0};
  std::vector<float> out(6);
  embedding_lookup(t, ids, out.data());
  EXPECT_EQ(out[0], 3.0f);
  EXPECT_EQ(out[2], 4.0f);
  EXPECT_EQ(out[3], 0.0f);
  const std::vector<int32_t> bad = {1, 4};
  try {
    embedding_lookup(t, bad, out.data());
    FAIL() << "id 4 of a 4-token vocabulary was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("token id 4 at position 1"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace fp4moe::model
