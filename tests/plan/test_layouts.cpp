// SmemLayout mechanics and the layout of the shipped Hopper kernel (sm90_nvfp4_w4a16_grouped_gemm,
// plan/layout_sm90_w4a16.h): every shipped config's offsets pinned to the byte, alignment, no
// overlaps, regions summing to the total, constexpr use as the kernel does (static_assert against
// the sm_90 opt-in), and the summary / refusal wording the launcher and the planner share.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>

#include "plan/layout_cutlass.h"
#include "plan/layout_sm90_w4a16.h"
#include "plan/w4a16_smem.h"

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

// The shipped configs (kW4A16Configs, the kernel's template instantiations) pinned to the byte.
// Per stage: x_tile block_t x block_k x 2, w_packed block_w x block_k / 2, w_scales
// block_w x block_k / 16, back to back (all multiples of 128); then the epilogue, block_t rows
// of block_w x 2 + 16 B; the total rounded to 128 (never needed for these tiles).
struct Pinned {
  const char* name;
  uint32_t x_tile, w_packed, w_scales, stage_stride, epilogue_offset, epilogue_bytes, total;
};
constexpr Pinned kPinned[] = {
    {"w4a16_swapab_m64n8k128_s4", 2048, 4096, 512, 6656, 26624, 1152, 27776},
    {"w4a16_swapab_m64n16k128_s4", 4096, 4096, 512, 8704, 34816, 2304, 37120},
    {"w4a16_swapab_m64n8k256_s3", 4096, 8192, 1024, 13312, 39936, 1152, 41088},
    {"w4a16_swapab_m64n8k256_s4", 4096, 8192, 1024, 13312, 53248, 1152, 54400},
    {"w4a16_swapab_m128n8k256_s4", 4096, 16384, 2048, 22528, 90112, 2176, 92288},
    {"w4a16_swapab_m128n16k256_s4", 8192, 16384, 2048, 26624, 106496, 4352, 110848},
    {"w4a16_swapab_m128n32k128_s4", 8192, 8192, 1024, 17408, 69632, 8704, 78336},
    {"w4a16_swapab_m128n64k128_s4", 16384, 8192, 1024, 25600, 102400, 17408, 119808},
    {"w4a16_swapab_m64n64k128_s4", 16384, 4096, 512, 20992, 83968, 9216, 93184},
};
static_assert(sizeof(kPinned) / sizeof(kPinned[0]) == kNumW4A16Configs, "pin every shipped config");

TEST(W4A16Layout, ShippedConfigsPinnedToTheByte) {
  for (int i = 0; i < kNumW4A16Configs; ++i) {
    const W4A16Config& c = kW4A16Configs[i];
    const Pinned& p = kPinned[i];
    const W4A16Layout l = W4A16Layout::make(c);
    const std::string name = w4a16_config_name(c);
    ASSERT_EQ(name, p.name) << "config id " << i;
    ASSERT_TRUE(l.valid()) << name << ": " << l.invalid_reason;
    EXPECT_EQ(l.x_tile(0), 0u) << name;
    EXPECT_EQ(l.x_tile_bytes, p.x_tile) << name;
    EXPECT_EQ(l.w_packed(0), p.x_tile) << name;
    EXPECT_EQ(l.w_packed_bytes, p.w_packed) << name;
    EXPECT_EQ(l.w_scales(0), p.x_tile + p.w_packed) << name;
    EXPECT_EQ(l.w_scales_bytes, p.w_scales) << name;
    EXPECT_EQ(l.stage_stride, p.stage_stride) << name;
    for (uint32_t s = 0; s < c.stages; ++s) {
      EXPECT_EQ(l.x_tile(s), s * p.stage_stride) << name << " stage " << s;
      EXPECT_EQ(l.layout.regions[3 * s].offset, l.x_tile(s)) << name << " stage " << s;
      EXPECT_EQ(l.layout.regions[3 * s + 1].offset, l.w_packed(s)) << name << " stage " << s;
      EXPECT_EQ(l.layout.regions[3 * s + 2].offset, l.w_scales(s)) << name << " stage " << s;
    }
    EXPECT_EQ(l.epilogue_offset, p.epilogue_offset) << name;
    EXPECT_EQ(l.epilogue_bytes, p.epilogue_bytes) << name;
    EXPECT_EQ(l.layout.offset_of("epilogue tile (bf16 block_t x block_w, rows +16 B)"), p.epilogue_offset) << name;
    EXPECT_EQ(l.total_bytes(), p.total) << name;
    EXPECT_EQ(l.layout.bytes_of_kind(RegionKind::kPadding), 0u) << name;
    EXPECT_TRUE(l.fits(kSm90SmemOptinBytes)) << name;
    expect_well_formed(l.layout, name);
  }
}

