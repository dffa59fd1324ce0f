// Shared-memory layout of the project's own Hopper kernel family `sm90_nvfp4_w4a16_grouped_gemm`:
// BF16 activations x NVFP4 weights, grouped over experts, wgmma on BF16 operands after an in-SMEM
// dequantization of the weight tile. The kernel carves its dynamic shared memory with this very
// struct (issue "Hopper NVFP4 MoE kernels"):
//
//   constexpr auto kLayout = fp4moe::plan::Sm90W4A16Layout::make({128, 32, 128, 0, true});
//   static_assert(kLayout.fits(fp4moe::plan::kSm90SmemOptin));
//   extern __shared__ __align__(1024) uint8_t smem[];
//   auto* x_tile = reinterpret_cast<__nv_bfloat16*>(smem + kLayout.x_tile(stage));  // TMA destination
//   uint8_t* w_fp4 = smem + kLayout.w_packed(stage);
//   ...  launch with kLayout.total_bytes() of dynamic shared memory
//
// Per stage (TMA destinations, each 1024 B aligned for the 128B swizzle):
//   x_tile      token_rows x BLOCK_K bf16                   (activations)
//   w_packed    weight_rows x BLOCK_K / 2 bytes             (NVFP4 e2m1, two per byte)
//   w_scales    weight_rows x BLOCK_K / 16 bytes            (e4m3, one per 16 weights; 128 B aligned)
// Once:
//   w_dequant   weight_rows x BLOCK_K bf16                  (the wgmma operand, 1024 aligned)
//   epilogue    BLOCK_M x BLOCK_N bf16                      (output staging for the TMA store)
//   barriers    full + empty mbarrier per stage, 8 B each
//
// Roles: without swap-AB, tokens are the MMA M (BLOCK_M = 64 or 128 = one or two warpgroups of
// wgmma M=64) and weights the MMA N (BLOCK_N up to 256). With swap-AB the weight dimension fills
// the MMA M (64 or 128) and tokens are N = 8..256 (wgmma N is a multiple of 8): decode-sized
// experts (1..64 tokens) waste at most 7 rows instead of up to 127.
//
// stages == 0 in the config asks for the most stages (<= kMaxStages) that fit a capacity (the
// "builder" of this family: exact, because this is the kernel's own layout). Header-only constexpr.
// Tested by tests/plan/test_layouts.cpp.
#pragma once

#include <cstdint>

#include "plan/smem_layout.h"

namespace fp4moe::plan {

inline constexpr uint32_t kSm90SmemOptin = 232448;  // sm_90 opt-in per block (227 KiB)

struct Sm90W4A16Config {
  uint32_t block_m = 128;  // output tile rows (MMA M): tokens, or weights with swap_ab
  uint32_t block_n = 128;  // output tile cols (MMA N): weights, or tokens with swap_ab
  uint32_t block_k = 128;  // K per stage; a multiple of 64 (128 B of bf16 = one swizzle row)
  uint32_t stages = 0;     // 0: as many as fit (see Sm90W4A16Layout::max_stages)
  bool swap_ab = false;

  FP4MOE_HD constexpr uint32_t weight_rows() const { return swap_ab ? block_m : block_n; }
  FP4MOE_HD constexpr uint32_t token_rows() const { return swap_ab ? block_n : block_m; }
};

struct Sm90W4A16Layout {
  static constexpr uint32_t kMaxStages = 8;
  static constexpr uint32_t kNvfp4Block = 16;

  Sm90W4A16Config config{};
  SmemLayout layout{};
  // Offsets of stage 0 and the stride between stages, for the kernel's carve.
  uint32_t x_tile_offset = 0, w_packed_offset = 0, w_scales_offset = 0, stage_stride = 0;
  uint32_t w_dequant_offset = 0, epilogue_offset = 0, full_barrier_offset = 0, empty_barrier_offset = 0;
  uint32_t stage_bytes = 0;  // bytes one stage adds, including its alignment padding and barriers
  const char* invalid_reason = nullptr;

  FP4MOE_HD constexpr uint32_t total_bytes() const { return layout.total_bytes; }
  FP4MOE_HD constexpr bool fits(uint32_t capacity) const { return invalid_reason == nullptr && total_bytes() <= capacity; }

  // Where tile i of stage s lives, relative to the dynamic smem base (which the kernel declares
  // `extern __shared__ __align__(1024) uint8_t smem[]`).
  FP4MOE_HD constexpr uint32_t x_tile(uint32_t stage) const { return x_tile_offset + stage * stage_stride; }
  FP4MOE_HD constexpr uint32_t w_packed(uint32_t stage) const { return w_packed_offset + stage * stage_stride; }
  FP4MOE_HD constexpr uint32_t w_scales(uint32_t stage) const { return w_scales_offset + stage * stage_stride; }
  FP4MOE_HD constexpr uint32_t full_barrier(uint32_t stage) const { return full_barrier_offset + stage * kMbarrierBytes; }
  FP4MOE_HD constexpr uint32_t empty_barrier(uint32_t stage) const { return empty_barrier_offset + stage * kMbarrierBytes; }

