// NVFP4 numerics (src/format/nvfp4.h): the golden ModelOpt cases bit for bit
// (../shared/golden/nvfp4/*.safetensors), the e4m3 decode table, and property tests on fresh random
// data (round trips, ties to even, monotonicity, saturation, the quantization error bound, the
// 128x4 swizzle and its inverse). Run: test_nvfp4 (FP4MOE_TEST_SEED=<n> replays a seed).
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "core/error.h"
#include "format/nvfp4.h"
#include "format/safetensors.h"
#include "testing/testing.h"

namespace fp4moe::format {
namespace {

std::mt19937_64 make_rng(uint64_t salt) { return std::mt19937_64(testing::test_seed() ^ (salt * 0x9E3779B97F4A7C15ull)); }

uint32_t bits(float f) { return std::bit_cast<uint32_t>(f); }

// Expects a call to throw fp4moe::Error whose message contains every given fragment.
template <typename F>
void expect_error(F&& f, std::initializer_list<std::string> fragments) {
  try {
    f();
    ADD_FAILURE() << "expected fp4moe::Error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    for (const std::string& frag : fragments) {
      EXPECT_NE(msg.find(frag), std::string::npos) << "message lacks '" << frag << "': " << msg;
    }
  }
}

// ---------------------------------------------------------------------------------------------
// e2m1

constexpr float kE2M1Magnitudes[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};

TEST(E2M1, DecodeTable) {
  for (int c = 0; c < 16; ++c) {
    const float expected = (c & 8 ? -1.0f : 1.0f) * kE2M1Magnitudes[c & 7];
    EXPECT_EQ(e2m1_to_f32(static_cast<uint8_t>(c)), expected) << "code " << c;
  }
  // 0x8 decodes to +0 (ModelOpt's table); only the low nibble counts.
  EXPECT_EQ(bits(e2m1_to_f32(0x8)), bits(0.0f));
  EXPECT_EQ(e2m1_to_f32(0xF7), 6.0f);
}

TEST(E2M1, RoundTripAllCodes) {
  for (int c = 0; c < 16; ++c) {
    const uint8_t back = f32_to_e2m1(e2m1_to_f32(static_cast<uint8_t>(c)));
    EXPECT_EQ(back, c == 0x8 ? 0x0 : c) << "code " << c;  // +0 re-encodes as 0x0
  }
  // Sign rule: `x < 0`. -0.0f is not < 0 (code 0); a negative value rounding to 0 keeps the sign.
  EXPECT_EQ(f32_to_e2m1(-0.0f), 0x0);
  EXPECT_EQ(f32_to_e2m1(-0.1f), 0x8);
  EXPECT_EQ(f32_to_e2m1(-std::numeric_limits<float>::denorm_min()), 0x8);
}

TEST(E2M1, EveryMidpointTiesToEven) {
  for (int i = 0; i + 1 < 8; ++i) {
    const float lo = kE2M1Magnitudes[i];
    const float hi = kE2M1Magnitudes[i + 1];
    const float mid = 0.5f * (lo + hi);  // exact: at most 4 significant bits
    const int even = (i % 2 == 0) ? i : i + 1;  // the magnitude index with mantissa bit 0
    for (float sign : {1.0f, -1.0f}) {
      const uint8_t sbit = sign < 0 ? 0x8 : 0x0;
      EXPECT_EQ(f32_to_e2m1(sign * mid), even | sbit) << "tie " << sign * mid;
      EXPECT_EQ(f32_to_e2m1(sign * std::nextafter(mid, 0.0f)), i | sbit) << "below " << sign * mid;
      EXPECT_EQ(f32_to_e2m1(sign * std::nextafter(mid, 100.0f)), (i + 1) | sbit)
          << "above " << sign * mid;
    }
  }
  // Saturation at +-6 (the 5 tie above goes to 4, anything larger to 6), NaN -> +6.
  for (float v : {5.0001f, 6.0f, 7.0f, 1e30f, std::numeric_limits<float>::infinity()}) {
    EXPECT_EQ(f32_to_e2m1(v), 0x7) << v;
    EXPECT_EQ(f32_to_e2m1(-v), 0xF) << -v;
  }
  EXPECT_EQ(f32_to_e2m1(std::numeric_limits<float>::quiet_NaN()), 0x7);
}

TEST(E2M1, EncodeIsNearestAndMonotone) {
  auto rng = make_rng(1);
  std::uniform_real_distribution<float> dist(-7.0f, 7.0f);
  std::vector<float> xs(200000);
  for (float& x : xs) x = dist(rng);
  std::sort(xs.begin(), xs.end());
  float prev = -std::numeric_limits<float>::infinity();
  for (float x : xs) {
    const float q = e2m1_to_f32(f32_to_e2m1(x));
    ASSERT_GE(q, prev) << "encode not monotone at " << x;
    prev = q;
    // Nearest: no representable value is strictly closer (ties are checked above).
    const float a = std::min(std::fabs(x), 6.0f);
    for (float m : kE2M1Magnitudes) {
      ASSERT_LE(std::fabs(std::fabs(q) - a), std::fabs(m - a)) << "x=" << x << " got " << q;
    }
    ASSERT_TRUE(q == 0.0f || (q < 0) == (x < 0)) << "sign of " << x << " -> " << q;
  }
}

TEST(E2M1, PackUnpack) {
  auto rng = make_rng(2);
  std::vector<uint8_t> codes(2 * 1000);
  for (uint8_t& c : codes) c = static_cast<uint8_t>(rng() & 0xF);
  std::vector<uint8_t> packed(codes.size() / 2);
  e2m1_pack_codes(codes, packed);
  for (size_t j = 0; j < packed.size(); ++j) {
    ASSERT_EQ(packed[j] & 0xF, codes[2 * j]) << "low nibble = even element, byte " << j;
    ASSERT_EQ(packed[j] >> 4, codes[2 * j + 1]) << "high nibble = odd element, byte " << j;
  }
  for (size_t k = 0; k < codes.size(); ++k) {
    ASSERT_EQ(e2m1_code_at(packed.data(), static_cast<int64_t>(k)), codes[k]) << "k=" << k;
  }
  std::vector<uint8_t> back(codes.size());
  e2m1_unpack_codes(packed, back);
  EXPECT_EQ(back, codes);
  std::vector<uint8_t> odd(3), small(1);
  expect_error([&] { e2m1_pack_codes(odd, small); }, {"3 codes", "1 bytes"});
}

// ---------------------------------------------------------------------------------------------
// e4m3fn

// Independent decode from the OCP definition.
float e4m3_reference(int c) {
  const int s = c >> 7, e = (c >> 3) & 0xF, m = c & 7;
  if (e == 15 && m == 7) return std::numeric_limits<float>::quiet_NaN();
  const double v = e == 0 ? std::ldexp(m / 8.0, -6) : std::ldexp(1.0 + m / 8.0, e - 7);
  return static_cast<float>(s ? -v : v);
}

TEST(E4M3, DecodeMatchesGolden) {
  SafetensorsFile file(testing::shared_path("golden/nvfp4/e4m3_decode.safetensors"));
  const TensorView codes = file.view("codes");
  const TensorView values = file.view("values");
  ASSERT_EQ(codes.dtype, DType::kU8);
  ASSERT_EQ(values.dtype, DType::kF32);
  ASSERT_EQ(codes.numel(), 256);
  ASSERT_EQ(values.numel(), 256);
  for (int i = 0; i < 256; ++i) {
    const uint8_t code = codes.bytes[static_cast<size_t>(i)];
    float expected;
    std::memcpy(&expected, values.bytes.data() + 4 * i, 4);
    const float got = e4m3_to_f32(code);
    if (std::isnan(expected)) {
      EXPECT_TRUE(std::isnan(got)) << "code " << int(code);
      EXPECT_TRUE(code == 0x7F || code == 0xFF) << "NaN golden at code " << int(code);
    } else {
      EXPECT_EQ(bits(got), bits(expected)) << "code " << int(code) << ": " << got << " vs " << expected;
    }
    EXPECT_EQ(bits(kE4M3Values[code]), bits(got)) << "table entry " << int(code);
  }
}

TEST(E4M3, DecodeFormula) {
  for (int c = 0; c < 256; ++c) {
    const float ref = e4m3_reference(c);
    const float got = e4m3_to_f32(static_cast<uint8_t>(c));
    if (std::isnan(ref)) {
      EXPECT_TRUE(std::isnan(got)) << c;
    } else {
      EXPECT_EQ(bits(got), bits(ref)) << "code " << c;
    }
  }
  EXPECT_EQ(e4m3_to_f32(0x7E), 448.0f);
  EXPECT_EQ(e4m3_to_f32(0x01), kE4M3MinScale);
  EXPECT_EQ(e4m3_to_f32(kE4M3One), 1.0f);
  static_assert(e4m3_to_f32(0x7E) == 448.0f && e4m3_to_f32(0x08) == 0.015625f);
}

TEST(E4M3, EncodeRoundTripsEveryFiniteCode) {
  for (int c = 0; c < 256; ++c) {
    if ((c & 0x7F) == 0x7F) continue;
    EXPECT_EQ(f32_to_e4m3(e4m3_to_f32(static_cast<uint8_t>(c))), c) << "code " << c;
  }
  EXPECT_EQ(f32_to_e4m3(std::numeric_limits<float>::quiet_NaN()), kE4M3NaN);
  EXPECT_EQ(f32_to_e4m3(-std::numeric_limits<float>::quiet_NaN()), kE4M3NaN);
}

TEST(E4M3, TiesToEvenBetweenNeighbours) {
  // Positive codes are ordered by value; neighbours differ by one code, so exactly one of each
  // pair has mantissa LSB 0 (the even one), including 0x07 | 0x08 across the subnormal boundary.
  for (int c = 0; c + 1 <= 0x7E; ++c) {
    const float lo = e4m3_to_f32(static_cast<uint8_t>(c));
    const float hi = e4m3_to_f32(static_cast<uint8_t>(c + 1));
    const float mid = 0.5f * (lo + hi);  // exact in f32
    const int even = (c % 2 == 0) ? c : c + 1;
    for (int sign : {0, 0x80}) {
      const float s = sign ? -1.0f : 1.0f;
      EXPECT_EQ(f32_to_e4m3(s * mid), even | sign) << "tie " << s * mid;
      EXPECT_EQ(f32_to_e4m3(s * std::nextafter(mid, 0.0f)), c | sign) << "below " << s * mid;
      EXPECT_EQ(f32_to_e4m3(s * std::nextafter(mid, 1000.0f)), (c + 1) | sign)
          << "above " << s * mid;
    }
  }
}

TEST(E4M3, SaturatesLikeSatfinite) {
  for (float v : {448.0f, 449.0f, 464.0f, 465.0f, 480.0f, 1e6f, 3e38f,
                  std::numeric_limits<float>::infinity()}) {
    EXPECT_EQ(f32_to_e4m3(v), 0x7E) << v;
    EXPECT_EQ(f32_to_e4m3(-v), 0xFE) << -v;
  }
  EXPECT_EQ(f32_to_e4m3(0.0f), 0x00);
  EXPECT_EQ(f32_to_e4m3(-0.0f), 0x80);
  EXPECT_EQ(f32_to_e4m3(std::ldexp(1.0f, -10)), 0x00);  // tie between 0 and 2^-9 -> 0 (even)
  EXPECT_EQ(f32_to_e4m3(std::nextafter(std::ldexp(1.0f, -10), 1.0f)), 0x01);
  EXPECT_EQ(f32_to_e4m3(-std::ldexp(1.0f, -11)), 0x80);
  EXPECT_EQ(f32_to_e4m3(std::numeric_limits<float>::denorm_min()), 0x00);
}

TEST(E4M3, EncodeIsNearestRandom) {
  auto rng = make_rng(3);
  std::uniform_real_distribution<float> exponent(-13.0f, 9.5f);
  std::vector<float> finite;
  for (int c = 0; c <= 0x7E; ++c) finite.push_back(e4m3_to_f32(static_cast<uint8_t>(c)));
  for (int i = 0; i < 100000; ++i) {
    const float x = std::exp2(exponent(rng));
    const uint8_t code = f32_to_e4m3(x);
    ASSERT_LE(code, 0x7E) << x;
    if (x >= 448.0f) {
      ASSERT_EQ(code, 0x7E) << x;
      continue;
    }
    const double err = std::fabs(static_cast<double>(finite[code]) - x);
    for (float v : finite) {
      ASSERT_LE(err, std::fabs(static_cast<double>(v) - x)) << "x=" << x << " -> " << finite[code];
    }
    ASSERT_EQ(f32_to_e4m3(-x), code | 0x80) << -x;
  }
}

// ---------------------------------------------------------------------------------------------
// Golden ModelOpt quantization cases

template <typename T>
std::vector<T> read_tensor(const SafetensorsFile& file, const std::string& name, DType dtype) {
  const TensorView v = file.view(name);
  EXPECT_EQ(v.dtype, dtype) << name;
  std::vector<T> out(v.bytes.size() / sizeof(T));
  std::memcpy(out.data(), v.bytes.data(), out.size() * sizeof(T));
  return out;
}

class GoldenQuant : public ::testing::TestWithParam<std::string> {};

TEST_P(GoldenQuant, ReproducesModelOptBitForBit) {
  const std::string c = GetParam();
  SafetensorsFile file(testing::shared_path("golden/nvfp4/quant_cases.safetensors"));
  const TensorView input_view = file.view(c + ".input");
  ASSERT_EQ(input_view.rank(), 2);
  const int64_t n = input_view.dim(0), k = input_view.dim(1);
  const auto input = read_tensor<float>(file, c + ".input", DType::kF32);
  const auto weight = read_tensor<uint8_t>(file, c + ".weight", DType::kU8);
  const auto scales = read_tensor<uint8_t>(file, c + ".weight_scale", DType::kF8_E4M3);
  const auto scale_2 = read_tensor<float>(file, c + ".weight_scale_2", DType::kF32);
  const auto dequant = read_tensor<float>(file, c + ".dequant", DType::kF32);
  const auto swizzled = read_tensor<uint8_t>(file, c + ".weight_scale_swizzled", DType::kU8);
  ASSERT_EQ(scale_2.size(), 1u);

  const Nvfp4Matrix q = nvfp4_quantize(input, n, k);
  EXPECT_EQ(bits(q.global_scale), bits(scale_2[0]))
      << c << ": global scale " << q.global_scale << " vs " << scale_2[0];
  ASSERT_EQ(q.scales.size(), scales.size());
  ASSERT_EQ(q.packed.size(), weight.size());
  const int64_t kb = k / 16;
  int scale_mismatches = 0, code_mismatches = 0;
  for (size_t i = 0; i < scales.size(); ++i) {
    if (q.scales[i] != scales[i] && scale_mismatches++ < 5) {
      ADD_FAILURE() << c << " [N=" << n << ", K=" << k << "]: scale [" << i / kb << ", " << i % kb
                    << "] = 0x" << std::hex << int(q.scales[i]) << " vs golden 0x" << int(scales[i]);
    }
  }
  for (size_t i = 0; i < weight.size(); ++i) {
    if (q.packed[i] != weight[i] && code_mismatches++ < 5) {
      const size_t row = i / static_cast<size_t>(k / 2), col = 2 * (i % static_cast<size_t>(k / 2));
      ADD_FAILURE() << c << " [N=" << n << ", K=" << k << "]: codes at [" << row << ", " << col
                    << ".." << col + 1 << "] = 0x" << std::hex << int(q.packed[i]) << " vs golden 0x"
                    << int(weight[i]) << std::dec << " (inputs " << input[row * k + col] << ", "
                    << input[row * k + col + 1] << ")";
    }
  }
  EXPECT_EQ(scale_mismatches, 0) << c;
  EXPECT_EQ(code_mismatches, 0) << c;

  // Dequantization of the golden tensors, through the checkpoint view, matches bit for bit.
  const Nvfp4View golden_view = nvfp4_view(file.view(c + ".weight"), file.view(c + ".weight_scale"),
                                           file.view(c + ".weight_scale_2"), c);
  const std::vector<float> deq = nvfp4_dequantize(golden_view);
  ASSERT_EQ(deq.size(), dequant.size());
  int deq_mismatches = 0;
  for (size_t i = 0; i < deq.size(); ++i) {
    if (bits(deq[i]) != bits(dequant[i]) && deq_mismatches++ < 5) {
      ADD_FAILURE() << c << ": dequant [" << i / k << ", " << i % k << "] = " << deq[i]
                    << " vs golden " << dequant[i];
    }
  }
  EXPECT_EQ(deq_mismatches, 0) << c;

  // Swizzle and its inverse.
  const std::vector<uint8_t> sw = swizzle_scales_128x4(scales, n, kb);
  EXPECT_EQ(sw, swizzled) << c << ": 128x4 swizzle of [" << n << ", " << kb << "]";
  EXPECT_EQ(unswizzle_scales_128x4(swizzled, n, kb), scales) << c;

  // The TensorView entry point agrees; BF16-representable inputs give the same through bf16.
  const Nvfp4Matrix qv = nvfp4_quantize(input_view);
  EXPECT_EQ(qv.packed, q.packed);
  EXPECT_EQ(qv.scales, q.scales);
  std::vector<uint16_t> as_bf16(input.size());
  bool bf16_exact = true;
  for (size_t i = 0; i < input.size(); ++i) {
    as_bf16[i] = f32_to_bf16(input[i]);
    bf16_exact = bf16_exact && bits(bf16_to_f32(as_bf16[i])) == bits(input[i]);
  }
  if (c == "bf16_weights") {
    EXPECT_TRUE(bf16_exact) << "bf16_weights input is not bf16-exact";
  }
  if (bf16_exact) {
    const Nvfp4Matrix qb = nvfp4_quantize_bf16(as_bf16, n, k);
    EXPECT_EQ(bits(qb.global_scale), bits(scale_2[0]));
    EXPECT_EQ(qb.packed, weight) << c << " via bf16";
    EXPECT_EQ(qb.scales, scales) << c << " via bf16";
  }
}

INSTANTIATE_TEST_SUITE_P(Nvfp4, GoldenQuant,
                         ::testing::Values("normal", "outliers", "zero_blocks", "tiny", "huge",
                                           "ragged_rows", "ties", "bf16_weights"),
                         [](const ::testing::TestParamInfo<std::string>& info) { return info.param; });

// ---------------------------------------------------------------------------------------------
// Quantization properties on random data

// A random [n, k] matrix: per-row magnitudes over 2^-24..2^8 (so some blocks are tiny next to
// the global amax and get subnormal or clamped scales), zero blocks, -0.0, exact zeros, outliers.
std::vector<float> random_matrix(std::mt19937_64& rng, int64_t n, int64_t k) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> exponent(-24.0f, 8.0f);
  std::uniform_real_distribution<float> u01(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(n * k));
  for (int64_t r = 0; r < n; ++r) {
    const float row_mag = std::exp2(exponent(rng));
    for (int64_t b = 0; b < k / 16; ++b) {
      const float p = u01(rng);
      const float block_mag = row_mag * (p < 0.1f ? std::exp2(-12.0f * u01(rng)) : 1.0f);
      for (int i = 0; i < 16; ++i) {
        float v = normal(rng) * block_mag;
        const float e = u01(rng);
        if (p > 0.95f) v = (e < 0.5f) ? 0.0f : -0.0f;  // all-zero block
        else if (e < 0.02f) v = 0.0f;
        else if (e < 0.03f) v *= 100.0f;  // outlier
        x[static_cast<size_t>(r * k + b * 16 + i)] = v;
      }
    }
  }
  return x;
}

