// sglang.bench_serving's per-request timings (see stream_timing.h).
#include "tools/stream_timing.h"

#include <algorithm>
#include <nlohmann/json.hpp>

namespace fp4moe::tools {
namespace {

// A count of `obj` into *out: one the server left out keeps *out; false for one of another type, below 0 or past
// `most` (the chunk is malformed).
bool read_count(const nlohmann::json& obj, const char* key, int64_t most, int64_t* out) {
  if (!obj.contains(key)) return true;
  const nlohmann::json& v = obj[key];
  if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > most) return false;
  *out = v.get<int64_t>();
  return true;
}

}  // namespace

bool StreamTiming::on_chunk(std::string_view data, double now_s) {
  if (data == "[DONE]") return true;
  const nlohmann::json j = nlohmann::json::parse(data, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("meta_info") || !j["meta_info"].is_object()) return false;
  const nlohmann::json& meta = j["meta_info"];
  int64_t n = completion_tokens, prompt = prompt_len, cached = cached_len;
  if (!read_count(meta, "completion_tokens", max_tokens, &n) ||
      !read_count(meta, "prompt_tokens", INT64_MAX, &prompt) || !read_count(meta, "cached_tokens", INT64_MAX, &cached))
    return false;
  prompt_len = prompt;
  cached_len = cached;
  const bool has_text = j.contains("text") && j["text"].is_string() && !j["text"].get_ref<const std::string&>().empty();
  return advance(n, has_text, meta.contains("completion_tokens"), now_s);
}

bool StreamTiming::on_openai_chunk(std::string_view data, double now_s) {
  if (data == "[DONE]") return true;
  const nlohmann::json j = nlohmann::json::parse(data, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("usage") || !j["usage"].is_object() || !j.contains("choices") ||
      !j["choices"].is_array())
    return false;
  const nlohmann::json& usage = j["usage"];
  int64_t n = completion_tokens, prompt = prompt_len, cached = cached_len;
  if (!read_count(usage, "completion_tokens", max_tokens, &n) ||
      !read_count(usage, "prompt_tokens", INT64_MAX, &prompt))
    return false;
  if (usage.contains("prompt_tokens_details") && usage["prompt_tokens_details"].is_object() &&
      !read_count(usage["prompt_tokens_details"], "cached_tokens", INT64_MAX, &cached))
    return false;
  prompt_len = prompt;
  cached_len = cached;
  if (n > 0 && completion_tokens == 0) first_token_s = now_s;
  completion_tokens = n;
  if (j["choices"].empty()) return true;  // the usage-only last chunk
  const nlohmann::json& c = j["choices"][0];
  const nlohmann::json* text = !c.is_object()       ? nullptr
                               : c.contains("text") ? &c["text"]
                               : c.contains("delta") && c["delta"].is_object() && c["delta"].contains("content")
                                   ? &c["delta"]["content"]
                                   : nullptr;
  // As sglang.bench_serving's OpenAI request functions: a chunk whose delta has text is timed, TTFT at the first, one
  // inter-token latency for each later one (however many tokens it carries).
  if (text == nullptr || !text->is_string() || text->get_ref<const std::string&>().empty()) return true;
  if (!usage.contains("completion_tokens")) return false;
  if (!openai_text_) {
    ttft_s = now_s;
    openai_text_ = true;
  } else {
    itl_s.push_back(now_s - last_s);
  }
  tokens = std::max<int64_t>(n, 1);
  last_s = now_s;
  return true;
}

bool StreamTiming::advance(int64_t n, bool has_text, bool has_count, double now_s) {
  if (n > 0 && completion_tokens == 0) first_token_s = now_s;
  completion_tokens = n;
  // As sglang.bench_serving: only a chunk with text (the text so far) is timed, and it must carry its count.
  if (!has_text) return true;
  if (!has_count) return false;
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
