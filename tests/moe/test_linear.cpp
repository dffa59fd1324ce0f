// CPU Linear kernel (F32, BF16, NVFP4) against a double-precision reference on fresh random data,
// the thread pool, and the loading of Linear tensors (shapes, dtypes, error messages).
// Run: build/tests/moe/test_linear (FP4MOE_TEST_SEED=<n> replays a failure's random data).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <atomic>
#include <filesystem>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include <unistd.h>

#include "core/error.h"
#include "format/nvfp4.h"
#include "format/safetensors.h"
#include "kernels/cpu/linear.h"
#include "kernels/cpu/thread_pool.h"
#include "moe/weights.h"
#include "testing/testing.h"

namespace fp4moe {
namespace {

using kernels::cpu::LinearTensors;
using kernels::cpu::LinearWeight;
using kernels::cpu::WeightFormat;

// Random weight in `fmt` with values of order 1 (NVFP4: random codes, scale codes 0x20..0x7E).
LinearWeight random_weight(WeightFormat fmt, int64_t out, int64_t in, bool bias, std::mt19937_64& rng) {
  std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
  std::vector<float> b;
  if (bias) {
    b.resize(out);
    for (auto& v : b) v = uni(rng);
  }
  const size_t n = static_cast<size_t>(out * in);
  if (fmt == WeightFormat::kF32) {
    std::vector<float> w(n);
    for (auto& v : w) v = uni(rng);
    return LinearWeight::from_f32(out, in, std::move(w), std::move(b));
  }
  if (fmt == WeightFormat::kBF16) {
    std::vector<uint16_t> w(n);
    for (auto& v : w) v = f32_to_bf16(uni(rng));
    return LinearWeight::from_bf16(out, in, std::move(w), std::move(b));
  }
  std::vector<uint8_t> packed(n / 2), scales(n / 16);
  std::uniform_int_distribution<int> byte(0, 255), sc(0x20, 0x7E);
  for (auto& v : packed) v = static_cast<uint8_t>(byte(rng));
  for (auto& v : scales) v = static_cast<uint8_t>(sc(rng));
  const float gs = std::uniform_real_distribution<float>(1e-4f, 1e-2f)(rng);
  return LinearWeight::from_nvfp4(out, in, std::move(packed), std::move(scales), gs, 0.5f, std::move(b));
}

// Weight element (r, k) decoded independently of the kernel (spec §1.3 formula).
double ref_weight(const LinearWeight& w, int64_t r, int64_t k) {
  const int64_t in = w.in_features;
  switch (w.format) {
    case WeightFormat::kF32: return w.f32[r * in + k];
    case WeightFormat::kBF16: return bf16_to_f32(w.bf16[r * in + k]);
    case WeightFormat::kNVFP4: {
      const uint8_t b = w.packed[r * (in / 2) + k / 2];
      const uint8_t nib = (k & 1) ? (b >> 4) : (b & 0xF);
      const float s = format::e4m3_to_f32(w.scales[r * (in / 16) + k / 16]) * w.global_scale;
      return static_cast<double>(format::e2m1_to_f32(nib)) * static_cast<double>(s);
    }
  }
  return 0;
}

void check_linear(WeightFormat fmt, int64_t out, int64_t in, int64_t m, bool bias, std::mt19937_64& rng) {
  SCOPED_TRACE(::testing::Message() << kernels::cpu::weight_format_name(fmt) << " out=" << out << " in=" << in
                                  << " m=" << m << " bias=" << bias);
  LinearWeight w = random_weight(fmt, out, in, bias, rng);
  std::vector<float> x(static_cast<size_t>(m * in));
  std::uniform_real_distribution<float> uni(-2.0f, 2.0f);
  for (auto& v : x) v = uni(rng);
  std::vector<float> y(static_cast<size_t>(m * out), NAN);
  kernels::cpu::linear_forward(w, x.data(), m, y.data());
  // f32 accumulation over `in` terms: |error| <= in * 2^-23 * sum|x w| (gamma_n bound, generous).
  int64_t n_bad = 0;
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t r = 0; r < out; ++r) {
      double ref = bias ? w.bias[r] : 0.0, mag = bias ? std::abs(w.bias[r]) : 0.0;
      for (int64_t k = 0; k < in; ++k) {
        const double p = static_cast<double>(x[i * in + k]) * ref_weight(w, r, k);
        ref += p;
        mag += std::abs(p);
      }
      const double tol = (static_cast<double>(in) + 2) * 1.2e-7 * mag + 1e-30;
      const double got = y[i * out + r];
      if (!(std::abs(got - ref) <= tol) && n_bad++ < 5) {
        ADD_FAILURE() << "y[" << i << ", " << r << "] = " << got << ", reference " << ref << ", |diff| "
                      << std::abs(got - ref) << " > tol " << tol;
      }
    }
  }
  EXPECT_EQ(n_bad, 0);
  // Each row's result does not depend on m or the blocking: m single-row calls give the same bits.
  std::vector<float> y1(static_cast<size_t>(out));
  for (int64_t i = 0; i < m; ++i) {
    kernels::cpu::linear_forward(w, x.data() + i * in, 1, y1.data());
    ASSERT_EQ(0, std::memcmp(y1.data(), y.data() + i * out, static_cast<size_t>(out) * 4)) << "row " << i;
  }
}

