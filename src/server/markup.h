// Pieces the model-output parsers share (reasoning.h, tool_calls.h): the held-back tail of a stream
// that may still become a tag, and the lookup of a format table by name.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <string>
#include <string_view>

namespace fp4moe::server::markup {

// The length of the longest suffix of s that is a proper prefix of tag (the text to hold back).
inline size_t partial_tag_suffix(std::string_view s, std::string_view tag) {
  for (size_t n = std::min(s.size(), tag.size() - 1); n > 0; --n) {
    if (s.substr(s.size() - n) == tag.substr(0, n)) return n;
  }
  return 0;
}

template <class Format, size_t N>
const Format* find_by_name(const std::array<Format, N>& formats, std::string_view name) {
  for (const Format& f : formats) {
    if (f.name == name) return &f;
  }
  return nullptr;
}

template <class Format, size_t N>
std::string names_of(const std::array<Format, N>& formats) {
  std::string s;
  for (const Format& f : formats) s += (s.empty() ? "" : ", ") + std::string(f.name);
  return s;
}

}  // namespace fp4moe::server::markup
