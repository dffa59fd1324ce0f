// GPU MLA absorbed-form decode (kernels/cuda/ops/mla_decode.h: mla_cache_append_bf16, mla_absorb_q,
// mla_decode_attention, mla_project_v) against the CPU model::mla_attention_absorbed (model/mla.cpp)
// on the same bf16-rounded inputs (q with rotated q_pe, the latent cache [c_kv | k_pe], kv_b_proj),
// one decode query per sequence at position seq_len - 1 (dense keys):
//   - the glm5_tiny golden dims (4 heads, rank 32, rope 16, nope 32, v 32) and GLM-5-like dims
//     (20 heads: two 16-head chunks, the second partial; rank 512, rope 64, nope 192, v 256; 73,856 B
//     of shared memory, above the 48 KiB default);
//   - sequence lengths 1, 17, 64 (a page boundary), 300, a padded entry (seq_len 0 -> zeros), blocks
//     shuffled in the pool and random data in unused slots;
//   - one split, forced splits (incl. always-empty ones) and the planner's;
//   - the append kernel: every new token's [c_kv | k_pe] lands in its slot, slot -1 is skipped,
//     nothing else changes (bit for bit);
//   - mla_project_v alone over 1..300 sequences (passes of 256: one, exactly one full, a full and a
//     partial) against an f64 product of the f32 latent: within 2^-8 |ref| + 2^-14 sum |W x latent| (the
//     bf16 rounding, the hi + lo split's ~2^-17 and f32 sums), nothing written past the output, and
//     a workspace that stops growing at 256 sequences.
// Tolerance per output element: |gpu - cpu| <= 2^-8 |cpu| + 1e-4 max|cpu| (bf16 output rounding is
// 2^-9 relative; the f32 sums differ in order only).
// Label gpu; without a usable GPU every case skips with the reason.
// Run: test_cuda_mla_decode (FP4MOE_TEST_SEED=<n> replays a seed).
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


struct MlaCase {
  std::string name;
  model::MlaDims dims;
  int64_t page_size;
  std::vector<int64_t> seq_lens;  // cached tokens after this step's append (0: padded entry)
  DecodeSplit split;              // n_splits 0: plan_mla_decode_split for 132 SMs
};

