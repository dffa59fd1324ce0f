// The tensor-core core of MLA attention in the absorbed form, shared by the decode kernel
// (mla_decode.cu: keys 0..seq_len-1 of a sequence) and the prefill / DSA kernel (mla_prefill.cu:
// a query token's causal prefix or its DSA selection). One CTA of kMlaWarps warps attends 16 heads
// of one query row to a list of keys (list indices [key_begin, key_end); `rows.fetch(j)` issues the
// loads that locate list entry j's [c_kv | k_pe] row and `rows.resolve(f)` gives its cache element
// offset from them, or -1 after flagging why: see RowFetch):
//   - the keys come 32 at a time into a cp.async double buffer of bf16 rows (mla_mma_smem_layout;
//     4 threads per key, one row lookup each, fetched a tile ahead), zeros past the list and for
//     refused rows; one barrier a tile both makes tile `it` visible and frees the buffer and the scores
//     region of tile it - 1 (the refill of that buffer is issued after it);
//   - warp w scores the tile over k16 steps w, w + 4, ... (mma.sync m16n8k16, f32 accumulation)
//     with q as three bf16 parts (split_bf16x2<3>: the f32 q itself, so scores carry
//     only f32 accumulation error; with two parts the score error grows with |q . k| and the GLM-5
//     golden checks moved);
//   - warp w sums the four partial scores of n-tile w (keys 8 w .. 8 w + 7 of the tile) in shared
//     memory in warp order (scores x scale, as the CPU) and shares its maximum per head; every warp
//     takes the tile's maximum from the four, and warp w writes P of its n-tile (three bf16 parts)
//     to shared memory and keeps its share of the softmax sum (summed over the CTA at the end), so
//     no softmax work is repeated across warps (each used to run all of it: ~1,370 instructions a
//     warp a tile, Nsight Compute);
//   - warp w adds P (the three parts, ldmatrix) x c_kv over latent dims [w rank / 4, (w + 1) rank / 4)
//     (ldmatrix.trans of the same tile), rescaling its rows first unless no row's maximum moved.
// The result (divided by the softmax sum; zeros for an empty list) goes to out + head * out_head_stride
// (f32, rank wide), or as bf16 hi / lo parts to Args::parts, and, when lse != nullptr (a split of the list),
// m + log(l) to lse[head * lse_head_stride] (-inf for an empty split).
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "kernels/cuda/ops/bf16_parts.cuh"
#include "kernels/cuda/ops/device_errors.h"
#include "kernels/cuda/ops/mla_decode.h"
#include "kernels/cuda/ptx.cuh"

