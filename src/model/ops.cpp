// The shared f32 CPU ops of the model forwards (see ops.h). Tested by tests/model/test_ops.cpp.
#include "model/ops.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>

#include "core/error.h"
#include "model/causal_lm.h"

namespace fp4moe::model {

void rms_norm(const float* x, int64_t n_rows, int64_t dim, const float* w, float eps, float* y) {
  for (int64_t r = 0; r < n_rows; ++r) {
    const float* xr = x + r * dim;
    float* yr = y + r * dim;
    float ss = 0.0f;
    for (int64_t i = 0; i < dim; ++i) ss += xr[i] * xr[i];
    const float inv = 1.0f / std::sqrt(ss / static_cast<float>(dim) + eps);
    for (int64_t i = 0; i < dim; ++i) yr[i] = w[i] * (xr[i] * inv);
  }
}

void layer_norm(const float* x, int64_t n_rows, int64_t dim, const float* w, const float* b, float eps, float* y) {
  for (int64_t r = 0; r < n_rows; ++r) {
    const float* xr = x + r * dim;
    float* yr = y + r * dim;
    float mean = 0.0f;
    for (int64_t i = 0; i < dim; ++i) mean += xr[i];
    mean /= static_cast<float>(dim);
    float var = 0.0f;
    for (int64_t i = 0; i < dim; ++i) var += (xr[i] - mean) * (xr[i] - mean);
    var /= static_cast<float>(dim);
    const float inv = 1.0f / std::sqrt(var + eps);
    for (int64_t i = 0; i < dim; ++i) yr[i] = (xr[i] - mean) * inv * w[i] + b[i];
  }
}

std::vector<float> rope_inv_freq(int64_t rotary_dim, float theta) {
  FP4MOE_CHECK(rotary_dim > 0 && rotary_dim % 2 == 0) << "rotary_dim=" << rotary_dim << " must be positive and even";
  std::vector<float> f(static_cast<size_t>(rotary_dim / 2));
  for (int64_t i = 0; i < rotary_dim / 2; ++i) {
    // HF: 1.0 / (base ** (arange(0, dim, 2).float() / dim)), all f32.
    const float e = static_cast<float>(2 * i) / static_cast<float>(rotary_dim);
    f[static_cast<size_t>(i)] = 1.0f / std::pow(theta, e);
  }
  return f;
}

void rope_cos_sin(std::span<const float> inv_freq, int64_t pos, float* cos_out, float* sin_out) {
  const float p = static_cast<float>(pos);
  for (size_t i = 0; i < inv_freq.size(); ++i) {
    const float a = p * inv_freq[i];
    cos_out[i] = std::cos(a);
    sin_out[i] = std::sin(a);
  }
}

void rope_neox(float* x, int64_t n_heads, int64_t head_stride, int64_t offset, int64_t rotary_dim,
               const float* cos, const float* sin) {
  const int64_t half = rotary_dim / 2;
  for (int64_t h = 0; h < n_heads; ++h) {
    float* v = x + h * head_stride + offset;
    for (int64_t i = 0; i < half; ++i) {
      const float x1 = v[i];
      const float x2 = v[i + half];
      v[i] = x1 * cos[i] - x2 * sin[i];
      v[i + half] = x2 * cos[i] + x1 * sin[i];
    }
  }
}

void rope_interleaved(float* x, int64_t n_heads, int64_t head_stride, int64_t offset, int64_t rotary_dim,
                      const float* cos, const float* sin) {
  const int64_t half = rotary_dim / 2;
  for (int64_t h = 0; h < n_heads; ++h) {
    float* v = x + h * head_stride + offset;
    for (int64_t i = 0; i < half; ++i) {
      const float x1 = v[2 * i];
      const float x2 = v[2 * i + 1];
      v[2 * i] = x1 * cos[i] - x2 * sin[i];
      v[2 * i + 1] = x2 * cos[i] + x1 * sin[i];
    }
  }
}

void silu_mul(const float* gate, const float* up, int64_t n, float* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = silu(gate[i]) * up[i];
}

int64_t first_non_finite(const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    if (!std::isfinite(x[i])) return i;
  }
  return -1;
}

