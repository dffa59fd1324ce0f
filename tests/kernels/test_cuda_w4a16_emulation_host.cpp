// CPU emulation of the inner loops of both sm90_nvfp4_w4a16_grouped_gemm kernels (no GPU needed),
// split from test_cuda_w4a16_host.cpp: on a random problem (2 experts x 32 rows, K = 208 = 16 x 13,
// 16 tokens; kStream also K = 1040 = 16 x 65) the A fragments come from the kernel-layout bytes as
// each kernel indexes them (kStream: each lane's 16 B of chunk kc copied by an emulated cp.async into
// its warp's shared-memory ring slot kc % stages of a host image of the CTA's W4A16Layout and read
// back by the same lane after wait_group(stages - 2), every shipped stream config and a ring of 4;
// kPipeline: a host image of one stage as load_stage's cp.async copies fill it, block_k 128 and 256),
// the B fragments from the activations (kStream: each lane's 32 B at x[tok][64 kc + 16 t] read from the
// TMA boxes in the CTA's activation ring, a slot a scale group at 8 / 16 tokens, a chunk at 32; kPipeline:
// x_tile_offset swizzle and load_b_fragments), an emulated
// mma.sync m16n8k16 written here from the PTX fragment layouts, and 2^8 x D must equal the f64 dot
// products of the dequantized weights (format/nvfp4.h). The scale words come from the kernel
// scale bytes (w4a16_scale_byte: B x 0x00100010 + 0x75007500) as the kernels form them; the
// random e4m3 scales are forced to include zero blocks (whose codes the repack zeroes), the
// smallest and largest subnormal (0x01, 0x07) and the largest normal (0x7E, 448). Also: the
// pipeline kernel's per-lane scale slice gives the scale words of w4a16_chunk_scales; and the wgmma
// kernel's A tile (w4a16_wgmma_a_stores) holds the dequantized weights in natural K order.
// Run: test_cuda_w4a16_emulation_host (FP4MOE_TEST_SEED=<n> replays a seed).
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


// ---- emulation of both kernels' inner loops ------------------------------------------------------

// Emulated mma.sync.m16n8k16.row.col bf16: D[16x8] += A[16x16] B[16x8] from the 32 lanes'
// registers, per the PTX ISA fragment layouts (groupID g = lane / 4, t = lane % 4):
//   A: a0 = (g, 2t..2t+1), a1 = (g+8, 2t..), a2 = (g, 2t+8..), a3 = (g+8, 2t+8..)
//   B: b0 = (k 2t..2t+1, n g), b1 = (k 2t+8..2t+9, n g)      low half = lower index
// Unassigned elements stay NaN and would poison D. f64 products of bf16 values are exact.
void emulate_mma(const uint32_t a[32][4], const uint32_t b[32][2], double d[16][8]) {
  double A[16][16], B[16][8];
  for (auto& row : A) for (double& v : row) v = std::nan("");
  for (auto& row : B) for (double& v : row) v = std::nan("");
  for (int lane = 0; lane < 32; ++lane) {
    const int g = lane / 4, t = lane % 4;
    const int rows[4] = {g, g + 8, g, g + 8}, cols[4] = {2 * t, 2 * t, 2 * t + 8, 2 * t + 8};
    for (int r = 0; r < 4; ++r) {
      A[rows[r]][cols[r]] = lo_f32(a[lane][r]);
      A[rows[r]][cols[r] + 1] = hi_f32(a[lane][r]);
    }
    B[2 * t][g] = lo_f32(b[lane][0]);
    B[2 * t + 1][g] = hi_f32(b[lane][0]);
    B[2 * t + 8][g] = lo_f32(b[lane][1]);
    B[2 * t + 9][g] = hi_f32(b[lane][1]);
  }
  for (int m = 0; m < 16; ++m) {
    for (int n = 0; n < 8; ++n) {
      for (int k = 0; k < 16; ++k) d[m][n] += A[m][k] * B[k][n];
    }
  }
}

// The 4 MMA steps of one chunk from per-lane fragments a[lane][s][.], b[lane][s][.].
void emulate_chunk(const uint32_t a[32][4][4], const uint32_t b[32][4][2], double d[16][8]) {
  for (int s = 0; s < 4; ++s) {
    uint32_t as[32][4], bs[32][2];
    for (int lane = 0; lane < 32; ++lane) {
      std::memcpy(as[lane], a[lane][s], sizeof(as[lane]));
      std::memcpy(bs[lane], b[lane][s], sizeof(bs[lane]));
    }
    emulate_mma(as, bs, d);
  }
}

