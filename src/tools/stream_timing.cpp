// sglang.bench_serving's per-request timings (see stream_timing.h).
#include "tools/stream_timing.h"

#include <nlohmann/json.hpp>

namespace fp4moe::tools {

bool StreamTiming::on_chunk(std::string_view data, double now_s) {
  if (data == "[DONE]") return true;
  const nlohmann::json j = nlohmann::json::parse(data, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("meta_info") || !j["meta_info"].is_object()) return false;
  const nlohmann::json& meta = j["meta_info"];
  // A count the server left out keeps its value; one of another type makes the chunk malformed.
  bool ok = true;
  const auto count = [&](const char* key, int64_t fallback) {
    if (!meta.contains(key)) return fallback;
    if (!meta[key].is_number_integer()) {
      ok = false;
      return fallback;
    }
    return meta[key].get<int64_t>();
  };
  const int64_t n = count("completion_tokens", tokens);
  const int64_t prompt = count("prompt_tokens", prompt_len), cached = count("cached_tokens", cached_len);
  if (!ok) return false;
  prompt_len = prompt;
  cached_len = cached;
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
