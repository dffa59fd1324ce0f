// engine::Engine scheduling on a scripted model (tests/engine/scripted_model.h): concurrent requests
// equal each alone, chunked prefill equals unchunked, KV exhaustion makes requests wait, preemption
// by recompute keeps outputs identical, aborts free blocks, rejections carry their numbers, the
// continuous-decode gate and its once-per-run delivery, stop strings across token boundaries, the threaded engine and its probe.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <limits>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <tuple>
#include <utility>

#include "core/error.h"
#include "engine/default_model.h"
#include "engine/engine.h"
#include "engine/scripted_model.h"
#include "testing/testing.h"

namespace fp4moe::engine {
namespace {

using testing::ScriptedModel;

struct Collected {
  std::vector<TokenId> ids;
  std::string text;
  std::optional<Finish> finish;
  int n_events = 0;
};

struct Harness {
  explicit Harness(EngineOptions o, std::unique_ptr<model::CausalLM> m = std::make_unique<ScriptedModel>(),
                   std::shared_ptr<const Tokenizer> tok = make_default_tokenizer())
      : engine(std::move(o), std::move(m), std::move(tok)) {}

  RequestId submit(std::vector<TokenId> prompt, SamplingParams sp, int64_t priority = 0, bool log_metrics = true) {
    SubmitResult r = engine.submit({std::move(prompt), sp, priority, log_metrics}, [this](const RequestOutput& out) {
      std::lock_guard<std::mutex> lock(mu);
      Collected& c = results[out.id];
      ++c.n_events;
      EXPECT_FALSE(c.finish.has_value()) << "event after finish for request " << out.id;
      for (const auto& t : out.tokens) c.ids.push_back(t.id);
      c.text += out.text;
      if (out.finished) c.finish = out.finished;
    });
    EXPECT_TRUE(r.ok()) << (r.rejection ? r.rejection->message : "");
    return r.id;
  }
  // Declared before the engine: ~Engine aborts what is left, and those callbacks write here.
  std::mutex mu;
  std::map<RequestId, Collected> results;
  Engine engine;
};

SamplingParams greedy(int64_t n) {
  SamplingParams sp;
  sp.temperature = 0.0;
  sp.max_new_tokens = n;
  sp.ignore_eos = true;
  return sp;
}

std::vector<TokenId> random_prompt(std::mt19937_64& rng, int64_t n) {
  std::vector<TokenId> p(static_cast<size_t>(n));
  for (auto& t : p) t = static_cast<TokenId>(rng() % 256);
  return p;
}

std::vector<TokenId> alone(const std::vector<TokenId>& prompt, const SamplingParams& sp) {
  Harness h(EngineOptions{});
  const RequestId id = h.submit(prompt, sp);
  h.engine.run_until_idle();
  return h.results.at(id).ids;
}

struct Case {
  std::vector<TokenId> prompt;
  SamplingParams sp;
};

std::vector<Case> mixed_cases(uint64_t seed, int n) {
  std::mt19937_64 rng(seed);
  std::vector<Case> cases;
  for (int i = 0; i < n; ++i) {
    SamplingParams sp = greedy(1 + static_cast<int64_t>(rng() % 24));
    if (i % 3 == 1) {  // seeded sampling must also be independent of the batch
      sp.temperature = 0.8;
      sp.top_k = 20;
      sp.seed = rng();
    }
    cases.push_back({random_prompt(rng, 1 + static_cast<int64_t>(rng() % 40)), sp});
  }
  return cases;
}

void expect_same_as_alone(EngineOptions o, uint64_t seed, int n, uint64_t* preemptions = nullptr) {
  const auto cases = mixed_cases(seed, n);
  Harness h(o);
  std::vector<RequestId> ids;
  for (const Case& c : cases) ids.push_back(h.submit(c.prompt, c.sp));
  h.engine.run_until_idle();
  for (size_t i = 0; i < cases.size(); ++i) {
    const Collected& got = h.results.at(ids[i]);
    ASSERT_TRUE(got.finish.has_value()) << "request " << i << " never finished";
    EXPECT_EQ(got.finish->reason, FinishReason::kLength);
    EXPECT_EQ(got.ids, alone(cases[i].prompt, cases[i].sp)) << "request " << i << " (prompt "
                                                             << cases[i].prompt.size() << ")";
  }
  const EngineStats s = h.engine.stats();
  EXPECT_EQ(s.kv_used_tokens, 0);
  EXPECT_EQ(s.n_running + s.n_waiting, 0);
  if (preemptions) *preemptions = s.preemptions_total;
}

// A request with log_metrics false (the /health_generate probe) runs like any other but stays out of the request
// counters and latency histograms; the steps it rode in count.
TEST(Scheduler, RequestWithoutLogMetricsIsNotCounted) {
  Harness h(EngineOptions{});
  // The request counters and histograms: requests (submitted, finished, TTFT and E2E observations), tokens.
  auto expect_counted = [&](uint64_t requests, uint64_t prompt_tokens, uint64_t generated) {
    const EngineStats s = h.engine.stats();
    EXPECT_EQ(s.requests_submitted_total, requests);
    EXPECT_EQ(s.requests_finished_total, requests);
    EXPECT_EQ(s.ttft_s.count, requests);
    EXPECT_EQ(s.e2e_s.count, requests);
    EXPECT_EQ(s.prompt_tokens_total, prompt_tokens);
    EXPECT_EQ(s.generation_tokens_total, generated);
    EXPECT_EQ(s.inter_token_s.count, generated - requests);
    EXPECT_GT(s.steps_total, 0u);
  };
  const RequestId quiet = h.submit({1, 2, 3}, greedy(4), 0, /*log_metrics=*/false);
  h.engine.run_until_idle();
  EXPECT_EQ(h.results.at(quiet).ids, alone({1, 2, 3}, greedy(4)));
  expect_counted(0, 0, 0);
  h.submit({4, 5}, greedy(3));
  h.engine.run_until_idle();
  expect_counted(1, 2, 3);
}

TEST(Scheduler, ConcurrentEqualsAlone) {
  EngineOptions o;
  o.max_running_requests = 4;
  expect_same_as_alone(o, testing::test_seed(), 12);
}

// A forward that blames one sequence (model::SequenceError, as the models do for a NaN in its rows) fails that
// request alone: the others of the step run it again and finish exactly as alone; every block comes back. Also on a
// model that draws the seeded requests' tokens itself (as the GPU models do): the failed step's draws are held
// for the re-run, so those requests still equal their host-sampled runs alone.
class SequenceErrorTest : public ::testing::TestWithParam<bool> {};
INSTANTIATE_TEST_SUITE_P(Scheduler, SequenceErrorTest, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "DeviceDraws" : "HostSampling"; });

TEST_P(SequenceErrorTest, FailsOnlyThatRequest) {
  EngineOptions o;
  o.max_running_requests = 4;
  auto model = std::make_unique<ScriptedModel>();
  constexpr TokenId kPoison = 271;  // the eos id: never the greedy choice, so only the poisoned prompt holds it
  model->poison_token = kPoison;
  model->argmax_supported = GetParam();
  const ScriptedModel* raw = model.get();
  Harness h(o, std::move(model));
  auto cases = mixed_cases(testing::test_seed() + 11, 8);
  cases.insert(cases.begin() + 2, Case{{5, 6, kPoison, 7}, greedy(5)});
  // In the failing step, a request whose every draw shows (temperature 50 over logits in [0, 8]: nearly uniform).
  SamplingParams flat = greedy(6);
  flat.temperature = 50.0;
  flat.seed = testing::test_seed() + 3;
  cases.insert(cases.begin() + 1, Case{{9, 10, 11}, flat});
  // A sampled request may draw the poison token itself (the flat one does about once in 45 seeds) and would then
  // fail too: such a request takes the next seed whose run alone does not generate it.
  for (Case& c : cases) {
    if (!c.sp.seed) continue;
    while (std::ranges::count(alone(c.prompt, c.sp), kPoison) != 0) ++*c.sp.seed;
  }
  std::vector<RequestId> ids;
  for (const Case& c : cases) ids.push_back(h.submit(c.prompt, c.sp));
  h.engine.run_until_idle();
  for (size_t i = 0; i < cases.size(); ++i) {
    const Collected& got = h.results.at(ids[i]);
    ASSERT_TRUE(got.finish.has_value()) << "request " << i << " never finished";
    if (i == 3) {
      EXPECT_EQ(got.finish->reason, FinishReason::kError);
      EXPECT_NE(got.finish->error.find("failed for this request (the other "), std::string::npos) << got.finish->error;
      EXPECT_NE(got.finish->error.find("holds a NaN"), std::string::npos) << got.finish->error;
      EXPECT_TRUE(got.ids.empty());
      continue;
    }
    EXPECT_EQ(got.finish->reason, FinishReason::kLength) << "request " << i << ": " << got.finish->error;
    EXPECT_EQ(got.ids, alone(cases[i].prompt, cases[i].sp)) << "request " << i;
  }
  const EngineStats s = h.engine.stats();
  EXPECT_EQ(s.kv_used_tokens, 0);
  EXPECT_EQ(s.n_running + s.n_waiting, 0);
  // The re-run step counts nothing twice: each prompt once (the failed one's too: it was admitted), each token
  // generated once, one first token per finished request.
  uint64_t prompt_tokens = 0, generated = 0;
  for (size_t i = 0; i < cases.size(); ++i) {
    prompt_tokens += cases[i].prompt.size();
    generated += h.results.at(ids[i]).ids.size();
  }
  EXPECT_EQ(s.prompt_tokens_total, prompt_tokens);
  EXPECT_EQ(s.generation_tokens_total, generated);
  EXPECT_EQ(s.ttft_s.count, cases.size() - 1);
  EXPECT_EQ(s.requests_finished_total, cases.size());
  if (GetParam()) {
    EXPECT_GT(raw->sample_answers, 0);  // the seeded requests were drawn by the model
  }
}

// A model that answers SeqChunk::argmax (as the GPU models do): greedy requests without logprobs or
// penalties take that path, seeded temperature / top-k requests are drawn by the model
// (SeqChunk::sample with the request's own uniform draw), the others still get logits, and every
// output equals the logits path's (the host sampler's).
TEST(Scheduler, ModelSideArgmaxForPlainGreedyEqualsLogitsPath) {
  const auto cases = mixed_cases(testing::test_seed(), 12);
  auto m = std::make_unique<ScriptedModel>();
  m->argmax_supported = true;
  ScriptedModel* raw = m.get();
  EngineOptions o;
  o.max_running_requests = 4;
  Harness h(o, std::move(m));
  std::vector<RequestId> ids;
  for (const Case& c : cases) ids.push_back(h.submit(c.prompt, c.sp));
  SamplingParams with_logprobs = greedy(5);
  with_logprobs.logprobs = true;  // greedy, but needs the logits
  const std::vector<TokenId> p{1, 2, 3};
  const RequestId lp = h.submit(p, with_logprobs);
  SamplingParams penalized = greedy(6);
  penalized.temperature = 0.9;
  penalized.repetition_penalty = 1.3;  // sampled, but the penalty needs the logits on the host
  penalized.seed = 11;
  const RequestId pen = h.submit(p, penalized);
  h.engine.run_until_idle();
  EXPECT_EQ(h.results.at(pen).ids, alone(p, penalized));
  int64_t plain_greedy_tokens = 0, drawn_tokens = 0;
  for (size_t i = 0; i < cases.size(); ++i) {
    EXPECT_EQ(h.results.at(ids[i]).ids, alone(cases[i].prompt, cases[i].sp)) << "request " << i;
    const auto n = static_cast<int64_t>(h.results.at(ids[i]).ids.size());
    if (!cases[i].sp.needs_logits()) plain_greedy_tokens += n;
    if (cases[i].sp.device_samplable()) drawn_tokens += n;
  }
  EXPECT_EQ(h.results.at(lp).ids, alone(p, with_logprobs));
  EXPECT_GT(plain_greedy_tokens, 0);
  EXPECT_GT(drawn_tokens, 0);
  EXPECT_EQ(raw->argmax_answers, plain_greedy_tokens);  // exactly the plain greedy tokens came as argmax
  EXPECT_EQ(raw->sample_answers, drawn_tokens);         // and the sampled ones as device draws
}

// --disable-device-sampling (EngineOptions::device_sampling = false): sampled requests get their
// logits rows on the host again, same tokens.
TEST(Scheduler, DeviceSamplingOffSamplesOnTheHost) {
  const auto cases = mixed_cases(testing::test_seed() + 7, 9);
  auto m = std::make_unique<ScriptedModel>();
  m->argmax_supported = true;
  ScriptedModel* raw = m.get();
  EngineOptions o;
  o.device_sampling = false;
  Harness h(o, std::move(m));
  std::vector<RequestId> ids;
  for (const Case& c : cases) ids.push_back(h.submit(c.prompt, c.sp));
  h.engine.run_until_idle();
  for (size_t i = 0; i < cases.size(); ++i) {
    EXPECT_EQ(h.results.at(ids[i]).ids, alone(cases[i].prompt, cases[i].sp)) << "request " << i;
  }
  EXPECT_EQ(raw->sample_answers, 0);
}

TEST(Scheduler, ChunkedPrefillEqualsUnchunked) {
  EngineOptions o;
  o.chunked_prefill_size = 5;
  o.max_prefill_tokens = 7;
  o.max_running_requests = 8;
  std::vector<StepInfo> steps;
  o.step_observer = [&](const StepInfo& s) { steps.push_back(s); };
  expect_same_as_alone(o, testing::test_seed() + 1, 10);
  // The chunk budget is the step's, over all requests (SGLang's): min(7, 5).
  for (const StepInfo& s : steps) EXPECT_LE(s.n_prefill_tokens, 5) << "step " << s.step;
}

// --chunked-prefill-size bounds a step's prefill over all requests, not each request's chunk (SGLang's chunk
// budget): four 6-token prompts under a budget of 8 (max_prefill_tokens 100) take 8, 8, 8 tokens, the prompts
// split across steps where the budget ends; without chunking one step takes all 24.
TEST(Scheduler, ChunkBudgetIsTheStepsOverAllRequests) {
  for (const int64_t chunk : {int64_t{8}, int64_t{-1}}) {
    EngineOptions o;
    o.chunked_prefill_size = chunk;
    o.max_prefill_tokens = 100;
    std::vector<int64_t> prefill;
    o.step_observer = [&](const StepInfo& s) {
      if (s.n_prefill_tokens > 0) prefill.push_back(s.n_prefill_tokens);
    };
    Harness h(o);
    std::vector<RequestId> ids;
    for (TokenId t = 1; t <= 4; ++t) ids.push_back(h.submit({t, 2, 3, 4, 5, 6}, greedy(3)));
    h.engine.run_until_idle();
    const std::vector<int64_t> want = chunk > 0 ? std::vector<int64_t>{8, 8, 8} : std::vector<int64_t>{24};
    EXPECT_EQ(prefill, want) << "chunk " << chunk;
    for (size_t i = 0; i < ids.size(); ++i)
      EXPECT_EQ(h.results.at(ids[i]).ids, alone({static_cast<TokenId>(i + 1), 2, 3, 4, 5, 6}, greedy(3)));
  }
}

TEST(Scheduler, KvExhaustionWaitsAndPreemptionKeepsOutputs) {
  EngineOptions o;
  o.max_total_tokens = 96;  // 12 blocks of 8: a few 40 + 24 token requests at most
  o.page_size = 8;
  o.max_running_requests = 8;
  bool saw_waiting_with_free_slot = false;
  o.step_observer = [&](const StepInfo& s) {
    EXPECT_LE(s.kv_used_tokens, 96);
    if (s.n_waiting > 0 && s.n_running < 8) saw_waiting_with_free_slot = true;
  };
  // Random mixed lengths: whether a given draw preempts depends on the draw, so only the outputs and
  // the waiting are asserted here; the fixed case below must preempt.
  expect_same_as_alone(o, testing::test_seed() + 2, 12);
  EXPECT_TRUE(saw_waiting_with_free_slot) << "KV never ran out";
}

// 4 blocks of 8 tokens. Three requests of prompt 8 + 16 new tokens (24 = 3 blocks each) are all
// admitted (1 block each: schedule_conservativeness 0 keeps no room for their growth) but cannot all grow: someone
// must be preempted, and recomputed later. Every output equals the request sent alone; returns the engine's stats
// afterwards.
EngineStats expect_growth_preemption_keeps_outputs(EngineOptions o) {
  o.schedule_conservativeness = 0;
  o.max_total_tokens = 32;
  o.page_size = 8;
  o.max_running_requests = 3;
  Harness h(o);
  const std::vector<std::vector<TokenId>> prompts = {
      {1, 2, 3, 4, 5, 6, 7, 8}, {9, 8, 7, 6, 5, 4, 3, 2}, {3, 1, 4, 1, 5, 9, 2, 6}};
  std::vector<RequestId> ids;
  for (const auto& p : prompts) ids.push_back(h.submit(p, greedy(16)));
  h.engine.run_until_idle();
  for (size_t i = 0; i < prompts.size(); ++i) {
    const Collected& got = h.results.at(ids[i]);
    EXPECT_TRUE(got.finish.has_value()) << "request " << i << " never finished";
    EXPECT_EQ(got.ids, alone(prompts[i], greedy(16))) << "request " << i;
  }
  const EngineStats st = h.engine.stats();
  EXPECT_GT(st.preemptions_total, 0u) << "no request was preempted";
  return st;
}

TEST(Scheduler, GrowthPastCapacityPreemptsAndKeepsOutputs) {
  EXPECT_EQ(expect_growth_preemption_keeps_outputs(EngineOptions{}).kv_used_tokens, 0);
}

// SGLang's new_token_ratio (schedule_conservativeness 1, the default): admission keeps room for the running
// requests' remaining max_new_tokens x the ratio, so the case above admits the next request only when its growth
// fits too: no preemption, the same outputs, fewer tokens forwarded (no recompute). The ratio starts at 0.7, decays
// over decode steps, and a preemption (conservativeness 0.1: too little kept) raises it from the requests' progress.
TEST(Scheduler, AdmissionKeepsRoomForRunningRequestsGrowth) {
  auto run = [](double conservativeness, EngineStats* st, double* max_ratio = nullptr) {
    EngineOptions o;
    o.schedule_conservativeness = conservativeness;
    o.max_total_tokens = 32;
    o.page_size = 8;
    o.max_running_requests = 3;
    Harness h(o);
    EXPECT_DOUBLE_EQ(h.engine.stats().new_token_ratio, std::min(0.7 * conservativeness, 1.0));
    const std::vector<std::vector<TokenId>> prompts = {
        {1, 2, 3, 4, 5, 6, 7, 8}, {9, 8, 7, 6, 5, 4, 3, 2}, {3, 1, 4, 1, 5, 9, 2, 6}};
    std::vector<RequestId> ids;
    for (const auto& p : prompts) ids.push_back(h.submit(p, greedy(16)));
    while (h.engine.step()) {
      if (max_ratio) *max_ratio = std::max(*max_ratio, h.engine.stats().new_token_ratio);
    }
    for (size_t i = 0; i < prompts.size(); ++i) EXPECT_EQ(h.results.at(ids[i]).ids, alone(prompts[i], greedy(16)));
    *st = h.engine.stats();
  };
  EngineStats careful, none, low;
  run(1.0, &careful);
  run(0.0, &none);
  EXPECT_EQ(careful.preemptions_total, 0u);
  EXPECT_GT(none.preemptions_total, 0u);
  EXPECT_LT(careful.forward_tokens_total, none.forward_tokens_total) << "no prompt recomputed";
  EXPECT_LT(careful.new_token_ratio, 0.7) << "decayed over the decode steps";
  EXPECT_DOUBLE_EQ(none.new_token_ratio, 0.0);
  double low_max = 0.0;
  run(0.1, &low, &low_max);  // 0.07 keeps ~1 token a request: they are admitted together and one is preempted
  EXPECT_GT(low.preemptions_total, 0u);
  EXPECT_GT(low_max, 0.07) << "raised by the preemption";
  EngineOptions bad;
  bad.schedule_conservativeness = -1;
  EXPECT_THROW(bad.validate(), Error);
}

// ---- prefix cache (engine/prefix_cache.h; the cache alone: test_prefix_cache.cpp) ----

int64_t forwarded_tokens(ScriptedModel& m) {
  int64_t n = 0;
  for (const auto& c : m.calls) n += c.n_tokens;
  m.calls.clear();
  return n;
}

// The same prompt again forwards only what its whole cached pages do not hold; a follow-up turn
// (prompt + reply + more) reuses the reply's pages too; outputs equal those without a cache (the
// scripted logits depend on the whole history, so a wrong copied prefix would show); usage and the
// stats count the cached tokens; blocks held by the cache are not the requests'; a flush empties it.
TEST(Scheduler, PrefixCacheSkipsCachedPagesAndKeepsOutputs) {
  EngineOptions o;  // page_size 16, prefix cache on
  auto owned = std::make_unique<ScriptedModel>();
  ScriptedModel& m = *owned;
  Harness h(o, std::move(owned));
  ASSERT_TRUE(h.engine.prefix_cache_enabled());
  EngineOptions off;
  off.enable_prefix_cache = false;
  auto without_cache = [&](const std::vector<TokenId>& prompt) {
    Harness h0(off);
    EXPECT_FALSE(h0.engine.prefix_cache_enabled());
    const RequestId id = h0.submit(prompt, greedy(30));
    h0.engine.run_until_idle();
    return h0.results.at(id).ids;
  };
  std::mt19937_64 rng(testing::test_seed() + 40);
  const std::vector<TokenId> prompt = random_prompt(rng, 40);

  const RequestId a = h.submit(prompt, greedy(30));
  h.engine.run_until_idle();
  EXPECT_EQ(forwarded_tokens(m), 40 + 29);
  EXPECT_EQ(h.results.at(a).finish->usage.cached_tokens, 0);
  EXPECT_EQ(h.engine.stats().prefix_cache_tokens, 64) << "69 tokens forwarded: 4 whole pages kept";
  EXPECT_EQ(h.engine.stats().kv_used_tokens, 0);

  const RequestId b = h.submit(prompt, greedy(30));
  h.engine.run_until_idle();
  EXPECT_EQ(forwarded_tokens(m), 40 - 32 + 29) << "the prompt's 2 whole pages came from the cache";
  EXPECT_EQ(h.results.at(b).finish->usage.cached_tokens, 32);
  EXPECT_EQ(h.results.at(b).ids, h.results.at(a).ids);
  EXPECT_EQ(h.results.at(a).ids, without_cache(prompt));

  std::vector<TokenId> turn2 = prompt;
  turn2.insert(turn2.end(), h.results.at(a).ids.begin(), h.results.at(a).ids.end());
  for (int i = 0; i < 10; ++i) turn2.push_back(static_cast<TokenId>(rng() % 256));  // 80 tokens
  const RequestId c = h.submit(turn2, greedy(30));
  h.engine.run_until_idle();
  EXPECT_EQ(forwarded_tokens(m), 80 - 64 + 29) << "prompt + 24 of the reply's tokens came from the cache";
  EXPECT_EQ(h.results.at(c).finish->usage.cached_tokens, 64);
  EXPECT_EQ(h.results.at(c).ids, without_cache(turn2));

  const EngineStats st = h.engine.stats();
  EXPECT_EQ(st.prefix_cache_queries_total, 40u + 40u + 80u);
  EXPECT_EQ(st.prefix_cache_hits_total, 32u + 64u);
  EXPECT_EQ(st.prefix_cache_tokens, 96) << "turn 2's 109 tokens (6 pages) replaced the entry it extends";
  EXPECT_EQ(st.kv_used_tokens, 0);
  EXPECT_TRUE(h.engine.flush_prefix_cache().flushed);
  EXPECT_FALSE(h.engine.step()) << "nothing to run";
  EXPECT_EQ(h.engine.stats().prefix_cache_tokens, 0);
  const RequestId d = h.submit(prompt, greedy(30));
  // With a request waiting (then running) the cache is kept: SGLang's refusal, with the counts.
  Engine::FlushResult busy = h.engine.flush_prefix_cache();
  EXPECT_FALSE(busy.flushed);
  EXPECT_EQ(busy.n_waiting, 1);
  h.engine.step();
  busy = h.engine.flush_prefix_cache();
  EXPECT_FALSE(busy.flushed);
  EXPECT_EQ(busy.n_running, 1);
  EXPECT_EQ(busy.n_waiting, 0);
  h.engine.run_until_idle();
  EXPECT_EQ(h.results.at(d).finish->usage.cached_tokens, 0) << "flushed";
  EXPECT_EQ(h.results.at(d).ids, h.results.at(a).ids);
}

// A completed prefill is cached at once (SGLang's cache_unfinished_req): a request with the same prompt
// that arrives while the first still decodes finds its whole pages; both outputs equal.
TEST(Scheduler, PrefixCacheHoldsAPrefillWhileItsRequestDecodes) {
  EngineOptions o;
  auto owned = std::make_unique<ScriptedModel>();
  ScriptedModel& m = *owned;
  Harness h(o, std::move(owned));
  std::mt19937_64 rng(testing::test_seed() + 43);
  const std::vector<TokenId> prompt = random_prompt(rng, 40);
  const RequestId a = h.submit(prompt, greedy(30));
  ASSERT_TRUE(h.engine.step());  // a's prefill
  EXPECT_EQ(h.engine.stats().prefix_cache_tokens, 32);
  forwarded_tokens(m);
  const RequestId b = h.submit(prompt, greedy(30));
  ASSERT_TRUE(h.engine.step());  // a decodes, b prefills what the cache lacks
  EXPECT_EQ(forwarded_tokens(m), 1 + (40 - 32));
  h.engine.run_until_idle();
  EXPECT_EQ(h.results.at(b).finish->usage.cached_tokens, 32);
  EXPECT_EQ(h.results.at(b).ids, h.results.at(a).ids);
  EXPECT_EQ(h.engine.stats().kv_used_tokens, 0);
  EXPECT_EQ(h.engine.stats().prefix_cache_tokens, 64) << "a's and b's finished states: one entry of 4 pages";
}

// A group's choices of one prompt (n > 1) prefill it once: the others wait for the first's prefill and take its
// whole pages from the cache (SGLang prefills such a prompt before its n samples); a choice of another prompt in
// the group takes none. Outputs equal each alone; cache_hit_rate is the last admitting step's (SGLang's gauge).
TEST(Scheduler, GroupChoicesOfOnePromptPrefillItOnce) {
  EngineOptions o;  // page_size 16, prefix cache on
  auto owned = std::make_unique<ScriptedModel>();
  ScriptedModel& m = *owned;
  Harness h(o, std::move(owned));
  std::mt19937_64 rng(testing::test_seed() + 44);
  const std::vector<TokenId> prompt = random_prompt(rng, 40), other = random_prompt(rng, 40);
  std::map<RequestId, std::vector<TokenId>> ids;
  std::vector<Engine::Submission> g;
  for (const auto* p : {&prompt, &prompt, &other, &prompt}) {
    g.push_back({{*p, greedy(5)}, [&ids](const RequestOutput& out) {
                   for (const auto& t : out.tokens) ids[out.id].push_back(t.id);
                 }});
  }
  const GroupSubmitResult r = h.engine.submit_group(std::move(g));
  ASSERT_TRUE(r.ok());
  ASSERT_TRUE(h.engine.step());  // the first choice's prefill; choice 2 waits, and the queue behind it (FCFS)
  EXPECT_EQ(forwarded_tokens(m), 40);
  EXPECT_EQ(h.engine.stats().n_running, 1);
  EXPECT_DOUBLE_EQ(h.engine.stats().cache_hit_rate, 0.0);
  ASSERT_TRUE(h.engine.step());  // it decodes; choices 2 and 4 prefill past the 2 cached pages, 3 all of its own
  EXPECT_EQ(forwarded_tokens(m), 1 + (40 - 32) + 40 + (40 - 32));
  EXPECT_DOUBLE_EQ(h.engine.stats().cache_hit_rate, 64.0 / 120.0);
  h.engine.run_until_idle();
  EXPECT_EQ(h.engine.stats().prefix_cache_hits_total, 64u);
  EXPECT_EQ(ids.at(r.ids[0]), alone(prompt, greedy(5)));
  EXPECT_EQ(ids.at(r.ids[1]), ids.at(r.ids[0]));
  EXPECT_EQ(ids.at(r.ids[3]), ids.at(r.ids[0]));
  EXPECT_EQ(ids.at(r.ids[2]), alone(other, greedy(5)));
  // A prompt of one page or less has nothing to share: its choices prefill together.
  std::vector<Engine::Submission> small;
  for (int i = 0; i < 3; ++i) small.push_back({{{1, 2, 3}, greedy(2)}, nullptr});
  ASSERT_TRUE(h.engine.submit_group(std::move(small)).ok());
  forwarded_tokens(m);
  ASSERT_TRUE(h.engine.step());
  EXPECT_EQ(forwarded_tokens(m), 3 * 3);
  h.engine.run_until_idle();
}

// No hit: with the cache off, for a model whose states cannot be copied, and for a request that
// computes prompt logprobs (every prompt position must be forwarded).
TEST(Scheduler, PrefixCacheOffUncopyableOrPromptLogprobsForwardEverything) {
  std::mt19937_64 rng(testing::test_seed() + 41);
  const std::vector<TokenId> prompt = random_prompt(rng, 40);
  auto run_twice = [&](EngineOptions o, bool copyable, int64_t prompt_logprobs) {
    auto owned = std::make_unique<ScriptedModel>();
    ScriptedModel& m = *owned;
    m.states_copyable = copyable;
    Harness h(o, std::move(owned));
    SamplingParams sp = greedy(4);
    h.submit(prompt, greedy(4));
    h.engine.run_until_idle();
    forwarded_tokens(m);
    sp.prompt_logprobs = prompt_logprobs;
    const RequestId id = h.submit(prompt, sp);
    h.engine.run_until_idle();
    return std::make_tuple(forwarded_tokens(m), h.results.at(id).finish->usage.cached_tokens,
                           h.engine.prefix_cache_enabled());
  };
  EngineOptions off;
  off.enable_prefix_cache = false;
  using R = std::tuple<int64_t, int64_t, bool>;  // forwarded, cached, cache on
  EXPECT_EQ(run_twice(off, true, -1), R(43, 0, false));
  EXPECT_EQ(run_twice(EngineOptions{}, false, -1), R(43, 0, false));
  EXPECT_EQ(run_twice(EngineOptions{}, true, 2), R(43, 0, true));
  EXPECT_EQ(run_twice(EngineOptions{}, true, -1), R(40 - 32 + 3, 32, true)) << "the control";
}

// The cache only uses blocks nothing else wants: 4 blocks of 16; a cached entry of 2 blocks is
// evicted for a request that needs all 4, which runs at once and equals its output alone.
TEST(Scheduler, PrefixCacheGivesItsBlocksToRequests) {
  EngineOptions o;
  o.max_total_tokens = 64;
  std::vector<StepInfo> steps;
  o.step_observer = [&](const StepInfo& s) { steps.push_back(s); };
  Harness h(o);
  std::mt19937_64 rng(testing::test_seed() + 42);
  h.submit(random_prompt(rng, 40), greedy(8));
  h.engine.run_until_idle();
  EXPECT_EQ(h.engine.stats().prefix_cache_tokens, 32);
  const std::vector<TokenId> big = random_prompt(rng, 50);
  steps.clear();
  const RequestId id = h.submit(big, greedy(8));
  ASSERT_TRUE(h.engine.step());
  EXPECT_EQ(steps.at(0).n_prefill_requests, 1) << "admitted at once: the cache gave way";
  h.engine.run_until_idle();
  EXPECT_EQ(h.results.at(id).ids, alone(big, greedy(8)));
  EXPECT_EQ(h.engine.stats().prefix_cache_tokens, 48) << "its own 57 forwarded tokens: 3 pages";
  EXPECT_EQ(h.engine.stats().preemptions_total, 0u);
}

// A hit whose entry holds the blocks its request needs (4 blocks: an entry of 2 pinned + 3 needed) is
// dropped rather than waited for forever (it used to wait with nothing running: a livelock); the output
// equals the request's alone.
TEST(Scheduler, PrefixCacheNeverStarvesAHit) {
  EngineOptions o;
  o.max_total_tokens = 64;
  Harness h(o);
  std::mt19937_64 rng(testing::test_seed() + 44);
  const std::vector<TokenId> prompt = random_prompt(rng, 40);
  h.submit(prompt, greedy(8));
  h.engine.run_until_idle();
  ASSERT_EQ(h.engine.stats().prefix_cache_tokens, 32);
  const RequestId big = h.submit(prompt, greedy(20));  // 41 tokens to admit: 3 blocks, 2 free
  h.engine.run_until_idle();
  ASSERT_TRUE(h.results.at(big).finish) << "admitted without its hit";
  EXPECT_EQ(h.results.at(big).finish->usage.cached_tokens, 0);
  EXPECT_EQ(h.results.at(big).ids, alone(prompt, greedy(20)));
}

// SchedulePolicy::kPriority: one slot, four requests queued before the first step are served by
// priority (lower first), arrival order within a priority; the KV-bound preemption takes the request
// of the largest priority value even when it is the older one (kFcfs takes the newer); outputs are
// those of each request alone; a priority under kFcfs is refused naming the policy.
TEST(Scheduler, PriorityPolicyOrdersAdmissionAndPreemption) {
  EngineOptions o;
  o.schedule_policy = SchedulePolicy::kPriority;
  o.max_running_requests = 1;
  Harness h(o);
  std::vector<RequestId> order;
  const std::vector<int64_t> priorities = {5, 0, 5, -1};
  std::vector<RequestId> ids;
  for (size_t i = 0; i < priorities.size(); ++i) {
    ids.push_back(h.submit({static_cast<TokenId>(10 + i), 2, 3}, greedy(3), priorities[i]));
  }
  while (h.engine.step()) {
    for (RequestId id : ids) {
      const auto it = h.results.find(id);
      if (it != h.results.end() && !it->second.ids.empty() && std::find(order.begin(), order.end(), id) == order.end())
        order.push_back(id);
    }
  }
  EXPECT_EQ(order, (std::vector<RequestId>{ids[3], ids[1], ids[0], ids[2]}));
  // SGLang's order (--enable-priority-scheduling): higher values first, arrival order within a priority.
  {
    EngineOptions sg = o;
    sg.priority_low_first = false;
    Harness hs(sg);
    std::vector<RequestId> sids, sorder;
    for (size_t i = 0; i < priorities.size(); ++i)
      sids.push_back(hs.submit({static_cast<TokenId>(10 + i), 2, 3}, greedy(3), priorities[i]));
    while (hs.engine.step()) {
      for (RequestId id : sids) {
        const auto it = hs.results.find(id);
        if (it != hs.results.end() && !it->second.ids.empty() &&
            std::find(sorder.begin(), sorder.end(), id) == sorder.end())
          sorder.push_back(id);
      }
    }
    EXPECT_EQ(sorder, (std::vector<RequestId>{sids[0], sids[2], sids[1], sids[3]}));
  }

  for (SchedulePolicy policy : {SchedulePolicy::kFcfs, SchedulePolicy::kPriority}) {
    SCOPED_TRACE(to_string(policy));
    EngineOptions k;
    k.schedule_policy = policy;
    k.schedule_conservativeness = 0;  // both admitted: growth comes from preempting
    k.max_total_tokens = 32;          // 4 blocks of 8: two 7-token prompts + 16 new tokens cannot both grow
    k.page_size = 8;
    Harness hk(k);
    const std::vector<TokenId> pa = {1, 2, 3, 4, 5, 6, 7}, pb = {7, 6, 5, 4, 3, 2, 1};
    const bool prio = policy == SchedulePolicy::kPriority;
    const RequestId a = hk.submit(pa, greedy(16), prio ? 5 : 0), b = hk.submit(pb, greedy(16), 0);
    hk.engine.run_until_idle();
    ASSERT_TRUE(hk.results.at(a).finish && hk.results.at(b).finish);
    EXPECT_EQ(hk.results.at(a).finish->n_preemptions > 0, prio) << "the older, lower-priority request";
    EXPECT_EQ(hk.results.at(b).finish->n_preemptions > 0, !prio) << "the newer request";
    EXPECT_EQ(hk.results.at(a).ids, alone(pa, greedy(16)));
    EXPECT_EQ(hk.results.at(b).ids, alone(pb, greedy(16)));
  }

  Harness fcfs(EngineOptions{});
  const SubmitResult r = fcfs.engine.submit({{1, 2}, greedy(2), 3}, {});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.rejection->kind, RejectKind::kBadParam);
  EXPECT_NE(r.rejection->message.find("priority 3 needs the priority schedule policy"), std::string::npos)
      << r.rejection->message;
  EXPECT_EQ(parse_schedule_policy("priority"), SchedulePolicy::kPriority);
  EXPECT_THROW(parse_schedule_policy("lpm"), Error);
}