namespace fp4moe::cuda::mla_mma {

constexpr unsigned kFullMask = 0xffffffffu;
constexpr int kThreads = kMlaWarps * 32;

struct Args {
  const float* q;        // q_lat of this query row: [n_heads, rank + rope] f32 (8 B aligned)
  const __nv_bfloat16* cache;
  int n_heads;
  int h0;                // first head of this CTA (a multiple of 16)
  int rank;
  int rope;
  int key_begin, key_end;  // list indices this CTA walks
  float scale;
  float* out;            // latent of head 0 of this row (and split)
  int64_t out_head_stride;
  float* lse;            // split: log-sum-exp of head 0 (nullptr when the list is not split)
  int64_t lse_head_stride;
  // Instead of out (one split only): the result as two bf16 parts (bf16_hi_lo), hi at parts + head * rank + dim and
  // lo parts_lo further (mla_project_v's rows). nullptr: out.
  __nv_bfloat16* parts = nullptr;
  int64_t parts_lo = 0;
};

// A list entry's row lookup in two steps, so that the loads behind tile it + 1's rows are in flight
// during tile it (a table entry read and used at once stalled every warp of the CTA each tile):
// `fetch(j)` (j < key_end) issues the loads and returns their raw values without using them;
// `resolve(f)` checks them and gives the row's cache element offset, or -1 after flagging why. The
// decode and prefill kernels each pass an object with both (mla_decode.cu, mla_prefill.cu).
struct RowFetch {
  int32_t a = 0;  // the kernel's own meaning: a block id (decode), a key (prefill)
  int32_t b = 0;  // and the key's row within its block (decode)
};

// One thread's list entry of the next key tile (both attention CTAs): fetch issues its lookup a tile ahead (none
// for an entry at or past key_end), row resolves it when the tile's copies are issued (-1: past the end or refused).
struct AheadRow {
  RowFetch pending;
  bool in_list = false;
  template <class Rows>
  __device__ __forceinline__ void fetch(const Rows& rows, int entry, int key_end) {
    in_list = entry < key_end;
    if (in_list) pending = rows.fetch(entry);
  }
  template <class Rows>
  __device__ __forceinline__ int64_t row(const Rows& rows) const {
    return in_list ? rows.resolve(pending) : -1;
  }
};

// Token `key` (0 <= key < 2^31) as (its page's table index, its row within the page): 32-bit division.
__device__ __forceinline__ void key_page(int key, int page_size, uint32_t& page, uint32_t& within) {
  page = static_cast<uint32_t>(key) / static_cast<uint32_t>(page_size);
  within = static_cast<uint32_t>(key) - page * static_cast<uint32_t>(page_size);
}

// The cache element offset of row `within` of block `blk` (read from a block table), or -1 after
// flagging kDeviceErrorKvBlock for a block id outside [0, n_blocks).
__device__ __forceinline__ int64_t block_row(int64_t blk, uint32_t within, int page_size, int64_t n_blocks, int width,
                                             uint32_t* error_flag) {
  if (blk < 0 || blk >= n_blocks) {
    atomicOr(error_flag, kDeviceErrorKvBlock);
    return -1;
  }
  return (blk * page_size + within) * width;
}

// Keys through a sequence's block table (a list entry is a key: decode's 0..seq_len-1, a dense prefill
// query's 0..pos): fetch reads the key's block id, resolve checks it (block_row). The prefill kernel's
// DSA selection maps its entries to keys first and then looks each up at once (row).
struct TableRows {
  const int32_t* table;  // this sequence's block table
  int page_size;
  int64_t n_blocks;
  int width;  // rank + rope
  uint32_t* error_flag;
  __device__ __forceinline__ RowFetch fetch(int key) const {
    uint32_t page, within;
    key_page(key, page_size, page, within);
    return RowFetch{table[page], static_cast<int32_t>(within)};
  }
  __device__ __forceinline__ int64_t resolve(const RowFetch& f) const {
    return block_row(f.a, static_cast<uint32_t>(f.b), page_size, n_blocks, width, error_flag);
  }
  // Both steps at once (a key known only now: the table read is used at once).
  __device__ __forceinline__ int64_t row(int key) const {
    uint32_t page, within;
    key_page(key, page_size, page, within);
    return block_row(table[page], within, page_size, n_blocks, width, error_flag);
  }
};

// Where a query row's result goes: latent [rows, n_heads, rank] directly (one split), or the split
// workspace part_o [rows, n_heads, n_splits, rank] + part_lse [rows, n_heads, n_splits] that the
// merge kernel combines. row0 = query row x n_heads (head 0 of the row).
__device__ __forceinline__ void set_output(Args& a, float* latent, float* part_o, float* part_lse, int64_t row0,
                                           int rank, int n_splits, int split) {
  if (n_splits == 1) {
    a.out = latent + row0 * rank;
    a.out_head_stride = rank;
    a.lse = nullptr;
    a.lse_head_stride = 0;
  } else {
    a.out = part_o + (row0 * n_splits + split) * rank;
    a.out_head_stride = static_cast<int64_t>(n_splits) * rank;
    a.lse = part_lse + row0 * n_splits + split;
    a.lse_head_stride = n_splits;
  }
}

// f32 {x0, x1} as three bf16x2 parts, each the rounding of what the ones before left: x0 = p[0].x +
// p[1].x + p[2].x to within 2^-25 |x0| (8 + 8 + 8 of f32's 24 significant bits), so MMAs over the
// three parts multiply by the f32 value itself (bf16 x bf16 products are exact in f32).
template <int kParts = 3>
__device__ __forceinline__ void split_bf16x2(float x0, float x1, uint32_t p[kParts]) {
#pragma unroll
  for (int i = 0; i < kParts; ++i) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(x0, x1);
    const float2 hf = __bfloat1622float2(h);
    p[i] = *reinterpret_cast<const uint32_t*>(&h);
    x0 -= hf.x;  // exact (Sterbenz): hf is x rounded to 8 bits
    x1 -= hf.y;
  }
}

