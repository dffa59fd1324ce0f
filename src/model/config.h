// model::ModelConfig: everything the GLM-4.5 (Glm4MoeForCausalLM) and GLM-5 (GlmMoeDsaForCausalLM) forwards
// read from a Hugging Face config.json (spec ../shared/spec/nvfp4-and-glm.md §4.1, §4.7), with the
// defaults transformers 5.17 applies when a field is absent, plus the quantization description
// (format::QuantConfig, read by format/checkpoint.h's read_quant_config). format::ModelConfig holds
// only what checkpoint validation needs; this one holds what the forward needs.
//
// An unknown architecture, a missing required field, or a field of the wrong JSON type fails with
// the file and the field named. Tested by tests/model/test_config.cpp.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "format/checkpoint.h"
#include "moe/config.h"

namespace fp4moe::model {

inline constexpr const char* kArchGlm4Moe = "Glm4MoeForCausalLM";
inline constexpr const char* kArchGlmMoeDsa = "GlmMoeDsaForCausalLM";

// The model's generation_config.json (transformers' GenerationConfig): the end-of-sequence tokens it adds to
// config.json's (SGLang and vLLM stop at both) and the sampling values its authors recommend, which the server's
// `--sampling-defaults model` applies to the OpenAI routes as SGLang (chat) and vLLM (`--generation-config auto`:
// chat and completions) do. Only the fields the file gives are taken (not transformers' class defaults, e.g. its
// top_k 50); max_new_tokens and do_sample are not read (SGLang reads neither; vLLM caps max_tokens by the former).
// The ranges are the requests' (engine::sampling_defaults_from checks them). A model without the file has source
// empty.
struct GenerationDefaults {
  std::string source;                  // the file, for messages; empty when the model has none
  std::vector<int64_t> eos_token_ids;  // its eos_token_id (int or list), in [0, vocab_size)
  std::optional<double> temperature;
  std::optional<double> top_p;
  std::optional<int64_t> top_k;
  std::optional<double> min_p;
  std::optional<double> repetition_penalty;
  // A sampling field of the wrong JSON type ("field \"top_k\" must be an integer, found 1.5"): kept, not thrown,
  // since only `serve --sampling-defaults model` reads these fields (it refuses them; inspect lists them).
  std::vector<std::string> problems;

  // Calls f(name, member) for each sampling field above (of g, const or not): the one list of them.
  template <class Self, class F>
  static void for_each_sampling(Self& g, F&& f) {
    f("temperature", g.temperature);
    f("top_p", g.top_p);
    f("top_k", g.top_k);
    f("min_p", g.min_p);
    f("repetition_penalty", g.repetition_penalty);
  }
  template <class F>
  void for_each_sampling(F&& f) const {
    for_each_sampling(*this, f);
  }
  bool has_sampling() const;
  std::string sampling_summary() const;  // "temperature 0.6, top_p 0.95" (empty when none)
};

struct ModelConfig {
  std::string source;        // the file it came from, for messages
  std::string architecture;  // architectures[0], e.g. "Glm4MoeForCausalLM"
  std::string model_type;    // "glm4_moe", "glm_moe_dsa"

  // Shared by both families.
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;
  int64_t head_dim = 0;                  // GLM-4.x attention head dim; GLM-5: rope dim only (ignore)
  int64_t intermediate_size = 0;         // dense MLP
  int64_t max_position_embeddings = 0;
  float rms_norm_eps = 1e-5f;
  std::string hidden_act = "silu";
  bool tie_word_embeddings = false;
  bool attention_bias = false;           // GLM-4.x: bias on q/k/v (never on o_proj)
  bool mlp_bias = false;
  std::optional<int64_t> bos_token_id;
  std::optional<int64_t> pad_token_id;
  // config.json's eos_token_id (int or list); load_model_config adds generation_config.json's (as SGLang and vLLM
  // stop at both), so this is every token that ends a sequence.
  std::vector<int64_t> eos_token_ids;

  // RoPE ("rope_parameters" in transformers 5, or the legacy top-level rope_theta / rope_scaling).
  float rope_theta = 10000.0f;
  std::string rope_type = "default";     // only "default" is implemented; others fail at model build
  float partial_rotary_factor = 1.0f;    // GLM-4.x: 0.5 -> RoPE on the first half of head_dim
  bool rope_interleave = false;          // GLM-5 MLA: true (GPT-J pairs); GLM-4.x: false (NeoX)
  bool indexer_rope_interleave = false;  // GLM-5 DSA indexer