TEST(W4A16Layout, ConstexprAsTheKernelUsesIt) {
  // What the kernel does at compile time: make the layout, static_assert it fits sm_90, carve.
  constexpr W4A16Layout l = W4A16Layout::make(kW4A16Configs[5]);  // w4a16_swapab_m128n16k256_s4
  static_assert(l.valid() && l.fits(kSm90SmemOptinBytes));
  static_assert(l.w_scales(3) == 3 * 26624 + 8192 + 16384);
  static_assert(l.total_bytes() == 110848);
  static_assert(w4a16_ctas_per_sm(l.config, l.total_bytes()) == 2);  // 233472 / (110848 + 1024)
  static_assert(w4a16_ctas_per_sm(kW4A16Configs[0], W4A16Layout::make(kW4A16Configs[0]).total_bytes()) == 8);  // 4 warps: 64 regs cap
  EXPECT_EQ(l.config.n_threads(), 256u);
}

TEST(W4A16Layout, SummaryAndRefusalWording) {
  const W4A16Config c = kW4A16Configs[7];  // w4a16_swapab_m128n64k128_s4
  EXPECT_EQ(w4a16_smem_summary(c), "4 stages x (x_tile 16384 + w_packed 8192 + w_scales 1024) + epilogue 17408 = 119808 B");
  EXPECT_EQ(w4a16_smem_refusal(c, kSm90SmemOptinBytes), "");
  EXPECT_EQ(w4a16_smem_refusal(c, 119808), "");
  EXPECT_EQ(w4a16_smem_refusal(c, 101376),
            "config w4a16_swapab_m128n64k128_s4 needs 4 stages x (x_tile 16384 + w_packed 8192 + w_scales 1024) + "
            "epilogue 17408 = 119808 B of shared memory > 101376 B (the device's opt-in limit per block) by 18432 B");
  EXPECT_EQ(w4a16_smem_refusal({128, 8, 192, 4}, kSm90SmemOptinBytes),
            "config w4a16_swapab_m128n8k192_s4 cannot be built: block_k must be 128 or 256");
}

TEST(W4A16Layout, RejectsConfigsTheKernelCannotBuild) {
  EXPECT_NE(W4A16Layout::make({96, 16, 128, 4}).invalid_reason, nullptr);   // block_w 96
  EXPECT_NE(W4A16Layout::make({128, 4, 128, 4}).invalid_reason, nullptr);   // block_t 4
  EXPECT_NE(W4A16Layout::make({128, 24, 128, 4}).invalid_reason, nullptr);  // block_t 24
  EXPECT_NE(W4A16Layout::make({128, 16, 64, 4}).invalid_reason, nullptr);   // block_k 64
  EXPECT_NE(W4A16Layout::make({128, 16, 128, 1}).invalid_reason, nullptr);  // 1 stage
  EXPECT_NE(W4A16Layout::make({128, 16, 128, 7}).invalid_reason, nullptr);  // 7 stages
  EXPECT_EQ(W4A16Layout::make({128, 16, 128, 6}).invalid_reason, nullptr);
  EXPECT_FALSE(W4A16Layout::make({96, 16, 128, 4}).fits(UINT32_MAX));
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
