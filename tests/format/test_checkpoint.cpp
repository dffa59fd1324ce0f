// Tests for format/checkpoint: the four golden models (counts worked out independently, below),
// a sharded copy, broken copies (each error names the module and the numbers), and the
// exclusion-pattern semantics. Run: ctest -R test_checkpoint, or build/tests/format/test_checkpoint.
#include <gtest/gtest.h>

#include <set>
#include <tuple>

#include "format/checkpoint.h"
#include "format/checkpoint_edit.h"
#include "testing/testing.h"

namespace fp4moe::format {
namespace {

using testing::copy_checkpoint;
using testing::TempDir;
using testing::TensorMap;

// Expected numbers, worked out from the files themselves (config.json read by eye, tensor names
// and shapes listed with a 20-line Python header reader: json.loads(f.read(8 + u64 LE length))):
//   every model: num_hidden_layers 3; layer 0 dense (glm4: first_k_dense_replace 1; glm5:
//   mlp_layer_types [dense, sparse, sparse]); layers 1-2 MoE with n_routed_experts 16, each
//   expert gate/up/down on disk (48 expert Linears per layer), 1 shared expert (3 Linears),
//   1 router (mlp.gate).
//   glm4: attention q,k,v,o = 4 per layer -> 12; dense 3; MoE 2*(48+3+1) = 104; lm_head 1:
//         120 Linears (+1 embedding). NVFP4 version: all but lm_head and 2 routers = 117
//         (= count of *.weight_scale tensors); 117*4 + 22 other tensors = 490 tensors on disk.
//   glm5: attention q_a,q_b,kv_a,kv_b,o + indexer wq_b,wk,weights_proj = 8 per layer -> 24;
//         132 Linears. NVFP4 version: dense 3 + experts 2*48 + shared 2*3 = 105; 469 tensors.
//   Parameters (NVFP4 weight = 2 per byte, scales left out): 1218208 (glm4), 1288576 (glm5),
//   the same for both versions. Bytes by dtype summed from data_offsets.
struct GoldenCase {
  const char* dir;
  int64_t n_attention;
  int64_t n_linear;
  int64_t n_nvfp4;
  int64_t n_nvfp4_attention;
  int64_t n_parameters;
  std::map<DType, uint64_t> bytes;
};

const GoldenCase kGolden[] = {
    {"glm4_moe_tiny", 12, 120, 0, 0, 1218208, {{DType::kF32, 128}, {DType::kBF16, 2436352}}},
    {"glm4_moe_tiny_nvfp4", 12, 120, 117, 12, 1218208,
     {{DType::kF32, 1064}, {DType::kBF16, 273664}, {DType::kF8_E4M3, 67584}, {DType::kU8, 540672}}},
    {"glm5_tiny", 24, 132, 0, 0, 1288576, {{DType::kF32, 128}, {DType::kBF16, 2577088}}},
    {"glm5_tiny_nvfp4", 24, 132, 105, 0, 1288576,
     {{DType::kF32, 968}, {DType::kBF16, 709312}, {DType::kF8_E4M3, 58368}, {DType::kU8, 466944}}},
};

std::filesystem::path golden(const std::string& name) {
  return fp4moe::testing::shared_path("golden/models/" + name);
}

std::string all_problems(const Checkpoint& c) {
  std::string s;
  for (const auto& p : c.problems()) s += p.message + "\n";
  return s;
}

void expect_golden(const Checkpoint& c, const GoldenCase& g) {
  SCOPED_TRACE(g.dir);
  EXPECT_TRUE(c.problems().empty()) << all_problems(c);
  EXPECT_EQ(c.config().n_layers, 3);
  EXPECT_EQ(c.config().n_dense_layers(), 1);
  EXPECT_EQ(c.config().n_moe_layers(), 2);
  EXPECT_EQ(c.config().layer_is_moe, (std::vector<bool>{false, true, true}));
  EXPECT_EQ(c.config().n_routed_experts, 16);
  EXPECT_EQ(c.config().n_experts_per_tok, 4);
  EXPECT_EQ(c.config().n_shared_experts, 1);
  EXPECT_EQ(c.n_experts_on_disk(1), 16);
  EXPECT_EQ(c.n_experts_on_disk(2), 16);
  EXPECT_EQ(c.n_experts_on_disk(0), 0);
  const KindSummary linears = c.linear_summary();
  EXPECT_EQ(linears.n_nvfp4 + linears.n_bf16, g.n_linear);
  EXPECT_EQ(linears.n_other, 0);
  EXPECT_EQ(linears.n_nvfp4, g.n_nvfp4);
  auto s = c.kind_summary();
  EXPECT_EQ(s[ModuleKind::kAttention].n_nvfp4 + s[ModuleKind::kAttention].n_bf16, g.n_attention);
  EXPECT_EQ(s[ModuleKind::kAttention].n_nvfp4, g.n_nvfp4_attention);
  EXPECT_EQ(s[ModuleKind::kRoutedExpert].n_nvfp4 + s[ModuleKind::kRoutedExpert].n_bf16, 96);
  EXPECT_EQ(s[ModuleKind::kSharedExpert].n_nvfp4 + s[ModuleKind::kSharedExpert].n_bf16, 6);
  EXPECT_EQ(s[ModuleKind::kDenseMlp].n_nvfp4 + s[ModuleKind::kDenseMlp].n_bf16, 3);
  EXPECT_EQ(s[ModuleKind::kRouter].n_bf16, 2);
  EXPECT_EQ(s[ModuleKind::kRouter].n_nvfp4, 0);
  EXPECT_EQ(s[ModuleKind::kLmHead].n_bf16, 1);
  EXPECT_EQ(s[ModuleKind::kEmbedding].n_bf16, 1);
  EXPECT_EQ(c.n_parameters(), g.n_parameters);
  EXPECT_EQ(c.bytes_by_dtype(), g.bytes);
  if (g.n_nvfp4 > 0) {
    EXPECT_EQ(c.quant().quant_algo, "NVFP4");
    EXPECT_EQ(c.quant().source, "hf_quant_config.json");
    EXPECT_EQ(c.quant().group_size, 16);
  } else {
    EXPECT_FALSE(c.quant().present);
  }
}

TEST(Checkpoint, GoldenModelCounts) {
  for (const GoldenCase& g : kGolden) {
    Checkpoint c(golden(g.dir));
    expect_golden(c, g);
    // Independent of the module logic: count *.weight_scale tensors in the raw headers.
    int64_t n_scales = 0;
    for (const auto& f : c.store().files()) {
      for (const auto& t : f->tensors()) {
        if (t.name.size() > 13 && t.name.ends_with(".weight_scale")) ++n_scales;
      }
    }
    EXPECT_EQ(n_scales, g.n_nvfp4) << g.dir;
  }
}

TEST(Checkpoint, ArchitectureFields) {
  Checkpoint a(golden("glm4_moe_tiny_nvfp4"));
  EXPECT_EQ(a.config().architecture, "Glm4MoeForCausalLM");
  EXPECT_EQ(a.config().model_type, "glm4_moe");
  EXPECT_EQ(a.config().hidden_size, 128);
  EXPECT_EQ(a.config().intermediate_size, 256);
  EXPECT_EQ(a.config().moe_intermediate_size, 64);
  EXPECT_EQ(a.config().vocab_size, 512);
  EXPECT_EQ(a.config().n_nextn_layers, 1);
  Checkpoint b(golden("glm5_tiny"));
  EXPECT_EQ(b.config().architecture, "GlmMoeDsaForCausalLM");
  EXPECT_EQ(b.config().model_type, "glm_moe_dsa");
}

TEST(Checkpoint, LinearAccessor) {
  Checkpoint c(golden("glm4_moe_tiny_nvfp4"));
  const std::string name = "model.layers.1.mlp.experts.3.down_proj";
  LinearTensors t = c.linear(name);
  ASSERT_NE(t.module, nullptr);
  EXPECT_EQ(t.module->kind, ModuleKind::kRoutedExpert);
  EXPECT_EQ(t.module->layer, 1);
  EXPECT_EQ(t.module->expert, 3);
  EXPECT_EQ(t.module->format, LinearFormat::kNVFP4);
  EXPECT_EQ(t.module->out_features, 128);
  EXPECT_EQ(t.module->in_features, 64);
  EXPECT_EQ(t.weight.shape, (Shape{128, 32}));
  ASSERT_TRUE(t.weight_scale.has_value());
  EXPECT_EQ(t.weight_scale->shape, (Shape{128, 4}));
  EXPECT_EQ(t.weight_scale_2, c.tensor(name + ".weight_scale_2").as<float>()[0]);
  ASSERT_TRUE(t.input_scale.has_value());
  EXPECT_GT(*t.input_scale, 0.0f);

  LinearTensors q = c.linear("model.layers.0.self_attn.q_proj");
  ASSERT_TRUE(q.bias.has_value());
  EXPECT_EQ(q.bias->shape, (Shape{128}));
  LinearTensors head = c.linear("lm_head");
  EXPECT_EQ(head.module->format, LinearFormat::kBF16);
  EXPECT_EQ(head.weight.shape, (Shape{512, 128}));
  EXPECT_FALSE(head.weight_scale.has_value());
  EXPECT_TRUE(c.find_module("model.layers.1.mlp.gate")->excluded);

  try {
    c.linear("model.layers.1.mlp.experts.16.up_proj");
    FAIL() << "no throw for a missing module";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("model.layers.1.mlp.experts.16.up_proj"), std::string::npos);
  }
}

TEST(Checkpoint, ShardedCopyGivesIdenticalResults) {
  for (const GoldenCase& g : kGolden) {
    TempDir tmp("ckpt_shard");
    copy_checkpoint(golden(g.dir), tmp.path(), nullptr, nullptr, /*n_shards=*/2);
    ASSERT_TRUE(std::filesystem::exists(tmp.path() / "model.safetensors.index.json"));
    ASSERT_TRUE(std::filesystem::exists(tmp.path() / "model-00002-of-00002.safetensors"));
    ASSERT_FALSE(std::filesystem::exists(tmp.path() / "model.safetensors"));
    Checkpoint sharded(tmp.path());
    Checkpoint single(golden(g.dir));
    EXPECT_EQ(sharded.store().files().size(), 2u);
    expect_golden(sharded, g);
    ASSERT_EQ(sharded.modules().size(), single.modules().size());
    for (size_t i = 0; i < single.modules().size(); ++i) {
      const LinearModule& a = single.modules()[i];
      const LinearModule& b = sharded.modules()[i];
      EXPECT_EQ(a.name, b.name);
      EXPECT_EQ(a.format, b.format) << a.name;
      EXPECT_EQ(a.out_features, b.out_features) << a.name;
      EXPECT_EQ(a.in_features, b.in_features) << a.name;
      EXPECT_EQ(a.has_input_scale, b.has_input_scale) << a.name;
    }
  }
}

// Copies glm4_moe_tiny_nvfp4 with an edit and returns the problems of the copy.
std::vector<CheckpointProblem> problems_after(
    const char* model, const std::function<void(TensorMap&)>& edit_tensors,
    const std::function<void(const std::string&, nlohmann::ordered_json&)>& edit_json = nullptr) {
  TempDir tmp("ckpt_broken");
  copy_checkpoint(golden(model), tmp.path(), edit_tensors, edit_json);
  Checkpoint c(tmp.path());
  EXPECT_THROW(c.require_valid(), Error);
  return c.problems();
}

// The one problem about `module`, which must contain every fragment.
void expect_problem(const std::vector<CheckpointProblem>& problems, const std::string& module,
                    const std::vector<std::string>& fragments) {
  std::string all;
  for (const auto& p : problems) {
    all += p.message + "\n";
    if (p.module != module) continue;
    for (const auto& f : fragments) {
      EXPECT_NE(p.message.find(f), std::string::npos) << "'" << f << "' not in: " << p.message;
    }
    return;
  }
  ADD_FAILURE() << "no problem names " << module << "; problems:\n" << all;
}

TEST(Checkpoint, MissingWeightScale) {
  const std::string m = "model.layers.1.mlp.experts.3.up_proj";
  auto p = problems_after("glm4_moe_tiny_nvfp4", [&](TensorMap& t) { t.erase(m + ".weight_scale"); });
  ASSERT_EQ(p.size(), 1u);
  expect_problem(p, m, {"no .weight_scale", "[64, 8]", "U8 [64, 64]"});
}

TEST(Checkpoint, WrongScaleShape) {
  const std::string m = "model.layers.0.mlp.down_proj";
  auto p = problems_after("glm4_moe_tiny_nvfp4", [&](TensorMap& t) {
    auto& s = t.at(m + ".weight_scale");
    s.shape = {128, 8};
    s.bytes.resize(128 * 8);
  });
  ASSERT_EQ(p.size(), 1u);
  expect_problem(p, m, {"F8_E4M3 [128, 8]", "expected F8_E4M3 [128, 16]", "N=128", "K=256"});
}

TEST(Checkpoint, WrongGlobalScaleDtype) {
  const std::string m = "model.layers.2.self_attn.o_proj";
  auto p = problems_after("glm4_moe_tiny_nvfp4", [&](TensorMap& t) {
    auto& s = t.at(m + ".weight_scale_2");
    s.shape = {2};
    s.bytes.resize(8);
  });
  ASSERT_EQ(p.size(), 1u);
  expect_problem(p, m, {"weight_scale_2 is F32 [2]", "expected F32 []"});
}

TEST(Checkpoint, ConfigTensorMismatch) {
  // config says moe_intermediate_size 96: every expert and shared-expert Linear disagrees.
  auto p = problems_after("glm4_moe_tiny", nullptr, [](const std::string& file, auto& j) {
    if (file == "config.json") j["moe_intermediate_size"] = 96;
  });
  EXPECT_EQ(p.size(), 2u * (48 + 3));
  expect_problem(p, "model.layers.1.mlp.experts.0.gate_proj",
                 {"[out 64, in 128]", "config.json implies [out 96, in 128]"});
  expect_problem(p, "model.layers.2.mlp.shared_experts.down_proj",
                 {"[out 128, in 64]", "implies [out 128, in 96]"});
}

TEST(Checkpoint, MissingExpertAndDenseLayerMismatch) {
  auto p = problems_after(
      "glm5_tiny",
      [](TensorMap& t) {
        for (const char* proj : {"gate_proj", "up_proj", "down_proj"})
          t.erase(std::string("model.layers.2.mlp.experts.7.") + proj + ".weight");
      },
      [](const std::string& file, auto& j) {
        if (file == "config.json") j["mlp_layer_types"] = {"dense", "dense", "sparse"};
      });
  expect_problem(p, "model.layers.2.mlp.experts",
                 {"MoE layer 2 has 15 of 16 routed experts", "3 expert projections missing",
                  "model.layers.2.mlp.experts.7.gate_proj"});
  expect_problem(p, "model.layers.1.mlp.experts.0.gate_proj",
                 {"layer 1 is dense in config.json"});
  expect_problem(p, "model.layers.1.mlp.gate_proj", {"missing: dense layer 1"});
}

TEST(Checkpoint, ExcludedButQuantized) {
  auto exclude_dense = [](const std::string& file, nlohmann::ordered_json& j) {
    if (file == "hf_quant_config.json") j["quantization"]["exclude_modules"].push_back("model.layers.0.mlp*");
    if (file == "config.json") j["quantization_config"]["ignore"].push_back("model.layers.0.mlp*");
  };
  auto p = problems_after("glm4_moe_tiny_nvfp4", nullptr, exclude_dense);
  ASSERT_EQ(p.size(), 3u);
  for (const char* proj : {"gate_proj", "up_proj", "down_proj"}) {
    expect_problem(p, std::string("model.layers.0.mlp.") + proj,
                   {"NVFP4 on disk but excluded by 'model.layers.0.mlp*'", "hf_quant_config.json"});
  }
}

TEST(Checkpoint, Bf16ButNotExcluded) {
  auto drop_attn = [](const std::string& file, nlohmann::ordered_json& j) {
    auto drop = [](nlohmann::ordered_json& list) {
      nlohmann::ordered_json out = nlohmann::ordered_json::array();
      for (auto& e : list)
        if (e != "model.layers.*.self_attn*") out.push_back(e);
      list = out;
    };
    if (file == "hf_quant_config.json") drop(j["quantization"]["exclude_modules"]);
    if (file == "config.json") drop(j["quantization_config"]["ignore"]);
  };
  auto p = problems_after("glm5_tiny_nvfp4", nullptr, drop_attn);
  EXPECT_EQ(p.size(), 24u);
  expect_problem(p, "model.layers.1.self_attn.indexer.wq_b",
                 {"BF16 on disk but not excluded", "quant_algo NVFP4"});
}

TEST(Checkpoint, QuantConfigsDisagree) {
  auto p = problems_after("glm4_moe_tiny_nvfp4", nullptr, [](const std::string& file, auto& j) {
    if (file == "config.json") j["quantization_config"]["ignore"] = {"lm_head"};
  });
  expect_problem(p, "", {"exclusion lists disagree", "model.layers.*.mlp.gate"});
  // The group size too (config.json's 32 was ignored beside hf_quant_config.json's 16).
  p = problems_after("glm4_moe_tiny_nvfp4", nullptr, [](const std::string& file, auto& j) {
    if (file == "config.json") j["quantization_config"]["config_groups"]["group_0"]["weights"]["group_size"] = 32;
  });
  expect_problem(p, "",
                 {"group_size disagrees: hf_quant_config.json says 16, config.json quantization_config says 32"});
}

// A quantization field of the wrong type is named with its value (a quant_algo of 4 read as '' and an exclusion
// list given as a string as no exclusions).
TEST(Checkpoint, QuantConfigFieldsOfTheWrongTypeAreNamed) {
  for (const auto& [field, value, message] : std::vector<std::tuple<std::string, nlohmann::json, std::string>>{
           {"quant_algo", 4, "config.json quantization_config: field 'quant_algo' is 4, expected a string"},
           {"ignore", "lm_head",
            "config.json quantization_config: field 'ignore' is \"lm_head\", expected a list of strings"},
           {"ignore", nlohmann::json::array({"lm_head", 5}),
            "field 'ignore' is [\"lm_head\",5], expected a list of strings"},
           {"quant_method", true, "field 'quant_method' is true, expected a string"}}) {
    TempDir tmp("ckpt_quant_type");
    copy_checkpoint(golden("glm4_moe_tiny_nvfp4"), tmp.path(), nullptr, [&](const std::string& file, auto& j) {
      if (file == "config.json") j["quantization_config"][field] = value;
    });
    const std::string err = testing::error_of([&] { Checkpoint c(tmp.path()); });
    EXPECT_NE(err.find(message), std::string::npos) << field << ": " << err;
  }
}

TEST(Checkpoint, Nvfp4WithoutQuantConfig) {
  TempDir tmp("ckpt_noquant");
  copy_checkpoint(golden("glm4_moe_tiny_nvfp4"), tmp.path(), nullptr,
                  [](const std::string& file, auto& j) {
                    if (file == "config.json") j.erase("quantization_config");
                  });
  std::filesystem::remove(tmp.path() / "hf_quant_config.json");
  Checkpoint c(tmp.path());
  EXPECT_EQ(c.problems().size(), 117u);
  expect_problem(c.problems(), "model.layers.0.self_attn.q_proj", {"no quantization config"});
  try {
    c.linear("model.layers.0.self_attn.q_proj");
    FAIL() << "linear() of a module with a problem did not throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("model.layers.0.self_attn.q_proj cannot be loaded"),
              std::string::npos)
        << e.what();
  }
}

