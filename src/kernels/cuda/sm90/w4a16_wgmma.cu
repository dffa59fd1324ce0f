// sm90_nvfp4_w4a16_grouped_gemm, kind kWgmma: the prefill / 64-token tile on Hopper's wgmma (issue #5).
// Same API, work items, split-K and epilogues as the mma.sync kernels (w4a16_grouped_gemm.cu); the
// shared memory is plan/layout_sm90_w4a16.h's kWgmma layout.
//
// One CTA = a producer warpgroup (its first thread issues every stage's TMA loads once the consumers
// released the stage; setmaxnreg lowers it to 40 registers) and two consumer warpgroups (256 threads,
// raised by setmaxnreg) computing a block_w (128 or 256) weight rows x block_t tokens tile of one
// expert: consumer warpgroup q issues wgmma.mma_async m64n<block_t>k16 (bf16 in, f32 accumulate,
// both operands from shared memory) for the m64 blocks q, q + 2 of the weight rows (consumer warp w
// owns row tiles w and w + 8). The producer puts chunk i into stage slot i % stages once every consumer
// warp released the slot's previous chunk (the slot's `empty` mbarrier, one arrival a consumer warp), by
// two TMA loads on the slot's `full` mbarrier (the activation tile and the codes of the CTA's row tiles),
// up to `stages` chunks ahead. Per 64-wide K chunk i (consumers):
//   1. wait for the slot's full mbarrier;
//   2. each warp dequantizes its own row tiles (16 rows each, the mma.sync kernels' registers, exact:
//      w4a16_fragments.h) and stores the bf16 rows in natural K order into A buffer i % 4, 128B-swizzled
//      (lane (g, t) holds rows g, g + 8 at k = 16 t .. 16 t + 15: two 16 B units per row), so the
//      weight layout's K permutation never reaches the MMA;
//   3. fence.proxy.async (generic-proxy writes -> the wgmma's async proxy), then a named barrier of the
//      warp's own warpgroup only (a warpgroup's wgmmas read only its own warps' A rows);
//   4. per k16 step (descriptors + 32 B) one wgmma per m64 block of the warpgroup, commit, wait until
//      at most one group is pending, so the MMAs of chunk i overlap the dequantization of chunk i + 1;
//   5. release chunk i - 1's slot (its wgmma is complete and its codes were read; __syncwarp, lane 0
//      arrives on the slot's empty mbarrier).
// Measured against the single-role version (every warp dequantized, thread 0 refilled the slot of
// chunk i - 2 after one __syncthreads a chunk): 195 -> 152 issued instructions a consumer warp a chunk
// (m128n64) and 0.81-0.86x the time at 64 tokens a expert (BENCHMARKS.md, seventeenth session).
// A buffer i % 4 was last read by the wgmma of chunk i - 4, complete before the barrier of chunk i - 2.
// Stages and A buffers are powers of 2 dividing the scale group (8 chunks), so a chunk's slot, A buffer
// and phase parity are compile-time constants of the unrolled group loop (static SASS per consumer warp
// and chunk, m128n64: 152 -> 126 instructions with 5 stages / 3 buffers before).
// Activations arrive by TMA (cp.async.bulk.tensor, box 64 k x block_t rows of x [m_total, K], 128B
// swizzle: the x tile's layout; zero-filled past K and past m_total; rows past the expert's own are the
// next expert's tokens, whose output columns are never stored); codes by one TMA load per stage too
// (make_codes_map: a 2D box of the CTA's row tiles x 512 B, L2 evict-first); scales a group (8 chunks)
// ahead in registers. The TMA load
// replaces block_t x 8 / 256 cp.async per thread per chunk and their address arithmetic (Nsight
// Compute: the cp.async version issued ~380 instructions per warp per chunk, at 34% issue use).
// The accumulator fragment of wgmma m64nN (thread (warp w of the warpgroup, lane (g, t)): rows 16 w + g
// (+8), columns 8 j + 2 t (+1)) is the mma.sync C fragment of that warp's row tile, so the epilogue is
// the pipelined kernel's (write_output_tile).
// Tested by tests/kernels/test_cuda_w4a16.cpp (every config); the swizzle and descriptor against CuTe
// by tests/kernels/test_wgmma_layout_host.cpp.

