// CUDA device discovery and the CUDA error formatter behind FP4MOE_CUDA_CHECK.
// Tested by tests/kernels/test_cuda_nvfp4.cpp.
#include "kernels/cuda/device.h"

#include <cuda_profiler_api.h>
#include <cuda_runtime_api.h>

#include <cstdlib>
#include <mutex>
#include <sstream>
#include <string_view>
#include <unordered_map>

#include "core/error.h"
#include "kernels/cuda/cuda_check.h"

#ifndef FP4MOE_CUDA_SM_LIST
#error "FP4MOE_CUDA_SM_LIST (the built compute capabilities, e.g. \"90\") comes from src/kernels/cuda/CMakeLists.txt"
#endif

namespace fp4moe::cuda {

namespace {

std::string error_text(cudaError_t err) {
  std::ostringstream os;
  os << cudaGetErrorName(err) << " (" << cudaGetErrorString(err) << ")";
  return os.str();
}

std::string visible_devices() {
  const char* env = std::getenv("CUDA_VISIBLE_DEVICES");
  return std::string("CUDA_VISIBLE_DEVICES=") + (env != nullptr ? env : "<unset>");
}

bool sm_is_built(int sm) {
  std::string_view list = FP4MOE_CUDA_SM_LIST;
  while (!list.empty()) {
    const size_t comma = list.find(',');
    const std::string_view item = list.substr(0, comma);
    if (item == std::to_string(sm)) return true;
    if (comma == std::string_view::npos) break;
    list.remove_prefix(comma + 1);
  }
  return false;
}

}  // namespace

const char* cuda_built_sm_list() { return FP4MOE_CUDA_SM_LIST; }

std::string cuda_device_description(int device) {
  cudaDeviceProp props{};
  const cudaError_t err = cudaGetDeviceProperties(&props, device);
  std::ostringstream os;
  os << "device " << device;
  if (err != cudaSuccess) {
    cudaGetLastError();  // clear the (non-sticky) error this query left
    os << " (properties unavailable: " << error_text(err) << ")";
    return os.str();
  }
  os << " (" << props.name << ", sm_" << props.major << props.minor << ", "
     << props.multiProcessorCount << " SMs, " << (props.totalGlobalMem >> 30) << " GiB)";
  return os.str();
}

bool cuda_device_available(std::string* why) {
  auto fail = [&](const std::string& reason) {
    if (why != nullptr) *why = reason;
    return false;
  };
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    cudaGetLastError();
    return fail("cudaGetDeviceCount failed: " + error_text(err) + "; " + visible_devices());
  }
  if (count == 0) return fail("no CUDA device visible; " + visible_devices());
  int device = 0;
  err = cudaGetDevice(&device);
  if (err != cudaSuccess) {
    cudaGetLastError();
    return fail("cudaGetDevice failed: " + error_text(err));
  }
  int major = 0, minor = 0;
  err = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
  if (err == cudaSuccess) err = cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device);
  if (err != cudaSuccess) {
    cudaGetLastError();
    return fail("cudaDeviceGetAttribute(compute capability) failed on device " +
                std::to_string(device) + ": " + error_text(err));
  }
  if (!sm_is_built(major * 10 + minor)) {
    return fail(cuda_device_description(device) + " is not among the built targets (sm " +
                std::string(FP4MOE_CUDA_SM_LIST) +
                "; arch-specific 'a' code runs only on its exact compute capability)");
  }
  if (why != nullptr) why->clear();
  return true;
}

DeviceLimits current_device_limits() {
  static std::mutex mutex;
  static std::unordered_map<int, DeviceLimits> cache;
  int device = 0;
  FP4MOE_CUDA_CHECK(cudaGetDevice(&device));
  const std::lock_guard<std::mutex> lock(mutex);
  const auto it = cache.find(device);
  if (it != cache.end()) return it->second;
  DeviceLimits d;
  d.device = device;
  int optin = 0;
  FP4MOE_CUDA_CHECK(cudaDeviceGetAttribute(&d.sm_count, cudaDevAttrMultiProcessorCount, device));
  FP4MOE_CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  d.smem_optin_per_block = static_cast<uint32_t>(optin);
  cache.emplace(device, d);
  return d;
}

void throw_cuda_error(cudaError_t err, const char* call, const char* file, int line) {
  std::ostringstream os;
  os << "CUDA error " << error_text(err) << " in `" << call << "` at " << file << ":" << line;
  int device = -1;
  const cudaError_t dev_err = cudaGetDevice(&device);
  if (dev_err == cudaSuccess) {
    os << " on " << cuda_device_description(device);
    size_t free_bytes = 0, total_bytes = 0;
    if (err == cudaErrorMemoryAllocation && cudaMemGetInfo(&free_bytes, &total_bytes) == cudaSuccess) {
      os << "; device memory: " << (free_bytes >> 20) << " MiB free of " << (total_bytes >> 20) << " MiB";
    }
  } else {
    os << " (current device unknown: " << error_text(dev_err) << ")";
  }
  cudaGetLastError();  // clear the error this reports (or the failed cudaGetDevice's)
  throw Error(os.str());
}

void record_timing_event(CUevent_st* event, CUstream_st* stream) {
  // cudaEventRecordExternal is only legal inside a capture (outside it: cudaErrorIllegalState).
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  FP4MOE_CUDA_CHECK(cudaStreamIsCapturing(stream, &capture));
  if (capture == cudaStreamCaptureStatusActive) {
    FP4MOE_CUDA_CHECK(cudaEventRecordWithFlags(event, stream, cudaEventRecordExternal));
  } else {
    FP4MOE_CUDA_CHECK(cudaEventRecord(event, stream));
  }
}

void cuda_profiler_start() { FP4MOE_CUDA_CHECK(cudaProfilerStart()); }

void cuda_profiler_stop() { FP4MOE_CUDA_CHECK(cudaProfilerStop()); }

}  // namespace fp4moe::cuda
