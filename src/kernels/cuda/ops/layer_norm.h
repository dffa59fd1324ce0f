// LayerNorm with weight and bias on the GPU, BF16 rows with f32 math: the GLM-5 DSA indexer's key
// norm (nn.LayerNorm(index_head_dim, eps=1e-6) on wk(x)), the same formula as model::layer_norm
// (model/ops.h): y = (x - mean) * rsqrt(var + eps) * w + b, biased variance, two passes over the
// row (mean, then the centered sum of squares) as the CPU does.
// One warp per row (8 rows per 256-thread CTA), each lane owning elements lane, lane + 32, ...: y
// may alias x (a lane writes only the elements it read). Asynchronous on `stream`; arguments checked
// on the host (fp4moe::Error naming the values).
// Tested by tests/kernels/test_cuda_layer_norm.cpp (GPU vs model::layer_norm, label gpu).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

namespace fp4moe::cuda {

// x, y [n_rows, dim] with a row stride of `row_stride` elements (>= dim) for both; w, b [dim] f32.
void layer_norm_bf16(const __nv_bfloat16* x, const float* w, const float* b, int64_t n_rows, int64_t dim,
                     int64_t row_stride, float eps, __nv_bfloat16* y, cudaStream_t stream);

}  // namespace fp4moe::cuda
