// What the CUTLASS probes measure from CUTLASS's own types (host-only: sizeof and constants, no
// kernel is launched or instantiated for a device). Shared by the .cu probes and the gtest.
#pragma once

#include <cstdint>
#include <vector>

namespace fp4moe::plan::cutlass_check {

struct Measured {
  const char* name;                 // "sm120 128x256x128 nvfp4 NONE swap_ab=0"
  uint32_t m, n, k;
  bool mx;                          // MXFP8 x MXFP4 (else NVFP4 x NVFP4)
  bool swap_ab;                     // column-major C/D
  uint32_t epilogue_storage;        // sizeof(CollectiveEpilogue::SharedStorage)
  int stages;                       // CollectiveMainloop::DispatchPolicy::Stages (the builder's choice)
  uint32_t kernel_storage;          // GemmKernel::SharedStorageSize
};

std::vector<Measured> measure_sm120();
std::vector<Measured> measure_sm100();
// Offsets a device kernel computes from W4A16Layout of w4a16_swapab_m128n16k256_s4 (device_include.cu).
void layout_device_offsets(uint32_t out[4]);

}  // namespace fp4moe::plan::cutlass_check
