// The timings of one streamed SGLang /generate request as sglang.bench_serving measures them (bench-serving's
// per-request accounting): TTFT at the first chunk that carries tokens, then for each later chunk carrying k new
// tokens (--num-continuous-decode-steps sends several) k inter-token latencies of its gap / k; a chunk without new
// tokens adds nothing and its gap rolls into the next. Tested by tests/tools/test_stream_timing.cpp.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace fp4moe::tools {

struct StreamTiming {
  int64_t tokens = 0;      // meta_info.completion_tokens of the last chunk
  int64_t prompt_len = 0;  // meta_info.prompt_tokens
  int64_t cached_len = 0;  // meta_info.cached_tokens
  double ttft_s = 0.0;
  std::vector<double> itl_s;
  double last_s = 0.0;  // when the last token-carrying chunk arrived

  // Accounts one SSE data payload that arrived `now_s` seconds after the request was sent ("[DONE]" is ignored).
  // False for a payload that is not a JSON object with a meta_info object whose counts, where present, are integers;
  // the request then fails naming it.
  bool on_chunk(std::string_view data, double now_s);
};

}  // namespace fp4moe::tools
