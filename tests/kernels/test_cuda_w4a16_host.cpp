// CPU checks of sm90_nvfp4_w4a16_grouped_gemm (src/kernels/cuda/sm90/), no GPU needed:
//   * the register-level e2m1 -> bf16 decode and e4m3 -> bf16 scale against format/nvfp4.h, for
//     every code; exactness of e2m1 x e4m3 in bf16;
//   * the shared-memory swizzles are bijections that keep 16 B chunks inside their tile;
//   * an emulation of one CTA's MMA loop: the kernel's own fragment loaders (w4a16_fragments.h)
//     read a host image of the swizzled stage, an emulated mma.sync m16n8k16 (PTX fragment
//     layouts, written here independently) multiplies, and the result must equal the f64 dot
//     products of the dequantized weights: this pins the K permutation, swizzles and decode;
//   * the constexpr layout (offsets, alignment, totals; plan/layout_sm90_w4a16.h), config names,
//     and the refusal messages (a config over the shared-memory limit, K = 16 x odd, bad N, bad
//     config id) to the byte;
//   * the kernel's carve (the offsets its template takes from the layout of each config id) equals
//     what `fp4moe plan` sizes the same config with, and the launcher refuses exactly the configs
//     the planner rejects, with the same message.
// Run: test_cuda_w4a16_host (FP4MOE_TEST_SEED=<n> replays a seed).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "format/nvfp4.h"
#include "kernels/cuda/sm90/w4a16_fragments.h"
#include "kernels/cuda/sm90/w4a16_grouped_gemm.h"
#include "plan/gpu_table.h"
#include "plan/kernel_families.h"
#include "plan/layout_sm90_w4a16.h"
#include "testing/testing.h"

namespace fp4moe::cuda::sm90 {
namespace {

float lo_f32(uint32_t pair) { return bf16_to_f32(static_cast<uint16_t>(pair & 0xFFFFu)); }
float hi_f32(uint32_t pair) { return bf16_to_f32(static_cast<uint16_t>(pair >> 16)); }

std::string expect_throw(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "no fp4moe::Error thrown";
  return "";
}

TEST(W4A16Decode, E2m1x8MatchesFormatForEveryCodeInEveryPosition) {
  std::mt19937_64 rng(testing::test_seed() ^ 0xE2A1ull);
  for (int pos = 0; pos < 8; ++pos) {
    for (uint32_t code = 0; code < 16; ++code) {
      for (int rep = 0; rep < 16; ++rep) {
        uint32_t word = static_cast<uint32_t>(rng());
        word = (word & ~(0xFu << (4 * pos))) | (code << (4 * pos));
        uint32_t out[4];
        e2m1x8_to_bf16x8(word, out);
        for (int i = 0; i < 8; ++i) {
          const uint32_t c = (word >> (4 * i)) & 0xFu;
          const float got = (i & 1) ? hi_f32(out[i / 2]) : lo_f32(out[i / 2]);
          ASSERT_EQ(got, format::e2m1_to_f32(static_cast<uint8_t>(c)))
              << "word 0x" << std::hex << word << " element " << std::dec << i << " code " << c;
        }
      }
    }
  }
}

TEST(W4A16Decode, E4m3ToBf16IsExactForEveryCode) {
  for (int code = 0; code < 256; ++code) {
    const float want = format::e4m3_to_f32(static_cast<uint8_t>(code));
    const float got = bf16_to_f32(e4m3_to_bf16_bits(static_cast<uint8_t>(code)));
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(got)) << "code 0x" << std::hex << code;
    } else {
      EXPECT_EQ(got, want) << "code 0x" << std::hex << code;
      EXPECT_EQ(std::signbit(got), std::signbit(want)) << "code 0x" << std::hex << code;
    }
  }
}

// The kernel multiplies e2m1 x e4m3 in bf16 and relies on the product being exact.
TEST(W4A16Decode, E2m1TimesE4m3IsExactInBf16) {
  for (int code = 0; code < 16; ++code) {
    for (int s = 0; s < 256; ++s) {
      if (s == 0x7F || s == 0xFF) continue;
      const uint32_t pair = code | (code << 4);
      uint32_t dq[4];
      e2m1x8_to_bf16x8(pair, dq);  // element 0 and 1 are `code`
      const uint32_t prod = host_bf16x2_mul_exact(dq[0], e4m3_to_bf16_bits(static_cast<uint8_t>(s)));
      const double want = static_cast<double>(format::e2m1_to_f32(static_cast<uint8_t>(code))) *
                          format::e4m3_to_f32(static_cast<uint8_t>(s));
      EXPECT_EQ(static_cast<double>(lo_f32(prod)), want) << "code " << code << " scale 0x" << std::hex << s;
      EXPECT_EQ(static_cast<double>(hi_f32(prod)), want) << "code " << code << " scale 0x" << std::hex << s;
    }
  }
}

