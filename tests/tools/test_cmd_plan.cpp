// `fp4moe plan` end to end: runs the built binary (FP4MOE_CLI) and checks the README commands'
// tables, --json against schema fp4moe.plan.v1, --emit-blocklist, --model DIR, --decode and the
// error paths (exit status 1 with a message carrying the numbers), and the shipped Hopper configs
// rejected with their bytes on a GPU with less shared memory (--gpu rtx-4090).
#include <gtest/gtest.h>

#include <unistd.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "plan/plan_report.h"
#include "testing/testing.h"

namespace {

struct CliRun {
  int status = -1;
  std::string out;
};

// Runs `fp4moe plan <args>` (stderr merged), with --no-runtime so a local GPU cannot change the table.
CliRun run_plan(const std::string& args, const std::string& env = "") {
  CliRun r;
  r.status = fp4moe::testing::run_command(env + " " + std::string(FP4MOE_CLI) + " plan --no-runtime " + args, &r.out);
  return r;
}

const char* kGlm5 = "--problem moe:E=256,topk=8,H=6144,I=2048";

// The first table row starting with `tile` (after its indentation), runs of spaces collapsed.
std::string row(const std::string& out, const std::string& tile) {
  const size_t at = out.find("\n  " + tile + " ");
  if (at == std::string::npos) return "(no row " + tile + ")";
  const size_t end = out.find('\n', at + 1);
  std::string collapsed;
  for (char c : out.substr(at + 3, end - at - 3)) {
    if (c != ' ' || collapsed.empty() || collapsed.back() != ' ') collapsed.push_back(c);
  }
  return collapsed;
}

TEST(CmdPlan, Sm120TableExplainsTheTwoFailingTiles) {
  const CliRun r = run_plan(std::string("--gpu rtx-pro-6000 --kernel cutlass-sm120-moe ") + kGlm5);
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_EQ(row(r.out, "128x256x128 FINALIZE swap_ab=0"),
            "128x256x128 FINALIZE swap_ab=0 3 102400 NO -1024 builder-overflow: needs 102400 B, 1024 B over the opt-in (CUTLASS "
            "builder picked 3 stages)");
  EXPECT_EQ(row(r.out, "256x128x128 FINALIZE swap_ab=0").substr(0, 56), "256x128x128 FINALIZE swap_ab=0 3 102400 NO -1024 builder");
  EXPECT_EQ(row(r.out, "128x256x128 FINALIZE swap_ab=1"), "128x256x128 FINALIZE swap_ab=1 2 74752 yes 26624 ");
  EXPECT_EQ(row(r.out, "128x64x128 NONE swap_ab=0"), "128x64x128 NONE swap_ab=0 6 101376 yes 0 ");
  EXPECT_NE(r.out.find("[builder-overflow] 128x256x128 FINALIZE swap_ab=0: 3 stages x 27648 + epilogue 17408 + overhead 2048 = 102400 B > 101376 B opt-in (sm_120) by 1024 B"),
            std::string::npos)
      << r.out;
}

TEST(CmdPlan, HopperDefaultPlansOurKernel) {
  const CliRun r = run_plan(std::string("--gpu h200 ") + kGlm5 + " --tokens 1,16,64,512,4096");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("sm90_nvfp4_w4a16_grouped_gemm on h200 (sm_90, opt-in 232448 B)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("       1 gemm1 (gate+up)        8      1.00 w4a16_stream_m128n8_d4 "), std::string::npos)
      << r.out;
  // The feasibility table lists the shipped configs with their stages and bytes. Stream configs:
  // the code ring depth and the bytes, m128n8_d8 2 x 8 x 1024 of activations + 4 warps x 8 x 2 x 512 of
  // codes + 48 = 49200 B, margin 232448 - 49200 = 183248; m64n8_d8 16384 + 2 x 8 x 1024 + 48 = 32816 B,
  // margin 199632.
  EXPECT_EQ(row(r.out, "w4a16_stream_m128n8_d8"), "w4a16_stream_m128n8_d8 8 49200 yes 183248 ");
  EXPECT_EQ(row(r.out, "w4a16_stream_m64n8_d8"), "w4a16_stream_m64n8_d8 8 32816 yes 199632 ");
  EXPECT_EQ(row(r.out, "w4a16_swapab_m64n8k256_s4"), "w4a16_swapab_m64n8k256_s4 4 54400 yes 178048 ");
  EXPECT_EQ(row(r.out, "w4a16_swapab_m128n64k128_s4"), "w4a16_swapab_m128n64k128_s4 4 119808 yes 112640 ");
  EXPECT_NE(r.out.find("Every candidate fits."), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("    4096 gemm2 (down)"), std::string::npos) << r.out;
}

TEST(CmdPlan, SmallerSmemRejectsShippedConfigsWithTheBytes) {
  // RTX 4090 (sm_89, 101376 B opt-in): the two shipped configs over it are rejected, in the table
  // and with the byte breakdown; the plan picks among the rest.
  const CliRun r = run_plan(std::string("--gpu rtx-4090 ") + kGlm5 + " --tokens 4096");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("sm90_nvfp4_w4a16_grouped_gemm on rtx-4090 (sm_89, opt-in 101376 B)"), std::string::npos) << r.out;
  EXPECT_EQ(row(r.out, "w4a16_swapab_m128n64k128_s4"),
            "w4a16_swapab_m128n64k128_s4 4 119808 NO -18432 smem-opt-in: config w4a16_swapab_m128n64k128_s4 needs 4 stages x "
            "(x_tile 16384 + w_tiles 8192 + w_scales 1024) + epilogue 17408 = 119808 B of shared memory > 101376 B (the "
            "device's opt-in limit per block) by 18432 B");
  EXPECT_EQ(row(r.out, "w4a16_swapab_m128n32k128_s4"), "w4a16_swapab_m128n32k128_s4 4 78336 yes 23040 ");
  // The stream configs fit its bytes (2 x 8 x 2048 of activations + 4 warps x 4 x 2 x 512 of codes + 48 =
  // 49200 B, 101376 - 49200 = 52176 left) but take their activations by TMA, which sm_89 lacks.
  EXPECT_EQ(row(r.out, "w4a16_stream_m128n16_d4"),
            "w4a16_stream_m128n16_d4 4 49200 NO 52176 arch: sm90_nvfp4_w4a16_grouped_gemm stream tiles need TMA "
            "(cp.async.bulk.tensor, sm_90+); rtx-4090 is sm_89");
  EXPECT_NE(r.out.find("  [smem-opt-in] w4a16_swapab_m128n64k128_s4: 4 stages x (x_tile 16384 + w_tiles 8192 + w_scales 1024) + "
                       "epilogue 17408 = 119808 B > 101376 B opt-in (sm_89) by 18432 B\n"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("  [smem-opt-in] w4a16_swapab_m128n16k256_s4: 4 stages x (x_tile 8192 + w_tiles 16384 + w_scales 2048) + "
                       "epilogue 4352 = 110848 B > 101376 B opt-in (sm_89) by 9472 B\n"),
            std::string::npos)
      << r.out;
}

TEST(CmdPlan, JsonValidatesAgainstTheSchema) {
  const CliRun r = run_plan(std::string("--gpu rtx-pro-6000 --kernel cutlass-sm120-moe --json --tokens 1,4096 ") + kGlm5);
  ASSERT_EQ(r.status, 0) << r.out;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  const std::vector<std::string> problems = fp4moe::plan::validate_report_json(j);
  EXPECT_TRUE(problems.empty()) << problems.front();
  EXPECT_EQ(j["gpu"]["smem_optin_per_block"], 101376);
  EXPECT_EQ(j["plans"].size(), 4u);
}

TEST(CmdPlan, EmitBlocklist) {
  const CliRun r = run_plan(std::string("--gpu rtx-pro-6000 --kernel cutlass-sm120-moe --emit-blocklist ") + kGlm5);
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("FLASHINFER_TACTICS_BLOCKLIST=4,5,14,15,24,25,31,32,34,35,44,45,54,55\n"), std::string::npos) << r.out;
}

// --json with --emit-blocklist and with --layouts gives those facts as JSON (both printed text or left them out).
TEST(CmdPlan, BlocklistAndLayoutsAsJson) {
  CliRun r = run_plan(std::string("--gpu rtx-pro-6000 --kernel cutlass-sm120-moe --emit-blocklist --json ") + kGlm5);
  ASSERT_EQ(r.status, 0) << r.out;
  nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["schema"], "fp4moe.blocklist.v1");
  EXPECT_EQ(j["gpu"], "rtx-pro-6000");
  std::vector<int> tactics;
  for (const auto& t : j["tactics"]) tactics.push_back(t["tactic"].get<int>());
  EXPECT_EQ(tactics, (std::vector<int>{4, 5, 14, 15, 24, 25, 31, 32, 34, 35, 44, 45, 54, 55}));
  EXPECT_NE(j["tactics"][0]["reason"].get<std::string>().find("= 162816 B > 101376 B opt-in (sm_120) by 61440 B"),
            std::string::npos)
      << j.dump();
  r = run_plan(std::string("--gpu h200 --tokens 1 --layouts --json ") + kGlm5);
  ASSERT_EQ(r.status, 0) << r.out;
  j = nlohmann::json::parse(r.out);
  EXPECT_TRUE(fp4moe::plan::validate_report_json(j).empty());
  ASSERT_FALSE(j["layouts"].empty());
  for (const auto& l : j["layouts"]) {
    uint64_t end = 0;
    for (const auto& reg : l["regions"]) {
      EXPECT_EQ(reg["offset"].get<uint64_t>() % reg["align"].get<uint64_t>(), 0u) << l.dump();
      EXPECT_GE(reg["offset"].get<uint64_t>(), end) << l.dump();
      end = reg["offset"].get<uint64_t>() + reg["bytes"].get<uint64_t>();
    }
    EXPECT_LE(end, l["total_bytes"].get<uint64_t>()) << l.dump();
  }
  // The candidate the text names has the same bytes in both forms.
  EXPECT_EQ(j["layouts"][0]["candidate"], j["candidates"][0]["tile"]) << j["candidates"][0].dump();
  EXPECT_EQ(j["layouts"][0]["total_bytes"], j["candidates"][0]["bytes"]);
  EXPECT_FALSE(nlohmann::json::parse(run_plan(std::string("--gpu h200 --json ") + kGlm5).out).contains("layouts"));
}

