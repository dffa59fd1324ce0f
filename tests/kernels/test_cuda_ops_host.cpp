// CPU-only checks of the host side of the GPU model kernels (no GPU needed): the attention row
// tiling of GQA groups, the attention kernel's CTA/row/key geometry (attention_geometry.h: every
// CTA of random decode and prefill grids walked on the CPU; each (token, head) computed once per
// split, the splits' visible keys partitioning 0..pos exactly) and its shared-memory carve, the MLA
// decode kernel's shared-memory layout and split planning, the decode split planner (coverage, tile
// multiples, caps, empty and all-padding batches), the launchers' split check (check_decode_split:
// a default DecodeSplit is rejected as not planned), the splits and grids of the GPU test's decode
// cases (test_cuda_paged_attention.cpp) as that test chooses them, the split-K workspace size,
// block-table packing and slot computation with their error messages, the device-error texts, and
// the argmax tie order shared with the kernel (argmax_beats).
// Run: test_cuda_ops_host (FP4MOE_TEST_SEED=<n> replays a seed).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "kernels/cuda/launch_grid.h"
#include "kernels/cuda/ops/attention_geometry.h"
#include "kernels/cuda/ops/device_errors.h"
#include "kernels/cuda/ops/mla_decode.h"
#include "kernels/cuda/ops/mla_prefill.h"
#include "kernels/cuda/ops/norm_rope.h"
#include "kernels/cuda/ops/paged_attention.h"
#include "kernels/cuda/ops/split_merge.h"
#include "model/ops.h"
#include "testing/testing.h"

