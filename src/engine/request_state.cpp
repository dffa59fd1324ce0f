// engine::RequestState (see request_state.h). Tested through tests/engine/test_scheduler.cpp.
#include "engine/request_state.h"

#include <algorithm>
#include <cstdio>
#include <limits>

#include "core/error.h"
#include "engine/constraint.h"

namespace fp4moe::engine {

RequestState::RequestState(RequestId id_, Request request, OutputCallback callback, const Tokenizer* tokenizer,
                           int64_t vocab, uint64_t seed, Clock::time_point now)
    : id(id_),
      priority(request.priority),
      log_metrics(request.log_metrics),
      count_output(request.count_output),
      prompt(std::move(request.prompt_ids)),
      sampling(std::move(request.sampling)),
      tokens_(prompt),
      callback_(std::move(callback)),
      tokenizer_(tokenizer),
      sampler_(sampling, vocab, seed),
      vocab_(vocab),
      t_submit_(now) {
  if (tokenizer_) detok_.emplace(*tokenizer_, sampling.skip_special_tokens, sampling.keep_special_ids);
  sampler_.observe_prompt(prompt);
  if (sampling.constraint) constraint_state_ = sampling.constraint->start();
  if (sampling.constraint && sampling.constraint_after_reasoning) {
    const SamplingParams::ReasoningSpan& r = *sampling.constraint_after_reasoning;
    phase_ = r.starts_inside ? Phase::kReasoning : Phase::kBeforeReasoning;
    if (tokenizer_) reasoning_start_id_ = tokenizer_->token_to_id(r.start);
  }
  if (sampling.prompt_logprobs >= 0 && !prompt.empty()) {
    GeneratedToken first;
    first.id = prompt.front();
    first.logprob = std::numeric_limits<float>::quiet_NaN();  // nothing precedes it
    prompt_lps_.push_back(std::move(first));
  }
}

bool RequestState::wants_prompt_logits(int64_t start, int64_t n) const {
  // Row p of the forward holds the distribution of token p + 1; the due ones: [prompt_lp_next_, prompt size).
  if (sampling.prompt_logprobs < 0) return false;
  const int64_t lo = std::max(start, prompt_lp_next_ - 1);
  const int64_t hi = std::min(start + n, static_cast<int64_t>(prompt.size()) - 1);
  return lo < hi;
}

void RequestState::on_prompt_logits(int64_t start, int64_t n, const float* logits, int64_t vocab) {
  for (int64_t p = std::max(start, prompt_lp_next_ - 1); p < start + n; ++p) {
    const int64_t t = p + 1;
    if (t >= static_cast<int64_t>(prompt.size())) break;
    const SampleResult s =
        logprobs_of(logits + (p - start) * vocab, vocab, prompt[static_cast<size_t>(t)], sampling.prompt_logprobs);
    GeneratedToken g;
    g.id = s.id;
    g.logprob = s.logprob;
    g.top_logprobs = s.top;
    prompt_lps_.push_back(std::move(g));
    prompt_lp_next_ = t + 1;
  }
}

std::span<const TokenId> RequestState::tokens_from(int64_t start, int64_t n) const {
  FP4MOE_CHECK(start >= 0 && n >= 1 && start + n <= n_all_tokens())
      << "request " << id << ": tokens [" << start << ", " << start + n << ") outside its " << n_all_tokens() << " tokens";
  return {tokens_.data() + start, static_cast<size_t>(n)};
}

void RequestState::admitted(Clock::time_point now) {
  if (!t_first_scheduled_) t_first_scheduled_ = now;
  prefill_target_ = n_all_tokens();
}

void RequestState::preempt() {
  ++n_preemptions_;
  prefill_target_ = 0;
}

namespace {
double secs(std::chrono::steady_clock::duration d) { return std::chrono::duration<double>(d).count(); }
}  // namespace

bool RequestState::stream_text(const std::string& piece, std::string& out, bool match) {
  held_ += piece;
  size_t best = std::string::npos;
  const std::string* which = nullptr;
  for (const std::string& s : sampling.stop) {
    const size_t p = match ? held_.find(s) : std::string::npos;
    if (p != std::string::npos && (best == std::string::npos || p < best)) {
      best = p;
      which = &s;
    }
  }
  if (which) {
    out += held_.substr(0, best + (sampling.include_stop_str ? which->size() : 0));
    held_.clear();
    matched_stop_str_ = *which;
    return true;
  }
  // Keep the longest suffix that is a proper prefix of some stop string.
  size_t keep = 0;
  for (const std::string& s : sampling.stop) {
    for (size_t k = std::min(s.size() - 1, held_.size()); k > keep; --k) {
      if (held_.compare(held_.size() - k, k, s, 0, k) == 0) {
        keep = k;
        break;
      }
    }
  }
  out += held_.substr(0, held_.size() - keep);
  held_.erase(0, held_.size() - keep);
  return false;
}

void RequestState::flush_text(std::string& out) {
  if (detok_ && !matched_stop_str_) {
    if (stream_text(detok_->flush(), out)) return;
  }
  if (!matched_stop_str_) out += held_;
  held_.clear();
}

RequestOutput RequestState::on_logits(const float* logits, Clock::time_point now, const std::vector<TokenId>& eos_ids,
                                      int64_t context_length) {
  const bool before_min = static_cast<int64_t>(generated.size()) < sampling.min_new_tokens;
  if (!before_min && !sampling.constraint) return on_sampled(sampler_.sample(logits), now, eos_ids, context_length);
  std::vector<float> z(logits, logits + vocab_);
  const float ban = -std::numeric_limits<float>::infinity();
  auto is_eos = [&](TokenId t) { return std::find(eos_ids.begin(), eos_ids.end(), t) != eos_ids.end(); };
  if (sampling.constraint && phase_ != Phase::kReasoning) {
    // Only tokens that keep a match possible; EOS (a special token, never in the mask) where the
    // text so far is a whole match. Before a possible reasoning block also its start tag; right after one
    // whitespace.
    const TokenConstraint& c = *sampling.constraint;
    const std::shared_ptr<const TokenMask> mask = c.allowed(constraint_state_);
    const bool eos_ok = c.accepting(constraint_state_) && !sampling.ignore_eos;
    for (int64_t t = 0; t < vocab_; ++t) {
      const auto id = static_cast<TokenId>(t);
      const bool ok = mask->test(id) || (eos_ok && is_eos(id)) ||
                      (phase_ == Phase::kBeforeReasoning && id == reasoning_start_id_) ||
                      (phase_ == Phase::kAfterReasoning && is_space_token(id));
      if (!ok) z[static_cast<size_t>(t)] = ban;
    }
  }
  if (before_min) {
    // min_new_tokens: the tokens that would end the request cannot be drawn yet.
    for (TokenId t : sampling.stop_token_ids) z[static_cast<size_t>(t)] = ban;
    if (!sampling.ignore_eos) {
      for (TokenId t : eos_ids) {
        if (t >= 0 && t < vocab_) z[static_cast<size_t>(t)] = ban;
      }
    }
  }
  if (sampling.constraint && std::none_of(z.begin(), z.end(), [&](float v) { return v != ban; })) {
    finish_error_ =
        "the " + sampling.constraint->description() + " constraint allows no token of the vocabulary after " +
        std::to_string(generated.size()) + " generated tokens" +
        (before_min ? " (min_new_tokens " + std::to_string(sampling.min_new_tokens) + " bans ending it)" : "");
    finish_reason_ = FinishReason::kError;
    RequestOutput out;
    out.id = id;
    return out;
  }
  return on_sampled(sampler_.sample(z.data()), now, eos_ids, context_length);
}

bool RequestState::is_space_token(TokenId id) const {
  if (!sampling.constraint || !sampling.constraint->vocab().usable(id)) return false;
  const std::string& b = sampling.constraint->vocab().bytes(id);
  return std::all_of(b.begin(), b.end(), [](char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; });
}

RequestOutput RequestState::on_argmax(TokenId id_chosen, Clock::time_point now, const std::vector<TokenId>& eos_ids,
                                      int64_t context_length) {
  FP4MOE_CHECK(!sampling.needs_logits() || sampling.device_samplable())
      << "request " << id << ": a model-chosen token for sampling that needs logits (penalties or logprobs)";
  SampleResult s;
  s.id = id_chosen;
  return on_sampled(s, now, eos_ids, context_length);
}

model::DeviceSampling RequestState::device_sampling() {
  FP4MOE_CHECK(sampling.device_samplable()) << "request " << id << ": its sampling cannot run on the device";
  model::DeviceSampling d;
  if (!held_draw_) held_draw_ = sampler_.next_uniform();
  d.u = *held_draw_;
  d.temperature = sampling.temperature;
  d.top_p = sampling.top_p;
  d.min_p = sampling.min_p;
  d.top_k = sampling.top_k;
  return d;
}

RequestOutput RequestState::on_sampled(const SampleResult& s, Clock::time_point now, const std::vector<TokenId>& eos_ids,
                                       int64_t context_length) {
  RequestOutput out;
  out.id = id;
  held_draw_.reset();
  sampler_.accept(s.id);
  generated.push_back(s.id);
  tokens_.push_back(s.id);
  token_times_s_.push_back(secs(now - t_submit_));
  GeneratedToken g;
  g.id = s.id;
  g.logprob = s.logprob;
  g.top_logprobs = s.top;
  g.time_s = token_times_s_.back();
  out.tokens.push_back(std::move(g));
  if (generated.size() == 1 && sampling.prompt_logprobs >= 0) out.prompt_logprobs = std::move(prompt_lps_);

  const bool is_eos = !sampling.ignore_eos && std::find(eos_ids.begin(), eos_ids.end(), s.id) != eos_ids.end();
  const bool is_stop_id = std::find(sampling.stop_token_ids.begin(), sampling.stop_token_ids.end(), s.id) !=
                          sampling.stop_token_ids.end();
  if (is_eos || is_stop_id) {
    matched_stop_token_ = s.id;
    finish_reason_ = FinishReason::kStop;
    // The stop token adds no text, unless include_stop_str (vLLM's include_stop_str_in_output, SGLang's
    // no_stop_trim) keeps it: then its text as the detokenizer renders it (nothing for a skipped special token).
    if (sampling.include_stop_str && detok_) stream_text(detok_->push(s.id), out.text, false);
    return out;
  }
  bool feed = sampling.constraint && phase_ == Phase::kConstrained;
  std::string_view bytes;  // what the automaton reads of this token (all of it unless the phase says less)
  std::string after_end;   // the bytes of a token that follow the reasoning's end tag
  if (sampling.constraint && phase_ == Phase::kBeforeReasoning) {
    if (s.id == reasoning_start_id_) {
      phase_ = Phase::kReasoning;
    } else {
      phase_ = Phase::kConstrained;  // the reply begins without a reasoning block
      feed = true;
    }
  } else if (sampling.constraint && phase_ == Phase::kAfterReasoning) {
    // One whitespace token the constraint does not take (a "\n" after the tag) is let through, no more.
    phase_ = Phase::kConstrained;
    feed = !is_space_token(s.id) || sampling.constraint->allowed(constraint_state_)->test(s.id);
  } else if (sampling.constraint && phase_ == Phase::kReasoning) {
    // The end tag may arrive split over tokens or inside one ("</think" + ">\n"): what follows it in
    // the same token is the reply's start (whitespace skipped, as the reasoning parser drops it).
    reasoning_tail_ += tokenizer_ ? tokenizer_->token_bytes(s.id) : std::string();
    const std::string& end = sampling.constraint_after_reasoning->end;
    const size_t at = reasoning_tail_.find(end);
    if (at != std::string::npos) {
      after_end = reasoning_tail_.substr(at + end.size());
      const size_t text = after_end.find_first_not_of(" \t\n\r");
      after_end.erase(0, text == std::string::npos ? after_end.size() : text);
      reasoning_tail_.clear();
      phase_ = after_end.empty() ? Phase::kAfterReasoning : Phase::kConstrained;
      feed = !after_end.empty();
      bytes = after_end;
    } else if (reasoning_tail_.size() >= end.size()) {
      reasoning_tail_.erase(0, reasoning_tail_.size() - (end.size() - 1));
    }
  }
  if (feed) {
    const TokenConstraint& c = *sampling.constraint;
    constraint_state_ = bytes.empty() ? c.advance(constraint_state_, s.id) : c.advance(constraint_state_, bytes);
    if (constraint_state_ == ByteAutomaton::kDead) {  // a token the mask allowed, or the text after an end tag
      finish_error_ = "token " + std::to_string(s.id) + " left the " + sampling.constraint->description() +
                      " constraint after " + std::to_string(generated.size()) + " tokens";
      finish_reason_ = FinishReason::kError;
      return out;
    }
  }
  const bool past_min = static_cast<int64_t>(generated.size()) >= sampling.min_new_tokens;
  if (detok_ && stream_text(detok_->push(s.id), out.text, past_min)) {
    finish_reason_ = FinishReason::kStop;
    return out;
  }
  if (sampling.constraint && phase_ == Phase::kConstrained && !sampling.constraint->can_continue(constraint_state_)) {
    finish_reason_ = FinishReason::kStop;  // a whole match that nothing may follow: done without an EOS step
    return out;
  }
  if (static_cast<int64_t>(generated.size()) >= sampling.max_new_tokens || n_all_tokens() >= context_length) {
    finish_reason_ = FinishReason::kLength;
  }
  return out;
}

RequestOutput RequestState::finish(FinishReason reason, const std::string& error, Clock::time_point now,
                                   RequestOutput base) {
  if (held_out_) {
    hold(std::move(base));
    base = std::move(*held_out_);
    held_out_.reset();
    held_due_ = false;
  }
  RequestOutput out = std::move(base);
  out.id = id;
  flush_text(out.text);
  Finish f;
  f.reason = reason;
  f.matched_stop_token = matched_stop_token_;
  f.matched_stop_str = matched_stop_str_;
  f.error = error;
  f.usage.prompt_tokens = static_cast<int64_t>(prompt.size());
  f.usage.completion_tokens = static_cast<int64_t>(generated.size());
  f.usage.cached_tokens = cached_tokens;
  f.timings.queue_s = t_first_scheduled_ ? secs(*t_first_scheduled_ - t_submit_) : secs(now - t_submit_);
  f.timings.ttft_s = token_times_s_.empty() ? 0.0 : token_times_s_.front();
  f.timings.e2e_s = secs(now - t_submit_);
  f.timings.token_times_s = token_times_s_;
  f.n_preemptions = n_preemptions_;
  out.finished = std::move(f);
  return out;
}

void RequestState::emit(const RequestOutput& out) {
  if (!callback_) return;
  try {
    callback_(out);
  } catch (const std::exception& e) {
    // A callback must not take the inference thread down; the request still finishes normally.
    std::fprintf(stderr, "fp4moe engine: callback of request %llu threw: %s\n", static_cast<unsigned long long>(id),
                 e.what());
  }
}

void RequestState::hold(RequestOutput out, bool due) {
  held_due_ = held_due_ || due;
  if (!held_out_) {
    held_out_ = std::move(out);
    held_out_->id = id;
    return;
  }
  for (GeneratedToken& t : out.tokens) held_out_->tokens.push_back(std::move(t));
  held_out_->text += out.text;
}

void RequestState::flush_held() {
  if (!held_out_) return;
  RequestOutput out = std::move(*held_out_);
  held_out_.reset();
  held_due_ = false;
  emit(out);
}

double RequestState::ttft_s() const { return token_times_s_.empty() ? 0.0 : token_times_s_.front(); }

double RequestState::last_inter_token_s() const {
  const size_t n = token_times_s_.size();
  return n >= 2 ? token_times_s_[n - 1] - token_times_s_[n - 2] : 0.0;
}

}  // namespace fp4moe::engine
