// The engine on real models: the golden glm5_tiny / glm4_moe_tiny greedy ids through the engine
// (chunked prefill, batching, and preemption by recompute under a tiny KV budget), and the embedded
// default model + byte-level tokenizer (round trip, specials, chat template, batch == alone).
#include <gtest/gtest.h>

#include <map>
#include <string>

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
  setups[2].o.max_total_tokens = 40;
  setups[2].o.page_size = 4;
  for (const Setup& su : setups) {
    SCOPED_TRACE(su.name);
    model::LoadOptions lo;
    lo.progress = false;
    Engine e(su.o, model::load_model(dir, lo), nullptr);
    Outputs run;
    const auto ids = submit_all(e, run, prompts, greedy(T - S));
    e.run_until_idle();
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

INSTANTIATE_TEST_SUITE_P(Models, GoldenThroughEngine, ::testing::Values("glm5_tiny", "glm4_moe_tiny"));

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