template <uint32_t BK>
void check_swizzles(uint32_t rows_w, uint32_t rows_t) {
  std::vector<int> seen_x(rows_t * BK * 2 / 16, 0);
  for (uint32_t r = 0; r < rows_t; ++r) {
    for (uint32_t c = 0; c < BK / 8; ++c) {
      const uint32_t off = x_tile_offset<BK>(r, c);
      ASSERT_EQ(off % 16, 0u);
      ASSERT_EQ(off / (BK * 2), r) << "x chunk left its row";
      ++seen_x[off / 16];
    }
  }
  for (int v : seen_x) ASSERT_EQ(v, 1) << "x_tile swizzle is not a bijection, BK=" << BK;
  std::vector<int> seen_w(rows_w * BK / 2, 0);
  for (uint32_t r = 0; r < rows_w; ++r) {
    for (uint32_t b = 0; b < BK / 2; ++b) {
      const uint32_t off = w_packed_offset<BK>(r, b);
      ASSERT_LT(off, rows_w * BK / 2);
      // The 16 B chunk moves as a whole (cp.async writes whole chunks).
      ASSERT_EQ(off % 16, b % 16);
      ASSERT_EQ(w_packed_offset<BK>(r, b - b % 16) + b % 16, off);
      ++seen_w[off];
    }
  }
  for (int v : seen_w) ASSERT_EQ(v, 1) << "w_packed swizzle is not a bijection, BK=" << BK;
}

TEST(W4A16Swizzle, BijectionsForShippedTileShapes) {
  for (const W4A16Config& c : kW4A16Configs) {
    if (c.block_k == 128) check_swizzles<128>(c.block_w, c.block_t);
    if (c.block_k == 256) check_swizzles<256>(c.block_w, c.block_t);
  }
}

// Emulated mma.sync.m16n8k16.row.col bf16: D[16x8] += A[16x16] B[16x8] from the 32 lanes'
// registers, per the PTX ISA fragment layouts (groupID g = lane / 4, t = lane % 4):
//   A: a0 = (g, 2t..2t+1), a1 = (g+8, 2t..), a2 = (g, 2t+8..), a3 = (g+8, 2t+8..)
//   B: b0 = (k 2t..2t+1, n g), b1 = (k 2t+8..2t+9, n g)      low half = lower index
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

template <uint32_t BK>
void emulate_stage(uint64_t seed) {
  constexpr uint32_t kRowsW = 32, kRowsT = 16;  // 2 warps x 2 n8 tiles
  std::mt19937_64 rng(seed);
  std::vector<uint8_t> codes(kRowsW * BK), scales(kRowsW * BK / 16);
  std::vector<uint16_t> x(kRowsT * BK);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (uint8_t& c : codes) c = static_cast<uint8_t>(rng() & 0xF);
  for (uint8_t& s : scales) s = format::f32_to_e4m3(std::exp2(static_cast<float>(rng() % 17) - 8.0f) * 1.3f);
  for (uint16_t& v : x) v = f32_to_bf16(normal(rng));

  // Host images of one stage, laid out exactly as the kernel's cp.async writes them.
  std::vector<uint4> w_store(kRowsW * BK / 2 / 16), x_store(kRowsT * BK * 2 / 16);
  std::vector<uint8_t> s_tile(kRowsW * BK / 16);
  auto* w_tile = reinterpret_cast<uint8_t*>(w_store.data());
  auto* x_tile = reinterpret_cast<uint8_t*>(x_store.data());
  for (uint32_t r = 0; r < kRowsW; ++r) {
    for (uint32_t j = 0; j < BK / 2; ++j) {
      w_tile[w_packed_offset<BK>(r, j)] = format::e2m1_pack(codes[r * BK + 2 * j], codes[r * BK + 2 * j + 1]);
    }
    for (uint32_t b = 0; b < BK / 16; ++b) s_tile[w_scales_offset<BK>(r, b)] = scales[r * BK / 16 + b];
  }
  for (uint32_t tok = 0; tok < kRowsT; ++tok) {
    for (uint32_t k = 0; k < BK; ++k) {
      std::memcpy(x_tile + x_tile_offset<BK>(tok, k / 8) + (k % 8) * 2, &x[tok * BK + k], 2);
    }
  }

  for (uint32_t warp = 0; warp < kRowsW / 16; ++warp) {
    for (uint32_t j = 0; j < kRowsT / 8; ++j) {
      double d[16][8] = {};
      for (uint32_t kc = 0; kc < BK / 64; ++kc) {
        uint32_t a[32][4][4], b[32][4][2];
        for (uint32_t lane = 0; lane < 32; ++lane) {
          load_a_fragments<BK>(w_tile, s_tile.data(), warp * 16, kc, lane, a[lane]);
          load_b_fragments<BK>(x_tile, j * 8, kc, lane, b[lane]);
        }
        for (int s = 0; s < 4; ++s) {
          uint32_t as[32][4], bs[32][2];
          for (int lane = 0; lane < 32; ++lane) {
            std::memcpy(as[lane], a[lane][s], sizeof(as[lane]));
            std::memcpy(bs[lane], b[lane][s], sizeof(bs[lane]));
          }
          emulate_mma(as, bs, d);
        }
      }
      for (int m = 0; m < 16; ++m) {
        for (int n = 0; n < 8; ++n) {
          const uint32_t row = warp * 16 + m, tok = j * 8 + n;
          double want = 0;
          for (uint32_t k = 0; k < BK; ++k) {
            want += static_cast<double>(format::e2m1_to_f32(codes[row * BK + k])) *
                    format::e4m3_to_f32(scales[row * BK / 16 + k / 16]) * bf16_to_f32(x[tok * BK + k]);
          }
          ASSERT_NEAR(d[m][n], want, 1e-9 * (1 + std::fabs(want)))
              << "BK=" << BK << " weight row " << row << " token " << tok;
        }
      }
    }
  }
}

