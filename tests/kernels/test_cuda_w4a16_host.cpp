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
//     from the activations (kStream: a register ring of 4 chunks, 32 B at x[tok][64 kc + 16 t];
//     kPipeline: x_tile_offset swizzle and load_b_fragments), an emulated mma.sync m16n8k16
//     written here from the PTX fragment layouts, and 2^8 x D against the f64 dot products of the
//     dequantized weights (format/nvfp4.h);
//   * the pipeline kernel's per-lane scale slice gives the scale words of w4a16_chunk_scales;
//   * the constexpr layout (plan/layout_sm90_w4a16.h) of both kinds, config names, the kernel's
//     carve against what `fp4moe plan` sizes, the launcher refusing exactly what the planner
//     rejects, the check() rules, the problem checks, and the default config per token count.
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


std::string expect_throw(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "no fp4moe::Error thrown";
  return "";
}

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
  std::string msg = expect_throw([&] { w4a16_repack(codes.data(), scales.data(), 1, 16, 40, co, so, "layers.3.w13"); });
  EXPECT_NE(msg.find("w4a16 repack of layers.3.w13: K=40 must be a multiple of 16 (one NVFP4 block; K % 16 = 8)"),
            std::string::npos)
      << msg;
  msg = expect_throw([&] { w4a16_repack(codes.data(), scales.data(), 1, 20, 64, co, so, "layers.3.w2"); });
  EXPECT_NE(msg.find("w4a16 repack of layers.3.w2: N=20 must be a multiple of 8 (16 B output stores; N % 8 = 4)"),
            std::string::npos)
      << msg;
  msg = expect_throw([&] { w4a16_repack(codes.data(), scales.data(), 0, 16, 64, co, so, "w"); });
  EXPECT_NE(msg.find("E=0, N=16, K=64 must be positive"), std::string::npos) << msg;
  msg = expect_throw([&] { w4a16_unpack(codes.data(), scales.data(), 1, 16, 40, co, so); });
  EXPECT_NE(msg.find("w4a16 repack of weight: K=40 must be a multiple of 16"), std::string::npos) << msg;

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
    msg = expect_throw([&] { w4a16_unpack(kc.data(), ks.data(), 2, 16, 64, c2, s2); });
    EXPECT_NE(msg.find("w4a16 unpack: expert 0, row 9, block 1 (k 16..31) has scale byte 0x1, which no e4m3 scale maps to"),
              std::string::npos)
        << msg;
  }
  // ... a negative scale (the sign bit: NVFP4 scales are UE4M3) is named by expert, row and block,
  // -0 included ...
  scales[(1 * 16 + 4) * 4 + 1] = 0xB8;  // -1.0
  msg = expect_throw([&] { w4a16_repack(codes.data(), scales.data(), 2, 16, 64, co, so, "w2"); });
  EXPECT_NE(msg.find("w4a16 repack of w2: expert 1, row 4, block 1 (k 16..31) has a negative e4m3 scale (0xb8; "
                     "NVFP4 block scales are UE4M3, sign bit 0)"),
            std::string::npos)
      << msg;
  scales[(1 * 16 + 4) * 4 + 1] = 0x80;
  msg = expect_throw([&] { w4a16_repack(codes.data(), scales.data(), 2, 16, 64, co, so, "w2"); });
  EXPECT_NE(msg.find("expert 1, row 4, block 1 (k 16..31) has a negative e4m3 scale (0x80"), std::string::npos) << msg;
  scales[(1 * 16 + 4) * 4 + 1] = 0x38;
  // ... a NaN is named by expert, row and block (0x7F and 0xFF).
  scales[(1 * 16 + 5) * 4 + 2] = 0x7F;
  msg = expect_throw([&] { w4a16_repack(codes.data(), scales.data(), 2, 16, 64, co, so, "w2"); });
  EXPECT_NE(msg.find("w4a16 repack of w2: expert 1, row 5, block 2 (k 32..47) has a NaN e4m3 scale (0x7f)"),
            std::string::npos)
      << msg;
  scales[(1 * 16 + 5) * 4 + 2] = 0x38;
  scales[(0 * 16 + 15) * 4 + 3] = 0xFF;
  msg = expect_throw([&] { w4a16_repack(codes.data(), scales.data(), 2, 16, 64, co, so, "w2"); });
  EXPECT_NE(msg.find("expert 0, row 15, block 3 (k 48..63) has a NaN e4m3 scale (0xff)"), std::string::npos) << msg;
}

// ---- layout, configs, refusals --------------------------------------------------------------

// The static_asserts the kernel templates make about their config, checked for the whole table.
TEST(W4A16Configs, ShippedConfigsMeetTheKernelsStaticAsserts) {
  for (const W4A16Config& c : kW4A16Configs) {
    const std::string name = w4a16_config_name(c);
    EXPECT_TRUE(W4A16Layout::make(c).valid()) << name;
    if (c.kind == W4A16Kind::kStream) {
      // sm90_nvfp4_w4a16_stream_kernel: static_assert(kLayout.fits(kSm90SmemOptinBytes)) and
      // static_assert(kW4A16ScaleGroup % kW4A16StreamXAhead == 0) (xs = j % 4 is compile-time).
      EXPECT_TRUE(W4A16Layout::make(c).fits(kSm90SmemOptinBytes)) << name;
      EXPECT_EQ(kW4A16ScaleGroup % kW4A16StreamXAhead, 0u) << name << ": the activation ring must divide a scale group";
      // cp_async_wait<stages - 2> needs stages >= 2 (and the prologue's stages - 1 copies >= 1);
      // ring slot kc % stages is a mask for a power of two.
      EXPECT_GE(c.stages, 2u) << name;
      EXPECT_EQ(c.stages & (c.stages - 1), 0u) << name << ": slot = kc % stages";
      EXPECT_EQ(W4A16Layout::make(c).ring_warp_bytes, c.stages * kW4A16TileBytes) << name << ": one 512 B chunk per slot";
    } else {
      EXPECT_EQ(c.block_k % 64, 0u) << name;
      EXPECT_EQ(kW4A16ScaleGroup % (c.block_k / 64), 0u) << name;
    }
  }
}

