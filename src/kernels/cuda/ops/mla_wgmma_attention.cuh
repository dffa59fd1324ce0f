// MLA decode attention on Hopper's wgmma (sm_90a), the absorbed form: two warpgroups attend 16 heads of one sequence
// to its keys [key_begin, key_end), 64 keys a tile, with the f32 accuracy of mla_mma_attention.cuh (q and P as three
// bf16 parts each: their f32 values, bf16 x bf16 products being exact in f32) and the same outputs (mla_mma::Args:
// f32 latent, or mla_project_v's bf16 hi / lo rows, and the split's log-sum-exp).
//
// Why: the mma.sync CTA (16 heads x 32 keys, four warps, two CTAs an SM) issues ~840 instructions a warp a tile
// (816 m16n8k16 MMAs a CTA: 3 parts of q and of P). Here a tile is 36 wgmma m64n48k16 for the scores and 4 x MB
// m64n48k16 for P x c_kv, both operands read from shared memory by the tensor cores.
//
// Per tile (mla_wgmma_smem_layout; one barrier makes tile `it` visible and frees tile it - 1's buffer):
//   - cp.async of the 64 keys' cache rows (four threads a key, rows located through `rows` a tile ahead, as
//     mla_mma::attend) into the 128B-swizzled tile, zeros past the list and for refused rows;
//   - scores^T [64 keys x 48] = tile [keys x dims] x q^T, q's parts stacked along N, warpgroup wg taking the k16
//     steps 2 i + wg; thread (warp w of its warpgroup, lane 4 g + t) holds keys 16 w + g (+ 8) and, of each part,
//     heads 2 t, 2 t + 1, 2 t + 8, 2 t + 9; it adds the three parts, the two warpgroups' sums are exchanged (xch) and
//     added in the same order in both, then scaled (base 2) and masked past the list;
//   - the heads' tile maxima over the warp's 16 keys (shuffles), over the 4 warps through `red` (each warpgroup runs
//     the same softmax); P (three bf16 parts, rows part x 16 + head, keys along the row: K-major B) -> the p region,
//     warpgroup wg storing the keys 16 w + g + 8 wg;
//   - latent^T [dims x 48] += c_kv^T [dims x keys] x P^T: A is column block b of the same tile read MN-major
//     (transposed), warpgroup wg taking m64 blocks wg x ceil(MB / 2) + b; the parts' columns are summed at the end.
// The accumulators are modified by ordinary instructions (rescale) only after wgmma.wait_group 0.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>
#include <cute/arch/mma_sm90_desc.hpp>
#include <cute/arch/mma_sm90_gmma.hpp>
#include <cute/arch/mma_sm90_gmma_ext.hpp>
#include <utility>

#include "kernels/cuda/ops/bf16_parts.cuh"
#include "kernels/cuda/ops/mla_decode.h"
#include "kernels/cuda/ops/mla_mma_attention.cuh"
#include "kernels/cuda/ptx.cuh"
#include "plan/layout_sm90_w4a16.h"