TEST(Checkpoint, FlatQuantizationConfigOnly) {
  // Without hf_quant_config.json the flat config.json form is used, with the same result.
  TempDir tmp("ckpt_flat");
  copy_checkpoint(golden("glm5_tiny_nvfp4"), tmp.path());
  std::filesystem::remove(tmp.path() / "hf_quant_config.json");
  Checkpoint c(tmp.path());
  EXPECT_TRUE(c.problems().empty()) << all_problems(c);
  EXPECT_EQ(c.quant().source, "config.json quantization_config");
  EXPECT_EQ(c.quant().exclude_modules.size(), 3u);
  EXPECT_EQ(c.linear_summary().n_nvfp4, 105);
}

TEST(QuantConfig, ExclusionSemantics) {
  QuantConfig q;
  q.present = true;
  q.quant_algo = "NVFP4";
  q.exclude_modules = {"lm_head", "model.layers.*.mlp.gate", "model.layers.0.self_attn*",
                       "model.layers.5", "model.layers.7.mlp.experts.[0-3].*"};
  EXPECT_TRUE(q.is_excluded("lm_head"));
  EXPECT_TRUE(q.is_excluded("model.lm_head"));           // contained at a dot boundary
  EXPECT_FALSE(q.is_excluded("lm_head_extra"));
  EXPECT_TRUE(q.is_excluded("model.layers.12.mlp.gate"));
  EXPECT_FALSE(q.is_excluded("model.layers.12.mlp.gate_proj"));
  EXPECT_TRUE(q.is_excluded("model.layers.0.self_attn.q_proj"));
  EXPECT_FALSE(q.is_excluded("model.layers.1.self_attn.q_proj"));
  EXPECT_TRUE(q.is_excluded("model.layers.5.mlp.down_proj"));  // prefix of the module
  EXPECT_FALSE(q.is_excluded("model.layers.50.mlp.down_proj"));
  EXPECT_TRUE(q.is_excluded("model.layers.7.mlp.experts.2.up_proj"));
  EXPECT_FALSE(q.is_excluded("model.layers.7.mlp.experts.4.up_proj"));
  EXPECT_EQ(q.excluded_by("model.layers.3.mlp.gate").value(), "model.layers.*.mlp.gate");
}

