// SmemLayout mechanics and the layout of the shipped Hopper kernel (sm90_nvfp4_w4a16_grouped_gemm,
// plan/layout_sm90_w4a16.h): every shipped config's offsets pinned to the byte (the kStream
// configs: three regions, the CTA's activation ring, the warps' code rings, mbarriers and ticket), alignment, no
// overlaps, regions summing to the total, constexpr use as the kernel does (static_assert against the sm_90 opt-in,
// CTAs per SM), the rules check() enforces for both kinds, and the summary / refusal wording the launcher and the
// planner share. Run: test_plan_layouts.
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
// kPipeline, per stage (each region 128 B aligned; every size here is a multiple of 128, so the
// regions sit back to back): x_tile = block_t x block_k x 2 (bf16), w_tiles = block_w x block_k / 2
// (e2m1, the kernel weight layout), w_scales = block_w x block_k / 16 (one e4m3 per 16);
// stage_stride = their sum; the epilogue at stages x stage_stride, block_t rows of
// block_w x 2 + 16 B; the total rounded up to 128 (never needed for these tiles).
// kStream: the CTA's activation ring at 0 (8 / 16 tokens: 2 slots of a scale group's 8 chunks x block_t rows
// x 128 B; 32 tokens: x_stages slots of one chunk), the warps' code rings after it (block_w / 32 warps x
// stages x 2 row tiles x a 512 B chunk slot of codes, one 16 x 64 e2m1 tile of the kernel layout:
// ring_warp = stages x 1024), then 16 B of mbarriers a slot and the ticket's 16 B; the pipeline fields are 0.
struct Pinned {
  const char* name;
  uint32_t x_tile, w_tiles, w_scales, stage_stride, epilogue_offset, epilogue_bytes, total;
  uint32_t ring_warp;  // kStream: bytes of one warp's ring (W4A16Layout::ring_warp_bytes)
};
constexpr Pinned kPinned[] = {
    // m64n8_d8: 2 x 8 x 8 x 128 = 16384 of activations + 2 warps x 8 x 1024 of codes + 48 = 32816.
    {"w4a16_stream_m64n8_d8", 0, 0, 0, 0, 0, 0, 32816, 8192},
    // m128n8_d4: 16384 + 4 warps x 4 x 1024 + 48 = 32816.
    {"w4a16_stream_m128n8_d4", 0, 0, 0, 0, 0, 0, 32816, 4096},
    // m128n8_d8: 16384 + 4 x 8192 + 48 = 49200.
    {"w4a16_stream_m128n8_d8", 0, 0, 0, 0, 0, 0, 49200, 8192},
    // m64n16_d8: 2 x 8 x 16 x 128 = 32768 + 2 x 8 x 1024 + 48 = 49200.
    {"w4a16_stream_m64n16_d8", 0, 0, 0, 0, 0, 0, 49200, 8192},
    // m128n16_d4: 32768 + 4 x 4 x 1024 + 48 = 49200.
    {"w4a16_stream_m128n16_d4", 0, 0, 0, 0, 0, 0, 49200, 4096},
    // m128n16_d8: 32768 + 4 x 8192 + 48 = 65584.
    {"w4a16_stream_m128n16_d8", 0, 0, 0, 0, 0, 0, 65584, 8192},
    // m64n8k256_s4: x 8*256*2 = 4096, w 64*256/2 = 8192, s 64*256/16 = 1024, stride 13312;
    // epilogue at 4*13312 = 53248, 8*(64*2+16) = 1152 B; total 54400 = 425 x 128.
    {"w4a16_swapab_m64n8k256_s4", 4096, 8192, 1024, 13312, 53248, 1152, 54400, 0},
    // m128n16k256_s4: x 16*256*2 = 8192, w 128*256/2 = 16384, s 128*256/16 = 2048, stride 26624;
    // epilogue at 4*26624 = 106496, 16*(128*2+16) = 4352 B; total 110848 = 866 x 128.
    {"w4a16_swapab_m128n16k256_s4", 8192, 16384, 2048, 26624, 106496, 4352, 110848, 0},
    // m128n32k128_s4: x 32*128*2 = 8192, w 128*128/2 = 8192, s 128*128/16 = 1024, stride 17408;
    // epilogue at 4*17408 = 69632, 32*272 = 8704 B; total 78336 = 612 x 128.
    {"w4a16_swapab_m128n32k128_s4", 8192, 8192, 1024, 17408, 69632, 8704, 78336, 0},
    // m128n64k128_s4: x 64*128*2 = 16384, w 8192, s 1024, stride 25600; epilogue at
    // 4*25600 = 102400, 64*272 = 17408 B; total 119808 = 936 x 128.
    {"w4a16_swapab_m128n64k128_s4", 16384, 8192, 1024, 25600, 102400, 17408, 119808, 0},
    // m64n64k128_s4: x 64*128*2 = 16384, w 64*128/2 = 4096, s 64*128/16 = 512, stride 20992;
    // epilogue at 4*20992 = 83968, 64*(64*2+16) = 9216 B; total 93184 = 728 x 128.
    {"w4a16_swapab_m64n64k128_s4", 16384, 4096, 512, 20992, 83968, 9216, 93184, 0},
    // kWgmma, per stage x_tile = block_t x 128 (1024 B aligned), w_tiles = 128 rows x 32 B = 4096; the
    // a_tiles (4 x block_w rows x 128 B) after the 4 stages, then two 8 B mbarriers per stage (full,
    // empty): 64 B; the epilogue (block_t x (block_w x 2 + 16)) at 0, inside the stages, adding nothing.
    // m128n32_s4 (17-32 tokens): stride 4096 + 4096 = 8192, a_tiles 65536 at 32768, total 98368.
    {"w4a16_wgmma_m128n32_s4", 4096, 4096, 0, 8192, 0, 8704, 98368, 0},
    // m128n64_s4: stride 8192 + 4096 = 12288, a_tiles at 49152, total 114752 (2 CTAs an SM).
    {"w4a16_wgmma_m128n64_s4", 8192, 4096, 0, 12288, 0, 17408, 114752, 0},
    // m128n128_s4: stride 16384 + 4096 = 20480, a_tiles at 81920, total 147520; epilogue 34816.
    {"w4a16_wgmma_m128n128_s4", 16384, 4096, 0, 20480, 0, 34816, 147520, 0},
    // m128n256_s4: stride 32768 + 4096 = 36864, a_tiles at 147456, total 213056; epilogue 69632.
    {"w4a16_wgmma_m128n256_s4", 32768, 4096, 0, 36864, 0, 69632, 213056, 0},
    // m256n64_s4: w_tiles 256 x 32 = 8192, stride 16384, a_tiles 4 x 32768 at 65536, total 196672;
    // epilogue 64 x (512 + 16) = 33792.
    {"w4a16_wgmma_m256n64_s4", 8192, 8192, 0, 16384, 0, 33792, 196672, 0},
    // m256n128_s4: stride 16384 + 8192 = 24576, a_tiles at 98304, total 229440; epilogue 128 x 528 = 67584.
    {"w4a16_wgmma_m256n128_s4", 16384, 8192, 0, 24576, 0, 67584, 229440, 0},
    // m128n32_d4 (appended, a stream tile with the CTA's activation ring): 4 slots x 32 rows x 128 B =
    // 16384, then 4 warps x 4 x 2 x 512 = 4 x 4096 of codes, then 4 x 16 + 16 B of mbarriers and
    // ticket: 32848.
    {"w4a16_stream_m128n32_d4", 0, 0, 0, 0, 0, 0, 32848, 4096},
    // m256n8_d4 / m256n16_d4 (appended, the 1-8 / 9-16 token defaults): 16384 / 32768 of activations + 8 warps x
    // 4 x 1024 of codes + 48: 49200 and 65584.
    {"w4a16_stream_m256n8_d4", 0, 0, 0, 0, 0, 0, 49200, 4096},
    {"w4a16_stream_m256n16_d4", 0, 0, 0, 0, 0, 0, 65584, 4096},
    // m256n32_d4 (appended, the CTA's activation ring): 16384 + 8 warps x 4096 of codes + 80 = 49232.
    {"w4a16_stream_m256n32_d4", 0, 0, 0, 0, 0, 0, 49232, 4096},
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
    EXPECT_EQ(l.x_tile_bytes, p.x_tile) << name;
    EXPECT_EQ(l.w_tiles_bytes, p.w_tiles) << name;
    EXPECT_EQ(l.w_scales_bytes, p.w_scales) << name;
    EXPECT_EQ(l.stage_stride, p.stage_stride) << name;
    EXPECT_EQ(l.epilogue_offset, p.epilogue_offset) << name;
    EXPECT_EQ(l.epilogue_bytes, p.epilogue_bytes) << name;
    EXPECT_EQ(l.total_bytes(), p.total) << name;
    EXPECT_TRUE(l.fits(kSm90SmemOptinBytes)) << name;
    EXPECT_EQ(l.ring_warp_bytes, p.ring_warp) << name;
    if (W4A16Layout::stream_cta_x_ring(c)) {
      // The CTA's activation ring at 0, the code rings after it, the mbarriers and ticket last.
      ASSERT_EQ(l.layout.n_regions, 3) << name;
      EXPECT_EQ(l.ring_x_offset, 0u) << name;
      EXPECT_EQ(l.ring_offset, l.x_stages * l.x_slot_chunks * c.block_t * 128) << name;
      EXPECT_EQ(l.x_slot_chunks, W4A16Layout::stream_x_group_slots(c) ? kW4A16StreamXGroupChunks : 1u) << name;
      EXPECT_EQ(l.barriers_offset, l.ring_offset + c.n_warps() * l.ring_warp_bytes) << name;
      EXPECT_EQ(l.barriers_offset + 16 * l.x_stages + 16, p.total) << name;
      EXPECT_FALSE(l.fits(p.total - 1)) << name;
      EXPECT_EQ(c.n_warps() * kW4A16StreamTilesPerWarp * 16, c.block_w) << name;  // every row of the CTA owned
      expect_well_formed(l.layout, name);
      continue;
    }
    ASSERT_NE(c.kind, W4A16Kind::kStream) << name << ": every stream tile has the CTA's activation ring";
    if (c.kind == W4A16Kind::kWgmma) {
      // x_tile, w_tiles per stage, then the a_tiles and the mbarriers; every wgmma tile on a 1024 B
      // swizzle atom.
      ASSERT_EQ(l.layout.n_regions, static_cast<int>(2 * c.stages + 2)) << name;
      for (uint32_t s = 0; s < c.stages; ++s) {
        EXPECT_EQ(l.x_tile(s), s * p.stage_stride) << name << " stage " << s;
        EXPECT_EQ(l.x_tile(s) % 1024, 0u) << name << " stage " << s;
        EXPECT_EQ(l.layout.regions[2 * s].offset, l.x_tile(s)) << name << " stage " << s;
        EXPECT_EQ(l.layout.regions[2 * s + 1].offset, l.w_tiles(s)) << name << " stage " << s;
      }
      EXPECT_EQ(l.w_tiles(0), p.x_tile) << name;
      EXPECT_EQ(l.a_tiles_offset, c.stages * p.stage_stride) << name;
      EXPECT_EQ(l.a_tiles_offset % 1024, 0u) << name;
      EXPECT_EQ(l.a_tile_bytes, c.block_w * 128u) << name;
      EXPECT_EQ(l.layout.offset_of("a_tiles (bf16 dequantized weights, 128B-swizzled)"), l.a_tiles_offset) << name;
      EXPECT_EQ(l.barriers_offset, l.a_tiles_offset + kWgmmaABuffers * l.a_tile_bytes) << name;
      EXPECT_EQ(l.layout.offset_of("mbarriers (stage full, stage empty)"), l.barriers_offset) << name;
      EXPECT_EQ(l.layout.bytes_of_kind(RegionKind::kBarrier), 16u * c.stages) << name;
      EXPECT_EQ(l.barriers_offset + 16 * c.stages, p.total) << name;
      EXPECT_LE(p.epilogue_bytes, c.stages * p.stage_stride) << name << ": the epilogue must fit in the stages";
      EXPECT_EQ(l.layout.bytes_of_kind(RegionKind::kPadding), 0u) << name;
      EXPECT_EQ(l.config.n_threads(), 384u) << name;  // a producer warpgroup + two consumer warpgroups
      expect_well_formed(l.layout, name);
      continue;
    }
    ASSERT_EQ(l.layout.n_regions, static_cast<int>(3 * c.stages + 1)) << name;  // no tail padding
    EXPECT_EQ(l.x_tile(0), 0u) << name;
    EXPECT_EQ(l.w_tiles(0), p.x_tile) << name;
    EXPECT_EQ(l.w_scales(0), p.x_tile + p.w_tiles) << name;
    EXPECT_EQ(p.stage_stride, p.x_tile + p.w_tiles + p.w_scales) << name;
    for (uint32_t s = 0; s < c.stages; ++s) {
      EXPECT_EQ(l.x_tile(s), s * p.stage_stride) << name << " stage " << s;
      EXPECT_EQ(l.layout.regions[3 * s].offset, l.x_tile(s)) << name << " stage " << s;
      EXPECT_EQ(l.layout.regions[3 * s + 1].offset, l.w_tiles(s)) << name << " stage " << s;
      EXPECT_EQ(l.layout.regions[3 * s + 2].offset, l.w_scales(s)) << name << " stage " << s;
    }
    EXPECT_EQ(l.layout.offset_of("stage w_tiles (nvfp4 e2m1, kernel layout)"), p.x_tile) << name;
    EXPECT_EQ(l.layout.offset_of("epilogue tile (bf16 block_t x block_w, rows +16 B)"), p.epilogue_offset) << name;
    EXPECT_EQ(l.layout.bytes_of_kind(RegionKind::kPadding), 0u) << name;
    expect_well_formed(l.layout, name);
  }
}

