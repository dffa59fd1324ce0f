// DSA lightning indexer kernels (see dsa_indexer.h).
//   dsa_index_cache_append_kernel<T>: thread per element of a key row -> its cache slot.
//   dsa_index_key_norm_rope_append_kernel: a warp per key row: LayerNorm + RoPE straight into its bf16 cache slot.
//   dsa_index_scores_kernel<T, DPL> (head_dim = 32 * DPL): CTA (query token, sequence, 256-key chunk),
//       8 warps. q [n_heads, head_dim] and w * weight_scale of the query sit in shared memory (f32);
//       a warp takes one causal key at a time, each lane holding dims lane + 32a of it, and for each
//       head h in order: d = warp_sum(q_h . k), acc = fma(w_h, max(d * scale, 0), acc); lane 0 writes
//       the score into the query's workspace row. Queries that keep all keys (pos + 1 <= topk) are
//       skipped.
//   dsa_select_topk_kernel: CTA per query (256 threads). k = min(topk, pos + 1); k == pos + 1 writes
//       0..pos. Otherwise a radix select over dsa_ordered_key(score): 4 passes of 8 bits (a shared
//       256-bin histogram of the keys matching the prefix so far, thread 0 picks the digit with
//       dsa_radix_pick) give the k-th largest key T and how many keys equal to T are taken
//       (`remaining`); then one pass in position order, 256 keys at a time, takes every key > T and
//       the first `remaining` keys == T, each written at its rank among the taken keys (block-wide
//       exclusive counts from warp ballots): ascending positions, exactly model::dsa_select_topk's set.
// Performance notes: the score kernel re-reads the query's keys per token (a tile of tokens sharing
// each key row, or tensor-core MMA over [tokens x heads] x keys, is the next step); the select pass
// reads a query's scores 5 times from L2. Tested by tests/kernels/test_cuda_dsa_indexer.cpp and
// test_cuda_mla_fusions.cpp (the fused key append).
#include <algorithm>

#include "core/error.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/launch_grid.h"
#include "kernels/cuda/ops/device_errors.h"
#include "kernels/cuda/ops/dsa_indexer.h"
#include "kernels/cuda/ops/fused_append.cuh"
#include "kernels/cuda/ops/layer_norm.h"
#include "kernels/cuda/ops/layer_norm_row.cuh"
#include "kernels/cuda/ops/rope_math.cuh"
#include "kernels/cuda/warp_reduce.cuh"

