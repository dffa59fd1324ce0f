// GLM-5 / DeepSeek-V3 MLA attention on the GPU for MANY query tokens per sequence (prefill, chunked
// prefill, and decode with a DSA key selection), in the absorbed form of model/mla.cpp
// (mla_attention_absorbed) over the paged latent cache of mla_decode.h:
//   latent[i,h] = sum_{t in keys(i)} softmax_t((q_lat[i,h] . [c_kv_t | k_pe_t]) * scale) c_kv_t
// keys(i) is 0..pos_i (dense causal) or the query's DSA selection, a CSR on the device:
//   sel_offsets [n_tokens + 1] int32, sel_idx [sel_offsets[n_tokens]] int32; query row i attends to
//   keys sel_idx[sel_offsets[i] .. sel_offsets[i+1]) (each in [0, pos_i]; ascending as the indexer
//   writes them, though any order gives the same softmax up to f32 rounding). Null offsets: dense.
// Steps 1 and 3 are mla_decode.h's mla_absorb_q / mla_project_v: both take ROWS of
// [n_heads, ...] (their `n_seqs` argument is just a row count), so pass n_tokens there.
//
// Layouts (device memory, row-major):
//   q_lat   [n_tokens, n_heads, rank + rope] f32 (mla_absorb_q output; q_pe rotated)
//   cache   [n_blocks, page_size, rank + rope] bf16 (mla_cache_append_bf16 writes it)
//   block_table / seq_lens as in paged_attention.h; seq_lens count this step's tokens (append first)
//   q_start [n_seqs + 1] int32: sequence s's queries are rows q_start[s] .. q_start[s+1) (q_start[0]
//           = 0, q_start[n_seqs] = n_tokens), at positions seq_len - q_len .. seq_len - 1
//   latent  [n_tokens, n_heads, rank] f32 (mla_project_v input)
// The CTA is mla_mma_attention.cuh's (mma.sync tensor cores, mla_mma_smem_layout; the decode kernel has its own wgmma
// CTA): 16 heads of ONE query token x one split of that token's key list; rank + rope must be a multiple of 16.
// Split-K over the key list (like decode) is optional: plan_mla_prefill_split picks 1 split for a
// big prefill and more for few tokens (a DSA decode step); workspace and merge as in decode.
//
// Which call the GPU GLM-5 model makes:
//   prefill / chunked prefill (any layer): mla_prefill_attention with the indexer's selection;
//   decode, dense (no DSA or every seq_len <= index_topk): mla_decode_attention (mla_decode.h);
//   decode with a DSA selection: mla_prefill_attention with q_start = 0, 1, ..., n_seqs (q_len 1;
//     a padded entry has seq_len 0 and q_len 0) and split = plan_mla_prefill_split(n_seqs, heads,
//     min(index_topk, max_seq_len), n_sms).
// Bad ids/lengths/selections set error_flag bits (device_errors.h, incl. kDeviceErrorKeySelection).
// Tested by tests/kernels/test_cuda_mla_prefill.cpp (GPU vs model::mla_attention_absorbed, dense
// and sparse) and tests/kernels/test_cuda_mla_host.cpp (CTA geometry, layout, split planning).
#pragma once

#include "kernels/cuda/ops/device_errors.h"

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/cuda/ops/attention_geometry.h"
#include "kernels/cuda/ops/mla_decode.h"
#include "kernels/cuda/ops/paged_attention.h"

namespace fp4moe::cuda {

// kDeviceErrorKeySelection (device_errors.h): a selected key outside [0, pos] of its query, or
// selection offsets that are negative, decreasing, past n_selected, or hold more keys than pos + 1
// (set by mla_prefill_attention; the DSA indexer sets it when its offsets do not hold
// min(index_topk, pos + 1) keys).


// grid.x = token * n_chunks + chunk (token within its sequence's q chunk, chunk of 16 heads).
struct MlaPrefillCta {
  int64_t token;
  int chunk;
};
FP4MOE_ATTN_HD inline MlaPrefillCta mla_prefill_cta(uint32_t block_x, int n_chunks) {
  return {static_cast<int64_t>(block_x / static_cast<uint32_t>(n_chunks)),
          static_cast<int>(block_x % static_cast<uint32_t>(n_chunks))};
}

// List indices [begin, end) of a query's key list (n_keys long) that split `split` walks.
FP4MOE_ATTN_HD inline void mla_split_key_range(int64_t n_keys, int split, int64_t keys_per_split, int64_t* begin,
                                               int64_t* end) {
  *begin = static_cast<int64_t>(split) * keys_per_split;
  const int64_t e = *begin + keys_per_split;
  *end = e < n_keys ? e : n_keys;
  if (*end < *begin) *end = *begin;
}

// Splits of the key lists for n_tokens queries of n_heads heads whose longest key list holds
// max_keys_per_query keys (dense: the longest seq_len; DSA: min(index_topk, longest seq_len)):
// plan_mla_split for the mma.sync CTA (kMlaMmaCtasPerSm an SM, 32-key tiles) with one row per query token (1 split
// once the tokens fill the GPU).
inline DecodeSplit plan_mla_prefill_split(int64_t n_tokens, int64_t n_heads, int64_t max_keys_per_query, int n_sms,
                                          int64_t min_keys_per_split = 256) {
  return plan_mla_split(n_tokens, n_heads, max_keys_per_query, n_sms, min_keys_per_split, kMlaMmaCtasPerSm,
                        kAttnKeysPerTile);
}
// f32 workspace of the split path (0 for one split): [n_tokens, n_heads, n_splits, rank] + lse.
inline size_t mla_prefill_workspace_bytes(int64_t n_tokens, const MlaDecodeDims& dims, const DecodeSplit& split) {
  return mla_decode_workspace_bytes(n_tokens, dims, split);
}

struct MlaPrefillArgs {
  const float* q_lat = nullptr;
  MlaCacheView cache;  // read only here
  const int32_t* block_table = nullptr;
  int64_t max_blocks_per_seq = 0;
  const int32_t* seq_lens = nullptr;
  const int32_t* q_start = nullptr;
  int64_t n_seqs = 0;
  int64_t n_tokens = 0;   // host copy of q_start[n_seqs]
  int64_t max_q_len = 0;  // host copy of the longest q chunk
  const int32_t* sel_offsets = nullptr;  // [n_tokens + 1]; null: dense causal
  const int32_t* sel_idx = nullptr;      // [n_selected]
  int64_t n_selected = 0;                // host copy of sel_offsets[n_tokens]
  float* latent = nullptr;
  uint32_t* error_flag = nullptr;
};

// latent for every query row. split: plan_mla_prefill_split (a query whose key list is longer than
// n_splits * keys_per_split sets kDeviceErrorSeqLen); workspace: mla_prefill_workspace_bytes
// (null for one split). A query with an empty key list gets zeros (the CPU refuses it).
void mla_prefill_attention(const MlaPrefillArgs& args, const MlaDecodeDims& dims, const DecodeSplit& split,
                           float* workspace, cudaStream_t stream);

}  // namespace fp4moe::cuda
