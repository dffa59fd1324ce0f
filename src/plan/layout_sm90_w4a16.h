// Tile configurations and the shared-memory layout of sm90_nvfp4_w4a16_grouped_gemm, the Hopper
// MoE kernel that ships (src/kernels/cuda/sm90/w4a16_grouped_gemm.cu): mma.sync m16n8k16 BF16
// tensor cores, swap-AB, cp.async multi-stage pipeline, NVFP4 dequantized in registers. One
// constexpr description used by three parties: the kernel carves its dynamic shared memory with
// these offsets and the launcher requests `total_bytes()`; the planner (kernel_families.cpp)
// enumerates kW4A16Configs and sizes them with the same layout; the tests pin the offsets. The
// host-side wording (config names, byte summary, the refusal message) is in plan/w4a16_smem.h.
//
// Config (swap-AB: weights are the MMA M, tokens the MMA N):
//   block_w  weight rows (output features) per CTA: 64 or 128 = one m16 tile per warp (4 or 8 warps)
//   block_t  tokens per CTA tile: 8, 16, 32 or 64 (n8 MMA tiles per warp: block_t / 8)
//   block_k  K per pipeline stage: 128 or 256 (a multiple of 64: one thread reads one whole
//            16-element NVFP4 block per 64-wide K chunk)
//   stages   cp.async pipeline depth: 2..6
// Name: "w4a16_swapab_m<block_w>n<block_t>k<block_k>_s<stages>" (MMA M x N x K as the issue names them).
//
// Per stage (each region 128 B aligned, all sizes are multiples of 128 so no padding appears):
//   x_tile    block_t x block_k bf16                16 B chunks XOR-swizzled by token parity
//   w_packed  block_w x block_k / 2 bytes (e2m1)    16 B chunks XOR-swizzled per 128 B line
//   w_scales  block_w x block_k / 16 bytes (e4m3)   linear
// Once:
//   epilogue  block_t rows x (block_w x 2 + 16) B   bf16 output tile, token-major, rows padded by
//                                                   16 B so the transposed writes spread over banks
// Header-only constexpr, host + device; depends only on plan/smem_layout.h. Tested by
// tests/plan/test_layouts.cpp (offsets pinned per shipped config) and
// tests/kernels/test_cuda_w4a16_host.cpp (the kernel's carve against the planner's sizing).
#pragma once

#include <cstdint>

#include "plan/smem_layout.h"

namespace fp4moe::plan {

inline constexpr uint32_t kSm90SmemOptinBytes = 232448;  // cudaDevAttrMaxSharedMemoryPerBlockOptin on sm_90

struct W4A16Config {
  uint32_t block_w = 128;  // weight rows per CTA (MMA M)
  uint32_t block_t = 16;   // tokens per CTA (MMA N)
  uint32_t block_k = 256;  // K per stage
  uint32_t stages = 4;

  FP4MOE_HD constexpr uint32_t n_warps() const { return block_w / 16; }
  FP4MOE_HD constexpr uint32_t n_threads() const { return n_warps() * 32; }
};

// CTAs per SM the kernel is compiled for (__launch_bounds__ min blocks, which caps registers at
// 65536 / (ctas x threads)): as many as the shared memory allows (228 KB per SM, 1 KB reserved per
// CTA), but never fewer than 64 registers per thread. Decode tiles are latency-bound: more resident
// warps hide the load -> dequant -> MMA chains.
FP4MOE_HD constexpr uint32_t w4a16_ctas_per_sm(const W4A16Config& c, uint32_t smem_bytes) {
  constexpr uint32_t kSmemPerSm = 233472, kReservedPerCta = 1024;
  const uint32_t by_smem = kSmemPerSm / (smem_bytes + kReservedPerCta);
  const uint32_t by_regs = 65536 / (c.n_threads() * 64);
  const uint32_t n = by_smem < by_regs ? by_smem : by_regs;
  return n < 1 ? 1 : n;
}

struct W4A16Layout {
  static constexpr uint32_t kMinStages = 2;
  static constexpr uint32_t kMaxStages = 6;
  static constexpr uint32_t kEpilogueRowPad = 16;

  W4A16Config config{};
  SmemLayout layout{};
  uint32_t x_tile_offset = 0, w_packed_offset = 0, w_scales_offset = 0;  // stage 0
  uint32_t stage_stride = 0;                                              // bytes between stages
  uint32_t x_tile_bytes = 0, w_packed_bytes = 0, w_scales_bytes = 0;      // one stage
  uint32_t epilogue_offset = 0, epilogue_row_bytes = 0, epilogue_bytes = 0;
  const char* invalid_reason = nullptr;  // non-null: the config cannot be built (the rule broken)

  FP4MOE_HD constexpr uint32_t total_bytes() const { return layout.total_bytes; }
  FP4MOE_HD constexpr bool valid() const { return invalid_reason == nullptr; }
  FP4MOE_HD constexpr bool fits(uint32_t capacity) const { return valid() && total_bytes() <= capacity; }

