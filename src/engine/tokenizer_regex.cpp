// PCRE2 wrapper for the pre-tokenizer (see tokenizer_regex.h). Tested by tests/engine/test_tokenizer.cpp.
#define PCRE2_CODE_UNIT_WIDTH 8
#include "engine/tokenizer_regex.h"

#include <pcre2.h>

#include <memory>

#include "core/error.h"

namespace fp4moe::engine {

namespace {

std::string pcre2_message(int code) {
  PCRE2_UCHAR buffer[256];
  const int n = pcre2_get_error_message(code, buffer, sizeof(buffer));
  return n < 0 ? "PCRE2 error " + std::to_string(code) : std::string(reinterpret_cast<char*>(buffer));
}

using MatchData = std::unique_ptr<pcre2_match_data, decltype(&pcre2_match_data_free)>;

}  // namespace

Regex::Regex(const std::string& pattern, bool literal) : pattern_(pattern) {
  int error_code = 0;
  PCRE2_SIZE error_offset = 0;
  // PCRE2_LITERAL admits UTF but not UCP (which only changes classes a literal does not have).
  const uint32_t options = PCRE2_UTF | (literal ? PCRE2_LITERAL : PCRE2_UCP);
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), options,
                                   &error_code, &error_offset, nullptr);
  if (code == nullptr) {  // a tokenizer file's pattern: the user's input, named without this file's line
    throw Error("cannot compile regex /" + pattern + "/ at offset " + std::to_string(error_offset) + ": " +
                pcre2_message(error_code));
  }
  code_ = code;
  jit_ = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
}

Regex::~Regex() { pcre2_code_free(static_cast<pcre2_code*>(code_)); }

std::vector<std::pair<size_t, size_t>> Regex::find_all(std::string_view subject) const {
  auto* code = static_cast<pcre2_code*>(code_);
  MatchData md(pcre2_match_data_create_from_pattern(code, nullptr), &pcre2_match_data_free);
  FP4MOE_CHECK(md != nullptr) << "out of memory for PCRE2 match data of /" << pattern_ << "/";
  std::vector<std::pair<size_t, size_t>> out;
  const auto* data = reinterpret_cast<PCRE2_SPTR>(subject.data());
  size_t offset = 0;
  bool use_jit = jit_;
  while (offset <= subject.size()) {
    // The caller validated the UTF-8 once; checking again per call would make this loop quadratic.
    const uint32_t options = PCRE2_NO_UTF_CHECK | (use_jit ? 0u : PCRE2_NO_JIT);
    int rc = pcre2_match(code, data, subject.size(), offset, options, md.get(), nullptr);
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT && use_jit) {
      use_jit = false;  // the interpreter keeps its backtracking on the heap
      continue;
    }
    if (rc == PCRE2_ERROR_NOMATCH) break;
    FP4MOE_CHECK(rc >= 0) << "regex /" << pattern_ << "/ failed at byte " << offset << " of " << subject.size()
                          << ": " << pcre2_message(rc);
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md.get());
    const size_t begin = ov[0], end = ov[1];
    if (end > begin) {
      out.emplace_back(begin, end);
      offset = end;
    } else {
      // Empty match: step one whole character past it.
      if (begin >= subject.size()) break;
      offset = begin + 1;
      while (offset < subject.size() && (static_cast<uint8_t>(subject[offset]) & 0xC0) == 0x80) ++offset;
    }
  }
  return out;
}

}  // namespace fp4moe::engine
