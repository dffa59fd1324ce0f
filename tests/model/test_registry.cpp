// Loading through the registry: errors for broken checkpoints name the tensor and both shapes,
// sharded checkpoints load like single files, unknown architectures are refused by name, dummy
// weights are deterministic from the seed (BF16 and NVFP4) and work for configs no checkpoint
// exists for (here GLM-4.x with q/k RMSNorm and tied embeddings).
//   ctest --test-dir build -R ModelRegistry
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <functional>
#include <optional>
#include <tuple>

#include "core/error.h"
#include "format/safetensors.h"
#include "model/checkpoint_edit.h"
#include "model/registry.h"
#include "testing/testing.h"

namespace fp4moe::model {
namespace {

namespace fs = std::filesystem;

using checkpoint_edit::copy_checkpoint;
using checkpoint_edit::copy_with_nan;
using checkpoint_edit::golden;
using checkpoint_edit::Replacement;

struct TempDir : fp4moe::testing::TempDir {
  TempDir() : fp4moe::testing::TempDir("registry") {}
};

std::string load_error(const fs::path& dir) {
  LoadOptions o;
  o.progress = false;
  try {
    load_model(dir, o);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

std::vector<float> prompt_logits(CausalLM& lm) {
  auto st = lm.new_state();
  const std::vector<int32_t> ids = {5, 17, 99, 3, 250, 8, 42};
  return lm.forward_one(*st, ids, true);
}

TEST(ModelRegistry, MissingTensorIsNamed) {
  TempDir t;
  copy_checkpoint(golden("glm4_moe_tiny"), t.path(),
                  [](const std::string& n, auto&) { return n != "model.layers.1.self_attn.q_proj.weight"; });
  const std::string e = load_error(t.path());
  EXPECT_NE(e.find("model.layers.1.self_attn.q_proj.weight"), std::string::npos) << e;
  EXPECT_NE(e.find("[128, 128]"), std::string::npos) << e;
}

TEST(ModelRegistry, MissingNormIsNamed) {
  TempDir t;
  copy_checkpoint(golden("glm4_moe_tiny"), t.path(),
                  [](const std::string& n, auto&) { return n != "model.layers.2.post_attention_layernorm.weight"; });
  const std::string e = load_error(t.path());
  EXPECT_NE(e.find("tensor model.layers.2.post_attention_layernorm.weight is missing"), std::string::npos) << e;
  EXPECT_NE(e.find("[128]"), std::string::npos) << e;
}

TEST(ModelRegistry, WrongShapeNamesTensorAndBothShapes) {
  TempDir t;
  copy_checkpoint(golden("glm4_moe_tiny"), t.path(), [](const std::string& n, std::optional<Replacement>& r) {
    if (n == "model.layers.0.input_layernorm.weight") r = Replacement{DType::kBF16, {64}, std::vector<uint8_t>(128)};
    return true;
  });
  const std::string e = load_error(t.path());
  EXPECT_NE(e.find("model.layers.0.input_layernorm.weight is BF16 [64], expected BF16|F32 [128]"), std::string::npos)
      << e;
}

TEST(ModelRegistry, WrongLinearShapeNamesTensorAndBothShapes) {
  TempDir t;
  copy_checkpoint(golden("glm4_moe_tiny"), t.path(), [](const std::string& n, std::optional<Replacement>& r) {
    if (n == "model.layers.2.mlp.experts.5.down_proj.weight") {
      r = Replacement{DType::kBF16, {64, 128}, std::vector<uint8_t>(64 * 128 * 2)};
    }
    return true;
  });
  const std::string e = load_error(t.path());
  EXPECT_NE(e.find("model.layers.2.mlp.experts.5.down_proj"), std::string::npos) << e;
  EXPECT_NE(e.find("[64, 128]"), std::string::npos) << e;
  EXPECT_NE(e.find("[128, 64]"), std::string::npos) << e;
}

TEST(ModelRegistry, WrongDtypeIsNamed) {
  TempDir t;
  copy_checkpoint(golden("glm4_moe_tiny"), t.path(), [](const std::string& n, std::optional<Replacement>& r) {
    if (n == "model.embed_tokens.weight") r = Replacement{DType::kI16, {512, 128}, std::vector<uint8_t>(512 * 128 * 2)};
    return true;
  });
  const std::string e = load_error(t.path());
  EXPECT_NE(e.find("model.embed_tokens.weight is I16 [512, 128], expected BF16|F32 [512, 128]"), std::string::npos)
      << e;
}

// A NaN in a BF16 weight loads (values are not scanned) and the forward fails naming the layer and the
// sublayer whose output first holds it, not the next layer's softmax. One weight a case: layer 2's o_proj
// (attention), layer 0's dense MLP, layer 1's shared expert (every token passes through it).
TEST(ModelRegistry, NonFiniteWeightIsBlamedOnItsLayer) {
  struct Case {
    const char* model;
    const char* tensor;
    const char* want;
  };
  const Case cases[] = {
      {"glm4_moe_tiny", "model.layers.2.self_attn.o_proj.weight",
       "layer 2: the attention output of batch entry 0 at position 0, column "},
      {"glm4_moe_tiny", "model.layers.0.mlp.down_proj.weight",
       "layer 0: the MLP output of batch entry 0 at position 0, column "},
      {"glm5_tiny", "model.layers.1.mlp.shared_experts.down_proj.weight",
       "layer 1: the MoE output of batch entry 0 at position 0, column "},
      {"glm5_tiny", "model.layers.2.self_attn.o_proj.weight",
       "layer 2: the attention output of batch entry 0 at position 0, column "},
      // After the last layer: NaN logits were sampled as token 0 without a word.
      {"glm4_moe_tiny", "lm_head.weight", "the logits (model.norm, lm_head) of batch entry 0 at position 0, column 0"},
      {"glm5_tiny", "lm_head.weight", "the logits (model.norm, lm_head) of batch entry 0 at position 0, column 0"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.tensor);
    TempDir t;
    copy_with_nan(c.model, t.path(), c.tensor, 0, 3);
    LoadOptions o;
    o.progress = false;
    auto lm = load_model(t.path(), o);
    std::string e;
    try {
      prompt_logits(*lm);
    } catch (const Error& err) {
      e = err.what();
    }
    EXPECT_EQ(e.rfind(c.want, 0), 0u) << e;
    EXPECT_NE(e.find(" is nan: a weight of this layer (or its input) holds NaN or Inf"), std::string::npos) << e;
  }
}

// A NaN confined to one sequence of a batch (here: the embedding row of a token only that sequence holds) is blamed
// on its batch entry (SequenceError), with the states unchanged; the other sequence then runs alone exactly as on
// the unmodified model.
TEST(ModelRegistry, NonFiniteRowsAreBlamedOnTheirSequence) {
  for (const char* model : {"glm4_moe_tiny", "glm5_tiny"}) {
    SCOPED_TRACE(model);
    TempDir t;
    copy_with_nan(model, t.path(), "model.embed_tokens.weight", 99, 3);  // token 99's row
    LoadOptions o;
    o.progress = false;
    auto lm = load_model(t.path(), o);
    auto clean = load_model(golden(model), o);
    const int64_t V = lm->vocab_size();
    const std::vector<int32_t> a = {5, 17, 3}, b = {8, 99, 42};
    auto sa = lm->new_state(), sb = lm->new_state();
    std::vector<float> la(static_cast<size_t>(V)), lb(static_cast<size_t>(V));
    const SeqChunk batch[] = {{sa.get(), a, la.data()}, {sb.get(), b, lb.data()}};
    try {
      lm->forward(batch);
      ADD_FAILURE() << "no error";
    } catch (const SequenceError& e) {
      EXPECT_EQ(e.entry(), 1);
      const std::string msg = e.what();
      EXPECT_EQ(msg.rfind("layer 0: the attention output of batch entry 1 at position 1, column ", 0), 0u) << msg;
    }
    EXPECT_EQ(sa->length(), 0);
    EXPECT_EQ(sb->length(), 0);
    lm->forward(std::span<const SeqChunk>(batch, 1));
    auto sc = clean->new_state();
    std::vector<float> want(static_cast<size_t>(V));
    const SeqChunk alone[] = {{sc.get(), a, want.data()}};
    clean->forward(alone);
    EXPECT_EQ(la, want);
  }
  // A NaN weight every row reads: each entry's rows are non-finite, so no one entry is blamed (a plain Error: the
  // engine fails the step's requests together instead of one a step).
  for (const char* model : {"glm4_moe_tiny", "glm5_tiny"}) {
    SCOPED_TRACE(model);
    TempDir t;
    copy_with_nan(model, t.path(), "model.layers.1.self_attn.o_proj.weight", 0, 3);
    LoadOptions o;
    o.progress = false;
    auto lm = load_model(t.path(), o);
    const std::vector<int32_t> a = {5, 17, 3}, b = {8, 9, 42};
    auto sa = lm->new_state(), sb = lm->new_state();
    const SeqChunk batch[] = {{sa.get(), a, nullptr}, {sb.get(), b, nullptr}};
    std::string what;
    bool blamed_one = false;
    try {
      lm->forward(batch);
    } catch (const SequenceError& e) {
      blamed_one = true;
      what = e.what();
    } catch (const Error& e) {
      what = e.what();
    }
    EXPECT_FALSE(blamed_one) << what;
    EXPECT_NE(what.find("layer 1: the attention output of batch entry 0 at position 0, column 0 is nan (and rows of 1 "
                        "other batch entries)"),
              std::string::npos)
        << what;
  }
}

// NVFP4 scales no quantizer writes are refused at load, naming the tensor (and a block scale's [row,
// block]); before, a zero or 1e30 global scale and NaN block scales loaded and gave zero or NaN logits.
TEST(ModelRegistry, BadNvfp4ScalesAreNamedAtLoad) {
  const std::string mod = "model.layers.1.mlp.experts.3.down_proj";
  auto f32 = [](float v) {
    std::vector<uint8_t> b(4);
    std::memcpy(b.data(), &v, 4);
    return Replacement{DType::kF32, {}, b};
  };
  struct Bad {
    std::string tensor;
    std::function<void(Replacement&)> make;
    std::string want;
  };
  const std::vector<Bad> cases = {
      {mod + ".weight_scale_2", [&](Replacement& r) { r = f32(0.0f); }, mod + ".weight_scale_2 = 0: the global scale"},
      {mod + ".weight_scale_2", [&](Replacement& r) { r = f32(-1.0f); }, mod + ".weight_scale_2 = -1: the global"},
      {mod + ".input_scale", [&](Replacement& r) { r = f32(std::nanf("")); },
       mod + ".input_scale = nan: the activation"},
      {mod + ".weight_scale",
       [](Replacement& r) {
         r.bytes[2 * 4 + 1] = 0x7F;  // [2, 1]: NaN
       },
       mod + ".weight_scale[2, 1] = 0x7f (nan): e4m3 block scales must be finite and non-negative"},
      {mod + ".weight_scale", [](Replacement& r) { r.bytes[5] = 0xB8; },
       mod + ".weight_scale[1, 1] = 0xb8 (-1): e4m3 block scales"},
  };
  for (const Bad& bad : cases) {
    TempDir t;
    const fs::path src = golden("glm4_moe_tiny_nvfp4");
    format::SafetensorsFile f(src / "model.safetensors");
    copy_checkpoint(src, t.path(), [&](const std::string& n, std::optional<Replacement>& r) {
      if (n != bad.tensor) return true;
      const auto v = f.view(*f.find(n));
      r = Replacement{v.dtype, v.shape, std::vector<uint8_t>(v.bytes.begin(), v.bytes.end())};
      bad.make(*r);
      return true;
    });
    const std::string e = load_error(t.path());
    EXPECT_NE(e.find(bad.want), std::string::npos) << e;
  }
}

// A quantization section that is not the NVFP4 the loader reads is refused (the weights were read as NVFP4
// all the same).
TEST(ModelRegistry, UnsupportedQuantizationIsRefused) {
  for (const auto& [key, value, want] :
       {std::tuple{"quant_algo", nlohmann::json("FP8"), "hf_quant_config.json says 'FP8'"},
        std::tuple{"group_size", nlohmann::json(32),
                   "group_size disagrees: hf_quant_config.json says 32, config.json quantization_config says 16"}}) {
    TempDir t;
    const fs::path src = golden("glm4_moe_tiny_nvfp4");
    copy_checkpoint(src, t.path(), [](const std::string&, auto&) { return true; });
    nlohmann::json q;
    {
      std::ifstream in(src / "hf_quant_config.json");
      q = nlohmann::json::parse(in);
    }
    q["quantization"][key] = value;
    std::ofstream(t.path() / "hf_quant_config.json") << q.dump();
    const std::string e = load_error(t.path());
    EXPECT_NE(e.find(want), std::string::npos) << e;
  }
  // A DeepSeek-style FP8 section names its quant_method, not the quant_algo it leaves empty.
  TempDir t;
  copy_checkpoint(golden("glm4_moe_tiny"), t.path(), [](const std::string&, auto&) { return true; });
  nlohmann::json c;
  {
    std::ifstream in(t.path() / "config.json");
    c = nlohmann::json::parse(in);
  }
  c["quantization_config"] = {{"quant_method", "fp8"}, {"fmt", "e4m3"}, {"weight_block_size", {128, 128}}};
  std::ofstream(t.path() / "config.json") << c.dump();
  const std::string e = load_error(t.path());
  EXPECT_NE(e.find("quant_method 'fp8' is not supported"), std::string::npos) << e;
}

// An integer field past 32 bits is refused naming it (index_topk 2^32 + 8 ran as 8; 10^12 was reported as a
// negative number no config held).
TEST(ModelRegistry, ConfigIntegersPast32BitsAreNamed) {
  for (const auto& [model, key] :
       {std::pair{"glm5_tiny", "index_topk"}, std::pair{"glm4_moe_tiny", "n_shared_experts"}}) {
    TempDir t;
    copy_checkpoint(golden(model), t.path(), [](const std::string&, auto&) { return true; });
    nlohmann::json j;
    {
      std::ifstream in(t.path() / "config.json");
      j = nlohmann::json::parse(in);
    }
    j[key] = (int64_t{1} << 32) + 8;
    std::ofstream(t.path() / "config.json") << j.dump();
    const std::string e = load_error(t.path());
    EXPECT_NE(e.find(std::string(key) + "\" = 4294967304 is past the 32-bit range"), std::string::npos) << e;
  }
}

// A config asking for more layers than the checkpoint holds is refused before anything is sized by it
// (num_hidden_layers 10^7 grew past 3 GB); an implausible count (past 2^16) before the tensors are read.
TEST(ModelRegistry, LayerCountPastTheCheckpointIsRefusedFirst) {
  for (const char* model : {"glm4_moe_tiny", "glm5_tiny_nvfp4"}) {
    for (const int64_t layers : {int64_t{1000}, int64_t{1'000'000'000}}) {
      TempDir t;
      copy_checkpoint(golden(model), t.path(), [](const std::string&, auto&) { return true; });
      nlohmann::json j;
      {
        std::ifstream in(t.path() / "config.json");
        j = nlohmann::json::parse(in);
      }
      j["num_hidden_layers"] = layers;
      j.erase("mlp_layer_types");
      j.erase("index_topk_pattern");
      j.erase("indexer_types");
      std::ofstream(t.path() / "config.json") << j.dump();
      const std::string e = load_error(t.path());
      const std::string want = layers == 1000 ? "num_hidden_layers = 1000, but the checkpoint's tensors hold layers 0-"
                                              : "num_hidden_layers=1000000000 is past 65536";
      EXPECT_NE(e.find(want), std::string::npos) << model << ": " << e;
    }
  }
}

TEST(ModelRegistry, ShardedCheckpointLoadsLikeSingleFile) {
  TempDir t;
  const fs::path src = golden("glm4_moe_tiny_nvfp4");
  for (const char* f : {"config.json", "hf_quant_config.json"}) fs::copy_file(src / f, t.path() / f);
  format::SafetensorsFile f(src / "model.safetensors");
  format::SafetensorsWriter a, b;
  nlohmann::json index;
  index["metadata"] = {{"total_size", 0}};
  for (const auto& info : f.tensors()) {
    const bool first = info.name < "model.layers.1";
    (first ? a : b).add(info.name, f.view(info));
    index["weight_map"][info.name] = first ? "model-00001-of-00002.safetensors" : "model-00002-of-00002.safetensors";
  }
  a.write(t.path() / "model-00001-of-00002.safetensors");
  b.write(t.path() / "model-00002-of-00002.safetensors");
  std::ofstream(t.path() / "model.safetensors.index.json") << index.dump();
  LoadOptions o;
  o.progress = false;
  auto sharded = load_model(t.path(), o);
  auto single = load_model(src, o);
  EXPECT_EQ(prompt_logits(*sharded), prompt_logits(*single));
}

TEST(ModelRegistry, UnknownArchitectureIsNamed) {
  ModelConfig c = load_model_config(golden("glm4_moe_tiny"));
  c.architecture = "MysteryForCausalLM";
  format::TensorStore store(golden("glm4_moe_tiny"));
  try {
    build_model(c, store, LoadOptions{});
    FAIL() << "an unregistered architecture was built";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("\"MysteryForCausalLM\""), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(kArchGlm4Moe), std::string::npos) << e.what();
  }
  const auto names = registered_architectures();
  EXPECT_NE(std::find(names.begin(), names.end(), kArchGlm4Moe), names.end());
  EXPECT_THROW(parse_load_format("fast"), Error);
  EXPECT_EQ(parse_dummy_weights("bf16"), DummyWeights::kBF16);
  EXPECT_EQ(parse_dummy_weights("nvfp4"), DummyWeights::kNVFP4);
  const std::string msg = fp4moe::testing::error_of([] { parse_dummy_weights("fp8"); });
  EXPECT_NE(msg.find("dummy weights \"fp8\" is not one of: bf16, nvfp4"), std::string::npos) << msg;
}

TEST(ModelRegistry, DummyWeightsAreDeterministicFromTheSeed) {
  for (DummyWeights w : {DummyWeights::kBF16, DummyWeights::kNVFP4}) {
    LoadOptions o;
    o.format = LoadFormat::kDummy;
    o.dummy_weights = w;
    o.progress = false;
    o.seed = 7;
    auto m1 = load_model(golden("glm4_moe_tiny"), o);
    auto m2 = load_model(golden("glm4_moe_tiny"), o);
    o.seed = 8;
    auto m3 = load_model(golden("glm4_moe_tiny"), o);
    const auto l1 = prompt_logits(*m1), l2 = prompt_logits(*m2), l3 = prompt_logits(*m3);
    EXPECT_EQ(l1, l2);
    EXPECT_NE(l1, l3);
    for (float v : l1) ASSERT_TRUE(std::isfinite(v));
    const std::string d = m1->describe();
    EXPECT_EQ(d.find("NVFP4") != std::string::npos, w == DummyWeights::kNVFP4) << d;
    // Dummy weights never come from the directory's checkpoint.
    auto real = load_model(golden("glm4_moe_tiny"), LoadOptions{LoadFormat::kAuto, DummyWeights::kBF16, 0, false});
    EXPECT_NE(prompt_logits(*real), l1);
  }
}

// A config no golden checkpoint covers: q/k RMSNorm, tied embeddings, GQA 8/2, rotary 0.25,
// every layer MoE. Checks the KV cache path (prefill then decode == full forward) and that the
// q/k norm weights are used.
TEST(ModelRegistry, DummyQkNormTiedConfigDecodesConsistently) {
  TempDir t;
  nlohmann::json j;
  {
    std::ifstream in(golden("glm4_moe_tiny") / "config.json");
    j = nlohmann::json::parse(in);
  }
  j["use_qk_norm"] = true;
  j["tie_word_embeddings"] = true;
  j["num_attention_heads"] = 8;
  j["num_key_value_heads"] = 2;
  j["head_dim"] = 16;
  j["partial_rotary_factor"] = 0.25;
  j["rope_parameters"]["partial_rotary_factor"] = 0.25;
  j["first_k_dense_replace"] = 0;
  j["num_hidden_layers"] = 2;
  std::ofstream(t.path() / "config.json") << j.dump();
  LoadOptions o;
  o.format = LoadFormat::kDummy;
  o.progress = false;
  o.seed = fp4moe::testing::test_seed();
  auto lm = load_model(t.path(), o);
  EXPECT_EQ(lm->config().rotary_dim(), 4);
  EXPECT_NE(lm->describe().find("q/k RMSNorm"), std::string::npos);
  EXPECT_NE(lm->describe().find("(tied)"), std::string::npos);
  const std::vector<int32_t> ids = {1, 2, 3, 4, 5, 6, 7, 8, 9};
  auto full_state = lm->new_state();
  const auto full = lm->forward_one(*full_state, ids, true);
  auto st = lm->new_state();
  auto got = lm->forward_one(*st, std::span<const int32_t>(ids.data(), 4), true);
  for (size_t i = 4; i < ids.size(); ++i) {
    const auto step = lm->forward_one(*st, std::span<const int32_t>(ids.data() + i, 1), false);
    got.insert(got.end(), step.begin(), step.end());
  }
  ASSERT_EQ(got.size(), full.size());
  float mx = 0, diff = 0;
  for (size_t i = 0; i < full.size(); ++i) {
    mx = std::max(mx, std::fabs(full[i]));
    diff = std::max(diff, std::fabs(full[i] - got[i]));
  }
  EXPECT_LE(diff, 1e-5f * mx);

  // The manifest lists the q/k norms (so the dummy checkpoint and a real one must hold them).
  TempDir t2;
  write_dummy_checkpoint(lm->config(), o, t2.path());
  format::TensorStore store(t2.path());
  EXPECT_TRUE(store.contains("model.layers.1.self_attn.k_norm.weight"));
  EXPECT_FALSE(store.contains("lm_head.weight"));
}

}  // namespace
}  // namespace fp4moe::model
