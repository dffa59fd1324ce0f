// Register-level building blocks of sm90_nvfp4_w4a16_grouped_gemm (mma.sync m16n8k16 bf16), written
// as host+device functions so that tests/kernels/test_cuda_w4a16_host.cpp checks them on the CPU (no
// GPU needed): the scale conversion, the A fragments of one 64-wide K chunk from a lane's 16 B of
// kernel-layout codes (w4a16_weight_layout.h), the activation tile swizzle and the B fragments,
// which the test feeds to an emulated mma.sync.
//
// K permutation (why one thread reads one whole NVFP4 block): an MMA sums over k, so any
// permutation of k applied to A and B alike leaves the result unchanged. In a 64-wide K chunk,
// thread t of a quad (t = lane % 4) takes physical k = 16 t .. 16 t + 15, exactly one 16-element
// NVFP4 block with one scale per row. MMA step s (0..3) maps the PTX fragment's logical k slots
// {2t, 2t+1} -> 16 t + 4 s + {0, 1} and {2t+8, 2t+9} -> 16 t + 4 s + {2, 3}; activation words 2s
// and 2s+1 (bf16 pairs, 8 contiguous bytes at k = 16 t + 4 s) are the B registers.
//
// Exact dequantization: e2m1 (2 significant bits) x e4m3 (4 bits; a subnormal renormalized has at
// most 3) has at most 6 significant bits; the A registers hold e2m1 x e4m3 x 2^-8, in
// [2^-18, 10.5], exact normal bf16 values (or +0: a zero-scale block has zero codes, see
// w4a16_weight_layout.h), so the tensor-core products with bf16 activations are exact in f32.
// The epilogue multiplies the f32 accumulator by 2^8 and the per-expert f32 global scale:
// y = bf16(gs * sum_k x_k (e2m1_k * scale_k)).
#pragma once

#include <vector_types.h>  // uint4

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#include <cuda_bf16.h>
#endif

#include "kernels/cuda/sm90/w4a16_weight_layout.h"
#include "plan/layout_sm90_w4a16.h"  // w4a16_wgmma_swizzle
#include "plan/smem_layout.h"         // FP4MOE_HD

// `#pragma unroll` in device code only (host compilers warn about it).
#if defined(__CUDA_ARCH__)
#define FP4MOE_W4A16_UNROLL _Pragma("unroll")
#else
#define FP4MOE_W4A16_UNROLL
#endif

