// Roofline cost per candidate tile (see cost_model.h for the formulas). Tested by
// tests/plan/test_planner.cpp.
#include "plan/cost_model.h"

#include <algorithm>
#include <cmath>

namespace fp4moe::plan {
namespace {

constexpr double kNvfp4BytesPerElement = 0.5 + 1.0 / 16.0;  // e2m1 + one e4m3 scale per 16
constexpr double kBf16Bytes = 2.0;

}  // namespace

double kernel_mma_efficiency(const TileCandidate& c) {
  if (c.family != KernelFamily::kSm90W4A16) return 1.0;
  switch (c.ours.kind) {
    case W4A16Kind::kWgmma:
      return kWgmmaEfficiency;
    default:
      return kMmaSyncEfficiency;
  }
}

double kernel_dequant_flops(const TileCandidate& c) {
  if (c.family != KernelFamily::kSm90W4A16) return 0;
  switch (c.ours.kind) {
    case W4A16Kind::kWgmma:
      return kWgmmaDequantFlops;
    case W4A16Kind::kStream:
      return kStreamDequantFlops;
    default:
      return kPipelineDequantFlops;
  }
}

CostEstimate estimate_cost(const TileCandidate& c, const GemmProblem& p, const GpuSpec& gpu) {
  CostEstimate e;
  const double m = std::max(1.0, std::ceil(p.m));
  const double tok = c.token_tile(), wt = c.weight_tile();
  const double k = static_cast<double>(p.k), n = static_cast<double>(p.n);
  const double m_tiles = std::ceil(m / tok), n_tiles = std::ceil(n / wt);
  e.tiles = static_cast<int64_t>(p.n_groups * m_tiles * n_tiles);
  const int n_sms = std::max(1, gpu.n_sms);
  e.waves = (e.tiles + n_sms - 1) / n_sms;
  e.padded_flops = 2.0 * p.n_groups * m_tiles * tok * n_tiles * wt * k;
  e.useful_flops = 2.0 * p.n_groups * p.m * n * k;
  e.padding_waste = e.padded_flops > 0 ? 1.0 - e.useful_flops / e.padded_flops : 0;

  // Ours multiplies BF16 (activations stay BF16, weights are dequantized in registers); the CUTLASS
  // families multiply NVFP4 x NVFP4 on the block-scaled FP4 tensor cores.
  const bool fp4_mma = c.family != KernelFamily::kSm90W4A16;
  const double peak_tflops = fp4_mma && gpu.fp4_dense_tflops > 0 ? gpu.fp4_dense_tflops : gpu.bf16_dense_tflops;
  const double act_bytes = fp4_mma ? kNvfp4BytesPerElement : kBf16Bytes;
  const double per_sm_flops = kernel_mma_efficiency(c) * peak_tflops * 1e12 / n_sms;
  const double per_sm_feed = kL2FeedFactor * gpu.hbm_gbps * 1e9 / n_sms;

  const double tile_flops = 2.0 * tok * wt * k;
  const double tile_bytes = (tok * act_bytes + wt * kNvfp4BytesPerElement) * k;
  const double tile_mma_s = per_sm_flops > 0 ? tile_flops / per_sm_flops : 0;
  const double tile_feed_s = per_sm_feed > 0 ? tile_bytes / per_sm_feed : 0;
  e.mma_time_us = e.waves * tile_mma_s * 1e6;
  e.feed_time_us = e.waves * tile_feed_s * 1e6;
  // Every tile dequantizes its weight_tile x K weights (the token tiles of one weight tile each again).
  const double peak_per_sm = peak_tflops * 1e12 / n_sms;
  e.dequant_time_us = peak_per_sm > 0 ? e.waves * wt * k * kernel_dequant_flops(c) / peak_per_sm * 1e6 : 0;

  // HBM: every weight once, activations once (a group's activations are small and re-read by its
  // weight-tile columns from L2: that traffic is in the feed term), outputs once (bf16).
  e.bytes = p.n_groups * (n * k * kNvfp4BytesPerElement + m * k * act_bytes + m * n * kBf16Bytes);
  e.mem_time_us = gpu.hbm_gbps > 0 ? e.bytes / (gpu.hbm_gbps * 1e9) * 1e6 : 0;

  e.onchip_time_us = std::max(e.mma_time_us, e.feed_time_us);
  e.time_us = std::max({e.onchip_time_us, e.dequant_time_us, e.mem_time_us});
  e.bound = e.time_us == e.mem_time_us       ? "hbm"
            : e.time_us == e.dequant_time_us ? "dequant"
            : e.time_us == e.mma_time_us     ? "mma"
                                             : "smem-feed";
  return e;
}

}  // namespace fp4moe::plan
