// nvfp4_dequant_to_bf16: one thread per 16-element NVFP4 block. Because n_cols % 16 == 0, the
// blocks of a row-major [N, K] matrix are consecutive in flat order, so block b owns codes bytes
// [8b, 8b+8), scale byte b and outputs [16b, 16b+16): one 8-byte load, one 1-byte load and two
// 16-byte stores per thread, no shared memory. The decoders are the constexpr ones of
// format/nvfp4.h, shared with the CPU reference.
// Tested by tests/kernels/test_cuda_nvfp4.cpp (bit for bit against the CPU dequantization).
#include "kernels/cuda/nvfp4_dequant.h"

#include <algorithm>

#include "core/error.h"
#include "format/nvfp4.h"
#include "kernels/cuda/cuda_check.h"

namespace fp4moe::cuda {

namespace {

constexpr int kThreadsPerCta = 256;
// Grid cap; the kernel grid-strides over the rest (2^20 CTAs x 256 threads = 2^28 blocks per pass).
constexpr int64_t kMaxCtas = int64_t{1} << 20;

__global__ void __launch_bounds__(kThreadsPerCta)
    nvfp4_dequant_to_bf16_kernel(const uint8_t* __restrict__ packed,
                                 const uint8_t* __restrict__ scales, float global_scale,
                                 int64_t n_blocks, __nv_bfloat16* __restrict__ out) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t b = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; b < n_blocks;
       b += stride) {
    const uint2 codes = *reinterpret_cast<const uint2*>(packed + b * 8);
    // ModelOpt order: f32(scale) * global scale first, then e2m1 value times that product.
    const float block_scale = format::e4m3_to_f32(scales[b]) * global_scale;
    uint32_t pairs[8];  // bf16 pairs; the low half holds the even element (lower address)
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const uint32_t word = j < 4 ? codes.x : codes.y;
      const uint8_t byte = static_cast<uint8_t>(word >> (8 * (j % 4)));
      const __nv_bfloat162 v =
          __floats2bfloat162_rn(format::e2m1_to_f32(byte & 0xF) * block_scale,
                                format::e2m1_to_f32(byte >> 4) * block_scale);
      pairs[j] = *reinterpret_cast<const uint32_t*>(&v);
    }
    uint4* dst = reinterpret_cast<uint4*>(out + b * 16);
    dst[0] = make_uint4(pairs[0], pairs[1], pairs[2], pairs[3]);
    dst[1] = make_uint4(pairs[4], pairs[5], pairs[6], pairs[7]);
  }
}

}  // namespace

void nvfp4_dequant_to_bf16(const uint8_t* packed, const uint8_t* scales, float global_scale,
                           int64_t n_rows, int64_t n_cols, __nv_bfloat16* out,
                           cudaStream_t stream) {
  FP4MOE_CHECK(n_rows >= 0 && n_cols >= 0 && n_cols % format::kNvfp4BlockSize == 0)
      << "nvfp4_dequant_to_bf16: N=" << n_rows << ", K=" << n_cols
      << " (K must be a non-negative multiple of " << format::kNvfp4BlockSize << ")";
  const int64_t n_blocks = n_rows * (n_cols / format::kNvfp4BlockSize);
  if (n_blocks == 0) return;
  FP4MOE_CHECK(packed != nullptr && scales != nullptr && out != nullptr)
      << "nvfp4_dequant_to_bf16: null pointer for N=" << n_rows << ", K=" << n_cols
      << " (packed " << static_cast<const void*>(packed) << ", scales "
      << static_cast<const void*>(scales) << ", out " << static_cast<const void*>(out) << ")";
  FP4MOE_CHECK(reinterpret_cast<uintptr_t>(packed) % 8 == 0 &&
               reinterpret_cast<uintptr_t>(out) % 16 == 0)
      << "nvfp4_dequant_to_bf16: packed " << static_cast<const void*>(packed)
      << " must be 8-byte and out " << static_cast<const void*>(out)
      << " 16-byte aligned (vector loads/stores)";
  const int64_t ctas = std::min((n_blocks + kThreadsPerCta - 1) / kThreadsPerCta, kMaxCtas);
  nvfp4_dequant_to_bf16_kernel<<<static_cast<unsigned>(ctas), kThreadsPerCta, 0, stream>>>(
      packed, scales, global_scale, n_blocks, out);
  FP4MOE_CUDA_CHECK(cudaGetLastError());
}

}  // namespace fp4moe::cuda