namespace fp4moe::cuda {

namespace {

__device__ __forceinline__ float to_f32(float x) { return x; }
__device__ __forceinline__ float to_f32(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename T>
__global__ void __launch_bounds__(256)
    dsa_index_cache_append_kernel(const T* __restrict__ k, int64_t k_stride, int64_t n_tokens,
                                  const int32_t* __restrict__ slots, int64_t n_slots, int head_dim,
                                  T* __restrict__ cache, uint32_t* error_flag) {
  const int64_t total = n_tokens * head_dim;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; idx < total; idx += stride) {
    const int64_t t = idx / head_dim;
    const int64_t c = idx % head_dim;
    const int64_t slot = slots[t];
    if (slot < 0) continue;
    if (slot >= n_slots) {
      if (c == 0) atomicOr(error_flag, kDeviceErrorKvSlot);
      continue;
    }
    cache[slot * head_dim + c] = k[t * k_stride + c];
  }
}

// dsa_index_key_norm_rope_append's kernel (bf16 cache): a warp a token row of k; its LayerNorm
// (layer_norm_warp_row) straight into the cache slot, then, after the warp's writes are visible to it, the
// rotary pairs of that row rotated in place (rope_kernel's arithmetic, a lane a pair). Flags as the three
// launches it replaces: kDeviceErrorRopePosition for a position outside the table (the row then stays
// unrotated), then slot -1 skipped and a slot past the cache kDeviceErrorKvSlot.
constexpr int kKeyAppendWarps = 8;  // dsa_index_key_norm_rope_append_kernel: a warp a key row, 8 a CTA

__global__ void __launch_bounds__(32 * kKeyAppendWarps)
    dsa_index_key_norm_rope_append_kernel(const __nv_bfloat16* __restrict__ k, int64_t k_stride, int64_t n_tokens,
                                          int head_dim, const float* __restrict__ ln_w, const float* __restrict__ ln_b,
                                          float eps, int rope, const int32_t* __restrict__ positions,
                                          const float* __restrict__ cos_table, const float* __restrict__ sin_table,
                                          int64_t n_positions, bool neox, const int32_t* __restrict__ slots,
                                          int64_t n_slots, __nv_bfloat16* cache, uint32_t* error_flag) {
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int64_t t = static_cast<int64_t>(blockIdx.x) * kKeyAppendWarps + threadIdx.x / 32;
  if (t >= n_tokens) return;  // warp-uniform
  const FusedAppendTarget at = fused_append_target(positions, n_positions, slots, n_slots, t, lane, error_flag);
  if (at.slot < 0) return;
  __nv_bfloat16* dst = cache + at.slot * head_dim;
  layer_norm_warp_row(k + t * k_stride, ln_w, ln_b, head_dim, eps, dst, lane);
  if (!at.pos_ok) return;
  __syncwarp();  // the row's normalized values, written by every lane, visible to the lanes rotating them
  const int half = rope / 2;
  for (int i = lane; i < half; i += 32) {
    int64_t i1, i2;
    rope_pair_dims(neox, i, half, i1, i2);
    rope_rotate_pair(__bfloat162float(dst[i1]), __bfloat162float(dst[i2]), cos_table[at.pos * half + i],
                     sin_table[at.pos * half + i], dst[i1], dst[i2]);
  }
}

struct IndexParams {
  const __nv_bfloat16* q;
  const __nv_bfloat16* w;
  const void* cache;
  const int32_t* block_table;
  const int32_t* seq_lens;
  const int32_t* q_start;
  const int32_t* sel_offsets;
  int32_t* sel_idx;
  float* scores;  // this chunk's rows: [n_seqs, gridDim.x, max_seq_len]
  uint32_t* error_flag;
  int64_t tok_begin;  // the chunk's first query token (within each sequence)
  int64_t n_blocks;
  int64_t max_blocks_per_seq;
  int64_t max_seq_len;
  int64_t index_topk;
  int64_t n_selected;
  int page_size;
  int n_heads;
  int head_dim;
  float scale;
  float weight_scale;
};

// The query of CTA (blockIdx.x, blockIdx.y): its row and position, or false (CTA-uniform) when the
// sequence has fewer tokens or its lengths are inconsistent (then kDeviceErrorSeqLen, once per query
// when `report`).
struct IndexQuery {
  int64_t row;
  int64_t pos;
};

// The chunk's workspace row of CTA (blockIdx.x, blockIdx.y): [n_seqs, gridDim.x] rows.
__device__ __forceinline__ int64_t chunk_ws_row() {
  return static_cast<int64_t>(blockIdx.y) * gridDim.x + blockIdx.x;
}
__device__ __forceinline__ bool index_query(const IndexParams& p, bool report, IndexQuery* q) {
  const int s = blockIdx.y;
  const int64_t tok = p.tok_begin + blockIdx.x;
  const int64_t q_begin = p.q_start[s];
  const int64_t q_len = p.q_start[s + 1] - q_begin;
  if (tok >= q_len) return false;
  const int64_t seq_len = p.seq_lens[s];
  if (seq_len < q_len || seq_len > p.max_blocks_per_seq * p.page_size || seq_len > p.max_seq_len) {
    if (report && threadIdx.x == 0) atomicOr(p.error_flag, kDeviceErrorSeqLen);
    return false;
  }
  q->row = q_begin + tok;
  q->pos = seq_len - q_len + tok;
  return true;
}

template <typename T, int DPL>
__global__ void __launch_bounds__(kDsaScoreWarps * 32) dsa_index_scores_kernel(const IndexParams p) {
  extern __shared__ __align__(16) unsigned char smem[];
  const DsaScoreSmemLayout L = dsa_score_smem_layout(p.n_heads, p.head_dim);
  float* q_s = reinterpret_cast<float*>(smem);
  float* w_s = reinterpret_cast<float*>(smem + L.w_offset);
  constexpr int D = 32 * DPL;
  const int warp = static_cast<int>(threadIdx.x) / 32;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  IndexQuery qr;
  if (!index_query(p, blockIdx.z == 0, &qr)) return;
  const int64_t n_causal = qr.pos + 1;
  if (n_causal <= p.index_topk) return;  // the query keeps every causal key: nothing to score
  const int64_t t_begin = static_cast<int64_t>(blockIdx.z) * kDsaKeysPerCta;
  if (t_begin >= n_causal) return;
  const int64_t t_end = min(t_begin + kDsaKeysPerCta, n_causal);

  const __nv_bfloat16* q = p.q + qr.row * p.n_heads * D;
  for (int i = threadIdx.x; i < p.n_heads * D; i += kDsaScoreWarps * 32) q_s[i] = __bfloat162float(q[i]);
  for (int h = threadIdx.x; h < p.n_heads; h += kDsaScoreWarps * 32) {
    w_s[h] = __bfloat162float(p.w[qr.row * p.n_heads + h]) * p.weight_scale;  // as the CPU: iw *= wscale
  }
  __syncthreads();

  const T* cache = static_cast<const T*>(p.cache);
  const int32_t* table = p.block_table + static_cast<int64_t>(blockIdx.y) * p.max_blocks_per_seq;
  float* out = p.scores + chunk_ws_row() * p.max_seq_len;
  for (int64_t t = t_begin + warp; t < t_end; t += kDsaScoreWarps) {
    const int64_t blk = table[t / p.page_size];
    if (blk < 0 || blk >= p.n_blocks) {  // warp-uniform
      if (lane == 0) {
        atomicOr(p.error_flag, kDeviceErrorKvBlock);
        out[t] = 0.0f;
      }
      continue;
    }
    const T* kr = cache + (blk * p.page_size + t % p.page_size) * D;
    float kv[DPL];
#pragma unroll
    for (int a = 0; a < DPL; ++a) kv[a] = to_f32(kr[lane + 32 * a]);
    float acc = 0.0f;
    for (int h = 0; h < p.n_heads; ++h) {
      const float* qh = q_s + h * D;
      float d = 0.0f;
#pragma unroll
      for (int a = 0; a < DPL; ++a) d = fmaf(qh[lane + 32 * a], kv[a], d);
      d = warp_sum(d);
      acc = fmaf(w_s[h], fmaxf(d * p.scale, 0.0f), acc);
    }
    if (lane == 0) out[t] = acc;
  }
}

constexpr int kSelectWarps = kDsaSelectThreads / 32;

// How many threads of the CTA before this one have `flag` set (and, in *total, how many in all).
// Every thread of the CTA must call it.
__device__ __forceinline__ int block_exclusive_count(bool flag, int* warp_counts, int* total) {
  const int warp = static_cast<int>(threadIdx.x) / 32;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const unsigned ballot = __ballot_sync(kWarpFullMask, flag);
  if (lane == 0) warp_counts[warp] = __popc(ballot);
  __syncthreads();
  int before = __popc(ballot & ((1u << lane) - 1u));
  int tot = 0;
#pragma unroll
  for (int w = 0; w < kSelectWarps; ++w) {
    const int c = warp_counts[w];
    if (w < warp) before += c;
    tot += c;
  }
  __syncthreads();  // warp_counts is rewritten by the next call
  *total = tot;
  return before;
}

// (minimum 4 CTAs per SM: up to 64 registers; without it ptxas kept 32 and spilled)
__global__ void __launch_bounds__(kDsaSelectThreads, 4) dsa_select_topk_kernel(const IndexParams p) {
  __shared__ uint32_t hist[256];
  __shared__ int warp_counts[kSelectWarps];
  __shared__ uint32_t s_prefix;
  __shared__ int64_t s_remaining;
  IndexQuery qr;
  if (!index_query(p, true, &qr)) return;
  const int64_t n = qr.pos + 1;
  const int64_t k = min(p.index_topk, n);
  const int64_t o0 = p.sel_offsets[qr.row];
  const int64_t o1 = p.sel_offsets[qr.row + 1];
  if (o0 < 0 || o1 - o0 != k || o1 > p.n_selected) {
    if (threadIdx.x == 0) atomicOr(p.error_flag, kDeviceErrorKeySelection);
    return;  // CTA-uniform
  }
  int32_t* out = p.sel_idx + o0;
  if (k == n) {
    for (int64_t t = threadIdx.x; t < n; t += kDsaSelectThreads) out[t] = static_cast<int32_t>(t);
    return;
  }
  const float* sc = p.scores + chunk_ws_row() * p.max_seq_len;

  // Radix select: after the passes, `prefix` is the k-th largest key and `remaining` keys equal to
  // it are taken (all keys above it are).
  uint32_t prefix = 0, mask = 0;
  int64_t remaining = k;
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int i = threadIdx.x; i < 256; i += kDsaSelectThreads) hist[i] = 0;
    __syncthreads();
    for (int64_t t = threadIdx.x; t < n; t += kDsaSelectThreads) {
      const uint32_t u = dsa_ordered_key(sc[t]);
      if ((u & mask) == prefix) atomicAdd(&hist[(u >> shift) & 255u], 1u);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      int64_t n_greater = 0;
      const int d = dsa_radix_pick(hist, remaining, &n_greater);
      s_prefix = prefix | (static_cast<uint32_t>(d) << shift);
      s_remaining = remaining - n_greater;
    }
    __syncthreads();
    prefix = s_prefix;
    remaining = s_remaining;
    mask |= 255u << shift;
  }

