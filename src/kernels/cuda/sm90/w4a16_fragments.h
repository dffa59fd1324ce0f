// Register-level building blocks of sm90_nvfp4_w4a16_grouped_gemm (v1, mma.sync m16n8k16 bf16),
// written as host+device functions so that tests/kernels/test_cuda_w4a16.cpp checks them on the CPU
// (no GPU needed): the e2m1 -> bf16 decode, the shared-memory swizzles, and the loads of one
// 64-wide K chunk into MMA fragments, which the test feeds to an emulated mma.sync.
//
// K permutation (why one thread reads one whole NVFP4 block): an MMA sums over k, so any
// permutation of k applied to A and B alike leaves the result unchanged. In a 64-wide K chunk,
// thread t of a quad (t = lane % 4) takes physical k = 16 t .. 16 t + 15, exactly one 16-element
// NVFP4 block with one scale: 8 bytes of codes and 32 bytes of activations per row. MMA step
// s (0..3) maps the PTX fragment's logical k slots {2t, 2t+1} -> 16 t + 4 s + {0, 1} and
// {2t+8, 2t+9} -> 16 t + 4 s + {2, 3}. Byte 2s of the thread's 8 code bytes then holds A slots
// {2t, 2t+1} and byte 2s+1 slots {2t+8, 2t+9}; activation words 2s and 2s+1 (bf16 pairs) are B.
//
// Exact dequantization: e2m1 (2 significant bits) x e4m3 (4 bits) has at most 6 significant bits
// and lies in [2^-10, 2688], so it is exact in bf16 and the tensor-core product with a bf16
// activation is exact in f32. The per-expert f32 global scale multiplies the f32 accumulator in
// the epilogue: y = bf16(gs * sum_k x_k (e2m1_k * scale_k)).
#pragma once

#include <vector_types.h>  // uint4

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#include <cuda_bf16.h>
#endif

#include "plan/smem_layout.h"  // FP4MOE_HD

// `#pragma unroll` in device code only (host compilers warn about it).
#if defined(__CUDA_ARCH__)
#define FP4MOE_W4A16_UNROLL _Pragma("unroll")
#else
#define FP4MOE_W4A16_UNROLL
#endif

