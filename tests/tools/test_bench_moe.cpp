// Tests of `fp4moe bench moe` (tools/bench_moe.h):
//   CPU: the row arithmetic (GB/s, roofline fraction, TFLOP/s, speedup, FLOP count), the table and
//        JSON output, the CLI wiring on a `bench` parent (add_bench_moe_command) and its refusals
//        with the option and value in the message; without a GPU the command fails naming the reason.
// The GPU run is in test_bench_moe_gpu.cpp (label gpu).
// Run: test_bench_moe.
#include <gtest/gtest.h>

#include <CLI/CLI.hpp>

#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "testing/testing.h"
#include "tools/bench_moe.h"

#if defined(FP4MOE_HAVE_CUDA)
#include "kernels/cuda/device.h"
#endif

namespace fp4moe::tools {
namespace {

bool have_gpu(std::string* why) {
#if defined(FP4MOE_HAVE_CUDA)
  return cuda::cuda_device_available(why);
#else
  *why = "built without CUDA";
  return false;
#endif
}

BenchMoeRow example_row() {
  BenchMoeRow r;
  r.layer = "shard";
  r.routing = "uniform";
  r.n_experts = 32;
  r.top_k = 8;
  r.hidden = 6144;
  r.inter = 2048;
  r.shared_inter = 2048;
  r.tokens = 64;
  r.active_experts = 32;
  r.max_rows_per_expert = 24;
  r.config = "w4a16_stream_m64n16_d8";
  r.weight_bytes = 2'100'000'000;  // 2.1 GB in 1 ms at 4.2e12 B/s = 50% of the roofline
  r.flops = 3e12;
  r.ms = 1.0;
  r.peer_ms = 3.5;
  return r;
}

TEST(BenchMoe, RowArithmetic) {
  const BenchMoeRow r = example_row();
  EXPECT_DOUBLE_EQ(r.weight_gbps(), 2100.0);
  EXPECT_DOUBLE_EQ(r.roofline(4.2e12), 0.5);
  EXPECT_DOUBLE_EQ(r.tflops(), 3000.0);
  EXPECT_DOUBLE_EQ(r.speedup(), 3.5);
  BenchMoeRow no_peer = r;
  no_peer.peer_ms = 0;
  EXPECT_EQ(no_peer.speedup(), 0.0);
  // 64 tokens x top-8 x 3 x 2048 x 6144 x 2 + 64 x 3 x 2048 x 6144 x 2
  EXPECT_DOUBLE_EQ(bench_moe_flops(64, 8, 6144, 2048, 2048), 2.0 * (64.0 * 8 * 3 * 2048 * 6144 + 64.0 * 3 * 2048 * 6144));
}

TEST(BenchMoe, TableAndJson) {
  const std::vector<BenchMoeRow> rows = {example_row()};
  const std::string table = format_bench_moe_table(rows, 4.2e12);
  EXPECT_NE(table.find("roofline"), std::string::npos) << table;
  EXPECT_NE(table.find("50.0%"), std::string::npos) << table;
  EXPECT_NE(table.find("3.50x"), std::string::npos) << table;
  EXPECT_NE(table.find("w4a16_stream_m64n16_d8"), std::string::npos) << table;
  BenchMoeOptions opts;
  const nlohmann::json j = bench_moe_json(rows, opts);
  ASSERT_EQ(j.at("rows").size(), 1u);
  const auto& row = j.at("rows")[0];
  EXPECT_EQ(row.at("tokens"), 64);
  EXPECT_DOUBLE_EQ(row.at("roofline").get<double>(), 0.5);
  EXPECT_DOUBLE_EQ(row.at("time_us").get<double>(), 1000.0);
  EXPECT_DOUBLE_EQ(row.at("peer_time_us").get<double>(), 3500.0);
  EXPECT_DOUBLE_EQ(j.at("hbm_bytes_per_s").get<double>(), 4.2e12);
  EXPECT_TRUE(row.at("one_config_time_us").is_null());
  EXPECT_NE(table.find("1cfg_us"), std::string::npos) << table;
  // With expert row classes the one-config time is its own column.
  BenchMoeRow classes = example_row();
  classes.one_config_ms = 1.25;
  const std::string t2 = format_bench_moe_table({classes}, 4.2e12);
  EXPECT_NE(t2.find("1250.0"), std::string::npos) << t2;
  EXPECT_DOUBLE_EQ(bench_moe_json({classes}, opts).at("rows")[0].at("one_config_time_us").get<double>(), 1250.0);
}

// Parses `args` on an app with a `bench` parent, as the lead's cmd_bench.cpp will build it.
void parse_bench(const std::string& args) {
  CLI::App app("fp4moe");
  CLI::App* bench = app.add_subcommand("bench", "benchmarks");
  add_bench_moe_command(*bench);
  app.parse(args, false);
}

void expect_refusal(const std::string& args, const std::string& needle) {
  try {
    parse_bench(args);
    FAIL() << "'" << args << "' was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << args << ": " << e.what();
  }
}

TEST(BenchMoe, CliRefusesBadOptions) {
  expect_refusal("bench moe --tokens 0", "--tokens 0 must be in [1, 1048576]");
  expect_refusal("bench moe --tokens 64,-3", "--tokens -3");
  expect_refusal("bench moe --layer half", "--layer 'half' must be shard, full or both");
  expect_refusal("bench moe --routing skewed", "--routing 'skewed'");
  expect_refusal("bench moe --iters 0", "--iters 0 >= 1");
  expect_refusal("bench moe --hbm-bw 0", "--hbm-bw 0 must be > 0");
  expect_refusal("bench moe --experts 16 --hidden 256", "needs --experts, --hidden and --inter together");
  // Through the binary: the empty-value rule reaches nested subcommands (it read --tokens '' as 0) and seeds are
  // unsigned; both usage errors.
  for (const auto& [args, want] : {std::pair<std::string, std::string>{"bench moe --tokens ''", "--tokens: is empty"},
                                   {"bench moe --seed -1", "'-1' is not an integer in [0, 2^64)"}}) {
    std::string out;
    EXPECT_EQ(fp4moe::testing::run_command(std::string(FP4MOE_CLI) + " " + args + " 2>&1", &out), 2) << args;
    EXPECT_NE(out.find(want), std::string::npos) << args << ": " << out;
  }
}

TEST(BenchMoe, WithoutGpuTheCommandNamesTheReason) {
  std::string why;
  if (have_gpu(&why)) GTEST_SKIP() << "a GPU is present (the GPU test below runs the command)";
  try {
    parse_bench("bench moe --experts 16 --hidden 256 --inter 128 --top-k 4 --tokens 1 --iters 1");
    FAIL() << "bench moe ran without a GPU";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_TRUE(msg.find("no usable GPU") != std::string::npos || msg.find("without CUDA") != std::string::npos) << msg;
  }
}

}  // namespace
}  // namespace fp4moe::tools
