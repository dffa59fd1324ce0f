// Checkpoint description: config parsing, module discovery from tensor names, NVFP4/BF16
// decision from the tensors present, and the cross-checks against config.json and the
// quantization config. See checkpoint.h; tested by tests/format/test_checkpoint.cpp.
#include "format/checkpoint.h"

#include <algorithm>
#include <fstream>
#include <set>
#include <sstream>

#include "core/error.h"
#include "format/json_file.h"
#include "format/nvfp4.h"

namespace fp4moe::format {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// Suffixes of the tensors that make up one weight module, longest first so that
// ".weight_scale_2" is not taken for ".weight".
constexpr std::string_view kSuffixes[] = {".weight_scale_2", ".weight_scale", ".input_scale",
                                          ".weight", ".bias"};

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}
bool starts_with(std::string_view s, std::string_view prefix) {
  return s.size() >= prefix.size() && s.substr(0, prefix.size()) == prefix;
}

// An integer field within 32 bits: no real config comes near, and the shapes multiplied from them stay
// far from int64's range (2^62 experts printed negative latencies).
int64_t int32_field(const json& v, const char* key, const std::string& source) {
  FP4MOE_CHECK(json_int_in(v, INT32_MIN, INT32_MAX))
      << source << ": field '" << key << "' = " << v.dump() << " is past the 32-bit range";
  return v.get<int64_t>();
}

int64_t get_int(const json& j, const char* key, int64_t fallback, const std::string& source) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return fallback;
  FP4MOE_CHECK(it->is_number_integer()) << source << ": field '" << key << "' is " << it->dump()
                                        << ", expected an integer";
  return int32_field(*it, key, source);
}

int64_t require_int(const json& j, const char* key, const std::string& source) {
  auto it = j.find(key);
  FP4MOE_CHECK(it != j.end() && it->is_number_integer())
      << source << ": required integer field '" << key << "' is "
      << (it == j.end() ? std::string("missing") : it->dump());
  return int32_field(*it, key, source);
}

std::string get_string(const json& j, const char* key) {
  auto it = j.find(key);
  return (it != j.end() && it->is_string()) ? it->get<std::string>() : std::string();
}

// As get_int: absent or null reads as "", another type is named (a quant_algo of 4 read as '' and was reported as
// an unsupported algorithm '').
std::string optional_string(const json& j, const char* key, const std::string& source) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return {};
  FP4MOE_CHECK(it->is_string()) << source << ": field '" << key << "' is " << it->dump() << ", expected a string";
  return it->get<std::string>();
}

// A list of strings, absent or null as none; anything else is named (a string "lm_head" read as no exclusions).
std::vector<std::string> optional_strings(const json& j, const char* key, const std::string& source) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return {};
  const bool ok = it->is_array() && std::all_of(it->begin(), it->end(), [](const json& e) { return e.is_string(); });
  FP4MOE_CHECK(ok) << source << ": field '" << key << "' is " << it->dump() << ", expected a list of strings";
  return it->get<std::vector<std::string>>();
}

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
  return s;
}

// The Linear shape [out, in] config.json implies for a module, or nullopt when the name is not
// one fp4moe knows.
std::optional<std::pair<int64_t, int64_t>> expected_shape(const ModelConfig& c,
                                                          const LinearModule& m) {
  const int64_t h = c.hidden_size;
  std::string_view n = m.name;
  auto leaf_is = [&](std::string_view leaf) { return ends_with(n, leaf); };
  auto mlp = [&](int64_t inter) -> std::optional<std::pair<int64_t, int64_t>> {
    if (leaf_is(".gate_proj") || leaf_is(".up_proj")) return std::pair{inter, h};
    if (leaf_is(".down_proj")) return std::pair{h, inter};
    return std::nullopt;
  };
  const json& r = c.raw;
  switch (m.kind) {
    case ModuleKind::kEmbedding:
    case ModuleKind::kLmHead: return std::pair{c.vocab_size, h};
    case ModuleKind::kRouter: return std::pair{c.n_routed_experts, h};
    case ModuleKind::kDenseMlp: return mlp(c.intermediate_size);
    case ModuleKind::kRoutedExpert: return mlp(c.moe_intermediate_size);
    case ModuleKind::kSharedExpert:
      return mlp(c.moe_intermediate_size * std::max<int64_t>(c.n_shared_experts, 1));
    case ModuleKind::kAttention: break;
    case ModuleKind::kOther: return std::nullopt;
  }
  const std::string src = "config.json";
  const int64_t heads = get_int(r, "num_attention_heads", 0, src);
  if (r.contains("kv_lora_rank") && !r["kv_lora_rank"].is_null()) {  // MLA (GLM-5, DeepSeek)
    const int64_t q_lora = get_int(r, "q_lora_rank", 0, src);
    const int64_t kv_lora = get_int(r, "kv_lora_rank", 0, src);
    const int64_t nope = get_int(r, "qk_nope_head_dim", 0, src);
    const int64_t rope = get_int(r, "qk_rope_head_dim", 0, src);
    const int64_t v = get_int(r, "v_head_dim", 0, src);
    const int64_t idx_heads = get_int(r, "index_n_heads", 0, src);
    const int64_t idx_dim = get_int(r, "index_head_dim", 0, src);
    if (leaf_is(".self_attn.q_a_proj")) return std::pair{q_lora, h};
    if (leaf_is(".self_attn.q_b_proj")) return std::pair{heads * (nope + rope), q_lora};
    if (leaf_is(".self_attn.q_proj")) return std::pair{heads * (nope + rope), h};
    if (leaf_is(".self_attn.kv_a_proj_with_mqa")) return std::pair{kv_lora + rope, h};
    if (leaf_is(".self_attn.kv_b_proj")) return std::pair{heads * (nope + v), kv_lora};
    if (leaf_is(".self_attn.o_proj")) return std::pair{h, heads * v};
    if (leaf_is(".indexer.wq_b")) return std::pair{idx_heads * idx_dim, q_lora};
    if (leaf_is(".indexer.wk")) return std::pair{idx_dim, h};
    if (leaf_is(".indexer.weights_proj")) return std::pair{idx_heads, h};
    return std::nullopt;
  }
  const int64_t kv_heads = get_int(r, "num_key_value_heads", heads, src);
  const int64_t head_dim = get_int(r, "head_dim", heads > 0 ? h / heads : 0, src);
  if (leaf_is(".self_attn.q_proj")) return std::pair{heads * head_dim, h};
  if (leaf_is(".self_attn.k_proj") || leaf_is(".self_attn.v_proj"))
    return std::pair{kv_heads * head_dim, h};
  if (leaf_is(".self_attn.o_proj")) return std::pair{h, heads * head_dim};
  return std::nullopt;
}

