// FP4MOE_CUDA_CHECK(call): runs a CUDA runtime call and throws fp4moe::Error when it fails, with
// the error name and text, the call as written, file:line and the current device, e.g.
//   CUDA error cudaErrorInvalidValue (invalid argument) in `cudaMemcpy(...)` at x.cu:42
//   on device 0 (NVIDIA H200, sm_90)
// Tested by tests/kernels/test_cuda_nvfp4.cpp.
#pragma once

#include <cuda_runtime_api.h>

namespace fp4moe::cuda {

// Builds the message described above and throws fp4moe::Error.
[[noreturn]] void throw_cuda_error(cudaError_t err, const char* call, const char* file, int line);

}  // namespace fp4moe::cuda

#define FP4MOE_CUDA_CHECK(call)                                                  \
  do {                                                                           \
    const cudaError_t fp4moe_cuda_err_ = (call);                                 \
    if (fp4moe_cuda_err_ != cudaSuccess) {                                       \
      ::fp4moe::cuda::throw_cuda_error(fp4moe_cuda_err_, #call, __FILE__, __LINE__); \
    }                                                                            \
  } while (0)