TEST(CmdPlan, ModelDirReadsConfigJson) {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / ("fp4moe_plan_model_" + std::to_string(fp4moe::testing::test_seed()));
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "config.json") << R"({"n_routed_experts": 256, "num_experts_per_tok": 8, "hidden_size": 6144,
                                           "moe_intermediate_size": 2048, "num_hidden_layers": 78})";
  const CliRun r = run_plan("--gpu b200 --model " + dir.string() + " --json");
  std::filesystem::remove_all(dir);
  ASSERT_EQ(r.status, 0) << r.out;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["problem"], "moe:E=256,topk=8,H=6144,I=2048");
  EXPECT_EQ(j["kernel"], "cutlass-sm100-moe");
}

// --model takes a preset (as serve and analyze do) when no such folder exists; errors then name the preset.
TEST(CmdPlan, ModelPreset) {
  const CliRun r = run_plan("--gpu h200 --model glm5-shard --json");
  ASSERT_EQ(r.status, 0) << r.out;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["problem"], "moe:E=32,topk=8,H=6144,I=2048");  // one 8-way EP rank's 32 of GLM-5's 256 experts
  const CliRun none = run_plan("--gpu h200 --model no-such-preset-or-dir");
  EXPECT_EQ(none.status, 1) << none.out;
  EXPECT_NE(none.out.find("--model no-such-preset-or-dir: no such directory, and not a preset (glm5-shard, "),
            std::string::npos)
      << none.out;
  const CliRun tokens = run_plan("--gpu h200 --decode --model glm5-shard --tokens 8");  // it was ignored
  EXPECT_EQ(tokens.status, 1) << tokens.out;
  EXPECT_NE(tokens.out.find("--decode models running requests: use --concurrency"), std::string::npos) << tokens.out;
  const CliRun past = run_plan("--gpu h200 --decode --model glm5-shard --concurrency 16,16777217");
  EXPECT_EQ(past.status, 1) << past.out;
  EXPECT_NE(past.out.find("--concurrency 16777217 is past 16777216 running requests"), std::string::npos) << past.out;
  // The decode options without --decode, and --emit-blocklist with it, were ignored: usage errors.
  for (const auto& [args, message] : std::vector<std::pair<std::string, std::string>>{
           {"--ep 4", "--ep requires --decode"},
           {"--concurrency 16", "--concurrency requires --decode"},
           {"--target-util 0.3", "--target-util requires --decode"},
           {"--routing r.json", "--routing requires --decode"},
           {"--decode --emit-blocklist", "--emit-blocklist excludes --decode"},
           {"--emit-blocklist --layouts", "--emit-blocklist excludes --layouts"}}) {
    const CliRun r = run_plan("--gpu h200 --model glm5-shard " + args);
    EXPECT_EQ(r.status, 2) << args << ": " << r.out;
    EXPECT_NE(r.out.find(message), std::string::npos) << args << ": " << r.out;
  }
}

