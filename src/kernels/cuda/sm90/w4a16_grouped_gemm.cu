// sm90_nvfp4_w4a16_grouped_gemm: the mma.sync kernels and the launcher of all three kinds (API in
// w4a16_grouped_gemm.h, the weight layout in w4a16_weight_layout.h, register-level pieces in
// w4a16_fragments.h, shared memory and configs in plan/layout_sm90_w4a16.h, the description the planner
// sizes the configs with; the wgmma kernel in w4a16_wgmma.cu, the pieces both files use in
// w4a16_kernel_common.cuh).
//
// Both mma.sync kernels: one CTA computes a block_w (weight rows) x block_t (tokens) output tile of one
// expert over the whole K; kPipeline: warp w owns the 16 weight rows of row tile
// blockIdx.y * (block_w / 16) + w (one m16 MMA tile), kStream: the 32 rows of row tiles 2 w and 2 w + 1
// from there (kW4A16StreamTilesPerWarp), and all block_t tokens (block_t / 8 n8 tiles). blockIdx.x picks the work item:
// the (expert, token tile) pairs in expert order, found on the device by a warp-wide prefix sum
// over the tile counts ceil(tokens_e / block_t) (every warp computes it redundantly: no barrier, no
// shared memory). Accumulators are f32; the epilogue multiplies by 2^8 x the expert's global scale.
//
// kStream (decode): no barrier for the codes. Each lane streams its 16 B of codes per chunk and tile
// with cp.async into its warp's ring of `stages` chunk slots per tile in shared memory (stages - 1
// chunks of both tiles in flight per warp, so many more bytes in flight per SM than registers allow)
// and reads back only its own 16 B; the activations come by TMA boxes into a ring of the CTA
// (W4A16Layout::stream_cta_x_ring, mbarriers; the boxes issued by the first warp there): with 32 tokens
// a slot a chunk, with 8 / 16 a slot a scale group (stream_x_group_slots: one wait, ticket and release a
// group); scales come a group (8 chunks) ahead in registers; each activation fragment feeds both tiles' MMAs.
//
// kPipeline (32+ tokens): `stages` cp.async groups in flight (activations, the CTA's code tiles and
// each lane's scale bytes of one block_k slice), wait_group(stages - 2) + __syncthreads before a slice is read, the
// refill of the slot consumed one iteration earlier issued before the MMAs. Out-of-range token rows, row tiles and K
// chunks are zero-filled by cp.async (src-size 0), so no NaN from uninitialized shared memory can reach the
// accumulators. Epilogue transposed through shared memory to token-major rows and written with 16 B stores.
//
// Registers: __launch_bounds__ asks for w4a16_ctas_per_sm CTAs per SM; ptxas must not spill (a
// build error). Tested by tests/kernels/test_cuda_w4a16.cpp (GPU) and test_cuda_w4a16_host.cpp.
#include <cuda.h>  // CUtensorMap
#include <cutlass/arch/barrier.h>

#include <algorithm>
#include <array>
#include <cute/arch/copy_sm90_tma.hpp>
#include <type_traits>
#include <utility>

#include "core/error.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/ptx.cuh"
#include "kernels/cuda/sm90/w4a16_fragments.h"
#include "kernels/cuda/sm90/w4a16_grouped_gemm.h"
#include "kernels/cuda/sm90/w4a16_kernel_common.cuh"
#include "kernels/cuda/sm90/w4a16_weight_layout.h"
#include "plan/layout_sm90_w4a16.h"

