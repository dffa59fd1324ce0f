// MoeLayer: the whole MoE block of a GLM-style decoder layer on the CPU (f32 activations):
//   logits = x Wg^T (f32, router weight F32/BF16), route (moe/router.h), dispatch (moe/dispatch.h),
//   each routed expert runs GatedMlp on its dispatched rows, combine y[t] = sum_s w[t,s] * out[t,s]
//   in slot order (deterministic), then + shared expert(s).
// Experts run one after another with the Linears parallel over output rows, or, when enough
// experts are active, in parallel one expert per task; both give bit-identical results.
// Tensors: <prefix>.gate.weight [E, H], <prefix>.gate.e_score_correction_bias [E] (F32, sigmoid
// family), <prefix>.experts.{e}.{gate,up,down}_proj, <prefix>.shared_experts.{gate,up,down}_proj.
// Tested by tests/moe/test_moe_golden.cpp (the four golden models) and test_moe_random.cpp (f64 ref).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "format/safetensors.h"
#include "kernels/cpu/linear.h"
#include "moe/config.h"
#include "moe/dispatch.h"
#include "moe/mlp.h"

namespace fp4moe::moe {

// What one forward decided, for tests, statistics and the GPU path.
struct MoeTrace {
  std::vector<float> router_logits;   // [n_tokens, E]
  std::vector<int32_t> topk_idx;      // [n_tokens, top_k]
  std::vector<float> topk_weights;    // [n_tokens, top_k]
  DispatchPlan plan;
};

class MoeLayer {
 public:
  MoeLayer() = default;
  // Takes ownership; checks every shape against cfg (throws naming the part).
  MoeLayer(MoeConfig cfg, std::string prefix, kernels::cpu::LinearWeight router,
           std::vector<float> correction_bias, std::vector<GatedMlp> experts,
           std::optional<GatedMlp> shared);

  // prefix = "model.layers.1.mlp".
  static MoeLayer load(const format::TensorStore& store, const std::string& prefix, const MoeConfig& cfg);
  // <prefix>.gate.e_score_correction_bias as f32 [E] (F32 or BF16 on disk); empty unless cfg uses a
  // sigmoid router with a correction bias. Throws naming the tensor when it is missing or misshapen.
  static std::vector<float> load_correction_bias(const format::TensorStore& store, const std::string& prefix,
                                                 const MoeConfig& cfg);
  // Random weights (experts and shared expert in `format`, router F32), deterministic from seed.
  static MoeLayer random(const MoeConfig& cfg, kernels::cpu::WeightFormat format, uint64_t seed,
                         const std::string& prefix = "random.mlp");

  // y[n_tokens, hidden] = MoE(x[n_tokens, hidden]); y may not alias x.
  void forward(const float* x, int64_t n_tokens, float* y, MoeTrace* trace = nullptr) const;

  // Calibration hook: sees the input of every Linear: "<prefix>.gate" (router, all tokens),
  // "<prefix>.experts.{e}.{gate,up,down}_proj" (the rows dispatched to expert e; not called for an
  // expert with no tokens) and "<prefix>.shared_experts.*". Called from the forward's thread.
  void set_linear_input_observer(LinearInputObserver observer) { observer_ = std::move(observer); }

  const MoeConfig& config() const { return cfg_; }
  const std::string& prefix() const { return prefix_; }
  const kernels::cpu::LinearWeight& router() const { return router_; }
  const std::vector<float>& correction_bias() const { return correction_bias_; }
  const std::vector<GatedMlp>& experts() const { return experts_; }
  const std::optional<GatedMlp>& shared() const { return shared_; }

 private:
  MoeConfig cfg_;
  std::string prefix_;
  kernels::cpu::LinearWeight router_;
  std::vector<float> correction_bias_;
  std::vector<GatedMlp> experts_;
  std::optional<GatedMlp> shared_;
  LinearInputObserver observer_;
};

}  // namespace fp4moe::moe
