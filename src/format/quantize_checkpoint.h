// BF16 checkpoint -> ModelOpt-layout NVFP4 checkpoint (the weight part of `fp4moe quantize`).
// Facts: ../shared/spec/nvfp4-and-glm.md §1.4 (recipe), §1.6 (scale sharing), §2 (layout).
//
// Scope: every Linear of the input except the exclusion patterns (default "lm_head" and
// "model.layers.*.mlp.gate", the routers; embeddings are never quantized). Scale sharing as
// ModelOpt exports it: q/k/v_proj of one attention share one weight_scale_2 (max of their
// amax / 2688), and each gate_proj/up_proj pair (dense MLP, shared expert, every routed expert)
// shares one. MLA projections are not grouped (ModelOpt's grouping for them is unverified, spec
// §1.6); each gets its own scale, which every loader accepts.
//
// input_scale needs calibration (amax of each Linear's input over a prompt set), which needs a
// forward pass: the caller passes `input_amax` (module -> amax). With amax for every quantized
// module the output is "NVFP4" (W4A4-ready) and each module gets input_scale = amax / 2688 (group
// members take the group max, as ModelOpt). With an empty map the output is "W4A16_NVFP4"
// (weight-only, no input_scale tensors, as ModelOpt writes weight-only exports). A map that
// covers only some modules is an error naming the missing ones: a silently wrong input_scale is
// worse than none.
//
// Output: one safetensors file per input file (model.safetensors, or model-0000i-of-0000n shards
// with model.safetensors.index.json), config.json with "quantization_config" and
// hf_quant_config.json in the golden models' shapes; every other non-safetensors file copied.
// Tested by tests/format/test_quantize_checkpoint.cpp (golden models reproduced bit for bit).
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "format/checkpoint.h"

namespace fp4moe::format {

struct QuantizeOptions {
  // Exclusion patterns (vLLM/ModelOpt semantics, see QuantConfig::is_excluded), appended after
  // the defaults (default_quantize_exclusions).
  std::vector<std::string> exclude;
  // Calibrated input amax per quantized module; empty = weight-only (no input_scale).
  std::map<std::string, float> input_amax;
  std::string producer_name = "fp4moe";
  std::string producer_version;
  // Input safetensors files not written (file names): those none of whose tensors the architecture reads (a
  // golden.safetensors of test data beside the shards, which a folder without an index reads as one).
  std::set<std::string> skip_files;
};

struct QuantizeReport {
  std::string quant_algo;  // "NVFP4" or "W4A16_NVFP4"
  std::vector<std::string> exclude_modules;  // as written
  int64_t n_quantized = 0;       // Linears written as NVFP4
  int64_t n_kept = 0;            // Linears kept in their dtype (excluded)
  int64_t n_scale_groups = 0;    // weight_scale_2 groups of more than one module
  bool has_input_scales = false;
  uint64_t bytes_in = 0;
  uint64_t bytes_out = 0;
};

// The default patterns: lm_head and the MoE routers.
std::vector<std::string> default_quantize_exclusions();

// The module prefix whose members share weight_scale_2 and input_scale with `module`
// ("....self_attn.qkv" for q/k/v_proj, "....gate_up" for gate/up_proj), or `module` itself.
std::string scale_group_of(const std::string& module);

// The exclusion list quantize writes for checkpoint `in`: the defaults, then `extra` (duplicates dropped; an empty
// pattern is refused), then what must stay BF16 and neither leaves so: the GLM-5 DSA indexer's weights_proj (SGLang
// and vLLM build it unquantized) and each MTP layer on disk after num_hidden_layers ("model.layers.78.*", as
// ModelOpt's _add_mtp_exclusions: speculative decoding loads it in BF16, and calibration never runs it).
std::vector<std::string> quantize_exclusions(const std::vector<std::string>& extra, const Checkpoint& in);

// The Linear modules of `in` that quantize_checkpoint would quantize with these options
// (sorted); calibration uses it to keep only the amax values that will be written. Fails, before any work, when some
// of them have an in_features K that is not a multiple of the NVFP4 block, with their count, the first ones and a
// pattern that excludes them all.
std::vector<std::string> modules_to_quantize(const Checkpoint& in, const std::vector<std::string>& extra_exclude);

// The patterns of `extra` that match no Linear module of `in` (a typo keeps nothing in BF16; the command warns).
std::vector<std::string> unmatched_exclusions(const Checkpoint& in, const std::vector<std::string>& extra);

// Makes the output directory (and its parents); fails naming it and the OS reason (/proc/x, a full disk). The CLI
// calls it before calibrating (through QuantizeOutput), quantize_checkpoint before writing.
void create_output_dir(const std::filesystem::path& out_dir);

// The output directory of one quantize run, made (with its missing parents) on construction, before calibrating.
// Unless commit() is called, the destructor removes the directories the run made, each only while it is empty (a
// file anyone put there keeps it): a run that fails after making them (a bad calibration prompt) leaves none
// behind. The files are quantize_checkpoint's to remove: it removes what it wrote when it fails part-way.
class QuantizeOutput {
 public:
  explicit QuantizeOutput(std::filesystem::path dir);
  ~QuantizeOutput();
  QuantizeOutput(const QuantizeOutput&) = delete;
  QuantizeOutput& operator=(const QuantizeOutput&) = delete;
  void commit() { committed_ = true; }

 private:
  std::filesystem::path dir_;   // absolute
  std::filesystem::path made_;  // the topmost directory the run made (empty: none, dir_ existed)
  bool committed_ = false;
};

// The refusals quantize_checkpoint makes before any work (output not empty or the input itself,
// input invalid or already quantized), so a caller can check them before a long calibration pass.
void check_quantize_paths(const Checkpoint& in, const std::filesystem::path& out_dir);

// Quantizes `in` into `out_dir` (created; must not exist or be empty). Throws naming the module and
// numbers when the input has problems, is already quantized, or the amax map is partial; a failure while writing
// removes the files this call wrote (and nothing else).
QuantizeReport quantize_checkpoint(const Checkpoint& in, const std::filesystem::path& out_dir,
                                   const QuantizeOptions& options);

}  // namespace fp4moe::format
