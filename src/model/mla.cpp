// MLA attention core (see mla.h). Tested by tests/model/test_glm5_attention.cpp.
#include "model/mla.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "kernels/cpu/thread_pool.h"
#include "model/ops.h"

namespace fp4moe::model {

float MlaDims::softmax_scale() const { return 1.0f / std::sqrt(static_cast<float>(qk_head_dim())); }

void MlaLatentCache::append(const float* c_kv, const float* k_pe) {
  c_kv_.insert(c_kv_.end(), c_kv, c_kv + kv_lora_rank_);
  k_pe_.insert(k_pe_.end(), k_pe, k_pe + rope_dim_);
  ++n_tokens_;
}

void MlaLatentCache::truncate(int64_t n) {
  FP4MOE_CHECK(n >= 0 && n <= n_tokens_) << "truncating an MLA cache of " << n_tokens_ << " tokens to " << n;
  n_tokens_ = n;
  c_kv_.resize(static_cast<size_t>(n * kv_lora_rank_));
  k_pe_.resize(static_cast<size_t>(n * rope_dim_));
}

namespace {

float dot(const float* a, const float* b, int n) {
  float s = 0.0f;
  for (int i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

void check_args(const MlaAttentionArgs& a) {
  FP4MOE_CHECK(a.dims && a.q && a.q_pos && a.cache && a.kv_b && a.keys && a.out) << "MLA attention: null argument";
  const MlaDims& d = *a.dims;
  FP4MOE_CHECK(a.cache->kv_lora_rank() == d.kv_lora_rank && a.cache->rope_dim() == d.qk_rope_head_dim)
      << "MLA cache holds rank " << a.cache->kv_lora_rank() << " / rope " << a.cache->rope_dim()
      << ", layer wants " << d.kv_lora_rank << " / " << d.qk_rope_head_dim;
  FP4MOE_CHECK(a.keys->dense() || a.keys->n_queries() == a.n_q)
      << "key selection has " << a.keys->n_queries() << " queries, attention has " << a.n_q;
  for (int64_t i = 0; i < a.n_q; ++i) {
    FP4MOE_CHECK(a.q_pos[i] >= 0 && a.q_pos[i] < a.cache->n_tokens())
        << "query " << i << " at position " << a.q_pos[i] << " but the MLA cache holds " << a.cache->n_tokens()
        << " tokens";
    if (!a.keys->dense()) {
      for (int32_t t : a.keys->keys_of(i)) {
        FP4MOE_CHECK(t >= 0 && t <= a.q_pos[i])
            << "query " << i << " at position " << a.q_pos[i] << " selects key " << t << " (not causal)";
      }
    }
  }
}

// The keys query i attends to, written into `keys` (dense: 0..pos).
void keys_for(const MlaAttentionArgs& a, int64_t i, std::vector<int32_t>& keys) {
  keys.clear();
  if (a.keys->dense()) {
    for (int64_t t = 0; t <= a.q_pos[i]; ++t) keys.push_back(static_cast<int32_t>(t));
  } else {
    auto sel = a.keys->keys_of(i);
    keys.assign(sel.begin(), sel.end());
  }
}

// The keys any query uses (ascending) and, for each cache position < n_keys, its slot in that
// list (-1 when unused): the expanded form rebuilds K/V only for these.
struct KeyUnion {
  std::vector<int32_t> keys;
  std::vector<int32_t> slot;
};

KeyUnion key_union(const MlaAttentionArgs& a) {
  KeyUnion u;
  int64_t n_keys = 0;
  for (int64_t i = 0; i < a.n_q; ++i) n_keys = std::max(n_keys, a.q_pos[i] + 1);
  u.slot.assign(static_cast<size_t>(n_keys), -1);
  if (a.keys->dense()) {
    for (int64_t t = 0; t < n_keys; ++t) u.slot[static_cast<size_t>(t)] = 0;
  } else {
    for (int32_t t : a.keys->idx) u.slot[static_cast<size_t>(t)] = 0;
  }
  for (int64_t t = 0; t < n_keys; ++t) {
    if (u.slot[static_cast<size_t>(t)] < 0) continue;
    u.slot[static_cast<size_t>(t)] = static_cast<int32_t>(u.keys.size());
    u.keys.push_back(static_cast<int32_t>(t));
  }
  return u;
}

// Runs fn(i, h, scratch) for every (query, head) pair on the default thread pool; each task owns
// its scratch buffers, so results do not depend on the thread count.
struct Scratch {
  std::vector<int32_t> keys;
  std::vector<float> p, q_abs, latent;
};

// Below this many multiply-adds a call runs on the calling thread (waking the pool costs more).
constexpr int64_t kMinParallelWork = 1 << 18;

template <typename Fn>
void for_each_query_head(const MlaAttentionArgs& a, int64_t work_per_key, Fn fn) {
  const int64_t n_heads = a.dims->n_heads;
  const int64_t n_tasks = a.n_q * n_heads;
  int64_t n_pairs = 0;
  for (int64_t i = 0; i < a.n_q; ++i) n_pairs += a.keys->dense() ? a.q_pos[i] + 1 : static_cast<int64_t>(a.keys->keys_of(i).size());
  const bool parallel = n_pairs * n_heads * work_per_key >= kMinParallelWork;
  // Group pairs so each task has some work (a task per pair costs more than tiny heads do).
  const int64_t per_task =
      parallel ? std::max<int64_t>(1, n_tasks / (8 * kernels::cpu::default_thread_pool().n_threads())) : n_tasks;
  const int64_t n_groups = (n_tasks + per_task - 1) / per_task;
  kernels::cpu::default_thread_pool().parallel_for(n_groups, [&](int64_t g) {
    Scratch sc;
    int64_t last_i = -1;
    for (int64_t task = g * per_task; task < std::min(n_tasks, (g + 1) * per_task); ++task) {
      const int64_t i = task / n_heads;
      if (i != last_i) {
        keys_for(a, i, sc.keys);
        FP4MOE_CHECK(!sc.keys.empty()) << "query " << i << " attends to no key";
        last_i = i;
      }
      fn(i, static_cast<int>(task % n_heads), sc);
    }
  });
}

}  // namespace

void mla_attention_expanded(const MlaAttentionArgs& a) {
  check_args(a);
  const MlaDims& d = *a.dims;
  const int nope = d.qk_nope_head_dim, rope = d.qk_rope_head_dim, vd = d.v_head_dim, rank = d.kv_lora_rank;
  const int rows = d.kv_b_rows_per_head();
  const float scale = d.softmax_scale();
  const KeyUnion u = key_union(a);
  const int64_t n_used = static_cast<int64_t>(u.keys.size());

  // kv[slot][h] = kv_b_h · c_kv(key): [n_used, n_heads, nope + v].
  std::vector<float> kv(static_cast<size_t>(n_used) * d.n_heads * rows);
  auto expand = [&](int64_t s) {
    const float* c = a.cache->c_kv(u.keys[static_cast<size_t>(s)]);
    float* dst = kv.data() + static_cast<size_t>(s) * d.n_heads * rows;
    for (int r = 0; r < d.n_heads * rows; ++r) dst[r] = dot(a.kv_b + static_cast<size_t>(r) * rank, c, rank);
  };
  if (n_used * d.n_heads * rows * rank >= kMinParallelWork) {
    kernels::cpu::default_thread_pool().parallel_for(n_used, expand);
  } else {
    for (int64_t s = 0; s < n_used; ++s) expand(s);
  }

  for_each_query_head(a, d.qk_head_dim() + vd, [&](int64_t i, int h, Scratch& sc) {
    const std::vector<int32_t>& keys = sc.keys;
    sc.p.resize(keys.size());
    const float* q = a.q + (static_cast<size_t>(i) * d.n_heads + h) * d.qk_head_dim();
    for (size_t j = 0; j < keys.size(); ++j) {
      const size_t slot = static_cast<size_t>(u.slot[static_cast<size_t>(keys[j])]);
      const float* k = kv.data() + (slot * d.n_heads + h) * rows;
      sc.p[j] = (dot(q, k, nope) + dot(q + nope, a.cache->k_pe(keys[j]), rope)) * scale;
    }
    softmax_inplace(sc.p.data(), static_cast<int64_t>(sc.p.size()));
    float* o = a.out + (static_cast<size_t>(i) * d.n_heads + h) * vd;
    std::fill(o, o + vd, 0.0f);
    for (size_t j = 0; j < keys.size(); ++j) {
      const size_t slot = static_cast<size_t>(u.slot[static_cast<size_t>(keys[j])]);
      const float* v = kv.data() + (slot * d.n_heads + h) * rows + nope;
      for (int x = 0; x < vd; ++x) o[x] += sc.p[j] * v[x];
    }
  });
}

void mla_attention_absorbed(const MlaAttentionArgs& a) {
  check_args(a);
  const MlaDims& d = *a.dims;
  const int nope = d.qk_nope_head_dim, rope = d.qk_rope_head_dim, vd = d.v_head_dim, rank = d.kv_lora_rank;
  const int rows = d.kv_b_rows_per_head();
  const float scale = d.softmax_scale();

  for_each_query_head(a, 2 * rank + rope, [&](int64_t i, int h, Scratch& sc) {
    const std::vector<int32_t>& keys = sc.keys;
    sc.p.resize(keys.size());
    sc.q_abs.assign(static_cast<size_t>(rank), 0.0f);
    sc.latent.assign(static_cast<size_t>(rank), 0.0f);
    const float* q = a.q + (static_cast<size_t>(i) * d.n_heads + h) * d.qk_head_dim();
    const float* w_uk = a.kv_b + static_cast<size_t>(h) * rows * rank;  // [nope, rank]
    const float* w_uv = w_uk + static_cast<size_t>(nope) * rank;         // [v, rank]
    // q_abs = W_UK_h^T q_nope.
    for (int x = 0; x < nope; ++x) {
      const float qx = q[x];
      const float* w = w_uk + static_cast<size_t>(x) * rank;
      for (int r = 0; r < rank; ++r) sc.q_abs[r] += qx * w[r];
    }
    for (size_t j = 0; j < keys.size(); ++j) {
      sc.p[j] = (dot(sc.q_abs.data(), a.cache->c_kv(keys[j]), rank) + dot(q + nope, a.cache->k_pe(keys[j]), rope)) *
                scale;
    }
    softmax_inplace(sc.p.data(), static_cast<int64_t>(sc.p.size()));
    for (size_t j = 0; j < keys.size(); ++j) {
      const float* c = a.cache->c_kv(keys[j]);
      for (int r = 0; r < rank; ++r) sc.latent[r] += sc.p[j] * c[r];
    }
    float* o = a.out + (static_cast<size_t>(i) * d.n_heads + h) * vd;
    for (int x = 0; x < vd; ++x) o[x] = dot(w_uv + static_cast<size_t>(x) * rank, sc.latent.data(), rank);
  });
}

void mla_attention(const MlaAttentionArgs& a) {
  const MlaDims& d = *a.dims;
  check_args(a);
  int64_t pairs = 0;
  for (int64_t i = 0; i < a.n_q; ++i) {
    pairs += a.keys->dense() ? a.q_pos[i] + 1 : static_cast<int64_t>(a.keys->keys_of(i).size());
  }
  const int64_t n_used = static_cast<int64_t>(key_union(a).keys.size());
  const int64_t rows = d.kv_b_rows_per_head(), rank = d.kv_lora_rank, h = d.n_heads;
  // Multiply-adds of each form.
  const int64_t expanded = n_used * h * rows * rank + pairs * h * (d.qk_head_dim() + d.v_head_dim);
  const int64_t absorbed = a.n_q * h * rows * rank + pairs * h * (2 * rank + d.qk_rope_head_dim);
  if (absorbed < expanded) {
    mla_attention_absorbed(a);
  } else {
    mla_attention_expanded(a);
  }
}

}  // namespace fp4moe::model
