// Helpers shared by the GPU tests: skip (with the reason) when no usable GPU is visible, and
// RAII device buffers, bf16 test data and copies back.
#pragma once

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "kernels/cuda/cublas_check.h"
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

// A cuBLAS handle for the test (default stream).
class CublasHandle {
 public:
  CublasHandle() { FP4MOE_CUBLAS_CHECK(cublasCreate(&h_)); }
  ~CublasHandle() { cublasDestroy(h_); }
  CublasHandle(const CublasHandle&) = delete;
  CublasHandle& operator=(const CublasHandle&) = delete;
  cublasHandle_t get() const { return h_; }

 private:
  cublasHandle_t h_ = nullptr;
};

// A device copy of `host`.
template <typename T>
DevicePtr<T> upload(const std::vector<T>& host) {
  DevicePtr<T> d = device_alloc<T>(host.size());
  if (!host.empty()) FP4MOE_CUDA_CHECK(cudaMemcpy(d.get(), host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice));
  return d;
}

// `n` elements of device memory copied back.
template <typename T>
std::vector<T> download(const T* d, size_t n) {
  std::vector<T> h(n);
  if (n > 0) FP4MOE_CUDA_CHECK(cudaMemcpy(h.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost));
  return h;
}

// n bf16 bit patterns of N(0, sd^2) values, and their f32 values.
inline std::vector<uint16_t> random_bf16(size_t n, std::mt19937_64& rng, float sd = 1.0f) {
  std::normal_distribution<float> d(0.0f, sd);
  std::vector<uint16_t> v(n);
  for (auto& x : v) x = f32_to_bf16(d(rng));
  return v;
}
inline std::vector<float> to_f32(const uint16_t* p, size_t n) {
  std::vector<float> f(n);
  for (size_t i = 0; i < n; ++i) f[i] = bf16_to_f32(p[i]);
  return f;
}
inline std::vector<float> to_f32(const std::vector<uint16_t>& v) { return to_f32(v.data(), v.size()); }

// bf16 bit patterns as the kernels' __nv_bfloat16 pointers.
template <typename T>
const __nv_bfloat16* cbf(const T* p) {
  return reinterpret_cast<const __nv_bfloat16*>(p);
}
inline __nv_bfloat16* bf(uint16_t* p) { return reinterpret_cast<__nv_bfloat16*>(p); }

}  // namespace fp4moe::cuda::gpu_test
