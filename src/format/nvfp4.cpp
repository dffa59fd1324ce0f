// NVFP4 block quantization (ModelOpt recipe), dequantization, packing and the 128x4 scale
// swizzle; the scalar e2m1/e4m3 conversions are inline in nvfp4.h.
// Tested by tests/format/test_nvfp4.cpp.
#include "format/nvfp4.h"

#include <algorithm>
#include <cmath>
#include <sstream>
#include <string>

#include "core/error.h"

namespace fp4moe::format {

namespace {

constexpr float kGlobalScaleDivisor = kE2M1Max * kE4M3Max;  // 2688, exact in f32

void check_matrix(const char* what, size_t n_elems, int64_t n_rows, int64_t n_cols) {
  FP4MOE_CHECK(n_rows >= 0 && n_cols >= 0)
      << what << ": negative shape N=" << n_rows << ", K=" << n_cols;
  FP4MOE_CHECK(n_cols % kNvfp4BlockSize == 0)
      << what << ": N=" << n_rows << ", K=" << n_cols << ": K is not a multiple of the NVFP4 block ("
      << kNvfp4BlockSize << ")";
  FP4MOE_CHECK(static_cast<int64_t>(n_elems) == n_rows * n_cols)
      << what << ": input holds " << n_elems << " elements but N=" << n_rows << " x K=" << n_cols
      << " = " << n_rows * n_cols;
}

void check_global_scale(const char* what, float gs) {
  // A normal f32: then f32(block scale) * gs >= 2^-9 * 2^-126 > 0, so no 0/0 in the codes.
  FP4MOE_CHECK(nvfp4_scalar_scale_ok(gs))
      << what << ": global scale " << gs << " is not a finite normal positive f32 (min "
      << std::numeric_limits<float>::min() << ")";
}

// amax(|x|) / 2688, rejecting non-finite elements (their [row, col] named when n_cols > 0, else their
// flat index).
template <typename Load>
float global_scale_impl(std::string_view what, size_t n, int64_t n_cols, Load load) {
  float amax = 0.0f;
  for (size_t i = 0; i < n; ++i) {
    const float v = load(i);
    if (!std::isfinite(v)) {
      const auto at = static_cast<int64_t>(i);
      if (n_cols > 0) {
        FP4MOE_FAIL() << what << ": non-finite value " << v << " at [" << at / n_cols << ", " << at % n_cols << "] of ["
                      << static_cast<int64_t>(n) / n_cols << ", " << n_cols << "]";
      }
      FP4MOE_FAIL() << what << ": non-finite value " << v << " at flat index " << i << " of " << n;
    }
    amax = std::max(amax, std::fabs(v));
  }
  return amax / kGlobalScaleDivisor;
}

// The ModelOpt recipe (spec §1.4) for one matrix; load(i) returns element i (row-major) as f32.
// Every step is one f32 operation in the order PyTorch evaluates it, so results are bit exact.
template <typename Load>
Nvfp4Matrix quantize_impl(const char* what, int64_t n_rows, int64_t n_cols, float gs, Load load) {
  check_global_scale(what, gs);
  Nvfp4Matrix q;
  q.n_rows = n_rows;
  q.n_cols = n_cols;
  q.global_scale = gs;
  const int64_t n_blocks = n_cols / kNvfp4BlockSize;
  q.packed.resize(static_cast<size_t>(n_rows * (n_cols / 2)));
  q.scales.resize(static_cast<size_t>(n_rows * n_blocks));
  // per_block_amax / (E2M1_MAX * weights_scaling_factor_2): the f32 product 6 * gs first.
  const float block_scale_divisor = kE2M1Max * gs;
  float x[kNvfp4BlockSize];
  for (int64_t n = 0; n < n_rows; ++n) {
    for (int64_t b = 0; b < n_blocks; ++b) {
      const int64_t base = n * n_cols + b * kNvfp4BlockSize;
      float block_amax = 0.0f;
      for (int i = 0; i < kNvfp4BlockSize; ++i) {
        x[i] = load(static_cast<size_t>(base + i));
        FP4MOE_CHECK(std::isfinite(x[i]))
            << what << ": non-finite value " << x[i] << " at [" << n << ", "
            << b * kNvfp4BlockSize + i << "] of N=" << n_rows << ", K=" << n_cols;
        block_amax = std::max(block_amax, std::fabs(x[i]));
      }
      float scale = block_amax / block_scale_divisor;
      if (scale == 0.0f) scale = 1.0f;  // all-zero block
      scale = std::clamp(scale, kE4M3MinScale, kE4M3Max);
      const uint8_t scale_code = f32_to_e4m3(scale);
      q.scales[static_cast<size_t>(n * n_blocks + b)] = scale_code;
      // Codes come from the *rounded* scale: x / (f32(e4m3 scale) * gs).
      const float step = kE4M3Values[scale_code] * gs;
      uint8_t* out = q.packed.data() + (n * n_cols + b * kNvfp4BlockSize) / 2;
      for (int i = 0; i < kNvfp4BlockSize; i += 2) {
        out[i / 2] = e2m1_pack(f32_to_e2m1(x[i] / step), f32_to_e2m1(x[i + 1] / step));
      }
    }
  }
  return q;
}

// Element i of a row-major F32/BF16 tensor; memcpy because mmapped data may be unaligned.
struct ViewLoader {
  const uint8_t* bytes;
  bool is_bf16;
  float operator()(size_t i) const {
    if (is_bf16) {
      uint16_t h;
      std::memcpy(&h, bytes + 2 * i, 2);
      return bf16_to_f32(h);
    }
    float f;
    std::memcpy(&f, bytes + 4 * i, 4);
    return f;
  }
};

ViewLoader view_loader(const char* what, const TensorView& x) {
  FP4MOE_CHECK(x.dtype == DType::kF32 || x.dtype == DType::kBF16)
      << what << ": input dtype " << dtype_name(x.dtype) << " (shape " << shape_to_string(x.shape)
      << ") is neither F32 nor BF16";
  FP4MOE_CHECK(x.rank() == 2) << what << ": input shape " << shape_to_string(x.shape)
                              << " is not rank 2 [N, K]";
  const size_t elem = x.dtype == DType::kBF16 ? 2 : 4;
  FP4MOE_CHECK(x.bytes.size() == static_cast<size_t>(x.numel()) * elem)
      << what << ": " << x.bytes.size() << " bytes for shape " << shape_to_string(x.shape) << " "
      << dtype_name(x.dtype);
  return {x.bytes.data(), x.dtype == DType::kBF16};
}

}  // namespace

void e2m1_pack_codes(std::span<const uint8_t> codes, std::span<uint8_t> packed) {
  FP4MOE_CHECK(codes.size() % 2 == 0 && packed.size() == codes.size() / 2)
      << "e2m1_pack_codes: " << codes.size() << " codes into " << packed.size()
      << " bytes (need an even count and count/2 bytes)";
  for (size_t j = 0; j < packed.size(); ++j) packed[j] = e2m1_pack(codes[2 * j], codes[2 * j + 1]);
}

void e2m1_unpack_codes(std::span<const uint8_t> packed, std::span<uint8_t> codes) {
  FP4MOE_CHECK(codes.size() == 2 * packed.size())
      << "e2m1_unpack_codes: " << packed.size() << " bytes into " << codes.size()
      << " codes (need 2 per byte)";
  for (size_t j = 0; j < packed.size(); ++j) {
    codes[2 * j] = packed[j] & 0xF;
    codes[2 * j + 1] = packed[j] >> 4;
  }
}

void Nvfp4View::validate() const {
  FP4MOE_CHECK(n_rows >= 0 && n_cols >= 0) << "NVFP4 view: negative shape N=" << n_rows
                                           << ", K=" << n_cols;
  FP4MOE_CHECK(n_cols % kNvfp4BlockSize == 0)
      << "NVFP4 view: N=" << n_rows << ", K=" << n_cols << ": K is not a multiple of "
      << kNvfp4BlockSize;
  FP4MOE_CHECK(static_cast<int64_t>(packed.size()) == n_rows * (n_cols / 2))
      << "NVFP4 view N=" << n_rows << ", K=" << n_cols << ": packed codes have " << packed.size()
      << " bytes, expected N*K/2 = " << n_rows * (n_cols / 2);
  FP4MOE_CHECK(static_cast<int64_t>(scales.size()) == n_rows * n_scale_cols())
      << "NVFP4 view N=" << n_rows << ", K=" << n_cols << ": scales have " << scales.size()
      << " bytes, expected N*K/16 = " << n_rows * n_scale_cols();
}

Nvfp4View nvfp4_view(const TensorView& weight, const TensorView& weight_scale,
                     const TensorView& weight_scale_2, std::string_view name) {
  FP4MOE_CHECK(weight.dtype == DType::kU8 && weight.rank() == 2)
      << name << ".weight: NVFP4 needs U8 [N, K/2], got " << dtype_name(weight.dtype) << " "
      << shape_to_string(weight.shape);
  const int64_t n = weight.dim(0);
  const int64_t k = 2 * weight.dim(1);
  FP4MOE_CHECK(k % kNvfp4BlockSize == 0)
      << name << ".weight: U8 " << shape_to_string(weight.shape) << " gives K=" << k
      << ", not a multiple of " << kNvfp4BlockSize;
  FP4MOE_CHECK(weight_scale.dtype == DType::kF8_E4M3 && weight_scale.rank() == 2 &&
               weight_scale.dim(0) == n && weight_scale.dim(1) == k / kNvfp4BlockSize)
      << name << ".weight_scale: expected F8_E4M3 [" << n << ", " << k / kNvfp4BlockSize
      << "] for weight U8 " << shape_to_string(weight.shape) << ", got "
      << dtype_name(weight_scale.dtype) << " " << shape_to_string(weight_scale.shape);
  FP4MOE_CHECK(weight_scale_2.dtype == DType::kF32 && weight_scale_2.numel() == 1 &&
               weight_scale_2.rank() <= 1 && weight_scale_2.bytes.size() == 4)
      << name << ".weight_scale_2: expected an F32 scalar [] (or [1]), got "
      << dtype_name(weight_scale_2.dtype) << " " << shape_to_string(weight_scale_2.shape);
  Nvfp4View v;
  v.packed = weight.bytes;
  v.scales = weight_scale.bytes;
  std::memcpy(&v.global_scale, weight_scale_2.bytes.data(), 4);
  v.n_rows = n;
  v.n_cols = k;
  FP4MOE_CHECK(std::isfinite(v.global_scale) && v.global_scale > 0.0f)
      << name << ".weight_scale_2 = " << v.global_scale << " is not a finite positive scale";
  v.validate();
  return v;
}

float nvfp4_global_scale(std::span<const float> x, std::string_view what, int64_t n_cols) {
  return global_scale_impl(what, x.size(), n_cols, [&](size_t i) { return x[i]; });
}

float nvfp4_global_scale_bf16(std::span<const uint16_t> x, std::string_view what, int64_t n_cols) {
  return global_scale_impl(what, x.size(), n_cols, [&](size_t i) { return bf16_to_f32(x[i]); });
}

// An all-zero matrix has amax 0; ModelOpt would then divide 0 by 0. Global scale 1.0 instead
// (every block is all-zero: scale 1.0, codes 0, dequantized zeros).
static float computed_global_scale(float gs) { return gs == 0.0f ? 1.0f : gs; }

Nvfp4Matrix nvfp4_quantize(std::span<const float> x, int64_t n_rows, int64_t n_cols) {
  check_matrix("nvfp4_quantize", x.size(), n_rows, n_cols);
  return nvfp4_quantize(x, n_rows, n_cols, computed_global_scale(nvfp4_global_scale(x, "nvfp4_quantize", n_cols)));
}

Nvfp4Matrix nvfp4_quantize(std::span<const float> x, int64_t n_rows, int64_t n_cols,
                           float global_scale) {
  check_matrix("nvfp4_quantize", x.size(), n_rows, n_cols);
  return quantize_impl("nvfp4_quantize", n_rows, n_cols, global_scale,
                       [&](size_t i) { return x[i]; });
}

Nvfp4Matrix nvfp4_quantize_bf16(std::span<const uint16_t> x, int64_t n_rows, int64_t n_cols) {
  check_matrix("nvfp4_quantize_bf16", x.size(), n_rows, n_cols);
  return nvfp4_quantize_bf16(x, n_rows, n_cols, computed_global_scale(nvfp4_global_scale_bf16(x)));
}

Nvfp4Matrix nvfp4_quantize_bf16(std::span<const uint16_t> x, int64_t n_rows, int64_t n_cols,
                                float global_scale) {
  check_matrix("nvfp4_quantize_bf16", x.size(), n_rows, n_cols);
  return quantize_impl("nvfp4_quantize_bf16", n_rows, n_cols, global_scale,
                       [&](size_t i) { return bf16_to_f32(x[i]); });
}

Nvfp4Matrix nvfp4_quantize(const TensorView& x) {
  const ViewLoader load = view_loader("nvfp4_quantize", x);
  check_matrix("nvfp4_quantize", static_cast<size_t>(x.numel()), x.dim(0), x.dim(1));
  const float gs = global_scale_impl("nvfp4_quantize", static_cast<size_t>(x.numel()), x.dim(1), load);
  return nvfp4_quantize(x, computed_global_scale(gs));
}

Nvfp4Matrix nvfp4_quantize(const TensorView& x, float global_scale) {
  const ViewLoader load = view_loader("nvfp4_quantize", x);
  check_matrix("nvfp4_quantize", static_cast<size_t>(x.numel()), x.dim(0), x.dim(1));
  return quantize_impl("nvfp4_quantize", x.dim(0), x.dim(1), global_scale, load);
}

void nvfp4_dequantize(const Nvfp4View& w, std::span<float> out) {
  w.validate();
  FP4MOE_CHECK(static_cast<int64_t>(out.size()) == w.n_rows * w.n_cols)
      << "nvfp4_dequantize: output has " << out.size() << " elements, expected N=" << w.n_rows
      << " x K=" << w.n_cols;
  const int64_t n_blocks = w.n_scale_cols();
  for (int64_t n = 0; n < w.n_rows; ++n) {
    const uint8_t* row = w.packed.data() + n * (w.n_cols / 2);
    for (int64_t b = 0; b < n_blocks; ++b) {
      // ModelOpt: per_block_scale = f32(scale) * double_scale, then e2m1 * per_block_scale.
      const float block_scale = kE4M3Values[w.scales[static_cast<size_t>(n * n_blocks + b)]] *
                                w.global_scale;
      for (int i = 0; i < kNvfp4BlockSize; ++i) {
        const int64_t k = b * kNvfp4BlockSize + i;
        out[static_cast<size_t>(n * w.n_cols + k)] = e2m1_to_f32(e2m1_code_at(row, k)) * block_scale;
      }
    }
  }
}

std::vector<float> nvfp4_dequantize(const Nvfp4View& w) {
  w.validate();
  std::vector<float> out(static_cast<size_t>(w.n_rows * w.n_cols));
  nvfp4_dequantize(w, out);
  return out;
}

void nvfp4_dequantize_bf16(const Nvfp4View& w, std::span<uint16_t> out) {
  const std::vector<float> f = nvfp4_dequantize(w);
  FP4MOE_CHECK(out.size() == f.size()) << "nvfp4_dequantize_bf16: output has " << out.size()
                                       << " elements, expected N=" << w.n_rows << " x K=" << w.n_cols;
  for (size_t i = 0; i < f.size(); ++i) out[i] = f32_to_bf16(f[i]);
}

std::vector<uint8_t> swizzle_scales_128x4(std::span<const uint8_t> scales, int64_t rows,
                                          int64_t cols) {
  FP4MOE_CHECK(rows >= 0 && cols >= 0 && static_cast<int64_t>(scales.size()) == rows * cols)
      << "swizzle_scales_128x4: " << scales.size() << " scales for a [" << rows << ", " << cols
      << "] matrix";
  std::vector<uint8_t> out(static_cast<size_t>(swizzled_scale_bytes(rows, cols)), 0);
  for (int64_t m = 0; m < rows; ++m) {
    for (int64_t k = 0; k < cols; ++k) {
      out[static_cast<size_t>(swizzled_scale_offset(m, k, cols))] =
          scales[static_cast<size_t>(m * cols + k)];
    }
  }
  return out;
}

std::vector<uint8_t> unswizzle_scales_128x4(std::span<const uint8_t> swizzled, int64_t rows,
                                            int64_t cols) {
  FP4MOE_CHECK(rows >= 0 && cols >= 0 &&
               static_cast<int64_t>(swizzled.size()) == swizzled_scale_bytes(rows, cols))
      << "unswizzle_scales_128x4: buffer of " << swizzled.size() << " bytes for a [" << rows
      << ", " << cols << "] scale matrix; the 128x4 layout needs "
      << swizzle_padded_rows(rows) << " x " << swizzle_padded_cols(cols) << " = "
      << swizzled_scale_bytes(rows, cols);
  std::vector<uint8_t> out(static_cast<size_t>(rows * cols));
  for (int64_t m = 0; m < rows; ++m) {
    for (int64_t k = 0; k < cols; ++k) {
      out[static_cast<size_t>(m * cols + k)] =
          swizzled[static_cast<size_t>(swizzled_scale_offset(m, k, cols))];
    }
  }
  return out;
}

std::optional<std::string> nvfp4_bad_block_scale(std::string_view module, std::span<const uint8_t> scales,
                                                 int64_t n_cols) {
  const int64_t bad = nvfp4_first_bad_block_scale(scales);
  if (bad < 0) return std::nullopt;
  const uint8_t code = scales[static_cast<size_t>(bad)];
  std::ostringstream m;
  m << module << ".weight_scale[" << bad / n_cols << ", " << bad % n_cols << "] = 0x" << std::hex
    << static_cast<int>(code) << std::dec << " (" << e4m3_to_f32(code)
    << "): e4m3 block scales must be finite and non-negative";
  return m.str();
}

}  // namespace fp4moe::format
