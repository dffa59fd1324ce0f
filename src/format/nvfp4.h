// NVFP4 numerics: e2m1 (FP4) and e4m3fn (FP8) encode/decode, nibble packing, ModelOpt block
// quantization (two-level scales), dequantization and the 128x4 swizzled scale layout.
// Facts and sources: ../shared/spec/nvfp4-and-glm.md §0, §1, §3.
//
// The scalar conversions and the swizzle offset are `constexpr` / FP4MOE_HOST_DEVICE so that CUDA
// kernels use the very same definitions as the CPU reference (src/kernels/cuda/nvfp4_dequant.cu).
// Tested by tests/format/test_nvfp4.cpp (golden ModelOpt cases bit for bit, plus property tests).
#pragma once

#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/tensor.h"

#ifndef FP4MOE_HOST_DEVICE
#if defined(__CUDACC__)
#define FP4MOE_HOST_DEVICE __host__ __device__
#else
#define FP4MOE_HOST_DEVICE
#endif
#endif

namespace fp4moe::format {

inline constexpr int kNvfp4BlockSize = 16;        // elements along K per e4m3 block scale
inline constexpr float kE2M1Max = 6.0f;           // largest e2m1 magnitude
inline constexpr float kE4M3Max = 448.0f;         // largest finite e4m3fn (code 0x7E)
inline constexpr float kE4M3MinScale = 0.001953125f;  // 2^-9, smallest e4m3 subnormal (ModelOpt clamp)
inline constexpr uint8_t kE4M3NaN = 0x7F;         // canonical NaN code (0xFF is the other one)
inline constexpr uint8_t kE4M3One = 0x38;         // 1.0f: the scale of an all-zero block

// ---------------------------------------------------------------------------------------------
// e2m1 (FP4): sign bit 3, exponent bits 2:1 (bias 1), mantissa bit 0; no Inf/NaN.
// Magnitudes {0, 0.5, 1, 1.5, 2, 3, 4, 6}.

// Decodes the low 4 bits of `code`. Code 0x8 ("-0") decodes to +0.0f, as ModelOpt's
// `e2m1_values` table does (the golden dequant has +0 there; -0 == +0 numerically anyway).
constexpr FP4MOE_HOST_DEVICE float e2m1_to_f32(uint8_t code) {
  const int mag = code & 0x7;
  const int exp = mag >> 1;
  const int man = mag & 1;
  // exp 0: 0 or 0.5 (subnormal); else (2 + man) * 2^(exp-1) / 2
  const float v = exp == 0 ? 0.5f * static_cast<float>(man)
                           : 0.5f * static_cast<float>((2 + man) << (exp - 1));
  return (code & 0x8) != 0 && mag != 0 ? -v : v;
}

// Rounds to the nearest e2m1 value, ties to even, saturating at +-6 (ModelOpt `_cast_fp4`; the
// same intervals as PTX cvt.rn.satfinite.e2m1x2.f32). The sign is `x < 0`: a negative value that
// rounds to 0 gives 0x8, while -0.0f itself gives 0x0 (ModelOpt, and the golden data, do this).
// NaN gives 0x7 (+6), as ModelOpt's searchsorted does.
constexpr FP4MOE_HOST_DEVICE uint8_t f32_to_e2m1(float x) {
  const float a = x < 0 ? -x : x;
  uint8_t mag;
  if (a <= 0.25f) {
    mag = 0;  // [0, 0.25] -> 0 (0.25 ties to even 0)
  } else if (a < 0.75f) {
    mag = 1;  // 0.5
  } else if (a <= 1.25f) {
    mag = 2;  // 1.0 (0.75 and 1.25 tie to even 1.0)
  } else if (a < 1.75f) {
    mag = 3;  // 1.5
  } else if (a <= 2.5f) {
    mag = 4;  // 2.0 (1.75 and 2.5 tie to 2.0)
  } else if (a < 3.5f) {
    mag = 5;  // 3.0
  } else if (a <= 5.0f) {
    mag = 6;  // 4.0 (3.5 and 5 tie to 4.0)
  } else {
    mag = 7;  // 6.0; everything above 5 saturates, NaN lands here too (all comparisons false)
  }
  return static_cast<uint8_t>(mag | (x < 0 ? 0x8 : 0x0));
}

// Packing: byte j of a row holds element 2j in the low nibble and element 2j+1 in the high one.
constexpr FP4MOE_HOST_DEVICE uint8_t e2m1_pack(uint8_t even, uint8_t odd) {
  return static_cast<uint8_t>((even & 0xF) | ((odd & 0xF) << 4));
}
// The code of element k of a packed row.
constexpr FP4MOE_HOST_DEVICE uint8_t e2m1_code_at(const uint8_t* packed_row, int64_t k) {
  const uint8_t b = packed_row[k >> 1];
  return (k & 1) != 0 ? static_cast<uint8_t>(b >> 4) : static_cast<uint8_t>(b & 0xF);
}

// codes (one per byte, low 4 bits) [n] -> packed [n/2]; n must be even.
void e2m1_pack_codes(std::span<const uint8_t> codes, std::span<uint8_t> packed);
// packed [n/2] -> codes [n]
void e2m1_unpack_codes(std::span<const uint8_t> packed, std::span<uint8_t> codes);

// ---------------------------------------------------------------------------------------------
// e4m3fn (OCP FP8): sign bit 7, exponent bits 6:3 (bias 7), mantissa bits 2:0. No Inf;
// 0x7F / 0xFF are NaN; largest finite 448 (0x7E); smallest subnormal 2^-9.

constexpr FP4MOE_HOST_DEVICE float e4m3_to_f32(uint8_t code) {
  const int exp = (code >> 3) & 0xF;
  const int man = code & 0x7;
  if (exp == 0xF && man == 0x7) return std::numeric_limits<float>::quiet_NaN();
  // Both branches are exact in f32: subnormal man * 2^-9, normal (8 + man) * 2^(exp-10).
  const float v = exp == 0 ? static_cast<float>(man) * 0.001953125f
                           : static_cast<float>((8 + man) << exp) * 0.0009765625f;
  return (code & 0x80) != 0 ? -v : v;
}

// All 256 decoded codes, for table lookups on the host.
inline constexpr std::array<float, 256> kE4M3Values = [] {
  std::array<float, 256> t{};
  for (int i = 0; i < 256; ++i) t[static_cast<size_t>(i)] = e4m3_to_f32(static_cast<uint8_t>(i));
  return t;
}();

namespace detail {
FP4MOE_HOST_DEVICE inline uint32_t f32_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
#endif
}
}  // namespace detail

