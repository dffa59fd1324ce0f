// GQA attention over a paged KV cache on the GPU, BF16 in/out with f32 math, the same attention as
// the CPU GLM-4.x model (model/glm4_moe.cpp, Glm4MoeModel::attention): query head h reads KV head
// h / (n_heads / n_kv_heads); scores q.k * scale with scale = 1/sqrt(head_dim) applied after the
// dot product; softmax over keys 0..pos of the query (causal), no bias, no sink, no soft-cap (the
// q/k/v biases of attention_bias are added by the projections before this).
//
// Layouts (device memory, row-major):
//   q          [n_tokens, n_heads, head_dim]                      (token stride n_heads * head_dim)
//   k/v cache  [n_blocks, page_size, n_kv_heads, head_dim]        (one pool per layer)
//   block_table[n_seqs, max_blocks_per_seq] int32: sequence s's token p lives in block
//              block_table[s][p / page_size] at row p % page_size (blocks in any order; unused
//              entries are never read, pad them with -1)
//   seq_lens   [n_seqs] int32: tokens in the cache for s, this step's included (append first)
//   q_start    [n_seqs + 1] int32 (prefill): s's query tokens are rows q_start[s] .. q_start[s+1)
//              of q/out, at positions seq_len - q_len .. seq_len - 1
//   out        [n_tokens, n_heads, head_dim]
// head_dim % 32 == 0 and 32 <= head_dim <= 128 (a lane owns head_dim / 32 dims).
//
// One kernel serves both phases: a CTA takes (a tile of query tokens x a chunk of the GQA group) of
// one sequence and one KV head, and one split of the keys. Decode (one query per sequence) splits
// the keys across CTAs (flash-decoding); each split writes its normalized output and log-sum-exp to
// a workspace, and a second kernel merges them (o = sum_s e^{lse_s - M} o_s / sum_s e^{lse_s - M}).
// Bad ids/lengths set bits of error_flag (device_errors.h) instead of trapping.
// Tested by tests/kernels/test_cuda_paged_attention.cpp (GPU vs a CPU reference written like
// Glm4MoeModel::attention) and tests/kernels/test_cuda_ops_host.cpp (the host planning below).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>
#include <vector>