TEST(QuantConfig, WildcardMatch) {
  EXPECT_TRUE(wildcard_match("*", ""));
  EXPECT_TRUE(wildcard_match("a*b*c", "axxbyyc"));
  EXPECT_FALSE(wildcard_match("a*b*c", "axxbyy"));
  EXPECT_TRUE(wildcard_match("a?c", "abc"));
  EXPECT_FALSE(wildcard_match("a?c", "ac"));
  EXPECT_TRUE(wildcard_match("x[!0-9]y", "xay"));
  EXPECT_FALSE(wildcard_match("x[!0-9]y", "x5y"));
  EXPECT_TRUE(wildcard_match("*.mlp.gate", "model.layers.1.mlp.gate"));
  EXPECT_FALSE(wildcard_match("*.mlp.gate", "model.layers.1.mlp.gate_proj"));
}

TEST(ModuleNames, Classification) {
  int64_t l = 0, e = 0;
  EXPECT_EQ(classify_module_name("model.layers.12.mlp.experts.255.down_proj", &l, &e),
            ModuleKind::kRoutedExpert);
  EXPECT_EQ(l, 12);
  EXPECT_EQ(e, 255);
  EXPECT_EQ(classify_module_name("model.layers.3.mlp.shared_experts.up_proj", &l, &e),
            ModuleKind::kSharedExpert);
  EXPECT_EQ(e, -1);
  EXPECT_EQ(classify_module_name("model.layers.3.mlp.gate", &l, &e), ModuleKind::kRouter);
  EXPECT_EQ(classify_module_name("model.layers.0.mlp.up_proj", &l, &e), ModuleKind::kDenseMlp);
  EXPECT_EQ(classify_module_name("model.layers.0.self_attn.indexer.wk", &l, &e),
            ModuleKind::kAttention);
  EXPECT_EQ(classify_module_name("lm_head", &l, &e), ModuleKind::kLmHead);
  EXPECT_EQ(l, -1);
  EXPECT_EQ(classify_module_name("model.embed_tokens", &l, &e), ModuleKind::kEmbedding);
  EXPECT_EQ(classify_module_name("model.layers.78.eh_proj", &l, &e), ModuleKind::kOther);
  EXPECT_EQ(l, 78);
  // Indices of more than 9 digits are no index (they overflowed int64_t); layer_index is the same parse.
  EXPECT_EQ(classify_module_name("model.layers.99999999999999999999.mlp.gate", &l, &e), ModuleKind::kOther);
  EXPECT_EQ(l, -1);
  EXPECT_EQ(classify_module_name("model.layers.2.mlp.experts.99999999999999999999.up_proj", &l, &e),
            ModuleKind::kRoutedExpert);
  EXPECT_EQ(l, 2);
  EXPECT_EQ(e, -1);
  EXPECT_EQ(layer_index("model.layers.123456789.input_layernorm.weight"), 123456789);
  EXPECT_EQ(layer_index("model.layers.1234567890.input_layernorm.weight"), -1);
  EXPECT_EQ(layer_index("model.layers.7"), -1);
  EXPECT_EQ(layer_index("model.layers.x7.mlp"), -1);
  EXPECT_EQ(layer_index("model.norm.weight"), -1);
}

