// GPU paged attention (kernels/cuda/ops/paged_attention.h) against a CPU reference written exactly
// like the CPU model's attention (Glm4MoeModel::attention in model/glm4_moe.cpp: head h reads KV
// head h / group, scores (q . k) * 1/sqrt(head_dim), model::softmax_inplace over keys 0..pos, then
// sum p_j v_j, here accumulated in f64), on fresh random bf16 q/K/V:
//   - kv_cache_append_bf16 writes each new token's K/V rows (taken from a strided fused buffer) into
//     its slot, skips a padded token (slot -1), and leaves every other slot as it was (bit for bit);
//   - decode (one query per sequence): GQA groups 1, 2, 12 (GLM-4.5: 96 q / 8 kv heads, head_dim
//     128) and 48 (two head chunks a KV head), head_dim 32/64/96/128, sequence lengths 1, 17, 300,
//     page-boundary lengths and 4097, the planner's split and forced splits (incl. more splits than
//     keys, so some splits are empty), a padded entry (seq_len 0 -> zeros), and a batch of padded
//     entries only (no key anywhere: planner's 1 x 32 split and a forced 3-split merge -> zeros);
//     test_cuda_ops_host (PagedAttentionGpuCases) checks these cases' splits and grids on the CPU;
//   - prefill chunks attending causally to a cached prefix + themselves: lengths 1, 2 across a page
//     boundary, 17 after 283 cached, 300 from empty, page_size 1;
//   - the error flag: a block id outside the pool and a seq_len beyond the block table.
// Every sequence's blocks are a shuffled, non-contiguous set of the pool, and unused slots hold
// random data (reading them would show). Tolerance per output element: |gpu - cpu| <= 2^-8 |cpu| +
// 2e-5 max|V| (the bf16 output rounding is 2^-9 relative; f32 sum-order differences are ~1e-6;
// a key lost or counted twice moves an output by ~max|V| / keys, > 2e-4 max|V| up to 4097 keys).
// Label gpu; without a usable GPU every case skips with the reason.
// Run: test_cuda_paged_attention (FP4MOE_TEST_SEED=<n> replays a seed).
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/ops/device_errors.h"
#include "kernels/cuda/ops/paged_attention.h"
#include "kernels/cuda_test_util.h"
#include "model/ops.h"
#include "testing/testing.h"

