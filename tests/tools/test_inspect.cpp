// Tests for `fp4moe inspect`: the report functions on the four golden models and a broken copy,
// the demo checkpoint (deterministic, quantizes cleanly), and the CLI binary end to end (exit
// codes, --json, --demo). Run: ctest -R test_inspect.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <string>

#include "format/checkpoint.h"
#include "format/checkpoint_edit.h"
#include "format/quantize_checkpoint.h"
#include "testing/testing.h"
#include "tools/inspect.h"

namespace fp4moe::tools {
namespace {

using fp4moe::testing::TempDir;

std::filesystem::path golden(const std::string& name) {
  return fp4moe::testing::shared_path("golden/models/" + name);
}

// `fp4moe generate` of one token on `dir` (expected to succeed): what it printed, warnings included.
std::string generate_one_token(const std::filesystem::path& dir) {
  std::string out;
  EXPECT_EQ(testing::run_command(std::string(FP4MOE_CLI) + " generate --prompt-ids 1,2 --max-new-tokens 1 --model " +
                                     dir.string(),
                                 &out),
            0)
      << out;
  return out;
}

// Linears per model: see tests/format/test_checkpoint.cpp for how these were worked out.
struct Case {
  const char* dir;
  int64_t n_nvfp4;
  int64_t n_bf16;
};
constexpr Case kCases[] = {{"glm4_moe_tiny", 0, 120},
                           {"glm4_moe_tiny_nvfp4", 117, 3},
                           {"glm5_tiny", 0, 132},
                           {"glm5_tiny_nvfp4", 105, 27}};

TEST(Inspect, GoldenModelsJson) {
  for (const Case& k : kCases) {
    SCOPED_TRACE(k.dir);
    format::Checkpoint c(golden(k.dir));
    auto j = inspect_json(c);
    EXPECT_EQ(j["layers"]["n_layers"], 3);
    EXPECT_EQ(j["layers"]["n_dense"], 1);
    EXPECT_EQ(j["layers"]["n_moe"], 2);
    EXPECT_EQ(j["layers"]["moe"], (std::vector<int64_t>{1, 2}));
    EXPECT_EQ(j["experts"]["n_routed"], 16);
    EXPECT_EQ(j["experts"]["on_disk_per_layer"]["1"], 16);
    EXPECT_EQ(j["experts"]["on_disk_per_layer"]["2"], 16);
    EXPECT_EQ(j["modules"]["linear_nvfp4"], k.n_nvfp4);
    EXPECT_EQ(j["modules"]["linear_bf16"], k.n_bf16);
    EXPECT_EQ(j["modules"]["linear_other"], 0);
    EXPECT_EQ(j["modules"]["by_kind"]["routed_experts"][k.n_nvfp4 ? "nvfp4" : "bf16"], 96);
    EXPECT_EQ(j["modules"]["by_kind"]["router"]["bf16"], 2);
    EXPECT_TRUE(j["problems"].empty());
  }
}

TEST(Inspect, GoldenModelText) {
  format::Checkpoint c(golden("glm4_moe_tiny_nvfp4"));
  const std::string t = inspect_text(c);
  for (const char* want :
       {"architecture  Glm4MoeForCausalLM (model_type glm4_moe)", "layers        3 (1 dense, 2 MoE)",
        "16 routed, top-4, 1 shared; on disk per MoE layer: 16", "NVFP4 (group 16) from hf_quant_config.json",
        "Linears              117       3", "routed_experts        96       0",
        "parameters    1218208", "problems      none"}) {
    EXPECT_NE(t.find(want), std::string::npos) << "'" << want << "' not in:\n" << t;
  }
}

TEST(Inspect, BrokenCheckpointListsProblems) {
  TempDir tmp("inspect_broken");
  fp4moe::testing::copy_checkpoint(golden("glm4_moe_tiny_nvfp4"), tmp.path(), [](auto& t) {
    t.erase("model.layers.2.mlp.experts.11.gate_proj.weight_scale");
  });
  format::Checkpoint c(tmp.path());
  const std::string t = inspect_text(c);
  EXPECT_NE(t.find("problems      1\n  - model.layers.2.mlp.experts.11.gate_proj: NVFP4 weight U8 [64, 64] "
                   "has no .weight_scale (expected F8_E4M3 [64, 8])"),
            std::string::npos)
      << t;
  EXPECT_EQ(inspect_json(c)["problems"].size(), 1u);
}

// NVFP4 scalar scales' values: a zero global scale or a NaN activation scale is a problem naming it.
TEST(Inspect, BadScalarScalesAreProblems) {
  TempDir tmp("inspect_scales");
  auto set_f32 = [](fp4moe::testing::OwnedTensor& t, float v) { std::memcpy(t.bytes.data(), &v, 4); };
  fp4moe::testing::copy_checkpoint(golden("glm4_moe_tiny_nvfp4"), tmp.path(), [&](auto& t) {
    set_f32(t.at("model.layers.2.mlp.experts.4.up_proj.weight_scale_2"), 0.0f);
    set_f32(t.at("model.layers.0.mlp.down_proj.input_scale"), std::nanf(""));
  });
  format::Checkpoint c(tmp.path());
  const std::string t = inspect_text(c);
  EXPECT_NE(t.find("model.layers.2.mlp.experts.4.up_proj: weight_scale_2 = 0: the global scale must be a finite, "
                   "normal, positive f32"),
            std::string::npos)
      << t;
  EXPECT_NE(t.find("model.layers.0.mlp.down_proj: input_scale = nan: the activation scale"), std::string::npos) << t;
}

// An F16 Linear is a problem, as the loaders refuse it (inspect called F16 a type "fp4moe loads").
TEST(Inspect, F16LinearIsAProblem) {
  TempDir tmp("inspect_f16");
  fp4moe::testing::copy_checkpoint(golden("glm4_moe_tiny"), tmp.path(), [](auto& t) {
    t.at("model.layers.0.self_attn.o_proj.weight").dtype = DType::kF16;
  });
  format::Checkpoint c(tmp.path());
  const Findings f = find_problems(c);
  ASSERT_FALSE(f.problems.empty());
  EXPECT_NE(f.problems[0].message.find("model.layers.0.self_attn.o_proj: weight F16 [128, 128] is neither NVFP4 (U8) "
                                       "nor a float type fp4moe loads (BF16, F32)"),
            std::string::npos)
      << f.problems[0].message;
}

// An FP8 checkpoint (quant_method fp8, F8_E4M3 weights with weight_scale_inv, as GLM's FP8 releases): inspect says
// what its section is (not ModelOpt's blank quant_algo and producer), counts the F8 Linears apart from BF16, and
// names them in one problem with the way out, not one line a module.
TEST(Inspect, Fp8CheckpointIsSummarized) {
  TempDir tmp("inspect_fp8");
  int64_t n_fp8 = 0;
  fp4moe::testing::copy_checkpoint(
      golden("glm4_moe_tiny"), tmp.path(),
      [&](auto& t) {
        std::map<std::string, fp4moe::testing::OwnedTensor> scales;
        for (auto& [name, w] : t) {
          if (name.find("_proj.weight") == std::string::npos || w.shape.size() != 2) continue;
          w.dtype = DType::kF8_E4M3;
          w.bytes.assign(static_cast<size_t>(w.shape[0] * w.shape[1]), 0);
          const Shape blocks{(w.shape[0] + 127) / 128, (w.shape[1] + 127) / 128};
          scales[name.substr(0, name.size() - 6) + "weight_scale_inv"] = {
              DType::kF32, blocks, std::vector<uint8_t>(static_cast<size_t>(blocks[0] * blocks[1] * 4))};
          ++n_fp8;
        }
        t.insert(scales.begin(), scales.end());
      },
      [](const std::string& file, nlohmann::ordered_json& j) {
        if (file == "config.json") {
          j["quantization_config"] = {{"quant_method", "fp8"}, {"fmt", "e4m3"}, {"weight_block_size", {128, 128}}};
        }
      });
  format::Checkpoint c(tmp.path());
  const Findings f = find_problems(c);
  const std::string t = inspect_text(c);
  EXPECT_NE(t.find("quantization  quant_method fp8 from config.json quantization_config: not read"), std::string::npos)
      << t;
  EXPECT_NE(t.find("modules       kind               NVFP4    BF16   other\n"), std::string::npos) << t;
  EXPECT_NE(t.find(fmt::format("Linears                0       3 {:>7}\n", n_fp8)), std::string::npos) << t;
  EXPECT_NE(t.find(fmt::format("{} Linear weights are F8_E4M3 (first model.layers.0.mlp.down_proj F8_E4M3 [128, 256]): "
                               "neither NVFP4 (U8) nor a float type fp4moe loads (BF16, F32) (an FP8 checkpoint: "
                               "quantize its BF16 release with `fp4moe quantize`",
                               n_fp8)),
            std::string::npos)
      << t;
  EXPECT_EQ(t.find("quant_algo '' is not supported"), std::string::npos) << t;
  EXPECT_LT(f.problems.size(), 5u) << t;  // one line a module before
  const auto j = inspect_json(c);         // the JSON counts as the table does
  EXPECT_EQ(j["modules"]["linear_bf16"], 3);
  EXPECT_EQ(j["modules"]["linear_other"], n_fp8);
  EXPECT_FALSE(c.find_module("model.layers.1.mlp.experts.3.up_proj")->ok);
}

// The e4m3 block scales are read only with --check-scales (an eighth of the weight bytes); then a NaN or negative one
// is a problem with the message the load refuses it with.
TEST(Inspect, CheckScalesReadsTheBlockScales) {
  TempDir tmp("inspect_block_scales");
  const std::string mod = "model.layers.1.mlp.experts.3.down_proj";
  fp4moe::testing::copy_checkpoint(golden("glm4_moe_tiny_nvfp4"), tmp.path(), [&](auto& t) {
    t.at(mod + ".weight_scale").bytes[2 * 4 + 1] = 0x7F;              // [2, 1] of [*, 4]: NaN
    t.at("model.layers.0.mlp.up_proj.weight_scale").bytes[0] = 0xB8;  // [0, 0]: -1
  });
  format::Checkpoint c(tmp.path());
  EXPECT_TRUE(find_problems(c).problems.empty());
  const Findings f = find_problems(c, /*check_scales=*/true);
  ASSERT_EQ(f.problems.size(), 2u);
  EXPECT_EQ(f.problems[0].message,
            "model.layers.0.mlp.up_proj.weight_scale[0, 0] = 0xb8 (-1): e4m3 block scales must be finite and "
            "non-negative");
  EXPECT_EQ(f.problems[1].message,
            mod + ".weight_scale[2, 1] = 0x7f (nan): e4m3 block scales must be finite and non-negative");
  std::string out;
  EXPECT_EQ(testing::run_command(std::string(FP4MOE_CLI) + " inspect --check-scales " + tmp.path().string(), &out), 1);
  EXPECT_NE(out.find(mod + ".weight_scale[2, 1] = 0x7f (nan)"), std::string::npos) << out;
  for (const Case& k : kCases) EXPECT_TRUE(find_problems(format::Checkpoint(golden(k.dir)), true).problems.empty());
}

// A config that asks for far more than is on disk is a few problems, found at once: one for the layer
// count (not one a missing module: 10^5 layers listed ~500,000; past 65,536 the config itself is refused), one a MoE
// layer for the experts (10^9 built 3 x 10^9 names).
TEST(Inspect, ConfigPastTheCheckpointIsAFewProblems) {
  TempDir tmp("inspect_huge");
  fp4moe::testing::copy_checkpoint(golden("glm4_moe_tiny_nvfp4"), tmp.path(), nullptr,
                                   [](const std::string& file, nlohmann::ordered_json& j) {
                                     if (file != "config.json") return;
                                     j["num_hidden_layers"] = 60000;  // under the 65,536 a config may ask for
                                     j["n_routed_experts"] = 1000000000;
                                   });
  format::Checkpoint c(tmp.path());
  const nlohmann::json j = inspect_json(c);
  std::string all;
  for (const auto& p : j["problems"]) all += p.dump() + "\n";
  EXPECT_LE(j["problems"].size(), 10u) << all;
  EXPECT_NE(all.find("num_hidden_layers = 60000, but the checkpoint's Linear modules hold layers 0-2"),
            std::string::npos)
      << all;
  EXPECT_NE(all.find("MoE layer 1 has 16 of 1000000000 routed experts (n_routed_experts) whole on disk; 2999999952 "),
            std::string::npos)
      << all;
}

// Every tensor the architecture reads is checked, not only the Linears: a missing norm, a mis-shaped router
// bias and an absent attention Linear are problems naming them (each failed only at load before); a module
// format::Checkpoint already names is not named twice.
TEST(Inspect, EveryTensorTheModelReadsIsChecked) {
  TempDir tmp("inspect_manifest");
  fp4moe::testing::copy_checkpoint(golden("glm5_tiny_nvfp4"), tmp.path(), [](auto& t) {
    t.erase("model.layers.1.input_layernorm.weight");
    t.at("model.layers.2.mlp.gate.e_score_correction_bias").shape = {15};
    t.at("model.layers.2.mlp.gate.e_score_correction_bias").bytes.resize(60);
    t.erase("model.layers.0.self_attn.kv_a_proj_with_mqa.weight");
    t.at("model.layers.0.self_attn.indexer.k_norm.bias").dtype = DType::kU8;
    t.at("model.layers.0.self_attn.indexer.k_norm.bias").shape = {64};
    t.erase("model.layers.0.mlp.up_proj.weight");  // format::Checkpoint names it (scales, no weight)
  });
  format::Checkpoint c(tmp.path());
  const Findings f = find_problems(c);
  std::string all;
  for (const auto& p : f.problems) all += p.message + "\n";
  EXPECT_EQ(f.problems.size(), 6u) << all;  // format::Checkpoint names up_proj twice (scales; a dense MLP part)
  for (const char* want :
       {"model.layers.1.input_layernorm.weight: missing: GlmMoeDsaForCausalLM reads it (expected BF16|F32 [128])",
        "model.layers.2.mlp.gate.e_score_correction_bias: is F32 [15], expected BF16|F32 [16]",
        "model.layers.0.self_attn.kv_a_proj_with_mqa: missing: GlmMoeDsaForCausalLM reads it (a Linear [out 48, in "
        "128])",
        "model.layers.0.self_attn.indexer.k_norm.bias: is U8 [64], expected BF16|F32 [32]",
        "model.layers.0.mlp.up_proj: has quantization scales but no .weight tensor"}) {
    EXPECT_NE(all.find(want), std::string::npos) << "'" << want << "' not in:\n" << all;
  }
  EXPECT_NE(inspect_text(c).find("problems      6\n"), std::string::npos);
  EXPECT_EQ(inspect_json(c)["problems"].size(), 6u);
}

// quant_algo NVFP4 (calibrated W4A4) with a Linear lacking its .input_scale: a warning (fp4moe loads it; another
// engine's activation quantizer would lack the scale), not a problem; W4A16_NVFP4 needs none.
TEST(Inspect, MissingInputScaleUnderCalibratedNvfp4IsAWarning) {
  TempDir tmp("inspect_input_scale");
  fp4moe::testing::copy_checkpoint(golden("glm4_moe_tiny_nvfp4"), tmp.path(),
                                   [](auto& t) { t.erase("model.layers.1.mlp.experts.3.up_proj.input_scale"); });
  format::Checkpoint c(tmp.path());
  const Findings f = find_problems(c);
  EXPECT_TRUE(f.problems.empty()) << f.problems.front().message;
  ASSERT_EQ(f.warnings.size(), 1u);
  EXPECT_EQ(
      f.warnings[0].rfind("1 of 117 NVFP4 Linears have no .input_scale, e.g. model.layers.1.mlp.experts.3.up_proj: "
                          "hf_quant_config.json says quant_algo NVFP4 (calibrated W4A4)",
                          0),
      0u)
      << f.warnings[0];
  EXPECT_NE(inspect_text(c).find("warnings      1\n  - 1 of 117 NVFP4 Linears"), std::string::npos);
  EXPECT_EQ(inspect_json(c)["warnings"].size(), 1u);
  EXPECT_TRUE(find_problems(format::Checkpoint(golden("glm4_moe_tiny_nvfp4"))).warnings.empty());
}

// A norm's weight stored 2-D is one problem naming its shape, not also counted as a Linear of kind "other".
TEST(Inspect, ATwoDimensionalNormIsNotALinear) {
  TempDir tmp("inspect_norm_2d");
  fp4moe::testing::copy_checkpoint(golden("glm4_moe_tiny"), tmp.path(), [](auto& t) {
    t.at("model.layers.0.input_layernorm.weight").shape = {1, 128};
  });
  format::Checkpoint c(tmp.path());
  EXPECT_EQ(c.find_module("model.layers.0.input_layernorm"), nullptr);
  EXPECT_EQ(c.kind_summary().count(format::ModuleKind::kOther), 0u);
  const Findings f = find_problems(c);
  ASSERT_EQ(f.problems.size(), 1u);
  EXPECT_EQ(f.problems[0].message, "model.layers.0.input_layernorm.weight: is BF16 [1, 128], expected BF16|F32 [128]");
  const std::string text = inspect_text(c);
  EXPECT_EQ(text.find("other"), std::string::npos) << text;
}

// Tensors nothing reads (here a KV-cache scale) are listed, not refused; the MTP layer the config declares is
// not listed.
TEST(Inspect, UnreadTensorsAreListed) {
  TempDir tmp("inspect_unread");
  fp4moe::testing::copy_checkpoint(
      golden("glm4_moe_tiny"), tmp.path(),
      [](auto& t) {
        fp4moe::testing::OwnedTensor scale{DType::kF32, {}, std::vector<uint8_t>(4, 0)};
        t["model.layers.0.self_attn.k_scale"] = scale;
        t["model.layers.3.eh_proj.weight"] = t.at("model.layers.0.self_attn.o_proj.weight");  // the MTP layer
      },
      [](const std::string& file, nlohmann::ordered_json& j) {
        if (file == "config.json") j["num_nextn_predict_layers"] = 1;
      });
  format::Checkpoint c(tmp.path());
  const Findings f = find_problems(c);
  EXPECT_TRUE(f.problems.empty()) << f.problems.front().message;
  EXPECT_EQ(f.unread, std::vector<std::string>{"model.layers.0.self_attn.k_scale"});
  EXPECT_NE(inspect_text(c).find("unread        1 tensor(s) that Glm4MoeForCausalLM does not read:\n  - "
                                 "model.layers.0.self_attn.k_scale\n"),
            std::string::npos)
      << inspect_text(c);
  EXPECT_EQ(inspect_json(c)["unread"], nlohmann::json::array({"model.layers.0.self_attn.k_scale"}));
  // Loading warns about it, names the tensor, and loads.
  const std::string out = generate_one_token(tmp.path());
  EXPECT_NE(out.find("warning: " + tmp.path().string() +
                     ": 1 tensor(s) that Glm4MoeForCausalLM does not read: model.layers.0.self_attn.k_scale"),
            std::string::npos)
      << out;
  // The golden checkpoints read every tensor.
  for (const Case& k : kCases) {
    format::Checkpoint g(golden(k.dir));
    const Findings gf = find_problems(g);
    EXPECT_TRUE(gf.unread.empty() && gf.unread_files.empty() && gf.problems.empty()) << k.dir;
  }
}

// The review's cases: a tensor beside a Linear that format::Checkpoint names is still named (only the Linear's
// own parts are deduplicated); a config asking for 40 layers over 3 is a few problems, not 2,295; the MoE
// parser's refusals are problems; a config without n_shared_experts reads the shared expert on disk (both
// parsers default to 1, as transformers does; the MoE one said 0 and skipped it).
TEST(Inspect, ReviewedEdges) {
  {
    TempDir tmp("inspect_router_bias");
    fp4moe::testing::copy_checkpoint(
        golden("glm4_moe_tiny_nvfp4"), tmp.path(),
        [](auto& t) { t.erase("model.layers.1.mlp.gate.e_score_correction_bias"); },
        [](const std::string& file, nlohmann::ordered_json& j) {
          if (file == "hf_quant_config.json") j["quantization"]["exclude_modules"] = {"lm_head"};
          if (file == "config.json") j["quantization_config"]["ignore"] = {"lm_head"};
        });
    format::Checkpoint c(tmp.path());
    std::string all;
    for (const auto& p : find_problems(c).problems) all += p.message + "\n";
    EXPECT_NE(all.find("model.layers.1.mlp.gate: BF16 on disk but not excluded"), std::string::npos) << all;
    EXPECT_NE(all.find("model.layers.1.mlp.gate.e_score_correction_bias: missing"), std::string::npos) << all;
  }
  {
    TempDir tmp("inspect_40_layers");
    fp4moe::testing::copy_checkpoint(golden("glm4_moe_tiny"), tmp.path(), nullptr,
                                     [](const std::string& file, nlohmann::ordered_json& j) {
                                       if (file == "config.json") j["num_hidden_layers"] = 40;
                                     });
    format::Checkpoint c(tmp.path());
    const Findings f = find_problems(c);
    std::string all;
    for (const auto& p : f.problems) all += p.message + "\n";
    EXPECT_LE(f.problems.size(), 5u) << all;
  }
  {
    TempDir tmp("inspect_softmax");
    fp4moe::testing::copy_checkpoint(golden("glm4_moe_tiny"), tmp.path(), nullptr,
                                     [](const std::string& file, nlohmann::ordered_json& j) {
                                       if (file == "config.json") j["scoring_func"] = "softmax";
                                     });
    format::Checkpoint c(tmp.path());
    const Findings f = find_problems(c);
    ASSERT_FALSE(f.problems.empty());
    EXPECT_NE(f.problems.back().message.find("scoring_func 'softmax' is not supported"), std::string::npos)
        << f.problems.back().message;
  }
  {
    TempDir tmp("inspect_shared_default");
    fp4moe::testing::copy_checkpoint(golden("glm4_moe_tiny"), tmp.path(), nullptr,
                                     [](const std::string& file, nlohmann::ordered_json& j) {
                                       if (file == "config.json") j.erase("n_shared_experts");
                                     });
    format::Checkpoint c(tmp.path());
    const Findings f = find_problems(c);
    EXPECT_TRUE(f.problems.empty() && f.unread.empty())
        << (f.problems.empty() ? f.unread.front() : f.problems.front().message);
    // The same greedy tokens as the golden model, whose config says n_shared_experts 1.
    std::string a, b;
    const std::string gen =
        std::string(FP4MOE_CLI) + " generate --prompt-ids 5,17,99 --max-new-tokens 4 --greedy --model ";
    ASSERT_EQ(testing::run_command(gen + tmp.path().string() + " 2>/dev/null | grep -i ids", &a), 0) << a;
    ASSERT_EQ(testing::run_command(gen + golden("glm4_moe_tiny").string() + " 2>/dev/null | grep -i ids", &b), 0) << b;
    EXPECT_EQ(a, b);
  }
}

// A config the model's parser refuses is a problem (format::Checkpoint reads fewer fields).
TEST(Inspect, ConfigTheModelRefusesIsAProblem) {
  TempDir tmp("inspect_model_config");
  fp4moe::testing::copy_checkpoint(golden("glm4_moe_tiny"), tmp.path(), nullptr,
                                   [](const std::string& file, nlohmann::ordered_json& j) {
                                     if (file == "config.json") j["num_key_value_heads"] = 3;
                                   });
  format::Checkpoint c(tmp.path());
  const Findings f = find_problems(c);
  ASSERT_FALSE(f.problems.empty());
  EXPECT_EQ(f.problems.back().module, "config.json");
  EXPECT_NE(f.problems.back().message.find("the model loader refuses it: "), std::string::npos)
      << f.problems.back().message;
}

// A quantization section the loader refuses is named once, by format::Checkpoint: the loader's refusal repeated its
// first problem with a source location inside inspect's own list (the formats.md example: hf_quant_config.json no
// longer excludes lm_head).
TEST(Inspect, RefusedQuantizationSectionIsNamedOnce) {
  TempDir tmp("inspect_quant_refused");
  fp4moe::testing::copy_checkpoint(golden("glm4_moe_tiny_nvfp4"), tmp.path(), nullptr,
                                   [](const std::string& file, nlohmann::ordered_json& j) {
                                     if (file == "hf_quant_config.json")
                                       j["quantization"]["exclude_modules"] = {"model.layers.*.mlp.gate"};
                                   });
  format::Checkpoint c(tmp.path());
  const Findings f = find_problems(c);
  const std::string text = inspect_text(c, f);
  ASSERT_EQ(f.problems.size(), 2u) << text;
  EXPECT_NE(f.problems[0].message.find("exclusion lists disagree"), std::string::npos) << text;
  EXPECT_EQ(f.problems[1].module, "lm_head") << text;
  EXPECT_EQ(text.find("the model loader refuses it"), std::string::npos) << text;
  EXPECT_EQ(text.find(".cpp:"), std::string::npos) << text;
}

// A checkpoint whose Linears are stored otherwise than its quantization section says (the section dropped from an
// NVFP4 checkpoint, or an NVFP4 section beside BF16 weights): inspect lists each as a problem, the model loader
// reads each as stored and warns once with the count and the first (the same rule, QuantConfig::disagreement).
TEST(Inspect, QuantConfigAgainstTheWeightsWarnsAtLoad) {
  struct Edit {
    const char* from;
    bool drop_section;  // else: add glm5_tiny_nvfp4's section to the BF16 checkpoint
    const char* want;
  };
  for (const Edit& e :
       {Edit{"glm5_tiny_nvfp4", true, "NVFP4 on disk but the checkpoint has no quantization config"},
        Edit{"glm5_tiny", false, "BF16 on disk but not excluded, and hf_quant_config.json says quant_algo NVFP4"}}) {
    TempDir tmp("inspect_quant_disagrees");
    fp4moe::testing::copy_checkpoint(golden(e.from), tmp.path(), nullptr,
                                     [&](const std::string& file, nlohmann::ordered_json& j) {
                                       if (file == "config.json" && e.drop_section) j.erase("quantization_config");
                                     });
    if (e.drop_section) {
      std::filesystem::remove(tmp.path() / "hf_quant_config.json");
    } else {
      std::filesystem::copy_file(golden("glm5_tiny_nvfp4") / "hf_quant_config.json",
                                 tmp.path() / "hf_quant_config.json");
    }
    format::Checkpoint c(tmp.path());
    const Findings f = find_problems(c);
    EXPECT_EQ(f.problems.size(), 105u) << e.from;  // glm5_tiny_nvfp4's NVFP4 Linears
    EXPECT_NE(f.problems.front().message.find(e.want), std::string::npos) << f.problems.front().message;
    const std::string out = generate_one_token(tmp.path());
    EXPECT_NE(out.find("warning: " + tmp.path().string() +
                       ": 105 Linear(s) are stored otherwise than the quantization config says, e.g. "),
              std::string::npos)
        << out;
    EXPECT_NE(out.find(e.want), std::string::npos) << out;
  }
  // The golden checkpoints agree with their sections: no warning.
  for (const Case& k : kCases) {
    const std::string out = generate_one_token(golden(k.dir));
    EXPECT_EQ(out.find("warning"), std::string::npos) << k.dir << ": " << out;
  }
}

// generation_config.json: inspect shows what ends a sequence (config.json's eos and its own) and its sampling values,
// and reports a value the server refuses (a request's range) or a file the loader refuses.
TEST(Inspect, GenerationConfig) {
  auto with_generation = [](const TempDir& tmp, nlohmann::ordered_json g) {
    fp4moe::testing::copy_checkpoint(golden("glm5_tiny"), tmp.path(), nullptr,
                                     [&](const std::string& file, nlohmann::ordered_json& j) {
                                       if (file == "generation_config.json") j = g;
                                     });
    format::Checkpoint c(tmp.path());
    return std::make_pair(find_problems(c), inspect_text(c));
  };
  {
    TempDir tmp("inspect_generation_ok");
    const auto [f, text] = with_generation(tmp, {{"eos_token_id", {3, 1}}, {"temperature", 0.6}, {"top_p", 0.95}});
    EXPECT_TRUE(f.problems.empty()) << text;
    EXPECT_EQ(f.eos_token_ids, (std::vector<int64_t>{1, 3}));  // config.json's 1 first
    EXPECT_NE(text.find("generation    eos [1, 3]; sampling defaults temperature 0.6, top_p 0.95 ("), std::string::npos)
        << text;
    format::Checkpoint c(tmp.path());
    const auto j = inspect_json(c, f);
    EXPECT_EQ(j["generation"]["eos_token_ids"], nlohmann::json::array({1, 3}));
    EXPECT_EQ(j["generation"]["sampling_defaults"]["top_p"], 0.95);
    EXPECT_FALSE(j["generation"]["sampling_defaults"].contains("top_k"));
  }
  {
    TempDir tmp("inspect_generation_range");
    const auto [f, text] = with_generation(tmp, {{"temperature", 0.6}, {"top_p", 0}});
    ASSERT_EQ(f.problems.size(), 1u) << text;
    EXPECT_EQ(f.problems[0].module, "generation_config.json");
    EXPECT_NE(f.problems[0].message.find("generation_config.json: top_p 0 must be in (0, 1]"), std::string::npos)
        << f.problems[0].message;
  }
  {
    TempDir tmp("inspect_generation_type");
    const auto [f, text] = with_generation(tmp, {{"top_k", "forty"}, {"eos_token_id", 3}});
    ASSERT_EQ(f.problems.size(), 1u) << text;
    EXPECT_EQ(f.problems[0].module, "generation_config.json");
    EXPECT_NE(f.problems[0].message.find("serve --sampling-defaults model refuses it: "), std::string::npos);
    EXPECT_NE(f.problems[0].message.find("generation_config.json: field \"top_k\" must be an integer"),
              std::string::npos)
        << f.problems[0].message;
    EXPECT_NE(text.find("generation    eos [1, 3]\n"), std::string::npos) << text;  // the loader reads the rest
  }
  // A file the loader refuses is one problem, named as the file's, and the tensors are still checked.
  TempDir tmp("inspect_generation_malformed");
  fp4moe::testing::copy_checkpoint(golden("glm5_tiny"), tmp.path(),
                                   [](auto& t) { t.erase("model.layers.0.input_layernorm.weight"); });
  std::ofstream(tmp.path() / "generation_config.json") << "{\"eos_token_id\": ";
  format::Checkpoint c(tmp.path());
  const Findings f = find_problems(c);
  ASSERT_EQ(f.problems.size(), 2u) << inspect_text(c, f);
  EXPECT_EQ(f.problems[0].module, "generation_config.json");
  EXPECT_NE(f.problems[0].message.find("the model loader refuses it: "), std::string::npos);
  EXPECT_NE(f.problems[0].message.find("malformed JSON"), std::string::npos) << f.problems[0].message;
  EXPECT_EQ(f.problems[1].module, "model.layers.0.input_layernorm.weight");
}

TEST(Inspect, DemoCheckpointIsDeterministicAndClean) {
  TempDir a("inspect_demo_a"), b("inspect_demo_b");
  write_demo_bf16_checkpoint(a.path(), 7);
  write_demo_bf16_checkpoint(b.path(), 7);
  std::ifstream fa(a.path() / "model.safetensors", std::ios::binary), fb(b.path() / "model.safetensors", std::ios::binary);
  std::stringstream sa, sb;
  sa << fa.rdbuf();
  sb << fb.rdbuf();
  EXPECT_EQ(sa.str(), sb.str());
  write_demo_bf16_checkpoint(b.path(), 8);
  std::ifstream fc(b.path() / "model.safetensors", std::ios::binary);
  std::stringstream sc;
  sc << fc.rdbuf();
  EXPECT_NE(sa.str(), sc.str());

  format::Checkpoint bf16(a.path());
  EXPECT_TRUE(bf16.problems().empty()) << inspect_text(bf16);
  // 2 layers: attention 4+4, dense MLP 3, 8 experts * 3 + shared 3, router 1, lm_head 1 = 40.
  EXPECT_EQ(bf16.linear_summary().n_bf16, 40);
  format::quantize_checkpoint(format::Checkpoint(a.path()), a.path() / "q", {});
  format::Checkpoint q(a.path() / "q");
  EXPECT_TRUE(q.problems().empty()) << inspect_text(q);
  EXPECT_EQ(q.linear_summary().n_nvfp4, 38);
  EXPECT_EQ(q.n_experts_on_disk(1), 8);
  EXPECT_EQ(q.n_parameters(), bf16.n_parameters());
}

TEST(Inspect, CliEndToEnd) {
  const std::string cli = FP4MOE_CLI;
  std::string out;
  EXPECT_EQ(testing::run_command(cli + " inspect " + golden("glm5_tiny_nvfp4").string(), &out), 0) << out;
  EXPECT_NE(out.find("Linears              105      27"), std::string::npos) << out;

  EXPECT_EQ(testing::run_command(cli + " inspect --json " + golden("glm5_tiny").string(), &out), 0) << out;
  auto j = nlohmann::json::parse(out);
  EXPECT_EQ(j["architecture"], "GlmMoeDsaForCausalLM");
  EXPECT_EQ(j["modules"]["linear_bf16"], 132);

  EXPECT_EQ(testing::run_command(cli + " inspect --demo", &out), 0) << out;
  EXPECT_NE(out.find("Linears               38       2"), std::string::npos) << out;
  EXPECT_NE(out.find("problems      none"), std::string::npos) << out;

  TempDir tmp("inspect_cli_broken");
  fp4moe::testing::copy_checkpoint(golden("glm4_moe_tiny_nvfp4"), tmp.path(), [](auto& t) {
    t.erase("model.layers.0.self_attn.v_proj.weight_scale_2");
  });
  EXPECT_EQ(testing::run_command(cli + " inspect " + tmp.path().string(), &out), 1) << out;
  EXPECT_NE(out.find("model.layers.0.self_attn.v_proj: NVFP4 weight has no .weight_scale_2"),
            std::string::npos)
      << out;
  // The report first, then the exit's reason, without a check's source line.
  EXPECT_NE(out.find("fp4moe: error: checkpoint " + tmp.path().string() + " has 1 problem(s), listed above\n"),
            std::string::npos)
      << out;
  EXPECT_LT(out.find("problems      1"), out.find("fp4moe: error:")) << out;
  EXPECT_EQ(out.find(".cpp:"), std::string::npos) << out;
  EXPECT_EQ(
      testing::run_command(cli + " inspect --demo-dir /tmp/fp4moe_demo_unused " + golden("glm5_tiny").string(), &out),
      2)
      << out;  // it was ignored without --demo
  EXPECT_NE(out.find("--demo-dir requires --demo"), std::string::npos) << out;
  // A --demo-dir that is a file is named as one (was "filesystem error: cannot create directories: Not a directory").
  EXPECT_EQ(testing::run_command(
                cli + " inspect --demo --demo-dir " + (golden("glm4_moe_tiny") / "config.json").string(), &out),
            1);
  EXPECT_NE(out.find("config.json is a file, not a folder (the demo writes bf16/ and nvfp4/ checkpoints into it)"),
            std::string::npos)
      << out;
  EXPECT_EQ(testing::run_command(
                cli + " inspect --demo --demo-dir " + (golden("glm4_moe_tiny") / "config.json" / "sub").string(), &out),
            1);
  EXPECT_NE(out.find("inspect --demo: cannot write the demo checkpoints under "), std::string::npos) << out;
  EXPECT_NE(out.find("config.json/sub: Not a directory"), std::string::npos) << out;
  EXPECT_NE(testing::run_command(cli + " inspect /nonexistent/dir", &out), 0);
  EXPECT_NE(out.find("/nonexistent/dir does not exist"), std::string::npos) << out;
  const std::string file = (golden("glm4_moe_tiny") / "config.json").string();
  EXPECT_NE(testing::run_command(cli + " inspect " + file, &out), 0);
  EXPECT_NE(out.find(file + " is a file, not a directory"), std::string::npos) << out;
  EXPECT_NE(testing::run_command(cli + " generate --prompt-ids 1 --model " + file, &out), 0);
  EXPECT_NE(out.find(file + " is a file; give the model's directory"), std::string::npos) << out;
}

}  // namespace
}  // namespace fp4moe::tools
