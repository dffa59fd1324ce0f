// The GPU table: per product, the compute capability, shared-memory limits, SM count, tensor-core
// features and the roofline numbers the cost model and the decode economics use. One table
// (gpu_table.cpp); `find_gpu("h200")`, `find_gpu("sm_120")`. With a GPU present (built with
// FP4MOE_HAVE_CUDA and cudaGetDeviceProperties succeeds), `query_runtime_gpu()` returns the table
// entry with the runtime's values written over it and every disagreement listed.
// Tested by tests/plan/test_gpu_table.cpp.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace fp4moe::plan {

enum GpuFeature : uint32_t {
  kMmaSync = 1u << 0,        // mma.sync (sm_80+)
  kWgmma = 1u << 1,          // warpgroup MMA (sm_90a only)
  kTcgen05 = 1u << 2,        // tcgen05 / UMMA with tensor memory (sm_100a / sm_103a)
  kBlockScaledFp4 = 1u << 3, // block-scaled FP4 MMA (sm_100: tcgen05.mma.kind::mxf4nvf4; sm_120: mma.sync .kind::mxf4nvf4)
  kTma = 1u << 4,            // cp.async.bulk.tensor (sm_90+)
  kFp8 = 1u << 5,            // FP8 tensor cores (sm_89+)
};

struct GpuSpec {
  std::string name;              // canonical product key, e.g. "h200"
  std::string product;           // marketing name
  int sm = 0;                    // compute capability x10 + minor, e.g. 90, 120
  uint32_t smem_per_sm = 0;      // bytes
  uint32_t smem_optin_per_block = 0;  // cudaDevAttrMaxSharedMemoryPerBlockOptin
  uint32_t smem_reserved_per_block = 0;
  uint32_t smem_default_per_block = 49152;
  int n_sms = 0;
  uint32_t features = 0;
  double bf16_dense_tflops = 0;  // dense tensor peak with fp32 accumulation
  double fp4_dense_tflops = 0;   // dense block-scaled FP4 peak; 0 without FP4 tensor cores
  double hbm_gbps = 0;           // memory bandwidth, GB/s (1e9)
  std::string source;            // where the numbers come from

  std::string sm_name() const;   // "sm_90"
  bool has(GpuFeature f) const { return (features & f) != 0; }
  std::string features_string() const;  // "mma.sync wgmma tma fp8"
};

// Every product in the table, in table order.
const std::vector<GpuSpec>& gpu_table();

// Finds by product name ("h200", "rtx-pro-6000", "gb10", "dgx-spark", case-insensitive, '_' or
// '-' alike) or by arch ("sm_120", "sm120", "120": the first product of that arch). nullopt when
// unknown; `gpu_names()` lists what is accepted.
std::optional<GpuSpec> find_gpu(std::string_view name);
// Like find_gpu but throws fp4moe::Error listing the accepted names.
GpuSpec require_gpu(std::string_view name);
std::string gpu_names();

// What the CUDA runtime reports for one device.
struct RuntimeGpu {
  std::string name;  // cudaDeviceProp::name
  int sm = 0;
  uint32_t smem_per_sm = 0, smem_optin_per_block = 0, smem_reserved_per_block = 0, smem_default_per_block = 0;
  int n_sms = 0;
};

// `base` with the runtime's values written over it; each field that differs from the table is
// described in `disagreements` ("smem_optin_per_block: table 101376, runtime 99328").
struct ResolvedGpu {
  GpuSpec spec;
  std::vector<std::string> disagreements;
  bool from_runtime = false;
};
ResolvedGpu merge_runtime(const GpuSpec& base, const RuntimeGpu& rt);

// The runtime's view of device `device`. nullopt with `why` set when the build has no CUDA
// ("built without CUDA"), no device is visible, or the query fails (with the CUDA error name).
std::optional<RuntimeGpu> query_runtime_gpu(int device, std::string* why);

// The table entry for a runtime device: by product name in cudaDeviceProp::name when it
// matches, otherwise the first product of its arch, otherwise an entry built from the runtime.
ResolvedGpu resolve_runtime_gpu(const RuntimeGpu& rt);

}  // namespace fp4moe::plan
