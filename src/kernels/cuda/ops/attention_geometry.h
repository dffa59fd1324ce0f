// The index arithmetic of the paged attention kernel (paged_attention.cu), as host+device functions
// so the CPU tests run the very code the kernel runs: which (sequence, KV head, head chunk, query
// tile, key split) a CTA owns, which query row (token, head of the group) each of its 32 row slots
// holds, which keys the CTA walks and which each row may see (causal), and the shared-memory carve.
// tests/kernels/test_cuda_ops_host.cpp walks every CTA of many random problems with these functions
// and checks that each (token, head) is computed exactly once per split and that the splits'
// visible keys partition 0..pos exactly.
#pragma once

#include <cstdint>

#include "kernels/cuda/ops/paged_attention.h"

#if defined(__CUDACC__)
#define FP4MOE_ATTN_HD __host__ __device__
#else
#define FP4MOE_ATTN_HD
#endif

namespace fp4moe::cuda {

// Shared memory of one CTA for head_dim D: q rows as f32, one 32-key tile of K (rows padded by 2
// bf16 so that lane j's reads of row j hit 32 different banks: stride D/2 + 1 words, odd) and of V.
template <int D>
struct AttnSmem {
  static constexpr int kKStride = D + 2;  // bf16 per padded K row
  static constexpr int kQOffset = 0;
  static constexpr int kQBytes = kAttnRowsPerCta * D * 4;
  static constexpr int kKOffset = kQOffset + kQBytes;
  static constexpr int kKBytes = kAttnKeysPerTile * kKStride * 2;
  static constexpr int kVOffset = kKOffset + kKBytes;
  static constexpr int kVBytes = kAttnKeysPerTile * D * 2;
  static constexpr int kTotalBytes = kVOffset + kVBytes;
  static_assert(D % 32 == 0 && D >= 32 && D <= 128, "head_dim 32, 64, 96 or 128");
  static_assert(kKOffset % 16 == 0 && kVOffset % 16 == 0, "16-byte aligned sections");
  static_assert((kKStride / 2) % 2 == 1, "odd K row stride in 4-byte words: conflict-free per-lane rows");
};
static_assert(AttnSmem<128>::kTotalBytes == 32896, "q 16384 + K 8320 + V 8192");
static_assert(AttnSmem<128>::kTotalBytes <= 48 * 1024, "static shared memory limit (no opt-in needed)");

// grid.x = q_tile * (n_kv_heads * n_head_chunks) + kv_head * n_head_chunks + head_chunk.
struct AttnCta {
  int64_t q_tile;
  int kv_head;
  int head_chunk;
};
FP4MOE_ATTN_HD inline AttnCta attn_cta(uint32_t block_x, int n_kv_heads, int n_head_chunks) {
  const uint32_t per_tile = static_cast<uint32_t>(n_kv_heads) * static_cast<uint32_t>(n_head_chunks);
  const uint32_t rem = block_x % per_tile;
  return {static_cast<int64_t>(block_x / per_tile), static_cast<int>(rem) / n_head_chunks,
          static_cast<int>(rem) % n_head_chunks};
}

// Row slot r (0..31) of a CTA whose first query token (within the sequence's chunk) is tok0:
// token tok0 + r / heads_per_cta, group head head_chunk * heads_per_cta + r % heads_per_cta.
struct AttnRow {
  int64_t token;  // index within the sequence's q chunk
  int group_head;
  bool valid;
};
FP4MOE_ATTN_HD inline AttnRow attn_row(int r, int64_t tok0, int head_chunk, int heads_per_cta, int tokens_per_cta,
                                       int group, int64_t q_len) {
  AttnRow row;
  row.token = tok0 + r / heads_per_cta;
  row.group_head = head_chunk * heads_per_cta + r % heads_per_cta;
  row.valid = r < tokens_per_cta * heads_per_cta && row.token < q_len && row.group_head < group;
  return row;
}

// The last key a query token may see (its position): the chunk's tokens are the last q_len of seq_len.
FP4MOE_ATTN_HD inline int64_t attn_query_pos(int64_t seq_len, int64_t q_len, int64_t token) {
  return seq_len - q_len + token;
}

// Keys a part when a list of len keys is cut into n parts of whole key tiles: ceil(len / n) rounded up to `tile`. One
// definition for the planners' keys_per_split of the longest list (paged_attention_plan.cpp) and for each decode
// kernel's cut of a sequence by its own length (attn_key_range, mla_decode_split_keys), so the split a planner models
// is the split a kernel runs.
FP4MOE_ATTN_HD inline int64_t split_part_keys(int64_t len, int64_t n, int64_t tile) {
  const int64_t per = (len + n - 1) / n;
  return (per + tile - 1) / tile * tile;
}

// Keys [begin, end) the CTA walks: its split's range, cut at its last row's position. The sequence's keys are cut
// into n_splits parts of ceil(seq_len / n_splits) rounded up to whole kAttnKeysPerTile-key tiles by its own length
// (trailing splits may be empty), so a split planned for a longer list (a CUDA graph plans for its power-of-two
// block-table bucket, up to twice the longest sequence; a batch mixes lengths) spreads every sequence over its
// splits instead of filling the first ones (as mla_decode_split_keys for MLA decode).
FP4MOE_ATTN_HD inline void attn_key_range(int64_t seq_len, int64_t q_len, int64_t tok0, int tokens_per_cta, int split,
                                          int n_splits, int64_t* begin, int64_t* end) {
  const int64_t last_token = (tok0 + tokens_per_cta < q_len ? tok0 + tokens_per_cta : q_len) - 1;
  const int64_t last_pos = attn_query_pos(seq_len, q_len, last_token);
  const int64_t keys_per_split = split_part_keys(seq_len, n_splits, kAttnKeysPerTile);
  *begin = static_cast<int64_t>(split) * keys_per_split;
  const int64_t e = *begin + keys_per_split;
  *end = e < last_pos + 1 ? e : last_pos + 1;
}

}  // namespace fp4moe::cuda
