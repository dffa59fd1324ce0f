// DType table and bf16 conversions.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>

#include "core/dtype.h"
#include "testing/testing.h"

namespace fp4moe {
namespace {

TEST(DType, NamesRoundTripAndBits) {
  for (int i = 0; i < kNumDTypes; ++i) {
    auto t = static_cast<DType>(i);
    auto parsed = parse_dtype(dtype_name(t));
    ASSERT_TRUE(parsed.has_value()) << dtype_name(t);
    EXPECT_EQ(*parsed, t);
  }
  EXPECT_EQ(dtype_bits(DType::kF4), 4);
  EXPECT_EQ(dtype_bits(DType::kF6_E3M2), 6);
  EXPECT_EQ(dtype_bits(DType::kF8_E4M3), 8);
  EXPECT_EQ(dtype_bits(DType::kBF16), 16);
  EXPECT_EQ(dtype_bits(DType::kI64), 64);
  EXPECT_FALSE(parse_dtype("F8_E4M3FN").has_value());
  EXPECT_FALSE(parse_dtype("").has_value());
}

TEST(BF16, ExactValuesRoundTrip) {
  for (uint32_t b = 0; b < 0x10000; ++b) {
    float f = bf16_to_f32(static_cast<uint16_t>(b));
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(f))));
    } else {
      EXPECT_EQ(f32_to_bf16(f), b);
    }
  }
}

TEST(BF16, RoundsToNearestEven) {
  // 1 + 2^-8 is halfway between bf16 1.0 and 1.0078125: ties to even -> 1.0.
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(1.0f + 0x1p-8f)), 1.0f);
  // 1 + 3*2^-8 is halfway between 1.0078125 (odd) and 1.015625 (even) -> 1.015625.
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(1.0f + 3 * 0x1p-8f)), 1.015625f);
  EXPECT_TRUE(std::isinf(bf16_to_f32(f32_to_bf16(std::numeric_limits<float>::max()))));
  std::mt19937_64 rng(testing::test_seed());
  std::uniform_real_distribution<float> dist(-1e4f, 1e4f);
  for (int i = 0; i < 100000; ++i) {
    float x = dist(rng);
    float y = bf16_to_f32(f32_to_bf16(x));
    EXPECT_LE(std::fabs(x - y), std::fabs(x) * 0x1p-8f) << x;
  }
}

}  // namespace
}  // namespace fp4moe
