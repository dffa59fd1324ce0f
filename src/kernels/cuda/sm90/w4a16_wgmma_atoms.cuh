// The wgmma instructions of the W4A16 wgmma kind (w4a16_wgmma.cu: both operands in shared memory), CuTe's
// atoms m64nNk16 bf16 x bf16 -> f32, both operands K-major: one call per k16 step and m64 block.
// Included only by .cu files of this folder.
#pragma once

#include <cute/arch/mma_sm90_gmma.hpp>

#include <cstdint>
#include <utility>

namespace fp4moe::cuda::sm90::w4a16_detail {

namespace gmma = cute::SM90::GMMA;

template <uint32_t N>
struct WgmmaAtoms;
template <>
struct WgmmaAtoms<32> {
  using SS = gmma::MMA_64x32x16_F32BF16BF16_SS<gmma::Major::K, gmma::Major::K>;
};
template <>
struct WgmmaAtoms<64> {
  using SS = gmma::MMA_64x64x16_F32BF16BF16_SS<gmma::Major::K, gmma::Major::K>;
};
template <>
struct WgmmaAtoms<128> {
  using SS = gmma::MMA_64x128x16_F32BF16BF16_SS<gmma::Major::K, gmma::Major::K>;
};
template <>
struct WgmmaAtoms<256> {
  using SS = gmma::MMA_64x256x16_F32BF16BF16_SS<gmma::Major::K, gmma::Major::K>;
};

// d (N / 2 f32 a thread) = A(desc_a) x B(desc_b)^T (+ d unless `first`): both operands in shared memory.
template <class Op, size_t... I>
__device__ __forceinline__ void wgmma_ss(uint64_t desc_a, uint64_t desc_b, float* d, bool first,
                                         std::index_sequence<I...>) {
  Op::fma(desc_a, desc_b, d[I]..., first ? gmma::ScaleOut::Zero : gmma::ScaleOut::One);
}

}  // namespace fp4moe::cuda::sm90::w4a16_detail
