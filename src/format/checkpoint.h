// Checkpoint description: what a Hugging Face checkpoint directory holds, read from config.json,
// hf_quant_config.json / config.json "quantization_config" and the
// safetensors headers (single file or sharded). Facts: ../shared/spec/nvfp4-and-glm.md §2, §4.
//
// Every 2-D weight module is described (name, kind, layer, expert, [out, in], format), where the
// format is decided from the tensors present (U8 .weight + F8_E4M3 .weight_scale + F32
// .weight_scale_2 [+ .input_scale] = NVFP4, a 2-D float .weight = BF16) and then cross-checked
// against the config (shapes, experts per layer, exclude_modules / ignore). Disagreements are
// collected as problems naming the module and the numbers; `fp4moe inspect` prints them and the
// loader-facing accessors (Checkpoint::linear, require_valid) throw on them.
//
// Tested by tests/format/test_checkpoint.cpp (the four golden models, a sharded copy, broken copies).
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/tensor.h"
#include "format/safetensors.h"

namespace fp4moe::format {

enum class LinearFormat : uint8_t { kBF16, kNVFP4 };
std::string_view linear_format_name(LinearFormat f);  // "BF16", "NVFP4"

// What a weight module is, from its name (GLM / DeepSeek naming).
enum class ModuleKind : uint8_t {
  kAttention,     // model.layers.L.self_attn.*
  kDenseMlp,      // model.layers.L.mlp.{gate,up,down}_proj
  kSharedExpert,  // model.layers.L.mlp.shared_experts.*
  kRoutedExpert,  // model.layers.L.mlp.experts.E.{gate,up,down}_proj
  kRouter,        // model.layers.L.mlp.gate
  kLmHead,        // lm_head
  kEmbedding,     // model.embed_tokens (not a Linear: never cross-checked against exclusions)
  kOther,         // anything else 2-D (MTP eh_proj, ...)
};
inline constexpr int kNumModuleKinds = 8;
std::string_view module_kind_name(ModuleKind k);  // "attention", "dense_mlp", ...

// The quantization section, from hf_quant_config.json ({"quantization": {...}}) or from
// config.json "quantization_config" (flat, with "ignore"). Both present: hf_quant_config.json wins
// and a disagreement in quant_algo or the exclusion list is a problem.
struct QuantConfig {
  bool present = false;
  std::string source;             // "hf_quant_config.json" or "config.json quantization_config"
  std::string quant_algo;         // "NVFP4", "W4A16_NVFP4", "MIXED_PRECISION", ...
  std::string quant_method;       // config.json quantization_config's ("modelopt"; "fp8" is refused), or empty
  std::optional<std::string> kv_cache_quant_algo;
  int64_t group_size = 16;
  std::vector<std::string> exclude_modules;  // "exclude_modules" or "ignore"
  std::map<std::string, std::string> quantized_layers;  // MIXED_PRECISION: module -> quant_algo
  std::string producer_name;
  std::string producer_version;

  // A quantization_config of another method (an FP8 checkpoint's "fp8"): a problem names it; its other fields
  // (quant_algo, producer) mean nothing here.
  bool foreign_method() const { return !quant_method.empty() && quant_method != "modelopt"; }
  // True when quant_algo says "every Linear not excluded is NVFP4".
  bool nvfp4_by_default() const { return quant_algo == "NVFP4" || quant_algo == "W4A16_NVFP4"; }
  // Why fp4moe cannot serve what this section describes (a quant_algo other than the NVFP4 ones, a group
  // size other than 16), or nullopt; the loaders refuse it, inspect lists it.
  std::optional<std::string> unsupported() const;
  // vLLM ModelOpt semantics: fnmatch wildcards ('*' crosses dots), exact names, and a plain name
  // also excludes everything below it ("a.b" excludes "a.b.c") or containing it at a dot boundary.
  bool is_excluded(std::string_view module) const;
  // The pattern that excludes `module`, if any.
  std::optional<std::string> excluded_by(std::string_view module) const;
  // How a Linear stored as NVFP4 (nvfp4_on_disk) or BF16 disagrees with this section, or nullopt: NVFP4 with no
  // section, NVFP4 excluded, BF16 not excluded where quant_algo makes every other Linear NVFP4 (an embedding may
  // stay BF16), MIXED_PRECISION's quantized_layers. The one rule: format::Checkpoint reports these as problems
  // (inspect); the model loader, which reads each Linear as stored, warns about them.
  std::optional<std::string> disagreement(const std::string& module, bool nvfp4_on_disk, bool embedding = false) const;
};

// fnmatch-style match ('*' any run, '?' one char, '[...]' sets) over the whole string.
bool wildcard_match(std::string_view pattern, std::string_view text);

// The most decoder layers a config may ask for (no model has so many; a bigger num_hidden_layers is a typo or a
// hostile file that would size per-layer tables by it). Both config parsers check it.
inline constexpr int64_t kMaxModelLayers = int64_t{1} << 16;

// The architecture facts fp4moe needs from config.json (the raw JSON stays available).
struct ModelConfig {
  std::string architecture;  // architectures[0]
  std::string model_type;
  int64_t n_layers = 0;        // num_hidden_layers (MTP layers excluded)
  int64_t n_nextn_layers = 0;  // num_nextn_predict_layers
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;      // dense MLP
  int64_t moe_intermediate_size = 0;  // per routed expert
  int64_t vocab_size = 0;
  int64_t n_routed_experts = 0;
  int64_t n_experts_per_tok = 0;
  int64_t n_shared_experts = 0;  // default 1 for glm4_moe / glm_moe_dsa / deepseek_v3, 0 otherwise (transformers)
  int64_t first_k_dense_replace = 0;
  bool tie_word_embeddings = false;
  std::vector<bool> layer_is_moe;  // from mlp_layer_types, else first_k_dense_replace
  nlohmann::json raw;              // config.json as read

