// GLM-5 / DeepSeek-V3.2 DSA lightning indexer on the GPU (the CPU core is model/dsa_indexer.h):
// a paged indexer-key cache and the per-query top-k key selection that mla_prefill_attention reads.
//   I[i,t] = sum_h w[i,h] * ReLU((q[i,h] . k[t]) * head_dim^-0.5),  t <= pos_i
//   query row i keeps min(index_topk, pos_i + 1) keys: highest I first, ties to the lower position,
//   written ascending (model::dsa_select_topk's order); a query that keeps every causal key is not
//   scored (it gets 0..pos_i).
// Two kernels: dsa_index_scores_kernel (CTA: one query token x 256 keys; a warp scores one key at a
// time, lanes own head_dim / 32 dims, dot products in f32 summed per head by a warp butterfly) writes
// the scores of a query into its row of an f32 workspace; dsa_select_topk_kernel (CTA per query) finds
// the k-th largest score with a 4-pass 8-bit radix select over order-preserving uint32 keys
// (dsa_ordered_key), then compacts the winners in position order (ties at the threshold: the first
// ones by position), so the selection matches the CPU exactly whenever the scores do.
// The GPU sums in another order than the CPU: scores equal to ~1e-6 relative may order differently
// (near-ties); NaN scores are not supported.
//
// Layouts (device memory, row-major):
//   q       [n_tokens, n_heads, head_dim] bf16 (wq_b output, RoPE applied: rope FIRST in each head)
//   w       [n_tokens, n_heads] bf16 (weights_proj output, UNSCALED: the kernel multiplies by
//           weight_scale = n_heads^-0.5 in f32, as the CPU model does)
//   cache   [n_blocks, page_size, head_dim] bf16 or f32 (LayerNorm'd, RoPE'd keys; dsa_index_cache_append)
//   block_table / seq_lens / q_start as in mla_prefill.h (seq_lens include this step's tokens)
//   sel_offsets [n_tokens + 1] int32 (dsa_selection_offsets, uploaded), sel_idx [n_selected] int32:
//           the CSR that mla_prefill_attention takes
//   workspace f32 [n_seqs, chunk_tokens, max_seq_len] scores of one chunk of queries (see the cap below)
// Limits (refused by the host, naming the numbers; dsa_index_plan): head_dim 32, 64, 128 or 256;
// (n_heads * head_dim + n_heads) * 4 B of q/w in shared memory <= 48 KiB; max_seq_len <= 65535 * 256
// keys (grid.z); n_seqs <= 65535. Any index_topk >= 1 (the radix select has no key-count limit).
// Tested by tests/kernels/test_cuda_dsa_indexer.cpp (GPU vs model::dsa_select_topk, exact),
// test_cuda_mla_fusions.cpp (the fused key append vs its three launches) and
// tests/kernels/test_cuda_mla_host.cpp (offsets, ordered keys, radix digit pick, plan refusals).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "kernels/cuda/ops/attention_geometry.h"  // FP4MOE_ATTN_HD
#include "kernels/cuda/ops/mla_prefill.h"         // kDeviceErrorKeySelection
#include "kernels/cuda/ops/norm_rope.h"           // RopeStyle