TEST(Linear, MatchesF64ReferenceAllFormats) {
  std::mt19937_64 rng(testing::test_seed());
  struct Case { int64_t out, in, m; };
  const Case nvfp4_cases[] = {{1, 16, 1}, {7, 48, 3}, {33, 160, 5}, {130, 272, 1}, {257, 1024, 9}, {64, 2048, 17}};
  const Case dense_cases[] = {{1, 1, 1}, {5, 13, 2}, {37, 5, 4}, {129, 301, 3}, {300, 1000, 1}, {64, 777, 33}};
  for (bool bias : {false, true}) {
    for (const Case& c : nvfp4_cases) check_linear(WeightFormat::kNVFP4, c.out, c.in, c.m, bias, rng);
    for (WeightFormat f : {WeightFormat::kF32, WeightFormat::kBF16}) {
      for (const Case& c : dense_cases) check_linear(f, c.out, c.in, c.m, bias, rng);
      for (const Case& c : nvfp4_cases) check_linear(f, c.out, c.in, c.m, bias, rng);
    }
  }
}

TEST(Linear, ZeroRowsWritesNothing) {
  std::mt19937_64 rng(testing::test_seed());
  LinearWeight w = random_weight(WeightFormat::kNVFP4, 8, 32, true, rng);
  float sentinel = 123.0f;
  kernels::cpu::linear_forward(w, nullptr, 0, &sentinel);
  EXPECT_EQ(sentinel, 123.0f);
}

TEST(Linear, DequantizeMatchesFormatLibraryBitForBit) {
  std::mt19937_64 rng(testing::test_seed() + 1);
  LinearWeight w = random_weight(WeightFormat::kNVFP4, 45, 96, false, rng);
  format::Nvfp4View v{w.packed, w.scales, w.global_scale, w.out_features, w.in_features};
  std::vector<float> expect = format::nvfp4_dequantize(v);
  std::vector<float> got = kernels::cpu::dequantize(w);
  ASSERT_EQ(expect.size(), got.size());
  for (size_t i = 0; i < got.size(); ++i) ASSERT_EQ(expect[i], got[i]) << "element " << i;
}

TEST(Linear, InvalidWeightsAreRejectedWithSizes) {
  try {
    LinearWeight::from_nvfp4(4, 24, std::vector<uint8_t>(48), std::vector<uint8_t>(6), 1.0f);
    FAIL() << "in_features 24 accepted for NVFP4";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("in_features 24 is not a multiple of the block size 16"), std::string::npos)
        << e.what();
  }
  try {
    LinearWeight::from_bf16(4, 8, std::vector<uint16_t>(31));
    FAIL() << "31 elements accepted for [4, 8]";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("holds 31 elements, expected 32"), std::string::npos) << e.what();
  }
  try {
    LinearWeight::from_f32(4, 8, std::vector<float>(32), std::vector<float>(3));
    FAIL() << "bias of 3 accepted for out 4";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("bias holds 3 elements, expected 4"), std::string::npos) << e.what();
  }
}

