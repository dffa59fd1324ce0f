// GPU DSA lightning indexer (kernels/cuda/ops/dsa_indexer.h: dsa_index_cache_append,
// dsa_index_select_topk with dsa_selection_offsets) against the CPU model::dsa_select_topk
// (model/dsa_indexer.cpp) on the same inputs (bf16 q and w, w scaled by n_heads^-0.5 in f32 on both
// sides; keys f32, or bf16-rounded for the bf16 cache):
//   - the append kernel: each sequence's newest q_len keys are appended (token stride head_dim + 3,
//     plus a padded token with slot -1); the pool afterwards equals the expected pool bit for bit;
//   - the selection, EXACTLY (every query's ascending key list): glm5_tiny golden dims (8 index heads
//     x 32, top-8; page 16) with bf16 and f32 caches, and GLM-5 dims (32 heads x 128; top-2048 on
//     sequences of 2,100 and 2,500 keys, and top-64 on shorter ones; page 64); several sequences per
//     call with different q chunks (a 1-token sequence, chunks ending inside a page, whole prompts, a
//     long sequence with a partial chunk, no queries, a padded entry), and a decode-like batch (q_len
//     1 per sequence); queries that keep every causal key (pos + 1 <= topk) included.
// The GPU sums in another order than the CPU, so each scored query's inputs are redrawn until the
// CPU's k-th and (k+1)-th scores differ by more than twice the worst-case f32 error of either side,
// (head_dim + n_heads + 2) * 2^-24 * B with B = max_t sum_h |w_h| * scale * sum_x |q_hx k_tx|
// (2.03e-5 * B with a 5% cushion for GLM-5's 128 + 32; about 60-75% of the draws are redrawn at
// top-2048 of 2,500-3,000 keys, at most 500 draws a query): then the exact sets must agree.
// Label gpu; without a usable GPU every case skips with the reason.
// Run: test_cuda_dsa_indexer (FP4MOE_TEST_SEED=<n> replays a seed).
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/ops/device_errors.h"
#include "kernels/cuda/ops/dsa_indexer.h"
#include "kernels/cuda/ops/paged_attention.h"
#include "kernels/cuda_test_util.h"
#include "model/dsa_indexer.h"
#include "testing/testing.h"