  int64_t taken = 0, eq_seen = 0;
  for (int64_t base = 0; base < n; base += kDsaSelectThreads) {  // CTA-uniform bounds
    const int64_t t = base + threadIdx.x;
    const bool valid = t < n;
    const uint32_t u = valid ? dsa_ordered_key(sc[t]) : 0u;
    const bool gt = valid && u > prefix;
    const bool eq = valid && u == prefix;
    int eq_total = 0, sel_total = 0;
    const int eq_before = block_exclusive_count(eq, warp_counts, &eq_total);
    const bool sel = gt || (eq && eq_seen + eq_before < remaining);
    const int sel_before = block_exclusive_count(sel, warp_counts, &sel_total);
    if (sel) out[taken + sel_before] = static_cast<int32_t>(t);
    taken += sel_total;
    eq_seen += eq_total;
  }
  if (threadIdx.x == 0 && taken != k) atomicOr(p.error_flag, kDeviceErrorKeySelection);  // cannot happen
}

template <typename T, int DPL>
void launch_scores(const IndexParams& p, const DsaIndexPlan& plan, cudaStream_t stream) {
  const dim3 grid(plan.score_grid_x, plan.score_grid_y, plan.score_grid_z);
  dsa_index_scores_kernel<T, DPL><<<grid, kDsaScoreWarps * 32, plan.score_smem_bytes, stream>>>(p);
}