// NTW = rank / 32: the n8 tiles of latent dims each warp accumulates (rank / 4 dims per warp).
// Called by all kThreads threads of the CTA (it has barriers; CTA-uniform arguments); smem holds
// mla_mma_smem_layout(rank, rope).total_bytes.
template <int NTW, class Rows>
__device__ __forceinline__ void attend(const Args& p, const Rows& rows, unsigned char* smem) {
  const MlaMmaSmemLayout L = mla_mma_smem_layout(p.rank, p.rope);
  // q k16 steps one warp holds at most: (rank + the largest rope, kMlaMaxRope) / 16 over 4 warps.
  constexpr int kQSteps = ((32 * NTW + kMlaMaxRope) / 16 + kMlaWarps - 1) / kMlaWarps;
  static_assert(kQSteps <= kMlaMaxQStepsPerWarp, "q fragments per warp");
  // P as three bf16 parts too (kMlaPParts: f32-exact; with hi + lo, 2^-17 relative, the GLM-5 golden
  // checks moved).
  const int warp = static_cast<int>(threadIdx.x) / 32;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int g = lane >> 2, t = lane & 3;
  const int W = L.width;
  const int n_ksteps = W / 16;
  const int h0 = p.h0;
  const int key_end = p.key_end;
  const int n_tiles = max(key_end - p.key_begin, 0) / kAttnKeysPerTile +
                      (max(key_end - p.key_begin, 0) % kAttnKeysPerTile != 0 ? 1 : 0);
  const uint32_t tiles_u32 = ptx::smem_u32(smem);
  float4* scores = reinterpret_cast<float4*>(smem + L.scores_offset);  // [warp][n-tile][lane]
  unsigned char* p_smem = smem + L.p_offset;  // [part][head row] x kMlaPRowBytes
  const uint32_t p_u32 = tiles_u32 + static_cast<uint32_t>(L.p_offset);

  // Thread i copies 16 B pieces i % 4, i % 4 + 4, ... of list entry k0 + i / 4 of a tile at k0. Its
  // entry's lookup is fetched a tile ahead (fetch_tile: `ahead`), resolved when the tile's copies
  // are issued (copy_tile: into buffer `buf`, zeros past key_end and for refused rows, one commit group).
  static_assert(kThreads == 4 * kAttnKeysPerTile, "four threads per key of a tile");
  const int pieces = W / 8;
  const int key_j = static_cast<int>(threadIdx.x) / 4, key_sub = static_cast<int>(threadIdx.x) % 4;
  AheadRow ahead;
  auto fetch_tile = [&](int k0) { ahead.fetch(rows, k0 + key_j, key_end); };
  auto copy_tile = [&](int buf) {
    const int64_t row = ahead.row(rows);
    const bool ok = row >= 0;  // else zero-filled (the source is not read)
    const __nv_bfloat16* src = p.cache + (ok ? row : 0) + key_sub * 8;
    uint32_t dst = tiles_u32 + buf * L.tile_bytes + key_j * L.row_bytes + key_sub * 16;
    for (int piece = key_sub; piece < pieces; piece += 4, src += 32, dst += 64) ptx::cp_async_16(dst, src, ok);
    ptx::cp_async_commit();
  };
  if (n_tiles > 0) {
    fetch_tile(p.key_begin);
    copy_tile(0);
    if (n_tiles > 1) fetch_tile(p.key_begin + kAttnKeysPerTile);  // lands while q is split below
  }

  // q fragments (3 bf16 parts) of this warp's k16 steps ks = warp + 4 i: rows g, g + 8 of the chunk.
  // The first two parts stay in registers; the third goes to this lane's 16 B slots in shared
  // memory (read back by the same lane: no barrier), which keeps rank 512 within 255 registers.
  uint32_t qf[kQSteps][2][4];
  uint4* q_part3 = reinterpret_cast<uint4*>(smem + L.q_part3_offset) + warp * kMlaMaxQStepsPerWarp * 32 + lane;
#pragma unroll
  for (int i = 0; i < kQSteps; ++i) {
    const int ks = warp + 4 * i;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int head = h0 + g + 8 * r;
      float2 lo_k = make_float2(0.0f, 0.0f), hi_k = make_float2(0.0f, 0.0f);
      if (ks < n_ksteps && head < p.n_heads) {
        const float* q = p.q + static_cast<int64_t>(head) * W + 16 * ks + 2 * t;
        lo_k = *reinterpret_cast<const float2*>(q);
        hi_k = *reinterpret_cast<const float2*>(q + 8);
      }
      uint32_t plo[3], phi[3];
      split_bf16x2<3>(lo_k.x, lo_k.y, plo);
      split_bf16x2<3>(hi_k.x, hi_k.y, phi);
#pragma unroll
      for (int part = 0; part < 2; ++part) {
        qf[i][part][r] = plo[part];
        qf[i][part][2 + r] = phi[part];
      }
      reinterpret_cast<uint32_t*>(&q_part3[i * 32])[r] = plo[2];
      reinterpret_cast<uint32_t*>(&q_part3[i * 32])[2 + r] = phi[2];
    }
  }

  float o[NTW][4];