TEST(W4A16Emulation, FragmentsOfOneStageGiveTheExactProducts) {
  const uint64_t seed = testing::test_seed();
  emulate_stage<128>(seed ^ 0x128ull);
  emulate_stage<256>(seed ^ 0x256ull);
}

TEST(W4A16Layout, RegionsAreAlignedAndSumToTheTotal) {
  for (const W4A16Config& c : kW4A16Configs) {
    const W4A16Layout l = W4A16Layout::make(c);
    const std::string name = w4a16_config_name(c);
    ASSERT_TRUE(l.valid()) << name;
    EXPECT_LE(l.total_bytes(), kSm90SmemOptinBytes) << name;
    uint32_t sum = 0;
    for (int i = 0; i < l.layout.n_regions; ++i) {
      EXPECT_EQ(l.layout.regions[i].offset, sum) << name << " region " << l.layout.regions[i].name;
      sum += l.layout.regions[i].bytes;
    }
    EXPECT_EQ(sum, l.total_bytes()) << name;
    EXPECT_EQ(l.x_tile_bytes, c.block_t * c.block_k * 2) << name;
    EXPECT_EQ(l.w_packed_bytes, c.block_w * c.block_k / 2) << name;
    EXPECT_EQ(l.w_scales_bytes, c.block_w * c.block_k / 16) << name;
    EXPECT_EQ(l.stage_stride, l.x_tile_bytes + l.w_packed_bytes + l.w_scales_bytes) << name;
    for (uint32_t s = 0; s < c.stages; ++s) {
      EXPECT_EQ(l.x_tile(s) % 128, 0u) << name;
      EXPECT_EQ(l.w_packed(s) % 128, 0u) << name;
      EXPECT_EQ(l.w_scales(s) % 16, 0u) << name;
      EXPECT_EQ(l.w_packed(s), l.x_tile(s) + l.x_tile_bytes) << name;
    }
    EXPECT_EQ(l.epilogue_offset, c.stages * l.stage_stride) << name;
    EXPECT_EQ(l.epilogue_bytes, c.block_t * (c.block_w * 2 + 16)) << name;
    EXPECT_EQ(l.total_bytes() % 128, 0u) << name;
  }
}