bool is_scalar_f32(const TensorInfo* t) {
  return t != nullptr && t->dtype == DType::kF32 && t->numel() == 1 && t->shape.size() <= 1;
}

std::string describe(const TensorInfo& t) {
  return std::string(dtype_name(t.dtype)) + " " + shape_to_string(t.shape);
}

}  // namespace

std::string_view linear_format_name(LinearFormat f) {
  return f == LinearFormat::kNVFP4 ? "NVFP4" : "BF16";
}

std::string_view module_kind_name(ModuleKind k) {
  switch (k) {
    case ModuleKind::kAttention: return "attention";
    case ModuleKind::kDenseMlp: return "dense_mlp";
    case ModuleKind::kSharedExpert: return "shared_experts";
    case ModuleKind::kRoutedExpert: return "routed_experts";
    case ModuleKind::kRouter: return "router";
    case ModuleKind::kLmHead: return "lm_head";
    case ModuleKind::kEmbedding: return "embeddings";
    case ModuleKind::kOther: return "other";
  }
  return "?";
}

bool wildcard_match(std::string_view p, std::string_view t) {
  // Iterative glob with backtracking to the last '*'.
  size_t pi = 0, ti = 0, star_p = std::string_view::npos, star_t = 0;
  auto match_one = [&](size_t& pj, char c) -> bool {  // advances pj past one pattern item
    if (p[pj] == '?') { ++pj; return true; }
    if (p[pj] == '[') {
      size_t j = pj + 1;
      bool negate = j < p.size() && (p[j] == '!' || p[j] == '^');
      if (negate) ++j;
      bool found = false;
      size_t first = j;
      while (j < p.size() && (p[j] != ']' || j == first)) {
        if (j + 2 < p.size() && p[j + 1] == '-' && p[j + 2] != ']') {
          if (p[j] <= c && c <= p[j + 2]) found = true;
          j += 3;
        } else {
          if (p[j] == c) found = true;
          ++j;
        }
      }
      if (j >= p.size()) {  // no closing ']': '[' is literal
        if (c != '[') return false;
        ++pj;
        return true;
      }
      pj = j + 1;
      return found != negate;
    }
    if (p[pj] == c) { ++pj; return true; }
    return false;
  };
  while (ti < t.size()) {
    if (pi < p.size() && p[pi] == '*') {
      star_p = pi++;
      star_t = ti;
      continue;
    }
    size_t pj = pi;
    if (pi < p.size() && match_one(pj, t[ti])) {
      pi = pj;
      ++ti;
      continue;
    }
    if (star_p == std::string_view::npos) return false;
    pi = star_p + 1;
    ti = ++star_t;
  }
  while (pi < p.size() && p[pi] == '*') ++pi;
  return pi == p.size();
}

bool QuantConfig::is_excluded(std::string_view module) const {
  return excluded_by(module).has_value();
}

std::optional<std::string> QuantConfig::excluded_by(std::string_view module) const {
  for (const std::string& p : exclude_modules) {
    const bool wild = p.find_first_of("*?[") != std::string::npos;
    if (wild) {
      if (wildcard_match(p, module) || wildcard_match(p + ".*", module)) return p;
      continue;
    }
    if (module == p || starts_with(module, p + ".")) return p;
    // Contained at a dot boundary ("lm_head" in "model.lm_head"), as vLLM's substring rule.
    const std::string dotted = "." + p;
    size_t at = std::string_view(module).find(dotted);
    while (at != std::string_view::npos) {
      size_t end = at + dotted.size();
      if (end == module.size() || module[end] == '.') return p;
      at = std::string_view(module).find(dotted, at + 1);
    }
  }
  return std::nullopt;
}