namespace fp4moe::cuda::sm90 {

namespace {

using namespace w4a16_detail;

// ---- kStream: per-warp code rings -------------------------------------------------------------------
// Each warp owns kW4A16StreamTilesPerWarp = 2 adjacent row tiles (32 weight rows): the activation
// fragments it loads feed both tiles' MMAs, and it runs two independent dequant chains. x_map: the
// activations' TMA descriptor (make_x_map) for the CTA's activation ring.
template <uint32_t BLOCK_W, uint32_t BLOCK_T, uint32_t STAGES, bool SWIGLU>
__global__ void __launch_bounds__(
    W4A16Config{BLOCK_W, BLOCK_T, 64, STAGES, W4A16Kind::kStream}.n_threads(),
    w4a16_ctas_per_sm(W4A16Config{BLOCK_W, BLOCK_T, 64, STAGES, W4A16Kind::kStream},
                      W4A16Layout::make(W4A16Config{BLOCK_W, BLOCK_T, 64, STAGES, W4A16Kind::kStream}).total_bytes()))
    sm90_nvfp4_w4a16_stream_kernel(const __grid_constant__ KernelParams p, const __grid_constant__ CUtensorMap x_map) {
  using Barrier = cutlass::arch::ClusterTransactionBarrier;
  constexpr W4A16Config kConfig{BLOCK_W, BLOCK_T, 64, STAGES, W4A16Kind::kStream};
  constexpr W4A16Layout kLayout = W4A16Layout::make(kConfig);
  static_assert(kLayout.fits(kSm90SmemOptinBytes), "config exceeds the sm_90 opt-in shared memory");
  constexpr uint32_t kNTiles = BLOCK_T / 8;
  constexpr bool kCtaX = W4A16Layout::stream_cta_x_ring(kConfig);
  constexpr uint32_t kXStages = kLayout.x_stages;
  constexpr bool kXGroup = W4A16Layout::stream_x_group_slots(kConfig);  // a slot a scale group
  static_assert(plan::kW4A16StreamXGroupChunks == kW4A16ScaleGroup, "a group slot is one scale group");
  static_assert(kW4A16StreamTilesPerWarp == 2, "the loop below is written for two row tiles per warp");
  static_assert(kCtaX, "every stream tile takes its activations from the CTA's ring");
  static_assert((kXStages & (kXStages - 1)) == 0 && (kXGroup ? kXStages >= 2 : kXStages >= STAGES),
                "activation ring slots");
  extern __shared__ __align__(1024) uint8_t smem[];

  WorkItem item;
  if (!find_work<static_cast<int>(BLOCK_T)>(p, static_cast<int>(blockIdx.x), item)) return;
  const uint32_t lane = threadIdx.x & 31u, warp = threadIdx.x >> 5;
  const uint32_t g = lane >> 2, t = lane & 3u;
  const int rt0 = static_cast<int>(blockIdx.y * (BLOCK_W / 16) + 2 * warp);
  // The CTA's activation ring: with 32 tokens chunk kc's token rows go by one TMA box into slot
  // (kc - kc0) % kXStages, with 8 / 16 a scale group kg's 8 boxes into slot (kg - kg0) % kXStages (issued
  // at the previous group's start) (full[slot]: expect_tx); issued by the first warp to get there (a
  // ticket: atomicMax on `issued`), so no warp waits on another's issue; every warp with row tiles reads
  // its fragments and its lane 0 arrives on empty[slot]; a slot is refilled once every such warp released
  // it (issued by a single thread 0 instead, every warp waited on warp 0: 1-8 tokens 20% slower).
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + kLayout.barriers_offset);
  uint64_t* empty = full + kXStages;
  uint32_t* issued = reinterpret_cast<uint32_t*>(empty + kXStages);  // chunks (slot a group: groups) from kc0 issued
  const int cta_tiles =
      min(static_cast<int>(BLOCK_W / 16), p.row_tiles - static_cast<int>(blockIdx.y * (BLOCK_W / 16)));
  if (cta_tiles <= 0) return;  // CTA-uniform
  if (threadIdx.x == 0) {
    if ((smem_u32(smem) & (plan::kWgmmaSwizzleAtom - 1)) != 0) __trap();  // the swizzle needs it aligned
    *issued = 0;
#pragma unroll
    for (uint32_t s = 0; s < kXStages; ++s) {
      Barrier::init(full + s, 1);
      Barrier::init(empty + s, static_cast<uint32_t>(cta_tiles + 1) / 2);  // the warps with row tiles
    }
    cutlass::arch::fence_barrier_init();
  }
  __syncthreads();
  if (rt0 >= p.row_tiles) return;  // no barrier below: a warp may leave on its own
  // An odd row-tile count: the last warp's second tile does not exist; it streams tile rt0 twice
  // (in bounds, same bytes) and stores only the first.
  const bool has1 = rt0 + 1 < p.row_tiles;

  const int64_t tile0 = static_cast<int64_t>(item.expert) * p.row_tiles + rt0;
  const int64_t tile1 = has1 ? tile0 + 1 : tile0;
  // This lane's 16 B of chunk 0 of the current scale group (advanced a group at a time below).
  const uint8_t* codes0 = p.w_codes + tile0 * p.k_chunks * kW4A16TileBytes + lane * 16;
  const uint8_t* codes1 = p.w_codes + tile1 * p.k_chunks * kW4A16TileBytes + lane * 16;
  const uint8_t* scales0 = p.w_scales + tile0 * p.k_groups * kW4A16TileBytes + lane * 16;
  const uint8_t* scales1 = p.w_scales + tile1 * p.k_groups * kW4A16TileBytes + lane * 16;
  // This lane's 16 B in its warp's code rings (plan::W4A16Layout, kStream: ring_code_slot gives a slot's
  // offset from here, both tiles' codes).
  const uint32_t ring = smem_u32(smem) + kLayout.ring_offset + warp * kLayout.ring_warp_bytes + lane * 16;
  const uint8_t* ring_ptr = smem + kLayout.ring_offset + warp * kLayout.ring_warp_bytes + lane * 16;
  // CTA ring: lane (g, t)'s activations in a slot are token row 8 nt + g, 16 B units 2 t and 2 t + 1
  // of the row's 128 B (k = 16 t .. 16 t + 15), 128B-swizzled.
  const uint32_t x_lane0 = plan::w4a16_wgmma_swizzle(g, 2 * t), x_lane1 = plan::w4a16_wgmma_swizzle(g, 2 * t + 1);
  const uint32_t full_u32 = smem_u32(full), empty_u32 = smem_u32(empty);
  const uint4 zero = make_uint4(0, 0, 0, 0);

