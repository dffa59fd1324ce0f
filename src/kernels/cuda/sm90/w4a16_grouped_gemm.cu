// sm90_nvfp4_w4a16_grouped_gemm, version 1: the kernel and its launcher (API and design in
// w4a16_grouped_gemm.h, register-level pieces in w4a16_fragments.h, shared memory in
// plan/layout_sm90_w4a16.h, the layout the planner sizes the configs with).
//
// One CTA computes a block_w (weight rows) x block_t (tokens) output tile of one expert over the
// whole K. blockIdx.y picks the weight tile, blockIdx.x the work item: the (expert, token tile)
// pairs in expert order, found on the device by a warp-wide prefix sum over the tile counts
// ceil(tokens_e / block_t) (every warp computes it redundantly: no barrier, no shared memory).
// Warp w owns weight rows 16w..16w+15 (one m16 tile) and all block_t tokens (block_t / 8 n8 tiles).
//
// Pipeline: `stages` cp.async groups in flight (activations, packed codes, scales of one block_k
// slice), wait_group(stages - 2) + __syncthreads before a slice is read, the refill of the slot
// consumed one iteration earlier issued before the MMAs. Out-of-range rows (tokens past the
// expert's count, weight rows past N) and K past the end are zero-filled by cp.async (src-size 0),
// so no NaN from uninitialized shared memory can reach the accumulators.
//
// Epilogue: acc x global scale (f32) -> bf16, transposed through shared memory to token-major rows
// and written with 16 B stores.
// Registers: __launch_bounds__ asks for w4a16_ctas_per_sm CTAs per SM (as many as the shared
// memory allows, never below 64 registers per thread); ptxas must not spill (a build error).
// Tested by tests/kernels/test_cuda_w4a16.cpp.
#include <algorithm>
#include <array>
#include <utility>

#include "core/error.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/sm90/w4a16_fragments.h"
#include "kernels/cuda/sm90/w4a16_grouped_gemm.h"
#include "plan/layout_sm90_w4a16.h"

