// Reading JSON (config.json, hf_quant_config.json, tokenizer.json, ...; request bodies and schemas too, through
// try_parse_json): one place that bounds the nesting and turns a missing file or a parse error into a message
// naming the source and nlohmann's position.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/file.h"

namespace fp4moe::format {

// How deep a JSON file may nest: configs, chats and histograms nest a few levels; 100,000 '[' overflowed the stack
// of what walks the value (a segfault), so deeper is refused while parsing.
inline constexpr int kMaxJsonFileDepth = 256;

// The one depth-bounded JSON parse (files, request bodies, JSON schemas given as text): what reads a value later
// (dumps, schema compilers, template walks) recurses per level, so a value nesting deeper than `max_depth` is
// refused while parsing. Returns the value, or nullopt with `failure` filled. J is nlohmann::json or
// nlohmann::ordered_json.
struct JsonParseFailure {
  bool too_deep = false;  // else malformed
  // "malformed JSON: <nlohmann's message with the byte position>" or "JSON nests deeper than <max_depth> levels"
  std::string message;
};
template <typename J = nlohmann::json>
std::optional<J> try_parse_json(std::string_view text, int max_depth, JsonParseFailure* failure) {
  bool too_deep = false;
  try {
    J value = J::parse(text, [&](int depth, typename J::parse_event_t, J&) {
      if (depth > max_depth) {
        too_deep = true;
        throw std::runtime_error("too deep");
      }
      return true;
    });
    return value;
  } catch (const nlohmann::json::exception& e) {  // parse_error, or out_of_range 406: a number past a double
    *failure = {false, std::string("malformed JSON: ") + e.what()};
  } catch (const std::runtime_error&) {
    if (!too_deep) throw;
    *failure = {true, "JSON nests deeper than " + std::to_string(max_depth) + " levels"};
  }
  return std::nullopt;
}

// Parses `text` (from `source`, for messages): malformed JSON or nesting past kMaxJsonFileDepth fails naming it.
template <typename J = nlohmann::json>
J parse_json_text(const std::string& text, const std::string& source) {
  JsonParseFailure failure;
  std::optional<J> value = try_parse_json<J>(text, kMaxJsonFileDepth, &failure);
  if (!value) FP4MOE_FAIL() << source << ": " << failure.message;
  return std::move(*value);
}

// A model's JSON files (config.json, tokenizer.json, ...) are regular files: a FIFO or a device in their place is
// refused before it is opened (opening a FIFO with no writer blocked forever).
template <typename J = nlohmann::json>
J read_json_file(const std::filesystem::path& path) {
  std::error_code ec;
  const std::filesystem::file_status st = std::filesystem::status(path, ec);
  FP4MOE_CHECK(ec || std::filesystem::is_regular_file(st) || std::filesystem::is_directory(st))
      << path.string() << " is not a regular file (a FIFO, socket or device; a JSON file is read whole)";
  return parse_json_text<J>(read_file(path), path.string());
}

// Whether an integer JSON value lies in [lo, hi] as written: nlohmann's get<int> wraps 2^32 + 8 to 8, and a
// value past int64 is held unsigned. False for a non-integer.
inline bool json_int_in(const nlohmann::json& v, int64_t lo, int64_t hi) {
  if (v.is_number_unsigned()) return hi >= 0 && v.get<uint64_t>() <= static_cast<uint64_t>(hi);
  return v.is_number_integer() && v.get<int64_t>() >= lo && v.get<int64_t>() <= hi;
}

}  // namespace fp4moe::format
