// sm90_nvfp4_w4a16_grouped_gemm, kind kWgmmaRs: the warp-specialized prefill tile (issue #5). Same API,
// work items, split-K and epilogues as the other kinds; the shared memory is plan/layout_sm90_w4a16.h's
// kWgmmaRs layout.
//
// One CTA = three warpgroups (384 threads) computing block_w (128 or 256) weight rows x block_t tokens
// of one expert:
//  * warpgroup 0, the producer (setmaxnreg down to kWgmmaRsProducerRegs; the consumers' increase must fit
//    in what it frees, plan/layout_sm90_w4a16.h): per 64-wide K chunk i it
//    waits until slot i % stages is empty (the slot's "empty" mbarrier, from round 1 on), copies the
//    chunk's activations (token row r: 32 pairs of bf16, 4 B cp.async each, lane = pair, to
//    plan::w4a16_rs_x_offset: the K permutation of the A registers, see below; zero-filled past K,
//    rows past the expert's not copied: they only feed output columns that are never stored) and its
//    codes (a 16 B cp.async per lane and row tile) into the slot, one cp.async group per chunk; once
//    the group of chunk i - (stages - 2) has landed (wait_group) it arrives on that slot's "full"
//    mbarrier (128 arrivals a phase): an ordinary release the sanitizers follow (cp.async.mbarrier.
//    arrive.noinc would need no wait).
//  * warpgroups 1 and 2, the consumers (setmaxnreg up to kWgmmaRsConsumerRegs): warpgroup q issues
//    wgmma.mma_async m64n<block_t>k16 with A from registers (RS) for the m64 blocks q, q + 2 of the rows
//    (warp w of the consumers owns row tiles w and w + 8, as in kWgmma). Per chunk: wait for the full
//    barrier, read the lane's 16 B of codes of each row tile, dequantize them with the mma.sync
//    kernels' exact register code (w4a16_fragments.h) -- those registers ARE the wgmma A fragment
//    (warp w of a warpgroup holds rows 16 w .. 16 w + 15 of the m64 block in the m16n8k16 A layout),
//    logical k 2t, 2t + 1 | 2t + 8, 2t + 9 of step s being the chunk's k = 16 t + 4 s + {0, 1} | {2, 3}
//    -- then 4 k16 steps x kMB wgmma with B = the slot's x tile (descriptor + 32 B a step), commit,
//    wait until one group is pending, and release the slot of chunk i - 1 (its wgmma has completed;
//    one arrival per warp, 8 a phase). The A registers are double-buffered (chunk parity): the
//    dequantization of chunk i + 1 overlaps the wgmma of chunk i, and never touches registers a wgmma
//    in flight reads.
// No block-wide barrier in the main loop; scales come a group (8 chunks) ahead in registers as in
// kWgmma. The accumulators are the mma.sync C fragments of each warp's row tiles, so the epilogue is
// the shared write_output_tile (the consumers meet at named barrier 1; the producer has left).
// Tested by tests/kernels/test_cuda_w4a16.cpp (every config); the x permutation by
// tests/kernels/test_cuda_w4a16_emulation_host.cpp.
#include <cutlass/arch/barrier.h>
#include <cutlass/arch/reg_reconfig.h>

#include <type_traits>
#include <utility>

#include "kernels/cuda/sm90/w4a16_fragments.h"
#include "kernels/cuda/sm90/w4a16_kernel_common.cuh"
#include "kernels/cuda/sm90/w4a16_wgmma_atoms.cuh"
#include "kernels/cuda/sm90/w4a16_weight_layout.h"
#include "plan/layout_sm90_w4a16.h"

