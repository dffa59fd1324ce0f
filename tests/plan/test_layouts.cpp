// SmemLayout mechanics and the project's own Hopper layout (sm90_nvfp4_w4a16_grouped_gemm):
// alignment, no overlaps, regions summing to the total, stage strides, the deepest pipeline that
// fits, and constexpr use as a kernel would (static_assert against the sm_90 opt-in).
#include <gtest/gtest.h>

#include "plan/layout_cutlass.h"
#include "plan/layout_sm90_w4a16.h"

namespace fp4moe::plan {
namespace {

void expect_well_formed(const SmemLayout& l, const std::string& what) {
  uint32_t sum = 0, end = 0;
  for (int i = 0; i < l.n_regions; ++i) {
    const SmemRegion& r = l.regions[i];
    EXPECT_EQ(r.offset, end) << what << ": region " << r.name << " leaves a gap or overlaps";
    EXPECT_EQ(r.offset % r.align, 0u) << what << ": region " << r.name << " at " << r.offset << " not aligned to " << r.align;
    sum += r.bytes;
    end = r.offset + r.bytes;
  }
  EXPECT_EQ(sum, l.total_bytes) << what;
  EXPECT_EQ(end, l.total_bytes) << what;
}

TEST(SmemLayout, StructPaddingLikeCxx) {
  // struct { alignas(1024) char a[100]; char b[3]; } has sizeof 1024; inside an outer struct
  // followed by a 16-aligned member of 8 bytes: 1024 + 8 -> 2048 (outer alignment 1024).
  SmemLayout l{};
  l.open_struct("outer tail", 1);
  l.open_struct("inner tail", 1);
  l.add("a", 100, 1024, RegionKind::kStageOperand);
  l.add("b", 3, 1, RegionKind::kStageOperand);
  EXPECT_EQ(l.close_struct(), 1024u);
  EXPECT_EQ(l.total_bytes, 1024u);
  l.add("c", 8, 16, RegionKind::kBarrier);
  l.close_struct();
  EXPECT_EQ(l.total_bytes, 2048u);
  EXPECT_EQ(l.offset_of("c"), 1024u);
  EXPECT_EQ(l.offset_of("missing"), UINT32_MAX);
  expect_well_formed(l, "toy");
}

TEST(Sm90W4A16, DecodeSwapAbLayout) {
  // swap-AB 128 weights x 8 tokens x K 128, 8 stages:
  //   x_tile 8x128 bf16 = 2048 (1024-aligned), w_packed 128x128/2 = 8192 at 2048, w_scales
  //   128x128/16 = 1024 at 10240, stage end 11264 -> stride 11264 (already 1024-aligned).
  constexpr Sm90W4A16Layout l = Sm90W4A16Layout::make({128, 8, 128, 0, true});
  static_assert(l.invalid_reason == nullptr);
  static_assert(l.config.stages == 8);
  static_assert(l.fits(kSm90SmemOptin));
  EXPECT_EQ(l.stage_stride, 11264u);
  EXPECT_EQ(l.x_tile(0), 0u);
  EXPECT_EQ(l.w_packed(0), 2048u);
  EXPECT_EQ(l.w_scales(0), 10240u);
  EXPECT_EQ(l.x_tile(3), 3 * 11264u);
  // After 8 stages (90112): w_dequant 128x128 bf16 = 32768, epilogue 128x8 bf16 = 2048, barriers 64 + 64.
  EXPECT_EQ(l.w_dequant_offset, 90112u);
  EXPECT_EQ(l.epilogue_offset, 90112u + 32768u);
  EXPECT_EQ(l.full_barrier_offset, 90112u + 32768u + 2048u);
  EXPECT_EQ(l.empty_barrier(0), l.full_barrier_offset + 64u);
  EXPECT_EQ(l.total_bytes(), 90112u + 32768u + 2048u + 128u);
  expect_well_formed(l.layout, "128x8x128 swap");
  for (uint32_t s = 0; s < 8; ++s) {
    EXPECT_EQ(l.x_tile(s) % 1024, 0u);
    EXPECT_EQ(l.w_packed(s) % 1024, 0u);
    EXPECT_EQ(l.w_scales(s) % 128, 0u);
  }
}

TEST(Sm90W4A16, DeepestPipelineThatFits) {
  // 128x256x128 (prefill, tokens = M): stage = 32768 (x) + 16384 (w) + 2048 (s) = 51200;
  // w_dequant 256x128x2 = 65536, epilogue 128x256x2 = 65536: 2 stages = 233504 > 232448.
  const Sm90W4A16Layout big = Sm90W4A16Layout::make({128, 256, 128, 0, false});
  EXPECT_EQ(big.config.stages, 1u);
  EXPECT_EQ(Sm90W4A16Layout::at_stages({128, 256, 128, 0, false}, 2).total_bytes(), 233504u);
  // 128x256x64: stage 16384 + 8192 + 1024 = 25600; fixed 32768 + 65536 = 98304 -> 5 stages fit.
  const Sm90W4A16Layout mid = Sm90W4A16Layout::make({128, 256, 64, 0, false});
  EXPECT_EQ(mid.config.stages, 5u);
  EXPECT_EQ(mid.total_bytes(), 5 * 25600u + 98304u + 80u);
  EXPECT_FALSE(Sm90W4A16Layout::at_stages({128, 256, 64, 0, false}, 6).fits(kSm90SmemOptin));
  expect_well_formed(mid.layout, "128x256x64");
}

TEST(Sm90W4A16, RejectsBadTiles) {
  EXPECT_NE(Sm90W4A16Layout::make({128, 4, 128, 0, true}).invalid_reason, nullptr);    // N < 8
  EXPECT_NE(Sm90W4A16Layout::make({96, 16, 128, 0, true}).invalid_reason, nullptr);    // MMA M 96
  EXPECT_NE(Sm90W4A16Layout::make({128, 128, 96, 0, false}).invalid_reason, nullptr);  // K not /64
  EXPECT_NE(Sm90W4A16Layout::make({128, 128, 128, 9, false}).invalid_reason, nullptr); // > 8 stages
}

TEST(CutlassLayouts, WellFormed) {
  const CutlassGroupedModel a = model_cutlass_sm120({128, 256, 128, OperandKind::kNvfp4, EpilogueFusion::kFinalize, false}, kCutlassB46b16d);
  expect_well_formed(a.layout, "sm120 128x256x128 FINALIZE");
  EXPECT_EQ(a.layout.offset_of("mainloop smem_B") % 1024, 0u);
  const CutlassGroupedModel b = model_cutlass_sm100({128, 256, 256, OperandKind::kNvfp4, EpilogueFusion::kNone, false}, kCutlassB46b16d);
  expect_well_formed(b.layout, "sm100 128x256x256");
}

}  // namespace
}  // namespace fp4moe::plan
