// CausalLM::forward_one (see causal_lm.h).
#include "model/causal_lm.h"

namespace fp4moe::model {

std::vector<float> CausalLM::forward_one(KvState& state, std::span<const int32_t> tokens, bool all_logits) {
  const size_t rows = all_logits ? tokens.size() : 1;
  std::vector<float> logits(rows * static_cast<size_t>(vocab_size()));
  const SeqChunk chunk{&state, tokens, logits.data(), all_logits};
  forward(std::span<const SeqChunk>(&chunk, 1));
  return logits;
}

}  // namespace fp4moe::model
