// Device pieces shared by the W4A16 kernels' translation units (w4a16_grouped_gemm.cu: kStream and
// kPipeline; w4a16_wgmma.cu: kWgmma): the kernel parameters, the work-item search over the expert
// offsets, the epilogue arithmetic, the split-K partial store and the shared-memory output tile.
// Included only by .cu files of this folder.
#pragma once

#include <cuda.h>  // CUtensorMap
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>
#include <cutlass/arch/barrier.h>  // NamedBarrier

#include <array>
#include <cstdint>
#include <utility>

#include "core/error.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/ptx.cuh"
#include "kernels/cuda/sm90/w4a16_weight_layout.h"
#include "plan/layout_sm90_w4a16.h"

namespace fp4moe::cuda::sm90::w4a16_detail {

struct KernelParams {
  const __nv_bfloat16* x;
  const int32_t* offsets;
  const uint8_t* w_codes;   // kernel layout
  const uint8_t* w_scales;  // kernel layout
  const float* global_scales;
  const float* global_scales_up;  // kSwiGlu: the up half's (== global_scales when shared)
  __nv_bfloat16* y;
  int32_t m_total, n, k, n_experts;
  int32_t row_tiles, k_chunks, k_groups;
  int32_t n_out;  // columns of y: n, or n / 2 with kSwiGlu
  int32_t groups_per_part;  // kStream split-K: scale groups per K part (blockIdx.z); k_groups when unsplit
  float* partial;           // split-K: f32 [parts, m_total, n] (nullptr: unsplit, y written directly)
  int32_t min_rows, max_rows;  // the expert row class: experts with other row counts have no work items
};

constexpr unsigned kFullMask = 0xFFFFFFFFu;

using ptx::cp_async_16;
using ptx::cp_async_ca;
using ptx::cp_async_commit;
using ptx::cp_async_wait;
using ptx::mma_bf16_m16n8k16;
using ptx::smem_u32;

struct WorkItem {
  int expert = 0;
  int row_begin = 0;  // first token row of the tile
  int rows = 0;       // valid token rows in the tile, 1..block_t
};

// Work item `work` (expert order, token tiles of block_t within an expert). False when `work` is
// past the last tile. Offsets are clamped to [0, m_total] so that bad offsets cannot make the
// kernel read or write out of bounds; no offsets (a dense Linear, E = 1): rows [0, m_total). Only
// experts of the launch's row class (p.min_rows .. p.max_rows rows) have tiles. Every lane of the
// calling warp gets the same answer.
template <int BLOCK_T>
__device__ __forceinline__ bool find_work(const KernelParams& p, int work, WorkItem& out) {
  if (p.offsets == nullptr) {
    out.expert = 0;
    out.row_begin = work * BLOCK_T;
    out.rows = min(BLOCK_T, p.m_total - out.row_begin);
    return out.row_begin < p.m_total;
  }
  const int lane = static_cast<int>(threadIdx.x & 31u);
  int remaining = work;
  for (int base = 0; base < p.n_experts; base += 32) {
    const int e = base + lane;
    int start = 0, end = 0;
    if (e < p.n_experts) {
      start = min(max(__ldg(p.offsets + e), 0), p.m_total);
      end = min(max(__ldg(p.offsets + e + 1), start), p.m_total);
    }
    const int rows = end - start;
    const int tiles = rows >= p.min_rows && rows <= p.max_rows ? (rows + BLOCK_T - 1) / BLOCK_T : 0;
    int incl = tiles;
#pragma unroll
    for (int d = 1; d < 32; d <<= 1) {
      const int v = __shfl_up_sync(kFullMask, incl, d);
      if (lane >= d) incl += v;
    }
    const int total = __shfl_sync(kFullMask, incl, 31);
    if (remaining < total) {
      // The first expert whose inclusive count passes `remaining` has tiles > 0.
      const unsigned hit = __ballot_sync(kFullMask, incl > remaining);
      const int src = __ffs(static_cast<int>(hit)) - 1;
      const int before = __shfl_sync(kFullMask, incl - tiles, src);
      const int e_start = __shfl_sync(kFullMask, start, src);
      const int e_end = __shfl_sync(kFullMask, end, src);
      out.expert = base + src;
      out.row_begin = e_start + (remaining - before) * BLOCK_T;
      out.rows = min(BLOCK_T, e_end - out.row_begin);
      return true;
    }
    remaining -= total;
  }
  return false;
}

// Epilogue factors: the A registers carry 2^-8 (kW4A16AccShift).
__device__ __forceinline__ float epilogue_scale(const float* global_scales, int expert) {
  return __ldg(global_scales + expert) * static_cast<float>(1 << kW4A16AccShift);
}

// SwiGLU of one (gate, up) accumulator pair, f32: silu(g) * u (moe/mlp.cpp's formula).
__device__ __forceinline__ float swiglu(float gate, float up) { return gate / (1.0f + __expf(-gate)) * up; }

// Split-K: a warp's f32 sums of its row tile `row_tile` (C fragment: rows 16 row_tile + g (+8), tokens
// 8 nt + 2 t (+1)) into this part's plane of the workspace, x f (rows g) and fu (rows g + 8: with the
// SwiGLU epilogue the up rows), for w4a16_splitk_reduce_kernel.
template <uint32_t kNTiles>
__device__ __forceinline__ void store_partial(const KernelParams& p, const WorkItem& item, int row_tile, uint32_t lane,
                                              const float (&acc)[kNTiles][4], float f, float fu) {
  float* part = p.partial + static_cast<int64_t>(blockIdx.z) * p.m_total * p.n;
  const int row0 = row_tile * 16 + static_cast<int>(lane >> 2), t = static_cast<int>(lane & 3u);
#pragma unroll
  for (uint32_t nt = 0; nt < kNTiles; ++nt) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int tok = static_cast<int>(nt * 8) + 2 * t + (i & 1);
      const int row = row0 + 8 * (i >> 1);
      if (tok < item.rows && row < p.n) {
        part[static_cast<int64_t>(item.row_begin + tok) * p.n + row] = acc[nt][i] * (i >> 1 ? fu : f);
      }
    }
  }
}