#pragma unroll
  for (int n = 0; n < NTW; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
  // m_row: the running maximum per head row (the same in every thread of a row); l_part: this thread's
  // share of the softmax sum (its keys of its warp's n-tiles), summed over the CTA at the end.
  float m_row[2] = {-INFINITY, -INFINITY}, l_part[2] = {0.0f, 0.0f};
  const int dim0 = warp * (p.rank / 4);
  const int mq = lane >> 3, mr = lane & 7;  // ldmatrix: this lane addresses row mr of matrix mq

  for (int it = 0; it < n_tiles; ++it) {
    const int k0 = p.key_begin + it * kAttnKeysPerTile;
    const int buf = it & 1;
    ptx::cp_async_wait<0>();  // tile `it`'s copies (issued a tile ago) landed
    // Tile `it` visible to every warp, and every warp is past tile it - 1: its buffer (buf ^ 1) and the
    // scores region are free.
    __syncthreads();
    if (it + 1 < n_tiles) {
      copy_tile(buf ^ 1);  // tile it + 1, from the lookups fetched a tile ago
      if (it + 2 < n_tiles) fetch_tile(k0 + 2 * kAttnKeysPerTile);
    }
    const uint32_t tile = tiles_u32 + buf * L.tile_bytes;

    // Partial scores over this warp's k16 steps: 16 heads x 32 keys (n-tiles of 8 keys).
    float sc[4][4];
#pragma unroll
    for (int n = 0; n < 4; ++n) sc[n][0] = sc[n][1] = sc[n][2] = sc[n][3] = 0.0f;
#pragma unroll
    for (int i = 0; i < kQSteps; ++i) {
      const int ks = warp + 4 * i;
      if (ks >= n_ksteps) break;  // warp-uniform
#pragma unroll
      for (int np = 0; np < 2; ++np) {
        // Matrices: keys of n-tile 2 np + (mq >> 1), dims 16 ks + 8 (mq & 1): b0/b1 of two n-tiles.
        uint32_t b[4];
        const int key = 16 * np + 8 * (mq >> 1) + mr;
        ptx::ldmatrix_x4(b, tile + key * L.row_bytes + (16 * ks + 8 * (mq & 1)) * 2);
#pragma unroll
        for (int part = 0; part < 2; ++part) {
          ptx::mma_bf16_m16n8k16(sc[2 * np], qf[i][part], b);
          ptx::mma_bf16_m16n8k16(sc[2 * np + 1], qf[i][part], b + 2);
        }
        const uint4 q3 = q_part3[i * 32];
        const uint32_t a3[4] = {q3.x, q3.y, q3.z, q3.w};
        ptx::mma_bf16_m16n8k16(sc[2 * np], a3, b);
        ptx::mma_bf16_m16n8k16(sc[2 * np + 1], a3, b + 2);
      }
    }
#pragma unroll
    for (int n = 0; n < 4; ++n) scores[(warp * 4 + n) * 32 + lane] = make_float4(sc[n][0], sc[n][1], sc[n][2], sc[n][3]);
    __syncthreads();
    // This warp's n-tile (keys k0 + 8 warp ..): the four warps' partial scores summed in warp order,
    // as the CPU (q . k) * scale, keys past the list's end masked; then its maximum per head row
    // (r = 0: row g in s[0], s[1]; r = 1: row g + 8 in s[2], s[3]).
    float s[4];
    {
      float4 sum = scores[warp * 32 + lane];
#pragma unroll
      for (int w = 1; w < kMlaWarps; ++w) {
        const float4 v = scores[(w * 4 + warp) * 32 + lane];
        sum.x += v.x;
        sum.y += v.y;
        sum.z += v.z;
        sum.w += v.w;
      }
      s[0] = sum.x;
      s[1] = sum.y;
      s[2] = sum.z;
      s[3] = sum.w;
    }
    float tile_max[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float mx = -INFINITY;
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int key = k0 + 8 * warp + 2 * t + e;
        const float v = key < key_end ? s[2 * r + e] * p.scale : -INFINITY;
        s[2 * r + e] = v;
        mx = fmaxf(mx, v);
      }
      mx = fmaxf(mx, __shfl_xor_sync(kFullMask, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(kFullMask, mx, 2));
      tile_max[r] = mx;
    }
    // Into the slot this lane just read (warp 0's partial of n-tile `warp`: read by no other warp).
    *reinterpret_cast<float2*>(&scores[warp * 32 + lane]) = make_float2(tile_max[0], tile_max[1]);
    __syncthreads();
    // Online softmax, the same in every warp: the tile's maximum per row from the four n-tiles'.
    float corr[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float m_new = m_row[r];
#pragma unroll
      for (int w = 0; w < kMlaWarps; ++w) m_new = fmaxf(m_new, reinterpret_cast<const float*>(&scores[w * 32 + lane])[r]);
      corr[r] = expf(m_row[r] - m_new);  // key k0 < key_end: m_new finite
      m_row[r] = m_new;
    }
    // P of this warp's n-tile -> shared memory as kMlaPParts bf16 parts (rows g, g + 8, keys 8 warp + 2 t,
    // + 1); this thread's share of the row sums.
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float sum = 0.0f;
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const float v = s[2 * r + e];
        const float pr = v == -INFINITY ? 0.0f : expf(v - m_row[r]);
        s[2 * r + e] = pr;
        sum += pr;
      }
      l_part[r] = l_part[r] * corr[r] + sum;
      uint32_t parts[kMlaPParts];
      split_bf16x2<kMlaPParts>(s[2 * r], s[2 * r + 1], parts);
#pragma unroll
      for (int part = 0; part < kMlaPParts; ++part) {
        *reinterpret_cast<uint32_t*>(p_smem + (part * kMlaHeadsPerCta + g + 8 * r) * kMlaPRowBytes +
                                     (8 * warp + 2 * t) * 2) = parts[part];
      }
    }
    __syncthreads();
    // Rescale the output rows (skipped when no row of this warp's lanes has a new maximum: x 1 exactly).
    if (__any_sync(kFullMask, corr[0] != 1.0f || corr[1] != 1.0f)) {
#pragma unroll
      for (int n = 0; n < NTW; ++n) {
        o[n][0] *= corr[0];
        o[n][1] *= corr[0];
        o[n][2] *= corr[1];
        o[n][3] *= corr[1];
      }
    }

    // latent += P [16 x 32] x c_kv [32 x this warp's dims]; P's A fragments (k16 step kk: keys
    // 16 kk ..) by ldmatrix from the kMlaPParts bf16 parts: lane addresses row lane % 16, keys
    // 16 kk + 8 (lane / 16).