namespace fp4moe::cuda {

struct PagedKvCacheView {
  __nv_bfloat16* k = nullptr;
  __nv_bfloat16* v = nullptr;
  int64_t n_blocks = 0;
  int64_t page_size = 0;
  int64_t n_kv_heads = 0;
  int64_t head_dim = 0;
  int64_t n_slots() const { return n_blocks * page_size; }
};

// Writes k/v rows [n_tokens, n_kv_heads * head_dim] (token strides k_stride/v_stride elements, even)
// into cache slot slots[t] = block * page_size + row. A negative slot is skipped (a padded token);
// a slot >= n_slots sets kDeviceErrorKvSlot and is skipped.
void kv_cache_append_bf16(const __nv_bfloat16* k, int64_t k_stride, const __nv_bfloat16* v, int64_t v_stride,
                          int64_t n_tokens, const int32_t* slots, const PagedKvCacheView& cache,
                          uint32_t* error_flag, cudaStream_t stream);

// ---- host-side planning (pure functions, tested on the CPU) ----

// Keys one CTA processes per step of its loop (one key per lane).
inline constexpr int kAttnKeysPerTile = 32;
// Query rows (token x head) one CTA holds: 4 warps x 8 rows.
inline constexpr int kAttnWarps = 4;
inline constexpr int kAttnRowsPerWarp = 8;
inline constexpr int kAttnRowsPerCta = kAttnWarps * kAttnRowsPerWarp;

// How the query rows of one (sequence, KV head) are cut into CTAs.
struct AttentionRowTiling {
  int heads_per_cta = 0;   // min(group, 32)
  int n_head_chunks = 0;   // ceil(group / heads_per_cta)
  int tokens_per_cta = 0;  // 32 / heads_per_cta
};
AttentionRowTiling attention_row_tiling(int64_t n_heads, int64_t n_kv_heads);

// How the keys of the longest sequence are split across CTAs. A default-constructed split (0 x 0)
// is "not planned": every decode launcher rejects it, so take one from plan_decode_split /
// plan_mla_decode_split (or spell out both fields). The decode kernels cut each sequence into n_splits
// parts by its own length (attn_key_range, mla_decode_split_keys); keys_per_split is the plan's part of
// the longest list and bounds the lengths a launch takes (n_splits x keys_per_split).
struct DecodeSplit {
  int n_splits = 0;
  int64_t keys_per_split = 0;  // a multiple of kAttnKeysPerTile; n_splits * keys_per_split >= max_seq_len
  std::string to_string() const;  // "4 splits x 256 keys"
};
// The split launch limits: 1 <= n_splits <= kMaxLaunchSplits (grid.z), keys_per_split a positive
// multiple of kAttnKeysPerTile and <= kMaxKeysPerSplit (any int32 seq_len fits one split, and
// n_splits * keys_per_split fits int64). Fails naming `what` and the split otherwise.
inline constexpr int kMaxLaunchSplits = 65535;
inline constexpr int64_t kMaxKeysPerSplit = int64_t{1} << 31;
void check_decode_split(const char* what, const DecodeSplit& split);
// Enough CTAs to fill the GPU twice (n_sms SMs; n_seqs * n_kv_heads * head chunks CTAs without
// splitting), at least min_keys_per_split keys a split of the longest sequence (a shorter one's parts
// are shorter: attn_key_range), at most kMaxDecodeSplits splits. Always a
// valid launch (check_decode_split), also for max_seq_len 0 (an all-padding batch: 1 split x 32
// keys, the kernel writes zeros) and n_seqs 0 (an empty batch: 1 split).
inline constexpr int kMaxDecodeSplits = 64;
DecodeSplit plan_decode_split(int64_t n_seqs, int64_t n_heads, int64_t n_kv_heads, int64_t max_seq_len,
                              int n_sms, int64_t min_keys_per_split = 256);

// f32 workspace the split path needs (0 when n_splits == 1): partial outputs
// [n_tokens, n_heads, n_splits, head_dim] then log-sum-exps [n_tokens, n_heads, n_splits].
size_t attention_workspace_bytes(int64_t n_tokens, int64_t n_heads, int64_t head_dim, const DecodeSplit& split);

// The split with the fewest changes to `split` whose workspace for n_seqs sequences fits
// workspace_bytes: keys_per_split doubles (n_splits = ceil(max_seq_len / keys_per_split)) until it
// fits or one split remains (no workspace). For a model that preallocates a fixed workspace.
DecodeSplit cap_decode_split(const DecodeSplit& split, int64_t n_seqs, int64_t n_heads, int64_t head_dim,
                             int64_t max_seq_len, size_t workspace_bytes);

// [n_seqs, max_blocks] row-major, each sequence's blocks then -1 padding; max_blocks = the longest
// table (at least 1). Fails naming the sequence when a block id is outside [0, n_blocks).
std::vector<int32_t> pack_block_tables(const std::vector<std::vector<int32_t>>& tables, int64_t n_blocks,
                                       int64_t* max_blocks);
// The cache slot of token position `pos` of a sequence with block table `table` (fails naming pos
// when the table is too short).
int32_t kv_slot(const std::vector<int32_t>& table, int64_t pos, int64_t page_size);

// ---- attention ----

struct PagedAttentionArgs {
  const __nv_bfloat16* q = nullptr;
  PagedKvCacheView cache;  // k/v read only here
  const int32_t* block_table = nullptr;
  int64_t max_blocks_per_seq = 0;
  const int32_t* seq_lens = nullptr;
  int64_t n_seqs = 0;
  int64_t n_heads = 0;
  float scale = 0.0f;  // 1/sqrt(head_dim) for GLM-4.x
  __nv_bfloat16* out = nullptr;
  uint32_t* error_flag = nullptr;
};

// One query token per sequence (row s of q/out). split comes from plan_decode_split for the
// longest seq_len (it must pass check_decode_split); a seq_len above n_splits * keys_per_split or
// the block table sets kDeviceErrorSeqLen; a seq_len of 0 (a padded entry) writes zeros, also when
// every entry is padding. workspace holds attention_workspace_bytes(n_seqs, ...) bytes (may be null
// when split.n_splits == 1).
void paged_attention_decode_bf16(const PagedAttentionArgs& args, const DecodeSplit& split, float* workspace,
                                 cudaStream_t stream);

// Chunks of query tokens (q_start), each causal over its sequence's whole cache; n_tokens =
// q_start[n_seqs] (host copy), max_q_len the longest chunk. No key split.
void paged_attention_prefill_bf16(const PagedAttentionArgs& args, const int32_t* q_start, int64_t n_tokens,
                                  int64_t max_q_len, cudaStream_t stream);

}  // namespace fp4moe::cuda
