// A fact about Hopper's wgmma that the planned W4A16 wgmma kernel relies on (issue #5, docs/gpu.md
// "Next: a wgmma W4A16 kernel"), read from CuTe's own description of the instruction (the pinned
// CUTLASS headers; no GPU needed): in the register-A form (RS) of wgmma m64nNk16 with bf16 inputs,
// thread tid of the warpgroup holds the A values that mma.sync m16n8k16's A fragment gives lane
// tid % 32, at rows shifted by 16 x (tid / 32). So the W4A16 kernels' in-register dequantization,
// built for mma.sync, can feed wgmma unchanged; only the activations (B) move to shared memory.
#include <gtest/gtest.h>

#include <cute/atom/mma_traits_sm90_gmma.hpp>
#include <cute/tensor.hpp>

#include "plan/layout_sm90_w4a16.h"

namespace {

// mma.sync m16n8k16 A fragment (PTX ISA "Matrix Fragments for mma.m16n8k16"): lane (g, t) holds
// a0 = rows g at k 2t, 2t+1; a1 = row g+8; a2 = row g at k 2t+8, 2t+9; a3 = row g+8 there.
struct MK {
  int m, k;
};
MK mma_sync_a(int lane, int v) {
  const int g = lane / 4, t = lane % 4;
  const int reg = v / 2, half = v % 2;
  return {g + 8 * (reg % 2), 2 * t + half + 8 * (reg / 2)};
}

template <class Atom>
void expect_rs_a_is_mma_sync_a(const char* what) {
  using namespace cute;
  TiledMMA mma = make_tiled_mma(Atom{});
  const auto coords = make_identity_tensor(make_shape(Int<64>{}, Int<16>{}));
  for (int tid = 0; tid < 128; ++tid) {
    const auto frag = mma.get_thread_slice(tid).partition_A(coords);
    ASSERT_EQ(int(size(frag)), 8) << what;
    for (int v = 0; v < 8; ++v) {
      const MK want = mma_sync_a(tid % 32, v);
      EXPECT_EQ(int(get<0>(frag(v))), 16 * (tid / 32) + want.m) << what << ": thread " << tid << " value " << v;
      EXPECT_EQ(int(get<1>(frag(v))), want.k) << what << ": thread " << tid << " value " << v;
    }
  }
}

TEST(WgmmaLayout, RegisterAIsTheMmaSyncAFragmentPerWarp) {
  using cute::GMMA::Major;
  expect_rs_a_is_mma_sync_a<cute::SM90_64x64x16_F32BF16BF16_RS<Major::K, Major::K>>("m64n64k16 RS");
  expect_rs_a_is_mma_sync_a<cute::SM90_64x128x16_F32BF16BF16_RS<Major::K, Major::K>>("m64n128k16 RS");
  expect_rs_a_is_mma_sync_a<cute::SM90_64x256x16_F32BF16BF16_RS<Major::K, Major::K>>("m64n256k16 RS");
}

// The kWgmma kernel's shared-memory tiles (plan/layout_sm90_w4a16.h): w4a16_wgmma_swizzle is CuTe's
// canonical K-major 128B-swizzled bf16 layout (Layout_K_SW128_Atom tiled over 128 rows x 64 k), byte
// for byte.
TEST(WgmmaLayout, KernelSwizzleIsCutesK128Atom) {
  using namespace cute;
  const auto tile = tile_to_shape(GMMA::Layout_K_SW128_Atom<bfloat16_t>{}, make_shape(Int<128>{}, Int<64>{}));
  // The atom keeps its swizzle (Sw<3,4,3>) for the shared-memory pointer (smem_ptr_flag): it acts on
  // byte addresses, so apply it to 2 x the element offset.
  const auto swizzle = get_swizzle_portion(tile);
  const auto offsets = get_nonswizzle_portion(tile);
  for (int m = 0; m < 128; ++m) {
    for (int k = 0; k < 64; ++k) {
      const uint32_t want = static_cast<uint32_t>(swizzle(2 * int(offsets(m, k))));
      const uint32_t got = fp4moe::plan::w4a16_wgmma_swizzle(m, k / 8) + 2u * (k % 8);
      ASSERT_EQ(got, want) << "row " << m << " k " << k;
    }
  }
}

// w4a16_wgmma_desc (+ 2 per k16 step, i.e. 32 B) is the descriptor CuTe's SS atom gets for each k16
// block of a 64 x 64 tile of that layout (what make_fragment_A hands the MMA), and its start address
// field is the shared address / 16.
TEST(WgmmaLayout, KernelDescriptorIsCutes) {
  using namespace cute;
  const auto tile = tile_to_shape(GMMA::Layout_K_SW128_Atom<bfloat16_t>{}, make_shape(Int<64>{}, Int<64>{}));
  const auto s_a = make_tensor(make_smem_ptr(static_cast<bfloat16_t*>(nullptr)), tile);
  TiledMMA mma = make_tiled_mma(SM90_64x64x16_F32BF16BF16_SS<GMMA::Major::K, GMMA::Major::K>{});
  const auto thr = mma.get_slice(0);
  const auto descs = thr.make_fragment_A(thr.partition_A(s_a));
  ASSERT_EQ(int(size<2>(descs)), 4);
  for (int k = 0; k < 4; ++k) {
    const GmmaDescriptor cute_desc = descs(0, 0, k);
    EXPECT_EQ(fp4moe::plan::w4a16_wgmma_desc(0) + 2 * k, static_cast<uint64_t>(cute_desc)) << "k16 block " << k;
  }
  for (uint32_t addr : {1024u, 0x8000u + 32u, 227u * 1024u}) {
    GmmaDescriptor d;
    d.desc_ = fp4moe::plan::w4a16_wgmma_desc(addr);
    EXPECT_EQ(d.bitfield.start_address_, addr >> 4) << addr;
    EXPECT_EQ(d.bitfield.stride_byte_offset_, 1024 >> 4) << addr;
    EXPECT_EQ(d.bitfield.layout_type_, uint8_t(SM90::GMMA::LayoutType::B128)) << addr;
    EXPECT_EQ(d.bitfield.base_offset_, 0) << addr;
  }
}

// The f32 accumulators of wgmma m64nNk16 (SS and RS alike): thread tid holds, per n8 tile j, the
// mma.sync m16n8k16 C fragment of lane tid % 32 (rows g, g + 8, columns 2t, 2t + 1 of the tile) at rows
// shifted by 16 x (tid / 32) -- so the kWgmma kernel reuses the mma.sync kernels' epilogue with
// acc[j][0..3] = value 4 j + 0..3.
template <class Atom>
void expect_c_is_mma_sync_c(int n, const char* what) {
  using namespace cute;
  TiledMMA mma = make_tiled_mma(Atom{});
  const auto coords = make_identity_tensor(make_shape(Int<64>{}, n));
  for (int tid = 0; tid < 128; ++tid) {
    const auto frag = mma.get_thread_slice(tid).partition_C(coords);
    ASSERT_EQ(int(size(frag)), n / 2) << what;
    const int g = (tid % 32) / 4, t = tid % 4;
    for (int v = 0; v < n / 2; ++v) {
      const int j = v / 4, i = v % 4;
      EXPECT_EQ(int(get<0>(frag(v))), 16 * (tid / 32) + g + 8 * (i / 2)) << what << ": thread " << tid << " value " << v;
      EXPECT_EQ(int(get<1>(frag(v))), 8 * j + 2 * t + (i % 2)) << what << ": thread " << tid << " value " << v;
    }
  }
}

TEST(WgmmaLayout, AccumulatorsAreTheMmaSyncCFragmentPerWarp) {
  using cute::GMMA::Major;
  expect_c_is_mma_sync_c<cute::SM90_64x32x16_F32BF16BF16_SS<Major::K, Major::K>>(32, "m64n32k16 SS");
  expect_c_is_mma_sync_c<cute::SM90_64x64x16_F32BF16BF16_SS<Major::K, Major::K>>(64, "m64n64k16 SS");
  expect_c_is_mma_sync_c<cute::SM90_64x128x16_F32BF16BF16_SS<Major::K, Major::K>>(128, "m64n128k16 SS");
  expect_c_is_mma_sync_c<cute::SM90_64x256x16_F32BF16BF16_SS<Major::K, Major::K>>(256, "m64n256k16 SS");
}

}  // namespace
