// engine::Sampler: greedy, seeded reproducibility, the support sets of top-k / top-p / min-p, draw
// frequencies against the distribution, penalties and logprobs. Fresh logits from test_seed().
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <numeric>
#include <random>
#include <vector>

#include "core/error.h"
#include "engine/sampler.h"
#include "model/config.h"
#include "testing/testing.h"

namespace fp4moe::engine {
namespace {

std::vector<float> random_logits(int64_t V, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> n(0.0f, 2.0f);
  std::vector<float> z(static_cast<size_t>(V));
  for (float& v : z) v = n(rng);
  return z;
}

std::vector<double> softmax(const std::vector<float>& z, double T) {
  const float mx = *std::max_element(z.begin(), z.end());
  std::vector<double> p(z.size());
  double s = 0;
  for (size_t i = 0; i < z.size(); ++i) s += p[i] = std::exp((static_cast<double>(z[i]) - mx) / T);
  for (double& x : p) x /= s;
  return p;
}

std::vector<int32_t> by_prob(const std::vector<double>& p) {
  std::vector<int32_t> o(p.size());
  std::iota(o.begin(), o.end(), 0);
  std::stable_sort(o.begin(), o.end(), [&](int32_t a, int32_t b) { return p[a] > p[b]; });
  return o;
}

TEST(Sampler, GreedyIsArgmax) {
  const auto z = random_logits(100, testing::test_seed());
  SamplingParams p;
  p.temperature = 0.0;
  Sampler s(p, 100, 1);
  const auto order = by_prob(softmax(z, 1.0));
  for (int i = 0; i < 5; ++i) EXPECT_EQ(s.sample(z.data()).id, order[0]);
}

// generation_config.json's values become the defaults; one out of a request's range is refused naming the file.
TEST(Sampler, SamplingDefaultsFromGenerationConfig) {
  model::GenerationDefaults g;
  g.source = "m/generation_config.json";
  EXPECT_EQ(sampling_defaults_from(g).temperature, 1.0);  // none given: SamplingParams{}
  g.temperature = 0.6;
  g.top_k = 20;
  g.repetition_penalty = 1.05;
  const SamplingParams p = sampling_defaults_from(g);
  EXPECT_EQ(p.temperature, 0.6);
  EXPECT_EQ(p.top_k, 20);
  EXPECT_EQ(p.top_p, 1.0);
  EXPECT_EQ(p.repetition_penalty, 1.05);
  g.temperature = 150;  // a request's bound: the file cannot set what no request may send
  EXPECT_THROW(sampling_defaults_from(g), Error);
  g.temperature = 0.6;
  g.problems = {"m/generation_config.json: field \"top_k\" must be an integer, found 1.5"};
  try {
    sampling_defaults_from(g);
    ADD_FAILURE() << "a mistyped field accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("must be an integer, found 1.5 (--sampling-defaults openai ignores"),
              std::string::npos)
        << e.what();
  }
  g.problems.clear();
  g.min_p = 1.5;
  try {
    sampling_defaults_from(g);
    ADD_FAILURE() << "min_p 1.5 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("m/generation_config.json: min_p 1.5 must be in [0, 1]"), std::string::npos)
        << e.what();
  }
}

TEST(Sampler, SeededDrawsRepeatAndSeedsDiffer) {
  const auto z = random_logits(50, testing::test_seed() + 1);
  SamplingParams p;
  p.temperature = 1.5;
  auto draws = [&](uint64_t seed) {
    Sampler s(p, 50, seed);
    std::vector<int32_t> ids;
    for (int i = 0; i < 64; ++i) ids.push_back(s.sample(z.data()).id);
    return ids;
  };
  EXPECT_EQ(draws(7), draws(7));
  EXPECT_NE(draws(7), draws(8));
}

TEST(Sampler, TopKTopPMinPSupportSets) {
  const int64_t V = 64;
  const auto z = random_logits(V, testing::test_seed() + 2);
  const auto p1 = softmax(z, 1.0);
  const auto order = by_prob(p1);
  auto support = [&](const SamplingParams& p) {
    Sampler s(p, V, 3);
    const auto d = s.distribution(z.data());
    std::vector<int32_t> ids;
    double sum = 0;
    for (int64_t i = 0; i < V; ++i) {
      sum += d[static_cast<size_t>(i)];
      if (d[static_cast<size_t>(i)] > 0) ids.push_back(static_cast<int32_t>(i));
    }
    EXPECT_NEAR(sum, 1.0, 1e-9);
    std::sort(ids.begin(), ids.end());
    return ids;
  };
  auto top_n = [&](size_t n) {
    std::vector<int32_t> ids(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(n));
    std::sort(ids.begin(), ids.end());
    return ids;
  };
  SamplingParams p;
  p.top_k = 5;
  EXPECT_EQ(support(p), top_n(5));
  p = {};
  p.top_p = 0.6;  // smallest prefix by probability whose mass reaches 0.6
  size_t n = 0;
  for (double cum = 0; cum < 0.6 - 1e-12; ++n) cum += p1[static_cast<size_t>(order[n])];
  EXPECT_EQ(support(p), top_n(n));
  p = {};
  p.min_p = 0.2;  // tokens with p >= 0.2 * p_max
  size_t m = 0;
  while (m < order.size() && p1[static_cast<size_t>(order[m])] >= 0.2 * p1[static_cast<size_t>(order[0])]) ++m;
  EXPECT_EQ(support(p), top_n(m));
  // Samples never leave the support.
  p = {};
  p.top_k = 3;
  Sampler s(p, V, testing::test_seed());
  const auto allowed = top_n(3);
  for (int i = 0; i < 500; ++i) {
    const int32_t id = s.sample(z.data()).id;
    EXPECT_TRUE(std::binary_search(allowed.begin(), allowed.end(), id)) << "id " << id;
  }
}

// The definition, with the whole row stably sorted by probability: the sampler sorts only the
// prefix its truncation reads, and must keep the same tokens with the same probabilities.
std::vector<double> full_sort_truncation(const std::vector<float>& z, const SamplingParams& sp) {
  const std::vector<double> p = softmax(z, sp.temperature);
  const std::vector<int32_t> o = by_prob(p);
  size_t keep = p.size();
  if (sp.top_k > 0) keep = std::min(keep, static_cast<size_t>(sp.top_k));
  if (sp.top_p < 1.0) {
    double mass = 0, cum = 0;
    for (size_t i = 0; i < keep; ++i) mass += p[static_cast<size_t>(o[i])];
    size_t n = 0;
    while (n < keep) {
      cum += p[static_cast<size_t>(o[n++])] / mass;
      if (cum >= sp.top_p - 1e-12) break;
    }
    keep = n;
  }
  if (sp.min_p > 0.0) {
    size_t n = 1;
    while (n < keep && p[static_cast<size_t>(o[n])] >= sp.min_p * p[static_cast<size_t>(o[0])]) ++n;
    keep = n;
  }
  std::vector<double> out(p.size(), 0.0);
  double kept = 0;
  for (size_t i = 0; i < keep; ++i) kept += p[static_cast<size_t>(o[i])];
  for (size_t i = 0; i < keep; ++i) out[static_cast<size_t>(o[i])] = p[static_cast<size_t>(o[i])] / kept;
  return out;
}

TEST(Sampler, PrefixSortKeepsTheFullSortsDistribution) {
  std::mt19937_64 rng(testing::test_seed());
  const int64_t top_ks[] = {-1, 1, 3, 40, 700};
  const double top_ps[] = {1.0, 0.97, 0.8, 0.3};
  const double min_ps[] = {0.0, 0.02, 0.4};
  for (int trial = 0; trial < 60; ++trial) {
    const int64_t V = trial % 3 == 0 ? 5000 : 257;
    std::vector<float> z = random_logits(V, rng());
    if (trial % 2 == 1) {  // many exact ties: the boundaries fall inside tied groups
      for (float& v : z) v = std::round(v);
    }
    SamplingParams sp;
    sp.temperature = 0.4 + 0.3 * static_cast<double>(trial % 4);
    sp.top_k = top_ks[rng() % 5];
    sp.top_p = top_ps[rng() % 4];
    sp.min_p = min_ps[rng() % 3];
    if (sp.greedy()) continue;
    const std::vector<double> want = full_sort_truncation(z, sp);
    const std::vector<double> got = Sampler(sp, V, 1).distribution(z.data());
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i) {
      ASSERT_EQ(got[i] > 0.0, want[i] > 0.0) << "trial " << trial << " token " << i << " (top_k " << sp.top_k
                                             << ", top_p " << sp.top_p << ", min_p " << sp.min_p << ")";
      ASSERT_NEAR(got[i], want[i], 1e-12 * std::max(1.0, want[i])) << "trial " << trial << " token " << i;
    }
  }
}

TEST(Sampler, FrequenciesMatchTheDistribution) {
  const int64_t V = 8;
  const auto z = random_logits(V, testing::test_seed() + 3);
  SamplingParams p;
  p.temperature = 0.7;
  p.top_p = 0.9;
  Sampler s(p, V, testing::test_seed());
  const auto want = s.distribution(z.data());
  const int N = 40000;
  std::vector<int> count(static_cast<size_t>(V), 0);
  for (int i = 0; i < N; ++i) ++count[static_cast<size_t>(s.sample(z.data()).id)];
  for (int64_t i = 0; i < V; ++i) {
    const double w = want[static_cast<size_t>(i)];
    const double got = count[static_cast<size_t>(i)] / static_cast<double>(N);
    EXPECT_NEAR(got, w, 5 * std::sqrt(w * (1 - w) / N) + 1e-9) << "token " << i;
  }
}

TEST(Sampler, Penalties) {
  std::vector<float> z = {2.0f, -1.0f, 1.0f, 0.5f};
  SamplingParams p;
  p.temperature = 0.0;
  p.repetition_penalty = 2.0;
  {
    Sampler s(p, 4, 0);
    s.observe_prompt(std::vector<TokenId>{0});
    // Token 0: 2 / 2 = 1.0 ties token 2 (1.0): lowest id wins -> still 0; make it lose with output too.
    EXPECT_EQ(s.sample(z.data()).id, 0);
    p.repetition_penalty = 2.5;  // 2 / 2.5 = 0.8 < 1.0
    Sampler s2(p, 4, 0);
    s2.observe_prompt(std::vector<TokenId>{0});
    EXPECT_EQ(s2.sample(z.data()).id, 2);
  }
  p = {};
  p.temperature = 0.0;
  p.frequency_penalty = 0.6;
  Sampler f(p, 4, 0);
  f.observe_prompt(std::vector<TokenId>{2});  // the prompt does not count for frequency
  EXPECT_EQ(f.sample(z.data()).id, 0);
  f.accept(0);
  EXPECT_EQ(f.sample(z.data()).id, 0);  // 2 - 0.6 = 1.4 > 1
  f.accept(0);
  EXPECT_EQ(f.sample(z.data()).id, 2);  // 2 - 1.2 = 0.8 < 1
  p = {};
  p.temperature = 0.0;
  p.presence_penalty = 1.2;
  Sampler pr(p, 4, 0);
  pr.accept(0);
  EXPECT_EQ(pr.sample(z.data()).id, 2);  // 0.8 < 1
  pr.accept(0);
  EXPECT_EQ(pr.sample(z.data()).id, 2);  // presence counts once
}

TEST(Sampler, Logprobs) {
  const int64_t V = 30;
  const auto z = random_logits(V, testing::test_seed() + 4);
  SamplingParams p;
  p.temperature = 0.0;
  p.logprobs = true;
  p.top_logprobs = 4;
  Sampler s(p, V, 0);
  const SampleResult r = s.sample(z.data());
  const auto lp = softmax(z, 1.0);
  const auto order = by_prob(lp);
  EXPECT_EQ(r.id, order[0]);
  EXPECT_NEAR(r.logprob, std::log(lp[static_cast<size_t>(r.id)]), 1e-5);
  ASSERT_EQ(r.top.size(), 4u);
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(r.top[i].id, order[i]);
    EXPECT_NEAR(r.top[i].logprob, std::log(lp[static_cast<size_t>(order[i])]), 1e-5);
  }
}