void run_case(const MlaCase& c, std::mt19937_64& rng) {
  const model::MlaDims& d = c.dims;
  const int rank = d.kv_lora_rank, rope = d.qk_rope_head_dim, W = rank + rope;
  const int qk = d.qk_head_dim(), vd = d.v_head_dim;
  const int64_t n_seqs = static_cast<int64_t>(c.seq_lens.size());
  int64_t total_blocks = 0;
  for (int64_t len : c.seq_lens) total_blocks += (len + c.page_size - 1) / c.page_size;
  const int64_t n_blocks = total_blocks + 2;
  std::vector<int32_t> perm(static_cast<size_t>(n_blocks));
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  std::vector<std::vector<int32_t>> tables(c.seq_lens.size());
  size_t next = 0;
  for (size_t s = 0; s < tables.size(); ++s) {
    for (int64_t b = 0; b < (c.seq_lens[s] + c.page_size - 1) / c.page_size; ++b) tables[s].push_back(perm[next++]);
  }
  int64_t max_blocks = 0;
  const std::vector<int32_t> packed = pack_block_tables(tables, n_blocks, &max_blocks);

  // Latent rows per sequence; all but the last are in the pool already, the last is appended.
  const size_t pool_elems = static_cast<size_t>(n_blocks * c.page_size * W);
  std::vector<uint16_t> pool = random_bf16(pool_elems, rng, 1.0f), expect;
  std::vector<std::vector<uint16_t>> rows(c.seq_lens.size());
  std::vector<uint16_t> c_in, pe_in;  // appended tokens: c_kv stride rank + 2, k_pe stride rope + 4
  std::vector<int32_t> slots;
  for (size_t s = 0; s < rows.size(); ++s) {
    rows[s] = random_bf16(static_cast<size_t>(c.seq_lens[s] * W), rng, 1.0f);
    for (int64_t p = 0; p < c.seq_lens[s]; ++p) {
      const size_t dst = static_cast<size_t>(kv_slot(tables[s], p, c.page_size)) * static_cast<size_t>(W);
      const auto src = rows[s].begin() + p * W;
      if (p + 1 < c.seq_lens[s]) {
        std::copy_n(src, W, pool.begin() + dst);
      } else {
        std::vector<uint16_t> cr = random_bf16(static_cast<size_t>(rank + 2), rng, 1.0f);
        std::vector<uint16_t> pr = random_bf16(static_cast<size_t>(rope + 4), rng, 1.0f);
        std::copy_n(src, rank, cr.begin());
        std::copy_n(src + rank, rope, pr.begin());
        c_in.insert(c_in.end(), cr.begin(), cr.end());
        pe_in.insert(pe_in.end(), pr.begin(), pr.end());
        slots.push_back(kv_slot(tables[s], p, c.page_size));
      }
    }
  }
  expect = pool;
  for (size_t i = 0; i < slots.size(); ++i) {
    for (int x = 0; x < rank; ++x) expect[static_cast<size_t>(slots[i]) * W + x] = c_in[i * (rank + 2) + x];
    for (int x = 0; x < rope; ++x) expect[static_cast<size_t>(slots[i]) * W + rank + x] = pe_in[i * (rope + 4) + x];
  }
  c_in.resize(c_in.size() + static_cast<size_t>(rank + 2), 0x3f80);  // a padded token (slot -1)
  pe_in.resize(pe_in.size() + static_cast<size_t>(rope + 4), 0x3f80);
  slots.push_back(-1);

  auto dpool = upload(pool);
  auto dc = upload(c_in);
  auto dpe = upload(pe_in);
  auto dslots = upload(slots);
  auto flag = device_alloc<uint32_t>(1);
  FP4MOE_CUDA_CHECK(cudaMemset(flag.get(), 0, 4));
  MlaCacheView cache{bf(dpool.get()), n_blocks, c.page_size, rank, rope};
  mla_cache_append_bf16(cbf(dc.get()), rank + 2, cbf(dpe.get()), rope + 4, static_cast<int64_t>(slots.size()),
                        dslots.get(), cache, flag.get(), nullptr);
  FP4MOE_CUDA_CHECK(cudaDeviceSynchronize());
  ASSERT_TRUE(download(dpool.get(), pool_elems) == expect) << c.name << ": pool after append";

  const std::vector<uint16_t> q = random_bf16(static_cast<size_t>(n_seqs * d.n_heads * qk), rng, 1.0f);
  const std::vector<uint16_t> kv_b =
      random_bf16(static_cast<size_t>(d.n_heads) * d.kv_b_rows_per_head() * rank, rng, 1.0f / std::sqrt(float(rank)));
  MlaDecodeDims dims{d.n_heads, rank, d.qk_nope_head_dim, rope, vd, d.softmax_scale()};
  const int64_t max_len = *std::max_element(c.seq_lens.begin(), c.seq_lens.end());
  const DecodeSplit split = c.split.n_splits > 0 ? c.split : plan_mla_decode_split(n_seqs, d.n_heads, max_len, 132);
  const std::string what = c.name + " [" + split.to_string() + "]";
  std::vector<int32_t> lens32(c.seq_lens.begin(), c.seq_lens.end());
  auto dq = upload(q);
  auto dkvb = upload(kv_b);
  auto dtable = upload(packed);
  auto dlens = upload(lens32);
  auto dqlat = device_alloc<float>(static_cast<size_t>(n_seqs * d.n_heads * W));
  auto dlat = device_alloc<float>(static_cast<size_t>(n_seqs * d.n_heads * rank));
  const size_t ws = mla_decode_workspace_bytes(n_seqs, dims, split);
  auto dws = device_alloc<float>(ws / 4);
  auto dout = device_alloc<uint16_t>(static_cast<size_t>(n_seqs * d.n_heads * vd));
  const CublasHandle cublas;
  mla_absorb_q(cbf(dq.get()), cbf(dkvb.get()), dims, n_seqs, dqlat.get(), cublas.get(), nullptr);
  mla_decode_attention(dqlat.get(), cache, dtable.get(), max_blocks, dlens.get(), n_seqs, dims, split,
                       ws ? dws.get() : nullptr, dlat.get(), flag.get(), nullptr);
  auto dpws = device_alloc<char>(mla_project_v_workspace_bytes(n_seqs, dims));
  mla_project_v(dlat.get(), cbf(dkvb.get()), dims, n_seqs, dpws.get(), bf(dout.get()), cublas.get(), nullptr);
  FP4MOE_CUDA_CHECK(cudaDeviceSynchronize());
  const uint32_t flags = download(flag.get(), 1)[0];
  ASSERT_EQ(flags, 0u) << what << ": device errors " << describe_device_errors(flags);
  const std::vector<uint16_t> got = download(dout.get(), static_cast<size_t>(n_seqs * d.n_heads * vd));

  // The attention step alone, at f32 accuracy: the latent from the GPU's own q_lat, against an f64
  // softmax over the same keys (q and the probabilities enter the tensor cores as three bf16 parts:
  // their f32 values). Bound: 2^-14 relative to each row's largest |latent|.
  {
    const std::vector<float> qlat = download(dqlat.get(), static_cast<size_t>(n_seqs * d.n_heads * W));
    const std::vector<float> lat = download(dlat.get(), static_cast<size_t>(n_seqs * d.n_heads * rank));
    double worst = 0;
    for (int64_t s = 0; s < n_seqs; ++s) {
      const int64_t len = c.seq_lens[static_cast<size_t>(s)];
      for (int h = 0; h < d.n_heads; ++h) {
        const float* qr = qlat.data() + (s * d.n_heads + h) * W;
        std::vector<double> sc(static_cast<size_t>(len)), lref(static_cast<size_t>(rank), 0.0);
        double mx = -1e300, sum = 0;
        for (int64_t p = 0; p < len; ++p) {
          double dot = 0;
          for (int x = 0; x < W; ++x) dot += static_cast<double>(qr[x]) * bf16_to_f32(rows[static_cast<size_t>(s)][static_cast<size_t>(p * W + x)]);
          sc[static_cast<size_t>(p)] = dot * d.softmax_scale();
          mx = std::max(mx, sc[static_cast<size_t>(p)]);
        }
        for (int64_t p = 0; p < len; ++p) {
          const double e = std::exp(sc[static_cast<size_t>(p)] - mx);
          sum += e;
          for (int x = 0; x < rank; ++x) lref[static_cast<size_t>(x)] += e * bf16_to_f32(rows[static_cast<size_t>(s)][static_cast<size_t>(p * W + x)]);
        }
        double row_max = 0;
        for (int x = 0; x < rank; ++x) {
          lref[static_cast<size_t>(x)] = len > 0 ? lref[static_cast<size_t>(x)] / sum : 0.0;
          row_max = std::max(row_max, std::fabs(lref[static_cast<size_t>(x)]));
        }
        for (int x = 0; x < rank; ++x) {
          const double err = std::fabs(lat[static_cast<size_t>((s * d.n_heads + h) * rank + x)] - lref[static_cast<size_t>(x)]);
          worst = std::max(worst, err / (row_max + 1e-30));
          ASSERT_LE(err, std::ldexp(row_max, -14) + 1e-30)
              << what << ": latent seq " << s << " head " << h << " dim " << x << " gpu "
              << lat[static_cast<size_t>((s * d.n_heads + h) * rank + x)] << " f64 " << lref[static_cast<size_t>(x)];
        }
      }
    }
    std::printf("[mla_decode] %s: latent vs f64 attention, worst |err| / row max |latent| = %.3g\n", what.c_str(),
                worst);
  }

  const std::vector<float> kv_b_f = to_f32(kv_b.data(), kv_b.size());
  for (int64_t s = 0; s < n_seqs; ++s) {
    std::vector<float> ref(static_cast<size_t>(d.n_heads * vd), 0.0f);
    if (c.seq_lens[static_cast<size_t>(s)] > 0) {
      model::MlaLatentCache lc(rank, rope);
      for (int64_t p = 0; p < c.seq_lens[static_cast<size_t>(s)]; ++p) {
        const std::vector<float> row = to_f32(rows[static_cast<size_t>(s)].data() + p * W, static_cast<size_t>(W));
        lc.append(row.data(), row.data() + rank);
      }
      const std::vector<float> qf = to_f32(q.data() + s * d.n_heads * qk, static_cast<size_t>(d.n_heads * qk));
      const int64_t pos = c.seq_lens[static_cast<size_t>(s)] - 1;
      const model::KeySelection dense;
      model::MlaAttentionArgs a;
      a.dims = &d;
      a.q = qf.data();
      a.q_pos = &pos;
      a.n_q = 1;
      a.cache = &lc;
      a.kv_b = kv_b_f.data();
      a.keys = &dense;
      a.out = ref.data();
      model::mla_attention_absorbed(a);
    }
    float max_ref = 0.0f;
    for (float v : ref) max_ref = std::max(max_ref, std::fabs(v));
    for (size_t i = 0; i < ref.size(); ++i) {
      const float g = bf16_to_f32(got[static_cast<size_t>(s) * ref.size() + i]);
      ASSERT_LE(std::fabs(g - ref[i]), std::ldexp(std::fabs(ref[i]), -8) * 1.001f + 1e-4f * max_ref)
          << what << ": seq " << s << " (len " << c.seq_lens[static_cast<size_t>(s)] << ") head "
          << static_cast<int64_t>(i) / vd << " dim " << static_cast<int64_t>(i) % vd << " gpu " << g << " cpu " << ref[i];
    }
  }
}

