// The engine on real models: the golden glm5_tiny / glm4_moe_tiny greedy ids through the engine
// (chunked prefill, batching, and preemption by recompute under a tiny KV budget), and the embedded
// default model + byte-level tokenizer (round trip, specials, chat template, batch == alone).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <string>

#include "core/error.h"
#include "engine/chat_template.h"
#include "engine/default_model.h"
#include "engine/engine.h"
#include "format/safetensors.h"
#include "model/registry.h"
#include "testing/testing.h"

namespace fp4moe::engine {
namespace {

struct Outputs {
  std::map<RequestId, std::vector<TokenId>> ids;
  std::map<RequestId, FinishReason> reason;
};

SamplingParams greedy(int64_t n) {
  SamplingParams sp;
  sp.temperature = 0.0;
  sp.max_new_tokens = n;
  sp.ignore_eos = true;
  return sp;
}

std::vector<RequestId> submit_all(Engine& e, Outputs& run, const std::vector<std::vector<TokenId>>& prompts,
                                  const SamplingParams& sp) {
  std::vector<RequestId> ids;
  for (const auto& p : prompts) {
    SubmitResult r = e.submit({p, sp}, [&run](const RequestOutput& out) {
      for (const auto& t : out.tokens) run.ids[out.id].push_back(t.id);
      if (out.finished) run.reason[out.id] = out.finished->reason;
    });
    EXPECT_TRUE(r.ok()) << (r.rejection ? r.rejection->message : "");
    ids.push_back(r.id);
  }
  return ids;
}

class GoldenThroughEngine : public ::testing::TestWithParam<std::string> {};

TEST_P(GoldenThroughEngine, GreedyIdsEqualGolden) {
  const auto dir = testing::shared_path("golden/models/" + GetParam());
  format::SafetensorsFile f(dir / "golden.safetensors");
  const TensorView in = f.view("input_ids"), want = f.view("greedy_ids");
  const int64_t n_seq = in.dim(0), S = in.dim(1), T = want.dim(1);
  std::vector<std::vector<TokenId>> prompts, expected;
  for (int64_t s = 0; s < n_seq; ++s) {
    std::vector<TokenId> p, g;
    for (int64_t i = 0; i < S; ++i) p.push_back(static_cast<TokenId>(in.as<int64_t>()[s * S + i]));
    for (int64_t i = S; i < T; ++i) g.push_back(static_cast<TokenId>(want.as<int64_t>()[s * T + i]));
    prompts.push_back(p);
    expected.push_back(g);
  }
  struct Setup {
    const char* name;
    EngineOptions o;
  };
  std::vector<Setup> setups(3);
  setups[0].name = "batched";
  setups[1].name = "chunked prefill 5, 7 tokens per step";
  setups[1].o.chunked_prefill_size = 5;
  setups[1].o.max_prefill_tokens = 7;
  // Both prompts (16 + 1 tokens = 5 pages each) are admitted, then the KV cannot hold both
  // continuations (24 tokens = 6 pages each): the newer one is preempted and recomputed.
  setups[2].name = "KV for 40 tokens in pages of 4 (preemption)";
  setups[2].o.schedule_conservativeness = 0;  // both admitted: no room kept for their growth
  setups[2].o.max_total_tokens = 40;
  setups[2].o.page_size = 4;
  // The prompts run once, then again from the prefix cache: their whole pages of 4 (S - 1 tokens at
  // most: the last one is forwarded for its logits) are copied from the first run's KV.
  setups.push_back({"prefix cache hits (each prompt twice, pages of 4)", {}});
  setups.back().o.page_size = 4;
  for (const Setup& su : setups) {
    SCOPED_TRACE(su.name);
    model::LoadOptions lo;
    lo.progress = false;
    Engine e(su.o, model::load_model(dir, lo), nullptr);
    Outputs run;
    const bool twice = su.o.page_size == 4 && su.o.max_total_tokens != 40;
    if (twice) {
      submit_all(e, run, prompts, greedy(T - S));
      e.run_until_idle();
    }
    const auto ids = submit_all(e, run, prompts, greedy(T - S));
    e.run_until_idle();
    if (twice) {
      EXPECT_EQ(e.stats().prefix_cache_hits_total, static_cast<uint64_t>(n_seq * ((S - 1) / 4 * 4)));
    }
    for (int64_t s = 0; s < n_seq; ++s) {
      EXPECT_EQ(run.ids[ids[static_cast<size_t>(s)]], expected[static_cast<size_t>(s)]) << "sequence " << s;
      EXPECT_EQ(run.reason[ids[static_cast<size_t>(s)]], FinishReason::kLength);
    }
    const EngineStats st = e.stats();
    if (su.o.max_total_tokens == 40) {
      EXPECT_GT(st.preemptions_total, 0u);
    }
    EXPECT_EQ(st.kv_used_tokens, 0);
    EXPECT_FALSE(st.moe_layers.empty());
    int64_t routed = 0;
    for (int64_t c : st.expert_tokens[0]) routed += c;
    EXPECT_EQ(routed, static_cast<int64_t>(st.forward_tokens_total) * e.model_config().num_experts_per_tok);
  }
}

// Prompt logprobs (SamplingParams::prompt_logprobs) against log_softmax of the model's own all-position
// logits (CausalLM::forward_one, computed here in double): whole, chunked and through a preemption
// (the recompute must not report them again); only the first event carries them, the generated ids
// are those of the same request without them.
TEST_P(GoldenThroughEngine, PromptLogprobsMatchTheModelsLogits) {
  const auto dir = testing::shared_path("golden/models/" + GetParam());
  format::SafetensorsFile f(dir / "golden.safetensors");
  const TensorView in = f.view("input_ids");
  const int64_t n_seq = in.dim(0), S = in.dim(1);
  std::vector<std::vector<TokenId>> prompts;
  for (int64_t s = 0; s < n_seq; ++s) {
    std::vector<TokenId> p;
    for (int64_t i = 0; i < S; ++i) p.push_back(static_cast<TokenId>(in.as<int64_t>()[s * S + i]));
    prompts.push_back(p);
  }
  model::LoadOptions lo;
  lo.progress = false;
  constexpr int64_t kTop = 3;
  // The reference: [prompt position t >= 1] -> (logprob of prompt[t], the kTop most likely (id, logprob)).
  std::vector<std::vector<std::pair<double, std::vector<std::pair<TokenId, double>>>>> want(prompts.size());
  {
    auto lm = model::load_model(dir, lo);
    const int64_t V = lm->vocab_size();
    for (size_t s = 0; s < prompts.size(); ++s) {
      auto state = lm->new_state();
      const std::vector<float> logits = lm->forward_one(*state, prompts[s], /*all_logits=*/true);
      for (size_t t = 1; t < prompts[s].size(); ++t) {
        const float* z = logits.data() + (t - 1) * static_cast<size_t>(V);
        double mx = z[0], sum = 0.0;
        for (int64_t v = 1; v < V; ++v) mx = std::max(mx, static_cast<double>(z[v]));
        for (int64_t v = 0; v < V; ++v) sum += std::exp(z[v] - mx);
        const double lse = mx + std::log(sum);
        std::vector<std::pair<TokenId, double>> all;
        for (int64_t v = 0; v < V; ++v) all.push_back({static_cast<TokenId>(v), z[v] - lse});
        std::stable_sort(all.begin(), all.end(), [](const auto& a, const auto& b) { return a.second > b.second; });
        all.resize(kTop + 1);  // one past the top: ties at its end are told apart
        want[s].push_back({z[prompts[s][t]] - lse, all});
      }
    }
  }
  std::vector<EngineOptions> setups(4);
  setups[1].chunked_prefill_size = 5;
  setups[1].max_prefill_tokens = 7;
  setups[2].schedule_conservativeness = 0;
  setups[2].max_total_tokens = 40;  // as in GreedyIdsEqualGolden: the newer request is preempted
  setups[2].page_size = 4;
  setups[3] = setups[2];  // and chunked: a preemption can catch the newer request mid-prefill
  setups[3].chunked_prefill_size = 3;
  setups[3].max_prefill_tokens = 3;
  for (size_t k = 0; k < setups.size(); ++k) {
    SCOPED_TRACE("setup " + std::to_string(k));
    std::vector<std::vector<TokenId>> plain_ids(prompts.size());
    {
      Engine e(setups[k], model::load_model(dir, lo), nullptr);
      Outputs run;
      const auto ids = submit_all(e, run, prompts, greedy(8));
      e.run_until_idle();
      for (size_t s = 0; s < prompts.size(); ++s) plain_ids[s] = run.ids[ids[s]];
    }
    Engine e(setups[k], model::load_model(dir, lo), nullptr);
    SamplingParams sp = greedy(8);
    sp.prompt_logprobs = kTop;
    std::map<RequestId, std::vector<GeneratedToken>> got;
    std::map<RequestId, int> events_with;
    std::map<RequestId, std::vector<TokenId>> gen;
    std::vector<RequestId> ids;
    for (const auto& p : prompts) {
      SubmitResult r = e.submit({p, sp}, [&](const RequestOutput& out) {
        for (const auto& t : out.tokens) gen[out.id].push_back(t.id);
        if (out.prompt_logprobs.empty()) return;
        EXPECT_FALSE(out.tokens.empty()) << "prompt logprobs come with the first token";
        ++events_with[out.id];
        got[out.id] = out.prompt_logprobs;
      });
      ASSERT_TRUE(r.ok());
      ids.push_back(r.id);
    }
    e.run_until_idle();
    if (k >= 2) {
      EXPECT_GT(e.stats().preemptions_total, 0u);
    }
    for (size_t s = 0; s < prompts.size(); ++s) {
      SCOPED_TRACE("sequence " + std::to_string(s));
      EXPECT_EQ(events_with[ids[s]], 1);
      EXPECT_EQ(gen[ids[s]], plain_ids[s]);
      const std::vector<GeneratedToken>& lp = got[ids[s]];
      ASSERT_EQ(lp.size(), prompts[s].size());
      EXPECT_EQ(lp[0].id, prompts[s][0]);
      EXPECT_TRUE(std::isnan(lp[0].logprob));
      EXPECT_TRUE(lp[0].top_logprobs.empty());
      for (size_t t = 1; t < lp.size(); ++t) {
        EXPECT_EQ(lp[t].id, prompts[s][t]);
        EXPECT_NEAR(lp[t].logprob, want[s][t - 1].first, 1e-4) << "position " << t;
        ASSERT_EQ(lp[t].top_logprobs.size(), static_cast<size_t>(kTop));
        for (int64_t j = 0; j < kTop; ++j) {
          EXPECT_NEAR(lp[t].top_logprobs[j].logprob, want[s][t - 1].second[j].second, 1e-4);
          // The ids agree unless a neighbour's logprob ties with this one within the tolerance.
          const auto& w = want[s][t - 1].second;
          if ((j == 0 || w[j - 1].second - w[j].second > 1e-3) && w[j].second - w[j + 1].second > 1e-3) {
            EXPECT_EQ(lp[t].top_logprobs[j].id, want[s][t - 1].second[j].first) << "position " << t << " top " << j;
          }
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Models, GoldenThroughEngine, ::testing::Values("glm5_tiny", "glm4_moe_tiny"));

// max_prompt_logits_bytes caps the prefill chunks that compute prompt logprobs (3 rows of the default
// model's 272-entry vocabulary here) and only those; the logprobs are those of the uncapped engine.
TEST(DefaultModel, PromptLogprobChunksStayWithinTheLogitsBudget) {
  auto tok = make_default_tokenizer();
  const std::vector<TokenId> prompt = tok->encode("1 2 3 4 5 6 7 8 9 10");
  ASSERT_GT(prompt.size(), 12u);
  SamplingParams sp = greedy(2);
  sp.prompt_logprobs = 1;
  auto run = [&](int64_t budget_bytes, std::vector<int64_t>* prefill_steps) {
    EngineOptions o;
    o.max_prompt_logits_bytes = budget_bytes;
    o.step_observer = [prefill_steps](const StepInfo& info) {
      if (info.n_prefill_tokens > 0) prefill_steps->push_back(info.n_prefill_tokens);
    };
    Engine e(o, make_default_model(0), tok);
    std::vector<GeneratedToken> lps;
    EXPECT_TRUE(e.submit({prompt, sp}, [&](const RequestOutput& out) {
                   if (!out.prompt_logprobs.empty()) lps = out.prompt_logprobs;
                 }).ok());
    e.run_until_idle();
    return lps;
  };
  std::vector<int64_t> capped_steps, whole_steps;
  const auto capped = run(3 * 272 * 4, &capped_steps);
  const auto whole = run(EngineOptions{}.max_prompt_logits_bytes, &whole_steps);
  EXPECT_EQ(whole_steps, std::vector<int64_t>{static_cast<int64_t>(prompt.size())});
  ASSERT_EQ(capped_steps.size(), (prompt.size() - 1 + 2) / 3) << "chunks of 3, the last prompt token's logits unneeded";
  for (int64_t n : capped_steps) EXPECT_LE(n, 3);
  ASSERT_EQ(capped.size(), prompt.size());
  ASSERT_EQ(whole.size(), prompt.size());
  for (size_t t = 1; t < prompt.size(); ++t) EXPECT_NEAR(capped[t].logprob, whole[t].logprob, 1e-5) << t;
  EngineOptions bad;
  bad.max_prompt_logits_bytes = 0;
  EXPECT_THROW(bad.validate(), Error);
}

// min_new_tokens: the greedy first token made a stop token, or the first character of the greedy text
// made a stop string, ends the request at once; with min_new_tokens 3 neither can before 3 tokens.
TEST(DefaultModel, MinNewTokensHoldsOffStopTokensAndStrings) {
  auto tok = make_default_tokenizer();
  const std::vector<TokenId> prompt = tok->encode("The quick brown fox");
  struct Result {
    std::vector<TokenId> ids;
    std::string text;
    FinishReason reason = FinishReason::kAbort;
  };
  auto run = [&](const SamplingParams& sp) {
    Engine e(EngineOptions{}, make_default_model(0), tok);
    Result r;
    EXPECT_TRUE(e.submit({prompt, sp}, [&](const RequestOutput& out) {
                   for (const auto& t : out.tokens) r.ids.push_back(t.id);
                   r.text += out.text;
                   if (out.finished) r.reason = out.finished->reason;
                 }).ok());
    e.run_until_idle();
    return r;
  };
  SamplingParams sp = greedy(6);
  const Result free_run = run(sp);
  ASSERT_EQ(free_run.ids.size(), 6u);
  ASSERT_FALSE(free_run.text.empty());

  SamplingParams by_id = sp;
  by_id.stop_token_ids = {free_run.ids[0]};
  EXPECT_EQ(run(by_id).ids.size(), 1u);
  by_id.min_new_tokens = 3;
  const Result held = run(by_id);
  ASSERT_GE(held.ids.size(), 3u);
  for (size_t i = 0; i < 3; ++i) EXPECT_NE(held.ids[i], free_run.ids[0]) << "token " << i;

  SamplingParams by_str = sp;
  by_str.stop = {free_run.text.substr(0, 1)};
  const Result cut = run(by_str);
  EXPECT_EQ(cut.reason, FinishReason::kStop);
  EXPECT_EQ(cut.text, "");
  by_str.min_new_tokens = 3;
  const Result kept = run(by_str);
  EXPECT_GE(kept.ids.size(), 3u);
  EXPECT_EQ(kept.ids, std::vector<TokenId>(free_run.ids.begin(), free_run.ids.begin() + kept.ids.size()))
      << "a stop string does not change the tokens";

  SamplingParams bad = sp;
  bad.min_new_tokens = 7;
  EXPECT_THROW(bad.validate(tok->vocab_size()), Error);
}

TEST(DefaultModel, TokenizerIsByteLevelWithSpecials) {
  auto tok = make_default_tokenizer();
  EXPECT_EQ(tok->vocab_size(), 272);
  const std::string text = "h\xc3\xa9llo, <|user|>!";
  const auto ids = tok->encode(text);
  const std::vector<TokenId> want = {'h', 0xc3, 0xa9, 'l', 'l', 'o', ',', ' ', 263, '!'};
  EXPECT_EQ(ids, want);
  EXPECT_EQ(tok->decode(ids), text);
  EXPECT_EQ(tok->eos_id(), 256);
  ChatTemplate chat = ChatTemplate::from_config(default_tokenizer_config(), "default");
  nlohmann::ordered_json msgs = nlohmann::ordered_json::array();
  msgs.push_back({{"role", "user"}, {"content", "hi"}});
  EXPECT_EQ(chat.render(msgs), "[gMASK]<sop><|user|>\nhi<|assistant|>\n");
}

TEST(DefaultModel, GeneratesAndBatchEqualsAlone) {
  auto lm = make_default_model(0);
  EXPECT_EQ(lm->config().architecture, "GlmMoeDsaForCausalLM");
  EXPECT_EQ(lm->vocab_size(), 272);
  auto tok = make_default_tokenizer();
  const std::vector<std::vector<TokenId>> prompts = {tok->encode("The quick brown fox"), tok->encode("Hi"),
                                                     tok->encode("1 2 3 4 5 6 7 8 9 10 11 12")};
  EngineOptions o;
  o.chunked_prefill_size = 8;
  Engine batched(o, std::move(lm), tok);
  Outputs run;
  const auto ids = submit_all(batched, run, prompts, greedy(6));
  batched.run_until_idle();
  for (size_t i = 0; i < prompts.size(); ++i) {
    Engine one(EngineOptions{}, make_default_model(0), tok);
    Outputs r1;
    const auto id1 = submit_all(one, r1, {prompts[i]}, greedy(6));
    one.run_until_idle();
    EXPECT_EQ(run.ids[ids[i]], r1.ids[id1[0]]) << "prompt " << i;
    EXPECT_EQ(run.ids[ids[i]].size(), 6u);
  }
}

}  // namespace
}  // namespace fp4moe::engine