  int64_t n_moe_layers() const;
  int64_t n_dense_layers() const { return n_layers - n_moe_layers(); }
};

// Parses config.json's architecture fields; throws naming the file and the field.
ModelConfig parse_model_config(const nlohmann::json& config, const std::string& source);

// One 2-D weight module.
struct LinearModule {
  std::string name;  // "model.layers.1.mlp.experts.3.up_proj"
  ModuleKind kind = ModuleKind::kOther;
  int64_t layer = -1;   // -1 when not in model.layers
  int64_t expert = -1;  // routed experts only
  LinearFormat format = LinearFormat::kBF16;
  DType weight_dtype = DType::kBF16;  // as stored (U8 for NVFP4)
  int64_t out_features = 0;  // N
  int64_t in_features = 0;   // K (logical; NVFP4 stores K/2 bytes per row)
  bool has_bias = false;
  bool has_input_scale = false;
  bool excluded = false;  // by the quant config
  bool ok = true;         // false when a problem names this module
};

struct CheckpointProblem {
  std::string module;  // module or tensor name; "" for checkpoint-wide problems
  std::string message;
};

// Counts per module kind and format.
struct KindSummary {
  int64_t n_nvfp4 = 0;
  int64_t n_bf16 = 0;   // BF16 or F32 weights
  int64_t n_other = 0;  // weights no loader reads (F16, F8_E4M3: a problem names them)
};

// The loader's view of one Linear: views into the memory-mapped files.
struct LinearTensors {
  const LinearModule* module = nullptr;
  TensorView weight;                       // BF16 [N, K] or U8 [N, K/2]
  std::optional<TensorView> weight_scale;  // F8_E4M3 [N, K/16] (NVFP4)
  float weight_scale_2 = 1.0f;             // NVFP4 global weight scale
  std::optional<float> input_scale;        // NVFP4 activation scale, when calibrated
  std::optional<TensorView> bias;          // [N]
};

class Checkpoint {
 public:
  // Reads everything; never throws for problems in the tensors (they are collected), only for
  // unreadable files (missing config.json, malformed JSON or safetensors).
  explicit Checkpoint(const std::filesystem::path& dir);

  const std::filesystem::path& dir() const { return dir_; }
  const ModelConfig& config() const { return config_; }
  const QuantConfig& quant() const { return quant_; }
  const TensorStore& store() const { return *store_; }
  const std::vector<LinearModule>& modules() const { return modules_; }  // sorted by name
  const std::vector<CheckpointProblem>& problems() const { return problems_; }

  const LinearModule* find_module(std::string_view name) const;  // nullptr when absent
  // The module's tensors; throws naming the module when it is absent or has a problem.
  LinearTensors linear(std::string_view name) const;
  // Any tensor by full name; throws naming the checkpoint and tensor when absent.
  TensorView tensor(std::string_view name) const { return store_->view(name); }
  // Throws one Error listing every problem (module and numbers) when there is any.
  void require_valid() const;

  // Summaries.
  std::map<ModuleKind, KindSummary> kind_summary() const;
  std::map<DType, uint64_t> bytes_by_dtype() const;
  // Parameters, counting each NVFP4 weight as N*K elements (2 per stored byte) and leaving out
  // the quantization scales, so a checkpoint and its NVFP4 version have the same count.
  int64_t n_parameters() const;
  KindSummary linear_summary() const;              // kind_summary()'s counts over the Linears (embeddings excluded)
  int64_t n_experts_on_disk(int64_t layer) const;  // distinct routed expert indices in a layer

 private:
  void classify_modules();
  void check_against_config();
  void check_against_quant_config();
  void problem(const std::string& module, const std::string& message);

  std::filesystem::path dir_;
  ModelConfig config_;
  QuantConfig quant_;
  std::unique_ptr<TensorStore> store_;
  std::vector<LinearModule> modules_;
  std::map<std::string, size_t, std::less<>> module_index_;
  std::vector<CheckpointProblem> problems_;
  std::set<std::string> unloadable_modules_;  // named by a problem for several modules at once
};

// Reads the quantization section of a checkpoint directory (both shapes); `present` is false when
// neither exists. Throws on malformed JSON naming the file.
QuantConfig read_quant_config(const std::filesystem::path& dir, const nlohmann::json& config,
                              std::vector<CheckpointProblem>* problems);

// The layer of a module or tensor name "model.layers.<L>...." (L of 1-9 digits), else -1. The one parse of a
// layer index (the loader's per-layer byte counts and the manifest checks use it too).
int64_t layer_index(std::string_view name);

// Parses "model.layers.<L>." and "mlp.experts.<E>." out of a module name (-1 where absent; indices of 1-9 digits).
ModuleKind classify_module_name(std::string_view name, int64_t* layer, int64_t* expert);

}  // namespace fp4moe::format
