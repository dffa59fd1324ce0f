// GlmMoeDsaForCausalLM end to end against ../shared/golden/models/glm5_tiny{,_nvfp4} (HF transformers
// 5.17 forward in f32; golden README): full-prompt logits, greedy decoding through the KV cache,
// prefill + decode == one full forward (and the same DSA selections), the DSA path being sparse
// and mattering, batching, KV-state rollback on errors; the registry entry and manifest; "shared"
// indexer layers on dummy BF16 and NVFP4 weights.
#include <gtest/gtest.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"
#include "format/safetensors.h"
#include "model/config.h"
#include "model/dsa_selection_log.h"
#include "model/glm5.h"
#include "model/ops.h"
#include "model/registry.h"
#include "testing/testing.h"

namespace fp4moe::model {
namespace {

using dsa_test::log_into;
using dsa_test::pinned_to;
using dsa_test::selection_from;
using dsa_test::SelectionLog;

struct Golden {
  int64_t n_seq = 0, prompt_len = 0, greedy_len = 0, vocab = 0;
  std::vector<int32_t> input_ids;    // [n_seq, prompt_len]
  std::vector<float> logits;         // [n_seq, prompt_len, vocab]
  std::vector<int32_t> greedy_ids;   // [n_seq, greedy_len]
  std::vector<float> greedy_logits;  // [n_seq, greedy_len, vocab]
};

std::vector<int32_t> ids_of(const TensorView& v) {
  std::vector<int32_t> out;
  for (int64_t x : v.as<int64_t>()) out.push_back(static_cast<int32_t>(x));
  return out;
}

Golden load_golden(const std::filesystem::path& dir) {
  format::SafetensorsFile f(dir / "golden.safetensors");
  Golden g;
  const TensorView ids = f.view("input_ids"), lg = f.view("logits"), gids = f.view("greedy_ids"),
                   glg = f.view("greedy_logits");
  g.n_seq = ids.dim(0);
  g.prompt_len = ids.dim(1);
  g.greedy_len = gids.dim(1);
  g.vocab = lg.dim(2);
  g.input_ids = ids_of(ids);
  g.greedy_ids = ids_of(gids);
  auto l = lg.as<float>();
  g.logits.assign(l.begin(), l.end());
  auto gl = glg.as<float>();
  g.greedy_logits.assign(gl.begin(), gl.end());
  return g;
}

// max |a - b| / max |b| over n values.
double rel_err(const float* a, const float* b, int64_t n) {
  double err = 0, mx = 0;
  for (int64_t i = 0; i < n; ++i) {
    err = std::max(err, std::abs(double(a[i]) - double(b[i])));
    mx = std::max(mx, std::abs(double(b[i])));
  }
  return err / mx;
}

constexpr double kTol = 2e-3;  // golden README: max |diff| <= 2e-3 * max |logits| per sequence

class Glm5Golden : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    dir_ = testing::shared_path("golden/models/" + GetParam());
    cfg_ = load_model_config(dir_);
    ASSERT_EQ(cfg_.architecture, kArchGlmMoeDsa);
    store_ = std::make_unique<format::TensorStore>(dir_);
    LoadOptions opts;
    opts.progress = false;
    lm_ = create_glm_moe_dsa(cfg_, *store_, opts);
    g_ = load_golden(dir_);
    ASSERT_EQ(g_.vocab, cfg_.vocab_size);
  }
  std::span<const int32_t> prompt(int64_t s) const {
    return {g_.input_ids.data() + s * g_.prompt_len, static_cast<size_t>(g_.prompt_len)};
  }
  std::span<const int32_t> greedy(int64_t s) const {
    return {g_.greedy_ids.data() + s * g_.greedy_len, static_cast<size_t>(g_.greedy_len)};
  }

  std::filesystem::path dir_;
  ModelConfig cfg_;
  std::unique_ptr<format::TensorStore> store_;
  std::unique_ptr<CausalLM> lm_;
  Golden g_;
};

