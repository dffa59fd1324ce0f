// layer_norm_bf16 (kernels/cuda/ops/layer_norm.h) against model::layer_norm (model/ops.h, the CPU
// GLM-5 indexer key norm) on fresh random bf16 inputs with a non-zero mean (so the centering
// matters), random f32 weight and bias; the CPU gets the same bf16 values as f32. Checks:
//   - dims 1, 32, 128 (GLM-5 index_head_dim), 129, 1000 and 5120; 1, 9 and 300 rows; a row stride
//     larger than dim (the padding must stay untouched); y aliasing x (in place) and not;
//   - y within 2^-8 * |ref| + 1e-5 of the CPU value (one bf16 rounding of the output, 2^-9 relative,
//     plus f32 sum-order differences far below it);
//   - a constant row (variance 0) gives exactly bf16(b) (eps keeps the division finite);
//   - bad arguments (row_stride < dim, dim 0) are refused on the host naming the values.
// Label gpu; without a usable GPU every case skips with the reason.
// Run: test_cuda_layer_norm (FP4MOE_TEST_SEED=<n> replays a seed).
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/ops/layer_norm.h"
#include "kernels/cuda_test_util.h"
#include "model/ops.h"
#include "testing/testing.h"

namespace fp4moe::cuda {
namespace {

using gpu_test::upload;
using gpu_test::download;
using gpu_test::bf;


TEST(CudaLayerNorm, MatchesCpu) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(testing::test_seed());
  struct Case {
    int64_t rows, dim, stride;
    bool alias;
  };
  const Case cases[] = {{1, 1, 1, false},      {9, 32, 32, false},    {300, 128, 128, false}, {300, 128, 160, true},
                        {9, 129, 131, false},  {9, 1000, 1000, true}, {1, 5120, 5120, false}, {9, 5120, 5200, true}};
  const float eps = 1e-6f;
  for (const Case& c : cases) {
    std::normal_distribution<float> d(0.0f, 1.0f);
    const float offset = 3.0f * d(rng);
    std::vector<uint16_t> xb(static_cast<size_t>(c.rows * c.stride));
    for (auto& v : xb) v = f32_to_bf16(offset + 2.0f * d(rng));
    std::vector<float> w(static_cast<size_t>(c.dim)), b(w.size());
    for (auto& v : w) v = 1.0f + 0.5f * d(rng);
    for (auto& v : b) v = 0.5f * d(rng);
    // The CPU reference on the dense [rows, dim] f32 copy of the bf16 rows.
    std::vector<float> xf(static_cast<size_t>(c.rows * c.dim)), ref(xf.size());
    for (int64_t r = 0; r < c.rows; ++r) {
      for (int64_t i = 0; i < c.dim; ++i) xf[static_cast<size_t>(r * c.dim + i)] = bf16_to_f32(xb[static_cast<size_t>(r * c.stride + i)]);
    }
    model::layer_norm(xf.data(), c.rows, c.dim, w.data(), b.data(), eps, ref.data());

    auto dx = upload(xb);
    auto dw = upload(w);
    auto db = upload(b);
    auto dy = upload(xb);  // same padding as x, so untouched padding can be checked
    uint16_t* out = c.alias ? dx.get() : dy.get();
    layer_norm_bf16(bf(dx.get()), dw.get(), db.get(), c.rows, c.dim, c.stride, eps, bf(out), nullptr);
    FP4MOE_CUDA_CHECK(cudaDeviceSynchronize());
    const std::vector<uint16_t> y = download(out, xb.size());
    for (int64_t r = 0; r < c.rows; ++r) {
      for (int64_t i = 0; i < c.stride; ++i) {
        const size_t at = static_cast<size_t>(r * c.stride + i);
        if (i >= c.dim) {
          ASSERT_EQ(y[at], xb[at]) << "padding changed: rows=" << c.rows << " dim=" << c.dim << " stride=" << c.stride
                                   << " row " << r << " col " << i;
          continue;
        }
        const float want = ref[static_cast<size_t>(r * c.dim + i)];
        const float got = bf16_to_f32(y[at]);
        ASSERT_NEAR(got, want, std::ldexp(std::fabs(want), -8) + 1e-5f)
            << "rows=" << c.rows << " dim=" << c.dim << " stride=" << c.stride << " alias=" << c.alias << " row " << r
            << " col " << i;
      }
    }
  }
}

TEST(CudaLayerNorm, ConstantRowGivesTheBias) {
  SKIP_WITHOUT_GPU();
  const int64_t dim = 128;
  std::vector<uint16_t> xb(static_cast<size_t>(dim), f32_to_bf16(2.5f));
  std::vector<float> w(static_cast<size_t>(dim), 3.0f), b(static_cast<size_t>(dim));
  for (int64_t i = 0; i < dim; ++i) b[static_cast<size_t>(i)] = 0.01f * static_cast<float>(i) - 0.5f;
  auto dx = upload(xb);
  auto dw = upload(w);
  auto db = upload(b);
  layer_norm_bf16(bf(dx.get()), dw.get(), db.get(), 1, dim, dim, 1e-6f, bf(dx.get()), nullptr);
  FP4MOE_CUDA_CHECK(cudaDeviceSynchronize());
  const std::vector<uint16_t> y = download(dx.get(), xb.size());
  for (int64_t i = 0; i < dim; ++i) {
    EXPECT_EQ(y[static_cast<size_t>(i)], f32_to_bf16(b[static_cast<size_t>(i)])) << "col " << i;
  }
}

TEST(CudaLayerNorm, RefusesBadArgumentsNamingThem) {
  SKIP_WITHOUT_GPU();
  try {
    layer_norm_bf16(nullptr, nullptr, nullptr, 4, 128, 64, 1e-6f, nullptr, nullptr);
    FAIL() << "row_stride < dim accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("dim=128, row_stride=64"), std::string::npos) << e.what();
  }
  EXPECT_THROW(layer_norm_bf16(nullptr, nullptr, nullptr, 4, 0, 0, 1e-6f, nullptr, nullptr), Error);
}

}  // namespace
}  // namespace fp4moe::cuda
