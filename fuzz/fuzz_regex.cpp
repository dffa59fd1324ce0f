// libFuzzer target for structured-output constraints: any byte string is a regex (or, when it starts
// with '{', a JSON schema) that either compiles into a byte DFA or raises fp4moe::Error naming what is
// wrong. A compiled DFA must keep its promises: every state accepts or can continue (dead states are
// pruned, so a constrained reply can always be completed) and every transition stays in range.
// Anything else (a crash, an ASan/UBSan report, another exception type, a hang) is a finding.
//   cmake -S . -B build -DFP4MOE_FUZZ=ON && cmake --build build --target fuzz_regex
//   build/fuzz/bin/fuzz_regex -dict=fuzz/regex.dict build/fuzz/work/regex fuzz/corpus/regex
// CTest runs it for $FP4MOE_FUZZ_SECONDS (default 60) as fuzz_regex_bounded.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "engine/json_schema.h"
#include "engine/regex_dfa.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string input(reinterpret_cast<const char*>(data), size);
  fp4moe::engine::RegexLimits limits;  // small, so each input stays fast
  limits.max_nfa_states = 20000;
  limits.max_dfa_states = 2000;
  fp4moe::engine::ByteDfa dfa;
  try {
    if (!input.empty() && input[0] == '{') {
      const auto schema = nlohmann::ordered_json::parse(input, nullptr, /*allow_exceptions=*/false);
      if (schema.is_discarded()) return 0;
      dfa = fp4moe::engine::compile_regex(fp4moe::engine::json_schema_to_regex(schema, "[ ]?"), limits);
    } else {
      dfa = fp4moe::engine::compile_regex(input, limits);
    }
  } catch (const fp4moe::Error&) {
    return 0;  // refused with a message
  }
  if (dfa.n_states() < 1 || dfa.n_classes() < 1 || dfa.n_classes() > 256) std::abort();
  for (int32_t s = 0; s < dfa.n_states(); ++s) {
    if (!dfa.accepting(s) && !dfa.can_continue(s)) std::abort();  // a live state that cannot be completed
    bool any = false;
    for (int b = 0; b < 256; ++b) {
      const int32_t t = dfa.step(s, static_cast<uint8_t>(b));
      if (t < fp4moe::engine::ByteDfa::kDead || t >= dfa.n_states()) std::abort();
      any = any || t != fp4moe::engine::ByteDfa::kDead;
    }
    if (any != dfa.can_continue(s)) std::abort();
  }
  return 0;
}