// The end of the shared-memory kernels (kPipeline, kWgmma): warp `warp` of the CTA holds, for
// m-block b < kMB, the C fragments of row tile rt0 + warp + 8 b (rows g / g + 8 = weight rows,
// columns 2t, 2t + 1 = tokens of n8 tile j) in acc[b][j]. Split-K: the f32 parts go to the workspace.
// Otherwise the tile goes token-major through shared memory at `epi` (BLOCK_T rows of kEpiRow bytes;
// the caller has made it free) and out with 16 B stores; kSwiGlu: silu(gate row g) * up row g + 8 ->
// column 8 x (row tile) + g. `tid` counts the kThreads threads of the CTA, which all hold accumulators.
// kNamedBarrier > 0: the kThreads threads sync on cutlass::arch::NamedBarrier kNamedBarrier - 1 (a CTA
// with other warps, e.g. a producer that has exited) instead of __syncthreads.
template <uint32_t BLOCK_W, uint32_t BLOCK_T, uint32_t kThreads, uint32_t kEpiRow, bool SWIGLU, uint32_t kMB = 1,
          uint32_t kNamedBarrier = 0>
__device__ __forceinline__ void write_output_tile(const KernelParams& p, const WorkItem& item, int rt0, uint32_t tid,
                                                  const float (&acc)[kMB][BLOCK_T / 8][4], uint8_t* epi) {
  constexpr uint32_t kNTiles = BLOCK_T / 8;
  constexpr uint32_t kOutCols = SWIGLU ? BLOCK_W / 2 : BLOCK_W;
  const uint32_t lane = tid & 31u, warp = tid >> 5;
  const float f = epilogue_scale(p.global_scales, item.expert);
  const uint32_t g = lane >> 2, t = lane & 3u;
  const float fu = SWIGLU ? epilogue_scale(p.global_scales_up, item.expert) : f;
  if (p.partial != nullptr) {
#pragma unroll
    for (uint32_t b = 0; b < kMB; ++b) store_partial<kNTiles>(p, item, rt0 + static_cast<int>(warp + 8 * b), lane, acc[b], f, fu);
    return;
  }
  auto put = [&](uint32_t tk, uint32_t col, float v) {
    *reinterpret_cast<__nv_bfloat16*>(epi + tk * kEpiRow + col * 2) = __float2bfloat16_rn(v);
  };
#pragma unroll
  for (uint32_t b = 0; b < kMB; ++b) {
    const uint32_t rtl = warp + 8 * b;  // row tile within the CTA
#pragma unroll
    for (uint32_t j = 0; j < kNTiles; ++j) {
      const uint32_t tok = j * 8 + 2 * t;
      if constexpr (SWIGLU) {
        put(tok, rtl * 8 + g, swiglu(acc[b][j][0] * f, acc[b][j][2] * fu));
        put(tok + 1, rtl * 8 + g, swiglu(acc[b][j][1] * f, acc[b][j][3] * fu));
      } else {
        const uint32_t wr = rtl * 16 + g;
        put(tok, wr, acc[b][j][0] * f);
        put(tok + 1, wr, acc[b][j][1] * f);
        put(tok, wr + 8, acc[b][j][2] * f);
        put(tok + 1, wr + 8, acc[b][j][3] * f);
      }
    }
  }
  if constexpr (kNamedBarrier == 0) {
    __syncthreads();
  } else {
    cutlass::arch::NamedBarrier::sync(kThreads, kNamedBarrier - 1);
  }
  const int64_t n0 = static_cast<int64_t>(rt0) * (SWIGLU ? 8 : 16);
  constexpr uint32_t kOutChunks = BLOCK_T * kOutCols / 8;  // 16 B = 8 outputs
#pragma unroll
  for (uint32_t i = tid; i < kOutChunks; i += kThreads) {
    const uint32_t r = i / (kOutCols / 8), c = i % (kOutCols / 8);
    const int64_t n = n0 + c * 8;
    if (static_cast<int>(r) < item.rows && n < p.n_out) {
      *reinterpret_cast<uint4*>(p.y + static_cast<int64_t>(item.row_begin + static_cast<int>(r)) * p.n_out + n) =
          *reinterpret_cast<const uint4*>(epi + r * kEpiRow + c * 16);
    }
  }
}