namespace fp4moe::cuda {

struct DsaIndexerDims {
  int n_heads = 0;           // index_n_heads
  int head_dim = 0;          // index_head_dim
  int64_t index_topk = 0;    // keys kept per query
  float scale = 0.0f;        // head_dim^-0.5 (IndexerDims::softmax_scale)
  float weight_scale = 0.0f; // n_heads^-0.5 (IndexerDims::weight_scale), folded into w
};

struct DsaIndexCacheView {
  void* k = nullptr;           // [n_blocks, page_size, head_dim] of dtype
  DType dtype = DType::kBF16;  // kBF16 or kF32
  int64_t n_blocks = 0;
  int64_t page_size = 0;
  int head_dim = 0;
};

// Writes key rows k [n_tokens, head_dim] (element type = cache.dtype, token stride k_stride elements)
// into cache slots slots[t] = block * page_size + row (-1: skipped; >= n_blocks * page_size:
// kDeviceErrorKvSlot, skipped).
void dsa_index_cache_append(const void* k, int64_t k_stride, int64_t n_tokens, const int32_t* slots,
                            const DsaIndexCacheView& cache, uint32_t* error_flag, cudaStream_t stream);

// The indexer key branch's tail: for each of n_tokens rows of k [head_dim] (token stride k_stride),
// cache[slots[t]] = RoPE(LayerNorm(k_t)) (LayerNorm with ln_w, ln_b, eps; RoPE on dims [0, rope) at positions[t])
// in one launch (a warp a token), with the bits and flags of layer_norm_bf16 (in place) + rope_bf16 +
// dsa_index_cache_append; k is then not written (past 2^23 tokens: those three launches, in place on k). The
// cache must hold bf16 keys.
struct DsaKeyNormRope {
  const float* ln_w = nullptr;  // [head_dim]
  const float* ln_b = nullptr;
  float eps = 0.0f;
  int rope = 0;       // rotary dims (even, <= head_dim), the first of the row
  RopeAngles angles;  // positions [n_tokens]
};
void dsa_index_key_norm_rope_append(__nv_bfloat16* k, int64_t k_stride, int64_t n_tokens, const DsaKeyNormRope& nr,
                                    const int32_t* slots, const DsaIndexCacheView& cache, uint32_t* error_flag,
                                    cudaStream_t stream);

// ---- host-side planning (pure functions, tested on the CPU) ----

// CSR offsets of the selection for the queries of q_start / seq_lens (host copies): query row
// q_start[s] + j sits at position seq_len - q_len + j and keeps min(index_topk, pos + 1) keys.
// Fails naming the sequence when q_start decreases, q_len > seq_len, or the total exceeds int32.
std::vector<int32_t> dsa_selection_offsets(std::span<const int32_t> seq_lens, std::span<const int32_t> q_start,
                                           int64_t index_topk);

inline constexpr int kDsaScoreWarps = 8;
inline constexpr int kDsaKeysPerCta = 256;  // 32 keys per warp
inline constexpr int kDsaSelectThreads = 256;
inline constexpr int64_t kDsaMaxKeys = int64_t{65535} * kDsaKeysPerCta;  // grid.z of the score kernel

// Shared memory of the score CTA: the query's q [n_heads, head_dim] then w [n_heads], f32.
struct DsaScoreSmemLayout {
  int q_bytes = 0;
  int w_offset = 0;
  int w_bytes = 0;
  int total_bytes = 0;
};
FP4MOE_ATTN_HD constexpr DsaScoreSmemLayout dsa_score_smem_layout(int n_heads, int head_dim) {
  DsaScoreSmemLayout l;
  l.q_bytes = n_heads * head_dim * 4;
  l.w_offset = l.q_bytes;
  l.w_bytes = n_heads * 4;
  l.total_bytes = l.w_offset + l.w_bytes;
  return l;
}
static_assert(dsa_score_smem_layout(32, 128).total_bytes == 16512, "GLM-5: 32 x 128 q + 32 w");

// The score workspace is capped: the queries run in chunks of `chunk_tokens` query tokens per
// sequence (token j of every sequence in chunk j / chunk_tokens), each chunk's scores in rows
// [n_seqs, chunk_tokens, max_seq_len] f32 that its select pass reads before the next chunk is scored.
// kDsaWorkspaceBudgetBytes is what a model allocates (one 8,192-token prefill at 128k tokens of
// context would otherwise need 4 GiB); a chunk is one token at least, so the workspace is
// max(budget, n_seqs x max_seq_len x 4 B) at most.
inline constexpr size_t kDsaWorkspaceBudgetBytes = size_t{256} << 20;

// Query tokens per sequence and chunk for a workspace of `workspace_bytes`: min(max_q_len,
// workspace_bytes / (n_seqs x max_seq_len x 4)), at least 1 (0 when there is nothing to score).
int64_t dsa_index_chunk_tokens(int64_t n_seqs, int64_t max_q_len, int64_t max_seq_len, size_t workspace_bytes);

// The workspace a step needs with the budget: n_seqs x chunk_tokens x max_seq_len x 4 B.
size_t dsa_index_workspace_bytes(int64_t n_seqs, int64_t max_q_len, int64_t max_seq_len,
                                 size_t budget_bytes = kDsaWorkspaceBudgetBytes);

// The launches of both kernels per chunk: score grid (chunk_tokens, n_seqs, key chunks), select grid
// (chunk_tokens, n_seqs), the score CTA's shared memory; n_chunks = ceil(max_q_len / chunk_tokens).
// Fails (naming the numbers) outside the limits above, or when the workspace cannot hold one token
// of every sequence.
struct DsaIndexPlan {
  unsigned score_grid_x = 0, score_grid_y = 0, score_grid_z = 0;
  int score_smem_bytes = 0;
  unsigned select_grid_x = 0, select_grid_y = 0;
  int64_t chunk_tokens = 0;
  int64_t n_chunks = 0;
  std::string to_string() const;  // "scores 40x3x2 CTAs (16512 B smem), select 40x3, 1 chunk of 40 tokens"
};
DsaIndexPlan dsa_index_plan(const DsaIndexerDims& dims, int64_t n_seqs, int64_t max_q_len, int64_t max_seq_len,
                            size_t workspace_bytes = kDsaWorkspaceBudgetBytes);

// ---- the radix select's arithmetic (host+device; the CPU tests emulate the kernel with them) ----

// A uint32 whose unsigned order is the float order of x (-0 and +0 map to the same key, as they
// compare equal on the CPU); NaN is not ordered.
FP4MOE_ATTN_HD inline uint32_t dsa_ordered_key(float x) {
  if (x == 0.0f) return 0x80000000u;
  uint32_t b = 0;
#if defined(__CUDA_ARCH__)
  b = __float_as_uint(x);
#else
  std::memcpy(&b, &x, 4);
#endif
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

// One radix pass: hist[256] counts the digits of the keys still matching the prefix, `remaining`
// (>= 1, <= their total) of them are still to be taken, highest first. Returns the digit holding the
// remaining-th highest key and, in *n_greater, how many matching keys have a larger digit.
FP4MOE_ATTN_HD inline int dsa_radix_pick(const uint32_t* hist, int64_t remaining, int64_t* n_greater) {
  int64_t above = 0;
  for (int d = 255; d > 0; --d) {
    if (above + static_cast<int64_t>(hist[d]) >= remaining) {
      *n_greater = above;
      return d;
    }
    above += hist[d];
  }
  *n_greater = above;
  return 0;
}

// ---- the selection ----

struct DsaIndexerArgs {
  const __nv_bfloat16* q = nullptr;
  const __nv_bfloat16* w = nullptr;
  DsaIndexCacheView cache;  // read only here
  const int32_t* block_table = nullptr;
  int64_t max_blocks_per_seq = 0;
  const int32_t* seq_lens = nullptr;
  const int32_t* q_start = nullptr;
  int64_t n_seqs = 0;
  int64_t n_tokens = 0;     // host copy of q_start[n_seqs]
  int64_t max_q_len = 0;    // host copy of the longest q chunk
  int64_t max_seq_len = 0;  // host copy of the longest seq_len (the workspace row stride)
  const int32_t* sel_offsets = nullptr;  // [n_tokens + 1], dsa_selection_offsets
  int64_t n_selected = 0;                // host copy of sel_offsets[n_tokens]
  int32_t* sel_idx = nullptr;            // [n_selected], written
  uint32_t* error_flag = nullptr;
};

// Scores (into workspace, workspace_bytes of it: dsa_index_workspace_bytes(n_seqs, max_q_len,
// max_seq_len) or any size that holds one token per sequence) and selects, chunk by chunk.
// A seq_len above max_seq_len or the block table, or below q_len, sets kDeviceErrorSeqLen; offsets
// that do not hold min(index_topk, pos + 1) keys set kDeviceErrorKeySelection.
void dsa_index_select_topk(const DsaIndexerArgs& args, const DsaIndexerDims& dims, float* workspace,
                           size_t workspace_bytes, cudaStream_t stream);

}  // namespace fp4moe::cuda
