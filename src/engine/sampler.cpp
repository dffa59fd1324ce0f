// engine::Sampler (see sampler.h). Tested by tests/engine/test_sampler.cpp.
#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <sstream>
#include <string>

#include "core/error.h"
#include "model/config.h"

namespace fp4moe::engine {

namespace {

std::string show(double v) {
  std::ostringstream os;
  os << v;
  return os.str();
}

// Throws FieldError(field, message()) unless ok; the message is built only then (validate runs per request
// and per logit_bias entry).
template <class Message>
void need(bool ok, const char* field, Message&& message) {
  if (!ok) throw FieldError(field, message());
}

}  // namespace

void SamplingParams::validate(int64_t vocab_size) const {
  need(max_new_tokens >= 1, "max_new_tokens",
       [&] { return "max_new_tokens " + std::to_string(max_new_tokens) + " must be >= 1"; });
  need(min_new_tokens >= 0 && min_new_tokens <= max_new_tokens, "min_new_tokens", [&] {
    return "min_new_tokens " + std::to_string(min_new_tokens) +
           " must be in [0, max_new_tokens = " + std::to_string(max_new_tokens) + "]";
  });
  need(stream_interval >= 0, "stream_interval",
       [&] { return "stream_interval " + std::to_string(stream_interval) + " must be >= 1 (0: the server's)"; });
  need(std::isfinite(temperature) && temperature >= 0.0 && temperature <= kMaxTemperature, "temperature", [&] {
    return "temperature " + show(temperature) + " must be in [0, " + show(kMaxTemperature) + "] (0 = greedy)";
  });
  need(top_k >= -1 && top_k <= INT32_MAX, "top_k",
       [&] { return "top_k " + std::to_string(top_k) + " must be -1 (off), 0 (off) or in [1, 2^31)"; });
  need(std::isfinite(top_p) && top_p > 0.0 && top_p <= 1.0, "top_p",
       [&] { return "top_p " + show(top_p) + " must be in (0, 1]"; });
  need(std::isfinite(min_p) && min_p >= 0.0 && min_p <= 1.0, "min_p",
       [&] { return "min_p " + show(min_p) + " must be in [0, 1]"; });
  need(std::isfinite(repetition_penalty) && repetition_penalty > 0.0 && repetition_penalty <= kMaxRepetitionPenalty,
       "repetition_penalty", [&] {
         return "repetition_penalty " + show(repetition_penalty) + " must be in (0, " + show(kMaxRepetitionPenalty) +
                "]";
       });
  auto penalty = [&](double v, const char* name) {
    need(std::isfinite(v) && v >= -kMaxAbsPenalty && v <= kMaxAbsPenalty, name, [&] {
      return std::string(name) + " " + show(v) + " must be in [" + show(-kMaxAbsPenalty) + ", " + show(kMaxAbsPenalty) +
             "]";
    });
  };
  penalty(frequency_penalty, "frequency_penalty");
  penalty(presence_penalty, "presence_penalty");
  need(top_logprobs >= 0 && top_logprobs <= kMaxTopLogprobs, "top_logprobs", [&] {
    return "top_logprobs " + std::to_string(top_logprobs) + " must be in [0, " + std::to_string(kMaxTopLogprobs) + "]";
  });
  need(prompt_logprobs >= -1 && prompt_logprobs <= kMaxTopLogprobs, "prompt_logprobs", [&] {
    return "prompt_logprobs " + std::to_string(prompt_logprobs) + " must be -1 (off) or in [0, " +
           std::to_string(kMaxTopLogprobs) + "]";
  });
  for (size_t i = 0; i < stop_token_ids.size(); ++i) {
    need(stop_token_ids[i] >= 0 && stop_token_ids[i] < vocab_size, "stop_token_ids", [&] {
      return "stop_token_ids[" + std::to_string(i) + "] = " + std::to_string(stop_token_ids[i]) +
             " is outside the model's vocabulary [0, " + std::to_string(vocab_size) + ")";
    });
  }
  for (size_t i = 0; i < stop.size(); ++i) {
    need(!stop[i].empty(), "stop", [&] { return "stop[" + std::to_string(i) + "] is an empty string"; });
  }
  for (const auto& [id, bias] : logit_bias) {
    need(id >= 0 && id < vocab_size, "logit_bias", [&] {
      return "logit_bias[\"" + std::to_string(id) + "\"]: token " + std::to_string(id) +
             " is outside the model's vocabulary [0, " + std::to_string(vocab_size) + ")";
    });
    need(std::isfinite(bias) && bias >= -kMaxAbsLogitBias && bias <= kMaxAbsLogitBias, "logit_bias", [&] {
      return "logit_bias of token " + std::to_string(id) + " = " + show(bias) + " must be in [" +
             show(-kMaxAbsLogitBias) + ", " + show(kMaxAbsLogitBias) + "]";
    });
  }
}

SamplingParams sampling_defaults_from(const model::GenerationDefaults& g) {
  if (!g.problems.empty())
    FP4MOE_FAIL() << g.problems.front() << " (--sampling-defaults openai ignores the file's sampling values)";
  SamplingParams p;
  if (g.temperature) p.temperature = *g.temperature;
  if (g.top_p) p.top_p = *g.top_p;
  if (g.top_k) p.top_k = *g.top_k;
  if (g.min_p) p.min_p = *g.min_p;
  if (g.repetition_penalty) p.repetition_penalty = *g.repetition_penalty;
  try {
    p.validate(1);  // no ids among these fields
  } catch (const FieldError& e) {
    FP4MOE_FAIL() << g.source << ": " << e.what()
                  << " (a request's range; --sampling-defaults openai ignores the file's)";
  }
  return p;
}

TokenId argmax_token(const float* logits, int64_t vocab) {
  int64_t best = 0;
  for (int64_t i = 1; i < vocab; ++i) {
    if (logits[i] > logits[best]) best = i;
  }
  return static_cast<TokenId>(best);
}

Sampler::Sampler(const SamplingParams& params, int64_t vocab_size, uint64_t seed)
    : params_(params), vocab_(vocab_size), rng_(seed), seen_(static_cast<size_t>(vocab_size), 0) {
  FP4MOE_CHECK(vocab_size >= 1) << "sampler vocabulary size " << vocab_size << " must be >= 1";
}

void Sampler::observe_prompt(std::span<const TokenId> prompt) {
  for (TokenId t : prompt) {
    if (t >= 0 && t < vocab_) seen_[static_cast<size_t>(t)] = 1;
  }
}

void Sampler::accept(TokenId id) {
  if (id < 0 || id >= vocab_) return;
  seen_[static_cast<size_t>(id)] = 1;
  ++out_counts_[id];
}

void Sampler::penalized(const float* logits, std::vector<float>& out) const {
  out.assign(logits, logits + vocab_);
  if (params_.repetition_penalty != 1.0) {
    const float rp = static_cast<float>(params_.repetition_penalty);
    for (int64_t i = 0; i < vocab_; ++i) {
      if (!seen_[static_cast<size_t>(i)]) continue;
      out[static_cast<size_t>(i)] = out[static_cast<size_t>(i)] > 0 ? out[static_cast<size_t>(i)] / rp
                                                                     : out[static_cast<size_t>(i)] * rp;
    }
  }
  if (params_.frequency_penalty != 0.0 || params_.presence_penalty != 0.0) {
    for (const auto& [id, n] : out_counts_) {
      out[static_cast<size_t>(id)] -= static_cast<float>(params_.frequency_penalty * static_cast<double>(n) +
                                                         params_.presence_penalty);
    }
  }
  for (const auto& [id, bias] : params_.logit_bias) {
    if (id >= 0 && id < vocab_) out[static_cast<size_t>(id)] += bias;
  }
}

namespace {

// Probabilities after temperature, top-k, top-p and min-p (zeros outside the kept set, renormalized).
// The order (probability desc, id asc: a stable sort by probability) only as far as the truncation
// reads it: `order` holds the first n tokens of that order, n grown by doubling (each a partial sort
// of the whole row, so ~V log n work instead of V log V; plain temperature sampling sorts nothing).
class OrderPrefix {
 public:
  explicit OrderPrefix(const std::vector<double>& prob) : prob_(prob), all_(prob.size()) {
    std::iota(all_.begin(), all_.end(), 0);
  }
  // The i-th token of the order (i < size of the row).
  int32_t at(size_t i) {
    if (i >= sorted_) grow(i + 1);
    return all_[i];
  }