namespace fp4moe::cuda::mla_wgmma {

namespace gmma = cute::SM90::GMMA;

constexpr int kThreads = 32 * kMlaWgWarps;  // two warpgroups
static_assert(kMlaWgWarps == 8 && kThreads == 4 * kMlaWgKeysPerTile, "four threads per key of a tile");
static_assert(kMlaPParts == 3 && kMlaHeadsPerCta == 16 && kMlaWgQRows == 48, "the wgmma shape below: m64n48 (3 x 16)");

using ScoresOp = gmma::MMA_64x48x16_F32BF16BF16_SS<gmma::Major::K, gmma::Major::K>;
using PvOp = gmma::MMA_64x48x16_F32BF16BF16_SS<gmma::Major::MN, gmma::Major::K>;
constexpr int kRegs = 24;  // 64 x 48 f32 over 128 threads

// 128B-swizzle descriptors and tiles: the W4A16 wgmma kind's (plan/layout_sm90_w4a16.h, checked against CuTe by
// test_wgmma_layout_host): w4a16_wgmma_desc_lo for K-major operands, w4a16_wgmma_desc_of_lo adds the constant high
// word; the low word is kept per thread and advanced by compile-time constants (16 B units). w4a16_wgmma_swizzle:
// 16 B chunk c (< 8) of row r of a column block.
static_assert(kMlaWgAtomBytes == plan::kWgmmaSwizzleAtom && kMlaWgColBytes == 128, "the W4A16 kind's 128B swizzle");
using plan::w4a16_wgmma_desc_lo;
using plan::w4a16_wgmma_desc_of_lo;
using plan::w4a16_wgmma_swizzle;
// An MN-major operand's low word: as w4a16_wgmma_desc_lo, with the leading byte offset (bits 16-29, >> 4) = the next
// 64 MN elements, one column block further.
__device__ __forceinline__ uint32_t desc_mn_lo(uint32_t addr, uint32_t next_mn_bytes) {
  return ((addr & 0x3FFFFu) >> 4) | (((next_mn_bytes >> 4) & 0x3FFFu) << 16);
}

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;
// 2^x (ex2.approx.ftz: 2^-inf = 0).
__device__ __forceinline__ float ex2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

template <class Op, size_t... I>
__device__ __forceinline__ void wgmma(uint64_t da, uint64_t db, float* d, bool zero, std::index_sequence<I...>) {
  Op::fma(da, db, d[I]..., zero ? gmma::ScaleOut::Zero : gmma::ScaleOut::One);
}
template <int N>
__device__ __forceinline__ void fence_regs(float* d) {
#pragma unroll
  for (int i = 0; i < N; ++i) cute::warpgroup_fence_operand(d[i]);
}

// MB = ceil(rank / 64) m64 blocks of latent dims, CB = ceil((rank + rope) / 64) column blocks (the scores take
// all CB x 4 k16 steps, the zeros past rank + rope included: a compile-time count, so that the wgmmas are one
// unrolled sequence; a loop's block boundaries made ptxas inject warpgroup.arrive between them, C7519). Called by
// all kThreads threads (barriers; CTA-uniform arguments); smem holds mla_wgmma_smem_layout(rank, rope).total_bytes.
template <int MB, int CB, class Rows>
__device__ __forceinline__ void attend(const mla_mma::Args& p, const Rows& rows, unsigned char* smem_raw) {
  // The offsets depend on CB alone: a compile-time layout (W below is the real rank + rope).
  constexpr MlaWgmmaSmemLayout L = mla_wgmma_smem_layout(64 * MB, 64 * (CB - MB));
  static_assert(L.m_blocks == MB && L.col_blocks == CB, "the layout's blocks");
  constexpr int kHalfSteps = 2 * CB;      // each warpgroup's k16 steps of the scores: 2 i + wg
  constexpr int kMbPerWg = (MB + 1) / 2;  // each warpgroup's m64 blocks of latent dims (MB 1: warpgroup 0's)
  const uint32_t raw = ptx::smem_u32(smem_raw);
  const uint32_t base = (raw + kMlaWgAtomBytes - 1) & ~static_cast<uint32_t>(kMlaWgAtomBytes - 1);
  unsigned char* smem = smem_raw + (base - raw);
  const int tid = static_cast<int>(threadIdx.x);
  const int wg = tid / 128, wt = tid % 128;  // warpgroup, thread within it
  const int warp = wt / 32, lane = tid % 32, g = lane >> 2, t = lane & 3;
  const int W = p.rank + p.rope;
  // The softmax in base 2 (ex2.approx: 2 instructions where expf took ~14; relative error ~2^-22): scores x
  // scale x log2(e), maxima in those units.
  const float scale_log2 = p.scale * kLog2e;
  const int data_chunks = W / 8;  // 16 B chunks of a cache row; chunks up to col_blocks x 8 are zeros
  const int key_end = p.key_end;
  const int n_keys = max(key_end - p.key_begin, 0);
  const int n_tiles = (n_keys + kMlaWgKeysPerTile - 1) / kMlaWgKeysPerTile;
  const uint32_t tiles_u32 = base + L.tiles_offset, q_u32 = base + L.q_offset, p_u32 = base + L.p_offset;
  float* red = reinterpret_cast<float*>(smem + L.red_offset) + wg * kMlaWarps * kMlaHeadsPerCta;  // this warpgroup's
  float4* xch = reinterpret_cast<float4*>(smem + L.xch_offset);  // [warpgroup][thread][2] partial scores

  // Thread i copies the chunks (i % 4) + 4 j of list entry k0 + i / 4 of a tile at k0; its row lookup is fetched a
  // tile ahead (as mla_mma::attend).
  const int key_j = tid >> 2, key_sub = tid & 3;
  // This thread's two chunks of each column block: 4 j + key_sub, swizzled by its key row.
  const uint32_t swz_off[2] = {static_cast<uint32_t>(((key_sub ^ key_j) & 7) << 4),
                               static_cast<uint32_t>((((4 + key_sub) ^ key_j) & 7) << 4)};
  mla_mma::AheadRow ahead;
  auto fetch_tile = [&](int k0) { ahead.fetch(rows, k0 + key_j, key_end); };
  auto copy_tile = [&](int buf) {
    const int64_t row = ahead.row(rows);
    const bool ok = row >= 0;  // else zero-filled (the source is not read)
    // A refused row reads nothing (src-size 0) from the cache base; chunks past W likewise. (The address can then lie
    // up to 128 B past the row, or ~1.1 KB past the base: not read; memcheck reports nothing, thirty-fifth session.)
    const char* src = reinterpret_cast<const char*>(p.cache + (ok ? row : 0)) + 16 * key_sub;
    const uint32_t dst = tiles_u32 + buf * L.tile_bytes + static_cast<uint32_t>(key_j) * kMlaWgColBytes;
#pragma unroll
    for (int cb = 0; cb < CB; ++cb) {
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const int c = 8 * cb + 4 * j;  // + key_sub
        ptx::cp_async_16(dst + cb * L.tile_col_bytes + swz_off[j], src + 16 * c, ok && c + key_sub < data_chunks);
      }
    }
    ptx::cp_async_commit();
  };
  if (n_tiles > 0) {
    fetch_tile(p.key_begin);
    copy_tile(0);
    if (n_tiles > 1) fetch_tile(p.key_begin + kMlaWgKeysPerTile);  // lands while q is split below
  }