TEST(W4A16Layout, PipelineRegionsAreAlignedAndSumToTheTotal) {
  int n_pipeline = 0;
  for (const W4A16Config& c : kW4A16Configs) {
    if (c.kind != W4A16Kind::kPipeline) continue;
    ++n_pipeline;
    const W4A16Layout l = W4A16Layout::make(c);
    const std::string name = w4a16_config_name(c);
    ASSERT_TRUE(l.valid()) << name;
    EXPECT_LE(l.total_bytes(), kSm90SmemOptinBytes) << name;
    uint32_t sum = 0;
    for (int i = 0; i < l.layout.n_regions; ++i) {
      EXPECT_EQ(l.layout.regions[i].offset, sum) << name << " region " << l.layout.regions[i].name;
      EXPECT_EQ(l.layout.regions[i].offset % 128, 0u) << name << " region " << l.layout.regions[i].name;
      sum += l.layout.regions[i].bytes;
    }
    EXPECT_EQ(sum, l.total_bytes()) << name;
    EXPECT_EQ(l.x_tile_bytes, c.block_t * c.block_k * 2) << name;
    EXPECT_EQ(l.w_tiles_bytes, c.block_w * c.block_k / 2) << name;
    EXPECT_EQ(l.w_tiles_bytes, c.block_w / 16 * (c.block_k / 64) * kW4A16TileBytes) << name;  // whole 512 B tiles
    EXPECT_EQ(l.w_scales_bytes, c.block_w * c.block_k / 16) << name;
    EXPECT_EQ(l.w_scales_bytes, c.block_w / 16 * 32 * 2 * (c.block_k / 64)) << name;  // per lane 2 B per chunk
    EXPECT_EQ(l.stage_stride, l.x_tile_bytes + l.w_tiles_bytes + l.w_scales_bytes) << name;
    ASSERT_GE(l.layout.n_regions, static_cast<int>(3 * c.stages + 1)) << name;
    for (uint32_t s = 0; s < c.stages; ++s) {  // x_tile, w_tiles, w_scales per stage, in that order
      EXPECT_EQ(l.layout.regions[3 * s].offset, l.x_tile(s)) << name;
      EXPECT_EQ(l.layout.regions[3 * s + 1].offset, l.w_tiles(s)) << name;
      EXPECT_EQ(l.layout.regions[3 * s + 2].offset, l.w_scales(s)) << name;
      EXPECT_EQ(l.w_tiles(s), l.x_tile(s) + l.x_tile_bytes) << name;
      EXPECT_EQ(l.w_scales(s), l.w_tiles(s) + l.w_tiles_bytes) << name;
    }
    EXPECT_EQ(l.layout.regions[3 * c.stages].offset, l.epilogue_offset) << name;  // then the epilogue
    EXPECT_EQ(l.epilogue_offset, c.stages * l.stage_stride) << name;
    EXPECT_EQ(l.epilogue_bytes, c.block_t * (c.block_w * 2 + 16)) << name;
    EXPECT_EQ(l.total_bytes() % 128, 0u) << name;
  }
  EXPECT_EQ(n_pipeline, 5);
}

// The kStream layout is one region, the code rings: warp w's ring of `stages` chunk slots of
// 512 B (32 lanes x 16 B of one 16 x 64 e2m1 tile) at ring_offset + w x stages x 512
// (tests/plan/test_layouts.cpp pins every config's bytes); the launcher refuses it 1 B short.
TEST(W4A16Layout, StreamConfigsCarveOnlyTheCodeRings) {
  int n_stream = 0;
  for (const W4A16Config& c : kW4A16Configs) {
    if (c.kind != W4A16Kind::kStream) continue;
    ++n_stream;
    const W4A16Layout l = W4A16Layout::make(c);
    const std::string name = w4a16_config_name(c);
    const uint32_t total = c.n_warps() * c.stages * 512;
    ASSERT_TRUE(l.valid()) << name;
    ASSERT_EQ(l.layout.n_regions, 1) << name;
    const plan::SmemRegion& r = l.layout.regions[0];
    EXPECT_STREQ(r.name, "code rings (per warp, e2m1 kernel layout)") << name;
    EXPECT_EQ(r.offset, 0u) << name;
    EXPECT_EQ(r.bytes, total) << name;
    EXPECT_EQ(r.align, 128u) << name;
    EXPECT_EQ(l.ring_offset, 0u) << name;
    EXPECT_EQ(l.ring_warp_bytes, c.stages * 512) << name;
    EXPECT_EQ(l.total_bytes(), total) << name;  // the last warp's ring ends at the request
    EXPECT_EQ(l.x_tile_bytes + l.w_tiles_bytes + l.w_scales_bytes + l.stage_stride + l.epilogue_bytes, 0u) << name;
    EXPECT_EQ(w4a16_smem_summary(c), std::to_string(c.n_warps()) + " warps x code ring (" + std::to_string(c.stages) +
                                         " chunks x 512 B) = " + std::to_string(total) + " B")
        << name;
    EXPECT_NO_THROW(w4a16_check_config(c, total)) << name;
    const std::string msg = expect_throw([&] { w4a16_check_config(c, total - 1); });
    EXPECT_NE(msg.find("config " + name + " needs " + w4a16_smem_summary(c) + " of shared memory > " +
                       std::to_string(total - 1) + " B (the device's opt-in limit per block) by 1 B"),
              std::string::npos)
        << msg;
  }
  EXPECT_EQ(n_stream, 6);
  // By hand: config 0, m64n8_d8, is 64 / 16 = 4 warps x 8 x 512 = 16384 B.
  EXPECT_EQ(w4a16_smem_summary(w4a16_config(0)), "4 warps x code ring (8 chunks x 512 B) = 16384 B");
}