int64_t ModelConfig::n_moe_layers() const {
  return std::count(layer_is_moe.begin(), layer_is_moe.end(), true);
}

ModelConfig parse_model_config(const json& j, const std::string& source) {
  FP4MOE_CHECK(j.is_object()) << source << ": top level is not a JSON object";
  ModelConfig c;
  c.raw = j;
  if (auto it = j.find("architectures"); it != j.end() && it->is_array() && !it->empty() &&
                                         it->front().is_string()) {
    c.architecture = it->front().get<std::string>();
  }
  c.model_type = get_string(j, "model_type");
  c.n_layers = require_int(j, "num_hidden_layers", source);
  c.hidden_size = require_int(j, "hidden_size", source);
  c.vocab_size = require_int(j, "vocab_size", source);
  c.intermediate_size = get_int(j, "intermediate_size", 0, source);
  c.moe_intermediate_size = get_int(j, "moe_intermediate_size", 0, source);
  c.n_routed_experts = get_int(j, "n_routed_experts", get_int(j, "num_experts", 0, source), source);
  c.n_experts_per_tok = get_int(j, "num_experts_per_tok", 0, source);
  // transformers' default for the model types that have the field (Glm4MoeConfig, GlmMoeDsaConfig, DeepseekV3Config:
  // one shared expert, as model::ModelConfig reads it); 0 for the others (Qwen3-MoE, Mixtral have none).
  const bool shared_by_default =
      c.model_type == "glm4_moe" || c.model_type == "glm_moe_dsa" || c.model_type == "deepseek_v3";
  c.n_shared_experts = get_int(j, "n_shared_experts", shared_by_default ? 1 : 0, source);
  c.first_k_dense_replace = get_int(j, "first_k_dense_replace", 0, source);
  c.n_nextn_layers = get_int(j, "num_nextn_predict_layers", 0, source);
  if (auto it = j.find("tie_word_embeddings"); it != j.end() && it->is_boolean()) {
    c.tie_word_embeddings = it->get<bool>();
  }
  FP4MOE_CHECK(c.n_layers > 0 && c.hidden_size > 0 && c.vocab_size > 0)
      << source << ": num_hidden_layers=" << c.n_layers << " hidden_size=" << c.hidden_size
      << " vocab_size=" << c.vocab_size << " must all be positive";
  FP4MOE_CHECK(c.n_layers <= kMaxModelLayers)
      << source << ": num_hidden_layers=" << c.n_layers << " is past " << kMaxModelLayers << " (no model has so many)";
  FP4MOE_CHECK(c.first_k_dense_replace >= 0)
      << source << ": first_k_dense_replace=" << c.first_k_dense_replace << " must be >= 0 (the leading dense layers)";
  FP4MOE_CHECK(c.n_nextn_layers >= 0) << source << ": num_nextn_predict_layers=" << c.n_nextn_layers
                                      << " must be >= 0 (the MTP layers after num_hidden_layers)";
  c.layer_is_moe.assign(static_cast<size_t>(c.n_layers), false);
  if (auto it = j.find("mlp_layer_types"); it != j.end() && it->is_array()) {
    FP4MOE_CHECK(static_cast<int64_t>(it->size()) == c.n_layers)
        << source << ": mlp_layer_types has " << it->size() << " entries, num_hidden_layers is "
        << c.n_layers;
    for (size_t i = 0; i < it->size(); ++i) {
      const json& e = (*it)[i];
      FP4MOE_CHECK(e.is_string() && (e == "dense" || e == "sparse"))
          << source << ": mlp_layer_types[" << i << "] is " << e.dump()
          << ", expected \"dense\" or \"sparse\"";
      c.layer_is_moe[i] = (e == "sparse");
    }
  } else if (c.n_routed_experts > 0) {
    for (int64_t i = c.first_k_dense_replace; i < c.n_layers; ++i) c.layer_is_moe[i] = true;
  }
  if (c.n_moe_layers() > 0) {
    // Each named on its own (one check of all four left the reader to find which).
    FP4MOE_CHECK(c.n_routed_experts > 0)
        << source << ": " << c.n_moe_layers() << " MoE layers but n_routed_experts=" << c.n_routed_experts;
    FP4MOE_CHECK(c.n_experts_per_tok > 0 && c.n_experts_per_tok <= c.n_routed_experts)
        << source << ": num_experts_per_tok=" << c.n_experts_per_tok << " is outside [1, n_routed_experts="
        << c.n_routed_experts << "] (a token's top-k experts are chosen among the routed ones)";
    FP4MOE_CHECK(c.moe_intermediate_size > 0)
        << source << ": " << c.n_moe_layers() << " MoE layers but moe_intermediate_size=" << c.moe_intermediate_size;
  }
  return c;
}

namespace {

// A module index: 1-9 decimal digits (so that it fits an int64_t with room, and a name like
// "model.layers.99999999999999999999.x" is no layer rather than an overflow), else -1.
int64_t parse_index(std::string_view digits) {
  if (digits.empty() || digits.size() > 9) return -1;
  int64_t v = 0;
  for (char ch : digits) {
    if (ch < '0' || ch > '9') return -1;
    v = v * 10 + (ch - '0');
  }
  return v;
}

}  // namespace