  FP4MOE_HD constexpr uint32_t x_tile(uint32_t stage) const { return x_tile_offset + stage * stage_stride; }
  FP4MOE_HD constexpr uint32_t w_packed(uint32_t stage) const { return w_packed_offset + stage * stage_stride; }
  FP4MOE_HD constexpr uint32_t w_scales(uint32_t stage) const { return w_scales_offset + stage * stage_stride; }

  // nullptr when the kernel can be instantiated with `c`, else the rule it breaks.
  FP4MOE_HD static constexpr const char* check(const W4A16Config& c) {
    if (c.block_w != 64 && c.block_w != 128) return "block_w (weight rows, MMA M) must be 64 or 128";
    if (c.block_t != 8 && c.block_t != 16 && c.block_t != 32 && c.block_t != 64) {
      return "block_t (tokens, MMA N) must be 8, 16, 32 or 64";
    }
    if (c.block_k != 128 && c.block_k != 256) return "block_k must be 128 or 256";
    if (c.stages < kMinStages || c.stages > kMaxStages) return "stages must be 2..6";
    return nullptr;
  }

  FP4MOE_HD static constexpr W4A16Layout make(const W4A16Config& c) {
    W4A16Layout out{};
    out.config = c;
    out.invalid_reason = check(c);
    if (out.invalid_reason != nullptr) return out;
    out.x_tile_bytes = c.block_t * c.block_k * 2;
    out.w_packed_bytes = c.block_w * c.block_k / 2;
    out.w_scales_bytes = c.block_w * c.block_k / 16;
    SmemLayout& l = out.layout;
    for (uint32_t s = 0; s < c.stages; ++s) {
      const uint32_t x = l.add("stage x_tile (bf16 activations)", out.x_tile_bytes, 128, RegionKind::kStageOperand);
      const uint32_t w = l.add("stage w_packed (nvfp4 e2m1)", out.w_packed_bytes, 128, RegionKind::kStageOperand);
      const uint32_t sc = l.add("stage w_scales (e4m3 per 16)", out.w_scales_bytes, 128, RegionKind::kStageOperand);
      if (s == 0) {
        out.x_tile_offset = x;
        out.w_packed_offset = w;
        out.w_scales_offset = sc;
      } else if (s == 1) {
        out.stage_stride = x - out.x_tile_offset;
      }
    }
    if (c.stages == 1) out.stage_stride = l.total_bytes;
    out.epilogue_row_bytes = c.block_w * 2 + kEpilogueRowPad;
    out.epilogue_bytes = c.block_t * out.epilogue_row_bytes;
    out.epilogue_offset = l.add("epilogue tile (bf16 block_t x block_w, rows +16 B)", out.epilogue_bytes, 128,
                                RegionKind::kEpilogue);
    // Round the whole request to 128 B (the launcher asks for exactly this).
    const uint32_t end = round_up(l.total_bytes, 128);
    if (end != l.total_bytes) l.add("tail padding", end - l.total_bytes, 1, RegionKind::kPadding);
    return out;
  }
};

// The configurations the kernel is compiled for (the planner and autotuner pick among these by
// index). Decode (1..16 tokens per expert) wants small block_t; prefill the 64-token tiles. On an
// H200 (GLM-5 shard) m64n8k256_s4 was fastest for 1..8 tokens, m128n16k256_s4 for 16,
// m128n32k128_s4 for 32 and m128n64k128_s4 beyond; the k128 decode tiles (8 CTAs per SM) lost.
inline constexpr W4A16Config kW4A16Configs[] = {
    {64, 8, 128, 4},    // w4a16_swapab_m64n8k128_s4
    {64, 16, 128, 4},   // w4a16_swapab_m64n16k128_s4
    {64, 8, 256, 3},    // w4a16_swapab_m64n8k256_s3
    {64, 8, 256, 4},    // w4a16_swapab_m64n8k256_s4
    {128, 8, 256, 4},   // w4a16_swapab_m128n8k256_s4
    {128, 16, 256, 4},  // w4a16_swapab_m128n16k256_s4
    {128, 32, 128, 4},  // w4a16_swapab_m128n32k128_s4
    {128, 64, 128, 4},  // w4a16_swapab_m128n64k128_s4
    {64, 64, 128, 4},   // w4a16_swapab_m64n64k128_s4
};
inline constexpr int kNumW4A16Configs = static_cast<int>(sizeof(kW4A16Configs) / sizeof(kW4A16Configs[0]));

namespace detail {
constexpr bool all_configs_fit() {
  for (const W4A16Config& c : kW4A16Configs) {
    if (!W4A16Layout::make(c).fits(kSm90SmemOptinBytes)) return false;
  }
  return true;
}
}  // namespace detail
static_assert(detail::all_configs_fit(), "a shipped W4A16 config exceeds the sm_90 opt-in shared memory (232448 B)");

}  // namespace fp4moe::plan