// The kernel instantiates config id i as sm90_nvfp4_w4a16_grouped_gemm_kernel<block_w, block_t,
// block_k, stages> and carves with W4A16Layout::make of that config (x_tile/w_packed/w_scales at
// stage 0 plus s x stage_stride, the epilogue after the last stage) and requests total_bytes().
// The planner must size the same config id with the same regions.
TEST(W4A16Layout, KernelCarveEqualsThePlannersLayout) {
  const std::vector<plan::TileCandidate> cands = plan::family_candidates(plan::KernelFamily::kSm90W4A16, false);
  ASSERT_EQ(static_cast<int>(cands.size()), w4a16_num_configs());
  const plan::GpuSpec h200 = plan::require_gpu("h200");
  for (int id = 0; id < w4a16_num_configs(); ++id) {
    const W4A16Config& c = w4a16_config(id);
    const W4A16Layout kernel = W4A16Layout::make(W4A16Config{c.block_w, c.block_t, c.block_k, c.stages});
    const std::string name = w4a16_config_name(c);
    const plan::TileCandidate& cand = cands[static_cast<size_t>(id)];
    ASSERT_EQ(cand.to_string(), name) << "config id " << id;
    const plan::SmemLayout planned = plan::candidate_layout(cand, h200, plan::kCutlass420);
    ASSERT_EQ(planned.n_regions, kernel.layout.n_regions) << name;
    for (uint32_t s = 0; s < c.stages; ++s) {
      EXPECT_EQ(planned.regions[3 * s].offset, kernel.x_tile_offset + s * kernel.stage_stride) << name << " stage " << s;
      EXPECT_EQ(planned.regions[3 * s + 1].offset, kernel.w_packed_offset + s * kernel.stage_stride) << name << " stage " << s;
      EXPECT_EQ(planned.regions[3 * s + 2].offset, kernel.w_scales_offset + s * kernel.stage_stride) << name << " stage " << s;
      EXPECT_EQ(planned.regions[3 * s].bytes, kernel.x_tile_bytes) << name;
      EXPECT_EQ(planned.regions[3 * s + 1].bytes, kernel.w_packed_bytes) << name;
      EXPECT_EQ(planned.regions[3 * s + 2].bytes, kernel.w_scales_bytes) << name;
    }
    EXPECT_EQ(planned.regions[3 * c.stages].offset, kernel.epilogue_offset) << name;
    EXPECT_EQ(planned.regions[3 * c.stages].bytes, c.block_t * kernel.epilogue_row_bytes) << name;
    EXPECT_EQ(planned.total_bytes, kernel.total_bytes()) << name;
    const plan::SmemCheck check = plan::check_smem(cand, h200, plan::kCutlass420);
    EXPECT_EQ(check.bytes, kernel.total_bytes()) << name;
    EXPECT_EQ(check.stages, static_cast<int>(c.stages)) << name;
  }
}

// One computation behind both refusals: on an RTX 4090 (101376 B opt-in) the planner rejects the
// configs the launcher would refuse, and its reason is the launcher's message without the kernel
// name.
TEST(W4A16Configs, LauncherRefusesWhatThePlannerRejects) {
  const plan::GpuSpec ada = plan::require_gpu("rtx-4090");
  ASSERT_EQ(ada.smem_optin_per_block, 101376u);
  int refused = 0;
  for (const plan::TileCandidate& cand : plan::family_candidates(plan::KernelFamily::kSm90W4A16, false)) {
    const plan::SmemCheck check = plan::check_smem(cand, ada, plan::kCutlass420);
    const std::string name = cand.to_string();
    if (check.fits) {
      EXPECT_NO_THROW(w4a16_check_config(cand.ours, ada.smem_optin_per_block)) << name;
      continue;
    }
    ++refused;
    EXPECT_EQ(check.rule, "smem-opt-in") << name;
    const std::string msg = expect_throw([&] { w4a16_check_config(cand.ours, ada.smem_optin_per_block); });
    EXPECT_NE(msg.find(std::string("sm90_nvfp4_w4a16_grouped_gemm: ") + check.reason), std::string::npos)
        << name << "\nlauncher: " << msg << "\nplanner: " << check.reason;
  }
  EXPECT_EQ(refused, 2);  // m128n16k256_s4 (110848 B) and m128n64k128_s4 (119808 B)
}

TEST(W4A16Configs, NamesRoundTrip) {
  const std::vector<std::string> names = w4a16_config_names();
  ASSERT_EQ(static_cast<int>(names.size()), w4a16_num_configs());
  EXPECT_NE(std::find(names.begin(), names.end(), "w4a16_swapab_m128n16k256_s4"), names.end());
  for (int i = 0; i < w4a16_num_configs(); ++i) EXPECT_EQ(w4a16_config_id(names[static_cast<size_t>(i)]), i);
  const std::string msg = expect_throw([] { w4a16_config_id("w4a16_swapab_m256n8k128_s4"); });
  EXPECT_NE(msg.find("unknown config 'w4a16_swapab_m256n8k128_s4'; known: " + names[0] + ", " + names[1]), std::string::npos)
      << msg;
  const std::string msg_id = expect_throw([] { w4a16_config(99); });
  const int n = w4a16_num_configs();
  EXPECT_NE(msg_id.find("config id 99 is out of range (" + std::to_string(n) + " configs, ids 0.." + std::to_string(n - 1) + ")"),
            std::string::npos)
      << msg_id;
  EXPECT_EQ(w4a16_config(w4a16_default_config(1)).block_t, 8u);
  EXPECT_EQ(w4a16_config(w4a16_default_config(9)).block_t, 16u);
  EXPECT_EQ(w4a16_config(w4a16_default_config(500)).block_t, 64u);
}