namespace fp4moe::cuda::sm90 {

// The scale word of byte `i` (0..3, a compile-time constant in the unrolled loops) of a 32-bit word
// of kernel scale bytes: w4a16_scale_word(B) = B x 0x00100010 + 0x75007500, a bf16x2 {v, v} with
// v = value(B) x 2^118 = e4m3 x 2^118 exactly (w4a16_weight_layout.h). On the device one PRMT puts
// B in bytes 0 and 2 (selector 0x4i4i: byte i, zero, byte i, zero = B x 0x00010001) and one LEA
// makes x 16 + 0x75007500 (2 instructions instead of ~9 for the old e4m3 conversion); the halves
// cannot carry into each other (B <= 0x9E). The PRMT is inline PTX, not __byte_perm: with the
// intrinsic NVVM reorders the conversions and the m64n8_d8 / m128n8_d8 stream kernels spill 12 B
// at their 80-register cap (measured with nvcc 13, issue #5); with the asm they do not.
FP4MOE_HD inline uint32_t w4a16_scale_word_of(uint32_t packed, uint32_t i) {
#if defined(__CUDA_ARCH__)
  uint32_t twice;  // B x 0x00010001
  asm("prmt.b32 %0, %1, 0, %2;" : "=r"(twice) : "r"(packed), "r"(0x4040u | i | (i << 8)));
  return twice * 16u + kW4A16ScaleWordBase;
#else
  return w4a16_scale_word((packed >> (8 * i)) & 0xFFu);
#endif
}

// bf16x2 times bf16x2 (both halves), the kernel's __hmul2. On the host in f32, then truncated: the
// products the kernel forms are exact in bf16 (tests assert the dropped bits are zero).
FP4MOE_HD inline uint32_t w4a16_mul_pairs(uint32_t a, uint32_t b) {
#if defined(__CUDA_ARCH__)
  const __nv_bfloat162 r =
      __hmul2(*reinterpret_cast<const __nv_bfloat162*>(&a), *reinterpret_cast<const __nv_bfloat162*>(&b));
  return *reinterpret_cast<const uint32_t*>(&r);
#else
  auto to_f32 = [](uint32_t bits16) {
    const uint32_t u = bits16 << 16;
    float f;
    std::memcpy(&f, &u, sizeof(f));
    return f;
  };
  auto to_bits = [](float f) {
    uint32_t u;
    std::memcpy(&u, &f, sizeof(u));
    return u >> 16;
  };
  return to_bits(to_f32(a & 0xFFFFu) * to_f32(b & 0xFFFFu)) | (to_bits(to_f32(a >> 16) * to_f32(b >> 16)) << 16);
#endif
}

// ---- kStream loop bounds -----------------------------------------------------------------------

// The end of the scale groups [kg0, end) that the stream kernel runs unchecked, for a CTA's K part of
// groups [kg0, kg1) whose chunks end at kc_end, K = k, a ring of `stages` chunks: in each such group
// (kW4A16ScaleGroup chunks) every prefetch (codes and activations, stages - 1 chunks ahead) lands
// below kc_end and inside the full 64-wide chunks of K, so the chunk step needs no range predicates. The groups from
// `end` to kg1 test each prefetch. Maximal: group `end` (when < kg1) has a prefetch out of range.
FP4MOE_HD constexpr int w4a16_stream_unchecked_end(int kg0, int kg1, int kc_end, int64_t k, uint32_t stages) {
  const int64_t full_chunks = k / 64;
  const int64_t in_range = kc_end < full_chunks ? kc_end : full_chunks;
  // Group kg's last prefetch is chunk kW4A16ScaleGroup (kg + 1) - 1 + stages - 1 < in_range.
  const int64_t room = in_range - static_cast<int64_t>(stages) + 1;
  if (room < 0) return kg0;
  const int64_t end = room / static_cast<int64_t>(kW4A16ScaleGroup);
  return end < kg0 ? kg0 : end > kg1 ? kg1 : static_cast<int>(end);
}

// ---- shared-memory swizzles (byte offsets inside one stage's tile) ------------------------------

// x_tile: row `tok` of block_k bf16 (block_k * 2 bytes); 16 B chunk c is stored at c ^ (tok & 1).
// A quarter warp's 16 B loads (tokens g, g+1, four quads each) then hit 8 distinct bank groups.
template <uint32_t BLOCK_K>
FP4MOE_HD constexpr uint32_t x_tile_offset(uint32_t tok, uint32_t chunk16) {
  return tok * (BLOCK_K * 2) + ((chunk16 ^ (tok & 1u)) * 16);
}

// ---- A fragments of one 64-wide K chunk ------------------------------------------------------

// The scale words of chunk j (0..7) of a scale group, from the lane's 16 B of the group: byte 2j is
// row g's scale, byte 2j+1 row g+8's. `j` should be a compile-time constant (unrolled loops).
// w4a16_pair_scales takes the pair as the low 16 bits of `pair` (the pipeline kernel's slice).
FP4MOE_HD inline void w4a16_pair_scales(uint32_t pair, uint32_t& sc_lo, uint32_t& sc_hi) {
  sc_lo = w4a16_scale_word_of(pair, 0);
  sc_hi = w4a16_scale_word_of(pair, 1);
}
FP4MOE_HD inline void w4a16_chunk_scales(const uint4& group, uint32_t j, uint32_t& sc_lo, uint32_t& sc_hi) {
  const uint32_t w = (j >> 1) == 0 ? group.x : (j >> 1) == 1 ? group.y : (j >> 1) == 2 ? group.z : group.w;
  sc_lo = w4a16_scale_word_of(w, 2 * (j & 1u));
  sc_hi = w4a16_scale_word_of(w, 2 * (j & 1u) + 1);
}

// A registers a[s][0..3] of the 4 MMA steps of a chunk, from the lane's 16 B of codes and the
// scale words of rows g (sc_lo) and g + 8 (sc_hi); register order as PTX's m16n8k16 A fragment
// (row g k-lo, row g+8 k-lo, row g k-hi, row g+8 k-hi).
FP4MOE_HD inline void w4a16_chunk_fragments(const uint4& codes, uint32_t sc_lo, uint32_t sc_hi, uint32_t a[4][4]) {
  const uint32_t words[4] = {codes.x, codes.y, codes.z, codes.w};
  FP4MOE_W4A16_UNROLL
  for (int s = 0; s < 4; ++s) {
    uint32_t raw[4];
    w4a16_word_to_pairs(words[s], raw);
    a[s][0] = w4a16_mul_pairs(raw[0], sc_lo);
    a[s][1] = w4a16_mul_pairs(raw[1], sc_hi);
    a[s][2] = w4a16_mul_pairs(raw[2], sc_lo);
    a[s][3] = w4a16_mul_pairs(raw[3], sc_hi);
  }
}

// kWgmma (w4a16_wgmma.cu): the stage slot, A buffer and full-barrier phase parity of chunk i =
// kW4A16ScaleGroup x group + j of a CTA's K loop, from (group, j) alone, with `stages` and `a_buffers`
// powers of 2 dividing the scale group: slot i % stages = j % stages and buffer j % a_buffers (compile-time
// constants of the unrolled j loop), parity (i / stages) & 1, where the group term is even unless
// stages == kW4A16ScaleGroup (then it flips every group).
struct W4A16WgmmaChunkPhase {
  uint32_t slot, abuf, parity;
};
FP4MOE_HD constexpr W4A16WgmmaChunkPhase w4a16_wgmma_chunk_phase(uint32_t group, uint32_t j, uint32_t stages,
                                                                 uint32_t a_buffers) {
  return W4A16WgmmaChunkPhase{j % stages, j % a_buffers, ((kW4A16ScaleGroup / stages) * group + j / stages) & 1u};
}

// kWgmma (w4a16_wgmma.cu): where lane (g, t) stores its dequantized chunk a[4][4] (as
// w4a16_chunk_fragments builds it) in its warp's row tile of an A tile: 16 rows x 128 B of bf16 in
// natural K order, 128B-swizzled (plan::w4a16_wgmma_swizzle; a row tile starts on an 8-row boundary,
// so the offsets are relative to it). a[s][0] / a[s][2] hold row g at k = 16 t + 4 s + {0, 1} / {2, 3},
// a[s][1] / a[s][3] row g + 8: each row's k = 16 t .. 16 t + 15 are two 16 B units, 2 t and 2 t + 1.
struct W4A16WgmmaStores {
  uint32_t offset[4];  // bytes from the row tile's start
  uint4 value[4];
};
// The four offsets alone (they depend on the lane only: loop invariants of the kernel).
FP4MOE_HD inline void w4a16_wgmma_a_offsets(uint32_t lane, uint32_t offset[4]) {
  const uint32_t g = lane >> 2, t = lane & 3u;
  offset[0] = plan::w4a16_wgmma_swizzle(g, 2 * t);
  offset[1] = plan::w4a16_wgmma_swizzle(g, 2 * t + 1);
  offset[2] = plan::w4a16_wgmma_swizzle(g + 8, 2 * t);
  offset[3] = plan::w4a16_wgmma_swizzle(g + 8, 2 * t + 1);
}
FP4MOE_HD inline W4A16WgmmaStores w4a16_wgmma_a_stores(const uint32_t a[4][4], uint32_t lane) {
  W4A16WgmmaStores s;
  w4a16_wgmma_a_offsets(lane, s.offset);
  s.value[0] = uint4{a[0][0], a[0][2], a[1][0], a[1][2]};
  s.value[1] = uint4{a[2][0], a[2][2], a[3][0], a[3][2]};
  s.value[2] = uint4{a[0][1], a[0][3], a[1][1], a[1][3]};
  s.value[3] = uint4{a[2][1], a[2][3], a[3][1], a[3][3]};
  return s;
}

// B registers of the 4 MMA steps from the 32 activation bytes at k = 16 t .. 16 t + 15 of a chunk
// (q0 = the first 16 B): step s takes words 2s and 2s + 1.
FP4MOE_HD inline void w4a16_b_from_words(const uint4& q0, const uint4& q1, uint32_t b[4][2]) {
  b[0][0] = q0.x;
  b[0][1] = q0.y;
  b[1][0] = q0.z;
  b[1][1] = q0.w;
  b[2][0] = q1.x;
  b[2][1] = q1.y;
  b[3][0] = q1.z;
  b[3][1] = q1.w;
}

// B fragments (activations, token tok0 + g) of the 4 MMA steps from the swizzled x_tile: b[s][0..1].
template <uint32_t BLOCK_K>
FP4MOE_HD inline void load_b_fragments(const uint8_t* x_tile, uint32_t tok0, uint32_t kc, uint32_t lane,
                                       uint32_t b[4][2]) {
  const uint32_t g = lane >> 2, t = lane & 3u;
  const uint32_t tok = tok0 + g;
  const uint4 q0 = *reinterpret_cast<const uint4*>(x_tile + x_tile_offset<BLOCK_K>(tok, kc * 8 + 2 * t));
  const uint4 q1 = *reinterpret_cast<const uint4*>(x_tile + x_tile_offset<BLOCK_K>(tok, kc * 8 + 2 * t + 1));
  w4a16_b_from_words(q0, q1, b);
}

}  // namespace fp4moe::cuda::sm90