// Config id i is instantiated as sm90_nvfp4_w4a16_stream_kernel<block_w, block_t, stages>, which
// carves its code rings with W4A16Layout::make(W4A16Config{block_w, block_t, 64, stages, kStream})
// (ring_offset + warp x ring_warp_bytes) and is launched with that total_bytes() of dynamic shared
// memory (after cudaFuncSetAttribute), or as sm90_nvfp4_w4a16_pipeline_kernel<block_w, block_t,
// block_k, stages>, which carves with W4A16Layout::make(W4A16Config{block_w, block_t, block_k,
// stages}) and requests its total_bytes(). The planner must size the same config id with the same
// regions.
TEST(W4A16Layout, KernelCarveEqualsThePlannersLayout) {
  const std::vector<plan::TileCandidate> cands = plan::family_candidates(plan::KernelFamily::kSm90W4A16, false);
  ASSERT_EQ(static_cast<int>(cands.size()), w4a16_num_configs());
  const plan::GpuSpec h200 = plan::require_gpu("h200");
  for (int id = 0; id < w4a16_num_configs(); ++id) {
    const W4A16Config& c = w4a16_config(id);
    const std::string name = w4a16_config_name(c);
    const plan::TileCandidate& cand = cands[static_cast<size_t>(id)];
    ASSERT_EQ(cand.to_string(), name) << "config id " << id;
    EXPECT_EQ(cand.base_tile_index, id) << name;
    const plan::SmemLayout planned = plan::candidate_layout(cand, h200, plan::kCutlass420);
    const plan::SmemCheck check = plan::check_smem(cand, h200, plan::kCutlass420);
    EXPECT_TRUE(check.fits) << name << ": " << check.reason;
    EXPECT_EQ(check.stages, static_cast<int>(c.stages)) << name;
    if (c.kind == W4A16Kind::kStream) {
      const W4A16Layout kernel = W4A16Layout::make(W4A16Config{c.block_w, c.block_t, 64, c.stages, W4A16Kind::kStream});
      EXPECT_EQ(c.block_k, 64u) << name;
      ASSERT_EQ(planned.n_regions, 1) << name;
      ASSERT_EQ(kernel.layout.n_regions, 1) << name;
      EXPECT_STREQ(planned.regions[0].name, kernel.layout.regions[0].name) << name;
      EXPECT_EQ(planned.regions[0].offset, kernel.ring_offset) << name;
      EXPECT_EQ(planned.regions[0].bytes, c.n_warps() * kernel.ring_warp_bytes) << name;
      EXPECT_EQ(planned.total_bytes, kernel.total_bytes()) << name;
      EXPECT_EQ(check.bytes, kernel.total_bytes()) << name;  // what the launcher requests
      EXPECT_EQ(check.bytes, c.n_warps() * c.stages * 512) << name;
      EXPECT_EQ(check.stages * check.stage_bytes + check.epilogue_bytes + check.overhead_bytes, check.bytes) << name;
      uint32_t sum = 0;
      for (const plan::BreakdownItem& b : check.breakdown) sum += b.bytes;
      EXPECT_EQ(sum, check.bytes) << name;
      continue;
    }
    if (plan::w4a16_is_wgmma(c.kind)) {
      // sm90_nvfp4_w4a16_wgmma_kernel<block_w, block_t, stages> carves with W4A16Config{block_w,
      // block_t, 64, stages, kWgmma} (wgmma_config): x_tile / w_tiles per stage, then the A tiles and the
      // mbarriers, which are the overhead.
      const W4A16Layout kernel = W4A16Layout::make(W4A16Config{c.block_w, c.block_t, 64, c.stages, c.kind});
      ASSERT_EQ(planned.n_regions, kernel.layout.n_regions) << name;
      for (uint32_t s = 0; s < c.stages; ++s) {
        EXPECT_EQ(planned.regions[2 * s].offset, kernel.x_tile_offset + s * kernel.stage_stride) << name << " stage " << s;
        EXPECT_EQ(planned.regions[2 * s + 1].offset, kernel.w_tiles_offset + s * kernel.stage_stride) << name << " stage " << s;
      }
      EXPECT_EQ(planned.regions[2 * c.stages].offset, kernel.a_tiles_offset) << name;
      EXPECT_EQ(planned.total_bytes, kernel.total_bytes()) << name;
      EXPECT_EQ(check.bytes, kernel.total_bytes()) << name;
      EXPECT_EQ(check.epilogue_bytes, 0u) << name << ": the epilogue reuses the stages";
      EXPECT_EQ(planned.regions[2 * c.stages + 1].offset, kernel.barriers_offset) << name;
      EXPECT_EQ(check.overhead_bytes, plan::kWgmmaABuffers * kernel.a_tile_bytes + 8u * c.stages)
          << name << ": the A tiles and the mbarriers";
      continue;
    }
    const W4A16Layout kernel = W4A16Layout::make(W4A16Config{c.block_w, c.block_t, c.block_k, c.stages});
    ASSERT_EQ(planned.n_regions, kernel.layout.n_regions) << name;
    for (uint32_t s = 0; s < c.stages; ++s) {
      EXPECT_EQ(planned.regions[3 * s].offset, kernel.x_tile_offset + s * kernel.stage_stride) << name << " stage " << s;
      EXPECT_EQ(planned.regions[3 * s + 1].offset, kernel.w_tiles_offset + s * kernel.stage_stride) << name << " stage " << s;
      EXPECT_EQ(planned.regions[3 * s + 2].offset, kernel.w_scales_offset + s * kernel.stage_stride) << name << " stage " << s;
      EXPECT_EQ(planned.regions[3 * s].bytes, kernel.x_tile_bytes) << name;
      EXPECT_EQ(planned.regions[3 * s + 1].bytes, kernel.w_tiles_bytes) << name;
      EXPECT_EQ(planned.regions[3 * s + 2].bytes, kernel.w_scales_bytes) << name;
    }
    EXPECT_EQ(planned.regions[3 * c.stages].offset, kernel.epilogue_offset) << name;
    EXPECT_EQ(planned.regions[3 * c.stages].bytes, c.block_t * kernel.epilogue_row_bytes) << name;
    EXPECT_EQ(planned.total_bytes, kernel.total_bytes()) << name;
    EXPECT_EQ(check.bytes, kernel.total_bytes()) << name;
  }
}