const model::MlaDims kTiny{4, 32, 32, 16, 32};
const model::MlaDims kGlm5Like{20, 512, 192, 64, 256};
const std::vector<int64_t> kLens{1, 17, 64, 300, 0};

void run_cases(const std::vector<MlaCase>& cases) {
  std::mt19937_64 rng(testing::test_seed());
  for (const MlaCase& c : cases) {
    run_case(c, rng);
    if (::testing::Test::HasFatalFailure()) return;
  }
}

// glm5_tiny dims (also run under compute-sanitizer by scripts/gpu_check.sh).
TEST(CudaMlaDecode, TinyMatchesCpuAbsorbed) {
  SKIP_WITHOUT_GPU();
  run_cases({
      {"glm5_tiny dims, page 16", kTiny, 16, kLens, DecodeSplit{1, 320}},
      {"glm5_tiny dims, forced splits", kTiny, 16, kLens, DecodeSplit{7, 64}},
      {"glm5_tiny dims, planner", kTiny, 16, kLens, DecodeSplit{0, 0}},
  });
}

TEST(CudaMlaDecode, Glm5LikeMatchesCpuAbsorbed) {
  SKIP_WITHOUT_GPU();
  run_cases({
      {"glm5-like dims (20 heads, rank 512), page 64", kGlm5Like, 64, kLens, DecodeSplit{1, 320}},
      {"glm5-like dims, forced splits", kGlm5Like, 64, kLens, DecodeSplit{3, 128}},
      // 10 splits: the merge's loads 8 splits at a time, then a tail of 2; the shorter rows' empty splits
      // inside the 8 (split_merge.h). 300 keys are cut as 4 x 64 + 44 and 5 empty splits.
      {"glm5-like dims, 10 forced splits", kGlm5Like, 64, kLens, DecodeSplit{10, 32}},
      // A plan for longer lists than these (a CUDA graph plans for its block-table bucket): each sequence is cut by
      // its own length (mla_decode_split_keys), 700 keys as 192 x 3 + 124, 300 as 128 + 128 + 44 + an empty split.
      {"glm5-like dims, 4 splits planned for 1,024 keys", kGlm5Like, 64, {1, 17, 64, 300, 0, 700}, DecodeSplit{4, 256}},
  });
}