int64_t layer_index(std::string_view name) {
  constexpr std::string_view kLayers = "model.layers.";
  if (!starts_with(name, kLayers)) return -1;
  const std::string_view rest = name.substr(kLayers.size());
  const size_t dot = rest.find('.');
  return dot == std::string_view::npos ? -1 : parse_index(rest.substr(0, dot));
}

ModuleKind classify_module_name(std::string_view name, int64_t* layer, int64_t* expert) {
  *layer = -1;
  *expert = -1;
  if (name == "lm_head" || ends_with(name, ".lm_head")) return ModuleKind::kLmHead;
  if (ends_with(name, "embed_tokens")) return ModuleKind::kEmbedding;
  const int64_t l = layer_index(name);
  if (l < 0) return ModuleKind::kOther;
  *layer = l;
  std::string_view rest = name.substr(name.find('.', std::string_view("model.layers.").size()) + 1);
  if (starts_with(rest, "self_attn.")) return ModuleKind::kAttention;
  if (starts_with(rest, "mlp.shared_experts.")) return ModuleKind::kSharedExpert;
  constexpr std::string_view kExperts = "mlp.experts.";
  if (starts_with(rest, kExperts)) {
    const std::string_view e = rest.substr(kExperts.size());
    const size_t d = e.find('.');
    if (d != std::string_view::npos) *expert = parse_index(e.substr(0, d));
    return ModuleKind::kRoutedExpert;
  }
  if (rest == "mlp.gate") return ModuleKind::kRouter;
  if (rest == "mlp.gate_proj" || rest == "mlp.up_proj" || rest == "mlp.down_proj")
    return ModuleKind::kDenseMlp;
  return ModuleKind::kOther;
}

QuantConfig read_quant_config(const fs::path& dir, const json& config,
                              std::vector<CheckpointProblem>* problems) {
  auto add_problem = [&](const std::string& msg) {
    if (problems != nullptr) problems->push_back({"", msg});
  };
  auto from_section = [&](const json& q, QuantConfig& out) {
    out.quant_algo = optional_string(q, "quant_algo", out.source);
    if (auto it = q.find("kv_cache_quant_algo"); it != q.end() && !it->is_null())
      out.kv_cache_quant_algo = optional_string(q, "kv_cache_quant_algo", out.source);
    out.group_size = get_int(q, "group_size", 16, out.source);
    for (const char* key : {"exclude_modules", "ignore"}) {
      for (std::string& e : optional_strings(q, key, out.source)) out.exclude_modules.push_back(std::move(e));
    }
    if (auto it = q.find("quantized_layers"); it != q.end() && it->is_object()) {
      for (auto& [k, v] : it->items())
        out.quantized_layers[k] = optional_string(v, "quant_algo", out.source + " quantized_layers." + k);
    }
  };
  auto producer = [&](const json& j, QuantConfig& out) {
    if (auto it = j.find("producer"); it != j.end() && it->is_object()) {
      out.producer_name = get_string(*it, "name");
      out.producer_version = get_string(*it, "version");
    }
  };

  std::optional<QuantConfig> legacy;
  if (fs::exists(dir / "hf_quant_config.json")) {
    const json j = read_json_file(dir / "hf_quant_config.json");
    QuantConfig q;
    q.present = true;
    q.source = "hf_quant_config.json";
    FP4MOE_CHECK(j.is_object() && j.contains("quantization") && j["quantization"].is_object())
        << (dir / "hf_quant_config.json").string() << ": no \"quantization\" object";
    from_section(j["quantization"], q);
    producer(j, q);
    legacy = q;
  }
  std::optional<QuantConfig> modern;
  if (auto it = config.find("quantization_config"); it != config.end() && it->is_object()) {
    QuantConfig q;
    q.present = true;
    q.source = "config.json quantization_config";
    const json& qc = *it;
    const std::string method = optional_string(qc, "quant_method", q.source);
    q.quant_method = method;
    if (!method.empty() && method != "modelopt") {
      add_problem("config.json quantization_config: quant_method '" + method +
                  "' is not supported (only 'modelopt')");
    }
    if (qc.contains("quantization") && qc["quantization"].is_object()) {
      from_section(qc["quantization"], q);  // nested (legacy) shape inside config.json
    } else {
      from_section(qc, q);
      // The flat shape keeps the group size inside config_groups.*.weights.
      if (auto g = qc.find("config_groups"); g != qc.end() && g->is_object()) {
        // The 4-bit weight groups' (a mixed export may list other groups, e.g. an int4 AWQ group of 128).
        for (auto& [name, group] : g->items()) {
          if (group.contains("weights") && group["weights"].is_object() &&
              get_int(group["weights"], "num_bits", 4, q.source) == 4)
            q.group_size = get_int(group["weights"], "group_size", q.group_size, q.source);
        }
      }
      if (auto kv = qc.find("kv_cache_scheme"); kv != qc.end() && kv->is_object()) {
        q.kv_cache_quant_algo = get_int(*kv, "num_bits", 0, q.source) == 8 ? "FP8" : "unknown";
      }
    }
    producer(qc, q);
    modern = q;
  }
  if (legacy && modern) {
    if (legacy->quant_algo != modern->quant_algo) {
      add_problem("quant_algo disagrees: hf_quant_config.json says '" + legacy->quant_algo +
                  "', config.json quantization_config says '" + modern->quant_algo + "'");
    }
    if (legacy->group_size != modern->group_size) {
      add_problem("group_size disagrees: hf_quant_config.json says " + std::to_string(legacy->group_size) +
                  ", config.json quantization_config says " + std::to_string(modern->group_size));
    }
    std::set<std::string> a(legacy->exclude_modules.begin(), legacy->exclude_modules.end());
    std::set<std::string> b(modern->exclude_modules.begin(), modern->exclude_modules.end());
    if (a != b) {
      add_problem("exclusion lists disagree: hf_quant_config.json exclude_modules [" +
                  join(legacy->exclude_modules) + "] vs config.json quantization_config ignore [" +
                  join(modern->exclude_modules) + "]");
    }
    return *legacy;
  }
  if (legacy) return *legacy;
  if (modern) return *modern;
  return QuantConfig{};
}

