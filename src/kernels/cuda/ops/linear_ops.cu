// Element-wise kernels around the GPU model's Linears (see linear_ops.h): one thread per element,
// grid-stride. Tested by tests/kernels/test_cuda_ops.cpp.
#include "kernels/cuda/ops/linear_ops.h"

#include <algorithm>

#include "core/error.h"
#include "kernels/cuda/cuda_check.h"

namespace fp4moe::cuda {

namespace {

constexpr int kCta = 256;
constexpr int64_t kMaxGrid = int64_t{1} << 16;

__global__ void add_bias_kernel(__nv_bfloat16* y, const float* __restrict__ bias, int64_t n_rows, int64_t n_cols,
                                int64_t ld) {
  const int64_t n = n_rows * n_cols;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kCta + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * kCta) {
    const int64_t r = i / n_cols, c = i % n_cols;
    __nv_bfloat16& v = y[r * ld + c];
    v = __float2bfloat16_rn(__fadd_rn(__bfloat162float(v), bias[c]));
  }
}

}  // namespace

void add_bias_bf16(__nv_bfloat16* y, const float* bias, int64_t n_rows, int64_t n_cols, int64_t ld,
                   cudaStream_t stream) {
  FP4MOE_CHECK(n_rows >= 0 && n_cols >= 0 && ld >= n_cols)
      << "add_bias_bf16: n_rows=" << n_rows << " n_cols=" << n_cols << " ld=" << ld << " (need ld >= n_cols >= 0)";
  FP4MOE_CHECK(y != nullptr && bias != nullptr) << "add_bias_bf16: null pointer (y " << y << ", bias " << bias << ")";
  if (n_rows == 0 || n_cols == 0) return;
  const int64_t blocks = std::min(kMaxGrid, (n_rows * n_cols + kCta - 1) / kCta);
  add_bias_kernel<<<static_cast<unsigned>(blocks), kCta, 0, stream>>>(y, bias, n_rows, n_cols, ld);
  FP4MOE_CUDA_CHECK(cudaGetLastError());
}

}  // namespace fp4moe::cuda