  // This CTA's K part (split-K: blockIdx.z): scale groups [kg0, kg1), chunks [kc0, kc_end).
  const int kg0 = static_cast<int>(blockIdx.z) * p.groups_per_part;
  const int kg1 = min(kg0 + p.groups_per_part, p.k_groups);
  const int kc0 = kg0 * static_cast<int>(kW4A16ScaleGroup);
  const int kc_end = min(kg1 * static_cast<int>(kW4A16ScaleGroup), p.k_chunks);

  codes0 += static_cast<int64_t>(kc0) * kW4A16TileBytes;
  codes1 += static_cast<int64_t>(kc0) * kW4A16TileBytes;
  // Ticket i of the CTA ring (chunk i from kc0 with a slot a chunk, scale group i from kg0 with a slot a
  // group), asked for when `wanted`: the first warp to ask for it (its lane 0) issues the slot's boxes, of
  // chunk c0 (a slot a chunk) or of chunks c0 .. c0 + 7 short of kc_end (a slot a group), rows past M_total
  // and k past K read as zeros, into slot i % kXStages, once every warp released the slot's previous ticket
  // i - kXStages. Each warp asks for its tickets in order, so `issued` >= i here: equal means no warp took
  // ticket i yet.
  auto issue_boxes = [&](bool wanted, uint32_t i, int c0) {
    if (lane == 0 && wanted && atomicMax(issued, i + 1) == i) {
      const uint32_t xslot = i % kXStages;
      if (i >= kXStages) Barrier::wait(empty + xslot, (i / kXStages - 1) & 1u);
      const int n = kXGroup ? min(static_cast<int>(kW4A16ScaleGroup), kc_end - c0) : 1;
      Barrier::arrive_and_expect_tx(full + xslot, static_cast<uint32_t>(n) * BLOCK_T * 128);
      for (int j = 0; j < n; ++j) {
        cute::SM90_TMA_LOAD_2D::copy(
            &x_map, full + xslot, static_cast<uint64_t>(cute::TMA::CacheHintSm90::EVICT_NORMAL),
            smem + kLayout.cta_x_box(xslot, static_cast<uint32_t>(j)), (c0 + j) * 64, item.row_begin);
      }
    }
  };
  // Group slots: scale group kg's activations, issued a group ahead.
  auto issue_group = [&](int kg) {
    issue_boxes(kg < kg1, static_cast<uint32_t>(kg - kg0), kg * static_cast<int>(kW4A16ScaleGroup));
  };
  // Chunk kc of both tiles' codes (chunk `rel` of the current group's codes0 / codes1) -> slot `slot`
  // (kc % STAGES) of the warp's code rings, one commit group per chunk, STAGES - 1 chunks ahead.
  // `checked`: a chunk past kc_end copies nothing; unchecked, the caller knows kc < kc_end (no predicate,
  // no address select). With a slot a chunk (32 tokens) also chunk kc's activations: one TMA box of its
  // token rows into the CTA's ring (rows of the next items or past M_total, and k past K, read as zeros
  // or land in columns never stored); with a slot a group they come by issue_group. Every call passes a
  // constant, so the branch folds away after inlining (a generic lambda taking run_group's
  // std::bool_constant crashes nvcc 13.0's cicc here).
  auto load_chunk = [&](bool checked, int kc, int rel, uint32_t slot) {
    const int64_t off = static_cast<int64_t>(rel) * kW4A16TileBytes;
    if (checked) {
      const bool ok = kc < kc_end;
      cp_async_16(ring + kLayout.ring_code_slot(0, slot), ok ? static_cast<const void*>(codes0 + off) : p.w_codes, ok);
      cp_async_16(ring + kLayout.ring_code_slot(1, slot), ok ? static_cast<const void*>(codes1 + off) : p.w_codes, ok);
    } else {
      cp_async_16(ring + kLayout.ring_code_slot(0, slot), codes0 + off);
      cp_async_16(ring + kLayout.ring_code_slot(1, slot), codes1 + off);
    }
    cp_async_commit();
    // With a slot a chunk, chunk kc's token rows (with a slot a scale group they come by issue_group).
    if constexpr (!kXGroup) issue_boxes(!checked || kc < kc_end, static_cast<uint32_t>(kc - kc0), kc);
  };

  float acc[2][kNTiles][4];
#pragma unroll
  for (uint32_t h = 0; h < 2; ++h) {
#pragma unroll
    for (uint32_t j = 0; j < kNTiles; ++j) {
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[h][j][i] = 0.0f;
    }
  }
  if constexpr (kXGroup) issue_group(kg0);
#pragma unroll
  for (uint32_t d = 0; d + 1 < STAGES; ++d) {
    const int kc = kc0 + static_cast<int>(d);
    load_chunk(true, kc, static_cast<int>(d), static_cast<uint32_t>(kc) % STAGES);
  }
  auto group_of = [&](const uint8_t* sc, int kg) {
    return kg < kg1 ? __ldg(reinterpret_cast<const uint4*>(sc + kg * kW4A16TileBytes)) : zero;
  };
  uint4 sg0 = group_of(scales0, kg0), sg1 = group_of(scales1, kg0);
  uint4 sg0_next = group_of(scales0, kg0 + 1), sg1_next = group_of(scales1, kg0 + 1);

