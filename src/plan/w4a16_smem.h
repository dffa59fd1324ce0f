// Host-side wording of the sm90_nvfp4_w4a16_grouped_gemm shared-memory layout
// (plan/layout_sm90_w4a16.h): config names, the byte summary, and the one refusal computation
// shared by the kernel's launcher (cuda::sm90::w4a16_check_config) and the planner's rejection
// (kernel_families.cpp, check_smem). Tested by tests/plan/test_layouts.cpp and
// tests/kernels/test_cuda_w4a16_host.cpp.
#pragma once

#include <cstdint>
#include <string>

#include "plan/layout_sm90_w4a16.h"

namespace fp4moe::plan {

inline constexpr const char* kW4A16KernelName = "sm90_nvfp4_w4a16_grouped_gemm";

// "w4a16_swapab_m128n16k256_s4" (kPipeline), "w4a16_stream_m64n8_d8" (kStream)
std::string w4a16_config_name(const W4A16Config& c);

// Byte breakdown: "4 stages x (x_tile 8192 + w_tiles 16384 + w_scales 2048) + epilogue 4352 = 110848 B",
// or "invalid config (<rule>)".
std::string w4a16_smem_summary(const W4A16Config& c);

// Empty when `c` builds and its layout fits `smem_limit` bytes (the device's opt-in maximum per
// block); otherwise why not, with the numbers:
//   "config w4a16_swapab_m128n64k256_s6 needs 6 stages x (...) = 324608 B of shared memory
//    > 232448 B (the device's opt-in limit per block) by 92160 B"
//   "config w4a16_swapab_m96n8k256_s4 cannot be built: block_w (weight rows, MMA M) must be 64 or 128"
std::string w4a16_smem_refusal(const W4A16Config& c, uint32_t smem_limit);

// The weight shapes the kernel runs, one rule each for the repack, the launcher, the planner and the tune cache:
// K (input features) a positive multiple of the NVFP4 block (16), N (weight rows, output features) a positive
// multiple of 8 (the epilogue's 16 B output stores of 8 bf16). Empty when the value holds, else the sentence:
//   "K=100 must be a positive multiple of 16 (one NVFP4 block; K % 16 = 4)"
//   "N=4100 must be a positive multiple of 8 (16 B output stores; N % 8 = 4)"
inline constexpr int64_t kW4A16KMultiple = 16;
inline constexpr int64_t kW4A16NMultiple = 8;
std::string w4a16_k_refusal(int64_t k);
std::string w4a16_n_refusal(int64_t n);

}  // namespace fp4moe::plan
