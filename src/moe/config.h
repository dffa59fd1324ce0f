// MoeConfig: everything the MoE block needs to know about routing and shapes, with the two router
// families: sigmoid + e_score_correction_bias with grouped top-k ("noaux_tc": GLM-4.5, GLM-5,
// DeepSeek-V3) and softmax top-k (Qwen3-MoE, Mixtral). Spec: ../shared/spec/nvfp4-and-glm.md §4.5.
// Tested by tests/moe/test_router.cpp and tests/moe/test_moe_golden.cpp.
#pragma once

#include <cstdint>
#include <limits>
#include <string>

#include <nlohmann/json_fwd.hpp>

namespace fp4moe::moe {

enum class ScoringFunc : uint8_t {
  kSigmoid,  // s = sigmoid(logit); choose by s + bias within the chosen groups; weights = s (unbiased)
  kSoftmax,  // s = softmax(logits over all experts); top-k of s; weights = s
};

struct MoeConfig {
  int64_t hidden = 0;            // hidden_size
  int64_t moe_intermediate = 0;  // moe_intermediate_size (per routed expert)
  int n_experts = 0;             // n_routed_experts
  int top_k = 0;                 // num_experts_per_tok
  int n_group = 1;
  int topk_group = 1;
  bool norm_topk_prob = true;           // divide the top-k weights by their sum (+1e-20 for sigmoid)
  float routed_scaling_factor = 1.0f;   // multiplies the final weights
  ScoringFunc scoring = ScoringFunc::kSigmoid;
  bool correction_bias = true;          // sigmoid: the router has gate.e_score_correction_bias [E]
  // Value given to experts of unchosen groups before the final top-k (HF masked_fill):
  // glm4_moe (and DeepSeek-V3) 0.0, glm_moe_dsa -inf.
  float masked_fill_value = 0.0f;
  int n_shared_experts = 0;       // shared expert intermediate = moe_intermediate * n_shared_experts

  int experts_per_group() const { return n_group > 0 ? n_experts / n_group : 0; }
  int64_t shared_intermediate() const { return moe_intermediate * n_shared_experts; }
  // Throws fp4moe::Error naming the field and values (E % n_group, topk_group <= n_group, ...).
  void validate() const;
  // "E=16 top-4 groups 1/1 sigmoid+bias norm scale 2.5 fill 0 H=128 I=64 shared 1"
  std::string to_string() const;
};

// From a Hugging Face config.json: model_type glm4_moe, glm_moe_dsa, deepseek_v3 (sigmoid family;
// fill -inf only for glm_moe_dsa), qwen3_moe / qwen2_moe / mixtral (softmax family). Throws naming
// the missing field or the unsupported model_type/scoring_func.
MoeConfig moe_config_from_hf(const nlohmann::json& config);

}  // namespace fp4moe::moe
