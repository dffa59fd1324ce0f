// GlmMoeDsaForCausalLM (GLM-5, model_type glm_moe_dsa) on the CPU in f32 (spec
// ../shared/spec/nvfp4-and-glm.md §4.1-§4.6):
//   h = x + o_proj(MLA(RMSNorm_in(x)))          MLA with q/kv LoRA, interleaved RoPE, DSA top-k keys
//   y = h + MLP_or_MoE(RMSNorm_post(h))          dense first layers, MoE (sigmoid, masked_fill -inf)
//   logits = lm_head(RMSNorm(y))
// Per sequence the KV state caches, per layer, the MLA latent (c_kv + k_pe, never expanded K/V) and,
// on "full" indexer layers, the indexer key; "shared" layers reuse the previous full layer's top-k.
// Prefill uses the expanded MLA form, decode the absorbed one (mla.h picks the cheaper); both give
// the logits of a full forward. Every Linear may be BF16 or NVFP4 as the checkpoint stores it.
// Tested by tests/model/test_glm5.cpp (golden glm5_tiny / glm5_tiny_nvfp4 logits, greedy decode
// through the cache, prefill+decode == full forward, batching, a sparse DSA selection).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "format/safetensors.h"
#include "model/causal_lm.h"
#include "model/config.h"
#include "model/mla.h"
#include "model/registry.h"

namespace fp4moe::model {

// The factory and the tensor manifest (registered in registry.cpp under kArchGlmMoeDsa).
Architecture glm_moe_dsa_architecture();

// Builds the model from a checkpoint (config from config.json; every tensor checked).
std::unique_ptr<CausalLM> create_glm_moe_dsa(const ModelConfig& config, const format::TensorStore& store,
                                             const LoadOptions& options);

// Every tensor a GlmMoeDsaForCausalLM of this config reads (indexer weights only on "full" layers;
// MTP layers beyond num_hidden_layers are not read).
std::vector<WeightSpec> glm_moe_dsa_manifest(const ModelConfig& config);

// Sees every DSA selection a forward makes (tests, statistics): the layer, the index of the chunk
// in the batch, the absolute positions of the chunk's queries and the keys each one attends to.
// On a "shared" layer `reused` is true and the selection is the previous full layer's.
using DsaSelectionObserver = std::function<void(int64_t layer, size_t chunk, std::span<const int64_t> q_pos,
                                                const KeySelection& keys, bool reused)>;

// Replaces the indexer's choice on "full" layers: given the layer, the chunk and its query
// positions, the keys each query attends to instead (checked by check_key_selection: exactly
// min(index_topk, pos + 1) distinct ascending keys <= pos per query). For tests that separate the
// top-k selection from everything else: a bf16 GPU forward pinned to the f32 CPU model's selections
// must match the golden logits even where bf16 rounding flips a near-tie of the index scores.
using DsaSelectionOverride =
    std::function<KeySelection(int64_t layer, size_t chunk, std::span<const int64_t> q_pos)>;

// The GLM-5 model class (CPU and GPU), exposed for the selection hooks; everything else is in
// CausalLM. Both hooks are for tests and statistics: on the GPU they synchronize the stream.
class GlmMoeDsaModel : public CausalLM {
 public:
  virtual void set_dsa_observer(DsaSelectionObserver observer) = 0;
  virtual void set_dsa_selection_override(DsaSelectionOverride source) = 0;
};

}  // namespace fp4moe::model
