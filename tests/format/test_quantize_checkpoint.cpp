// Tests for format/quantize_checkpoint: quantizing the golden BF16 models reproduces the golden
// NVFP4 models' weight, weight_scale and weight_scale_2 bit for bit (input_scale comes from
// calibration, which is given here), the JSON files have the golden shapes, the output passes
// the checkpoint checks, and misuse fails with named errors.
// Run: ctest -R test_quantize_checkpoint.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>

#include "format/checkpoint.h"
#include "format/checkpoint_edit.h"
#include "format/quantize_checkpoint.h"
#include "testing/testing.h"

namespace fp4moe::format {
namespace {

using testing::TempDir;

std::filesystem::path golden(const std::string& name) {
  return fp4moe::testing::shared_path("golden/models/" + name);
}

bool is_input_scale(const std::string& name) { return name.ends_with(".input_scale"); }

// The golden model's input_scale values turned back into amax (input_scale * 2688).
std::map<std::string, float> golden_input_amax(const std::filesystem::path& dir) {
  TensorStore store(dir);
  std::map<std::string, float> amax;
  for (const std::string& name : store.names()) {
    if (!is_input_scale(name)) continue;
    amax[name.substr(0, name.size() - 12)] = store.view(name).as<float>()[0] * 2688.0f;
  }
  return amax;
}

// Every tensor of `want` except input_scale is in `got` with the same dtype, shape and bytes; and
// no tensor is in `got` that is not in `want`.
void expect_same_tensors(const std::filesystem::path& got_dir, const std::filesystem::path& want_dir,
                         bool expect_input_scales) {
  TensorStore got(got_dir), want(want_dir);
  int64_t n_compared = 0, n_input_scales = 0;
  for (const std::string& name : want.names()) {
    if (is_input_scale(name)) {
      ++n_input_scales;
      ASSERT_EQ(got.contains(name), expect_input_scales) << name;
      if (expect_input_scales) {
        const float a = got.view(name).as<float>()[0], b = want.view(name).as<float>()[0];
        EXPECT_NEAR(a, b, 1e-6f * b) << name;  // amax*2688/2688: at most an ulp or so
        EXPECT_EQ(got.view(name).shape, Shape{}) << name;
      }
      continue;
    }
    ASSERT_TRUE(got.contains(name)) << "missing " << name;
    const TensorView a = got.view(name), b = want.view(name);
    EXPECT_EQ(a.dtype, b.dtype) << name;
    EXPECT_EQ(a.shape, b.shape) << name;
    ASSERT_EQ(a.bytes.size(), b.bytes.size()) << name;
    if (std::memcmp(a.bytes.data(), b.bytes.data(), a.bytes.size()) != 0) {
      size_t i = 0;
      while (a.bytes[i] == b.bytes[i]) ++i;
      ADD_FAILURE() << name << " differs first at byte " << i << ": got " << int(a.bytes[i])
                    << ", golden " << int(b.bytes[i]);
    }
    ++n_compared;
  }
  EXPECT_EQ(static_cast<int64_t>(got.names().size()),
            n_compared + (expect_input_scales ? n_input_scales : 0));
  EXPECT_GT(n_compared, 100);
}

// config.json and hf_quant_config.json equal the golden ones, producer aside.
void expect_same_json(const std::filesystem::path& got_dir, const std::filesystem::path& want_dir) {
  for (const char* file : {"config.json", "hf_quant_config.json"}) {
    auto got = fp4moe::testing::read_json(got_dir / file);
    auto want = fp4moe::testing::read_json(want_dir / file);
    if (got.contains("quantization_config")) got["quantization_config"].erase("producer");
    if (want.contains("quantization_config")) want["quantization_config"].erase("producer");
    got.erase("producer");
    want.erase("producer");
    EXPECT_EQ(got.dump(2), want.dump(2)) << file;  // dump of ordered_json: key order compared too
  }
}

TEST(QuantizeCheckpoint, Glm4ReproducesGoldenBitForBit) {
  TempDir out("quant_glm4");
  QuantizeOptions opt;
  opt.input_amax = golden_input_amax(golden("glm4_moe_tiny_nvfp4"));
  QuantizeReport r = quantize_checkpoint(Checkpoint(golden("glm4_moe_tiny")), out.path() / "q", opt);
  EXPECT_EQ(r.quant_algo, "NVFP4");
  EXPECT_EQ(r.n_quantized, 117);
  EXPECT_EQ(r.n_kept, 3);  // lm_head + 2 routers
  // Groups: q/k/v in 3 layers, gate/up: 1 dense + 2 * (16 experts + 1 shared).
  EXPECT_EQ(r.n_scale_groups, 3 + 1 + 2 * 17);
  expect_same_tensors(out.path() / "q", golden("glm4_moe_tiny_nvfp4"), true);
  expect_same_json(out.path() / "q", golden("glm4_moe_tiny_nvfp4"));
  EXPECT_TRUE(std::filesystem::exists(out.path() / "q" / "generation_config.json"));
  EXPECT_FALSE(std::filesystem::exists(out.path() / "q" / "golden.safetensors"));
  Checkpoint c(out.path() / "q");
  EXPECT_TRUE(c.problems().empty());
  EXPECT_EQ(c.linear_summary().n_nvfp4, 117);
}

TEST(QuantizeCheckpoint, Glm5WithAttentionExcludedReproducesGolden) {
  TempDir out("quant_glm5");
  QuantizeOptions opt;
  opt.exclude = {"model.layers.*.self_attn*"};
  opt.input_amax = golden_input_amax(golden("glm5_tiny_nvfp4"));
  QuantizeReport r = quantize_checkpoint(Checkpoint(golden("glm5_tiny")), out.path() / "q", opt);
  EXPECT_EQ(r.n_quantized, 105);
  EXPECT_EQ(r.n_kept, 24 + 3);
  expect_same_tensors(out.path() / "q", golden("glm5_tiny_nvfp4"), true);
  expect_same_json(out.path() / "q", golden("glm5_tiny_nvfp4"));
  Checkpoint c(out.path() / "q");
  EXPECT_TRUE(c.problems().empty());
  EXPECT_EQ(c.linear_summary().n_nvfp4, 105);
}

// What must stay BF16 is kept so without an --exclude: the GLM-5 indexer's weights_proj (SGLang and vLLM build it
// unquantized) and an MTP layer on disk (ModelOpt's _add_mtp_exclusions; calibration never runs it and failed on
// its 56 modules). Neither pattern is written where another already keeps those modules (the goldens above).
TEST(QuantizeCheckpoint, IndexerWeightsProjAndMtpLayersStayBf16) {
  TempDir out("quant_must_stay");
  QuantizeReport r = quantize_checkpoint(Checkpoint(golden("glm5_tiny")), out.path() / "g5", {});
  EXPECT_EQ(r.exclude_modules, (std::vector<std::string>{"lm_head", "model.layers.*.mlp.gate",
                                                         "model.layers.*.self_attn.indexer.weights_proj"}));
  Checkpoint g5(out.path() / "g5");
  EXPECT_EQ(g5.find_module("model.layers.0.self_attn.indexer.weights_proj")->format, LinearFormat::kBF16);
  EXPECT_EQ(g5.find_module("model.layers.0.self_attn.indexer.wk")->format, LinearFormat::kNVFP4);

  // glm4_moe_tiny with its MTP layer (3; num_nextn_predict_layers 1) on disk: a copy of layer 1 plus eh_proj.
  fp4moe::testing::copy_checkpoint(golden("glm4_moe_tiny"), out.path() / "mtp", [](fp4moe::testing::TensorMap& t) {
    fp4moe::testing::TensorMap more;
    for (const auto& [name, tensor] : t) {
      if (name.rfind("model.layers.1.", 0) == 0) more["model.layers.3." + name.substr(15)] = tensor;
    }
    more["model.layers.3.eh_proj.weight"] = t.at("model.layers.0.mlp.down_proj.weight");
    t.insert(more.begin(), more.end());
  });
  QuantizeOptions calibrated;
  calibrated.input_amax = golden_input_amax(golden("glm4_moe_tiny_nvfp4"));
  r = quantize_checkpoint(Checkpoint(out.path() / "mtp"), out.path() / "mtp_q", calibrated);
  EXPECT_EQ(r.exclude_modules, (std::vector<std::string>{"lm_head", "model.layers.*.mlp.gate", "model.layers.3.*"}));
  Checkpoint q(out.path() / "mtp_q");
  EXPECT_TRUE(q.problems().empty()) << q.problems().front().message;
  EXPECT_EQ(q.find_module("model.layers.3.eh_proj")->format, LinearFormat::kBF16);
  EXPECT_EQ(q.find_module("model.layers.3.mlp.experts.0.up_proj")->format, LinearFormat::kBF16);
  EXPECT_EQ(q.find_module("model.layers.1.mlp.experts.0.up_proj")->format, LinearFormat::kNVFP4);
}

// Linears whose K is not a multiple of 16 are refused before any work, all counted, with the --exclude options that
// keep each family of them (and only them) in BF16: a pattern per family (the routed experts' down_proj, the dense
// MLP's down_proj), all of them in the hint.
TEST(QuantizeCheckpoint, KNotAMultipleOf16IsRefusedWithAPattern) {
  TempDir tmp("quant_odd_k");
  fp4moe::testing::copy_checkpoint(
      golden("glm4_moe_tiny"), tmp.path() / "in",
      [](fp4moe::testing::TensorMap& t) {
        for (auto& [name, tensor] : t) {
          const bool expert = name.find(".mlp.experts.") != std::string::npos;
          const bool dense = name.rfind("model.layers.0.mlp.", 0) == 0;
          if (!(expert || dense) || name.find("_proj.weight") == std::string::npos) continue;
          const bool down = name.find("down_proj") != std::string::npos;
          const int64_t i = expert ? 72 : 200;  // 200 = 16 x 12.5
          tensor.shape = down ? Shape{128, i} : Shape{i, 128};
          tensor.bytes.assign(static_cast<size_t>(128 * i * 2), 0x3c);
        }
      },
      [](const std::string& file, nlohmann::ordered_json& j) {
        if (file == "config.json") {
          j["moe_intermediate_size"] = 72;
          j["intermediate_size"] = 200;
        }
      });
  try {
    modules_to_quantize(Checkpoint(tmp.path() / "in"), {});
    FAIL() << "K = 72 accepted";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("quantize: 33 Linear(s) have in_features K not a multiple of the NVFP4 block (16): "
                     "model.layers.0.mlp.down_proj (K=200), model.layers.1.mlp.experts.0.down_proj (K=72), "),
              std::string::npos)
        << m;
    EXPECT_NE(m.find("; keep them in BF16 with --exclude 'model.layers.*.mlp.down_proj' --exclude "
                     "'model.layers.*.mlp.experts.*.down_proj'"),
              std::string::npos)
        << m;
  }
  EXPECT_EQ(modules_to_quantize(Checkpoint(tmp.path() / "in"),
                                {"model.layers.*.mlp.down_proj", "model.layers.*.mlp.experts.*.down_proj"})
                .size(),
            117u - 33u);
}

// A pattern that matches no Linear is reported (a typo would keep nothing in BF16); an empty one is refused.
TEST(QuantizeCheckpoint, ExclusionPatternsAreChecked) {
  EXPECT_EQ(unmatched_exclusions(Checkpoint(golden("glm5_tiny")),
                                 {"model.layers.*.self_attn*", "model.layers.*.self_atn*", "lm_head", "mlp.gate_proj"}),
            (std::vector<std::string>{"model.layers.*.self_atn*"}));
  try {
    quantize_exclusions({"lm_head", ""}, Checkpoint(golden("glm5_tiny")));
    FAIL() << "an empty pattern was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("quantize: --exclude '' is an empty pattern"), std::string::npos) << e.what();
  }
}

TEST(QuantizeCheckpoint, WithoutCalibrationIsWeightOnly) {
  TempDir out("quant_w4a16");
  QuantizeReport r = quantize_checkpoint(Checkpoint(golden("glm4_moe_tiny")), out.path(), {});
  EXPECT_EQ(r.quant_algo, "W4A16_NVFP4");
  EXPECT_FALSE(r.has_input_scales);
  expect_same_tensors(out.path(), golden("glm4_moe_tiny_nvfp4"), false);
  Checkpoint c(out.path());
  EXPECT_TRUE(c.problems().empty());
  EXPECT_EQ(c.quant().quant_algo, "W4A16_NVFP4");
  EXPECT_FALSE(c.find_module("model.layers.0.self_attn.q_proj")->has_input_scale);
  auto config = fp4moe::testing::read_json(out.path() / "config.json");
  EXPECT_FALSE(config["quantization_config"]["config_groups"]["group_0"].contains("input_activations"));
}

TEST(QuantizeCheckpoint, ShardedInput) {
  TempDir tmp("quant_sharded");
  fp4moe::testing::copy_checkpoint(golden("glm5_tiny"), tmp.path() / "in", nullptr, nullptr, 2);
  QuantizeOptions opt;
  opt.exclude = {"model.layers.*.self_attn*"};
  quantize_checkpoint(Checkpoint(tmp.path() / "in"), tmp.path() / "out", opt);
  EXPECT_TRUE(std::filesystem::exists(tmp.path() / "out" / "model.safetensors.index.json"));
  EXPECT_FALSE(std::filesystem::exists(tmp.path() / "out" / "model.safetensors"));
  expect_same_tensors(tmp.path() / "out", golden("glm5_tiny_nvfp4"), false);
  Checkpoint c(tmp.path() / "out");
  EXPECT_EQ(c.store().files().size(), 2u);
  EXPECT_TRUE(c.problems().empty());
  EXPECT_EQ(c.linear_summary().n_nvfp4, 105);
}

TEST(QuantizeCheckpoint, PartialCalibrationIsRefused) {
  TempDir out("quant_partial");
  QuantizeOptions opt;
  opt.input_amax = golden_input_amax(golden("glm4_moe_tiny_nvfp4"));
  opt.input_amax.erase("model.layers.2.mlp.experts.5.down_proj");
  try {
    quantize_checkpoint(Checkpoint(golden("glm4_moe_tiny")), out.path() / "q", opt);
    FAIL() << "partial calibration accepted";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("116 of 117"), std::string::npos) << msg;
    EXPECT_NE(msg.find("model.layers.2.mlp.experts.5.down_proj"), std::string::npos) << msg;
  }
  EXPECT_FALSE(std::filesystem::exists(out.path() / "q" / "model.safetensors"));