  // q's three bf16 parts -> rows part x 16 + head of the q region (zeros for heads past n_heads and dims past W).
  for (int i = tid; i < kMlaHeadsPerCta * CB * 8; i += kThreads) {
    const int hl = i / (CB * 8), c = i - hl * (CB * 8);
    const int head = p.h0 + hl;
    float v[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
    if (head < p.n_heads && c < data_chunks) {
      const float2* q = reinterpret_cast<const float2*>(p.q + static_cast<int64_t>(head) * W + 8 * c);
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float2 x = q[e];
        v[2 * e] = x.x;
        v[2 * e + 1] = x.y;
      }
    }
    uint32_t parts[kMlaPParts][4];
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      uint32_t pp[kMlaPParts];
      mla_mma::split_bf16x2<kMlaPParts>(v[2 * e], v[2 * e + 1], pp);
#pragma unroll
      for (int part = 0; part < kMlaPParts; ++part) parts[part][e] = pp[part];
    }
#pragma unroll
    for (int part = 0; part < kMlaPParts; ++part) {
      const uint32_t r = static_cast<uint32_t>(part * kMlaHeadsPerCta + hl);
      ptx::st_shared_v4(q_u32 + (c >> 3) * L.q_col_bytes + w4a16_wgmma_swizzle(r, static_cast<uint32_t>(c & 7)),
                        make_uint4(parts[part][0], parts[part][1], parts[part][2], parts[part][3]));
    }
  }

  // o[b]: this warpgroup's m64 block wg x kMbPerWg + b of latent^T (dims 64 (..) + 16 warp + g, + 8 in regs 4 i + 2,
  // 4 i + 3) x 48 columns (P's part x 16 + head: n8 block i = 2 part + (head >= 8), head 8 (i & 1) + 2 t (+ 1)),
  // unnormalized f32, the parts summed at the end. Zeroed before any wgmma is in flight.
  float o[kMbPerWg][kRegs];
