// GatedMlp: down(silu(gate(x)) * up(x)) on the CPU Linear kernel. See mlp.h.
#include "moe/mlp.h"

#include <cmath>
#include <vector>

#include "core/error.h"
#include "moe/weights.h"

namespace fp4moe::moe {

GatedMlp GatedMlp::load(const format::TensorStore& store, const std::string& prefix, int64_t hidden,
                        int64_t intermediate) {
  GatedMlp m;
  m.prefix = prefix;
  m.gate = load_linear(store, prefix + ".gate_proj", intermediate, hidden);
  m.up = load_linear(store, prefix + ".up_proj", intermediate, hidden);
  m.down = load_linear(store, prefix + ".down_proj", hidden, intermediate);
  return m;
}

GatedMlp GatedMlp::random(kernels::cpu::WeightFormat format, int64_t hidden, int64_t intermediate, uint64_t seed,
                          const std::string& prefix) {
  GatedMlp m;
  m.prefix = prefix;
  m.gate = random_linear(format, intermediate, hidden, seed * 3 + 0);
  m.up = random_linear(format, intermediate, hidden, seed * 3 + 1);
  m.down = random_linear(format, hidden, intermediate, seed * 3 + 2);
  return m;
}

void GatedMlp::forward(const float* x, int64_t rows, float* y, const LinearInputObserver* observer) const {
  const int64_t h = hidden();
  const int64_t i = intermediate();
  FP4MOE_CHECK(up.out_features == i && up.in_features == h && down.out_features == h && down.in_features == i)
      << prefix << ": inconsistent MLP shapes gate " << gate.describe() << ", up " << up.describe() << ", down "
      << down.describe();
  if (rows == 0) return;
  std::vector<float> g(static_cast<size_t>(rows * i)), u(static_cast<size_t>(rows * i));
  if (observer != nullptr && *observer) {
    (*observer)(prefix + ".gate_proj", x, rows, h);
    (*observer)(prefix + ".up_proj", x, rows, h);
  }
  kernels::cpu::linear_forward(gate, x, rows, g.data());
  kernels::cpu::linear_forward(up, x, rows, u.data());
  for (size_t k = 0; k < g.size(); ++k) {
    const float v = g[k];
    g[k] = v / (1.0f + std::exp(-v)) * u[k];  // silu(gate) * up
  }
  if (observer != nullptr && *observer) (*observer)(prefix + ".down_proj", g.data(), rows, i);
  kernels::cpu::linear_forward(down, g.data(), rows, y);
}

}  // namespace fp4moe::moe
