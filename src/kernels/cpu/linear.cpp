// CPU Linear: dequantize a block of weight rows once, apply it to every input row (f32 accumulate).
// See linear.h. Tested by tests/moe/test_linear.cpp.
#include "kernels/cpu/linear.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <sstream>

#include "core/error.h"
#include "kernels/cpu/thread_pool.h"

namespace fp4moe::kernels::cpu {

namespace {

using format::kNvfp4BlockSize;

// e2m1 nibble -> value, from format/nvfp4.h's decoder.
constexpr std::array<float, 16> kE2M1 = [] {
  std::array<float, 16> t{};
  for (int i = 0; i < 16; ++i) t[static_cast<size_t>(i)] = format::e2m1_to_f32(static_cast<uint8_t>(i));
  return t;
}();

// A packed byte -> its two values {low nibble (even k), high nibble (odd k)}: one lookup per byte.
constexpr std::array<std::array<float, 2>, 256> kE2M1Pairs = [] {
  std::array<std::array<float, 2>, 256> t{};
  for (int b = 0; b < 256; ++b) t[static_cast<size_t>(b)] = {kE2M1[b & 0xF], kE2M1[b >> 4]};
  return t;
}();

// Block of output rows per task: about 32 KiB of dequantized f32 weights, 4..256 rows, a multiple of 4.
int64_t rows_per_block(int64_t in) {
  int64_t rows = (32 * 1024 / 4) / std::max<int64_t>(in, 1);
  rows = std::clamp<int64_t>(rows, 4, 256);
  return rows & ~int64_t{3};
}

// Below this many multiply-adds (plus dequant work) a Linear runs on the calling thread: waking
// the pool costs more than the work.
constexpr int64_t kSerialWork = 1 << 16;

// Input rows per register block (each weight row loaded once per kRowsX input rows).
constexpr int kRowsX = 4;

// M input rows against N weight rows: M*N dot products, each with 8 independent f32 lanes
// (vectorizable without reassociation) summed pairwise at the end, the tail added last. Every
// (row, weight row) result is the same for any M, N: the blocking never changes the bits.
template <int M, int N>
inline void dot_block(const float* x, int64_t x_stride, const float* w, int64_t n, float* y, int64_t y_stride) {
  float acc[M][N][8] = {};
  int64_t k = 0;
  for (; k + 8 <= n; k += 8) {
    for (int i = 0; i < M; ++i) {
      for (int r = 0; r < N; ++r) {
        for (int j = 0; j < 8; ++j) acc[i][r][j] += x[i * x_stride + k + j] * w[r * n + k + j];
      }
    }
  }
  for (int i = 0; i < M; ++i) {
    for (int r = 0; r < N; ++r) {
      float tail = 0.0f;
      for (int64_t kk = k; kk < n; ++kk) tail += x[i * x_stride + kk] * w[r * n + kk];
      const float* a = acc[i][r];
      y[i * y_stride + r] = (((a[0] + a[4]) + (a[1] + a[5])) + ((a[2] + a[6]) + (a[3] + a[7]))) + tail;
    }
  }
}

void expect_size(const char* what, size_t found, int64_t expected, const LinearWeight& w) {
  FP4MOE_CHECK(static_cast<int64_t>(found) == expected)
      << weight_format_name(w.format) << " Linear [" << w.out_features << ", " << w.in_features << "]: "
      << what << " holds " << found << " elements, expected " << expected;
}

std::string describe_view(const TensorView& v) {
  return std::string(dtype_name(v.dtype)) + " " + shape_to_string(v.shape);
}

float read_scalar_f32(const std::string& name, const TensorView& v) {
  FP4MOE_CHECK(v.dtype == DType::kF32 && v.numel() == 1 && v.rank() <= 1)
      << name << ": expected F32 [] (a scalar), found " << describe_view(v);
  float f;
  std::memcpy(&f, v.bytes.data(), 4);
  return f;
}

}  // namespace

std::string_view weight_format_name(WeightFormat f) {
  switch (f) {
    case WeightFormat::kF32: return "F32";
    case WeightFormat::kBF16: return "BF16";
    case WeightFormat::kNVFP4: return "NVFP4";
  }
  return "?";
}

LinearWeight LinearWeight::from_f32(int64_t out, int64_t in, std::vector<float> w, std::vector<float> bias) {
  LinearWeight lw;
  lw.format = WeightFormat::kF32;
  lw.out_features = out;
  lw.in_features = in;
  lw.f32 = std::move(w);
  lw.bias = std::move(bias);
  lw.validate();
  return lw;
}

LinearWeight LinearWeight::from_bf16(int64_t out, int64_t in, std::vector<uint16_t> w, std::vector<float> bias) {
  LinearWeight lw;
  lw.format = WeightFormat::kBF16;
  lw.out_features = out;
  lw.in_features = in;
  lw.bf16 = std::move(w);
  lw.bias = std::move(bias);
  lw.validate();
  return lw;
}

LinearWeight LinearWeight::from_nvfp4(int64_t out, int64_t in, std::vector<uint8_t> packed,
                                      std::vector<uint8_t> scales, float global_scale,
                                      std::optional<float> input_scale, std::vector<float> bias) {
  LinearWeight lw;
  lw.format = WeightFormat::kNVFP4;
  lw.out_features = out;
  lw.in_features = in;
  lw.packed = std::move(packed);
  lw.scales = std::move(scales);
  lw.global_scale = global_scale;
  lw.input_scale = input_scale;
  lw.bias = std::move(bias);
  lw.validate();
  return lw;
}

int64_t LinearWeight::weight_bytes() const {
  return static_cast<int64_t>(f32.size() * 4 + bf16.size() * 2 + packed.size() + scales.size());
}

void LinearWeight::validate() const {
  FP4MOE_CHECK(out_features >= 1 && in_features >= 1)
      << weight_format_name(format) << " Linear shape [" << out_features << ", " << in_features << "] must be positive";
  const int64_t n = out_features * in_features;
  switch (format) {
    case WeightFormat::kF32:
      expect_size("f32 weight", f32.size(), n, *this);
      break;
    case WeightFormat::kBF16:
      expect_size("bf16 weight", bf16.size(), n, *this);
      break;
    case WeightFormat::kNVFP4:
      FP4MOE_CHECK(in_features % kNvfp4BlockSize == 0)
          << "NVFP4 Linear [" << out_features << ", " << in_features << "]: in_features " << in_features
          << " is not a multiple of the block size " << kNvfp4BlockSize;
      expect_size("packed e2m1 weight", packed.size(), n / 2, *this);
      expect_size("e4m3 block scales", scales.size(), n / kNvfp4BlockSize, *this);
      FP4MOE_CHECK(std::isfinite(global_scale))
          << "NVFP4 Linear [" << out_features << ", " << in_features << "]: weight_scale_2 " << global_scale
          << " is not finite";
      break;
  }
  if (!bias.empty()) expect_size("bias", bias.size(), out_features, *this);
}

std::string LinearWeight::describe() const {
  std::ostringstream os;
  os << weight_format_name(format) << " [" << out_features << ", " << in_features << "]";
  if (has_bias()) os << " +bias";
  return os.str();
}

void dequantize_row(const LinearWeight& w, int64_t row, float* out) {
  const int64_t in = w.in_features;
  switch (w.format) {
    case WeightFormat::kF32:
      std::memcpy(out, w.f32.data() + row * in, static_cast<size_t>(in) * 4);
      return;
    case WeightFormat::kBF16: {
      const uint16_t* src = w.bf16.data() + row * in;
      for (int64_t k = 0; k < in; ++k) out[k] = bf16_to_f32(src[k]);
      return;
    }
    case WeightFormat::kNVFP4: {
      const auto& e4m3 = format::kE4M3Values;
      const int64_t n_blocks = in / kNvfp4BlockSize;
      const uint8_t* codes = w.packed.data() + row * (in / 2);
      const uint8_t* scales = w.scales.data() + row * n_blocks;
      for (int64_t b = 0; b < n_blocks; ++b) {
        const float s = e4m3[scales[b]] * w.global_scale;  // ModelOpt: scale * scale_2 first, in f32
        const uint8_t* c = codes + b * (kNvfp4BlockSize / 2);
        float* o = out + b * kNvfp4BlockSize;
        float v[kNvfp4BlockSize];
        for (int j = 0; j < kNvfp4BlockSize / 2; ++j) {
          v[2 * j] = kE2M1Pairs[c[j]][0];      // even k: low nibble
          v[2 * j + 1] = kE2M1Pairs[c[j]][1];  // odd k: high nibble
        }
        for (int j = 0; j < kNvfp4BlockSize; ++j) o[j] = v[j] * s;
      }
      return;
    }
  }
}

std::vector<float> dequantize(const LinearWeight& w) {
  std::vector<float> out(static_cast<size_t>(w.out_features * w.in_features));
  for (int64_t r = 0; r < w.out_features; ++r) dequantize_row(w, r, out.data() + r * w.in_features);
  return out;
}

void linear_forward(const LinearWeight& w, const float* x, int64_t m, float* y) {
  FP4MOE_CHECK(m >= 0) << "linear_forward: m=" << m << " must be >= 0";
  if (m == 0) return;
  const int64_t out = w.out_features;
  const int64_t in = w.in_features;
  const int64_t block_rows = rows_per_block(in);
  const int64_t n_blocks = (out + block_rows - 1) / block_rows;

  auto run_block = [&](int64_t b) {
    const int64_t r0 = b * block_rows;
    const int64_t r1 = std::min(out, r0 + block_rows);
    const float* wb;
    thread_local std::vector<float> scratch;
    if (w.format == WeightFormat::kF32) {
      wb = w.f32.data() + r0 * in;
    } else {
      scratch.resize(static_cast<size_t>(block_rows * in));
      for (int64_t r = r0; r < r1; ++r) dequantize_row(w, r, scratch.data() + (r - r0) * in);
      wb = scratch.data();
    }
    int64_t i = 0;
    for (; i + kRowsX <= m; i += kRowsX) {
      int64_t r = r0;
      for (; r + 4 <= r1; r += 4) dot_block<kRowsX, 4>(x + i * in, in, wb + (r - r0) * in, in, y + i * out + r, out);
      for (; r < r1; ++r) dot_block<kRowsX, 1>(x + i * in, in, wb + (r - r0) * in, in, y + i * out + r, out);
    }
    for (; i < m; ++i) {
      int64_t r = r0;
      for (; r + 4 <= r1; r += 4) dot_block<1, 4>(x + i * in, in, wb + (r - r0) * in, in, y + i * out + r, out);
      for (; r < r1; ++r) dot_block<1, 1>(x + i * in, in, wb + (r - r0) * in, in, y + i * out + r, out);
    }
    if (w.has_bias()) {
      for (int64_t ii = 0; ii < m; ++ii) {
        for (int64_t rr = r0; rr < r1; ++rr) y[ii * out + rr] += w.bias[rr];
      }
    }
  };

  const int64_t work = out * in * (m + 1);
  if (work < kSerialWork || n_blocks == 1) {
    for (int64_t b = 0; b < n_blocks; ++b) run_block(b);
  } else {
    default_thread_pool().parallel_for(n_blocks, run_block);
  }
}

LinearWeight linear_weight_from_tensors(const LinearTensors& t, int64_t out, int64_t in, bool want_bias) {
  const std::string& mod = t.module;
  FP4MOE_CHECK(out >= 1 && in >= 1) << mod << ": Linear shape [" << out << ", " << in << "] must be positive";
  FP4MOE_CHECK(t.weight != nullptr) << mod << ".weight: missing (expected a [" << out << ", " << in << "] weight)";
  const TensorView& wv = *t.weight;

  std::vector<float> bias;
  if (want_bias) {
    FP4MOE_CHECK(t.bias != nullptr) << mod << ".bias: missing (expected BF16 or F32 [" << out << "])";
    const TensorView& bv = *t.bias;
    FP4MOE_CHECK((bv.dtype == DType::kBF16 || bv.dtype == DType::kF32) && bv.shape == Shape{out})
        << mod << ".bias: expected BF16 or F32 [" << out << "], found " << describe_view(bv);
    bias.resize(static_cast<size_t>(out));
    if (bv.dtype == DType::kF32) {
      std::memcpy(bias.data(), bv.bytes.data(), static_cast<size_t>(out) * 4);
    } else {
      auto src = bv.as<uint16_t>();
      for (int64_t i = 0; i < out; ++i) bias[i] = bf16_to_f32(src[i]);
    }
  }

  const bool nvfp4 = wv.dtype == DType::kU8 || t.weight_scale != nullptr;
  if (nvfp4) {
    FP4MOE_CHECK(in % kNvfp4BlockSize == 0)
        << mod << ".weight: NVFP4 needs in_features (" << in << ") to be a multiple of " << kNvfp4BlockSize;
    const Shape w_shape{out, in / 2};
    const Shape s_shape{out, in / kNvfp4BlockSize};
    FP4MOE_CHECK(wv.dtype == DType::kU8 && wv.shape == w_shape)
        << mod << ".weight: expected U8 " << shape_to_string(w_shape) << " (NVFP4, packed e2m1), found "
        << describe_view(wv);
    FP4MOE_CHECK(t.weight_scale != nullptr)
        << mod << ".weight_scale: missing (expected F8_E4M3 " << shape_to_string(s_shape)
        << " next to the U8 NVFP4 weight)";
    const TensorView& sv = *t.weight_scale;
    FP4MOE_CHECK(sv.dtype == DType::kF8_E4M3 && sv.shape == s_shape)
        << mod << ".weight_scale: expected F8_E4M3 " << shape_to_string(s_shape) << ", found " << describe_view(sv);
    FP4MOE_CHECK(t.weight_scale_2 != nullptr) << mod << ".weight_scale_2: missing (expected F32 [] for NVFP4)";
    const float gs = read_scalar_f32(mod + ".weight_scale_2", *t.weight_scale_2);
    FP4MOE_CHECK(format::nvfp4_scalar_scale_ok(gs))
        << mod << ".weight_scale_2 = " << gs
        << ": the global scale must be a finite, normal, positive f32 (amax / 2688)";
    std::optional<float> is;
    if (t.input_scale != nullptr) {
      is = read_scalar_f32(mod + ".input_scale", *t.input_scale);
      FP4MOE_CHECK(format::nvfp4_scalar_scale_ok(*is))
          << mod << ".input_scale = " << *is << ": the activation scale must be a finite, normal, positive f32";
    }
    // Read once here, as every weight byte is: a NaN or negative block scale would only show as NaN logits.
    if (std::optional<std::string> why = format::nvfp4_bad_block_scale(mod, sv.bytes, in / kNvfp4BlockSize))
      FP4MOE_FAIL() << *why;
    std::vector<uint8_t> packed(wv.bytes.begin(), wv.bytes.end());
    std::vector<uint8_t> scales(sv.bytes.begin(), sv.bytes.end());
    return LinearWeight::from_nvfp4(out, in, std::move(packed), std::move(scales), gs, is, std::move(bias));
  }

  const Shape w_shape{out, in};
  FP4MOE_CHECK((wv.dtype == DType::kBF16 || wv.dtype == DType::kF32) && wv.shape == w_shape)
      << mod << ".weight: expected BF16 or F32 " << shape_to_string(w_shape) << " (or U8 "
      << shape_to_string(Shape{out, in / 2}) << " NVFP4), found " << describe_view(wv);
  if (wv.dtype == DType::kF32) {
    auto src = wv.as<float>();
    return LinearWeight::from_f32(out, in, std::vector<float>(src.begin(), src.end()), std::move(bias));
  }
  auto src = wv.as<uint16_t>();
  return LinearWeight::from_bf16(out, in, std::vector<uint16_t>(src.begin(), src.end()), std::move(bias));
}

}  // namespace fp4moe::kernels::cpu
