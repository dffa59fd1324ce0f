// engine::Sampler: turns one row of logits into a token, as SGLang / vLLM define the knobs:
//   penalties (on the logits: repetition divides positive / multiplies negative logits of every token
//   seen in prompt or output; frequency subtracts freq * count and presence subtracts presence once,
//   both over output tokens only) -> greedy (temperature 0) or softmax(logits / T) -> top-k -> top-p
//   (smallest most-likely set reaching top_p) -> min-p (drop tokens below min_p * p_max) -> draw
//   from the renormalized rest with the request's own generator (seeded: reproducible).
// Logprobs are log-softmax of the logits after penalties, before temperature and truncation
// (SGLang's default "raw" logprobs would be before penalties; we report what was sampled from).
//
//   Sampler s(params, vocab);             // one per request
//   s.observe_prompt(prompt_ids);
//   SampleResult r = s.sample(logits);    // then s.accept(r.id)
//
// Tested by tests/engine/test_sampler.cpp (support sets, statistics, seeds, penalties, logprobs).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/error.h"

namespace fp4moe::model {
struct GenerationDefaults;  // model/config.h
}

namespace fp4moe::engine {

using TokenId = int32_t;
class TokenConstraint;  // engine/constraint.h

// A request field out of its range: `field` as SamplingParams spells it ("stop_token_ids"); the message
// names the field and value and carries no source location (a server maps the field to its API's name and
// returns the message as it is).
class FieldError : public Error {
 public:
  FieldError(std::string field, const std::string& message) : Error(message), field_(std::move(field)) {}
  const std::string& field() const { return field_; }

 private:
  std::string field_;
};

// The requests' ranges, one definition for SamplingParams::validate and the server's parse (which names the API's
// field): temperature [0, kMaxTemperature], repetition_penalty (0, kMaxRepetitionPenalty], frequency / presence
// penalty [-kMaxAbsPenalty, kMaxAbsPenalty], logit_bias [-kMaxAbsLogitBias, kMaxAbsLogitBias], top_logprobs and
// prompt_logprobs up to kMaxTopLogprobs (OpenAI's bounds; vLLM / SGLang's for the penalties).
inline constexpr double kMaxTemperature = 100.0;
inline constexpr double kMaxRepetitionPenalty = 2.0;
inline constexpr double kMaxAbsPenalty = 2.0;
inline constexpr double kMaxAbsLogitBias = 100.0;
inline constexpr int64_t kMaxTopLogprobs = 20;

struct SamplingParams {
  int64_t max_new_tokens = 128;
  // vLLM's min_tokens / SGLang's min_new_tokens: until this many tokens were generated, EOS (unless
  // ignore_eos) and stop_token_ids are not drawn (their logits masked) and stop strings do not match.
  int64_t min_new_tokens = 0;
  double temperature = 1.0;          // 0 = greedy
  int64_t top_k = -1;                // <= 0 or -1: off
  double top_p = 1.0;                // (0, 1]
  double min_p = 0.0;                // [0, 1]
  double repetition_penalty = 1.0;   // > 0; 1 = off
  double frequency_penalty = 0.0;    // [-2, 2]
  double presence_penalty = 0.0;     // [-2, 2]
  std::optional<uint64_t> seed;      // nullopt: drawn from the engine's generator
  std::vector<TokenId> stop_token_ids;
  std::vector<std::string> stop;  // stop strings (not emitted, unless include_stop_str)
  // vLLM's include_stop_str_in_output / SGLang's no_stop_trim: the matched stop string ends the text.
  bool include_stop_str = false;
  bool ignore_eos = false;
  bool skip_special_tokens = true;   // in the streamed text
  // SGLang's per-request stream_interval: this request's tokens streamed in groups of this many (the first at once);
  // 0: the engine's (EngineOptions::stream_interval).
  int64_t stream_interval = 0;
  // Special tokens the streamed text keeps all the same: the server's reasoning / tool-call parsers' tags where the
  // tokenizer marks them special (they read the text; SGLang and vLLM parse with them kept).
  std::vector<TokenId> keep_special_ids;
  bool logprobs = false;             // logprob of each chosen token
  int64_t top_logprobs = 0;          // >= 0: this many most likely tokens with their logprobs
  // Prompt logprobs (vLLM's prompt_logprobs; what OpenAI echo + logprobs reports): -1 off; N in
  // [0, 20]: each prompt token's logprob given the tokens before it, with the N most likely tokens
  // there, delivered in the request's first event (RequestOutput::prompt_logprobs). The prefill
  // then computes the logits of every prompt position (model::SeqChunk::all_logits).
  int64_t prompt_logprobs = -1;
  // OpenAI logit_bias: added to the token's logit after the penalties, before temperature and the
  // truncations (bias in [-100, 100]: -100 bans a token in practice, +100 all but forces it).
  std::vector<std::pair<TokenId, float>> logit_bias;
  // Structured outputs (engine/constraint.h): only tokens that keep the reply a possible match are
  // drawn, end-of-sequence only where it is a whole match, and the request ends (stop) once nothing
  // can follow. Applied by RequestState on the logits, so such requests always sample on the host.
  std::shared_ptr<const TokenConstraint> constraint;
  // With a constraint and a reasoning model (the server's --reasoning-parser): the reply may first
  // think, unconstrained, between `start` and `end` (e.g. "<think>", "</think>"); the constraint applies
  // from the token after `end`. With starts_inside the reply begins inside the block (its start tag is
  // in the prompt); otherwise the first tokens may be whitespace or the `start` token (one token of the
  // vocabulary), and any other token begins the constrained reply.
  struct ReasoningSpan {
    std::string start, end;
    bool starts_inside = false;
  };
  std::optional<ReasoningSpan> constraint_after_reasoning;

