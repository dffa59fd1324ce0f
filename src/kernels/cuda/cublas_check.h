// FP4MOE_CUBLAS_CHECK(call): runs a cuBLAS call and throws fp4moe::Error when it fails, with the
// status name and text, the call as written and file:line, e.g.
//   cuBLAS error CUBLAS_STATUS_INVALID_VALUE (an invalid numeric value was used as an argument) in
//   `cublasGemmEx(...)` at gpu_linear.cpp:88
// Used by every file that calls cuBLAS (the BF16 peers, the GPU model's BF16 Linears).
#pragma once

#include <cublas_v2.h>

#include "core/error.h"

#define FP4MOE_CUBLAS_CHECK(call)                                                                       \
  do {                                                                                                  \
    const cublasStatus_t fp4moe_cublas_st_ = (call);                                                    \
    FP4MOE_CHECK(fp4moe_cublas_st_ == CUBLAS_STATUS_SUCCESS)                                            \
        << "cuBLAS error " << cublasGetStatusName(fp4moe_cublas_st_) << " ("                            \
        << cublasGetStatusString(fp4moe_cublas_st_) << ") in `" << #call << "` at " << __FILE__ << ":" \
        << __LINE__;                                                                                    \
  } while (0)

namespace fp4moe::cuda {

// Binds `stream` to `handle` unless it already is: cublasSetStream resets a workspace given with
// cublasSetWorkspace to cuBLAS's default pool, and a CUDA graph capture must not make cuBLAS
// allocate one (the GPU models bind their stream and a fixed workspace once, see gpu_step.h).
inline void cublas_bind_stream(cublasHandle_t handle, cudaStream_t stream) {
  cudaStream_t current = nullptr;
  FP4MOE_CUBLAS_CHECK(cublasGetStream(handle, &current));
  if (current != stream) FP4MOE_CUBLAS_CHECK(cublasSetStream(handle, stream));
}

}  // namespace fp4moe::cuda