// A random MoE slice in both layouts plus the activations.
struct EmuProblem {
  static constexpr int64_t kExperts = 2, kN = 32, kTokens = 40;  // 40: a ragged last tile at n16 and n32
  int64_t k = 0;
  Weights w;
  std::vector<uint8_t> kcodes, kscales;  // kernel layout
  std::vector<uint16_t> x;               // [kTokens, k] bf16, the tokens of every expert
  int64_t row_tiles = 0, k_chunks = 0, k_groups = 0;
};

// K = 208 = 16 x 13 (the default): 4 chunks (3 x 64 + 16, the last 1/4 full), 1 scale group.
// K = 1040 = 16 x 65: 17 chunks (16 x 64 + 16), ceil(17 / 8) = 3 scale groups.
EmuProblem make_emu_problem(uint64_t seed, int64_t k = 208, int64_t want_chunks = 4, int64_t want_groups = 1) {
  std::mt19937_64 rng(seed);
  EmuProblem p;
  p.k = k;
  p.w = random_weights(rng, EmuProblem::kExperts, EmuProblem::kN, k);
  // Scale edge cases in both row halves of a tile and both experts (a row has k / 16 blocks).
  const int64_t blocks = k / 16;
  p.w.scales[0] = 0x00;                                        // expert 0, row 0, block 0: zero block
  p.w.scales[static_cast<size_t>(9 * blocks + 2)] = 0x01;      // row 9 (tile row g + 8): 2^-9
  p.w.scales[static_cast<size_t>(3 * blocks + 5)] = 0x07;      // 7 x 2^-9
  p.w.scales[static_cast<size_t>(12 * blocks + 1)] = 0x7E;     // 448
  p.w.scales[static_cast<size_t>((EmuProblem::kN + 10) * blocks + blocks - 1)] = 0x00;  // expert 1, last block
  w4a16_repack(p.w.codes.data(), p.w.scales.data(), EmuProblem::kExperts, EmuProblem::kN, k, p.kcodes, p.kscales,
               "emulated weight");
  std::normal_distribution<float> normal(0.0f, 1.0f);
  p.x.resize(static_cast<size_t>(EmuProblem::kTokens * k));
  for (uint16_t& v : p.x) v = f32_to_bf16(normal(rng));
  p.row_tiles = w4a16_row_tiles(EmuProblem::kN);
  p.k_chunks = w4a16_k_chunks(k);
  p.k_groups = w4a16_k_groups(k);
  EXPECT_EQ(p.row_tiles, 2);
  EXPECT_EQ(p.k_chunks, want_chunks) << "K=" << k;
  EXPECT_EQ(p.k_groups, want_groups) << "K=" << k;
  return p;
}

// 2^8 x D of the row tile `rt` x token tile `nt` of expert `e` against the f64 dot products of the
// dequantized weights; products are exact, so only the f64 summation order differs (1e-9 of the
// sum of |terms|).
void expect_tile_exact(const EmuProblem& p, int64_t e, int64_t rt, int64_t nt, const double d[16][8], const char* kernel) {
  for (int m = 0; m < 16; ++m) {
    for (int n = 0; n < 8; ++n) {
      const int64_t row = rt * 16 + m, tok = nt * 8 + n;
      double want = 0, sum_abs = 0;
      for (int64_t kk = 0; kk < p.k; ++kk) {
        const double term = static_cast<double>(format::e2m1_to_f32(static_cast<uint8_t>(p.w.code(e, row, kk)))) *
                            format::e4m3_to_f32(p.w.scale(e, row, kk)) *
                            bf16_to_f32(p.x[static_cast<size_t>(tok * p.k + kk)]);
        want += term;
        sum_abs += std::fabs(term);
      }
      const double got = std::ldexp(d[m][n], kW4A16AccShift);
      ASSERT_FALSE(std::isnan(got)) << kernel << ": a fragment element was never written";
      ASSERT_NEAR(got, want, 1e-9 * sum_abs + 1e-30)
          << kernel << ": expert " << e << " weight row " << row << " token " << tok;
    }
  }
}