namespace fp4moe::cuda::sm90::w4a16_detail {

namespace {

using plan::kSm90SmemOptinBytes;
using plan::kW4A16Configs;
using plan::kWgmmaRsConsumerRegs;
using plan::kWgmmaRsProducerRegs;
using plan::w4a16_rs_x_offset;
using plan::w4a16_wgmma_desc;
using plan::W4A16Config;
using plan::W4A16Kind;
using plan::W4A16Layout;
using Barrier = cutlass::arch::ClusterBarrier;

constexpr W4A16Config rs_config(uint32_t block_w, uint32_t block_t, uint32_t stages) {
  return W4A16Config{block_w, block_t, 64, stages, W4A16Kind::kWgmmaRs};
}

constexpr uint32_t kProducerThreads = 128, kConsumerThreads = 256, kThreads = kProducerThreads + kConsumerThreads;
constexpr uint32_t kEpilogueBarrier = 1;  // named barrier of the consumers (0 is __syncthreads)

template <uint32_t BLOCK_W, uint32_t BLOCK_T, uint32_t STAGES, bool SWIGLU>
__global__ void __launch_bounds__(kThreads, 1) sm90_nvfp4_w4a16_wgmma_rs_kernel(const KernelParams p) {
  constexpr W4A16Layout kLayout = W4A16Layout::make(rs_config(BLOCK_W, BLOCK_T, STAGES));
  static_assert(kLayout.valid() && kLayout.fits(kSm90SmemOptinBytes), "config exceeds the sm_90 opt-in shared memory");
  static_assert(rs_config(BLOCK_W, BLOCK_T, STAGES).n_threads() == kThreads, "three warpgroups");
  constexpr uint32_t kMB = BLOCK_W / 128;  // m64 blocks per consumer warpgroup
  constexpr uint32_t kRowTiles = BLOCK_W / 16, kNTiles = BLOCK_T / 8, kAcc = BLOCK_T / 2;
  constexpr uint32_t kXOff = kLayout.x_tile_offset, kWOff = kLayout.w_tiles_offset, kStride = kLayout.stage_stride;
  static_assert(kXOff % 1024 == 0 && kStride % 1024 == 0, "x tiles must sit on the 1024 B swizzle atom");
  static_assert(kRowTiles % 4 == 0 && BLOCK_T % 4 == 0, "the producer's 4 warps split row tiles and token rows evenly");
  using Op = typename WgmmaAtoms<BLOCK_T>::RS;
  extern __shared__ __align__(1024) uint8_t smem[];

  WorkItem item;
  if (!find_work<static_cast<int>(BLOCK_T)>(p, static_cast<int>(blockIdx.x), item)) return;  // the whole CTA
  const uint32_t tid = threadIdx.x, lane = tid & 31u, warp = tid >> 5;
  const uint32_t base = smem_u32(smem);
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + kLayout.barriers_offset);
  uint64_t* empty = full + STAGES;
  if (tid == 0) {
    if ((base & 1023u) != 0) __trap();  // the swizzle needs 1024 B aligned tiles
#pragma unroll
    for (uint32_t s = 0; s < STAGES; ++s) {
      Barrier::init(full + s, kProducerThreads);
      Barrier::init(empty + s, kConsumerThreads / 32);
    }
    cutlass::arch::fence_barrier_init();
  }
  __syncthreads();

  const int rt0 = static_cast<int>(blockIdx.y * kRowTiles);
  // This CTA's K part (split-K: blockIdx.z): scale groups [kg0, kg1), chunks kc0 .. kc0 + n_chunks - 1
  // (n_chunks >= 1: the split plan leaves no part empty and K > 0).
  const int kg0 = static_cast<int>(blockIdx.z) * p.groups_per_part;
  const int kg1 = min(kg0 + p.groups_per_part, p.k_groups);
  const int kc0 = kg0 * static_cast<int>(kW4A16ScaleGroup);
  const int n_chunks = min(kg1 * static_cast<int>(kW4A16ScaleGroup), p.k_chunks) - kc0;

