// Kernel-layout NVFP4 -> BF16 (see w4a16_dequant.h). One warp per (row tile, K chunk): each lane
// reads its 16 B of codes and its two scale bytes exactly as the GEMM's lanes do (the same
// w4a16_fragments.h helpers), forms the bf16x2 pairs e2m1 x e4m3 x 2^-8, and writes them scaled by
// 2^8 x gs at their rows and columns (w4a16_weight_layout.h's table).
#include "kernels/cuda/sm90/w4a16_dequant.h"

#include "core/error.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/sm90/w4a16_fragments.h"
#include "kernels/cuda/sm90/w4a16_weight_layout.h"

namespace fp4moe::cuda::sm90 {

namespace {

constexpr int kWarpsPerBlock = 8;

__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    w4a16_dequant_kernel(const uint8_t* __restrict__ codes, const uint8_t* __restrict__ scales, const float* gs_p,
                         const float* gs_up_p, int64_t expert, int32_t n, int32_t k, int32_t row_tiles,
                         int32_t k_chunks, int32_t k_groups, bool gate_up, __nv_bfloat16* __restrict__ out) {
  const int64_t tile = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
  if (tile >= static_cast<int64_t>(row_tiles) * k_chunks) return;
  const int rt = static_cast<int>(tile / k_chunks), kc = static_cast<int>(tile % k_chunks);
  const uint32_t lane = threadIdx.x & 31u, g = lane >> 2, t = lane & 3u;
  const int64_t et = expert * row_tiles + rt;
  const uint4 w = *reinterpret_cast<const uint4*>(codes + (et * k_chunks + kc) * kW4A16TileBytes + 16 * lane);
  const uint16_t pair = *reinterpret_cast<const uint16_t*>(
      scales + (et * k_groups + kc / static_cast<int>(kW4A16ScaleGroup)) * kW4A16TileBytes + 16 * lane +
      2 * (kc % static_cast<int>(kW4A16ScaleGroup)));
  uint32_t sc_lo = 0, sc_hi = 0;
  w4a16_pair_scales(pair, sc_lo, sc_hi);
  uint32_t a[4][4];
  w4a16_chunk_fragments(w, sc_lo, sc_hi, a);
  const float factor = __ldg(gs_p + expert) * static_cast<float>(1 << kW4A16AccShift);
  const float factor_up = (gs_up_p != nullptr ? __ldg(gs_up_p + expert) : __ldg(gs_p + expert)) *
                          static_cast<float>(1 << kW4A16AccShift);
  const int half_n = n / 2;
#pragma unroll
  for (int hi = 0; hi < 2; ++hi) {  // tile row g + 8 hi
    const int r = rt * 16 + static_cast<int>(g) + 8 * hi;
    int row = r;
    float f = factor;
    if (gate_up) {  // tile rows 0..7: gate rows 8 rt..; 8..15: up rows 8 rt..
      row = hi == 0 ? rt * 8 + static_cast<int>(g) : half_n + rt * 8 + static_cast<int>(g);
      f = hi == 0 ? factor : factor_up;
      if (rt * 8 + static_cast<int>(g) >= half_n) continue;
    } else if (r >= n) {
      continue;
    }
#pragma unroll
    for (int s = 0; s < 4; ++s) {
#pragma unroll
      for (int p = 0; p < 2; ++p) {  // a[s][hi + 2p]: k = 16 t + 4 s + 2 p + {0, 1}
        const int col = kc * 64 + static_cast<int>(16 * t) + 4 * s + 2 * p;
        if (col >= k) continue;
        const uint32_t v = a[s][hi + 2 * p];
        const float lo_f = __uint_as_float(v << 16), hi_f = __uint_as_float(v & 0xFFFF0000u);
        const __nv_bfloat162 o = __floats2bfloat162_rn(__fmul_rn(lo_f, f), __fmul_rn(hi_f, f));
        *reinterpret_cast<__nv_bfloat162*>(out + static_cast<int64_t>(row) * k + col) = o;
      }
    }
  }
}

}  // namespace

void w4a16_dequant_expert(const W4A16DequantArgs& a, cudaStream_t stream) {
  FP4MOE_CHECK(a.codes != nullptr && a.scales != nullptr && a.global_scales != nullptr && a.out != nullptr)
      << "w4a16_dequant_expert: null pointer";
  FP4MOE_CHECK(a.n > 0 && a.k > 0 && a.k % 16 == 0 && a.expert >= 0 && a.n < (int64_t{1} << 31) &&
               a.k < (int64_t{1} << 31))
      << "w4a16_dequant_expert: expert " << a.expert << ", n=" << a.n << ", k=" << a.k
      << " (k must be a positive multiple of 16, n positive, both < 2^31)";
  FP4MOE_CHECK(!a.gate_up || a.n % 16 == 0) << "w4a16_dequant_expert: gate_up n=" << a.n
                                            << " must be 2 I with I % 8 == 0 (n % 16 = " << a.n % 16 << ")";
  const int64_t row_tiles = w4a16_row_tiles(a.n), k_chunks = w4a16_k_chunks(a.k), k_groups = w4a16_k_groups(a.k);
  const int64_t tiles = row_tiles * k_chunks;
  const int64_t blocks = (tiles + kWarpsPerBlock - 1) / kWarpsPerBlock;
  FP4MOE_CHECK(blocks < (int64_t{1} << 31)) << "w4a16_dequant_expert: " << tiles << " tiles exceed the grid";
  w4a16_dequant_kernel<<<static_cast<unsigned>(blocks), kWarpsPerBlock * 32, 0, stream>>>(
      a.codes, a.scales, a.global_scales, a.global_scales_up, a.expert, static_cast<int32_t>(a.n),
      static_cast<int32_t>(a.k), static_cast<int32_t>(row_tiles), static_cast<int32_t>(k_chunks),
      static_cast<int32_t>(k_groups), a.gate_up, a.out);
  FP4MOE_CUDA_CHECK(cudaGetLastError());
}

}  // namespace fp4moe::cuda::sm90
