// A scripted CausalLM for engine tests: its KV state stores the tokens themselves, and the logits
// after a position are a function of the whole history (`next` picks the favourite token, the
// others get small history-dependent values), so any KV mix-up between sequences, a lost chunk or a
// wrong recompute changes the output. Forward calls are recorded (tokens and sequences per call).
#pragma once

#include <cstdint>
#include <algorithm>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/error.h"
#include "engine/sampler.h"
#include "model/causal_lm.h"

namespace fp4moe::testing {

class ScriptedState : public model::KvState {
 public:
  int64_t length() const override { return static_cast<int64_t>(tokens.size()); }
  void truncate(int64_t n) override { tokens.resize(static_cast<size_t>(n)); }
  size_t bytes() const override { return tokens.size() * sizeof(int32_t); }
  std::unique_ptr<model::KvState> copy_prefix(int64_t n) const override {
    if (!copyable) return nullptr;
    auto out = std::make_unique<ScriptedState>();
    out->copyable = copyable;
    out->tokens.assign(tokens.begin(), tokens.begin() + n);
    return out;
  }
  std::vector<int32_t> tokens;
  bool copyable = true;  // false: like a model without copy_prefix (no prefix cache)
};

class ScriptedModel : public model::CausalLM {
 public:
  using NextFn = std::function<int32_t(std::span<const int32_t> history)>;

  explicit ScriptedModel(int64_t vocab = 272, NextFn next = {}, int64_t max_pos = 4096) : next_(std::move(next)) {
    config_.architecture = "Scripted";
    config_.vocab_size = vocab;
    config_.max_position_embeddings = max_pos;
    config_.eos_token_ids = {vocab - 1};
    if (!next_) {
      // FNV-1a of the history, avoiding the eos token.
      next_ = [vocab](std::span<const int32_t> h) {
        uint64_t x = 1469598103934665603ULL;
        for (int32_t t : h) x = (x ^ static_cast<uint64_t>(t)) * 1099511628211ULL;
        return static_cast<int32_t>(x % static_cast<uint64_t>(vocab - 1));
      };
    }
  }

  const model::ModelConfig& config() const override { return config_; }
  bool supports_argmax() const override { return argmax_supported; }
  bool argmax_supported = false;  // answer SeqChunk::argmax like a GPU model (tests of that path)
  int64_t argmax_answers = 0;     // how many argmax-only rows it answered
  int64_t sample_answers = 0;     // how many device draws (SeqChunk::sample) it answered
  std::unique_ptr<model::KvState> new_state() const override {
    auto s = std::make_unique<ScriptedState>();
    s->copyable = states_copyable;
    return s;
  }
  bool states_copyable = true;  // false: states without copy_prefix (the engine runs without a prefix cache)

  std::string fail_with;  // non-empty: every forward throws this (a model that cannot run)
  int32_t poison_token = -1;  // >= 0: a chunk holding this token fails alone (model::SequenceError), as a NaN would

  void forward(std::span<const model::SeqChunk> batch, model::ForwardTrace* trace) override {
    if (!fail_with.empty()) throw Error(fail_with);
    for (size_t b = 0; b < batch.size() && poison_token >= 0; ++b) {  // checked before any state changes
      const auto& t = batch[b].tokens;
      if (std::find(t.begin(), t.end(), poison_token) != t.end()) {
        throw model::SequenceError(static_cast<int64_t>(b), "entry " + std::to_string(b) + " holds a NaN");
      }
    }
    int64_t n_tokens = 0;
    for (const model::SeqChunk& c : batch) {
      auto* s = dynamic_cast<ScriptedState*>(c.state);
      FP4MOE_CHECK(s != nullptr) << "state from another model";
      FP4MOE_CHECK(!c.tokens.empty()) << "empty chunk";
      for (size_t i = 0; i < c.tokens.size(); ++i) {
        s->tokens.push_back(c.tokens[i]);
        FP4MOE_CHECK(c.argmax == nullptr || argmax_supported) << "argmax asked of a model without supports_argmax()";
        FP4MOE_CHECK(c.sample == nullptr || c.argmax != nullptr) << "a device draw without an argmax slot";
        if (c.argmax != nullptr && i + 1 == c.tokens.size()) {
          std::vector<float> row(static_cast<size_t>(config_.vocab_size));
          fill_logits(s->tokens, row.data());
          if (c.sample != nullptr) {  // as a GPU model draws: engine::sample_from given the request's u
            engine::SamplingParams p;
            p.temperature = c.sample->temperature;
            p.top_k = c.sample->top_k;
            p.top_p = c.sample->top_p;
            p.min_p = c.sample->min_p;
            *c.argmax = engine::sample_from(row.data(), config_.vocab_size, p, c.sample->u);
            ++sample_answers;
          } else {
            *c.argmax = static_cast<int32_t>(std::max_element(row.begin(), row.end()) - row.begin());
            ++argmax_answers;
          }
        }
        const bool want = c.logits && (c.all_logits || i + 1 == c.tokens.size());
        if (!want) continue;
        float* out = c.logits + (c.all_logits ? i * static_cast<size_t>(config_.vocab_size) : 0);
        fill_logits(s->tokens, out);
      }
      n_tokens += static_cast<int64_t>(c.tokens.size());
    }
    calls.push_back({static_cast<int64_t>(batch.size()), n_tokens});
    if (trace) trace->moe_layers.push_back({1, std::vector<int64_t>{n_tokens, 0, 2 * n_tokens}});
  }

  void fill_logits(std::span<const int32_t> history, float* out) const {
    const int32_t fav = next_(history);
    uint64_t x = 88172645463325252ULL + history.size();
    for (int64_t v = 0; v < config_.vocab_size; ++v) {
      x ^= x << 13;
      x ^= x >> 7;
      x ^= x << 17;
      out[v] = static_cast<float>(x % 1000) / 1000.0f;  // [0, 1)
    }
    out[fav] = 8.0f;
  }

  void set_linear_observer(model::LinearInputObserver) override {}
  size_t weight_bytes() const override { return 0; }
  std::string describe() const override { return "scripted test model"; }

  struct Call {
    int64_t n_seqs = 0;
    int64_t n_tokens = 0;
  };
  std::vector<Call> calls;

 private:
  model::ModelConfig config_;
  NextFn next_;
};

}  // namespace fp4moe::testing