Checkpoint::Checkpoint(const fs::path& dir) : dir_(dir) {
  FP4MOE_CHECK(fs::is_directory(dir)) << "checkpoint directory " << dir.string()
                                      << (fs::exists(dir) ? " is a file, not a directory" : " does not exist");
  const fs::path config_path = dir / "config.json";
  FP4MOE_CHECK(fs::exists(config_path)) << "checkpoint " << dir.string() << " has no config.json";
  config_ = parse_model_config(read_json_file(config_path), config_path.string());
  quant_ = read_quant_config(dir, config_.raw, &problems_);
  store_ = std::make_unique<TensorStore>(dir);
  classify_modules();
  check_against_config();
  check_against_quant_config();
  for (LinearModule& m : modules_) {
    m.ok = unloadable_modules_.count(m.name) == 0 &&
           std::none_of(problems_.begin(), problems_.end(),
                        [&](const CheckpointProblem& p) { return p.module == m.name; });
  }
}

void Checkpoint::problem(const std::string& module, const std::string& message) {
  problems_.push_back({module, module.empty() ? message : module + ": " + message});
}

void Checkpoint::classify_modules() {
  // Linears whose weight dtype no loader reads (F16, an FP8 checkpoint's F8_E4M3), by dtype: one problem each.
  std::map<DType, std::vector<std::pair<std::string, TensorInfo>>> unloadable;
  // Group tensors by module prefix.
  std::map<std::string, std::set<std::string>> parts;  // prefix -> suffixes present
  for (const std::string& name : store_->names()) {
    for (std::string_view suffix : kSuffixes) {
      if (ends_with(name, suffix)) {
        parts[name.substr(0, name.size() - suffix.size())].insert(std::string(suffix));
        break;
      }
    }
  }
  for (const auto& [prefix, suffixes] : parts) {
    const bool has_scale_tensors = suffixes.count(".weight_scale") || suffixes.count(".weight_scale_2") ||
                                   suffixes.count(".input_scale");
    const TensorInfo* w = store_->find(prefix + ".weight");
    if (w == nullptr) {
      if (has_scale_tensors) {
        problem(prefix, "has quantization scales but no .weight tensor");
      }
      continue;
    }
    const bool nvfp4 = w->dtype == DType::kU8;
    if (!nvfp4 && w->shape.size() != 2 && !has_scale_tensors) continue;  // norms, biases
    // A norm's weight stored 2-D ([1, H]) is a misshapen norm (the model's tensor check names its shape), not a Linear
    // of an "other" kind.
    const std::string_view last = std::string_view(prefix).substr(prefix.rfind('.') + 1);
    if (!nvfp4 && !has_scale_tensors && ends_with(last, "norm")) continue;

    LinearModule m;
    m.name = prefix;
    m.kind = classify_module_name(prefix, &m.layer, &m.expert);
    m.weight_dtype = w->dtype;
    m.format = nvfp4 ? LinearFormat::kNVFP4 : LinearFormat::kBF16;
    if (w->shape.size() != 2) {
      problem(prefix, "weight " + describe(*w) + " is not 2-D");
      modules_.push_back(m);
      continue;
    }
    m.out_features = w->shape[0];
    m.in_features = nvfp4 ? 2 * w->shape[1] : w->shape[1];
    if (nvfp4) {
      const int64_t n = m.out_features, k = m.in_features;
      const TensorInfo* s = store_->find(prefix + ".weight_scale");
      const TensorInfo* s2 = store_->find(prefix + ".weight_scale_2");
      const TensorInfo* is = store_->find(prefix + ".input_scale");
      if (k % 16 != 0) {
        problem(prefix, "NVFP4 weight " + describe(*w) + " gives K=" + std::to_string(k) +
                            ", not a multiple of the 16-element block");
      }
      if (s == nullptr) {
        problem(prefix, "NVFP4 weight " + describe(*w) + " has no .weight_scale (expected F8_E4M3 [" +
                            std::to_string(n) + ", " + std::to_string(k / 16) + "])");
      } else if (s->dtype != DType::kF8_E4M3 || s->shape != Shape{n, k / 16}) {
        problem(prefix, "weight_scale is " + describe(*s) + ", expected F8_E4M3 [" +
                            std::to_string(n) + ", " + std::to_string(k / 16) +
                            "] for weight U8 " + shape_to_string(w->shape) + " (N=" +
                            std::to_string(n) + ", K=" + std::to_string(k) + ")");
      }
      // The scalars' values too (two floats a module; the block scales are checked where they are read).
      auto scalar_value = [&](const char* suffix, const char* what) {
        const float v = store_->view(prefix + suffix).as<float>()[0];
        if (!nvfp4_scalar_scale_ok(v)) {
          std::ostringstream m;
          m << (suffix + 1) << " = " << v << ": " << what << " must be a finite, normal, positive f32";
          problem(prefix, m.str());
        }
      };
      if (s2 == nullptr) {
        problem(prefix, "NVFP4 weight has no .weight_scale_2 (expected F32 [])");
      } else if (!is_scalar_f32(s2)) {
        problem(prefix, "weight_scale_2 is " + describe(*s2) + ", expected F32 []");
      } else {
        scalar_value(".weight_scale_2", "the global scale");
      }
      if (is != nullptr && !is_scalar_f32(is)) {
        problem(prefix, "input_scale is " + describe(*is) + ", expected F32 []");
      } else if (is != nullptr) {
        scalar_value(".input_scale", "the activation scale");
      }
      m.has_input_scale = is != nullptr;
    } else {
      // The loaders read BF16 and F32 Linears (model::check_tensors, quantize); an F16 checkpoint is refused there.
      if (w->dtype != DType::kBF16 && w->dtype != DType::kF32) {
        unloadable[w->dtype].emplace_back(prefix, *w);  // one problem a dtype, after the loop
      }
      if (has_scale_tensors) {
        problem(prefix, "weight is " + describe(*w) +
                            " but quantization scales are present (NVFP4 weights are U8)");
      }
    }
    if (const TensorInfo* b = store_->find(prefix + ".bias")) {
      m.has_bias = true;
      if (b->shape != Shape{m.out_features}) {
        problem(prefix, "bias is " + describe(*b) + ", expected [" +
                            std::to_string(m.out_features) + "]");
      }
    }
    modules_.push_back(m);
  }
  std::sort(modules_.begin(), modules_.end(),
            [](const LinearModule& a, const LinearModule& b) { return a.name < b.name; });
  for (size_t i = 0; i < modules_.size(); ++i) module_index_[modules_[i].name] = i;
  for (const auto& [dtype, found] : unloadable) {
    const std::string first = found.front().first + " " + describe(found.front().second);
    const char* hint =
        dtype == DType::kF8_E4M3
            ? " (an FP8 checkpoint: quantize its BF16 release with `fp4moe quantize`, or use an NVFP4 one)"
            : "";
    if (found.size() == 1) {
      problem(found.front().first, "weight " + describe(found.front().second) +
                                       " is neither NVFP4 (U8) nor a float type fp4moe loads (BF16, F32)" + hint);
      continue;
    }
    problem("", std::to_string(found.size()) + " Linear weights are " + std::string(dtype_name(dtype)) + " (first " +
                    first + "): neither NVFP4 (U8) nor a float type fp4moe loads (BF16, F32)" + hint);
    for (const auto& [module, info] : found) unloadable_modules_.insert(module);
  }
}

