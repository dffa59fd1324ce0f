// The global-memory layout of NVFP4 expert weights that sm90_nvfp4_w4a16_grouped_gemm reads (the
// "kernel layout"), made once at load from the checkpoint layout (codes [E, N, K/2], low nibble =
// even k; e4m3 scales [E, N, K/16], linear). Header-only and host+device: the kernel, the host
// repack (w4a16_repack.cpp) and the CPU emulation tests read the same definitions.
//
// Tiles. Rows are grouped into row tiles of 16 (the MMA's M; N is padded to a multiple of 16 with
// zeros) and K into chunks of 64 (K padded to a multiple of 64 with zero codes; zero codes times
// zero-filled activations add nothing, so any K % 16 == 0 works). One (expert, row tile, chunk) is
// 512 contiguous bytes, the 16 B that lane L = 4 g + t of a warp needs for the four m16n8k16 steps
// of the chunk: rows g and g + 8, NVFP4 block t (k = 16 t .. 16 t + 15 of the chunk). A warp reads
// a chunk with one fully coalesced 16 B load per lane, chunks of one row tile follow each other.
//   codes offset(e, rt, kc) = ((e * row_tiles + rt) * k_chunks + kc) * 512 + 16 L
// Scales come in groups of 8 chunks: per (expert, row tile, group) 512 B, lane L's 16 B hold, for
// chunk j = 0..7 of the group, byte 2 j = scale(row g, block t), byte 2 j + 1 = scale(row g + 8).
//   scales offset(e, rt, kg) = ((e * row_tiles + rt) * k_groups + kg) * 512 + 16 L
// (chunks past the end of K and rows past N hold zero codes and zero scales).
//
// Scale bytes (issue #5) are not the checkpoint's e4m3 codes but an unsigned "ue5m3" byte B, chosen
// so that the kernel's bf16x2 scale word is one integer multiply-add (w4a16_scale_word):
//   B = 0: a zero scale. Its word is finite (2^107) and w4a16_repack zeroes the block's 16 codes,
//          so every product is +0, exactly what e2m1 x 0 gives.
//   B > 0: e = B >> 3 (5 bits), m = B & 7, value = 2^(e - 11) x (1 + m / 8).
// Every e4m3 code maps exactly: normal codes (exponent field E >= 1, value 2^(E - 7) (1 + m / 8))
// are B = code + 32 (e = E + 4, 0x08..0x7E -> 0x28..0x9E); the subnormals m x 2^-9 (m = 1..7)
// renormalize to at most 3 mantissa bits: 0x01..0x07 -> 0x10, 0x18, 0x1C, 0x20, 0x22, 0x24, 0x26.
// The bf16 of value x 2^118 has exponent field e - 11 + 118 + 127 = e + 234 (236..253: normal,
// finite) and mantissa m << 4, i.e. its 16 bits are (B << 4) + (234 << 7) = (B << 4) + 0x7500, and
// the word {v, v} is B x 0x00100010 + 0x75007500 (no carry between halves: B <= 0x9E). Negative
// scales (NVFP4 block scales are UE4M3: the sign bit is always 0) and NaN are refused at repack.
//
// Bits inside a lane's 16 B: word s (0..3) feeds MMA step s; it holds 8 e2m1 codes, and four
// bit operations turn it into the four A-fragment registers a[s][0..3] of the step, each a bf16x2
// whose halves are two consecutive k of one row:
//   a[s][j]: row g + 8 (j & 1), chunk-local k = 16 t + 4 s + 2 (j >> 1) + {0 (low half), 1 (high)}
// (the same K permutation is applied to the activations: B registers b[s][0..1] hold x at
// k = 16 t + 4 s + {0,1} and {2,3}, 8 contiguous bytes; an MMA's sum does not depend on the order
// of k). Output j takes the bits at the positions of kPairMask rotated right by rot(j, p):
//   a0 = (q << 6) & M, a1 = rotr(q, 4) & M, a2 = (q << 2) & M,
//   a3 = (q & {bits 8, 24}) | (rotr(q, 8) & (M without them))
// (a left shift is a rotation by 32 - s whose wrapped bits fall outside M: ptxas issues it as
// IMAD.SHL on the FMA pipe, so the integer ALU pipe runs 7 operations a word instead of 9: a0 and a2
// one LOP3 each, a1 a funnel shift and a LOP3, a3 a funnel shift and two LOP3. Found by an exact-cover
// search over outputs of one or two shifts; 7 ALU operations is its minimum. Measured on the H200
// against the layout with four rotations (9 ALU operations), same run: the stream kernel's gate_up at
// 1-16 tokens per expert 2-6% faster, down and the wgmma tiles unchanged; BENCHMARKS.md 2026-12-05,
// twenty-third session.)
// where M = kPairMask marks, per half, the e2m1 magnitude at bf16 bits 8..6 (exponent bits 1..0 and
// the top mantissa bit) and the sign at bit 15. Such a bf16 is exactly e2m1 x 2^-126 (e2m1's
// exponent bias is 1, bf16's 127; e2m1 subnormals land on bf16 subnormals). The four footprints
// are disjoint and cover all 32 bits (checked at compile time below), so the word is a pure bit
// permutation of its 8 codes: 2.25 integer operations per bf16x2 (1.75 of them on the ALU pipe)
// instead of a table lookup.
// Multiplying by the scale word (bf16x2 of e4m3 x 2^118, see w4a16_scale_word) gives
// e2m1 x e4m3 x 2^-8 exactly (6 significant bits, normal range), and the epilogue multiplies the
// f32 accumulator by 2^8 x the global scale.
//
// Tested by tests/kernels/test_cuda_w4a16_host.cpp (repack round trip, every code in every
// position, the emulated fragments of a whole tile against format/nvfp4.h).
#pragma once