// Error bound, per element, with D = f32(block scale) * global scale and y = x / D:
//   the code is RNE(y) saturated at +-6, so in code units the error is |y| - 6 when |y| > 6 and
//   otherwise at most half the e2m1 spacing at |y|: 0.25 below 2, 0.5 in [2, 4), 1 in [4, 6].
//   Times D; plus f32 rounding of D, of y and of code * D: (|x| + |w|) * 2^-22, and 2^-149 for
//   results in the f32 subnormal range.
// When the ideal scale S = block_amax / (6 * global) is in e4m3's normal range (>= 2^-6), the
// rounded scale is within S/16 of it, so |y| <= 6 * 16/15 = 6.4 and the error is at most
// one code unit: |x - w| <= D <= (17/16) * block_amax / 6 (checked as a second, coarser bound).
// (Below 2^-6 the e4m3 step 2^-9 is coarse relative to S, and |y| can reach 9: the first
// bound still holds there.)
double code_error_bound(double y) {
  const double a = std::fabs(y);
  if (a > 6.0) return a - 6.0;
  return a < 2.0 ? 0.25 : a < 4.0 ? 0.5 : 1.0;
}

void check_quantization(const std::vector<float>& x, int64_t n, int64_t k, const Nvfp4Matrix& q,
                        const std::string& what) {
  const std::vector<float> w = nvfp4_dequantize(q.view());
  const double gs = q.global_scale;
  int failures = 0;
  for (int64_t r = 0; r < n && failures < 5; ++r) {
    for (int64_t b = 0; b < k / 16 && failures < 5; ++b) {
      const size_t base = static_cast<size_t>(r * k + b * 16);
      double block_amax = 0;
      for (int i = 0; i < 16; ++i) block_amax = std::max(block_amax, std::fabs(double(x[base + i])));
      const uint8_t code = q.scales[static_cast<size_t>(r * (k / 16) + b)];
      const double s = e4m3_to_f32(code);
      if (block_amax == 0) {
        EXPECT_EQ(code, kE4M3One) << what << ": all-zero block [" << r << ", " << b << "]";
        for (int i = 0; i < 16; ++i) EXPECT_EQ(w[base + i], 0.0f);
        continue;
      }
      // The scale is an e4m3 neighbour of the clamped ideal scale, the nearer one (f32 slack).
      const double ideal = std::clamp(block_amax / (6.0 * gs), double(kE4M3MinScale), 448.0);
      const double below = e4m3_to_f32(static_cast<uint8_t>(std::max(int(code) - 1, 0)));
      const double above = code < 0x7E ? e4m3_to_f32(static_cast<uint8_t>(code + 1)) : 448.0;
      const bool nearest = std::fabs(s - ideal) <= 0.5 * std::max(s - below, above - s) + 1e-6 * ideal &&
                           ideal >= below && ideal <= above;
      if (!nearest) {
        ++failures;
        ADD_FAILURE() << what << ": block [" << r << ", " << b << "] scale " << s
                      << " is not the e4m3 rounding of " << ideal;
      }
      const double d = s * gs;
      const bool normal_range = ideal >= std::ldexp(1.0, -6);
      for (int i = 0; i < 16; ++i) {
        const double xi = x[base + i], wi = w[base + i];
        const double err = std::fabs(xi - wi);
        const double bound = code_error_bound(xi / d) * d + (std::fabs(xi) + std::fabs(wi)) * 0x1p-22 +
                             0x1p-149;
        const double coarse = (17.0 / 16.0) * block_amax / 6.0 * (1 + 0x1p-20) + 0x1p-149;
        if (err > bound || (normal_range && err > coarse)) {
          ++failures;
          ADD_FAILURE() << what << " [N=" << n << ", K=" << k << "]: element [" << r << ", "
                        << b * 16 + i << "] x=" << xi << " dequant=" << wi << " err=" << err
                        << " bound=" << bound << " coarse=" << coarse << " scale=" << s
                        << " global=" << gs;
          break;
        }
      }
    }
  }
}

