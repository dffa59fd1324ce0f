// Host-only arithmetic of moe::GpuMoeLayer (moe/gpu_moe_layer.h), kept free of CUDA so that the CPU
// tests check it: the scratch buffers' sizes against what every kernel of forward(n_tokens) writes
// (GpuMoeScratchPlan), and the tokens per expert the W4A16 GEMM config is chosen for
// (gpu_moe_tokens_per_expert). Tested by tests/moe/test_gpu_route_math.cpp (CPU).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"

namespace fp4moe::moe {

// Tokens per expert to pick the grouped GEMM's token tile for (w4a16_default_config), when n_tokens
// tokens each go to top_k of n_experts experts; the host does not know the histogram (forward()
// never synchronizes).
// Routed experts: the mean, ceil(n_tokens * top_k / E). A tile of the mean splits every expert above
// the mean into two tiles (GLM-5 shard, 64 tokens, top-8 of 32: the count is Binomial(64, 1/4), 43%
// of the experts exceed 16 rows, 1.43 tiles per expert), but the kernel is bound by dequantization
// work per tile and a 32-token tile costs more than 1.43 16-token ones on the H200 numbers we have
// (BENCHMARKS.md: pipelined m128n32 576 us vs ~340 x 1.43 = 486 us for the streaming n16 tiles).
// The shared expert (E = 1): one expert's weights, so the grid is ceil(n / block_t) x ceil(N /
// block_w) CTAs only; the 64-token tile gives 32 CTAs for N = 4096 on 132 SMs, one wave whose
// length is one CTA's whole K loop (~70 us from the same table), while 16-token tiles give 4 x 64 =
// 256 CTAs doing ~4 x 7 us of full-GPU work. Up to 128 tokens the 16-token tile is used (or n itself
// when smaller); above, the larger tiles fill the GPU and win.
inline int64_t gpu_moe_tokens_per_expert(int64_t n_tokens, int64_t top_k, int64_t n_experts) {
  FP4MOE_CHECK(n_tokens >= 0 && top_k >= 1 && n_experts >= 1)
      << "gpu_moe_tokens_per_expert: n_tokens=" << n_tokens << ", top_k=" << top_k << ", n_experts=" << n_experts;
  constexpr int64_t kSharedSmallTile = 16, kSharedSmallMax = 128;
  const int64_t rows = n_tokens * top_k;
  if (n_experts == 1) return rows <= kSharedSmallMax ? std::clamp<int64_t>(rows, 1, kSharedSmallTile) : rows;
  return std::max<int64_t>(1, (rows + n_experts - 1) / n_experts);
}

// One launch of the routed GEMMs over the experts with min_rows..max_rows rows (GpuMoeLayer's row classes).
struct GpuMoeRowClass {
  int config_id = 0;
  int32_t min_rows = 0, max_rows = std::numeric_limits<int32_t>::max();
};

// The row classes of the routed GEMMs when the routed config (c0, token tile t0) is chosen for the
// mean rows per expert and n_tokens tokens each pick an expert at most once: experts with at most t0
// rows on c0; above, a ladder of doubling tiles, `tile(rows)` (-> {config id, token tile}: the
// kernels' default config for that many rows) for 2 t0, 4 t0, ... while below the top tile, the top
// tile being tile(clamp(4 t0, 64, 256)); a class only while an expert can reach it (n_tokens rows).
// The ladder: an expert just above the mean (GLM-5 shard, batch 64: 17-30 rows over a 16-token tile)
// runs on the 32-token tile, not the 64-token one, whose time is flat in the token count (the
// dequantization bounds it: BENCHMARKS.md, seventeenth session, run 3). One class when n_tokens <= t0.
// At most 4 classes: token tiles are >= 8 and the top one <= max(64, 4 t0), so 8 -> 16, 32 below 64.
inline constexpr size_t kGpuMoeMaxRowClasses = 4;
template <class Tile>
std::vector<GpuMoeRowClass> gpu_moe_row_class_ladder(int c0, int32_t t0, int64_t n_tokens, Tile tile) {
  if (n_tokens <= t0) return {GpuMoeRowClass{c0}};
  const std::pair<int, int32_t> top = tile(std::min<int64_t>(256, std::max<int64_t>(64, 4 * int64_t{t0})));
  if (top.second <= t0) return {GpuMoeRowClass{c0}};
  std::vector<GpuMoeRowClass> out{GpuMoeRowClass{c0, 0, t0}};
  int32_t below = t0;  // the largest rows the classes so far take
  while (n_tokens > below) {
    const std::pair<int, int32_t> next = tile(2 * int64_t{below});
    if (next.second <= below || next.second >= top.second) break;
    out.push_back(GpuMoeRowClass{next.first, below + 1, next.second});
    below = next.second;
  }
  if (n_tokens > below) out.push_back(GpuMoeRowClass{top.first, below + 1});
  return out;
}

// Rows per expert (the routed experts' mean, or the rows of a dense Linear / the shared expert) from
// which an NVFP4 GEMM dequantizes the weights to BF16 (cuda::sm90::w4a16_dequant_expert) and runs
// cuBLAS instead of the W4A16 grouped GEMM. The dequantization costs ~2.56 B of HBM traffic per
// weight (~23 us per GLM-5 expert on an H200, ~0.74 ms for the 32-expert shard's gate_up + down).
// Since the TMA wgmma tiles (BENCHMARKS.md, eleventh session) W4A16 runs at 0.86-0.94x cuBLAS at
// 256-512 rows per expert: on the shard gate_up + down take 3.62 us per row per expert (1.85 ms at
// 512) against cuBLAS's 3.25 (1.66 ms), so dequant + cuBLAS (0.74 ms + 3.25 us x R) wins only from
// R ~ 2000 rows per expert: 2048 (it was 384 when W4A16 ran at ~0.6x). Only eager steps take that
// path (it reads the expert offsets on the host); decode steps stay on the W4A16 GEMM, below the
// threshold and capturable.
inline constexpr int64_t kNvfp4DequantMinRows = 2048;
inline bool gpu_moe_dequant_path(int64_t n_tokens, int64_t top_k, int64_t n_experts) {
  return n_experts >= 1 && (n_tokens * top_k + n_experts - 1) / n_experts >= kNvfp4DequantMinRows;
}

// The scratch of a GpuMoeLayer for T = max_tokens (R = T * top_k routed rows) and the elements each
// kernel of forward(n_tokens) writes into it. `bf16_gate_up`: the cuBLAS GEMMs (the kBf16Cublas peer,
// and the NVFP4 layer's dequantized prefill path when max_tokens can reach it), whose gate_up writes
// [R, 2I] (and [T, 2Is] for the shared expert) before the swiglu kernel; the W4A16 GEMM has the
// SwiGLU in its epilogue and writes act [R, I] directly.
struct GpuMoeScratchPlan {
  int64_t max_tokens = 0, top_k = 0, n_experts = 0, hidden = 0, inter = 0, shared_inter = 0;
  bool has_shared = false;
  bool bf16_gate_up = false;