template <typename T>
void launch_scores_t(const IndexParams& p, const DsaIndexPlan& plan, cudaStream_t stream) {
  switch (p.head_dim) {
    case 32: launch_scores<T, 1>(p, plan, stream); break;
    case 64: launch_scores<T, 2>(p, plan, stream); break;
    case 128: launch_scores<T, 4>(p, plan, stream); break;
    case 256: launch_scores<T, 8>(p, plan, stream); break;
    default: FP4MOE_FAIL() << "dsa_index_select_topk: head_dim " << p.head_dim << " (32, 64, 128 or 256)";
  }
}

void check_cache(const char* what, const DsaIndexCacheView& c) {
  FP4MOE_CHECK((c.dtype == DType::kBF16 || c.dtype == DType::kF32) && c.n_blocks >= 1 && c.page_size >= 1 &&
               c.page_size <= INT32_MAX && c.head_dim >= 1)
      << what << ": indexer cache " << dtype_name(c.dtype) << " (BF16 or F32), n_blocks=" << c.n_blocks
      << ", page_size=" << c.page_size << ", head_dim=" << c.head_dim;
}

}  // namespace

std::string DsaIndexPlan::to_string() const {
  return "scores " + std::to_string(score_grid_x) + "x" + std::to_string(score_grid_y) + "x" +
         std::to_string(score_grid_z) + " CTAs (" + std::to_string(score_smem_bytes) + " B smem), select " +
         std::to_string(select_grid_x) + "x" + std::to_string(select_grid_y) + ", " + std::to_string(n_chunks) +
         (n_chunks == 1 ? " chunk of " : " chunks of ") + std::to_string(chunk_tokens) + " tokens";
}