TEST(Nvfp4Quantize, ErrorBoundOnRandomMatrices) {
  auto rng = make_rng(4);
  for (int trial = 0; trial < 40; ++trial) {
    const int64_t n = 1 + static_cast<int64_t>(rng() % 64);
    const int64_t k = 16 * (1 + static_cast<int64_t>(rng() % 24));
    const std::vector<float> x = random_matrix(rng, n, k);
    const Nvfp4Matrix q = nvfp4_quantize(x, n, k);
    EXPECT_EQ(bits(q.global_scale), bits(nvfp4_global_scale(x) == 0 ? 1.0f : nvfp4_global_scale(x)));
    check_quantization(x, n, k, q, "trial " + std::to_string(trial));
  }
}

TEST(Nvfp4Quantize, SharedGlobalScale) {
  auto rng = make_rng(5);
  const int64_t n = 48, k = 128;
  const std::vector<float> a = random_matrix(rng, n, k);
  std::vector<float> b = random_matrix(rng, n, k);
  for (float& v : b) v *= 3.0f;
  std::vector<float> both(a);
  both.insert(both.end(), b.begin(), b.end());
  // max of the members' global scales == global scale of the whole group, bit for bit.
  const float shared = std::max(nvfp4_global_scale(a), nvfp4_global_scale(b));
  EXPECT_EQ(bits(shared), bits(nvfp4_global_scale(both)));
  const Nvfp4Matrix qa = nvfp4_quantize(a, n, k, shared);
  const Nvfp4Matrix qb = nvfp4_quantize(b, n, k, shared);
  EXPECT_EQ(bits(qa.global_scale), bits(shared));
  const Nvfp4Matrix qboth = nvfp4_quantize(both, 2 * n, k);
  // Quantizing the stacked group equals quantizing each member with the shared scale.
  std::vector<uint8_t> packed(qa.packed), scales(qa.scales);
  packed.insert(packed.end(), qb.packed.begin(), qb.packed.end());
  scales.insert(scales.end(), qb.scales.begin(), qb.scales.end());
  EXPECT_EQ(packed, qboth.packed);
  EXPECT_EQ(scales, qboth.scales);
  check_quantization(a, n, k, qa, "shared-scale member a");
  check_quantization(b, n, k, qb, "shared-scale member b");
  // The computed-scale overload is the given-scale one with amax / 2688.
  const Nvfp4Matrix own = nvfp4_quantize(a, n, k);
  const Nvfp4Matrix given = nvfp4_quantize(a, n, k, nvfp4_global_scale(a));
  EXPECT_EQ(own.packed, given.packed);
  EXPECT_EQ(own.scales, given.scales);
}