  struct Sizes {
    int64_t logits = 0;      // f32 [T, E]
    int64_t topk = 0;        // topk_idx (i32) and topk_weights (f32), [T, k] each
    int64_t offsets = 0;     // i32 [E + 1]
    int64_t rows = 0;        // row_token and entry_of, i32 [R] each
    int64_t xp = 0;          // bf16 [R, H] gathered rows
    int64_t gu = 0;          // bf16 [R, 2I] (bf16_gate_up only)
    int64_t act = 0;         // bf16 [R, I]
    int64_t down_out = 0;    // bf16 [R, H]
    int64_t shared_gu = 0;   // bf16 [T, 2Is] (bf16_gate_up with a shared expert only)
    int64_t shared_act = 0;  // bf16 [T, Is]
    int64_t shared_out = 0;  // bf16 [T, H]
  };

  // Elements forward(n) writes (n = max_tokens gives the capacity the buffers are allocated with).
  Sizes writes(int64_t n) const {
    Sizes s;
    const int64_t r = n * top_k;
    s.logits = n * n_experts;                    // router_logits
    s.topk = n * top_k;                          // route_topk
    s.offsets = n_experts + 1;                   // dispatch_plan
    s.rows = r;                                  // dispatch_plan
    s.xp = r * hidden;                           // gather_rows
    s.gu = bf16_gate_up ? r * 2 * inter : 0;     // cuBLAS gate_up
    s.act = r * inter;                           // SwiGLU epilogue / swiglu kernel
    s.down_out = r * hidden;                     // down GEMM
    if (has_shared) {
      s.shared_gu = bf16_gate_up ? n * 2 * shared_inter : 0;
      s.shared_act = n * shared_inter;
      s.shared_out = n * hidden;
    }
    return s;
  }
  Sizes capacity() const { return writes(max_tokens); }

  // Throws naming the buffer and the numbers unless every write of forward(n) fits its buffer
  // (and 0 <= n <= max_tokens).
  void check(int64_t n) const {
    FP4MOE_CHECK(n >= 0 && n <= max_tokens) << "GpuMoeScratchPlan: n_tokens=" << n << " outside [0, " << max_tokens << "]";
    const Sizes cap = capacity(), w = writes(n);
    auto fits = [&](const char* name, int64_t written, int64_t size) {
      FP4MOE_CHECK(written >= 0 && written <= size)
          << "GpuMoeScratchPlan: forward(" << n << ") writes " << written << " elements of " << name << " ["
          << size << "] (max_tokens " << max_tokens << ", top_k " << top_k << ", E " << n_experts << ", H " << hidden
          << ", I " << inter << ", Is " << shared_inter << ")";
    };
    fits("logits", w.logits, cap.logits);
    fits("topk", w.topk, cap.topk);
    fits("offsets", w.offsets, cap.offsets);
    fits("rows", w.rows, cap.rows);
    fits("xp", w.xp, cap.xp);
    fits("gu", w.gu, cap.gu);
    fits("act", w.act, cap.act);
    fits("down_out", w.down_out, cap.down_out);
    fits("shared_gu", w.shared_gu, cap.shared_gu);
    fits("shared_act", w.shared_act, cap.shared_act);
    fits("shared_out", w.shared_out, cap.shared_out);
  }
};

}  // namespace fp4moe::moe