std::vector<int32_t> dsa_selection_offsets(std::span<const int32_t> seq_lens, std::span<const int32_t> q_start,
                                           int64_t index_topk) {
  FP4MOE_CHECK(index_topk >= 1) << "dsa_selection_offsets: index_topk " << index_topk << " (must be >= 1)";
  FP4MOE_CHECK(q_start.size() == seq_lens.size() + 1 && q_start[0] == 0)
      << "dsa_selection_offsets: q_start has " << q_start.size() << " entries for " << seq_lens.size()
      << " sequences (needs n_seqs + 1, starting at 0; first " << (q_start.empty() ? -1 : q_start[0]) << ")";
  for (size_t s = 0; s < seq_lens.size(); ++s) {
    const int64_t q_len = static_cast<int64_t>(q_start[s + 1]) - q_start[s];
    FP4MOE_CHECK(q_len >= 0 && q_len <= seq_lens[s])
        << "dsa_selection_offsets: sequence " << s << " has q_start " << q_start[s] << " .. " << q_start[s + 1]
        << " (" << q_len << " queries) and seq_len " << seq_lens[s] << " (needs 0 <= q_len <= seq_len)";
  }
  // q_start is non-decreasing from 0 now: every query row is below q_start.back().
  std::vector<int32_t> offsets(static_cast<size_t>(q_start.back()) + 1, 0);
  int64_t total = 0;
  for (size_t s = 0; s < seq_lens.size(); ++s) {
    const int64_t q_len = static_cast<int64_t>(q_start[s + 1]) - q_start[s];
    for (int64_t j = 0; j < q_len; ++j) {
      const int64_t pos = seq_lens[s] - q_len + j;
      total += std::min<int64_t>(index_topk, pos + 1);
      FP4MOE_CHECK(total <= INT32_MAX) << "dsa_selection_offsets: " << total << " selected keys by sequence " << s
                                       << " query " << j << " exceed int32 (split the batch)";
      offsets[static_cast<size_t>(q_start[s] + j) + 1] = static_cast<int32_t>(total);
    }
  }
  return offsets;
}

