// A compiled PCRE2 pattern (UTF + UCP, JIT when available) that lists the byte ranges it matches,
// as the pre-tokenizer's Split needs them. Shared read-only between threads; match data is per call.
// Tested by tests/engine/test_tokenizer.cpp (through the golden encode cases and RegexSplit*).
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace fp4moe::engine {

class Regex {
 public:
  // `literal`: the pattern is a plain string (tokenizer.json's {"String": ...}).
  // Throws fp4moe::Error with PCRE2's message and the offset in the pattern.
  Regex(const std::string& pattern, bool literal);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // Non-overlapping, non-empty matches [begin, end) in `subject`, which must be valid UTF-8.
  std::vector<std::pair<size_t, size_t>> find_all(std::string_view subject) const;
  const std::string& pattern() const { return pattern_; }

 private:
  std::string pattern_;
  void* code_ = nullptr;  // pcre2_code_8*
  bool jit_ = false;
};

}  // namespace fp4moe::engine