  if (warp < 4) {  // ---- producer ----
    cutlass::arch::warpgroup_reg_dealloc<kWgmmaRsProducerRegs>();
    const __nv_bfloat16* x_lane = p.x + static_cast<int64_t>(item.row_begin) * p.k + 2 * lane;
    // Row tiles rt0 + warp + 4 m (m < kRowTiles / 4) at codes + m x tile_step, valid while < row_tiles
    // (few registers: the producer runs on kWgmmaRsProducerRegs).
    const int rt_first = rt0 + static_cast<int>(warp);
    const int64_t tile_step = 4 * static_cast<int64_t>(p.k_chunks) * kW4A16TileBytes;
    const uint8_t* codes = p.w_codes + (static_cast<int64_t>(item.expert) * p.row_tiles + rt_first) * (tile_step / 4) + lane * 16;
    // Rows r = warp + 4 j sit at r & 7 = warp + 4 (j & 1): two swizzle phases a lane alternates between.
    const uint32_t x_dst[2] = {w4a16_rs_x_offset(warp, lane), w4a16_rs_x_offset(warp + 4, lane)};
    constexpr int kLag = static_cast<int>(STAGES) - 2;
    for (int i = 0; i < n_chunks; ++i) {
      const uint32_t slot = static_cast<uint32_t>(i) % STAGES;
      if (i >= static_cast<int>(STAGES)) Barrier::wait(empty + slot, static_cast<uint32_t>(i / static_cast<int>(STAGES) - 1) & 1u);
      const int kc = kc0 + i;
      const int k = kc * 64;
      const bool k_ok = k + 2 * static_cast<int>(lane) < p.k;  // K % 16 == 0: a pair is all in or all out
      const uint32_t x_slot = base + kXOff + slot * kStride;
#pragma unroll 4
      for (uint32_t j = 0; j < BLOCK_T / 4; ++j) {
        const uint32_t r = warp + 4 * j;
        if (static_cast<int>(r) < item.rows) {
          const void* src = k_ok ? static_cast<const void*>(x_lane + static_cast<int64_t>(r) * p.k + k) : p.x;
          cp_async_small<4>(x_slot + (r & ~7u) * 128 + x_dst[j & 1u], src, k_ok);
        }
      }
#pragma unroll
      for (uint32_t m = 0; m < kRowTiles / 4; ++m) {
        const bool ok = rt_first + static_cast<int>(4 * m) < p.row_tiles;
        const void* src = ok ? static_cast<const void*>(codes + m * tile_step + static_cast<int64_t>(kc) * kW4A16TileBytes) : p.w_codes;
        cp_async_16(base + kWOff + slot * kStride + (warp + 4 * m) * kW4A16TileBytes + lane * 16, src, ok);
      }
      cp_async_commit();
      // Chunk i - kLag has landed (this thread's copies): publish it. kLag = stages - 2 chunks stay in
      // flight; more would deadlock (the slot this loop waits for is released by the consumers only
      // after the chunk after it, which must have been published).
      if (i >= kLag) {
        cp_async_wait<kLag>();
        Barrier::arrive(full + static_cast<uint32_t>(i - kLag) % STAGES);
      }
    }
    cp_async_wait<0>();
    for (int i = max(n_chunks - kLag, 0); i < n_chunks; ++i) Barrier::arrive(full + static_cast<uint32_t>(i) % STAGES);
    return;  // the consumers finish alone (named barrier kEpilogueBarrier)
  }

  // ---- consumers ----
  cutlass::arch::warpgroup_reg_alloc<kWgmmaRsConsumerRegs>();
  const uint32_t cw = warp - 4;  // consumer warp 0..7: row tiles cw + 8 b
  ScaleGroups<kMB> sg;
  sg.start(p, item.expert, rt0 + static_cast<int>(cw), lane, kg0, kg1);

