// Small element-wise kernels around the GPU model's Linears (BF16 activations):
//   - add_bias_bf16: y[r, c] = bf16(float(y[r, c]) + bias[c]) for the q/k/v biases of GLM-4.5 (the
//     GEMM writes x W^T in bf16, the f32 bias is added after; one extra rounding vs the CPU's f32);
// (A dense NVFP4 Linear calls the grouped GEMM without expert offsets: sm90/w4a16_grouped_gemm.h.)
// Asynchronous on `stream`, host-checked arguments (fp4moe::Error naming the values).
// Tested by tests/kernels/test_cuda_ops.cpp (GPU vs the CPU formula).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

namespace fp4moe::cuda {

// y [n_rows, n_cols] row-major with row stride `ld` elements (>= n_cols); bias [n_cols] f32.
void add_bias_bf16(__nv_bfloat16* y, const float* bias, int64_t n_rows, int64_t n_cols, int64_t ld,
                   cudaStream_t stream);

}  // namespace fp4moe::cuda
