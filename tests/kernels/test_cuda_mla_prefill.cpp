// GPU MLA attention for many queries per sequence (kernels/cuda/ops/mla_prefill.h:
// mla_prefill_attention, with mla_decode.h's mla_absorb_q / mla_project_v over n_tokens rows) against
// the CPU model::mla_attention_absorbed (model/mla.cpp) on the same bf16-rounded inputs (q with
// rotated q_pe, the paged latent cache [c_kv | k_pe], kv_b_proj):
//   - the glm5_tiny golden dims (4 heads, rank 32, rope 16, nope 32, v 32; page 16) and GLM-5 dims
//     with a reduced head count (20 heads: two 16-head chunks, the second partial; rank 512, rope 64,
//     nope 192, v 256; page 64; 74,112 B of shared memory, above the 48 KiB default);
//   - several sequences per call with different q chunks: a 1-token sequence, chunks ending inside a
//     page (17 tokens, 5 queries), a whole-page chunk (64/64), a long sequence with a partial chunk
//     (300 keys, 40 queries), a whole prompt (130/130), an entry with no queries (50 keys, 0 queries)
//     and a padded entry (seq_len 0); blocks shuffled in the pool, random data in unused slots;
//   - dense causal keys and DSA selections on the device (random ascending subsets of 0..pos of
//     min(topk, pos + 1) keys, topk 8 = glm5_tiny's index_topk, 100, 128; and random list lengths
//     1..pos+1), one split, forced splits (incl. always-empty ones) and the planner's;
//   - decode with a DSA selection: q_len 1 per sequence (q_start 0, 1, 2, ...) through the same call;
//   - a selected key past its query's position sets kDeviceErrorKeySelection.
// Tolerance per output element: |gpu - cpu| <= 2^-8 |cpu| + 1e-4 max|cpu| (bf16 output rounding is
// 2^-9 relative; the f32 sums differ in order only).
// Label gpu; without a usable GPU every case skips with the reason.
// Run: test_cuda_mla_prefill (FP4MOE_TEST_SEED=<n> replays a seed).
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/ops/device_errors.h"
#include "kernels/cuda/ops/mla_decode.h"
#include "kernels/cuda/ops/mla_prefill.h"
#include "kernels/cuda_test_util.h"
#include "model/mla.h"
#include "testing/testing.h"