DsaIndexPlan dsa_index_plan(const DsaIndexerDims& d, int64_t n_seqs, int64_t max_q_len, int64_t max_seq_len,
                            size_t workspace_bytes) {
  const char* what = "dsa_index_select_topk";
  FP4MOE_CHECK(d.n_heads >= 1 && (d.head_dim == 32 || d.head_dim == 64 || d.head_dim == 128 || d.head_dim == 256) &&
               d.index_topk >= 1 && d.scale > 0.0f && d.weight_scale > 0.0f)
      << what << ": index heads=" << d.n_heads << ", head_dim=" << d.head_dim << " (32, 64, 128 or 256), topk="
      << d.index_topk << " (>= 1), scale=" << d.scale << ", weight_scale=" << d.weight_scale << " (> 0)";
  const int64_t smem = (static_cast<int64_t>(d.n_heads) * d.head_dim + d.n_heads) * 4;
  FP4MOE_CHECK(smem <= 48 * 1024) << what << ": q " << d.n_heads << " x " << d.head_dim << " + w " << d.n_heads
                                  << " f32 = " << smem << " B of shared memory > 49152 B";
  FP4MOE_CHECK(n_seqs >= 0 && n_seqs <= 65535 && max_q_len >= 0 && max_q_len <= INT32_MAX)
      << what << ": n_seqs=" << n_seqs << " (<= 65535), max_q_len=" << max_q_len << " (<= " << INT32_MAX << ")";
  FP4MOE_CHECK(max_seq_len >= max_q_len && max_seq_len <= kDsaMaxKeys)
      << what << ": max_seq_len " << max_seq_len << " (>= max_q_len " << max_q_len << ", <= " << kDsaMaxKeys
      << " = 65535 key chunks x " << kDsaKeysPerCta << ")";
  DsaIndexPlan plan;
  plan.chunk_tokens = std::max<int64_t>(dsa_index_chunk_tokens(n_seqs, max_q_len, max_seq_len, workspace_bytes), 1);
  plan.n_chunks = max_q_len > 0 ? (max_q_len + plan.chunk_tokens - 1) / plan.chunk_tokens : 0;
  const size_t per_token = static_cast<size_t>(n_seqs) * static_cast<size_t>(max_seq_len) * sizeof(float);
  FP4MOE_CHECK(max_seq_len <= d.index_topk || max_q_len == 0 || workspace_bytes >= per_token)
      << what << ": a score workspace of " << workspace_bytes << " B cannot hold one query per sequence ("
      << n_seqs << " sequences x " << max_seq_len << " keys x 4 B = " << per_token << " B)";
  plan.score_grid_x = plan.select_grid_x = static_cast<unsigned>(plan.chunk_tokens);
  plan.score_grid_y = plan.select_grid_y = static_cast<unsigned>(std::max<int64_t>(n_seqs, 1));
  plan.score_grid_z = static_cast<unsigned>(std::max<int64_t>((max_seq_len + kDsaKeysPerCta - 1) / kDsaKeysPerCta, 1));
  plan.score_smem_bytes = dsa_score_smem_layout(d.n_heads, d.head_dim).total_bytes;
  return plan;
}

int64_t dsa_index_chunk_tokens(int64_t n_seqs, int64_t max_q_len, int64_t max_seq_len, size_t workspace_bytes) {
  FP4MOE_CHECK(n_seqs >= 0 && max_q_len >= 0 && max_seq_len >= 0)
      << "dsa_index_chunk_tokens: n_seqs=" << n_seqs << ", max_q_len=" << max_q_len << ", max_seq_len=" << max_seq_len;
  if (n_seqs == 0 || max_q_len == 0 || max_seq_len == 0) return 0;
  const size_t per_token = static_cast<size_t>(n_seqs) * static_cast<size_t>(max_seq_len) * sizeof(float);
  return std::clamp<int64_t>(static_cast<int64_t>(workspace_bytes / per_token), 1, max_q_len);
}

size_t dsa_index_workspace_bytes(int64_t n_seqs, int64_t max_q_len, int64_t max_seq_len, size_t budget_bytes) {
  const int64_t chunk = dsa_index_chunk_tokens(n_seqs, max_q_len, max_seq_len, budget_bytes);
  return static_cast<size_t>(n_seqs) * static_cast<size_t>(chunk) * static_cast<size_t>(max_seq_len) * sizeof(float);
}

