// Built-in model configs for `--load-format dummy` (random weights from a seed): shapes large enough
// to measure, without a checkpoint. `--model NAME` names one where no directory NAME exists.
//   glm5-shard       GLM-5 widths (H 6144, MLA 64 heads, DSA indexer, I 2048), 4 layers (1 dense + 3 MoE),
//                    32 routed experts top-8 + 1 shared: one GPU's share of GLM-5's 256 under 8-way EP
//   glm5-small       a GLM-5-architecture model of ~2 B parameters (H 2048, 8 layers, 64 experts)
//   glm45-air-shard  GLM-4.5-Air widths (H 4096, 96/8 heads, I 1408), 4 layers (1 dense + 3 MoE), 32 routed
//                    experts top-8 + 1 shared: one GPU's share of its 128 under 4-way EP (runs on --device cuda)
// The widths follow ../shared/spec/nvfp4-and-glm.md (GLM-5 §4.1 table, GLM-4.5-Air table).
// Tested by tests/model/test_presets.cpp (every preset parses, builds its manifest and names itself).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/config.h"

namespace fp4moe::model {

std::vector<std::string> preset_names();
// The config.json object of a preset, or nullopt for an unknown name.
std::optional<nlohmann::json> preset_config(const std::string& name);
// One line per preset: "glm5-shard: ...".
std::string describe_presets();

// The config of a model directory, or of a preset when no such directory exists; fails naming both
// possibilities (and the presets) otherwise.
ModelConfig load_config_or_preset(const std::string& dir_or_preset);

}  // namespace fp4moe::model
