// Warp-wide butterfly reductions shared by the CUDA kernels (device code only; include from .cu files).
// Every lane of the (full) warp gets the result. Tested through the kernels that use them
// (tests/kernels/test_cuda_ops.cpp, test_cuda_paged_attention.cpp, test_cuda_mla_decode.cpp).
#pragma once

namespace fp4moe::cuda {

inline constexpr unsigned kWarpFullMask = 0xffffffffu;

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(kWarpFullMask, v, o));
  return v;
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(kWarpFullMask, v, o);
  return v;
}

}  // namespace fp4moe::cuda
