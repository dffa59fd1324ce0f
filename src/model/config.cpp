// Parsing of config.json into model::ModelConfig (see config.h). Defaults are those of
// transformers 5.17's Glm4MoeConfig / GlmMoeDsaConfig for fields a checkpoint may omit; the
// dimensions every forward needs are required. Tested by tests/model/test_config.cpp.
#include "model/config.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <sstream>
#include <type_traits>

#include "core/error.h"
#include "format/json_file.h"

namespace fp4moe::model {
namespace {

using json = nlohmann::json;

const json* field(const json& j, const char* key) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return nullptr;
  return &*it;
}

int64_t get_int(const json& j, const char* key, const std::string& src, std::optional<int64_t> dflt) {
  const json* v = field(j, key);
  if (v == nullptr) {
    FP4MOE_CHECK(dflt.has_value()) << src << ": required field \"" << key << "\" is missing";
    return *dflt;
  }
  FP4MOE_CHECK(v->is_number_integer())
      << src << ": field \"" << key << "\" must be an integer, found " << v->dump();
  // Kept as int64 here, but some consumers hold 32 bits (index_topk 2^32 + 8 ran as 8): no config field
  // of a real model comes near 2^31.
  FP4MOE_CHECK(format::json_int_in(*v, INT32_MIN, INT32_MAX))
      << src << ": field \"" << key << "\" = " << v->dump() << " is past the 32-bit range";
  return v->get<int64_t>();
}

double get_num(const json& j, const char* key, const std::string& src, std::optional<double> dflt) {
  const json* v = field(j, key);
  if (v == nullptr) {
    FP4MOE_CHECK(dflt.has_value()) << src << ": required field \"" << key << "\" is missing";
    return *dflt;
  }
  FP4MOE_CHECK(v->is_number()) << src << ": field \"" << key << "\" must be a number, found " << v->dump();
  return v->get<double>();
}

bool get_bool(const json& j, const char* key, const std::string& src, bool dflt) {
  const json* v = field(j, key);
  if (v == nullptr) return dflt;
  FP4MOE_CHECK(v->is_boolean()) << src << ": field \"" << key << "\" must be true/false, found " << v->dump();
  return v->get<bool>();
}

std::string get_str(const json& j, const char* key, const std::string& src, const std::string& dflt) {
  const json* v = field(j, key);
  if (v == nullptr) return dflt;
  FP4MOE_CHECK(v->is_string()) << src << ": field \"" << key << "\" must be a string, found " << v->dump();
  return v->get<std::string>();
}

std::vector<std::string> get_str_list(const json& j, const char* key, const std::string& src) {
  std::vector<std::string> out;
  const json* v = field(j, key);
  if (v == nullptr) return out;
  FP4MOE_CHECK(v->is_array()) << src << ": field \"" << key << "\" must be a list, found " << v->dump();
  for (const json& e : *v) {
    FP4MOE_CHECK(e.is_string()) << src << ": field \"" << key << "\" must list strings, found " << e.dump();
    out.push_back(e.get<std::string>());
  }
  return out;
}

std::optional<int64_t> get_opt_int(const json& j, const char* key, const std::string& src) {
  const json* v = field(j, key);
  if (v == nullptr) return std::nullopt;
  if (v->is_array()) {  // e.g. a list-valued pad id: take the first
    FP4MOE_CHECK(!v->empty() && (*v)[0].is_number_integer())
        << src << ": field \"" << key << "\" must be an integer or a list of integers, found " << v->dump();
    return (*v)[0].get<int64_t>();
  }
  FP4MOE_CHECK(v->is_number_integer()) << src << ": field \"" << key << "\" must be an integer, found " << v->dump();
  return v->get<int64_t>();
}

// A token id or a list of them (eos_token_id), each in [0, vocab_size); empty when absent.
std::vector<int64_t> get_token_ids(const json& j, const char* key, const std::string& src, int64_t vocab_size) {
  std::vector<int64_t> ids;
  const json* v = field(j, key);
  if (v == nullptr) return ids;
  if (v->is_array()) {
    for (const json& e : *v) {
      FP4MOE_CHECK(e.is_number_integer()) << src << ": " << key << " lists a non-integer " << e.dump();
      ids.push_back(e.get<int64_t>());
    }
  } else {
    FP4MOE_CHECK(v->is_number_integer()) << src << ": " << key << " must be an integer or a list, found " << v->dump();
    ids.push_back(v->get<int64_t>());
  }
  for (int64_t id : ids) {
    FP4MOE_CHECK(id >= 0 && id < vocab_size)
        << src << ": " << key << " " << id << " is outside the vocabulary [0, " << vocab_size << ")";
  }
  return ids;
}

void parse_rope(const json& j, const std::string& src, ModelConfig& c) {
  // transformers 5: rope_parameters {rope_theta, rope_type, partial_rotary_factor}; older files: top-level
  // rope_theta and rope_scaling {type|rope_type, ...}.
  c.rope_theta = static_cast<float>(get_num(j, "rope_theta", src, 10000.0));
  c.partial_rotary_factor = static_cast<float>(get_num(j, "partial_rotary_factor", src, c.partial_rotary_factor));
  for (const char* key : {"rope_scaling", "rope_parameters"}) {
    const json* rp = field(j, key);
    if (rp == nullptr) continue;
    FP4MOE_CHECK(rp->is_object()) << src << ": field \"" << key << "\" must be an object, found " << rp->dump();
    const std::string s = src + " " + key;
    c.rope_theta = static_cast<float>(get_num(*rp, "rope_theta", s, c.rope_theta));
    c.partial_rotary_factor = static_cast<float>(get_num(*rp, "partial_rotary_factor", s, c.partial_rotary_factor));
    c.rope_type = get_str(*rp, "rope_type", s, get_str(*rp, "type", s, c.rope_type));
  }
  FP4MOE_CHECK(c.rope_theta > 0) << src << ": rope_theta=" << c.rope_theta << " must be positive";
  FP4MOE_CHECK(c.partial_rotary_factor > 0 && c.partial_rotary_factor <= 1)
      << src << ": partial_rotary_factor=" << c.partial_rotary_factor << " must be in (0, 1]";
}

void parse_moe(const json& j, const std::string& src, ModelConfig& c) {
  c.moe_intermediate_size = get_int(j, "moe_intermediate_size", src, std::nullopt);
  c.n_routed_experts = get_int(j, "n_routed_experts", src, std::nullopt);
  c.num_experts_per_tok = get_int(j, "num_experts_per_tok", src, std::nullopt);
  c.n_shared_experts = get_int(j, "n_shared_experts", src, 1);
  c.n_group = get_int(j, "n_group", src, 1);
  c.topk_group = get_int(j, "topk_group", src, 1);
  c.norm_topk_prob = get_bool(j, "norm_topk_prob", src, true);
  c.routed_scaling_factor = static_cast<float>(get_num(j, "routed_scaling_factor", src, 1.0));
  c.scoring_func = get_str(j, "scoring_func", src, "sigmoid");
  c.topk_method = get_str(j, "topk_method", src, "noaux_tc");
  c.first_k_dense_replace = get_int(j, "first_k_dense_replace", src, 0);
  FP4MOE_CHECK(c.first_k_dense_replace >= 0)
      << src << ": first_k_dense_replace=" << c.first_k_dense_replace << " must be >= 0 (the leading dense layers)";
  c.num_nextn_predict_layers = get_int(j, "num_nextn_predict_layers", src, 0);
  FP4MOE_CHECK(c.num_nextn_predict_layers >= 0) << src << ": num_nextn_predict_layers=" << c.num_nextn_predict_layers
                                                << " must be >= 0 (the MTP layers after num_hidden_layers)";

  c.mlp_layer_types = get_str_list(j, "mlp_layer_types", src);
  if (c.mlp_layer_types.empty()) {
    for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
      c.mlp_layer_types.push_back(i < c.first_k_dense_replace ? "dense" : "sparse");
    }
  }
  FP4MOE_CHECK(static_cast<int64_t>(c.mlp_layer_types.size()) == c.num_hidden_layers)
      << src << ": mlp_layer_types has " << c.mlp_layer_types.size() << " entries, num_hidden_layers="
      << c.num_hidden_layers;
  for (size_t i = 0; i < c.mlp_layer_types.size(); ++i) {
    const std::string& t = c.mlp_layer_types[i];
    FP4MOE_CHECK(t == "dense" || t == "sparse")
        << src << ": mlp_layer_types[" << i << "]=\"" << t << "\" is neither \"dense\" nor \"sparse\"";
  }
  FP4MOE_CHECK(c.scoring_func == "sigmoid")
      << src << ": scoring_func '" << c.scoring_func
      << "' is not supported (sigmoid only: the GLM routers' sigmoid with e_score_correction_bias)";
  // The router's own rules (top_k in [1, experts], E % n_group, topk_group <= n_group, top_k within the chosen
  // groups, n_shared_experts >= 0, ...): one definition, MoeConfig::validate. (get_int keeps every field within 32
  // bits, so the int fields of MoeConfig hold them.)
  try {
    c.moe_config().validate();
  } catch (const Error& e) {
    throw Error(src + ": " + e.what());
  }
}