#include <cuda.h>  // CUtensorMap
#include <cudaTypedefs.h>  // PFN_cuTensorMapEncodeTiled
#include <cute/arch/copy_sm90_tma.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/arch/reg_reconfig.h>

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
using plan::kWgmmaABuffers;
using plan::kWgmmaProducerRegs;
using plan::w4a16_wgmma_consumer_regs;
using plan::w4a16_ctas_per_sm;
using plan::w4a16_wgmma_desc;
using plan::w4a16_wgmma_desc_lo;
using plan::w4a16_wgmma_desc_of_lo;
using plan::w4a16_wgmma_swizzle;
using plan::W4A16Config;
using plan::W4A16Kind;
using plan::W4A16Layout;

// The kernel's config (a function: a variable template inside __launch_bounds__ aborts nvcc 13's cicc).
constexpr W4A16Config wgmma_config(uint32_t block_w, uint32_t block_t, uint32_t stages) {
  return W4A16Config{block_w, block_t, 64, stages, W4A16Kind::kWgmma};
}

using Barrier = cutlass::arch::ClusterTransactionBarrier;
// L2 policies of the TMA loads (CuTe's TMA::CacheHintSm90): the activations are read by every row
// block (normal), the weight codes once (evict first).
constexpr uint64_t kTmaEvictNormal = static_cast<uint64_t>(cute::TMA::CacheHintSm90::EVICT_NORMAL);
constexpr uint64_t kTmaEvictFirst = static_cast<uint64_t>(cute::TMA::CacheHintSm90::EVICT_FIRST);

