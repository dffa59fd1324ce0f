// GPU test of `fp4moe bench moe` (tools/bench_moe.h), label gpu; skipped with the reason without a
// usable GPU. A small custom shape (E=16 top-4, H=I=512, one shared expert) at 1 and 33 tokens,
// uniform and Zipf routing, NVFP4 and the BF16 peer: every row is timed, the JSON parses, the
// routing statistics are consistent (active experts, max rows per expert); and a shape whose dummy
// weights need the host repack (H=256, I=128) runs without the peer, timed as a CUDA-graph replay;
// --tuned with an empty cache falls back to the planner's top choice, a config the kernel runs.
// Run: test_bench_moe_gpu.
#include <gtest/gtest.h>

#include <algorithm>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "kernels/cuda/device.h"
#include "tools/bench_moe.h"

namespace fp4moe::tools {
namespace {

bool have_gpu(std::string* why) { return cuda::cuda_device_available(why); }

TEST(BenchMoeGpu, SmallCustomShape) {
  std::string why;
  if (!have_gpu(&why)) GTEST_SKIP() << "no usable GPU: " << why;
  BenchMoeOptions opts;
  opts.experts = 16;
  opts.hidden = 512;  // n % 16 == 0 and k % 512 == 0: dummy weights hashed straight into the kernel layout
  opts.inter = 512;
  opts.top_k = 4;
  opts.shared = 1;
  opts.tokens = {1, 33};
  opts.warmup = 1;
  opts.iters = 3;
  opts.json = true;
  std::ostringstream out;
  const std::vector<BenchMoeRow> rows = run_bench_moe(opts, out);
  ASSERT_EQ(rows.size(), 4u);  // 2 token counts x (uniform, zipf)
  const nlohmann::json j = nlohmann::json::parse(out.str());
  ASSERT_EQ(j.at("rows").size(), 4u);
  for (const BenchMoeRow& r : rows) {
    SCOPED_TRACE(r.routing + " tokens " + std::to_string(r.tokens));
    EXPECT_GT(r.ms, 0.0);
    EXPECT_GT(r.peer_ms, 0.0);
    EXPECT_GE(r.active_experts, 1);
    EXPECT_LE(r.active_experts, std::min<int64_t>(16, r.tokens * 4));
    EXPECT_GE(r.max_rows_per_expert, (r.tokens * 4 + 15) / 16);
    EXPECT_LE(r.max_rows_per_expert, r.tokens);  // an expert appears at most once per token
    EXPECT_GT(r.weight_bytes, 0);
    EXPECT_FALSE(r.config.empty());
  }
  // One token hits exactly top_k experts.
  EXPECT_EQ(rows[0].active_experts, 4);
}

TEST(BenchMoeGpu, TunedWithAnEmptyCacheUsesThePlannersChoice) {
  std::string why;
  if (!have_gpu(&why)) GTEST_SKIP() << "no usable GPU: " << why;
  BenchMoeOptions opts;
  opts.experts = 16;
  opts.hidden = 512;
  opts.inter = 512;
  opts.top_k = 4;
  opts.tokens = {8};
  opts.routing = "uniform";
  opts.warmup = 1;
  opts.iters = 2;
  opts.peer = false;
  opts.tuned = true;
  opts.cache = ::testing::TempDir() + "/fp4moe_no_such_tune_cache.json";
  std::ostringstream out;
  const std::vector<BenchMoeRow> rows = run_bench_moe(opts, out);
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_GT(rows[0].ms, 0.0);
  EXPECT_EQ(rows[0].config.rfind("w4a16_", 0), 0u) << rows[0].config;
}

TEST(BenchMoeGpu, ShapeNeedingTheHostRepack) {
  std::string why;
  if (!have_gpu(&why)) GTEST_SKIP() << "no usable GPU: " << why;
  BenchMoeOptions opts;
  opts.experts = 8;
  opts.hidden = 256;  // k % 512 != 0: dummy weights made in the checkpoint layout and repacked on the host
  opts.inter = 128;
  opts.top_k = 2;
  opts.shared = 0;
  opts.tokens = {3};
  opts.routing = "uniform";
  opts.peer = false;
  opts.graph = true;
  opts.warmup = 0;
  opts.iters = 1;
  std::ostringstream out;
  const std::vector<BenchMoeRow> rows = run_bench_moe(opts, out);
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_GT(rows[0].ms, 0.0);
  EXPECT_EQ(rows[0].peer_ms, 0.0);
  EXPECT_NE(out.str().find("custom"), std::string::npos) << out.str();
}

}  // namespace
}  // namespace fp4moe::tools