// SGLang's priority preemption (EngineOptions::priority_scheduling_preemption_threshold): a waiting request that finds
// no slot, or no KV room, preempts the running requests that rank below it by more than the threshold, the worst first;
// a difference of exactly the threshold, a lower priority, or no threshold waits; absent priorities (an int64 extreme)
// compare without overflow; outputs are those of each request alone; bad options are named.
TEST(Scheduler, PriorityPreemptionAdmitsAWaitingRequestOverLowerRunningOnes) {
  struct Case {
    const char* name;
    bool low_first;
    std::optional<int64_t> threshold;
    int64_t running_priority, waiting_priority;
    bool preempts;
  };
  const std::vector<Case> cases = {
      {"SGLang order, difference 11 > 10", false, 10, 0, 11, true},
      {"SGLang order, difference 10 is not > 10", false, 10, 0, 10, false},
      {"SGLang order, lower waiting", false, 10, 20, 0, false},
      {"vLLM order, threshold 0", true, 0, 3, 2, true},
      {"vLLM order, equal priorities", true, 0, 3, 3, false},
      {"no threshold", false, std::nullopt, 0, 100, false},
      {"SGLang's absent priority running (int64 min)", false, 10, std::numeric_limits<int64_t>::min(), 0, true},
      {"absent priority waiting (int64 max, low first)", true, 10, 0, std::numeric_limits<int64_t>::max(), false},
  };
  const std::vector<TokenId> p_run = {1, 2, 3, 4, 5}, p_wait = {9, 8, 7};
  for (bool by_kv : {false, true}) {
    for (const Case& c : cases) {
      SCOPED_TRACE(std::string(c.name) + (by_kv ? ", KV room" : ", slots"));
      EngineOptions o;
      o.schedule_policy = SchedulePolicy::kPriority;
      o.priority_low_first = c.low_first;
      o.priority_scheduling_preemption_threshold = c.threshold;
      if (by_kv) {
        o.max_running_requests = 4;
        o.page_size = 4;
        o.max_total_tokens = 28;  // 7 blocks of 4: the running request's tokens and future ones leave no room
      } else {
        o.max_running_requests = 1;
      }
      int64_t kv_preempted = 0, priority_preempted = 0;
      o.step_observer = [&](const StepInfo& info) {
        kv_preempted += info.n_preempted;
        priority_preempted += info.n_priority_preempted;
      };
      Harness h(o);
      const RequestId run = h.submit(p_run, greedy(20), c.running_priority);
      for (int i = 0; i < 3; ++i) ASSERT_TRUE(h.engine.step());
      ASSERT_EQ(h.results.at(run).ids.size(), 3u);
      const RequestId wait = h.submit(p_wait, greedy(8), c.waiting_priority);
      ASSERT_TRUE(h.engine.step());
      EXPECT_EQ(h.results.count(wait) > 0 && !h.results.at(wait).ids.empty(), c.preempts)
          << "the waiting request's first token in the step it arrived";
      h.engine.run_until_idle();
      ASSERT_TRUE(h.results.at(run).finish && h.results.at(wait).finish);
      EXPECT_EQ(h.results.at(run).finish->n_preemptions, c.preempts ? 1 : 0);
      EXPECT_EQ(h.results.at(wait).finish->n_preemptions, 0);
      EXPECT_EQ(priority_preempted, c.preempts ? 1 : 0);
      EXPECT_EQ(kv_preempted, 0) << "no KV retraction";
      EXPECT_EQ(h.results.at(run).ids, alone(p_run, greedy(20)));
      EXPECT_EQ(h.results.at(wait).ids, alone(p_wait, greedy(8)));
    }
  }

  // Two running requests, one slot needed: the worst goes (the lower priority even if older; among equal
  // priorities the newer); the other keeps running.
  for (const auto& [older_priority, newer_priority] : {std::pair<int64_t, int64_t>{0, 5}, {0, 0}, {5, 0}}) {
    SCOPED_TRACE("older " + std::to_string(older_priority) + ", newer " + std::to_string(newer_priority));
    EngineOptions o;
    o.schedule_policy = SchedulePolicy::kPriority;
    o.priority_low_first = false;
    o.priority_scheduling_preemption_threshold = 10;
    o.max_running_requests = 2;
    Harness h(o);
    const RequestId older = h.submit({1, 2, 3}, greedy(12), older_priority);
    const RequestId newer = h.submit({4, 5, 6}, greedy(12), newer_priority);
    for (int i = 0; i < 2; ++i) ASSERT_TRUE(h.engine.step());
    const RequestId top = h.submit({7, 8}, greedy(4), 20);
    h.engine.run_until_idle();
    const bool older_goes = older_priority < newer_priority;
    EXPECT_EQ(h.results.at(older).finish->n_preemptions, older_goes ? 1 : 0);
    EXPECT_EQ(h.results.at(newer).finish->n_preemptions, older_goes ? 0 : 1);
    EXPECT_EQ(h.results.at(top).ids, alone({7, 8}, greedy(4)));
    EXPECT_EQ(h.results.at(older).ids, alone({1, 2, 3}, greedy(12)));
    EXPECT_EQ(h.results.at(newer).ids, alone({4, 5, 6}, greedy(12)));
  }

  // The accounting's edges, each with a step observer: `arrive` submits the waiting request before the step
  // looked at.
  struct Seen {
    std::vector<StepInfo> steps;
  };
  auto options = [](Seen& seen) {
    EngineOptions o;
    o.schedule_policy = SchedulePolicy::kPriority;
    o.priority_low_first = false;
    o.priority_scheduling_preemption_threshold = 10;
    o.page_size = 4;
    o.step_observer = [&seen](const StepInfo& i) { seen.steps.push_back(i); };
    return o;
  };
  {
    SCOPED_TRACE("a victim mid-prefill gives its chunk's budget back");
    Seen seen;
    EngineOptions o = options(seen);
    o.max_running_requests = 1;
    o.chunked_prefill_size = 8;
    o.max_prefill_tokens = 8;
    Harness h(o);
    std::vector<TokenId> long_prompt(10);
    for (size_t i = 0; i < long_prompt.size(); ++i) long_prompt[i] = static_cast<TokenId>(30 + i);
    const RequestId v = h.submit(long_prompt, greedy(4), 0);
    ASSERT_TRUE(h.engine.step());  // 8 of its 10 prompt tokens; 2 left for the next step's chunk
    const std::vector<TokenId> p7 = {1, 2, 3, 4, 5, 6, 7};
    const RequestId top = h.submit(p7, greedy(3), 20);
    ASSERT_TRUE(h.engine.step());
    EXPECT_EQ(seen.steps.back().n_priority_preempted, 1);
    EXPECT_EQ(seen.steps.back().n_prefill_tokens, 7) << "the whole 8-token budget, not the 6 the victim left";
    EXPECT_EQ(h.results.at(top).ids.size(), 1u);
    h.engine.run_until_idle();
    EXPECT_EQ(h.results.at(v).ids, alone(long_prompt, greedy(4)));
    EXPECT_EQ(h.results.at(top).ids, alone(p7, greedy(3)));
  }
  {
    SCOPED_TRACE("one victim is enough when its future tokens leave the room with it");
    Seen seen;
    EngineOptions o = options(seen);
    o.max_running_requests = 4;
    o.max_total_tokens = 48;  // 12 blocks of 4
    Harness h(o);
    const RequestId v1 = h.submit({1, 2, 3}, greedy(20), 0), v2 = h.submit({4, 5, 6}, greedy(20), 0);
    for (int i = 0; i < 2; ++i) ASSERT_TRUE(h.engine.step());
    const std::vector<TokenId> p8 = {9, 9, 8, 8, 7, 7, 6, 6};
    const RequestId top = h.submit(p8, greedy(8), 20);
    ASSERT_TRUE(h.engine.step());
    EXPECT_EQ(seen.steps.back().n_priority_preempted, 1);
    EXPECT_EQ(h.results.at(top).ids.size(), 1u);
    h.engine.run_until_idle();
    EXPECT_EQ(h.results.at(v1).finish->n_preemptions, 0);
    EXPECT_EQ(h.results.at(v2).finish->n_preemptions, 1) << "the newer of two equals";
  }
  {
    SCOPED_TRACE("victims that cannot free enough are left running");
    Seen seen;
    EngineOptions o = options(seen);
    o.max_running_requests = 4;
    o.max_total_tokens = 40;  // 10 blocks of 4
    o.schedule_conservativeness = 0;
    Harness h(o);
    std::vector<TokenId> big(20, 5), wants(18, 6);
    const RequestId k = h.submit(big, greedy(3), 20), v = h.submit({1, 2, 3}, greedy(12), 0);
    ASSERT_TRUE(h.engine.step());
    const RequestId top = h.submit(wants, greedy(2), 20);  // 5 blocks; 3 free and the victim's 1
    h.engine.run_until_idle();
    int64_t preempted = 0;
    for (const StepInfo& i : seen.steps) preempted += i.n_priority_preempted;
    EXPECT_EQ(preempted, 0);
    EXPECT_EQ(h.results.at(v).finish->n_preemptions, 0);
    EXPECT_EQ(h.results.at(top).ids, alone(wants, greedy(2)));
    EXPECT_EQ(h.results.at(k).ids, alone(big, greedy(3)));
  }
  {
    SCOPED_TRACE("a victim is not re-admitted in the step that preempted it");
    Seen seen;
    EngineOptions o = options(seen);
    o.max_running_requests = 4;
    o.max_total_tokens = 32;
    o.schedule_conservativeness = 1.5;  // new-token ratio 1
    o.enable_prefix_cache = false;
    Harness h(o);
    const std::vector<TokenId> pv = {1, 11, 12, 13, 14}, ph = {2, 21, 22};
    const RequestId v = h.submit(pv, greedy(4), 0);
    ASSERT_TRUE(h.engine.step());
    const RequestId top = h.submit(ph, greedy(18), 20);
    ASSERT_TRUE(h.engine.step());
    EXPECT_EQ(seen.steps.back().n_priority_preempted, 1);
    EXPECT_EQ(seen.steps.back().n_prefill_requests, 1) << "the victim's prefill waits for the next step";
    h.engine.run_until_idle();
    EXPECT_EQ(h.results.at(v).ids, alone(pv, greedy(4)));
    EXPECT_EQ(h.results.at(top).ids, alone(ph, greedy(18)));
  }
  {
    SCOPED_TRACE("a prefix-cache hit's tokens count in what the victims must free");
    Seen seen;
    EngineOptions o = options(seen);
    o.max_running_requests = 2;
    o.max_total_tokens = 4 * 13;
    o.schedule_conservativeness = 0;
    Harness h(o);
    std::vector<TokenId> prefix(32);
    for (size_t i = 0; i < prefix.size(); ++i) prefix[i] = static_cast<TokenId>(10 + i);
    h.submit(prefix, greedy(1), 20);
    h.engine.run_until_idle();  // the prefix is in the cache
    const RequestId k = h.submit({1, 2, 3}, greedy(20), 20), v = h.submit({4, 5, 6}, greedy(20), 0);
    for (int i = 0; i < 3; ++i) ASSERT_TRUE(h.engine.step());
    std::vector<TokenId> extended = prefix;
    for (int i = 0; i < 14; ++i) extended.push_back(static_cast<TokenId>(100 + i));
    const RequestId top = h.submit(extended, greedy(2), 20);
    ASSERT_TRUE(h.engine.step());
    EXPECT_FALSE(seen.steps.back().n_priority_preempted > 0 && seen.steps.back().n_prefill_requests == 0)
        << "a victim preempted and nobody admitted";
    h.engine.run_until_idle();
    EXPECT_EQ(h.results.at(top).ids, alone(extended, greedy(2)));
    EXPECT_EQ(h.results.at(v).ids, alone({4, 5, 6}, greedy(20)));
    EXPECT_EQ(h.results.at(k).ids, alone({1, 2, 3}, greedy(20)));
  }

  auto refused = [](SchedulePolicy policy, int64_t threshold) {
    EngineOptions bad;
    bad.schedule_policy = policy;
    bad.priority_scheduling_preemption_threshold = threshold;
    try {
      bad.validate();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  EXPECT_NE(refused(SchedulePolicy::kPriority, -1).find("priority_scheduling_preemption_threshold -1 must be >= 0"),
            std::string::npos);
  EXPECT_NE(refused(SchedulePolicy::kFcfs, 10).find("needs the priority schedule policy (this engine runs fcfs)"),
            std::string::npos);
  EXPECT_EQ(refused(SchedulePolicy::kPriority, 0), "accepted");
}

TEST(Scheduler, RejectsTooLongWithBothNumbers) {
  EngineOptions o;
  o.max_total_tokens = 64;
  o.page_size = 16;
  Harness h(o);
  SubmitResult r = h.engine.submit({std::vector<TokenId>(50, 1), greedy(20)}, {});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.rejection->kind, RejectKind::kTooLong);
  EXPECT_NE(r.rejection->message.find("prompt 50 tokens + max_new_tokens 20 = 70 tokens > KV capacity 64"),
            std::string::npos) << r.rejection->message;
  o.max_total_tokens = 4096;
  o.context_length = 60;
  Harness h2(o);
  r = h2.engine.submit({std::vector<TokenId>(50, 1), greedy(20)}, {});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.rejection->message.find("70 tokens > context length 60"), std::string::npos) << r.rejection->message;
  r = h2.engine.submit({{1, 2, 999}, greedy(2)}, {});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.rejection->kind, RejectKind::kBadParam);
  EXPECT_NE(r.rejection->message.find("prompt token 999 at position 2"), std::string::npos) << r.rejection->message;
  SamplingParams bad = greedy(2);
  bad.top_p = 0;
  r = h2.engine.submit({{1}, bad}, {});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.rejection->kind, RejectKind::kBadParam);
  EXPECT_EQ(h2.engine.stats().requests_rejected_total, 3u);  // too long, bad token, bad top_p
}