TEST(W4A16Layout, ConstexprAsTheKernelUsesIt) {
  // What the kernel does at compile time: make the layout, static_assert it fits sm_90, carve.
  constexpr W4A16Layout l = W4A16Layout::make(kW4A16Configs[7]);  // w4a16_swapab_m128n16k256_s4
  static_assert(l.valid() && l.fits(kSm90SmemOptinBytes));
  static_assert(l.w_scales(3) == 3 * 26624 + 8192 + 16384);
  static_assert(l.total_bytes() == 110848);
  // 8 warps x 64 registers: 65536 / (256 x 64) = 4 by registers; 233472 / (110848 + 1024) = 2 by smem.
  static_assert(w4a16_ctas_per_sm(l.config, l.total_bytes()) == 2);
  // m64n8k256_s4: 65536 / (128 x 64) = 8 by registers; 233472 / (54400 + 1024) = 4 by smem.
  static_assert(w4a16_ctas_per_sm(kW4A16Configs[6], W4A16Layout::make(kW4A16Configs[6]).total_bytes()) == 4);
  // The stream kernel's __launch_bounds__, from its ring bytes and its register budget
  // 72 + (8 + 4 x kW4A16StreamTilesPerWarp (2)) x block_t / 8: 88 for n8, 104 for n16. The 8 / 16-token
  // tiles hold their activations in the CTA's ring with a slot a scale group: 2 slots x 8 chunks x block_t
  // rows x 128 B (16384 B at n8, 32768 B at n16) at 0, then the warps' code rings, then the mbarriers
  // (2 full + 2 empty + the ticket: 48 B).
  //   m64n8_d8   (64 threads, 16384 + 16384 + 48 = 32816 B): 233472 / (32816 + 1024) = 6 by smem, 65536 / (64 x 88) =
  //   11 -> 6 m128n8_d4  (128 threads, 32816 B): 6 by smem, 65536 / (128 x 88) = 5 -> 5 m128n8_d8  (128 threads, 16384
  //   + 32768 + 48 = 49200 B): 233472 / (49200 + 1024) = 4 by smem -> 4 m64n16_d8  (64 threads, 32768 + 16384 + 48 =
  //   49200 B): 4 by smem, 9 by regs -> 4 m128n16_d4 (128 threads, 49200 B): 4 by smem, 65536 / (128 x 104) = 4 -> 4
  //   m128n16_d8 (128 threads, 32768 + 32768 + 48 = 65584 B): 233472 / (65584 + 1024) = 3 -> 3
  constexpr W4A16Layout stream = W4A16Layout::make(kW4A16Configs[0]);  // w4a16_stream_m64n8_d8
  static_assert(stream.valid() && stream.total_bytes() == 32816 && stream.layout.n_regions == 3);
  static_assert(W4A16Layout::stream_cta_x_ring(stream.config) && W4A16Layout::stream_x_group_slots(stream.config));
  static_assert(stream.ring_x_offset == 0 && stream.x_stages == 2 && stream.x_slot_chunks == 8);
  static_assert(stream.ring_offset == 16384 && stream.ring_warp_bytes == 8192 && stream.barriers_offset == 32768);
  // Slot offsets (the kernel's and the emulation's addressing): code ring of tile 1, slot 3: (8 + 3) x 512 from
  // the warp's rings; activation slot 1: 8 chunks x 8 rows x 128 B from the ring's start (chunk j of a group
  // j x block_t x 128 B further).
  static_assert(stream.ring_code_slot(1, 3) == 5632 && stream.cta_x_slot(1) == 8192);
  static_assert(W4A16Layout::make(kW4A16Configs[4]).cta_x_slot(1) == 16384);
  static_assert(kW4A16StreamTilesPerWarp == 2);
  static constexpr uint32_t kWantBudget[6] = {88, 88, 88, 104, 104, 104};
  static constexpr uint32_t kWantCtas[6] = {6, 5, 4, 4, 4, 3};
  static_assert([] {
    for (int i = 0; i < 6; ++i) {
      const W4A16Config& c = kW4A16Configs[i];
      if (c.kind != W4A16Kind::kStream || w4a16_register_budget(c) != kWantBudget[i]) return false;
      if (w4a16_ctas_per_sm(c, W4A16Layout::make(c).total_bytes()) != kWantCtas[i]) return false;
    }
    return true;
  }());
  // n32 (the CTA's activation ring: one n8 tile's fragments live at a time): 72 + 8 + 8 x 4 = 112 registers,
  // 65536 / (128 x 112) = 4 CTAs a SM by registers, 233472 / (32848 + 1024) = 6 by smem (81920 B and 2 a SM
  // with a ring per warp); m256n32_d4 65536 / (256 x 112) = 2 by registers, 233472 / (49232 + 1024) = 4 by smem.
  constexpr W4A16Config n32 = kW4A16Configs[17];  // w4a16_stream_m128n32_d4
  static_assert(n32.kind == W4A16Kind::kStream && n32.block_t == 32 && n32.stages == 4);
  static_assert(W4A16Layout::stream_cta_x_ring(n32) && W4A16Layout::make(n32).x_stages == 4);
  static_assert(w4a16_register_budget(n32) == 112 && w4a16_ctas_per_sm(n32, W4A16Layout::make(n32).total_bytes()) == 4);
  static_assert(kW4A16Configs[20].block_w == 256 && kW4A16Configs[20].block_t == 32);
  static_assert(w4a16_ctas_per_sm(kW4A16Configs[20], W4A16Layout::make(kW4A16Configs[20]).total_bytes()) == 2);
  // The 256-row CTAs (8 warps, configs 18 and 19): m256n8_d4 233472 / (49200 + 1024) = 4 by smem, 65536 /
  // (256 x 88) = 2 by registers -> 2; m256n16_d4 233472 / (65584 + 1024) = 3 by smem, 65536 / (256 x 104) = 2 -> 2.
  static_assert(w4a16_ctas_per_sm(kW4A16Configs[18], W4A16Layout::make(kW4A16Configs[18]).total_bytes()) == 2);
  static_assert(w4a16_ctas_per_sm(kW4A16Configs[19], W4A16Layout::make(kW4A16Configs[19]).total_bytes()) == 2);
  static_assert(kW4A16Configs[18].block_w == 256 && kW4A16Configs[18].block_t == 8 && kW4A16Configs[19].block_t == 16);
  // The rings alone would not limit m64n8_d8: 65536 / (64 x 88) = 11 by registers.
  static_assert(w4a16_ctas_per_sm(kW4A16Configs[0], 0) == 11);
  static_assert(w4a16_register_budget(kW4A16Configs[6]) == 64);
  EXPECT_EQ(l.config.n_threads(), 256u);
  EXPECT_EQ(stream.config.n_threads(), 64u);
}