// One computation behind both refusals: on an RTX 4090 (101376 B opt-in) the planner rejects the
// configs the launcher would refuse, and its reason is the launcher's message without the kernel
// name. From the real numbers: the 6 stream configs need at most 8 warps x 8 x 512 = 32768 B
// (m128*_d8) or 4 warps x 16 x 512 = 32768 B (m64*_d16), the others 4 x 8 x 512 = 16384 B: all
// fit; of the pipeline ones m64n8k256_s4 (54400 B), m128n32k128_s4 (78336 B) and m64n64k128_s4
// (93184 B) fit, while m128n16k256_s4 (4 x (8192 + 16384 + 2048) + 4352 = 110848 B) and
// m128n64k128_s4 (4 x (16384 + 8192 + 1024) + 17408 = 119808 B) do not; the five wgmma configs are
// rejected by the architecture (sm_89 has no wgmma; they would not fit either): 7 refusals. On a made-up
// GPU with a 20000 B opt-in only the two 16384 B stream configs fit: the four 32768 B ones, all 5
// pipeline ones (54400 B and up) and the 5 wgmma ones are refused, 14 in all.
std::vector<std::string> check_refusals_agree(const plan::GpuSpec& gpu) {
  std::vector<std::string> refused;
  for (const plan::TileCandidate& cand : plan::family_candidates(plan::KernelFamily::kSm90W4A16, false)) {
    const plan::SmemCheck check = plan::check_smem(cand, gpu, plan::kCutlass420);
    const std::string name = cand.to_string();
    if (check.fits) {
      EXPECT_NO_THROW(w4a16_check_config(cand.ours, gpu.smem_optin_per_block)) << name;
      continue;
    }
    refused.push_back(name);
    if (check.rule == "arch") {  // the wgmma configs on a GPU without wgmma (the binary's arch list decides)
      EXPECT_TRUE(plan::w4a16_is_wgmma(cand.ours.kind)) << name << ": " << check.reason;
      continue;
    }
    EXPECT_EQ(check.rule, "smem-opt-in") << name;
    const std::string msg = expect_throw([&] { w4a16_check_config(cand.ours, gpu.smem_optin_per_block); });
    EXPECT_NE(msg.find(std::string("sm90_nvfp4_w4a16_grouped_gemm: ") + check.reason), std::string::npos)
        << name << "\nlauncher: " << msg << "\nplanner: " << check.reason;
  }
  return refused;
}

TEST(W4A16Configs, LauncherRefusesWhatThePlannerRejects) {
  const plan::GpuSpec ada = plan::require_gpu("rtx-4090");
  ASSERT_EQ(ada.smem_optin_per_block, 101376u);
  EXPECT_EQ(check_refusals_agree(ada),
            (std::vector<std::string>{"w4a16_swapab_m128n16k256_s4", "w4a16_swapab_m128n64k128_s4",
                                      "w4a16_wgmma_m128n64_s5", "w4a16_wgmma_m128n128_s5", "w4a16_wgmma_m128n256_s4",
                                      "w4a16_wgmma_m256n64_s5", "w4a16_wgmma_m256n128_s4"}));
  plan::GpuSpec tiny = ada;
  tiny.name = "tiny";
  tiny.smem_optin_per_block = 20000;
  EXPECT_EQ(check_refusals_agree(tiny),
            (std::vector<std::string>{"w4a16_stream_m64n8_d16", "w4a16_stream_m128n8_d8", "w4a16_stream_m64n16_d16",
                                      "w4a16_stream_m128n16_d8", "w4a16_swapab_m64n8k256_s4",
                                      "w4a16_swapab_m128n16k256_s4", "w4a16_swapab_m128n32k128_s4",
                                      "w4a16_swapab_m128n64k128_s4", "w4a16_swapab_m64n64k128_s4",
                                      "w4a16_wgmma_m128n64_s5", "w4a16_wgmma_m128n128_s5", "w4a16_wgmma_m128n256_s4",
                                      "w4a16_wgmma_m256n64_s5", "w4a16_wgmma_m256n128_s4"}));
  // The stream refusal to the byte: 32768 - 20000 = 12768.
  const std::string msg =
      expect_throw([] { w4a16_check_config(w4a16_config(w4a16_config_id("w4a16_stream_m128n8_d8")), 20000); });
  EXPECT_NE(msg.find("config w4a16_stream_m128n8_d8 needs 8 warps x code ring (8 chunks x 512 B) = 32768 B of shared "
                     "memory > 20000 B (the device's opt-in limit per block) by 12768 B"),
            std::string::npos)
      << msg;
}

TEST(W4A16Configs, NamesRoundTrip) {
  const std::vector<std::string> names = w4a16_config_names();
  const std::vector<std::string> want = {
      "w4a16_stream_m64n8_d8",       "w4a16_stream_m64n8_d16",      "w4a16_stream_m128n8_d8",
      "w4a16_stream_m64n16_d8",      "w4a16_stream_m64n16_d16",     "w4a16_stream_m128n16_d8",
      "w4a16_swapab_m64n8k256_s4",   "w4a16_swapab_m128n16k256_s4", "w4a16_swapab_m128n32k128_s4",
      "w4a16_swapab_m128n64k128_s4", "w4a16_swapab_m64n64k128_s4", "w4a16_wgmma_m128n64_s5",
      "w4a16_wgmma_m128n128_s5",     "w4a16_wgmma_m128n256_s4",     "w4a16_wgmma_m256n64_s5",
      "w4a16_wgmma_m256n128_s4"};
  ASSERT_EQ(names, want);
  ASSERT_EQ(static_cast<int>(names.size()), w4a16_num_configs());
  for (int i = 0; i < w4a16_num_configs(); ++i) EXPECT_EQ(w4a16_config_id(names[static_cast<size_t>(i)]), i);
  const std::string msg = expect_throw([] { w4a16_config_id("w4a16_swapab_m256n8k128_s4"); });
  EXPECT_NE(msg.find("unknown config 'w4a16_swapab_m256n8k128_s4'; known: w4a16_stream_m64n8_d8, w4a16_stream_m64n8_d16, "),
            std::string::npos)
      << msg;
  const std::string msg_id = expect_throw([] { w4a16_config(99); });
  EXPECT_NE(msg_id.find("config id 99 is out of range (16 configs, ids 0..15)"), std::string::npos) << msg_id;
  expect_throw([] { w4a16_config(-1); });
}

