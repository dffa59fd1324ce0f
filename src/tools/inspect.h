// `fp4moe inspect` as functions: the report (text and JSON) of a checkpoint description, and the
// tiny deterministic GLM-style demo checkpoint that `fp4moe inspect --demo` builds and inspects.
// Implemented in cmd_inspect.cpp; tested by tests/tools/test_inspect.cpp.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "format/checkpoint.h"
#include "model/config.h"

namespace fp4moe::tools {

// What inspect finds: format::Checkpoint's problems (the Linears against config.json and the
// quantization config), then the model loader's (model::check_tensors: every other tensor the
// architecture reads, missing or of the wrong shape / dtype; config.json refused by the model's parser),
// and the tensors nothing reads.
struct Findings {
  std::vector<format::CheckpointProblem> problems;
  std::vector<std::string> unread;                            // in files the model reads from
  std::vector<std::pair<std::string, int64_t>> unread_files;  // files nothing reads: name, tensor count
  std::string skipped;  // why the tensors besides the Linears were not checked (model::TensorCheck), or ""
  // What fp4moe loads but other engines would read wrong: NVFP4 Linears without .input_scale under quant_algo NVFP4
  // (calibrated W4A4: vLLM / SGLang's FP4 GEMMs quantize activations with it; fp4moe's W4A16 does not read it).
  std::vector<std::string> warnings;
  bool loaded = false;  // the model loader read config.json and generation_config.json (then the fields below are set)
  // What ends a sequence (config.json's eos_token_id and generation_config.json's, as the loader merges them) and
  // the sampling values generation_config.json recommends (the server's --sampling-defaults model).
  std::vector<int64_t> eos_token_ids;
  model::GenerationDefaults generation;
};
// check_scales: also read every NVFP4 Linear's e4m3 block scales (an eighth of the packed weight bytes) and report
// a NaN or negative one (format::nvfp4_bad_block_scale), as the load would refuse it.
Findings find_problems(const format::Checkpoint& c, bool check_scales = false);

// Human-readable report: architecture, layer/expert counts, module formats by kind, bytes by
// dtype, parameters, quantization config, every problem and the unread tensors.
std::string inspect_text(const format::Checkpoint& c, const Findings& f);
std::string inspect_text(const format::Checkpoint& c);  // with find_problems(c)
// The same facts as JSON (keys: dir, architecture, model_type, layers, experts, modules,
// bytes_by_dtype, parameters, quantization, generation (null when the model loader refuses the config), problems,
// warnings, unread, unread_files).
nlohmann::ordered_json inspect_json(const format::Checkpoint& c, const Findings& f);
nlohmann::ordered_json inspect_json(const format::Checkpoint& c);

// Writes a tiny BF16 Glm4MoeForCausalLM checkpoint (2 layers: 1 dense, 1 MoE with 8 experts
// top-2 + 1 shared; hidden 64, vocab 256) with weights drawn deterministically from `seed`.
void write_demo_bf16_checkpoint(const std::filesystem::path& dir, uint64_t seed);

}  // namespace fp4moe::tools
