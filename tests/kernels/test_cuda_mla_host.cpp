// CPU-only checks of the host side of the GPU MLA prefill and DSA indexer kernels (no GPU needed):
//   - mla_prefill.h: every CTA of random prefill grids walked with mla_prefill_cta (each (query row,
//     head) computed exactly once per split), the splits' key-list ranges (mla_split_key_range)
//     partitioning each list exactly for planned and forced splits (the shared-memory carve is
//     mla_decode's, tested in test_cuda_ops_host), plan_mla_prefill_split
//     (one split for a big prefill, several for a DSA decode step) and its workspace size;
//   - dsa_indexer.h: dsa_selection_offsets (values and error messages), dsa_ordered_key (unsigned
//     order == float order, -0 == +0), the kernel's radix select emulated on the CPU with the same
//     dsa_ordered_key / dsa_radix_pick (4 passes + position-order compaction) against a sort-based
//     top-k with ties to the lower position (model::dsa_select_topk's order) on random scores with
//     many ties, negatives and signed zeros, and dsa_index_plan (grids, shared memory, refusals).
// Run: test_cuda_mla_host (FP4MOE_TEST_SEED=<n> replays a seed).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "kernels/cuda/ops/dsa_indexer.h"
#include "kernels/cuda/ops/mla_prefill.h"
#include "testing/testing.h"