void parse_glm5(const json& j, const std::string& src, ModelConfig& c) {
  c.q_lora_rank = get_int(j, "q_lora_rank", src, std::nullopt);
  c.kv_lora_rank = get_int(j, "kv_lora_rank", src, std::nullopt);
  c.qk_nope_head_dim = get_int(j, "qk_nope_head_dim", src, std::nullopt);
  c.qk_rope_head_dim = get_int(j, "qk_rope_head_dim", src, std::nullopt);
  c.qk_head_dim = get_int(j, "qk_head_dim", src, c.qk_nope_head_dim + c.qk_rope_head_dim);
  c.v_head_dim = get_int(j, "v_head_dim", src, std::nullopt);
  FP4MOE_CHECK(c.qk_head_dim == c.qk_nope_head_dim + c.qk_rope_head_dim)
      << src << ": qk_head_dim=" << c.qk_head_dim << " != qk_nope_head_dim " << c.qk_nope_head_dim
      << " + qk_rope_head_dim " << c.qk_rope_head_dim;
  FP4MOE_CHECK(c.qk_rope_head_dim % 2 == 0) << src << ": qk_rope_head_dim=" << c.qk_rope_head_dim << " is odd";
  c.index_topk = get_int(j, "index_topk", src, std::nullopt);
  c.index_head_dim = get_int(j, "index_head_dim", src, std::nullopt);
  c.index_n_heads = get_int(j, "index_n_heads", src, std::nullopt);
  // GLM-5: interleaved RoPE for MLA and the indexer (spec §4.3, §6.3).
  c.rope_interleave = get_bool(j, "rope_interleave", src, true);
  c.indexer_rope_interleave = get_bool(j, "indexer_rope_interleave", src, true);
  c.layer_types = get_str_list(j, "layer_types", src);
  c.indexer_types = get_str_list(j, "indexer_types", src);
  if (c.indexer_types.empty()) {
    // Spec §6.2: index_topk_pattern ("F"/"S" per layer), else full iff max(i - offset + 1, 0) % freq == 0.
    const std::string pattern = get_str(j, "index_topk_pattern", src, "");
    if (!pattern.empty()) {
      FP4MOE_CHECK(static_cast<int64_t>(pattern.size()) == c.num_hidden_layers)
          << src << ": index_topk_pattern has " << pattern.size() << " letters, num_hidden_layers=" << c.num_hidden_layers;
      for (size_t i = 0; i < pattern.size(); ++i) {
        FP4MOE_CHECK(pattern[i] == 'F' || pattern[i] == 'S')
            << src << ": index_topk_pattern[" << i << "]='" << pattern[i] << "' is neither 'F' nor 'S'";
        c.indexer_types.push_back(pattern[i] == 'F' ? "full" : "shared");
      }
    } else {
      const int64_t freq = get_int(j, "index_topk_freq", src, 1);
      const int64_t offset = get_int(j, "index_skip_topk_offset", src, 2);
      FP4MOE_CHECK(freq >= 1) << src << ": index_topk_freq=" << freq << " must be >= 1";
      for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
        c.indexer_types.push_back(std::max<int64_t>(i - offset + 1, 0) % freq == 0 ? "full" : "shared");
      }
    }
  }
  FP4MOE_CHECK(static_cast<int64_t>(c.indexer_types.size()) == c.num_hidden_layers)
      << src << ": indexer_types has " << c.indexer_types.size() << " entries, num_hidden_layers=" << c.num_hidden_layers;
  for (size_t i = 0; i < c.indexer_types.size(); ++i) {
    FP4MOE_CHECK(c.indexer_types[i] == "full" || c.indexer_types[i] == "shared")
        << src << ": indexer_types[" << i << "]=\"" << c.indexer_types[i] << "\" is neither \"full\" nor \"shared\"";
  }
  FP4MOE_CHECK(c.indexer_types.empty() || c.indexer_types[0] == "full")
      << src << ": indexer_types[0] must be \"full\" (a shared layer reuses an earlier full layer's top-k)";
}

}  // namespace

