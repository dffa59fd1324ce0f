// DSA lightning indexer core (GLM-5 / DeepSeek-V3.2, spec §4.4) on the CPU in f32: scores every
// causal key of a query and keeps the top min(index_topk, pos+1) for the MLA attention.
//   I[s,t] = sum_h w[s,h] * ReLU( (q[s,h] . k[t]) * head_dim^-0.5 ),  t <= s
// q heads and keys are laid out [rope | nope] (rope FIRST, unlike MLA) with interleaved RoPE on the
// rope part; w = weights_proj(x) * n_heads^-0.5. The per-sequence cache holds one key per token.
// The projections (wq_b, wk + LayerNorm, weights_proj) live with the layer in glm5.cpp.
// Tested by tests/model/test_glm5_attention.cpp (naive reference, causal masking, top-k count).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "model/mla.h"

namespace fp4moe::model {

struct IndexerDims {
  int n_heads = 0;     // index_n_heads
  int head_dim = 0;    // index_head_dim
  int rope_dim = 0;    // qk_rope_head_dim (the first rope_dim of each head and of the key)
  int index_topk = 0;  // keys kept per query

  float softmax_scale() const;  // head_dim^-0.5
  float weight_scale() const;   // n_heads^-0.5, folded into w
};

// The indexer keys of one layer for one sequence: [n_tokens, head_dim] (normed, rotated).
class IndexerKeyCache {
 public:
  IndexerKeyCache() = default;
  explicit IndexerKeyCache(int head_dim) : head_dim_(head_dim) {}

  int head_dim() const { return head_dim_; }
  int64_t n_tokens() const { return n_tokens_; }
  void append(const float* k);
  void truncate(int64_t n);
  const float* key(int64_t t) const { return k_.data() + t * head_dim_; }

 private:
  int head_dim_ = 0;
  int64_t n_tokens_ = 0;
  std::vector<float> k_;
};

// Index scores of one query (q [n_heads, head_dim], w [n_heads]) against keys 0..pos:
// scores[0..pos] (pos + 1 values).
void dsa_index_scores(const IndexerDims& dims, const float* q, const float* w, const IndexerKeyCache& cache,
                      int64_t pos, float* scores);

// Top-k selection for n_q queries: q [n_q, n_heads, head_dim], w [n_q, n_heads], q_pos [n_q].
// Query i keeps min(index_topk, q_pos[i] + 1) keys among 0..q_pos[i], highest scores first,
// ties to the lower position; each key list is returned ascending. When every query keeps all its
// causal keys the result is still an explicit (not dense) selection.
KeySelection dsa_select_topk(const IndexerDims& dims, const float* q, const float* w, const int64_t* q_pos,
                             int64_t n_q, const IndexerKeyCache& cache);

// Throws (naming `what`, the query and the numbers) unless `keys` is a selection the indexer could
// have made for these queries: one list per query, exactly min(index_topk, q_pos[i] + 1) keys,
// ascending, distinct, each in 0..q_pos[i].
void check_key_selection(const KeySelection& keys, std::span<const int64_t> q_pos, int64_t index_topk,
                         const std::string& what);

}  // namespace fp4moe::model