#pragma unroll
    for (int kk = 0; kk < 2; ++kk) {
      uint32_t pf[kMlaPParts][4];
#pragma unroll
      for (int part = 0; part < kMlaPParts; ++part) {
        ptx::ldmatrix_x4(pf[part], p_u32 + (part * kMlaHeadsPerCta + (lane & 15)) * kMlaPRowBytes +
                                       (16 * kk + 8 * (lane >> 4)) * 2);
      }
      // .trans matrices: keys 16 kk + 8 (mq & 1) + mr, dims of n-tile (2 np + (mq >> 1)).
      const int key = 16 * kk + 8 * (mq & 1) + mr;
      if constexpr (NTW == 1) {
        uint32_t b[2];
        ptx::ldmatrix_x2_trans(b, tile + key * L.row_bytes + dim0 * 2);
        for (int part = 0; part < kMlaPParts; ++part) ptx::mma_bf16_m16n8k16(o[0], pf[part], b);
      } else {
#pragma unroll
        for (int np = 0; np < NTW / 2; ++np) {
          uint32_t b[4];
          ptx::ldmatrix_x4_trans(b, tile + key * L.row_bytes + (dim0 + 16 * np + 8 * (mq >> 1)) * 2);
#pragma unroll
          for (int part = 0; part < kMlaPParts; ++part) {
            ptx::mma_bf16_m16n8k16(o[2 * np], pf[part], b);
            ptx::mma_bf16_m16n8k16(o[2 * np + 1], pf[part], b + 2);
          }
        }
      }
    }
  }
  __syncthreads();  // every warp's last reads of P (the scores region) are done

  // The softmax sums: over the quad, then over the warps in warp order (lane (g, 0) of each warp writes
  // rows g, g + 8 into the scores region).
  float l_row[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l_part[r] += __shfl_xor_sync(kFullMask, l_part[r], 1);
    l_part[r] += __shfl_xor_sync(kFullMask, l_part[r], 2);
  }
  if (t == 0) *reinterpret_cast<float2*>(&scores[warp * 32 + lane]) = make_float2(l_part[0], l_part[1]);
  __syncthreads();
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l_row[r] = 0.0f;
#pragma unroll
    for (int w = 0; w < kMlaWarps; ++w) l_row[r] += reinterpret_cast<const float*>(&scores[w * 32 + (lane & ~3)])[r];
  }