const std::vector<std::string>& known_architectures() {
  static const std::vector<std::string> k = {kArchGlm4Moe, kArchGlmMoeDsa};
  return k;
}

bool ModelConfig::is_moe_layer(int64_t layer) const {
  FP4MOE_CHECK(layer >= 0 && layer < static_cast<int64_t>(mlp_layer_types.size()))
      << "layer " << layer << " out of range [0, " << mlp_layer_types.size() << ")";
  return mlp_layer_types[static_cast<size_t>(layer)] == "sparse";
}

int64_t ModelConfig::rotary_dim() const {
  return static_cast<int64_t>(static_cast<double>(head_dim) * partial_rotary_factor);
}

std::string ModelConfig::summary() const {
  std::ostringstream os;
  int64_t n_moe = 0;
  for (const auto& t : mlp_layer_types) n_moe += t == "sparse";
  os << architecture << ": " << num_hidden_layers << " layers (" << num_hidden_layers - n_moe << " dense, "
     << n_moe << " MoE), hidden " << hidden_size << ", heads " << num_attention_heads << "/" << num_key_value_heads
     << ", vocab " << vocab_size << ", experts " << n_routed_experts << " top-" << num_experts_per_tok << " + "
     << n_shared_experts << " shared (I=" << moe_intermediate_size << ")";
  if (quantization.present) os << ", quant " << quantization.quant_algo;
  return os.str();
}

