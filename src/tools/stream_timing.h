// The timings of one streamed SGLang /generate request as sglang.bench_serving measures them (bench-serving's
// per-request accounting): only chunks whose text (the text so far) is not empty are timed; TTFT at the first, then
// for each later one carrying k new tokens (--num-continuous-decode-steps sends several) k inter-token latencies of
// its gap / k; a chunk without new tokens adds nothing and its gap rolls into the next. The output length is the
// last chunk's completion_tokens (a reply of tokens whose text stays empty, special tokens only, is timed from its
// first token instead of failing). Tested by tests/tools/test_stream_timing.cpp.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace fp4moe::tools {

struct StreamTiming {
  int64_t max_tokens = INT64_MAX;  // the request's max_new_tokens: a count past it makes a chunk malformed
  int64_t completion_tokens = 0;   // meta_info.completion_tokens of the last chunk (the output length)
  int64_t tokens = 0;              // ... of the last timed chunk
  int64_t prompt_len = 0;          // meta_info.prompt_tokens
  int64_t cached_len = 0;          // meta_info.cached_tokens
  double ttft_s = 0.0;             // at the first timed chunk
  double first_token_s = 0.0;      // at the first chunk with completion_tokens > 0 (a reply whose text stays empty)
  std::vector<double> itl_s;
  double last_s = 0.0;  // when the last token-carrying chunk arrived

  // Accounts one SSE data payload that arrived `now_s` seconds after the request was sent ("[DONE]" is ignored).
  // False for a payload that is not a JSON object with a meta_info object whose counts, where present, are integers
  // in range (completion_tokens <= max_tokens), or a timed chunk without completion_tokens; the request then fails
  // naming it.
  bool on_chunk(std::string_view data, double now_s);
  // A streamed OpenAI completions or chat reply (bench-serving --backend sglang-oai / openai-chat ...), asked with
  // stream_options include_usage and continuous_usage_stats, as sglang.bench_serving's OpenAI request functions time
  // it: each chunk whose delta (choices[0].text or .delta.content) has text is timed, TTFT at the first and one
  // inter-token latency per later one; the counts are the chunks' usage (completion_tokens so far, prompt_tokens,
  // prompt_tokens_details.cached_tokens), the usage-only last chunk (no choices) giving the final ones. False for a
  // payload that is not such an object, or a count as on_chunk refuses it.
  bool on_openai_chunk(std::string_view data, double now_s);
  // The request's TTFT: at its first timed chunk, or at its first token when no chunk had text.
  double ttft() const { return tokens > 0 ? ttft_s : first_token_s; }

 private:
  // One chunk's counts (after they were checked) and whether the text so far is not empty.
  bool advance(int64_t n, bool has_text, bool has_count, double now_s);
  bool openai_text_ = false;  // an OpenAI reply's first timed chunk came
};

}  // namespace fp4moe::tools