namespace fp4moe::cuda {
namespace {

// The grid of the grid-stride kernels (launch_grid.h): ceil(work / per CTA), at least 1, capped.
TEST(LaunchGrid, CeilAtLeastOneAndCapped) {
  EXPECT_EQ(grid_stride_ctas(0, 256), 1);
  EXPECT_EQ(grid_stride_ctas(256, 256), 1);
  EXPECT_EQ(grid_stride_ctas(257, 256), 2);
  EXPECT_EQ(grid_stride_ctas(int64_t{1} << 40, 1, 4096), 4096);
  EXPECT_EQ(grid_stride_ctas(int64_t{1} << 40, 256), kGridStrideMaxCtas);
}

TEST(AttentionRowTiling, GroupsOfGlmAndEdges) {
  const AttentionRowTiling glm45 = attention_row_tiling(96, 8);  // GLM-4.5: group 12
  EXPECT_EQ(glm45.heads_per_cta, 12);
  EXPECT_EQ(glm45.n_head_chunks, 1);
  EXPECT_EQ(glm45.tokens_per_cta, 2);
  const AttentionRowTiling mha = attention_row_tiling(4, 4);
  EXPECT_EQ(mha.heads_per_cta, 1);
  EXPECT_EQ(mha.tokens_per_cta, 32);
  const AttentionRowTiling wide = attention_row_tiling(96, 2);  // group 48 > 32 rows
  EXPECT_EQ(wide.heads_per_cta, 32);
  EXPECT_EQ(wide.n_head_chunks, 2);
  EXPECT_EQ(wide.tokens_per_cta, 1);
  try {
    attention_row_tiling(12, 5);
    FAIL() << "12 heads over 5 KV heads accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("n_heads 12 must be a positive multiple of n_kv_heads 5"), std::string::npos)
        << e.what();
  }
}

TEST(PlanDecodeSplit, CoversTheLongestSequence) {
  std::mt19937_64 rng(testing::test_seed());
  for (int it = 0; it < 2000; ++it) {
    const int64_t n_seqs = 1 + static_cast<int64_t>(rng() % 300);
    const int64_t n_kv = 1 + static_cast<int64_t>(rng() % 8);
    const int64_t n_heads = n_kv * (1 + static_cast<int64_t>(rng() % 16));
    const int64_t len = static_cast<int64_t>(rng() % 200000);
    const int n_sms = 1 + static_cast<int>(rng() % 200);
    const DecodeSplit s = plan_decode_split(n_seqs, n_heads, n_kv, len, n_sms);
    const std::string c = "seqs=" + std::to_string(n_seqs) + " heads=" + std::to_string(n_heads) + "/" +
                          std::to_string(n_kv) + " len=" + std::to_string(len) + " sms=" + std::to_string(n_sms) +
                          " -> " + s.to_string();
    ASSERT_GE(s.n_splits, 1) << c;
    ASSERT_LE(s.n_splits, kMaxDecodeSplits) << c;
    ASSERT_EQ(s.keys_per_split % kAttnKeysPerTile, 0) << c;
    ASSERT_GE(s.keys_per_split, kAttnKeysPerTile) << c;
    ASSERT_GE(s.n_splits * s.keys_per_split, len) << c;
    ASSERT_LT((s.n_splits - 1) * s.keys_per_split, std::max<int64_t>(len, 1)) << c << " (an always-empty split)";
    ASSERT_NO_THROW(check_decode_split("plan_decode_split", s)) << c;
  }
  // One long sequence on a 132-SM H200 with 8 KV heads: split to fill the GPU.
  const DecodeSplit one = plan_decode_split(1, 96, 8, 32768, 132);
  EXPECT_EQ(one.n_splits, 32) << one.to_string();  // want 33 -> 993 keys -> 1024 -> 32 splits
  EXPECT_EQ(one.keys_per_split, 1024) << one.to_string();
  // Many sequences already fill it: no split.
  EXPECT_EQ(plan_decode_split(256, 96, 8, 32768, 132).n_splits, 1);
  // Short sequences are not split below 256 keys.
  EXPECT_EQ(plan_decode_split(1, 96, 8, 300, 132).n_splits, 1);
  EXPECT_EQ(plan_decode_split(1, 96, 8, 0, 132).to_string(), "1 split x 32 keys");
}

// cap_decode_split: the capped split still covers the keys, is a valid launch, never needs more
// workspace than the budget unless it is a single split (which needs none), and is the planned
// split when that already fits.
TEST(DecodeSplit, CapFitsTheWorkspaceBudget) {
  std::mt19937_64 rng(testing::test_seed());
  for (int it = 0; it < 2000; ++it) {
    const int64_t n_seqs = 1 + static_cast<int64_t>(rng() % 300);
    const int64_t n_kv = 1 + static_cast<int64_t>(rng() % 8);
    const int64_t n_heads = n_kv * (1 + static_cast<int64_t>(rng() % 16));
    const int64_t head_dim = 32 * (1 + static_cast<int64_t>(rng() % 4));
    const int64_t len = static_cast<int64_t>(rng() % 200000);
    const DecodeSplit planned = plan_decode_split(n_seqs, n_heads, n_kv, len, 132);
    const size_t budget = static_cast<size_t>(rng() % (size_t{64} << 20));
    const DecodeSplit s = cap_decode_split(planned, n_seqs, n_heads, head_dim, len, budget);
    const std::string c = planned.to_string() + " -> " + s.to_string() + " budget " + std::to_string(budget);
    ASSERT_NO_THROW(check_decode_split("cap", s)) << c;
    ASSERT_GE(s.n_splits * s.keys_per_split, len) << c;
    ASSERT_TRUE(s.n_splits == 1 || attention_workspace_bytes(n_seqs, n_heads, head_dim, s) <= budget) << c;
    if (attention_workspace_bytes(n_seqs, n_heads, head_dim, planned) <= budget) {
      ASSERT_EQ(s.to_string(), planned.to_string()) << c;
    }
    ASSERT_LE(s.n_splits, planned.n_splits) << c;
  }
  // 64 sequences x 96 heads x 128 dims x 32 splits of 1024 keys: 100 MB planned; 16 MiB forces 4 splits.
  const DecodeSplit big{32, 1024};
  EXPECT_EQ(cap_decode_split(big, 64, 96, 128, 32768, size_t{16} << 20).to_string(), "4 splits x 8192 keys");
  EXPECT_EQ(cap_decode_split(big, 64, 96, 128, 32768, 0).n_splits, 1);
}

// The launchers' split check: a default DecodeSplit is "not planned", and every launch limit is named.
TEST(DecodeSplit, CheckRejectsUnplannedAndOutOfRangeSplits) {
  EXPECT_EQ(DecodeSplit{}.n_splits, 0);
  EXPECT_EQ(DecodeSplit{}.keys_per_split, 0);
  const auto message = [](const DecodeSplit& split) -> std::string {
    try {
      check_decode_split("paged_attention_decode_bf16", split);
    } catch (const Error& e) {
      return e.what();
    }
    return "accepted";
  };
  const auto has = [](const std::string& what, const std::string& part) {
    return what.find(part) != std::string::npos;
  };
  EXPECT_PRED2(has, message(DecodeSplit{}),
               "paged_attention_decode_bf16: split 0 splits x 0 keys is not planned (take it from plan_decode_split");
  EXPECT_PRED2(has, message(DecodeSplit{1, 0}),
               "split 1 split x 0 keys (keys a split must be a positive multiple of 32, at most 2147483648)");
  EXPECT_PRED2(has, message(DecodeSplit{2, 48}), "split 2 splits x 48 keys (keys a split must be a positive multiple");
  EXPECT_PRED2(has, message(DecodeSplit{1, -32}), "split 1 split x -32 keys (keys a split");
  EXPECT_PRED2(has, message(DecodeSplit{1, kMaxKeysPerSplit + 32}), "x 2147483680 keys (keys a split");
  EXPECT_PRED2(has, message(DecodeSplit{0, 64}), "split 0 splits x 64 keys (1 to 65535 splits)");
  EXPECT_PRED2(has, message(DecodeSplit{-1, 64}), "split -1 splits x 64 keys (1 to 65535 splits)");
  EXPECT_PRED2(has, message(DecodeSplit{65536, 32}), "split 65536 splits x 32 keys (1 to 65535 splits)");
  for (const DecodeSplit ok : {DecodeSplit{1, 32}, DecodeSplit{65535, 32}, DecodeSplit{1, kMaxKeysPerSplit},
                               DecodeSplit{kMaxLaunchSplits, kMaxKeysPerSplit}}) {
    EXPECT_EQ(message(ok), "accepted") << ok.to_string();
  }
}

TEST(AttentionSmem, Carve) {
  // q 32 rows x D f32 + K 32 x (D + 2) bf16 + V 32 x D bf16.
  EXPECT_EQ(AttnSmem<32>::kTotalBytes, 32 * 32 * 4 + 32 * 34 * 2 + 32 * 32 * 2);
  EXPECT_EQ(AttnSmem<64>::kTotalBytes, 32 * 64 * 4 + 32 * 66 * 2 + 32 * 64 * 2);
  EXPECT_EQ(AttnSmem<96>::kTotalBytes, 32 * 96 * 4 + 32 * 98 * 2 + 32 * 96 * 2);
  EXPECT_EQ(AttnSmem<128>::kTotalBytes, 32896);
  EXPECT_EQ(AttnSmem<128>::kVOffset, 16384 + 8320);
}

// Walks every CTA of the kernel's grid (x: q tiles x KV heads x head chunks, y: sequences, z: key
// splits) with the kernel's own geometry functions, following its control flow (early exit of a CTA
// past the sequence's chunk, row validity, key range cut at the CTA's last position, per-row causal
// limit), and checks that each (token, head) is computed once per split and sees every key 0..pos
// exactly once. Decode: q_len[s] = 1 for every entry (the kernel's one query row), seq_len 0 allowed.
void walk_attention_grid(int n_kv, int group, bool decode, const std::vector<int64_t>& q_len,
                         const std::vector<int64_t>& seq_len, const DecodeSplit& split, const std::string& c) {
  const int n_heads = n_kv * group;
  const int n_seqs = static_cast<int>(q_len.size());
  const AttentionRowTiling t = attention_row_tiling(n_heads, n_kv);
  const int64_t max_q = *std::max_element(q_len.begin(), q_len.end());
  const int64_t n_q_tiles = decode ? 1 : (max_q + t.tokens_per_cta - 1) / t.tokens_per_cta;
  const int64_t grid_x = n_q_tiles * n_kv * t.n_head_chunks;
  ASSERT_NO_THROW(check_decode_split("walk_attention_grid", split)) << c;  // the launchers' check
  for (int64_t len : seq_len) ASSERT_LE(len, split.n_splits * split.keys_per_split) << c << " (the kernel flags it)";
  // rows_seen[s][(token * n_heads + head) * n_splits + split], keys_seen[s][(token * n_heads + head) * len + key]
  for (int s = 0; s < n_seqs; ++s) {
    std::vector<int> rows_seen(static_cast<size_t>(q_len[s] * n_heads * split.n_splits), 0);
    std::vector<int> keys_seen(static_cast<size_t>(q_len[s] * n_heads * std::max<int64_t>(seq_len[s], 1)), 0);
    for (int sp = 0; sp < split.n_splits; ++sp) {
      for (int64_t bx = 0; bx < grid_x; ++bx) {
        const AttnCta cta = attn_cta(static_cast<uint32_t>(bx), n_kv, t.n_head_chunks);
        const int64_t tok0 = cta.q_tile * t.tokens_per_cta;
        if (tok0 >= q_len[s]) continue;
        int64_t kb = 0, ke = 0;
        attn_key_range(seq_len[s], q_len[s], tok0, t.tokens_per_cta, sp, split.n_splits, &kb, &ke);
        ASSERT_LE(ke, seq_len[s]) << c;
        for (int r = 0; r < kAttnRowsPerCta; ++r) {
          const AttnRow row = attn_row(r, tok0, cta.head_chunk, t.heads_per_cta, t.tokens_per_cta, group, q_len[s]);
          if (!row.valid) continue;
          const int64_t head = static_cast<int64_t>(cta.kv_head) * group + row.group_head;
          ASSERT_LT(head, n_heads) << c;
          ASSERT_LT(row.token, q_len[s]) << c;
          ++rows_seen[static_cast<size_t>((row.token * n_heads + head) * split.n_splits + sp)];
          const int64_t limit = attn_query_pos(seq_len[s], q_len[s], row.token);
          for (int64_t k0 = kb; k0 < ke; k0 += kAttnKeysPerTile) {  // the kernel's tile loop
            for (int lane = 0; lane < kAttnKeysPerTile; ++lane) {
              const int64_t key = k0 + lane;
              if (key < ke && key <= limit) {
                ++keys_seen[static_cast<size_t>((row.token * n_heads + head) * std::max<int64_t>(seq_len[s], 1) + key)];
              }
            }
          }
        }
      }
    }
    for (size_t i = 0; i < rows_seen.size(); ++i) ASSERT_EQ(rows_seen[i], 1) << c << " seq " << s << " row/split " << i;
    for (int64_t tok = 0; tok < q_len[s]; ++tok) {
      const int64_t pos = attn_query_pos(seq_len[s], q_len[s], tok);
      for (int64_t h = 0; h < n_heads; ++h) {
        for (int64_t key = 0; key < seq_len[s]; ++key) {
          ASSERT_EQ(keys_seen[static_cast<size_t>((tok * n_heads + h) * std::max<int64_t>(seq_len[s], 1) + key)],
                    key <= pos ? 1 : 0)
              << c << " seq " << s << " (len " << seq_len[s] << ", q " << q_len[s] << ") token " << tok << " head " << h
              << " key " << key;
        }
      }
    }
  }
}

TEST(AttentionGeometry, EveryRowOncePerSplitAndKeysPartitioned) {
  std::mt19937_64 rng(testing::test_seed());
  for (int it = 0; it < 300; ++it) {
    const int n_kv = 1 + static_cast<int>(rng() % 4);
    const int group = std::vector<int>{1, 2, 3, 12, 32, 33, 48}[rng() % 7];
    const bool decode = rng() % 2 == 0;
    const int n_seqs = 1 + static_cast<int>(rng() % 4);
    std::vector<int64_t> q_len(n_seqs), seq_len(n_seqs);
    for (int s = 0; s < n_seqs; ++s) {
      q_len[s] = decode ? 1 : 1 + static_cast<int64_t>(rng() % 70);
      seq_len[s] = q_len[s] + static_cast<int64_t>(rng() % 120);
      if (decode && rng() % 8 == 0) seq_len[s] = 0;  // padded entry
    }
    const int64_t max_len = *std::max_element(seq_len.begin(), seq_len.end());
    DecodeSplit split{1, (std::max<int64_t>(max_len, 1) + 31) / 32 * 32};
    if (decode && rng() % 2 == 0) {
      split.keys_per_split = 32 * (1 + static_cast<int64_t>(rng() % 3));
      split.n_splits = static_cast<int>((std::max<int64_t>(max_len, 1) + split.keys_per_split - 1) / split.keys_per_split) +
                       static_cast<int>(rng() % 2);  // sometimes one always-empty split
    }
    const std::string c = std::string(decode ? "decode" : "prefill") + " kv=" + std::to_string(n_kv) +
                          " group=" + std::to_string(group) + " seqs=" + std::to_string(n_seqs) + " " + split.to_string();
    walk_attention_grid(n_kv, group, decode, q_len, seq_len, split, c);
    if (HasFatalFailure()) return;
  }
}

// The decode kernel's per-sequence key ranges (mla_decode_split_keys, the code its CTAs run): for any length and
// split count they partition 0..seq_len-1 in order, every non-empty range but the last is whole 64-key tiles of
// ceil(seq_len / n_splits) rounded up, and a sequence shorter than the plan spreads over its splits (1,032 keys over 2:
// 576 + 456, not 1,024 + 8 as fixed splits of a 2,048-key bucket's plan cut it).
TEST(MlaDecodePlan, SplitKeysPartitionEachSequenceByItsLength) {
  std::mt19937_64 rng(testing::test_seed());
  for (int it = 0; it < 2000; ++it) {
    const int n_splits = 1 + static_cast<int>(rng() % 40);
    const int64_t seq_len = it < 50 ? it : static_cast<int64_t>(rng() % 5000);
    const int64_t tile =
        ((seq_len + n_splits - 1) / n_splits + kMlaWgKeysPerTile - 1) / kMlaWgKeysPerTile * kMlaWgKeysPerTile;
    int64_t next = 0;
    for (int z = 0; z < n_splits; ++z) {
      int64_t b = -1, e = -1;
      mla_decode_split_keys(seq_len, n_splits, z, &b, &e);
      ASSERT_LE(b, e) << seq_len << " / " << n_splits << " split " << z;
      if (b == e) {
        ASSERT_GE(b, seq_len) << seq_len << " / " << n_splits << " split " << z;  // only trailing splits are empty
        continue;
      }
      ASSERT_EQ(b, next) << seq_len << " / " << n_splits << " split " << z;
      ASSERT_EQ(b % kMlaWgKeysPerTile, 0) << seq_len << " / " << n_splits << " split " << z;
      ASSERT_TRUE(e - b == tile || e == seq_len)
          << seq_len << " / " << n_splits << " split " << z << ": " << b << ".." << e;
      next = e;
    }
    ASSERT_EQ(next, seq_len) << seq_len << " / " << n_splits;
  }
  int64_t b = 0, e = 0;
  mla_decode_split_keys(1032, 2, 0, &b, &e);
  EXPECT_EQ(e - b, 576);
  mla_decode_split_keys(1032, 2, 1, &b, &e);
  EXPECT_EQ(e - b, 456);
  mla_decode_split_keys(1032, 4, 3, &b, &e);  // 4 x 320 (5 tiles): the last 72 keys
  EXPECT_EQ(b, 960);
  EXPECT_EQ(e, 1032);
}

// A batch with no key anywhere (all entries padded, or no entries) still plans a valid launch, for
// GQA and MLA; the planners take any int32 length and refuse longer ones.
TEST(PlanDecodeSplit, EmptyAndAllPaddingBatchesAreValidLaunches) {
  for (int64_t n_seqs : {0, 1, 5, 300}) {
    const DecodeSplit gqa = plan_decode_split(n_seqs, 96, 8, 0, 132);
    EXPECT_EQ(gqa.to_string(), "1 split x 32 keys") << n_seqs << " sequences";
    EXPECT_NO_THROW(check_decode_split("paged_attention_decode_bf16", gqa));
    const DecodeSplit mla = plan_mla_decode_split(n_seqs, 64, 0, 132);
    EXPECT_EQ(mla.to_string(), "1 split x 64 keys") << n_seqs << " sequences";  // the wgmma CTA's 64-key tile
    EXPECT_NO_THROW(check_decode_split("mla_decode_attention", mla));
  }
  EXPECT_EQ(plan_decode_split(0, 96, 8, 4096, 132).n_splits, 1);  // nothing to fill the GPU with
  // Every entry padded: each row is computed once per split and sees no key (the kernel writes zeros).
  walk_attention_grid(8, 12, true, {1, 1, 1}, {0, 0, 0}, plan_decode_split(3, 96, 8, 0, 132), "all padded, planner");
  walk_attention_grid(2, 2, true, {1, 1}, {0, 0}, DecodeSplit{3, 32}, "all padded, 3 x 32");
  const DecodeSplit longest = plan_decode_split(1, 96, 8, INT32_MAX, 132);
  EXPECT_NO_THROW(check_decode_split("paged_attention_decode_bf16", longest)) << longest.to_string();
  EXPECT_GE(longest.n_splits * longest.keys_per_split, int64_t{INT32_MAX}) << longest.to_string();
  EXPECT_NO_THROW(check_decode_split("x", plan_decode_split(1, 1, 1, INT32_MAX, 1, INT32_MAX)));  // 1 x 2^31
  try {
    plan_decode_split(1, 96, 8, int64_t{INT32_MAX} + 1, 132);
    FAIL() << "a max_seq_len beyond int32 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("max_seq_len=2147483648 (int32)"), std::string::npos) << e.what();
  }
}

// The decode cases of tests/kernels/test_cuda_paged_attention.cpp (DecodeSmall, DecodeGlmShapes:
// keep this list in sync with it), each split chosen exactly as its run_case chooses it: the case's
// forced_split when its n_splits > 0, else plan_decode_split(n_seqs, n_heads, n_kv_heads, longest
// seq_len, 132), a case forcing nothing holding a default DecodeSplit{} (the choice does not depend
// on the test's random seed). On the H200 the planner cases reached the launcher with "1 split x 0
// keys": DecodeSplit{} defaulted to n_splits 1, so the test's "n_splits 0: plan" rule never fired.
// Here every case's split must pass the launcher's check_decode_split, cover the longest sequence,
// need a workspace exactly when it has several splits, and its grid must compute every row once per
// split with each key 0..seq_len-1 seen exactly once (walk_attention_grid).
TEST(PagedAttentionGpuCases, DecodeSplitsAreValidLaunches) {
  struct SeqSpec {
    int64_t cached, q_len;
  };
  struct GpuDecodeCase {
    std::string name;
    int64_t n_heads, n_kv_heads, head_dim, page_size;
    std::vector<SeqSpec> seqs;
    bool decode;
    DecodeSplit forced_split{};
  };
  const std::vector<SeqSpec> kMixedDecode{{0, 1}, {16, 1}, {299, 1}, {15, 1}, {32, 1}};
  const std::vector<GpuDecodeCase> cases{
      // DecodeSmall
      {"tiny group 2, d32, page 16", 4, 2, 32, 16, kMixedDecode, true},
      {"tiny, forced 5 x 64-key splits", 4, 2, 32, 16, kMixedDecode, true, DecodeSplit{5, 64}},
      {"tiny, 10 splits (each sequence cut by its length; short ones leave most empty)", 4, 2, 32, 16, kMixedDecode, true, DecodeSplit{10, 32}},
      {"mha d96, page 1", 3, 3, 96, 1, {{0, 1}, {40, 1}}, true},
      {"padded entry (seq_len 0)", 8, 2, 64, 16, {{20, 1}, {0, 0}, {5, 1}}, true, DecodeSplit{2, 32}},
      {"all entries padded, planner", 8, 2, 64, 16, {{0, 0}, {0, 0}}, true},
      {"all entries padded, 3 x 32-key splits", 8, 2, 64, 16, {{0, 0}, {0, 0}}, true, DecodeSplit{3, 32}},
      // DecodeGlmShapes
      {"glm45 96/8 heads, d128, page 64", 96, 8, 128, 64, {{0, 1}, {299, 1}, {999, 1}, {4096, 1}}, true},
      {"glm45 one long sequence (planner splits)", 96, 8, 128, 64, {{4096, 1}}, true},
      {"group 48 (two head chunks), d64", 96, 2, 64, 16, {{16, 1}, {300, 1}}, true, DecodeSplit{3, 128}},
  };
  for (const GpuDecodeCase& c : cases) {
    ASSERT_TRUE(c.decode) << c.name;
    const int64_t n_seqs = static_cast<int64_t>(c.seqs.size());
    std::vector<int64_t> seq_len, q_len;
    for (const SeqSpec& sp : c.seqs) {
      seq_len.push_back(sp.cached + sp.q_len);
      q_len.push_back(1);  // decode: one query row per sequence, padded entries included
    }
    const int64_t max_len = *std::max_element(seq_len.begin(), seq_len.end());
    const DecodeSplit split =
        c.forced_split.n_splits > 0 ? c.forced_split : plan_decode_split(n_seqs, c.n_heads, c.n_kv_heads, max_len, 132);
    const std::string what = c.name + " [" + split.to_string() + "]";
    if (c.forced_split.n_splits == 0) {
      EXPECT_EQ(split.to_string(), plan_decode_split(n_seqs, c.n_heads, c.n_kv_heads, max_len, 132).to_string())
          << c.name << ": a case forcing nothing must get the planner's split";
    }
    EXPECT_NO_THROW(check_decode_split("paged_attention_decode_bf16", split)) << what;
    EXPECT_GE(split.n_splits * split.keys_per_split, max_len) << what;
    EXPECT_EQ(attention_workspace_bytes(n_seqs, c.n_heads, c.head_dim, split) > 0, split.n_splits > 1) << what;
    walk_attention_grid(static_cast<int>(c.n_kv_heads), static_cast<int>(c.n_heads / c.n_kv_heads), true, q_len,
                        seq_len, split, what);
    if (HasFatalFailure()) return;
  }
}

TEST(MlaDecodePlan, LayoutSplitsWorkspace) {
  // The tensor-core decode kernel's layout: bf16 rows padded by 16 B (an odd number of 16 B pieces,
  // so ldmatrix's 8 row addresses hit 8 bank groups), two key tiles, 4 x 16 x 32 f32 scores, then
  // the third bf16 part of the q fragments (4 warps x 9 steps x 32 lanes x 16 B).
  const MlaMmaSmemLayout mma_glm5 = mla_mma_smem_layout(512, 64);
  EXPECT_EQ(mma_glm5.row_bytes, 1168);
  EXPECT_EQ(mma_glm5.scores_offset, 2 * 32 * 1168);
  EXPECT_EQ(mma_glm5.q_part3_offset, 2 * 32 * 1168 + 8192);
  // Inside the scores region: the n-tile maxima (2 KB), then P (3 parts x 16 rows x 80 B).
  EXPECT_EQ(mma_glm5.p_offset, mma_glm5.scores_offset + 2048);
  EXPECT_LE(mma_glm5.p_offset + 3 * 16 * 80, mma_glm5.scores_offset + mma_glm5.scores_bytes);
  EXPECT_EQ((kMlaPRowBytes / 16) % 2, 1);  // ldmatrix's 8 rows of P in 8 bank groups
  EXPECT_EQ(mma_glm5.total_bytes, 101376);
  EXPECT_EQ(mla_mma_smem_layout(32, 16).total_bytes, 2 * 32 * 112 + 8192 + 18432);  // glm5_tiny
  for (int rank : {32, 64, 128, 256, 512}) {
    for (int rope = 16; rope <= kMlaMaxRope; rope += 16) {
      const MlaMmaSmemLayout l = mla_mma_smem_layout(rank, rope);
      ASSERT_EQ((l.row_bytes / 16) % 2, 1) << rank << "+" << rope;
      ASSERT_EQ(l.scores_offset % 16, 0) << rank << "+" << rope;
      ASSERT_LE((l.width / 16 + kMlaWarps - 1) / kMlaWarps, kMlaMaxQStepsPerWarp) << rank << "+" << rope;
      ASSERT_EQ(l.q_part3_offset % 16, 0) << rank << "+" << rope;
      ASSERT_GE(plan::sm90_ctas_per_sm_by_smem(l.total_bytes), 2u) << rank << "+" << rope;
    }
  }
  // The decode kernel's wgmma CTA: every region starts on a 1,024 B swizzle atom (the descriptors' 128B swizzle is
  // anchored there), the q and P regions are 48 rows (3 parts x 16 heads) of 128 B, one CTA fits an SM.
  const MlaWgmmaSmemLayout wg_glm5 = mla_wgmma_smem_layout(512, 64);
  EXPECT_EQ(wg_glm5.col_blocks, 9);
  EXPECT_EQ(wg_glm5.m_blocks, 8);
  EXPECT_EQ(wg_glm5.q_offset, 2 * 9 * 64 * 128);
  EXPECT_EQ(wg_glm5.total_bytes, 218624);
  for (int rank : {32, 64, 128, 256, 512}) {
    for (int rope = 16; rope <= kMlaMaxRope; rope += 16) {
      const MlaWgmmaSmemLayout l = mla_wgmma_smem_layout(rank, rope);
      ASSERT_EQ(l.col_blocks, (rank + rope + 63) / 64) << rank << "+" << rope;
      ASSERT_EQ(l.m_blocks, (rank + 63) / 64) << rank << "+" << rope;
      for (int off : {l.tiles_offset, l.tile_bytes, l.q_offset, l.q_col_bytes, l.p_offset}) {
        ASSERT_EQ(off % kMlaWgAtomBytes, 0) << rank << "+" << rope;
      }
      ASSERT_EQ(l.q_col_bytes, kMlaWgQRows * 128) << rank << "+" << rope;
      ASSERT_EQ(l.p_bytes, kMlaWgQRows * 128) << rank << "+" << rope;
      ASSERT_EQ(l.xch_offset, l.red_offset + l.red_bytes) << rank << "+" << rope;
      ASSERT_GE(plan::sm90_ctas_per_sm_by_smem(l.total_bytes), 1u) << rank << "+" << rope;
    }
  }
  // The decode CTA (wgmma) fits once an SM and takes 64 keys a tile; the prefill / DSA CTA (mma.sync) twice, 32 keys.
  static_assert(kMlaWgCtasPerSm == 1 && kMlaMmaCtasPerSm == 2);
  ASSERT_EQ(plan::sm90_ctas_per_sm_by_smem(mla_wgmma_smem_layout(512, 64).total_bytes), 1u);
  ASSERT_EQ(plan::sm90_ctas_per_sm_by_smem(mla_mma_smem_layout(512, 64).total_bytes), 2u);
  // The decode plan is the least time of kMlaWgSplitCost's model. Where bench_mla_decode measured (H100, 132 SMs,
  // thirty-sixth session) it is the fastest split: 1 sequence x 1,024 keys 16 x 64 (13.1 us; 4 x 256 20.5), 4 x 1,024
  // 8 splits (16.0), 16 x 1,024 2 (35.1; 4: 40.1), 32 x 1,024 1 (51.6; 2: 67.0), 48 x 1,024 2 (97.9; 1: 102.7),
  // 8 x 2,048 4, 24 x 2,048 4 (92.0; 1: 93.7), 48 x 2,048 2 (163.6; 1: 191.3), 64 x 2,048 1 (189.2; 2: 218.3).
  EXPECT_EQ(plan_mla_decode_split(1, 64, 1024, 132, 32).to_string(), "16 splits x 64 keys");
  EXPECT_EQ(plan_mla_decode_split(4, 64, 1024, 132, 32).to_string(), "8 splits x 128 keys");
  // 1,032 keys: 17 splits of one tile (13.5 us measured; 9 x 128: 15.4), past floor(1,032 / 64) = 16 parts.
  EXPECT_EQ(plan_mla_decode_split(1, 64, 1032, 132, 32).to_string(), "17 splits x 64 keys");
  EXPECT_EQ(plan_mla_decode_split(16, 64, 1024, 132, 32).to_string(), "2 splits x 512 keys");
  EXPECT_EQ(plan_mla_decode_split(32, 64, 1024, 132, 32).to_string(), "1 split x 1024 keys");
  EXPECT_EQ(plan_mla_decode_split(48, 64, 1024, 132, 32).to_string(), "2 splits x 512 keys");
  EXPECT_EQ(plan_mla_decode_split(8, 64, 2048, 132, 32).to_string(), "4 splits x 512 keys");
  EXPECT_EQ(plan_mla_decode_split(24, 64, 2048, 132, 32).to_string(), "4 splits x 512 keys");
  EXPECT_EQ(plan_mla_decode_split(48, 64, 2048, 132, 32).to_string(), "2 splits x 1024 keys");
  EXPECT_EQ(plan_mla_decode_split(64, 64, 2048, 132, 32).to_string(), "1 split x 2048 keys");
  // The minimum keys a split caps the count: at most 1,024 / 128 = 8.
  EXPECT_EQ(plan_mla_decode_split(1, 64, 1024, 132, 128).to_string(), "8 splits x 128 keys");
  // Long lists: one sequence (4 CTAs) of 32,768 keys 32 splits of 1,024 (128 CTAs, one wave); 64 sequences (256 CTAs,
  // two waves) 1. 100 sequences: 400 CTAs leave a fourth wave of 4 CTAs at 1 split, and the model would take 8 splits
  // of 4,096 (3,200 CTAs), but more than kMlaMaxSplitWaves = 4 waves of split CTAs (528) is refused: 1 split. No plan
  // of several splits exceeds that bound (the workspace's), and every plan covers its keys.
  EXPECT_EQ(plan_mla_decode_split(1, 64, 32768, 132).to_string(), "32 splits x 1024 keys");
  EXPECT_EQ(plan_mla_decode_split(64, 64, 32768, 132).n_splits, 1);
  EXPECT_EQ(plan_mla_decode_split(100, 64, 32768, 132).n_splits, 1);
  for (int64_t seqs : {1, 3, 17, 33, 48, 65, 100, 256}) {
    for (int64_t keys : {64, 1000, 2048, 32768}) {
      const DecodeSplit s = plan_mla_decode_split(seqs, 64, keys, 132, 32);
      if (s.n_splits > 1) {
        EXPECT_LE(seqs * 4 * s.n_splits, kMlaMaxSplitWaves * 132) << seqs << " x " << keys;
      }
      EXPECT_GE(static_cast<int64_t>(s.n_splits) * s.keys_per_split, keys) << seqs << " x " << keys;
    }
  }
  // An empty batch and a batch of empty lists: one split.
  EXPECT_EQ(plan_mla_decode_split(0, 64, 1024, 132).n_splits, 1);
  EXPECT_EQ(plan_mla_decode_split(8, 64, 0, 132).n_splits, 1);
  // The prefill / DSA CTA: 264 slots / 4 = 66, capped at 64 splits of 512 keys (32-key tiles).
  EXPECT_EQ(plan_mla_prefill_split(1, 64, 32768, 132).to_string(), "64 splits x 512 keys");
  EXPECT_EQ(plan_mla_prefill_split(16, 64, 32768, 132).n_splits, 4);  // 64 CTAs x 4 = 256 <= 264 slots
  EXPECT_EQ(plan_mla_prefill_split(1, 64, 1024, 132, 32).to_string(), "32 splits x 32 keys");
  try {  // a tile not a multiple of 32 keys
    plan_mla_split(1, 64, 1024, 132, 32, 1, 48);
    ADD_FAILURE() << "a 48-key tile was planned";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(
                  "plan_mla_split: n_rows=1, n_heads=64, max_keys=1024 (int32), n_sms=132, min_keys_per_split=32, "
                  "ctas_per_sm=1, keys_per_tile=48 (a multiple of 32)"),
              std::string::npos)
        << e.what();
  }
  // GQA's splits are whole 32-key tiles too: a minimum of 16 at 100 keys plans 3 splits of 34, rounded to 2 x 64.
  EXPECT_EQ(plan_decode_split(1, 96, 8, 100, 132, 16).to_string(), "2 splits x 64 keys");
  EXPECT_EQ(plan_decode_split(64, 96, 8, 32768, 132).n_splits, 1);  // GQA: 64 x 8 x 1 = 512 CTAs >= 264
  const MlaDecodeDims dims{64, 512, 192, 64, 256, 0.07f};
  EXPECT_EQ(mla_decode_workspace_bytes(2, dims, DecodeSplit{1, 64}), 0u);
  EXPECT_EQ(mla_decode_workspace_bytes(2, dims, DecodeSplit{3, 64}), 384u * 512 * 4 + 384u * 4);
}

// Each split runs the kernels' online softmax over its keys in 32-key tiles (m, l, acc rescaled by
// e^{m - m_new}) and stores o = acc / l, lse = m + log l; split_merge_value must give the softmax
// average over the whole row (model::softmax_inplace), empty splits included.
TEST(SplitMerge, EqualsOneSoftmaxOverTheRow) {
  std::mt19937_64 rng(testing::test_seed());
  std::normal_distribution<float> nd(0.0f, 3.0f);
  for (int it = 0; it < 300; ++it) {
    const int n_keys = 1 + static_cast<int>(rng() % 400);
    const int dim = 1 + static_cast<int>(rng() % 8);
    const int kps = 32 * (1 + static_cast<int>(rng() % 4));
    const int n_splits = (n_keys + kps - 1) / kps + static_cast<int>(rng() % 3);  // trailing empty splits
    std::vector<float> score(static_cast<size_t>(n_keys)), v(static_cast<size_t>(n_keys * dim));
    for (float& x : score) x = nd(rng);
    for (float& x : v) x = nd(rng);
    std::vector<float> part_o(static_cast<size_t>(n_splits * dim), 0.0f), lse(static_cast<size_t>(n_splits));
    for (int sp = 0; sp < n_splits; ++sp) {
      float m = -INFINITY, l = 0.0f;
      std::vector<float> acc(static_cast<size_t>(dim), 0.0f);
      for (int k0 = sp * kps; k0 < std::min(n_keys, (sp + 1) * kps); k0 += 32) {
        const int k1 = std::min({n_keys, (sp + 1) * kps, k0 + 32});
        float tile_max = -INFINITY;
        for (int k = k0; k < k1; ++k) tile_max = std::max(tile_max, score[static_cast<size_t>(k)]);
        const float m_new = std::max(m, tile_max);
        const float corr = std::exp(m - m_new);
        float sum = 0.0f;
        for (float& a : acc) a *= corr;
        for (int k = k0; k < k1; ++k) {
          const float p = std::exp(score[static_cast<size_t>(k)] - m_new);
          sum += p;
          for (int d = 0; d < dim; ++d) acc[static_cast<size_t>(d)] += p * v[static_cast<size_t>(k * dim + d)];
        }
        l = l * corr + sum;
        m = m_new;
      }
      for (int d = 0; d < dim; ++d) part_o[static_cast<size_t>(sp * dim + d)] = l > 0.0f ? acc[static_cast<size_t>(d)] / l : 0.0f;
      lse[static_cast<size_t>(sp)] = l > 0.0f ? m + std::log(l) : -INFINITY;
    }
    std::vector<float> p = score;
    model::softmax_inplace(p.data(), n_keys);
    const float mx = split_lse_max(lse.data(), n_splits);
    for (int d = 0; d < dim; ++d) {
      double ref = 0.0;
      for (int k = 0; k < n_keys; ++k) ref += static_cast<double>(p[static_cast<size_t>(k)]) * v[static_cast<size_t>(k * dim + d)];
      const float got = split_merge_value(lse.data(), part_o.data(), n_splits, dim, mx, d);
      ASSERT_NEAR(got, ref, 1e-5 * 3.0 * 6.0) << "keys=" << n_keys << " splits=" << n_splits << "x" << kps << " d=" << d;
    }
  }
  // Every split empty (a padded entry): zeros.
  const float lse_empty[3] = {-INFINITY, -INFINITY, -INFINITY};
  const float o_empty[3] = {0.0f, 0.0f, 0.0f};
  EXPECT_EQ(split_merge_value(lse_empty, o_empty, 3, 1, split_lse_max(lse_empty, 3), 0), 0.0f);
}

// The merge reads every split's o (no branch: the GPU keeps several loads in flight) and selects an
// empty split's term away, so an empty split adds exactly nothing, whatever its o holds.
TEST(SplitMerge, AnEmptySplitAddsNothingWhateverItsOutput) {
  const float lse3[3] = {0.5f, -INFINITY, -1.25f};
  const float lse2[2] = {0.5f, -1.25f};
  const float o2[2] = {2.0f, -3.0f};
  const float mx = split_lse_max(lse3, 3);
  EXPECT_EQ(mx, 0.5f);
  const float want = split_merge_value(lse2, o2, 2, 1, split_lse_max(lse2, 2), 0);
  for (const float junk : {0.0f, 7.0f, INFINITY, -INFINITY, NAN}) {
    const float o3[3] = {2.0f, junk, -3.0f};
    EXPECT_EQ(split_merge_value(lse3, o3, 3, 1, mx, 0), want) << "empty split's o = " << junk;
  }
  // The weighted average itself: (2 e^0 - 3 e^{-1.75}) / (1 + e^{-1.75}).
  const double e = std::exp(-1.75);
  EXPECT_NEAR(want, (2.0 - 3.0 * e) / (1.0 + e), 1e-6);
}

TEST(AttentionWorkspace, Bytes) {
  EXPECT_EQ(attention_workspace_bytes(5, 8, 128, DecodeSplit{1, 4096}), 0u);
  // 5 tokens x 8 heads x 3 splits = 120 rows: 120 * 128 * 4 (o) + 120 * 4 (lse).
  EXPECT_EQ(attention_workspace_bytes(5, 8, 128, DecodeSplit{3, 256}), 120u * 128 * 4 + 120 * 4);
}

TEST(BlockTables, PackAndSlots) {
  int64_t width = 0;
  const std::vector<int32_t> packed = pack_block_tables({{7, 2}, {}, {0, 5, 9}}, 10, &width);
  EXPECT_EQ(width, 3);
  EXPECT_EQ(packed, (std::vector<int32_t>{7, 2, -1, -1, -1, -1, 0, 5, 9}));
  try {
    pack_block_tables({{1}, {3, 10}}, 10, &width);
    FAIL() << "block 10 of a 10-block pool accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("sequence 1: entry 1 = 10 is outside the pool [0, 10)"), std::string::npos)
        << e.what();
  }
  EXPECT_EQ(kv_slot({7, 2}, 0, 16), 7 * 16);
  EXPECT_EQ(kv_slot({7, 2}, 17, 16), 2 * 16 + 1);
  try {
    kv_slot({7, 2}, 32, 16);
    FAIL() << "position 32 of a 2-block table accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("position 32 needs block 2 of a table of 2 blocks"), std::string::npos)
        << e.what();
  }
}

TEST(DeviceErrors, Describe) {
  EXPECT_EQ(describe_device_errors(0), "none");
  EXPECT_EQ(describe_device_errors(kDeviceErrorTokenId | kDeviceErrorKvBlock),
            "token id outside the vocabulary (embedding) | KV block id outside the cache pool (attention)");
  EXPECT_EQ(describe_device_errors(1u << 31), "unknown bits 0x80000000");
  EXPECT_EQ(describe_device_errors(kDeviceErrorKeySelection),
            "DSA key selection outside the query's causal range or malformed (MLA / indexer)");
}

// The kernel's reduction order gives the CPU argmax on any permutation of the reduction: fold the
// candidates in a random order with argmax_beats and compare with model::argmax.
TEST(ArgmaxOrder, AnyReductionOrderMatchesCpu) {
  std::mt19937_64 rng(testing::test_seed());
  for (int it = 0; it < 500; ++it) {
    const int n = 1 + static_cast<int>(rng() % 200);
    std::vector<float> x(static_cast<size_t>(n));
    for (float& v : x) v = static_cast<float>(static_cast<int>(rng() % 5)) - 2.0f;  // many ties
    if (rng() % 4 == 0) x[rng() % x.size()] = -INFINITY;
    std::vector<int32_t> order(x.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int32_t>(i);
    std::shuffle(order.begin(), order.end(), rng);
    ArgmaxCandidate best = argmax_identity();
    for (int32_t i : order) {
      const ArgmaxCandidate c{x[static_cast<size_t>(i)], i};
      if (argmax_beats(c, best)) best = c;
    }
    ASSERT_EQ(best.index, model::argmax(x.data(), n)) << "n=" << n << " it=" << it;
  }
}

}  // namespace
}  // namespace fp4moe::cuda