template <uint32_t BLOCK_W, uint32_t BLOCK_T, uint32_t STAGES, bool SWIGLU>
__global__ void __launch_bounds__(wgmma_config(BLOCK_W, BLOCK_T, STAGES).n_threads(),
                                  w4a16_ctas_per_sm(wgmma_config(BLOCK_W, BLOCK_T, STAGES),
                                                          W4A16Layout::make(wgmma_config(BLOCK_W, BLOCK_T, STAGES)).total_bytes()))
    sm90_nvfp4_w4a16_wgmma_kernel(const __grid_constant__ KernelParams p, const __grid_constant__ CUtensorMap x_map,
                                  const __grid_constant__ CUtensorMap codes_map) {
  constexpr W4A16Layout kLayout = W4A16Layout::make(wgmma_config(BLOCK_W, BLOCK_T, STAGES));
  static_assert(kLayout.valid() && kLayout.fits(kSm90SmemOptinBytes), "config exceeds the sm_90 opt-in shared memory");
  // kMB m64 blocks per warpgroup; m64 block j (A rows 64 j ..) belongs to warpgroup j % 2, and its
  // warp w (of 4) owns row tile 4 j + w = warp + 8 (j / 2) of the CTA: warp `warp` owns row tiles
  // warp + 8 b for b < kMB.
  constexpr uint32_t kMB = BLOCK_W / 128;
  // Warpgroup 0: the producer (its first lane issues the TMA loads; registers lowered to
  // kWgmmaProducerRegs); warpgroups 1, 2: the consumers (dequantize, wgmma, epilogue; registers raised
  // to w4a16_wgmma_consumer_regs).
  constexpr W4A16Config kConfig = wgmma_config(BLOCK_W, BLOCK_T, STAGES);
  constexpr uint32_t kConsumerWarps = 8, kConsumerThreads = 32 * kConsumerWarps;
  static_assert(kConfig.n_threads() == kConsumerThreads + 128, "a producer warpgroup + two consumer warpgroups");
  constexpr uint32_t kConsumerRegs = w4a16_wgmma_consumer_regs(kConfig, kLayout.total_bytes());
  // Named barriers (cutlass::arch::NamedBarrier ids): 0, 1 the warpgroups' A rows, 2 the consumers.
  constexpr uint32_t kEpilogueBarrier = 2;
  constexpr uint32_t kRowTiles = BLOCK_W / 16, kNTiles = BLOCK_T / 8, kAcc = BLOCK_T / 2;
  constexpr uint32_t kXOff = kLayout.x_tile_offset, kWOff = kLayout.w_tiles_offset, kStride = kLayout.stage_stride;
  constexpr uint32_t kAOff = kLayout.a_tiles_offset, kABytes = kLayout.a_tile_bytes;
  constexpr uint32_t kTileBytes = 16 * 128;  // one row tile (16 rows) of an A tile
  constexpr uint32_t kXBytes = BLOCK_T * 128;  // one x tile: the TMA box (zero fill counts too)
  constexpr uint32_t kCodesBytes = kRowTiles * kW4A16TileBytes;  // the chunk's codes: the TMA box
  static_assert(kCodesBytes == kLayout.w_tiles_bytes && kRowTiles <= 256, "the codes box is the stage's w tiles");
  static_assert(kXBytes == kLayout.x_tile_bytes && BLOCK_T <= 256, "the TMA box is the x tile (at most 256 rows)");
  static_assert(kXOff % 1024 == 0 && kStride % 1024 == 0 && kAOff % 1024 == 0 && kABytes % 1024 == 0,
                "wgmma tiles must sit on the 1024 B swizzle atom");
  using Op = typename WgmmaAtoms<BLOCK_T>::SS;
  extern __shared__ __align__(1024) uint8_t smem[];

  WorkItem item;
  // Row blocks along x, work items along y (the launcher transposes the grid): the CTAs resident at once
  // are every row block of a few token tiles, so each tile's activations come from HBM about once.
  if (!find_work<static_cast<int>(BLOCK_T)>(p, static_cast<int>(blockIdx.y), item)) return;  // the whole CTA
  const uint32_t lane = threadIdx.x & 31u;
  const uint32_t base = smem_u32(smem);
  if (threadIdx.x == 0 && (base & 1023u) != 0) __trap();  // the swizzle needs 1024 B aligned tiles
  // full[s]: chunk data of stage s landed (the producer's expect_tx + both TMA loads); empty[s]: every
  // consumer warp is done with it (codes read, its wgmma over the x tile complete).
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + kLayout.barriers_offset);
  uint64_t* empty = full + STAGES;
  if (threadIdx.x == 0) {
#pragma unroll
    for (uint32_t s = 0; s < STAGES; ++s) {
      Barrier::init(full + s, 1);
      Barrier::init(empty + s, kConsumerWarps);
    }
    cutlass::arch::fence_barrier_init();
  }
  __syncthreads();

  const int rt0 = static_cast<int>(blockIdx.x * kRowTiles);

  // This CTA's K part (split-K: blockIdx.z): scale groups [kg0, kg1), chunks kc0 .. kc0 + n_chunks - 1.
  const int kg0 = static_cast<int>(blockIdx.z) * p.groups_per_part;
  const int kg1 = min(kg0 + p.groups_per_part, p.k_groups);
  const int kc0 = kg0 * static_cast<int>(kW4A16ScaleGroup);
  const int n_chunks = min(kg1 * static_cast<int>(kW4A16ScaleGroup), p.k_chunks) - kc0;

  if (threadIdx.x < 128) {
    cutlass::arch::warpgroup_reg_dealloc<kWgmmaProducerRegs>();
    // The producer (one lane): chunk kc0 + i into stage slot i % STAGES once the slot's previous
    // chunk (i - STAGES) is released, by two TMA loads on the slot's full barrier: the activations (x
    // tile) and the codes of the CTA's kRowTiles row tiles (one 2D box: rows of the codes tensor are row
    // tiles, kW4A16TileBytes a chunk; row tiles past this expert's are the next expert's or zero-filled
    // past the last, and their zero scales make their A rows zero). Then it exits: the consumers wait
    // for every load it issued.
    if (threadIdx.x == 0) {
      for (int i = 0; i < n_chunks; ++i) {
        const uint32_t slot = static_cast<uint32_t>(i) % STAGES;
        if (i >= static_cast<int>(STAGES)) Barrier::wait(empty + slot, static_cast<uint32_t>(i / static_cast<int>(STAGES) + 1) & 1u);
        const int kc = kc0 + i;
        Barrier::arrive_and_expect_tx(full + slot, kXBytes + kCodesBytes);
        cute::SM90_TMA_LOAD_2D::copy(&x_map, full + slot, kTmaEvictNormal, smem + kXOff + slot * kStride, kc * 64, item.row_begin);
        cute::SM90_TMA_LOAD_2D::copy(&codes_map, full + slot, kTmaEvictFirst, smem + kWOff + slot * kStride,
                                     kc * static_cast<int>(kW4A16TileBytes / 4), item.expert * p.row_tiles + rt0);
      }
    }
    return;
  }
  cutlass::arch::warpgroup_reg_alloc<kConsumerRegs>();
  // Consumer thread / warp / warpgroup numbers (0 .. 255, 0 .. 7, 0 .. 1).
  const uint32_t tid = threadIdx.x - 128, warp = tid >> 5, wg = warp >> 2;

  // Not zero-filled: the first wgmma of each m64 block overwrites them (scale-d 0). Zeroing them with
  // ordinary instructions makes ptxas serialize every wgmma (C7515: non-wgmma instructions defining
  // accumulators while a wgmma may be in flight, here across the loop's wait_group 1). n_chunks >= 1:
  // the split-K plan leaves no part empty and K > 0.
  float acc[kMB][kNTiles][4];
  ScaleGroups<kMB> sg;
  sg.start(p, item.expert, rt0 + static_cast<int>(warp), lane, kg0, kg1);

  // Loop invariants as 32-bit shared addresses and descriptor low words: with a power-of-2 stage and
  // A-buffer count, a chunk's slot, A buffer and phase parity are functions of its place in the scale
  // group (w4a16_wgmma_chunk_phase), compile-time constants after unrolling, so per chunk only
  // constants are added.
  const uint32_t full_u32 = base + kLayout.barriers_offset, empty_u32 = full_u32 + 8 * STAGES;
  const uint32_t codes_u32 = base + kWOff + warp * kW4A16TileBytes + lane * 16;
  uint32_t a_off[4];
  w4a16_wgmma_a_offsets(lane, a_off);
  uint32_t a_st[kMB][4];
