// Reading JSON files (config.json, hf_quant_config.json, tokenizer.json, ...): one place that turns a
// missing file or a parse error into an fp4moe::Error naming the path and nlohmann's position.
#pragma once

#include <cstdint>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/file.h"

namespace fp4moe::format {

// How deep a JSON file may nest: configs, chats and histograms nest a few levels; 100,000 '[' overflowed the stack
// of what walks the value (a segfault), so deeper is refused while parsing.
inline constexpr int kMaxJsonFileDepth = 256;

// Parses `text` (from `source`, for messages): malformed JSON or nesting past kMaxJsonFileDepth fails naming it.
// J is nlohmann::json or nlohmann::ordered_json (key order kept, e.g. for writing configs back).
template <typename J = nlohmann::json>
J parse_json_text(const std::string& text, const std::string& source) {
  bool too_deep = false;
  try {
    return J::parse(text, [&](int depth, typename J::parse_event_t, J&) {
      if (depth > kMaxJsonFileDepth) {
        too_deep = true;
        throw std::runtime_error("too deep");
      }
      return true;
    });
  } catch (const nlohmann::json::exception& e) {
    FP4MOE_FAIL() << source << ": malformed JSON: " << e.what();
  } catch (const std::runtime_error&) {
    if (!too_deep) throw;
  }
  FP4MOE_FAIL() << source << ": JSON nests deeper than " << kMaxJsonFileDepth << " levels";
  return J();
}

template <typename J = nlohmann::json>
J read_json_file(const std::filesystem::path& path) {
  return parse_json_text<J>(read_file(path), path.string());
}

// Whether an integer JSON value lies in [lo, hi] as written: nlohmann's get<int> wraps 2^32 + 8 to 8, and a
// value past int64 is held unsigned. False for a non-integer.
inline bool json_int_in(const nlohmann::json& v, int64_t lo, int64_t hi) {
  if (v.is_number_unsigned()) return hi >= 0 && v.get<uint64_t>() <= static_cast<uint64_t>(hi);
  return v.is_number_integer() && v.get<int64_t>() >= lo && v.get<int64_t>() <= hi;
}

}  // namespace fp4moe::format
