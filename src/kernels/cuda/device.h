// CUDA device discovery: whether a usable GPU is present (and why not), and a one-line
// description of a device for logs and error messages.
// Tested by tests/kernels/test_cuda_nvfp4.cpp (which skips, printing the reason, without a GPU).
#pragma once

#include <cstdint>
#include <string>

struct CUevent_st;
struct CUstream_st;

namespace fp4moe::cuda {

// True when the CUDA driver works, at least one device is visible, and the current device's
// compute capability is one the kernels were built for (sm_90a code runs on sm_90 only).
// Otherwise false, with the reason in *why (when why != nullptr), e.g.
// "cudaGetDeviceCount failed: cudaErrorNoDevice (no CUDA-capable device is detected);
// CUDA_VISIBLE_DEVICES=<unset>".
bool cuda_device_available(std::string* why = nullptr);

// "device 0 (NVIDIA H200, sm_90, 132 SMs, 140 GiB)", or what went wrong asking.
std::string cuda_device_description(int device);

// What the launchers check a launch against, for the current device: queried once per device and
// cached (a cudaDeviceGetAttribute pair on every launch is host time inside each decode step).
// Throws fp4moe::Error when the query fails.
struct DeviceLimits {
  int device = 0;
  int sm_count = 0;
  uint32_t smem_optin_per_block = 0;  // cudaDevAttrMaxSharedMemoryPerBlockOptin
};
DeviceLimits current_device_limits();

// The compute capabilities (major*10+minor) the kernels were compiled for, e.g. "90".
const char* cuda_built_sm_list();

// Records a timing event on `stream` that also works inside a stream capture: there it becomes an
// external event record node (cudaEventRecordExternal), recorded at every replay, so a captured
// step's times read like an eager one's (a plain cudaEventRecord in a capture only orders the graph,
// and cudaEventElapsedTime then fails). Outside a capture, cudaEventRecord.
void record_timing_event(CUevent_st* event, CUstream_st* stream);

// cudaProfilerStart / cudaProfilerStop: the range a profiler started with `ncu --profile-from-start off`
// or `nsys --capture-range=cudaProfilerApi` records (bench-one-batch --profile-decode). Throws
// fp4moe::Error when the call fails.
void cuda_profiler_start();
void cuda_profiler_stop();

}  // namespace fp4moe::cuda