#pragma unroll
  for (uint32_t b = 0; b < kMB; ++b) {
#pragma unroll
    for (int q = 0; q < 4; ++q) a_st[b][q] = base + kAOff + (warp + 8 * b) * kTileBytes + a_off[q];
  }
  const uint32_t desc_a_lo = w4a16_wgmma_desc_lo(base + kAOff + wg * 4 * kTileBytes);
  const uint32_t desc_b_lo = w4a16_wgmma_desc_lo(base + kXOff);
  static_assert((STAGES & (STAGES - 1)) == 0 && STAGES <= kW4A16ScaleGroup && (kWgmmaABuffers & (kWgmmaABuffers - 1)) == 0 &&
                    kWgmmaABuffers <= kW4A16ScaleGroup,
                "a chunk's slot and A buffer follow from its place in the scale group");

  // Chunk j of scale group `group` (counted from kg0): slot, A buffer, parity (CPU-tested).
  auto phase = [](int group, uint32_t j) {
    return w4a16_wgmma_chunk_phase(static_cast<uint32_t>(group), j, STAGES, kWgmmaABuffers);
  };

  // The codes of the next chunk come into registers while the current chunk's wgmma is being issued
  // (the dequantization then starts without an LDS round trip). The stage's full barrier completes
  // phase i / STAGES when both TMA loads of chunk i have landed.
  uint4 codes_next[kMB];
  auto load_codes = [&](const W4A16WgmmaChunkPhase& ph) {
    ptx::mbarrier_wait_parity(full_u32 + 8 * ph.slot, ph.parity);
#pragma unroll
    for (uint32_t b = 0; b < kMB; ++b) {
      codes_next[b] = ptx::ld_shared_v4(codes_u32 + ph.slot * kStride + 8 * b * kW4A16TileBytes);
    }
  };
  load_codes(phase(0, 0));  // chunk 0: n_chunks >= 1

  for (int kg = kg0; kg < kg1; ++kg) {
#pragma unroll
    for (uint32_t j = 0; j < kW4A16ScaleGroup; ++j) {
      const uint32_t i = static_cast<uint32_t>(kg - kg0) * kW4A16ScaleGroup + j;
      if (i < static_cast<uint32_t>(n_chunks)) {  // uniform over the consumers
        const W4A16WgmmaChunkPhase ph = phase(kg - kg0, j);  // slot i % STAGES, A buffer i % kWgmmaABuffers
        const uint32_t slot = ph.slot, abuf = ph.abuf;
        uint4 codes[kMB];
#pragma unroll
        for (uint32_t b = 0; b < kMB; ++b) codes[b] = codes_next[b];
#pragma unroll
        for (uint32_t b = 0; b < kMB; ++b) {
          uint32_t sc_lo, sc_hi;
          w4a16_chunk_scales(sg.cur[b], j, sc_lo, sc_hi);
          uint32_t a[4][4];
          w4a16_chunk_fragments(codes[b], sc_lo, sc_hi, a);
          // Rows g and g + 8 of the row tile in natural K order (w4a16_wgmma_a_stores).
          const W4A16WgmmaStores st = w4a16_wgmma_a_stores(a, lane);
#pragma unroll
          for (int q = 0; q < 4; ++q) ptx::st_shared_v4(a_st[b][q] + abuf * kABytes, st.value[q]);
        }
        ptx::fence_proxy_async_shared();  // this thread's A stores -> the async proxy
        // The warpgroup's A rows (its warps' row tiles) are written: only its own wgmma reads them.
        cutlass::arch::NamedBarrier::sync(128, wg);

        // No register fence on the accumulators inside the loop: the wgmma of chunk i - 1 is still in
        // flight here, and any non-wgmma instruction defining its accumulators makes ptxas serialize
        // every wgmma (C7515). Only the wgmma asm statements touch them until the final wait.
        cute::warpgroup_arrive();
#pragma unroll
        for (uint32_t s = 0; s < 4; ++s) {
#pragma unroll
          for (uint32_t b = 0; b < kMB; ++b) {
            // m64 block 2 b + wg: A rows 64 (2 b + wg) .. (row tiles 8 b + 4 wg ..); k16 step s is 32 B
            // further along the 128 B rows (descriptor address units of 16 B).
            const uint64_t desc_a = w4a16_wgmma_desc_of_lo(desc_a_lo + (abuf * kABytes + 2 * b * 4 * kTileBytes) / 16 + 2 * s);
            const uint64_t desc_b = w4a16_wgmma_desc_of_lo(desc_b_lo + slot * kStride / 16 + 2 * s);
            wgmma_ss<Op>(desc_a, desc_b, &acc[b][0][0], i == 0 && s == 0, std::make_index_sequence<kAcc>{});
          }
        }
        cute::warpgroup_commit_batch();
        // Chunk i + 1's codes (slot and parity constants of j + 1; the next group's first chunk at j = 7).
        if (i + 1 < static_cast<uint32_t>(n_chunks)) {
          load_codes(phase(kg - kg0 + static_cast<int>((j + 1) / kW4A16ScaleGroup), (j + 1) % kW4A16ScaleGroup));
        }
        cute::warpgroup_wait<1>();
        // The wgmma of chunk i - 1 is complete and this warp read its codes long ago: release its stage
        // (every lane's reads ordered before lane 0's arrive).
        if (i > 0) {
          __syncwarp();
          if (lane == 0) ptx::mbarrier_arrive(empty_u32 + 8 * ((slot + STAGES - 1) % STAGES));
        }
      }
    }
    sg.advance(kg, kg1);
  }
  cute::warpgroup_wait<0>();