TEST_P(Glm5Golden, PromptLogitsMatchGolden) {
  // Both prompts in one batched step.
  std::vector<std::unique_ptr<KvState>> states;
  std::vector<std::vector<float>> logits(static_cast<size_t>(g_.n_seq));
  std::vector<SeqChunk> batch;
  for (int64_t s = 0; s < g_.n_seq; ++s) {
    states.push_back(lm_->new_state());
    logits[s].resize(static_cast<size_t>(g_.prompt_len * g_.vocab));
    batch.push_back({states.back().get(), prompt(s), logits[s].data(), true});
  }
  lm_->forward(batch);
  for (int64_t s = 0; s < g_.n_seq; ++s) {
    EXPECT_EQ(states[s]->length(), g_.prompt_len);
    const double e = rel_err(logits[s].data(), g_.logits.data() + s * g_.prompt_len * g_.vocab, g_.prompt_len * g_.vocab);
    std::printf("[glm5] %s seq %lld prompt logits: max|diff|/max|golden| = %.3g\n", GetParam().c_str(),
                static_cast<long long>(s), e);
    EXPECT_LE(e, kTol) << GetParam() << " sequence " << s;
  }
}

TEST_P(Glm5Golden, GreedyDecodeThroughCacheMatchesGolden) {
  const int64_t S = g_.prompt_len, n_new = g_.greedy_len - S, V = g_.vocab;
  std::vector<std::unique_ptr<KvState>> states;
  std::vector<std::vector<float>> logits(static_cast<size_t>(g_.n_seq), std::vector<float>(static_cast<size_t>(V)));
  std::vector<std::vector<int32_t>> generated(static_cast<size_t>(g_.n_seq));
  std::vector<int32_t> next(static_cast<size_t>(g_.n_seq));
  for (int64_t step = 0; step <= n_new; ++step) {
    std::vector<SeqChunk> batch;
    for (int64_t s = 0; s < g_.n_seq; ++s) {
      if (step == 0) states.push_back(lm_->new_state());
      std::span<const int32_t> toks = step == 0 ? prompt(s) : std::span<const int32_t>(&next[s], 1);
      batch.push_back({states[s].get(), toks, logits[s].data(), false});
    }
    lm_->forward(batch);
    for (int64_t s = 0; s < g_.n_seq; ++s) {
      // The logits that chose token S + step sit at position S - 1 + step of greedy_logits.
      const float* want = g_.greedy_logits.data() + (s * g_.greedy_len + S - 1 + step) * V;
      const double e = rel_err(logits[s].data(), want, V);
      EXPECT_LE(e, kTol) << GetParam() << " sequence " << s << " step " << step;
      if (step == n_new) continue;
      next[s] = static_cast<int32_t>(argmax(logits[s].data(), V));
      generated[s].push_back(next[s]);
    }
  }
  for (int64_t s = 0; s < g_.n_seq; ++s) {
    std::vector<int32_t> want(greedy(s).begin() + S, greedy(s).end());
    EXPECT_EQ(generated[s], want) << GetParam() << " sequence " << s;
    EXPECT_EQ(states[s]->length(), g_.greedy_len);  // prompt + every greedy token fed back
  }
}

TEST_P(Glm5Golden, PrefillThenDecodeEqualsFullForward) {
  auto* dsa = dynamic_cast<GlmMoeDsaModel*>(lm_.get());
  ASSERT_NE(dsa, nullptr);
  const int64_t V = g_.vocab, T = g_.greedy_len;
  for (int64_t s = 0; s < g_.n_seq; ++s) {
    // One full forward over prompt + greedy continuation.
    SelectionLog full_sel, inc_sel;
    dsa->set_dsa_observer(log_into(full_sel));
    auto full_state = lm_->new_state();
    std::vector<float> full = lm_->forward_one(*full_state, greedy(s), true);
    ASSERT_EQ(static_cast<int64_t>(full.size()), T * V);
    EXPECT_LE(rel_err(full.data(), g_.greedy_logits.data() + s * T * V, T * V), kTol) << "sequence " << s;

    // Chunked prefill (5 + 11 tokens) then one token at a time.
    dsa->set_dsa_observer(log_into(inc_sel));
    auto st = lm_->new_state();
    std::vector<float> inc;
    const std::vector<std::pair<int64_t, int64_t>> pieces = {{0, 5}, {5, 16}};
    for (auto [b, e] : pieces) {
      auto l = lm_->forward_one(*st, greedy(s).subspan(static_cast<size_t>(b), static_cast<size_t>(e - b)), true);
      inc.insert(inc.end(), l.begin(), l.end());
    }
    for (int64_t t = 16; t < T; ++t) {
      auto l = lm_->forward_one(*st, greedy(s).subspan(static_cast<size_t>(t), 1), false);
      inc.insert(inc.end(), l.begin(), l.end());
    }
    dsa->set_dsa_observer({});
    ASSERT_EQ(inc.size(), full.size());
    for (int64_t t = 0; t < T; ++t) {
      const double e = rel_err(inc.data() + t * V, full.data() + t * V, V);
      EXPECT_LE(e, 1e-5) << GetParam() << " sequence " << s << " position " << t
                         << ": incremental logits differ from the full forward";
    }
    EXPECT_EQ(inc_sel, full_sel) << "the DSA selections of the incremental run differ from the full forward";
    EXPECT_EQ(st->length(), T);
    EXPECT_GT(st->bytes(), 0u);
  }
}