#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int head = h0 + g + 8 * r;
    if (head >= p.n_heads) continue;
    const float inv = l_row[r] > 0.0f ? 1.0f / l_row[r] : 0.0f;
    if (p.parts != nullptr) {
      __nv_bfloat16* hi = p.parts + static_cast<int64_t>(head) * p.rank;
#pragma unroll
      for (int n = 0; n < NTW; ++n) {
        // __fmul_rn: the rounded product, as the f32 path stores it (nvcc must not fuse it into the parts'
        // subtraction).
        __nv_bfloat162 h, l;
        bf16_hi_lo(__fmul_rn(o[n][2 * r], inv), h.x, l.x);
        bf16_hi_lo(__fmul_rn(o[n][2 * r + 1], inv), h.y, l.y);
        const int64_t at = dim0 + 8 * n + 2 * t;
        *reinterpret_cast<__nv_bfloat162*>(hi + at) = h;
        *reinterpret_cast<__nv_bfloat162*>(hi + p.parts_lo + at) = l;
      }
    } else {
      float* dst = p.out + head * p.out_head_stride;
#pragma unroll
      for (int n = 0; n < NTW; ++n) {
        *reinterpret_cast<float2*>(dst + dim0 + 8 * n + 2 * t) = make_float2(o[n][2 * r] * inv, o[n][2 * r + 1] * inv);
      }
    }
    if (p.lse != nullptr && warp == 0 && t == 0) {
      p.lse[head * p.lse_head_stride] = l_row[r] > 0.0f ? m_row[r] + logf(l_row[r]) : -INFINITY;
    }
  }
}

}  // namespace fp4moe::cuda::mla_mma
