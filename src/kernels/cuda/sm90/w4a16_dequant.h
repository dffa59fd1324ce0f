// NVFP4 weights in the W4A16 kernel layout (w4a16_weight_layout.h) -> row-major BF16 on the device,
// one expert at a time: the operand of a BF16 cuBLAS GEMM where that beats the W4A16 grouped GEMM
// (prefill: many tokens per expert / rows per Linear; the GPU MoE layer switches at
// moe::kNvfp4DequantMinRows rows per expert, GpuLinear at model::kLinearDequantMinRows rows). Exact up to the global scale:
//   out[r][k] = bf16_rn(f32(e2m1 x e4m3) x gs)
// (e2m1 x e4m3 has at most 6 significant bits, so the only roundings are the f32 product with the
// per-expert global scale and the bf16 round to nearest even). The GEMM result then equals the
// `--bf16-peer` path's (which uploads the same dequantized weights).
// Tested by tests/kernels/test_cuda_w4a16.cpp (W4A16Dequant: every code and scale, gate/up rows).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

namespace fp4moe::cuda::sm90 {

struct W4A16DequantArgs {
  const uint8_t* codes = nullptr;   // kernel layout, all experts (w4a16_repack / w4a16_repack_gate_up)
  const uint8_t* scales = nullptr;  // kernel layout, all experts
  const float* global_scales = nullptr;     // device [n_experts] (gate_up: gate_proj's)
  const float* global_scales_up = nullptr;  // gate_up: device [n_experts] of up_proj; nullptr = shared
  int64_t expert = 0, n = 0, k = 0;  // the expert to dequantize; its n x k weight (n = 2 I for gate_up)
  bool gate_up = false;  // rows interleaved by 8 (w4a16_repack_gate_up): out = gate rows 0..I-1, then up I..2I-1
  __nv_bfloat16* out = nullptr;  // [n, k] row-major (4 B aligned)
};

// Asynchronous on `stream`; throws fp4moe::Error naming the numbers on a bad shape (k % 16 != 0,
// n % 16 != 0 for gate_up, null pointers) and on launch errors. Capturable.
void w4a16_dequant_expert(const W4A16DequantArgs& args, cudaStream_t stream);

}  // namespace fp4moe::cuda::sm90