// 128x64x256, 6 stages: x 64*256*2 = 32768, w 128*256/2 = 16384, scales 128*256/16 = 2048 per
// stage (51200 x 6 = 307200) + epilogue 64 * (128*2 + 16) = 17408 = 324608 B > 232448 by 92160.
TEST(W4A16Configs, InfeasibleConfigIsRefusedWithTheBytes) {
  const W4A16Config big{128, 64, 256, 6};
  const std::string msg = expect_throw([&] { w4a16_check_config(big, kSm90SmemOptinBytes); });
  EXPECT_NE(msg.find("sm90_nvfp4_w4a16_grouped_gemm: config w4a16_swapab_m128n64k256_s6 needs 6 stages x "
                     "(x_tile 32768 + w_packed 16384 + w_scales 2048) + epilogue 17408 = 324608 B of shared "
                     "memory > 232448 B (the device's opt-in limit per block) by 92160 B"),
            std::string::npos)
      << msg;
  // A shipped config against a smaller (sm_120-like) limit: m128n64k128_s4 =
  // 4 x (16384 + 8192 + 1024) + 64 * 272 = 102400 + 17408 = 119808 B > 101376 by 18432.
  const std::string msg2 = expect_throw([] { w4a16_check_config(w4a16_config(w4a16_config_id("w4a16_swapab_m128n64k128_s4")), 101376); });
  EXPECT_NE(msg2.find("= 119808 B of shared memory > 101376 B (the device's opt-in limit per block) by 18432 B"),
            std::string::npos)
      << msg2;
  const std::string msg3 = expect_throw([] { w4a16_check_config(W4A16Config{96, 8, 256, 4}, kSm90SmemOptinBytes); });
  EXPECT_NE(msg3.find("block_w (weight rows, MMA M) must be 64 or 128"), std::string::npos) << msg3;
  for (int i = 0; i < w4a16_num_configs(); ++i) w4a16_check_config(w4a16_config(i), kSm90SmemOptinBytes);
}

TEST(W4A16Problem, RefusesUnsupportedShapesNamingTheNumbers) {
  alignas(16) static uint8_t buf[256] = {};
  W4A16GroupedGemmArgs a;
  a.x = reinterpret_cast<const __nv_bfloat16*>(buf);
  a.expert_offsets = reinterpret_cast<const int32_t*>(buf);
  a.w_packed = buf;
  a.w_scales = buf;
  a.w_global_scales = reinterpret_cast<const float*>(buf);
  a.y = reinterpret_cast<__nv_bfloat16*>(buf);
  a.m_total = 4;
  a.n = 64;
  a.k = 1040;  // 16 x 65
  a.n_experts = 2;
  const W4A16Config& c = w4a16_config(0);
  std::string msg = expect_throw([&] { w4a16_check_problem(a, c); });
  EXPECT_NE(msg.find("K=1040 must be a positive multiple of 64 (K % 64 = 16)"), std::string::npos) << msg;
  EXPECT_NE(msg.find("K = 16 x odd is not supported"), std::string::npos) << msg;
  a.k = 320;  // 64 x 5: supported (a partial last K tile)
  w4a16_check_problem(a, c);
  a.n = 60;
  msg = expect_throw([&] { w4a16_check_problem(a, c); });
  EXPECT_NE(msg.find("N=60 must be a positive multiple of 8"), std::string::npos) << msg;
  a.n = 64;
  a.y = reinterpret_cast<__nv_bfloat16*>(buf + 2);
  msg = expect_throw([&] { w4a16_check_problem(a, c); });
  EXPECT_NE(msg.find("must be 16 B aligned"), std::string::npos) << msg;
  a.y = nullptr;
  msg = expect_throw([&] { w4a16_check_problem(a, c); });
  EXPECT_NE(msg.find("null pointer"), std::string::npos) << msg;
  a.m_total = 0;  // nothing to do: pointers are not needed
  w4a16_check_problem(a, c);
  // The launcher checks before touching CUDA, so the refusal works without a GPU too.
  a.m_total = 4;
  a.y = reinterpret_cast<__nv_bfloat16*>(buf);
  a.k = 1040;
  msg = expect_throw([&] { w4a16_grouped_gemm(a, 0, nullptr); });
  EXPECT_NE(msg.find("K=1040"), std::string::npos) << msg;
}

}  // namespace
}  // namespace fp4moe::cuda::sm90