  opt.input_amax = golden_input_amax(golden("glm4_moe_tiny_nvfp4"));
  opt.input_amax["lm_head"] = 1.0f;  // excluded: not quantized, so no input_scale to write
  EXPECT_THROW(quantize_checkpoint(Checkpoint(golden("glm4_moe_tiny")), out.path() / "q", opt), Error);
}

TEST(QuantizeCheckpoint, RefusesQuantizedOrBrokenInput) {
  TempDir out("quant_refuse");
  try {
    quantize_checkpoint(Checkpoint(golden("glm4_moe_tiny_nvfp4")), out.path(), {});
    FAIL() << "quantized input accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("already quantized (117 NVFP4 modules"), std::string::npos)
        << e.what();
  }
  TempDir broken("quant_broken");
  fp4moe::testing::copy_checkpoint(golden("glm4_moe_tiny"), broken.path(), [](auto& t) {
    t.erase("model.layers.1.mlp.experts.2.gate_proj.weight");
  });
  EXPECT_THROW(quantize_checkpoint(Checkpoint(broken.path()), out.path(), {}), Error);
  // A NaN in a weight: the tensor and its [row, col].
  TempDir nan_in("quant_nan");
  fp4moe::testing::copy_checkpoint(golden("glm4_moe_tiny"), nan_in.path(), [](auto& t) {
    auto& w = t.at("model.layers.1.mlp.experts.2.up_proj.weight");
    ASSERT_EQ(w.dtype, DType::kBF16);
    const size_t at = static_cast<size_t>(3 * w.shape[1] + 7);
    w.bytes[2 * at] = 0xC0;  // bf16 0x7FC0: NaN
    w.bytes[2 * at + 1] = 0x7F;
  });
  try {
    quantize_checkpoint(Checkpoint(nan_in.path()), out.path(), {});
    FAIL() << "a NaN weight accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("model.layers.1.mlp.experts.2.up_proj.weight: non-finite value nan at [3, 7]"),
              std::string::npos)
        << e.what();
  }

  std::ofstream(out.path() / "stale.safetensors") << "x";
  try {
    quantize_checkpoint(Checkpoint(golden("glm4_moe_tiny")), out.path(), {});
    FAIL() << "non-empty output directory accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("is not empty"), std::string::npos) << e.what();
  }
}