TEST(Scheduler, QueueFull) {
  EngineOptions o;
  o.max_queued_requests = 2;
  o.max_running_requests = 1;
  Harness h(o);
  h.submit({1, 2}, greedy(3));
  h.submit({1, 2}, greedy(3));
  SubmitResult r = h.engine.submit({{1, 2}, greedy(3)}, {});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.rejection->kind, RejectKind::kQueueFull);
  EXPECT_NE(r.rejection->message.find("2 requests waiting + 1 new > max_queued_requests 2"), std::string::npos)
      << r.rejection->message;
  h.engine.step();  // admits one (max_running_requests 1): the queue has room again
  EXPECT_TRUE(h.engine.submit({{1, 2}, greedy(3)}, {}).ok());
}

// A group (one client request's choices) is admitted whole or not at all: one that does not fit the
// queue's room leaves nothing queued and calls no callback; a bad member names its index.
TEST(Scheduler, SubmitGroupIsAllOrNone) {
  EngineOptions o;
  o.max_queued_requests = 4;
  o.max_running_requests = 1;
  std::atomic<int> finished{0};  // before the engine, whose destructor aborts what is left
  Harness h(o);
  h.submit({1, 2}, greedy(3));
  auto group = [&](size_t n, SamplingParams sp) {
    std::vector<Engine::Submission> g;
    for (size_t i = 0; i < n; ++i) {
      g.push_back({{{1, 2}, sp}, [&finished](const RequestOutput& out) {
                     if (out.finished) ++finished;
                   }});
    }
    return g;
  };
  GroupSubmitResult r = h.engine.submit_group(group(4, greedy(3)));  // 1 waiting + 4 > 4
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.rejection->kind, RejectKind::kQueueFull);
  EXPECT_NE(r.rejection->message.find("1 requests waiting + 4 new"), std::string::npos) << r.rejection->message;
  EXPECT_EQ(h.engine.stats().requests_submitted_total, 1u);
  EXPECT_EQ(h.engine.stats().n_waiting, 1);

  r = h.engine.submit_group(group(5, greedy(3)));  // more than the queue holds: never admissible
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.rejection->kind, RejectKind::kBadParam);
  EXPECT_NE(r.rejection->message.find("5 requests admitted together exceed max_queued_requests 4"), std::string::npos)
      << r.rejection->message;

  std::vector<Engine::Submission> mixed = group(3, greedy(3));
  mixed[2].request.sampling.top_p = 0;
  r = h.engine.submit_group(std::move(mixed));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.rejection->kind, RejectKind::kBadParam);
  EXPECT_EQ(r.rejected_index, 2u);
  // A sampling field's rejection names the field (a server maps it to its API's name) and no source file.
  EXPECT_EQ(r.rejection->field, "top_p");
  EXPECT_EQ(r.rejection->message, "top_p 0 must be in (0, 1]");
  std::vector<Engine::Submission> oov = group(1, greedy(3));
  oov[0].request.sampling.stop_token_ids = {1, 1 << 30};
  r = h.engine.submit_group(std::move(oov));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.rejection->field, "stop_token_ids");
  EXPECT_NE(r.rejection->message.find("stop_token_ids[1] = 1073741824 is outside the model's vocabulary [0, "),
            std::string::npos)
      << r.rejection->message;
  EXPECT_EQ(r.rejection->message.find(".cpp"), std::string::npos) << r.rejection->message;

  r = h.engine.submit_group(group(3, greedy(3)));  // 1 + 3 = 4 fits
  ASSERT_TRUE(r.ok());
  ASSERT_EQ(r.ids.size(), 3u);
  EXPECT_EQ(r.ids[1], r.ids[0] + 1);
  EXPECT_EQ(h.engine.stats().n_waiting, 4);
  h.engine.run_until_idle();
  EXPECT_EQ(finished.load(), 3);  // nothing from the refused groups
  EXPECT_EQ(h.engine.stats().requests_rejected_total, 4u);
}