// The split-K plan (no GPU): GLM-5's o_proj (N = 6144, K = 16384: 32 scale groups) at one token
// is 96 CTAs of 64 rows -> ceil(4 x 132 / 96) = 6 parts of ceil(32 / 6) = 6 groups, i.e. 6 parts;
// the same for a pipelined 64-row tile, and at 64 tokens the 128 x 64 pipelined tile (48 CTAs) makes
// 8 parts of 4 groups, also with the SwiGLU epilogue; no split for no workspace, a full grid, one group, or a
// workspace without room for two parts; the workspace caps the parts.
TEST(W4A16Configs, SplitKPlan) {
  W4A16GroupedGemmArgs a;
  a.m_total = 1;
  a.n = 6144;
  a.k = 16384;
  a.n_experts = 1;
  float* ws = reinterpret_cast<float*>(uintptr_t{256});  // never dereferenced
  a.splitk_workspace = ws;
  a.splitk_workspace_bytes = size_t{1} << 30;
  const W4A16Config& stream = w4a16_config(w4a16_config_id("w4a16_stream_m64n8_d8"));
  W4A16SplitK s = w4a16_splitk_plan(a, stream, 132);
  EXPECT_EQ(s.parts, 6);
  EXPECT_EQ(s.groups_per_part, 6);
  EXPECT_EQ(w4a16_splitk_plan(a, w4a16_config(w4a16_config_id("w4a16_swapab_m64n8k256_s4")), 132).parts, 6);
  a.m_total = 64;
  s = w4a16_splitk_plan(a, w4a16_config(w4a16_config_id("w4a16_swapab_m128n64k128_s4")), 132);
  EXPECT_EQ(s.parts, 8);
  EXPECT_EQ(s.groups_per_part, 4);
  a.m_total = 1;
  a.epilogue = W4A16Epilogue::kSwiGlu;  // split the same way; the reduction applies the SwiGLU
  EXPECT_EQ(w4a16_splitk_plan(a, stream, 132).parts, 6);
  a.epilogue = W4A16Epilogue::kNone;
  a.splitk_workspace_bytes = 3 * 6144 * 4;  // room for 3 planes of [1, 6144] f32
  s = w4a16_splitk_plan(a, stream, 132);
  EXPECT_EQ(s.parts, 3);
  EXPECT_EQ(s.groups_per_part, 11);  // 32 groups: 11 + 11 + 10
  a.splitk_workspace_bytes = 6144 * 4;
  EXPECT_EQ(w4a16_splitk_plan(a, stream, 132).parts, 1);
  a.splitk_workspace_bytes = size_t{1} << 30;
  a.k = 512;  // one scale group: nothing to split
  EXPECT_EQ(w4a16_splitk_plan(a, stream, 132).parts, 1);
  a.k = 16384;
  a.n_experts = 32;  // the MoE down GEMM at 8 tokens per expert: 32 x 96 CTAs fill the GPU
  a.m_total = 256;
  EXPECT_EQ(w4a16_splitk_plan(a, stream, 132).parts, 1);
  a.splitk_workspace = nullptr;
  a.n_experts = 1;
  a.m_total = 1;
  EXPECT_EQ(w4a16_splitk_plan(a, stream, 132).parts, 1);
  // Never more than kW4A16MaxSplitK parts, never an empty part.
  a.splitk_workspace = ws;
  const W4A16Config& wgmma = w4a16_config(w4a16_config_id("w4a16_wgmma_m128n64_s5"));
  for (int64_t k = 512; k <= 65536; k += 512) {
    a.k = k;
    for (const W4A16Config* c : {&stream, &wgmma}) {
      s = w4a16_splitk_plan(a, *c, 132);
      ASSERT_LE(s.parts, kW4A16MaxSplitK) << k;
      ASSERT_LT(static_cast<int64_t>(s.parts - 1) * s.groups_per_part, w4a16_k_groups(k)) << k;
      ASSERT_GE(static_cast<int64_t>(s.parts) * s.groups_per_part, w4a16_k_groups(k)) << k;
    }
  }
  // The wgmma kind fills whole waves: o_proj (N = 6144, K = 16384: 32 groups) at 64 tokens on the
  // m128n64 tile (2 resident CTAs per SM: 264) is 48 CTAs; cost = waves x (groups per part + 1):
  // 1 part 1 x 33, 4 parts (192 CTAs) 1 x 9, 5 parts (240 CTAs, 7 groups each: ceil(32 / 7) = 5) 1 x 8,
  // 6 parts (288 CTAs) 2 x 7, 8 parts 2 x 5: 5 parts of 7 groups.
  a.k = 16384;
  a.m_total = 64;
  s = w4a16_splitk_plan(a, wgmma, 132);
  EXPECT_EQ(s.parts, 5);
  EXPECT_EQ(s.groups_per_part, 7);
  // A grid of whole waves already (E = 32 experts x 32 row blocks at 64 tokens each): no split.
  a.n_experts = 32;
  a.n = 4096;
  a.k = 6144;
  a.m_total = 32 * 64;
  EXPECT_EQ(w4a16_splitk_plan(a, wgmma, 132).parts, 1);
}

