// Shared f32 CPU ops of the model forwards: RMSNorm, LayerNorm, RoPE (NeoX half-split on a leading
// slice of each head, and interleaved GPT-J pairs), SiLU, softmax, embedding lookup, argmax.
// Each follows the HF transformers 5.17 formula in f32 (spec ../shared/spec/nvfp4-and-glm.md §4).
// Tested by tests/model/test_ops.cpp against naive formulas.
#pragma once

#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "core/tensor.h"

namespace fp4moe::model {

// y[r] = w * (x[r] * rsqrt(mean(x[r]^2) + eps)), rows of `dim`. y may alias x.
void rms_norm(const float* x, int64_t n_rows, int64_t dim, const float* w, float eps, float* y);

// y[r] = (x[r] - mean) * rsqrt(var + eps) * w + b (biased variance, as torch). y may alias x.
void layer_norm(const float* x, int64_t n_rows, int64_t dim, const float* w, const float* b,
                float eps, float* y);

// RoPE frequencies for `rotary_dim` dims: inv_freq[i] = 1 / theta^(2i / rotary_dim), i < rotary_dim/2,
// computed in f32 as HF's default rope init does.
std::vector<float> rope_inv_freq(int64_t rotary_dim, float theta);

// cos/sin of pos * inv_freq[i] (f32 product, as HF's rotary embedding), each [rotary_dim/2].
void rope_cos_sin(std::span<const float> inv_freq, int64_t pos, float* cos_out, float* sin_out);

// NeoX (half-split) RoPE in place on dims [offset, offset + rotary_dim) of each of `n_heads` heads
// spaced `head_stride` floats apart: pairs (i, i + rotary_dim/2) rotate by angle i.
//   x1' = x1*cos - x2*sin;  x2' = x2*cos + x1*sin
void rope_neox(float* x, int64_t n_heads, int64_t head_stride, int64_t offset, int64_t rotary_dim,
               const float* cos, const float* sin);

// Interleaved (GPT-J) RoPE in place: pairs (offset + 2i, offset + 2i + 1) rotate by angle i.
void rope_interleaved(float* x, int64_t n_heads, int64_t head_stride, int64_t offset,
                      int64_t rotary_dim, const float* cos, const float* sin);

inline float silu(float x) { return x / (1.0f + __builtin_expf(-x)); }

// out[i] = silu(gate[i]) * up[i]. out may alias gate or up.
void silu_mul(const float* gate, const float* up, int64_t n, float* out);

// The CPU forwards check each sublayer's output so that a non-finite weight is blamed on its layer, not on
// the next layer's softmax: the index of the first NaN / Inf of x[0, n), or -1; and the failure naming
// `what` ("the attention output"), the batch entry, its position, the column, the value and likely causes.
// `other_entries`: how many further batch entries hold non-finite rows; 0 throws SequenceError (the one entry is
// at fault: the engine fails that request alone), more a plain Error (a weight all of them read, most likely).
// column < 0: the row's column and value are not known (the GPU step's logits flags), "... holds NaN or Inf".
int64_t first_non_finite(const float* x, int64_t n);
[[noreturn]] void fail_non_finite(const char* what, int64_t entry, int64_t position, int64_t column, float value,
                                  int64_t other_entries = 0);

// How many batch entries other than `entry` hold a row in (first, rows) that `non_finite(row)` flags, each counted
// once (rows of one entry are contiguous; `locate(row).first` is the row's entry): one entry is blamed only when the
// non-finite rows are all its own. A row of `entry` itself is not tested.
template <typename NonFinite, typename Locate>
int64_t other_non_finite_entries(int64_t first, int64_t rows, int64_t entry, NonFinite non_finite, Locate locate) {
  int64_t others = 0, last_other = -1;
  for (int64_t r = first + 1; r < rows; ++r) {
    const int64_t e = locate(r).first;
    if (e == entry || e == last_other || !non_finite(r)) continue;
    ++others;
    last_other = e;
  }
  return others;
}

// Both checked together on rows x [rows, H]: `locate(row)` gives the row's {batch entry, position} (each model
// lays its batch out its own way).
template <typename Locate>
void check_finite_rows(const float* x, int64_t rows, int64_t H, const char* what, Locate locate) {
  const int64_t i = first_non_finite(x, rows * H);
  if (i < 0) return;
  const auto [entry, position] = locate(i / H);
  const int64_t others = other_non_finite_entries(
      i / H, rows, entry, [&](int64_t r) { return first_non_finite(x + r * H, H) >= 0; }, locate);
  fail_non_finite(what, entry, position, i % H, x[i], others);
}

// Numerically stable softmax in place over n values (-inf entries get 0; all -inf is an error; a NaN or a +inf
// among them makes every output NaN, for the caller's non-finite check to blame on its sequence).
void softmax_inplace(float* x, int64_t n);

// out[t] = table[ids[t]] as f32; table is [vocab, dim] BF16 or F32. An id outside
// [0, vocab) fails naming the id, its position and vocab.
void embedding_lookup(const TensorView& table, std::span<const int32_t> ids, float* out);

// Index of the largest value (first one on ties).
int64_t argmax(const float* x, int64_t n);

// Converts a BF16/F32 tensor to f32 (e.g. norm weights, biases).
std::vector<float> to_f32(const TensorView& t);

}  // namespace fp4moe::model
