// NVFP4 -> BF16 dequantization on the GPU (weights for W4A16 paths and for tests of the GEMMs):
//   out[n][k] = bf16_rn(e2m1(code[n][k]) * (f32(e4m3 scale[n][k/16]) * global_scale))
// bit for bit what the CPU reference format::nvfp4_dequantize_bf16 gives (same decode functions,
// same product order, round to nearest even).
// Tested by tests/kernels/test_cuda_nvfp4.cpp.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

namespace fp4moe::cuda {

// All pointers are device memory, row-major:
//   packed  [n_rows, n_cols/2]  e2m1 codes, low nibble = even column (8-byte aligned)
//   scales  [n_rows, n_cols/16] e4m3fn block scales, linear (not swizzled)
//   out     [n_rows, n_cols]    bf16 (16-byte aligned)
// n_cols % 16 == 0. Asynchronous on `stream`; launch errors throw fp4moe::Error.
void nvfp4_dequant_to_bf16(const uint8_t* packed, const uint8_t* scales, float global_scale,
                           int64_t n_rows, int64_t n_cols, __nv_bfloat16* out,
                           cudaStream_t stream);

}  // namespace fp4moe::cuda
