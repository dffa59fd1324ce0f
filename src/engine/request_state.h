// engine::RequestState: one request inside the engine (inference thread only): its tokens
// (prompt + generated), KV state and blocks, sampler, and the streaming of its output: incremental
// detokenization, stop tokens, stop strings held back until they can no longer match (text past a
// stop string is never emitted), and its timings. Tested through the engine
// (tests/engine/test_scheduler.cpp, StopStrings*).
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "engine/sampler.h"
#include "engine/tokenizer.h"

namespace fp4moe::engine {

class RequestState {
 public:
  using Clock = std::chrono::steady_clock;

  RequestState(RequestId id, Request request, OutputCallback callback, const Tokenizer* tokenizer, int64_t vocab,
               uint64_t seed, Clock::time_point now);

  const RequestId id;
  const int64_t priority;            // Request::priority
  const bool log_metrics;            // Request::log_metrics
  const bool count_output;           // Request::count_output
  std::vector<TokenId> prompt;       // as submitted
  SamplingParams sampling;
  std::vector<TokenId> generated;    // sampled so far
  std::unique_ptr<model::KvState> kv;  // while running
  std::vector<int32_t> blocks;       // KV blocks held
  bool counted_prompt = false;
  int64_t cached_tokens = 0;  // prompt tokens the first admission took from the prefix cache
  // A choice of a group (n > 1) whose prompt an earlier choice of the same group has too: that one's id. Admission
  // holds this one while that one is prefilling, so that it finds the prompt in the prefix cache instead of
  // prefilling it again (SGLang prefills such a prompt once before its n samples). 0: none.
  RequestId prompt_leader = 0;

  int64_t kv_length() const { return kv ? kv->length() : 0; }
  int64_t n_all_tokens() const { return static_cast<int64_t>(tokens_.size()); }
  // Running requests: still prefilling what they held when admitted (prompt + earlier output).
  bool in_prefill() const { return kv_length() < prefill_target_; }
  int64_t remaining_prefill() const { return prefill_target_ - kv_length(); }
  std::span<const TokenId> tokens_from(int64_t start, int64_t n) const;

  void admitted(Clock::time_point now);
  void preempt();  // KV and blocks were freed by the engine; the next admission recomputes

  // Prompt logprobs (sampling.prompt_logprobs >= 0): whether a forward of positions [start, start + n)
  // yields logits for prompt tokens still without a logprob, and taking them from such a forward's
  // logits ([n, vocab], all_logits). A recompute after a preemption finds them taken.
  bool wants_prompt_logits(int64_t start, int64_t n) const;
  void on_prompt_logits(int64_t start, int64_t n, const float* logits, int64_t vocab);

  // Samples from the logits of the last fed position, appends the token and builds the event
  // (token, logprobs, text). Sets finish_reason() when the request is done.
  RequestOutput on_logits(const float* logits, Clock::time_point now, const std::vector<TokenId>& eos_ids,
                          int64_t context_length);
  // The same for a token chosen by the model (SeqChunk::argmax: when !sampling.needs_logits(), or a
  // device draw, SeqChunk::sample, when sampling.device_samplable()).
  RequestOutput on_argmax(TokenId id, Clock::time_point now, const std::vector<TokenId>& eos_ids,
                          int64_t context_length);
  // The knobs and this step's uniform draw for a device draw (takes the draw from the request's
  // generator, as a host sample would). The draw is held until a token is appended: a step that failed
  // for another request (model::SequenceError) and runs again draws the same token, so seeds reproduce.
  model::DeviceSampling device_sampling();
  const std::optional<FinishReason>& finish_reason() const { return finish_reason_; }
  const std::string& finish_error() const { return finish_error_; }  // with FinishReason::kError

  // The final event: `base` (the last tokens, if any) + whatever text is still held + finished.
  RequestOutput finish(FinishReason reason, const std::string& error, Clock::time_point now, RequestOutput base = {});
  void emit(const RequestOutput& out);
  // Continuous decode runs deliver once per run, --stream-interval N every N tokens: hold() merges an event into
  // the held one (tokens appended, text concatenated), `due` when its token is one the interval delivers;
  // flush_held() emits it, flush_due() only when it holds a due token; finish() puts it in front of its `base`.
  void hold(RequestOutput out, bool due = true);
  void flush_held();
  void flush_due() {
    if (held_due_) flush_held();
  }
  bool has_held() const { return held_out_.has_value(); }

  double ttft_s() const;
  double last_inter_token_s() const;  // between the last two tokens

 private:
  RequestOutput on_sampled(const SampleResult& s, Clock::time_point now, const std::vector<TokenId>& eos_ids,
                           int64_t context_length);
  // Appends text to the held buffer and moves what can no longer start a stop string to `out`;
  // returns true when a stop string matched (held text from the match on is dropped).
  bool stream_text(const std::string& piece, std::string& out, bool match = true);
  void flush_text(std::string& out);
  bool is_space_token(TokenId id) const;  // the constraint's vocabulary spells it with whitespace only

  std::vector<TokenId> tokens_;  // prompt + generated
  OutputCallback callback_;
  const Tokenizer* tokenizer_;
  std::optional<IncrementalDetokenizer> detok_;
  std::string held_;
  std::optional<RequestOutput> held_out_;  // events held back by hold(), not yet emitted
  bool held_due_ = false;                  // held_out_ holds a token the stream interval delivers
  Sampler sampler_;
  std::optional<double> held_draw_;  // device_sampling()'s draw, until on_sampled appends a token
  int64_t vocab_ = 0;
  std::vector<GeneratedToken> prompt_lps_;  // prompt logprobs so far, moved into the first token's event
  int64_t prompt_lp_next_ = 1;              // the next prompt position whose logprob is due
  int64_t prefill_target_ = 0;
  int64_t n_preemptions_ = 0;
  std::optional<FinishReason> finish_reason_;
  std::string finish_error_;
  uint64_t constraint_state_ = 0;  // sampling.constraint's automaton after the generated tokens
  // sampling.constraint_after_reasoning: where the reply is (the constraint applies in kConstrained).
  // kBeforeReasoning: the start tag may come; kReasoning: free; kAfterReasoning: one whitespace token
  // may come (the reasoning parser drops it), then the constraint applies.
  enum class Phase : uint8_t { kConstrained, kBeforeReasoning, kReasoning, kAfterReasoning };
  Phase phase_ = Phase::kConstrained;
  std::optional<TokenId> reasoning_start_id_;  // the start tag as one token
  std::string reasoning_tail_;                 // the reasoning's last bytes (to find its end tag)
  std::optional<TokenId> matched_stop_token_;
  std::optional<std::string> matched_stop_str_;
  Clock::time_point t_submit_;
  std::optional<Clock::time_point> t_first_scheduled_;
  std::vector<double> token_times_s_;
};

}  // namespace fp4moe::engine
