// MLA absorbed-form attention for many queries per sequence (see mla_prefill.h).
//   mla_prefill_attention_kernel<NTW> (rank = 32 * NTW): CTA (token x 16-head chunk, sequence, key
//       split), mla_decode's tensor-core CTA (mla_mma_attention.cuh) over the query's key list:
//       0..pos (dense) or its DSA selection, the split walking list indices [split * keys_per_split,
//       ...); each list entry is checked (causality, block id) when its row is resolved (PrefillRows).
//   split merge:              split_merge_kernel.cuh (a thread per (token, head, dim) -> latent; shared).
// Performance notes: a CTA reads its keys once per 16 heads of ONE token, so dense prefill re-reads
// the cache per token from L2 (fine for DSA lists of <= 2048 keys; a multi-token tile sharing the
// K tile is the next step for long dense prefill). Tested by tests/kernels/test_cuda_mla_prefill.cpp.
#include "kernels/cuda/warp_reduce.cuh"
#include "kernels/cuda/ops/mla_prefill.h"

#include <algorithm>

#include "core/error.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/ops/device_errors.h"
#include "kernels/cuda/ops/mla_mma_attention.cuh"
#include "kernels/cuda/ops/split_merge_kernel.cuh"

namespace fp4moe::cuda {

namespace {

struct PrefillParams {
  const float* q_lat;
  const __nv_bfloat16* cache;
  const int32_t* block_table;
  const int32_t* seq_lens;
  const int32_t* q_start;
  const int32_t* sel_offsets;
  const int32_t* sel_idx;
  float* latent;
  float* part_o;
  float* part_lse;
  uint32_t* error_flag;
  int64_t n_blocks;
  int64_t max_blocks_per_seq;
  int64_t keys_per_split;
  int64_t max_keys;  // n_splits * keys_per_split
  int64_t n_selected;
  int page_size;
  int n_heads;
  int n_chunks;
  int rank;
  int rope;
  int n_splits;
  float scale;
};

// A query's key list (mla_mma::RowFetch): dense (entry j = key j <= pos by construction: the block table
// lookup as decode, mla_mma::TableRows) or its DSA selection (entry j = key sel[j], fetched; resolve checks it
// causal and then looks it up: its block id depends on the key).
struct PrefillRows {
  const int32_t* sel;  // the query's selection, nullptr: dense
  int64_t pos;         // the query's position
  mla_mma::TableRows keys;
  __device__ __forceinline__ mla_mma::RowFetch fetch(int j) const {
    return sel != nullptr ? mla_mma::RowFetch{sel[j], 0} : keys.fetch(j);
  }
  __device__ __forceinline__ int64_t resolve(const mla_mma::RowFetch& f) const {
    if (sel == nullptr) return keys.resolve(f);
    if (f.a < 0 || f.a > pos) {
      atomicOr(keys.error_flag, kDeviceErrorKeySelection);
      return -1;
    }
    return keys.row(f.a);
  }
};

template <int NTW>
__global__ void __launch_bounds__(mla_mma::kThreads, 1) mla_prefill_attention_kernel(const PrefillParams p) {
  extern __shared__ __align__(128) unsigned char smem[];
  const MlaPrefillCta cta = mla_prefill_cta(blockIdx.x, p.n_chunks);
  const int s = blockIdx.y;
  const int split = blockIdx.z;
  const int W = p.rank + p.rope;

  const int64_t q_begin = p.q_start[s];
  const int64_t q_len = p.q_start[s + 1] - q_begin;
  if (cta.token >= q_len) return;  // CTA-uniform: this sequence has fewer query tokens
  const int64_t seq_len = p.seq_lens[s];
  if (seq_len < q_len || seq_len > p.max_blocks_per_seq * p.page_size) {
    if (threadIdx.x == 0) atomicOr(p.error_flag, kDeviceErrorSeqLen);
    return;  // CTA-uniform
  }
  const int64_t row = q_begin + cta.token;  // query row of q_lat / latent / sel_offsets
  const int64_t pos = attn_query_pos(seq_len, q_len, cta.token);
  int64_t off0 = 0, n_keys = pos + 1;
  if (p.sel_offsets != nullptr) {
    off0 = p.sel_offsets[row];
    const int64_t off1 = p.sel_offsets[row + 1];
    n_keys = off1 - off0;
    if (off0 < 0 || off1 < off0 || off1 > p.n_selected || n_keys > pos + 1) {
      if (threadIdx.x == 0) atomicOr(p.error_flag, kDeviceErrorKeySelection);
      return;  // CTA-uniform
    }
  }
  if (n_keys > p.max_keys) {
    if (threadIdx.x == 0) atomicOr(p.error_flag, kDeviceErrorSeqLen);
    return;  // CTA-uniform: the splits do not cover this key list
  }
  int64_t begin64 = 0, end64 = 0;
  mla_split_key_range(n_keys, split, p.keys_per_split, &begin64, &end64);
  // List indices are below n_keys <= pos + 1 <= seq_len (int32), so 32-bit from here; an empty range
  // (a split past this list's end, whose begin may not fit 32 bits) becomes [0, 0).
  const bool any_key = end64 > begin64;
  const PrefillRows rows{
      p.sel_offsets != nullptr ? p.sel_idx + off0 : nullptr,  // read only when n_keys > 0
      pos,
      {p.block_table + static_cast<int64_t>(s) * p.max_blocks_per_seq, p.page_size, p.n_blocks, W, p.error_flag}};
  mla_mma::Args a;
  a.q = p.q_lat + row * p.n_heads * W;
  a.cache = p.cache;
  a.n_heads = p.n_heads;
  a.h0 = cta.chunk * kMlaHeadsPerCta;
  a.rank = p.rank;
  a.rope = p.rope;
  a.key_begin = any_key ? static_cast<int>(begin64) : 0;
  a.key_end = any_key ? static_cast<int>(end64) : 0;
  a.scale = p.scale;
  mla_mma::set_output(a, p.latent, p.part_o, p.part_lse, row * p.n_heads, p.rank, p.n_splits, split);
  mla_mma::attend<NTW>(a, rows, smem);
}

template <int RPL>
void launch(const PrefillParams& p, dim3 grid, int smem_bytes, cudaStream_t stream) {
  if (smem_bytes > 48 * 1024) {
    FP4MOE_CUDA_CHECK(cudaFuncSetAttribute(mla_prefill_attention_kernel<RPL>,
                                           cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes));
  }
  mla_prefill_attention_kernel<RPL><<<grid, mla_mma::kThreads, smem_bytes, stream>>>(p);
}

}  // namespace

void mla_prefill_attention(const MlaPrefillArgs& a, const MlaDecodeDims& dims, const DecodeSplit& split,
                           float* workspace, cudaStream_t stream) {
  const char* what = "mla_prefill_attention";
  FP4MOE_CHECK(dims.n_heads >= 1 && dims.n_heads <= 65535 && dims.qk_nope_head_dim >= 1 && dims.v_head_dim >= 1 &&
               (dims.kv_lora_rank == 32 || dims.kv_lora_rank == 64 || dims.kv_lora_rank == 128 ||
                dims.kv_lora_rank == 256 || dims.kv_lora_rank == 512) &&
               dims.qk_rope_head_dim >= 2 && dims.qk_rope_head_dim <= 128 && dims.qk_rope_head_dim % 2 == 0 &&
               dims.scale > 0.0f)
      << what << ": heads=" << dims.n_heads << ", kv_lora_rank=" << dims.kv_lora_rank
      << " (32, 64, 128, 256 or 512), nope=" << dims.qk_nope_head_dim << ", rope=" << dims.qk_rope_head_dim
      << " (even, <= 128), v=" << dims.v_head_dim << ", scale=" << dims.scale;
  const MlaCacheView& cache = a.cache;
  FP4MOE_CHECK(cache.kv_lora_rank == dims.kv_lora_rank && cache.rope_dim == dims.qk_rope_head_dim &&
               cache.n_blocks >= 1 && cache.page_size >= 1 && cache.page_size <= INT32_MAX &&
               a.max_blocks_per_seq >= 1 && a.n_seqs >= 0 && a.n_seqs <= 65535 && a.n_tokens >= 0 &&
               a.max_q_len >= 0 && a.max_q_len <= a.n_tokens && a.n_selected >= 0)
      << what << ": cache rank " << cache.kv_lora_rank << " / rope " << cache.rope_dim << ", layer wants "
      << dims.kv_lora_rank << " / " << dims.qk_rope_head_dim << "; n_blocks=" << cache.n_blocks
      << ", page_size=" << cache.page_size << ", max_blocks_per_seq=" << a.max_blocks_per_seq
      << ", n_seqs=" << a.n_seqs << " (<= 65535), n_tokens=" << a.n_tokens << ", max_q_len=" << a.max_q_len
      << " (<= n_tokens), n_selected=" << a.n_selected;
  check_decode_split(what, split);
  FP4MOE_CHECK(split.n_splits == 1 || workspace != nullptr)
      << what << ": split " << split.to_string() << " needs a workspace of "
      << mla_prefill_workspace_bytes(a.n_tokens, dims, split) << " B";
  if (a.n_seqs == 0 || a.n_tokens == 0 || a.max_q_len == 0) return;
  FP4MOE_CHECK(a.q_lat != nullptr && cache.kv != nullptr && a.block_table != nullptr && a.seq_lens != nullptr &&
               a.q_start != nullptr && a.latent != nullptr && a.error_flag != nullptr)
      << what << ": null pointer (q_lat, cache, block_table, seq_lens, q_start, latent or error_flag)";
  FP4MOE_CHECK(a.sel_offsets == nullptr || a.n_selected == 0 || a.sel_idx != nullptr)
      << what << ": selection offsets without sel_idx for " << a.n_selected << " selected keys";
  FP4MOE_CHECK(dims.latent_width() % 16 == 0 && dims.qk_rope_head_dim <= kMlaMaxRope)
      << what << ": kv_lora_rank " << dims.kv_lora_rank << " + rope " << dims.qk_rope_head_dim << " = "
      << dims.latent_width() << " must be a multiple of 16 (whole k16 tensor-core steps), rope <= " << kMlaMaxRope
      << " (the q fragments a warp holds)";
  FP4MOE_CHECK(reinterpret_cast<uintptr_t>(cache.kv) % 16 == 0 && reinterpret_cast<uintptr_t>(a.q_lat) % 8 == 0)
      << what << ": cache base " << static_cast<const void*>(cache.kv) << " (16 B) or q_lat "
      << static_cast<const void*>(a.q_lat) << " (8 B) is misaligned";
  const int n_chunks = (dims.n_heads + kMlaHeadsPerCta - 1) / kMlaHeadsPerCta;
  const int64_t grid_x = a.max_q_len * n_chunks;
  FP4MOE_CHECK(grid_x <= INT32_MAX) << what << ": " << grid_x << " CTAs along x for max_q_len " << a.max_q_len
                                    << " x " << n_chunks << " head chunks (> " << INT32_MAX << ")";
  const MlaMmaSmemLayout layout = mla_mma_smem_checked(what, dims.kv_lora_rank, dims.qk_rope_head_dim);

  PrefillParams p{};
  p.q_lat = a.q_lat;
  p.cache = cache.kv;
  p.block_table = a.block_table;
  p.seq_lens = a.seq_lens;
  p.q_start = a.q_start;
  p.sel_offsets = a.sel_offsets;
  p.sel_idx = a.sel_idx;
  p.latent = a.latent;
  p.error_flag = a.error_flag;
  p.n_blocks = cache.n_blocks;
  p.max_blocks_per_seq = a.max_blocks_per_seq;
  p.keys_per_split = split.keys_per_split;
  p.max_keys = split.keys_per_split * split.n_splits;
  p.n_selected = a.n_selected;
  p.page_size = static_cast<int>(cache.page_size);
  p.n_heads = dims.n_heads;
  p.n_chunks = n_chunks;
  p.rank = dims.kv_lora_rank;
  p.rope = dims.qk_rope_head_dim;
  p.n_splits = split.n_splits;
  p.scale = dims.scale;
  const int64_t n_rows = a.n_tokens * dims.n_heads;
  if (split.n_splits > 1) {
    p.part_o = workspace;
    p.part_lse = workspace + n_rows * split.n_splits * dims.kv_lora_rank;
  }
  const dim3 grid(static_cast<unsigned>(grid_x), static_cast<unsigned>(a.n_seqs),
                  static_cast<unsigned>(split.n_splits));
  switch (dims.kv_lora_rank / 32) {
    case 1: launch<1>(p, grid, layout.total_bytes, stream); break;
    case 2: launch<2>(p, grid, layout.total_bytes, stream); break;
    case 4: launch<4>(p, grid, layout.total_bytes, stream); break;
    case 8: launch<8>(p, grid, layout.total_bytes, stream); break;
    case 16: launch<16>(p, grid, layout.total_bytes, stream); break;
    default: FP4MOE_FAIL() << what << ": kv_lora_rank " << dims.kv_lora_rank;
  }
  FP4MOE_CUDA_CHECK(cudaGetLastError());
  if (split.n_splits > 1) {
    launch_split_merge(p.part_o, p.part_lse, n_rows, split.n_splits, dims.kv_lora_rank, a.latent, stream);
  }
}

}  // namespace fp4moe::cuda
