// CPU checks of sm90_nvfp4_w4a16_grouped_gemm (src/kernels/cuda/sm90/), no GPU needed:
//   * the kernel weight layout's bit permutation (w4a16_weight_layout.h): every 4-bit code in
//     every (register, half) slot decodes to exactly bf16(e2m1 x 2^-126) there and to zero in the
//     other 7 halves, whatever the other slots hold; the decode is a pure permutation of the word;
//   * the kernel scale byte (w4a16_scale_byte, issue #5): a bijection of the 127 e4m3 codes
//     0x00..0x7E onto its image, inverted by w4a16_scale_byte_to_e4m3 (which refuses every other
//     byte); the scale word B x 0x00100010 + 0x75007500 is e4m3 x 2^118 in both halves for every
//     nonzero code, the packed-byte path (w4a16_scale_word_of, the kernel's PRMT + IMAD) agrees
//     with it for every byte in every position, and e2m1 x e4m3 x 2^-8 is exact for every code x
//     scale through the new word (the host emulation of __hmul2 truncates: the f64 product shows
//     it drops nothing; a zero scale's codes are zero, so its product is +0);
//   * w4a16_repack / w4a16_unpack: round trip on random data (K = 16 x odd, N = 24, E = 3, ...;
//     exact, except the codes of zero-scale blocks come back zero), every code and scale byte found
//     where the file comment's formulas say, padding zero, sizes, and the refusals (K % 16, N % 8,
//     a NaN or negative scale naming expert, row and block; unpack of a byte no e4m3 maps to);
//   * (the emulation of both kernels' inner loops is in test_cuda_w4a16_emulation_host.cpp:)
//     an emulation of both kernels' inner loops on a random problem (2 experts x 32 rows,
//     K = 208 = 16 x 13, 16 tokens; kStream also K = 1040 = 16 x 65): the A fragments from the
//     kernel-layout bytes as each kernel indexes them (kStream: each lane's 16 B of chunk kc, indexed
//     in the global layout as before, copied by cp.async into its warp's shared-memory ring slot
//     kc % stages of a host image of the CTA's W4A16Layout and read back by the same lane after
//     wait_group(stages - 2), every shipped stream config and a ring of 4; kPipeline: a host image
//     of one stage as load_stage's cp.async copies fill it, block_k 128 and 256), the B fragments
//     from the activations (kStream: 32 B at x[tok][64 kc + 16 t] from TMA boxes in the CTA's ring;
//     kPipeline: x_tile_offset swizzle and load_b_fragments), an emulated mma.sync m16n8k16
//     written here from the PTX fragment layouts, and 2^8 x D against the f64 dot products of the
//     dequantized weights (format/nvfp4.h);
//   * the pipeline kernel's per-lane scale slice gives the scale words of w4a16_chunk_scales;
//   * the stream kernel's unchecked groups (w4a16_stream_unchecked_end): brute force over K parts,
//     K tails and ring depths, every prefetch of every unchecked group in range, the first checked
//     group (if any before kg1) with a prefetch out of range;
//   * (the layouts, configs and problem checks are in test_cuda_w4a16_configs_host.cpp.)
// Run: test_cuda_w4a16_host (FP4MOE_TEST_SEED=<n> replays a seed).
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <deque>
#include <functional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "format/nvfp4.h"
#include "kernels/cuda/sm90/w4a16_fragments.h"
#include "kernels/cuda/sm90/w4a16_grouped_gemm.h"
#include "kernels/cuda/sm90/w4a16_weight_layout.h"
#include "plan/gpu_table.h"
#include "plan/kernel_families.h"
#include "plan/layout_sm90_w4a16.h"
#include "testing/testing.h"
#include "kernels/w4a16_test_util.h"

