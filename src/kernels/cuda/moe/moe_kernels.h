// The non-GEMM kernels of the fused MoE layer on the GPU (moe/gpu_moe_layer.h strings them together
// around the expert GEMMs):
//   router_logits   logits[T, E] = x[T, H] (bf16) . wg[E, H]^T (f32), f32 accumulation
//   route_topk      the routing decision per token (route_math.h, the CPU router's algorithm)
//   dispatch_plan   per-expert offsets, row -> token and (token, slot) -> row, all on the device, in one
//                   block (no host sync); rows of an expert ordered by (token, slot) like moe/dispatch.h
//   gather_rows     xp[row] = x[row_token[row]]
//   swiglu          act = silu(gate) * up in f32, rounded to bf16 (the BF16 cuBLAS peer; the NVFP4
//                   path has it in the grouped GEMM's kSwiGlu epilogue)
//   combine         y[t] = sum over slots s in order of w[t, s] * down_out[row(t, s)] (+ shared[t]),
//                   one thread per (token, 8 outputs): deterministic, no atomics
//   fill_hash_bytes dummy weights made on the device (benchmarks: 256 experts are not quantized on the CPU)
// Every launcher checks its arguments (throws fp4moe::Error naming the numbers), launches on
// `stream` without synchronizing, and is CUDA-graph capturable. All pointers are device memory.
// Tested by tests/moe/test_gpu_moe_layer.cpp (GPU, label gpu: kernels vs moe::route and
// moe::DispatchPlan, the whole layer vs moe::MoeLayer) and tests/moe/test_gpu_route_math.cpp (CPU).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/cuda/moe/route_math.h"

namespace fp4moe::cuda::moe {

// H % 8 == 0 (16 B vector loads), H <= 2^30, 1 <= E <= 65535 (a grid row an expert). n_tokens may be 0.
void router_logits(const __nv_bfloat16* x, const float* wg, int64_t n_tokens, int64_t hidden, int n_experts,
                   float* logits, cudaStream_t stream);

// topk_idx / topk_weights [n_tokens, top_k]; bias [E] when p.has_bias. Throws on an invalid p
// (E % n_group, topk_group <= n_group <= 64, 1 <= top_k <= E).
void route_topk(const RouteParams& p, const float* logits, const float* bias, int64_t n_tokens, int32_t* topk_idx,
                float* topk_weights, cudaStream_t stream);

// Largest E dispatch_plan takes (its shared memory holds a counter per expert and warp).
constexpr int kMaxDispatchExperts = 4096;

// From topk_idx [n_tokens, top_k] (values in [0, E)): expert_offsets [E + 1] (expert e owns rows
// [offsets[e], offsets[e + 1])), row_token [n_tokens * top_k] (the token of each row) and entry_of
// [n_tokens * top_k] (the row of pair (t, s) at t * top_k + s). Optionally shared_offsets [2] =
// {0, n_tokens} (the E = 1 offsets of the shared expert's GEMM). One block; n_tokens may be 0.
void dispatch_plan(const int32_t* topk_idx, int64_t n_tokens, int top_k, int n_experts, int32_t* expert_offsets,
                   int32_t* row_token, int32_t* entry_of, int32_t* shared_offsets, cudaStream_t stream);

// xp[r, :] = x[row_token[r], :] for r < n_rows; H % 8 == 0.
void gather_rows(const __nv_bfloat16* x, const int32_t* row_token, int64_t n_rows, int64_t hidden,
                 __nv_bfloat16* xp, cudaStream_t stream);

// act[r, j] = bf16(silu(g) * u), g = gate[r * ld_in + j], u = up[r * ld_in + j], silu(g) = g / (1 + exp(-g)),
// for j < inter (act row stride inter). inter % 8 == 0, ld_in % 8 == 0 (gate/up 16 B aligned).
void swiglu(const __nv_bfloat16* gate, const __nv_bfloat16* up, int64_t ld_in, int64_t rows, int64_t inter,
            __nv_bfloat16* act, cudaStream_t stream);

// y[t, :] = bf16(sum_{s < top_k} w[t, s] * down_out[entry_of[t, s], :] + shared[t, :]) with the sum in
// f32 in slot order (shared may be nullptr). H % 8 == 0.
void combine(const __nv_bfloat16* down_out, const int32_t* entry_of, const float* topk_weights,
             const __nv_bfloat16* shared, int64_t n_tokens, int top_k, int64_t hidden, __nv_bfloat16* y,
             cudaStream_t stream);

// dst[i] = base + (hash(seed, i) & mask) for i < n: deterministic dummy bytes (e2m1 code pairs with
// base 0, mask 0xFF; e4m3 scales with e.g. base 0x30, mask 0x0F = 0.5 .. 1.875).
void fill_hash_bytes(uint8_t* dst, int64_t n, uint64_t seed, uint8_t base, uint8_t mask, cudaStream_t stream);

}  // namespace fp4moe::cuda::moe
