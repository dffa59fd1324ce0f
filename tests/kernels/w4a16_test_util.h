// Helpers shared by the W4A16 CPU tests (test_cuda_w4a16_host.cpp, test_cuda_w4a16_emulation_host.cpp,
// test_cuda_w4a16_configs_host.cpp): bf16x2 half access, random non-negative non-NaN e4m3 scales, random
// NVFP4 weights in the checkpoint layout, and the message of an expected fp4moe::Error.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "testing/testing.h"

namespace fp4moe::cuda::sm90::w4a16_test {

// The message of the fp4moe::Error `fn` throws (testing/testing.h).
using fp4moe::testing::error_of;

inline uint16_t half_bits(uint32_t pair, uint32_t half) {
  return static_cast<uint16_t>(half ? pair >> 16 : pair & 0xFFFFu);
}
inline float half_f32(uint32_t pair, uint32_t half) { return bf16_to_f32(half_bits(pair, half)); }
inline float lo_f32(uint32_t pair) { return half_f32(pair, 0); }
inline float hi_f32(uint32_t pair) { return half_f32(pair, 1); }

// Any non-negative, non-NaN e4m3fn code 0x00..0x7E (UE4M3, what w4a16_repack accepts); 0x00 (a
// zero block) comes 1 time in 127.
inline uint8_t random_scale(std::mt19937_64& rng) {
  for (;;) {
    const auto s = static_cast<uint8_t>(rng() & 0x7Fu);
    if (s != 0x7Fu) return s;
  }
}

struct Weights {
  int64_t n_experts = 0, n = 0, k = 0;
  std::vector<uint8_t> codes;   // checkpoint layout [E, N, K/2], low nibble = even k
  std::vector<uint8_t> scales;  // [E, N, K/16] e4m3fn
  uint32_t code(int64_t e, int64_t row, int64_t kk) const {
    const uint8_t b = codes[static_cast<size_t>((e * n + row) * (k / 2) + kk / 2)];
    return kk % 2 == 0 ? (b & 0xFu) : (b >> 4);
  }
  uint8_t scale(int64_t e, int64_t row, int64_t kk) const {
    return scales[static_cast<size_t>((e * n + row) * (k / 16) + kk / 16)];
  }
};

inline Weights random_weights(std::mt19937_64& rng, int64_t n_experts, int64_t n, int64_t k) {
  Weights w;
  w.n_experts = n_experts;
  w.n = n;
  w.k = k;
  w.codes.resize(static_cast<size_t>(n_experts * n * k / 2));
  w.scales.resize(static_cast<size_t>(n_experts * n * k / 16));
  for (uint8_t& c : w.codes) c = static_cast<uint8_t>(rng());
  for (uint8_t& s : w.scales) s = random_scale(rng);
  return w;
}

}  // namespace fp4moe::cuda::sm90::w4a16_test