#pragma unroll
  for (int b = 0; b < kMbPerWg; ++b) {
#pragma unroll
    for (int r = 0; r < kRegs; ++r) o[b][r] = 0.0f;
  }
  const bool pv_here = MB > 1 || wg == 0;  // MB 1: warpgroup 1 has no block
  // This thread's four heads hh: 2 t + (hh & 1) + 8 (hh >> 1); their running maxima and the softmax sums' share
  // (the same in both warpgroups: each runs the whole softmax on the summed scores).
  float m_run[4] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY};
  float l_part[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  auto head_of = [&](int hh) { return 2 * t + (hh & 1) + 8 * (hh >> 1); };
  // The accumulator register of (n8 block 2 part + (hh >> 1), row g + 8 r, column 2 t + (hh & 1)).
  auto reg_of = [](int part, int hh, int r) { return 4 * (2 * part + (hh >> 1)) + 2 * r + (hh & 1); };

  // Descriptor low words: the scores' A (tile 0) and B (q) at this warpgroup's first k16 step, P x c_kv's A (tile 0,
  // this warpgroup's first m64 block) and B (P).
  const uint32_t a_lo0 = w4a16_wgmma_desc_lo(tiles_u32) + 2 * wg, b_lo0 = w4a16_wgmma_desc_lo(q_u32) + 2 * wg;
  const uint32_t pv_a_lo0 = desc_mn_lo(tiles_u32, L.tile_col_bytes) + wg * kMbPerWg * (L.tile_col_bytes >> 4);
  const uint32_t pv_b_lo = w4a16_wgmma_desc_lo(p_u32);
  // The P element this thread stores for head hh (key 16 warp + g + 8 wg, part 0; part x further by 16 rows).
  uint32_t p_st[4];
#pragma unroll
  for (int hh = 0; hh < 4; ++hh) {
    const uint32_t key = static_cast<uint32_t>(16 * warp + g + 8 * wg);
    p_st[hh] = p_u32 + w4a16_wgmma_swizzle(static_cast<uint32_t>(head_of(hh)), key >> 3) + (key & 7) * 2;
  }

  for (int it = 0; it < n_tiles; ++it) {
    const int k0 = p.key_begin + it * kMlaWgKeysPerTile;
    const int buf = it & 1;
    ptx::cp_async_wait<0>();          // tile `it`'s copies (issued a tile ago) landed
    ptx::fence_proxy_async_shared();  // this thread's cp.async / q / P stores -> the wgmma's async proxy
    // Tile `it` (and q) visible to both warpgroups; every warp is past tile it - 1 (its wgmmas waited for): its
    // buffer, P, red and xch are free.
    __syncthreads();
    if (it + 1 < n_tiles) {
      copy_tile(buf ^ 1);
      if (it + 2 < n_tiles) fetch_tile(k0 + 2 * kMlaWgKeysPerTile);
    }

    // Partial scores over this warpgroup's half of the k16 steps: 64 keys x (3 parts x 16 heads), one m64n48k16 a
    // step (32 B further along the 128 B rows; the next column block every 4 steps).
    float sc[kRegs];
    fence_regs<kRegs>(sc);
    cute::warpgroup_arrive();
    const uint32_t a_lo = a_lo0 + static_cast<uint32_t>(buf) * (L.tile_bytes >> 4);
#pragma unroll
    for (int i = 0; i < kHalfSteps; ++i) {
      // k16 step 2 i + wg: column block i / 2, 32 B x (2 (i % 2) + wg) along the rows (wg's part in a_lo0 / b_lo0).
      wgmma<ScoresOp>(w4a16_wgmma_desc_of_lo(a_lo + (i >> 1) * (L.tile_col_bytes >> 4) + (i & 1) * 4),
                      w4a16_wgmma_desc_of_lo(b_lo0 + (i >> 1) * (L.q_col_bytes >> 4) + (i & 1) * 4), sc, i == 0,
                      std::make_index_sequence<kRegs>{});
    }
    cute::warpgroup_commit_batch();
    cute::warpgroup_wait<0>();
    fence_regs<kRegs>(sc);
    // The parts' sum of this half (part 0 + part 1 + part 2), exchanged with the other warpgroup's: s[r][hh] =
    // (warpgroup 0's + warpgroup 1's) for key 16 warp + g + 8 r, head head_of(hh), the same bits in both.
    float s[2][4];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
#pragma unroll
      for (int hh = 0; hh < 4; ++hh) s[r][hh] = (sc[reg_of(0, hh, r)] + sc[reg_of(1, hh, r)]) + sc[reg_of(2, hh, r)];
    }
    xch[(wg * 128 + wt) * 2] = make_float4(s[0][0], s[0][1], s[0][2], s[0][3]);
    xch[(wg * 128 + wt) * 2 + 1] = make_float4(s[1][0], s[1][1], s[1][2], s[1][3]);
    __syncthreads();
    float tmax[4];
    {
      const float4 o0 = xch[((wg ^ 1) * 128 + wt) * 2], o1 = xch[((wg ^ 1) * 128 + wt) * 2 + 1];
      const float other[2][4] = {{o0.x, o0.y, o0.z, o0.w}, {o1.x, o1.y, o1.z, o1.w}};
#pragma unroll
      for (int hh = 0; hh < 4; ++hh) {
        tmax[hh] = -INFINITY;
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const float dot = wg == 0 ? s[r][hh] + other[r][hh] : other[r][hh] + s[r][hh];
          const int key = k0 + 16 * warp + g + 8 * r;
          const float v = key < key_end ? dot * scale_log2 : -INFINITY;
          s[r][hh] = v;
          tmax[hh] = fmaxf(tmax[hh], v);
        }
#pragma unroll
        for (int x = 4; x < 32; x <<= 1) tmax[hh] = fmaxf(tmax[hh], __shfl_xor_sync(mla_mma::kFullMask, tmax[hh], x));
      }
    }
    if (g == 0) {
#pragma unroll
      for (int hh = 0; hh < 4; ++hh) red[warp * kMlaHeadsPerCta + head_of(hh)] = tmax[hh];
    }
    __syncthreads();
    float corr[4];