namespace fp4moe::cuda {
namespace {

using gpu_test::device_alloc;
using gpu_test::upload;
using gpu_test::download;


struct SeqSpec {
  int64_t seq_len;  // keys cached, this step's included
  int64_t q_len;    // queries: the last q_len positions
};

struct IndexCase {
  std::string name;
  model::IndexerDims dims;
  int64_t page_size;
  std::vector<SeqSpec> seqs;
  DType cache_dtype;
  int64_t chunk_tokens = 0;  // > 0: a workspace of this many query tokens per sequence (chunked)
};

// f32 values stored as the cache dtype (bf16 values are already bf16-exact).
std::vector<uint8_t> encode(const std::vector<float>& v, DType t) {
  std::vector<uint8_t> b;
  if (t == DType::kBF16) {
    b.resize(v.size() * 2);
    for (size_t i = 0; i < v.size(); ++i) {
      const uint16_t x = f32_to_bf16(v[i]);
      std::memcpy(b.data() + 2 * i, &x, 2);
    }
  } else {
    b.resize(v.size() * 4);
    if (!v.empty()) std::memcpy(b.data(), v.data(), b.size());
  }
  return b;
}

float bf16_round(float x) { return bf16_to_f32(f32_to_bf16(x)); }

void run_case(const IndexCase& c, std::mt19937_64& rng) {
  const model::IndexerDims& d = c.dims;
  const int hd = d.head_dim, nh = d.n_heads;
  const bool is_bf16 = c.cache_dtype == DType::kBF16;
  const int64_t n_seqs = static_cast<int64_t>(c.seqs.size());
  std::normal_distribution<float> nd(0.0f, 1.0f);
  auto key_value = [&] { return is_bf16 ? bf16_round(nd(rng)) : nd(rng); };

  // Paged pool with shuffled blocks; keys of positions < seq_len - q_len are in it already.
  int64_t total_blocks = 0;
  for (const SeqSpec& s : c.seqs) total_blocks += (s.seq_len + c.page_size - 1) / c.page_size;
  const int64_t n_blocks = total_blocks + 2;
  std::vector<int32_t> perm(static_cast<size_t>(n_blocks));
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  std::vector<std::vector<int32_t>> tables(c.seqs.size());
  size_t next = 0;
  for (size_t s = 0; s < tables.size(); ++s) {
    for (int64_t b = 0; b < (c.seqs[s].seq_len + c.page_size - 1) / c.page_size; ++b) tables[s].push_back(perm[next++]);
  }
  int64_t max_blocks = 0;
  const std::vector<int32_t> packed = pack_block_tables(tables, n_blocks, &max_blocks);
  std::vector<float> pool(static_cast<size_t>(n_blocks * c.page_size * hd));
  for (float& x : pool) x = key_value();
  std::vector<float> expect = pool;
  std::vector<std::vector<float>> keys(c.seqs.size());
  const int64_t k_stride = hd + 3;
  std::vector<float> k_in;
  std::vector<int32_t> slots;
  for (size_t s = 0; s < keys.size(); ++s) {
    const SeqSpec& spec = c.seqs[s];
    keys[s].resize(static_cast<size_t>(spec.seq_len * hd));
    for (float& x : keys[s]) x = key_value();
    for (int64_t p = 0; p < spec.seq_len; ++p) {
      const int32_t slot = kv_slot(tables[s], p, c.page_size);
      const auto src = keys[s].begin() + p * hd;
      std::copy_n(src, hd, expect.begin() + static_cast<int64_t>(slot) * hd);
      if (p < spec.seq_len - spec.q_len) {
        std::copy_n(src, hd, pool.begin() + static_cast<int64_t>(slot) * hd);
      } else {
        std::vector<float> row(static_cast<size_t>(k_stride));
        for (float& x : row) x = key_value();
        std::copy_n(src, hd, row.begin());
        k_in.insert(k_in.end(), row.begin(), row.end());
        slots.push_back(slot);
      }
    }
  }
  k_in.resize(k_in.size() + static_cast<size_t>(k_stride), 1.0f);  // a padded token (slot -1)
  slots.push_back(-1);

  // Queries: rows, positions, q (bf16) and w (bf16, unscaled).
  std::vector<int32_t> q_start{0}, lens32;
  std::vector<int64_t> pos;
  std::vector<size_t> seq_of;
  int64_t max_q_len = 0, max_seq_len = 0;
  for (size_t s = 0; s < c.seqs.size(); ++s) {
    q_start.push_back(q_start.back() + static_cast<int32_t>(c.seqs[s].q_len));
    lens32.push_back(static_cast<int32_t>(c.seqs[s].seq_len));
    max_q_len = std::max(max_q_len, c.seqs[s].q_len);
    max_seq_len = std::max(max_seq_len, c.seqs[s].seq_len);
    for (int64_t j = 0; j < c.seqs[s].q_len; ++j) {
      pos.push_back(c.seqs[s].seq_len - c.seqs[s].q_len + j);
      seq_of.push_back(s);
    }
  }
  const int64_t n_tokens = q_start.back();
  std::vector<uint16_t> q(static_cast<size_t>(n_tokens * nh * hd)), w(static_cast<size_t>(n_tokens * nh));
  const float wscale = d.weight_scale(), scale = d.softmax_scale();
  std::vector<model::IndexerKeyCache> caches;
  for (size_t s = 0; s < keys.size(); ++s) {
    caches.emplace_back(hd);
    for (int64_t p = 0; p < c.seqs[s].seq_len; ++p) caches.back().append(keys[s].data() + p * hd);
  }
  // Draw query i until its k-th and (k+1)-th CPU scores are farther apart than twice the f32 error.
  std::vector<float> qf_all(q.size()), wf_all(w.size());
  for (int64_t i = 0; i < n_tokens; ++i) {
    const int64_t n_causal = pos[static_cast<size_t>(i)] + 1;
    const int64_t k = std::min<int64_t>(d.index_topk, n_causal);
    const size_t s = seq_of[static_cast<size_t>(i)];
    uint16_t* qi = q.data() + i * nh * hd;
    uint16_t* wi = w.data() + i * nh;
    float* qf = qf_all.data() + i * nh * hd;
    float* wf = wf_all.data() + i * nh;
    bool ok = false;
    for (int attempt = 0; attempt < 500 && !ok; ++attempt) {
      for (int x = 0; x < nh * hd; ++x) {
        qi[x] = f32_to_bf16(nd(rng));
        qf[x] = bf16_to_f32(qi[x]);
      }
      for (int h = 0; h < nh; ++h) {
        wi[h] = f32_to_bf16(nd(rng));
        wf[h] = bf16_to_f32(wi[h]) * wscale;  // as Glm5Model: iw *= weight_scale
      }
      if (k == n_causal) break;  // not scored: any draw is exact
      std::vector<float> sc(static_cast<size_t>(n_causal));
      model::dsa_index_scores(d, qf, wf, caches[s], pos[static_cast<size_t>(i)], sc.data());
      double bound = 0.0;
      for (int64_t t = 0; t < n_causal; ++t) {
        const float* kt = caches[s].key(t);
        double b = 0.0;
        for (int h = 0; h < nh; ++h) {
          double a = 0.0;
          for (int x = 0; x < hd; ++x) a += std::fabs(static_cast<double>(qf[h * hd + x]) * kt[x]);
          b += std::fabs(wf[h]) * scale * a;
        }
        bound = std::max(bound, b);
      }
      std::nth_element(sc.begin(), sc.begin() + k, sc.end(), std::greater<float>());
      const float kth = *std::min_element(sc.begin(), sc.begin() + k);  // the k-th largest
      const float next_best = sc[static_cast<size_t>(k)];               // the (k+1)-th largest
      const double margin = 2.0 * (hd + nh + 2) * std::ldexp(1.0, -24) * bound * 1.05;
      ok = static_cast<double>(kth) - static_cast<double>(next_best) > margin;
    }
    ASSERT_TRUE(ok || k == n_causal) << c.name << ": no tie-free draw for query " << i << " (pos " << pos[i] << ")";
  }

  // GPU: append, offsets, select.
  std::vector<int32_t> offsets = dsa_selection_offsets(lens32, q_start, d.index_topk);
  const std::vector<uint8_t> pool_bytes = encode(pool, c.cache_dtype), expect_bytes = encode(expect, c.cache_dtype);
  const std::vector<uint8_t> k_in_bytes = encode(k_in, c.cache_dtype);
  auto dpool = upload(pool_bytes);
  auto dk = upload(k_in_bytes);
  auto dslots = upload(slots);
  auto flag = device_alloc<uint32_t>(1);
  FP4MOE_CUDA_CHECK(cudaMemset(flag.get(), 0, 4));
  const DsaIndexCacheView view{dpool.get(), c.cache_dtype, n_blocks, c.page_size, hd};
  dsa_index_cache_append(dk.get(), k_stride, static_cast<int64_t>(slots.size()), dslots.get(), view, flag.get(),
                         nullptr);
  FP4MOE_CUDA_CHECK(cudaDeviceSynchronize());
  ASSERT_TRUE(download(dpool.get(), pool_bytes.size()) == expect_bytes) << c.name << ": pool after append";

  auto dq = upload(q);
  auto dw = upload(w);
  auto dtable = upload(packed);
  auto dlens = upload(lens32);
  auto dqstart = upload(q_start);
  auto doff = upload(offsets);
  const int64_t n_selected = offsets.back();
  auto didx = device_alloc<int32_t>(static_cast<size_t>(n_selected));
  FP4MOE_CUDA_CHECK(cudaMemset(didx.get(), 0xff, static_cast<size_t>(std::max<int64_t>(n_selected, 1)) * 4));
  const size_t ws = c.chunk_tokens > 0
                       ? static_cast<size_t>(n_seqs * c.chunk_tokens * max_seq_len) * sizeof(float)
                       : dsa_index_workspace_bytes(n_seqs, max_q_len, max_seq_len);
  auto dws = device_alloc<float>(ws / 4);
  DsaIndexerArgs a;
  a.q = reinterpret_cast<const __nv_bfloat16*>(dq.get());
  a.w = reinterpret_cast<const __nv_bfloat16*>(dw.get());
  a.cache = view;
  a.block_table = dtable.get();
  a.max_blocks_per_seq = max_blocks;
  a.seq_lens = dlens.get();
  a.q_start = dqstart.get();
  a.n_seqs = n_seqs;
  a.n_tokens = n_tokens;
  a.max_q_len = max_q_len;
  a.max_seq_len = max_seq_len;
  a.sel_offsets = doff.get();
  a.n_selected = n_selected;
  a.sel_idx = didx.get();
  a.error_flag = flag.get();
  const DsaIndexerDims dims{nh, hd, d.index_topk, scale, wscale};
  const std::string what = c.name + " [" + dsa_index_plan(dims, n_seqs, max_q_len, max_seq_len, ws).to_string() + "]";
  dsa_index_select_topk(a, dims, dws.get(), ws, nullptr);
  FP4MOE_CUDA_CHECK(cudaDeviceSynchronize());
  const uint32_t flags = download(flag.get(), 1)[0];
  ASSERT_EQ(flags, 0u) << what << ": device errors " << describe_device_errors(flags);
  const std::vector<int32_t> got = download(didx.get(), static_cast<size_t>(n_selected));

  for (int64_t s = 0; s < n_seqs; ++s) {
    const SeqSpec& spec = c.seqs[static_cast<size_t>(s)];
    if (spec.q_len == 0) continue;
    const int64_t r0 = q_start[static_cast<size_t>(s)];
    const model::KeySelection ref = model::dsa_select_topk(d, qf_all.data() + r0 * nh * hd, wf_all.data() + r0 * nh,
                                                           pos.data() + r0, spec.q_len, caches[static_cast<size_t>(s)]);
    for (int64_t j = 0; j < spec.q_len; ++j) {
      const auto want = ref.keys_of(j);
      const int64_t o0 = offsets[static_cast<size_t>(r0 + j)], o1 = offsets[static_cast<size_t>(r0 + j + 1)];
      ASSERT_EQ(o1 - o0, static_cast<int64_t>(want.size())) << what << ": seq " << s << " query " << j;
      const std::vector<int32_t> g(got.begin() + o0, got.begin() + o1);
      const std::vector<int32_t> w_keys(want.begin(), want.end());
      if (g != w_keys) {
        size_t first = 0;
        while (first < g.size() && g[first] == w_keys[first]) ++first;
        FAIL() << what << ": seq " << s << " (seq_len " << spec.seq_len << ", q_len " << spec.q_len << ") query " << j
               << " (pos " << pos[static_cast<size_t>(r0 + j)] << ", keeps " << g.size() << "): first difference at "
               << first << ": gpu " << g[first] << " cpu " << w_keys[first];
      }
    }
  }
}

const model::IndexerDims kTiny{8, 32, 16, 8};
const model::IndexerDims kGlm5{32, 128, 64, 2048};
const model::IndexerDims kGlm5Top64{32, 128, 64, 64};
const std::vector<SeqSpec> kPrefill{{1, 1}, {17, 5}, {64, 64}, {300, 40}, {50, 0}, {130, 130}, {0, 0}};
const std::vector<SeqSpec> kDecode{{1, 1}, {17, 1}, {300, 1}, {0, 0}, {129, 1}, {1000, 1}};

void run_cases(const std::vector<IndexCase>& cases) {
  std::mt19937_64 rng(testing::test_seed());
  for (const IndexCase& c : cases) {
    run_case(c, rng);
    if (::testing::Test::HasFatalFailure()) return;
  }
}

TEST(CudaDsaIndexer, TinyMatchesCpu) {
  SKIP_WITHOUT_GPU();
  run_cases({
      {"glm5_tiny indexer (8 x 32, top-8), bf16 cache", kTiny, 16, kPrefill, DType::kBF16},
      {"glm5_tiny indexer, f32 cache", kTiny, 16, kPrefill, DType::kF32},
      {"glm5_tiny indexer, decode, f32 cache", kTiny, 16, kDecode, DType::kF32},
  });
}

TEST(CudaDsaIndexer, Glm5DimsMatchesCpu) {
  SKIP_WITHOUT_GPU();
  run_cases({
      {"glm5 indexer (32 x 128), top-64, bf16 cache", kGlm5Top64, 64, {{300, 40}, {64, 64}, {17, 5}, {1, 1}},
       DType::kBF16},
      {"glm5 indexer, top-2048, bf16 cache", kGlm5, 64, {{2500, 20}, {2100, 2100}, {333, 7}, {1, 1}, {0, 0}},
       DType::kBF16},
      {"glm5 indexer, top-2048, decode, f32 cache", kGlm5, 64, {{2049, 1}, {3000, 1}, {5, 1}, {2048, 1}},
       DType::kF32},
  });
}

// A workspace smaller than the step's queries: the indexer runs in chunks of query tokens (3 and 7
// tokens per sequence here: 44 chunks over 130 prompt tokens, 6 over 40), same selections.
TEST(CudaDsaIndexer, ChunkedWorkspaceMatchesCpu) {
  SKIP_WITHOUT_GPU();
  run_cases({
      {"glm5_tiny indexer, 3-token chunks", kTiny, 16, kPrefill, DType::kBF16, 3},
      {"glm5 indexer, top-64, 7-token chunks", kGlm5Top64, 64, {{300, 40}, {64, 64}, {17, 5}, {1, 1}},
       DType::kBF16, 7},
  });
}

}  // namespace
}  // namespace fp4moe::cuda
