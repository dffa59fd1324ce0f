// Glm4MoeForCausalLM (GLM-4.5 / 4.5-Air / 4.6 / 4.7) on the CPU, f32 activations, weights BF16 or
// NVFP4 per Linear as stored. Spec ../shared/spec/nvfp4-and-glm.md §4.2 (pre-norm decoder), §4.7
// (attention: q/k/v bias, optional per-head q/k RMSNorm before RoPE, NeoX RoPE on the first
// head_dim * partial_rotary_factor dims, GQA), §4.5 (MoE via moe::MoeLayer, dense first layers per
// mlp_layer_types / first_k_dense_replace). KV cache: ContiguousKvState with streams K and V.
// Tested by tests/model/test_glm4_moe.cpp against ../shared/golden/models/glm4_moe_tiny{,_nvfp4}.
#pragma once

#include <vector>

#include "model/registry.h"

namespace fp4moe::model {

// The factory and the tensor manifest (registered in registry.cpp under kArchGlm4Moe).
Architecture glm4_moe_architecture();

// Every tensor a Glm4MoeForCausalLM of this config reads.
std::vector<WeightSpec> glm4_moe_manifest(const ModelConfig& config);

}  // namespace fp4moe::model