// The grid covers every work item: for any split of m_total tokens over E experts, the token tiles
// sum_e ceil(m_e / block_t) never exceed grid.x (empty experts cost no tile; one expert: exactly), and grid.y covers N.
TEST(W4A16Configs, GridCoversEveryTokenTile) {
  std::mt19937 rng(20261203);
  for (int id = 0; id < w4a16_num_configs(); ++id) {
    const W4A16Config& c = w4a16_config(id);
    for (int trial = 0; trial < 200; ++trial) {
      const int64_t E = 1 + static_cast<int64_t>(rng() % 64);
      std::vector<int64_t> m(static_cast<size_t>(E), 0);
      int64_t total = 0, tiles = 0;
      for (auto& me : m) {
        me = (rng() % 3 == 0) ? 0 : static_cast<int64_t>(rng() % 300);
        total += me;
        tiles += (me + c.block_t - 1) / c.block_t;
      }
      W4A16GroupedGemmArgs a;
      a.m_total = total;
      a.n_experts = E;
      a.n = 8 * (1 + static_cast<int64_t>(rng() % 1000));
      const W4A16Grid g = w4a16_grid(a, c);
      ASSERT_GE(g.x, tiles) << w4a16_config_name(c) << " E " << E << " m_total " << total;
      if (E == 1) {
        ASSERT_EQ(g.x, tiles) << w4a16_config_name(c) << ": one expert's grid is exact";
      }
      ASSERT_GE(g.y * c.block_w, a.n);
      ASSERT_LT((g.y - 1) * c.block_w, a.n);
      ASSERT_EQ(g.ctas(), g.x * g.y);
    }
  }
}

TEST(W4A16Configs, DefaultConfigPerTokenCount) {
  struct Case {
    int64_t tokens;
    const char* name;
  };
  const Case cases[] = {{1, "w4a16_stream_m64n8_d8"},         {8, "w4a16_stream_m64n8_d8"},
                        {9, "w4a16_stream_m64n16_d8"},        {16, "w4a16_stream_m64n16_d8"},
                        {17, "w4a16_swapab_m128n32k128_s4"},  {32, "w4a16_swapab_m128n32k128_s4"},
                        {33, "w4a16_wgmma_m128n64_s5"},       {64, "w4a16_wgmma_m128n64_s5"},
                        {65, "w4a16_wgmma_m256n128_s4"},      {128, "w4a16_wgmma_m256n128_s4"},
                        {129, "w4a16_wgmma_m128n256_s4"},     {500, "w4a16_wgmma_m128n256_s4"}};
  for (const Case& cs : cases) {
    const W4A16Config& c = w4a16_config(w4a16_default_config(cs.tokens));
    EXPECT_EQ(w4a16_config_name(c), cs.name) << cs.tokens << " tokens per expert";
    EXPECT_GE(c.block_t, static_cast<uint32_t>(std::min<int64_t>(cs.tokens, 128))) << cs.tokens << " tokens per expert";
  }
  EXPECT_EQ(w4a16_config(w4a16_default_config(1)).kind, W4A16Kind::kStream);
  EXPECT_EQ(w4a16_config(w4a16_default_config(1)).block_t, 8u);
  EXPECT_EQ(w4a16_config(w4a16_default_config(9)).kind, W4A16Kind::kStream);
  EXPECT_EQ(w4a16_config(w4a16_default_config(9)).block_t, 16u);
  // The decode defaults' rings: 4 warps x 8 chunks x 512 B = 16384 B each.
  EXPECT_EQ(W4A16Layout::make(w4a16_config(w4a16_default_config(1))).total_bytes(), 16384u);
  EXPECT_EQ(W4A16Layout::make(w4a16_config(w4a16_default_config(16))).total_bytes(), 16384u);
  EXPECT_EQ(w4a16_config(w4a16_default_config(500)).block_t, 256u);
  EXPECT_EQ(w4a16_config(w4a16_default_config(500)).kind, W4A16Kind::kWgmma);
}

// 128x64x256, 6 stages: x_tile 64*256*2 = 32768, w_tiles 128*256/2 = 16384, w_scales
// 128*256/16 = 2048 per stage (51200 x 6 = 307200) + epilogue 64 * (128*2 + 16) = 17408 =
// 324608 B > 232448 by 92160.
TEST(W4A16Configs, InfeasibleConfigIsRefusedWithTheBytes) {
  const W4A16Config big{128, 64, 256, 6};
  const std::string msg = expect_throw([&] { w4a16_check_config(big, kSm90SmemOptinBytes); });
  EXPECT_NE(msg.find("sm90_nvfp4_w4a16_grouped_gemm: config w4a16_swapab_m128n64k256_s6 needs 6 stages x "
                     "(x_tile 32768 + w_tiles 16384 + w_scales 2048) + epilogue 17408 = 324608 B of shared "
                     "memory > 232448 B (the device's opt-in limit per block) by 92160 B"),
            std::string::npos)
      << msg;
  // A shipped config against a smaller (sm_89 / sm_120-like) limit: m128n64k128_s4 =
  // 4 x (16384 + 8192 + 1024) + 64 * 272 = 102400 + 17408 = 119808 B > 101376 by 18432.
  const std::string msg2 =
      expect_throw([] { w4a16_check_config(w4a16_config(w4a16_config_id("w4a16_swapab_m128n64k128_s4")), 101376); });
  EXPECT_NE(msg2.find("needs 4 stages x (x_tile 16384 + w_tiles 8192 + w_scales 1024) + epilogue 17408 = 119808 B of "
                      "shared memory > 101376 B (the device's opt-in limit per block) by 18432 B"),
            std::string::npos)
      << msg2;
  const std::string msg3 = expect_throw([] { w4a16_check_config(W4A16Config{96, 8, 256, 4}, kSm90SmemOptinBytes); });
  EXPECT_NE(msg3.find("block_w (weight rows, MMA M) must be 64 or 128"), std::string::npos) << msg3;
  for (int i = 0; i < w4a16_num_configs(); ++i) EXPECT_NO_THROW(w4a16_check_config(w4a16_config(i), kSm90SmemOptinBytes));
}