  FP4MOE_HD static constexpr const char* check(const Sm90W4A16Config& c) {
    if (c.block_k == 0 || c.block_k % 64 != 0) return "BLOCK_K must be a positive multiple of 64 (one 128 B swizzle row of bf16)";
    if (c.swap_ab) {
      if (c.block_m != 64 && c.block_m != 128) return "swap-AB: the weight tile (MMA M) must be 64 or 128";
      if (c.block_n < 8 || c.block_n > 256 || c.block_n % 8 != 0) return "swap-AB: the token tile (MMA N) must be 8..256, a multiple of 8";
    } else {
      if (c.block_m != 64 && c.block_m != 128) return "BLOCK_M (tokens, MMA M) must be 64 or 128 (one or two warpgroups)";
      if (c.block_n < 16 || c.block_n > 256 || c.block_n % 16 != 0) return "BLOCK_N (weights, MMA N) must be 16..256, a multiple of 16";
    }
    if (c.stages > kMaxStages) return "at most 8 pipeline stages";
    return nullptr;
  }

  // The layout at an explicit stage count (>= 1).
  FP4MOE_HD static constexpr Sm90W4A16Layout at_stages(const Sm90W4A16Config& c, uint32_t stages) {
    Sm90W4A16Layout out{};
    out.config = c;
    out.config.stages = stages;
    out.invalid_reason = check(out.config);
    if (out.invalid_reason != nullptr || stages == 0) {
      if (out.invalid_reason == nullptr) out.invalid_reason = "stages must be >= 1";
      return out;
    }
    const uint32_t x_bytes = c.token_rows() * c.block_k * 2;
    const uint32_t w_bytes = c.weight_rows() * c.block_k / 2;
    const uint32_t s_bytes = c.weight_rows() * c.block_k / kNvfp4Block;
    // Within a stage: x_tile at 0, w_packed at the next 1024 B, w_scales at the next 128 B. Each
    // stage starts 1024-aligned, so the stride is the stage's end rounded up to 1024.
    const uint32_t w_off = round_up(x_bytes, kSwizzle128Align);
    const uint32_t s_off = round_up(w_off + w_bytes, 128);
    const uint32_t stage_block = round_up(s_off + s_bytes, kSwizzle128Align);
    SmemLayout& l = out.layout;
    for (uint32_t s = 0; s < stages; ++s) {
      const uint32_t base = l.add("stage x_tile (bf16 activations)", x_bytes, kSwizzle128Align, RegionKind::kStageOperand);
      l.add("stage w_packed (nvfp4 e2m1)", w_bytes, kSwizzle128Align, RegionKind::kStageOperand);
      l.add("stage w_scales (e4m3 per 16)", s_bytes, 128, RegionKind::kStageOperand);
      if (s == 0) {
        out.x_tile_offset = base;
        out.w_packed_offset = base + w_off;
        out.w_scales_offset = base + s_off;
      }
    }
    out.stage_stride = stage_block;
    out.w_dequant_offset = l.add("w_dequant (bf16 wgmma operand)", c.weight_rows() * c.block_k * 2, kSwizzle128Align, RegionKind::kStageOperand);
    out.epilogue_offset = l.add("epilogue tile (bf16 BLOCK_M x BLOCK_N)", c.block_m * c.block_n * 2, kSwizzle128Align, RegionKind::kEpilogue);
    out.full_barrier_offset = l.add("full barriers (1 per stage)", stages * kMbarrierBytes, kMbarrierBytes, RegionKind::kBarrier);
    out.empty_barrier_offset = l.add("empty barriers (1 per stage)", stages * kMbarrierBytes, kMbarrierBytes, RegionKind::kBarrier);
    out.stage_bytes = stage_block + 2 * kMbarrierBytes;
    return out;
  }

  // The deepest pipeline (1..kMaxStages) that fits `capacity`; stages = 0 in the result's config
  // when not even one stage fits (the layout is then the 1-stage one, for the rejection message).
  FP4MOE_HD static constexpr Sm90W4A16Layout make(const Sm90W4A16Config& c, uint32_t capacity = kSm90SmemOptin) {
    if (c.stages != 0) return at_stages(c, c.stages);
    Sm90W4A16Layout best = at_stages(c, 1);
    for (uint32_t s = 2; s <= kMaxStages; ++s) {
      const Sm90W4A16Layout l = at_stages(c, s);
      if (!l.fits(capacity)) break;
      best = l;
    }
    return best;
  }
};

}  // namespace fp4moe::plan
