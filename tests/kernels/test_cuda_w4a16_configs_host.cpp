// CPU checks of sm90_nvfp4_w4a16_grouped_gemm's configurations (src/kernels/cuda/sm90/), no GPU
// needed: the constexpr layout (plan/layout_sm90_w4a16.h) of every kind against the static_asserts
// the kernels make, the kernel's carve against what `fp4moe plan` sizes, the launcher refusing exactly
// what the planner rejects (with the bytes), config names, the split-K plan, the launch grid (with
// expert row classes), the default config per token count, the check() rules, and the problem checks.
// Run: test_cuda_w4a16_configs_host.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "core/error.h"
#include "kernels/cuda/sm90/w4a16_grouped_gemm.h"
#include "kernels/cuda/sm90/w4a16_weight_layout.h"
#include "plan/gpu_table.h"
#include "plan/kernel_families.h"
#include "plan/layout_sm90_w4a16.h"
#include "kernels/w4a16_test_util.h"

namespace fp4moe::cuda::sm90 {
namespace {

using w4a16_test::error_of;

// ---- layout, configs, refusals --------------------------------------------------------------

// The static_asserts the kernel templates make about their config, checked for the whole table.
TEST(W4A16Configs, ShippedConfigsMeetTheKernelsStaticAsserts) {
  for (const W4A16Config& c : kW4A16Configs) {
    const std::string name = w4a16_config_name(c);
    EXPECT_TRUE(W4A16Layout::make(c).valid()) << name;
    if (c.kind == W4A16Kind::kStream) {
      // sm90_nvfp4_w4a16_stream_kernel: static_assert(kLayout.fits(kSm90SmemOptinBytes)).
      EXPECT_TRUE(W4A16Layout::make(c).fits(kSm90SmemOptinBytes)) << name;
      // cp_async_wait<stages - 2> needs stages >= 2 (and the prologue's stages - 1 copies >= 1);
      // ring slot kc % stages is a mask for a power of two.
      EXPECT_GE(c.stages, 2u) << name;
      EXPECT_EQ(c.stages & (c.stages - 1), 0u) << name << ": slot = kc % stages";
      ASSERT_TRUE(W4A16Layout::stream_cta_x_ring(c)) << name;
      {
        // The CTA ring's slot (kc - kc0) % x_stages (a slot a chunk) or (kg - kg0) % x_stages (a slot a scale
        // group) is a mask; a slot a chunk holds the stages - 1 chunks in flight and the one being read, a slot
        // a group the group being read and the next one.
        const uint32_t xs = W4A16Layout::make(c).x_stages;
        EXPECT_EQ(xs & (xs - 1), 0u) << name;
        if (W4A16Layout::stream_x_group_slots(c)) {
          EXPECT_GE(xs, 2u) << name;
          EXPECT_EQ(W4A16Layout::make(c).x_slot_chunks, kW4A16ScaleGroup) << name;
        } else {
          EXPECT_GE(xs, c.stages) << name;
          EXPECT_EQ(W4A16Layout::make(c).x_slot_chunks, 1u) << name;
        }
        EXPECT_EQ(W4A16Layout::make(c).ring_warp_bytes, kW4A16StreamTilesPerWarp * c.stages * kW4A16TileBytes)
            << name << ": one code ring per row tile, one 512 B chunk per slot";
      }
    } else {
      EXPECT_EQ(c.block_k % 64, 0u) << name;
      EXPECT_EQ(kW4A16ScaleGroup % (c.block_k / 64), 0u) << name;
    }
  }
}

TEST(W4A16Layout, PipelineRegionsAreAlignedAndSumToTheTotal) {
  int n_pipeline = 0;
  for (const W4A16Config& c : kW4A16Configs) {
    if (c.kind != W4A16Kind::kPipeline) continue;
    ++n_pipeline;
    const W4A16Layout l = W4A16Layout::make(c);
    const std::string name = w4a16_config_name(c);
    ASSERT_TRUE(l.valid()) << name;
    EXPECT_LE(l.total_bytes(), kSm90SmemOptinBytes) << name;
    uint32_t sum = 0;
    for (int i = 0; i < l.layout.n_regions; ++i) {
      EXPECT_EQ(l.layout.regions[i].offset, sum) << name << " region " << l.layout.regions[i].name;
      EXPECT_EQ(l.layout.regions[i].offset % 128, 0u) << name << " region " << l.layout.regions[i].name;
      sum += l.layout.regions[i].bytes;
    }
    EXPECT_EQ(sum, l.total_bytes()) << name;
    EXPECT_EQ(l.x_tile_bytes, c.block_t * c.block_k * 2) << name;
    EXPECT_EQ(l.w_tiles_bytes, c.block_w * c.block_k / 2) << name;
    EXPECT_EQ(l.w_tiles_bytes, c.block_w / 16 * (c.block_k / 64) * kW4A16TileBytes) << name;  // whole 512 B tiles
    EXPECT_EQ(l.w_scales_bytes, c.block_w * c.block_k / 16) << name;
    EXPECT_EQ(l.w_scales_bytes, c.block_w / 16 * 32 * 2 * (c.block_k / 64)) << name;  // per lane 2 B per chunk
    EXPECT_EQ(l.stage_stride, l.x_tile_bytes + l.w_tiles_bytes + l.w_scales_bytes) << name;
    ASSERT_GE(l.layout.n_regions, static_cast<int>(3 * c.stages + 1)) << name;
    for (uint32_t s = 0; s < c.stages; ++s) {  // x_tile, w_tiles, w_scales per stage, in that order
      EXPECT_EQ(l.layout.regions[3 * s].offset, l.x_tile(s)) << name;
      EXPECT_EQ(l.layout.regions[3 * s + 1].offset, l.w_tiles(s)) << name;
      EXPECT_EQ(l.layout.regions[3 * s + 2].offset, l.w_scales(s)) << name;
      EXPECT_EQ(l.w_tiles(s), l.x_tile(s) + l.x_tile_bytes) << name;
      EXPECT_EQ(l.w_scales(s), l.w_tiles(s) + l.w_tiles_bytes) << name;
    }
    EXPECT_EQ(l.layout.regions[3 * c.stages].offset, l.epilogue_offset) << name;  // then the epilogue
    EXPECT_EQ(l.epilogue_offset, c.stages * l.stage_stride) << name;
    EXPECT_EQ(l.epilogue_bytes, c.block_t * (c.block_w * 2 + 16)) << name;
    EXPECT_EQ(l.total_bytes() % 128, 0u) << name;
  }
  EXPECT_EQ(n_pipeline, 5);
}

// The launcher takes config c at `total` bytes of opt-in shared memory and refuses it 1 B short,
// naming the config, its byte summary, the limit and the miss.
void expect_fits_exactly(const W4A16Config& c, uint32_t total) {
  const std::string name = w4a16_config_name(c);
  EXPECT_NO_THROW(w4a16_check_config(c, total)) << name;
  const std::string msg = error_of([&] { w4a16_check_config(c, total - 1); });
  EXPECT_NE(msg.find("config " + name + " needs " + w4a16_smem_summary(c) + " of shared memory > " +
                     std::to_string(total - 1) + " B (the device's opt-in limit per block) by 1 B"),
            std::string::npos)
      << msg;
}

// Every kStream config (stream_cta_x_ring) holds the activations in the CTA's ring at 0, 1024 B aligned for
// the 128B swizzle: with 32 tokens x_stages slots of one chunk (block_t rows x 128 B; kW4A16StreamXRingBytes,
// at least `stages`), with 8 / 16 tokens (stream_x_group_slots) kW4A16StreamXGroupSlots slots of a scale
// group's 8 chunks; warp w's code rings at ring_offset + w x ring_warp_bytes, then a full and an empty
// mbarrier per slot and the issue ticket (16 B); the launcher refuses it 1 B short.
TEST(W4A16Layout, StreamCtaRingConfigsCarveTheRingsAndBarriers) {
  int n_cta = 0;
  for (const W4A16Config& c : kW4A16Configs) {
    if (c.kind != W4A16Kind::kStream) continue;
    ASSERT_TRUE(W4A16Layout::stream_cta_x_ring(c)) << w4a16_config_name(c);
    ++n_cta;
    const W4A16Layout l = W4A16Layout::make(c);
    const std::string name = w4a16_config_name(c);
    const bool group = W4A16Layout::stream_x_group_slots(c);
    EXPECT_EQ(group, c.block_t < 32) << name;
    const uint32_t x_stages = group ? 2u : std::max(c.stages, kW4A16StreamXRingBytes / (c.block_t * 128));
    const uint32_t slot_chunks = group ? 8u : 1u;
    const uint32_t x_bytes = x_stages * slot_chunks * c.block_t * 128;
    const uint32_t warp_bytes = c.stages * kW4A16StreamTilesPerWarp * 512;
    const uint32_t total = x_bytes + c.n_warps() * warp_bytes + x_stages * 16 + 16;
    ASSERT_TRUE(l.valid()) << name;
    EXPECT_EQ(l.x_stages, x_stages) << name;
    EXPECT_EQ(l.x_slot_chunks, slot_chunks) << name;
    ASSERT_EQ(l.layout.n_regions, 3) << name;
    const plan::SmemRegion* r = l.layout.regions;
    EXPECT_STREQ(r[0].name, "activation ring (CTA: bf16, 128B-swizzled)") << name;
    EXPECT_EQ(r[0].offset, 0u) << name;
    EXPECT_EQ(r[0].bytes, x_bytes) << name;
    EXPECT_EQ(r[0].align, 1024u) << name;
    EXPECT_STREQ(r[1].name, "code rings (per warp: e2m1 kernel layout)") << name;
    EXPECT_EQ(r[1].offset, x_bytes) << name;
    EXPECT_EQ(r[1].bytes, c.n_warps() * warp_bytes) << name;
    EXPECT_STREQ(r[2].name, "mbarriers (activation slot full, empty), issue ticket") << name;
    EXPECT_EQ(r[2].offset, x_bytes + c.n_warps() * warp_bytes) << name;
    EXPECT_EQ(r[2].bytes, x_stages * 16 + 16) << name;
    EXPECT_EQ(l.ring_x_offset, 0u) << name;
    EXPECT_EQ(l.cta_x_slot(1), slot_chunks * c.block_t * 128) << name;
    EXPECT_EQ(l.ring_offset, x_bytes) << name;
    EXPECT_EQ(l.ring_warp_bytes, warp_bytes) << name;
    EXPECT_EQ(l.barriers_offset, r[2].offset) << name;
    EXPECT_EQ(l.total_bytes(), total) << name;  // the ticket ends at the request
    EXPECT_EQ(w4a16_smem_summary(c), (group ? std::to_string(x_stages) + " slots x 8" : std::to_string(x_stages)) +
                                         " chunks x " + std::to_string(c.block_t * 128) + " B activations + " +
                                         std::to_string(c.n_warps()) + " warps x " + std::to_string(c.stages) +
                                         " chunks x 2 row tiles x 512 B codes + mbarriers, ticket " +
                                         std::to_string(x_stages * 16 + 16) + " = " + std::to_string(total) + " B")
        << name;
    expect_fits_exactly(c, total);
  }
  EXPECT_EQ(n_cta, 10);  // configs 0-5 and 17-20
  // By hand: m64n8_d8 (config 0): 2 slots x 8 chunks x 8 x 128 B = 16384, 2 warps x 8 x 2 x 512 of codes,
  // 2 x 16 + 16 of mbarriers and ticket: 16384 + 16384 + 48 = 32816 B.
  EXPECT_EQ(w4a16_smem_summary(w4a16_config(0)),
            "2 slots x 8 chunks x 1024 B activations + 2 warps x 8 chunks x 2 row tiles x 512 B codes + mbarriers, "
            "ticket 48 = 32816 B");
  // By hand: m128n32_d4 (config 17): 16384 / 4096 = 4 slots of 32 x 128 B, 4 warps x 4 x 2 x 512 of
  // codes, 4 x 16 + 16 of mbarriers and ticket: 16384 + 16384 + 80 = 32848 B.
  EXPECT_EQ(w4a16_smem_summary(w4a16_config(17)),
            "4 chunks x 4096 B activations + 4 warps x 4 chunks x 2 row tiles x 512 B codes + mbarriers, ticket 80 = "
            "32848 B");
}

// Config id i is instantiated as sm90_nvfp4_w4a16_stream_kernel<block_w, block_t, stages>, which
// carves its rings with W4A16Layout::make(W4A16Config{block_w, block_t, 64, stages, kStream})
// (ring_offset + warp x ring_warp_bytes) and is launched with that total_bytes() of dynamic shared
// memory (after cudaFuncSetAttribute), or as sm90_nvfp4_w4a16_pipeline_kernel<block_w, block_t,
// block_k, stages>, which carves with W4A16Layout::make(W4A16Config{block_w, block_t, block_k,
// stages}) and requests its total_bytes(). The planner must size the same config id with the same
// regions.
TEST(W4A16Layout, KernelCarveEqualsThePlannersLayout) {
  const std::vector<plan::TileCandidate> cands = plan::family_candidates(plan::KernelFamily::kSm90W4A16, false);
  ASSERT_EQ(static_cast<int>(cands.size()), w4a16_num_configs());
  const plan::GpuSpec h200 = plan::require_gpu("h200");
  for (int id = 0; id < w4a16_num_configs(); ++id) {
    const W4A16Config& c = w4a16_config(id);
    const std::string name = w4a16_config_name(c);
    const plan::TileCandidate& cand = cands[static_cast<size_t>(id)];
    ASSERT_EQ(cand.to_string(), name) << "config id " << id;
    EXPECT_EQ(cand.base_tile_index, id) << name;
    const plan::SmemLayout planned = plan::candidate_layout(cand, h200, plan::kCutlass420);
    const plan::SmemCheck check = plan::check_smem(cand, h200, plan::kCutlass420);
    EXPECT_TRUE(check.fits) << name << ": " << check.reason;
    EXPECT_EQ(check.stages, static_cast<int>(c.stages)) << name;
    if (c.kind == W4A16Kind::kStream) {
      const W4A16Layout kernel = W4A16Layout::make(W4A16Config{c.block_w, c.block_t, 64, c.stages, W4A16Kind::kStream});
      EXPECT_EQ(c.block_k, 64u) << name;
      ASSERT_TRUE(W4A16Layout::stream_cta_x_ring(c)) << name;  // every stream tile: three regions
      // The activation ring, the code rings, the mbarriers: region by region.
      ASSERT_EQ(planned.n_regions, 3) << name;
      ASSERT_EQ(kernel.layout.n_regions, 3) << name;
      for (int i = 0; i < 3; ++i) {
        EXPECT_STREQ(planned.regions[i].name, kernel.layout.regions[i].name) << name;
        EXPECT_EQ(planned.regions[i].offset, kernel.layout.regions[i].offset) << name;
        EXPECT_EQ(planned.regions[i].bytes, kernel.layout.regions[i].bytes) << name;
      }
      EXPECT_EQ(planned.regions[0].offset, kernel.ring_x_offset) << name;
      EXPECT_EQ(planned.regions[1].offset, kernel.ring_offset) << name;
      EXPECT_EQ(planned.regions[2].offset, kernel.barriers_offset) << name;
      EXPECT_EQ(planned.total_bytes, kernel.total_bytes()) << name;
      EXPECT_EQ(check.bytes, kernel.total_bytes()) << name;  // what the launcher requests
      EXPECT_EQ(check.stages * check.stage_bytes + check.epilogue_bytes + check.overhead_bytes, check.bytes) << name;
      uint32_t sum = 0;
      for (const plan::BreakdownItem& b : check.breakdown) sum += b.bytes;
      EXPECT_EQ(sum, check.bytes) << name;
      continue;
    }
    if (plan::w4a16_is_wgmma(c.kind)) {
      // sm90_nvfp4_w4a16_wgmma_kernel<block_w, block_t, stages> carves with W4A16Config{block_w,
      // block_t, 64, stages, kWgmma} (wgmma_config): x_tile / w_tiles per stage, then the A tiles and the
      // mbarriers, which are the overhead.
      const W4A16Layout kernel = W4A16Layout::make(W4A16Config{c.block_w, c.block_t, 64, c.stages, c.kind});
      ASSERT_EQ(planned.n_regions, kernel.layout.n_regions) << name;
      for (uint32_t s = 0; s < c.stages; ++s) {
        EXPECT_EQ(planned.regions[2 * s].offset, kernel.x_tile_offset + s * kernel.stage_stride) << name << " stage " << s;
        EXPECT_EQ(planned.regions[2 * s + 1].offset, kernel.w_tiles_offset + s * kernel.stage_stride) << name << " stage " << s;
      }
      EXPECT_EQ(planned.regions[2 * c.stages].offset, kernel.a_tiles_offset) << name;
      EXPECT_EQ(planned.total_bytes, kernel.total_bytes()) << name;
      EXPECT_EQ(check.bytes, kernel.total_bytes()) << name;
      EXPECT_EQ(check.epilogue_bytes, 0u) << name << ": the epilogue reuses the stages";
      EXPECT_EQ(planned.regions[2 * c.stages + 1].offset, kernel.barriers_offset) << name;
      EXPECT_EQ(check.overhead_bytes, plan::kWgmmaABuffers * kernel.a_tile_bytes + 16u * c.stages)
          << name << ": the A tiles and the mbarriers";
      continue;
    }
    const W4A16Layout kernel = W4A16Layout::make(W4A16Config{c.block_w, c.block_t, c.block_k, c.stages});
    ASSERT_EQ(planned.n_regions, kernel.layout.n_regions) << name;
    for (uint32_t s = 0; s < c.stages; ++s) {
      EXPECT_EQ(planned.regions[3 * s].offset, kernel.x_tile_offset + s * kernel.stage_stride) << name << " stage " << s;
      EXPECT_EQ(planned.regions[3 * s + 1].offset, kernel.w_tiles_offset + s * kernel.stage_stride) << name << " stage " << s;
      EXPECT_EQ(planned.regions[3 * s + 2].offset, kernel.w_scales_offset + s * kernel.stage_stride) << name << " stage " << s;
      EXPECT_EQ(planned.regions[3 * s].bytes, kernel.x_tile_bytes) << name;
      EXPECT_EQ(planned.regions[3 * s + 1].bytes, kernel.w_tiles_bytes) << name;
      EXPECT_EQ(planned.regions[3 * s + 2].bytes, kernel.w_scales_bytes) << name;
    }
    EXPECT_EQ(planned.regions[3 * c.stages].offset, kernel.epilogue_offset) << name;
    EXPECT_EQ(planned.regions[3 * c.stages].bytes, c.block_t * kernel.epilogue_row_bytes) << name;
    EXPECT_EQ(planned.total_bytes, kernel.total_bytes()) << name;
    EXPECT_EQ(check.bytes, kernel.total_bytes()) << name;
  }
}

// One computation behind both refusals: on an RTX PRO 6000 (sm_120: TMA, no wgmma, 101376 B opt-in) the
// planner rejects the configs the launcher would refuse, and its reason is the launcher's message without
// the kernel name. From the real numbers: the 10 stream configs need 32816-65584 B (the CTA's activation
// ring, the warps' code rings, mbarriers): all fit; of the pipeline ones m64n8k256_s4 (54400 B),
// m128n32k128_s4 (78336 B) and m64n64k128_s4 (93184 B) fit, while m128n16k256_s4 (4 x (8192 + 16384 +
// 2048) + 4352 = 110848 B) and m128n64k128_s4 (4 x (16384 + 8192 + 1024) + 17408 = 119808 B) do not; the
// six wgmma configs are rejected by the architecture (no wgmma; all but m128n32_s4, 98368 B, would not fit
// either): 8 refusals. An RTX 4090 (sm_89, no TMA) also refuses the stream configs by the architecture.
// On a made-up GPU with a 20000 B opt-in every config is refused.
std::vector<std::string> check_refusals_agree(const plan::GpuSpec& gpu) {
  std::vector<std::string> refused;
  for (const plan::TileCandidate& cand : plan::family_candidates(plan::KernelFamily::kSm90W4A16, false)) {
    const plan::SmemCheck check = plan::check_smem(cand, gpu, plan::kCutlass420);
    const std::string name = cand.to_string();
    if (check.fits) {
      EXPECT_NO_THROW(w4a16_check_config(cand.ours, gpu.smem_optin_per_block)) << name;
      continue;
    }
    refused.push_back(name);
    // Arch rejections: wgmma configs without wgmma, stream ones without TMA (the binary's arch list decides).
    if (check.rule == "arch") {
      EXPECT_TRUE(plan::w4a16_is_wgmma(cand.ours.kind) ||
                  (cand.ours.kind == W4A16Kind::kStream && !gpu.has(plan::kTma)))
          << name << ": " << check.reason;
      continue;
    }
    EXPECT_EQ(check.rule, "smem-opt-in") << name;
    const std::string msg = error_of([&] { w4a16_check_config(cand.ours, gpu.smem_optin_per_block); });
    EXPECT_NE(msg.find(std::string("sm90_nvfp4_w4a16_grouped_gemm: ") + check.reason), std::string::npos)
        << name << "\nlauncher: " << msg << "\nplanner: " << check.reason;
  }
  return refused;
}

TEST(W4A16Configs, LauncherRefusesWhatThePlannerRejects) {
  // An sm_120 card (TMA, no wgmma, 101376 B opt-in): the stream configs fit.
  const plan::GpuSpec blackwell = plan::require_gpu("rtx-pro-6000");
  ASSERT_EQ(blackwell.smem_optin_per_block, 101376u);
  const std::vector<std::string> over = {"w4a16_swapab_m128n16k256_s4", "w4a16_swapab_m128n64k128_s4",
                                         "w4a16_wgmma_m128n32_s4",      "w4a16_wgmma_m128n64_s4",
                                         "w4a16_wgmma_m128n128_s4",     "w4a16_wgmma_m128n256_s4",
                                         "w4a16_wgmma_m256n64_s4",      "w4a16_wgmma_m256n128_s4"};
  EXPECT_EQ(check_refusals_agree(blackwell), over);
  // sm_89 (no TMA) refuses the stream configs too: only the three pipeline configs that fit are left.
  const plan::GpuSpec ada = plan::require_gpu("rtx-4090");
  std::vector<std::string> want;
  for (const std::string& name : w4a16_config_names()) {
    const bool pipeline_fits = name == "w4a16_swapab_m64n8k256_s4" || name == "w4a16_swapab_m128n32k128_s4" ||
                               name == "w4a16_swapab_m64n64k128_s4";
    if (!pipeline_fits) want.push_back(name);
  }
  EXPECT_EQ(check_refusals_agree(ada), want);
  plan::GpuSpec tiny = blackwell;
  tiny.name = "tiny";
  tiny.smem_optin_per_block = 20000;
  // 20000 B refuses every config (the smallest needs 32816 B): the whole table, in id order (its names are
  // pinned by NamesRoundTrip).
  EXPECT_EQ(check_refusals_agree(tiny), w4a16_config_names());
  // The stream refusal to the byte: 49200 - 20000 = 29200.
  const std::string msg =
      error_of([] { w4a16_check_config(w4a16_config(w4a16_config_id("w4a16_stream_m128n8_d8")), 20000); });
  EXPECT_NE(msg.find("config w4a16_stream_m128n8_d8 needs 2 slots x 8 chunks x 1024 B activations + 4 warps x 8 chunks "
                     "x 2 row tiles x 512 B codes + mbarriers, ticket 48 = 49200 B of shared memory > 20000 B (the "
                     "device's opt-in limit per block) by 29200 B"),
            std::string::npos)
      << msg;
}

TEST(W4A16Configs, NamesRoundTrip) {
  const std::vector<std::string> names = w4a16_config_names();
  const std::vector<std::string> want = {
      "w4a16_stream_m64n8_d8",       "w4a16_stream_m128n8_d4",      "w4a16_stream_m128n8_d8",
      "w4a16_stream_m64n16_d8",      "w4a16_stream_m128n16_d4",     "w4a16_stream_m128n16_d8",
      "w4a16_swapab_m64n8k256_s4",   "w4a16_swapab_m128n16k256_s4", "w4a16_swapab_m128n32k128_s4",
      "w4a16_swapab_m128n64k128_s4", "w4a16_swapab_m64n64k128_s4",  "w4a16_wgmma_m128n32_s4",
      "w4a16_wgmma_m128n64_s4",      "w4a16_wgmma_m128n128_s4",     "w4a16_wgmma_m128n256_s4",
      "w4a16_wgmma_m256n64_s4",      "w4a16_wgmma_m256n128_s4",     "w4a16_stream_m128n32_d4",
      "w4a16_stream_m256n8_d4",      "w4a16_stream_m256n16_d4",     "w4a16_stream_m256n32_d4"};
  ASSERT_EQ(names, want);
  ASSERT_EQ(static_cast<int>(names.size()), w4a16_num_configs());
  for (int i = 0; i < w4a16_num_configs(); ++i) EXPECT_EQ(w4a16_config_id(names[static_cast<size_t>(i)]), i);
  const std::string msg = error_of([] { w4a16_config_id("w4a16_swapab_m256n8k128_s4"); });
  EXPECT_NE(
      msg.find("unknown config 'w4a16_swapab_m256n8k128_s4'; known: w4a16_stream_m64n8_d8, w4a16_stream_m128n8_d4, "),
      std::string::npos)
      << msg;
  const std::string msg_id = error_of([] { w4a16_config(99); });
  EXPECT_NE(msg_id.find("config id 99 is out of range (21 configs, ids 0..20)"), std::string::npos) << msg_id;
  error_of([] { w4a16_config(-1); });
}

// The split-K reduction's launch: 4 outputs a thread, 256 a block (a batch-1 o_proj: 1 x 6144 -> 6 blocks; 64
// rows -> 384), loads-first up to kW4A16ReduceLoadsFirstMaxBlocks blocks inclusive, SwiGLU counting its n / 2
// outputs, at most 4096 blocks.
TEST(W4A16Configs, SplitKReduceLaunch) {
  W4A16GroupedGemmArgs a;
  a.m_total = 1;
  a.n = 6144;
  W4A16SplitKReduce r = w4a16_splitk_reduce_launch(a);
  EXPECT_EQ(r.blocks, 6);
  EXPECT_TRUE(r.loads_first);
  a.m_total = 64;
  r = w4a16_splitk_reduce_launch(a);
  EXPECT_EQ(r.blocks, 384);
  EXPECT_FALSE(r.loads_first);
  a.n = 1024;
  a.m_total = 256;  // 65,536 quads: 256 blocks
  EXPECT_EQ(w4a16_splitk_reduce_launch(a).blocks, kW4A16ReduceLoadsFirstMaxBlocks);
  EXPECT_TRUE(w4a16_splitk_reduce_launch(a).loads_first);
  a.m_total = 257;
  EXPECT_FALSE(w4a16_splitk_reduce_launch(a).loads_first);
  a.n = 2048;
  a.m_total = 256;
  a.epilogue = W4A16Epilogue::kSwiGlu;  // 1024 outputs a row
  EXPECT_EQ(w4a16_splitk_reduce_launch(a).blocks, 256);
  a.epilogue = W4A16Epilogue::kNone;
  a.m_total = 8192;
  a.n = 16384;
  EXPECT_EQ(w4a16_splitk_reduce_launch(a).blocks, 4096);
}

// The split-K plan (no GPU): GLM-5's o_proj (N = 6144, K = 16384: 32 scale groups) at one token
// is 96 CTAs of 64 rows -> ceil(4 x 132 / 96) = 6 parts of ceil(32 / 6) = 6 groups, i.e. 6 parts;
// the same for a pipelined 64-row tile, and at 64 tokens the 128 x 64 pipelined tile (48 CTAs) makes
// 8 parts of 4 groups, also with the SwiGLU epilogue; no split for no workspace, a full grid, one group, or a
// workspace without room for two parts; the workspace caps the parts.
TEST(W4A16Configs, SplitKPlan) {
  W4A16GroupedGemmArgs a;
  a.m_total = 1;
  a.n = 6144;
  a.k = 16384;
  a.n_experts = 1;
  float* ws = reinterpret_cast<float*>(uintptr_t{256});  // never dereferenced
  a.splitk_workspace = ws;
  a.splitk_workspace_bytes = size_t{1} << 30;
  const W4A16Config& stream = w4a16_config(w4a16_config_id("w4a16_stream_m64n8_d8"));
  W4A16SplitK s = w4a16_splitk_plan(a, stream, 132);
  EXPECT_EQ(s.parts, 6);
  EXPECT_EQ(s.groups_per_part, 6);
  EXPECT_EQ(w4a16_splitk_plan(a, w4a16_config(w4a16_config_id("w4a16_swapab_m64n8k256_s4")), 132).parts, 6);
  a.m_total = 64;
  s = w4a16_splitk_plan(a, w4a16_config(w4a16_config_id("w4a16_swapab_m128n64k128_s4")), 132);
  EXPECT_EQ(s.parts, 8);
  EXPECT_EQ(s.groups_per_part, 4);
  a.m_total = 1;
  a.epilogue = W4A16Epilogue::kSwiGlu;  // split the same way; the reduction applies the SwiGLU
  EXPECT_EQ(w4a16_splitk_plan(a, stream, 132).parts, 6);
  a.epilogue = W4A16Epilogue::kNone;
  a.splitk_workspace_bytes = 3 * 6144 * 4;  // room for 3 planes of [1, 6144] f32
  s = w4a16_splitk_plan(a, stream, 132);
  EXPECT_EQ(s.parts, 3);
  EXPECT_EQ(s.groups_per_part, 11);  // 32 groups: 11 + 11 + 10
  a.splitk_workspace_bytes = 6144 * 4;
  EXPECT_EQ(w4a16_splitk_plan(a, stream, 132).parts, 1);
  a.splitk_workspace_bytes = size_t{1} << 30;
  a.k = 512;  // one scale group: nothing to split
  EXPECT_EQ(w4a16_splitk_plan(a, stream, 132).parts, 1);
  a.k = 16384;
  a.n_experts = 32;  // the MoE down GEMM at 8 tokens per expert: 32 x 96 CTAs fill the GPU
  a.m_total = 256;
  EXPECT_EQ(w4a16_splitk_plan(a, stream, 132).parts, 1);
  a.splitk_workspace = nullptr;
  a.n_experts = 1;
  a.m_total = 1;
  EXPECT_EQ(w4a16_splitk_plan(a, stream, 132).parts, 1);
  // Never more than kW4A16MaxSplitK parts, never an empty part.
  a.splitk_workspace = ws;
  const W4A16Config& wgmma = w4a16_config(w4a16_config_id("w4a16_wgmma_m128n64_s4"));
  for (int64_t k = 512; k <= 65536; k += 512) {
    a.k = k;
    for (const W4A16Config* c : {&stream, &wgmma}) {
      s = w4a16_splitk_plan(a, *c, 132);
      ASSERT_LE(s.parts, kW4A16MaxSplitK) << k;
      ASSERT_LT(static_cast<int64_t>(s.parts - 1) * s.groups_per_part, w4a16_k_groups(k)) << k;
      ASSERT_GE(static_cast<int64_t>(s.parts) * s.groups_per_part, w4a16_k_groups(k)) << k;
    }
  }
  // The wgmma kind fills whole waves: o_proj (N = 6144, K = 16384: 32 groups) at 64 tokens on the
  // m128n64 tile (2 resident CTAs per SM: 264) is 48 CTAs; cost = waves x (groups per part + 1):
  // 1 part 1 x 33, 4 parts (192 CTAs) 1 x 9, 5 parts (240 CTAs, 7 groups each: ceil(32 / 7) = 5) 1 x 8,
  // 6 parts (288 CTAs) 2 x 7, 8 parts 2 x 5: 5 parts of 7 groups.
  a.k = 16384;
  a.m_total = 64;
  s = w4a16_splitk_plan(a, wgmma, 132);
  EXPECT_EQ(s.parts, 5);
  EXPECT_EQ(s.groups_per_part, 7);
  // A grid of whole waves already (E = 32 experts x 32 row blocks at 64 tokens each): no split.
  a.n_experts = 32;
  a.n = 4096;
  a.k = 6144;
  a.m_total = 32 * 64;
  EXPECT_EQ(w4a16_splitk_plan(a, wgmma, 132).parts, 1);
}

// The grid covers every work item: for any split of m_total tokens over E experts, the token tiles
// sum_e ceil(m_e / block_t) never exceed grid.x (empty experts cost no tile; one expert: exactly), and grid.y covers N.
TEST(W4A16Configs, GridCoversEveryTokenTile) {
  std::mt19937 rng(20261203);
  for (int id = 0; id < w4a16_num_configs(); ++id) {
    const W4A16Config& c = w4a16_config(id);
    for (int trial = 0; trial < 200; ++trial) {
      const int64_t E = 1 + static_cast<int64_t>(rng() % 64);
      std::vector<int64_t> m(static_cast<size_t>(E), 0);
      int64_t total = 0, tiles = 0;
      for (auto& me : m) {
        me = (rng() % 3 == 0) ? 0 : static_cast<int64_t>(rng() % 300);
        total += me;
        tiles += (me + c.block_t - 1) / c.block_t;
      }
      W4A16GroupedGemmArgs a;
      a.m_total = total;
      a.n_experts = E;
      a.n = 8 * (1 + static_cast<int64_t>(rng() % 1000));
      const W4A16Grid g = w4a16_grid(a, c);
      ASSERT_GE(g.x, tiles) << w4a16_config_name(c) << " E " << E << " m_total " << total;
      if (E == 1) {
        ASSERT_EQ(g.x, tiles) << w4a16_config_name(c) << ": one expert's grid is exact";
      }
      ASSERT_GE(g.y * c.block_w, a.n);
      ASSERT_LT((g.y - 1) * c.block_w, a.n);
      ASSERT_EQ(g.ctas(), g.x * g.y);
    }
  }
}

TEST(W4A16Configs, DefaultConfigPerTokenCount) {
  struct Case {
    int64_t tokens;
    const char* name;
  };
  const Case cases[] = {
      {1, "w4a16_stream_m256n8_d4"},    {8, "w4a16_stream_m256n8_d4"},    {9, "w4a16_stream_m256n16_d4"},
      {16, "w4a16_stream_m256n16_d4"},  {17, "w4a16_stream_m256n32_d4"},  {32, "w4a16_stream_m256n32_d4"},
      {33, "w4a16_wgmma_m128n64_s4"},   {64, "w4a16_wgmma_m128n64_s4"},   {65, "w4a16_wgmma_m256n128_s4"},
      {128, "w4a16_wgmma_m256n128_s4"}, {129, "w4a16_wgmma_m128n256_s4"}, {500, "w4a16_wgmma_m128n256_s4"}};
  for (const Case& cs : cases) {
    const W4A16Config& c = w4a16_config(w4a16_default_config(cs.tokens, 32));
    EXPECT_EQ(w4a16_config_name(c), cs.name) << cs.tokens << " tokens per expert";
    EXPECT_GE(c.block_t, static_cast<uint32_t>(std::min<int64_t>(cs.tokens, 128))) << cs.tokens << " tokens per expert";
  }
  EXPECT_EQ(w4a16_config(w4a16_default_config(1, 32)).kind, W4A16Kind::kStream);
  EXPECT_EQ(w4a16_config(w4a16_default_config(1, 32)).block_t, 8u);
  EXPECT_EQ(w4a16_config(w4a16_default_config(9, 32)).kind, W4A16Kind::kStream);
  EXPECT_EQ(w4a16_config(w4a16_default_config(9, 32)).block_t, 16u);
  // The decode defaults' shared memory: the CTA's activation ring (2 slots x 8 chunks x block_t x 128 B) +
  // 8 warps x 4 chunks x 2 x 512 B of codes + 48 B of mbarriers = 49200 B (n8) and 65584 B (n16), 2 CTAs an SM
  // each (by registers).
  EXPECT_EQ(W4A16Layout::make(w4a16_config(w4a16_default_config(1, 32))).total_bytes(), 49200u);
  EXPECT_EQ(W4A16Layout::make(w4a16_config(w4a16_default_config(16, 32))).total_bytes(), 65584u);
  EXPECT_EQ(w4a16_config(w4a16_default_config(16, 32)).block_w, 256u);
  EXPECT_EQ(w4a16_config(w4a16_default_config(500, 32)).block_t, 256u);
  EXPECT_EQ(w4a16_config(w4a16_default_config(500, 32)).kind, W4A16Kind::kWgmma);
  // One expert (a dense Linear): the 128-row 32-token tile at 17-32 rows, the grouped
  // defaults elsewhere.
  for (int64_t t : {17, 24, 32}) {
    EXPECT_EQ(w4a16_config_name(w4a16_config(w4a16_default_config(t, 1))), "w4a16_stream_m128n32_d4") << t;
  }
  for (int64_t t : {1, 8, 9, 16, 33, 64, 65, 128, 129, 500}) {
    EXPECT_EQ(w4a16_default_config(t, 1), w4a16_default_config(t, 32)) << t;
  }
}

// 128x64x256, 6 stages: x_tile 64*256*2 = 32768, w_tiles 128*256/2 = 16384, w_scales
// 128*256/16 = 2048 per stage (51200 x 6 = 307200) + epilogue 64 * (128*2 + 16) = 17408 =
// 324608 B > 232448 by 92160.
TEST(W4A16Configs, InfeasibleConfigIsRefusedWithTheBytes) {
  const W4A16Config big{128, 64, 256, 6};
  const std::string msg = error_of([&] { w4a16_check_config(big, kSm90SmemOptinBytes); });
  EXPECT_NE(msg.find("sm90_nvfp4_w4a16_grouped_gemm: config w4a16_swapab_m128n64k256_s6 needs 6 stages x "
                     "(x_tile 32768 + w_tiles 16384 + w_scales 2048) + epilogue 17408 = 324608 B of shared "
                     "memory > 232448 B (the device's opt-in limit per block) by 92160 B"),
            std::string::npos)
      << msg;
  // A shipped config against a smaller (sm_89 / sm_120-like) limit: m128n64k128_s4 =
  // 4 x (16384 + 8192 + 1024) + 64 * 272 = 102400 + 17408 = 119808 B > 101376 by 18432.
  const std::string msg2 =
      error_of([] { w4a16_check_config(w4a16_config(w4a16_config_id("w4a16_swapab_m128n64k128_s4")), 101376); });
  EXPECT_NE(msg2.find("needs 4 stages x (x_tile 16384 + w_tiles 8192 + w_scales 1024) + epilogue 17408 = 119808 B of "
                      "shared memory > 101376 B (the device's opt-in limit per block) by 18432 B"),
            std::string::npos)
      << msg2;
  const std::string msg3 = error_of([] { w4a16_check_config(W4A16Config{96, 8, 256, 4}, kSm90SmemOptinBytes); });
  EXPECT_NE(msg3.find("block_w (weight rows, MMA M) must be 64 or 128"), std::string::npos) << msg3;
  for (int i = 0; i < w4a16_num_configs(); ++i) EXPECT_NO_THROW(w4a16_check_config(w4a16_config(i), kSm90SmemOptinBytes));
}

TEST(W4A16Configs, StreamConfigRulesAreNamed) {
  constexpr W4A16Kind kS = W4A16Kind::kStream;
  std::string msg = error_of([] { w4a16_check_config(W4A16Config{64, 64, 64, 4, kS}, kSm90SmemOptinBytes); });
  EXPECT_NE(msg.find("sm90_nvfp4_w4a16_grouped_gemm: config w4a16_stream_m64n64_d4 cannot be built: "
                     "stream: block_t (tokens, MMA N) must be 8, 16 or 32"),
            std::string::npos)
      << msg;
  msg = error_of([] { w4a16_check_config(W4A16Config{64, 8, 128, 4, kS}, kSm90SmemOptinBytes); });
  EXPECT_NE(msg.find("cannot be built: stream: block_k must be 64 (one chunk per step)"), std::string::npos) << msg;
  msg = error_of([] { w4a16_check_config(W4A16Config{64, 8, 64, 3, kS}, kSm90SmemOptinBytes); });
  EXPECT_NE(msg.find("config w4a16_stream_m64n8_d3 cannot be built: stream: stages (code ring depth) must be 4, 8 or 16"),
            std::string::npos)
      << msg;
  // A depth of 2 (one chunk in flight) and of 32 are refused too; 4 and 16 build.
  msg = error_of([] { w4a16_check_config(W4A16Config{64, 8, 64, 2, kS}, kSm90SmemOptinBytes); });
  EXPECT_NE(msg.find("config w4a16_stream_m64n8_d2 cannot be built: stream: stages (code ring depth) must be 4, 8 or 16"),
            std::string::npos)
      << msg;
  msg = error_of([] { w4a16_check_config(W4A16Config{128, 16, 64, 32, kS}, kSm90SmemOptinBytes); });
  EXPECT_NE(msg.find("config w4a16_stream_m128n16_d32 cannot be built: stream: stages (code ring depth) must be 4, 8 or 16"),
            std::string::npos)
      << msg;
  EXPECT_NO_THROW(w4a16_check_config(W4A16Config{64, 8, 64, 4, kS}, kSm90SmemOptinBytes));
  // 32768 + 4 warps x 16 x 1024 + 48 = 98352 B
  EXPECT_NO_THROW(w4a16_check_config(W4A16Config{128, 16, 64, 16, kS}, kSm90SmemOptinBytes));
  // Shared memory is checked for stream configs too: 16384 + 2 warps x 16 x 1024 + 48 = 49200 B > 49199 by 1.
  msg = error_of([] { w4a16_check_config(W4A16Config{64, 8, 64, 16, kS}, 49199); });
  EXPECT_NE(
      msg.find("sm90_nvfp4_w4a16_grouped_gemm: config w4a16_stream_m64n8_d16 needs 2 slots x 8 chunks x 1024 B "
               "activations + 2 warps x 16 chunks x 2 row tiles x 512 B codes + mbarriers, ticket 48 = 49200 B of "
               "shared memory > 49199 B (the device's opt-in limit per block) by 1 B"),
      std::string::npos)
      << msg;
  msg = error_of([] { w4a16_check_config(W4A16Config{96, 8, 64, 4, kS}, kSm90SmemOptinBytes); });
  EXPECT_NE(msg.find("stream: block_w (weight rows per CTA) must be 64, 128 or 256"), std::string::npos) << msg;
}

// Expert row classes (W4A16GroupedGemmArgs::min/max_expert_rows): need expert offsets and an ordered
// range; never split K; the grid holds only what the class can: at most m_total / min_expert_rows
// experts, one tile each when max_expert_rows fits the token tile.
// Problem arguments whose pointers are all `buf` (aligned, never dereferenced: only checked).
W4A16GroupedGemmArgs args_on(uint8_t* buf, bool with_offsets) {
  W4A16GroupedGemmArgs a;
  a.x = reinterpret_cast<const __nv_bfloat16*>(buf);
  if (with_offsets) a.expert_offsets = reinterpret_cast<const int32_t*>(buf);
  a.w_packed = buf;
  a.w_scales = buf;
  a.w_global_scales = reinterpret_cast<const float*>(buf);
  a.y = reinterpret_cast<__nv_bfloat16*>(buf);
  return a;
}

TEST(W4A16Problem, ExpertRowClassRulesGridAndNoSplit) {
  alignas(16) static uint8_t buf[256] = {};
  W4A16GroupedGemmArgs a = args_on(buf, false);
  a.m_total = 512;
  a.n = 4096;
  a.k = 6144;
  a.n_experts = 256;
  const W4A16Config& stream16 = w4a16_config(w4a16_config_id("w4a16_stream_m64n16_d8"));
  const W4A16Config& wg64 = w4a16_config(w4a16_config_id("w4a16_wgmma_m128n64_s4"));
  EXPECT_FALSE(a.filters_experts());
  a.min_expert_rows = 17;
  EXPECT_TRUE(a.filters_experts());
  a.n_experts = 1;  // a dense launch (no offsets) has no experts to class
  std::string msg = error_of([&] { w4a16_check_problem(a, wg64); });
  EXPECT_NE(msg.find("an expert row class needs expert_offsets and 0 <= min_expert_rows <= max_expert_rows (got 17 .. "
                     "2147483647, offsets 0)"),
            std::string::npos)
      << msg;
  a.n_experts = 256;
  a.expert_offsets = reinterpret_cast<const int32_t*>(buf);
  EXPECT_NO_THROW(w4a16_check_problem(a, wg64));
  a.max_expert_rows = 16;
  msg = error_of([&] { w4a16_check_problem(a, wg64); });
  EXPECT_NE(msg.find("(got 17 .. 16, offsets "), std::string::npos) << msg;
  // Unfiltered: 512 / 64 + min(256, 512) = 264 items; rows > 16: at most 512 / 17 = 30 experts,
  // 512 / 64 + 30 = 38 items; rows <= 16 on a 16-token tile: one tile per expert, 256.
  a.min_expert_rows = 0;
  a.max_expert_rows = std::numeric_limits<int32_t>::max();
  EXPECT_EQ(w4a16_grid(a, wg64).x, 264);
  a.min_expert_rows = 17;
  EXPECT_EQ(w4a16_grid(a, wg64).x, 38);
  a.min_expert_rows = 0;
  a.max_expert_rows = 16;
  EXPECT_EQ(w4a16_grid(a, stream16).x, 256);
  EXPECT_EQ(w4a16_grid(a, stream16).y, 4096 / 64);
  // A class never splits K, even with a workspace and a grid that would.
  a.n_experts = 1;
  a.m_total = 7;
  a.max_expert_rows = std::numeric_limits<int32_t>::max();
  a.splitk_workspace = reinterpret_cast<float*>(buf);
  a.splitk_workspace_bytes = size_t{1} << 26;
  EXPECT_GT(w4a16_splitk_plan(a, stream16, 132).parts, 1);
  a.max_expert_rows = 100;
  EXPECT_EQ(w4a16_splitk_plan(a, stream16, 132).parts, 1);
}

TEST(W4A16Problem, RefusesUnsupportedShapesNamingTheNumbers) {
  alignas(16) static uint8_t buf[256] = {};
  W4A16GroupedGemmArgs a = args_on(buf, true);
  a.m_total = 4;
  a.n = 64;
  a.k = 1048;  // 16 x 65 + 8
  a.n_experts = 2;
  const W4A16Config& c = w4a16_config(0);
  std::string msg = error_of([&] { w4a16_check_problem(a, c); });
  EXPECT_NE(msg.find("sm90_nvfp4_w4a16_grouped_gemm (w4a16_stream_m64n8_d8, M_total=4, N=64, K=1048, E=2): K=1048 must "
                     "be a positive multiple of 16 (one NVFP4 block; K % 16 = 8)"),
            std::string::npos)
      << msg;
  a.k = 0;
  msg = error_of([&] { w4a16_check_problem(a, c); });
  EXPECT_NE(msg.find("K=0 must be a positive multiple of 16"), std::string::npos) << msg;
  a.k = 1040;  // 16 x 65: the kernel layout pads K to 17 chunks of 64 with zero codes
  for (int id = 0; id < w4a16_num_configs(); ++id) EXPECT_NO_THROW(w4a16_check_problem(a, w4a16_config(id))) << id;
  a.n = 60;
  msg = error_of([&] { w4a16_check_problem(a, c); });
  EXPECT_NE(msg.find("N=60 must be a positive multiple of 8 (16 B output stores; N % 8 = 4)"), std::string::npos) << msg;
  a.n = 64;
  a.n_experts = 0;
  msg = error_of([&] { w4a16_check_problem(a, c); });
  EXPECT_NE(msg.find("E=0 must be >= 1"), std::string::npos) << msg;
  a.n_experts = 2;
  a.w_scales = buf + 8;  // 8 B aligned: the stream kernel's 16 B scale-group loads need 16
  msg = error_of([&] { w4a16_check_problem(a, c); });
  EXPECT_NE(msg.find("must be 16 B aligned"), std::string::npos) << msg;
  a.w_scales = buf + 16;
  a.w_packed = buf + 16;
  EXPECT_NO_THROW(w4a16_check_problem(a, c));
  a.y = reinterpret_cast<__nv_bfloat16*>(buf + 2);
  msg = error_of([&] { w4a16_check_problem(a, c); });
  EXPECT_NE(msg.find("must be 16 B aligned"), std::string::npos) << msg;
  a.y = reinterpret_cast<__nv_bfloat16*>(buf);
  a.expert_offsets = reinterpret_cast<const int32_t*>(buf + 2);
  msg = error_of([&] { w4a16_check_problem(a, c); });
  EXPECT_NE(msg.find("expert_offsets and w_global_scales 4 B aligned"), std::string::npos) << msg;
  a.expert_offsets = nullptr;  // only a single expert may leave its offsets out
  msg = error_of([&] { w4a16_check_problem(a, c); });
  EXPECT_NE(msg.find("expert_offsets may be null only for one expert (rows [0, M_total))"), std::string::npos) << msg;
  a.n_experts = 1;
  EXPECT_NO_THROW(w4a16_check_problem(a, c));
  a.n_experts = 2;
  a.expert_offsets = reinterpret_cast<const int32_t*>(buf);
  a.w_scales = nullptr;
  msg = error_of([&] { w4a16_check_problem(a, c); });
  EXPECT_NE(msg.find("null pointer"), std::string::npos) << msg;
  a.w_scales = buf;
  a.y = nullptr;
  msg = error_of([&] { w4a16_check_problem(a, c); });
  EXPECT_NE(msg.find("null pointer"), std::string::npos) << msg;
  a.m_total = 0;  // nothing to do: pointers are not needed
  EXPECT_NO_THROW(w4a16_check_problem(a, c));
  a.y = reinterpret_cast<__nv_bfloat16*>(buf);
  a.m_total = 4;
  // grid.y = ceil(N / block_w) must be <= 65535: N = 64 x 65536 with block_w 64 is one too many.
  a.n = int64_t{64} * 65536;
  msg = error_of([&] { w4a16_check_problem(a, c); });
  EXPECT_NE(msg.find("grid 2 x 65536 exceeds CUDA's limits"), std::string::npos) << msg;  // x: 4 / 8 + min(2, 4)
  a.n = 64;
  // The wgmma tiles launch transposed: their token tiles take the y limit. One expert of 65536 x 64
  // rows is 65536 tiles of 64 on m128n64 (row blocks: 1).
  {
    W4A16GroupedGemmArgs big = a;
    big.n_experts = 1;
    big.expert_offsets = nullptr;
    big.m_total = int64_t{65536} * 64;
    const W4A16Config& wg64 = w4a16_config(w4a16_config_id("w4a16_wgmma_m128n64_s4"));
    msg = error_of([&] { w4a16_check_problem(big, wg64); });
    EXPECT_NE(msg.find("grid 1 x 65536 exceeds CUDA's limits (2^31-1 x 65535) (the wgmma tiles launch row blocks along "
                       "x, token tiles along y)"),
              std::string::npos)
        << msg;
    big.m_total -= 64;
    EXPECT_NO_THROW(w4a16_check_problem(big, wg64));
    big.m_total += 64;
    EXPECT_NO_THROW(w4a16_check_problem(big, c));  // the stream tile's token tiles go along x
  }
  // An invalid config is refused before anything else.
  msg = error_of([&] { w4a16_check_problem(a, W4A16Config{64, 8, 64, 3, W4A16Kind::kStream}); });
  EXPECT_NE(msg.find("invalid config"), std::string::npos) << msg;
  // The launcher checks before touching CUDA, so the refusal works without a GPU too.
  a.k = 1048;
  msg = error_of([&] { w4a16_grouped_gemm(a, 0, nullptr); });
  EXPECT_NE(msg.find("K=1048"), std::string::npos) << msg;
}

}  // namespace
}  // namespace fp4moe::cuda::sm90