namespace fp4moe::cuda {
namespace {

using gpu_test::device_alloc;
using gpu_test::upload;
using gpu_test::random_bf16;
using gpu_test::download;
using gpu_test::cbf;
using gpu_test::bf;

struct SeqSpec {
  int64_t cached;  // tokens already in the cache
  int64_t q_len;   // this step's tokens (decode: 1, or 0 for a padded entry)
};

struct AttnCase {
  std::string name;
  int64_t n_heads, n_kv_heads, head_dim, page_size;
  std::vector<SeqSpec> seqs;
  bool decode;
  DecodeSplit forced_split{};  // the default (0 x 0, "not planned"): plan_decode_split for 132 SMs
};


// Runs one case end to end (append, attention) and checks both against the CPU.
void run_case(const AttnCase& c, std::mt19937_64& rng) {
  const int64_t n_seqs = static_cast<int64_t>(c.seqs.size());
  const int64_t D = c.head_dim;
  const int64_t row = c.n_kv_heads * D;
  const int64_t group = c.n_heads / c.n_kv_heads;
  std::vector<int64_t> seq_len(c.seqs.size());
  int64_t total_blocks = 0;
  for (size_t s = 0; s < c.seqs.size(); ++s) {
    seq_len[s] = c.seqs[s].cached + c.seqs[s].q_len;
    total_blocks += (seq_len[s] + c.page_size - 1) / c.page_size;
  }
  const int64_t n_blocks = total_blocks + 3;  // spare blocks hold random data nobody may read
  std::vector<int32_t> perm(static_cast<size_t>(n_blocks));
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  std::vector<std::vector<int32_t>> tables(c.seqs.size());
  size_t next = 0;
  for (size_t s = 0; s < c.seqs.size(); ++s) {
    for (int64_t b = 0; b < (seq_len[s] + c.page_size - 1) / c.page_size; ++b) tables[s].push_back(perm[next++]);
  }
  int64_t max_blocks = 0;
  const std::vector<int32_t> packed = pack_block_tables(tables, n_blocks, &max_blocks);

  // Every sequence's K/V rows, the pool with the cached prefix written (and garbage elsewhere).
  std::vector<std::vector<uint16_t>> k_all(c.seqs.size()), v_all(c.seqs.size());
  const size_t pool_elems = static_cast<size_t>(n_blocks * c.page_size * row);
  std::vector<uint16_t> k_pool = random_bf16(pool_elems, rng), v_pool = random_bf16(pool_elems, rng);
  std::vector<uint16_t> k_expect = k_pool, v_expect = v_pool;
  // New tokens in a fused buffer: [k (row) | 2 pad | v (row) | 4 pad] per token, stride even.
  const int64_t in_stride = 2 * row + 6;
  const int64_t v_off = row + 2;
  std::vector<uint16_t> kv_in;
  std::vector<int32_t> slots;
  for (size_t s = 0; s < c.seqs.size(); ++s) {
    k_all[s] = random_bf16(static_cast<size_t>(seq_len[s] * row), rng);
    v_all[s] = random_bf16(static_cast<size_t>(seq_len[s] * row), rng);
    for (int64_t p = 0; p < seq_len[s]; ++p) {
      const size_t dst = static_cast<size_t>(kv_slot(tables[s], p, c.page_size)) * static_cast<size_t>(row);
      const size_t src = static_cast<size_t>(p * row);
      std::copy_n(k_all[s].begin() + src, row, k_expect.begin() + dst);
      std::copy_n(v_all[s].begin() + src, row, v_expect.begin() + dst);
      if (p < c.seqs[s].cached) {
        std::copy_n(k_all[s].begin() + src, row, k_pool.begin() + dst);
        std::copy_n(v_all[s].begin() + src, row, v_pool.begin() + dst);
      } else {
        std::vector<uint16_t> r = random_bf16(static_cast<size_t>(in_stride), rng);
        std::copy_n(k_all[s].begin() + src, row, r.begin());
        std::copy_n(v_all[s].begin() + src, row, r.begin() + v_off);
        kv_in.insert(kv_in.end(), r.begin(), r.end());
        slots.push_back(kv_slot(tables[s], p, c.page_size));
      }
    }
  }
  {  // a padded token: slot -1, must not be written
    const std::vector<uint16_t> r = random_bf16(static_cast<size_t>(in_stride), rng);
    kv_in.insert(kv_in.end(), r.begin(), r.end());
    slots.push_back(-1);
  }

  auto dk_pool = upload(k_pool);
  auto dv_pool = upload(v_pool);
  auto dkv_in = upload(kv_in);
  auto dslots = upload(slots);
  auto flag = device_alloc<uint32_t>(1);
  FP4MOE_CUDA_CHECK(cudaMemset(flag.get(), 0, 4));
  PagedKvCacheView cache{bf(dk_pool.get()), bf(dv_pool.get()), n_blocks, c.page_size, c.n_kv_heads, D};
  kv_cache_append_bf16(cbf(dkv_in.get()), in_stride, cbf(dkv_in.get() + v_off), in_stride,
                       static_cast<int64_t>(slots.size()), dslots.get(), cache, flag.get(), nullptr);
  FP4MOE_CUDA_CHECK(cudaDeviceSynchronize());
  ASSERT_TRUE(download(dk_pool.get(), pool_elems) == k_expect) << c.name << ": K pool after append";
  ASSERT_TRUE(download(dv_pool.get(), pool_elems) == v_expect) << c.name << ": V pool after append";

  // Queries: decode has one row per sequence (padded entries too); prefill the chunks back to back.
  std::vector<int32_t> q_start{0};
  for (const SeqSpec& sp : c.seqs) q_start.push_back(q_start.back() + static_cast<int32_t>(c.decode ? 1 : sp.q_len));
  const int64_t n_tokens = q_start.back();
  const std::vector<uint16_t> q = random_bf16(static_cast<size_t>(n_tokens * c.n_heads * D), rng);
  std::vector<int32_t> lens32(seq_len.begin(), seq_len.end());
  auto dq = upload(q);
  auto dtable = upload(packed);
  auto dlens = upload(lens32);
  auto dqs = upload(q_start);
  auto dout = device_alloc<uint16_t>(q.size());
  FP4MOE_CUDA_CHECK(cudaMemset(dout.get(), 0xff, q.size() * 2));  // NaNs where nothing is written
  PagedAttentionArgs a;
  a.q = cbf(dq.get());
  a.cache = cache;
  a.block_table = dtable.get();
  a.max_blocks_per_seq = max_blocks;
  a.seq_lens = dlens.get();
  a.n_seqs = n_seqs;
  a.n_heads = c.n_heads;
  a.scale = 1.0f / std::sqrt(static_cast<float>(D));  // as Glm4MoeModel::attention
  a.out = bf(dout.get());
  a.error_flag = flag.get();
  std::string what = c.name;
  if (c.decode) {
    const int64_t max_len = *std::max_element(seq_len.begin(), seq_len.end());
    const DecodeSplit split =
        c.forced_split.n_splits > 0 ? c.forced_split : plan_decode_split(n_seqs, c.n_heads, c.n_kv_heads, max_len, 132);
    what += " [" + split.to_string() + "]";
    const size_t ws = attention_workspace_bytes(n_tokens, c.n_heads, D, split);
    auto dws = device_alloc<float>(ws / 4);
    paged_attention_decode_bf16(a, split, ws ? dws.get() : nullptr, nullptr);
    FP4MOE_CUDA_CHECK(cudaDeviceSynchronize());
  } else {
    int64_t max_q = 0;
    for (const SeqSpec& sp : c.seqs) max_q = std::max(max_q, sp.q_len);
    paged_attention_prefill_bf16(a, dqs.get(), n_tokens, max_q, nullptr);
    FP4MOE_CUDA_CHECK(cudaDeviceSynchronize());
  }
  const uint32_t flags = download(flag.get(), 1)[0];
  ASSERT_EQ(flags, 0u) << what << ": device errors " << describe_device_errors(flags);
  const std::vector<uint16_t> got = download(dout.get(), q.size());

  float max_v = 0.0f;
  for (const auto& v : v_all) {
    for (uint16_t x : v) max_v = std::max(max_v, std::fabs(bf16_to_f32(x)));
  }
  const float scale = a.scale;
  double worst = 0.0;
  for (size_t s = 0; s < c.seqs.size(); ++s) {
    const int64_t n_q = c.decode ? 1 : c.seqs[s].q_len;
    for (int64_t t = 0; t < n_q; ++t) {
      const int64_t pos = seq_len[s] - n_q + t;  // keys 0..pos
      for (int64_t h = 0; h < c.n_heads; ++h) {
        const size_t qrow = static_cast<size_t>(((q_start[s] + t) * c.n_heads + h) * D);
        std::vector<double> ref(static_cast<size_t>(D), 0.0);  // the p.v sum in f64: no 4097-term f32 drift
        if (seq_len[s] > 0) {
          const int64_t kvh = h / group;
          std::vector<float> scores(static_cast<size_t>(pos + 1));
          for (int64_t j = 0; j <= pos; ++j) {
            float dot = 0.0f;
            for (int64_t d = 0; d < D; ++d) {
              dot += bf16_to_f32(q[qrow + static_cast<size_t>(d)]) *
                     bf16_to_f32(k_all[s][static_cast<size_t>(j * row + kvh * D + d)]);
            }
            scores[static_cast<size_t>(j)] = dot * scale;
          }
          model::softmax_inplace(scores.data(), pos + 1);
          for (int64_t j = 0; j <= pos; ++j) {
            for (int64_t d = 0; d < D; ++d) {
              ref[static_cast<size_t>(d)] +=
                  static_cast<double>(scores[static_cast<size_t>(j)]) * bf16_to_f32(v_all[s][static_cast<size_t>(j * row + kvh * D + d)]);
            }
          }
        }
        for (int64_t d = 0; d < D; ++d) {
          const float g = bf16_to_f32(got[qrow + static_cast<size_t>(d)]);
          const float e = static_cast<float>(ref[static_cast<size_t>(d)]);
          const float err = std::fabs(g - e);
          worst = std::max<double>(worst, max_v > 0.0f ? err / max_v : err);  // max_v 0: no key anywhere
          ASSERT_LE(err, std::ldexp(std::fabs(e), -8) * 1.001f + 2e-5f * max_v)
              << what << ": seq " << s << " (len " << seq_len[s] << ") query " << t << " (pos " << pos << ") head " << h
              << " dim " << d << " gpu " << g << " cpu " << e;
        }
      }
    }
  }
  std::printf("  %-60s max |err| / max|V| = %.3g\n", what.c_str(), worst);
}

void run_cases(const std::vector<AttnCase>& cases) {
  std::mt19937_64 rng(testing::test_seed());
  for (const AttnCase& c : cases) {
    run_case(c, rng);
    if (::testing::Test::HasFatalFailure()) return;
  }
}

const std::vector<SeqSpec> kMixedDecode{{0, 1}, {16, 1}, {299, 1}, {15, 1}, {32, 1}};  // lens 1, 17, 300, 16, 33

// Small shapes (also run under compute-sanitizer by scripts/gpu_check.sh). The decode case lists
// here and in test_cuda_ops_host.cpp (PagedAttentionGpuCases) must stay the same.
TEST(CudaPagedAttention, DecodeSmall) {
  SKIP_WITHOUT_GPU();
  run_cases({
      {"tiny group 2, d32, page 16", 4, 2, 32, 16, kMixedDecode, true},
      {"tiny, forced 5 x 64-key splits", 4, 2, 32, 16, kMixedDecode, true, DecodeSplit{5, 64}},
      {"tiny, 10 splits (each sequence cut by its length; short ones leave most empty)", 4, 2, 32, 16, kMixedDecode, true, DecodeSplit{10, 32}},
      {"mha d96, page 1", 3, 3, 96, 1, {{0, 1}, {40, 1}}, true},
      {"padded entry (seq_len 0)", 8, 2, 64, 16, {{20, 1}, {0, 0}, {5, 1}}, true, DecodeSplit{2, 32}},
      {"all entries padded, planner", 8, 2, 64, 16, {{0, 0}, {0, 0}}, true},
      {"all entries padded, 3 x 32-key splits", 8, 2, 64, 16, {{0, 0}, {0, 0}}, true, DecodeSplit{3, 32}},
  });
}

TEST(CudaPagedAttention, DecodeGlmShapes) {
  SKIP_WITHOUT_GPU();
  run_cases({
      {"glm45 96/8 heads, d128, page 64", 96, 8, 128, 64, {{0, 1}, {299, 1}, {999, 1}, {4096, 1}}, true},
      {"glm45 one long sequence (planner splits)", 96, 8, 128, 64, {{4096, 1}}, true},
      {"group 48 (two head chunks), d64", 96, 2, 64, 16, {{16, 1}, {300, 1}}, true, DecodeSplit{3, 128}},
  });
}

TEST(CudaPagedAttention, PrefillSmall) {
  SKIP_WITHOUT_GPU();
  run_cases({
      {"tiny group 2, d32, page 16", 4, 2, 32, 16, {{0, 17}, {283, 17}, {0, 1}, {15, 2}}, false},
      {"mha d64, page 1", 2, 2, 64, 1, {{0, 40}, {5, 1}}, false},
      {"d96 group 3", 6, 2, 96, 32, {{31, 35}}, false},
  });
}

TEST(CudaPagedAttention, PrefillGlmShapes) {
  SKIP_WITHOUT_GPU();
  run_cases({
      {"glm45 96/8 heads, d128, page 64", 96, 8, 128, 64, {{0, 300}, {100, 33}}, false},
      {"group 48, d128", 96, 2, 128, 16, {{7, 9}}, false},
  });
}

// A block id outside the pool and a sequence longer than its block table set their bits.
TEST(CudaPagedAttention, FlagsBadBlocksAndLengths) {
  SKIP_WITHOUT_GPU();
  const int64_t D = 32, page = 16, n_blocks = 4;
  auto k = device_alloc<uint16_t>(static_cast<size_t>(n_blocks * page * D));
  auto v = device_alloc<uint16_t>(static_cast<size_t>(n_blocks * page * D));
  FP4MOE_CUDA_CHECK(cudaMemset(k.get(), 0, n_blocks * page * D * 2));
  FP4MOE_CUDA_CHECK(cudaMemset(v.get(), 0, n_blocks * page * D * 2));
  auto q = device_alloc<uint16_t>(static_cast<size_t>(D));
  FP4MOE_CUDA_CHECK(cudaMemset(q.get(), 0, D * 2));
  auto out = device_alloc<uint16_t>(static_cast<size_t>(D));
  auto flag = device_alloc<uint32_t>(1);
  struct Bad {
    std::vector<int32_t> table;
    int32_t len;
    uint32_t bit;
  };
  for (const Bad& b : {Bad{{1, 9}, 20, kDeviceErrorKvBlock}, Bad{{1, 2}, 33, kDeviceErrorSeqLen}}) {
    FP4MOE_CUDA_CHECK(cudaMemset(flag.get(), 0, 4));
    auto table = upload(b.table);
    auto lens = upload(std::vector<int32_t>{b.len});
    PagedAttentionArgs a;
    a.q = cbf(q.get());
    a.cache = PagedKvCacheView{bf(k.get()), bf(v.get()), n_blocks, page, 1, D};
    a.block_table = table.get();
    a.max_blocks_per_seq = static_cast<int64_t>(b.table.size());
    a.seq_lens = lens.get();
    a.n_seqs = 1;
    a.n_heads = 1;
    a.scale = 1.0f;
    a.out = bf(out.get());
    a.error_flag = flag.get();
    paged_attention_decode_bf16(a, DecodeSplit{1, 64}, nullptr, nullptr);
    FP4MOE_CUDA_CHECK(cudaDeviceSynchronize());
    EXPECT_EQ(download(flag.get(), 1)[0], b.bit) << "table len " << b.table.size() << ", seq_len " << b.len;
  }
}

}  // namespace
}  // namespace fp4moe::cuda