void Checkpoint::check_against_config() {
  const ModelConfig& c = config_;
  const int64_t n_all_layers = c.n_layers + c.n_nextn_layers;
  std::map<int64_t, std::set<int64_t>> experts;  // layer -> expert indices on disk
  std::map<int64_t, std::set<std::string>> dense_parts, router;
  for (const LinearModule& m : modules_) {
    if (auto want = expected_shape(c, m)) {
      if (m.out_features != want->first || m.in_features != want->second) {
        problem(m.name, std::string(linear_format_name(m.format)) + " weight is [out " +
                            std::to_string(m.out_features) + ", in " +
                            std::to_string(m.in_features) + "], config.json implies [out " +
                            std::to_string(want->first) + ", in " + std::to_string(want->second) +
                            "]");
      }
    }
    if (m.layer >= n_all_layers) {
      problem(m.name, "layer " + std::to_string(m.layer) + " is beyond num_hidden_layers " +
                          std::to_string(c.n_layers) + " + num_nextn_predict_layers " +
                          std::to_string(c.n_nextn_layers));
      continue;
    }
    if (m.layer < 0 || m.layer >= c.n_layers) continue;  // MTP layers are not cross-checked
    const bool moe = c.layer_is_moe[static_cast<size_t>(m.layer)];
    if (m.kind == ModuleKind::kRoutedExpert || m.kind == ModuleKind::kRouter ||
        m.kind == ModuleKind::kSharedExpert) {
      if (!moe) {
        problem(m.name, "layer " + std::to_string(m.layer) +
                            " is dense in config.json but holds MoE module " + m.name);
        continue;
      }
      if (m.kind == ModuleKind::kRoutedExpert) {
        if (m.expert < 0 || m.expert >= c.n_routed_experts) {
          problem(m.name, "expert index " + std::to_string(m.expert) + " is outside [0, " +
                              std::to_string(c.n_routed_experts) + ") (n_routed_experts)");
        } else {
          experts[m.layer].insert(m.expert);
        }
      }
      if (m.kind == ModuleKind::kRouter) router[m.layer].insert(m.name);
    } else if (m.kind == ModuleKind::kDenseMlp) {
      if (moe) {
        problem(m.name, "layer " + std::to_string(m.layer) +
                            " is MoE in config.json but holds dense MLP module " + m.name);
      } else {
        dense_parts[m.layer].insert(m.name);
      }
    }
  }
  // A config asking for more layers than the checkpoint holds is one problem, not one a missing module
  // (num_hidden_layers 10^5 listed ~500,000); the layers on disk are checked.
  int64_t layers_on_disk = 0;
  for (const LinearModule& m : modules_) layers_on_disk = std::max(layers_on_disk, m.layer + 1);
  if (c.n_layers > layers_on_disk) {
    problem("config.json", "num_hidden_layers = " + std::to_string(c.n_layers) + ", but the checkpoint's Linear " +
                               (layers_on_disk == 0 ? std::string("modules hold no layer")
                                                    : "modules hold layers 0-" + std::to_string(layers_on_disk - 1)));
  }
  // Every expert of every MoE layer has all three projections; every dense layer its MLP.
  for (int64_t l = 0; l < std::min(c.n_layers, layers_on_disk); ++l) {
    const std::string lp = "model.layers." + std::to_string(l) + ".mlp";
    if (c.layer_is_moe[static_cast<size_t>(l)]) {
      if (router[l].empty()) problem(lp + ".gate", "MoE layer " + std::to_string(l) + " has no router weight");
      // Names are built for the experts up to the last one on disk; the rest are counted (n_routed_experts
      // 10^9 built 3 x 10^9 names).
      const int64_t named = std::min(c.n_routed_experts, experts[l].empty() ? int64_t{0} : *experts[l].rbegin() + 1);
      int64_t n_missing = 3 * (c.n_routed_experts - named), n_complete = 0;
      std::string first_missing;
      for (int64_t e = 0; e < named; ++e) {
        bool complete = true;
        for (const char* proj : {"gate_proj", "up_proj", "down_proj"}) {
          std::string name = lp + ".experts." + std::to_string(e) + "." + proj;
          if (module_index_.find(name) != module_index_.end()) continue;
          complete = false;
          ++n_missing;
          if (first_missing.empty()) first_missing = std::move(name);
        }
        n_complete += complete ? 1 : 0;
      }
      if (first_missing.empty() && n_missing > 0)
        first_missing = lp + ".experts." + std::to_string(named) + ".gate_proj";
      if (n_missing > 0) {
        problem(lp + ".experts", "MoE layer " + std::to_string(l) + " has " + std::to_string(n_complete) + " of " +
                                     std::to_string(c.n_routed_experts) +
                                     " routed experts (n_routed_experts) whole on "
                                     "disk; " +
                                     std::to_string(n_missing) + " expert projections missing, first " + first_missing);
      }
      if (c.n_shared_experts > 0) {
        for (const char* proj : {"gate_proj", "up_proj", "down_proj"}) {
          std::string name = lp + ".shared_experts." + proj;
          if (module_index_.find(name) == module_index_.end())
            problem(name, "missing (config.json n_shared_experts=" +
                              std::to_string(c.n_shared_experts) + ")");
        }
      }
    } else {
      for (const char* proj : {"gate_proj", "up_proj", "down_proj"}) {
        std::string name = lp + "." + proj;
        if (module_index_.find(name) == module_index_.end())
          problem(name, "missing: dense layer " + std::to_string(l) + " has no " + proj);
      }
    }
  }
  if (module_index_.find("model.embed_tokens") == module_index_.end())
    problem("model.embed_tokens", "missing embedding weight");
  if (!c.tie_word_embeddings && module_index_.find("lm_head") == module_index_.end())
    problem("lm_head", "missing (tie_word_embeddings is false)");
}