// A shipped config by name (the table's order changes as configs are added).
const W4A16Config& w4a16_config_named(const std::string& name) {
  for (const W4A16Config& c : kW4A16Configs) {
    if (w4a16_config_name(c) == name) return c;
  }
  ADD_FAILURE() << "no shipped config " << name;
  return kW4A16Configs[0];
}

// The kernel's shape rules, one sentence each (the repack, the launcher, the planner and the tune cache say them).
TEST(W4A16Layout, ShapeRules) {
  EXPECT_EQ(w4a16_k_refusal(6144), "");
  EXPECT_EQ(w4a16_k_refusal(16), "");
  EXPECT_EQ(w4a16_k_refusal(100), "K=100 must be a positive multiple of 16 (one NVFP4 block; K % 16 = 4)");
  EXPECT_EQ(w4a16_k_refusal(0), "K=0 must be a positive multiple of 16 (one NVFP4 block; K % 16 = 0)");
  EXPECT_EQ(w4a16_k_refusal(-16), "K=-16 must be a positive multiple of 16 (one NVFP4 block; K % 16 = 0)");
  EXPECT_EQ(w4a16_n_refusal(8), "");
  EXPECT_EQ(w4a16_n_refusal(4100), "N=4100 must be a positive multiple of 8 (16 B output stores; N % 8 = 4)");
  EXPECT_EQ(w4a16_n_refusal(0), "N=0 must be a positive multiple of 8 (16 B output stores; N % 8 = 0)");
}