TEST(ThreadPool, EveryTaskRunsOnceNestedAndExceptions) {
  kernels::cpu::ThreadPool pool(3);
  std::vector<std::atomic<int>> hits(1000);
  pool.parallel_for(1000, [&](int64_t i) { hits[i].fetch_add(1); });
  for (size_t i = 0; i < hits.size(); ++i) ASSERT_EQ(hits[i].load(), 1) << "task " << i;
  // Nested parallel_for runs inline instead of deadlocking.
  std::atomic<int64_t> sum{0};
  pool.parallel_for(8, [&](int64_t i) { pool.parallel_for(10, [&](int64_t j) { sum += i * 10 + j; }); });
  EXPECT_EQ(sum.load(), 79 * 80 / 2);
  // The first exception reaches the caller; the pool stays usable.
  EXPECT_THROW(pool.parallel_for(50, [](int64_t i) { FP4MOE_CHECK(i != 17) << "task " << i; }), Error);
  std::atomic<int> n{0};
  pool.parallel_for(20, [&](int64_t) { ++n; });
  EXPECT_EQ(n.load(), 20);
  EXPECT_GE(kernels::cpu::default_cpu_threads(), 1);
}

// ---- loading from views and from a TensorStore ----

template <typename T>
TensorView view_of(DType dt, Shape shape, const std::vector<T>& data) {
  return TensorView{dt, std::move(shape),
                    std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(data.data()), data.size() * sizeof(T))};
}

using fp4moe::testing::error_of;

TEST(LoadLinear, FromViewsDetectsFormatAndNamesMismatches) {
  const std::string mod = "model.layers.1.mlp.experts.0.up_proj";
  std::vector<uint8_t> packed(64 * 64, 0x21), scales(64 * 8, 0x38);
  std::vector<float> gs{0.25f}, is{0.125f};
  std::vector<uint16_t> bf(64 * 128, f32_to_bf16(1.5f));
  const TensorView wq = view_of(DType::kU8, {64, 64}, packed);
  const TensorView ws = view_of(DType::kF8_E4M3, {64, 8}, scales);
  const TensorView ws2 = view_of(DType::kF32, {}, gs);
  const TensorView isv = view_of(DType::kF32, {}, is);

  LinearTensors t{mod, &wq, &ws, &ws2, &isv, nullptr};
  LinearWeight w = kernels::cpu::linear_weight_from_tensors(t, 64, 128, false);
  EXPECT_EQ(w.format, WeightFormat::kNVFP4);
  EXPECT_EQ(w.global_scale, 0.25f);
  ASSERT_TRUE(w.input_scale.has_value());
  EXPECT_EQ(*w.input_scale, 0.125f);
  // code 0x1 = 0.5 (even k), 0x2 = 1.0 (odd k); scale 0x38 = 1.0; global 0.25.
  std::vector<float> row(128);
  kernels::cpu::dequantize_row(w, 3, row.data());
  EXPECT_EQ(row[0], 0.125f);
  EXPECT_EQ(row[1], 0.25f);

  const TensorView wb = view_of(DType::kBF16, {64, 128}, bf);
  LinearWeight wbf = kernels::cpu::linear_weight_from_tensors(LinearTensors{mod, &wb}, 64, 128, false);
  EXPECT_EQ(wbf.format, WeightFormat::kBF16);

  // Wrong packed shape.
  const TensorView wq_bad = view_of(DType::kU8, {64, 32}, packed);
  EXPECT_NE(error_of([&] { kernels::cpu::linear_weight_from_tensors({mod, &wq_bad, &ws, &ws2}, 64, 128, false); })
                .find(mod + ".weight: expected U8 [64, 64] (NVFP4, packed e2m1), found U8 [64, 32]"),
            std::string::npos);
  // Wrong scale dtype.
  const TensorView ws_bad = view_of(DType::kU8, {64, 8}, scales);
  EXPECT_NE(error_of([&] { kernels::cpu::linear_weight_from_tensors({mod, &wq, &ws_bad, &ws2}, 64, 128, false); })
                .find(mod + ".weight_scale: expected F8_E4M3 [64, 8], found U8 [64, 8]"),
            std::string::npos);
  // Missing weight_scale_2 / weight_scale.
  EXPECT_NE(error_of([&] { kernels::cpu::linear_weight_from_tensors({mod, &wq, &ws}, 64, 128, false); })
                .find(mod + ".weight_scale_2: missing"),
            std::string::npos);
  EXPECT_NE(error_of([&] { kernels::cpu::linear_weight_from_tensors({mod, &wq}, 64, 128, false); })
                .find(mod + ".weight_scale: missing (expected F8_E4M3 [64, 8]"),
            std::string::npos);
  // Non-scalar weight_scale_2.
  const TensorView ws2_bad = view_of(DType::kF32, {2}, std::vector<float>{1, 2});
  EXPECT_NE(error_of([&] { kernels::cpu::linear_weight_from_tensors({mod, &wq, &ws, &ws2_bad}, 64, 128, false); })
                .find(mod + ".weight_scale_2: expected F32 [] (a scalar), found F32 [2]"),
            std::string::npos);
  // BF16 with the wrong shape (transposed).
  const TensorView wb_t = view_of(DType::kBF16, {128, 64}, bf);
  EXPECT_NE(error_of([&] { kernels::cpu::linear_weight_from_tensors({mod, &wb_t}, 64, 128, false); })
                .find(mod + ".weight: expected BF16 or F32 [64, 128] (or U8 [64, 64] NVFP4), found BF16 [128, 64]"),
            std::string::npos);
  // Missing bias, wrong bias shape.
  EXPECT_NE(error_of([&] { kernels::cpu::linear_weight_from_tensors({mod, &wb}, 64, 128, true); })
                .find(mod + ".bias: missing (expected BF16 or F32 [64])"),
            std::string::npos);
  std::vector<uint16_t> bias_data(65);
  const TensorView bias_bad = view_of(DType::kBF16, {65}, bias_data);
  EXPECT_NE(error_of([&] {
              kernels::cpu::linear_weight_from_tensors({mod, &wb, nullptr, nullptr, nullptr, &bias_bad}, 64, 128, true);
            }).find(mod + ".bias: expected BF16 or F32 [64], found BF16 [65]"),
            std::string::npos);
}

