// Reading JSON files (config.json, hf_quant_config.json, tokenizer.json, ...): one place that turns a
// missing file or a parse error into an fp4moe::Error naming the path and nlohmann's position.
#pragma once

#include <filesystem>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/file.h"

namespace fp4moe::format {

// J is nlohmann::json or nlohmann::ordered_json (key order kept, e.g. for writing configs back).
template <typename J = nlohmann::json>
J read_json_file(const std::filesystem::path& path) {
  const std::string text = read_file(path);
  try {
    return J::parse(text);
  } catch (const nlohmann::json::exception& e) {
    FP4MOE_FAIL() << path.string() << ": malformed JSON: " << e.what();
  }
  return J();
}

}  // namespace fp4moe::format
