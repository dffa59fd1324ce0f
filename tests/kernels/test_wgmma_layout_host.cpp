// A fact about Hopper's wgmma that the planned W4A16 wgmma kernel relies on (issue #5, docs/gpu.md
// "Next: a wgmma W4A16 kernel"), read from CuTe's own description of the instruction (the pinned
// CUTLASS headers; no GPU needed): in the register-A form (RS) of wgmma m64nNk16 with bf16 inputs,
// thread tid of the warpgroup holds the A values that mma.sync m16n8k16's A fragment gives lane
// tid % 32, at rows shifted by 16 x (tid / 32). So the W4A16 kernels' in-register dequantization,
// built for mma.sync, can feed wgmma unchanged; only the activations (B) move to shared memory.
#include <gtest/gtest.h>

#include <cute/atom/mma_traits_sm90_gmma.hpp>
#include <cute/tensor.hpp>

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

}  // namespace