TEST_P(Glm5Golden, DsaSelectionIsSparseAndMatters) {
  auto* dsa = dynamic_cast<GlmMoeDsaModel*>(lm_.get());
  ASSERT_NE(dsa, nullptr);
  SelectionLog sel;
  dsa->set_dsa_observer(log_into(sel));
  auto st = lm_->new_state();
  lm_->forward_one(*st, greedy(0), true);
  dsa->set_dsa_observer({});
  int64_t n_sparse = 0;
  for (const auto& [key, keys] : sel) {
    const int64_t pos = key.second;
    EXPECT_EQ(static_cast<int64_t>(keys.size()), std::min<int64_t>(cfg_.index_topk, pos + 1));
    for (int32_t t : keys) EXPECT_LE(t, pos);
    if (static_cast<int64_t>(keys.size()) < pos + 1) ++n_sparse;  // some causal key is excluded
  }
  EXPECT_GT(n_sparse, 0) << "no query's DSA selection excluded a causal key";

  // With top-k >= the sequence length the attention is dense causal: the logits must then miss the
  // golden ones, so the golden check above really depends on the sparse selection.
  ModelConfig dense_cfg = cfg_;
  dense_cfg.index_topk = 1 << 20;
  LoadOptions opts;
  opts.progress = false;
  auto dense_lm = create_glm_moe_dsa(dense_cfg, *store_, opts);
  auto ds = dense_lm->new_state();
  std::vector<float> dense = dense_lm->forward_one(*ds, greedy(0), true);
  const double e = rel_err(dense.data(), g_.greedy_logits.data(), g_.greedy_len * g_.vocab);
  std::printf("[glm5] %s dense-attention logits vs golden: %.3g (sparse path must matter: > %.3g)\n",
              GetParam().c_str(), e, kTol);
  EXPECT_GT(e, kTol);
}

// set_dsa_selection_override: its own selections give the same logits bit for bit; another valid
// selection (the first min(top-k, pos + 1) keys) changes the sparse positions only; a selection the
// indexer could not make (a key count off by one, a key past the query) is refused with the numbers
// and leaves the state as it was.
TEST_P(Glm5Golden, SelectionOverrideIsUsedAndChecked) {
  auto* dsa = dynamic_cast<GlmMoeDsaModel*>(lm_.get());
  ASSERT_NE(dsa, nullptr);
  const int64_t V = g_.vocab, N = g_.greedy_len, topk = cfg_.index_topk;
  SelectionLog sel;
  dsa->set_dsa_observer(log_into(sel));
  auto st = lm_->new_state();
  const std::vector<float> own = lm_->forward_one(*st, greedy(0), true);
  dsa->set_dsa_observer({});
  dsa->set_dsa_selection_override(pinned_to(sel));
  auto s1 = lm_->new_state();
  EXPECT_EQ(lm_->forward_one(*s1, greedy(0), true), own);

  auto first_keys = [&](int64_t, int64_t p) {
    std::vector<int32_t> k(static_cast<size_t>(std::min(topk, p + 1)));
    for (size_t i = 0; i < k.size(); ++i) k[i] = static_cast<int32_t>(i);
    return k;
  };
  dsa->set_dsa_selection_override(selection_from(first_keys));
  auto s2 = lm_->new_state();
  const std::vector<float> other = lm_->forward_one(*s2, greedy(0), true);
  EXPECT_LE(rel_err(other.data(), own.data(), topk * V), 1e-6) << "positions before the first sparse query";
  EXPECT_GT(rel_err(other.data() + topk * V, own.data() + topk * V, (N - topk) * V), kTol);

  const std::pair<std::function<std::vector<int32_t>(int64_t, int64_t)>, std::string> bad[] = {
      {[&](int64_t l, int64_t p) {
         auto k = first_keys(l, p);
         if (p == N - 1) k.pop_back();
         return k;
       },
       "(position " + std::to_string(N - 1) + ") has " + std::to_string(topk - 1) + " keys, needs min(index_topk " +
           std::to_string(topk) + ", position + 1) = " + std::to_string(topk)},
      {[&](int64_t l, int64_t p) {
         auto k = first_keys(l, p);
         if (p == N - 1) k.back() = static_cast<int32_t>(N);
         return k;
       },
       "key " + std::to_string(topk - 1) + " is " + std::to_string(N) + " after " + std::to_string(topk - 2) +
           " (keys must be ascending, distinct, in 0.." + std::to_string(N - 1) + ")"}};
  for (const auto& [pick, want] : bad) {
    dsa->set_dsa_selection_override(selection_from(pick));
    auto s3 = lm_->new_state();
    lm_->forward_one(*s3, greedy(0).subspan(0, 4), false);
    try {
      lm_->forward_one(*s3, greedy(0).subspan(4), false);
      ADD_FAILURE() << "an impossible selection was used";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("the DSA selection override"), std::string::npos) << e.what();
    }
    EXPECT_EQ(s3->length(), 4);
  }
  dsa->set_dsa_selection_override({});
}