#pragma unroll
    for (int hh = 0; hh < 4; ++hh) {
      float m_new = m_run[hh];
#pragma unroll
      for (int w = 0; w < kMlaWarps; ++w) m_new = fmaxf(m_new, red[w * kMlaHeadsPerCta + head_of(hh)]);
      corr[hh] = ex2(m_run[hh] - m_new);  // key k0 < key_end: m_new finite; m_run -inf: 0
      m_run[hh] = m_new;
    }
    // P -> the p region as three bf16 parts (rows part x 16 + head, key k at chunk k / 8 (swizzled), element
    // k % 8): warpgroup w stores the keys of r = w (p_st).
#pragma unroll
    for (int hh = 0; hh < 4; ++hh) {
      float pr[2];
#pragma unroll
      for (int r = 0; r < 2; ++r) pr[r] = ex2(s[r][hh] - m_run[hh]);  // a masked key (-inf): 0
      l_part[hh] = l_part[hh] * corr[hh] + (pr[0] + pr[1]);
      float x = wg == 0 ? pr[0] : pr[1];
#pragma unroll
      for (int part = 0; part < kMlaPParts; ++part) {
        const __nv_bfloat16 h = __float2bfloat16_rn(x);
        x -= __bfloat162float(h);  // exact (see mla_mma::split_bf16x2)
        ptx::st_shared_u16(p_st[hh] + part * kMlaHeadsPerCta * kMlaWgColBytes, __bfloat16_as_ushort(h));
      }
    }
    ptx::fence_proxy_async_shared();  // P -> the async proxy
    __syncthreads();                  // both warpgroups' P written (each wgmma reads all of it)
    if (pv_here) {
      // Rescale (no wgmma in flight: the scores were waited for, tile it - 1's P x c_kv too).
      if (corr[0] != 1.0f || corr[1] != 1.0f || corr[2] != 1.0f || corr[3] != 1.0f) {
#pragma unroll
        for (int b = 0; b < kMbPerWg; ++b) {
#pragma unroll
          for (int r = 0; r < kRegs; ++r) o[b][r] *= corr[(r & 1) + 2 * ((r >> 2) & 1)];
        }
      }
      // latent^T += c_kv^T x P^T over the tile's 4 k16 steps of keys (2,048 B of tile rows each), P's three parts
      // as 48 columns.
#pragma unroll
      for (int b = 0; b < kMbPerWg; ++b) fence_regs<kRegs>(o[b]);
      cute::warpgroup_arrive();
      const uint32_t a_lo = pv_a_lo0 + static_cast<uint32_t>(buf) * (L.tile_bytes >> 4);
#pragma unroll
      for (int kk = 0; kk < kMlaWgKeysPerTile / 16; ++kk) {
#pragma unroll
        for (int b = 0; b < kMbPerWg; ++b) {
          // m64 block wg x kMbPerWg + b (its column block), keys 16 kk .. (2,048 B of tile rows further).
          wgmma<PvOp>(w4a16_wgmma_desc_of_lo(a_lo + b * (L.tile_col_bytes >> 4) + kk * (16 * kMlaWgColBytes >> 4)),
                      w4a16_wgmma_desc_of_lo(pv_b_lo + kk * 2), o[b], false, std::make_index_sequence<kRegs>{});
        }
      }
      cute::warpgroup_commit_batch();
      cute::warpgroup_wait<0>();
#pragma unroll
      for (int b = 0; b < kMbPerWg; ++b) fence_regs<kRegs>(o[b]);
    }
  }

  // The softmax sums: over the warp's 8 key rows (g), then over the warpgroup's warps in warp order through red.