#pragma unroll
  for (uint32_t b = 0; b < kMB; ++b) fence_accumulators<kAcc>(&acc[b][0][0]);
  // Every wgmma and every TMA load (each waited for in the loop) is done: the stage region becomes the
  // epilogue tile. The producer warpgroup has exited: the consumers' own barrier.
  cutlass::arch::NamedBarrier::sync(kConsumerThreads, kEpilogueBarrier);

  write_output_tile<BLOCK_W, BLOCK_T, kConsumerThreads, kLayout.epilogue_row_bytes, SWIGLU, kMB, kEpilogueBarrier + 1>(
      p, item, rt0, tid, acc, smem);
}

// The driver's tensor-map encoder, through the runtime (no link against libcuda).
PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static const PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult q{};
    FP4MOE_CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault, &q));
    FP4MOE_CHECK(q == cudaDriverEntryPointSuccess && f != nullptr)
        << "sm90_nvfp4_w4a16_grouped_gemm: the CUDA driver has no cuTensorMapEncodeTiled (query result " << static_cast<int>(q)
        << "); the wgmma configs need a CUDA 12+ driver";
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(f);
  }();
  return fn;
}

// A 2D tiled TMA descriptor of `ptr` (dims and box innermost first, rows `row_bytes` apart), elements
// stride 1, L2 promotion 256 B, out-of-bounds elements read as zeros: what both maps below share.
CUresult encode_2d_map(CUtensorMap& map, CUtensorMapDataType type, const void* ptr, cuuint64_t dim0, cuuint64_t dim1,
                       cuuint64_t row_bytes, cuuint32_t box0, cuuint32_t box1, CUtensorMapSwizzle swizzle) {
  const cuuint64_t dims[2] = {dim0, dim1};
  const cuuint64_t strides[1] = {row_bytes};
  const cuuint32_t box[2] = {box0, box1};
  const cuuint32_t elem_strides[2] = {1, 1};
  return tensor_map_encoder()(&map, type, 2, const_cast<void*>(ptr), dims, strides, box, elem_strides,
                              CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                              CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
}

// The TMA descriptor of the weight codes (kernel layout: [experts x row_tiles][k_chunks] tiles of
// kW4A16TileBytes) as a 2D u32 tensor, one row per row tile: box kW4A16TileBytes / 4 x block_w / 16 rows
// (one chunk of the CTA's row tiles), no swizzle (the stage's w tiles are [row tile][512 B]), zeros past
// the last row tile.
CUtensorMap make_codes_map(const KernelParams& p, uint32_t block_w) {
  CUtensorMap map{};
  const cuuint64_t row_bytes = static_cast<cuuint64_t>(p.k_chunks) * kW4A16TileBytes;
  const CUresult r = encode_2d_map(map, CU_TENSOR_MAP_DATA_TYPE_UINT32, p.w_codes, row_bytes / 4,
                                   static_cast<cuuint64_t>(p.n_experts) * static_cast<cuuint64_t>(p.row_tiles), row_bytes,
                                   kW4A16TileBytes / 4, block_w / 16, CU_TENSOR_MAP_SWIZZLE_NONE);
  FP4MOE_CHECK(r == CUDA_SUCCESS) << "sm90_nvfp4_w4a16_grouped_gemm: cuTensorMapEncodeTiled of the weight codes failed (CUresult "
                                  << static_cast<int>(r) << "; codes " << static_cast<const void*>(p.w_codes) << ", "
                                  << p.n_experts << " x " << p.row_tiles << " row tiles x " << p.k_chunks << " chunks, box "
                                  << kW4A16TileBytes << " B x " << block_w / 16 << ")";
  return map;
}

}  // namespace