TEST(W4A16Layout, SummaryAndRefusalWording) {
  const W4A16Config c = kW4A16Configs[9];  // w4a16_swapab_m128n64k128_s4
  EXPECT_EQ(w4a16_smem_summary(c), "4 stages x (x_tile 16384 + w_tiles 8192 + w_scales 1024) + epilogue 17408 = 119808 B");
  EXPECT_EQ(w4a16_smem_refusal(c, kSm90SmemOptinBytes), "");
  EXPECT_EQ(w4a16_smem_refusal(c, 119808), "");
  EXPECT_EQ(w4a16_smem_refusal(c, 101376),
            "config w4a16_swapab_m128n64k128_s4 needs 4 stages x (x_tile 16384 + w_tiles 8192 + w_scales 1024) + "
            "epilogue 17408 = 119808 B of shared memory > 101376 B (the device's opt-in limit per block) by 18432 B");
  EXPECT_EQ(w4a16_smem_refusal({128, 8, 192, 4}, kSm90SmemOptinBytes),
            "config w4a16_swapab_m128n8k192_s4 cannot be built: block_k must be 128 or 256");
  // kStream: the CTA's activation ring (8 / 16 tokens: 2 slots of a scale group's 8 chunks), the warps' code
  // rings and the mbarriers: 2 x 8 x 1024 + 4 warps x 8 x 2 x 512 + 48 = 49200 B for m128n8_d8 (config 2);
  // refused only by a limit under that (49199: by 1 B).
  EXPECT_EQ(w4a16_smem_summary(kW4A16Configs[2]),
            "2 slots x 8 chunks x 1024 B activations + 4 warps x 8 chunks x 2 row tiles x 512 B codes + mbarriers, "
            "ticket 48 = 49200 B");
  EXPECT_EQ(w4a16_smem_summary(kW4A16Configs[4]),
            "2 slots x 8 chunks x 2048 B activations + 4 warps x 4 chunks x 2 row tiles x 512 B codes + mbarriers, "
            "ticket 48 = 49200 B");
  EXPECT_EQ(w4a16_smem_refusal(kW4A16Configs[2], 49200), "");
  EXPECT_EQ(w4a16_smem_refusal(kW4A16Configs[2], 49199),
            "config w4a16_stream_m128n8_d8 needs 2 slots x 8 chunks x 1024 B activations + 4 warps x 8 chunks x 2 row "
            "tiles x 512 B codes + mbarriers, ticket 48 = 49200 B of shared memory > 49199 B (the device's opt-in "
            "limit per block) by 1 B");
  // kWgmma: the stages and the A tiles; the epilogue tile reuses the stages.
  EXPECT_EQ(w4a16_smem_summary(w4a16_config_named("w4a16_wgmma_m128n64_s4")),
            "4 stages x (x_tile 8192 + w_tiles 4096) + a_tiles 4 x 16384 + mbarriers 64 = 114752 B (epilogue 17408 reuses "
            "the stages)");
  EXPECT_EQ(w4a16_smem_refusal(w4a16_config_named("w4a16_wgmma_m128n256_s4"), 101376),
            "config w4a16_wgmma_m128n256_s4 needs 4 stages x (x_tile 32768 + w_tiles 4096) + a_tiles 4 x 16384 + "
            "mbarriers 64 = 213056 B (epilogue 69632 reuses the stages) of shared memory > 101376 B (the device's opt-in "
            "limit per block) by 111680 B");
  EXPECT_EQ(w4a16_smem_refusal({64, 8, 64, 3, W4A16Kind::kStream}, kSm90SmemOptinBytes),
            "config w4a16_stream_m64n8_d3 cannot be built: stream: stages (code ring depth) must be 4, 8 or 16");
}