moe::MoeConfig ModelConfig::moe_config() const {
  moe::MoeConfig m;
  m.hidden = hidden_size;
  m.moe_intermediate = moe_intermediate_size;
  m.n_experts = static_cast<int>(n_routed_experts);
  m.top_k = static_cast<int>(num_experts_per_tok);
  m.n_group = static_cast<int>(n_group);
  m.topk_group = static_cast<int>(topk_group);
  m.norm_topk_prob = norm_topk_prob;
  m.routed_scaling_factor = routed_scaling_factor;
  m.scoring = moe::ScoringFunc::kSigmoid;
  m.correction_bias = true;
  // transformers' GlmMoeDsaMoE masks unchosen groups with -inf; Glm4MoeMoE (and DeepseekV3MoE) with 0.0.
  m.masked_fill_value = architecture == kArchGlmMoeDsa ? -std::numeric_limits<float>::infinity() : 0.0f;
  m.n_shared_experts = static_cast<int>(n_shared_experts);
  return m;
}

ModelConfig parse_model_config(const nlohmann::json& j, const std::string& source) {
  FP4MOE_CHECK(j.is_object()) << source << ": config must be a JSON object";
  ModelConfig c;
  c.source = source;
  c.raw = j;
  const std::vector<std::string> archs = get_str_list(j, "architectures", source);
  FP4MOE_CHECK(!archs.empty()) << source << ": \"architectures\" is missing or empty";
  c.architecture = archs[0];
  bool known = false;
  for (const auto& a : known_architectures()) known = known || a == c.architecture;
  if (!known) {
    std::string list;
    for (const auto& a : known_architectures()) list += (list.empty() ? "" : ", ") + a;
    FP4MOE_FAIL() << source << ": architecture \"" << c.architecture << "\" is not supported (supported: " << list << ")";
  }
  c.model_type = get_str(j, "model_type", source, "");

  c.vocab_size = get_int(j, "vocab_size", source, std::nullopt);
  c.hidden_size = get_int(j, "hidden_size", source, std::nullopt);
  c.num_hidden_layers = get_int(j, "num_hidden_layers", source, std::nullopt);
  c.num_attention_heads = get_int(j, "num_attention_heads", source, std::nullopt);
  c.num_key_value_heads = get_int(j, "num_key_value_heads", source, c.num_attention_heads);
  FP4MOE_CHECK(c.vocab_size > 0 && c.hidden_size > 0 && c.num_hidden_layers > 0 && c.num_attention_heads > 0 &&
               c.num_key_value_heads > 0)
      << source << ": vocab_size=" << c.vocab_size << ", hidden_size=" << c.hidden_size
      << ", num_hidden_layers=" << c.num_hidden_layers << ", num_attention_heads=" << c.num_attention_heads
      << ", num_key_value_heads=" << c.num_key_value_heads << " must all be positive";
  // Per-layer lists are sized by it before any tensor is read (the loaders then check it against the
  // checkpoint's layers): a typo of 10^9 layers would ask for tens of GB first.
  FP4MOE_CHECK(c.num_hidden_layers <= format::kMaxModelLayers)
      << source << ": num_hidden_layers=" << c.num_hidden_layers << " is past " << format::kMaxModelLayers
      << " (no model has so many)";
  c.head_dim = get_int(j, "head_dim", source, c.hidden_size / c.num_attention_heads);
  c.intermediate_size = get_int(j, "intermediate_size", source, std::nullopt);
  c.max_position_embeddings = get_int(j, "max_position_embeddings", source, 131072);
  FP4MOE_CHECK(c.max_position_embeddings >= 1)
      << source << ": max_position_embeddings=" << c.max_position_embeddings << " must be >= 1";
  c.rms_norm_eps = static_cast<float>(get_num(j, "rms_norm_eps", source, 1e-5));
  FP4MOE_CHECK(std::isfinite(c.rms_norm_eps) && c.rms_norm_eps > 0.0f)
      << source << ": rms_norm_eps=" << c.rms_norm_eps << " must be a positive number (as f32)";
  c.hidden_act = get_str(j, "hidden_act", source, "silu");
  FP4MOE_CHECK(c.hidden_act == "silu") << source << ": hidden_act=\"" << c.hidden_act << "\" (only silu is supported)";
  c.tie_word_embeddings = get_bool(j, "tie_word_embeddings", source, false);
  c.attention_bias = get_bool(j, "attention_bias", source, false);
  c.mlp_bias = get_bool(j, "mlp_bias", source, false);
  c.bos_token_id = get_opt_int(j, "bos_token_id", source);
  c.pad_token_id = get_opt_int(j, "pad_token_id", source);
  c.eos_token_ids = get_token_ids(j, "eos_token_id", source, c.vocab_size);
  c.use_qk_norm = get_bool(j, "use_qk_norm", source, false);

  if (c.architecture == kArchGlm4Moe) c.partial_rotary_factor = 0.5f;  // Glm4MoeConfig default
  parse_rope(j, source, c);
  parse_moe(j, source, c);

  if (c.architecture == kArchGlm4Moe) {
    FP4MOE_CHECK(c.num_attention_heads % c.num_key_value_heads == 0)
        << source << ": num_attention_heads=" << c.num_attention_heads
        << " is not a multiple of num_key_value_heads=" << c.num_key_value_heads;
    FP4MOE_CHECK(c.rotary_dim() % 2 == 0 && c.rotary_dim() > 0 && c.rotary_dim() <= c.head_dim)
        << source << ": rotary dim head_dim " << c.head_dim << " * partial_rotary_factor " << c.partial_rotary_factor
        << " = " << c.rotary_dim() << " must be even and in (0, head_dim]";
    c.rope_interleave = get_bool(j, "rope_interleave", source, false);
  } else if (c.architecture == kArchGlmMoeDsa) {
    parse_glm5(j, source, c);
    // What the GLM-5 forward needs of these fields (checked here, not at load, so that inspect reports them too).
    FP4MOE_CHECK(c.q_lora_rank > 0) << c.source << ": q_lora_rank=" << c.q_lora_rank
                                    << "; GlmMoeDsaForCausalLM needs the q LoRA (q_a_proj/q_b_proj)";
    FP4MOE_CHECK(c.kv_lora_rank > 0 && c.qk_rope_head_dim > 0 && c.qk_rope_head_dim % 2 == 0 && c.v_head_dim > 0 &&
                 c.qk_nope_head_dim >= 0)
        << c.source << ": bad MLA dims kv_lora_rank=" << c.kv_lora_rank << " qk_rope_head_dim=" << c.qk_rope_head_dim
        << " qk_nope_head_dim=" << c.qk_nope_head_dim << " v_head_dim=" << c.v_head_dim;
    FP4MOE_CHECK(c.index_topk > 0 && c.index_n_heads > 0 && c.index_head_dim >= c.qk_rope_head_dim)
        << c.source << ": bad indexer dims index_topk=" << c.index_topk << " index_n_heads=" << c.index_n_heads
        << " index_head_dim=" << c.index_head_dim << " (must be >= qk_rope_head_dim " << c.qk_rope_head_dim << ")";
    FP4MOE_CHECK(static_cast<int64_t>(c.indexer_types.size()) == c.num_hidden_layers &&
                 (c.num_hidden_layers == 0 || c.indexer_types[0] == "full"))
        << c.source << ": indexer_types must list " << c.num_hidden_layers << " layers starting with \"full\"";
  }
  // Both forwards implement plain RoPE only.
  FP4MOE_CHECK(c.rope_type == "default") << c.source << ": rope_type \"" << c.rope_type << "\" is not implemented for "
                                         << c.architecture << " (only \"default\")";
  return c;
}

