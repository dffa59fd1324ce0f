// engine::ByteDfa: a regular expression compiled to a deterministic automaton over UTF-8 bytes, the
// machine constrained decoding (engine/constraint.h) walks: which bytes may follow what was generated,
// and whether it is a whole match. The syntax is the subset structured-output regexes use (outlines'
// and SGLang's `regex`, JSON-schema `pattern`): literals (UTF-8), `.`, classes `[a-z\d]` / `[^...]`,
// `\d \w \s \D \W \S`, `\n \t \r \f \v \0 \xHH \uHHHH`, groups `(...)`, `(?:...)`, `(?P<name>...)`,
// `|`, `* + ?`, `{n} {n,} {n,m}` (a lazy `?` suffix is accepted: it changes which match a search finds,
// not the language), and `^` / `$` at the ends. The whole generated text must match (fullmatch).
// Lookaround, backreferences, word boundaries and inline flags are refused naming the offset.
// `\w` is ASCII ([A-Za-z0-9_]); `.` and negated classes match any Unicode scalar value (valid UTF-8
// only, so a constrained reply is always valid UTF-8) except that `.` excludes `\n`, as Python's `re`.
//
//   ByteDfa dfa = compile_regex(R"(\d{3}-[a-z]+)");
//   int32_t s = dfa.start();  s = dfa.step(s, '1');  ...  dfa.accepting(s);
//
// Built by Thompson's construction, then the subset construction over byte classes, then every state
// from which no match is reachable is removed (a step into it is kDead), so a live state can always
// be completed. Tested by tests/engine/test_constraint.cpp.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace fp4moe::engine {

struct RegexLimits {
  int64_t max_nfa_states = 1 << 20;  // Thompson states (counted repetitions copy their operand)
  int64_t max_dfa_states = 1 << 17;  // 131072 states x (byte classes, a few dozen) x 4 B of transitions
  // NFA states visited by the subset construction (~0.6 s at 2e7 on one core): bounds what one request's
  // pattern can cost the thread compiling it.
  int64_t max_work = 20'000'000;
};

class ByteDfa {
 public:
  static constexpr int32_t kDead = -1;

  int32_t start() const { return 0; }
  int32_t step(int32_t state, uint8_t byte) const {
    return next_[static_cast<size_t>(state) * n_classes_ + class_of_[byte]];
  }
  bool accepting(int32_t state) const { return accepting_[static_cast<size_t>(state)] != 0; }
  // Some byte leads on from `state` (false: a match that can only end here).
  bool can_continue(int32_t state) const { return can_continue_[static_cast<size_t>(state)] != 0; }
  int32_t n_states() const { return static_cast<int32_t>(accepting_.size()); }
  // Bytes no part of the pattern tells apart share a class; the table has a column per class.
  int32_t n_classes() const { return n_classes_; }
  // Whether all of `text` matches.
  bool matches(std::string_view text) const;

 private:
  friend ByteDfa compile_regex(std::string_view pattern, const RegexLimits& limits);
  uint8_t class_of_[256] = {};
  int32_t n_classes_ = 1;
  std::vector<int32_t> next_;  // [n_states * n_classes]
  std::vector<uint8_t> accepting_;
  std::vector<uint8_t> can_continue_;
};

// Fails (fp4moe::Error) naming the offset and what is wrong, a limit exceeded with its numbers, or a
// pattern that matches nothing.
ByteDfa compile_regex(std::string_view pattern, const RegexLimits& limits = {});

// `text` as a regex that matches exactly it (metacharacters escaped).
std::string regex_escape(std::string_view text);

}  // namespace fp4moe::engine
