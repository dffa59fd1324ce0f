// Tests for `fp4moe quantize` (the CLI) and its calibration: weight tensors equal the golden NVFP4
// models bit for bit, calibration on the golden prompts reproduces the golden input_scale of the
// modules whose input is unambiguous (attention, dense MLP, shared-expert gate/up), the output
// passes the checkpoint checks, prompt files are parsed strictly. Run: ctest -R test_quantize.
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <set>

#include "format/checkpoint.h"
#include "format/checkpoint_edit.h"
#include "format/quantize_checkpoint.h"
#include "testing/testing.h"
#include "tools/quantize.h"

namespace fp4moe::tools {
namespace {

using fp4moe::testing::TempDir;

std::filesystem::path golden(const std::string& name) {
  return fp4moe::testing::shared_path("golden/models/" + name);
}

// The golden prompts (input_ids I64 [2, 16]) as a prompt file.
std::filesystem::path write_golden_prompts(const std::string& model, const std::filesystem::path& dir) {
  format::SafetensorsFile f(golden(model) / "golden.safetensors");
  TensorView ids = f.view("input_ids");
  auto v = ids.as<int64_t>();
  const std::filesystem::path path = dir / "prompts.txt";
  std::ofstream out(path);
  out << "# golden input_ids\n";
  for (int64_t r = 0; r < ids.dim(0); ++r) {
    for (int64_t c = 0; c < ids.dim(1); ++c) out << (c ? ", " : "") << v[r * ids.dim(1) + c];
    out << "\n";
  }
  return path;
}

// Weight tensors (everything but input_scale) equal the golden model's byte for byte.
void expect_weights_equal(const std::filesystem::path& got_dir, const std::filesystem::path& want_dir) {
  format::TensorStore got(got_dir), want(want_dir);
  int64_t n = 0;
  for (const std::string& name : want.names()) {
    if (name.ends_with(".input_scale")) continue;
    ASSERT_TRUE(got.contains(name)) << name;
    TensorView a = got.view(name), b = want.view(name);
    EXPECT_EQ(a.shape, b.shape) << name;
    EXPECT_EQ(a.dtype, b.dtype) << name;
    EXPECT_TRUE(a.bytes.size() == b.bytes.size() &&
                std::memcmp(a.bytes.data(), b.bytes.data(), a.bytes.size()) == 0)
        << name;
    ++n;
  }
  EXPECT_GT(n, 100);
}

TEST(QuantizeCli, NoCalibrationIsWeightOnlyAndBitExact) {
  TempDir tmp("quantize_cli_w4a16");
  std::string out;
  ASSERT_EQ(testing::run_command(std::string(FP4MOE_CLI) + " quantize --no-calibration " + golden("glm4_moe_tiny").string() +
                    " " + (tmp.path() / "q").string(),
                &out),
            0)
      << out;
  EXPECT_NE(out.find("quantized 117 Linears to W4A16_NVFP4"), std::string::npos) << out;
  EXPECT_NE(out.find("input_scale not written"), std::string::npos) << out;
  expect_weights_equal(tmp.path() / "q", golden("glm4_moe_tiny_nvfp4"));
  format::Checkpoint c(tmp.path() / "q");
  EXPECT_TRUE(c.problems().empty());
  EXPECT_EQ(testing::run_command(std::string(FP4MOE_CLI) + " inspect " + (tmp.path() / "q").string(), &out), 0) << out;
}

// A folder without an index reads every *.safetensors as a shard; one none of whose tensors the model reads (test data
// beside the weights) is not written as a shard of the output, and a warning names it.
TEST(QuantizeCli, FilesTheModelDoesNotReadAreNotWritten) {
  TempDir tmp("quantize_cli_unread_file");
  const std::filesystem::path in = tmp.path() / "in";
  std::filesystem::create_directories(in);
  for (const char* f : {"config.json", "generation_config.json"})
    std::filesystem::copy_file(golden("glm4_moe_tiny") / f, in / f);
  std::filesystem::copy_file(golden("glm4_moe_tiny") / "model.safetensors", in / "weights.safetensors");
  std::filesystem::copy_file(golden("glm4_moe_tiny") / "golden.safetensors", in / "golden.safetensors");
  std::string out;
  ASSERT_EQ(testing::run_command(std::string(FP4MOE_CLI) + " quantize --no-calibration " + in.string() + " " +
                                     (tmp.path() / "q").string() + " 2>&1",
                                 &out),
            0)
      << out;
  EXPECT_NE(out.find("quantize: warning: golden.safetensors holds 10 tensor(s), none of which Glm4MoeForCausalLM "
                     "reads: not written"),
            std::string::npos)
      << out;
  EXPECT_TRUE(std::filesystem::exists(tmp.path() / "q" / "model.safetensors"));  // one input file left: no shards
  EXPECT_FALSE(std::filesystem::exists(tmp.path() / "q" / "model.safetensors.index.json"));
  expect_weights_equal(tmp.path() / "q", golden("glm4_moe_tiny_nvfp4"));
  EXPECT_EQ(testing::run_command(std::string(FP4MOE_CLI) + " inspect " + (tmp.path() / "q").string(), &out), 0) << out;
  EXPECT_EQ(out.find("not read"), std::string::npos) << out;
}

// Calibrated on the golden prompts: weights bit-exact, and input_scale equal (to f32 rounding of
// two different forward implementations) wherever the golden calibration observed the same
// tensor: attention and dense-MLP inputs, and the shared experts' gate/up (the MoE layer input).
void calibrated_case(const std::string& model, const std::string& extra_args, int64_t n_quantized,
                     const std::vector<std::string>& compare) {
  TempDir tmp("quantize_cli_calib");
  const auto prompts = write_golden_prompts(model, tmp.path());
  std::string out;
  ASSERT_EQ(testing::run_command(std::string(FP4MOE_CLI) + " quantize " + extra_args + " --calib-prompts " +
                    prompts.string() + " " + golden(model).string() + " " + (tmp.path() / "q").string(),
                &out),
            0)
      << out;
  EXPECT_NE(out.find("calibrated " + std::to_string(n_quantized) + " modules on 2 prompts (32 tokens)"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("to NVFP4"), std::string::npos) << out;
  EXPECT_EQ(out.find("matches no Linear module"), std::string::npos) << out;
  expect_weights_equal(tmp.path() / "q", golden(model + "_nvfp4"));
  format::Checkpoint c(tmp.path() / "q");
  EXPECT_TRUE(c.problems().empty());
  int64_t n_with_scale = 0;
  for (const auto& m : c.modules()) n_with_scale += m.has_input_scale;
  EXPECT_EQ(n_with_scale, n_quantized);
  format::TensorStore want(golden(model + "_nvfp4"));
  for (const std::string& m : compare) {
    const float got = c.tensor(m + ".input_scale").as<float>()[0];
    const float ref = want.view(m + ".input_scale").as<float>()[0];
    EXPECT_NEAR(got, ref, 1e-4f * ref) << m;
  }
}

TEST(QuantizeCli, CalibratedGlm4) {
  std::vector<std::string> compare;
  for (int l = 0; l < 3; ++l) {
    const std::string p = "model.layers." + std::to_string(l);
    for (const char* a : {"q_proj", "k_proj", "v_proj", "o_proj"}) compare.push_back(p + ".self_attn." + a);
    if (l == 0) {
      for (const char* m : {"gate_proj", "up_proj", "down_proj"}) compare.push_back(p + ".mlp." + m);
    } else {
      compare.push_back(p + ".mlp.shared_experts.gate_proj");
      compare.push_back(p + ".mlp.shared_experts.up_proj");
    }
  }
  calibrated_case("glm4_moe_tiny", "", 117, compare);
}

TEST(QuantizeCli, CalibratedGlm5AttentionExcluded) {
  calibrated_case("glm5_tiny", "--exclude 'model.layers.*.self_attn*'", 105,
                  {"model.layers.0.mlp.gate_proj", "model.layers.0.mlp.up_proj",
                   "model.layers.0.mlp.down_proj", "model.layers.1.mlp.shared_experts.gate_proj",
                   "model.layers.2.mlp.shared_experts.up_proj"});
}

TEST(QuantizeCli, RefusesBeforeCalibrating) {
  // An already-quantized input and a non-empty output are refused before the calibration pass runs.
  TempDir tmp("quantize_cli_refuse");
  std::string out;
  EXPECT_EQ(testing::run_command(std::string(FP4MOE_CLI) + " quantize " + golden("glm4_moe_tiny_nvfp4").string() + " " +
                                     (tmp.path() / "q").string(),
                                 &out),
            1);
  EXPECT_NE(out.find("is already quantized (117 NVFP4 modules"), std::string::npos) << out;
  EXPECT_EQ(out.find("calibrated"), std::string::npos) << out;
  std::filesystem::create_directories(tmp.path() / "full");
  std::ofstream(tmp.path() / "full" / "x") << "x";
  EXPECT_EQ(testing::run_command(std::string(FP4MOE_CLI) + " quantize " + golden("glm4_moe_tiny").string() + " " +
                                     (tmp.path() / "full").string(),
                                 &out),
            1);
  EXPECT_NE(out.find("already exists and is not empty"), std::string::npos) << out;
  EXPECT_EQ(out.find("calibrated"), std::string::npos) << out;
  // A file as the output, or under it: said so before any work (it said "not empty", or failed after the run).
  const std::string file = (tmp.path() / "full" / "x").string();
  for (const auto& [dest, want] : {std::pair{file, file + " exists and is not a directory"},
                                   std::pair{file + "/out", "cannot be created: " + file + " is not a directory"}}) {
    EXPECT_EQ(testing::run_command(
                  std::string(FP4MOE_CLI) + " quantize " + golden("glm4_moe_tiny").string() + " " + dest, &out),
              1);
    EXPECT_NE(out.find(want), std::string::npos) << out;
    EXPECT_EQ(out.find("calibrated"), std::string::npos) << out;
  }
  // An output directory that cannot be made (here under /proc, which passes the writable-ancestor check as root) is
  // refused before calibrating, naming it (it was a raw filesystem_error after the calibration pass).
  EXPECT_EQ(testing::run_command(std::string(FP4MOE_CLI) + " quantize " + golden("glm4_moe_tiny").string() +
                                     " /proc/fp4moe_quantize_out",
                                 &out),
            1);
  EXPECT_NE(out.find("quantize: "), std::string::npos) << out;
  EXPECT_NE(out.find("/proc/fp4moe_quantize_out"), std::string::npos) << out;
  EXPECT_EQ(out.find("calibrated"), std::string::npos) << out;
  EXPECT_EQ(out.find("filesystem error"), std::string::npos) << out;
  // An empty --exclude pattern is refused before any work (it was accepted and written to the exclusion list): a
  // usage error, as every option given an empty value.
  EXPECT_EQ(testing::run_command(std::string(FP4MOE_CLI) + " quantize --exclude '' " +
                                     golden("glm4_moe_tiny").string() + " " + (tmp.path() / "q2").string(),
                                 &out),
            2);
  EXPECT_NE(out.find("--exclude: is empty: give a value or leave the option out"), std::string::npos) << out;
  EXPECT_EQ(out.find("calibrated"), std::string::npos) << out;
  EXPECT_FALSE(std::filesystem::exists(tmp.path() / "q2"));
  // Patterns that exclude every Linear: refused before calibrating (it was refused after the calibration pass).
  EXPECT_EQ(testing::run_command(std::string(FP4MOE_CLI) + " quantize --exclude '*' " +
                                     golden("glm4_moe_tiny").string() + " " + (tmp.path() / "q3").string(),
                                 &out),
            1);
  EXPECT_NE(out.find("quantize: the exclusion patterns leave no Linear to quantize in"), std::string::npos) << out;
  EXPECT_EQ(out.find("calibrated"), std::string::npos) << out;
  EXPECT_FALSE(std::filesystem::exists(tmp.path() / "q3"));
}

TEST(QuantizeCli, BadPromptsAreNamed) {
  TempDir tmp("quantize_cli_bad");
  {
    std::ofstream(tmp.path() / "bad.txt") << "1, 2, x3\n";
    std::ofstream(tmp.path() / "big.txt") << "1 2 999999\n";
  }
  std::string out;
  EXPECT_EQ(testing::run_command(std::string(FP4MOE_CLI) + " quantize --calib-prompts " + (tmp.path() / "bad.txt").string() +
                    " " + golden("glm4_moe_tiny").string() + " " + (tmp.path() / "q").string(),
                &out),
            1);
  EXPECT_NE(out.find("bad.txt:1: 'x3' is not a token id"), std::string::npos) << out;
  // A run that fails after making its output directory removes it again (it was left behind, empty); an output
  // directory that existed (empty) stays, empty.
  EXPECT_FALSE(std::filesystem::exists(tmp.path() / "q"));
  std::filesystem::create_directories(tmp.path() / "q");
  EXPECT_EQ(testing::run_command(std::string(FP4MOE_CLI) + " quantize --calib-prompts " + (tmp.path() / "big.txt").string() +
                    " " + golden("glm4_moe_tiny").string() + " " + (tmp.path() / "q").string(),
                &out),
            1);
  EXPECT_NE(out.find("calibration prompt #1 (of 1): token id 999999 is outside the vocabulary [0, 512)"),
            std::string::npos)
      << out;
  EXPECT_TRUE(std::filesystem::is_directory(tmp.path() / "q"));
  EXPECT_TRUE(std::filesystem::is_empty(tmp.path() / "q"));
  // A line of separators only names its line (it was "calibration prompt 0 is empty"); a directory says so.
  std::ofstream(tmp.path() / "empty.txt") << "1 2\n,,,\n";
  EXPECT_THROW(read_prompt_ids(tmp.path() / "empty.txt"), Error);
  try {
    read_prompt_ids(tmp.path() / "empty.txt");
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("empty.txt:2: the prompt holds no token id"), std::string::npos) << e.what();
  }
  try {
    read_prompt_ids(tmp.path());
    FAIL() << "read a directory";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("is a directory, not a file"), std::string::npos) << e.what();
  }
}

TEST(Calibration, PromptFileAndBuiltinSet) {
  TempDir tmp("quantize_prompts");
  std::ofstream(tmp.path() / "p.txt") << "# comment\n3,4 5\n\n  7\t8,9\n";
  PromptIds p = read_prompt_ids(tmp.path() / "p.txt");
  ASSERT_EQ(p.size(), 2u);
  EXPECT_EQ(p[0], (std::vector<int32_t>{3, 4, 5}));
  EXPECT_EQ(p[1], (std::vector<int32_t>{7, 8, 9}));
  PromptIds a = builtin_calibration_prompts(512), b = builtin_calibration_prompts(512);
  EXPECT_EQ(a, b);
  ASSERT_EQ(a.size(), 8u);
  std::set<int32_t> distinct;
  for (const auto& s : a) {
    for (int32_t id : s) {
      EXPECT_GE(id, 0);
      EXPECT_LT(id, 512);
      distinct.insert(id);
    }
  }
  EXPECT_GT(distinct.size(), 200u);
}

TEST(Calibration, BuiltinSetCoversEveryModule) {
  const auto modules = format::modules_to_quantize(format::Checkpoint(golden("glm4_moe_tiny")), {});
  ASSERT_EQ(modules.size(), 117u);
  Calibration cal = calibrate_input_amax(golden("glm4_moe_tiny"), builtin_calibration_prompts(512), modules);
  EXPECT_EQ(cal.input_amax.size(), 117u);
  EXPECT_EQ(cal.n_tokens, 8 * 64);
  for (const auto& [m, a] : cal.input_amax) EXPECT_TRUE(std::isfinite(a) && a > 0.0f) << m;
}

}  // namespace
}  // namespace fp4moe::tools
