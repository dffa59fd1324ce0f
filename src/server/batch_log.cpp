// BatchLog (see batch_log.h).
#include "server/batch_log.h"

#include <fmt/format.h>

#include <ctime>
#include <utility>

namespace fp4moe::server {

BatchLog::BatchLog(int64_t decode_interval, int64_t kv_capacity_tokens, Sink sink)
    : interval_(decode_interval), capacity_(kv_capacity_tokens > 0 ? kv_capacity_tokens : 1), sink_(std::move(sink)) {}

std::string BatchLog::timestamp() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  localtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "[%Y-%m-%d %H:%M:%S] ", &tm);
  return buf;
}

void BatchLog::on_step(const engine::StepInfo& s, Clock::time_point now) {
  if (interval_ <= 0) return;
  if (!started_) {
    started_ = true;
    last_ = now;
  }
  const double usage = static_cast<double>(s.kv_used_tokens) / static_cast<double>(capacity_);
  if (s.n_preempted > 0) {
    sink_(timestamp() + fmt::format("KV cache pool is full. Retract requests. #retracted_reqs: {}, #running-req: {}, "
                                    "#queue-req: {}",
                                    s.n_preempted, s.n_running, s.n_waiting));
  }
  // #running-req: the requests decoding in this step (SGLang's running batch: without the new ones, with those that
  // finished in it).
  if (s.n_prefill_requests > 0) {
    sink_(timestamp() + fmt::format("Prefill batch. #new-seq: {}, #new-token: {}, #cached-token: {}, token usage: "
                                    "{:.2f}, #running-req: {}, #queue-req: {}",
                                    s.n_prefill_requests, s.n_prefill_tokens, s.n_cached_tokens, usage,
                                    s.n_decode_requests, s.n_waiting));
  }
  // An empty window (prefill only since the last line or the idle reset) starts at this step.
  if (decode_tokens_ == 0 && s.n_decode_requests == 0) last_ = now;
  decode_tokens_ += s.n_decode_requests;
  if (s.n_prefill_requests == 0 && s.n_decode_requests > 0 && ++decode_steps_ >= interval_) {
    const double seconds = std::chrono::duration<double>(now - last_).count();
    const double throughput = seconds > 0.0 ? static_cast<double>(decode_tokens_) / seconds : 0.0;
    sink_(timestamp() + fmt::format("Decode batch. #running-req: {}, #token: {}, token usage: {:.2f}, cuda graph: {}, "
                                    "gen throughput (token/s): {:.2f}, #queue-req: {}",
                                    s.n_decode_requests, s.kv_used_tokens, usage, s.cuda_graph ? "True" : "False",
                                    throughput, s.n_waiting));
    decode_steps_ = 0;
    decode_tokens_ = 0;
    last_ = now;
  }
  // Nothing left running: the open window closes unlogged, so that the idle time before the next request does not
  // count as decode time.
  if (s.n_running == 0) {
    decode_steps_ = 0;
    decode_tokens_ = 0;
  }
}

}  // namespace fp4moe::server