TEST(Nvfp4Quantize, Bf16InputMatchesF32) {
  auto rng = make_rng(6);
  const int64_t n = 33, k = 96;
  std::vector<float> x = random_matrix(rng, n, k);
  std::vector<uint16_t> h(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    h[i] = f32_to_bf16(x[i]);
    x[i] = bf16_to_f32(h[i]);
  }
  const Nvfp4Matrix qf = nvfp4_quantize(x, n, k);
  const Nvfp4Matrix qh = nvfp4_quantize_bf16(h, n, k);
  EXPECT_EQ(bits(qf.global_scale), bits(qh.global_scale));
  EXPECT_EQ(qf.packed, qh.packed);
  EXPECT_EQ(qf.scales, qh.scales);
  const TensorView view{DType::kBF16, {n, k}, {reinterpret_cast<const uint8_t*>(h.data()), h.size() * 2}};
  const Nvfp4Matrix qv = nvfp4_quantize(view);
  EXPECT_EQ(qv.packed, qf.packed);
  EXPECT_EQ(qv.scales, qf.scales);
  const Nvfp4Matrix qhs = nvfp4_quantize_bf16(h, n, k, 0.5f);
  const Nvfp4Matrix qfs = nvfp4_quantize(x, n, k, 0.5f);
  EXPECT_EQ(qhs.packed, qfs.packed);
  EXPECT_EQ(qhs.scales, qfs.scales);
}

