// server::BatchLog (SGLang's scheduler lines): a prefill line every step that forwards prompt tokens, a decode line
// every N decode-only steps with the decode tokens over the window's wall time (idle and prefill-only time before
// the window's first decode left out), the retract warning on preemption, nothing with interval 0.
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <vector>

#include "server/batch_log.h"

namespace fp4moe::server {
namespace {

using namespace std::chrono_literals;

engine::StepInfo decode_step(int64_t running, int64_t kv, int64_t waiting = 0) {
  engine::StepInfo s;
  s.n_decode_requests = running;
  s.n_running = running;
  s.kv_used_tokens = kv;
  s.n_waiting = waiting;
  return s;
}

// The line without its "[date time] " prefix.
std::string body(const std::string& line) {
  EXPECT_EQ(line.size() > 22 && line[0] == '[' && line[20] == ']' && line[21] == ' ', true) << line;
  return line.substr(22);
}

TEST(BatchLog, PrefillEveryStepDecodeEveryIntervalWithThroughput) {
  std::vector<std::string> lines;
  BatchLog log(4, 1000, [&](const std::string& l) { lines.push_back(l); });
  const auto t0 = BatchLog::Clock::time_point{} + 100s;
  engine::StepInfo p;
  p.n_prefill_requests = 2;
  p.n_prefill_tokens = 300;
  p.n_cached_tokens = 64;
  p.n_running = 2;
  p.n_waiting = 1;
  p.kv_used_tokens = 320;
  log.on_step(p, t0);
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(body(lines[0]),
            "Prefill batch. #new-seq: 2, #new-token: 300, #cached-token: 64, token usage: 0.32, #running-req: 0, "
            "#queue-req: 1");
  // Four decode steps of 2 tokens, 10 ms apart after the prefill: 8 tokens in 40 ms.
  for (int i = 1; i <= 4; ++i) {
    engine::StepInfo d = decode_step(2, 336, 1);
    d.cuda_graph = true;
    log.on_step(d, t0 + i * 10ms);
  }
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(body(lines[1]),
            "Decode batch. #running-req: 2, #token: 336, token usage: 0.34, cuda graph: True, gen throughput "
            "(token/s): 200.00, #queue-req: 1");
  // Idle for an hour, then a prefill and four decode steps of one token, 5 ms apart: 4 tokens in 20 ms, not in an
  // hour.
  const auto t1 = t0 + 3600s;
  engine::StepInfo p1;
  p1.n_prefill_requests = 1;
  p1.n_prefill_tokens = 10;
  p1.n_running = 1;
  log.on_step(p1, t1);
  for (int i = 1; i <= 4; ++i) log.on_step(decode_step(1, 16), t1 + i * 5ms);
  ASSERT_EQ(lines.size(), 4u);
  EXPECT_NE(body(lines[3]).find("cuda graph: False, gen throughput (token/s): 200.00"), std::string::npos) << lines[3];
  // Three more decode steps: no line before the fourth.
  for (int i = 5; i <= 7; ++i) log.on_step(decode_step(1, 16), t1 + i * 5ms);
  EXPECT_EQ(lines.size(), 4u);
}

TEST(BatchLog, MixedStepsCountTowardThroughputButNotTheIntervalAndPreemptionWarns) {
  std::vector<std::string> lines;
  BatchLog log(2, 100, [&](const std::string& l) { lines.push_back(l); });
  const auto t0 = BatchLog::Clock::time_point{} + 1s;
  log.on_step(decode_step(3, 48), t0);  // the window starts at its first step: 3 tokens, no time yet
  engine::StepInfo mixed = decode_step(3, 64);
  mixed.n_prefill_requests = 1;
  mixed.n_prefill_tokens = 5;
  mixed.n_running = 4;
  mixed.n_preempted = 1;
  log.on_step(mixed, t0 + 10ms);
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(body(lines[0]),
            "KV cache pool is full. Retract requests. #retracted_reqs: 1, #running-req: 4, #queue-req: 0");
  EXPECT_NE(body(lines[1]).find("#running-req: 3, #queue-req: 0"), std::string::npos) << lines[1];  // the decoding ones
  EXPECT_EQ(body(lines[1]).rfind("Prefill batch. #new-seq: 1, #new-token: 5", 0), 0u) << lines[1];
  log.on_step(decode_step(4, 80), t0 + 20ms);  // the second decode-only step: 3 + 3 + 4 tokens in 20 ms
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_NE(body(lines[2]).find("token usage: 0.80, cuda graph: False, gen throughput (token/s): 500.00"),
            std::string::npos)
      << lines[2];
}

// A request that ends inside a window (interval 3, 8 decode steps: lines after 3 and 6, 2 steps left) closes it
// unlogged when nothing is left running; the next request's window then starts at its prefill, not before the idle
// time (which made one line read 0.42 token/s).
TEST(BatchLog, AWindowOpenWhenTheLastRequestEndsClosesUnlogged) {
  std::vector<std::string> lines;
  BatchLog log(3, 1000, [&](const std::string& l) { lines.push_back(l); });
  auto t = BatchLog::Clock::time_point{} + 10s;
  engine::StepInfo p;
  p.n_prefill_requests = 1;
  p.n_prefill_tokens = 4;
  p.n_running = 1;
  log.on_step(p, t);
  for (int i = 1; i <= 8; ++i) {
    engine::StepInfo d = decode_step(1, 16);
    if (i == 8) d.n_running = 0;  // it finished in its last step
    log.on_step(d, t + i * 10ms);
  }
  ASSERT_EQ(lines.size(), 3u);  // the prefill and two decode lines
  t += 5s;                      // idle
  log.on_step(p, t);
  for (int i = 1; i <= 3; ++i) log.on_step(decode_step(1, 16), t + i * 10ms);
  ASSERT_EQ(lines.size(), 5u);
  EXPECT_NE(body(lines[4]).find("gen throughput (token/s): 100.00"), std::string::npos) << lines[4];  // 3 in 30 ms
}

TEST(BatchLog, IntervalZeroLogsNothing) {
  int n = 0;
  BatchLog log(0, 100, [&](const std::string&) { ++n; });
  engine::StepInfo s = decode_step(1, 16);
  s.n_prefill_requests = 1;
  s.n_preempted = 1;
  for (int i = 0; i < 100; ++i) log.on_step(s, BatchLog::Clock::now());
  EXPECT_EQ(n, 0);
}

}  // namespace
}  // namespace fp4moe::server