// The wgmma kinds' scales: a lane's 16 B of the scale group of each of its kMB row tiles
// (rt_first + 8 b), the current group and the next one in registers. Row tiles past N (ok[b] false)
// read nothing and hold zeros.
template <uint32_t kMB>
struct ScaleGroups {
  const uint8_t* at[kMB];  // group 0 of row tile b, this lane's 16 B
  bool ok[kMB];
  uint4 cur[kMB], next[kMB];

  // Groups kg0 and kg0 + 1 (< kg1) of expert `expert`'s row tiles rt_first + 8 b.
  __device__ __forceinline__ void start(const KernelParams& p, int expert, int rt_first, uint32_t lane, int kg0, int kg1) {
#pragma unroll
    for (uint32_t b = 0; b < kMB; ++b) {
      const int rt = rt_first + static_cast<int>(8 * b);
      ok[b] = rt < p.row_tiles;
      const int64_t tile = static_cast<int64_t>(expert) * p.row_tiles + (ok[b] ? rt : 0);
      at[b] = p.w_scales + tile * p.k_groups * kW4A16TileBytes + lane * 16;
      cur[b] = ok[b] ? load(b, kg0) : make_uint4(0, 0, 0, 0);
      next[b] = ok[b] && kg0 + 1 < kg1 ? load(b, kg0 + 1) : make_uint4(0, 0, 0, 0);
    }
  }
  // After group kg: the next becomes current, group kg + 2 (< kg1) is fetched.
  __device__ __forceinline__ void advance(int kg, int kg1) {
#pragma unroll
    for (uint32_t b = 0; b < kMB; ++b) {
      cur[b] = next[b];
      if (ok[b] && kg + 2 < kg1) next[b] = load(b, kg + 2);
    }
  }
  __device__ __forceinline__ uint4 load(uint32_t b, int kg) const {
    return __ldg(reinterpret_cast<const uint4*>(at[b] + static_cast<int64_t>(kg) * kW4A16TileBytes));
  }
};

// Keeps the compiler from moving the N accumulator registers at d while a wgmma may still write them
// (CuTe's warpgroup_fence_operand, for a whole fragment).
template <size_t N>
__device__ __forceinline__ void fence_accumulators(float* d) {
#pragma unroll
  for (size_t i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// Launches `kernel(args...)` on `grid` x `threads` with `smem_bytes` of dynamic shared memory (opting in
// first).
template <class Kernel, class... Args>
void launch_with_smem(Kernel kernel, uint32_t smem_bytes, uint32_t threads, dim3 grid, cudaStream_t stream,
                      const Args&... args) {
  FP4MOE_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem_bytes)));
  kernel<<<grid, threads, smem_bytes, stream>>>(args...);
  FP4MOE_CUDA_CHECK(cudaGetLastError());
}

// The launch table of one kernel kind's translation unit over every config id: entry I runs
// Launcher<I, SWIGLU>::run(p, grid, stream) when config I is of kind KIND (only those get their
// kernels instantiated) and fails otherwise (the dispatcher routes a config to its kind's table).
using KindLaunchFn = void (*)(const KernelParams&, dim3, cudaStream_t);
template <plan::W4A16Kind KIND, template <int, bool> class Launcher>
class KindLaunchTable {
  template <int I, bool SWIGLU>
  static void one(const KernelParams& p, dim3 grid, cudaStream_t stream) {
    if constexpr (plan::kW4A16Configs[I].kind == KIND) {
      Launcher<I, SWIGLU>::run(p, grid, stream);
    } else {
      FP4MOE_FAIL() << "sm90_nvfp4_w4a16_grouped_gemm: config id " << I << " is not of this kernel's kind";
    }
  }
  template <bool SWIGLU, int... I>
  static constexpr std::array<KindLaunchFn, sizeof...(I)> make(std::integer_sequence<int, I...>) {
    return {&one<I, SWIGLU>...};
  }

 public:
  static void launch(int config_id, bool swiglu, const KernelParams& p, dim3 grid, cudaStream_t stream) {
    static constexpr auto kPlain = make<false>(std::make_integer_sequence<int, plan::kNumW4A16Configs>{});
    static constexpr auto kSwiGlu = make<true>(std::make_integer_sequence<int, plan::kNumW4A16Configs>{});
    (swiglu ? kSwiGlu : kPlain)[static_cast<size_t>(config_id)](p, grid, stream);
  }
};

// Launches config `config_id` (a kWgmma config of kW4A16Configs) on `grid` (w4a16_wgmma.cu).
void launch_wgmma(int config_id, bool swiglu, const KernelParams& p, dim3 grid, cudaStream_t stream);
// The TMA descriptor of the activations x [m_total, K] for a block_t-token box of 64 k (128B swizzle,
// zeros out of bounds); w4a16_wgmma.cu.
CUtensorMap make_x_map(const KernelParams& p, uint32_t block_t);

}  // namespace fp4moe::cuda::sm90::w4a16_detail
