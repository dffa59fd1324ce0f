// DeviceBuffer: an owning, move-only block of device memory (cudaMalloc/cudaFree) with typed views,
// for layers that preallocate their weights and scratch. Tested through moe/gpu_moe_layer.h's tests.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "kernels/cuda/cuda_check.h"

namespace fp4moe::cuda {

class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  // At least 256 bytes so that empty buffers still give valid, aligned pointers.
  // Out of memory: the error names the bytes asked for and the device's free / total memory.
  explicit DeviceBuffer(size_t bytes) : bytes_(bytes) {
    const cudaError_t err = cudaMalloc(&ptr_, bytes < 256 ? 256 : bytes);
    if (err != cudaSuccess) {
      const std::string call = "cudaMalloc of " + std::to_string(bytes) + " B (" + std::to_string(bytes >> 20) + " MiB)";
      throw_cuda_error(err, call.c_str(), __FILE__, __LINE__);
    }
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& o) noexcept : ptr_(std::exchange(o.ptr_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    if (this != &o) {
      reset();
      ptr_ = std::exchange(o.ptr_, nullptr);
      bytes_ = std::exchange(o.bytes_, 0);
    }
    return *this;
  }
  ~DeviceBuffer() { reset(); }

  template <typename T>
  static DeviceBuffer from_host(const std::vector<T>& host) {
    DeviceBuffer b(host.size() * sizeof(T));
    if (!host.empty()) FP4MOE_CUDA_CHECK(cudaMemcpy(b.ptr_, host.data(), b.bytes_, cudaMemcpyHostToDevice));
    return b;
  }
  template <typename T>
  std::vector<T> to_host(size_t count) const {
    std::vector<T> h(count);
    if (count > 0) FP4MOE_CUDA_CHECK(cudaMemcpy(h.data(), ptr_, count * sizeof(T), cudaMemcpyDeviceToHost));
    return h;
  }

  template <typename T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }
  size_t bytes() const { return bytes_; }
  bool empty() const { return ptr_ == nullptr; }

 private:
  void reset() {
    if (ptr_ != nullptr) cudaFree(ptr_);
    ptr_ = nullptr;
    bytes_ = 0;
  }
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace fp4moe::cuda