void Checkpoint::check_against_quant_config() {
  for (LinearModule& m : modules_) {
    m.excluded = quant_.present && quant_.excluded_by(m.name).has_value();
    if (std::optional<std::string> why =
            quant_.disagreement(m.name, m.format == LinearFormat::kNVFP4, m.kind == ModuleKind::kEmbedding))
      problem(m.name, *why);
  }
  // (Another method's section is named once, by the config read: its empty quant_algo is not a second problem.)
  if (std::optional<std::string> why = quant_.unsupported(); why && !quant_.foreign_method()) problem("", *why);
}

std::optional<std::string> QuantConfig::disagreement(const std::string& module, bool nvfp4, bool embedding) const {
  if (!present) {
    if (nvfp4)
      return "NVFP4 on disk but the checkpoint has no quantization config (hf_quant_config.json or config.json "
             "quantization_config)";
    return std::nullopt;
  }
  if (nvfp4_by_default()) {
    const std::optional<std::string> by = excluded_by(module);
    if (nvfp4 && by) return "NVFP4 on disk but excluded by '" + *by + "' in " + source;
    if (!nvfp4 && !by && !embedding)
      return "BF16 on disk but not excluded, and " + source + " says quant_algo " + quant_algo +
             " for every Linear not in exclude_modules";
    return std::nullopt;
  }
  if (quant_algo == "MIXED_PRECISION") {
    auto it = quantized_layers.find(module);
    const bool listed_nvfp4 = it != quantized_layers.end() && it->second.find("NVFP4") != std::string::npos;
    if (nvfp4 && !listed_nvfp4) return "NVFP4 on disk but not listed as NVFP4 in quantized_layers of " + source;
    if (!nvfp4 && it != quantized_layers.end())
      return "BF16 on disk but listed in quantized_layers of " + source + " as " + it->second;
    return std::nullopt;
  }
  if (nvfp4) return "NVFP4 on disk but " + source + " says quant_algo '" + quant_algo + "'";
  return std::nullopt;
}