TEST(Scheduler, AbortFreesBlocks) {
  EngineOptions o;
  o.page_size = 4;
  Harness h(o);
  const RequestId a = h.submit({1, 2, 3, 4, 5, 6, 7, 8, 9}, greedy(50));
  const RequestId b = h.submit({5, 6}, greedy(4));
  h.engine.step();
  h.engine.step();
  EXPECT_GT(h.engine.stats().kv_used_tokens, 0);
  EXPECT_TRUE(h.engine.abort(a));
  h.engine.run_until_idle();
  EXPECT_EQ(h.results.at(a).finish->reason, FinishReason::kAbort);
  EXPECT_EQ(h.results.at(b).finish->reason, FinishReason::kLength);
  EXPECT_EQ(h.engine.stats().kv_used_tokens, 0);
  EXPECT_EQ(h.engine.stats().requests_aborted_total, 1u);
  EXPECT_FALSE(h.engine.abort(a)) << "a finished request cannot be aborted again";
}

TEST(Scheduler, ContinuousDecodeStepsAreGatedByWaitingRequests) {
  EngineOptions o;
  o.num_continuous_decode_steps = 4;
  std::vector<StepInfo> steps;
  struct Harness* harness = nullptr;
  std::optional<RequestId> late;
  o.step_observer = [&](const StepInfo& s) {
    steps.push_back(s);
    // A request arrives during the first continuous run: the run must stop at once.
    if (s.continuous && !late) late = harness->submit({7, 8, 9}, greedy(3));
  };
  Harness h(o);
  harness = &h;
  h.submit({1, 2, 3}, greedy(30));
  ASSERT_TRUE(h.engine.step());  // prefill only: no continuous steps after it
  ASSERT_EQ(steps.size(), 1u);
  EXPECT_EQ(steps[0].n_prefill_requests, 1);
  ASSERT_TRUE(h.engine.step());  // decode, then one continuous step (the late request arrives in it)
  ASSERT_EQ(steps.size(), 3u);
  EXPECT_FALSE(steps[1].continuous);
  EXPECT_TRUE(steps[2].continuous);
  ASSERT_TRUE(late.has_value());
  ASSERT_TRUE(h.engine.step());  // the late request is admitted in the very next step
  ASSERT_EQ(steps.size(), 4u);
  EXPECT_FALSE(steps[3].continuous);
  EXPECT_EQ(steps[3].n_prefill_requests, 1);
  EXPECT_EQ(steps[3].n_decode_requests, 1);
  ASSERT_TRUE(h.engine.step());  // both decoding, nothing waiting: 1 + 3 continuous steps
  ASSERT_EQ(steps.size(), 8u);
  for (size_t i = 5; i < 8; ++i) EXPECT_TRUE(steps[i].continuous) << "step " << i;
  h.engine.run_until_idle();
  EXPECT_EQ(h.results.at(*late).ids, alone({7, 8, 9}, greedy(3)));
  EXPECT_GT(h.engine.stats().continuous_steps_total, 0u);
}

