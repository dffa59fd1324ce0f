// LayerNorm (weight + bias) on BF16 rows (see layer_norm.h): one warp per row (layer_norm_warp_row,
// layer_norm_row.cuh). Tested by tests/kernels/test_cuda_layer_norm.cpp.
#include <algorithm>

#include "core/error.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/ops/layer_norm.h"
#include "kernels/cuda/ops/layer_norm_row.cuh"
#include "kernels/cuda/warp_reduce.cuh"

namespace fp4moe::cuda {

namespace {

constexpr int kLnCta = 256;
constexpr int kLnRowsPerCta = kLnCta / 32;
constexpr int64_t kLnMaxGrid = int64_t{1} << 20;  // grid-stride over rows beyond this many CTAs

__global__ void __launch_bounds__(kLnCta)
    layer_norm_kernel(const __nv_bfloat16* x, const float* __restrict__ w, const float* __restrict__ b,
                      int64_t n_rows, int64_t dim, int64_t row_stride, float eps, __nv_bfloat16* y) {
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int64_t row_step = static_cast<int64_t>(gridDim.x) * kLnRowsPerCta;
  // The row is uniform per warp, so a warp leaves the loop together (full-mask shuffles stay valid).
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * kLnRowsPerCta + threadIdx.x / 32; row < n_rows;
       row += row_step) {
    const int64_t base = row * row_stride;
    layer_norm_warp_row(x + base, w, b, dim, eps, y + base, lane);
  }
}

}  // namespace

void layer_norm_bf16(const __nv_bfloat16* x, const float* w, const float* b, int64_t n_rows, int64_t dim,
                     int64_t row_stride, float eps, __nv_bfloat16* y, cudaStream_t stream) {
  FP4MOE_CHECK(n_rows >= 0 && dim >= 1 && row_stride >= dim && eps >= 0.0f)
      << "layer_norm_bf16: n_rows=" << n_rows << ", dim=" << dim << ", row_stride=" << row_stride << " (>= dim), eps="
      << eps;
  if (n_rows == 0) return;
  FP4MOE_CHECK(x != nullptr && w != nullptr && b != nullptr && y != nullptr)
      << "layer_norm_bf16: null pointer (x, w, b or y) for " << n_rows << " rows of " << dim;
  const int64_t ctas = std::min<int64_t>((n_rows + kLnRowsPerCta - 1) / kLnRowsPerCta, kLnMaxGrid);
  layer_norm_kernel<<<static_cast<unsigned>(ctas), kLnCta, 0, stream>>>(x, w, b, n_rows, dim, row_stride, eps, y);
  FP4MOE_CUDA_CHECK(cudaGetLastError());
}

}  // namespace fp4moe::cuda