  // Not zero-filled: the first wgmma of each m64 block overwrites them (scale-d 0); see w4a16_wgmma.cu
  // on why nothing but the wgmma may define them inside the loop (ptxas C7515).
  float acc[kMB][kNTiles][4];
  uint32_t a[2][kMB][4][4];  // A registers of chunk parity 0 / 1
  // Chunk i (group-local j, A buffer buf): wait until it landed, dequantize, issue its wgmma, wait until
  // at most `pending` (0 or 1) groups are pending, release the slot of chunk i - 1.
  auto consume = [&](int i, uint32_t j, uint32_t buf, auto pending) {
    const uint32_t slot = static_cast<uint32_t>(i) % STAGES;
    Barrier::wait(full + slot, static_cast<uint32_t>(i / static_cast<int>(STAGES)) & 1u);
#pragma unroll
    for (uint32_t b = 0; b < kMB; ++b) {
      const uint4 w = *reinterpret_cast<const uint4*>(smem + kWOff + slot * kStride + (cw + 8 * b) * kW4A16TileBytes + lane * 16);
      uint32_t sc_lo, sc_hi;
      w4a16_chunk_scales(sg.cur[b], j, sc_lo, sc_hi);
      w4a16_chunk_fragments(w, sc_lo, sc_hi, a[buf][b]);
    }
    ptx::fence_proxy_async_shared();  // the landed cp.async copies -> the wgmma's async proxy
    const uint64_t desc_b = w4a16_wgmma_desc(base + kXOff + slot * kStride);
    cute::warpgroup_arrive();
#pragma unroll
    for (uint32_t s = 0; s < 4; ++s) {
#pragma unroll
      for (uint32_t b = 0; b < kMB; ++b) {
        wgmma_rs<Op>(a[buf][b][s], desc_b + 2 * s, &acc[b][0][0], i == 0 && s == 0, std::make_index_sequence<kAcc>{});
      }
    }
    cute::warpgroup_commit_batch();
    cute::warpgroup_wait<decltype(pending)::value>();  // chunk i - 1's wgmma done: its slot and A registers are free
    // Every lane read its codes of chunk i - 1 before this point; __syncwarp orders those reads before
    // lane 0's arrive (the producer refills the slot after it).
    __syncwarp();
    if (i >= 1 && lane == 0) Barrier::arrive(empty + static_cast<uint32_t>(i - 1) % STAGES);
  };
  // Whole groups without a branch between the wgmma (ptxas can then keep one group in flight while the
  // other buffer is written: a conditional chunk makes it serialize every wgmma, C7511); the rest of a
  // last partial group (K not a multiple of 512) one chunk at a time, buffer 0, nothing left pending.
  const int whole = n_chunks / static_cast<int>(kW4A16ScaleGroup);
  for (int g = 0; g < whole; ++g) {
#pragma unroll
    for (uint32_t j = 0; j < kW4A16ScaleGroup; ++j) {
      consume(g * static_cast<int>(kW4A16ScaleGroup) + static_cast<int>(j), j, j & 1u, std::integral_constant<int, 1>{});
    }
    sg.advance(kg0 + g, kg1);
  }
  for (int i = whole * static_cast<int>(kW4A16ScaleGroup); i < n_chunks; ++i) {
    consume(i, static_cast<uint32_t>(i) % kW4A16ScaleGroup, 0, std::integral_constant<int, 0>{});
  }
  cute::warpgroup_wait<0>();
#pragma unroll
  for (uint32_t b = 0; b < kMB; ++b) fence_accumulators<kAcc>(&acc[b][0][0]);
  // Every consumer's wgmma is done and every copy has landed (the consumers waited for each chunk's
  // full barrier): the stage region becomes the epilogue tile once all consumers are here.
  asm volatile("bar.sync %0, %1;" ::"n"(kEpilogueBarrier), "n"(kConsumerThreads) : "memory");
  write_output_tile<BLOCK_W, BLOCK_T, kConsumerThreads, kLayout.epilogue_row_bytes, SWIGLU, kMB, kEpilogueBarrier>(
      p, item, rt0, tid - kProducerThreads, acc, smem);
}

// Config I of kW4A16Configs (a kWgmmaRs config: KindLaunchTable instantiates no other).
template <int I, bool SWIGLU>
struct Launch {
  static void run(const KernelParams& p, dim3 grid, cudaStream_t stream) {
    constexpr W4A16Config c = kW4A16Configs[I];
    launch_with_smem(sm90_nvfp4_w4a16_wgmma_rs_kernel<c.block_w, c.block_t, c.stages, SWIGLU>, W4A16Layout::make(c).total_bytes(),
                     c.n_threads(), grid, stream, p);
  }
};

}  // namespace

void launch_wgmma_rs(int config_id, bool swiglu, const KernelParams& p, dim3 grid, cudaStream_t stream) {
  KindLaunchTable<W4A16Kind::kWgmmaRs, Launch>::launch(config_id, swiglu, p, grid, stream);
}

}  // namespace fp4moe::cuda::sm90::w4a16_detail