// With N > 1 a request's tokens after its first reach its callback once per continuous run (or with
// its finishing event); a first token is delivered in the step that sampled it. Outputs are unchanged.
TEST(Scheduler, ContinuousRunDeliversOncePerRunFirstTokensAtOnce) {
  struct Event {
    RequestId id;
    int64_t step;  // steps completed before the delivery
    size_t n_tokens;
    bool finished;
  };
  std::vector<Event> events;  // declared before the engine: ~Engine may still call back
  int64_t n_steps = 0;
  EngineOptions o;
  o.num_continuous_decode_steps = 4;
  o.step_observer = [&](const StepInfo&) { ++n_steps; };
  Engine engine(o, std::make_unique<ScriptedModel>(), make_default_tokenizer());
  auto submit = [&](std::vector<TokenId> prompt, int64_t n) {
    SubmitResult r = engine.submit({std::move(prompt), greedy(n)}, [&](const RequestOutput& out) {
      events.push_back({out.id, n_steps, out.tokens.size(), out.finished.has_value()});
    });
    EXPECT_TRUE(r.ok());
    return r.id;
  };
  const RequestId a = submit({1, 2, 3}, 30);
  ASSERT_TRUE(engine.step());  // prefill: a's first token at once
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].step, 0);
  EXPECT_EQ(events[0].n_tokens, 1u);
  ASSERT_TRUE(engine.step());  // 1 + 3 continuous decode steps, delivered together at the end
  EXPECT_EQ(n_steps, 5);
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[1].id, a);
  EXPECT_EQ(events[1].step, 5);
  EXPECT_EQ(events[1].n_tokens, 4u);

  const RequestId b = submit({7, 8, 9}, 3);
  ASSERT_TRUE(engine.step());  // b's prefill with a's decode (step 5): no continuous steps after it
  EXPECT_EQ(n_steps, 6);
  ASSERT_EQ(events.size(), 4u);
  EXPECT_EQ(events[2].id, b);  // b's first token: in step 5 itself
  EXPECT_EQ(events[2].step, 5);
  EXPECT_EQ(events[2].n_tokens, 1u);
  EXPECT_EQ(events[3].id, a);
  EXPECT_EQ(events[3].step, 6);
  EXPECT_EQ(events[3].n_tokens, 1u);
  ASSERT_TRUE(engine.step());  // both decoding: step 6, then continuous steps 7, 8, 9
  EXPECT_EQ(n_steps, 10);
  ASSERT_EQ(events.size(), 6u);
  EXPECT_EQ(events[4].id, b);  // b's tokens of steps 6 and 7 come with its finish in step 7
  EXPECT_EQ(events[4].step, 7);
  EXPECT_EQ(events[4].n_tokens, 2u);
  EXPECT_TRUE(events[4].finished);
  EXPECT_EQ(events[5].id, a);  // a's tokens of steps 6..9 at the end of the run
  EXPECT_EQ(events[5].step, 10);
  EXPECT_EQ(events[5].n_tokens, 4u);
  EXPECT_FALSE(events[5].finished);
  engine.run_until_idle();
  size_t n_a = 0;
  for (const Event& e : events) n_a += e.id == a ? e.n_tokens : 0;
  EXPECT_EQ(n_a, 30u);
  EXPECT_TRUE(events.back().finished);

  // Mixed lengths and seeded sampling: the same outputs as alone.
  EngineOptions mixed;
  mixed.num_continuous_decode_steps = 4;
  expect_same_as_alone(mixed, testing::test_seed(), 24);

  // Preemption during runs (the fixed case of GrowthPastCapacityPreemptsAndKeepsOutputs): tokens
  // held for a preempted request are delivered once, in order.
  EngineOptions tight;
  tight.num_continuous_decode_steps = 4;
  EXPECT_GT(expect_growth_preemption_keeps_outputs(tight).continuous_steps_total, 0u);
}