  // One scale group (8 chunks). Checked groups (the part's last groups, and any group whose
  // prefetch reaches a K tail) test every prefetch against [kc0, kc_end) and K; in the unchecked
  // groups before them every prefetch is in range, so the chunk step has no range predicates, no
  // address selects and constant offsets from the group's code pointers.
  auto run_group = [&](auto checked, int kg) {
    const uint32_t slot0 = (static_cast<uint32_t>(kg) * kW4A16ScaleGroup) % STAGES;
    // Group slots: the next group's boxes, then this group's landed.
    [[maybe_unused]] uint32_t gslot = 0, gx = 0;
    if constexpr (kXGroup) {
      issue_group(kg + 1);
      const uint32_t gi = static_cast<uint32_t>(kg - kg0);
      gslot = gi % kXStages;
      ptx::mbarrier_wait_parity(full_u32 + 8 * gslot, (gi / kXStages) & 1u);
      gx = smem_u32(smem) + kLayout.cta_x_slot(gslot);
    }
#pragma unroll
    for (uint32_t j = 0; j < kW4A16ScaleGroup; ++j) {
      const int kc = kg * static_cast<int>(kW4A16ScaleGroup) + static_cast<int>(j);
      if (kc < kc_end) {  // also in unchecked groups: a per-chunk block keeps ptxas from hoisting
                          // the next chunks' scale words and loads (register pressure)
        // Groups 0 .. kc + STAGES - 2 are committed: at most STAGES - 2 pending means chunk kc landed
        // (this lane's copies: the lane reads back only its own bytes).
        cp_async_wait<static_cast<int>(STAGES) - 2>();
        const uint32_t slot = (slot0 + j) % STAGES;
        const uint4 w0 = *reinterpret_cast<const uint4*>(ring_ptr + kLayout.ring_code_slot(0, slot));
        const uint4 w1 = *reinterpret_cast<const uint4*>(ring_ptr + kLayout.ring_code_slot(1, slot));
        // Chunk kc's activations in the CTA ring (its group's slot, box j; or its own slot, waited for here):
        // each n8 tile's fragments are loaded just before its MMAs (fewer live registers), and a chunk's
        // own slot released after the last.
        uint32_t xs = 0;
        [[maybe_unused]] uint32_t xslot = 0;
        if constexpr (kXGroup) {
          xs = gx + j * (BLOCK_T * 128);
        } else {
          const uint32_t xi = static_cast<uint32_t>(kc - kc0);
          xslot = xi % kXStages;
          ptx::mbarrier_wait_parity(full_u32 + 8 * xslot, (xi / kXStages) & 1u);
          xs = smem_u32(smem) + kLayout.cta_x_slot(xslot);
        }
        // Into the slots chunk kc - 1 used (its reads above completed: the previous step's MMAs used them).
        load_chunk(decltype(checked)::value, kc + static_cast<int>(STAGES) - 1, static_cast<int>(j + STAGES) - 1,
                   (slot0 + j + STAGES - 1) % STAGES);
        uint32_t a0[4][4], a1[4][4];
        {
          uint32_t sc_lo, sc_hi;
          w4a16_chunk_scales(sg0, j, sc_lo, sc_hi);
          w4a16_chunk_fragments(w0, sc_lo, sc_hi, a0);
          w4a16_chunk_scales(sg1, j, sc_lo, sc_hi);
          w4a16_chunk_fragments(w1, sc_lo, sc_hi, a1);
        }
#pragma unroll
        for (uint32_t nt = 0; nt < kNTiles; ++nt) {
          uint32_t b[4][2];
          w4a16_b_from_words(ptx::ld_shared_v4(xs + nt * 1024 + x_lane0), ptx::ld_shared_v4(xs + nt * 1024 + x_lane1),
                             b);
#pragma unroll
          for (int s = 0; s < 4; ++s) {
            mma_bf16_m16n8k16(acc[0][nt], a0[s], b[s]);
            mma_bf16_m16n8k16(acc[1][nt], a1[s], b[s]);
          }
        }
        if constexpr (!kXGroup) {
          __syncwarp();  // every lane's reads of the slot are done
          if (lane == 0) ptx::mbarrier_arrive(empty_u32 + 8 * xslot);
        }
      }
    }
    if constexpr (kXGroup) {
      __syncwarp();  // every lane's reads of the group's slot are done
      if (lane == 0) ptx::mbarrier_arrive(empty_u32 + 8 * gslot);
    }
    codes0 += kW4A16ScaleGroup * kW4A16TileBytes;
    codes1 += kW4A16ScaleGroup * kW4A16TileBytes;
    sg0 = sg0_next;
    sg1 = sg1_next;
    sg0_next = group_of(scales0, kg + 2);
    sg1_next = group_of(scales1, kg + 2);
  };
  const int fast_end = w4a16_stream_unchecked_end(kg0, kg1, kc_end, p.k, STAGES);
  int kg = kg0;
  for (; kg < fast_end; ++kg) run_group(std::false_type{}, kg);
  for (; kg < kg1; ++kg) run_group(std::true_type{}, kg);
  cp_async_wait<0>();  // the copies past K are zero-size; drain before the warp leaves