TEST(Nvfp4Quantize, AllZeroMatrix) {
  const std::vector<float> x(4 * 32, 0.0f);
  const Nvfp4Matrix q = nvfp4_quantize(x, 4, 32);
  EXPECT_EQ(q.global_scale, 1.0f);
  for (uint8_t s : q.scales) EXPECT_EQ(s, kE4M3One);
  for (uint8_t p : q.packed) EXPECT_EQ(p, 0);
  for (float v : nvfp4_dequantize(q.view())) EXPECT_EQ(bits(v), bits(0.0f));
}

TEST(Nvfp4Quantize, RejectsBadInput) {
  const std::vector<float> x(3 * 40, 1.0f);
  expect_error([&] { nvfp4_quantize(x, 3, 40); }, {"N=3", "K=40", "multiple"});
  expect_error([&] { nvfp4_quantize(x, 4, 32); }, {"120 elements", "N=4", "K=32"});
  std::vector<float> y(2 * 32, 1.0f);
  y[37] = std::numeric_limits<float>::quiet_NaN();
  expect_error([&] { nvfp4_quantize(y, 2, 32, 1.0f); }, {"non-finite", "[1, 5]"});
  expect_error([&] { nvfp4_quantize(y, 2, 32); }, {"non-finite", "[1, 5] of [2, 32]"});
  expect_error([&] { nvfp4_global_scale(y); }, {"non-finite", "flat index 37"});
  const std::vector<float> z(2 * 32, 1.0f);
  for (float bad : {0.0f, -1.0f, std::numeric_limits<float>::infinity(), 1e-40f}) {
    expect_error([&] { nvfp4_quantize(z, 2, 32, bad); }, {"global scale"});
  }
  const std::vector<int64_t> ints(32);
  const TensorView iv{DType::kI64, {1, 32}, {reinterpret_cast<const uint8_t*>(ints.data()), 256}};
  expect_error([&] { nvfp4_quantize(iv); }, {"I64", "[1, 32]"});
  const TensorView rank1{DType::kF32, {32}, {reinterpret_cast<const uint8_t*>(z.data()), 128}};
  expect_error([&] { nvfp4_quantize(rank1); }, {"rank 2", "[32]"});
}