TEST(W4A16Layout, RejectsConfigsTheKernelCannotBuild) {
  EXPECT_NE(W4A16Layout::make({96, 16, 128, 4}).invalid_reason, nullptr);   // block_w 96
  EXPECT_NE(W4A16Layout::make({128, 4, 128, 4}).invalid_reason, nullptr);   // block_t 4
  EXPECT_NE(W4A16Layout::make({128, 24, 128, 4}).invalid_reason, nullptr);  // block_t 24
  EXPECT_NE(W4A16Layout::make({128, 16, 64, 4}).invalid_reason, nullptr);   // block_k 64 (a stream size)
  EXPECT_NE(W4A16Layout::make({128, 16, 128, 1}).invalid_reason, nullptr);  // 1 stage
  EXPECT_NE(W4A16Layout::make({128, 16, 128, 7}).invalid_reason, nullptr);  // 7 stages
  EXPECT_EQ(W4A16Layout::make({128, 16, 128, 6}).invalid_reason, nullptr);
  EXPECT_FALSE(W4A16Layout::make({96, 16, 128, 4}).fits(UINT32_MAX));
  constexpr W4A16Kind kS = W4A16Kind::kStream;
  EXPECT_NE(W4A16Layout::make({96, 8, 64, 4, kS}).invalid_reason, nullptr);    // block_w 96
  EXPECT_NE(W4A16Layout::make({64, 64, 64, 4, kS}).invalid_reason, nullptr);   // block_t 64 (a pipeline size)
  EXPECT_NE(W4A16Layout::make({64, 8, 128, 4, kS}).invalid_reason, nullptr);   // block_k 128
  EXPECT_NE(W4A16Layout::make({64, 8, 64, 3, kS}).invalid_reason, nullptr);    // ring depth 3: not 4, 8 or 16
  EXPECT_NE(W4A16Layout::make({64, 8, 64, 2, kS}).invalid_reason, nullptr);    // 2: one chunk in flight only
  EXPECT_NE(W4A16Layout::make({64, 8, 64, 32, kS}).invalid_reason, nullptr);   // 32: beyond 16
  EXPECT_EQ(W4A16Layout::make({64, 8, 64, 4, kS}).invalid_reason, nullptr);
  EXPECT_EQ(W4A16Layout::make({64, 8, 64, 16, kS}).invalid_reason, nullptr);
  EXPECT_EQ(W4A16Layout::make({128, 16, 64, 8, kS}).invalid_reason, nullptr);
  // m128n16 with 16 chunks: 2 x 8 x 2048 + 4 x 16 x 1024 + 48 = 98352 B fits sm_90; m256n16 at 16 chunks
  // 32768 + 8 x 16 x 1024 + 48 = 163888 B (a device with less opt-in memory refuses it). m128n32 at 16
  // chunks (a slot a chunk, 16 slots of 4 KB): 65536 + 4 x 16 x 1024 + 16 x 16 + 16 = 131344 B fits.
  EXPECT_EQ(W4A16Layout::make({128, 16, 64, 16, kS}).total_bytes(), 98352u);
  EXPECT_TRUE(W4A16Layout::make({128, 16, 64, 16, kS}).fits(kSm90SmemOptinBytes));
  EXPECT_EQ(W4A16Layout::make({256, 16, 64, 16, kS}).total_bytes(), 163888u);
  EXPECT_TRUE(W4A16Layout::make({256, 16, 64, 16, kS}).fits(kSm90SmemOptinBytes));
  EXPECT_FALSE(W4A16Layout::make({256, 16, 64, 16, kS}).fits(163887));
  EXPECT_EQ(W4A16Layout::make({128, 32, 64, 16, kS}).total_bytes(), 131344u);
  EXPECT_TRUE(W4A16Layout::make({128, 32, 64, 16, kS}).fits(kSm90SmemOptinBytes));
  // An invalid stream config has no region (it cannot be built, so nothing is sized).
  EXPECT_EQ(W4A16Layout::make({64, 8, 64, 3, kS}).layout.n_regions, 0);
  EXPECT_NE(W4A16Layout::make({64, 8, 64, 4, static_cast<W4A16Kind>(7)}).invalid_reason, nullptr);
  EXPECT_NE(W4A16Layout::make({128, 256, 64, 6, static_cast<W4A16Kind>(3)}).invalid_reason, nullptr);  // the RS kind, removed
  constexpr W4A16Kind kW = W4A16Kind::kWgmma;
  EXPECT_NE(W4A16Layout::make({64, 64, 64, 4, kW}).invalid_reason, nullptr);    // block_w 64 (one warpgroup)
  EXPECT_NE(W4A16Layout::make({256, 256, 64, 4, kW}).invalid_reason, nullptr);  // 256 f32 accumulators a thread
  EXPECT_EQ(W4A16Layout::make({256, 128, 64, 4, kW}).invalid_reason, nullptr);
  EXPECT_EQ(W4A16Config({256, 128, 64, 4, kW}).n_threads(), 384u);  // producer + 2 consumer warpgroups, 2 row tiles a warp
  EXPECT_NE(W4A16Layout::make({128, 48, 64, 4, kW}).invalid_reason, nullptr);   // block_t 48
  EXPECT_NE(W4A16Layout::make({128, 64, 128, 4, kW}).invalid_reason, nullptr);  // block_k 128
  EXPECT_NE(W4A16Layout::make({128, 64, 64, 2, kW}).invalid_reason, nullptr);   // 2 stages: nothing in flight
  EXPECT_NE(W4A16Layout::make({128, 64, 64, 3, kW}).invalid_reason, nullptr);   // 3 stages: not a power of 2
  EXPECT_NE(W4A16Layout::make({128, 64, 64, 5, kW}).invalid_reason, nullptr);   // 5 stages: not a power of 2
  EXPECT_NE(W4A16Layout::make({128, 64, 64, 16, kW}).invalid_reason, nullptr);  // 16 stages: more than a scale group
  EXPECT_EQ(W4A16Layout::make({128, 32, 64, 8, kW}).invalid_reason, nullptr);
  // 256 tokens x 4 stages: the epilogue (256 x 272 = 69632) fits 4 x 36864; 8 stages do not fit sm_90.
  EXPECT_EQ(W4A16Layout::make({128, 256, 64, 4, kW}).invalid_reason, nullptr);
  EXPECT_FALSE(W4A16Layout::make({128, 256, 64, 8, kW}).fits(kSm90SmemOptinBytes));
  EXPECT_FALSE(W4A16Layout::make({64, 8, 64, 3, kS}).fits(UINT32_MAX));
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