  // C fragment of tile h: rows 16 rt + g (+8), tokens 8 nt + 2 t (+1), rt = rt0 + h. kSwiGlu: row g is
  // gate row 8 rt + g and row g + 8 its up row (w4a16_repack_gate_up), output column 8 rt + g.
  const float f = epilogue_scale(p.global_scales, item.expert);
  const float fu = SWIGLU ? epilogue_scale(p.global_scales_up, item.expert) : f;
#pragma unroll
  for (uint32_t h = 0; h < 2; ++h) {
    if (h == 1 && !has1) break;
    const int rt = rt0 + static_cast<int>(h);
    if (p.partial != nullptr) {
      store_partial<kNTiles>(p, item, rt, lane, acc[h], f, fu);
    } else if constexpr (SWIGLU) {
      const int col = rt * 8 + static_cast<int>(g);
#pragma unroll
      for (uint32_t nt = 0; nt < kNTiles; ++nt) {
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          const int tok = static_cast<int>(nt * 8 + 2 * t) + i;
          if (tok < item.rows && col < p.n_out) {
            p.y[static_cast<int64_t>(item.row_begin + tok) * p.n_out + col] =
                __float2bfloat16_rn(swiglu(acc[h][nt][i] * f, acc[h][nt][i + 2] * fu));
          }
        }
      }
    } else {
      const int row0 = rt * 16 + static_cast<int>(g);
#pragma unroll
      for (uint32_t nt = 0; nt < kNTiles; ++nt) {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int tok = static_cast<int>(nt * 8 + 2 * t) + (i & 1);
          const int row = row0 + 8 * (i >> 1);
          if (tok < item.rows && row < p.n) {
            p.y[static_cast<int64_t>(item.row_begin + tok) * p.n + row] = __float2bfloat16_rn(acc[h][nt][i] * f);
          }
        }
      }
    }
  }
}