namespace fp4moe::cuda {
namespace {

using gpu_test::device_alloc;
using gpu_test::CublasHandle;
using gpu_test::upload;
using gpu_test::random_bf16;
using gpu_test::to_f32;
using gpu_test::download;
using gpu_test::cbf;
using gpu_test::bf;


struct SeqSpec {
  int64_t seq_len;  // cached tokens, this step's included
  int64_t q_len;    // queries: the last q_len positions
};

constexpr int64_t kDense = 0;          // topk value: dense causal keys
constexpr int64_t kRandomCounts = -1;  // topk value: each query keeps a random 1..pos+1 keys

struct PrefillCase {
  std::string name;
  model::MlaDims dims;
  int64_t page_size;
  std::vector<SeqSpec> seqs;
  int64_t topk;       // kDense, kRandomCounts, or keys kept per query (min(topk, pos + 1))
  DecodeSplit split;  // n_splits 0: plan_mla_prefill_split for 132 SMs
  bool corrupt = false;  // one selected key past its query's position: expect kDeviceErrorKeySelection
};

void run_case(const PrefillCase& c, std::mt19937_64& rng) {
  const model::MlaDims& d = c.dims;
  const int rank = d.kv_lora_rank, rope = d.qk_rope_head_dim, W = rank + rope;
  const int qk = d.qk_head_dim(), vd = d.v_head_dim;
  const int64_t n_seqs = static_cast<int64_t>(c.seqs.size());

  // Paged pool: each sequence's blocks shuffled in, random data everywhere else.
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
  std::vector<uint16_t> pool = random_bf16(static_cast<size_t>(n_blocks * c.page_size * W), rng, 1.0f);
  std::vector<std::vector<uint16_t>> rows(c.seqs.size());
  for (size_t s = 0; s < rows.size(); ++s) {
    rows[s] = random_bf16(static_cast<size_t>(c.seqs[s].seq_len * W), rng, 1.0f);
    for (int64_t p = 0; p < c.seqs[s].seq_len; ++p) {
      const size_t dst = static_cast<size_t>(kv_slot(tables[s], p, c.page_size)) * static_cast<size_t>(W);
      std::copy_n(rows[s].begin() + p * W, W, pool.begin() + dst);
    }
  }

  // Query rows, positions and (optionally) the selection CSR.
  std::vector<int32_t> q_start{0}, lens32;
  std::vector<int64_t> pos;
  int64_t max_q_len = 0, max_keys = 0;
  for (const SeqSpec& s : c.seqs) {
    q_start.push_back(q_start.back() + static_cast<int32_t>(s.q_len));
    lens32.push_back(static_cast<int32_t>(s.seq_len));
    max_q_len = std::max(max_q_len, s.q_len);
    for (int64_t j = 0; j < s.q_len; ++j) pos.push_back(s.seq_len - s.q_len + j);
  }
  const int64_t n_tokens = q_start.back();
  std::vector<int32_t> sel_offsets, sel_idx;
  if (c.topk != kDense) {
    sel_offsets.push_back(0);
    for (int64_t i = 0; i < n_tokens; ++i) {
      std::vector<int32_t> all(static_cast<size_t>(pos[static_cast<size_t>(i)] + 1));
      std::iota(all.begin(), all.end(), 0);
      std::shuffle(all.begin(), all.end(), rng);
      const int64_t k = c.topk == kRandomCounts ? 1 + static_cast<int64_t>(rng() % all.size())
                                                : std::min<int64_t>(c.topk, static_cast<int64_t>(all.size()));
      all.resize(static_cast<size_t>(k));
      std::sort(all.begin(), all.end());
      sel_idx.insert(sel_idx.end(), all.begin(), all.end());
      sel_offsets.push_back(static_cast<int32_t>(sel_idx.size()));
      max_keys = std::max(max_keys, k);
    }
    if (c.corrupt) {  // the last query's first key -> one past its position
      sel_idx[static_cast<size_t>(sel_offsets[static_cast<size_t>(n_tokens - 1)])] = static_cast<int32_t>(pos.back() + 1);
    }
  } else {
    for (int64_t p : pos) max_keys = std::max(max_keys, p + 1);
  }

  const std::vector<uint16_t> q = random_bf16(static_cast<size_t>(n_tokens * d.n_heads * qk), rng, 1.0f);
  const std::vector<uint16_t> kv_b =
      random_bf16(static_cast<size_t>(d.n_heads) * d.kv_b_rows_per_head() * rank, rng, 1.0f / std::sqrt(float(rank)));
  const MlaDecodeDims dims{d.n_heads, rank, d.qk_nope_head_dim, rope, vd, d.softmax_scale()};
  const DecodeSplit split =
      c.split.n_splits > 0 ? c.split : plan_mla_prefill_split(n_tokens, d.n_heads, max_keys, 132);
  const std::string what = c.name + " [" + split.to_string() + "]";

  auto dpool = upload(pool);
  auto dq = upload(q);
  auto dkvb = upload(kv_b);
  auto dtable = upload(packed);
  auto dlens = upload(lens32);
  auto dqstart = upload(q_start);
  auto doff = upload(sel_offsets);
  auto didx = upload(sel_idx);
  auto flag = device_alloc<uint32_t>(1);
  FP4MOE_CUDA_CHECK(cudaMemset(flag.get(), 0, 4));
  auto dqlat = device_alloc<float>(static_cast<size_t>(n_tokens * d.n_heads * W));
  auto dlat = device_alloc<float>(static_cast<size_t>(n_tokens * d.n_heads * rank));
  const size_t ws = mla_prefill_workspace_bytes(n_tokens, dims, split);
  auto dws = device_alloc<float>(ws / 4);
  auto dout = device_alloc<uint16_t>(static_cast<size_t>(n_tokens * d.n_heads * vd));

  MlaPrefillArgs a;
  a.q_lat = dqlat.get();
  a.cache = MlaCacheView{bf(dpool.get()), n_blocks, c.page_size, rank, rope};
  a.block_table = dtable.get();
  a.max_blocks_per_seq = max_blocks;
  a.seq_lens = dlens.get();
  a.q_start = dqstart.get();
  a.n_seqs = n_seqs;
  a.n_tokens = n_tokens;
  a.max_q_len = max_q_len;
  if (c.topk != kDense) {
    a.sel_offsets = doff.get();
    a.sel_idx = didx.get();
    a.n_selected = static_cast<int64_t>(sel_idx.size());
  }
  a.latent = dlat.get();
  a.error_flag = flag.get();
  const CublasHandle cublas;
  mla_absorb_q(cbf(dq.get()), cbf(dkvb.get()), dims, n_tokens, dqlat.get(), cublas.get(), nullptr);  // rows = tokens
  mla_prefill_attention(a, dims, split, ws ? dws.get() : nullptr, nullptr);
  auto dpws = device_alloc<char>(mla_project_v_workspace_bytes(n_tokens, dims));
  mla_project_v(dlat.get(), cbf(dkvb.get()), dims, n_tokens, dpws.get(), bf(dout.get()), cublas.get(), nullptr);
  FP4MOE_CUDA_CHECK(cudaDeviceSynchronize());
  const uint32_t flags = download(flag.get(), 1)[0];
  if (c.corrupt) {
    ASSERT_EQ(flags, kDeviceErrorKeySelection) << what << ": device errors " << describe_device_errors(flags);
    return;
  }
  ASSERT_EQ(flags, 0u) << what << ": device errors " << describe_device_errors(flags);
  const std::vector<uint16_t> got = download(dout.get(), static_cast<size_t>(n_tokens * d.n_heads * vd));

  // The attention step alone, at f32 accuracy: each query row's latent from the GPU's own q_lat,
  // against an f64 softmax over the same key list. Bound: 2^-14 of the row's largest |latent|.
  {
    const std::vector<float> qlat = download(dqlat.get(), static_cast<size_t>(n_tokens * d.n_heads * W));
    const std::vector<float> lat = download(dlat.get(), static_cast<size_t>(n_tokens * d.n_heads * rank));
    double worst = 0;
    for (int64_t s = 0; s < n_seqs; ++s) {
      for (int64_t i = q_start[static_cast<size_t>(s)]; i < q_start[static_cast<size_t>(s) + 1]; ++i) {
        std::vector<int64_t> keys;
        if (c.topk != kDense) {
          for (int32_t o = sel_offsets[static_cast<size_t>(i)]; o < sel_offsets[static_cast<size_t>(i) + 1]; ++o) {
            keys.push_back(sel_idx[static_cast<size_t>(o)]);
          }
        } else {
          for (int64_t p = 0; p <= pos[static_cast<size_t>(i)]; ++p) keys.push_back(p);
        }
        for (int h = 0; h < d.n_heads; ++h) {
          const float* qr = qlat.data() + (i * d.n_heads + h) * W;
          std::vector<double> sc(keys.size()), lref(static_cast<size_t>(rank), 0.0);
          double mx = -1e300, sum = 0;
          for (size_t k = 0; k < keys.size(); ++k) {
            const uint16_t* kr = rows[static_cast<size_t>(s)].data() + keys[k] * W;
            double dot = 0;
            for (int x = 0; x < W; ++x) dot += static_cast<double>(qr[x]) * bf16_to_f32(kr[x]);
            sc[k] = dot * d.softmax_scale();
            mx = std::max(mx, sc[k]);
          }
          for (size_t k = 0; k < keys.size(); ++k) {
            const uint16_t* kr = rows[static_cast<size_t>(s)].data() + keys[k] * W;
            const double e = std::exp(sc[k] - mx);
            sum += e;
            for (int x = 0; x < rank; ++x) lref[static_cast<size_t>(x)] += e * bf16_to_f32(kr[x]);
          }
          double row_max = 0;
          for (double& v : lref) {
            v /= sum;
            row_max = std::max(row_max, std::fabs(v));
          }
          for (int x = 0; x < rank; ++x) {
            const double g = lat[static_cast<size_t>((i * d.n_heads + h) * rank + x)];
            const double err = std::fabs(g - lref[static_cast<size_t>(x)]);
            worst = std::max(worst, err / (row_max + 1e-30));
            ASSERT_LE(err, std::ldexp(row_max, -14) + 1e-30)
                << what << ": latent of query row " << i << " (pos " << pos[static_cast<size_t>(i)] << ", "
                << keys.size() << " keys) head " << h << " dim " << x << " gpu " << g << " f64 "
                << lref[static_cast<size_t>(x)];
          }
        }
      }
    }
    std::printf("[mla_prefill] %s: latent vs f64 attention, worst |err| / row max |latent| = %.3g\n", what.c_str(),
                worst);
  }

  const std::vector<float> kv_b_f = to_f32(kv_b.data(), kv_b.size());
  for (int64_t s = 0; s < n_seqs; ++s) {
    const SeqSpec& spec = c.seqs[static_cast<size_t>(s)];
    if (spec.q_len == 0) continue;
    model::MlaLatentCache lc(rank, rope);
    for (int64_t p = 0; p < spec.seq_len; ++p) {
      const std::vector<float> row = to_f32(rows[static_cast<size_t>(s)].data() + p * W, static_cast<size_t>(W));
      lc.append(row.data(), row.data() + rank);
    }
    const int64_t r0 = q_start[static_cast<size_t>(s)];
    const std::vector<float> qf = to_f32(q.data() + r0 * d.n_heads * qk, static_cast<size_t>(spec.q_len * d.n_heads * qk));
    model::KeySelection keys;
    if (c.topk != kDense) {
      const int64_t base = sel_offsets[static_cast<size_t>(r0)];
      for (int64_t j = 0; j <= spec.q_len; ++j) keys.offsets.push_back(sel_offsets[static_cast<size_t>(r0 + j)] - base);
      keys.idx.assign(sel_idx.begin() + base, sel_idx.begin() + sel_offsets[static_cast<size_t>(r0 + spec.q_len)]);
    }
    std::vector<float> ref(static_cast<size_t>(spec.q_len * d.n_heads * vd), 0.0f);
    model::MlaAttentionArgs args;
    args.dims = &d;
    args.q = qf.data();
    args.q_pos = pos.data() + r0;
    args.n_q = spec.q_len;
    args.cache = &lc;
    args.kv_b = kv_b_f.data();
    args.keys = &keys;
    args.out = ref.data();
    model::mla_attention_absorbed(args);
    float max_ref = 0.0f;
    for (float v : ref) max_ref = std::max(max_ref, std::fabs(v));
    const size_t per_tok = static_cast<size_t>(d.n_heads * vd);
    for (size_t i = 0; i < ref.size(); ++i) {
      const float g = bf16_to_f32(got[static_cast<size_t>(r0) * per_tok + i]);
      ASSERT_LE(std::fabs(g - ref[i]), std::ldexp(std::fabs(ref[i]), -8) * 1.001f + 1e-4f * max_ref)
          << what << ": seq " << s << " (seq_len " << spec.seq_len << ", q_len " << spec.q_len << ") query "
          << i / per_tok << " (pos " << pos[static_cast<size_t>(r0) + i / per_tok] << ") head "
          << (i % per_tok) / vd << " dim " << i % vd << " gpu " << g << " cpu " << ref[i];
    }
  }
}

const model::MlaDims kTiny{4, 32, 32, 16, 32};
const model::MlaDims kGlm5{20, 512, 192, 64, 256};
const std::vector<SeqSpec> kPrefill{{1, 1}, {17, 5}, {64, 64}, {300, 40}, {50, 0}, {130, 130}, {0, 0}};
const std::vector<SeqSpec> kDecode{{1, 1}, {17, 1}, {300, 1}, {0, 0}, {129, 1}, {1000, 1}};

void run_cases(const std::vector<PrefillCase>& cases) {
  std::mt19937_64 rng(testing::test_seed());
  for (const PrefillCase& c : cases) {
    run_case(c, rng);
    if (::testing::Test::HasFatalFailure()) return;
  }
}

TEST(CudaMlaPrefill, TinyDenseMatchesCpu) {
  SKIP_WITHOUT_GPU();
  run_cases({
      {"glm5_tiny dims, dense, planner", kTiny, 16, kPrefill, kDense, DecodeSplit{0, 0}},
      {"glm5_tiny dims, dense, one split", kTiny, 16, kPrefill, kDense, DecodeSplit{1, 320}},
      {"glm5_tiny dims, dense, forced splits", kTiny, 16, kPrefill, kDense, DecodeSplit{7, 64}},
  });
}

TEST(CudaMlaPrefill, TinySparseMatchesCpu) {
  SKIP_WITHOUT_GPU();
  run_cases({
      {"glm5_tiny dims, DSA top-8, planner", kTiny, 16, kPrefill, 8, DecodeSplit{0, 0}},
      {"glm5_tiny dims, DSA top-8, forced splits", kTiny, 16, kPrefill, 8, DecodeSplit{3, 32}},
      {"glm5_tiny dims, random list lengths, forced splits", kTiny, 16, kPrefill, kRandomCounts, DecodeSplit{4, 96}},
      {"glm5_tiny dims, random list lengths, one split", kTiny, 16, kPrefill, kRandomCounts, DecodeSplit{1, 320}},
  });
}

TEST(CudaMlaPrefill, TinyDecodeWithSelectionMatchesCpu) {
  SKIP_WITHOUT_GPU();
  run_cases({
      {"glm5_tiny dims, decode, DSA top-100, planner", kTiny, 16, kDecode, 100, DecodeSplit{0, 0}},
      {"glm5_tiny dims, decode, DSA top-100, forced splits", kTiny, 16, kDecode, 100, DecodeSplit{4, 32}},
      {"glm5_tiny dims, decode, dense, forced splits", kTiny, 16, kDecode, kDense, DecodeSplit{5, 224}},
  });
}

TEST(CudaMlaPrefill, Glm5DimsMatchesCpu) {
  SKIP_WITHOUT_GPU();
  run_cases({
      {"glm5 dims (20 heads, rank 512), dense, planner", kGlm5, 64, kPrefill, kDense, DecodeSplit{0, 0}},
      {"glm5 dims, DSA top-100, forced splits", kGlm5, 64, kPrefill, 100, DecodeSplit{3, 64}},
      {"glm5 dims, random list lengths, one split", kGlm5, 64, kPrefill, kRandomCounts, DecodeSplit{1, 320}},
      {"glm5 dims, decode, DSA top-128, planner", kGlm5, 64, kDecode, 128, DecodeSplit{0, 0}},
      {"glm5 dims, decode, DSA top-128, forced splits", kGlm5, 64, kDecode, 128, DecodeSplit{4, 32}},
  });
}

TEST(CudaMlaPrefill, KeyPastPositionSetsFlag) {
  SKIP_WITHOUT_GPU();
  run_cases({{"glm5_tiny dims, corrupt selection", kTiny, 16, kPrefill, 8, DecodeSplit{1, 320}, true}});
}

}  // namespace
}  // namespace fp4moe::cuda