TEST(LoadLinear, FromTensorStore) {
  const auto dir = std::filesystem::temp_directory_path() /
                   ("fp4moe_test_linear_" + std::to_string(testing::test_seed()) + "_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  std::mt19937_64 rng(testing::test_seed() + 7);
  LinearWeight src = random_weight(WeightFormat::kNVFP4, 24, 64, false, rng);
  std::vector<uint16_t> bias(24);
  for (size_t i = 0; i < bias.size(); ++i) bias[i] = f32_to_bf16(0.5f * static_cast<float>(i));
  std::vector<uint16_t> dense(8 * 24, f32_to_bf16(-2.0f));
  format::SafetensorsWriter wr;
  const float gs = src.global_scale;
  wr.add("a.proj.weight", DType::kU8, {24, 32}, src.packed);
  wr.add("a.proj.weight_scale", DType::kF8_E4M3, {24, 4}, src.scales);
  wr.add("a.proj.weight_scale_2", DType::kF32, {}, std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(&gs), 4));
  wr.add("a.proj.bias", DType::kBF16, {24},
         std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(bias.data()), bias.size() * 2));
  wr.add("b.proj.weight", DType::kBF16, {8, 24},
         std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(dense.data()), dense.size() * 2));
  wr.write(dir / "model.safetensors");
  {
    format::TensorStore store(dir);
    LinearWeight a = moe::load_linear(store, "a.proj", 24, 64, true);
    EXPECT_EQ(a.format, WeightFormat::kNVFP4);
    EXPECT_EQ(a.packed, src.packed);
    EXPECT_EQ(a.scales, src.scales);
    EXPECT_EQ(a.global_scale, gs);
    EXPECT_FALSE(a.input_scale.has_value());
    ASSERT_EQ(a.bias.size(), 24u);
    EXPECT_EQ(a.bias[5], 2.5f);
    LinearWeight b = moe::load_linear(store, "b.proj", 8, 24);
    EXPECT_EQ(b.format, WeightFormat::kBF16);
    EXPECT_NE(error_of([&] { moe::load_linear(store, "c.proj", 8, 24); }).find("c.proj.weight: missing"),
              std::string::npos);
    EXPECT_NE(error_of([&] { moe::load_linear(store, "b.proj", 24, 8); })
                  .find("b.proj.weight: expected BF16 or F32 [24, 8]"),
              std::string::npos);
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace fp4moe
