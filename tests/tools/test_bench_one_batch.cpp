// `fp4moe bench-one-batch` end to end: runs the built binary (FP4MOE_CLI) on the embedded default
// model and checks the JSON rows (one per batch size, positive latencies) and the bad-input errors.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "testing/testing.h"

namespace {

int run(const std::string& args, std::string* out) {
  return fp4moe::testing::run_command(std::string(FP4MOE_CLI) + " bench-one-batch " + args, out);
}

TEST(BenchOneBatch, DefaultModelJson) {
  std::string out;
  ASSERT_EQ(run("--batch-size 1,3 --input-len 8 --output-len 3 --json", &out), 0) << out;
  const auto j = nlohmann::json::parse(out.substr(out.find('{')));
  EXPECT_EQ(j["architecture"], "GlmMoeDsaForCausalLM");
  ASSERT_EQ(j["results"].size(), 2u);
  EXPECT_EQ(j["results"][0]["batch_size"], 1);
  EXPECT_EQ(j["results"][1]["batch_size"], 3);
  for (const auto& r : j["results"]) {
    EXPECT_GT(r["prefill_latency_s"].get<double>(), 0.0);
    EXPECT_GT(r["median_decode_latency_s"].get<double>(), 0.0);
    EXPECT_GE(r["total_latency_s"].get<double>(), r["prefill_latency_s"].get<double>());
  }
}

TEST(BenchOneBatch, TablePrintsEveryBatchSize) {
  std::string out;
  ASSERT_EQ(run("--batch-size 2 --input-len 4 --output-len 2", &out), 0) << out;
  EXPECT_NE(out.find("decode tok/s"), std::string::npos) << out;
  EXPECT_NE(out.find("\n     2 "), std::string::npos) << out;
}

// --breakdown on the CPU default model (it reports attention and mlp/moe per layer): the parts are
// positive and sum to at most the mean step; no CUDA graphs on the CPU.
TEST(BenchOneBatch, BreakdownSplitsTheDecodeStep) {
  std::string out;
  ASSERT_EQ(run("--batch-size 2 --input-len 4 --output-len 3 --breakdown --json", &out), 0) << out;
  const auto r = nlohmann::json::parse(out.substr(out.find('{')))["results"][0];
  const auto& b = r["decode_breakdown_s"];
  EXPECT_GT(b["attention"].get<double>(), 0.0) << r.dump();
  EXPECT_GT(b["mlp"].get<double>() + b["moe"].get<double>(), 0.0) << r.dump();
  EXPECT_GE(b["rest"].get<double>(), 0.0) << r.dump();
  EXPECT_EQ(r["cuda_graph_steps"], 0);
  ASSERT_EQ(run("--batch-size 2 --input-len 4 --output-len 2 --breakdown", &out), 0) << out;
  EXPECT_NE(out.find("decode step breakdown"), std::string::npos) << out;
  EXPECT_NE(out.find("graph steps"), std::string::npos) << out;
}

// The prefill in forwards of at most --max-prefill-tokens tokens (3: prompts of 8 split across
// forwards, several prompts in one) decodes the same greedy tokens as one forward of the whole batch.
TEST(BenchOneBatch, ChunkedPrefillDecodesTheSameTokens) {
  std::string out;
  std::string hash[2];
  const char* sizes[2] = {"3", "-1"};
  for (int i = 0; i < 2; ++i) {
    ASSERT_EQ(run(std::string("--batch-size 3 --input-len 8 --output-len 4 --warmup 0 --json --max-prefill-tokens ") +
                      sizes[i],
                  &out),
              0)
        << out;
    hash[i] = nlohmann::json::parse(out.substr(out.find('{')))["results"][0]["output_tokens_fnv1a"].get<std::string>();
  }
  EXPECT_EQ(hash[0].size(), 16u);
  EXPECT_EQ(hash[0], hash[1]);
}

// A batch size's prompts come from --seed and the size alone: its hash is the same whatever other sizes and warm-ups
// the command runs (it drew from one generator shared by all of them), and another seed changes it.
TEST(BenchOneBatch, HashOfABatchSizeIgnoresTheOtherRuns) {
  std::string out;
  std::vector<std::string> hashes;
  for (const std::string flags : {"--batch-size 4", "--batch-size 1,4", "--batch-size 4 --warmup 0",
                                  "--batch-size 2,4 --warmup 2", "--batch-size 4 --seed 5"}) {
    ASSERT_EQ(run(flags + " --input-len 8 --output-len 4 --json", &out), 0) << out;
    const auto results = nlohmann::json::parse(out.substr(out.find('{')))["results"];
    hashes.push_back(results.back()["output_tokens_fnv1a"].get<std::string>());
    EXPECT_EQ(results.back()["batch_size"], 4) << flags;
  }
  for (size_t i = 1; i < 4; ++i) EXPECT_EQ(hashes[i], hashes[0]) << i;
  EXPECT_NE(hashes[4], hashes[0]);
}

TEST(BenchOneBatch, BadInputNamesTheOption) {
  std::string out;
  EXPECT_NE(run("--batch-size 2,x", &out), 0);
  EXPECT_NE(out.find("--batch-size '2,x': entry 2 'x' is not a positive integer"), std::string::npos) << out;
  EXPECT_NE(run("--input-len 9000 --output-len 16", &out), 0);
  EXPECT_NE(out.find("9016 exceeds the model's max_position_embeddings 8192"), std::string::npos) << out;
  // Past INT32_MAX, before input + output wraps past INT64_MAX (it skipped the position check and ran forever).
  EXPECT_NE(run("--output-len 9223372036854775807", &out), 0);
  EXPECT_NE(out.find("--output-len 9223372036854775807 must be in [0, 2147483647]"), std::string::npos) << out;
  EXPECT_NE(run("--input-len 9223372036854775807", &out), 0);
  EXPECT_NE(out.find("--input-len 9223372036854775807 must be in [1, 2147483647]"), std::string::npos) << out;
  EXPECT_NE(run("--max-prefill-tokens 0", &out), 0);
  EXPECT_NE(out.find("--max-prefill-tokens 0 must be >= 1, or -1"), std::string::npos) << out;
  // Named as a bad value (not as "the default model is cpu only"), a usage error (exit 2) as a value outside CLI11's
  // own sets; so are the other values of fixed sets.
  EXPECT_EQ(run("--device gpu", &out), 2);
  EXPECT_NE(out.find("--device: device \"gpu\" is not one of: cpu, cuda"), std::string::npos) << out;
  EXPECT_EQ(out.find(".cpp:"), std::string::npos) << "no source location in a usage error: " << out;
  EXPECT_EQ(run("--model glm5-shard --load-format dumy", &out), 2);
  EXPECT_NE(out.find("--load-format: load format \"dumy\" is not one of: auto, dummy"), std::string::npos) << out;
  EXPECT_EQ(run("--model glm5-shard --load-format dummy --dummy-weights fp8", &out), 2);
  EXPECT_NE(out.find("--dummy-weights: dummy weights \"fp8\" is not one of: bf16, nvfp4"), std::string::npos) << out;
  // Dummy-weight options without --load-format dummy, and GEMM timing on the cpu, were ignored: refused by name.
  EXPECT_EQ(run("--model " + fp4moe::testing::shared_path("golden/models/glm5_tiny").string() + " --dummy-weights bf16",
                &out),
            2);
  EXPECT_NE(out.find("--dummy-weights: shapes dummy weights: it needs --load-format dummy (got --load-format auto, "
                     "which reads the checkpoint's weights)"),
            std::string::npos)
      << out;
  EXPECT_NE(run("--time-moe-gemms", &out), 0);
  EXPECT_NE(out.find("--time-moe-gemms times the GPU MoE layers' GEMMs: it needs --device cuda (not cpu)"),
            std::string::npos)
      << out;
  EXPECT_NE(run("--profile-decode", &out), 0);  // profiles GPU kernels: the cpu default model has none
  EXPECT_NE(out.find("--profile-decode brackets GPU kernels for a profiler: it needs --device cuda (not cpu)"),
            std::string::npos)
      << out;
  EXPECT_NE(run("--bf16-peer", &out), 0);  // the GPU model's cuBLAS path: ignored on the cpu before
  EXPECT_NE(out.find("--bf16-peer runs the GPU model's 16-bit cuBLAS path: it needs --device cuda (not cpu)"),
            std::string::npos)
      << out;
  // A batch past the machine's memory is refused before it is allocated (it grew to 6 GB, then bad_alloc).
  EXPECT_EQ(run("--batch-size 100000000 --input-len 4 --output-len 1", &out), 1);
  EXPECT_NE(out.find("--batch-size 100000000 x 5 tokens need ~"), std::string::npos) << out;
  EXPECT_NE(out.find("GB of CPU KV cache ("), std::string::npos) << out;
  EXPECT_NE(out.find(" GB available ("), std::string::npos) << out;  // MemAvailable or the cgroup limit, named
  EXPECT_EQ(out.find("bad_alloc"), std::string::npos) << out;
}

}  // namespace
