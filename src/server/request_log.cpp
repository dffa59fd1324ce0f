#include "server/request_log.h"

#include <algorithm>
#include <cstdio>
#include <optional>

#include <nlohmann/json.hpp>

#include "format/json_file.h"

namespace fp4moe::server {

namespace {

using nlohmann::json;
using Ordered = nlohmann::ordered_json;  // the body's keys in the order sent

// `text` cut to kRequestLogPartialChars at level 2 (whole at 3), marked with the length cut off.
std::string shown(const std::string& text, int level) {
  if (level >= kRequestLogMaxLevel || text.size() <= kRequestLogPartialChars) return text;
  size_t end = kRequestLogPartialChars;
  while (end > 0 && (static_cast<unsigned char>(text[end]) & 0xC0) == 0x80) --end;  // not inside a UTF-8 character
  return text.substr(0, end) + "... (" + std::to_string(text.size() - end) + " more bytes)";
}

// The prompt's fields of a request body, shown as their sizes at level 1.
Ordered size_of(const Ordered& v) {
  if (v.is_string()) return "<" + std::to_string(v.get_ref<const std::string&>().size()) + " bytes>";
  if (v.is_array()) return "<" + std::to_string(v.size()) + " items>";
  return "<" + std::string(v.type_name()) + ">";
}

// A client's rid with its control characters escaped (\n would start a forged line).
std::string escaped(const std::string& id) {
  std::string out;
  for (const char c : id) {
    const auto u = static_cast<unsigned char>(c);
    if (u < 0x20 || u == 0x7f) {
      char hex[8];
      std::snprintf(hex, sizeof hex, "\\x%02x", u);
      out += hex;
    } else {
      out += c;
    }
  }
  return out;
}

// Level 2: each string of the body cut as `shown` cuts it, and each list past kRequestLogPartialChars items cut to
// that many and a marker, so that a long prompt leaves the fields after it (the sampling fields) in the line.
void cut_values(Ordered& v) {
  if (v.is_string()) {
    v = shown(v.get_ref<const std::string&>(), 2);
  } else if (v.is_array()) {
    if (v.size() > kRequestLogPartialChars) {
      const size_t more = v.size() - kRequestLogPartialChars;
      v.erase(v.begin() + static_cast<std::ptrdiff_t>(kRequestLogPartialChars), v.end());
      v.push_back("... (" + std::to_string(more) + " more items)");
    }
    for (Ordered& e : v) cut_values(e);
  } else if (v.is_object()) {
    for (auto& [key, e] : v.items()) cut_values(e);
  }
}

}  // namespace

std::string request_log_body(const std::string& body, int level) {
  if (level <= 0) return {};
  format::JsonParseFailure failure;
  std::optional<Ordered> parsed = format::try_parse_json<Ordered>(body, format::kMaxJsonFileDepth, &failure);
  if (!parsed || !parsed->is_object()) {  // (the server parsed it as an object already: not reached from it)
    return level == 1 ? "<" + std::to_string(body.size()) + " bytes>" : shown(body, level);
  }
  if (level == 1) {
    // The prompt, and what a chat template renders into it or names its sender: shown as sizes.
    for (const char* key : {"text", "input_ids", "prompt", "messages", "tools", "chat_template_kwargs", "user"}) {
      if (parsed->contains(key)) (*parsed)[key] = size_of((*parsed)[key]);
    }
  } else if (level < kRequestLogMaxLevel) {
    cut_values(*parsed);
  }
  return parsed->dump(-1, ' ', false, Ordered::error_handler_t::replace);
}

std::string request_log_line(int level, bool finished, const std::string& id, const std::string& route,
                             const std::string& body_shown, int64_t prompt_tokens, const std::vector<Accumulated>& accs,
                             double elapsed_s) {
  int64_t completion = 0, cached = 0;
  double e2e = finished ? 0.0 : elapsed_s, ttft = -1;
  std::string reasons;
  for (const Accumulated& a : accs) {
    if (!a.finish) {  // aborted: the tokens it had
      completion += static_cast<int64_t>(a.tokens.size());
      reasons += reasons.empty() ? "unfinished" : ",unfinished";
      continue;
    }
    completion += a.finish->usage.completion_tokens;
    cached += a.finish->usage.cached_tokens;
    e2e = std::max(e2e, a.finish->timings.e2e_s);
    if (a.finish->timings.ttft_s > 0)
      ttft = ttft < 0 ? a.finish->timings.ttft_s : std::min(ttft, a.finish->timings.ttft_s);
    reasons += (reasons.empty() ? "" : ",") + finish_reason_string(*a.finish);
  }
  char times[96];
  std::snprintf(times, sizeof times, "e2e_latency=%.3f s, ttft=%.3f s", e2e, std::max(ttft, 0.0));
  std::string line = std::string(finished ? "Finish: " : "Abort: ") + "rid=" + escaped(id) + ", route=" + route +
                     ", choices=" + std::to_string(accs.size()) + ", prompt_tokens=" + std::to_string(prompt_tokens) +
                     ", completion_tokens=" + std::to_string(completion) + ", cached_tokens=" + std::to_string(cached) +
                     ", finish_reason=" + reasons + ", " + times;
  if (level >= 1) line += ", request=" + body_shown;
  if (level >= 2) {
    json outputs = json::array();
    for (const Accumulated& a : accs) outputs.push_back(shown(a.text, level));
    line += ", output=" + outputs.dump(-1, ' ', false, json::error_handler_t::replace);
  }
  return line;
}

}  // namespace fp4moe::server
