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
