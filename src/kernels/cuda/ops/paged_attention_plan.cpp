// Host-side planning of the paged attention kernels (paged_attention.h, mla_decode.h): how query
// rows and keys are cut into CTAs, the split-K workspace sizes, block-table packing and slot
// computation. Pure functions, tested on the CPU by tests/kernels/test_cuda_ops_host.cpp.
#include <algorithm>
#include <cstdint>

#include "core/error.h"
#include "kernels/cuda/ops/attention_geometry.h"
#include "kernels/cuda/ops/mla_decode.h"
#include "kernels/cuda/ops/paged_attention.h"

namespace fp4moe::cuda {

namespace {

// max_seq_len keys (at least 1) cut into n parts of ceil(len / n) rounded up to whole key tiles: n_splits = the parts
// that are not always empty (n or fewer).
DecodeSplit split_into(int64_t max_seq_len, int64_t n, int key_tile) {
  const int64_t len = std::max<int64_t>(max_seq_len, 1);
  const int64_t kps = split_part_keys(len, n, key_tile);
  DecodeSplit s;
  s.keys_per_split = kps;
  s.n_splits = static_cast<int>((len + kps - 1) / kps);
  return s;
}

// Splits so that base_ctas * n_splits fills `slots` CTA slots: at least (round_down false: the GQA
// kernel, 2 x n_sms slots, several CTAs per SM) or at most, never below one split (round_down true:
// the MLA kernels, plan_mla_split). Each split >= max(min_keys_per_split, key_tile) keys, a multiple of
// key_tile, n_splits <= kMaxDecodeSplits, and no split always empty. An empty batch (base_ctas 0) gets
// one split.
DecodeSplit split_for_ctas(int64_t base_ctas, int64_t max_seq_len, int64_t slots, int64_t min_keys_per_split,
                           bool round_down, int key_tile) {
  const int64_t want = base_ctas <= 0 ? 1 : round_down ? std::max<int64_t>(1, slots / base_ctas)
                                                       : (slots + base_ctas - 1) / base_ctas;
  const int64_t by_len = std::max<int64_t>(1, max_seq_len / std::max<int64_t>(min_keys_per_split, key_tile));
  return split_into(max_seq_len, std::clamp<int64_t>(std::min(want, by_len), 1, kMaxDecodeSplits), key_tile);
}

}  // namespace

AttentionRowTiling attention_row_tiling(int64_t n_heads, int64_t n_kv_heads) {
  FP4MOE_CHECK(n_heads >= 1 && n_kv_heads >= 1 && n_heads % n_kv_heads == 0)
      << "attention: n_heads " << n_heads << " must be a positive multiple of n_kv_heads " << n_kv_heads;
  const int64_t group = n_heads / n_kv_heads;
  AttentionRowTiling t;
  t.heads_per_cta = static_cast<int>(std::min<int64_t>(group, kAttnRowsPerCta));
  t.n_head_chunks = static_cast<int>((group + t.heads_per_cta - 1) / t.heads_per_cta);
  t.tokens_per_cta = kAttnRowsPerCta / t.heads_per_cta;
  return t;
}

std::string DecodeSplit::to_string() const {
  return std::to_string(n_splits) + (n_splits == 1 ? " split x " : " splits x ") + std::to_string(keys_per_split) +
         " keys";
}

void check_decode_split(const char* what, const DecodeSplit& split) {
  FP4MOE_CHECK(split.n_splits != 0 || split.keys_per_split != 0)
      << what << ": split " << split.to_string()
      << " is not planned (take it from plan_decode_split / plan_mla_decode_split)";
  FP4MOE_CHECK(split.n_splits >= 1 && split.n_splits <= kMaxLaunchSplits)
      << what << ": split " << split.to_string() << " (1 to " << kMaxLaunchSplits << " splits)";
  FP4MOE_CHECK(split.keys_per_split >= kAttnKeysPerTile && split.keys_per_split % kAttnKeysPerTile == 0 &&
               split.keys_per_split <= kMaxKeysPerSplit)
      << what << ": split " << split.to_string() << " (keys a split must be a positive multiple of "
      << kAttnKeysPerTile << ", at most " << kMaxKeysPerSplit << ")";
}

DecodeSplit plan_decode_split(int64_t n_seqs, int64_t n_heads, int64_t n_kv_heads, int64_t max_seq_len, int n_sms,
                              int64_t min_keys_per_split) {
  FP4MOE_CHECK(n_seqs >= 0 && max_seq_len >= 0 && max_seq_len <= INT32_MAX && n_sms >= 1 && min_keys_per_split >= 1)
      << "plan_decode_split: n_seqs=" << n_seqs << ", max_seq_len=" << max_seq_len << " (int32), n_sms=" << n_sms
      << ", min_keys_per_split=" << min_keys_per_split;
  const AttentionRowTiling tiling = attention_row_tiling(n_heads, n_kv_heads);
  return split_for_ctas(n_seqs * n_kv_heads * tiling.n_head_chunks, max_seq_len, 2 * static_cast<int64_t>(n_sms),
                        min_keys_per_split, false, kAttnKeysPerTile);
}

DecodeSplit cap_decode_split(const DecodeSplit& split, int64_t n_seqs, int64_t n_heads, int64_t head_dim,
                             int64_t max_seq_len, size_t workspace_bytes) {
  check_decode_split("cap_decode_split", split);
  FP4MOE_CHECK(max_seq_len >= 0 && max_seq_len <= INT32_MAX)
      << "cap_decode_split: max_seq_len=" << max_seq_len << " outside [0, 2^31)";
  DecodeSplit s = split;
  while (s.n_splits > 1 && attention_workspace_bytes(n_seqs, n_heads, head_dim, s) > workspace_bytes) {
    s.keys_per_split *= 2;
    s.n_splits = static_cast<int>(std::max<int64_t>(1, (max_seq_len + s.keys_per_split - 1) / s.keys_per_split));
  }
  return s;
}

DecodeSplit plan_mla_split(int64_t n_rows, int64_t n_heads, int64_t max_keys, int n_sms, int64_t min_keys_per_split,
                           int ctas_per_sm, int keys_per_tile, const MlaSplitCost* cost) {
  FP4MOE_CHECK(n_rows >= 0 && n_heads >= 1 && max_keys >= 0 && max_keys <= INT32_MAX && n_sms >= 1 &&
               min_keys_per_split >= 1 && ctas_per_sm >= 1 && keys_per_tile >= kAttnKeysPerTile &&
               keys_per_tile % kAttnKeysPerTile == 0)
      << "plan_mla_split: n_rows=" << n_rows << ", n_heads=" << n_heads << ", max_keys=" << max_keys
      << " (int32), n_sms=" << n_sms << ", min_keys_per_split=" << min_keys_per_split << ", ctas_per_sm=" << ctas_per_sm
      << ", keys_per_tile=" << keys_per_tile << " (a multiple of " << kAttnKeysPerTile << ")";
  const int64_t chunks = (n_heads + kMlaHeadsPerCta - 1) / kMlaHeadsPerCta;
  const int64_t slots = static_cast<int64_t>(ctas_per_sm) * n_sms;
  if (cost == nullptr || n_rows == 0) {
    return split_for_ctas(n_rows * chunks, max_keys, slots, min_keys_per_split, true, keys_per_tile);
  }
  // Every count up to kMaxDecodeSplits whose splits keep min_keys_per_split keys, by the model's time; the fewer
  // splits on a tie. (Not split_for_ctas's floor(max_keys / min keys) cap: at 1,032 keys and 64-key tiles it stops at
  // 16 parts, which round to 9 splits of 128, and never reaches 17 of 64.)
  DecodeSplit best;
  double best_us = 0;
  for (int64_t n = 1; n <= kMaxDecodeSplits; ++n) {
    const DecodeSplit s = split_into(max_keys, n, keys_per_tile);
    if (s.keys_per_split < min_keys_per_split && n > 1) break;  // keys a split only shrink as n grows
    if (s.n_splits != n) continue;                              // the same plan as a smaller count
    const int64_t ctas = n_rows * chunks * s.n_splits;
    if (n > 1 && ctas > kMlaMaxSplitWaves * slots) break;  // the workspace bound (mla_decode.h)
    const double waves = static_cast<double>((ctas + slots - 1) / slots);
    const double tiles = static_cast<double>(s.keys_per_split / keys_per_tile);
    double us = waves * (cost->cta_us + cost->tile_us * tiles);
    if (s.n_splits > 1) us += cost->merge_us + cost->merge_part_us * static_cast<double>(n_rows * n_heads * s.n_splits);
    if (best.n_splits == 0 || us < best_us) {
      best = s;
      best_us = us;
    }
  }
  return best;
}

size_t mla_decode_workspace_bytes(int64_t n_seqs, const MlaDecodeDims& dims, const DecodeSplit& split) {
  FP4MOE_CHECK(n_seqs >= 0 && dims.n_heads >= 1 && dims.kv_lora_rank >= 1 && split.n_splits >= 1)
      << "mla_decode_workspace_bytes: seqs=" << n_seqs << ", heads=" << dims.n_heads << ", rank=" << dims.kv_lora_rank
      << ", splits=" << split.n_splits;
  if (split.n_splits == 1) return 0;
  const auto rows = static_cast<size_t>(n_seqs * dims.n_heads * split.n_splits);
  return rows * static_cast<size_t>(dims.kv_lora_rank) * sizeof(float) + rows * sizeof(float);
}

size_t attention_workspace_bytes(int64_t n_tokens, int64_t n_heads, int64_t head_dim, const DecodeSplit& split) {
  FP4MOE_CHECK(n_tokens >= 0 && n_heads >= 1 && head_dim >= 1 && split.n_splits >= 1)
      << "attention_workspace_bytes: tokens=" << n_tokens << ", heads=" << n_heads << ", head_dim=" << head_dim
      << ", splits=" << split.n_splits;
  if (split.n_splits == 1) return 0;
  const auto rows = static_cast<size_t>(n_tokens * n_heads * split.n_splits);
  return rows * static_cast<size_t>(head_dim) * sizeof(float) + rows * sizeof(float);
}

std::vector<int32_t> pack_block_tables(const std::vector<std::vector<int32_t>>& tables, int64_t n_blocks,
                                       int64_t* max_blocks) {
  int64_t width = 1;
  for (const auto& t : tables) width = std::max<int64_t>(width, static_cast<int64_t>(t.size()));
  std::vector<int32_t> packed(tables.size() * static_cast<size_t>(width), -1);
  for (size_t s = 0; s < tables.size(); ++s) {
    for (size_t i = 0; i < tables[s].size(); ++i) {
      const int32_t b = tables[s][i];
      FP4MOE_CHECK(b >= 0 && b < n_blocks) << "block table of sequence " << s << ": entry " << i << " = " << b
                                           << " is outside the pool [0, " << n_blocks << ")";
      packed[s * static_cast<size_t>(width) + i] = b;
    }
  }
  if (max_blocks != nullptr) *max_blocks = width;
  return packed;
}

int32_t kv_slot(const std::vector<int32_t>& table, int64_t pos, int64_t page_size) {
  FP4MOE_CHECK(page_size >= 1 && pos >= 0 && pos / page_size < static_cast<int64_t>(table.size()))
      << "kv_slot: position " << pos << " needs block " << (page_size >= 1 ? pos / page_size : -1)
      << " of a table of " << table.size() << " blocks (page_size " << page_size << ")";
  const int64_t slot = static_cast<int64_t>(table[static_cast<size_t>(pos / page_size)]) * page_size + pos % page_size;
  FP4MOE_CHECK(slot >= 0 && slot <= INT32_MAX) << "kv_slot: slot " << slot << " of position " << pos
                                               << " does not fit int32 (page_size " << page_size << ")";
  return static_cast<int32_t>(slot);
}

}  // namespace fp4moe::cuda