// The other latent widths the decode CTA is built for (its m64 blocks of rank x 64-wide column blocks of
// rank + rope: 1 x 2, 2 x 3, 4 x 5; glm5_tiny is 1 x 1 and GLM-5 8 x 9), one and several splits.
TEST(CudaMlaDecode, OtherRanksMatchCpuAbsorbed) {
  SKIP_WITHOUT_GPU();
  const model::MlaDims r64{8, 64, 32, 64, 32}, r128{8, 128, 64, 64, 64}, r256{24, 256, 64, 32, 64};
  run_cases({
      {"rank 64 + rope 64", r64, 16, kLens, DecodeSplit{1, 320}},
      {"rank 128 + rope 64, forced splits", r128, 16, kLens, DecodeSplit{5, 64}},
      {"rank 256 + rope 32 (24 heads)", r256, 32, kLens, DecodeSplit{1, 320}},
      {"rank 256 + rope 32, planner", r256, 32, kLens, DecodeSplit{0, 0}},
  });
}

// mla_project_v alone: f32 latent [n, heads, rank] x W_UV (kv_b's last v rows of each head) -> bf16
// [n, heads * v], in passes of 256 sequences.
void check_project_v(const model::MlaDims& d, int64_t n_seqs, std::mt19937_64& rng) {
  const int64_t H = d.n_heads, R = d.kv_lora_rank, nope = d.qk_nope_head_dim, V = d.v_head_dim;
  SCOPED_TRACE("heads " + std::to_string(H) + " rank " + std::to_string(R) + " v " + std::to_string(V) + ", " +
               std::to_string(n_seqs) + " sequences");
  MlaDecodeDims dims{static_cast<int>(H), static_cast<int>(R), static_cast<int>(nope),
                     d.qk_rope_head_dim,  static_cast<int>(V), d.softmax_scale()};
  const std::vector<uint16_t> kv_b = random_bf16(static_cast<size_t>(H * (nope + V) * R), rng, 0.05f);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> latent(static_cast<size_t>(n_seqs * H * R));
  for (float& v : latent) v = nd(rng);
  const size_t n_out = static_cast<size_t>(n_seqs * H * V);
  auto dkvb = upload(kv_b);
  auto dlat = upload(latent);
  auto dout = device_alloc<uint16_t>(n_out + 64);
  FP4MOE_CUDA_CHECK(cudaMemset(dout.get(), 0xFF, (n_out + 64) * 2));
  auto dws = device_alloc<char>(mla_project_v_workspace_bytes(n_seqs, dims));
  const CublasHandle cublas;
  mla_project_v(dlat.get(), cbf(dkvb.get()), dims, n_seqs, dws.get(), bf(dout.get()), cublas.get(), nullptr);
  FP4MOE_CUDA_CHECK(cudaDeviceSynchronize());
  const std::vector<uint16_t> got = download(dout.get(), n_out + 64);
  for (size_t i = n_out; i < got.size(); ++i) ASSERT_EQ(got[i], 0xFFFFu) << "written past the output at " << i;
  const std::vector<float> w = to_f32(kv_b);
  for (int64_t s = 0; s < n_seqs; ++s) {
    for (int64_t h = 0; h < H; ++h) {
      const float* lat = latent.data() + (s * H + h) * R;
      for (int64_t x = 0; x < V; ++x) {
        const float* wr = w.data() + (h * (nope + V) + nope + x) * R;
        double ref = 0, mag = 0;
        for (int64_t r = 0; r < R; ++r) {
          ref += static_cast<double>(wr[r]) * lat[r];
          mag += std::fabs(static_cast<double>(wr[r]) * lat[r]);
        }
        const double g = bf16_to_f32(got[static_cast<size_t>((s * H + h) * V + x)]);
        ASSERT_LE(std::fabs(g - ref), std::ldexp(std::fabs(ref), -8) * 1.001 + std::ldexp(mag, -14))
            << "seq " << s << " head " << h << " dim " << x << " gpu " << g << " f64 " << ref;
      }
    }
  }
}

TEST(CudaMlaDecode, ProjectVInPassesMatchesF64) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(testing::test_seed());
  for (int64_t n : {1, 256, 300}) {
    check_project_v(kTiny, n, rng);
    if (HasFatalFailure()) return;
  }
  check_project_v(kGlm5Like, 257, rng);
  MlaDecodeDims glm5{64, 512, 192, 64, 256, 1.0f};
  EXPECT_EQ(mla_project_v_workspace_bytes(4096, glm5), mla_project_v_workspace_bytes(256, glm5));
  EXPECT_LT(mla_project_v_workspace_bytes(1, glm5), mla_project_v_workspace_bytes(256, glm5));
}

}  // namespace
}  // namespace fp4moe::cuda
