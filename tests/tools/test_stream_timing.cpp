// tools::StreamTiming, bench-serving's per-request accounting of a streamed /generate reply, against
// sglang.bench_serving's definitions: TTFT at the first token-carrying chunk; a later chunk carrying k new tokens
// gives k inter-token latencies of gap / k; a chunk without new tokens adds nothing and its gap rolls into the next;
// only chunks with text are timed; a malformed chunk (not JSON, no meta_info object, a count that is not an
// integer or is past max_new_tokens) is refused, not thrown.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tools/stream_timing.h"

namespace fp4moe::tools {
namespace {

std::string chunk(int64_t completion_tokens) {
  return R"({"text": "x", "meta_info": {"prompt_tokens": 7, "cached_tokens": 2, "completion_tokens": )" +
         std::to_string(completion_tokens) + "}}";
}

TEST(StreamTiming, ChunksOfSeveralTokensSpreadTheirGap) {
  StreamTiming t;
  EXPECT_TRUE(t.on_chunk(chunk(1), 0.5));
  EXPECT_TRUE(t.on_chunk(chunk(1), 0.6));  // no new token: nothing, the gap rolls on
  EXPECT_TRUE(t.on_chunk(chunk(2), 0.7));
  EXPECT_TRUE(t.on_chunk(chunk(6), 1.5));  // 4 new tokens over 0.8 s
  EXPECT_TRUE(t.on_chunk("[DONE]", 1.6));
  EXPECT_DOUBLE_EQ(t.ttft_s, 0.5);
  ASSERT_EQ(t.itl_s.size(), 5u);  // output tokens - 1, as TPOT counts them
  EXPECT_NEAR(t.itl_s[0], 0.2, 1e-12);
  for (size_t i = 1; i < 5; ++i) EXPECT_NEAR(t.itl_s[i], 0.2, 1e-12) << i;
  EXPECT_EQ(t.tokens, 6);
  EXPECT_EQ(t.prompt_len, 7);
  EXPECT_EQ(t.cached_len, 2);
}

// As sglang.bench_serving: a chunk whose text (so far) is empty is not timed (a token the decoder holds back, a
// special token); the first timed chunk may carry several tokens (no ITL for them).
TEST(StreamTiming, OnlyChunksWithTextAreTimed) {
  StreamTiming t;
  EXPECT_TRUE(t.on_chunk(R"({"text": "", "meta_info": {"completion_tokens": 1}})", 0.3));
  EXPECT_TRUE(t.on_chunk(R"({"text": "ab", "meta_info": {"completion_tokens": 3}})", 0.5));
  EXPECT_TRUE(t.on_chunk(R"({"text": "abc", "meta_info": {"completion_tokens": 4}})", 0.9));
  EXPECT_DOUBLE_EQ(t.first_token_s, 0.3);
  EXPECT_DOUBLE_EQ(t.ttft_s, 0.5);
  EXPECT_DOUBLE_EQ(t.ttft(), 0.5);
  ASSERT_EQ(t.itl_s.size(), 1u);
  EXPECT_NEAR(t.itl_s[0], 0.4, 1e-12);
  EXPECT_EQ(t.completion_tokens, 4);
  // A reply whose text stays empty: its count, no timed chunk.
  StreamTiming quiet;
  EXPECT_TRUE(quiet.on_chunk(R"({"text": "", "meta_info": {"completion_tokens": 2}})", 0.2));
  EXPECT_EQ(quiet.tokens, 0);
  EXPECT_EQ(quiet.completion_tokens, 2);
  EXPECT_DOUBLE_EQ(quiet.first_token_s, 0.2);
  EXPECT_DOUBLE_EQ(quiet.ttft(), 0.2);
}

TEST(StreamTiming, MalformedChunksAreRefused) {
  for (const std::string& bad :
       {std::string("not json"), std::string("[1, 2]"), std::string(R"({"text": "x"})"),
        std::string(R"({"meta_info": 3})"), std::string(R"({"meta_info": {"completion_tokens": "x"}})"),
        std::string(R"({"meta_info": {"completion_tokens": 1.5}})"),
        std::string(R"({"meta_info": {"completion_tokens": 2, "prompt_tokens": null}})")}) {
    StreamTiming t;
    EXPECT_FALSE(t.on_chunk(bad, 0.1)) << bad;
    EXPECT_EQ(t.tokens, 0) << bad;
  }
  StreamTiming t;  // counts left out keep their values
  EXPECT_TRUE(t.on_chunk(R"({"meta_info": {}})", 0.1));
  EXPECT_EQ(t.tokens, 0);
  // A timed chunk must carry its count; a count past the request's max_new_tokens is refused (1e9 tokens would
  // have allocated 8 GB of latencies).
  EXPECT_FALSE(t.on_chunk(R"({"text": "a", "meta_info": {}})", 0.2));
  StreamTiming bounded;
  bounded.max_tokens = 16;
  EXPECT_TRUE(bounded.on_chunk(chunk(16), 0.1));
  EXPECT_FALSE(bounded.on_chunk(chunk(1000000000), 0.2));
  EXPECT_FALSE(bounded.on_chunk(chunk(-1), 0.2));
}

// --backend openai / openai-chat ..., as sglang.bench_serving's OpenAI request functions time them: a chunk whose delta
// has text is timed (TTFT at the first, one inter-token latency per later one, however many tokens it carries); the
// counts are each chunk's usage so far (continuous_usage_stats), the usage-only last chunk giving the final ones.
TEST(StreamTiming, OpenAiChunksCountByTheirUsage) {
  auto completion = [](const std::string& text, int64_t n) {
    return R"({"choices": [{"index": 0, "text": ")" + text +
           R"("}], "usage": {"prompt_tokens": 7, "completion_tokens": )" + std::to_string(n) +
           R"(, "prompt_tokens_details": {"cached_tokens": 3}}})";
  };
  StreamTiming t;
  EXPECT_TRUE(t.on_openai_chunk(completion("", 1), 0.3));  // no text: counted, not timed
  EXPECT_TRUE(t.on_openai_chunk(completion("ab", 2), 0.5));
  EXPECT_TRUE(t.on_openai_chunk(completion("", 3), 0.7));   // an empty delta: not timed
  EXPECT_TRUE(t.on_openai_chunk(completion("c", 6), 1.3));  // 3 new tokens: one latency
  EXPECT_TRUE(t.on_openai_chunk(R"({"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 7}})", 1.4));
  EXPECT_TRUE(t.on_openai_chunk("[DONE]", 1.5));
  EXPECT_DOUBLE_EQ(t.first_token_s, 0.3);
  EXPECT_DOUBLE_EQ(t.ttft(), 0.5);
  ASSERT_EQ(t.itl_s.size(), 1u);
  EXPECT_NEAR(t.itl_s[0], 0.8, 1e-12);
  EXPECT_EQ(t.completion_tokens, 7);  // the usage-only chunk's
  EXPECT_EQ(t.prompt_len, 7);
  EXPECT_EQ(t.cached_len, 3);
  // A chat delta (the first one carries the role, an empty content).
  StreamTiming c;
  EXPECT_TRUE(c.on_openai_chunk(
      R"({"choices": [{"delta": {"role": "assistant", "content": ""}}], "usage": {"completion_tokens": 0}})", 0.1));
  EXPECT_TRUE(
      c.on_openai_chunk(R"({"choices": [{"delta": {"content": "hi"}}], "usage": {"completion_tokens": 1}})", 0.4));
  EXPECT_DOUBLE_EQ(c.ttft(), 0.4);
  // Without usage (the stream was not asked for it), or with counts of the wrong kind: refused.
  for (const std::string& bad : {std::string(R"({"choices": [{"text": "a"}]})"), std::string("[]"),
                                 std::string(R"({"choices": [{"text": "a"}], "usage": {"completion_tokens": "1"}})"),
                                 std::string(R"({"choices": [{"text": "a"}], "usage": {}})")}) {
    StreamTiming b;
    EXPECT_FALSE(b.on_openai_chunk(bad, 0.1)) << bad;
  }
}

}  // namespace
}  // namespace fp4moe::tools