// kStream, one CTA (config c, blockIdx.y = 0: warp w owns row tiles 2 w and 2 w + 1
// (kW4A16StreamTilesPerWarp), warps past the N row tiles return) on the block_t tokens from tok0 of
// expert e, each lane as the kernel runs it (lanes only meet in the MMA, emulated per chunk
// afterwards; a lane's two tiles share its activation fragments and its cp.async groups, so the
// emulation runs the tiles one after the other with the same schedule):
//   * codes: chunk kc's 16 B of the lane (indexed in the global kernel layout as before) go by cp.async
//     (zero-filled past K) into the ring of its tile h in its warp's shared memory, slot kc % stages, at
//     ring_offset + warp x ring_warp_bytes + (h x stages + slot) x 512 + 16 lane of a host image of the
//     CTA's W4A16Layout filled with garbage;
//   * activations (stream_cta_x_ring, every stream tile): one TMA box of a chunk's block_t token rows into
//     the CTA's ring, 128B-swizzled: 16 B unit u (k 64 kc + 8 u ..) of row r at r x 128 + (u ^ (r & 7)) x
//     16 (zero past K and past the tokens); block_t 32: with chunk kc's codes, by the first warp there,
//     slot kc % x_stages (cta_x_slot); block_t 8 / 16 (stream_x_group_slots): scale group kg's 8 boxes at
//     once into slot kg % x_stages, box kc % 8 at block_t x 128 B steps, group 0 before the code prologue
//     and group kg + 1 at group kg's start; the emulation writes a box at issue, the earliest the TMA may
//     land, so a slot refilled before its previous chunks were read poisons D; lane (g, t) reads units
//     2 t and 2 t + 1 of row 8 nt + g;
//   * chunks 0 .. stages - 2 are issued up front; at chunk kc the lane waits until at most stages - 2
//     groups are pending (only then does the emulation copy the oldest groups into the image), reads
//     both slots of chunk kc back, and issues chunk kc + stages - 1 into the slots chunk kc - 1 used (no
//     copy to a slot may still be pending);
//   * scales: group kg and the next one in registers (sg, sg_next), group kg + 2 loaded after kg.
void emulate_stream_cta(const EmuProblem& p, const W4A16Config& c, int64_t e, int64_t tok0, double (&d)[8][4][16][8]) {
  const W4A16Layout l = W4A16Layout::make(c);
  const std::string name = w4a16_config_name(c);
  ASSERT_TRUE(l.valid()) << name;
  const uint32_t n_tiles = c.block_t / 8, stages = c.stages;
  ASSERT_TRUE(W4A16Layout::stream_cta_x_ring(c)) << name << ": every stream tile has the CTA's activation ring";
  const bool group_x = W4A16Layout::stream_x_group_slots(c);  // a slot a scale group (8 / 16 tokens)
  const uint32_t x_stages = l.x_stages;
  if (!group_x) {
    ASSERT_GE(x_stages, stages) << name << ": chunk kc + stages - 1 is loaded while kc is read";
  }
  if (group_x) {
    ASSERT_EQ(l.x_slot_chunks, kW4A16ScaleGroup) << name;
    ASSERT_GE(x_stages, 2u) << name << ": group kg + 1 is loaded while kg is read";
  }
  constexpr uint32_t kTiles = kW4A16StreamTilesPerWarp;
  // The kernel's addressing: its warp's code rings + ring_code_slot + 16 lane.
  auto code_addr = [&](uint32_t warp, uint32_t h, uint32_t lane, uint32_t slot) {
    return l.ring_offset + warp * l.ring_warp_bytes + l.ring_code_slot(h, slot) + lane * 16;
  };
  auto cta_x_addr = [&](uint32_t slot, uint32_t box, uint32_t row, uint32_t unit) {  // the CTA ring's 16 B unit
    return l.cta_x_box(slot, box) + plan::w4a16_wgmma_swizzle(row, unit);
  };
  // Chunk kc's 16 B unit in the CTA ring: its own slot kc % x_stages, or with a slot a scale group the
  // group's slot (kc / 8) % x_stages, box kc % 8 of it (block_t rows x 128 B each).
  auto cta_x_chunk_addr = [&](int64_t kc, uint32_t row, uint32_t unit) {
    if (!group_x) return cta_x_addr(static_cast<uint32_t>(kc % x_stages), 0, row, unit);
    return cta_x_addr(static_cast<uint32_t>((kc / kW4A16ScaleGroup) % x_stages),
                      static_cast<uint32_t>(kc % kW4A16ScaleGroup), row, unit);
  };
  // The carve: every (warp, lane, slot) 16 B piece of codes (per tile), every (slot, box, row, unit) 16 B
  // of the CTA's activation ring, and 16 B of mbarriers per slot and the ticket's 16 B in the regions,
  // 16 B aligned, none shared, all covered.
  std::vector<int> owner(l.total_bytes(), -1);
  int piece = 0;
  auto claim = [&](uint32_t a) {
    ASSERT_TRUE(a % 16 == 0 && a + 16 <= l.total_bytes()) << name << ": piece at " << a;
    for (uint32_t b = a; b < a + 16; ++b) {
      ASSERT_EQ(owner[b], -1) << name << ": byte " << b << " of two pieces";
      owner[b] = piece;
    }
    ++piece;
  };
  for (uint32_t warp = 0; warp < c.n_warps(); ++warp) {
    for (uint32_t lane = 0; lane < 32; ++lane) {
      for (uint32_t slot = 0; slot < stages; ++slot) {
        for (uint32_t h = 0; h < kTiles; ++h) claim(code_addr(warp, h, lane, slot));
      }
    }
  }
  for (uint32_t slot = 0; slot < x_stages; ++slot) {
    for (uint32_t box = 0; box < (group_x ? kW4A16ScaleGroup : 1); ++box) {
      for (uint32_t row = 0; row < c.block_t; ++row) {
        for (uint32_t unit = 0; unit < 8; ++unit) claim(cta_x_addr(slot, box, row, unit));
      }
    }
    claim(l.barriers_offset + 16 * slot);  // full[slot], empty[slot]: 8 B each, one 16 B piece here
  }
  claim(l.barriers_offset + 16 * x_stages);  // the ticket
  ASSERT_EQ(l.ring_x_offset % plan::kWgmmaSwizzleAtom, 0u) << name << ": the swizzle needs 1024 B aligned slots";
  ASSERT_EQ(std::count(owner.begin(), owner.end(), -1), 0) << name;

  std::mt19937_64 rng(testing::test_seed() ^ 0x5A5Aull);
  std::vector<uint8_t> smem(l.total_bytes());
  for (uint8_t& b : smem) b = static_cast<uint8_t>(rng());  // a slot read before its copy landed poisons D
  std::memset(d, 0, sizeof(d));
  struct ChunkFrags {
    uint32_t a[32][4][4], b[4][32][4][2];
  };
  struct Copy {
    uint32_t dst;
    uint8_t bytes[16];
  };
  for (uint32_t rt = 0; rt < c.n_warps() * kTiles && rt < p.row_tiles; ++rt) {
    const uint32_t warp = rt / kTiles, h = rt % kTiles;
    const int64_t tile = e * p.row_tiles + rt;
    std::vector<ChunkFrags> frags(static_cast<size_t>(p.k_chunks));
    for (uint32_t lane = 0; lane < 32; ++lane) {
      const uint32_t g = lane / 4, t = lane % 4;
      std::deque<std::vector<Copy>> pending;  // this lane's committed cp.async groups, oldest first
      auto slot_of = [&](int64_t kc) { return static_cast<uint32_t>(kc % stages); };
      // Chunk kc's TMA box of block_t token rows into the CTA ring, written at issue (the earliest it may
      // land: a slot refilled before its previous chunks were read poisons D).
      auto tma_box = [&](int64_t kc) {
        for (uint32_t row = 0; row < c.block_t; ++row) {
          const int64_t tok = tok0 + row;
          for (uint32_t unit = 0; unit < 8; ++unit) {
            const int64_t k0 = 64 * kc + 8 * unit;
            uint8_t* dst = smem.data() + cta_x_chunk_addr(kc, row, unit);
            if (k0 < p.k && tok < EmuProblem::kTokens) {
              std::memcpy(dst, p.x.data() + tok * p.k + k0, 16);
            } else {
              std::memset(dst, 0, 16);
            }
          }
        }
      };
      // A slot a scale group: group kg's boxes (its chunks below k_chunks) issued at once.
      auto issue_group = [&](int64_t kg) {
        for (int64_t kc = kg * kW4A16ScaleGroup; kc < (kg + 1) * kW4A16ScaleGroup && kc < p.k_chunks; ++kc) tma_box(kc);
      };
      auto load_chunk = [&](int64_t kc) {
        std::vector<Copy> group;
        Copy cp{code_addr(warp, h, lane, slot_of(kc)), {}};
        if (kc < p.k_chunks)
          std::memcpy(cp.bytes, p.kcodes.data() + (tile * p.k_chunks + kc) * kW4A16TileBytes + lane * 16, 16);
        group.push_back(cp);
        if (!group_x && kc < p.k_chunks) tma_box(kc);  // the TMA box (none past the part's chunks)
        for (const std::vector<Copy>& q : pending) {
          for (const Copy& a : q) {
            for (const Copy& b : group) EXPECT_NE(a.dst, b.dst) << name << ": two copies in flight to one slot";
          }
        }
        pending.push_back(group);
      };
      auto wait_group = [&](size_t n) {  // cp.async.wait_group n: all but the newest n groups land
        for (; pending.size() > n; pending.pop_front()) {
          for (const Copy& q : pending.front()) std::memcpy(smem.data() + q.dst, q.bytes, 16);
        }
      };
      auto scale_group = [&](int64_t kg) {
        uint4 v;
        std::memcpy(&v, p.kscales.data() + (tile * p.k_groups + kg) * kW4A16TileBytes + lane * 16, 16);
        return v;
      };
      if (group_x) issue_group(0);  // before the code prologue, as the kernel
      for (uint32_t i = 0; i + 1 < stages; ++i) load_chunk(i);
      uint4 sg = scale_group(0), sg_next{};
      if (p.k_groups > 1) sg_next = scale_group(1);
      for (int64_t kg = 0; kg < p.k_groups; ++kg) {
        // A slot a scale group: at the group's start the next group's boxes, into the slot the group before
        // this one used (released at its end).
        if (group_x && kg + 1 < p.k_groups) issue_group(kg + 1);
        for (uint32_t j = 0; j < kW4A16ScaleGroup && kg * kW4A16ScaleGroup + j < p.k_chunks; ++j) {
          const int64_t kc = kg * kW4A16ScaleGroup + j;
          ASSERT_EQ(pending.size(), stages - 1) << name;  // groups 0 .. kc + stages - 2 committed, 0 .. kc - 1 landed
          wait_group(stages - 2);                          // chunk kc landed
          uint4 w;
          std::memcpy(&w, smem.data() + code_addr(warp, h, lane, slot_of(kc)), 16);
          uint32_t words[4][8];  // per n8 tile: b[s][0] = word 2 s (k 16 t + 4 s + {0,1}), b[s][1] = word 2 s + 1
          for (uint32_t nt = 0; nt < n_tiles; ++nt) {
            std::memcpy(words[nt], smem.data() + cta_x_chunk_addr(kc, 8 * nt + g, 2 * t), 16);
            std::memcpy(words[nt] + 4, smem.data() + cta_x_chunk_addr(kc, 8 * nt + g, 2 * t + 1), 16);
          }
          load_chunk(kc + stages - 1);  // into the slots chunk kc - 1 used
          uint32_t sc_lo = 0, sc_hi = 0;
          w4a16_chunk_scales(sg, j, sc_lo, sc_hi);
          w4a16_chunk_fragments(w, sc_lo, sc_hi, frags[static_cast<size_t>(kc)].a[lane]);
          for (uint32_t nt = 0; nt < n_tiles; ++nt) {
            for (int st = 0; st < 4; ++st) {
              frags[static_cast<size_t>(kc)].b[nt][lane][st][0] = words[nt][2 * st];
              frags[static_cast<size_t>(kc)].b[nt][lane][st][1] = words[nt][2 * st + 1];
            }
          }
        }
        sg = sg_next;
        if (kg + 2 < p.k_groups) sg_next = scale_group(kg + 2);
      }
      wait_group(0);  // the drain before the warp leaves
    }
    for (const ChunkFrags& f : frags) {
      for (uint32_t nt = 0; nt < n_tiles; ++nt) emulate_chunk(f.a, f.b[nt], d[rt][nt]);
    }
  }
}