bool GenerationDefaults::has_sampling() const {
  bool any = false;
  for_each_sampling([&](const char*, const auto& v) { any = any || v.has_value(); });
  return any;
}

std::string GenerationDefaults::sampling_summary() const {
  std::ostringstream os;
  for_each_sampling([&](const char* name, const auto& v) {
    if (!v) return;
    if (os.tellp() > 0) os << ", ";
    os << name << " " << *v;
  });
  return os.str();
}

GenerationDefaults parse_generation_config(const nlohmann::json& j, const std::string& source, int64_t vocab_size) {
  FP4MOE_CHECK(j.is_object()) << source << ": must be a JSON object, found " << j.type_name();
  GenerationDefaults g;
  g.source = source;
  g.eos_token_ids = get_token_ids(j, "eos_token_id", source, vocab_size);
  GenerationDefaults::for_each_sampling(g, [&](const char* key, auto& member) {
    const json* v = field(j, key);
    if (v == nullptr) return;
    const std::string at = source + ": field \"" + key + "\" must be ";
    if constexpr (std::is_same_v<std::decay_t<decltype(*member)>, int64_t>) {
      if (v->is_number_integer() && format::json_int_in(*v, INT32_MIN, INT32_MAX)) {
        member = v->get<int64_t>();
      } else {
        g.problems.push_back(at + "an integer, found " + v->dump());
      }
    } else if (v->is_number()) {
      member = v->get<double>();
    } else {
      g.problems.push_back(at + "a number, found " + v->dump());
    }
  });
  return g;
}

