// server/request_log.h: what each --log-requests-level shows of a request body and of its outputs, the cut at
// kRequestLogPartialChars on a UTF-8 boundary, and the Finish / Abort line's counts.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "server/request_log.h"

namespace fp4moe::server {
namespace {

Accumulated finished(const std::string& text, int64_t completion, int64_t cached, double e2e, double ttft,
                     engine::FinishReason reason = engine::FinishReason::kLength) {
  Accumulated a;
  a.text = text;
  engine::Finish f;
  f.reason = reason;
  f.usage.completion_tokens = completion;
  f.usage.cached_tokens = cached;
  f.timings.e2e_s = e2e;
  f.timings.ttft_s = ttft;
  a.finish = f;
  return a;
}

TEST(RequestLog, BodyByLevel) {
  const std::string body = R"({"text": "hello world", "sampling_params": {"temperature": 0.5}, "input_ids": [1, 2]})";
  EXPECT_EQ(request_log_body(body, 0), "");
  EXPECT_EQ(request_log_body(body, 1),
            R"({"text":"<11 bytes>","sampling_params":{"temperature":0.5},"input_ids":"<2 items>"})");
  EXPECT_EQ(request_log_body(body, 2),
            R"({"text":"hello world","sampling_params":{"temperature":0.5},"input_ids":[1,2]})");
  const std::string chat = R"({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3})";
  EXPECT_EQ(request_log_body(chat, 1), R"({"messages":"<1 items>","max_tokens":3})");
  // Not a JSON object: the text itself (cut as at level 2).
  EXPECT_EQ(request_log_body("not json", 1), "not json");
  // Level 2 cuts at kRequestLogPartialChars, never inside a UTF-8 character ("é" is 2 bytes); level 3 keeps it whole.
  std::string long_text(kRequestLogPartialChars - 1, 'a');
  long_text += "\xc3\xa9tail";
  const std::string long_body = "{\"text\":\"" + long_text + "\"}";
  const std::string cut = request_log_body(long_body, 2);
  EXPECT_EQ(cut.substr(0, kRequestLogPartialChars), long_body.substr(0, kRequestLogPartialChars)) << cut.size();
  EXPECT_NE(cut.find("... (" + std::to_string(long_body.size() - kRequestLogPartialChars) + " more bytes)"),
            std::string::npos)
      << cut.substr(kRequestLogPartialChars - 10);
  EXPECT_EQ(request_log_body(long_body, 3), long_body);
  std::string at_char(kRequestLogPartialChars - 10, 'b');  // the body's byte 2048 is the second byte of "é"
  const std::string body_at_char = "{\"text\":\"" + at_char + "\xc3\xa9\"}";
  const std::string cut2 = request_log_body(body_at_char, 2);
  EXPECT_EQ(cut2.substr(0, kRequestLogPartialChars - 1), body_at_char.substr(0, kRequestLogPartialChars - 1));
  EXPECT_EQ(cut2.substr(kRequestLogPartialChars - 1, 5), "... (") << "cut before the character, not inside it";
}

TEST(RequestLog, LineCountsChoicesAndAborts) {
  const std::vector<Accumulated> two = {finished("ab", 3, 2, 0.5, 0.02),
                                        finished("c", 1, 0, 0.25, 0.01, engine::FinishReason::kStop)};
  EXPECT_EQ(request_log_line(0, true, "cmpl-7", "/v1/completions", "", 12, two),
            "Finish: rid=cmpl-7, route=/v1/completions, choices=2, prompt_tokens=12, completion_tokens=4, "
            "cached_tokens=2, finish_reason=length,stop, e2e_latency=0.500 s, ttft=0.010 s");
  EXPECT_EQ(request_log_line(1, true, "7", "/generate", "{\"x\":1}", 12, two).substr(0, 7), "Finish:");
  EXPECT_NE(request_log_line(1, true, "7", "/generate", "{\"x\":1}", 12, two).find(", request={\"x\":1}"),
            std::string::npos);
  EXPECT_EQ(request_log_line(1, true, "7", "/generate", "{}", 12, two).find("output="), std::string::npos);
  EXPECT_NE(request_log_line(2, true, "7", "/generate", "{}", 12, two).find(", output=[\"ab\",\"c\"]"),
            std::string::npos);
  Accumulated gone;
  gone.tokens.resize(5);
  gone.text = "hello";
  EXPECT_EQ(request_log_line(0, false, "9", "/generate", "", 4, {gone}),
            "Abort: rid=9, route=/generate, choices=1, prompt_tokens=4, completion_tokens=5, cached_tokens=0, "
            "finish_reason=unfinished, e2e_latency=0.000 s, ttft=0.000 s");
}

}  // namespace
}  // namespace fp4moe::server