void dsa_index_cache_append(const void* k, int64_t k_stride, int64_t n_tokens, const int32_t* slots,
                            const DsaIndexCacheView& cache, uint32_t* error_flag, cudaStream_t stream) {
  check_cache("dsa_index_cache_append", cache);
  FP4MOE_CHECK(n_tokens >= 0 && k_stride >= cache.head_dim)
      << "dsa_index_cache_append: tokens=" << n_tokens << ", k_stride=" << k_stride << " (>= head_dim "
      << cache.head_dim << ")";
  if (n_tokens == 0) return;
  FP4MOE_CHECK(k != nullptr && slots != nullptr && cache.k != nullptr && error_flag != nullptr)
      << "dsa_index_cache_append: null pointer for tokens=" << n_tokens;
  const int64_t total = n_tokens * cache.head_dim;
  const int grid = grid_stride_ctas(total, 256);
  const int64_t n_slots = cache.n_blocks * cache.page_size;
  if (cache.dtype == DType::kBF16) {
    dsa_index_cache_append_kernel<__nv_bfloat16><<<grid, 256, 0, stream>>>(
        static_cast<const __nv_bfloat16*>(k), k_stride, n_tokens, slots, n_slots, cache.head_dim,
        static_cast<__nv_bfloat16*>(cache.k), error_flag);
  } else {
    dsa_index_cache_append_kernel<float><<<grid, 256, 0, stream>>>(static_cast<const float*>(k), k_stride, n_tokens,
                                                                   slots, n_slots, cache.head_dim,
                                                                   static_cast<float*>(cache.k), error_flag);
  }
  FP4MOE_CUDA_CHECK(cudaGetLastError());
}

void dsa_index_key_norm_rope_append(__nv_bfloat16* k, int64_t k_stride, int64_t n_tokens, const DsaKeyNormRope& nr,
                                    const int32_t* slots, const DsaIndexCacheView& cache, uint32_t* error_flag,
                                    cudaStream_t stream) {
  check_cache("dsa_index_key_norm_rope_append", cache);
  const int head_dim = cache.head_dim;
  FP4MOE_CHECK(n_tokens >= 0 && k_stride >= head_dim && nr.rope >= 2 && nr.rope % 2 == 0 && nr.rope <= head_dim &&
               nr.angles.n_positions >= 1 && nr.eps >= 0.0f)
      << "dsa_index_key_norm_rope_append: tokens=" << n_tokens << ", k_stride=" << k_stride << ", head_dim=" << head_dim
      << ", rope=" << nr.rope << " (even, 2..head_dim), n_positions=" << nr.angles.n_positions << ", eps=" << nr.eps;
  if (n_tokens == 0) return;
  FP4MOE_CHECK(k != nullptr && nr.ln_w != nullptr && nr.ln_b != nullptr && nr.angles.complete() && slots != nullptr &&
               cache.k != nullptr && error_flag != nullptr)
      << "dsa_index_key_norm_rope_append: null pointer for tokens=" << n_tokens;
  FP4MOE_CHECK(cache.dtype == DType::kBF16)
      << "dsa_index_key_norm_rope_append: the cache holds " << dtype_name(cache.dtype)
      << " keys; this path writes bf16 (use layer_norm_bf16 + rope_bf16 + dsa_index_cache_append)";
  if (n_tokens > int64_t{kGridStrideMaxCtas} * kKeyAppendWarps) {  // past the grid: the three launches, in place on k
    layer_norm_bf16(k, nr.ln_w, nr.ln_b, n_tokens, head_dim, k_stride, nr.eps, k, stream);
    rope_bf16(k, n_tokens, 1, k_stride, k_stride, 0, nr.rope, nr.angles.style, nr.angles.positions, nr.angles.cos,
              nr.angles.sin, nr.angles.n_positions, error_flag, stream);
    dsa_index_cache_append(k, k_stride, n_tokens, slots, cache, error_flag, stream);
    return;
  }
  dsa_index_key_norm_rope_append_kernel<<<static_cast<unsigned>((n_tokens + kKeyAppendWarps - 1) / kKeyAppendWarps),
                                          32 * kKeyAppendWarps, 0, stream>>>(
      k, k_stride, n_tokens, head_dim, nr.ln_w, nr.ln_b, nr.eps, nr.rope, nr.angles.positions, nr.angles.cos,
      nr.angles.sin, nr.angles.n_positions, nr.angles.style == RopeStyle::kNeox, slots,
      cache.n_blocks * cache.page_size, static_cast<__nv_bfloat16*>(cache.k), error_flag);
  FP4MOE_CUDA_CHECK(cudaGetLastError());
}