TEST(CmdPlan, ModelDirErrorsNameTheField) {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / ("fp4moe_plan_bad_" + std::to_string(fp4moe::testing::test_seed()));
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "config.json") << R"({"n_routed_experts": 256, "num_experts_per_tok": "8", "hidden_size": 6144})";
  const CliRun r = run_plan("--gpu b200 --model " + dir.string());
  std::filesystem::remove_all(dir);
  EXPECT_EQ(r.status, 1) << r.out;
  EXPECT_NE(r.out.find("'num_experts_per_tok' is \"8\", expected an integer"), std::string::npos) << r.out;
  // Sizes past 32 bits (2^62 experts printed negative latencies).
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "config.json") << R"({"n_routed_experts": 4611686018427387904, "num_experts_per_tok": 8,
                                            "hidden_size": 6144, "moe_intermediate_size": 2048})";
  const CliRun huge = run_plan("--gpu b200 --decode --model " + dir.string());
  std::filesystem::remove_all(dir);
  EXPECT_EQ(huge.status, 1) << huge.out;
  EXPECT_NE(huge.out.find("'n_routed_experts' = 4611686018427387904 must be in [1, 2^31)"), std::string::npos)
      << huge.out;
}

TEST(CmdPlan, DecodeEconomics) {
  const CliRun r = run_plan(std::string("--gpu b200 --decode --ep 8 --json ") + kGlm5);
  ASSERT_EQ(r.status, 0) << r.out;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["schema"], "fp4moe.decode.v1");
  ASSERT_EQ(j["rows"].size(), 5u);
  EXPECT_EQ(j["rows"][0]["concurrency"], 1);
  EXPECT_NEAR(j["rows"][0]["utilization"].get<double>(), 0.003157, 1e-6);
  const CliRun text = run_plan(std::string("--gpu h200 --decode ") + kGlm5);
  ASSERT_EQ(text.status, 0) << text.out;
  EXPECT_NE(text.out.find("50% of BF16 peak needs"), std::string::npos) << text.out;
}

