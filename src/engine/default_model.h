// The embedded default model: a small synthetic GLM-5-architecture model (GlmMoeDsaForCausalLM:
// MLA + DSA indexer, 3 layers, hidden 256, 16 routed experts top-4 + 1 shared, NVFP4 expert
// weights) with dummy weights from a seed, and a built-in byte-level tokenizer (256 byte tokens +
// GLM special tokens, built in code as a tokenizer.json so the same Tokenizer class serves it, with
// a GLM-style chat template). `fp4moe serve` with no --model uses these, so it works on any machine.
// Tested by tests/engine/test_engine_models.cpp (DefaultModel.*).
#pragma once

#include <cstdint>
#include <memory>

#include <nlohmann/json.hpp>

#include "engine/tokenizer.h"
#include "model/causal_lm.h"

namespace fp4moe::engine {

inline constexpr const char* kDefaultModelName = "fp4moe-default-glm5-synthetic";

// config.json of the default model (vocab 272 = 256 bytes + 10 GLM specials + 6 reserved).
nlohmann::json default_model_config();
// tokenizer.json and tokenizer_config.json of the built-in byte-level tokenizer.
nlohmann::json default_tokenizer_json();
nlohmann::json default_tokenizer_config();

std::unique_ptr<model::CausalLM> make_default_model(uint64_t seed = 0);
std::shared_ptr<const Tokenizer> make_default_tokenizer();

}  // namespace fp4moe::engine
