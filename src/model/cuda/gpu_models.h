// The GPU models (--device cuda): BF16 activations on the device, weights as the checkpoint stores
// them (NVFP4 Linears through the W4A16 GEMM, BF16 through cuBLAS), a paged KV cache, the same
// CausalLM interface as the CPU models (f32 logits copied to the host at the end of each step).
//
//   model::register_gpu_models();                    // once, before loading with Device::kCuda
//   LoadOptions o; o.device = Device::kCuda; o.gpu.max_tokens_per_step = 4096 + 64;
//   auto lm = model::load_model(dir, o);             // same loader, same dummy presets
//
// Glm4MoeForCausalLM (GLM-4.5/4.6/4.7) runs on the GPU: embedding, fused residual-add RMSNorm, q/k/v
// (+bias, optional q/k norm), NeoX partial RoPE, paged GQA attention (one kernel for prefill chunks,
// split-K flash-decoding for decode-only steps), o_proj, dense MLP (gate/up/SwiGLU/down) or the fused
// GPU MoE layer (moe/gpu_moe_layer.h), final norm and the lm_head (cuBLAS, f32 logits).
// GlmMoeDsaForCausalLM (GLM-5: MLA + DSA) runs on the GPU too (glm5_cuda.cpp): q/kv LoRA with their
// RMSNorms, interleaved RoPE, a paged latent cache [c_kv | k_pe] per layer and, on "full" indexer
// layers, a paged index-key cache (LayerNorm'd, RoPE'd wk(x)) on the same block ids; the DSA top-k
// selection (kernels/cuda/ops/dsa_indexer.h) when a sequence is longer than index_topk, reused by
// "shared" layers; absorbed MLA (mla_prefill_attention, or mla_decode_attention for a dense
// decode-only step); o_proj; dense MLP or the GPU MoE layer.
//
// One forward step: the host builds token ids, positions, KV slots and block tables, uploads them in
// one copy, the device runs every layer on one stream without host synchronization, then one
// synchronization reads the logits, the device error flag (bad ids / slots, kernels/cuda/ops/
// device_errors.h) and, for traces, the per-expert token counts and per-layer event timings.
// Tested by tests/model/test_gpu_model.cpp (label gpu: golden logits of both architectures, greedy
// vs the CPU model, prefill+decode == full forward, batching, a sparse DSA selection) and
// tests/model/test_gpu_kv_cache.cpp (block accounting).
#pragma once

#include <memory>

#include "format/safetensors.h"
#include "model/causal_lm.h"
#include "model/config.h"
#include "model/registry.h"

namespace fp4moe::model {

// Adds the GPU factories to the registry (idempotent).
void register_gpu_models();

// The GLM-4.5 GPU model (registered by register_gpu_models under Glm4MoeForCausalLM).
std::unique_ptr<CausalLM> create_glm4_moe_cuda(const ModelConfig& config, const format::TensorStore& store,
                                               const LoadOptions& options);

// The GLM-5 GPU model (registered by register_gpu_models under GlmMoeDsaForCausalLM).
std::unique_ptr<CausalLM> create_glm5_cuda(const ModelConfig& config, const format::TensorStore& store,
                                           const LoadOptions& options);

}  // namespace fp4moe::model
