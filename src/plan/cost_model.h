// The planner's cost model: a roofline per candidate tile for one grouped GEMM. Deliberately
// simple and documented (docs/planner.md, "Cost model"); it only has to order candidates sensibly:
//
//   tiles      = groups x ceil(m / token_tile) x ceil(n / weight_tile)     (m: tokens per group)
//   waves      = ceil(tiles / n_sms)                    (one CTA per SM: these tiles fill the SMEM)
//   tile_time  = max(2 x token_tile x weight_tile x K / (eff x peak / n_sms), (MMA, padded tile)
//                    tile operand bytes / (kL2FeedFactor x HBM / n_sms))    (feeding SMEM from L2)
//   dequant    = waves x weight_tile x K x dequant_cost / (peak / n_sms)   (ours: the in-kernel NVFP4 ->
//                    BF16 conversion, once per weight per token tile; 0 for the CUTLASS families)
//   mem_time   = (weights + scales + activations + outputs) / HBM       (re-reads hit L2: feed term)
//   time       = max(waves x tile_time, dequant, mem_time)
// Ranking: time; ties (both HBM- or dequant-bound) go to less padding waste, then to the smaller
// on-chip time waves x tile_time, then to more SMEM margin.
//
// eff = kernel_mma_efficiency: the fraction of the tensor peak a kernel kind reaches when MMA-bound
// (measured on the H200 for ours, BENCHMARKS.md ninth session; 1 for the CUTLASS families).
// Padding waste (rows of the token tile with no token) raises the MMA term; small tiles raise the
// feed term; so swap-AB / small-N tiles win when an expert has 1-64 tokens and big tiles win when
// it has hundreds. Tested by tests/plan/test_planner.cpp.
#pragma once

#include <cstdint>
#include <string>

#include "plan/gpu_table.h"
#include "plan/kernel_families.h"

namespace fp4moe::plan {

// L2 -> SMEM bandwidth available to the SMs, as a multiple of HBM bandwidth (Hopper/Blackwell L2
// delivers roughly 2-3x HBM; the planner only needs the ratio between candidates).
inline constexpr double kL2FeedFactor = 2.5;

// The fraction of the BF16 tensor peak ours reaches when MMA-bound (H200, bench_w4a16 at 256-512 tokens
// per expert): the mma.sync tiles (16 weight rows a warp, activations re-read by every warp) ~0.25, the
// wgmma tiles ~0.85 (0.80-0.88 since the eleventh session's TMA activation loads; 0.55 before). The
// CUTLASS families: 1 (their tiles are what the peak is measured with).
inline constexpr double kMmaSyncEfficiency = 0.25;
inline constexpr double kWgmmaEfficiency = 0.85;
double kernel_mma_efficiency(const TileCandidate& c);

// What dequantizing one weight costs ours, in FLOPs of an SM's share of the GPU table's dense BF16 peak
// (so it scales with the GPU like the MMA term; 989 TFLOP/s for the H200), measured on the H200 where a
// kind's time is flat in the token count (the per-weight work bounds it): the streaming tiles 190
// (gate_up / down at 16 tokens a expert, one token tile: 195 / 199; 20 tokens, two tiles: 170), the
// pipelined mma.sync tiles 380 (m128n32k128 at 32 tokens), the wgmma tiles 325 (m128n32 at 32 tokens:
// 319 / 346, m128n64 at 64: 311; BENCHMARKS.md, seventeenth session, runs 1 and 3). This is why no wgmma
// tile beats the streaming kernel at 16 tokens a expert though it needs a quarter of the MMA time. The
// CUTLASS families: 0 (FP4 tensor cores, no conversion).
inline constexpr double kStreamDequantFlops = 190;
inline constexpr double kPipelineDequantFlops = 380;
inline constexpr double kWgmmaDequantFlops = 325;
double kernel_dequant_flops(const TileCandidate& c);

// One grouped GEMM: n_groups independent [m x K] x [K x n] products (one per active expert).
struct GemmProblem {
  std::string name;          // "gemm1 (gate+up)", "gemm2 (down)", "gemm"
  int64_t n_groups = 1;      // experts that received tokens
  double m = 1;              // tokens per group (mean; the model uses ceil)
  int64_t n = 0;             // output features (weight rows)
  int64_t k = 0;             // reduction dim
  bool finalize = false;     // GEMM2 of a MoE (CUTLASS FINALIZE epilogue applies)
  int64_t total_tokens = 0;  // tokens of the batch this GEMM serves (for reports)
};

struct CostEstimate {
  int64_t tiles = 0;
  int64_t waves = 0;
  double padded_flops = 0, useful_flops = 0;
  double padding_waste = 0;    // 1 - useful / padded
  double bytes = 0;            // HBM traffic
  double mma_time_us = 0, feed_time_us = 0, dequant_time_us = 0, mem_time_us = 0;
  double time_us = 0;          // the estimate used for ranking
  double onchip_time_us = 0;   // max(mma, feed): a tie-break when HBM or the dequantization bounds both
  std::string bound;           // "mma", "smem-feed", "dequant" or "hbm"
};

CostEstimate estimate_cost(const TileCandidate& c, const GemmProblem& p, const GpuSpec& gpu);

}  // namespace fp4moe::plan
