// The server's batch log, SGLang's scheduler lines on stderr: every step that forwards prompt tokens
//   [2026-12-07 14:03:11] Prefill batch. #new-seq: 2, #new-token: 512, #cached-token: 128, token usage: 0.03,
//   #running-req: 5, #queue-req: 0
// and every `decode_interval` decode steps (SGLang's --decode-log-interval, 40)
//   [2026-12-07 14:03:12] Decode batch. #running-req: 16, #token: 9472, token usage: 0.29, cuda graph: True,
//   gen throughput (token/s): 1480.22, #queue-req: 3
// (#running-req: the requests decoding in the step, as SGLang's running batch; gen throughput: decode tokens since the
// last decode line over the wall time since it, or since the step before the window's first decode after a prefill;
// a window open when the last request finishes closes unlogged, so idle time never counts), and a warning line when
// the step preempted requests for KV blocks (SGLang's "KV cache pool is full. Retract requests. #retracted_reqs").
// Fed from EngineOptions::step_observer on the inference thread; one line a write. Tested by
// tests/server/test_batch_log.cpp and test_server_e2e.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>

#include "engine/engine.h"

namespace fp4moe::server {

class BatchLog {
 public:
  using Clock = std::chrono::steady_clock;
  using Sink = std::function<void(const std::string& line)>;  // one line, no newline
  // decode_interval <= 0: no lines at all. kv_capacity_tokens: the engine's (token usage's denominator).
  BatchLog(int64_t decode_interval, int64_t kv_capacity_tokens, Sink sink);

  // After each step; `now` the time it ended (tests pass their own clock).
  void on_step(const engine::StepInfo& s, Clock::time_point now);

  // The prefix of a line: "[YYYY-MM-DD HH:MM:SS] " in local time.
  static std::string timestamp();

 private:
  int64_t interval_, capacity_;
  Sink sink_;
  int64_t decode_steps_ = 0;   // decode-only steps since the last decode line
  int64_t decode_tokens_ = 0;  // decode tokens since the last decode line
  bool started_ = false;
  Clock::time_point last_;  // the window's start: the last decode line, or the step before its first decode
};

}  // namespace fp4moe::server
