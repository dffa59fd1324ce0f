// CPU Linear layer y = x W^T + b with the weight kept in its stored form: F32, BF16 or NVFP4
// (ModelOpt layout: packed e2m1 [out, in/2] low nibble = even k, e4m3 block scales [out, in/16],
// f32 global scale weight_scale_2). Weight rows are dequantized on the fly in the exact ModelOpt
// order, w = e2m1 * (f32(scale) * weight_scale_2) (../shared/spec/nvfp4-and-glm.md §1.3; the
// decoders are format/nvfp4.h's), and
// dot products accumulate in f32. Work is split over blocks of output rows on the default thread
// pool; each block is dequantized once and applied to all m input rows (cache-friendly for prefill).
// The result does not depend on the thread count.
//
// This file knows nothing of checkpoints or tensor names: linear_weight_from_tensors takes views,
// moe/weights.h (load_linear) finds them in a TensorStore.
// Tested by tests/moe/test_linear.cpp (f64 reference on fresh random data, all formats).
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/tensor.h"
#include "format/nvfp4.h"

namespace fp4moe::kernels::cpu {

enum class WeightFormat : uint8_t { kF32, kBF16, kNVFP4 };

std::string_view weight_format_name(WeightFormat f);  // "F32", "BF16", "NVFP4"

// A Linear weight [out_features, in_features] in its stored form (owning), plus an optional bias.
struct LinearWeight {
  WeightFormat format = WeightFormat::kF32;
  int64_t out_features = 0;
  int64_t in_features = 0;
  std::vector<float> f32;         // kF32:   [out, in]
  std::vector<uint16_t> bf16;     // kBF16:  [out, in] bf16 bit patterns
  std::vector<uint8_t> packed;    // kNVFP4: [out, in/2] e2m1 codes, low nibble = even k
  std::vector<uint8_t> scales;    // kNVFP4: [out, in/16] float8_e4m3fn block scales (linear layout)
  float global_scale = 1.0f;      // kNVFP4: weight_scale_2
  std::optional<float> input_scale;  // kNVFP4: activation scale, kept for information (W4A16 ignores it)
  std::vector<float> bias;        // [out] or empty

  static LinearWeight from_f32(int64_t out, int64_t in, std::vector<float> w, std::vector<float> bias = {});
  static LinearWeight from_bf16(int64_t out, int64_t in, std::vector<uint16_t> w, std::vector<float> bias = {});
  static LinearWeight from_nvfp4(int64_t out, int64_t in, std::vector<uint8_t> packed,
                                 std::vector<uint8_t> scales, float global_scale,
                                 std::optional<float> input_scale = std::nullopt,
                                 std::vector<float> bias = {});

  bool has_bias() const { return !bias.empty(); }
  // Bytes of the stored weight (+ scales), without the bias.
  int64_t weight_bytes() const;
  // Throws fp4moe::Error (with the sizes) when the buffers do not match the format and shape.
  void validate() const;
  // "NVFP4 [64, 128] +bias"
  std::string describe() const;
};

// y[m, out] = x[m, in] W^T (+ bias). x and y must not alias. m may be 0.
void linear_forward(const LinearWeight& w, const float* x, int64_t m, float* y);

// Dequantized row `row` of W into out[in_features] (exact ModelOpt order for NVFP4).
void dequantize_row(const LinearWeight& w, int64_t row, float* out);
// The whole dequantized W [out, in].
std::vector<float> dequantize(const LinearWeight& w);

// The tensors of one Linear as found in a checkpoint (views; nullptr = absent). `module` names
// the Linear in errors, e.g. "model.layers.1.mlp.experts.3.up_proj".
struct LinearTensors {
  std::string module;
  const TensorView* weight = nullptr;          // U8 [out, in/2] (NVFP4) or BF16/F32 [out, in]
  const TensorView* weight_scale = nullptr;    // F8_E4M3 [out, in/16]
  const TensorView* weight_scale_2 = nullptr;  // F32 [] (or [1])
  const TensorView* input_scale = nullptr;     // F32 [] (or [1])
  const TensorView* bias = nullptr;            // BF16/F32 [out]
};

// Builds (copies) a LinearWeight of shape [out, in] from views: NVFP4 when the weight is U8 and a
// weight_scale is present (then weight_scale_2 is required), else BF16/F32. Every mismatch throws
// naming the tensor with the expected and found shape/dtype. want_bias: the bias must be present.
LinearWeight linear_weight_from_tensors(const LinearTensors& t, int64_t out, int64_t in, bool want_bias);

}  // namespace fp4moe::kernels::cpu