TEST(W4A16Configs, StreamConfigRulesAreNamed) {
  constexpr W4A16Kind kS = W4A16Kind::kStream;
  std::string msg = expect_throw([] { w4a16_check_config(W4A16Config{64, 32, 64, 4, kS}, kSm90SmemOptinBytes); });
  EXPECT_NE(msg.find("sm90_nvfp4_w4a16_grouped_gemm: config w4a16_stream_m64n32_d4 cannot be built: "
                     "stream: block_t (tokens, MMA N) must be 8 or 16"),
            std::string::npos)
      << msg;
  msg = expect_throw([] { w4a16_check_config(W4A16Config{64, 8, 128, 4, kS}, kSm90SmemOptinBytes); });
  EXPECT_NE(msg.find("cannot be built: stream: block_k must be 64 (one chunk per step)"), std::string::npos) << msg;
  msg = expect_throw([] { w4a16_check_config(W4A16Config{64, 8, 64, 3, kS}, kSm90SmemOptinBytes); });
  EXPECT_NE(msg.find("config w4a16_stream_m64n8_d3 cannot be built: stream: stages (code ring depth) must be 4, 8 or 16"),
            std::string::npos)
      << msg;
  // A depth of 2 (one chunk in flight) and of 32 are refused too; 4 and 16 build.
  msg = expect_throw([] { w4a16_check_config(W4A16Config{64, 8, 64, 2, kS}, kSm90SmemOptinBytes); });
  EXPECT_NE(msg.find("config w4a16_stream_m64n8_d2 cannot be built: stream: stages (code ring depth) must be 4, 8 or 16"),
            std::string::npos)
      << msg;
  msg = expect_throw([] { w4a16_check_config(W4A16Config{128, 16, 64, 32, kS}, kSm90SmemOptinBytes); });
  EXPECT_NE(msg.find("config w4a16_stream_m128n16_d32 cannot be built: stream: stages (code ring depth) must be 4, 8 or 16"),
            std::string::npos)
      << msg;
  EXPECT_NO_THROW(w4a16_check_config(W4A16Config{64, 8, 64, 4, kS}, kSm90SmemOptinBytes));
  EXPECT_NO_THROW(w4a16_check_config(W4A16Config{128, 16, 64, 16, kS}, kSm90SmemOptinBytes));  // 8 x 16 x 512 = 65536 B
  // Shared memory is checked for stream configs too: 4 warps x 16 x 512 = 32768 B > 32767 by 1.
  msg = expect_throw([] { w4a16_check_config(W4A16Config{64, 8, 64, 16, kS}, 32767); });
  EXPECT_NE(msg.find("sm90_nvfp4_w4a16_grouped_gemm: config w4a16_stream_m64n8_d16 needs 4 warps x code ring (16 chunks "
                     "x 512 B) = 32768 B of shared memory > 32767 B (the device's opt-in limit per block) by 1 B"),
            std::string::npos)
      << msg;
  msg = expect_throw([] { w4a16_check_config(W4A16Config{96, 8, 64, 4, kS}, kSm90SmemOptinBytes); });
  EXPECT_NE(msg.find("stream: block_w (weight rows per CTA) must be 64 or 128"), std::string::npos) << msg;
}

// Expert row classes (W4A16GroupedGemmArgs::min/max_expert_rows): need expert offsets and an ordered
// range; never split K; the grid holds only what the class can: at most m_total / min_expert_rows
// experts, one tile each when max_expert_rows fits the token tile.
// Problem arguments whose pointers are all `buf` (aligned, never dereferenced: only checked).
W4A16GroupedGemmArgs args_on(uint8_t* buf, bool with_offsets) {
  W4A16GroupedGemmArgs a;
  a.x = reinterpret_cast<const __nv_bfloat16*>(buf);
  if (with_offsets) a.expert_offsets = reinterpret_cast<const int32_t*>(buf);
  a.w_packed = buf;
  a.w_scales = buf;
  a.w_global_scales = reinterpret_cast<const float*>(buf);
  a.y = reinterpret_cast<__nv_bfloat16*>(buf);
  return a;
}

TEST(W4A16Problem, ExpertRowClassRulesGridAndNoSplit) {
  alignas(16) static uint8_t buf[256] = {};
  W4A16GroupedGemmArgs a = args_on(buf, false);
  a.m_total = 512;
  a.n = 4096;
  a.k = 6144;
  a.n_experts = 256;
  const W4A16Config& stream16 = w4a16_config(w4a16_config_id("w4a16_stream_m64n16_d8"));
  const W4A16Config& wg64 = w4a16_config(w4a16_config_id("w4a16_wgmma_m128n64_s5"));
  EXPECT_FALSE(a.filters_experts());
  a.min_expert_rows = 17;
  EXPECT_TRUE(a.filters_experts());
  a.n_experts = 1;  // a dense launch (no offsets) has no experts to class
  std::string msg = expect_throw([&] { w4a16_check_problem(a, wg64); });
  EXPECT_NE(msg.find("an expert row class needs expert_offsets and 0 <= min_expert_rows <= max_expert_rows (got 17 .. "
                     "2147483647, offsets 0)"),
            std::string::npos)
      << msg;
  a.n_experts = 256;
  a.expert_offsets = reinterpret_cast<const int32_t*>(buf);
  EXPECT_NO_THROW(w4a16_check_problem(a, wg64));
  a.max_expert_rows = 16;
  msg = expect_throw([&] { w4a16_check_problem(a, wg64); });
  EXPECT_NE(msg.find("(got 17 .. 16, offsets "), std::string::npos) << msg;
  // Unfiltered: 512 / 64 + min(256, 512) = 264 items; rows > 16: at most 512 / 17 = 30 experts,
  // 512 / 64 + 30 = 38 items; rows <= 16 on a 16-token tile: one tile per expert, 256.
  a.min_expert_rows = 0;
  a.max_expert_rows = std::numeric_limits<int32_t>::max();
  EXPECT_EQ(w4a16_grid(a, wg64).x, 264);
  a.min_expert_rows = 17;
  EXPECT_EQ(w4a16_grid(a, wg64).x, 38);
  a.min_expert_rows = 0;
  a.max_expert_rows = 16;
  EXPECT_EQ(w4a16_grid(a, stream16).x, 256);
  EXPECT_EQ(w4a16_grid(a, stream16).y, 4096 / 64);
  // A class never splits K, even with a workspace and a grid that would.
  a.n_experts = 1;
  a.m_total = 7;
  a.max_expert_rows = std::numeric_limits<int32_t>::max();
  a.splitk_workspace = reinterpret_cast<float*>(buf);
  a.splitk_workspace_bytes = size_t{1} << 26;
  EXPECT_GT(w4a16_splitk_plan(a, stream16, 132).parts, 1);
  a.max_expert_rows = 100;
  EXPECT_EQ(w4a16_splitk_plan(a, stream16, 132).parts, 1);
}