  // Fails (FieldError, below) naming the field and value when out of range; vocab bounds the ids.
  void validate(int64_t vocab_size) const;
  bool greedy() const { return temperature == 0.0 || top_k == 1; }
  // False when the choice is the plain argmax of the logits (greedy, no penalties, no logprobs):
  // then a model may return only that argmax (model::SeqChunk::argmax).
  bool needs_logits() const {
    return !greedy() || logprobs || top_logprobs > 0 || repetition_penalty != 1.0 || frequency_penalty != 0.0 ||
           presence_penalty != 0.0 || !logit_bias.empty() || min_new_tokens > 0 || constraint != nullptr;
  }
  // True when a model can draw the token itself (model::SeqChunk::sample: temperature, top-k/p,
  // min-p on the device, given next_uniform()): not greedy, no penalties, no logprobs.
  bool device_samplable() const {
    return !greedy() && !logprobs && top_logprobs == 0 && repetition_penalty == 1.0 && frequency_penalty == 0.0 &&
           presence_penalty == 0.0 && logit_bias.empty() && min_new_tokens == 0 && constraint == nullptr;
  }
};

// SamplingParams{} with the values generation_config.json recommends (SGLang's --sampling-defaults model); fails
// naming the file, the field and the request's range when a value is out of it (SamplingParams::validate).
SamplingParams sampling_defaults_from(const model::GenerationDefaults& generation);

struct TokenLogprob {
  TokenId id = 0;
  float logprob = 0.0f;
};

struct SampleResult {
  TokenId id = 0;
  float logprob = 0.0f;                  // filled when params.logprobs or top_logprobs > 0
  std::vector<TokenLogprob> top;         // params.top_logprobs entries
};

// Token `id`'s logprob under log_softmax(z) ([vocab] logits) and the n_top most likely tokens (ties:
// the lower id first), the one definition the sampler's logprobs and the prompt logprobs share.
SampleResult logprobs_of(const float* z, int64_t vocab, TokenId id, int64_t n_top);

class Sampler {
 public:
  Sampler(const SamplingParams& params, int64_t vocab_size, uint64_t seed);

  void observe_prompt(std::span<const TokenId> prompt);
  // Samples from logits [vocab] (not modified).
  SampleResult sample(const float* logits);
  // Records an emitted output token (penalties count it from now on).
  void accept(TokenId id);
  // The uniform [0, 1) draw a sampled step uses (sample() takes one per non-greedy step); a model that
  // samples on the device (model::SeqChunk::sample) is given this draw instead, so seeds reproduce.
  double next_uniform();

  // The probabilities the draw uses (after penalties, temperature, top-k/p, min-p; zeros outside
  // the kept set); for tests. Greedy: one-hot at the argmax.
  std::vector<double> distribution(const float* logits) const;

 private:
  void penalized(const float* logits, std::vector<float>& out) const;

  SamplingParams params_;
  int64_t vocab_;
  std::mt19937_64 rng_;
  std::vector<uint8_t> seen_;                        // [vocab] in prompt or output (repetition)
  std::unordered_map<TokenId, int64_t> out_counts_;  // output token counts (frequency / presence)
};

// Greedy with the lowest index on ties (the reference forward's argmax).
TokenId argmax_token(const float* logits, int64_t vocab);

// The draw of Sampler::sample on logits z that already carry the penalties: greedy -> argmax_token;
// else the truncated distribution (temperature, top-k, top-p, min-p as above) and the first token
// in id order at which u in [0, 1) runs out of cumulative probability (the last kept token with
// nonzero probability when rounding leaves a sliver). The reference of the GPU sampling kernel
// (cuda::sample_rows).
TokenId sample_from(const float* z, int64_t vocab, const SamplingParams& params, double u);

}  // namespace fp4moe::engine