// kPipeline with block_w 32 (2 warps), block_t 16 and BLOCK_K: each K slice is copied into a host
// image of one stage exactly as load_stage's cp.async copies fill it (zero when the source is out
// of range), then the warps read it as the kernel's main loop does.
template <uint32_t BLOCK_K>
void emulate_pipeline_cta(const EmuProblem& p, int64_t e, double d[2][2][16][8]) {
  constexpr uint32_t kRowTiles = 2, kT = 16, kChunks = BLOCK_K / 64;
  const int64_t rt0 = 0, tile0 = e * p.row_tiles + rt0;
  const int64_t n_ktiles = (p.k_chunks + kChunks - 1) / kChunks;
  for (int64_t kt = 0; kt < n_ktiles; ++kt) {
    std::vector<uint4> x_store(kT * BLOCK_K * 2 / 16), w_store(kRowTiles * kChunks * 32);
    std::vector<uint4> s_store((kRowTiles * 32 * 2 * kChunks + 15) / 16);
    std::memset(x_store.data(), 0x00, x_store.size() * 16);
    std::memset(w_store.data(), 0x00, w_store.size() * 16);
    std::memset(s_store.data(), 0x00, s_store.size() * 16);
    auto* x_tile = reinterpret_cast<uint8_t*>(x_store.data());
    auto* w_tile = reinterpret_cast<uint8_t*>(w_store.data());
    auto* s_tile = reinterpret_cast<uint8_t*>(s_store.data());
    const int64_t k0 = kt * BLOCK_K;
    for (uint32_t i = 0; i < kT * BLOCK_K / 8; ++i) {
      const uint32_t r = i / (BLOCK_K / 8), c = i % (BLOCK_K / 8);
      const int64_t k = k0 + c * 8;
      if (k < p.k) std::memcpy(x_tile + x_tile_offset<BLOCK_K>(r, c), p.x.data() + r * p.k + k, 16);
    }
    for (uint32_t i = 0; i < kRowTiles * kChunks * 32; ++i) {
      const uint32_t rtl = i / (kChunks * 32), rem = i % (kChunks * 32);
      const int64_t kc = kt * kChunks + rem / 32;
      if (rt0 + rtl < p.row_tiles && kc < p.k_chunks) {
        std::memcpy(w_tile + i * 16, p.kcodes.data() + ((tile0 + rtl) * p.k_chunks + kc) * kW4A16TileBytes + (rem % 32) * 16, 16);
      }
    }
    const int64_t kc0 = kt * kChunks, kg = kc0 / kW4A16ScaleGroup, j0 = kc0 % kW4A16ScaleGroup;
    for (uint32_t i = 0; i < kRowTiles * 32; ++i) {
      const uint32_t rtl = i / 32, ln = i % 32;
      if (rt0 + rtl < p.row_tiles && kc0 < p.k_chunks) {
        std::memcpy(s_tile + i * 2 * kChunks,
                    p.kscales.data() + ((tile0 + rtl) * p.k_groups + kg) * kW4A16TileBytes + ln * 16 + 2 * j0, 2 * kChunks);
      }
    }
    for (uint32_t warp = 0; warp < kRowTiles; ++warp) {
      for (uint32_t nt = 0; nt < kT / 8; ++nt) {
        for (uint32_t kcl = 0; kcl < kChunks; ++kcl) {
          if (kt * kChunks + kcl >= p.k_chunks) continue;
          uint32_t a[32][4][4], b[32][4][2];
          for (uint32_t lane = 0; lane < 32; ++lane) {
            uint16_t pair;
            std::memcpy(&pair, s_tile + (warp * 32 + lane) * 2 * kChunks + 2 * kcl, 2);
            uint32_t sc_lo = 0, sc_hi = 0;
            w4a16_pair_scales(pair, sc_lo, sc_hi);
            const auto* codes = reinterpret_cast<const uint4*>(w_tile + warp * kChunks * kW4A16TileBytes + lane * 16 +
                                                               kcl * kW4A16TileBytes);
            w4a16_chunk_fragments(*codes, sc_lo, sc_hi, a[lane]);
            load_b_fragments<BLOCK_K>(x_tile, nt * 8, kcl, lane, b[lane]);
          }
          emulate_chunk(a, b, d[warp][nt]);
        }
      }
    }
  }
}