// --stream-interval N (SGLang's): a request's first token at once, then its tokens in groups of N (the group ending
// at tokens 1 + N, 1 + 2N, ...), the rest with the finishing event; with continuous runs, a run's end delivers only
// once a due token is held. Outputs are unchanged (the same ids as alone).
TEST(Scheduler, StreamIntervalGroupsTokensAfterTheFirst) {
  for (const int64_t continuous : {int64_t{1}, int64_t{3}}) {
    SCOPED_TRACE(::testing::Message() << "num_continuous_decode_steps " << continuous);
    std::vector<std::pair<size_t, bool>> events;  // (tokens, finished); declared before the engine
    EngineOptions o;
    o.stream_interval = 4;
    o.num_continuous_decode_steps = continuous;
    Engine engine(o, std::make_unique<ScriptedModel>(), make_default_tokenizer());
    std::vector<TokenId> ids;
    SubmitResult r = engine.submit({{1, 2, 3}, greedy(11)}, [&](const RequestOutput& out) {
      events.emplace_back(out.tokens.size(), out.finished.has_value());
      for (const GeneratedToken& t : out.tokens) ids.push_back(t.id);
    });
    ASSERT_TRUE(r.ok());
    engine.run_until_idle();
    std::vector<size_t> sizes;
    for (const auto& [n, finished] : events) sizes.push_back(n);
    if (continuous == 1) {
      // Tokens 1 | 2-5 | 6-9 | 10-11 with the finish.
      EXPECT_EQ(sizes, (std::vector<size_t>{1, 4, 4, 2}));
    } else {
      // Runs of up to 3 decode steps: 1 | run 2-4 (no due token: held) | run 5-7 (5 due: 2-7) | run 8-10 (9 due:
      // 8-10) | 11 with the finish.
      EXPECT_EQ(sizes, (std::vector<size_t>{1, 6, 3, 1}));
    }
    ASSERT_FALSE(events.empty());
    EXPECT_TRUE(events.back().second);
    EXPECT_EQ(ids, alone({1, 2, 3}, greedy(11)));
  }
  EngineOptions bad;
  bad.stream_interval = 0;
  EXPECT_THROW(bad.validate(), Error);
}