void load_generation_config(const std::filesystem::path& dir, ModelConfig& c) {
  const std::filesystem::path path = dir / "generation_config.json";
  std::error_code ec;
  if (!std::filesystem::exists(path, ec) && !std::filesystem::is_symlink(path, ec)) return;
  c.generation = parse_generation_config(format::read_json_file(path), path.string(), c.vocab_size);
  for (int64_t id : c.generation.eos_token_ids) {
    if (std::find(c.eos_token_ids.begin(), c.eos_token_ids.end(), id) == c.eos_token_ids.end())
      c.eos_token_ids.push_back(id);
  }
}

ModelConfig read_model_config(const std::filesystem::path& dir, std::vector<format::CheckpointProblem>* problems) {
  FP4MOE_CHECK(!std::filesystem::exists(dir) || std::filesystem::is_directory(dir))
      << dir.string() << " is a file; give the model's directory (config.json, *.safetensors, tokenizer.json)";
  const std::filesystem::path path = dir / "config.json";
  std::error_code ec;
  FP4MOE_CHECK(std::filesystem::exists(path, ec) || std::filesystem::is_symlink(path, ec))
      << "cannot open " << path.string() << " (a model directory needs config.json)";
  const json j = format::read_json_file(path);
  ModelConfig c = parse_model_config(j, path.string());
  c.quantization = format::read_quant_config(dir, j, problems);
  return c;
}

ModelConfig load_model_config(const std::filesystem::path& dir, bool with_generation) {
  // A quantization section that says something else than the NVFP4 this loader reads (a quant_method
  // other than modelopt, FP8, group size 32, two sections that disagree) is refused: the weights would be
  // read as NVFP4 all the same. `fp4moe inspect` lists every problem.
  std::vector<format::CheckpointProblem> problems;
  ModelConfig c = read_model_config(dir, &problems);
  // The sections' problems first (a quant_method other than modelopt is named there, before the empty
  // quant_algo it leaves), then what the section asks for (FP8, group 32).
  if (!problems.empty())
    FP4MOE_FAIL() << dir.string() << ": " << problems.front().message << " (fp4moe inspect lists every problem)";
  if (std::optional<std::string> why = c.quantization.unsupported())
    FP4MOE_FAIL() << dir.string() << ": " << *why << " (fp4moe inspect lists every problem)";
  if (with_generation) load_generation_config(dir, c);
  return c;
}

}  // namespace fp4moe::model
