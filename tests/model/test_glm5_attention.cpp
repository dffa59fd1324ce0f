// Unit tests of the GLM-5 attention pieces on fresh random data (seed from test_seed()):
//   - interleaved RoPE (model/ops.h) vs the rotation formula in f64, and vs HF's de-interleaved
//     apply_rotary_pos_emb_interleave (the output order differs, every q.k is the same);
//   - MLA expanded and absorbed forms vs a naive f64 attention over explicitly built K/V, dense
//     causal and with a sparse key selection, prefill (many queries) and decode (one query);
//   - the DSA indexer scores vs a naive f64 formula, causal top-k selection (count, causality,
//     the chosen set equals the naive top-k).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <set>
#include <vector>

#include "core/error.h"
#include "model/dsa_indexer.h"
#include "model/mla.h"
#include "model/ops.h"
#include "testing/testing.h"

namespace fp4moe::model {
namespace {

std::vector<float> random_vec(std::mt19937_64& rng, size_t n, float a = 1.0f) {
  std::uniform_real_distribution<float> u(-a, a);
  std::vector<float> v(n);
  for (float& x : v) x = u(rng);
  return v;
}

TEST(Glm5Rope, InterleavedMatchesRotationAndHfConvention) {
  std::mt19937_64 rng(testing::test_seed());
  const int dim = 16;
  const float theta = 10000.0f;
  for (int64_t pos : {0, 1, 7, 123, 4095}) {
    std::vector<float> x = random_vec(rng, dim), y = random_vec(rng, dim);
    std::vector<float> xr = x, yr = y;
    const std::vector<float> inv_freq = rope_inv_freq(dim, theta);
    std::vector<float> c(dim / 2), s(dim / 2);
    rope_cos_sin(inv_freq, pos, c.data(), s.data());
    rope_interleaved(xr.data(), 1, dim, 0, dim, c.data(), s.data());
    rope_cos_sin(inv_freq, pos + 3, c.data(), s.data());
    rope_interleaved(yr.data(), 1, dim, 0, dim, c.data(), s.data());
    for (int i = 0; i < dim / 2; ++i) {
      const double ang = static_cast<double>(pos) * std::pow(static_cast<double>(theta), -2.0 * i / dim);
      const double e0 = x[2 * i] * std::cos(ang) - x[2 * i + 1] * std::sin(ang);
      const double e1 = x[2 * i + 1] * std::cos(ang) + x[2 * i] * std::sin(ang);
      // The angle is formed in f32 (as HF): its rounding grows with pos (ulp(1300 rad) ~ 1.2e-4).
      const double tol = 1e-5 + 1e-7 * static_cast<double>(pos);
      EXPECT_NEAR(xr[2 * i], e0, tol) << "pos " << pos << " pair " << i;
      EXPECT_NEAR(xr[2 * i + 1], e1, tol) << "pos " << pos << " pair " << i;
    }
    // HF apply_rotary_pos_emb_interleave: de-interleave (evens, odds), then half-split rotation.
    auto hf = [&](const std::vector<float>& v, int64_t p) {
      std::vector<float> d(dim), out(dim);
      for (int i = 0; i < dim / 2; ++i) {
        d[i] = v[2 * i];
        d[i + dim / 2] = v[2 * i + 1];
      }
      for (int i = 0; i < dim / 2; ++i) {
        const double ang = static_cast<double>(p) * std::pow(static_cast<double>(theta), -2.0 * i / dim);
        out[i] = static_cast<float>(d[i] * std::cos(ang) - d[i + dim / 2] * std::sin(ang));
        out[i + dim / 2] = static_cast<float>(d[i + dim / 2] * std::cos(ang) + d[i] * std::sin(ang));
      }
      return out;
    };
    std::vector<float> xh = hf(x, pos), yh = hf(y, pos + 3);
    double ours = 0, theirs = 0;
    for (int i = 0; i < dim; ++i) {
      ours += static_cast<double>(xr[i]) * yr[i];
      theirs += static_cast<double>(xh[i]) * yh[i];
    }
    EXPECT_NEAR(ours, theirs, 1e-4 + 1e-6 * static_cast<double>(pos)) << "q.k differs from HF's convention at pos " << pos;
  }
}

// Naive MLA in f64: K_h = [kv_b_nope_h c_kv | k_pe], V_h = kv_b_v_h c_kv, masked softmax.
std::vector<double> naive_mla(const MlaDims& d, const std::vector<float>& q, const std::vector<int64_t>& q_pos,
                              const MlaLatentCache& cache, const std::vector<float>& kv_b,
                              const KeySelection& keys) {
  const int rows = d.kv_b_rows_per_head();
  const int64_t n_q = static_cast<int64_t>(q_pos.size());
  std::vector<double> out(static_cast<size_t>(n_q) * d.n_heads * d.v_head_dim, 0.0);
  for (int64_t i = 0; i < n_q; ++i) {
    std::vector<int32_t> ks;
    if (keys.dense()) {
      for (int64_t t = 0; t <= q_pos[i]; ++t) ks.push_back(static_cast<int32_t>(t));
    } else {
      auto s = keys.keys_of(i);
      ks.assign(s.begin(), s.end());
    }
    for (int h = 0; h < d.n_heads; ++h) {
      const float* qh = q.data() + (i * d.n_heads + h) * d.qk_head_dim();
      std::vector<double> sc(ks.size());
      std::vector<std::vector<double>> vs(ks.size(), std::vector<double>(d.v_head_dim));
      for (size_t j = 0; j < ks.size(); ++j) {
        const float* c = cache.c_kv(ks[j]);
        double s = 0;
        for (int x = 0; x < d.qk_nope_head_dim; ++x) {
          double k = 0;
          for (int r = 0; r < d.kv_lora_rank; ++r) k += double(kv_b[(h * rows + x) * d.kv_lora_rank + r]) * c[r];
          s += qh[x] * k;
        }
        for (int x = 0; x < d.qk_rope_head_dim; ++x) s += double(qh[d.qk_nope_head_dim + x]) * cache.k_pe(ks[j])[x];
        sc[j] = s / std::sqrt(double(d.qk_head_dim()));
        for (int x = 0; x < d.v_head_dim; ++x) {
          double v = 0;
          for (int r = 0; r < d.kv_lora_rank; ++r)
            v += double(kv_b[(h * rows + d.qk_nope_head_dim + x) * d.kv_lora_rank + r]) * c[r];
          vs[j][x] = v;
        }
      }
      const double m = *std::max_element(sc.begin(), sc.end());
      double sum = 0;
      for (double& s : sc) sum += (s = std::exp(s - m));
      for (size_t j = 0; j < ks.size(); ++j)
        for (int x = 0; x < d.v_head_dim; ++x) out[(i * d.n_heads + h) * d.v_head_dim + x] += sc[j] / sum * vs[j][x];
    }
  }
  return out;
}

struct MlaCase {
  MlaDims dims;
  int64_t n_cached;
  std::vector<int64_t> q_pos;
  bool sparse;
};

void run_mla_case(const MlaCase& c, std::mt19937_64& rng) {
  const MlaDims& d = c.dims;
  MlaLatentCache cache(d.kv_lora_rank, d.qk_rope_head_dim);
  for (int64_t t = 0; t < c.n_cached; ++t) {
    auto ckv = random_vec(rng, d.kv_lora_rank), kpe = random_vec(rng, d.qk_rope_head_dim);
    cache.append(ckv.data(), kpe.data());
  }
  auto kv_b = random_vec(rng, static_cast<size_t>(d.n_heads) * d.kv_b_rows_per_head() * d.kv_lora_rank, 0.3f);
  auto q = random_vec(rng, c.q_pos.size() * d.n_heads * d.qk_head_dim());
  KeySelection keys;
  if (c.sparse) {
    keys.offsets.push_back(0);
    for (int64_t pos : c.q_pos) {
      for (int64_t t = 0; t <= pos; ++t)
        if (t == pos || rng() % 3 == 0) keys.idx.push_back(static_cast<int32_t>(t));
      keys.offsets.push_back(static_cast<int64_t>(keys.idx.size()));
    }
  }
  const auto ref = naive_mla(d, q, c.q_pos, cache, kv_b, keys);
  double max_ref = 0;
  for (double v : ref) max_ref = std::max(max_ref, std::abs(v));
  for (int form = 0; form < 3; ++form) {
    std::vector<float> out(ref.size(), -99.0f);
    MlaAttentionArgs a{&d, q.data(), c.q_pos.data(), static_cast<int64_t>(c.q_pos.size()), &cache, kv_b.data(),
                       &keys, out.data()};
    if (form == 0) mla_attention_expanded(a);
    if (form == 1) mla_attention_absorbed(a);
    if (form == 2) mla_attention(a);
    double max_err = 0;
    for (size_t i = 0; i < ref.size(); ++i) max_err = std::max(max_err, std::abs(out[i] - ref[i]));
    EXPECT_LE(max_err, 1e-5 * (1 + max_ref))
        << (form == 0 ? "expanded" : form == 1 ? "absorbed" : "auto") << " heads " << d.n_heads << " rank "
        << d.kv_lora_rank << " cached " << c.n_cached << " queries " << c.q_pos.size() << " sparse " << c.sparse;
  }
}

TEST(Glm5Mla, ExpandedAndAbsorbedMatchNaive) {
  std::mt19937_64 rng(testing::test_seed() + 1);
  const MlaDims tiny{4, 32, 32, 16, 32};   // the golden glm5_tiny
  const MlaDims odd{3, 24, 8, 6, 10};      // uneven sizes
  std::vector<int64_t> prefill(20);
  std::iota(prefill.begin(), prefill.end(), 0);
  for (const MlaDims& d : {tiny, odd}) {
    for (bool sparse : {false, true}) {
      run_mla_case({d, 20, prefill, sparse}, rng);      // prefill of the whole cache
      run_mla_case({d, 37, {36}, sparse}, rng);         // one decode step
      run_mla_case({d, 37, {30, 31, 32, 36}, sparse}, rng);  // a chunk after a prefix
    }
  }
}

TEST(Glm5Mla, RejectsNonCausalSelectionAndUncachedQuery) {
  const MlaDims d{1, 4, 2, 2, 2};
  MlaLatentCache cache(4, 2);
  std::vector<float> c(4, 1.0f), k(2, 1.0f);
  cache.append(c.data(), k.data());
  cache.append(c.data(), k.data());
  std::vector<float> kv_b(1 * 4 * 4, 0.1f), q(4, 1.0f), out(2);
  KeySelection bad{{0, 2}, {0, 1}};
  std::vector<int64_t> pos{0};
  MlaAttentionArgs a{&d, q.data(), pos.data(), 1, &cache, kv_b.data(), &bad, out.data()};
  EXPECT_THROW(mla_attention_absorbed(a), Error);
  KeySelection dense;
  std::vector<int64_t> far{2};
  MlaAttentionArgs b{&d, q.data(), far.data(), 1, &cache, kv_b.data(), &dense, out.data()};
  EXPECT_THROW(mla_attention_expanded(b), Error);
}

TEST(Glm5Indexer, ScoresAndTopkMatchNaive) {
  std::mt19937_64 rng(testing::test_seed() + 2);
  const IndexerDims d{8, 32, 16, 8};
  const int64_t n_tok = 40;
  IndexerKeyCache cache(d.head_dim);
  for (int64_t t = 0; t < n_tok; ++t) {
    auto k = random_vec(rng, d.head_dim);
    cache.append(k.data());
  }
  std::vector<int64_t> q_pos(n_tok);
  std::iota(q_pos.begin(), q_pos.end(), 0);
  auto q = random_vec(rng, static_cast<size_t>(n_tok) * d.n_heads * d.head_dim);
  auto w = random_vec(rng, static_cast<size_t>(n_tok) * d.n_heads);
  KeySelection sel = dsa_select_topk(d, q.data(), w.data(), q_pos.data(), n_tok, cache);
  ASSERT_EQ(sel.n_queries(), n_tok);
  int n_sparse = 0;
  for (int64_t i = 0; i < n_tok; ++i) {
    const int64_t pos = q_pos[i];
    std::vector<double> ref(static_cast<size_t>(pos + 1));
    for (int64_t t = 0; t <= pos; ++t) {
      double acc = 0;
      for (int h = 0; h < d.n_heads; ++h) {
        double s = 0;
        for (int x = 0; x < d.head_dim; ++x) s += double(q[(i * d.n_heads + h) * d.head_dim + x]) * cache.key(t)[x];
        acc += double(w[i * d.n_heads + h]) * std::max(0.0, s / std::sqrt(double(d.head_dim)));
      }
      ref[t] = acc;
    }
    std::vector<float> ours(static_cast<size_t>(pos + 1));
    dsa_index_scores(d, q.data() + i * d.n_heads * d.head_dim, w.data() + i * d.n_heads, cache, pos, ours.data());
    for (int64_t t = 0; t <= pos; ++t) EXPECT_NEAR(ours[t], ref[t], 1e-5 * (1 + std::abs(ref[t])));

    auto keys = sel.keys_of(i);
    const int64_t want = std::min<int64_t>(d.index_topk, pos + 1);
    ASSERT_EQ(static_cast<int64_t>(keys.size()), want) << "query at " << pos;
    EXPECT_TRUE(std::is_sorted(keys.begin(), keys.end()));
    for (int32_t t : keys) EXPECT_LE(t, pos) << "non-causal key selected";
    std::vector<int32_t> order(static_cast<size_t>(pos + 1));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return ref[a] > ref[b]; });
    // Only compare where the naive k-th / (k+1)-th scores are apart (no near-ties).
    if (want < pos + 1 && ref[order[want - 1]] - ref[order[want]] > 1e-4) {
      std::set<int32_t> expect(order.begin(), order.begin() + want), got(keys.begin(), keys.end());
      EXPECT_EQ(got, expect) << "query at " << pos;
      ++n_sparse;
    }
  }
  EXPECT_GT(n_sparse, 0) << "no query exercised the sparse selection";
}

}  // namespace
}  // namespace fp4moe::model
