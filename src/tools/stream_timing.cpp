// sglang.bench_serving's per-request timings (see stream_timing.h).
#include "tools/stream_timing.h"

#include <nlohmann/json.hpp>

namespace fp4moe::tools {

bool StreamTiming::on_chunk(std::string_view data, double now_s) {
  if (data == "[DONE]") return true;
  const nlohmann::json j = nlohmann::json::parse(data, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("meta_info") || !j["meta_info"].is_object()) return false;
  const nlohmann::json& meta = j["meta_info"];
  // A count the server left out keeps its value; one of another type, or past max_tokens, makes the chunk
  // malformed.
  bool ok = true;
  const auto count = [&](const char* key, int64_t fallback, int64_t most) {
    if (!meta.contains(key)) return fallback;
    if (!meta[key].is_number_integer() || meta[key].get<int64_t>() < 0 || meta[key].get<int64_t>() > most) {
      ok = false;
      return fallback;
    }
    return meta[key].get<int64_t>();
  };
  constexpr int64_t kAny = INT64_MAX;
  const int64_t n = count("completion_tokens", completion_tokens, max_tokens);
  const int64_t prompt = count("prompt_tokens", prompt_len, kAny), cached = count("cached_tokens", cached_len, kAny);
  if (!ok) return false;
  prompt_len = prompt;
  cached_len = cached;
  if (n > 0 && completion_tokens == 0) first_token_s = now_s;
  completion_tokens = n;
  // As sglang.bench_serving: only a chunk with text (the text so far) is timed, and it must carry its count.
  const bool has_text = j.contains("text") && j["text"].is_string() && !j["text"].get_ref<const std::string&>().empty();
  if (!has_text) return true;
  if (!meta.contains("completion_tokens")) return false;
  if (n <= tokens) return true;
  if (tokens == 0) {
    ttft_s = now_s;
  } else {
    const double gap = now_s - last_s;
    itl_s.insert(itl_s.end(), static_cast<size_t>(n - tokens), gap / static_cast<double>(n - tokens));
  }
  tokens = n;
  last_s = now_s;
  return true;
}

}  // namespace fp4moe::tools