// Rounds to the nearest e4m3fn value, ties to even, saturating to +-448 like CUDA's
// __nv_fp8_e4m3(float) (__NV_SATFINITE): anything above 448 in magnitude, Inf included, gives
// 448 with the sign kept. NaN gives 0x7F. The sign of zero is kept (-0.0f -> 0x80).
FP4MOE_HOST_DEVICE inline uint8_t f32_to_e4m3(float x) {
  const uint32_t u = detail::f32_bits(x);
  const uint8_t sign = static_cast<uint8_t>((u >> 24) & 0x80);
  const uint32_t abs_bits = u & 0x7FFFFFFFu;
  if (abs_bits > 0x7F800000u) return kE4M3NaN;
  if (abs_bits >= 0x43E00000u) return static_cast<uint8_t>(sign | 0x7E);  // |x| >= 448 (Inf too)
  const int f32_exp = static_cast<int>(abs_bits >> 23) - 127;
  if (f32_exp < -6) {
    // Below the smallest normal 2^-6: subnormal step 2^-9. |x| * 512 is exact (power-of-two
    // scale of a value far from overflow); round it to an integer 0..8, ties to even. 8 becomes
    // the code 0x08 = 2^-6, the smallest normal, so the carry is free.
    const float q = (x < 0 ? -x : x) * 512.0f;
    uint32_t n = static_cast<uint32_t>(q);  // truncation, q < 8
    const float frac = q - static_cast<float>(n);  // exact
    if (frac > 0.5f || (frac == 0.5f && (n & 1u) != 0)) ++n;
    return static_cast<uint8_t>(sign | n);
  }
  // Normal: keep 3 of the 23 mantissa bits, rounding the other 20 to nearest even; a mantissa
  // carry moves into the exponent naturally.
  const uint32_t lsb = (abs_bits >> 20) & 1u;
  const uint32_t rounded = (abs_bits + 0x7FFFFu + lsb) >> 20;  // exponent(8) | mantissa(3)
  const int exp = static_cast<int>(rounded >> 3) - 127 + 7;
  const uint32_t code = (static_cast<uint32_t>(exp) << 3) | (rounded & 0x7u);
  if (code > 0x7Eu) return static_cast<uint8_t>(sign | 0x7E);  // rounded past 448: satfinite
  return static_cast<uint8_t>(sign | code);
}