#include <cstdint>
#include <vector>

#include "plan/smem_layout.h"  // FP4MOE_HD

namespace fp4moe::cuda::sm90 {

inline constexpr uint32_t kW4A16TileRows = 16;       // rows per row tile (MMA M)
inline constexpr uint32_t kW4A16ChunkK = 64;         // k per chunk (4 MMA steps of k16)
inline constexpr uint32_t kW4A16TileBytes = 512;     // one (row tile, chunk) of codes
inline constexpr uint32_t kW4A16ScaleGroup = 8;      // chunks per 512 B scale group
inline constexpr uint32_t kPairMask = 0x81C081C0u;   // bf16x2: sign 15/31, e2m1 magnitude 8..6 / 24..22
inline constexpr uint32_t kPair3LowMask = 0x01000100u;  // the bits of a3 taken unrotated (8, 24)
inline constexpr int kW4A16AccShift = 8;             // products carry 2^-8; the epilogue undoes it
inline constexpr uint32_t kW4A16ScaleWordStep = 0x00100010u;  // scale word = B x step + base
inline constexpr uint32_t kW4A16ScaleWordBase = 0x75007500u;  // per half 0x7500: bf16 exponent field 234
inline constexpr uint32_t kW4A16ScaleExpBias = 11;            // B: value = 2^((B >> 3) - 11) x (1 + (B & 7) / 8)
inline constexpr uint32_t kW4A16ScaleByteMax = 0x9Eu;         // B of e4m3 448 (0x7E), the largest scale

FP4MOE_HD constexpr int64_t w4a16_row_tiles(int64_t n) { return (n + kW4A16TileRows - 1) / kW4A16TileRows; }
FP4MOE_HD constexpr int64_t w4a16_k_chunks(int64_t k) { return (k + kW4A16ChunkK - 1) / kW4A16ChunkK; }
FP4MOE_HD constexpr int64_t w4a16_k_groups(int64_t k) {
  return (w4a16_k_chunks(k) + kW4A16ScaleGroup - 1) / kW4A16ScaleGroup;
}
// Bytes of the kernel-layout codes / scales of `n_experts` experts of n x k.
FP4MOE_HD constexpr int64_t w4a16_codes_bytes(int64_t n_experts, int64_t n, int64_t k) {
  return n_experts * w4a16_row_tiles(n) * w4a16_k_chunks(k) * kW4A16TileBytes;
}
FP4MOE_HD constexpr int64_t w4a16_scales_bytes(int64_t n_experts, int64_t n, int64_t k) {
  return n_experts * w4a16_row_tiles(n) * w4a16_k_groups(k) * kW4A16TileBytes;
}

// Right rotation used by output j (0..3) for the bf16 bit at position p (in kPairMask).
FP4MOE_HD constexpr uint32_t w4a16_rotation(uint32_t j, uint32_t p) {
  if (j == 0) return 26;  // q << 6
  if (j == 1) return 4;
  if (j == 2) return 30;  // q << 2
  return ((kPair3LowMask >> p) & 1u) ? 0u : 8u;
}

namespace detail {
constexpr bool pair_footprints_partition_the_word() {
  uint32_t seen = 0;
  for (uint32_t j = 0; j < 4; ++j) {
    for (uint32_t p = 0; p < 32; ++p) {
      if (((kPairMask >> p) & 1u) == 0) continue;
      const uint32_t src = (p + w4a16_rotation(j, p)) % 32;
      if ((seen >> src) & 1u) return false;
      seen |= 1u << src;
    }
  }
  return seen == 0xFFFFFFFFu;
}
}  // namespace detail
static_assert(detail::pair_footprints_partition_the_word(), "the four A-register footprints must tile a 32-bit word");
namespace detail {
// w4a16_word_to_pairs computes outputs 0 and 2 as left shifts (q << 6, q << 2): equal to their
// rotations by 26 and 30 only if no bit of kPairMask takes a bit that wrapped around.
constexpr bool left_shifts_match_the_rotations() {
  for (uint32_t p = 0; p < 32; ++p) {
    if (((kPairMask >> p) & 1u) == 0) continue;
    if (p < 6 || w4a16_rotation(0, p) != 26 || w4a16_rotation(2, p) != 30) return false;
  }
  return true;
}
}  // namespace detail
static_assert(detail::left_shifts_match_the_rotations(), "outputs 0 and 2 are left shifts: no wrapped bit may reach M");

FP4MOE_HD inline uint32_t rotr32(uint32_t x, uint32_t r) {
#if defined(__CUDA_ARCH__)
  return __funnelshift_r(x, x, r);
#else
  return r == 0 ? x : ((x >> r) | (x << (32 - r)));
#endif
}

// One word of 8 codes -> the four A registers of one MMA step, each element = e2m1 x 2^-126 (bf16).
FP4MOE_HD inline void w4a16_word_to_pairs(uint32_t q, uint32_t a[4]) {
  a[0] = (q << 6) & kPairMask;
  a[1] = rotr32(q, 4) & kPairMask;
  a[2] = (q << 2) & kPairMask;
  a[3] = (q & kPair3LowMask) | (rotr32(q, 8) & (kPairMask & ~kPair3LowMask));
}

// Where code (row r, chunk-local k) of a 16 x 64 tile lives: lane, word, and the output register j
// and half h it lands in. Inverse of the table in the file comment.
struct W4A16CodeSlot {
  uint32_t lane, word, j, half;
};
FP4MOE_HD constexpr W4A16CodeSlot w4a16_code_slot(uint32_t r, uint32_t k) {
  const uint32_t g = r & 7u, hi_row = r >> 3;  // r = g + 8 hi_row
  const uint32_t t = k >> 4, within = k & 15u;  // within = 4 s + 2 (j >> 1) + half
  const uint32_t s = within >> 2, pair = (within >> 1) & 1u, half = within & 1u;
  return W4A16CodeSlot{4 * g + t, s, hi_row + 2 * pair, half};
}

// Places a 4-bit code into `word` at the slot (j, half); the inverse of w4a16_word_to_pairs.
FP4MOE_HD constexpr uint32_t w4a16_place_code(uint32_t word, uint32_t j, uint32_t half, uint32_t code) {
  // bf16 bit p of output j (p = 16 half + {6, 7, 8} for magnitude bits 0..2, 16 half + 15 for the sign)
  const uint32_t base = 16 * half;
  const uint32_t positions[4] = {base + 6, base + 7, base + 8, base + 15};
  for (uint32_t b = 0; b < 4; ++b) {
    const uint32_t p = positions[b];
    const uint32_t src = (p + w4a16_rotation(j, p)) % 32;
    word = (word & ~(1u << src)) | (((code >> b) & 1u) << src);
  }
  return word;
}

// e4m3fn scale code -> kernel scale byte B (see the file comment). Defined for the codes the
// repack accepts: 0x00..0x7E (non-negative, not NaN); 0x00 -> 0.
FP4MOE_HD constexpr uint32_t w4a16_scale_byte(uint32_t e4m3) {
  if (e4m3 == 0) return 0;
  if ((e4m3 >> 3) != 0) return e4m3 + 32;  // normal: e = E + 4, same mantissa
  // Subnormal m x 2^-9 = 2^p x (m / 2^p) x 2^-9 with p = floor(log2 m): e = p + 2, and the
  // p bits of m below its leading one become the top of the 3-bit mantissa.
  const uint32_t p = e4m3 >= 4 ? 2u : e4m3 >= 2 ? 1u : 0u;
  return ((p + 2) << 3) | ((e4m3 - (1u << p)) << (3 - p));
}

// The inverse: kernel scale byte -> e4m3fn code; false when B is no image of w4a16_scale_byte.
FP4MOE_HD constexpr bool w4a16_scale_byte_to_e4m3(uint32_t b, uint32_t& e4m3) {
  e4m3 = 0;
  if (b == 0) return true;
  const uint32_t e = b >> 3, m = b & 7u;
  if (e >= 5) {  // normal e4m3 (E = e - 4 >= 1)
    if (b > kW4A16ScaleByteMax) return false;
    e4m3 = b - 32;
    return true;
  }
  if (e < 2) return false;
  const uint32_t p = e - 2;  // subnormal 2^p x (1 + m / 8) x 2^-9: m must fit in p bits
  if ((m & ((1u << (3 - p)) - 1u)) != 0) return false;
  e4m3 = (1u << p) | (m >> (3 - p));
  return true;
}

// The bf16x2 scale word {v, v}, v = value(B) x 2^118 (see the file comment), from B.
FP4MOE_HD constexpr uint32_t w4a16_scale_word(uint32_t b) { return b * kW4A16ScaleWordStep + kW4A16ScaleWordBase; }

namespace detail {
// The A registers carry e2m1 x 2^-126, so the scale word must be value(B) x 2^(126 - kW4A16AccShift):
// bf16 exponent field (B >> 3) - kW4A16ScaleExpBias + 126 - kW4A16AccShift + 127 at B's exponent
// bits, i.e. base = that field at B = 0, shifted to bf16 bit 7, in both halves.
constexpr bool scale_word_constants_agree() {
  const uint32_t field0 = 126 - kW4A16AccShift + 127 - kW4A16ScaleExpBias;  // 234
  return kW4A16ScaleWordBase == ((field0 << 7) | ((field0 << 7) << 16)) && kW4A16ScaleWordStep == ((1u << 4) | (1u << 20)) &&
         field0 + (kW4A16ScaleByteMax >> 3) < 255;  // 448's word is finite
}
// Every non-negative non-NaN e4m3 code maps to a distinct byte <= kW4A16ScaleByteMax that maps back.
constexpr bool scale_bytes_round_trip() {
  bool used[256] = {};
  for (uint32_t code = 0; code < 0x7F; ++code) {
    const uint32_t b = w4a16_scale_byte(code);
    uint32_t back = 0xFFFFu;
    if (b > kW4A16ScaleByteMax || used[b] || !w4a16_scale_byte_to_e4m3(b, back) || back != code) return false;
    used[b] = true;
  }
  return w4a16_scale_byte(0x7E) == kW4A16ScaleByteMax;
}
}  // namespace detail
static_assert(detail::scale_word_constants_agree(), "scale word base/step must encode value(B) x 2^(126 - kW4A16AccShift)");
static_assert(detail::scale_bytes_round_trip(), "w4a16_scale_byte must be invertible on e4m3 0x00..0x7E");

// Checkpoint layout -> kernel layout, on the host. codes [E, n, k/2] (low nibble = even k),
// scales [E, n, k/16] e4m3fn. Needs k % 16 == 0 and n % 8 == 0 (the kernel's output stores); throws
// fp4moe::Error naming the numbers otherwise, and on a NaN (0x7F / 0xFF) or negative (sign bit set,
// 0x80..0xFE) scale code naming the expert, row and block (the kernel's scale byte is unsigned and
// has no NaN). Scales become kernel scale bytes (w4a16_scale_byte); a block with a zero scale gets
// zero codes. `what` names the tensor in messages. Outputs are resized to w4a16_codes_bytes /
// w4a16_scales_bytes.
void w4a16_repack(const uint8_t* codes, const uint8_t* scales, int64_t n_experts, int64_t n, int64_t k,
                  std::vector<uint8_t>& codes_out, std::vector<uint8_t>& scales_out, const char* what = "weight");

// Gate and up projections of a gated MLP ([E, I, K] each, checkpoint layout) -> one kernel-layout
// weight of 2 I rows for the SwiGLU epilogue: row tile rt holds gate rows 8 rt .. 8 rt + 7 (tile
// rows 0..7) and up rows 8 rt .. 8 rt + 7 (tile rows 8..15), so each lane's accumulators pair a
// gate row with its up row. Needs I % 8 == 0 (and what w4a16_repack needs).
void w4a16_repack_gate_up(const uint8_t* gate_codes, const uint8_t* gate_scales, const uint8_t* up_codes,
                          const uint8_t* up_scales, int64_t n_experts, int64_t inter, int64_t k,
                          std::vector<uint8_t>& codes_out, std::vector<uint8_t>& scales_out, const char* what = "gate_up");

// The inverse (kernel layout -> checkpoint layout), for tests and `fp4moe inspect`: scale bytes go
// back to their e4m3 codes, so the round trip is exact except that the codes of a zero-scale block
// come back as zeros (the same dequantized values, +-0 -> +0). Throws fp4moe::Error naming expert,
// row and block on a scale byte that no e4m3 code maps to.
void w4a16_unpack(const uint8_t* codes, const uint8_t* scales, int64_t n_experts, int64_t n, int64_t k,
                  std::vector<uint8_t>& codes_out, std::vector<uint8_t>& scales_out);

}  // namespace fp4moe::cuda::sm90