TEST_P(Glm5Golden, FailedStepLeavesStatesUnchanged) {
  auto a = lm_->new_state(), b = lm_->new_state();
  lm_->forward_one(*a, prompt(0).subspan(0, 4), false);
  const std::vector<int32_t> bad = {1, 2, static_cast<int32_t>(cfg_.vocab_size)};
  std::vector<float> la(static_cast<size_t>(g_.vocab)), lb(static_cast<size_t>(g_.vocab));
  std::vector<SeqChunk> batch = {{a.get(), prompt(0).subspan(4, 3), la.data(), false},
                                 {b.get(), bad, lb.data(), false}};
  EXPECT_THROW(lm_->forward(batch), Error);
  EXPECT_EQ(a->length(), 4);
  EXPECT_EQ(b->length(), 0);
  // The state still continues correctly.
  auto l = lm_->forward_one(*a, prompt(0).subspan(4, g_.prompt_len - 4), true);
  const int64_t n = (g_.prompt_len - 4) * g_.vocab;
  EXPECT_LE(rel_err(l.data(), g_.logits.data() + 4 * g_.vocab, n), kTol);
  // A state from another model instance is rejected.
  LoadOptions opts;
  opts.progress = false;
  auto other = create_glm_moe_dsa(cfg_, *store_, opts);
  auto foreign = other->new_state();
  EXPECT_THROW(lm_->forward_one(*foreign, prompt(0), false), Error);
}

INSTANTIATE_TEST_SUITE_P(GoldenModels, Glm5Golden, ::testing::Values("glm5_tiny", "glm5_tiny_nvfp4"));

TEST(Glm5Registry, LoadModelDispatchesAndManifestMatchesCheckpoint) {
  const std::filesystem::path dir = testing::shared_path("golden/models/glm5_tiny");
  LoadOptions opts;
  opts.progress = false;
  auto lm = load_model(dir, opts);
  ASSERT_NE(dynamic_cast<GlmMoeDsaModel*>(lm.get()), nullptr);
  const Golden g = load_golden(dir);
  auto st = lm->new_state();
  auto logits = lm->forward_one(*st, {g.input_ids.data(), static_cast<size_t>(g.prompt_len)}, true);
  EXPECT_LE(rel_err(logits.data(), g.logits.data(), g.prompt_len * g.vocab), kTol);
  EXPECT_GT(lm->weight_bytes(), 0u);
  EXPECT_NE(lm->describe().find("indexer full"), std::string::npos) << lm->describe();

  // The manifest names exactly the checkpoint's tensors (Linears as module names).
  format::TensorStore store(dir);
  std::vector<std::string> names;
  for (const WeightSpec& w : glm_moe_dsa_manifest(lm->config())) {
    const bool linear = w.role == WeightRole::kLinear || w.role == WeightRole::kLinearBF16;
    names.push_back(linear ? w.name + ".weight" : w.name);
    const format::TensorInfo* info = store.find(names.back());
    ASSERT_NE(info, nullptr) << names.back();
    EXPECT_EQ(info->shape, w.shape) << names.back();
  }
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, store.names());
}

