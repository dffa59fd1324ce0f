// MoeConfig validation, printing and parsing from a Hugging Face config.json. See config.h.
#include "moe/config.h"

#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>
#include <type_traits>

#include "core/error.h"
#include "format/json_file.h"

namespace fp4moe::moe {

void MoeConfig::validate() const {
  FP4MOE_CHECK(hidden >= 1 && moe_intermediate >= 1)
      << "MoE hidden=" << hidden << " moe_intermediate=" << moe_intermediate << " must be >= 1";
  FP4MOE_CHECK(n_experts >= 1 && top_k >= 1 && top_k <= n_experts)
      << "MoE top_k=" << top_k << " must be in [1, n_experts=" << n_experts << "]";
  FP4MOE_CHECK(n_group >= 1 && n_experts % n_group == 0)
      << "MoE n_experts=" << n_experts << " is not divisible by n_group=" << n_group;
  FP4MOE_CHECK(topk_group >= 1 && topk_group <= n_group)
      << "MoE topk_group=" << topk_group << " must be in [1, n_group=" << n_group << "]";
  if (scoring == ScoringFunc::kSigmoid && n_group > 1) {
    FP4MOE_CHECK(experts_per_group() >= 2)
        << "MoE group scores sum the top-2 experts of a group, but a group has " << experts_per_group()
        << " expert(s) (n_experts=" << n_experts << ", n_group=" << n_group << ")";
  }
  FP4MOE_CHECK(top_k <= topk_group * experts_per_group())
      << "MoE top_k=" << top_k << " exceeds the experts of the chosen groups (" << topk_group << " x "
      << experts_per_group() << ")";
  FP4MOE_CHECK(scoring == ScoringFunc::kSigmoid || n_group == 1)
      << "MoE softmax scoring supports n_group=1 only, got n_group=" << n_group;
  FP4MOE_CHECK(std::isfinite(routed_scaling_factor) && routed_scaling_factor > 0)
      << "MoE routed_scaling_factor=" << routed_scaling_factor << " must be finite and > 0 (it scales the routed "
      << "experts' weights)";
  FP4MOE_CHECK(n_shared_experts >= 0) << "MoE n_shared_experts=" << n_shared_experts << " must be >= 0";
}

std::string MoeConfig::to_string() const {
  std::ostringstream os;
  os << "E=" << n_experts << " top-" << top_k << " groups " << topk_group << "/" << n_group << " "
     << (scoring == ScoringFunc::kSigmoid ? (correction_bias ? "sigmoid+bias" : "sigmoid") : "softmax")
     << (norm_topk_prob ? " norm" : "") << " scale " << routed_scaling_factor;
  if (scoring == ScoringFunc::kSigmoid) os << " fill " << masked_fill_value;
  os << " H=" << hidden << " I=" << moe_intermediate << " shared " << n_shared_experts;
  return os.str();
}

namespace {

template <typename T>
T required(const nlohmann::json& c, const char* key, const std::string& model_type) {
  FP4MOE_CHECK(c.contains(key) && !c.at(key).is_null())
      << "config.json (model_type " << model_type << "): missing field '" << key << "'";
  try {
    if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
      // nlohmann's get<int> wraps 2^32 + 8 to 8: the value must fit T as written.
      const nlohmann::json& v = c.at(key);
      FP4MOE_CHECK(v.is_number_integer()) << "config.json (model_type " << model_type << "): field '" << key
                                          << "' must be an integer, got " << v.dump();
      const bool fits = format::json_int_in(v, std::numeric_limits<T>::min(), std::numeric_limits<T>::max());
      FP4MOE_CHECK(fits) << "config.json (model_type " << model_type << "): field '" << key << "' = " << v.dump()
                         << " is past the range of the " << 8 * sizeof(T) << "-bit integer it is read into";
    }
    return c.at(key).get<T>();
  } catch (const nlohmann::json::exception& e) {
    FP4MOE_FAIL() << "config.json (model_type " << model_type << "): field '" << key << "' has the wrong type: "
                  << c.at(key).dump();
  }
  return T{};
}

template <typename T>
T optional_field(const nlohmann::json& c, const char* key, T fallback, const std::string& model_type) {
  if (!c.contains(key) || c.at(key).is_null()) return fallback;
  return required<T>(c, key, model_type);
}

}  // namespace

MoeConfig moe_config_from_hf(const nlohmann::json& c) {
  FP4MOE_CHECK(c.is_object()) << "config.json: expected a JSON object";
  const std::string mt = c.value("model_type", std::string{});
  MoeConfig cfg;
  cfg.hidden = required<int64_t>(c, "hidden_size", mt);
  if (mt == "glm4_moe" || mt == "glm_moe_dsa" || mt == "deepseek_v3") {
    cfg.moe_intermediate = required<int64_t>(c, "moe_intermediate_size", mt);
    cfg.n_experts = required<int>(c, "n_routed_experts", mt);
    cfg.top_k = required<int>(c, "num_experts_per_tok", mt);
    cfg.n_group = optional_field<int>(c, "n_group", 1, mt);
    cfg.topk_group = optional_field<int>(c, "topk_group", 1, mt);
    cfg.norm_topk_prob = optional_field<bool>(c, "norm_topk_prob", true, mt);
    cfg.routed_scaling_factor = optional_field<float>(c, "routed_scaling_factor", 1.0f, mt);
    cfg.n_shared_experts =
        optional_field<int>(c, "n_shared_experts", 1, mt);  // transformers' default (model/config.cpp too)
    const std::string scoring = optional_field<std::string>(c, "scoring_func", "sigmoid", mt);
    FP4MOE_CHECK(scoring == "sigmoid")
        << "config.json (model_type " << mt << "): scoring_func '" << scoring << "' is not supported (sigmoid only)";
    cfg.scoring = ScoringFunc::kSigmoid;
    cfg.correction_bias = true;
    // transformers GlmMoeDsaMoE masks unchosen groups with -inf; Glm4MoeMoE/DeepseekV3MoE with 0.0.
    cfg.masked_fill_value = mt == "glm_moe_dsa" ? -std::numeric_limits<float>::infinity() : 0.0f;
  } else if (mt == "qwen3_moe") {
    cfg.moe_intermediate = required<int64_t>(c, "moe_intermediate_size", mt);
    cfg.n_experts = required<int>(c, "num_experts", mt);
    cfg.top_k = required<int>(c, "num_experts_per_tok", mt);
    cfg.norm_topk_prob = optional_field<bool>(c, "norm_topk_prob", false, mt);
    cfg.scoring = ScoringFunc::kSoftmax;
    cfg.correction_bias = false;
  } else if (mt == "mixtral") {
    cfg.moe_intermediate = required<int64_t>(c, "intermediate_size", mt);
    cfg.n_experts = required<int>(c, "num_local_experts", mt);
    cfg.top_k = required<int>(c, "num_experts_per_tok", mt);
    cfg.norm_topk_prob = true;  // Mixtral always renormalizes the top-k softmax weights
    cfg.scoring = ScoringFunc::kSoftmax;
    cfg.correction_bias = false;
  } else {
    FP4MOE_FAIL() << "config.json: model_type '" << mt
                  << "' has no MoE support (glm4_moe, glm_moe_dsa, deepseek_v3, qwen3_moe, mixtral)";
  }
  cfg.validate();
  return cfg;
}

}  // namespace fp4moe::moe