namespace fp4moe::cuda::sm90 {

namespace {

struct KernelParams {
  const __nv_bfloat16* x;
  const int32_t* offsets;
  const uint8_t* w_packed;
  const uint8_t* w_scales;
  const float* global_scales;
  __nv_bfloat16* y;
  int32_t m_total, n, k, n_experts;
};

constexpr unsigned kFullMask = 0xFFFFFFFFu;

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16 B global -> shared copy; zero-fills the destination when !valid (src-size 0 reads nothing).
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src, bool valid) {
  const int src_size = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_size) : "memory");
}
__device__ __forceinline__ void cp_async_4(uint32_t dst, const void* src, bool valid) {
  const int src_size = valid ? 4 : 0;
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(src_size) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// D = A x B + D, m16n8k16, bf16 inputs, f32 accumulators (PTX fragment layouts).
__device__ __forceinline__ void mma_bf16_m16n8k16(float d[4], const uint32_t a[4], const uint32_t b[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

struct WorkItem {
  int expert = 0;
  int row_begin = 0;  // first token row of the tile
  int rows = 0;       // valid token rows in the tile, 1..block_t
};

// Work item `work` (expert order, token tiles of block_t within an expert). False when `work` is
// past the last tile. Offsets are clamped to [0, m_total] so that bad offsets cannot make the
// kernel read or write out of bounds. Every lane of the calling warp gets the same answer.
template <int BLOCK_T>
__device__ __forceinline__ bool find_work(const KernelParams& p, int work, WorkItem& out) {
  const int lane = static_cast<int>(threadIdx.x & 31u);
  int remaining = work;
  for (int base = 0; base < p.n_experts; base += 32) {
    const int e = base + lane;
    int start = 0, end = 0;
    if (e < p.n_experts) {
      start = min(max(__ldg(p.offsets + e), 0), p.m_total);
      end = min(max(__ldg(p.offsets + e + 1), start), p.m_total);
    }
    const int tiles = (end - start + BLOCK_T - 1) / BLOCK_T;
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

template <uint32_t BLOCK_W, uint32_t BLOCK_T, uint32_t BLOCK_K, uint32_t STAGES>
__global__ void __launch_bounds__(BLOCK_W / 16 * 32,
                                  w4a16_ctas_per_sm(W4A16Config{BLOCK_W, BLOCK_T, BLOCK_K, STAGES},
                                                    W4A16Layout::make(W4A16Config{BLOCK_W, BLOCK_T, BLOCK_K, STAGES}).total_bytes()))
    sm90_nvfp4_w4a16_grouped_gemm_kernel(const KernelParams p) {
  constexpr W4A16Layout kLayout = W4A16Layout::make(W4A16Config{BLOCK_W, BLOCK_T, BLOCK_K, STAGES});
  static_assert(kLayout.fits(kSm90SmemOptinBytes), "config exceeds the sm_90 opt-in shared memory");
  constexpr uint32_t kXOff = kLayout.x_tile_offset, kWOff = kLayout.w_packed_offset;
  constexpr uint32_t kSOff = kLayout.w_scales_offset, kStride = kLayout.stage_stride;
  constexpr uint32_t kEpiOff = kLayout.epilogue_offset, kEpiRow = kLayout.epilogue_row_bytes;
  constexpr uint32_t kThreads = BLOCK_W / 16 * 32;
  constexpr uint32_t kNTiles = BLOCK_T / 8;
  static_assert(BLOCK_K % 64 == 0 && BLOCK_W % 16 == 0 && BLOCK_T % 8 == 0, "tile shape");

  extern __shared__ __align__(128) uint8_t smem[];

  WorkItem item;
  if (!find_work<static_cast<int>(BLOCK_T)>(p, static_cast<int>(blockIdx.x), item)) return;

  const uint32_t tid = threadIdx.x, lane = tid & 31u, warp = tid >> 5;
  const int64_t n0 = static_cast<int64_t>(blockIdx.y) * BLOCK_W;
  const int w_rows = static_cast<int>(min(static_cast<int64_t>(BLOCK_W), p.n - n0));
  const int64_t k_half = p.k / 2, k_scales = p.k / 16;
  const __nv_bfloat16* x_rows = p.x + static_cast<int64_t>(item.row_begin) * p.k;
  const uint8_t* w_packed = p.w_packed + (static_cast<int64_t>(item.expert) * p.n + n0) * k_half;
  const uint8_t* w_scales = p.w_scales + (static_cast<int64_t>(item.expert) * p.n + n0) * k_scales;
  const int n_ktiles = (p.k + static_cast<int>(BLOCK_K) - 1) / static_cast<int>(BLOCK_K);
  const uint32_t smem_base = smem_u32(smem);

  // Issues the copies of K slice `kt` into stage `slot` (no commit).
  auto load_stage = [&](uint32_t slot, int kt) {
    const int k0 = kt * static_cast<int>(BLOCK_K);
    constexpr uint32_t kXChunks = BLOCK_T * BLOCK_K / 8;  // 16 B = 8 bf16
#pragma unroll
    for (uint32_t i = tid; i < kXChunks; i += kThreads) {
      const uint32_t r = i / (BLOCK_K / 8), c = i % (BLOCK_K / 8);
      const int k = k0 + static_cast<int>(c * 8);
      const bool ok = static_cast<int>(r) < item.rows && k < p.k;
      const void* src = ok ? static_cast<const void*>(x_rows + static_cast<int64_t>(r) * p.k + k) : p.x;
      cp_async_16(smem_base + kXOff + slot * kStride + x_tile_offset<BLOCK_K>(r, c), src, ok);
    }
    constexpr uint32_t kWChunks = BLOCK_W * BLOCK_K / 32;  // 16 B = 32 codes
#pragma unroll
    for (uint32_t i = tid; i < kWChunks; i += kThreads) {
      const uint32_t r = i / (BLOCK_K / 32), c = i % (BLOCK_K / 32);
      const int k = k0 + static_cast<int>(c * 32);
      const bool ok = static_cast<int>(r) < w_rows && k < p.k;
      const void* src = ok ? static_cast<const void*>(w_packed + static_cast<int64_t>(r) * k_half + k / 2)
                           : static_cast<const void*>(p.w_packed);
      cp_async_16(smem_base + kWOff + slot * kStride + w_packed_offset<BLOCK_K>(r, c * 16), src, ok);
    }
    constexpr uint32_t kSPieces = BLOCK_W * BLOCK_K / 64;  // 4 B = 4 scales = 64 k
#pragma unroll
    for (uint32_t i = tid; i < kSPieces; i += kThreads) {
      const uint32_t r = i / (BLOCK_K / 64), c = i % (BLOCK_K / 64);
      const int k = k0 + static_cast<int>(c * 64);
      const bool ok = static_cast<int>(r) < w_rows && k < p.k;
      const void* src = ok ? static_cast<const void*>(w_scales + static_cast<int64_t>(r) * k_scales + k / 16)
                           : static_cast<const void*>(p.w_scales);
      cp_async_4(smem_base + kSOff + slot * kStride + w_scales_offset<BLOCK_K>(r, c * 4), src, ok);
    }
  };

  float acc[kNTiles][4];
#pragma unroll
  for (uint32_t j = 0; j < kNTiles; ++j) {
#pragma unroll
    for (int i = 0; i < 4; ++i) acc[j][i] = 0.0f;
  }

#pragma unroll
  for (uint32_t s = 0; s + 1 < STAGES; ++s) {
    if (static_cast<int>(s) < n_ktiles) load_stage(s, static_cast<int>(s));
    cp_async_commit();  // always commit, so that group i holds slice i
  }

  for (int kt = 0; kt < n_ktiles; ++kt) {
    cp_async_wait<static_cast<int>(STAGES) - 2>();  // slice kt has landed (this thread's copies)
    __syncthreads();                                // ... everyone's; slot (kt-1) % S is free
    const int next = kt + static_cast<int>(STAGES) - 1;
    if (next < n_ktiles) load_stage(static_cast<uint32_t>(next) % STAGES, next);
    cp_async_commit();

    const uint32_t slot = static_cast<uint32_t>(kt) % STAGES;
    const uint8_t* x_tile = smem + kXOff + slot * kStride;
    const uint8_t* w_tile = smem + kWOff + slot * kStride;
    const uint8_t* s_tile = smem + kSOff + slot * kStride;
    const int k_left = p.k - kt * static_cast<int>(BLOCK_K);
#pragma unroll
    for (uint32_t kc = 0; kc < BLOCK_K / 64; ++kc) {
      if (static_cast<int>(kc * 64) < k_left) {  // K % 64 == 0: a chunk is all in or all out
        uint32_t a[4][4];
        load_a_fragments<BLOCK_K>(w_tile, s_tile, warp * 16, kc, lane, a);
#pragma unroll
        for (uint32_t j = 0; j < kNTiles; ++j) {
          uint32_t b[4][2];
          load_b_fragments<BLOCK_K>(x_tile, j * 8, kc, lane, b);
#pragma unroll
          for (int s = 0; s < 4; ++s) mma_bf16_m16n8k16(acc[j], a[s], b[s]);
        }
      }
    }
  }
  cp_async_wait<0>();  // only empty groups remain; drain them before the CTA exits

  // Epilogue: C fragment (row g / g+8 = weight rows, cols 2t, 2t+1 = tokens) -> token-major tile.
  const float gs = __ldg(p.global_scales + item.expert);
  uint8_t* epi = smem + kEpiOff;
  const uint32_t g = lane >> 2, t = lane & 3u;
  const uint32_t wr = warp * 16 + g;
#pragma unroll
  for (uint32_t j = 0; j < kNTiles; ++j) {
    const uint32_t tok = j * 8 + 2 * t;
    auto put = [&](uint32_t tk, uint32_t row, float v) {
      *reinterpret_cast<__nv_bfloat16*>(epi + tk * kEpiRow + row * 2) = __float2bfloat16_rn(v * gs);
    };
    put(tok, wr, acc[j][0]);
    put(tok + 1, wr, acc[j][1]);
    put(tok, wr + 8, acc[j][2]);
    put(tok + 1, wr + 8, acc[j][3]);
  }
  __syncthreads();
  constexpr uint32_t kOutChunks = BLOCK_T * BLOCK_W / 8;  // 16 B = 8 outputs
#pragma unroll
  for (uint32_t i = tid; i < kOutChunks; i += kThreads) {
    const uint32_t r = i / (BLOCK_W / 8), c = i % (BLOCK_W / 8);
    const int64_t n = n0 + c * 8;
    if (static_cast<int>(r) < item.rows && n < p.n) {
      *reinterpret_cast<uint4*>(p.y + static_cast<int64_t>(item.row_begin + static_cast<int>(r)) * p.n + n) =
          *reinterpret_cast<const uint4*>(epi + r * kEpiRow + c * 16);
    }
  }
}

using LaunchFn = void (*)(const KernelParams&, dim3, cudaStream_t);

template <int I>
void launch_config(const KernelParams& p, dim3 grid, cudaStream_t stream) {
  constexpr W4A16Config c = kW4A16Configs[I];
  constexpr uint32_t kBytes = W4A16Layout::make(c).total_bytes();
  auto kernel = sm90_nvfp4_w4a16_grouped_gemm_kernel<c.block_w, c.block_t, c.block_k, c.stages>;
  FP4MOE_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(kBytes)));
  kernel<<<grid, c.n_threads(), kBytes, stream>>>(p);
  FP4MOE_CUDA_CHECK(cudaGetLastError());
}

template <int... I>
constexpr std::array<LaunchFn, sizeof...(I)> make_launch_table(std::integer_sequence<int, I...>) {
  return {&launch_config<I>...};
}
constexpr auto kLaunchTable = make_launch_table(std::make_integer_sequence<int, kNumW4A16Configs>{});

}  // namespace

void w4a16_grouped_gemm(const W4A16GroupedGemmArgs& args, int config_id, cudaStream_t stream) {
  const W4A16Config& c = w4a16_config(config_id);
  w4a16_check_problem(args, c);
  if (args.m_total == 0) return;
  int device = 0, optin = 0;
  FP4MOE_CUDA_CHECK(cudaGetDevice(&device));
  FP4MOE_CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  w4a16_check_config(c, static_cast<uint32_t>(optin));

  const KernelParams p{args.x, args.expert_offsets, args.w_packed, args.w_scales, args.w_global_scales, args.y,
                       static_cast<int32_t>(args.m_total), static_cast<int32_t>(args.n),
                       static_cast<int32_t>(args.k), static_cast<int32_t>(args.n_experts)};
  const int64_t grid_x = args.m_total / c.block_t + std::min<int64_t>(args.n_experts, args.m_total);
  const int64_t grid_y = (args.n + c.block_w - 1) / c.block_w;
  kLaunchTable[static_cast<size_t>(config_id)](p, dim3(static_cast<unsigned>(grid_x), static_cast<unsigned>(grid_y)),
                                               stream);
}

}  // namespace fp4moe::cuda::sm90