// Every shipped stream config plus a ring of 4 (the smallest depth check() allows: chunk kc + 3
// refills the slot of chunk kc - 1 with two copies in flight) and a 32-token CTA activation ring of
// exactly `stages` slots (m64n32_d8: 8 slots of 4 KB; chunk kc + 7 refills the slot chunk kc - 1 was
// read from), at K = 208 (4 chunks: the d8 prologues run past K with zero-fill copies) and K = 1040
// (17 chunks: every ring wraps, 3 scale groups rotate through sg / sg_next).
TEST(W4A16Emulation, StreamKernelGivesTheExactProducts) {
  std::vector<W4A16Config> configs;
  for (const W4A16Config& c : kW4A16Configs) {
    if (c.kind == W4A16Kind::kStream) configs.push_back(c);
  }
  ASSERT_EQ(configs.size(), 10u);
  configs.push_back(W4A16Config{64, 16, 64, 4, W4A16Kind::kStream});
  configs.push_back(W4A16Config{64, 32, 64, 8, W4A16Kind::kStream});
  ASSERT_EQ(W4A16Layout::make(configs.back()).x_stages, 8u);
  const EmuProblem problems[] = {make_emu_problem(testing::test_seed() ^ 0x57Eull),
                                 make_emu_problem(testing::test_seed() ^ 0x57E2ull, 1040, 17, 3)};
  for (const EmuProblem& p : problems) {
    for (const W4A16Config& c : configs) {
      const std::string what = "stream " + w4a16_config_name(c) + " K=" + std::to_string(p.k);
      for (int64_t e = 0; e < EmuProblem::kExperts; ++e) {
        for (int64_t tok0 = 0; tok0 < EmuProblem::kTokens; tok0 += c.block_t) {
          double d[8][4][16][8];
          emulate_stream_cta(p, c, e, tok0, d);
          for (int64_t rt = 0; rt < p.row_tiles; ++rt) {
            for (uint32_t nt = 0; nt < c.block_t / 8 && tok0 / 8 + nt < EmuProblem::kTokens / 8; ++nt) {
              expect_tile_exact(p, e, rt, tok0 / 8 + nt, d[rt][nt], what.c_str());
            }
          }
          if (::testing::Test::HasFailure()) return;
        }
      }
    }
  }
}