// n_shared_experts defaults as transformers does: 1 for the GLM / DeepSeek-V3 types, 0 for the others.
TEST(ModelConfigParse, SharedExpertDefaultFollowsTheModelType) {
  nlohmann::json j = {{"num_hidden_layers", 2}, {"hidden_size", 8}, {"vocab_size", 16}, {"model_type", "glm4_moe"}};
  EXPECT_EQ(parse_model_config(j, "t").n_shared_experts, 1);
  j["model_type"] = "qwen3_moe";
  EXPECT_EQ(parse_model_config(j, "t").n_shared_experts, 0);
  j["n_shared_experts"] = 2;
  EXPECT_EQ(parse_model_config(j, "t").n_shared_experts, 2);
}

// Values that sized or indexed the per-layer table: refused, naming the field (a negative first_k_dense_replace
// wrote before the table: "double free or corruption" in inspect; 10^9 layers ran inspect for minutes at 10 GB).
TEST(ModelConfigParse, LayerCountsAreBounded) {
  const nlohmann::json base = {{"num_hidden_layers", 2},    {"hidden_size", 8},      {"vocab_size", 16},
                               {"model_type", "glm4_moe"},  {"n_routed_experts", 4}, {"num_experts_per_tok", 2},
                               {"moe_intermediate_size", 8}};
  for (const auto& [key, value, want] :
       {std::tuple<const char*, int64_t, const char*>{"first_k_dense_replace", -1,
                                                      "first_k_dense_replace=-1 must be >= 0"},
        {"num_hidden_layers", 1000000000, "num_hidden_layers=1000000000 is past 65536"},
        {"num_nextn_predict_layers", -5, "num_nextn_predict_layers=-5 must be >= 0"},
        {"num_experts_per_tok", 5,
         "t: num_experts_per_tok=5 is outside [1, n_routed_experts=4] (a token's top-k experts are chosen among the "
         "routed ones)"},
        {"num_experts_per_tok", 0, "num_experts_per_tok=0 is outside [1, n_routed_experts=4]"},
        {"moe_intermediate_size", 0, "t: 2 MoE layers but moe_intermediate_size=0"}}) {
    nlohmann::json j = base;
    j[key] = value;
    try {
      parse_model_config(j, "t");
      ADD_FAILURE() << key << " accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace fp4moe::format
