// Element types fp4moe moves around, with their safetensors names and bit widths, and the
// bf16 <-> f32 conversions (bf16 = top 16 bits of an IEEE f32; f32 -> bf16 rounds to nearest even,
// NaN stays NaN). Tested by tests/core/test_dtype.cpp.
#pragma once

#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>

namespace fp4moe {

// The safetensors dtype set (huggingface/safetensors `Dtype`), in that enum's order.
enum class DType : uint8_t {
  kBool, kF4, kF6_E2M3, kF6_E3M2, kU8, kI8, kF8_E5M2, kF8_E4M3, kF8_E8M0, kF8_E4M3FNUZ,
  kF8_E5M2FNUZ, kI16, kU16, kF16, kBF16, kI32, kU32, kF32, kC64, kF64, kI64, kU64,
};

inline constexpr int kNumDTypes = 22;

// Bits per element (F4 = 4, F6_* = 6, ...).
int dtype_bits(DType t);
// The safetensors spelling, e.g. "F8_E4M3".
std::string_view dtype_name(DType t);
// Parses a safetensors dtype string; nullopt when unknown.
std::optional<DType> parse_dtype(std::string_view s);

inline float bf16_to_f32(uint16_t b) {
  uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline uint16_t f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7F800000u) == 0x7F800000u && (u & 0x007FFFFFu) != 0) {
    return static_cast<uint16_t>((u >> 16) | 0x0040u);  // quiet NaN, sign kept
  }
  uint32_t rounding = 0x7FFFu + ((u >> 16) & 1u);  // round to nearest, ties to even
  return static_cast<uint16_t>((u + rounding) >> 16);
}

}  // namespace fp4moe
