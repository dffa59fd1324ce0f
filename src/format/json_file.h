// Reading JSON files (config.json, hf_quant_config.json, tokenizer.json, ...): one place that turns a
// missing file or a parse error into an fp4moe::Error naming the path and nlohmann's position.
#pragma once

#include <cstdint>
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

// Whether an integer JSON value lies in [lo, hi] as written: nlohmann's get<int> wraps 2^32 + 8 to 8, and a
// value past int64 is held unsigned. False for a non-integer.
inline bool json_int_in(const nlohmann::json& v, int64_t lo, int64_t hi) {
  if (v.is_number_unsigned()) return hi >= 0 && v.get<uint64_t>() <= static_cast<uint64_t>(hi);
  return v.is_number_integer() && v.get<int64_t>() >= lo && v.get<int64_t>() <= hi;
}

}  // namespace fp4moe::format