// ---------------------------------------------------------------------------------------------
// NVFP4 matrices: [n_rows, n_cols] logical elements, n_cols % 16 == 0.
//   packed  U8      [n_rows, n_cols/2]   e2m1 codes, low nibble = even column
//   scales  e4m3fn  [n_rows, n_cols/16]  linear (unswizzled), as on disk
//   global_scale f32 (weight_scale_2)
//   value[n][k] = e2m1(code) * (f32(scale[n][k/16]) * global_scale)

struct Nvfp4View {
  std::span<const uint8_t> packed;
  std::span<const uint8_t> scales;
  float global_scale = 0.0f;
  int64_t n_rows = 0;
  int64_t n_cols = 0;

  int64_t n_scale_cols() const { return n_cols / kNvfp4BlockSize; }
  // Throws naming the shape when n_cols % 16 != 0 or a span has the wrong size.
  void validate() const;
};

struct Nvfp4Matrix {
  int64_t n_rows = 0;
  int64_t n_cols = 0;
  std::vector<uint8_t> packed;  // [n_rows, n_cols/2]
  std::vector<uint8_t> scales;  // [n_rows, n_cols/16]
  float global_scale = 0.0f;

  Nvfp4View view() const { return {packed, scales, global_scale, n_rows, n_cols}; }
};

// A checkpoint's three tensors (weight U8 [N, K/2], weight_scale F8_E4M3 [N, K/16],
// weight_scale_2 F32 [] or [1]) as a view; `name` (the module prefix) goes into every error.
Nvfp4View nvfp4_view(const TensorView& weight, const TensorView& weight_scale,
                     const TensorView& weight_scale_2, std::string_view name);

// A checkpoint's f32 scale (weight_scale_2, input_scale) as the numerics need it: finite, normal and
// positive (then f32(block scale) * it >= 2^-9 * 2^-126 > 0). Also the quantizer's rule for a given global
// scale.
inline bool nvfp4_scalar_scale_ok(float v) { return std::isfinite(v) && v >= std::numeric_limits<float>::min(); }

// The first e4m3 block scale that no quantizer writes: NaN (0x7F / 0xFF) or negative (sign set, not -0);
// its flat index, or -1 when all are finite and >= 0.
inline int64_t nvfp4_first_bad_block_scale(std::span<const uint8_t> scales) {
  for (size_t i = 0; i < scales.size(); ++i) {
    const uint8_t c = scales[i];
    if ((c & 0x7F) == 0x7F || ((c & 0x80) != 0 && c != 0x80)) return static_cast<int64_t>(i);
  }
  return -1;
}

// What is wrong with `module`.weight_scale ([rows, n_cols] e4m3 block scales), naming the first bad one by [row,
// col], its code and value ("m.weight_scale[2, 1] = 0x7f (nan): e4m3 block scales must be finite and
// non-negative"), or nullopt. The loader refuses such a Linear with it; inspect --check-scales reports it.
std::optional<std::string> nvfp4_bad_block_scale(std::string_view module, std::span<const uint8_t> scales,
                                                 int64_t n_cols);

// Global scale amax(|x|) / (6 * 448) in f32, the division ModelOpt does. For a group of matrices
// that share one scale (q/k/v, gate/up) take the max of the members' global scales: the division
// is monotone, so that equals amax(group) / 2688 bit for bit. An all-zero input gives 0. A non-finite
// element is an error naming `what` and, for a [rows, n_cols] matrix (n_cols > 0), its [row, col].
float nvfp4_global_scale(std::span<const float> x, std::string_view what = "nvfp4_global_scale", int64_t n_cols = 0);
float nvfp4_global_scale_bf16(std::span<const uint16_t> x, std::string_view what = "nvfp4_global_scale_bf16",
                              int64_t n_cols = 0);