 private:
  void grow(size_t need) {
    const size_t n = std::min(all_.size(), std::max({need, 2 * sorted_, size_t{64}}));
    std::partial_sort(all_.begin(), all_.begin() + static_cast<std::ptrdiff_t>(n), all_.end(), [&](int32_t a, int32_t b) {
      return prob_[static_cast<size_t>(a)] > prob_[static_cast<size_t>(b)] ||
             (prob_[static_cast<size_t>(a)] == prob_[static_cast<size_t>(b)] && a < b);
    });
    sorted_ = n;
  }
  const std::vector<double>& prob_;
  std::vector<int32_t> all_;
  size_t sorted_ = 0;
};

std::vector<double> truncated_probs(const std::vector<float>& z, const SamplingParams& p) {
  const size_t V = z.size();
  std::vector<double> prob(V, 0.0);
  if (p.greedy()) {
    prob[static_cast<size_t>(argmax_token(z.data(), static_cast<int64_t>(V)))] = 1.0;
    return prob;
  }
  const float mx = *std::max_element(z.begin(), z.end());
  double sum = 0.0;
  for (size_t i = 0; i < V; ++i) {
    prob[i] = std::exp((static_cast<double>(z[i]) - mx) / p.temperature);
    sum += prob[i];
  }
  for (double& x : prob) x /= sum;
  size_t keep = V;
  if (p.top_k > 0) keep = std::min(keep, static_cast<size_t>(p.top_k));
  if (keep == V && p.top_p >= 1.0 && p.min_p <= 0.0) return prob;  // nothing truncated: every token, as is
  OrderPrefix order(prob);
  if (p.top_p < 1.0) {
    // The top-k set's mass: in order within the top-k prefix, in id order for the whole row (no
    // sort needed; the sums differ from an in-order sum only in the last bits).
    double kept_mass = 0.0;
    if (keep == V) {
      for (double x : prob) kept_mass += x;
    } else {
      for (size_t i = 0; i < keep; ++i) kept_mass += prob[static_cast<size_t>(order.at(i))];
    }
    double cum = 0.0;
    size_t n = 0;
    while (n < keep) {
      cum += prob[static_cast<size_t>(order.at(n))] / kept_mass;
      ++n;
      if (cum >= p.top_p - 1e-12) break;
    }
    keep = n;
  }
  if (p.min_p > 0.0) {
    const double floor = p.min_p * prob[static_cast<size_t>(order.at(0))];
    size_t n = 1;
    while (n < keep && prob[static_cast<size_t>(order.at(n))] >= floor) ++n;
    keep = n;
  }
  std::vector<double> out(V, 0.0);
  double kept = 0.0;
  for (size_t i = 0; i < keep; ++i) kept += prob[static_cast<size_t>(order.at(i))];
  for (size_t i = 0; i < keep; ++i) out[static_cast<size_t>(order.at(i))] = prob[static_cast<size_t>(order.at(i))] / kept;
  return out;
}

}  // namespace

TokenId sample_from(const float* z, int64_t vocab, const SamplingParams& params, double u) {
  if (params.greedy()) return argmax_token(z, vocab);
  const std::vector<double> prob = truncated_probs(std::vector<float>(z, z + vocab), params);
  double x = u;
  TokenId last_kept = 0;
  for (int64_t i = 0; i < vocab; ++i) {
    const double pi = prob[static_cast<size_t>(i)];
    if (pi <= 0.0) continue;
    last_kept = static_cast<TokenId>(i);
    x -= pi;
    if (x < 0.0) return static_cast<TokenId>(i);
  }
  return last_kept;  // rounding left a sliver of mass at the end
}

double Sampler::next_uniform() { return std::uniform_real_distribution<double>(0.0, 1.0)(rng_); }

std::vector<double> Sampler::distribution(const float* logits) const {
  std::vector<float> z;
  penalized(logits, z);
  return truncated_probs(z, params_);
}

SampleResult Sampler::sample(const float* logits) {
  std::vector<float> z;
  penalized(logits, z);
  SampleResult r;
  if (params_.greedy()) {
    r.id = argmax_token(z.data(), vocab_);
  } else {
    r.id = sample_from(z.data(), vocab_, params_, next_uniform());
  }
  if (params_.logprobs || params_.top_logprobs > 0) {
    const SampleResult lp = logprobs_of(z.data(), vocab_, r.id, params_.top_logprobs);
    r.logprob = lp.logprob;
    r.top = lp.top;
  }
  return r;
}

SampleResult logprobs_of(const float* z, int64_t vocab, TokenId id, int64_t n_top) {
  FP4MOE_CHECK(id >= 0 && id < vocab) << "logprobs_of: token " << id << " outside the vocabulary [0, " << vocab << ")";
  const float mx = *std::max_element(z, z + vocab);
  double sum = 0.0;
  for (int64_t i = 0; i < vocab; ++i) sum += std::exp(static_cast<double>(z[i]) - mx);
  const double lse = mx + std::log(sum);
  SampleResult r;
  r.id = id;
  r.logprob = static_cast<float>(z[id] - lse);
  if (n_top > 0) {
    const size_t n = std::min(static_cast<size_t>(n_top), static_cast<size_t>(vocab));
    std::vector<int32_t> order(static_cast<size_t>(vocab));
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(n), order.end(),
                      [&](int32_t a, int32_t b) { return z[a] > z[b] || (z[a] == z[b] && a < b); });
    for (size_t i = 0; i < n; ++i) {
      // A banned token (-inf: a structured-output mask, min_new_tokens) is no alternative: listed, its
      // logprob would be -inf, which JSON cannot carry.
      if (std::isinf(z[order[i]])) break;
      r.top.push_back({order[i], static_cast<float>(z[order[i]] - lse)});
    }
  }
  return r;
}

}  // namespace fp4moe::engine