namespace fp4moe::cuda {
namespace {

using fp4moe::testing::error_of;

TEST(MlaPrefillGeometry, EveryRowAndHeadOncePerSplit) {
  std::mt19937_64 rng(testing::test_seed());
  for (int it = 0; it < 300; ++it) {
    const int n_heads = 1 + static_cast<int>(rng() % 70);
    const int n_chunks = (n_heads + kMlaHeadsPerCta - 1) / kMlaHeadsPerCta;
    const int n_seqs = 1 + static_cast<int>(rng() % 6);
    std::vector<int64_t> q_start{0};
    int64_t max_q_len = 0;
    for (int s = 0; s < n_seqs; ++s) {
      const int64_t q_len = static_cast<int64_t>(rng() % 40);
      max_q_len = std::max(max_q_len, q_len);
      q_start.push_back(q_start.back() + q_len);
    }
    const int64_t n_tokens = q_start.back();
    std::vector<int> count(static_cast<size_t>(n_tokens * n_heads), 0);
    for (uint32_t x = 0; x < static_cast<uint32_t>(max_q_len * n_chunks); ++x) {
      const MlaPrefillCta cta = mla_prefill_cta(x, n_chunks);
      ASSERT_GE(cta.chunk, 0);
      ASSERT_LT(cta.chunk, n_chunks);
      for (int s = 0; s < n_seqs; ++s) {
        if (cta.token >= q_start[s + 1] - q_start[s]) continue;  // the kernel's early exit
        const int64_t row = q_start[s] + cta.token;
        for (int r = 0; r < kMlaHeadsPerCta; ++r) {
          const int head = cta.chunk * kMlaHeadsPerCta + r;
          if (head < n_heads) ++count[static_cast<size_t>(row * n_heads + head)];
        }
      }
    }
    for (size_t i = 0; i < count.size(); ++i) {
      ASSERT_EQ(count[i], 1) << "row " << i / n_heads << " head " << i % n_heads << " of " << n_heads
                             << " heads, max_q_len " << max_q_len;
    }
  }
}

TEST(MlaPrefillGeometry, SplitsPartitionEveryKeyList) {
  std::mt19937_64 rng(testing::test_seed());
  for (int it = 0; it < 2000; ++it) {
    const int64_t n_tokens = 1 + static_cast<int64_t>(rng() % 500);
    const int64_t n_heads = 1 + static_cast<int64_t>(rng() % 128);
    const int64_t max_keys = static_cast<int64_t>(rng() % 5000);
    DecodeSplit split = plan_mla_prefill_split(n_tokens, n_heads, max_keys, 132);
    if (it % 3 == 0) split = DecodeSplit{1 + static_cast<int>(rng() % 9), 32 * (1 + static_cast<int64_t>(rng() % 8))};
    const int64_t covered = split.n_splits * split.keys_per_split;
    if (it % 3 != 0) {
      ASSERT_NO_THROW(check_decode_split("test", split));
      ASSERT_GE(covered, max_keys) << split.to_string() << " for " << max_keys << " keys";
    }
    const int64_t n_keys = covered > 0 ? static_cast<int64_t>(rng() % (std::min(covered, max_keys) + 1)) : 0;
    int64_t next = 0;
    for (int sp = 0; sp < split.n_splits; ++sp) {
      int64_t b = 0, e = 0;
      mla_split_key_range(n_keys, sp, split.keys_per_split, &b, &e);
      ASSERT_LE(b, e);
      if (e > b) {
        ASSERT_EQ(b, next) << split.to_string() << " split " << sp << " of " << n_keys << " keys";
        next = e;
      }
    }
    ASSERT_EQ(next, n_keys) << split.to_string();
  }
}

TEST(MlaPrefillPlan, OneSplitForPrefillSeveralForDsaDecode) {
  const DecodeSplit prefill = plan_mla_prefill_split(4096, 64, 2048, 132);
  EXPECT_EQ(prefill.n_splits, 1) << prefill.to_string();
  EXPECT_GE(prefill.keys_per_split, 2048);
  const DecodeSplit decode = plan_mla_prefill_split(4, 64, 2048, 132);  // 16 CTAs without splitting
  EXPECT_GT(decode.n_splits, 1) << decode.to_string();
  EXPECT_GE(decode.n_splits * decode.keys_per_split, 2048);
  EXPECT_EQ(decode.keys_per_split % kAttnKeysPerTile, 0);
  const MlaDecodeDims dims{64, 512, 192, 64, 256, 0.07f};
  EXPECT_EQ(mla_prefill_workspace_bytes(4, dims, prefill), 0u);
  EXPECT_EQ(mla_prefill_workspace_bytes(4, dims, decode),
            static_cast<size_t>(4 * 64 * decode.n_splits) * (512 + 1) * sizeof(float));
  EXPECT_EQ(mla_prefill_workspace_bytes(0, dims, decode), 0u);
}

TEST(DsaSelectionOffsets, ValuesAndErrors) {
  // seq 0: 3 queries at 8, 9, 10 (topk 4 -> 4 each); seq 1: 2 queries at 0, 1 (1, 2); seq 2: none.
  const std::vector<int32_t> lens{11, 2, 5};
  const std::vector<int32_t> q_start{0, 3, 5, 5};
  EXPECT_EQ(dsa_selection_offsets(lens, q_start, 4), (std::vector<int32_t>{0, 4, 8, 12, 13, 15}));
  EXPECT_EQ(dsa_selection_offsets(lens, q_start, 100), (std::vector<int32_t>{0, 9, 19, 30, 31, 33}));
  EXPECT_EQ(dsa_selection_offsets(std::vector<int32_t>{}, std::vector<int32_t>{0}, 4), (std::vector<int32_t>{0}));
  EXPECT_NE(error_of([&] { dsa_selection_offsets(std::vector<int32_t>{2}, std::vector<int32_t>{0, 3}, 4); })
                .find("sequence 0 has q_start 0 .. 3 (3 queries) and seq_len 2 (needs 0 <= q_len <= seq_len)"),
            std::string::npos);
  EXPECT_NE(error_of([&] { dsa_selection_offsets(std::vector<int32_t>{9, 9}, std::vector<int32_t>{0, 5, 1}, 4); })
                .find("sequence 1 has q_start 5 .. 1 (-4 queries)"),
            std::string::npos);
  EXPECT_NE(error_of([&] { dsa_selection_offsets(lens, std::vector<int32_t>{0, 3}, 4); })
                .find("q_start has 2 entries for 3 sequences"),
            std::string::npos);
  EXPECT_NE(error_of([&] { dsa_selection_offsets(lens, q_start, 0); }).find("index_topk 0 (must be >= 1)"),
            std::string::npos);
}

TEST(DsaRadixSelect, OrderedKeyKeepsFloatOrder) {
  std::mt19937_64 rng(testing::test_seed());
  std::vector<float> v{0.0f, -0.0f, 1.0f, -1.0f, std::numeric_limits<float>::infinity(),
                       -std::numeric_limits<float>::infinity(), std::numeric_limits<float>::denorm_min(),
                       -std::numeric_limits<float>::denorm_min(), std::numeric_limits<float>::max(),
                       std::numeric_limits<float>::lowest()};
  std::normal_distribution<float> d(0.0f, 10.0f);
  for (int i = 0; i < 300; ++i) v.push_back(i % 3 == 0 ? std::ldexp(d(rng), -130) : d(rng));
  for (float a : v) {
    for (float b : v) {
      ASSERT_EQ(a < b, dsa_ordered_key(a) < dsa_ordered_key(b)) << a << " vs " << b;
      ASSERT_EQ(a == b, dsa_ordered_key(a) == dsa_ordered_key(b)) << a << " vs " << b;
    }
  }
}

// The select kernel's algorithm, sequentially: 4 radix passes, then position-order compaction.
std::vector<int32_t> emulate_radix_topk(const std::vector<float>& sc, int64_t k) {
  const int64_t n = static_cast<int64_t>(sc.size());
  uint32_t prefix = 0, mask = 0;
  int64_t remaining = k;
  for (int shift = 24; shift >= 0; shift -= 8) {
    uint32_t hist[256] = {};
    for (float x : sc) {
      const uint32_t u = dsa_ordered_key(x);
      if ((u & mask) == prefix) ++hist[(u >> shift) & 255u];
    }
    int64_t n_greater = 0;
    const int d = dsa_radix_pick(hist, remaining, &n_greater);
    prefix |= static_cast<uint32_t>(d) << shift;
    remaining -= n_greater;
    mask |= 255u << shift;
  }
  std::vector<int32_t> out;
  int64_t eq_seen = 0;
  for (int64_t t = 0; t < n; ++t) {
    const uint32_t u = dsa_ordered_key(sc[static_cast<size_t>(t)]);
    if (u > prefix || (u == prefix && eq_seen++ < remaining)) out.push_back(static_cast<int32_t>(t));
  }
  return out;
}

std::vector<int32_t> sort_topk(const std::vector<float>& sc, int64_t k) {
  std::vector<int32_t> order(sc.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return sc[a] > sc[b]; });
  order.resize(static_cast<size_t>(k));
  std::sort(order.begin(), order.end());
  return order;
}

TEST(DsaRadixSelect, EmulationMatchesSortedTopkWithTies) {
  std::mt19937_64 rng(testing::test_seed());
  for (int it = 0; it < 3000; ++it) {
    const int64_t n = 1 + static_cast<int64_t>(rng() % 600);
    const int64_t k = 1 + static_cast<int64_t>(rng() % n);
    std::vector<float> sc(static_cast<size_t>(n));
    const int mode = it % 4;
    std::normal_distribution<float> d(0.0f, 1.0f);
    for (float& x : sc) {
      if (mode == 0) x = d(rng);                                          // distinct
      if (mode == 1) x = std::round(d(rng) * 3.0f) / 4.0f;                // many ties, +-0
      if (mode == 2) x = (rng() % 4 == 0) ? (rng() % 2 ? 0.0f : -0.0f) : std::fabs(d(rng));  // ReLU-like
      if (mode == 3) x = 1.0f + std::ldexp(static_cast<float>(rng() % 3), -23);  // ties in the last byte
    }
    ASSERT_EQ(emulate_radix_topk(sc, k), sort_topk(sc, k)) << "n " << n << " k " << k << " mode " << mode;
  }
}

TEST(DsaRadixSelect, PickDigit) {
  uint32_t hist[256] = {};
  hist[200] = 3;
  hist[100] = 5;
  hist[0] = 2;
  int64_t g = -1;
  EXPECT_EQ(dsa_radix_pick(hist, 1, &g), 200);
  EXPECT_EQ(g, 0);
  EXPECT_EQ(dsa_radix_pick(hist, 3, &g), 200);
  EXPECT_EQ(dsa_radix_pick(hist, 4, &g), 100);
  EXPECT_EQ(g, 3);
  EXPECT_EQ(dsa_radix_pick(hist, 9, &g), 0);
  EXPECT_EQ(g, 8);
}

TEST(DsaIndexPlan, GridsSmemAndRefusals) {
  const DsaIndexerDims glm5{32, 128, 2048, 1.0f / std::sqrt(128.0f), 1.0f / std::sqrt(32.0f)};
  const DsaIndexPlan p = dsa_index_plan(glm5, 3, 40, 3000);
  EXPECT_EQ(p.score_grid_x, 40u);
  EXPECT_EQ(p.score_grid_y, 3u);
  EXPECT_EQ(p.score_grid_z, 12u);  // ceil(3000 / 256)
  EXPECT_EQ(p.score_smem_bytes, 16512);
  EXPECT_EQ(p.select_grid_x, 40u);
  EXPECT_EQ(p.select_grid_y, 3u);
  EXPECT_EQ(p.to_string(), "scores 40x3x12 CTAs (16512 B smem), select 40x3, 1 chunk of 40 tokens");
  EXPECT_EQ(dsa_index_workspace_bytes(3, 40, 3000), 3u * 40u * 3000u * 4u);  // within the budget

  // The workspace cap: 8,192 prompt tokens at 131,072 tokens of context would be 4 GiB of scores;
  // the budget (256 MiB) holds 512 query tokens of one sequence, so 16 chunks.
  EXPECT_EQ(dsa_index_chunk_tokens(1, 8192, 131072, kDsaWorkspaceBudgetBytes), 512);
  EXPECT_EQ(dsa_index_workspace_bytes(1, 8192, 131072), kDsaWorkspaceBudgetBytes);
  const DsaIndexPlan big = dsa_index_plan(glm5, 1, 8192, 131072);
  EXPECT_EQ(big.chunk_tokens, 512);
  EXPECT_EQ(big.n_chunks, 16);
  EXPECT_EQ(big.score_grid_x, 512u);
  // Never less than one token per sequence (then over the budget), never more than max_q_len.
  EXPECT_EQ(dsa_index_chunk_tokens(256, 1, 131072, kDsaWorkspaceBudgetBytes), 1);
  EXPECT_EQ(dsa_index_workspace_bytes(256, 1, 131072), size_t{256} * 131072 * 4);
  EXPECT_EQ(dsa_index_chunk_tokens(3, 5, 100, size_t{1} << 30), 5);
  EXPECT_EQ(dsa_index_chunk_tokens(0, 5, 100, 1024), 0);
  // A given workspace of 2 tokens of 3 sequences x 3,000 keys (+100 B): 3 chunks over 5 tokens.
  const DsaIndexPlan small = dsa_index_plan(glm5, 3, 5, 3000, 3u * 3000u * 4u * 2u + 100u);
  EXPECT_EQ(small.chunk_tokens, 2);
  EXPECT_EQ(small.n_chunks, 3);
  EXPECT_NE(error_of([&] { dsa_index_plan(glm5, 3, 5, 3000, 1000); })
                .find("a score workspace of 1000 B cannot hold one query per sequence (3 sequences x 3000 keys x "
                      "4 B = 36000 B)"),
            std::string::npos);

  DsaIndexerDims bad = glm5;
  bad.head_dim = 96;
  EXPECT_NE(error_of([&] { dsa_index_plan(bad, 1, 1, 1); }).find("head_dim=96 (32, 64, 128 or 256)"),
            std::string::npos);
  bad = glm5;
  bad.n_heads = 64;
  bad.head_dim = 256;
  EXPECT_NE(error_of([&] { dsa_index_plan(bad, 1, 1, 1); })
                .find("q 64 x 256 + w 64 f32 = 65792 B of shared memory > 49152 B"),
            std::string::npos);
  EXPECT_NE(error_of([&] { dsa_index_plan(glm5, 1, 1, kDsaMaxKeys + 1); })
                .find("max_seq_len 16776961 (>= max_q_len 1, <= 16776960 = 65535 key chunks x 256)"),
            std::string::npos);
  EXPECT_NE(error_of([&] { dsa_index_plan(glm5, 70000, 1, 1); }).find("n_seqs=70000 (<= 65535)"), std::string::npos);
  bad = glm5;
  bad.index_topk = 0;
  EXPECT_NE(error_of([&] { dsa_index_plan(bad, 1, 1, 1); }).find("topk=0 (>= 1)"), std::string::npos);
}

}  // namespace
}  // namespace fp4moe::cuda