TEST(Nvfp4View, FromCheckpointTensors) {
  const std::vector<uint8_t> packed(4 * 16, 0x21), scales(4 * 2, kE4M3One);
  const float gs = 0.5f;
  const TensorView w{DType::kU8, {4, 16}, packed};
  const TensorView s{DType::kF8_E4M3, {4, 2}, scales};
  const TensorView g{DType::kF32, {}, {reinterpret_cast<const uint8_t*>(&gs), 4}};
  const Nvfp4View v = nvfp4_view(w, s, g, "layers.0.mlp.up_proj");
  EXPECT_EQ(v.n_rows, 4);
  EXPECT_EQ(v.n_cols, 32);
  EXPECT_EQ(v.global_scale, 0.5f);
  const std::vector<float> deq = nvfp4_dequantize(v);
  EXPECT_EQ(deq[0], 0.25f);  // low nibble 1 -> 0.5 * 0.5, element 0
  EXPECT_EQ(deq[1], 0.5f);   // high nibble 2 -> 1.0 * 0.5, element 1
  const TensorView s_bad{DType::kF8_E4M3, {4, 3}, scales};
  expect_error([&] { nvfp4_view(w, s_bad, g, "layers.0.mlp.up_proj"); },
               {"layers.0.mlp.up_proj.weight_scale", "[4, 2]", "[4, 3]"});
  const TensorView s_u8{DType::kU8, {4, 2}, scales};
  expect_error([&] { nvfp4_view(w, s_u8, g, "m"); }, {"m.weight_scale", "U8"});
  const TensorView g_bad{DType::kBF16, {}, {reinterpret_cast<const uint8_t*>(&gs), 2}};
  expect_error([&] { nvfp4_view(w, s, g_bad, "m"); }, {"m.weight_scale_2", "BF16"});
  const TensorView w_bad{DType::kU8, {4, 12}, packed};
  expect_error([&] { nvfp4_view(w_bad, s, g, "m"); }, {"m.weight", "K=24"});
}