TEST(CmdPlan, LogPlansOncePerDistinctProblem) {
  // Tokens 1,1,16: gemm1 and gemm2 at 1 token are logged once each, then both at 16 tokens.
  const CliRun r = run_plan(std::string("--gpu h200 --tokens 1,1,16 ") + kGlm5, "FP4MOE_LOG_PLANS=1");
  ASSERT_EQ(r.status, 0) << r.out;
  size_t n = 0, pos = 0;
  while ((pos = r.out.find("fp4moe plan: h200 sm90_nvfp4_w4a16_grouped_gemm ", pos)) != std::string::npos) {
    ++n;
    ++pos;
  }
  EXPECT_EQ(n, 4u) << r.out;
  EXPECT_NE(r.out.find("fp4moe plan: h200 sm90_nvfp4_w4a16_grouped_gemm gemm1 (gate+up) groups=8 m=1 n=4096 k=6144: "
                       "w4a16_stream_m128n8_d4 4 stages 32816 B"),
            std::string::npos)
      << r.out;
  EXPECT_EQ(run_plan(std::string("--gpu h200 --tokens 1 ") + kGlm5).out.find("fp4moe plan: "), std::string::npos);
}

TEST(CmdPlan, ErrorsCarryNumbers) {
  // A value outside a fixed set is a usage error (exit 2, as CLI11's own sets), named with the flag.
  CliRun r = run_plan("--gpu h300 --problem moe:E=8,topk=2,H=64,I=64");
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.out.find("--gpu: unknown GPU 'h300'"), std::string::npos) << r.out;
  r = run_plan("--gpu h200 --kernel marlin --problem moe:E=8,topk=2,H=64,I=64");
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.out.find("--kernel: unknown kernel family 'marlin'; known: ours"), std::string::npos) << r.out;
  r = run_plan("--gpu h200 --problem moe:E=8,topk=20,H=64,I=64");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.out.find("topk=20 > E=8"), std::string::npos) << r.out;
  r = run_plan("--gpu h200 --kernel cutlass-sm100-moe --emit-blocklist --problem moe:E=8,topk=2,H=64,I=64");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.out.find("--emit-blocklist covers FlashInfer's SM120"), std::string::npos) << r.out;
  r = run_plan("--no-runtime --problem moe:E=8,topk=2,H=64,I=64");  // the reason was empty ("rt.has_value(): ;")
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.out.find("--no-runtime asks for no GPU query; pass --gpu ("), std::string::npos) << r.out;
  // A routing histogram nested 100,000 deep segfaulted (rc 139); a directory gave libstdc++'s basic_filebuf error.
  const std::filesystem::path deep =
      std::filesystem::temp_directory_path() / ("fp4moe_plan_deep_" + std::to_string(::getpid()) + ".json");
  std::ofstream(deep) << std::string(100000, '[') << std::string(100000, ']');
  r = run_plan("--gpu h200 --problem moe:E=8,topk=2,H=64,I=64 --decode --routing " + deep.string());
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.out.find(deep.string() + ": JSON nests deeper than 256 levels"), std::string::npos) << r.out;
  std::filesystem::remove(deep);
  const std::string dir = std::filesystem::temp_directory_path().string();
  r = run_plan("--gpu h200 --problem moe:E=8,topk=2,H=64,I=64 --decode --routing " + dir);
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.out.find(dir + " is a directory, not a file"), std::string::npos) << r.out;
}

}  // namespace