#pragma unroll
  for (int hh = 0; hh < 4; ++hh) {
#pragma unroll
    for (int x = 4; x < 32; x <<= 1) l_part[hh] += __shfl_xor_sync(mla_mma::kFullMask, l_part[hh], x);
  }
  __syncthreads();  // every warp's reads of red (the last tile's maxima) are done
  if (g == 0) {
#pragma unroll
    for (int hh = 0; hh < 4; ++hh) red[warp * kMlaHeadsPerCta + head_of(hh)] = l_part[hh];
  }
  __syncthreads();
  float inv[4], l_row[4];
#pragma unroll
  for (int hh = 0; hh < 4; ++hh) {
    l_row[hh] = 0.0f;
#pragma unroll
    for (int w = 0; w < kMlaWarps; ++w) l_row[hh] += red[w * kMlaHeadsPerCta + head_of(hh)];
    inv[hh] = l_row[hh] > 0.0f ? 1.0f / l_row[hh] : 0.0f;
  }

#pragma unroll
  for (int hh = 0; hh < 4; ++hh) {
    const int head = p.h0 + head_of(hh);
    if (head >= p.n_heads) continue;
    if (pv_here) {
#pragma unroll
      for (int b = 0; b < kMbPerWg; ++b) {
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const int dim = 64 * (wg * kMbPerWg + b) + 16 * warp + g + 8 * r;
          if (dim >= p.rank) continue;
          const float x = (o[b][reg_of(0, hh, r)] + o[b][reg_of(1, hh, r)]) + o[b][reg_of(2, hh, r)];
          if (p.parts != nullptr) {
            // __fmul_rn: the rounded product, as the f32 path stores it.
            __nv_bfloat16 hi, lo;
            bf16_hi_lo(__fmul_rn(x, inv[hh]), hi, lo);
            p.parts[static_cast<int64_t>(head) * p.rank + dim] = hi;
            p.parts[p.parts_lo + static_cast<int64_t>(head) * p.rank + dim] = lo;
          } else {
            p.out[head * p.out_head_stride + dim] = x * inv[hh];
          }
        }
      }
    }
    if (p.lse != nullptr && wg == 0 && warp == 0 && g == 0) {
      // Natural log-sum-exp for the merge: m in base-2 units.
      p.lse[head * p.lse_head_stride] = l_row[hh] > 0.0f ? m_run[hh] * kLn2 + logf(l_row[hh]) : -INFINITY;
    }
  }
}

}  // namespace fp4moe::cuda::mla_wgmma