TEST(W4A16Emulation, PipelineKernelGivesTheExactProducts) {
  const EmuProblem p = make_emu_problem(testing::test_seed() ^ 0x919Eull);
  for (int64_t e = 0; e < EmuProblem::kExperts; ++e) {
    double d128[2][2][16][8] = {}, d256[2][2][16][8] = {};
    emulate_pipeline_cta<128>(p, e, d128);  // 2 slices: chunks 0-1, 2-3
    emulate_pipeline_cta<256>(p, e, d256);  // 1 slice: chunks 0-3
    for (int64_t rt = 0; rt < 2; ++rt) {
      for (int64_t nt = 0; nt < 2; ++nt) {
        expect_tile_exact(p, e, rt, nt, d128[rt][nt], "pipeline block_k 128");
        expect_tile_exact(p, e, rt, nt, d256[rt][nt], "pipeline block_k 256");
      }
    }
  }
}

// The pipeline kernel's per-lane scale slice: for stage kt, lane L copies bytes 2 j0 .. 2 j0 +
// 2 kChunks - 1 of its 16 B in group kc0 / 8 (kc0 = kt x kChunks, j0 = kc0 % 8) with a cp.async of
// 2 kChunks bytes; chunk kcl's pair at slice bytes 2 kcl, 2 kcl + 1 must give w4a16_chunk_scales'
// words for chunk j0 + kcl, and the copy must be aligned to its size and stay inside the 16 B.
template <uint32_t BLOCK_K>
void check_scale_slices(uint64_t seed) {
  constexpr uint32_t kChunks = BLOCK_K / 64;
  static_assert(kW4A16ScaleGroup % kChunks == 0);
  std::mt19937_64 rng(seed);
  for (uint32_t lane = 0; lane < 32; ++lane) {
    uint8_t groups[2][16];  // this lane's 16 B of two consecutive scale groups
    for (auto& grp : groups) for (uint8_t& b : grp) b = random_scale(rng);
    for (uint32_t kt = 0; kt < 2 * kW4A16ScaleGroup / kChunks; ++kt) {
      const uint32_t kc0 = kt * kChunks, kg = kc0 / kW4A16ScaleGroup, j0 = kc0 % kW4A16ScaleGroup;
      const uint32_t src = lane * 16 + 2 * j0;
      EXPECT_EQ(src % (2 * kChunks), 0u) << "BLOCK_K " << BLOCK_K << " stage " << kt << ": cp.async source misaligned";
      EXPECT_LE(2 * j0 + 2 * kChunks, 16u) << "BLOCK_K " << BLOCK_K << " stage " << kt << ": the slice leaves the 16 B";
      uint8_t slice[8] = {};
      std::memcpy(slice, groups[kg] + 2 * j0, 2 * kChunks);
      uint4 group;
      std::memcpy(&group, groups[kg], 16);
      for (uint32_t kcl = 0; kcl < kChunks; ++kcl) {
        uint16_t pair;
        std::memcpy(&pair, slice + 2 * kcl, 2);
        uint32_t lo = 0, hi = 0, want_lo = 0, want_hi = 0;
        w4a16_pair_scales(pair, lo, hi);
        w4a16_chunk_scales(group, j0 + kcl, want_lo, want_hi);
        EXPECT_EQ(lo, want_lo) << "BLOCK_K " << BLOCK_K << " lane " << lane << " chunk " << kc0 + kcl;
        EXPECT_EQ(hi, want_hi) << "BLOCK_K " << BLOCK_K << " lane " << lane << " chunk " << kc0 + kcl;
      }
    }
  }
}