// ---- kPipeline: cp.async through shared memory ---------------------------------------------------
template <uint32_t BLOCK_W, uint32_t BLOCK_T, uint32_t BLOCK_K, uint32_t STAGES, bool SWIGLU>
__global__ void __launch_bounds__(BLOCK_W / 16 * 32,
                                  w4a16_ctas_per_sm(W4A16Config{BLOCK_W, BLOCK_T, BLOCK_K, STAGES},
                                                    W4A16Layout::make(W4A16Config{BLOCK_W, BLOCK_T, BLOCK_K, STAGES}).total_bytes()))
    sm90_nvfp4_w4a16_pipeline_kernel(const KernelParams p) {
  constexpr W4A16Layout kLayout = W4A16Layout::make(W4A16Config{BLOCK_W, BLOCK_T, BLOCK_K, STAGES});
  static_assert(kLayout.fits(kSm90SmemOptinBytes), "config exceeds the sm_90 opt-in shared memory");
  constexpr uint32_t kXOff = kLayout.x_tile_offset, kWOff = kLayout.w_tiles_offset, kStride = kLayout.stage_stride;
  constexpr uint32_t kSOff = kLayout.w_scales_offset;
  constexpr uint32_t kEpiOff = kLayout.epilogue_offset, kEpiRow = kLayout.epilogue_row_bytes;
  constexpr uint32_t kThreads = BLOCK_W / 16 * 32;
  constexpr uint32_t kRowTiles = BLOCK_W / 16;
  constexpr uint32_t kNTiles = BLOCK_T / 8;
  constexpr uint32_t kChunks = BLOCK_K / 64;                   // chunks per stage
  static_assert(BLOCK_K % 64 == 0 && kW4A16ScaleGroup % kChunks == 0, "tile shape");

  extern __shared__ __align__(128) uint8_t smem[];

  WorkItem item;
  if (!find_work<static_cast<int>(BLOCK_T)>(p, static_cast<int>(blockIdx.x), item)) return;

  const uint32_t tid = threadIdx.x, lane = tid & 31u, warp = tid >> 5;
  const int rt0 = static_cast<int>(blockIdx.y * kRowTiles);
  const __nv_bfloat16* x_rows = p.x + static_cast<int64_t>(item.row_begin) * p.k;
  const int64_t tile0 = static_cast<int64_t>(item.expert) * p.row_tiles + rt0;
  // This CTA's K part (split-K: blockIdx.z): slices [kt0, kt0 + n_ktiles) of whole scale groups (a
  // slice of kChunks chunks never straddles a group, so parts never share a slice).
  const int kg0 = static_cast<int>(blockIdx.z) * p.groups_per_part;
  const int kc_end = min((kg0 + p.groups_per_part) * static_cast<int>(kW4A16ScaleGroup), p.k_chunks);
  const int kt0 = kg0 * static_cast<int>(kW4A16ScaleGroup / kChunks);
  const int n_ktiles = (kc_end + static_cast<int>(kChunks) - 1) / static_cast<int>(kChunks) - kt0;
  const uint32_t smem_base = smem_u32(smem);

  // Issues the copies of K slice `kt` (chunks kt * kChunks ..) into stage `slot` (no commit).
  auto load_stage = [&](uint32_t slot, int kt) {
    const int k0 = kt * static_cast<int>(BLOCK_K);
    constexpr uint32_t kXPieces = BLOCK_T * BLOCK_K / 8;  // 16 B = 8 bf16
#pragma unroll
    for (uint32_t i = tid; i < kXPieces; i += kThreads) {
      const uint32_t r = i / (BLOCK_K / 8), c = i % (BLOCK_K / 8);
      const int k = k0 + static_cast<int>(c * 8);
      const bool ok = static_cast<int>(r) < item.rows && k < p.k;
      const void* src = ok ? static_cast<const void*>(x_rows + static_cast<int64_t>(r) * p.k + k) : p.x;
      cp_async_16(smem_base + kXOff + slot * kStride + x_tile_offset<BLOCK_K>(r, c), src, ok);
    }
    constexpr uint32_t kWPieces = kRowTiles * kChunks * (kW4A16TileBytes / 16);
#pragma unroll
    for (uint32_t i = tid; i < kWPieces; i += kThreads) {
      const uint32_t rtl = i / (kChunks * 32), rem = i % (kChunks * 32);
      const int kc = kt * static_cast<int>(kChunks) + static_cast<int>(rem / 32);
      const bool ok = rt0 + static_cast<int>(rtl) < p.row_tiles && kc < p.k_chunks;
      const void* src =
          ok ? static_cast<const void*>(p.w_codes + ((tile0 + rtl) * p.k_chunks + kc) * kW4A16TileBytes + (rem % 32) * 16)
             : static_cast<const void*>(p.w_codes);
      cp_async_16(smem_base + kWOff + slot * kStride + i * 16, src, ok);
    }
    // Scales: lane L of row tile rtl copies bytes 2 j0 .. 2 j0 + 2 kChunks - 1 of its 16 B in group
    // kt * kChunks / 8, where j0 = kt * kChunks % 8.
    constexpr uint32_t kSPieces = kRowTiles * 32;
    const int kc0 = kt * static_cast<int>(kChunks);
    const int kg = kc0 / static_cast<int>(kW4A16ScaleGroup), j0 = kc0 % static_cast<int>(kW4A16ScaleGroup);
#pragma unroll
    for (uint32_t i = tid; i < kSPieces; i += kThreads) {
      const uint32_t rtl = i / 32, ln = i % 32;
      const bool ok = rt0 + static_cast<int>(rtl) < p.row_tiles && kc0 < p.k_chunks;
      const void* src = ok ? static_cast<const void*>(p.w_scales + ((tile0 + rtl) * p.k_groups + kg) * kW4A16TileBytes +
                                                      ln * 16 + 2 * j0)
                           : static_cast<const void*>(p.w_scales);
      cp_async_ca<static_cast<int>(2 * kChunks)>(smem_base + kSOff + slot * kStride + i * 2 * kChunks, src, ok);
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
    if (static_cast<int>(s) < n_ktiles) load_stage(s, kt0 + static_cast<int>(s));
    cp_async_commit();  // always commit, so that group i holds slice kt0 + i
  }

  for (int i = 0; i < n_ktiles; ++i) {
    cp_async_wait<static_cast<int>(STAGES) - 2>();  // slice kt0 + i has landed (this thread's copies)
    __syncthreads();                                // ... everyone's; slot (i-1) % S is free
    const int next = i + static_cast<int>(STAGES) - 1;
    if (next < n_ktiles) load_stage(static_cast<uint32_t>(next) % STAGES, kt0 + next);
    cp_async_commit();

    const int kt = kt0 + i;
    const uint32_t slot = static_cast<uint32_t>(i) % STAGES;
    const uint8_t* x_tile = smem + kXOff + slot * kStride;
    const uint8_t* w_tile = smem + kWOff + slot * kStride + warp * kChunks * kW4A16TileBytes + lane * 16;
    const uint8_t* s_tile = smem + kSOff + slot * kStride + (warp * 32 + lane) * 2 * kChunks;
#pragma unroll
    for (uint32_t kcl = 0; kcl < kChunks; ++kcl) {
      if (kt * static_cast<int>(kChunks) + static_cast<int>(kcl) < p.k_chunks) {
        uint32_t sc_lo, sc_hi;
        w4a16_pair_scales(*reinterpret_cast<const uint16_t*>(s_tile + 2 * kcl), sc_lo, sc_hi);
        uint32_t a[4][4];
        w4a16_chunk_fragments(*reinterpret_cast<const uint4*>(w_tile + kcl * kW4A16TileBytes), sc_lo, sc_hi, a);
#pragma unroll
        for (uint32_t j = 0; j < kNTiles; ++j) {
          uint32_t b[4][2];
          load_b_fragments<BLOCK_K>(x_tile, j * 8, kcl, lane, b);
#pragma unroll
          for (int s = 0; s < 4; ++s) mma_bf16_m16n8k16(acc[j], a[s], b[s]);
        }
      }
    }
  }
  cp_async_wait<0>();  // only empty groups remain; drain them before the CTA exits

  // One m-block: acc is acc[0] of write_output_tile's [kMB][n8 tiles][4].
  write_output_tile<BLOCK_W, BLOCK_T, kThreads, kEpiRow, SWIGLU>(
      p, item, rt0, tid, reinterpret_cast<const float(&)[1][kNTiles][4]>(acc), smem + kEpiOff);
}

// The sum over parts, in part order, of partial[part, at .. at + 3]. kLoadsFirst: every part's load is
// issued before the first add (parts <= kW4A16MaxSplitK), so the reads of the parts (just written, from
// L2) overlap instead of following one another; it takes more registers (66 a thread, fewer resident
// warps), which a grid of many blocks misses more than it gains.
template <bool kLoadsFirst>
__device__ __forceinline__ float4 splitk_sum4(const float* __restrict__ partial, int parts, int64_t plane, int64_t at) {
  if constexpr (kLoadsFirst) {
    float4 v[kW4A16MaxSplitK];
#pragma unroll
    for (int part = 0; part < kW4A16MaxSplitK; ++part) {
      if (part < parts) v[part] = *reinterpret_cast<const float4*>(partial + part * plane + at);
    }
    float4 sum = v[0];
#pragma unroll
    for (int part = 1; part < kW4A16MaxSplitK; ++part) {
      if (part < parts) {
        sum.x += v[part].x;
        sum.y += v[part].y;
        sum.z += v[part].z;
        sum.w += v[part].w;
      }
    }
    return sum;
  } else {
    float4 sum = *reinterpret_cast<const float4*>(partial + at);
    for (int part = 1; part < parts; ++part) {
      const float4 v = *reinterpret_cast<const float4*>(partial + part * plane + at);
      sum.x += v.x;
      sum.y += v.y;
      sum.z += v.z;
      sum.w += v.w;
    }
    return sum;
  }
}

// Split-K: for the rows of the expert ranges [offsets[0], offsets[E]) (all rows without offsets: the
// rows the parts wrote), y[r, c] = bf16(s[r, c]) with s the sum over parts, in part order, of
// partial[part, r, :]; SwiGLU: y [rows, n / 2], y[r, c] = bf16(silu(s[r, gate row]) x s[r, up row]),
// the rows of w4a16_repack_gate_up (gate 16 (c / 8) + c % 8, up 8 rows after). 4 outputs a thread.
// kLoadsFirst (small grids): the loop runs over all m_total rows, so a thread's partial sums are read
// without waiting for the offsets (in range: the workspace holds m_total rows a part), and stores only
// the rows in [offsets[0], offsets[E]).
template <bool SWIGLU, bool kLoadsFirst>
__global__ void __launch_bounds__(256)
    w4a16_splitk_reduce_kernel(const float* __restrict__ partial, int parts, const int32_t* __restrict__ offsets,
                               int32_t n_experts, int32_t m_total, int32_t n, __nv_bfloat16* __restrict__ y) {
  const int r0 = offsets == nullptr ? 0 : min(max(__ldg(offsets), 0), m_total);
  const int r1 = offsets == nullptr ? m_total : min(max(__ldg(offsets + n_experts), r0), m_total);
  const int n_out = SWIGLU ? n / 2 : n;
  // kLoadsFirst: every row, stored only in [r0, r1) (its loads do not wait for the offsets).
  const int64_t row_begin = kLoadsFirst ? 0 : r0;
  const int64_t quads = static_cast<int64_t>(kLoadsFirst ? m_total : r1 - r0) * n_out / 4;
  const int64_t plane = static_cast<int64_t>(m_total) * n;
  for (int64_t q = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; q < quads;
       q += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t o = row_begin * n_out + 4 * q;  // first of the 4 outputs
    const int64_t r = o / n_out;
    float v[4];
    if constexpr (SWIGLU) {
      const int64_t c = o % n_out;  // c % 4 == 0: the 4 share a gate/up row tile
      const int64_t gate = r * n + 16 * (c / 8) + c % 8;
      const float4 sg = splitk_sum4<kLoadsFirst>(partial, parts, plane, gate),
                   su = splitk_sum4<kLoadsFirst>(partial, parts, plane, gate + 8);
      v[0] = swiglu(sg.x, su.x);
      v[1] = swiglu(sg.y, su.y);
      v[2] = swiglu(sg.z, su.z);
      v[3] = swiglu(sg.w, su.w);
    } else {
      const float4 s = splitk_sum4<kLoadsFirst>(partial, parts, plane, o);
      v[0] = s.x;
      v[1] = s.y;
      v[2] = s.z;
      v[3] = s.w;
    }
    if (kLoadsFirst && (r < r0 || r >= r1)) continue;
    __nv_bfloat162* out = reinterpret_cast<__nv_bfloat162*>(y + o);
    out[0] = __floats2bfloat162_rn(v[0], v[1]);
    out[1] = __floats2bfloat162_rn(v[2], v[3]);
  }
}

using LaunchFn = void (*)(const KernelParams&, dim3, cudaStream_t);

template <int I, bool SWIGLU>
void launch_config(const KernelParams& p, dim3 grid, cudaStream_t stream) {
  constexpr W4A16Config c = kW4A16Configs[I];
  if constexpr (c.kind == W4A16Kind::kWgmma) {
    launch_wgmma(I, SWIGLU, p, grid, stream);  // w4a16_wgmma.cu
  } else if constexpr (c.kind == W4A16Kind::kStream) {
    // The activations' TMA descriptor for the CTA's ring (every stream tile has one).
    static_assert(W4A16Layout::stream_cta_x_ring(c));
    launch_with_smem(sm90_nvfp4_w4a16_stream_kernel<c.block_w, c.block_t, c.stages, SWIGLU>,
                     W4A16Layout::make(c).total_bytes(), c.n_threads(), grid, stream, p, make_x_map(p, c.block_t));
  } else {
    launch_with_smem(sm90_nvfp4_w4a16_pipeline_kernel<c.block_w, c.block_t, c.block_k, c.stages, SWIGLU>,
                     W4A16Layout::make(c).total_bytes(), c.n_threads(), grid, stream, p);
  }
}

template <bool SWIGLU, int... I>
constexpr std::array<LaunchFn, sizeof...(I)> make_launch_table(std::integer_sequence<int, I...>) {
  return {&launch_config<I, SWIGLU>...};
}
constexpr auto kLaunchTable = make_launch_table<false>(std::make_integer_sequence<int, kNumW4A16Configs>{});
constexpr auto kLaunchTableSwiGlu = make_launch_table<true>(std::make_integer_sequence<int, kNumW4A16Configs>{});

}  // namespace

