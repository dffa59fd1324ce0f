// `fp4moe inspect` as functions: the report (text and JSON) of a checkpoint description, and the
// tiny deterministic GLM-style demo checkpoint that `fp4moe inspect --demo` builds and inspects.
// Implemented in cmd_inspect.cpp; tested by tests/tools/test_inspect.cpp.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>

#include <nlohmann/json.hpp>

#include "format/checkpoint.h"

namespace fp4moe::tools {

// Human-readable report: architecture, layer/expert counts, module formats by kind, bytes by
// dtype, parameters, quantization config and every problem.
std::string inspect_text(const format::Checkpoint& c);
// The same facts as JSON (keys: dir, architecture, model_type, layers, experts, modules,
// bytes_by_dtype, parameters, quantization, problems).
nlohmann::ordered_json inspect_json(const format::Checkpoint& c);

// Writes a tiny BF16 Glm4MoeForCausalLM checkpoint (2 layers: 1 dense, 1 MoE with 8 experts
// top-2 + 1 shared; hidden 64, vocab 256) with weights drawn deterministically from `seed`.
void write_demo_bf16_checkpoint(const std::filesystem::path& dir, uint64_t seed);

}  // namespace fp4moe::tools