// ---------------------------------------------------------------------------------------------
// 128x4 swizzle

// The vLLM formulation: view padded [Mp, Kp] as [Mp/128, 4, 32, Kp/4, 4] and permute to
// [Mp/128, Kp/4, 32, 4, 4]; the flat index in the permuted tensor is the offset.
int64_t permuted_index(int64_t m, int64_t k, int64_t cols) {
  const int64_t kt_count = (cols + 3) / 4;
  const int64_t mt = m / 128, r4 = (m % 128) / 32, r32 = m % 32, kt = k / 4, k4 = k % 4;
  return (((mt * kt_count + kt) * 32 + r32) * 4 + r4) * 4 + k4;
}

std::vector<std::pair<int64_t, int64_t>> ragged_shapes(std::mt19937_64& rng) {
  std::vector<std::pair<int64_t, int64_t>> shapes = {
      {1, 1}, {1, 4}, {127, 3}, {128, 4}, {129, 5}, {200, 3}, {256, 8}, {300, 17}, {2048, 384}};
  for (int i = 0; i < 6; ++i) {
    shapes.emplace_back(1 + static_cast<int64_t>(rng() % 700), 1 + static_cast<int64_t>(rng() % 40));
  }
  return shapes;
}

TEST(Swizzle, OffsetIsABijectionOntoThePaddedBuffer) {
  auto rng = make_rng(7);
  for (auto [rows, cols] : ragged_shapes(rng)) {
    const int64_t mp = swizzle_padded_rows(rows), kp = swizzle_padded_cols(cols);
    ASSERT_EQ(swizzled_scale_bytes(rows, cols), mp * kp);
    std::vector<uint8_t> seen(static_cast<size_t>(mp * kp), 0);
    for (int64_t m = 0; m < mp; ++m) {
      for (int64_t k = 0; k < kp; ++k) {
        const int64_t off = swizzled_scale_offset(m, k, cols);
        ASSERT_EQ(off, permuted_index(m, k, cols)) << "[" << m << ", " << k << "] of " << rows << "x" << cols;
        ASSERT_GE(off, 0);
        ASSERT_LT(off, mp * kp);
        ASSERT_EQ(seen[static_cast<size_t>(off)]++, 0) << "offset " << off << " hit twice";
      }
    }
  }
  // Spec §3 numbers: 512 B per 128x4 tile, row 32 lands 4 bytes in, row 1 lands 16 bytes in.
  static_assert(swizzled_scale_offset(32, 0, 4) == 4 && swizzled_scale_offset(1, 0, 4) == 16);
  static_assert(swizzled_scale_offset(0, 4, 8) == 512 && swizzled_scale_offset(128, 0, 8) == 1024);
}

