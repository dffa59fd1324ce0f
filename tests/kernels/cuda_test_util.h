// Helpers shared by the GPU tests: skip (with the reason) when no usable GPU is visible, and
// RAII device buffers.
#pragma once

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device.h"

// GTEST_SKIP()s the calling test with the reason when there is no GPU the kernels can run on.
#define SKIP_WITHOUT_GPU()                                                                      \
  do {                                                                                          \
    std::string why_;                                                                           \
    if (!::fp4moe::cuda::cuda_device_available(&why_)) GTEST_SKIP() << "no usable GPU: " << why_; \
  } while (0)

namespace fp4moe::cuda::gpu_test {

struct CudaFree {
  void operator()(void* p) const { cudaFree(p); }
};

template <typename T>
using DevicePtr = std::unique_ptr<T, CudaFree>;

// An uninitialized device buffer of `count` elements (at least one, so empty problems get a valid pointer).
template <typename T>
DevicePtr<T> device_alloc(size_t count) {
  void* p = nullptr;
  FP4MOE_CUDA_CHECK(cudaMalloc(&p, std::max<size_t>(count, 1) * sizeof(T)));
  return DevicePtr<T>(static_cast<T*>(p));
}

// A device copy of `host`.
template <typename T>
DevicePtr<T> upload(const std::vector<T>& host) {
  DevicePtr<T> d = device_alloc<T>(host.size());
  if (!host.empty()) FP4MOE_CUDA_CHECK(cudaMemcpy(d.get(), host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice));
  return d;
}

}  // namespace fp4moe::cuda::gpu_test