std::optional<std::string> QuantConfig::unsupported() const {
  if (!present) return std::nullopt;
  if (!nvfp4_by_default() && quant_algo != "MIXED_PRECISION")
    return source + ": quant_algo '" + quant_algo + "' is not supported (NVFP4, W4A16_NVFP4, MIXED_PRECISION)";
  if (group_size != 16)
    return source + ": group_size " + std::to_string(group_size) + " is not the NVFP4 block size 16";
  return std::nullopt;
}

const LinearModule* Checkpoint::find_module(std::string_view name) const {
  auto it = module_index_.find(name);
  return it == module_index_.end() ? nullptr : &modules_[it->second];
}

LinearTensors Checkpoint::linear(std::string_view name) const {
  const LinearModule* m = find_module(name);
  FP4MOE_CHECK(m != nullptr) << "checkpoint " << dir_.string() << " has no weight module '" << name
                             << "' (no " << name << ".weight)";
  if (!m->ok) {
    std::string msgs;
    for (const auto& p : problems_) {
      if (p.module == m->name) msgs += "\n  " + p.message;
    }
    FP4MOE_FAIL() << "checkpoint " << dir_.string() << ": module " << m->name
                  << " cannot be loaded:" << msgs;
  }
  LinearTensors t;
  t.module = m;
  t.weight = store_->view(m->name + ".weight");
  if (m->format == LinearFormat::kNVFP4) {
    t.weight_scale = store_->view(m->name + ".weight_scale");
    t.weight_scale_2 = store_->view(m->name + ".weight_scale_2").as<float>()[0];
    if (m->has_input_scale) t.input_scale = store_->view(m->name + ".input_scale").as<float>()[0];
  }
  if (m->has_bias) t.bias = store_->view(m->name + ".bias");
  return t;
}

void Checkpoint::require_valid() const {
  if (problems_.empty()) return;
  std::string msgs;
  for (const auto& p : problems_) msgs += "\n  " + p.message;
  FP4MOE_FAIL() << "checkpoint " << dir_.string() << " has " << problems_.size()
                << " problem(s):" << msgs;
}

std::map<ModuleKind, KindSummary> Checkpoint::kind_summary() const {
  std::map<ModuleKind, KindSummary> s;
  for (const LinearModule& m : modules_) {
    KindSummary& k = s[m.kind];
    if (m.format == LinearFormat::kNVFP4) {
      ++k.n_nvfp4;
    } else if (m.weight_dtype == DType::kBF16 || m.weight_dtype == DType::kF32) {
      ++k.n_bf16;
    } else {
      ++k.n_other;
    }
  }
  return s;
}

std::map<DType, uint64_t> Checkpoint::bytes_by_dtype() const {
  std::map<DType, uint64_t> s;
  for (const auto& f : store_->files()) {
    for (const TensorInfo& t : f->tensors()) s[t.dtype] += t.nbytes();
  }
  return s;
}

int64_t Checkpoint::n_parameters() const {
  int64_t n = 0;
  for (const auto& f : store_->files()) {
    for (const TensorInfo& t : f->tensors()) {
      if (ends_with(t.name, ".weight_scale") || ends_with(t.name, ".weight_scale_2") ||
          ends_with(t.name, ".input_scale")) {
        continue;  // quantization metadata, not parameters
      }
      if (ends_with(t.name, ".weight")) {
        const LinearModule* m = find_module(std::string_view(t.name).substr(0, t.name.size() - 7));
        if (m != nullptr && m->format == LinearFormat::kNVFP4) {
          n += 2 * t.numel();  // two e2m1 elements per byte
          continue;
        }
      }
      n += t.numel();
    }
  }
  return n;
}

KindSummary Checkpoint::linear_summary() const {
  KindSummary all;
  for (const auto& [k, v] : kind_summary()) {
    if (k == ModuleKind::kEmbedding) continue;
    all.n_nvfp4 += v.n_nvfp4;
    all.n_bf16 += v.n_bf16;
    all.n_other += v.n_other;
  }
  return all;
}

int64_t Checkpoint::n_experts_on_disk(int64_t layer) const {
  std::set<int64_t> e;
  for (const LinearModule& m : modules_) {
    if (m.kind == ModuleKind::kRoutedExpert && m.layer == layer && m.expert >= 0) e.insert(m.expert);
  }
  return static_cast<int64_t>(e.size());
}

}  // namespace fp4moe::format
