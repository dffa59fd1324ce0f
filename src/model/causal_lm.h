// CausalLM: the interface every model (Glm4MoeForCausalLM, GlmMoeDsaForCausalLM) implements on the
// CPU reference path, and the per-sequence KV state it owns.
//
// A forward step is batched over sequences so that the MoE layers see every token of the step at
// once (the serving engine relies on this):
//
//   auto a = lm->new_state(), b = lm->new_state();
//   std::vector<float> la(n_a * vocab), lb(vocab);
//   SeqChunk chunks[] = {{a.get(), prompt_a, la.data(), /*all_logits=*/true},
//                        {b.get(), prompt_b, lb.data(), /*all_logits=*/false}};
//   lm->forward(chunks);   // positions continue from each state's length(); states grow
//
// Logits are f32, [n_tokens, vocab] when all_logits, else [1, vocab] for the chunk's last token.
// Tested by tests/model/test_glm4_moe.cpp (golden logits, KV-cache decode, batching).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/error.h"
#include "model/config.h"
#include "moe/mlp.h"

namespace fp4moe::model {

// Per-sequence state (KV cache) created by the model that uses it. Its layout is the model's own
// business; the interface only exposes its length and size.
class KvState {
 public:
  virtual ~KvState() = default;
  virtual int64_t length() const = 0;       // tokens cached so far = position of the next token
  virtual void truncate(int64_t n_tokens) = 0;  // drop cached tokens >= n_tokens (n <= length())
  virtual size_t bytes() const = 0;         // memory held by the cache
  // A new state of the same model holding this state's first n_tokens tokens (n <= length()), for the
  // engine's prefix cache (engine/prefix_cache.h); a model may round n down to its page size (the
  // result's length() says), and this state may be dropped afterwards. nullptr: this kind of state
  // cannot be copied (the engine then runs without a prefix cache).
  virtual std::unique_ptr<KvState> copy_prefix(int64_t n_tokens) const {
    (void)n_tokens;
    return nullptr;
  }
};

// A token drawn on the device from the last token's logits (engine::sample_from given u; no penalties).
struct DeviceSampling {
  double u = 0.0;            // the request's uniform draw in [0, 1)
  double temperature = 1.0;  // > 0
  double top_p = 1.0;
  double min_p = 0.0;
  int64_t top_k = -1;        // <= 0: off
};

// One sequence's share of a batched forward step.
struct SeqChunk {
  KvState* state = nullptr;           // created by this model's new_state()
  std::span<const int32_t> tokens;    // >= 1 new tokens, appended after state->length()
  float* logits = nullptr;            // [tokens.size() or 1, vocab]; nullptr = no logits wanted
  bool all_logits = false;            // logits for every token (true) or only the last (false)
  // Greedy without logits: when set, the model writes the argmax (lowest index on ties, a NaN never
  // wins: engine::argmax_token) of the last token's logits here. Only for models whose
  // supports_argmax() is true (the GPU models: an int instead of a vocab-wide f32 row crosses PCIe).
  int32_t* argmax = nullptr;
  // With `argmax` set (and no logits): draw the token with these knobs instead of the argmax (the GPU
  // models: cuda::sample_rows), written to *argmax. Only for models whose supports_argmax() is true.
  const DeviceSampling* sample = nullptr;
};

// Per-layer routing statistics of one forward step (for MoE layers only).
struct MoeLayerTrace {
  int64_t layer = 0;
  std::vector<int64_t> tokens_per_expert;  // [n_routed_experts]
};

// Measured wall time of one part of one layer in one forward step (steady_clock on the CPU models;
// a GPU model times the same parts). Only filled when a trace is requested.
struct LayerTiming {
  int64_t layer = 0;
  std::string part;      // "attention", "mlp" (dense MLP) or "moe" (router + experts + shared expert);
                         // optionally GEMMs inside "moe": "moe.routed_gate_up", "moe.routed_down",
                         // "moe.shared_gate_up", "moe.shared_down" (read by `fp4moe analyze`)
  double seconds = 0.0;
};

struct ForwardTrace {
  std::vector<MoeLayerTrace> moe_layers;   // appended in layer order, one per MoE layer per step
  std::vector<LayerTiming> layer_times;    // appended in layer order, attention then mlp/moe per layer
  int64_t cuda_graph_steps = 0;            // steps that ran as a captured CUDA graph (GPU models)
};

// Sees the f32 input of every Linear the forward runs (calibration for `fp4moe quantize`):
// (module name e.g. "model.layers.1.mlp.experts.3.up_proj", x [rows, cols]). Expert Linears see
// only the rows routed to them (moe/mlp.h); attention Linears see all tokens of the step.
using LinearInputObserver = moe::LinearInputObserver;

// A forward failure blamed on one batch entry (the CPU models: the first entry whose rows hold a NaN / Inf after a
// sublayer; rows of different entries do not mix there). As with any forward error the states are left as they
// were; the engine fails that request alone and runs the others again (another entry at fault fails the same way
// on that step). A model that throws it must not answer SeqChunk::sample (the engine would draw again on the re-run).
class SequenceError : public Error {
 public:
  SequenceError(int64_t entry, const std::string& what) : Error(what), entry_(entry) {}
  int64_t entry() const { return entry_; }  // index into forward()'s batch

 private:
  int64_t entry_;
};

class CausalLM {
 public:
  virtual ~CausalLM() = default;

  virtual const ModelConfig& config() const = 0;
  int64_t vocab_size() const { return config().vocab_size; }

  virtual std::unique_ptr<KvState> new_state() const = 0;

  // Whether forward() honours SeqChunk::argmax (else it must be null).
  virtual bool supports_argmax() const { return false; }

  // One step over a batch of sequences (each chunk's state must be distinct). On error the
  // states are left as they were before the call; SequenceError names the one entry at fault.
  virtual void forward(std::span<const SeqChunk> batch, ForwardTrace* trace = nullptr) = 0;

  // Installs (or, with an empty function, removes) the Linear input observer.
  virtual void set_linear_observer(LinearInputObserver observer) = 0;

  // Bytes of weights held in memory, and a multi-line description of how each weight is stored.
  virtual size_t weight_bytes() const = 0;
  virtual std::string describe() const = 0;

  // Tokens of the KV cache preallocated at load (the GPU models' block pool), 0 when the cache grows with each
  // sequence (the CPU models): the engine sizes its block accounting to it when the pool was sized from GPU memory.
  virtual int64_t kv_pool_tokens() const { return 0; }
  // The preallocated pool in one line ("KV cache: N blocks x P tokens (... B)..."), "" without one.
  virtual std::string describe_kv_pool() const { return ""; }

  // Convenience: one sequence, returns the logits ([n, vocab] when all_logits, else [vocab]).
  std::vector<float> forward_one(KvState& state, std::span<const int32_t> tokens, bool all_logits);
};

}  // namespace fp4moe::model
