// CPU-only checks of the host side of the GPU model kernels (no GPU needed): the attention row
// tiling of GQA groups, the attention kernel's CTA/row/key geometry (attention_geometry.h: every
// CTA of random decode and prefill grids walked on the CPU; each (token, head) computed once per
// split, the splits' visible keys partitioning 0..pos exactly) and its shared-memory carve, the MLA
// decode kernel's shared-memory layout and split planning, the decode split planner (coverage, tile multiples, caps), the split-K
// workspace size, block-table packing and slot computation with their error messages, the
// device-error texts, and the argmax tie order shared with the kernel (argmax_beats).
// Run: test_cuda_ops_host (FP4MOE_TEST_SEED=<n> replays a seed).
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "kernels/cuda/ops/attention_geometry.h"
#include "kernels/cuda/ops/device_errors.h"
#include "kernels/cuda/ops/mla_decode.h"
#include "kernels/cuda/ops/norm_rope.h"
#include "kernels/cuda/ops/paged_attention.h"
#include "kernels/cuda/ops/split_merge.h"
#include "model/ops.h"
#include "testing/testing.h"

namespace fp4moe::cuda {
namespace {

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

TEST(AttentionSmem, Carve) {
  // q 32 rows x D f32 + K 32 x (D + 2) bf16 + V 32 x D bf16.
  EXPECT_EQ(AttnSmem<32>::kTotalBytes, 32 * 32 * 4 + 32 * 34 * 2 + 32 * 32 * 2);
  EXPECT_EQ(AttnSmem<64>::kTotalBytes, 32 * 64 * 4 + 32 * 66 * 2 + 32 * 64 * 2);
  EXPECT_EQ(AttnSmem<96>::kTotalBytes, 32 * 96 * 4 + 32 * 98 * 2 + 32 * 96 * 2);
  EXPECT_EQ(AttnSmem<128>::kTotalBytes, 32896);
  EXPECT_EQ(AttnSmem<128>::kVOffset, 16384 + 8320);
}

// Walks every CTA of the kernel's grid with the kernel's own geometry functions, following its
// control flow (early exit of a CTA past the sequence's chunk, row validity, key range cut at the
// CTA's last position, per-row causal limit), and counts what each (token, head, key) receives.
TEST(AttentionGeometry, EveryRowOncePerSplitAndKeysPartitioned) {
  std::mt19937_64 rng(testing::test_seed());
  for (int it = 0; it < 300; ++it) {
    const int n_kv = 1 + static_cast<int>(rng() % 4);
    const int group = std::vector<int>{1, 2, 3, 12, 32, 33, 48}[rng() % 7];
    const int n_heads = n_kv * group;
    const bool decode = rng() % 2 == 0;
    const int n_seqs = 1 + static_cast<int>(rng() % 4);
    std::vector<int64_t> q_len(n_seqs), seq_len(n_seqs);
    for (int s = 0; s < n_seqs; ++s) {
      q_len[s] = decode ? 1 : 1 + static_cast<int64_t>(rng() % 70);
      seq_len[s] = q_len[s] + static_cast<int64_t>(rng() % 120);
      if (decode && rng() % 8 == 0) seq_len[s] = 0;  // padded entry
    }
    const AttentionRowTiling t = attention_row_tiling(n_heads, n_kv);
    const int64_t max_q = *std::max_element(q_len.begin(), q_len.end());
    const int64_t max_len = *std::max_element(seq_len.begin(), seq_len.end());
    DecodeSplit split{1, (std::max<int64_t>(max_len, 1) + 31) / 32 * 32};
    if (decode && rng() % 2 == 0) {
      split.keys_per_split = 32 * (1 + static_cast<int64_t>(rng() % 3));
      split.n_splits = static_cast<int>((std::max<int64_t>(max_len, 1) + split.keys_per_split - 1) / split.keys_per_split) +
                       static_cast<int>(rng() % 2);  // sometimes one always-empty split
    }
    const int64_t n_q_tiles = decode ? 1 : (max_q + t.tokens_per_cta - 1) / t.tokens_per_cta;
    const int64_t grid_x = n_q_tiles * n_kv * t.n_head_chunks;
    const std::string c = std::string(decode ? "decode" : "prefill") + " kv=" + std::to_string(n_kv) +
                          " group=" + std::to_string(group) + " seqs=" + std::to_string(n_seqs) + " " + split.to_string();
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
          attn_key_range(seq_len[s], q_len[s], tok0, t.tokens_per_cta, sp, split.keys_per_split, &kb, &ke);
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
}

TEST(MlaDecodePlan, LayoutSplitsWorkspace) {
  const MlaSmemLayout tiny = mla_smem_layout(32, 16);  // glm5_tiny: 48 wide, 24 words -> odd 25
  EXPECT_EQ(tiny.k_stride_words, 25);
  EXPECT_EQ(tiny.total_bytes, 16 * 48 * 4 + 32 * 25 * 4);
  const MlaSmemLayout glm5 = mla_smem_layout(512, 64);  // 576 wide, 288 words -> 289
  EXPECT_EQ(glm5.k_stride_words, 289);
  EXPECT_EQ(glm5.k_offset, 36864);
  EXPECT_EQ(glm5.total_bytes, 73856);
  EXPECT_EQ(mla_smem_layout(64, 66).k_stride_words, 65);  // 65 words: already odd
  for (int rank : {32, 64, 128, 256, 512}) {
    for (int rope = 2; rope <= 128; rope += 2) {
      const MlaSmemLayout l = mla_smem_layout(rank, rope);
      ASSERT_EQ(l.k_stride_words % 2, 1) << rank << "+" << rope;
      ASSERT_GE(2 * l.k_stride_words, l.width) << rank << "+" << rope;
      ASSERT_EQ(l.k_offset % 16, 0) << rank << "+" << rope;
    }
  }
  // One GLM-5 sequence (64 heads = 4 CTAs) of 32768 tokens on 132 SMs: 66 wanted, capped at 64 splits.
  const DecodeSplit one = plan_mla_decode_split(1, 64, 32768, 132);
  EXPECT_EQ(one.to_string(), "64 splits x 512 keys");
  EXPECT_EQ(plan_mla_decode_split(64, 64, 32768, 132).n_splits, 2);  // 256 CTAs: want ceil(264 / 256) = 2
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