TEST(Swizzle, RoundTripOnRaggedShapes) {
  auto rng = make_rng(8);
  for (auto [rows, cols] : ragged_shapes(rng)) {
    std::vector<uint8_t> scales(static_cast<size_t>(rows * cols));
    for (uint8_t& s : scales) s = static_cast<uint8_t>(1 + rng() % 0x7E);  // never 0: padding shows
    const std::vector<uint8_t> sw = swizzle_scales_128x4(scales, rows, cols);
    ASSERT_EQ(static_cast<int64_t>(sw.size()), swizzled_scale_bytes(rows, cols));
    const auto n_zero = std::count(sw.begin(), sw.end(), uint8_t{0});
    EXPECT_EQ(n_zero, static_cast<std::ptrdiff_t>(sw.size() - scales.size()))
        << rows << "x" << cols << ": padding must be zero and every scale placed once";
    EXPECT_EQ(unswizzle_scales_128x4(sw, rows, cols), scales) << rows << "x" << cols;
  }
}

TEST(Swizzle, RejectsWrongSizes) {
  const std::vector<uint8_t> scales(10);
  expect_error([&] { swizzle_scales_128x4(scales, 3, 4); }, {"10 scales", "[3, 4]"});
  expect_error([&] { unswizzle_scales_128x4(scales, 3, 4); }, {"10 bytes", "[3, 4]", "512"});
}

}  // namespace
}  // namespace fp4moe::format
