// Built-in dummy-model configs (see presets.h). Tested by tests/model/test_presets.cpp.
#include "model/presets.h"

#include <filesystem>
#include <sstream>

#include "core/error.h"

namespace fp4moe::model {
namespace {

using nlohmann::json;

struct Preset {
  const char* name;
  const char* what;
  json (*make)();
};

json glm5(int64_t hidden, int64_t layers, int64_t heads, int64_t q_lora, int64_t nope, int64_t v, int64_t dense_i,
          int64_t moe_i, int64_t experts, int64_t index_heads, int64_t index_topk) {
  json types = json::array(), mlp = json::array(), idx = json::array();
  for (int64_t l = 0; l < layers; ++l) {
    types.push_back("deepseek_sparse_attention");
    mlp.push_back(l == 0 ? "dense" : "sparse");
    idx.push_back("full");
  }
  return json{{"architectures", {"GlmMoeDsaForCausalLM"}},
              {"model_type", "glm_moe_dsa"},
              {"vocab_size", 154880},
              {"hidden_size", hidden},
              {"num_hidden_layers", layers},
              {"num_attention_heads", heads},
              {"num_key_value_heads", heads},
              {"q_lora_rank", q_lora},
              {"kv_lora_rank", 512},
              {"qk_nope_head_dim", nope},
              {"qk_rope_head_dim", 64},
              {"qk_head_dim", nope + 64},
              {"v_head_dim", v},
              {"head_dim", 64},
              {"attention_bias", false},
              {"first_k_dense_replace", 1},
              {"mlp_layer_types", mlp},
              {"layer_types", types},
              {"indexer_types", idx},
              {"intermediate_size", dense_i},
              {"moe_intermediate_size", moe_i},
              {"n_routed_experts", experts},
              {"num_experts_per_tok", 8},
              {"n_shared_experts", 1},
              {"n_group", 1},
              {"topk_group", 1},
              {"routed_scaling_factor", 2.5},
              {"norm_topk_prob", true},
              {"hidden_act", "silu"},
              {"rms_norm_eps", 1e-5},
              {"rope_parameters", {{"rope_theta", 1000000.0}, {"rope_type", "default"}}},
              {"index_topk", index_topk},
              {"index_head_dim", 128},
              {"index_n_heads", index_heads},
              {"max_position_embeddings", 32768},
              {"tie_word_embeddings", false},
              {"bos_token_id", 0},
              {"eos_token_id", json::array({154820, 154827, 154829})},
              {"mlp_bias", false},
              {"torch_dtype", "bfloat16"}};
}

json glm45_air_shard() {
  return json{{"architectures", {"Glm4MoeForCausalLM"}},
              {"model_type", "glm4_moe"},
              {"vocab_size", 151552},
              {"hidden_size", 4096},
              {"num_hidden_layers", 4},
              {"num_attention_heads", 96},
              {"num_key_value_heads", 8},
              {"head_dim", 128},
              {"attention_bias", true},
              {"use_qk_norm", false},
              {"partial_rotary_factor", 0.5},
              {"rope_parameters", {{"rope_theta", 1000000.0}, {"rope_type", "default"}, {"partial_rotary_factor", 0.5}}},
              {"max_position_embeddings", 32768},
              {"intermediate_size", 10944},
              {"moe_intermediate_size", 1408},
              {"n_routed_experts", 32},
              {"num_experts_per_tok", 8},
              {"n_shared_experts", 1},
              {"first_k_dense_replace", 1},
              {"routed_scaling_factor", 1.0},
              {"n_group", 1},
              {"topk_group", 1},
              {"norm_topk_prob", true},
              {"hidden_act", "silu"},
              {"rms_norm_eps", 1e-5},
              {"tie_word_embeddings", false},
              {"eos_token_id", json::array({151329, 151336, 151338})},
              {"torch_dtype", "bfloat16"}};
}

const Preset kPresets[] = {
    {"glm5-shard", "GLM-5 widths, 4 layers (1 dense + 3 MoE), 32 experts top-8 + shared (1/8 of 256: 8-way EP)",
     [] { return glm5(6144, 4, 64, 2048, 192, 256, 12288, 2048, 32, 32, 2048); }},
    {"glm5-small", "GLM-5 architecture, H 2048, 8 layers, 16 MLA heads, 64 experts top-8 + shared (I 768)",
     [] { return glm5(2048, 8, 16, 768, 128, 128, 5120, 768, 64, 16, 512); }},
    {"glm45-air-shard", "GLM-4.5-Air widths, 4 layers (1 dense + 3 MoE), 32 experts top-8 + shared (1/4 of 128)",
     glm45_air_shard},
};

}  // namespace

std::vector<std::string> preset_names() {
  std::vector<std::string> n;
  for (const Preset& p : kPresets) n.push_back(p.name);
  return n;
}

std::optional<json> preset_config(const std::string& name) {
  for (const Preset& p : kPresets) {
    if (name == p.name) return p.make();
  }
  return std::nullopt;
}

std::string describe_presets() {
  std::ostringstream os;
  for (const Preset& p : kPresets) os << p.name << ": " << p.what << "\n";
  return os.str();
}

ModelConfig load_config_or_preset(const std::string& dir_or_preset) {
  if (std::filesystem::exists(dir_or_preset)) return load_model_config(dir_or_preset);
  const std::optional<json> p = preset_config(dir_or_preset);
  if (!p) {
    std::string names;
    for (const Preset& q : kPresets) names += (names.empty() ? "" : ", ") + std::string(q.name);
    FP4MOE_FAIL() << dir_or_preset << " is neither a model directory nor a preset (" << names << ")";
  }
  return parse_model_config(*p, "preset " + dir_or_preset);
}

}  // namespace fp4moe::model
