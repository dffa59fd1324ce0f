// The engine's own cost per decode step (scheduling, sampling bookkeeping, detokenizing and
// streaming, KV block accounting), measured with a model whose forward costs nothing: the host
// work a GPU step pays on top of its kernels. For each batch size and --num-continuous-decode-steps
// value: B greedy requests (prompt 16 tokens, the embedded default tokenizer) are prefilled, then
// the engine runs decode steps on the caller's thread (Engine::step, manual mode); the table gives
// the median of 5 repeats of the mean wall time per decode step and per generated token.
// Run: build/bench/bench_engine_step [--steps N] (default 400 decode steps per measurement)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "engine/default_model.h"
#include "engine/engine.h"
#include "model/causal_lm.h"

namespace {

using fp4moe::engine::Engine;
using fp4moe::engine::EngineOptions;
using fp4moe::engine::RequestOutput;
using fp4moe::engine::SamplingParams;
using fp4moe::engine::TokenId;

class LengthState : public fp4moe::model::KvState {
 public:
  int64_t length() const override { return n; }
  void truncate(int64_t t) override { n = t; }
  size_t bytes() const override { return 0; }
  int64_t n = 0;
};

// A GPU-like model (greedy answered as an argmax) whose forward does no work.
class NullModel : public fp4moe::model::CausalLM {
 public:
  NullModel() {
    config_.architecture = "Null";
    config_.vocab_size = 272;
    config_.max_position_embeddings = 1 << 20;
    config_.eos_token_ids = {271};
  }
  const fp4moe::model::ModelConfig& config() const override { return config_; }
  bool supports_argmax() const override { return true; }
  std::unique_ptr<fp4moe::model::KvState> new_state() const override { return std::make_unique<LengthState>(); }
  void forward(std::span<const fp4moe::model::SeqChunk> batch, fp4moe::model::ForwardTrace*) override {
    for (const fp4moe::model::SeqChunk& c : batch) {
      static_cast<LengthState*>(c.state)->n += static_cast<int64_t>(c.tokens.size());
      if (c.argmax != nullptr) *c.argmax = 65 + static_cast<int32_t>(c.tokens.back() % 26);  // letters
      if (c.logits != nullptr) std::fill_n(c.logits, config_.vocab_size, 0.0f);
    }
    ++forwards;
  }
  void set_linear_observer(fp4moe::model::LinearInputObserver) override {}
  size_t weight_bytes() const override { return 0; }
  std::string describe() const override { return "null model (no work)"; }
  int64_t forwards = 0;

 private:
  fp4moe::model::ModelConfig config_;
};

// Mean seconds per decode step over `steps` decode steps of B running requests.
double seconds_per_step(int64_t B, int64_t S, int64_t steps) {
  auto model = std::make_unique<NullModel>();
  NullModel* m = model.get();
  EngineOptions o;
  o.max_running_requests = B;
  o.max_total_tokens = B * (16 + steps + 64) + 64 * 16;
  o.num_continuous_decode_steps = S;
  Engine engine(o, std::move(model), fp4moe::engine::make_default_tokenizer());
  SamplingParams sp;
  sp.temperature = 0.0;
  sp.max_new_tokens = steps + 32;
  sp.ignore_eos = true;
  int64_t tokens = 0;
  for (int64_t b = 0; b < B; ++b) {
    std::vector<TokenId> prompt(16);
    for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<TokenId>(65 + (b + i) % 26);
    engine.submit({prompt, sp}, [&tokens](const RequestOutput& out) { tokens += static_cast<int64_t>(out.tokens.size()); });
  }
  while (engine.stats().n_waiting > 0) engine.step();  // prefill everything
  for (int i = 0; i < 4; ++i) engine.step();           // warm-up decode steps
  const int64_t f0 = m->forwards;
  const auto t0 = std::chrono::steady_clock::now();
  while (m->forwards - f0 < steps) engine.step();
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (tokens < B * steps) {  // every request must have produced its tokens: the steps did the work
    std::fprintf(stderr, "bench_engine_step: batch %lld produced %lld tokens in %lld steps\n",
                 static_cast<long long>(B), static_cast<long long>(tokens), static_cast<long long>(steps));
    std::exit(1);
  }
  return s / static_cast<double>(m->forwards - f0);
}

}  // namespace

int main(int argc, char** argv) {
  int64_t steps = 400;
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::strcmp(argv[i], "--steps") == 0) steps = std::atoll(argv[i + 1]);
  }
  std::printf("engine cost per decode step, null model (median of 5 runs of %lld steps)\n",
              static_cast<long long>(steps));
  std::printf("%6s %6s %14s %14s\n", "batch", "S", "us / step", "us / token");
  for (int64_t B : {1, 16, 64, 256}) {
    for (int64_t S : {1, 4}) {
      std::vector<double> runs;
      for (int r = 0; r < 5; ++r) runs.push_back(seconds_per_step(B, S, steps));
      std::sort(runs.begin(), runs.end());
      const double med = runs[2];
      std::printf("%6lld %6lld %14.1f %14.2f\n", static_cast<long long>(B), static_cast<long long>(S), med * 1e6,
                  med * 1e6 / static_cast<double>(B));
    }
  }
  return 0;
}