void dsa_index_select_topk(const DsaIndexerArgs& a, const DsaIndexerDims& dims, float* workspace,
                           size_t workspace_bytes, cudaStream_t stream) {
  const char* what = "dsa_index_select_topk";
  check_cache(what, a.cache);
  FP4MOE_CHECK(a.cache.head_dim == dims.head_dim && a.max_blocks_per_seq >= 1 && a.n_tokens >= 0 &&
               a.max_q_len <= a.n_tokens && a.n_selected >= 0)
      << what << ": cache head_dim " << a.cache.head_dim << ", indexer head_dim " << dims.head_dim
      << "; max_blocks_per_seq=" << a.max_blocks_per_seq << ", n_tokens=" << a.n_tokens << ", max_q_len="
      << a.max_q_len << " (<= n_tokens), n_selected=" << a.n_selected;
  const bool any_scored = a.max_seq_len > dims.index_topk;
  const DsaIndexPlan plan =
      dsa_index_plan(dims, a.n_seqs, a.max_q_len, a.max_seq_len, any_scored ? workspace_bytes : ~size_t{0});
  if (a.n_seqs == 0 || a.n_tokens == 0 || a.max_q_len == 0) return;
  FP4MOE_CHECK(a.q != nullptr && a.w != nullptr && a.cache.k != nullptr && a.block_table != nullptr &&
               a.seq_lens != nullptr && a.q_start != nullptr && a.sel_offsets != nullptr && a.sel_idx != nullptr &&
               a.error_flag != nullptr && (workspace != nullptr || !any_scored))
      << what << ": null pointer (q, w, cache, block_table, seq_lens, q_start, sel_offsets, sel_idx, error_flag, or "
      << "the score workspace of " << workspace_bytes << " B)";

  IndexParams p{};
  p.q = a.q;
  p.w = a.w;
  p.cache = a.cache.k;
  p.block_table = a.block_table;
  p.seq_lens = a.seq_lens;
  p.q_start = a.q_start;
  p.sel_offsets = a.sel_offsets;
  p.sel_idx = a.sel_idx;
  p.scores = workspace;
  p.error_flag = a.error_flag;
  p.n_blocks = a.cache.n_blocks;
  p.max_blocks_per_seq = a.max_blocks_per_seq;
  p.max_seq_len = a.max_seq_len;
  p.index_topk = dims.index_topk;
  p.n_selected = a.n_selected;
  p.page_size = static_cast<int>(a.cache.page_size);
  p.n_heads = dims.n_heads;
  p.head_dim = dims.head_dim;
  p.scale = dims.scale;
  p.weight_scale = dims.weight_scale;
  // Chunk c scores query tokens [c x chunk, (c + 1) x chunk) of every sequence into the workspace;
  // its select pass reads them (same stream) before chunk c + 1 overwrites them.
  for (int64_t c = 0; c < plan.n_chunks; ++c) {
    DsaIndexPlan chunk = plan;
    p.tok_begin = c * plan.chunk_tokens;
    chunk.score_grid_x = chunk.select_grid_x =
        static_cast<unsigned>(std::min<int64_t>(plan.chunk_tokens, a.max_q_len - p.tok_begin));
    if (any_scored) {
      if (a.cache.dtype == DType::kBF16) {
        launch_scores_t<__nv_bfloat16>(p, chunk, stream);
      } else {
        launch_scores_t<float>(p, chunk, stream);
      }
      FP4MOE_CUDA_CHECK(cudaGetLastError());
    }
    dsa_select_topk_kernel<<<dim3(chunk.select_grid_x, chunk.select_grid_y), kDsaSelectThreads, 0, stream>>>(p);
    FP4MOE_CUDA_CHECK(cudaGetLastError());
  }
}

}  // namespace fp4moe::cuda