void w4a16_grouped_gemm(const W4A16GroupedGemmArgs& args, int config_id, cudaStream_t stream) {
  const W4A16Config& c = w4a16_config(config_id);
  w4a16_check_problem(args, c);
  if (args.m_total == 0) return;
  const DeviceLimits limits = current_device_limits();
  w4a16_check_config(c, limits.smem_optin_per_block);

  const bool swiglu = args.epilogue == W4A16Epilogue::kSwiGlu;
  const W4A16SplitK split = w4a16_splitk_plan(args, c, limits.sm_count);
  KernelParams p{args.x, args.expert_offsets, args.w_packed, args.w_scales, args.w_global_scales,
                       args.w_global_scales_up != nullptr ? args.w_global_scales_up : args.w_global_scales, args.y,
                       static_cast<int32_t>(args.m_total), static_cast<int32_t>(args.n),
                       static_cast<int32_t>(args.k), static_cast<int32_t>(args.n_experts),
                       static_cast<int32_t>(w4a16_row_tiles(args.n)), static_cast<int32_t>(w4a16_k_chunks(args.k)),
                       static_cast<int32_t>(w4a16_k_groups(args.k)),
                       static_cast<int32_t>(swiglu ? args.n / 2 : args.n),
                       static_cast<int32_t>(split.groups_per_part),
                       split.parts > 1 ? args.splitk_workspace : nullptr,
                       args.min_expert_rows, args.max_expert_rows};
  const W4A16Grid grid = w4a16_grid(args, c);
  (swiglu ? kLaunchTableSwiGlu : kLaunchTable)[static_cast<size_t>(config_id)](
      p, dim3(static_cast<unsigned>(grid.x), static_cast<unsigned>(grid.y), static_cast<unsigned>(split.parts)),
      stream);
  if (split.parts > 1) {
    const auto [blocks, loads_first] = w4a16_splitk_reduce_launch(args);
    const auto kernel =
        swiglu ? (loads_first ? w4a16_splitk_reduce_kernel<true, true> : w4a16_splitk_reduce_kernel<true, false>)
               : (loads_first ? w4a16_splitk_reduce_kernel<false, true> : w4a16_splitk_reduce_kernel<false, false>);
    kernel<<<blocks, 256, 0, stream>>>(args.splitk_workspace, split.parts, args.expert_offsets,
                                       static_cast<int32_t>(args.n_experts), static_cast<int32_t>(args.m_total),
                                       static_cast<int32_t>(args.n), args.y);
    FP4MOE_CUDA_CHECK(cudaGetLastError());
  }
}

}  // namespace fp4moe::cuda::sm90
