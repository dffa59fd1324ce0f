// DSA lightning indexer core (see dsa_indexer.h). Tested by tests/model/test_glm5_attention.cpp.
#include "model/dsa_indexer.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/error.h"
#include "kernels/cpu/thread_pool.h"
#include "moe/router.h"

namespace fp4moe::model {

float IndexerDims::softmax_scale() const { return 1.0f / std::sqrt(static_cast<float>(head_dim)); }
float IndexerDims::weight_scale() const { return 1.0f / std::sqrt(static_cast<float>(n_heads)); }

void IndexerKeyCache::append(const float* k) {
  k_.insert(k_.end(), k, k + head_dim_);
  ++n_tokens_;
}

void IndexerKeyCache::truncate(int64_t n) {
  FP4MOE_CHECK(n >= 0 && n <= n_tokens_) << "truncating an indexer cache of " << n_tokens_ << " tokens to " << n;
  n_tokens_ = n;
  k_.resize(static_cast<size_t>(n * head_dim_));
}

void dsa_index_scores(const IndexerDims& dims, const float* q, const float* w, const IndexerKeyCache& cache,
                      int64_t pos, float* scores) {
  FP4MOE_CHECK(cache.head_dim() == dims.head_dim)
      << "indexer cache head_dim " << cache.head_dim() << " != layer index_head_dim " << dims.head_dim;
  FP4MOE_CHECK(pos >= 0 && pos < cache.n_tokens())
      << "indexer query at position " << pos << " but the cache holds " << cache.n_tokens() << " keys";
  const float scale = dims.softmax_scale();
  const int hd = dims.head_dim;
  for (int64_t t = 0; t <= pos; ++t) {
    const float* k = cache.key(t);
    float acc = 0.0f;
    for (int h = 0; h < dims.n_heads; ++h) {
      const float* qh = q + static_cast<size_t>(h) * hd;
      float s = 0.0f;
      for (int x = 0; x < hd; ++x) s += qh[x] * k[x];
      acc += w[h] * std::max(s * scale, 0.0f);
    }
    scores[t] = acc;
  }
}

KeySelection dsa_select_topk(const IndexerDims& dims, const float* q, const float* w, const int64_t* q_pos,
                             int64_t n_q, const IndexerKeyCache& cache) {
  FP4MOE_CHECK(dims.index_topk > 0) << "index_topk must be positive, got " << dims.index_topk;
  for (int64_t i = 0; i < n_q; ++i) {
    FP4MOE_CHECK(q_pos[i] >= 0 && q_pos[i] < cache.n_tokens())
        << "indexer query " << i << " at position " << q_pos[i] << " but the cache holds " << cache.n_tokens()
        << " keys";
  }
  // Queries are independent: one task each, results gathered in query order.
  std::vector<std::vector<int32_t>> chosen(static_cast<size_t>(n_q));
  auto select = [&](int64_t i) {
    const int64_t n_causal = q_pos[i] + 1;
    const int64_t k = std::min<int64_t>(dims.index_topk, n_causal);
    std::vector<int32_t>& order = chosen[static_cast<size_t>(i)];
    order.resize(static_cast<size_t>(n_causal));
    std::iota(order.begin(), order.end(), 0);
    if (k == n_causal) return;  // every causal key fits: nothing to score
    std::vector<float> scores(static_cast<size_t>(n_causal));
    dsa_index_scores(dims, q + static_cast<size_t>(i) * dims.n_heads * dims.head_dim,
                     w + static_cast<size_t>(i) * dims.n_heads, cache, q_pos[i], scores.data());
    std::nth_element(order.begin(), order.begin() + k, order.end(),
                     [&](int32_t a, int32_t b) { return moe::ranks_before(scores[a], a, scores[b], b); });
    order.resize(static_cast<size_t>(k));
    std::sort(order.begin(), order.end());
  };
  // Multiply-adds of the scoring; below ~2^18 the pool costs more than it saves.
  int64_t work = 0;
  for (int64_t i = 0; i < n_q; ++i) work += (q_pos[i] + 1) * dims.n_heads * dims.head_dim;
  if (n_q > 1 && work >= (int64_t{1} << 18)) {
    kernels::cpu::default_thread_pool().parallel_for(n_q, select);
  } else {
    for (int64_t i = 0; i < n_q; ++i) select(i);
  }
  KeySelection sel;
  sel.offsets.reserve(static_cast<size_t>(n_q) + 1);
  sel.offsets.push_back(0);
  for (const auto& c : chosen) {
    sel.idx.insert(sel.idx.end(), c.begin(), c.end());
    sel.offsets.push_back(static_cast<int64_t>(sel.idx.size()));
  }
  return sel;
}

void check_key_selection(const KeySelection& keys, std::span<const int64_t> q_pos, int64_t index_topk,
                         const std::string& what) {
  const auto n_q = static_cast<int64_t>(q_pos.size());
  FP4MOE_CHECK(keys.n_queries() == n_q && !keys.offsets.empty() && keys.offsets.front() == 0 &&
               keys.offsets.back() == static_cast<int64_t>(keys.idx.size()))
      << what << ": a selection of " << keys.n_queries() << " key lists (offsets end at "
      << (keys.offsets.empty() ? 0 : keys.offsets.back()) << " for " << keys.idx.size() << " keys) for " << n_q
      << " queries";
  for (int64_t i = 0; i < n_q; ++i) {
    const int64_t pos = q_pos[static_cast<size_t>(i)];
    const int64_t want = std::min(index_topk, pos + 1);
    FP4MOE_CHECK(keys.offsets[static_cast<size_t>(i) + 1] >= keys.offsets[static_cast<size_t>(i)])
        << what << ": query " << i << " has decreasing offsets";
    const std::span<const int32_t> k = keys.keys_of(i);
    FP4MOE_CHECK(static_cast<int64_t>(k.size()) == want)
        << what << ": query " << i << " (position " << pos << ") has " << k.size() << " keys, needs min(index_topk "
        << index_topk << ", position + 1) = " << want;
    for (size_t j = 0; j < k.size(); ++j) {
      FP4MOE_CHECK(k[j] >= 0 && k[j] <= pos && (j == 0 || k[j] > k[j - 1]))
          << what << ": query " << i << " (position " << pos << ") key " << j << " is " << k[j]
          << (j > 0 ? " after " + std::to_string(k[j - 1]) : std::string())
          << " (keys must be ascending, distinct, in 0.." << pos << ")";
    }
  }
}

}  // namespace fp4moe::model
