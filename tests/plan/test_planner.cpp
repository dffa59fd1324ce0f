// The planner: problem parsing, decisions (swap-AB / small-N for 1-64 tokens per expert, big
// tiles for prefill), rejection values and their exact messages (snapshots), the nothing-fits
// error (every shortfall, nearest first) and require_chosen's exception.
#include <gtest/gtest.h>

#include <algorithm>

#include "core/error.h"
#include "plan/planner.h"

namespace fp4moe::plan {
namespace {

const Problem kGlm5 = parse_problem("moe:E=256,topk=8,H=6144,I=2048");

TEST(Problem, Parses) {
  EXPECT_EQ(kGlm5.n_experts, 256);
  EXPECT_EQ(kGlm5.top_k, 8);
  EXPECT_EQ(kGlm5.hidden, 6144);
  EXPECT_EQ(kGlm5.intermediate, 2048);
  EXPECT_EQ(kGlm5.to_string(), "moe:E=256,topk=8,H=6144,I=2048");
  const Problem g = parse_problem("gemm:M=128,N=4096,K=6144");
  EXPECT_EQ(g.kind, Problem::Kind::kGemm);
  EXPECT_EQ(g.to_string(), "gemm:M=128,N=4096,K=6144");
  EXPECT_EQ(parse_token_list("1,16,4096"), (std::vector<int64_t>{1, 16, 4096}));
}

TEST(Problem, ErrorsNameTheField) {
  auto message = [](const char* text) {
    try {
      parse_problem(text);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message("moe:E=256,topk=8,H=6144").find("a MoE needs E, topk, H and I (got E=256 topk=8 H=6144 I=0)"), std::string::npos);
  EXPECT_NE(message("moe:E=256,topk=x,H=1,I=1").find("topk=x is not a positive integer"), std::string::npos);
  EXPECT_NE(message("moe:E=8,topk=9,H=1,I=1").find("topk=9 > E=8"), std::string::npos);
  EXPECT_NE(message("moe:E=8,Q=1").find("unknown MoE field 'q'"), std::string::npos);
  EXPECT_NE(message("conv:E=8").find("kind 'conv' is not moe or gemm"), std::string::npos);
  // Shapes the kernel cannot run are refused (they were planned); sizes whose tile counts overflowed too.
  EXPECT_NE(
      message("gemm:M=1,N=128,K=100").find("K=100 must be a positive multiple of 16 (one NVFP4 block; K % 16 = 4)"),
      std::string::npos);
  EXPECT_NE(message("gemm:M=1,N=12,K=64").find("N=12 must be a positive multiple of 8 (16 B output stores; N % 8 = 4)"),
            std::string::npos);
  EXPECT_NE(message("moe:E=8,topk=2,H=6150,I=64")
                .find("H (a K of the MoE GEMMs): K=6150 must be a positive multiple "
                      "of 16 (one NVFP4 block; K % 16 = 6)"),
            std::string::npos);
  EXPECT_NE(message("moe:E=1099511627776,topk=2,H=64,I=64").find("is past E <= 65536"), std::string::npos);
  EXPECT_THROW(gemms_of(parse_problem("moe:E=65536,topk=65536,H=64,I=64"), int64_t{1} << 40), Error);
  EXPECT_THROW(parse_token_list("1,,2"), Error);
  EXPECT_THROW(parse_token_list("0"), Error);
  // The list's own flag is named (plan's --concurrency was reported as "problem '0': tokens=0").
  try {
    parse_token_list("16,0", "--concurrency");
    FAIL() << "accepted 0";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--concurrency '16,0': 0 must be >= 1"), std::string::npos) << e.what();
  }
}

TEST(Problem, MoeGemms) {
  // 1 token: 8 experts of 1 token. E x (1 - (1 - 8/256)^1) = 8.
  EXPECT_NEAR(expected_active_experts(256, 8, 1), 8.0, 1e-9);
  const std::vector<GemmProblem> g = gemms_of(kGlm5, 1);
  ASSERT_EQ(g.size(), 2u);
  EXPECT_EQ(g[0].n_groups, 8);
  EXPECT_DOUBLE_EQ(g[0].m, 1.0);
  EXPECT_EQ(g[0].n, 4096);
  EXPECT_EQ(g[0].k, 6144);
  EXPECT_FALSE(g[0].finalize);
  EXPECT_EQ(g[1].n, 6144);
  EXPECT_EQ(g[1].k, 2048);
  EXPECT_TRUE(g[1].finalize);
  // 4096 tokens: every expert, 128 tokens each.
  const std::vector<GemmProblem> big = gemms_of(kGlm5, 4096);
  EXPECT_EQ(big[0].n_groups, 256);
  EXPECT_DOUBLE_EQ(big[0].m, 128.0);
}

TEST(Planner, OursOnHopperPicksSwapAbForDecodeAndBigTilesForPrefill) {
  const GpuSpec h200 = require_gpu("h200");
  const std::vector<GemmPlan> plans = plan(kGlm5, {1, 512, 4096}, h200, {});
  ASSERT_EQ(plans.size(), 6u);
  for (const GemmPlan& p : plans) {
    ASSERT_TRUE(p.chosen.has_value()) << p.error;
    EXPECT_EQ(p.family, KernelFamily::kSm90W4A16);
  }
  // 1 token per expert: the smallest token tile (8 = one n8 MMA tile). The n8 configs are
  // m64n8_d8, m128n8_d4, m128n8_d8 (stream) and m64n8k256_s4 (pipeline); at equal HBM time the
  // 128-row weight tiles re-read the activations half as often as the 64-row ones, and the cost model
  // does not look at the ring depth: the first of the two in the table, m128n8_d4.
  EXPECT_EQ(plans[0].chosen->candidate.to_string(), "w4a16_stream_m128n8_d4");
  EXPECT_EQ(plans[1].chosen->candidate.to_string(), "w4a16_stream_m128n8_d4");
  // Its rings: the CTA's activations, 2 slots x 8 chunks x 1024 B, then 4 warps x 4 chunks x 2 x 512 B of
  // codes and 48 B of mbarriers = 32816 B, 4 "stages" (the code ring depth).
  EXPECT_EQ(plans[0].chosen->smem.bytes, 32816u);
  EXPECT_EQ(plans[0].chosen->smem.stages, 4);
  // 16 tokens per expert: swap-AB, a 16-token tile, no padding.
  EXPECT_TRUE(plans[2].chosen->candidate.swap_ab());
  EXPECT_EQ(plans[2].chosen->candidate.token_tile(), 16u);
  EXPECT_DOUBLE_EQ(plans[2].chosen->cost.padding_waste, 0.0);
  // 128 tokens per expert: a token tile of at least 64, on the wgmma tiles (0.85 of the peak when
  // MMA-bound against the mma.sync tiles' 0.25: kernel_mma_efficiency).
  EXPECT_GE(plans[4].chosen->candidate.token_tile(), 64u);
  EXPECT_GE(plans[5].chosen->candidate.token_tile(), 64u);
  EXPECT_EQ(plans[4].chosen->candidate.ours.kind, W4A16Kind::kWgmma) << plans[4].chosen->candidate.to_string();
  EXPECT_EQ(plans[5].chosen->candidate.ours.kind, W4A16Kind::kWgmma) << plans[5].chosen->candidate.to_string();
  EXPECT_DOUBLE_EQ(kernel_mma_efficiency(plans[4].chosen->candidate), kWgmmaEfficiency);
  EXPECT_DOUBLE_EQ(kernel_mma_efficiency(plans[0].chosen->candidate), kMmaSyncEfficiency);
  // Ranked is sorted and holds only fitting candidates.
  for (const GemmPlan& p : plans) {
    for (size_t i = 1; i < p.ranked.size(); ++i) EXPECT_LE(p.ranked[i - 1].cost.time_us, p.ranked[i].cost.time_us);
    for (const CandidateResult& c : p.ranked) EXPECT_TRUE(c.smem.fits);
  }
}

// The dequantization term (cost_model.h): on the GLM-5 shard (32 experts, uniform) at 16 tokens a
// expert the streaming n16 tile beats the wgmma m128n32 tile, though the latter needs less MMA time at the
// same HBM bytes (measured 159 vs 259 us, BENCHMARKS.md seventeenth session run 3); at 32 tokens the
// streaming n16 tile's two token tiles dequantize every weight twice (278 vs 258 us for wgmma m128n32),
// and the streaming n32 tile (one token tile, w4a16_stream_m128n32_d4) is chosen over both.
TEST(Planner, OursDequantizationTermOrdersDecodeTiles) {
  const GpuSpec h200 = require_gpu("h200");
  const Problem shard = parse_problem("moe:E=32,topk=8,H=6144,I=2048");
  const std::vector<GemmPlan> plans = plan(shard, {64, 128}, h200, {});
  ASSERT_EQ(plans.size(), 4u);
  auto cost_of = [](const GemmPlan& p, const std::string& name) {
    for (const CandidateResult& c : p.ranked) {
      if (c.candidate.to_string() == name) return c.cost;
    }
    ADD_FAILURE() << name << " not ranked";
    return CostEstimate{};
  };
  // 64 tokens x 8 / 32 experts = 16 a expert.
  ASSERT_TRUE(plans[0].chosen.has_value()) << plans[0].error;
  EXPECT_EQ(plans[0].chosen->candidate.ours.kind, W4A16Kind::kStream) << plans[0].chosen->candidate.to_string();
  EXPECT_EQ(plans[0].chosen->candidate.token_tile(), 16u);
  EXPECT_EQ(plans[0].chosen->cost.bound, "dequant");
  const CostEstimate wg = cost_of(plans[0], "w4a16_wgmma_m128n32_s4");
  const CostEstimate st = cost_of(plans[0], "w4a16_stream_m128n16_d8");
  EXPECT_LT(wg.onchip_time_us, st.onchip_time_us);  // less MMA time ...
  EXPECT_GT(wg.time_us, st.time_us);                // ... but more dequantization
  // gate_up: 32 experts x 4096 / 128 = 1024 tiles = 8 waves on 132 SMs; 128 x 6144 weights a tile at 325
  // and 190 FLOPs each of 989 TFLOP/s / 132.
  const double per_sm = 989e12 / 132;
  EXPECT_NEAR(wg.dequant_time_us, 8 * 128.0 * 6144 * kWgmmaDequantFlops / per_sm * 1e6, 1e-6);
  EXPECT_NEAR(st.dequant_time_us, 8 * 128.0 * 6144 * kStreamDequantFlops / per_sm * 1e6, 1e-6);
  // 32 a expert: the streaming n32 tile, one token tile; wgmma m128n32 before the n16 tile's two.
  ASSERT_TRUE(plans[2].chosen.has_value()) << plans[2].error;
  EXPECT_EQ(plans[2].chosen->candidate.to_string(), "w4a16_stream_m128n32_d4");
  EXPECT_EQ(cost_of(plans[2], "w4a16_stream_m128n16_d8").dequant_time_us, 2 * st.dequant_time_us);
  EXPECT_LT(cost_of(plans[2], "w4a16_wgmma_m128n32_s4").time_us, cost_of(plans[2], "w4a16_stream_m128n16_d8").time_us);
  // The CUTLASS families multiply FP4: no dequantization.
  const GemmPlan b200 = plan_gemm(gemms_of(shard, 64)[0], require_gpu("b200"), {});
  ASSERT_TRUE(b200.chosen.has_value()) << b200.error;
  EXPECT_EQ(b200.chosen->cost.dequant_time_us, 0.0);
}

TEST(Planner, OursEnumeratesTheShippedConfigsWithTheKernelsLayout) {
  const std::vector<TileCandidate> cands = family_candidates(KernelFamily::kSm90W4A16, true);
  ASSERT_EQ(static_cast<int>(cands.size()), kNumW4A16Configs);
  const GpuSpec h200 = require_gpu("h200");
  for (int i = 0; i < kNumW4A16Configs; ++i) {
    const TileCandidate& c = cands[static_cast<size_t>(i)];
    const W4A16Config& k = kW4A16Configs[i];
    const std::string name = w4a16_config_name(k);
    EXPECT_EQ(c.to_string(), name);
    EXPECT_EQ(c.base_tile_index, i) << name;
    EXPECT_TRUE(c.swap_ab()) << name;
    EXPECT_EQ(c.token_tile(), k.block_t) << name;  // tokens are the MMA N
    EXPECT_EQ(c.weight_tile(), k.block_w) << name;
    EXPECT_EQ(c.tile_k(), k.block_k) << name;
    const SmemCheck check = check_smem(c, h200, kCutlass420);
    const W4A16Layout l = W4A16Layout::make(k);
    EXPECT_TRUE(check.fits) << name << ": " << check.reason;
    EXPECT_EQ(check.stages, static_cast<int>(k.stages)) << name;
    EXPECT_EQ(check.bytes, l.total_bytes()) << name;
    EXPECT_EQ(check.stage_bytes, l.stage_stride) << name;
    // The wgmma kinds' epilogue tile lives inside the stages: no bytes of its own.
    EXPECT_EQ(check.epilogue_bytes, w4a16_is_wgmma(k.kind) ? 0u : l.epilogue_bytes) << name;
    EXPECT_EQ(check.summary, w4a16_smem_summary(k)) << name;
    EXPECT_EQ(describe(candidate_layout(c, h200, kCutlass420)), describe(l.layout)) << name;
  }
}

// On a GPU with less shared memory (RTX 4090: 101376 B opt-in) the two shipped pipeline configs over
// it are rejected with the byte breakdown, by the computation the launcher refuses them with; the
// six wgmma configs by the architecture (sm_89 has no wgmma), and so are the ten stream configs (their
// activations come by TMA, which sm_89 lacks): 18 rejections in config id order, three configs left.
TEST(Planner, OursRejectionSnapshot) {
  const GemmPlan p = plan_gemm(gemms_of(kGlm5, 4096)[0], require_gpu("rtx-4090"), {});
  EXPECT_EQ(p.family, KernelFamily::kSm90W4A16);
  ASSERT_TRUE(p.chosen.has_value()) << p.error;
  ASSERT_EQ(p.rejected.size(), 18u);
  const Rejection* pipeline_smem[2] = {nullptr, nullptr};
  int wgmma = 0, stream = 0;
  for (const Rejection& r : p.rejected) {
    const W4A16Kind kind = r.candidate.ours.kind;
    if (kind == W4A16Kind::kPipeline) {
      pipeline_smem[pipeline_smem[0] == nullptr ? 0 : 1] = &r;
      continue;
    }
    EXPECT_EQ(r.rule, "arch") << r.message;
    const char* want =
        kind == W4A16Kind::kStream
            ? "sm90_nvfp4_w4a16_grouped_gemm stream tiles need TMA (cp.async.bulk.tensor, sm_90+); "
              "rtx-4090 is sm_89"
            : "sm90_nvfp4_w4a16_grouped_gemm wgmma tiles need sm_90a (wgmma.mma_async); rtx-4090 is sm_89";
    EXPECT_NE(r.message.find(want), std::string::npos) << r.message;
    ++(kind == W4A16Kind::kStream ? stream : wgmma);
  }
  EXPECT_EQ(stream, 10);
  EXPECT_EQ(wgmma, 6);
  EXPECT_EQ(p.rejected[0].candidate.to_string(), "w4a16_stream_m64n8_d8");
  EXPECT_EQ(p.rejected[17].candidate.to_string(), "w4a16_stream_m256n32_d4");
  ASSERT_NE(pipeline_smem[1], nullptr);
  EXPECT_EQ(pipeline_smem[0]->candidate.to_string(), "w4a16_swapab_m128n16k256_s4");
  const Rejection& r = *pipeline_smem[1];
  EXPECT_EQ(r.rule, "smem-opt-in");
  EXPECT_EQ(r.bytes_needed, 119808u);
  EXPECT_EQ(r.limit, 101376u);
  EXPECT_EQ(r.shortfall(), 18432);
  EXPECT_EQ(r.message,
            "w4a16_swapab_m128n64k128_s4: 4 stages x (x_tile 16384 + w_tiles 8192 + w_scales 1024) + epilogue 17408 = "
            "119808 B > 101376 B opt-in (sm_89) by 18432 B");
  const SmemCheck check = check_smem(r.candidate, require_gpu("rtx-4090"), kCutlass420);
  EXPECT_EQ(check.reason, w4a16_smem_refusal(r.candidate.ours, 101376));
  uint32_t sum = 0;
  for (const BreakdownItem& b : r.breakdown) sum += b.bytes;
  EXPECT_EQ(sum, r.bytes_needed);
  // Every shipped config fits the sm_90 opt-in (the kernel static_asserts it too).
  EXPECT_TRUE(plan_gemm(gemms_of(kGlm5, 4096)[0], require_gpu("h200"), {}).rejected.empty());
}

TEST(Planner, CutlassSm120RejectionSnapshots) {
  PlanOptions o;
  o.family = KernelFamily::kCutlassSm120;
  const GemmPlan p = plan_gemm(gemms_of(kGlm5, 64)[1], require_gpu("rtx-pro-6000"), o);
  ASSERT_TRUE(p.chosen.has_value());
  std::vector<std::string> messages;
  for (const Rejection& r : p.rejected) {
    if (r.rule == "builder-overflow") messages.push_back(r.message);
  }
  ASSERT_EQ(messages.size(), 2u);
  EXPECT_EQ(messages[0],
            "128x256x128 FINALIZE swap_ab=0: 3 stages x 27648 + epilogue 17408 + overhead 2048 = 102400 B > 101376 B opt-in "
            "(sm_120) by 1024 B");
  EXPECT_EQ(messages[1],
            "256x128x128 FINALIZE swap_ab=0: 3 stages x 27648 + epilogue 17408 + overhead 2048 = 102400 B > 101376 B opt-in "
            "(sm_120) by 1024 B");
  const Rejection& r = *std::find_if(p.rejected.begin(), p.rejected.end(), [](const Rejection& x) { return x.rule == "builder-overflow"; });
  EXPECT_EQ(r.note,
            "builder: (100944 - 17408) / 27776 = 3 stage(s) fit in its budget, but the kernel also needs 1664 B the budget does "
            "not count (pipelines, scheduler responses, TMA descriptors, padding); 2 stages would need 74752 B");
  const Rejection& min_stages = *std::find_if(p.rejected.begin(), p.rejected.end(), [](const Rejection& x) { return x.rule == "builder-min-stages"; });
  EXPECT_EQ(min_stages.message,
            "128x128x512 NONE swap_ab=0: 2 stages x 73728 + epilogue 13312 + overhead 2048 = 162816 B > 101376 B opt-in (sm_120) "
            "by 61440 B; the builder computes fewer than 2 stages; the SM120 mainloop static_asserts Stages >= 2 (builder: "
            "(100944 - 13312) / 73856 = 1 stage(s)); FlashInfer has no SHAPE_CASE for it either");
  // Decode on SM120: a swap-AB small-N tile.
  EXPECT_TRUE(p.chosen->candidate.swap_ab());
  EXPECT_LE(p.chosen->candidate.token_tile(), 64u);
}

TEST(Planner, DescribeListsEveryRegion) {
  TileCandidate c;
  c.family = KernelFamily::kCutlassSm120;
  c.cutlass = CutlassGroupedConfig{128, 256, 128, OperandKind::kNvfp4, EpilogueFusion::kFinalize, false};
  const std::string d = describe(candidate_layout(c, require_gpu("rtx-pro-6000"), kCutlassB46b16d));
  EXPECT_EQ(d.rfind("  0 +24576 (align 1024) mainloop smem_A\n  24576 +49152 (align 1024) mainloop smem_B\n", 0), 0u) << d;
  EXPECT_NE(d.find("(align 128) epilogue TMA descriptors (C + 2 D)\n"), std::string::npos) << d;
  EXPECT_NE(d.find("  total 102400 B\n"), std::string::npos) << d;
}

TEST(Planner, ArchMismatchIsARejectionNotAnException) {
  // The kernel needs mma.sync BF16 and cp.async (sm_80+; the stream tiles TMA, sm_90+); a pre-Ampere GPU is an
  // arch rejection.
  GpuSpec turing = require_gpu("rtx-3090");
  turing.name = "turing";
  turing.sm = 75;
  turing.features &= ~static_cast<uint32_t>(kMmaSync);
  PlanOptions o;
  o.family = KernelFamily::kSm90W4A16;
  const GemmPlan p = plan_gemm(gemms_of(kGlm5, 1)[0], turing, o);
  EXPECT_FALSE(p.chosen.has_value());
  ASSERT_EQ(static_cast<int>(p.rejected.size()), kNumW4A16Configs);
  EXPECT_EQ(p.rejected[0].rule, "arch");
  EXPECT_EQ(p.rejected[0].message,
            "w4a16_stream_m64n8_d8: sm90_nvfp4_w4a16_grouped_gemm needs mma.sync BF16 + cp.async (sm_80+); turing is sm_75");
  try {
    require_chosen(p);
    FAIL() << "require_chosen returned for an infeasible plan";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no sm90_nvfp4_w4a16_grouped_gemm tile fits gemm1 (gate+up) on turing (sm_75, opt-in 101376 B)"),
              std::string::npos)
        << e.what();
  }
}

TEST(Planner, NothingFitsListsShortfallsNearestFirst) {
  // A GPU with 64 KiB of opt-in SMEM: no SM120 tile fits; the error lists each, nearest first.
  GpuSpec small = require_gpu("rtx-pro-6000");
  small.name = "tiny";
  small.smem_optin_per_block = 65536;
  PlanOptions o;
  o.family = KernelFamily::kCutlassSm120;
  const GemmPlan p = plan_gemm(gemms_of(kGlm5, 1)[0], small, o);
  ASSERT_FALSE(p.chosen.has_value());
  EXPECT_EQ(p.rejected.size(), 20u);
  const std::string& e = p.error;
  EXPECT_EQ(e.rfind("no cutlass-sm120-moe tile fits gemm1 (gate+up) on tiny (sm_120, opt-in 65536 B); 20 candidates, nearest first:", 0), 0u) << e;
  // Shortfalls in the message never decrease.
  int64_t last = -1;
  size_t pos = 0;
  int n = 0;
  while ((pos = e.find("short by ", pos)) != std::string::npos) {
    pos += 9;
    const int64_t v = std::stoll(e.substr(pos));
    EXPECT_GE(v, last) << e;
    last = v;
    ++n;
  }
  EXPECT_EQ(n, 20);
  // The nearest miss is the smallest request, 128x64x128 NONE swap_ab=1 (5 stages, 87040 B): the
  // builder divides CUTLASS's constant 101376, not the device's value.
  EXPECT_NE(e.find(":\n  short by 21504 B: 128x64x128 NONE swap_ab=1: 5 stages x 14336 + epilogue 14336 + overhead 1024 = 87040 B"), std::string::npos) << e;
}

TEST(Planner, SameTilesFitOnHopperCapacity) {
  // The CUTLASS SM120 family sized against an sm_90 opt-in: the builder still uses 101376, so
  // the requests are unchanged and all dispatchable, buildable tiles fit with room to spare.
  GpuSpec h = require_gpu("rtx-pro-6000");
  h.smem_optin_per_block = 232448;
  PlanOptions o;
  o.family = KernelFamily::kCutlassSm120;
  const GemmPlan p = plan_gemm(gemms_of(kGlm5, 64)[1], h, o);
  for (const Rejection& r : p.rejected) EXPECT_EQ(r.rule, "builder-min-stages") << r.message;
}

}  // namespace
}  // namespace fp4moe::plan