// logprobs_of (the prompt logprobs' definition): any token's logprob, ties in the top list by the lower
// id, an id outside the vocabulary named.
TEST(Sampler, LogprobsOfAnyToken) {
  const int64_t V = 30;
  auto z = random_logits(V, testing::test_seed() + 5);
  z[7] = z[21] = 50.0f;  // a tie at the top
  const auto lp = softmax(z, 1.0);
  const SampleResult r = logprobs_of(z.data(), V, 3, 2);
  EXPECT_EQ(r.id, 3);
  EXPECT_NEAR(r.logprob, std::log(lp[3]), 1e-5);
  ASSERT_EQ(r.top.size(), 2u);
  EXPECT_EQ(r.top[0].id, 7);
  EXPECT_EQ(r.top[1].id, 21);
  EXPECT_NEAR(r.top[1].logprob, std::log(lp[21]), 1e-5);
  EXPECT_TRUE(logprobs_of(z.data(), V, 0, 0).top.empty());
  EXPECT_THROW(logprobs_of(z.data(), V, static_cast<TokenId>(V), 0), Error);
}

// logit_bias is added after the penalties: -100 removes the argmax from a greedy draw, +100 forces a
// token, and the sampled distribution moves by exp(bias) for a small bias. It needs the logits (no
// argmax-only step, no device draw).
TEST(Sampler, LogitBias) {
  const auto z = random_logits(100, testing::test_seed());
  const auto order = by_prob(softmax(z, 1.0));
  SamplingParams p;
  p.temperature = 0.0;
  EXPECT_FALSE(p.needs_logits());
  p.logit_bias = {{order[0], -100.0f}};
  EXPECT_TRUE(p.needs_logits());
  EXPECT_EQ(Sampler(p, 100, 1).sample(z.data()).id, order[1]);
  p.logit_bias = {{order[50], 100.0f}};
  EXPECT_EQ(Sampler(p, 100, 1).sample(z.data()).id, order[50]);
  SamplingParams t;
  t.temperature = 1.0;
  EXPECT_TRUE(t.device_samplable());
  t.logit_bias = {{order[3], 1.0f}};
  EXPECT_FALSE(t.device_samplable());
  const std::vector<double> base = Sampler(SamplingParams{}, 100, 1).distribution(z.data());
  const std::vector<double> biased = Sampler(t, 100, 1).distribution(z.data());
  const auto o3 = static_cast<size_t>(order[3]), o4 = static_cast<size_t>(order[4]);
  EXPECT_NEAR(biased[o3] / biased[o4], std::exp(1.0) * base[o3] / base[o4], 1e-6 * base[o3] / base[o4]);
  t.logit_bias = {{100, 1.0f}};
  EXPECT_THROW(t.validate(100), Error);  // outside the vocabulary
  t.logit_bias = {{3, 101.0f}};
  EXPECT_THROW(t.validate(100), Error);  // outside [-100, 100]
}

TEST(Sampler, ValidateNamesTheField) {
  SamplingParams p;
  p.top_p = 1.5;
  try {
    p.validate(10);
    FAIL() << "top_p 1.5 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("top_p 1.5"), std::string::npos) << e.what();
  }
  p = {};
  p.stop_token_ids = {3, 12};
  EXPECT_THROW(p.validate(10), Error);
  p = {};
  p.max_new_tokens = 0;
  EXPECT_THROW(p.validate(10), Error);
  p = {};
  p.prompt_logprobs = 21;
  EXPECT_THROW(p.validate(10), Error);
  p.prompt_logprobs = -2;
  EXPECT_THROW(p.validate(10), Error);
}

}  // namespace
}  // namespace fp4moe::engine
