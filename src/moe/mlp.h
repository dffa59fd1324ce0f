// GatedMlp: the SwiGLU MLP y = down(silu(gate(x)) * up(x)) used by routed experts, shared experts
// and the dense layers of GLM models, on kernels::cpu::linear_forward (weights F32/BF16/NVFP4).
// silu(g) = g / (1 + exp(-g)) in f32. Tested by tests/moe/test_moe_random.cpp.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "format/safetensors.h"
#include "kernels/cpu/linear.h"

namespace fp4moe::moe {

// Called with the input of each Linear (module name, x [rows, cols]) for calibration (amax).
using LinearInputObserver =
    std::function<void(const std::string& module, const float* x, int64_t rows, int64_t cols)>;

struct GatedMlp {
  std::string prefix;  // e.g. "model.layers.1.mlp.experts.3"; modules are prefix + ".gate_proj" ...
  kernels::cpu::LinearWeight gate;  // [intermediate, hidden]
  kernels::cpu::LinearWeight up;    // [intermediate, hidden]
  kernels::cpu::LinearWeight down;  // [hidden, intermediate]

  int64_t hidden() const { return gate.in_features; }
  int64_t intermediate() const { return gate.out_features; }

  // Loads `<prefix>.{gate,up,down}_proj` with shapes checked against hidden/intermediate.
  static GatedMlp load(const format::TensorStore& store, const std::string& prefix, int64_t hidden,
                       int64_t intermediate);
  static GatedMlp random(kernels::cpu::WeightFormat format, int64_t hidden, int64_t intermediate,
                         uint64_t seed, const std::string& prefix = "random");

  // y[rows, hidden] = down(silu(gate(x)) * up(x)); y may not alias x. The observer (if any) sees
  // the inputs of gate_proj, up_proj (both x) and down_proj (the activation).
  void forward(const float* x, int64_t rows, float* y, const LinearInputObserver* observer = nullptr) const;
};

}  // namespace fp4moe::moe