// A model that spells out a fixed text byte by byte (the default tokenizer: one token per byte).
std::unique_ptr<model::CausalLM> spelling_model(const std::string& text) {
  return std::make_unique<ScriptedModel>(272, [text](std::span<const int32_t> h) {
    // The prompt is one token; position p of the output spells text[p].
    const size_t p = h.size() - 1;
    return p < text.size() ? static_cast<int32_t>(static_cast<uint8_t>(text[p])) : 256;  // then <|endoftext|>
  });
}

TEST(Scheduler, StopStringsAcrossTokens) {
  Harness h(EngineOptions{}, spelling_model("Hello wor<ld> and more"));
  SamplingParams sp = greedy(40);
  sp.stop = {"<ld>", "zzz", "or<x"};
  const RequestId id = h.submit({65}, sp);
  h.engine.run_until_idle();
  const Collected& c = h.results.at(id);
  EXPECT_EQ(c.text, "Hello wor");
  EXPECT_EQ(c.finish->reason, FinishReason::kStop);
  EXPECT_EQ(c.finish->matched_stop_str, "<ld>");
  EXPECT_EQ(c.ids.size(), 13u);  // the token completing the stop string is counted
  EXPECT_EQ(c.finish->usage.completion_tokens, 13);
  // include_stop_str: the same tokens, the text through the stop string.
  sp.include_stop_str = true;
  const RequestId kept = h.submit({65}, sp);
  h.engine.run_until_idle();
  EXPECT_EQ(h.results.at(kept).text, "Hello wor<ld>");
  EXPECT_EQ(h.results.at(kept).ids.size(), 13u);
}

