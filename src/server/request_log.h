// SGLang's --log-requests (--log-requests-level 0-3): one stderr line per HTTP generation request when it ends,
//   [2026-12-07 23:10:00] Finish: rid=cmpl-7, route=/v1/completions, choices=1, prompt_tokens=12,
//   completion_tokens=32, cached_tokens=0, finish_reason=length, e2e_latency=0.412 s, ttft=0.031 s[, request=...]
//   [, output=...]
// ("Abort:" when the client left before the end). Only admitted requests get a line (a rejected one has its error
// reply and the error counters). Level 0: that metadata; 1: + the request body without its prompt (text, input_ids,
// prompt, messages, and tools, chat_template_kwargs and user, shown as their sizes): the sampling fields as sent; 2: +
// the body with each string cut to kRequestLogPartialChars bytes (each list to as many items) and each choice's
// output text cut the same; 3: + both whole. Tested by tests/server/test_request_log.cpp and test_server_e2e.cpp.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "server/protocol.h"

namespace fp4moe::server {

inline constexpr size_t kRequestLogPartialChars = 2048;
inline constexpr int kRequestLogMaxLevel = 3;

// What a line of this level shows of the request body (JSON, its keys in the order sent): "" at level 0.
std::string request_log_body(const std::string& body, int level);

// The line (without the timestamp and newline). `finished`: every choice ended (else "Abort:", its latency
// `elapsed_s` since admission); `body_shown` from request_log_body; the rid's control characters escaped (\xNN).
std::string request_log_line(int level, bool finished, const std::string& id, const std::string& route,
                             const std::string& body_shown, int64_t prompt_tokens, const std::vector<Accumulated>& accs,
                             double elapsed_s = 0.0);

}  // namespace fp4moe::server