  // GLM-4.x attention extras.
  bool use_qk_norm = false;              // per-head RMSNorm on q and k before RoPE

  // MoE (spec §4.5).
  int64_t moe_intermediate_size = 0;
  int64_t n_routed_experts = 0;
  int64_t num_experts_per_tok = 0;
  int64_t n_shared_experts = 0;
  int64_t n_group = 1;
  int64_t topk_group = 1;
  bool norm_topk_prob = true;
  float routed_scaling_factor = 1.0f;
  std::string scoring_func = "sigmoid";  // "sigmoid" (+ e_score_correction_bias): the only one the GLM routers use
  std::string topk_method = "noaux_tc";
  int64_t first_k_dense_replace = 0;
  std::vector<std::string> mlp_layer_types;  // per layer "dense" or "sparse" (derived when absent)
  int64_t num_nextn_predict_layers = 0;      // MTP layers after num_hidden_layers (not run)

  // GLM-5 MLA (spec §4.3).
  int64_t q_lora_rank = 0;
  int64_t kv_lora_rank = 0;
  int64_t qk_nope_head_dim = 0;
  int64_t qk_rope_head_dim = 0;
  int64_t qk_head_dim = 0;
  int64_t v_head_dim = 0;

  // GLM-5 DSA indexer (spec §4.4).
  int64_t index_topk = 0;
  int64_t index_head_dim = 0;
  int64_t index_n_heads = 0;
  std::vector<std::string> indexer_types;    // per layer "full" or "shared" (derived when absent)
  std::vector<std::string> layer_types;      // per layer attention type, as given

  // How the checkpoint says it is quantized (hf_quant_config.json or config.json
  // quantization_config). Loaders decide per Linear from the tensors present (spec §2.2); this is
  // the cross-check. Absent (present == false) for dummy weights and plain BF16 checkpoints.
  format::QuantConfig quantization;
  nlohmann::json raw;                        // the whole config.json, for anything not above
  GenerationDefaults generation;             // generation_config.json (load_model_config reads it)

  bool is_moe_layer(int64_t layer) const;    // mlp_layer_types[layer] == "sparse"
  int64_t rotary_dim() const;                // GLM-4.x: head_dim * partial_rotary_factor (even)
  std::string summary() const;               // one line: arch, layers, hidden, heads, experts
  // What the MoE layers run with (the fields above; the masked-group fill by architecture: -inf for GLM-5, 0 for
  // GLM-4.5, as transformers). The one source of the MoE layers' config: they do not parse config.json again.
  moe::MoeConfig moe_config() const;
};

// Parses a config.json object. `source` names it in errors. Fails on an unknown architecture
// (naming it and the known ones), on missing required fields and on inconsistent values
// (e.g. heads not divisible by kv heads, mlp_layer_types of the wrong length).
ModelConfig parse_model_config(const nlohmann::json& j, const std::string& source);

// Parses a generation_config.json object; `source` names it in errors. Fails when it is not an object or its
// eos_token_id is not ids in [0, vocab_size) (they decide where replies end); a sampling field of the wrong type goes
// to `problems`. Null fields count as absent.
GenerationDefaults parse_generation_config(const nlohmann::json& j, const std::string& source, int64_t vocab_size);

// Reads dir/generation_config.json when there is one (a dangling link is an error, as for config.json) into
// c.generation and adds its eos ids to c.eos_token_ids; fails naming the file on malformed JSON or a bad eos.
void load_generation_config(const std::filesystem::path& dir, ModelConfig& c);

// Reads dir/config.json and its quantization section (format::read_quant_config), whose problems go to `problems`
// (format::Checkpoint lists the same ones): nothing about the section is refused.
ModelConfig read_model_config(const std::filesystem::path& dir, std::vector<format::CheckpointProblem>* problems);

// read_model_config, refusing a quantization section with a problem or one this loader cannot read (FP8, group 32),
// and unless with_generation is false dir/generation_config.json (load_generation_config).
ModelConfig load_model_config(const std::filesystem::path& dir, bool with_generation = true);

// The architectures parse_model_config accepts.
const std::vector<std::string>& known_architectures();

}  // namespace fp4moe::model
