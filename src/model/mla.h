// Multi-head latent attention (MLA, DeepSeek-V3 / GLM-5) on the CPU in f32: the attention core
// over a per-sequence latent cache, in two mathematically equal forms (spec §4.3):
//   - expanded (prefill): k_nope/v of every cached key are rebuilt with kv_b_proj, then ordinary
//     per-head attention over [k_nope | k_pe];
//   - absorbed (decode): q_nope is pushed through W_UK into the latent space and the output is
//     lifted back with W_UV, so keys are never expanded.
// The cache holds only the latent per token: c_kv (kv_lora_rank, after kv_a_layernorm) and k_pe
// (qk_rope_head_dim, interleaved-RoPE'd). A query attends to keys 0..pos (causal), or to the DSA
// selection for it when one is given (KeySelection, made by dsa_indexer.h).
// RoPE (model/ops.h) is applied by the caller before q_pe/k_pe reach this code.
// Tested by tests/model/test_glm5_attention.cpp (naive f64 reference vs both forms, dense and sparse).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace fp4moe::model {

// Dimensions of one MLA layer (config names).
struct MlaDims {
  int n_heads = 0;
  int kv_lora_rank = 0;
  int qk_nope_head_dim = 0;
  int qk_rope_head_dim = 0;
  int v_head_dim = 0;

  int qk_head_dim() const { return qk_nope_head_dim + qk_rope_head_dim; }
  // Rows of kv_b_proj per head: [k_nope | v].
  int kv_b_rows_per_head() const { return qk_nope_head_dim + v_head_dim; }
  // softmax scale qk_head_dim^-0.5 (rope_type default: no mscale).
  float softmax_scale() const;
};

// The latent KV cache of one layer for one sequence.
class MlaLatentCache {
 public:
  MlaLatentCache() = default;
  MlaLatentCache(int kv_lora_rank, int rope_dim) : kv_lora_rank_(kv_lora_rank), rope_dim_(rope_dim) {}

  int kv_lora_rank() const { return kv_lora_rank_; }
  int rope_dim() const { return rope_dim_; }
  int64_t n_tokens() const { return n_tokens_; }
  // Appends one token: c_kv [kv_lora_rank] (normed), k_pe [rope_dim] (rotated).
  void append(const float* c_kv, const float* k_pe);
  // Drops tokens n.. (n <= n_tokens), e.g. to roll back a rejected draft.
  void truncate(int64_t n);
  const float* c_kv(int64_t t) const { return c_kv_.data() + t * kv_lora_rank_; }
  const float* k_pe(int64_t t) const { return k_pe_.data() + t * rope_dim_; }
  // Bytes held per token (f32): what a real cache would hold per layer.
  int64_t bytes_per_token() const { return 4 * static_cast<int64_t>(kv_lora_rank_ + rope_dim_); }

 private:
  int kv_lora_rank_ = 0;
  int rope_dim_ = 0;
  int64_t n_tokens_ = 0;
  std::vector<float> c_kv_;
  std::vector<float> k_pe_;
};

// Keys chosen per query, CSR: query i attends to keys idx[offsets[i] .. offsets[i+1]) (ascending,
// each <= that query's position). Empty `offsets` means dense causal attention for every query.
struct KeySelection {
  std::vector<int64_t> offsets;
  std::vector<int32_t> idx;

  bool dense() const { return offsets.empty(); }
  int64_t n_queries() const { return offsets.empty() ? 0 : static_cast<int64_t>(offsets.size()) - 1; }
  std::span<const int32_t> keys_of(int64_t i) const {
    return {idx.data() + offsets[static_cast<size_t>(i)],
            static_cast<size_t>(offsets[static_cast<size_t>(i) + 1] - offsets[static_cast<size_t>(i)])};
  }
};

// One attention call: n_q queries of one sequence against its cache.
//   q      [n_q, n_heads, qk_head_dim], per head [q_nope | q_pe] with q_pe already rotated;
//   q_pos  [n_q] absolute positions; query i sees cache keys 0..q_pos[i] (all must be cached);
//   kv_b   f32 kv_b_proj weight [n_heads * (nope + v), kv_lora_rank], per head [k_nope rows | v rows];
//   keys   DSA selection (or dense);
//   out    [n_q, n_heads * v_head_dim] (the o_proj input).
struct MlaAttentionArgs {
  const MlaDims* dims = nullptr;
  const float* q = nullptr;
  const int64_t* q_pos = nullptr;
  int64_t n_q = 0;
  const MlaLatentCache* cache = nullptr;
  const float* kv_b = nullptr;
  const KeySelection* keys = nullptr;
  float* out = nullptr;
};

// Expanded form: rebuilds k_nope/v for the keys used (cost n_keys * n_heads * (nope+v) * rank).
void mla_attention_expanded(const MlaAttentionArgs& args);
// Absorbed form: score = (W_UK^T q_nope) . c_kv + q_pe . k_pe, out = W_UV (sum p c_kv).
void mla_attention_absorbed(const MlaAttentionArgs& args);
// Picks the cheaper form for the call (absorbed when few queries share many keys).
void mla_attention(const MlaAttentionArgs& args);

}  // namespace fp4moe::model