namespace fp4moe::cuda::sm90 {
namespace {

using namespace w4a16_test;

// bf16 bits of e2m1(code) x 2^-126: the magnitude from format/nvfp4.h through f32 (0.5 x 2^-126 =
// 2^-127 is an f32/bf16 subnormal, exactly representable; ldexp is exact here), the sign from code
// bit 3 (format::e2m1_to_f32 decodes code 8 to +0 as ModelOpt does; the kernel's bit permutation
// gives -0, the same value).
uint16_t e2m1_slot_bits(uint32_t code) {
  const float v = std::ldexp(std::fabs(format::e2m1_to_f32(static_cast<uint8_t>(code))), -126);
  uint32_t u;
  std::memcpy(&u, &v, 4);
  EXPECT_EQ(u & 0xFFFFu, 0u) << "e2m1 code " << code << " x 2^-126 is not a bf16";
  return static_cast<uint16_t>((u >> 16) | ((code & 0x8u) << 12));
}

// ---- the bit permutation --------------------------------------------------------------------

TEST(W4A16Decode, EveryCodeInEverySlotDecodesAloneAndExactly) {
  std::mt19937_64 rng(testing::test_seed() ^ 0xE2A1ull);
  for (uint32_t j = 0; j < 4; ++j) {
    for (uint32_t half = 0; half < 2; ++half) {
      for (uint32_t code = 0; code < 16; ++code) {
        // Alone in a zero word: only its own half is non-zero (code 0 and 8 are +-0: bits 0 / 0x8000).
        uint32_t a[4];
        w4a16_word_to_pairs(w4a16_place_code(0, j, half, code), a);
        for (uint32_t jj = 0; jj < 4; ++jj) {
          for (uint32_t hh = 0; hh < 2; ++hh) {
            const uint16_t want = (jj == j && hh == half) ? e2m1_slot_bits(code) : 0;
            ASSERT_EQ(half_bits(a[jj], hh), want) << "code " << code << " placed at (j " << j << ", half " << half
                                                  << "), read at (j " << jj << ", half " << hh << ")";
          }
        }
        EXPECT_EQ(static_cast<double>(half_f32(a[j], half)),
                  std::ldexp(static_cast<double>(format::e2m1_to_f32(static_cast<uint8_t>(code))), -126))
            << "code " << code;
        // Among random codes in the other 7 slots (placed over a random word: the 8 footprints cover
        // all 32 bits, so nothing of the garbage may survive), every slot still decodes to its code.
        for (int rep = 0; rep < 32; ++rep) {
          uint32_t placed[4][2];
          uint32_t word = static_cast<uint32_t>(rng());
          for (uint32_t jj = 0; jj < 4; ++jj) {
            for (uint32_t hh = 0; hh < 2; ++hh) {
              placed[jj][hh] = static_cast<uint32_t>(rng() & 0xFu);
              word = w4a16_place_code(word, jj, hh, placed[jj][hh]);
            }
          }
          word = w4a16_place_code(word, j, half, code);
          placed[j][half] = code;
          w4a16_word_to_pairs(word, a);
          for (uint32_t jj = 0; jj < 4; ++jj) {
            for (uint32_t hh = 0; hh < 2; ++hh) {
              ASSERT_EQ(half_bits(a[jj], hh), e2m1_slot_bits(placed[jj][hh]))
                  << "word 0x" << std::hex << word << std::dec << " slot (j " << jj << ", half " << hh << ") after placing code "
                  << code << " at (j " << j << ", half " << half << ")";
            }
          }
        }
      }
    }
  }
}

// Decoding loses no bit: reading the 8 codes back from the pairs and placing them into a zero
// word rebuilds any word.
TEST(W4A16Decode, DecodeIsAPermutationOfTheWord) {
  std::mt19937_64 rng(testing::test_seed() ^ 0x9E47ull);
  uint16_t bits_of[16];
  for (uint32_t c = 0; c < 16; ++c) bits_of[c] = e2m1_slot_bits(c);
  for (int rep = 0; rep < 4096; ++rep) {
    const uint32_t word = rep == 0 ? 0xFFFFFFFFu : static_cast<uint32_t>(rng());
    uint32_t a[4];
    w4a16_word_to_pairs(word, a);
    uint32_t rebuilt = 0;
    for (uint32_t j = 0; j < 4; ++j) {
      for (uint32_t half = 0; half < 2; ++half) {
        const uint16_t b = half_bits(a[j], half);
        const uint16_t* hit = std::find(bits_of, bits_of + 16, b);
        ASSERT_NE(hit, bits_of + 16) << "word 0x" << std::hex << word << ": slot bits 0x" << b << " are no e2m1 code";
        rebuilt = w4a16_place_code(rebuilt, j, half, static_cast<uint32_t>(hit - bits_of));
      }
    }
    ASSERT_EQ(rebuilt, word);
  }
}

// w4a16_code_slot against the PTX m16n8k16 A fragment: lane 4 g + t holds rows g and g + 8; the
// thread of quad position t owns NVFP4 block t (k 16 t .. 16 t + 15) of the chunk; and the 1024
// codes of a 16 x 64 tile take 1024 distinct (lane, word, register, half) slots.
TEST(W4A16Decode, CodeSlotsOfATileAreDistinctAndFollowTheFragment) {
  std::set<uint32_t> seen;
  for (uint32_t r = 0; r < 16; ++r) {
    for (uint32_t k = 0; k < 64; ++k) {
      const W4A16CodeSlot s = w4a16_code_slot(r, k);
      ASSERT_LT(s.lane, 32u);
      ASSERT_LT(s.word, 4u);
      ASSERT_LT(s.j, 4u);
      ASSERT_LT(s.half, 2u);
      EXPECT_EQ(s.lane / 4, r % 8) << "row " << r << " k " << k;   // groupID g
      EXPECT_EQ(s.lane % 4, k / 16) << "row " << r << " k " << k;  // NVFP4 block of the chunk
      EXPECT_EQ(s.j & 1u, r / 8) << "row " << r << " k " << k;     // a1, a3: row g + 8
      // a[s][j] holds k = 16 t + 4 s + 2 (j >> 1) + half
      EXPECT_EQ(16 * (s.lane % 4) + 4 * s.word + 2 * (s.j >> 1) + s.half, k) << "row " << r;
      seen.insert(((s.lane * 4 + s.word) * 4 + s.j) * 2 + s.half);
    }
  }
  EXPECT_EQ(seen.size(), 1024u);
}

// ---- scales and the exact products ------------------------------------------------------------

// Every non-negative, non-NaN e4m3 code has a kernel scale byte, distinct, that maps back; no
// other byte maps back. The 128 e4m3 codes with the sign bit and the NaN are refused at repack.
// The wgmma kernel's per-chunk slot, A buffer and phase parity from (scale group, chunk in the group):
// the ring arithmetic of chunk i = 8 group + j for every power-of-2 stage and buffer count dividing the
// group (the 8-stage parity flips every group: a formula from j alone would be wrong there).
TEST(W4A16WgmmaPhase, ChunkPhaseIsTheRingArithmeticOfTheChunkIndex) {
  for (uint32_t stages : {1u, 2u, 4u, 8u}) {
    for (uint32_t buffers : {1u, 2u, 4u, 8u}) {
      for (uint32_t i = 0; i < 1000; ++i) {
        const W4A16WgmmaChunkPhase ph = w4a16_wgmma_chunk_phase(i / kW4A16ScaleGroup, i % kW4A16ScaleGroup, stages, buffers);
        ASSERT_EQ(ph.slot, i % stages) << stages << " stages, chunk " << i;
        ASSERT_EQ(ph.abuf, i % buffers) << buffers << " buffers, chunk " << i;
        ASSERT_EQ(ph.parity, (i / stages) & 1u) << stages << " stages, chunk " << i;
      }
    }
  }
  static_assert(w4a16_wgmma_chunk_phase(1, 0, 8, 4).parity == 1 && w4a16_wgmma_chunk_phase(1, 0, 4, 4).parity == 0);
}

TEST(W4A16Scale, ScaleByteIsABijectionOfTheUe4m3Codes) {
  std::set<uint32_t> image;
  for (uint32_t code = 0; code < 0x7F; ++code) {
    const uint32_t b = w4a16_scale_byte(code);
    ASSERT_LE(b, kW4A16ScaleByteMax) << "code 0x" << std::hex << code;
    EXPECT_TRUE(image.insert(b).second) << "two codes share scale byte 0x" << std::hex << b;
    uint32_t back = 0xFFFF;
    ASSERT_TRUE(w4a16_scale_byte_to_e4m3(b, back)) << "code 0x" << std::hex << code << " byte 0x" << b;
    EXPECT_EQ(back, code) << "byte 0x" << std::hex << b;
    if (code >= 0x08) {
      EXPECT_EQ(b, code + 32) << "normal code 0x" << std::hex << code;
    }
  }
  EXPECT_EQ(image.size(), 127u);
  EXPECT_EQ(w4a16_scale_byte(0), 0u);
  EXPECT_EQ(w4a16_scale_byte(0x7E), kW4A16ScaleByteMax);
  const uint32_t subnormals[7] = {0x10, 0x18, 0x1C, 0x20, 0x22, 0x24, 0x26};  // e4m3 0x01..0x07
  for (uint32_t m = 1; m <= 7; ++m) EXPECT_EQ(w4a16_scale_byte(m), subnormals[m - 1]) << "subnormal " << m;
  for (uint32_t b = 0; b < 256; ++b) {
    uint32_t e4m3 = 0;
    EXPECT_EQ(w4a16_scale_byte_to_e4m3(b, e4m3), image.count(b) == 1) << "byte 0x" << std::hex << b;
  }
}

// B x 0x00100010 + 0x75007500 is bf16x2 {e4m3 x 2^118, e4m3 x 2^118}, a positive normal bf16 with
// the low 4 mantissa bits zero, for every code but 0 (whose word is finite: zero codes make its
// products 0).
TEST(W4A16Scale, ScaleWordIsE4m3Times2To118ForEveryCode) {
  int checked = 0;
  for (uint32_t code = 0; code < 0x7F; ++code) {
    const uint32_t w = w4a16_scale_word(w4a16_scale_byte(code));
    EXPECT_EQ(w & 0xFFFFu, w >> 16) << "code 0x" << std::hex << code;
    EXPECT_TRUE(std::isfinite(lo_f32(w))) << "code 0x" << std::hex << code;
    EXPECT_FALSE(std::signbit(lo_f32(w))) << "code 0x" << std::hex << code;
    if (code == 0) {
      EXPECT_EQ(static_cast<double>(lo_f32(w)), std::ldexp(1.0, 107));
      continue;
    }
    const double want = std::ldexp(static_cast<double>(format::e4m3_to_f32(static_cast<uint8_t>(code))), 118);
    EXPECT_EQ(static_cast<double>(lo_f32(w)), want) << "code 0x" << std::hex << code;
    EXPECT_EQ(static_cast<double>(hi_f32(w)), want) << "code 0x" << std::hex << code;
    EXPECT_NE(w & 0x7F80u, 0u) << "subnormal scale word, code 0x" << std::hex << code;
    EXPECT_EQ(w & 0xFu, 0u) << "code 0x" << std::hex << code;
    ++checked;
  }
  EXPECT_EQ(checked, 126);
}

// The kernel's packed path (PRMT of byte i into bytes 0 and 2, then x 16 + base) against the
// one-byte formula, for every byte value in each of the 4 positions with the other bytes random.
TEST(W4A16Scale, PackedScaleWordMatchesTheByteFormulaInEveryPosition) {
  std::mt19937_64 rng(testing::test_seed() ^ 0xB17Eull);
  for (uint32_t b = 0; b < 256; ++b) {
    for (uint32_t i = 0; i < 4; ++i) {
      const uint32_t other = static_cast<uint32_t>(rng());
      const uint32_t packed = (other & ~(0xFFu << (8 * i))) | (b << (8 * i));
      EXPECT_EQ(w4a16_scale_word_of(packed, i), w4a16_scale_word(b)) << "byte 0x" << std::hex << b << " at " << i;
      // The device form, written out: PRMT selector 0x4i4i (byte i, zero, byte i, zero), x 16, + base.
      const uint32_t bb = (packed >> (8 * i)) & 0xFFu;
      EXPECT_EQ((bb | (bb << 16)) * 16u + kW4A16ScaleWordBase, w4a16_scale_word(b)) << "byte 0x" << std::hex << b;
    }
  }
}

// The kernel relies on e2m1 x 2^-126 (a register half) times e4m3 x 2^118 (the scale word made from
// the kernel scale byte) being exact in bf16; a zero scale has zero codes (w4a16_repack), so only
// code 0 meets scale 0's word (2^107) and gives +0. The host's w4a16_mul_pairs multiplies in f32 and truncates to bf16: equality with
// the f64 product proves the truncation dropped nothing (so __hmul2's rounding has nothing to round).
TEST(W4A16Scale, DequantizedProductIsExactForEveryCodeAndScale) {
  int checked = 0;
  for (uint32_t code = 0; code < 16; ++code) {
    uint32_t word = 0;  // `code` in all 8 slots
    for (uint32_t j = 0; j < 4; ++j) {
      for (uint32_t half = 0; half < 2; ++half) word = w4a16_place_code(word, j, half, code);
    }
    uint32_t raw[4];
    w4a16_word_to_pairs(word, raw);
    const double e2m1 = format::e2m1_to_f32(static_cast<uint8_t>(code));
    for (uint32_t s = 0; s < 0x7F; ++s) {
      if (s == 0 && code != 0) continue;  // zero-scale blocks have zero codes
      const uint32_t sw = w4a16_scale_word(w4a16_scale_byte(s));
      const double want = std::ldexp(e2m1 * format::e4m3_to_f32(static_cast<uint8_t>(s)), -kW4A16AccShift);
      for (uint32_t j = 0; j < 4; ++j) {
        const uint32_t prod = w4a16_mul_pairs(raw[j], sw);
        for (uint32_t half = 0; half < 2; ++half) {
          const double exact = static_cast<double>(half_f32(raw[j], half)) * static_cast<double>(half_f32(sw, half));
          ASSERT_EQ(static_cast<double>(half_f32(prod, half)), exact)
              << "code " << code << " scale 0x" << std::hex << s << ": the bf16 product lost bits";
          ASSERT_EQ(exact, want) << "code " << code << " scale 0x" << std::hex << s;
          if (s == 0) {
            EXPECT_EQ(half_bits(prod, half), 0u) << "zero scale: the product must be +0";
          }
          if (want != 0) {  // a normal bf16 in [2^-18, 10.5]: nothing near the subnormals
            EXPECT_GE(std::fabs(want), std::ldexp(1.0, -18)) << "code " << code << " scale 0x" << std::hex << s;
            EXPECT_LE(std::fabs(want), 10.5) << "code " << code << " scale 0x" << std::hex << s;
            EXPECT_NE(half_bits(prod, half) & 0x7F80u, 0u) << "subnormal product, code " << code << " scale 0x" << std::hex << s;
          }
        }
      }
      ++checked;
    }
  }
  EXPECT_EQ(checked, 16 * 126 + 1);
}

// Byte 2 j of a lane's 16 B scale group is row g's scale of chunk j, byte 2 j + 1 row g + 8's.
TEST(W4A16Scale, ChunkScalesPickTheBytesOfChunkJ) {
  std::mt19937_64 rng(testing::test_seed() ^ 0x5CA1Eull);
  for (int rep = 0; rep < 64; ++rep) {
    uint8_t bytes[16];
    for (uint8_t& b : bytes) b = static_cast<uint8_t>(w4a16_scale_byte(random_scale(rng)));
    uint4 group;
    std::memcpy(&group, bytes, 16);
    for (uint32_t j = 0; j < kW4A16ScaleGroup; ++j) {
      uint32_t lo = 0, hi = 0;
      w4a16_chunk_scales(group, j, lo, hi);
      EXPECT_EQ(lo, w4a16_scale_word(bytes[2 * j])) << "chunk " << j;
      EXPECT_EQ(hi, w4a16_scale_word(bytes[2 * j + 1])) << "chunk " << j;
    }
  }
}

// ---- repack ---------------------------------------------------------------------------------

uint32_t load_u32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

struct RepackShape {
  int64_t n_experts, n, k, codes_bytes, scales_bytes;
};

// Sizes by hand: row_tiles = ceil(N / 16), k_chunks = ceil(K / 64), k_groups = ceil(k_chunks / 8),
// codes E x row_tiles x k_chunks x 512 B, scales E x row_tiles x k_groups x 512 B.
constexpr RepackShape kRepackShapes[] = {
    {3, 24, 48, 3 * 2 * 1 * 512, 3 * 2 * 1 * 512},      // K = 16 x 3, N = 24 (half a row tile of padding)
    {1, 16, 1040, 1 * 1 * 17 * 512, 1 * 1 * 3 * 512},   // K = 16 x 65: 17 chunks, 3 scale groups
    {2, 40, 576, 2 * 3 * 9 * 512, 2 * 3 * 2 * 512},     // 9 chunks: a second group with one chunk
    {1, 8, 16, 512, 512},                               // the smallest problem
    {2, 32, 512, 2 * 2 * 8 * 512, 2 * 2 * 1 * 512},     // exactly one full scale group
};

TEST(W4A16Stream, UncheckedGroupsPrefetchOnlyInRange) {
  // Every (K, split part, ring depth) shape the kernel can meet at small sizes: K = 16 .. 3072 in
  // steps of 16 (K tails of every length), parts of 1..4 groups, rings of 4, 8, 16 chunks.
  int checked_shapes = 0;
  for (int64_t k = 16; k <= 3072; k += 16) {
    const int k_chunks = static_cast<int>((k + 63) / 64);
    const int k_groups = (k_chunks + static_cast<int>(kW4A16ScaleGroup) - 1) / static_cast<int>(kW4A16ScaleGroup);
    for (int per = 1; per <= 4; ++per) {
      for (int kg0 = 0; kg0 < k_groups; kg0 += per) {
        const int kg1 = std::min(kg0 + per, k_groups);
        const int kc_end = std::min(kg1 * static_cast<int>(kW4A16ScaleGroup), k_chunks);
        for (uint32_t stages : {4u, 8u, 16u}) {
          const int end = w4a16_stream_unchecked_end(kg0, kg1, kc_end, k, stages);
          ASSERT_GE(end, kg0);
          ASSERT_LE(end, kg1);
          // A group's prefetches: codes and activations of chunk kc + stages - 1.
          auto in_range = [&](int kg) {
            for (uint32_t j = 0; j < kW4A16ScaleGroup; ++j) {
              const int64_t c = int64_t{kg} * kW4A16ScaleGroup + j + stages - 1;
              if (c >= kc_end || (c + 1) * 64 > k) return false;
            }
            return true;
          };
          for (int kg = kg0; kg < end; ++kg) {
            ASSERT_TRUE(in_range(kg)) << "K " << k << " groups [" << kg0 << ", " << kg1 << ") stages " << stages
                                      << ": unchecked group " << kg << " prefetches out of range";
          }
          if (end < kg1) {
            EXPECT_FALSE(in_range(end)) << "K " << k << " groups [" << kg0 << ", " << kg1 << ") stages " << stages
                                        << ": group " << end << " could run unchecked";
          }
          ++checked_shapes;
        }
      }
    }
  }
  EXPECT_GT(checked_shapes, 1000);
  // The shard's gate_up (K = 6144, 12 groups, unsplit, ring 8): groups 0..10 unchecked, the last checked.
  EXPECT_EQ(w4a16_stream_unchecked_end(0, 12, 96, 6144, 8), 11);
  // down (K = 2048, 4 groups): 0..2 unchecked.
  EXPECT_EQ(w4a16_stream_unchecked_end(0, 4, 32, 2048, 8), 3);
}

TEST(W4A16Repack, RoundTripsAndPlacesEveryCodeWhereTheLayoutSays) {
  std::mt19937_64 rng(testing::test_seed() ^ 0x4E9Aull);
  for (const RepackShape& sh : kRepackShapes) {
    const std::string what = "E=" + std::to_string(sh.n_experts) + " N=" + std::to_string(sh.n) + " K=" + std::to_string(sh.k);
    Weights w = random_weights(rng, sh.n_experts, sh.n, sh.k);
    w.scales.front() = 0;  // zero-scale blocks (random ones come 1 time in 127) at both ends
    w.scales.back() = 0;
    std::vector<uint8_t> kcodes, kscales;
    w4a16_repack(w.codes.data(), w.scales.data(), sh.n_experts, sh.n, sh.k, kcodes, kscales, "test weight");
    ASSERT_EQ(w4a16_codes_bytes(sh.n_experts, sh.n, sh.k), sh.codes_bytes) << what;
    ASSERT_EQ(w4a16_scales_bytes(sh.n_experts, sh.n, sh.k), sh.scales_bytes) << what;
    ASSERT_EQ(static_cast<int64_t>(kcodes.size()), sh.codes_bytes) << what;
    ASSERT_EQ(static_cast<int64_t>(kscales.size()), sh.scales_bytes) << what;

    // Every code and scale where the file comment's formulas put it (written out here, not taken
    // from the repack): codes ((e * row_tiles + rt) * k_chunks + kc) * 512 + 16 L + 4 s, register
    // j = (r >= 8) + 2 ((k % 4) >= 2), half k % 2; scales ((e * row_tiles + rt) * k_groups + kg) *
    // 512 + 16 L + 2 (kc % 8) + (r >= 8). Every bit not so covered must be zero.
    const int64_t row_tiles = (sh.n + 15) / 16, k_chunks = (sh.k + 63) / 64, k_groups = (k_chunks + 7) / 8;
    std::vector<uint8_t> code_cover(kcodes.size(), 0), scale_cover(kscales.size(), 0);
    for (int64_t e = 0; e < sh.n_experts; ++e) {
      for (int64_t row = 0; row < sh.n; ++row) {
        const int64_t rt = row / 16, r = row % 16, g = r % 8;
        for (int64_t kk = 0; kk < sh.k; ++kk) {
          const int64_t kc = kk / 64, kl = kk % 64, t = kl / 16, within = kl % 16;
          const int64_t lane = 4 * g + t, s = within / 4;
          const uint32_t j = static_cast<uint32_t>(r / 8 + 2 * ((within / 2) % 2)), half = static_cast<uint32_t>(within % 2);
          const int64_t off = ((e * row_tiles + rt) * k_chunks + kc) * 512 + 16 * lane + 4 * s;
          uint32_t a[4];
          w4a16_word_to_pairs(load_u32(kcodes.data() + off), a);
          const uint32_t want_code = w.scale(e, row, kk) == 0 ? 0u : w.code(e, row, kk);  // zero block: zero codes
          ASSERT_EQ(half_bits(a[j], half), e2m1_slot_bits(want_code))
              << what << ": expert " << e << " row " << row << " k " << kk;
          const uint32_t mask = w4a16_place_code(0, j, half, 0xFu);
          for (int b = 0; b < 4; ++b) code_cover[static_cast<size_t>(off + b)] |= static_cast<uint8_t>(mask >> (8 * b));
          if (kk % 16 == 0) {
            const int64_t soff = ((e * row_tiles + rt) * k_groups + kc / 8) * 512 + 16 * lane + 2 * (kc % 8) + r / 8;
            ASSERT_EQ(kscales[static_cast<size_t>(soff)], w4a16_scale_byte(w.scale(e, row, kk)))
                << what << ": expert " << e << " row " << row << " block " << kk / 16;
            ++scale_cover[static_cast<size_t>(soff)];
          }
        }
      }
    }
    int64_t covered_bits = 0;
    for (size_t i = 0; i < kcodes.size(); ++i) {
      ASSERT_EQ(kcodes[i] & ~code_cover[i], 0) << what << ": padding code byte " << i << " is not zero";
      covered_bits += __builtin_popcount(code_cover[i]);
    }
    EXPECT_EQ(covered_bits, sh.n_experts * sh.n * sh.k * 4) << what << ": two codes share bits";
    for (size_t i = 0; i < kscales.size(); ++i) {
      ASSERT_LE(scale_cover[i], 1) << what << ": two scales share byte " << i;
      if (scale_cover[i] == 0) {
        ASSERT_EQ(kscales[i], 0) << what << ": padding scale byte " << i << " is not zero";
      }
    }

    // Round trip: the scales exactly; the codes exactly but in zero-scale blocks, which come back
    // zero (the same dequantized values: e2m1 x 0 = 0).
    std::vector<uint8_t> codes_back, scales_back;
    w4a16_unpack(kcodes.data(), kscales.data(), sh.n_experts, sh.n, sh.k, codes_back, scales_back);
    EXPECT_EQ(scales_back, w.scales) << what;
    std::vector<uint8_t> codes_want = w.codes;
    int64_t zero_blocks = 0;
    for (size_t sb = 0; sb < w.scales.size(); ++sb) {
      if (w.scales[sb] != 0) continue;
      ++zero_blocks;
      std::fill_n(codes_want.begin() + static_cast<ptrdiff_t>(sb * 8), 8, uint8_t{0});  // 16 codes = 8 bytes
    }
    EXPECT_EQ(codes_back, codes_want) << what << " (" << zero_blocks << " zero-scale blocks)";
    for (size_t i = 0; i < codes_back.size(); ++i) {
      for (int h = 0; h < 2; ++h) {
        const double s = format::e4m3_to_f32(w.scales[i / 8]);
        ASSERT_EQ(format::e2m1_to_f32(static_cast<uint8_t>((codes_back[i] >> (4 * h)) & 0xFu)) * s,
                  format::e2m1_to_f32(static_cast<uint8_t>((w.codes[i] >> (4 * h)) & 0xFu)) * s)
            << what << ": code byte " << i << " dequantizes differently after the round trip";
      }
    }
  }
}

TEST(W4A16Repack, RefusesWhatTheKernelCannotRunNamingTheNumbers) {
  std::vector<uint8_t> codes(1 << 14, 0x21), scales(1 << 12, 0x38), co, so;  // 0x38 = 1.0
  std::string msg = error_of([&] { w4a16_repack(codes.data(), scales.data(), 1, 16, 40, co, so, "layers.3.w13"); });
  EXPECT_NE(
      msg.find("w4a16 repack of layers.3.w13: K=40 must be a positive multiple of 16 (one NVFP4 block; K % 16 = 8)"),
      std::string::npos)
      << msg;
  msg = error_of([&] { w4a16_repack(codes.data(), scales.data(), 1, 20, 64, co, so, "layers.3.w2"); });
  EXPECT_NE(
      msg.find("w4a16 repack of layers.3.w2: N=20 must be a positive multiple of 8 (16 B output stores; N % 8 = 4)"),
      std::string::npos)
      << msg;
  msg = error_of([&] { w4a16_repack(codes.data(), scales.data(), 0, 16, 64, co, so, "w"); });
  EXPECT_NE(msg.find("E=0, N=16, K=64 must be positive"), std::string::npos) << msg;
  msg = error_of([&] { w4a16_unpack(codes.data(), scales.data(), 1, 16, 40, co, so); });
  EXPECT_NE(msg.find("w4a16 repack of weight: K=40 must be a positive multiple of 16"), std::string::npos) << msg;

  // E = 2, N = 16, K = 64: 4 scales per row. The largest finite scale (448), the smallest
  // subnormal and zero are fine ...
  scales[0] = 0x7E;
  scales[1] = 0x01;
  scales[2] = 0x00;
  w4a16_repack(codes.data(), scales.data(), 2, 16, 64, co, so, "w2");
  // ... unpack names a scale byte that no e4m3 code maps to (0x01: 5-bit exponent 0) ...
  {
    std::vector<uint8_t> kc = co, ks = so, c2, s2;
    w4a16_unpack(kc.data(), ks.data(), 2, 16, 64, c2, s2);
    ks[16 * 5 + 1] = 0x01;  // lane 5 = row 1, block 1; byte 1 = row 9's scale of chunk 0
    msg = error_of([&] { w4a16_unpack(kc.data(), ks.data(), 2, 16, 64, c2, s2); });
    EXPECT_NE(msg.find("w4a16 unpack: expert 0, row 9, block 1 (k 16..31) has scale byte 0x1, which no e4m3 scale maps to"),
              std::string::npos)
        << msg;
  }
  // ... a negative scale (the sign bit: NVFP4 scales are UE4M3) is named by expert, row and block,
  // -0 included ...
  scales[(1 * 16 + 4) * 4 + 1] = 0xB8;  // -1.0
  msg = error_of([&] { w4a16_repack(codes.data(), scales.data(), 2, 16, 64, co, so, "w2"); });
  EXPECT_NE(msg.find("w4a16 repack of w2: expert 1, row 4, block 1 (k 16..31) has a negative e4m3 scale (0xb8; "
                     "NVFP4 block scales are UE4M3, sign bit 0)"),
            std::string::npos)
      << msg;
  scales[(1 * 16 + 4) * 4 + 1] = 0x80;
  msg = error_of([&] { w4a16_repack(codes.data(), scales.data(), 2, 16, 64, co, so, "w2"); });
  EXPECT_NE(msg.find("expert 1, row 4, block 1 (k 16..31) has a negative e4m3 scale (0x80"), std::string::npos) << msg;
  scales[(1 * 16 + 4) * 4 + 1] = 0x38;
  // ... a NaN is named by expert, row and block (0x7F and 0xFF).
  scales[(1 * 16 + 5) * 4 + 2] = 0x7F;
  msg = error_of([&] { w4a16_repack(codes.data(), scales.data(), 2, 16, 64, co, so, "w2"); });
  EXPECT_NE(msg.find("w4a16 repack of w2: expert 1, row 5, block 2 (k 32..47) has a NaN e4m3 scale (0x7f)"),
            std::string::npos)
      << msg;
  scales[(1 * 16 + 5) * 4 + 2] = 0x38;
  scales[(0 * 16 + 15) * 4 + 3] = 0xFF;
  msg = error_of([&] { w4a16_repack(codes.data(), scales.data(), 2, 16, 64, co, so, "w2"); });
  EXPECT_NE(msg.find("expert 0, row 15, block 3 (k 48..63) has a NaN e4m3 scale (0xff)"), std::string::npos) << msg;
}

}  // namespace
}  // namespace fp4moe::cuda::sm90
