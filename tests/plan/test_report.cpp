// Reports: the JSON document validates against schema fp4moe.plan.v1 (and the validator catches
// broken documents), the text report names the failing tiles, and the FlashInfer blocklist for
// an RTX PRO 6000 lists exactly the tactics whose kernels cannot launch.
#include <gtest/gtest.h>

#include "core/error.h"
#include "plan/plan_report.h"

namespace fp4moe::plan {
namespace {

PlanReport sm120_report(std::vector<int64_t> tokens) {
  ResolvedGpu gpu;
  gpu.spec = require_gpu("rtx-pro-6000");
  PlanOptions o;
  o.family = KernelFamily::kCutlassSm120;
  return make_report(parse_problem("moe:E=256,topk=8,H=6144,I=2048"), tokens, gpu, o);
}

TEST(Report, JsonValidates) {
  for (const PlanReport& r : {sm120_report({}), sm120_report({1, 4096})}) {
    const nlohmann::json j = report_json(r);
    const std::vector<std::string> problems = validate_report_json(j);
    EXPECT_TRUE(problems.empty()) << problems.front();
    EXPECT_EQ(j["candidates"].size(), 20u + 40u);
    EXPECT_EQ(j["plans"].size(), r.tokens.size() * 2);
  }
  ResolvedGpu h;
  h.spec = require_gpu("h200");
  const PlanReport ours = make_report(parse_problem("gemm:M=16,N=4096,K=6144"), {}, h, {});
  const nlohmann::json j = report_json(ours);
  EXPECT_TRUE(validate_report_json(j).empty());
  EXPECT_EQ(j["kernel"], "sm90_nvfp4_w4a16_grouped_gemm");
  EXPECT_TRUE(j["cutlass_rules"].is_null());
  ASSERT_EQ(j["plans"].size(), 1u);
  EXPECT_TRUE(j["plans"][0]["chosen"].is_object());
}

TEST(Report, JsonCarriesTheRejection) {
  const nlohmann::json j = report_json(sm120_report({}));
  int overflow = 0;
  for (const auto& c : j["candidates"]) {
    if (c["rule"] == "builder-overflow") {
      ++overflow;
      EXPECT_EQ(c["bytes"], 102400);
      EXPECT_EQ(c["limit"], 101376);
      EXPECT_EQ(c["margin"], -1024);
      EXPECT_EQ(c["gemm"], "gemm2");
      EXPECT_FALSE(c["fits"].get<bool>());
    }
  }
  EXPECT_EQ(overflow, 2);
}

TEST(Report, ValidatorCatchesBrokenDocuments) {
  nlohmann::json j = report_json(sm120_report({1}));
  j["plans"][0]["chosen"]["stages"] = "three";
  j["candidates"][0].erase("bytes");
  j["candidates"][1]["breakdown"][0]["bytes"] = 1;
  j["schema"] = "fp4moe.plan.v0";
  const std::vector<std::string> p = validate_report_json(j);
  auto has = [&](const std::string& s) { return std::find(p.begin(), p.end(), s) != p.end(); };
  EXPECT_TRUE(has("plans[0].chosen.stages: expected integer, got string"));
  EXPECT_TRUE(has("candidates[0].bytes: missing"));
  EXPECT_TRUE(has("schema: expected \"fp4moe.plan.v1\", got \"fp4moe.plan.v0\""));
  bool sum = false;
  for (const std::string& s : p) sum |= s.rfind("candidates[1].breakdown: sums to", 0) == 0;
  EXPECT_TRUE(sum);
  EXPECT_EQ(validate_report_json(nlohmann::json::array()), std::vector<std::string>{"document: expected object, got array"});
}

TEST(Report, TextNamesTheFailingTiles) {
  const std::string text = format_report(sm120_report({}));
  EXPECT_NE(text.find("[builder-overflow] 128x256x128 FINALIZE swap_ab=0: 3 stages x 27648 + epilogue 17408 + overhead 2048 = 102400 B > 101376 B opt-in (sm_120) by 1024 B"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("[builder-overflow] 256x128x128 FINALIZE swap_ab=0"), std::string::npos);
  EXPECT_NE(text.find("GPU rtx-pro-6000 (NVIDIA RTX PRO 6000 Blackwell, sm_120): 188 SMs"), std::string::npos);
}

TEST(Report, FlashInferBlocklistForRtxPro6000) {
  // GEMM1 tactics 0-19: tiles 4 and 5 (128x128x256B, 256x128x128B: one stage) in both swaps.
  // GEMM2 20-59 = 20 + tile + 10 x FINALIZE + 20 x swap: the same tiles in all four variants,
  // plus FINALIZE swap_ab=0 of tiles 1 and 2 (128x256x64B, 256x128x64B: 102400 B) = 31, 32.
  const Blocklist b = flashinfer_blocklist(sm120_report({}));
  EXPECT_EQ(b.tactics, (std::vector<int>{4, 5, 14, 15, 24, 25, 31, 32, 34, 35, 44, 45, 54, 55}));
  const std::string text = format_blocklist(b);
  EXPECT_NE(text.find("FLASHINFER_TACTICS_BLOCKLIST=4,5,14,15,24,25,31,32,34,35,44,45,54,55\n"), std::string::npos) << text;
  EXPECT_NE(text.find("# 31: gemm2 128x256x128 FINALIZE swap_ab=0: 3 stages x 27648"), std::string::npos) << text;
  // Other families have no FlashInfer SM120 tactic numbers.
  ResolvedGpu h;
  h.spec = require_gpu("h200");
  EXPECT_THROW(flashinfer_blocklist(make_report(parse_problem("moe:E=8,topk=2,H=64,I=64"), {}, h, {})), Error);
}

}  // namespace
}  // namespace fp4moe::plan