void fail_non_finite(const char* what, int64_t entry, int64_t position, int64_t column, float value,
                     int64_t other_entries) {
  std::ostringstream m;
  m << what << " of batch entry " << entry << " at position " << position;
  if (column >= 0) {
    m << ", column " << column << " is " << value;
  } else {
    m << " holds NaN or Inf";
  }
  if (other_entries > 0) m << " (and rows of " << other_entries << " other batch entries)";
  m << ": a weight of this layer (or its input) holds NaN or Inf, or the values overflowed f32";
  if (other_entries > 0) throw Error(m.str());
  throw SequenceError(entry, m.str());
}

void softmax_inplace(float* x, int64_t n) {
  float m = -std::numeric_limits<float>::infinity();
  bool nan = false;
  for (int64_t i = 0; i < n; ++i) {
    m = std::max(m, x[i]);
    nan = nan || std::isnan(x[i]);
  }
  // NaN / +inf in, NaN out: the sublayer's finite check then names the sequence it came from.
  if (nan || m == std::numeric_limits<float>::infinity()) {
    std::fill(x, x + n, std::numeric_limits<float>::quiet_NaN());
    return;
  }
  FP4MOE_CHECK(std::isfinite(m)) << "softmax over " << n << " values whose maximum is " << m;
  float s = 0.0f;
  for (int64_t i = 0; i < n; ++i) {
    x[i] = std::exp(x[i] - m);
    s += x[i];
  }
  const float inv = 1.0f / s;
  for (int64_t i = 0; i < n; ++i) x[i] *= inv;
}

void embedding_lookup(const TensorView& table, std::span<const int32_t> ids, float* out) {
  FP4MOE_CHECK(table.rank() == 2) << "embedding table must be 2-D, found " << shape_to_string(table.shape);
  const int64_t vocab = table.dim(0);
  const int64_t dim = table.dim(1);
  for (size_t t = 0; t < ids.size(); ++t) {
    const int64_t id = ids[t];
    FP4MOE_CHECK(id >= 0 && id < vocab) << "token id " << id << " at position " << t << " is outside the vocabulary [0, "
                                        << vocab << ")";
    float* o = out + static_cast<int64_t>(t) * dim;
    switch (table.dtype) {
      case DType::kBF16: {
        const uint16_t* row = table.as<uint16_t>().data() + id * dim;
        for (int64_t i = 0; i < dim; ++i) o[i] = bf16_to_f32(row[i]);
        break;
      }
      case DType::kF32: {
        const float* row = table.as<float>().data() + id * dim;
        for (int64_t i = 0; i < dim; ++i) o[i] = row[i];
        break;
      }
      default:
        FP4MOE_FAIL() << "embedding table dtype " << dtype_name(table.dtype) << " (supported: BF16, F32)";
    }
  }
}

int64_t argmax(const float* x, int64_t n) {
  FP4MOE_CHECK(n > 0) << "argmax over " << n << " values";
  int64_t best = 0;
  for (int64_t i = 1; i < n; ++i) {
    if (x[i] > x[best]) best = i;
  }
  return best;
}

std::vector<float> to_f32(const TensorView& t) {
  std::vector<float> out(static_cast<size_t>(t.numel()));
  switch (t.dtype) {
    case DType::kBF16: {
      auto v = t.as<uint16_t>();
      for (size_t i = 0; i < out.size(); ++i) out[i] = bf16_to_f32(v[i]);
      break;
    }
    case DType::kF32: {
      auto v = t.as<float>();
      for (size_t i = 0; i < out.size(); ++i) out[i] = v[i];
      break;
    }
    default:
      FP4MOE_FAIL() << "cannot convert a " << dtype_name(t.dtype) << " tensor " << shape_to_string(t.shape)
                    << " to f32 (supported: BF16, F32)";
  }
  return out;
}

}  // namespace fp4moe::model
