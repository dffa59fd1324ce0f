// Reproduces ../shared/spec/smem-and-tiles.md §3 to the byte from the structural CUTLASS model
// (src/plan/layout_cutlass.h): every row of "Exact kernel SMEM on SM120" with the 4.4.2 carve-out
// (CUTLASS b46b16d) and without it, the SM100 rows, the builder-vs-kernel disagreement behind
// "requires 102400 bytes ... supports 101376", and the same tiles on sm_90 / sm_100 capacity.
// Also pins the model against what the CUTLASS 4.2.0 headers of this repo give (measured with
// tests/plan/cutlass_check, which re-checks them against the real types when nvcc is present).
#include <gtest/gtest.h>

#include "plan/layout_cutlass.h"

namespace fp4moe::plan {
namespace {

constexpr auto kNv = OperandKind::kNvfp4;
constexpr auto kMx = OperandKind::kMxfp8Mxfp4;
constexpr auto kNone = EpilogueFusion::kNone;
constexpr auto kFin = EpilogueFusion::kFinalize;

struct Row {
  CutlassGroupedConfig config;
  int stages;
  uint32_t bytes;
};

std::string describe(const CutlassGroupedConfig& c) {
  return std::to_string(c.m) + "x" + std::to_string(c.n) + "x" + std::to_string(c.k) + " " + operand_name(c.operands) + " " +
         fusion_name(c.epilogue) + " swap_ab=" + std::to_string(c.swap_ab);
}

void expect_rows(const std::vector<Row>& rows, const CutlassRules& rules) {
  for (const Row& r : rows) {
    const CutlassGroupedModel m = model_cutlass_sm120(r.config, rules);
    ASSERT_EQ(m.invalid_reason, nullptr) << describe(r.config) << ": " << m.invalid_reason;
    EXPECT_EQ(m.stages, r.stages) << describe(r.config) << " (" << rules.name << ")";
    EXPECT_EQ(m.layout.total_bytes, r.bytes) << describe(r.config) << " (" << rules.name << ")";
  }
}

// The spec's table, row by row (Tile, Epilogue, Stages, Kernel SMEM). "FIN" rows without a swap
// note hold for both swap_ab values.
const std::vector<Row> kSpecSm120Table = {
    {{128, 128, 128, kNv, kNone, false}, 4, 89088},  {{128, 128, 128, kNv, kFin, false}, 4, 93184},
    {{128, 128, 128, kNv, kFin, true}, 4, 93184},    {{128, 128, 256, kNv, kNone, false}, 2, 89088},
    {{128, 128, 256, kNv, kFin, false}, 2, 93184},   {{128, 256, 128, kNv, kNone, false}, 3, 98304},
    {{128, 256, 128, kNv, kFin, false}, 3, 102400},  {{128, 256, 128, kNv, kFin, true}, 2, 74752},
    {{256, 128, 128, kNv, kNone, false}, 3, 98304},  {{256, 128, 128, kNv, kFin, false}, 3, 102400},
    {{256, 128, 128, kNv, kFin, true}, 2, 74752},    {{128, 64, 128, kNv, kNone, false}, 6, 101376},
    {{128, 64, 128, kNv, kNone, true}, 5, 87040},    {{128, 64, 128, kNv, kFin, false}, 5, 91136},
    {{128, 64, 128, kNv, kFin, true}, 5, 91136},     {{128, 64, 256, kNv, kNone, false}, 3, 101376},
    {{128, 64, 256, kNv, kFin, false}, 2, 76800},    {{128, 32, 128, kNv, kNone, false}, 7, 101376},
    {{128, 32, 128, kNv, kNone, true}, 6, 89088},    {{128, 32, 128, kNv, kFin, false}, 6, 93184},
    {{128, 32, 128, kNv, kFin, true}, 6, 93184},     {{128, 32, 256, kNv, kNone, false}, 3, 89088},
    {{128, 32, 256, kNv, kFin, false}, 3, 93184},    {{128, 128, 128, kMx, kNone, false}, 2, 82944},
    {{128, 128, 128, kMx, kFin, false}, 2, 87040},   {{128, 64, 128, kMx, kNone, false}, 3, 92160},
    {{128, 64, 128, kMx, kFin, false}, 3, 96256},    {{128, 32, 128, kMx, kNone, false}, 4, 101376},
    {{128, 32, 128, kMx, kFin, false}, 3, 83968},
};

TEST(CutlassSm120, SpecTableWithCarveout) {
  // b46b16d builder capacity: 101376 - 128 (scheduler pipeline) - 256 (2 tensor maps) - 48 = 100944.
  EXPECT_EQ(sm120_builder_capacity(kSm120SmemCapacity, kCutlassB46b16d), 100944u);
  expect_rows(kSpecSm120Table, kCutlassB46b16d);
}

TEST(CutlassSm120, SpecTableWithoutCarveout) {
  // Before v4.4.2 the builder divided the raw 101376. The spec: "Same results on CUTLASS v4.2.1
  // for the four large tiles". Only swap_ab=1 NONE small-N tiles change: their quotient crosses an
  // integer. Hand check 128x32x128 NONE swap_ab=1: (101376 - 14336) / 12416 = 7.01 -> 7 stages;
  // tensors 7 x 12288 + 13312 = 99328; pipelines 128 + 112 + 48 + 16 = 304; responses 128;
  // -> 99760 -> 99840 (128) + 896 descriptors = 100736 -> 101376 (1024): exactly the limit.
  std::vector<Row> rows = kSpecSm120Table;
  for (Row& r : rows) {
    if (r.config.swap_ab && r.config.epilogue == kNone && r.config.n == 64) r = {r.config, 6, 101376};
    if (r.config.swap_ab && r.config.epilogue == kNone && r.config.n == 32) r = {r.config, 7, 101376};
  }
  expect_rows(rows, without_capacity_carveout(kCutlassB46b16d));
}

TEST(CutlassSm120, EpilogueStorageMatchesProbe) {
  // sizeof(CollectiveEpilogue::SharedStorage), bf16 output: NONE 13312 / 14336, FINALIZE 17408 / 18432.
  EXPECT_EQ(epilogue_storage_bytes(sm120_epilogue_shape({128, 128, 128, kNv, kNone, false})), 13312u);
  EXPECT_EQ(epilogue_storage_bytes(sm120_epilogue_shape({128, 128, 128, kNv, kNone, true})), 14336u);
  EXPECT_EQ(epilogue_storage_bytes(sm120_epilogue_shape({128, 256, 128, kNv, kFin, false})), 17408u);
  EXPECT_EQ(epilogue_storage_bytes(sm120_epilogue_shape({128, 256, 128, kNv, kFin, true})), 18432u);
}

TEST(CutlassSm120, BuilderStageBytesMatchSpec) {
  const CutlassRules& r = kCutlassB46b16d;
  EXPECT_EQ(builder_stage_bytes({128, 128, 128, kNv, kNone, false}, r, false), 18560u);
  EXPECT_EQ(builder_stage_bytes({128, 128, 256, kNv, kNone, false}, r, false), 36992u);
  EXPECT_EQ(builder_stage_bytes({128, 256, 128, kNv, kNone, false}, r, false), 27776u);
  EXPECT_EQ(builder_stage_bytes({256, 128, 128, kNv, kNone, false}, r, false), 27776u);
  EXPECT_EQ(builder_stage_bytes({128, 64, 128, kNv, kNone, false}, r, false), 14464u);
  EXPECT_EQ(builder_stage_bytes({128, 32, 128, kNv, kNone, false}, r, false), 12416u);
  EXPECT_EQ(builder_stage_bytes({128, 128, 128, kMx, kNone, false}, r, false), 33920u);
  // FP8 x FP4 pads FP4 to a byte: 33792 per stage against 18432 packed.
  EXPECT_EQ(stage_bytes({128, 128, 128, kMx, kNone, false}, r, false).operands(), 33792u);
  EXPECT_EQ(stage_bytes({128, 128, 128, kNv, kNone, false}, r, false).operands(), 18432u);
}

TEST(CutlassSm120, BuilderDisagreesWithKernelAt102400) {
  // The builder: (100944 - 17408) / 27776 = 3.007 -> 3 stages "fit"; the kernel requests 102400.
  for (bool carveout : {true, false}) {
    const CutlassRules rules = carveout ? kCutlassB46b16d : without_capacity_carveout(kCutlassB46b16d);
    for (CutlassGroupedConfig c : {CutlassGroupedConfig{128, 256, 128, kNv, kFin, false}, CutlassGroupedConfig{256, 128, 128, kNv, kFin, false}}) {
      const CutlassGroupedModel m = model_cutlass_sm120(c, rules);
      EXPECT_EQ(m.stages, 3) << describe(c);
      EXPECT_LE(3 * m.builder_stage_bytes + m.epilogue_storage, m.builder_capacity) << describe(c);
      EXPECT_EQ(m.layout.total_bytes, 102400u) << describe(c);
      EXPECT_GT(m.layout.total_bytes, kSm120SmemCapacity) << describe(c);
      // Breakdown: 3 stages x 27648 (mainloop) + 16896 epilogue tensors + 2560 the rest.
      EXPECT_EQ(m.layout.bytes_of_kind(RegionKind::kStageOperand), 82944u);
      uint32_t epilogue_tensors = 0;  // CollectiveEpilogue::TensorStorage, its padding included
      for (int i = 0; i < m.layout.n_regions; ++i) epilogue_tensors += m.layout.regions[i].in_epilogue_storage ? m.layout.regions[i].bytes : 0;
      EXPECT_EQ(epilogue_tensors, 16896u);
      EXPECT_EQ(m.layout.total_bytes - 82944u - 16896u, 2560u);
      EXPECT_EQ(m.layout.bytes_of_kind(RegionKind::kDescriptor), 7 * 128u);  // 4 mainloop + 3 epilogue maps
      // One stage fewer fits: 74752 B.
      EXPECT_EQ(sm120_kernel_layout(c, rules, 2).total_bytes, 74752u);
    }
  }
}

TEST(CutlassSm120, OneStageIsNotBuildable) {
  // 128x128x512 (FlashInfer 128x128x256B): (100944 - 13312) / 73856 = 1 < 2.
  const CutlassGroupedModel m = model_cutlass_sm120({128, 128, 512, kNv, kNone, false}, kCutlassB46b16d);
  EXPECT_EQ(m.stages, 1);
  EXPECT_TRUE(m.tile_ok);
  ASSERT_NE(m.invalid_reason, nullptr);
}

TEST(CutlassSm120, SameTilesOnHopperAndBlackwellCapacity) {
  // The SM120 layouts with a 232448 B (sm_90 / sm_100) budget: every table tile fits, deeper.
  // Hand check 128x256x128 FINALIZE: (232448 - 17408) / 27776 = 7.74 -> 7 stages; tensors
  // 7 x 27648 + 16896 = 210432 -> 210944; + 272 + 128 -> 211344 -> 211456 + 896 -> 212992.
  const CutlassGroupedModel fin = model_cutlass_sm120({128, 256, 128, kNv, kFin, false}, without_capacity_carveout(kCutlassB46b16d), 232448);
  EXPECT_EQ(fin.stages, 7);
  EXPECT_EQ(fin.layout.total_bytes, 212992u);
  for (const Row& r : kSpecSm120Table) {
    const CutlassGroupedModel m = model_cutlass_sm120(r.config, without_capacity_carveout(kCutlassB46b16d), 232448);
    ASSERT_EQ(m.invalid_reason, nullptr) << describe(r.config);
    EXPECT_GE(m.stages, r.stages) << describe(r.config);
    EXPECT_LE(m.layout.total_bytes, 232448u) << describe(r.config) << " at " << m.stages << " stages";
  }
}

TEST(CutlassSm100, SpecRows) {
  // 1-SM, static 1x1x1 cluster, capacity 232448; builder capacity 229032 (N != 256) / 229048 (N = 256).
  const CutlassGroupedModel a = model_cutlass_sm100({128, 128, 256, kNv, kNone, false}, kCutlassB46b16d);
  EXPECT_EQ(a.builder_capacity, 229032u);
  EXPECT_EQ(a.stages, 5);
  EXPECT_EQ(a.layout.total_bytes, 206336u);
  const CutlassGroupedModel b = model_cutlass_sm100({128, 256, 256, kNv, kNone, false}, kCutlassB46b16d);
  EXPECT_EQ(b.builder_capacity, 229048u);
  EXPECT_EQ(b.stages, 3);
  EXPECT_EQ(b.epilogue_storage, 34816u);  // the 128x64 sub-tile
  EXPECT_EQ(b.layout.total_bytes, 204800u);
  const CutlassGroupedModel c = model_cutlass_sm100({128, 64, 256, kNv, kFin, false}, kCutlassB46b16d);
  EXPECT_EQ(c.stages, 7);
  EXPECT_EQ(c.layout.total_bytes, 222720u);
}

TEST(CutlassSm100, Cutlass420MatchesItsHeaders) {
  // Measured from CUTLASS 4.2.0 (third_party) with nvcc: void C, EpilogueTileAuto, 1-SM NVF4.
  struct Case {
    CutlassGroupedConfig c;
    int stages;
    uint32_t epi, bytes;
  };
  for (const Case& k : {Case{{128, 128, 256, kNv, kNone, false}, 5, 17408, 202752},
                        Case{{128, 256, 256, kNv, kNone, false}, 2, 67584, 179200},
                        Case{{128, 64, 256, kNv, kNone, false}, 7, 17408, 219136}}) {
    const CutlassGroupedModel m = model_cutlass_sm100(k.c, kCutlass420);
    EXPECT_EQ(m.stages, k.stages) << describe(k.c);
    EXPECT_EQ(m.epilogue_storage, k.epi) << describe(k.c);
    EXPECT_EQ(m.layout.total_bytes, k.bytes) << describe(k.c);
  }
}

TEST(CutlassSm120, Cutlass420MatchesItsHeaders) {
  // 4.2.0: raw capacity, 16 B barrier budget; same results as the spec for the large tiles.
  EXPECT_EQ(model_cutlass_sm120({128, 128, 128, kNv, kNone, false}, kCutlass420).layout.total_bytes, 89088u);
  EXPECT_EQ(model_cutlass_sm120({128, 256, 128, kNv, kNone, false}, kCutlass420).layout.total_bytes, 98304u);
  EXPECT_EQ(model_cutlass_sm120({128, 256, 128, kNv, kFin, false}, kCutlass420).layout.total_bytes, 102400u);
  EXPECT_EQ(model_cutlass_sm120({128, 128, 128, kNv, kNone, true}, kCutlass420).epilogue_storage, 14336u);
  // 4.2.0 sizes SFB for N/128*128 = 0 rows when N < 128: reported, not silently modelled.
  const CutlassGroupedModel small = model_cutlass_sm120({128, 64, 128, kNv, kNone, false}, kCutlass420);
  ASSERT_NE(small.invalid_reason, nullptr);
  EXPECT_FALSE(small.tile_ok);
}

// The model is constexpr: a kernel can static_assert its own configuration.
static_assert(model_cutlass_sm120({128, 128, 128, kNv, kNone, false}, kCutlassB46b16d).layout.total_bytes == 89088);
static_assert(model_cutlass_sm120({128, 256, 128, kNv, kFin, false}, kCutlassB46b16d).layout.total_bytes > kSm120SmemCapacity);
static_assert(model_cutlass_sm100({128, 128, 256, kNv, kNone, false}, kCutlassB46b16d).layout.total_bytes == 206336);

}  // namespace
}  // namespace fp4moe::plan