// The TMA descriptor of the activations x [m_total, K] bf16 for a block_t-token x tile: box 64 k x
// block_t rows, 128B swizzle (the x tile's layout, w4a16_wgmma_swizzle), out-of-bounds reads as zeros.
// Also the stream kernel's, for its CTA activation ring (w4a16_grouped_gemm.cu).
CUtensorMap make_x_map(const KernelParams& p, uint32_t block_t) {
  CUtensorMap map{};
  // Rows K x 2 bytes apart; K % 16 == 0: a multiple of 16.
  const CUresult r = encode_2d_map(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, p.x, static_cast<cuuint64_t>(p.k),
                                   static_cast<cuuint64_t>(p.m_total), static_cast<cuuint64_t>(p.k) * 2, 64, block_t,
                                   CU_TENSOR_MAP_SWIZZLE_128B);
  FP4MOE_CHECK(r == CUDA_SUCCESS)
      << "sm90_nvfp4_w4a16_grouped_gemm: cuTensorMapEncodeTiled of the activations failed (CUresult "
      << static_cast<int>(r) << "; x " << static_cast<const void*>(p.x) << ", M_total " << p.m_total << ", K " << p.k
      << ", box 64 x " << block_t << ")";
  return map;
}

namespace {

// Config I of kW4A16Configs (a kWgmma config: KindLaunchTable instantiates no other).
template <int I, bool SWIGLU>
struct Launch {
  static void run(const KernelParams& p, dim3 grid, cudaStream_t stream) {
    constexpr W4A16Config c = kW4A16Configs[I];
    // grid = (work items, row blocks, K parts); the kernel wants the row blocks fastest (see above;
    // w4a16_check_problem holds the token tiles to the y limit).
    launch_with_smem(sm90_nvfp4_w4a16_wgmma_kernel<c.block_w, c.block_t, c.stages, SWIGLU>,
                     W4A16Layout::make(c).total_bytes(), c.n_threads(), dim3(grid.y, grid.x, grid.z), stream, p,
                     make_x_map(p, c.block_t), make_codes_map(p, c.block_w));
  }
};

}  // namespace

void launch_wgmma(int config_id, bool swiglu, const KernelParams& p, dim3 grid, cudaStream_t stream) {
  KindLaunchTable<W4A16Kind::kWgmma, Launch>::launch(config_id, swiglu, p, grid, stream);
}

}  // namespace fp4moe::cuda::sm90::w4a16_detail