// A config with "shared" indexer layers and a small top-k, on deterministic dummy weights.
ModelConfig shared_indexer_config() {
  const std::filesystem::path dir = testing::shared_path("golden/models/glm5_tiny");
  nlohmann::json j = load_model_config(dir).raw;
  j["indexer_types"] = {"full", "shared", "shared"};
  j["index_topk"] = 4;
  return parse_model_config(j, "glm5_tiny with shared indexer layers");
}

TEST(Glm5Dummy, SharedIndexerLayersReuseSelectionAndDecodeMatchesFullForward) {
  for (DummyWeights dw : {DummyWeights::kBF16, DummyWeights::kNVFP4}) {
    const ModelConfig cfg = shared_indexer_config();
    LoadOptions opts;
    opts.progress = false;
    opts.seed = testing::test_seed();
    opts.dummy_weights = dw;
    const std::filesystem::path tmp = std::filesystem::temp_directory_path() /
                                      ("fp4moe-test-glm5-" + std::to_string(::testing::UnitTest::GetInstance()->random_seed()) +
                                       "-" + std::to_string(static_cast<int>(dw)) + "-" + std::to_string(getpid()));
    write_dummy_checkpoint(cfg, opts, tmp);
    format::TensorStore store(tmp);
    EXPECT_FALSE(store.contains("model.layers.1.self_attn.indexer.wk.weight"));  // shared: no indexer
    auto lm = create_glm_moe_dsa(cfg, store, opts);
    std::filesystem::remove_all(tmp);
    auto* dsa = dynamic_cast<GlmMoeDsaModel*>(lm.get());
    ASSERT_NE(dsa, nullptr);

    std::vector<int32_t> ids(20);
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>((opts.seed + 37 * i) % cfg.vocab_size);
    SelectionLog full_sel, inc_sel;
    int n_reused = 0;
    dsa->set_dsa_observer([&](int64_t layer, size_t, std::span<const int64_t> q_pos, const KeySelection& keys,
                              bool reused) {
      EXPECT_EQ(reused, layer != 0) << "layer " << layer;
      if (reused) {
        ++n_reused;
        for (size_t i = 0; i < q_pos.size(); ++i) {
          auto k = keys.keys_of(static_cast<int64_t>(i));
          EXPECT_EQ(std::vector<int32_t>(k.begin(), k.end()), full_sel.at({0, q_pos[i]})) << "layer " << layer;
        }
      }
      log_into(full_sel)(layer, 0, q_pos, keys, reused);
    });
    auto fs = lm->new_state();
    const std::vector<float> full = lm->forward_one(*fs, ids, true);
    EXPECT_EQ(n_reused, 2);
    for (float v : full) ASSERT_TRUE(std::isfinite(v));

    dsa->set_dsa_observer(log_into(inc_sel));
    auto st = lm->new_state();
    std::vector<float> inc = lm->forward_one(*st, std::span<const int32_t>(ids).subspan(0, 9), true);
    for (size_t t = 9; t < ids.size(); ++t) {
      auto l = lm->forward_one(*st, std::span<const int32_t>(ids).subspan(t, 1), false);
      inc.insert(inc.end(), l.begin(), l.end());
    }
    dsa->set_dsa_observer({});
    ASSERT_EQ(inc.size(), full.size());
    const int64_t V = cfg.vocab_size;
    for (size_t t = 0; t < ids.size(); ++t) {
      EXPECT_LE(rel_err(inc.data() + t * V, full.data() + t * V, V), 1e-5)
          << (dw == DummyWeights::kNVFP4 ? "NVFP4" : "BF16") << " position " << t;
    }
    EXPECT_EQ(inc_sel, full_sel);
    // Truncating rolls the cache back: re-decoding the last 5 tokens gives the same logits.
    st->truncate(15);
    std::vector<float> again;
    for (size_t t = 15; t < ids.size(); ++t) {
      auto l = lm->forward_one(*st, std::span<const int32_t>(ids).subspan(t, 1), false);
      again.insert(again.end(), l.begin(), l.end());
    }
    EXPECT_TRUE(std::equal(again.begin(), again.end(), inc.end() - static_cast<int64_t>(again.size())));
  }
}

}  // namespace
}  // namespace fp4moe::model
