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
  // Level 1 hides what a chat template renders into the prompt, and the sender.
  const std::string chat =
      R"({"messages": [{"role": "user", "content": "hi"}], "tools": [], "chat_template_kwargs": {"k": "secret"},)"
      R"( "user": "alice@example.com", "max_tokens": 3})";
  EXPECT_EQ(request_log_body(chat, 1),
            R"({"messages":"<1 items>","tools":"<0 items>","chat_template_kwargs":"<object>","user":"<17 bytes>",)"
            R"("max_tokens":3})");
  // Not a JSON object (not reached from the server, which parsed the body): its size at 1, the text at 2.
  EXPECT_EQ(request_log_body("not json", 1), "<8 bytes>");
  EXPECT_EQ(request_log_body("not json", 2), "not json");
}

// Level 2 cuts each string at kRequestLogPartialChars bytes, never inside a UTF-8 character, and each list at as many
// items, so that the fields after a long prompt stay; level 3 keeps everything.
TEST(RequestLog, LevelTwoCutsEachValue) {
  std::string long_text(kRequestLogPartialChars - 1, 'a');
  long_text += "\xc3\xa9tail";  // "é" (2 bytes) straddles byte kRequestLogPartialChars
  std::string ids = "[";
  for (size_t i = 0; i < kRequestLogPartialChars + 5; ++i) ids += (i ? "," : "") + std::to_string(i % 10);
  ids += "]";
  const std::string body =
      "{\"text\":\"" + long_text + "\",\"input_ids\":" + ids + ",\"sampling_params\":{\"temperature\":0.5}}";
  const std::string cut = request_log_body(body, 2);
  EXPECT_NE(cut.find("\"text\":\"" + long_text.substr(0, kRequestLogPartialChars - 1) + "... (6 more bytes)\""),
            std::string::npos)
      << cut.substr(kRequestLogPartialChars - 20, 40) << " - cut before the character, not inside it";
  EXPECT_NE(cut.find(",\"... (5 more items)\"],"), std::string::npos);
  EXPECT_NE(cut.find("\"sampling_params\":{\"temperature\":0.5}}"), std::string::npos) << "after the prompt";
  std::string exact(kRequestLogPartialChars, 'b');  // exactly the limit: whole
  EXPECT_EQ(request_log_body("{\"text\":\"" + exact + "\"}", 2), "{\"text\":\"" + exact + "\"}");
  const std::string whole = request_log_body(body, 3);
  EXPECT_NE(whole.find(long_text), std::string::npos);
  EXPECT_EQ(whole.find("more items"), std::string::npos);
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
  EXPECT_EQ(request_log_line(0, false, "9", "/generate", "", 4, {gone}, 1.25),
            "Abort: rid=9, route=/generate, choices=1, prompt_tokens=4, completion_tokens=5, cached_tokens=0, "
            "finish_reason=unfinished, e2e_latency=1.250 s, ttft=0.000 s");
  // A client's rid cannot start a line of its own.
  EXPECT_EQ(request_log_line(0, true, "evil\n[2026-01-01 00:00:00] Finish: rid=forged\x7f", "/generate", "", 1, two)
                .substr(0, 66),
            "Finish: rid=evil\\x0a[2026-01-01 00:00:00] Finish: rid=forged\\x7f, ");
}

}  // namespace
}  // namespace fp4moe::server