// The A registers lane `lane` dequantizes for chunk kc of kernel-layout tile `tile` (expert x row tile),
// from its 16 B of codes and of the chunk's scale group, as the wgmma kernels do.
void lane_chunk_fragments(const EmuProblem& p, int64_t tile, int64_t kc, uint32_t lane, uint32_t a[4][4]) {
  uint4 codes, group;
  std::memcpy(&codes, &p.kcodes[static_cast<size_t>((tile * p.k_chunks + kc) * 512 + lane * 16)], 16);
  std::memcpy(&group, &p.kscales[static_cast<size_t>((tile * p.k_groups + kc / 8) * 512 + lane * 16)], 16);
  uint32_t sc_lo, sc_hi;
  w4a16_chunk_scales(group, static_cast<uint32_t>(kc % 8), sc_lo, sc_hi);
  w4a16_chunk_fragments(codes, sc_lo, sc_hi, a);
}

// kWgmma (w4a16_wgmma.cu): each lane's dequantized chunk goes into its warp's row tile of the A tile
// through w4a16_wgmma_a_stores. The 32 lanes' 16 B stores must cover the row tile's 2 KB exactly once;
// read back with the wgmma operand layout (row r, k at w4a16_wgmma_swizzle(r, k / 8) + 2 (k % 8), CuTe's
// Layout_K_SW128_Atom: test_wgmma_layout_host), element (r, k) must be e2m1 x e4m3 x 2^-8 of weight row
// 16 rt + r at K = 64 kc + k (natural order; 0 past K), and D = A x X^T summed over the chunks must be the
// f64 dot products (2 experts x 2 row tiles x 2 token tiles; K = 208: a partial last chunk, and 1040).
TEST(W4A16Emulation, WgmmaATileHoldsTheWeightsInNaturalKOrder) {
  for (const auto& [k, chunks, groups] : {std::array<int64_t, 3>{208, 4, 1}, std::array<int64_t, 3>{1040, 17, 3}}) {
    const EmuProblem p = make_emu_problem(testing::test_seed() ^ 0x3C3Cull ^ static_cast<uint64_t>(k), k, chunks, groups);
    for (int64_t e = 0; e < EmuProblem::kExperts; ++e) {
      for (int64_t rt = 0; rt < p.row_tiles; ++rt) {
        double d[2][16][8] = {};
        const int64_t tile = e * p.row_tiles + rt;
        for (int64_t kc = 0; kc < p.k_chunks; ++kc) {
          std::vector<uint8_t> a_tile(16 * 128, 0xFF);
          std::vector<int> stores(16 * 128 / 16, 0);
          for (uint32_t lane = 0; lane < 32; ++lane) {
            uint32_t a[4][4];
            lane_chunk_fragments(p, tile, kc, lane, a);
            const W4A16WgmmaStores st = w4a16_wgmma_a_stores(a, lane);
            for (int q = 0; q < 4; ++q) {
              ASSERT_EQ(st.offset[q] % 16, 0u);
              ASSERT_LT(st.offset[q], a_tile.size());
              std::memcpy(&a_tile[st.offset[q]], &st.value[q], 16);
              ++stores[st.offset[q] / 16];
            }
          }
          for (size_t u = 0; u < stores.size(); ++u) ASSERT_EQ(stores[u], 1) << "16 B unit " << u << " of the row tile";
          for (uint32_t r = 0; r < 16; ++r) {
            for (uint32_t kk = 0; kk < 64; ++kk) {
              uint16_t bits;
              std::memcpy(&bits, &a_tile[plan::w4a16_wgmma_swizzle(r, kk / 8) + 2 * (kk % 8)], 2);
              const float got = bf16_to_f32(bits);
              const int64_t row = rt * 16 + r, kg = kc * 64 + kk;
              const double want =
                  kg < p.k ? std::ldexp(static_cast<double>(format::e2m1_to_f32(static_cast<uint8_t>(p.w.code(e, row, kg)))) *
                                            format::e4m3_to_f32(p.w.scale(e, row, kg)),
                                        -kW4A16AccShift)
                           : 0.0;
              ASSERT_EQ(static_cast<double>(got), want) << "expert " << e << " row " << row << " k " << kg;
              for (int nt = 0; nt < 2; ++nt) {
                for (int n = 0; n < 8; ++n) {
                  const int64_t tok = nt * 8 + n;
                  const double xv = kg < p.k ? bf16_to_f32(p.x[static_cast<size_t>(tok * p.k + kg)]) : 0.0;
                  d[nt][r][n] += static_cast<double>(got) * xv;
                }
              }
            }
          }
        }
        for (int nt = 0; nt < 2; ++nt) expect_tile_exact(p, e, rt, nt, d[nt], "wgmma A tile");
      }
    }
  }
}

TEST(W4A16Emulation, PipelineScaleSliceGivesTheChunkScales) {
  check_scale_slices<128>(testing::test_seed() ^ 0x128ull);  // 2 chunks, 4 B per lane per stage
  check_scale_slices<256>(testing::test_seed() ^ 0x256ull);  // 4 chunks, 8 B per lane per stage
}


}  // namespace
}  // namespace fp4moe::cuda::sm90
