// Built-in dummy presets (model/presets.h) and the parallel dummy writer: every preset parses as a
// config of its architecture with the spec's widths, its manifest holds the hand-computed routed
// expert parameter count, `--model NAME` without --load-format dummy and an unknown name are refused
// with the reason, and two dummy checkpoints from the same seed are byte-identical (the writer makes
// the tensors on the thread pool but writes them in manifest order).
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <functional>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "core/error.h"
#include "model/config.h"
#include "model/glm4_moe.h"
#include "model/glm5.h"
#include "model/presets.h"
#include "model/registry.h"
#include "testing/testing.h"

namespace fp4moe::model {
namespace {

int64_t numel_containing(const std::vector<WeightSpec>& m, const std::string& needle) {
  int64_t n = 0;
  for (const WeightSpec& w : m) {
    if (w.name.find(needle) == std::string::npos) continue;
    int64_t e = 1;
    for (int64_t d : w.shape) e *= d;
    n += e;
  }
  return n;
}

using fp4moe::testing::error_of;

TEST(Presets, ParseWithTheSpecWidthsAndExpertCounts) {
  ASSERT_EQ(preset_names(), (std::vector<std::string>{"glm5-shard", "glm5-small", "glm45-air-shard"}));
  EXPECT_FALSE(preset_config("glm5").has_value());
  const ModelConfig g5 = parse_model_config(*preset_config("glm5-shard"), "glm5-shard");
  EXPECT_EQ(g5.architecture, kArchGlmMoeDsa);
  EXPECT_EQ(g5.hidden_size, 6144);
  EXPECT_EQ(g5.num_attention_heads, 64);
  EXPECT_EQ(g5.kv_lora_rank, 512);
  EXPECT_EQ(g5.qk_rope_head_dim, 64);
  EXPECT_EQ(g5.n_routed_experts, 32);
  EXPECT_EQ(g5.num_hidden_layers, 4);
  // 3 MoE layers x 32 experts x (gate + up + down) x 6144 x 2048.
  EXPECT_EQ(numel_containing(glm_moe_dsa_manifest(g5), ".mlp.experts."), int64_t{3} * 32 * 3 * 6144 * 2048);
  const ModelConfig small = parse_model_config(*preset_config("glm5-small"), "glm5-small");
  EXPECT_EQ(numel_containing(glm_moe_dsa_manifest(small), ".mlp.experts."), int64_t{7} * 64 * 3 * 2048 * 768);
  const ModelConfig air = parse_model_config(*preset_config("glm45-air-shard"), "glm45-air-shard");
  EXPECT_EQ(air.architecture, kArchGlm4Moe);
  EXPECT_EQ(air.hidden_size, 4096);
  EXPECT_EQ(air.num_key_value_heads, 8);
  EXPECT_EQ(air.head_dim, 128);
  EXPECT_EQ(air.rotary_dim(), 64);
  EXPECT_EQ(numel_containing(glm4_moe_manifest(air), ".mlp.experts."), int64_t{3} * 32 * 3 * 4096 * 1408);
  EXPECT_NE(describe_presets().find("glm5-shard: GLM-5 widths"), std::string::npos);
}

TEST(Presets, NeedDummyLoadAndUnknownNamesListThePresets) {
  LoadOptions o;
  o.progress = false;
  EXPECT_NE(error_of([&] { load_model("glm5-shard", o); }).find("preset glm5-shard has no weights: load it with --load-format dummy"),
            std::string::npos);
  const std::string e = error_of([&] { load_model("/nonexistent/fp4moe-model", o); });
  EXPECT_NE(e.find("is neither a model directory nor a preset (glm5-shard, glm5-small, glm45-air-shard)"),
            std::string::npos)
      << e;
}

TEST(Presets, ParallelDummyWriterIsByteIdenticalForTheSameSeed) {
  const ModelConfig c = load_model_config(fp4moe::testing::shared_path("golden/models/glm5_tiny"));
  LoadOptions o;
  o.progress = false;
  o.seed = 11;
  o.dummy_weights = DummyWeights::kNVFP4;
  const auto base = std::filesystem::temp_directory_path() / ("fp4moe-presets-" + std::to_string(::getpid()));
  write_dummy_checkpoint(c, o, base / "a");
  write_dummy_checkpoint(c, o, base / "b");
  auto read = [](const std::filesystem::path& p) {
    std::ifstream in(p, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  const std::string a = read(base / "a" / "model.safetensors"), b = read(base / "b" / "model.safetensors");
  std::filesystem::remove_all(base);
  ASSERT_GT(a.size(), 100000u);
  EXPECT_TRUE(a == b) << "two dummy checkpoints of seed 11 differ";
}

// dummy_checkpoint_bytes is the file's tensor data (its size less the 8-byte length and the JSON header), and
// check_dummy_fits refuses, with the numbers, what the memory or the temp folder cannot hold and NVFP4 for a Linear
// whose in_features is not a multiple of 16.
TEST(Presets, DummyCheckpointsThatCannotBeMadeAreRefusedWithTheirBytes) {
  ModelConfig c = load_model_config(fp4moe::testing::shared_path("golden/models/glm5_tiny"));
  const auto dir = std::filesystem::temp_directory_path() / ("fp4moe-dummy-bytes-" + std::to_string(::getpid()));
  for (DummyWeights w : {DummyWeights::kBF16, DummyWeights::kNVFP4}) {
    LoadOptions o;
    o.progress = false;
    o.dummy_weights = w;
    write_dummy_checkpoint(c, o, dir);
    std::ifstream in(dir / "model.safetensors", std::ios::binary);
    uint64_t header = 0;
    in.read(reinterpret_cast<char*>(&header), 8);
    const uint64_t size = std::filesystem::file_size(dir / "model.safetensors");
    EXPECT_EQ(dummy_checkpoint_bytes(c, o), size - 8 - header) << (w == DummyWeights::kNVFP4 ? "nvfp4" : "bf16");
    std::filesystem::remove_all(dir);
  }
  const ModelConfig shard = load_config_or_preset("glm5-shard");
  LoadOptions o;
  const uint64_t bytes = dummy_checkpoint_bytes(shard, o);
  EXPECT_GT(bytes, 12'000'000'000u);  // GLM-5 widths: 13.1 GB in BF16
  const HostMemory plenty{1e12, "MemAvailable"};
  EXPECT_NO_THROW(check_dummy_fits(shard, o, plenty, "/tmp", UINT64_MAX));
  std::string e = error_of([&] { check_dummy_fits(shard, o, {20e9, "MemAvailable"}, "/tmp", UINT64_MAX); });
  EXPECT_NE(e.find("dummy BF16 weights of GlmMoeDsaForCausalLM (4 layers): a 13.1 GB checkpoint made in memory, then "
                   "copied by the CPU model: ~26.3 GB of host memory; this machine has 20.0 GB available "
                   "(MemAvailable)"),
            std::string::npos)
      << e;
  o.device = Device::kCuda;  // the GPU model uploads the weights: the checkpoint alone
  EXPECT_NO_THROW(check_dummy_fits(shard, o, {20e9, "MemAvailable"}, "/tmp", UINT64_MAX));
  e = error_of([&] { check_dummy_fits(shard, o, {10e9, "cgroup /sys/fs/cgroup/x/memory.max"}, "/tmp", UINT64_MAX); });
  EXPECT_NE(e.find("a 13.1 GB checkpoint made in memory of host memory; this machine has 10.0 GB available (cgroup "),
            std::string::npos)
      << e;
  EXPECT_NO_THROW(check_dummy_fits(shard, o, HostMemory{}, "/tmp", UINT64_MAX));  // memory unknown: not refused
  e = error_of([&] { check_dummy_fits(shard, o, plenty, "/small", 5'000'000'000u); });
  EXPECT_NE(e.find("a 13.1 GB checkpoint is written to /small, which has 5.0 GB free (TMPDIR picks another folder)"),
            std::string::npos)
      << e;
  o.dummy_weights = DummyWeights::kNVFP4;
  EXPECT_LT(dummy_checkpoint_bytes(shard, o), bytes / 2);
  c.hidden_size = 72;  // 72 % 16 = 8: no NVFP4 scale blocks for the Linears that read the hidden state
  e = error_of([&] { check_dummy_fits(c, o, plenty, "/tmp", UINT64_MAX); });
  EXPECT_NE(e.find("--dummy-weights nvfp4: model.layers.0."), std::string::npos) << e;
  EXPECT_NE(e.find(", 72], and NVFP4 needs in_features a multiple of 16 (its scale block); use --dummy-weights bf16"),
            std::string::npos)
      << e;
}

}  // namespace
}  // namespace fp4moe::model
