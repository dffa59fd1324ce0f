// `fp4moe tune` and `fp4moe bench gemm` option handling, in process: the commands are registered
// on a CLI::App exactly as main.cpp (tune) and cmd_bench.cpp (bench gemm, via
// add_bench_gemm_command on a `bench` parent) do. Checks that --shape / --tokens / --routing
// errors name the bad token, that --model derives the MoE GEMM shapes from config.json (printed
// before the GPU check), and that without a usable GPU both commands fail with the reason
// (skipped, saying so, when a GPU is present).
#include <CLI/CLI.hpp>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "core/error.h"
#include "testing/testing.h"
#include "tools/bench_gemm.h"
#include "tools/commands.h"
#ifdef FP4MOE_HAVE_CUDA
#include "kernels/cuda/device.h"
#endif

namespace fp4moe::tools {
namespace {

// Success when `needle` occurs in `hay` (fp4moe::Error messages carry "check failed: <cond>: "
// before and " [file:line]" after the text the tests pin).
::testing::AssertionResult Contains(const std::string& hay, const std::string& needle) {
  if (hay.find(needle) != std::string::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "'" << needle << "'\n  not in '" << hay << "'";
}
#define EXPECT_HAS(hay, needle) EXPECT_TRUE(Contains(hay, needle))

bool gpu_present() {
#ifdef FP4MOE_HAVE_CUDA
  return cuda::cuda_device_available(nullptr);
#else
  return false;
#endif
}

// Parses `args` (no program name) on an app with `tune` and `bench gemm`; returns the
// fp4moe::Error message ("" when none was thrown). CLI11 parse errors fail the test.
std::string run(const std::string& args) {
  CLI::App app{"test"};
  app.require_subcommand(1);
  register_tune_command(app);
  CLI::App* bench = app.add_subcommand("bench", "benchmarks");
  bench->require_subcommand(1);
  add_bench_gemm_command(*bench);
  try {
    app.parse(args, false);
  } catch (const CLI::ParseError& e) {
    ADD_FAILURE() << "CLI11 rejected '" << args << "': " << e.what();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(TuneCli, ShapeErrorsNameTheBadToken) {
  EXPECT_HAS(run("tune --shape 32,40x96,6144"),
             "--shape '32,40x96,6144': entry 2 '40x96' is not a positive integer (expected E,N,K[,E,N,K...])");
  EXPECT_HAS(run("tune --shape 32,4096,6144,32"),
            "--shape '32,4096,6144,32': 4 numbers is not a multiple of 3 (expected E,N,K[,E,N,K...])");
  EXPECT_HAS(run("tune --shape 32,4096,6008"),
             "--shape '32,4096,6008': entry 3 K=6008 must be a positive multiple of 16 (one NVFP4 block; K % 16 = 8)");
  EXPECT_HAS(run("tune --shape 32,4096,6144 --tokens 1,2,3"),
             "--tokens '1,2,3': entry 3 '3' is not a token-count bucket (tokens per expert; buckets: "
             "1,2,4,8,16,32,64,128,256,512)");
  EXPECT_HAS(run("tune"), "fp4moe tune: give exactly one of --shape E,N,K[,...] or --model DIR|PRESET");
  EXPECT_HAS(run("tune --shape 1,64,64 --model /nonexistent"),
             "fp4moe tune: give exactly one of --shape E,N,K[,...] or --model DIR|PRESET");
  EXPECT_HAS(run("tune --shape 1,64,64 --iters 0"), "fp4moe tune: --iters 0 must be >= 1");
}

TEST(TuneCli, ModelGivesTheMoeGemmShapes) {
  const auto dir = testing::shared_path("golden/models/glm5_tiny");  // H=128, I=64, E=16, 1 shared expert
  ::testing::internal::CaptureStdout();
  const std::string err = run("tune --model " + dir.string() + " --tokens 1,8 --cache /tmp/fp4moe_unused_tune.json");
  const std::string out = ::testing::internal::GetCapturedStdout();
  // 12 named shapes, 11 distinct: dense o_proj [128, 128] is the shared gate_up shape (tuned once, used by both).
  EXPECT_NE(out.find("tuning 11 shape(s) x 2 token bucket(s), cache /tmp/fp4moe_unused_tune.json"), std::string::npos)
      << out;
  EXPECT_NE(out.find("  experts gate_up            E=16,N=128,K=128\n"), std::string::npos) << out;
  EXPECT_NE(out.find("  experts down               E=16,N=128,K=64\n"), std::string::npos) << out;
  EXPECT_NE(out.find("  shared gate_up             E=1,N=128,K=128\n"), std::string::npos) << out;
  EXPECT_NE(out.find("  shared down                E=1,N=128,K=64\n"), std::string::npos) << out;
  if (!gpu_present()) {
    EXPECT_HAS(err, "needs a");
  }
}

// The dense Linears the GPU model runs on the W4A16 GEMM (E = 1), from the architecture's manifest, of
// a preset (no checkpoint folder needed): GLM-5's MLA projections, the DSA indexer's wq_b / wk, the dense
// layer's MLP (gate and up share one shape); not kv_b_proj (read as BF16 by the absorbed attention),
// the router or the indexer's weights_proj (BF16 Linears), nor the experts (the MoE shapes above).
TEST(TuneCli, ModelGivesTheDenseLinearShapesOfAPreset) {
  ::testing::internal::CaptureStdout();
  const std::string err = run("tune --model glm5-shard --tokens 64 --cache /tmp/fp4moe_unused_tune.json");
  const std::string out = ::testing::internal::GetCapturedStdout();
  EXPECT_NE(out.find("tuning 12 shape(s) x 1 token bucket(s)"), std::string::npos) << out;
  for (const char* line :
       {"  experts gate_up            E=32,N=4096,K=6144\n", "  shared down                E=1,N=6144,K=2048\n",
        "  dense q_a_proj             E=1,N=2048,K=6144\n", "  dense q_b_proj             E=1,N=16384,K=2048\n",
        "  dense kv_a_proj_with_mqa   E=1,N=576,K=6144\n", "  dense o_proj               E=1,N=6144,K=16384\n",
        "  dense wq_b                 E=1,N=4096,K=2048\n", "  dense wk                   E=1,N=128,K=6144\n",
        "  dense gate_proj/up_proj    E=1,N=12288,K=6144\n", "  dense down_proj            E=1,N=6144,K=12288\n"}) {
    EXPECT_NE(out.find(line), std::string::npos) << line << " missing from\n" << out;
  }
  for (const char* absent : {"kv_b_proj", "weights_proj", "gate E=", "lm_head"}) {
    EXPECT_EQ(out.find(absent), std::string::npos) << absent << " in\n" << out;
  }
  // GLM-4.5-Air widths: q_proj alone, k_proj and v_proj one shape; a dense-only model would tune its Linears.
  ::testing::internal::CaptureStdout();
  run("tune --model glm45-air-shard --tokens 64 --cache /tmp/fp4moe_unused_tune.json");
  const std::string air = ::testing::internal::GetCapturedStdout();
  EXPECT_NE(air.find("  dense k_proj/v_proj        E=1,N=1024,K=4096\n"), std::string::npos) << air;
  EXPECT_NE(air.find("  dense q_proj               E=1,N=12288,K=4096\n"), std::string::npos) << air;
  if (!gpu_present()) {
    EXPECT_HAS(err, "needs a");
  }
  EXPECT_HAS(run("tune --model no-such-preset-or-dir"), "no-such-preset-or-dir");
}

TEST(TuneCli, WithoutGpuFailsWithTheReason) {
  if (gpu_present()) GTEST_SKIP() << "a usable GPU is present: the no-GPU failure cannot be observed here";
  const std::string err = run("tune --shape 32,4096,6144 --tokens 1");
#ifdef FP4MOE_HAVE_CUDA
  std::string why;
  cuda::cuda_device_available(&why);
  EXPECT_HAS(err, "fp4moe tune needs a usable GPU: " + why);
#else
  EXPECT_NE(err.find("fp4moe tune needs a GPU, and this build has no CUDA"), std::string::npos) << err;
#endif
}

// A cache path that cannot be written fails before the tuning (it failed when the winners were saved, after minutes of
// timing), with or without a GPU.
TEST(TuneCli, UnwritableCachePathFailsFirst) {
  const std::string dir = std::filesystem::temp_directory_path().string();
  EXPECT_HAS(run("tune --shape 32,4096,6144 --tokens 1 --cache " + dir),
             "tune cache " + dir + " is a directory, not a file");
  const std::filesystem::path file = std::filesystem::temp_directory_path() / "fp4moe_tune_cache_parent";
  std::ofstream(file) << "x";
  EXPECT_HAS(run("tune --shape 32,4096,6144 --tokens 1 --cache " + (file / "sub" / "tune.json").string()),
             "cannot be written: " + file.string() + " is not a directory");
  std::filesystem::remove(file);
}

TEST(BenchGemmCli, OptionErrorsNameTheBadToken) {
  EXPECT_HAS(run("bench gemm --shape 32,4096,x"),
             "--shape '32,4096,x': entry 3 'x' is not a positive integer (expected E,N,K[,E,N,K...])");
  EXPECT_HAS(run("bench gemm --tokens 1,0"), "--tokens '1,0': entry 2 '0' is not a positive integer");
  EXPECT_HAS(run("bench gemm --routing uniform,skewed"),
            "fp4moe bench gemm: --routing 'uniform,skewed': unknown routing 'skewed' (uniform, zipf)");
  EXPECT_HAS(run("bench gemm --runs 0"), "fp4moe bench gemm: --runs 0 must be >= 1 and --warmup 5 >= 0");
  EXPECT_HAS(run("bench gemm --batch 0"), "fp4moe bench gemm: --batch 0 must be >= 1 (launches a timed sample)");
  EXPECT_HAS(run("bench gemm --peak-tflops -1"),
            "fp4moe bench gemm: --peak-tflops -1 and --hbm-tbs 4.2 must be > 0");
}

TEST(BenchGemmCli, WithoutGpuFailsWithTheReason) {
  if (gpu_present()) GTEST_SKIP() << "a usable GPU is present: the no-GPU failure cannot be observed here";
  const std::string err = run("bench gemm --tokens 1 --routing zipf --json");
#ifdef FP4MOE_HAVE_CUDA
  std::string why;
  cuda::cuda_device_available(&why);
  EXPECT_HAS(err, "fp4moe bench gemm needs a usable GPU: " + why);
#else
  EXPECT_NE(err.find("fp4moe bench gemm needs a GPU, and this build has no CUDA"), std::string::npos) << err;
#endif
}

TEST(BenchGemmCli, HelpListsTheOptions) {
  CLI::App app{"test"};
  CLI::App* bench = app.add_subcommand("bench", "benchmarks");
  add_bench_gemm_command(*bench);
  CLI::App* gemm = bench->get_subcommand("gemm");
  const std::string help = gemm->help();
  for (const char* opt : {"--shape", "--tokens", "--routing", "--zipf-s", "--seed", "--runs", "--warmup", "--batch",
                          "--cache", "--peak-tflops", "--hbm-tbs", "--json"}) {
    EXPECT_NE(help.find(opt), std::string::npos) << opt << " missing from:\n" << help;
  }
}

}  // namespace
}  // namespace fp4moe::tools