// ModelOpt recipe (spec §1.4), in f32 with PyTorch's operation order, so the results are bit
// exact: block scale = e4m3(clamp(block_amax / (6 * global_scale), 2^-9, 448)), an all-zero block
// gets 1.0; codes = e2m1(x / (f32(block scale) * global_scale)).
// Without a global scale it is computed from x; a matrix that is entirely zero (ModelOpt would
// produce 0/0 = NaN scales) gets global scale 1.0 instead, so that it dequantizes to zeros.
// A given global scale must be finite and > 0. x must be finite; n_cols % 16 == 0.
Nvfp4Matrix nvfp4_quantize(std::span<const float> x, int64_t n_rows, int64_t n_cols);
Nvfp4Matrix nvfp4_quantize(std::span<const float> x, int64_t n_rows, int64_t n_cols,
                           float global_scale);
Nvfp4Matrix nvfp4_quantize_bf16(std::span<const uint16_t> x, int64_t n_rows, int64_t n_cols);
Nvfp4Matrix nvfp4_quantize_bf16(std::span<const uint16_t> x, int64_t n_rows, int64_t n_cols,
                                float global_scale);
// x: F32 or BF16, rank 2.
Nvfp4Matrix nvfp4_quantize(const TensorView& x);
Nvfp4Matrix nvfp4_quantize(const TensorView& x, float global_scale);

// value = e2m1(code) * (f32(scale) * global_scale), the product ModelOpt forms (scale times
// global scale first). out: [n_rows, n_cols].
void nvfp4_dequantize(const Nvfp4View& w, std::span<float> out);
std::vector<float> nvfp4_dequantize(const Nvfp4View& w);
// The same values rounded to bf16 (nearest even): what the GPU dequant kernel must produce.
void nvfp4_dequantize_bf16(const Nvfp4View& w, std::span<uint16_t> out);

// ---------------------------------------------------------------------------------------------
// 128x4 swizzled scales (CUTLASS Sm1xxBlockScaledConfig, cuBLASLt VEC16_UE4M3, TRT-LLM
// SWIZZLED_128x4): a scale matrix [rows, cols] is padded to [roundup(rows,128), roundup(cols,4)]
// and stored as tiles of 128 rows x 4 columns, 512 B each, tiles row-major (k-tiles inner).
// Within a tile: row m sits at (m % 32) * 16 + ((m % 128) / 32) * 4, column k at k % 4.

inline constexpr int64_t kSwizzleTileRows = 128;
inline constexpr int64_t kSwizzleTileCols = 4;
inline constexpr int64_t kSwizzleTileBytes = kSwizzleTileRows * kSwizzleTileCols;  // 512

constexpr FP4MOE_HOST_DEVICE int64_t swizzle_padded_rows(int64_t rows) {
  return (rows + kSwizzleTileRows - 1) / kSwizzleTileRows * kSwizzleTileRows;
}
constexpr FP4MOE_HOST_DEVICE int64_t swizzle_padded_cols(int64_t cols) {
  return (cols + kSwizzleTileCols - 1) / kSwizzleTileCols * kSwizzleTileCols;
}
// Bytes of the swizzled buffer (padding included).
constexpr FP4MOE_HOST_DEVICE int64_t swizzled_scale_bytes(int64_t rows, int64_t cols) {
  return swizzle_padded_rows(rows) * swizzle_padded_cols(cols);
}
// Offset of scale (m, k) of a [rows, cols] scale matrix in the swizzled buffer.
constexpr FP4MOE_HOST_DEVICE int64_t swizzled_scale_offset(int64_t m, int64_t k, int64_t cols) {
  const int64_t n_k_tiles = (cols + kSwizzleTileCols - 1) / kSwizzleTileCols;
  return (m / kSwizzleTileRows) * n_k_tiles * kSwizzleTileBytes + (k / 4) * kSwizzleTileBytes +
         (m % 32) * 16 + ((m % kSwizzleTileRows) / 32) * 4 + (k % 4);
}

// scales [rows, cols] (linear) -> swizzled buffer of swizzled_scale_bytes(rows, cols), padding 0.
std::vector<uint8_t> swizzle_scales_128x4(std::span<const uint8_t> scales, int64_t rows,
                                          int64_t cols);
// The inverse: swizzled buffer -> linear [rows, cols] (padding is ignored).
std::vector<uint8_t> unswizzle_scales_128x4(std::span<const uint8_t> swizzled, int64_t rows,
                                            int64_t cols);

}  // namespace fp4moe::format