namespace fp4moe::cuda::sm90 {

// __byte_perm (PTX prmt, default mode) with selector nibbles < 8: byte i of the result is byte
// (s >> 4i) & 7 of the 8-byte value {hi:y, lo:x}.
FP4MOE_HD inline uint32_t byte_perm(uint32_t x, uint32_t y, uint32_t s) {
#if defined(__CUDA_ARCH__)
  return __byte_perm(x, y, s);
#else
  const uint64_t v = (static_cast<uint64_t>(y) << 32) | x;
  uint32_t r = 0;
  for (int i = 0; i < 4; ++i) {
    const uint32_t sel = (s >> (4 * i)) & 7u;
    r |= static_cast<uint32_t>((v >> (8 * sel)) & 0xFFu) << (8 * i);
  }
  return r;
#endif
}

// bf16 bit patterns of the e2m1 magnitudes {0, 0.5, 1, 1.5, 2, 3, 4, 6} =
// {0x0000, 0x3F00, 0x3F80, 0x3FC0, 0x4000, 0x4040, 0x4080, 0x40C0}, split into low and high
// bytes, as two 8-byte prmt tables (magnitudes 0..3 in the first word, 4..7 in the second).
inline constexpr uint32_t kE2m1Bf16LoX = 0xC0800000u, kE2m1Bf16LoY = 0xC0804000u;
inline constexpr uint32_t kE2m1Bf16HiX = 0x3F3F3F00u, kE2m1Bf16HiY = 0x40404040u;

// 8 e2m1 codes (nibble i = element i: a little-endian word of 4 packed bytes, low nibble = even
// element) -> 4 bf16x2 words; word p holds elements 2p (low half) and 2p+1 (high half).
// Code 0x8 gives -0.0 (numerically zero).
FP4MOE_HD inline void e2m1x8_to_bf16x8(uint32_t codes, uint32_t out[4]) {
  const uint32_t sel_lo = codes & 0x7777u;          // magnitudes of elements 0..3
  const uint32_t sel_hi = (codes >> 16) & 0x7777u;  // magnitudes of elements 4..7
  const uint32_t lo_a = byte_perm(kE2m1Bf16LoX, kE2m1Bf16LoY, sel_lo);
  const uint32_t lo_b = byte_perm(kE2m1Bf16LoX, kE2m1Bf16LoY, sel_hi);
  // Signs into bit 7 of each high byte: duplicating the code bytes as {b0, b0, b1, b1} puts the
  // signs of elements 0..3 at bits 3, 15, 19, 31; even elements move up 4 to bits 7 and 23.
  const uint32_t dup_a = byte_perm(codes, 0u, 0x1100u), dup_b = byte_perm(codes, 0u, 0x3322u);
  const uint32_t hi_a = byte_perm(kE2m1Bf16HiX, kE2m1Bf16HiY, sel_lo) | ((dup_a << 4) & 0x00800080u) |
                        (dup_a & 0x80008000u);
  const uint32_t hi_b = byte_perm(kE2m1Bf16HiX, kE2m1Bf16HiY, sel_hi) | ((dup_b << 4) & 0x00800080u) |
                        (dup_b & 0x80008000u);
  // Interleave low/high bytes into bf16 pairs: {lo0, hi0, lo1, hi1} and {lo2, hi2, lo3, hi3}.
  out[0] = byte_perm(lo_a, hi_a, 0x5140u);
  out[1] = byte_perm(lo_a, hi_a, 0x7362u);
  out[2] = byte_perm(lo_b, hi_b, 0x5140u);
  out[3] = byte_perm(lo_b, hi_b, 0x7362u);
}

// e4m3fn code -> bf16 bits (exact: 3 mantissa bits, exponents 2^-9..2^8 are normal in bf16).
// The 7 magnitude bits shifted to f32 bits 26..20 are an f32 of value x 2^-120 (e4m3 subnormals
// land on f32 subnormals, still exact); one multiply by 2^120 rescales, and the product, exact in
// bf16, is truncated to its top 16 bits. NaN codes (0x7F, 0xFF) give a bf16 NaN.
FP4MOE_HD inline uint16_t e4m3_to_bf16_bits(uint8_t code) {
  const uint32_t mag = code & 0x7Fu;
  const uint32_t sign = (code & 0x80u) << 8;
#if defined(__CUDA_ARCH__)
  const float scaled = __uint_as_float(mag << 20) * 0x1p120f;
  const uint32_t bits = __float_as_uint(scaled);
#else
  float f;
  const uint32_t in = mag << 20;
  std::memcpy(&f, &in, sizeof(f));
  const float scaled = f * 0x1p120f;
  uint32_t bits;
  std::memcpy(&bits, &scaled, sizeof(bits));
#endif
  return static_cast<uint16_t>(mag == 0x7Fu ? (sign | 0x7FC0u) : (sign | (bits >> 16)));
}

// Host stand-in for the kernel's __hmul2(bf16x2, scale): both halves times the bf16 `scale`,
// computed in f32; the product is exact in bf16 (see the file comment), so truncating is exact.
inline uint32_t host_bf16x2_mul_exact(uint32_t pair, uint16_t scale) {
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
  const float s = to_f32(scale);
  return to_bits(to_f32(pair & 0xFFFFu) * s) | (to_bits(to_f32(pair >> 16) * s) << 16);
}

// ---- shared-memory swizzles (byte offsets inside one stage's tile) ------------------------------

// x_tile: row `tok` of block_k bf16 (block_k * 2 bytes); 16 B chunk c is stored at c ^ (tok & 1).
// A quarter warp's 16 B loads (tokens g, g+1, four quads each) then hit 8 distinct bank groups.
template <uint32_t BLOCK_K>
FP4MOE_HD constexpr uint32_t x_tile_offset(uint32_t tok, uint32_t chunk16) {
  return tok * (BLOCK_K * 2) + ((chunk16 ^ (tok & 1u)) * 16);
}

// w_packed: row r of block_k / 2 bytes, rows back to back. Viewed as 16 B chunks in 128 B lines,
// chunk position q (0..7) of line L is stored at q ^ ((L & 3) << 1): the 8-byte loads of four
// consecutive rows (a half warp) then cover all 32 banks for block_k 128 and 256.
template <uint32_t BLOCK_K>
FP4MOE_HD constexpr uint32_t w_packed_offset(uint32_t row, uint32_t byte) {
  const uint32_t linear = row * (BLOCK_K / 2) + byte;
  const uint32_t chunk = linear >> 4;
  const uint32_t line = chunk >> 3;
  return (((chunk ^ ((line & 3u) << 1)) << 4)) | (linear & 15u);
}

// w_scales: row r of block_k / 16 bytes, linear (a warp's byte loads hit distinct words).
template <uint32_t BLOCK_K>
FP4MOE_HD constexpr uint32_t w_scales_offset(uint32_t row, uint32_t block) {
  return row * (BLOCK_K / 16) + block;
}

// ---- fragments of one 64-wide K chunk `kc` of a stage ------------------------------------------

// A fragments (weights, rows row0 + g and row0 + g + 8, g = lane / 4) of the 4 MMA steps:
// a[s][0..3] in PTX register order (row g k-lo, row g+8 k-lo, row g k-hi, row g+8 k-hi), already
// multiplied by the block scale (bf16, exact). `w_tile` / `s_tile` point at the stage's tiles.
template <uint32_t BLOCK_K>
FP4MOE_HD inline void load_a_fragments(const uint8_t* w_tile, const uint8_t* s_tile, uint32_t row0,
                                       uint32_t kc, uint32_t lane, uint32_t a[4][4]) {
  const uint32_t g = lane >> 2, t = lane & 3u;
  uint32_t pairs[2][8];  // [row half][byte 0..7] -> scaled bf16x2
  FP4MOE_W4A16_UNROLL
  for (uint32_t h = 0; h < 2; ++h) {
    const uint32_t row = row0 + g + 8 * h;
    const uint32_t off = w_packed_offset<BLOCK_K>(row, kc * 32 + 8 * t);  // 8-byte aligned, one chunk
    const uint32_t* src = reinterpret_cast<const uint32_t*>(w_tile + off);
    const uint32_t w0 = src[0], w1 = src[1];
    const uint16_t sc = e4m3_to_bf16_bits(s_tile[w_scales_offset<BLOCK_K>(row, kc * 4 + t)]);
    uint32_t raw[8];
    e2m1x8_to_bf16x8(w0, raw);
    e2m1x8_to_bf16x8(w1, raw + 4);
#if defined(__CUDA_ARCH__)
    const __nv_bfloat162 sc2 = __halves2bfloat162(__ushort_as_bfloat16(sc), __ushort_as_bfloat16(sc));
  FP4MOE_W4A16_UNROLL
    for (int i = 0; i < 8; ++i) {
      __nv_bfloat162 v = *reinterpret_cast<const __nv_bfloat162*>(&raw[i]);
      v = __hmul2(v, sc2);  // exact (see the file comment)
      pairs[h][i] = *reinterpret_cast<const uint32_t*>(&v);
    }
#else
    for (int i = 0; i < 8; ++i) pairs[h][i] = host_bf16x2_mul_exact(raw[i], sc);
#endif
  }
  FP4MOE_W4A16_UNROLL
  for (uint32_t s = 0; s < 4; ++s) {
    a[s][0] = pairs[0][2 * s];
    a[s][1] = pairs[1][2 * s];
    a[s][2] = pairs[0][2 * s + 1];
    a[s][3] = pairs[1][2 * s + 1];
  }
}

// B fragments (activations, token tok0 + g) of the 4 MMA steps: b[s][0..1].
template <uint32_t BLOCK_K>
FP4MOE_HD inline void load_b_fragments(const uint8_t* x_tile, uint32_t tok0, uint32_t kc, uint32_t lane,
                                       uint32_t b[4][2]) {
  const uint32_t g = lane >> 2, t = lane & 3u;
  const uint32_t tok = tok0 + g;
  const uint4 q0 = *reinterpret_cast<const uint4*>(x_tile + x_tile_offset<BLOCK_K>(tok, kc * 8 + 2 * t));
  const uint4 q1 = *reinterpret_cast<const uint4*>(x_tile + x_tile_offset<BLOCK_K>(tok, kc * 8 + 2 * t + 1));
  b[0][0] = q0.x;
  b[0][1] = q0.y;
  b[1][0] = q0.z;
  b[1][1] = q0.w;
  b[2][0] = q1.x;
  b[2][1] = q1.y;
  b[3][0] = q1.z;
  b[3][1] = q1.w;
}

}  // namespace fp4moe::cuda::sm90
