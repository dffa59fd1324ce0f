// Paged GQA attention kernels (see paged_attention.h for the layouts and the math).
//
// paged_attention_kernel<DPL> (head_dim = 32 * DPL), 128 threads = 4 warps, grid
//   x = q_tile * (n_kv_heads * n_head_chunks) + kv_head * n_head_chunks + head_chunk
//   y = sequence, z = key split.
// The CTA's 32 query rows (tokens_per_cta tokens x heads_per_cta heads of one KV head's group) sit
// in shared memory as f32; row r belongs to warp r % 4 (slot r / 4), which keeps its running max m,
// sum l and output accumulator (DPL dims per lane) in registers. The CTA walks its keys 32 at a time:
// all threads copy the 32 keys' K and V rows (16-byte loads, found through the block table) into
// shared memory, then each warp scores one key per lane for each of its rows (dot over head_dim
// from shared memory), does the online-softmax update with warp shuffles and adds p_j * V[j].
// K rows are padded by 2 bf16 (stride head_dim/2 + 1 words, odd) so lane j's reads of row j hit 32
// different banks; V rows are read by all lanes at once (contiguous dims), so unpadded.
// Shared memory (AttnSmem<D>, attention_geometry.h): q 32*D*4 + K 32*(D+2)*2 + V 32*D*2 = 32,896 B at D = 128 (< 48 KiB
// static).
//
// split merge:            split_merge_kernel.cuh (a thread per (token, head, dim), shared with MLA).
// kv_cache_append_kernel: one thread per bf16 pair of a token's K and V rows.
// Tested by tests/kernels/test_cuda_paged_attention.cpp.
#include "kernels/cuda/warp_reduce.cuh"
#include "kernels/cuda/ops/paged_attention.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/launch_grid.h"
#include "kernels/cuda/ops/attention_geometry.h"
#include "kernels/cuda/ops/device_errors.h"
#include "kernels/cuda/ops/split_merge_kernel.cuh"