// The CLI's output directory: a failed run removes the directories it made, each only while empty; a file anyone put
// there keeps it (and its parents); a directory that existed, and a committed run's, stay.
TEST(QuantizeCheckpoint, OutputDirectoryOfAFailedRun) {
  TempDir t("quant_output");
  const std::filesystem::path nested = t.path() / "a" / "b" / "c";
  { QuantizeOutput out(nested); }
  EXPECT_TRUE(std::filesystem::exists(t.path()));
  EXPECT_FALSE(std::filesystem::exists(t.path() / "a"));
  {
    QuantizeOutput out(nested);
    std::ofstream(nested / "tokenizer.json") << "{}";  // put there by someone else during the run
  }
  EXPECT_TRUE(std::filesystem::exists(nested / "tokenizer.json"));
  std::filesystem::remove_all(t.path() / "a");
  std::filesystem::create_directories(t.path() / "empty");
  { QuantizeOutput out(t.path() / "empty"); }
  EXPECT_TRUE(std::filesystem::is_directory(t.path() / "empty"));
  {
    QuantizeOutput out(nested);
    out.commit();
  }
  EXPECT_TRUE(std::filesystem::is_directory(nested));
}

TEST(QuantizeCheckpoint, ScaleGroups) {
  EXPECT_EQ(scale_group_of("model.layers.0.self_attn.k_proj"), "model.layers.0.self_attn.qkv");
  EXPECT_EQ(scale_group_of("model.layers.0.self_attn.o_proj"), "model.layers.0.self_attn.o_proj");
  EXPECT_EQ(scale_group_of("model.layers.1.mlp.experts.9.up_proj"),
            "model.layers.1.mlp.experts.9.gate_up");
  EXPECT_EQ(scale_group_of("model.layers.1.mlp.experts.9.down_proj"),
            "model.layers.1.mlp.experts.9.down_proj");
  EXPECT_EQ(scale_group_of("lm_head"), "lm_head");
}

}  // namespace
}  // namespace fp4moe::format