TEST(W4A16Problem, RefusesUnsupportedShapesNamingTheNumbers) {
  alignas(16) static uint8_t buf[256] = {};
  W4A16GroupedGemmArgs a = args_on(buf, true);
  a.m_total = 4;
  a.n = 64;
  a.k = 1048;  // 16 x 65 + 8
  a.n_experts = 2;
  const W4A16Config& c = w4a16_config(0);
  std::string msg = expect_throw([&] { w4a16_check_problem(a, c); });
  EXPECT_NE(msg.find("sm90_nvfp4_w4a16_grouped_gemm (w4a16_stream_m64n8_d8, M_total=4, N=64, K=1048, E=2): K=1048 must "
                     "be a positive multiple of 16 (one NVFP4 block; K % 16 = 8)"),
            std::string::npos)
      << msg;
  a.k = 0;
  msg = expect_throw([&] { w4a16_check_problem(a, c); });
  EXPECT_NE(msg.find("K=0 must be a positive multiple of 16"), std::string::npos) << msg;
  a.k = 1040;  // 16 x 65: the kernel layout pads K to 17 chunks of 64 with zero codes
  for (int id = 0; id < w4a16_num_configs(); ++id) EXPECT_NO_THROW(w4a16_check_problem(a, w4a16_config(id))) << id;
  a.n = 60;
  msg = expect_throw([&] { w4a16_check_problem(a, c); });
  EXPECT_NE(msg.find("N=60 must be a positive multiple of 8 (16 B output stores; N % 8 = 4)"), std::string::npos) << msg;
  a.n = 64;
  a.n_experts = 0;
  msg = expect_throw([&] { w4a16_check_problem(a, c); });
  EXPECT_NE(msg.find("E=0 must be >= 1"), std::string::npos) << msg;
  a.n_experts = 2;
  a.w_scales = buf + 8;  // 8 B aligned: the stream kernel's 16 B scale-group loads need 16
  msg = expect_throw([&] { w4a16_check_problem(a, c); });
  EXPECT_NE(msg.find("must be 16 B aligned"), std::string::npos) << msg;
  a.w_scales = buf + 16;
  a.w_packed = buf + 16;
  EXPECT_NO_THROW(w4a16_check_problem(a, c));
  a.y = reinterpret_cast<__nv_bfloat16*>(buf + 2);
  msg = expect_throw([&] { w4a16_check_problem(a, c); });
  EXPECT_NE(msg.find("must be 16 B aligned"), std::string::npos) << msg;
  a.y = reinterpret_cast<__nv_bfloat16*>(buf);
  a.expert_offsets = reinterpret_cast<const int32_t*>(buf + 2);
  msg = expect_throw([&] { w4a16_check_problem(a, c); });
  EXPECT_NE(msg.find("expert_offsets and w_global_scales 4 B aligned"), std::string::npos) << msg;
  a.expert_offsets = nullptr;  // only a single expert may leave its offsets out
  msg = expect_throw([&] { w4a16_check_problem(a, c); });
  EXPECT_NE(msg.find("expert_offsets may be null only for one expert (rows [0, M_total))"), std::string::npos) << msg;
  a.n_experts = 1;
  EXPECT_NO_THROW(w4a16_check_problem(a, c));
  a.n_experts = 2;
  a.expert_offsets = reinterpret_cast<const int32_t*>(buf);
  a.w_scales = nullptr;
  msg = expect_throw([&] { w4a16_check_problem(a, c); });
  EXPECT_NE(msg.find("null pointer"), std::string::npos) << msg;
  a.w_scales = buf;
  a.y = nullptr;
  msg = expect_throw([&] { w4a16_check_problem(a, c); });
  EXPECT_NE(msg.find("null pointer"), std::string::npos) << msg;
  a.m_total = 0;  // nothing to do: pointers are not needed
  EXPECT_NO_THROW(w4a16_check_problem(a, c));
  a.y = reinterpret_cast<__nv_bfloat16*>(buf);
  a.m_total = 4;
  // grid.y = ceil(N / block_w) must be <= 65535: N = 64 x 65536 with block_w 64 is one too many.
  a.n = int64_t{64} * 65536;
  msg = expect_throw([&] { w4a16_check_problem(a, c); });
  EXPECT_NE(msg.find("grid 2 x 65536 exceeds CUDA's limits"), std::string::npos) << msg;  // x: 4 / 8 + min(2, 4)
  a.n = 64;
  // An invalid config is refused before anything else.
  msg = expect_throw([&] { w4a16_check_problem(a, W4A16Config{64, 8, 64, 3, W4A16Kind::kStream}); });
  EXPECT_NE(msg.find("invalid config"), std::string::npos) << msg;
  // The launcher checks before touching CUDA, so the refusal works without a GPU too.
  a.k = 1048;
  msg = expect_throw([&] { w4a16_grouped_gemm(a, 0, nullptr); });
  EXPECT_NE(msg.find("K=1048"), std::string::npos) << msg;
}

}  // namespace
}  // namespace fp4moe::cuda::sm90