// A stop token id ends the text before its own text, unless include_stop_str (vLLM's include_stop_str_in_output,
// SGLang's no_stop_trim) keeps it; a special token the detokenizer skips adds nothing either way.
TEST(Scheduler, StopTokenTextKeptOnlyWithIncludeStopStr) {
  Harness h(EngineOptions{}, spelling_model("Hello, world"));
  SamplingParams sp = greedy(40);
  sp.stop_token_ids = {','};
  const RequestId trimmed = h.submit({65}, sp);
  sp.include_stop_str = true;
  const RequestId kept = h.submit({65}, sp);
  h.engine.run_until_idle();
  EXPECT_EQ(h.results.at(trimmed).text, "Hello");
  EXPECT_EQ(h.results.at(kept).text, "Hello,");
  EXPECT_EQ(h.results.at(kept).finish->matched_stop_token, ',');
  EXPECT_EQ(h.results.at(kept).ids, h.results.at(trimmed).ids);
  // "Hi" then <|endoftext|> (256, special, skipped by default) as the stop token: no text for it.
  Harness special(EngineOptions{}, spelling_model("Hi"));
  SamplingParams sq = greedy(40);
  sq.stop_token_ids = {256};
  sq.include_stop_str = true;
  const RequestId id = special.submit({65}, sq);
  special.engine.run_until_idle();
  EXPECT_EQ(special.results.at(id).text, "Hi");
  EXPECT_EQ(special.results.at(id).finish->matched_stop_token, 256);
}

TEST(Scheduler, StopTokenAndUtf8AcrossTokens) {
  // "é" is two bytes, two tokens: streamed text never splits it; 256 (<|endoftext|>) is eos for
  // the default model but the scripted model's eos is 271: stop on 256 through stop_token_ids.
  Harness h(EngineOptions{}, spelling_model("caf\xc3\xa9!"));
  SamplingParams sp = greedy(40);
  sp.stop_token_ids = {256};
  std::vector<std::string> pieces;
  SubmitResult r = h.engine.submit({{65}, sp}, [&](const RequestOutput& out) { pieces.push_back(out.text); });
  ASSERT_TRUE(r.ok());
  h.engine.run_until_idle();
  std::string all;
  for (const auto& p : pieces) {
    all += p;
    EXPECT_NE(p, "\xc3") << "half a character was streamed";
  }
  EXPECT_EQ(all, "caf\xc3\xa9!");
}

TEST(Scheduler, HeldTextIsReleasedWhenTheStopStringDoesNotMatch) {
  Harness h(EngineOptions{}, spelling_model("ab<l"));
  SamplingParams sp = greedy(4);
  sp.stop = {"<ld>"};
  const RequestId id = h.submit({65}, sp);
  h.engine.run_until_idle();
  EXPECT_EQ(h.results.at(id).text, "ab<l");  // held back while it could match, released at the end
  EXPECT_EQ(h.results.at(id).finish->reason, FinishReason::kLength);
}

// A model whose forward fails: wait_warm_up() reports the warm-up's error (serve refuses to start on
// it); a request still submitted finishes with kError and the message, not a hang.
TEST(Scheduler, WarmUpFailureIsReported) {
  auto model = std::make_unique<ScriptedModel>();
  model->fail_with = "layer 0 down_proj: NaN";
  Harness h(EngineOptions{}, std::move(model));
  h.engine.start();
  const std::optional<std::string> failed = h.engine.wait_warm_up();
  ASSERT_TRUE(failed.has_value());
  EXPECT_NE(failed->find("layer 0 down_proj: NaN"), std::string::npos) << *failed;
  const RequestId id = h.submit({1, 2}, greedy(2));
  h.engine.shutdown(/*drain=*/true);
  const Collected& c = h.results.at(id);
  ASSERT_TRUE(c.finish.has_value());
  EXPECT_EQ(c.finish->reason, FinishReason::kError);
  EXPECT_NE(c.finish->error.find("layer 0 down_proj: NaN"), std::string::npos) << c.finish->error;

  Harness ok(EngineOptions{});
  ok.engine.start();
  EXPECT_FALSE(ok.engine.wait_warm_up().has_value());
  EXPECT_TRUE(ok.engine.is_ready());
}

// /flush_cache on the inference thread: refused while a request runs; a flush that times out (no step within the
// timeout) is withdrawn, not done later; once idle it flushes.
TEST(Scheduler, ThreadedFlushIsDecidedAtAStepAndWithdrawnOnTimeout) {
  EngineOptions o;
  o.debug_step_delay_s = 1.0;  // each step sleeps before its forward
  Harness h(o);
  h.engine.start();
  ASSERT_FALSE(h.engine.wait_warm_up().has_value());
  const std::vector<TokenId> prompt(40, 7);
  h.submit(prompt, greedy(2));
  for (int i = 0; i < 500 && h.engine.stats().prefix_cache_tokens == 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  ASSERT_GT(h.engine.stats().prefix_cache_tokens, 0) << "the prefill was not cached";
  // Mid-step: the 10 ms wait ends before the next step can decide.
  const Engine::FlushResult early = h.engine.flush_prefix_cache(std::chrono::milliseconds(10));
  EXPECT_TRUE(early.timed_out);
  EXPECT_FALSE(early.flushed);
  for (int i = 0; i < 500 && h.engine.stats().n_running > 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  std::this_thread::sleep_for(std::chrono::milliseconds(1200));  // a step that would have answered a queued flush
  EXPECT_GT(h.engine.stats().prefix_cache_tokens, 0) << "the withdrawn flush happened";
  const Engine::FlushResult idle = h.engine.flush_prefix_cache();
  EXPECT_TRUE(idle.flushed);
  EXPECT_EQ(h.engine.stats().prefix_cache_tokens, 0);
  h.engine.shutdown(/*drain=*/true);
}

TEST(Scheduler, ThreadedEngineStreamsAndProbes) {
  EngineOptions o;
  o.max_running_requests = 3;
  o.num_continuous_decode_steps = 2;
  Harness h(o);
  h.engine.start();
  for (int i = 0; i < 200 && !h.engine.is_ready(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  ASSERT_TRUE(h.engine.is_ready());
  EXPECT_TRUE(h.engine.run_health_probe(std::chrono::milliseconds(5000)));
  const auto cases = mixed_cases(testing::test_seed() + 5, 10);
  std::vector<RequestId> ids(cases.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < cases.size(); ++i) {
    threads.emplace_back([&, i] { ids[i] = h.submit(cases[i].prompt, cases[i].sp); });
  }
  for (auto& t : threads) t.join();
  h.engine.shutdown(/*drain=*/true);
  for (size_t i = 0; i < cases.size(); ++i) {
    const Collected& c = h.results.at(ids[i]);
    ASSERT_TRUE(c.finish.has_value());
    EXPECT_EQ(c.ids, alone(cases[i].prompt, cases[i].sp)) << "request " << i;
    EXPECT_EQ(c.finish->timings.token_times_s.size(), c.ids.size());
    EXPECT_GE(c.finish->timings.e2e_s, c.finish->timings.ttft_s);
  }
  const EngineStats s = h.engine.stats();
  EXPECT_EQ(s.requests_finished_total, cases.size());  // the probe is not counted (Request::log_metrics)
  EXPECT_EQ(s.ttft_s.count, cases.size());
  ASSERT_EQ(s.moe_layers.size(), 1u);
  EXPECT_EQ(s.expert_tokens[0][0] * 2, s.expert_tokens[0][2]);
  EXPECT_EQ(static_cast<uint64_t>(s.expert_tokens[0][0]), s.forward_tokens_total);
  EXPECT_FALSE(h.engine.submit({{1}, greedy(1)}, {}).ok()) << "accepted after shutdown";
}

TEST(Scheduler, ShutdownWithoutDrainAborts) {
  Harness h(EngineOptions{});
  const RequestId a = h.submit({1, 2, 3}, greedy(100));
  h.engine.step();
  h.engine.shutdown(/*drain=*/false);
  EXPECT_EQ(h.results.at(a).finish->reason, FinishReason::kAbort);
  EXPECT_EQ(h.engine.stats().kv_used_tokens, 0);
}

}  // namespace
}  // namespace fp4moe::engine