namespace fp4moe::cuda {

namespace {

constexpr unsigned kFullMask = 0xffffffffu;
constexpr int kAttnThreads = kAttnWarps * 32;
static_assert(kAttnRowsPerCta == 32, "row tiling (attention_row_tiling) assumes 32 rows a CTA");
static_assert(kAttnKeysPerTile == 32, "one key per lane");

struct KernelParams {
  const __nv_bfloat16* q;
  const __nv_bfloat16* k_cache;
  const __nv_bfloat16* v_cache;
  const int32_t* block_table;
  const int32_t* seq_lens;
  const int32_t* q_start;  // null: decode, one query per sequence at row s
  __nv_bfloat16* out;
  float* part_o;    // split path only
  float* part_lse;  // split path only
  uint32_t* error_flag;
  int64_t n_blocks;
  int64_t max_blocks_per_seq;
  int64_t max_keys;  // a seq_len above this (or above max_blocks_per_seq * page_size) is an error
  int page_size;
  int n_kv_heads;
  int n_heads;
  int group;
  int heads_per_cta;
  int n_head_chunks;
  int tokens_per_cta;
  int n_splits;
  float scale;
};

template <int DPL>
__global__ void __launch_bounds__(kAttnThreads) paged_attention_kernel(const KernelParams p) {
  constexpr int D = 32 * DPL;
  using L = AttnSmem<D>;
  __shared__ __align__(16) unsigned char smem[L::kTotalBytes];
  float* q_s = reinterpret_cast<float*>(smem + L::kQOffset);
  __nv_bfloat16* k_s = reinterpret_cast<__nv_bfloat16*>(smem + L::kKOffset);
  __nv_bfloat16* v_s = reinterpret_cast<__nv_bfloat16*>(smem + L::kVOffset);

  const int warp = static_cast<int>(threadIdx.x) / 32;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const AttnCta cta = attn_cta(blockIdx.x, p.n_kv_heads, p.n_head_chunks);
  const int kvh = cta.kv_head;
  const int chunk = cta.head_chunk;
  const int s = blockIdx.y;
  const int split = blockIdx.z;

  const int64_t seq_len = p.seq_lens[s];
  int64_t q_begin = s, q_len = 1;
  if (p.q_start != nullptr) {
    q_begin = p.q_start[s];
    q_len = p.q_start[s + 1] - q_begin;
  }
  const int64_t tok0 = cta.q_tile * p.tokens_per_cta;
  if (tok0 >= q_len) return;  // CTA-uniform: this sequence has fewer query tiles
  // Decode allows seq_len 0 (a padded batch entry: zeros out); prefill needs the chunk in the cache.
  if (seq_len < (p.q_start != nullptr ? q_len : 0) || seq_len > p.max_blocks_per_seq * p.page_size ||
      seq_len > p.max_keys) {
    if (threadIdx.x == 0) atomicOr(p.error_flag, kDeviceErrorSeqLen);
    return;  // CTA-uniform
  }

  // Rows of this CTA (attention_geometry.h): r -> (token tok0 + r / heads_per_cta, group head
  // chunk * heads_per_cta + r % heads_per_cta).
  auto row_of = [&](int r) { return attn_row(r, tok0, chunk, p.heads_per_cta, p.tokens_per_cta, p.group, q_len); };

  for (int i = threadIdx.x; i < kAttnRowsPerCta * D; i += kAttnThreads) {
    const int r = i / D;
    const int d = i % D;
    const AttnRow row = row_of(r);
    float v = 0.0f;
    if (row.valid) {
      const int head = kvh * p.group + row.group_head;
      v = __bfloat162float(p.q[((q_begin + row.token) * p.n_heads + head) * D + d]);
    }
    q_s[i] = v;
  }

  // Per-warp row state; slot i is row i * 4 + warp. limit = the row's query position (keys <= it).
  float m[kAttnRowsPerWarp], l[kAttnRowsPerWarp], acc[kAttnRowsPerWarp][DPL];
  int limit[kAttnRowsPerWarp];  // seq_lens are int32, so positions fit
#pragma unroll
  for (int i = 0; i < kAttnRowsPerWarp; ++i) {
    m[i] = -INFINITY;
    l[i] = 0.0f;
#pragma unroll
    for (int a = 0; a < DPL; ++a) acc[i][a] = 0.0f;
    const AttnRow row = row_of(i * kAttnWarps + warp);
    limit[i] = row.valid ? static_cast<int>(attn_query_pos(seq_len, q_len, row.token)) : -1;
  }
  int64_t key_begin64 = 0, key_end64 = 0;
  attn_key_range(seq_len, q_len, tok0, p.tokens_per_cta, split, p.n_splits, &key_begin64, &key_end64);
  // Walked keys are below seq_len (int32), so 32-bit from here (fewer registers in the hot loop); an
  // empty range (a split past this sequence's end, whose begin may not fit 32 bits) becomes [0, 0).
  const bool any_key = key_end64 > key_begin64;
  const int key_begin = any_key ? static_cast<int>(key_begin64) : 0;
  const int key_end = any_key ? static_cast<int>(key_end64) : 0;
  constexpr int kChunksPerRow = D / 8;  // 16-byte chunks of a K or V row
  const int64_t row_elems = static_cast<int64_t>(p.n_kv_heads) * D;
  const int32_t* table = p.block_table + static_cast<int64_t>(s) * p.max_blocks_per_seq;

  for (int k0 = key_begin; k0 < key_end; k0 += kAttnKeysPerTile) {
    __syncthreads();  // the previous tile is consumed (and q_s is written before the first)
    for (int i = threadIdx.x; i < kAttnKeysPerTile * kChunksPerRow; i += kAttnThreads) {
      const int j = i / kChunksPerRow;
      const int c = i % kChunksPerRow;
      const int key = k0 + j;
      uint4 kv = make_uint4(0, 0, 0, 0), vv = make_uint4(0, 0, 0, 0);
      if (key < key_end) {
        const int64_t blk = table[key / p.page_size];
        if (blk < 0 || blk >= p.n_blocks) {
          atomicOr(p.error_flag, kDeviceErrorKvBlock);
        } else {
          const int64_t off = (blk * p.page_size + key % p.page_size) * row_elems + static_cast<int64_t>(kvh) * D + c * 8;
          kv = *reinterpret_cast<const uint4*>(p.k_cache + off);
          vv = *reinterpret_cast<const uint4*>(p.v_cache + off);
        }
      }
      uint32_t* kd = reinterpret_cast<uint32_t*>(k_s + j * L::kKStride + c * 8);  // 4-byte aligned only
      kd[0] = kv.x;
      kd[1] = kv.y;
      kd[2] = kv.z;
      kd[3] = kv.w;
      *reinterpret_cast<uint4*>(v_s + j * D + c * 8) = vv;
    }
    __syncthreads();
    const int n_valid = min(kAttnKeysPerTile, key_end - k0);
    const int key = k0 + lane;
#pragma unroll
    for (int i = 0; i < kAttnRowsPerWarp; ++i) {
      if (limit[i] < k0) continue;  // warp-uniform: invalid row, or no key of this tile is visible
      const int r = i * kAttnWarps + warp;
      float score = -INFINITY;
      if (lane < n_valid && key <= limit[i]) {
        const float2* qr = reinterpret_cast<const float2*>(q_s + r * D);
        const __nv_bfloat162* kr = reinterpret_cast<const __nv_bfloat162*>(k_s + lane * L::kKStride);
        float dot = 0.0f;
#pragma unroll 8
        for (int d2 = 0; d2 < D / 2; ++d2) {
          const float2 qq = qr[d2];
          const float2 kk = __bfloat1622float2(kr[d2]);
          dot = fmaf(qq.x, kk.x, dot);
          dot = fmaf(qq.y, kk.y, dot);
        }
        score = dot * p.scale;  // as the CPU: (q . k) * scale
      }
      // Lane 0's key k0 <= limit[i], so the tile max is finite.
      const float m_new = fmaxf(m[i], warp_max(score));
      const float prob = score == -INFINITY ? 0.0f : expf(score - m_new);
      const float corr = expf(m[i] - m_new);  // 0 on the first visible tile (m = -inf)
      l[i] = l[i] * corr + warp_sum(prob);
#pragma unroll
      for (int a = 0; a < DPL; ++a) acc[i][a] *= corr;
      for (int j = 0; j < n_valid; ++j) {
        const float pj = __shfl_sync(kFullMask, prob, j);
        const __nv_bfloat16* vr = v_s + j * D + lane * DPL;
#pragma unroll
        for (int a = 0; a < DPL; ++a) acc[i][a] = fmaf(pj, __bfloat162float(vr[a]), acc[i][a]);
      }
      m[i] = m_new;
    }
  }

#pragma unroll
  for (int i = 0; i < kAttnRowsPerWarp; ++i) {
    const AttnRow rw = row_of(i * kAttnWarps + warp);
    if (!rw.valid) continue;
    const int head = kvh * p.group + rw.group_head;
    const int64_t row = (q_begin + rw.token) * p.n_heads + head;
    const float inv = l[i] > 0.0f ? 1.0f / l[i] : 0.0f;  // no visible key (empty split / seq_len 0): zeros
    if (p.n_splits == 1) {
#pragma unroll
      for (int a = 0; a < DPL; ++a) p.out[row * D + lane * DPL + a] = __float2bfloat16_rn(acc[i][a] * inv);
    } else {
      const int64_t prow = row * p.n_splits + split;
#pragma unroll
      for (int a = 0; a < DPL; ++a) p.part_o[prow * D + lane * DPL + a] = acc[i][a] * inv;
      if (lane == 0) p.part_lse[prow] = l[i] > 0.0f ? m[i] + logf(l[i]) : -INFINITY;
    }
  }
}

__global__ void __launch_bounds__(256)
    kv_cache_append_kernel(const __nv_bfloat16* __restrict__ k, int64_t k_stride, const __nv_bfloat16* __restrict__ v,
                           int64_t v_stride, int64_t n_tokens, const int32_t* __restrict__ slots, int64_t n_slots,
                           int64_t row_elems, __nv_bfloat16* __restrict__ k_cache, __nv_bfloat16* __restrict__ v_cache,
                           uint32_t* error_flag) {
  const int64_t pairs = row_elems / 2;
  const int64_t total = n_tokens * pairs;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; idx < total; idx += stride) {
    const int64_t t = idx / pairs;
    const int64_t c = idx % pairs;
    const int64_t slot = slots[t];
    if (slot < 0) continue;  // padding
    if (slot >= n_slots) {
      if (c == 0) atomicOr(error_flag, kDeviceErrorKvSlot);
      continue;
    }
    reinterpret_cast<__nv_bfloat162*>(k_cache + slot * row_elems)[c] =
        reinterpret_cast<const __nv_bfloat162*>(k + t * k_stride)[c];
    reinterpret_cast<__nv_bfloat162*>(v_cache + slot * row_elems)[c] =
        reinterpret_cast<const __nv_bfloat162*>(v + t * v_stride)[c];
  }
}

void check_common(const char* what, const PagedAttentionArgs& a) {
  const PagedKvCacheView& c = a.cache;
  FP4MOE_CHECK(c.head_dim >= 32 && c.head_dim <= 128 && c.head_dim % 32 == 0)
      << what << ": head_dim " << c.head_dim << " (supported: 32, 64, 96, 128)";
  FP4MOE_CHECK(c.n_blocks >= 1 && c.page_size >= 1 && c.n_kv_heads >= 1 && a.n_seqs >= 0 && a.n_seqs <= 65535 &&
               a.max_blocks_per_seq >= 1 && a.n_heads >= 1 && a.n_heads % c.n_kv_heads == 0 && a.scale > 0.0f &&
               a.n_heads <= INT32_MAX && c.page_size <= INT32_MAX)
      << what << ": n_blocks=" << c.n_blocks << ", page_size=" << c.page_size << ", n_kv_heads=" << c.n_kv_heads
      << ", n_heads=" << a.n_heads << ", n_seqs=" << a.n_seqs << " (<= 65535), max_blocks_per_seq="
      << a.max_blocks_per_seq << ", scale=" << a.scale;
  FP4MOE_CHECK(a.q != nullptr && c.k != nullptr && c.v != nullptr && a.block_table != nullptr &&
               a.seq_lens != nullptr && a.out != nullptr && a.error_flag != nullptr)
      << what << ": null pointer (q, k/v cache, block_table, seq_lens, out or error_flag)";
  for (const void* ptr : {static_cast<const void*>(c.k), static_cast<const void*>(c.v)}) {
    FP4MOE_CHECK(reinterpret_cast<uintptr_t>(ptr) % 16 == 0) << what << ": K/V cache base " << ptr
                                                            << " is not 16-byte aligned";
  }
}

KernelParams make_params(const PagedAttentionArgs& a, const AttentionRowTiling& t) {
  KernelParams p{};
  p.q = a.q;
  p.k_cache = a.cache.k;
  p.v_cache = a.cache.v;
  p.block_table = a.block_table;
  p.seq_lens = a.seq_lens;
  p.out = a.out;
  p.error_flag = a.error_flag;
  p.n_blocks = a.cache.n_blocks;
  p.max_blocks_per_seq = a.max_blocks_per_seq;
  p.page_size = static_cast<int>(a.cache.page_size);
  p.n_kv_heads = static_cast<int>(a.cache.n_kv_heads);
  p.n_heads = static_cast<int>(a.n_heads);
  p.group = static_cast<int>(a.n_heads / a.cache.n_kv_heads);
  p.heads_per_cta = t.heads_per_cta;
  p.n_head_chunks = t.n_head_chunks;
  p.tokens_per_cta = t.tokens_per_cta;
  p.scale = a.scale;
  return p;
}

void launch_attention(const KernelParams& p, int64_t head_dim, dim3 grid, cudaStream_t stream) {
  switch (head_dim / 32) {
    case 1: paged_attention_kernel<1><<<grid, kAttnThreads, 0, stream>>>(p); break;
    case 2: paged_attention_kernel<2><<<grid, kAttnThreads, 0, stream>>>(p); break;
    case 3: paged_attention_kernel<3><<<grid, kAttnThreads, 0, stream>>>(p); break;
    case 4: paged_attention_kernel<4><<<grid, kAttnThreads, 0, stream>>>(p); break;
    default: FP4MOE_FAIL() << "paged attention: head_dim " << head_dim << " (supported: 32, 64, 96, 128)";
  }
  FP4MOE_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

void kv_cache_append_bf16(const __nv_bfloat16* k, int64_t k_stride, const __nv_bfloat16* v, int64_t v_stride,
                          int64_t n_tokens, const int32_t* slots, const PagedKvCacheView& cache, uint32_t* error_flag,
                          cudaStream_t stream) {
  const int64_t row_elems = cache.n_kv_heads * cache.head_dim;
  FP4MOE_CHECK(n_tokens >= 0 && cache.n_blocks >= 1 && cache.page_size >= 1 && row_elems >= 2 && row_elems % 2 == 0 &&
               k_stride >= row_elems && v_stride >= row_elems && k_stride % 2 == 0 && v_stride % 2 == 0)
      << "kv_cache_append_bf16: tokens=" << n_tokens << ", n_blocks=" << cache.n_blocks << ", page_size="
      << cache.page_size << ", kv row " << cache.n_kv_heads << "x" << cache.head_dim << ", k_stride=" << k_stride
      << ", v_stride=" << v_stride << " (row width and strides must be even, strides >= row width)";
  if (n_tokens == 0) return;
  FP4MOE_CHECK(k != nullptr && v != nullptr && slots != nullptr && cache.k != nullptr && cache.v != nullptr &&
               error_flag != nullptr)
      << "kv_cache_append_bf16: null pointer for tokens=" << n_tokens;
  for (const void* ptr : {static_cast<const void*>(k), static_cast<const void*>(v), static_cast<const void*>(cache.k),
                          static_cast<const void*>(cache.v)}) {
    FP4MOE_CHECK(reinterpret_cast<uintptr_t>(ptr) % 4 == 0) << "kv_cache_append_bf16: pointer " << ptr
                                                           << " is not 4-byte aligned (bf16 pairs)";
  }
  const int64_t total = n_tokens * row_elems / 2;
  const int grid = grid_stride_ctas(total, 256);
  kv_cache_append_kernel<<<grid, 256, 0, stream>>>(k, k_stride, v, v_stride, n_tokens, slots, cache.n_slots(),
                                                   row_elems, cache.k, cache.v, error_flag);
  FP4MOE_CUDA_CHECK(cudaGetLastError());
}

void paged_attention_decode_bf16(const PagedAttentionArgs& args, const DecodeSplit& split, float* workspace,
                                 cudaStream_t stream) {
  check_common("paged_attention_decode_bf16", args);
  check_decode_split("paged_attention_decode_bf16", split);  // so p.max_keys below cannot overflow
  FP4MOE_CHECK(split.n_splits == 1 || workspace != nullptr)
      << "paged_attention_decode_bf16: split " << split.to_string() << " needs a workspace of "
      << attention_workspace_bytes(args.n_seqs, args.n_heads, args.cache.head_dim, split) << " B";
  if (args.n_seqs == 0) return;
  const AttentionRowTiling t = attention_row_tiling(args.n_heads, args.cache.n_kv_heads);
  KernelParams p = make_params(args, t);
  p.max_keys = split.keys_per_split * split.n_splits;
  p.n_splits = split.n_splits;
  const int64_t n_rows = args.n_seqs * args.n_heads;
  if (split.n_splits > 1) {
    p.part_o = workspace;
    p.part_lse = workspace + n_rows * split.n_splits * args.cache.head_dim;
  }
  const dim3 grid(static_cast<unsigned>(args.cache.n_kv_heads * t.n_head_chunks), static_cast<unsigned>(args.n_seqs),
                  static_cast<unsigned>(split.n_splits));
  launch_attention(p, args.cache.head_dim, grid, stream);
  if (split.n_splits > 1) {
    launch_split_merge(p.part_o, p.part_lse, n_rows, split.n_splits, static_cast<int>(args.cache.head_dim), args.out,
                       stream);
  }
}

void paged_attention_prefill_bf16(const PagedAttentionArgs& args, const int32_t* q_start, int64_t n_tokens,
                                  int64_t max_q_len, cudaStream_t stream) {
  check_common("paged_attention_prefill_bf16", args);
  FP4MOE_CHECK(q_start != nullptr && n_tokens >= 0 && max_q_len >= 0)
      << "paged_attention_prefill_bf16: q_start " << (q_start ? "set" : "null") << ", tokens=" << n_tokens
      << ", max_q_len=" << max_q_len;
  if (args.n_seqs == 0 || n_tokens == 0 || max_q_len == 0) return;
  const AttentionRowTiling t = attention_row_tiling(args.n_heads, args.cache.n_kv_heads);
  KernelParams p = make_params(args, t);
  p.q_start = q_start;
  const int64_t cap = args.max_blocks_per_seq * args.cache.page_size;
  p.max_keys = cap;
  p.n_splits = 1;
  const int64_t n_q_tiles = (max_q_len + t.tokens_per_cta - 1) / t.tokens_per_cta;
  const int64_t grid_x = n_q_tiles * args.cache.n_kv_heads * t.n_head_chunks;
  FP4MOE_CHECK(grid_x <= INT32_MAX) << "paged_attention_prefill_bf16: " << grid_x << " CTAs along x for max_q_len "
                                    << max_q_len;
  launch_attention(p, args.cache.head_dim, dim3(static_cast<unsigned>(grid_x), static_cast<unsigned>(args.n_seqs), 1),
                   stream);
}

}  // namespace fp4moe::cuda
