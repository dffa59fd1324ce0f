// Loading MoE/MLP weights from a checkpoint (TensorStore) into kernel-ready LinearWeights, and
// random weights for benchmarks and `--load-format dummy`. Per Linear the format is decided from
// the tensors present (§2.2 rule): U8 `.weight` + F8_E4M3 `.weight_scale` (+ F32 `.weight_scale_2`,
// optional `.input_scale`) is NVFP4, else BF16/F32 `.weight`. Errors name the tensor, the expected
// and the found shape/dtype. Tested by tests/moe/test_linear.cpp (LoadLinear.*) and tests/moe/.
#pragma once

#include <cstdint>
#include <string>

#include "format/safetensors.h"
#include "kernels/cpu/linear.h"

namespace fp4moe::moe {

using kernels::cpu::LinearWeight;
using kernels::cpu::WeightFormat;

// module = "model.layers.1.mlp.experts.3.up_proj" (tensors `<module>.weight`, ...); [out, in].
// bias: `<module>.bias` must be present (and is loaded); otherwise it is not read.
LinearWeight load_linear(const format::TensorStore& store, const std::string& module, int64_t out,
                         int64_t in, bool bias = false);

// Random weight in the given format, deterministic from seed: values ~ U(-a, a) with
// a = 1/sqrt(in) (NVFP4: quantized from such values with the ModelOpt recipe).
LinearWeight random_linear(WeightFormat format, int64_t out, int64_t in, uint64_t seed, bool bias = false);

}  // namespace fp4moe::moe
