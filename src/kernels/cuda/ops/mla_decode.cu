// MLA absorbed-form decode kernels (see mla_decode.h).
//   mla_absorb_q:         cuBLAS strided-batched GEMM over heads (bf16 in, f32 out) + mla_copy_q_pe_kernel
//                         (thread per q_pe element, as f32).
//   mla_decode_attention_kernel<MB, CB> (MB m64 blocks of rank, CB 64-wide column blocks of rank + rope): CTA
//                         (16-head chunk, sequence, key split), two warpgroups, wgmma: mla_wgmma_attention.cuh over
//                         keys 0..seq_len-1 (kMlaWgCtasPerSm = 1 CTA an SM, as plan_mla_decode_split plans).
//   split merge:          split_merge_kernel.cuh (a thread per (sequence, head, dim) -> latent, or mla_project_v's
//                         bf16 hi / lo rows with latent_parts: SplitMergeBf16Parts; shared).
//   mla_project_v:        per pass of up to 256 sequences: mla_split_bf16_kernel (latent -> hi, lo bf16 rows;
//                         skipped when the attention wrote them: mla_project_v_parts),
//                         one cuBLAS strided-batched GEMM over heads (both rows of every sequence: W_UV read
//                         once) into f32, mla_sum_round_bf16_kernel (hi + lo products -> bf16 out).
//   mla_cache_append_kernel: thread per bf16 pair of a token's [c_kv | k_pe] row.
//   mla_latent_norm_rope_append_kernel: a warp per token: c_kv's RMSNorm + k_pe's RoPE straight into the cache.
// Tested by tests/kernels/test_cuda_mla_decode.cpp and test_cuda_mla_fusions.cpp (the fused launches).
#include <algorithm>

#include "core/error.h"
#include "kernels/cuda/cublas_check.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/launch_grid.h"
#include "kernels/cuda/ops/bf16_parts.cuh"
#include "kernels/cuda/ops/device_errors.h"
#include "kernels/cuda/ops/fused_append.cuh"
#include "kernels/cuda/ops/mla_decode.h"
#include "kernels/cuda/ops/mla_mma_attention.cuh"
#include "kernels/cuda/ops/mla_wgmma_attention.cuh"
#include "kernels/cuda/ops/rms_norm_row.cuh"
#include "kernels/cuda/ops/rope_math.cuh"
#include "kernels/cuda/ops/split_merge_kernel.cuh"
#include "kernels/cuda/warp_reduce.cuh"

namespace fp4moe::cuda {

namespace {

constexpr int kElementwiseThreads = 256;

struct MlaParams {
  const float* q_lat;
  const __nv_bfloat16* cache;
  const int32_t* block_table;
  const int32_t* seq_lens;
  float* latent;
  float* part_o;
  float* part_lse;
  __nv_bfloat16* parts;  // one split: latent as mla_project_v's bf16 hi / lo rows instead (nullptr: latent;
                         // with several splits the merge writes the parts)
  uint32_t* error_flag;
  int64_t n_blocks;
  int64_t max_blocks_per_seq;
  int64_t max_keys;  // n_splits x keys_per_split: the longest seq_len the plan takes
  int page_size;
  int n_heads;
  int rank;
  int rope;
  int n_splits;
  float scale;
};

// Decode: keys 0..seq_len-1 of sequence blockIdx.y, split blockIdx.z, heads of chunk blockIdx.x: the CTA's
// arguments and key rows for the attention CTA. False (after flagging kDeviceErrorSeqLen) for a bad seq_len.
__device__ __forceinline__ bool decode_cta(const MlaParams& p, mla_mma::Args& a, mla_mma::TableRows& rows) {
  const int chunk = blockIdx.x;
  const int s = blockIdx.y;
  const int split = blockIdx.z;
  const int64_t seq_len = p.seq_lens[s];
  if (seq_len < 0 || seq_len > p.max_blocks_per_seq * p.page_size || seq_len > p.max_keys) {
    if (threadIdx.x == 0) atomicOr(p.error_flag, kDeviceErrorSeqLen);
    return false;  // CTA-uniform
  }
  // Every head of a decode query sees keys 0..seq_len-1; this split walks [begin, end) of them, cut by this
  // sequence's own length.
  int64_t begin64 = 0, end64 = 0;
  mla_decode_split_keys(seq_len, p.n_splits, split, &begin64, &end64);
  const bool any_key = end64 > begin64;
  const int W = p.rank + p.rope;
  // The key list is the sequence's keys 0..seq_len-1 (list entry = key).
  rows = mla_mma::TableRows{p.block_table + static_cast<int64_t>(s) * p.max_blocks_per_seq, p.page_size, p.n_blocks, W,
                            p.error_flag};
  a.q = p.q_lat + static_cast<int64_t>(s) * p.n_heads * W;
  a.cache = p.cache;
  a.n_heads = p.n_heads;
  a.h0 = chunk * kMlaHeadsPerCta;
  a.rank = p.rank;
  a.rope = p.rope;
  a.key_begin = any_key ? static_cast<int>(begin64) : 0;  // keys < seq_len fit 32 bits
  a.key_end = any_key ? static_cast<int>(end64) : 0;
  a.scale = p.scale;
  mla_mma::set_output(a, p.latent, p.part_o, p.part_lse, static_cast<int64_t>(s) * p.n_heads, p.rank, p.n_splits, split);
  if (p.parts != nullptr) {  // rows 2 s (hi) and 2 s + 1 (lo) of n_heads x rank
    const int64_t row = static_cast<int64_t>(p.n_heads) * p.rank;
    a.parts = p.parts + 2 * static_cast<int64_t>(s) * row;
    a.parts_lo = row;
  }
  return true;
}

// The decode CTA on wgmma (mla_wgmma_attention.cuh): MB m64 blocks of latent dims, CB column blocks of rank + rope.
template <int MB, int CB>
__global__ void __launch_bounds__(mla_wgmma::kThreads, 1) mla_decode_attention_kernel(const MlaParams p) {
  extern __shared__ __align__(128) unsigned char smem[];
  mla_mma::Args a;
  mla_mma::TableRows rows{};
  if (!decode_cta(p, a, rows)) return;
  mla_wgmma::attend<MB, CB>(a, rows, smem);
}

// A thread per (row, head, pair of q_pe dims): q_lat's rope dims = q_pe, rotated by the row's position
// when `positions` is set (rope_kernel's arithmetic: the values rope_bf16 on q would have left; a
// position outside [0, n_positions) flags kDeviceErrorRopePosition and copies the pair unrotated, as
// rope_bf16 leaves it).
__global__ void __launch_bounds__(kElementwiseThreads)
    mla_copy_q_pe_kernel(const __nv_bfloat16* __restrict__ q, int64_t n_rows, int n_heads, int rank, int nope, int rope,
                         const int32_t* __restrict__ positions, const float* __restrict__ cos_table,
                         const float* __restrict__ sin_table, int64_t n_positions, bool neox, uint32_t* error_flag,
                         float* __restrict__ q_lat) {
  const int half = rope / 2;
  const int64_t total = n_rows * n_heads * half;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; idx < total; idx += stride) {
    const int64_t row_head = idx / half;  // s * n_heads + h
    const int64_t i = idx % half;
    int64_t i1, i2;
    rope_pair_dims(neox, i, half, i1, i2);
    const __nv_bfloat16* src = q + row_head * (nope + rope) + nope;
    __nv_bfloat16 y1 = src[i1], y2 = src[i2];
    if (positions != nullptr) {
      const int64_t pos = positions[row_head / n_heads];
      if (pos >= 0 && pos < n_positions) {
        rope_rotate_pair(__bfloat162float(y1), __bfloat162float(y2), cos_table[pos * half + i],
                         sin_table[pos * half + i], y1, y2);
      } else if (row_head % n_heads == 0 && i == 0) {
        atomicOr(error_flag, kDeviceErrorRopePosition);
      }
    }
    float* dst = q_lat + row_head * (rank + rope) + rank;
    dst[i1] = __bfloat162float(y1);
    dst[i2] = __bfloat162float(y2);
  }
}

__global__ void __launch_bounds__(kElementwiseThreads)
    mla_split_bf16_kernel(const float* __restrict__ x, int64_t n, int64_t row, __nv_bfloat16* __restrict__ parts) {
  // x [n / row rows of `row`] -> parts [2 x n / row rows]: row 2 s = bf16(x_s), row 2 s + 1 = bf16(x_s - hi).
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const int64_t at = bf16_parts_index(i, row);
    bf16_hi_lo(x[i], parts[at], parts[at + row]);
  }
}

__global__ void __launch_bounds__(kElementwiseThreads)
    mla_sum_round_bf16_kernel(const float* __restrict__ x, int64_t n, int64_t row, __nv_bfloat16* __restrict__ y) {
  // x [2 x n / row rows of `row`] -> y [n / row rows]: y_s = bf16(x_2s + x_2s+1).
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const int64_t at = i + (i / row) * row;
    y[i] = __float2bfloat16_rn(x[at] + x[at + row]);
  }
}

int elementwise_blocks(int64_t n) { return grid_stride_ctas(n, kElementwiseThreads, 4096); }

__global__ void __launch_bounds__(256)
    mla_cache_append_kernel(const __nv_bfloat16* __restrict__ c_kv, int64_t c_stride,
                            const __nv_bfloat16* __restrict__ k_pe, int64_t pe_stride, int64_t n_tokens,
                            const int32_t* __restrict__ slots, int64_t n_slots, int rank, int rope,
                            __nv_bfloat16* __restrict__ cache, uint32_t* error_flag) {
  const int64_t pairs = (rank + rope) / 2;
  const int64_t total = n_tokens * pairs;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; idx < total; idx += stride) {
    const int64_t t = idx / pairs;
    const int64_t c = idx % pairs;
    const int64_t slot = slots[t];
    if (slot < 0) continue;
    if (slot >= n_slots) {
      if (c == 0) atomicOr(error_flag, kDeviceErrorKvSlot);
      continue;
    }
    const __nv_bfloat162 v = 2 * c < rank
                                 ? reinterpret_cast<const __nv_bfloat162*>(c_kv + t * c_stride)[c]
                                 : reinterpret_cast<const __nv_bfloat162*>(k_pe + t * pe_stride)[c - rank / 2];
    reinterpret_cast<__nv_bfloat162*>(cache + slot * (rank + rope))[c] = v;
  }
}

// The latent branch's tail (mla_latent_norm_rope_append): a warp a token row of kv, 8 a CTA; the c_kv
// RMSNorm by rms_norm_vec_row (kVecs 16 B pieces a lane) straight into the cache slot, then k_pe's
// pairs (a lane a pair) rotated by rope_kernel's arithmetic. Flags as the three launches it replaces:
// kDeviceErrorRopePosition for a position outside the table (k_pe then copied unrotated), then slot -1
// skipped and a slot past the cache kDeviceErrorKvSlot.
template <int kVecs>
__global__ void __launch_bounds__(32 * kRmsNormCtaWarps)
    mla_latent_norm_rope_append_kernel(const __nv_bfloat16* __restrict__ kv, int64_t kv_stride, int64_t n_tokens,
                                       int rank, int rope, const float* __restrict__ norm_w, float eps,
                                       const int32_t* __restrict__ positions, const float* __restrict__ cos_table,
                                       const float* __restrict__ sin_table, int64_t n_positions, bool neox,
                                       const int32_t* __restrict__ slots, int64_t n_slots,
                                       __nv_bfloat16* __restrict__ cache, uint32_t* error_flag) {
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int64_t t = static_cast<int64_t>(blockIdx.x) * kRmsNormCtaWarps + threadIdx.x / 32;
  if (t >= n_tokens) return;  // warp-uniform
  const FusedAppendTarget at = fused_append_target(positions, n_positions, slots, n_slots, t, lane, error_flag);
  if (at.slot < 0) return;
  const __nv_bfloat16* src = kv + t * kv_stride;
  __nv_bfloat16* dst = cache + at.slot * (rank + rope);
  rms_norm_vec_row<32, kVecs>(src, nullptr, norm_w, rank, eps, dst, lane, /*warp_partial=*/nullptr);
  const int half = rope / 2;
  for (int i = lane; i < half; i += 32) {
    int64_t i1, i2;
    rope_pair_dims(neox, i, half, i1, i2);
    __nv_bfloat16 y1 = src[rank + i1], y2 = src[rank + i2];
    if (at.pos_ok) {
      rope_rotate_pair(__bfloat162float(y1), __bfloat162float(y2), cos_table[at.pos * half + i],
                       sin_table[at.pos * half + i], y1, y2);
    }
    dst[rank + i1] = y1;
    dst[rank + i2] = y2;
  }
}

void check_dims(const char* what, const MlaDecodeDims& d) {
  FP4MOE_CHECK(d.n_heads >= 1 && d.n_heads <= 65535 && d.qk_nope_head_dim >= 1 && d.v_head_dim >= 1 &&
               (d.kv_lora_rank == 32 || d.kv_lora_rank == 64 || d.kv_lora_rank == 128 || d.kv_lora_rank == 256 ||
                d.kv_lora_rank == 512) &&
               d.qk_rope_head_dim >= 2 && d.qk_rope_head_dim <= 128 && d.qk_rope_head_dim % 2 == 0 && d.scale > 0.0f)
      << what << ": heads=" << d.n_heads << ", kv_lora_rank=" << d.kv_lora_rank << " (32, 64, 128, 256 or 512), nope="
      << d.qk_nope_head_dim << ", rope=" << d.qk_rope_head_dim << " (even, <= 128), v=" << d.v_head_dim
      << ", scale=" << d.scale;
}

template <int MB, int CB>
void launch_mla_attention(const MlaParams& p, dim3 grid, int smem_bytes, cudaStream_t stream) {
  if (smem_bytes > 48 * 1024) {
    FP4MOE_CUDA_CHECK(cudaFuncSetAttribute(mla_decode_attention_kernel<MB, CB>,
                                           cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes));
  }
  mla_decode_attention_kernel<MB, CB><<<grid, mla_wgmma::kThreads, smem_bytes, stream>>>(p);
}

}  // namespace

void mla_cache_append_bf16(const __nv_bfloat16* c_kv, int64_t c_stride, const __nv_bfloat16* k_pe, int64_t pe_stride,
                           int64_t n_tokens, const int32_t* slots, const MlaCacheView& cache, uint32_t* error_flag,
                           cudaStream_t stream) {
  FP4MOE_CHECK(n_tokens >= 0 && cache.n_blocks >= 1 && cache.page_size >= 1 && cache.kv_lora_rank >= 2 &&
               cache.kv_lora_rank % 2 == 0 && cache.rope_dim >= 2 && cache.rope_dim % 2 == 0 &&
               c_stride >= cache.kv_lora_rank && pe_stride >= cache.rope_dim && c_stride % 2 == 0 && pe_stride % 2 == 0)
      << "mla_cache_append_bf16: tokens=" << n_tokens << ", n_blocks=" << cache.n_blocks << ", page_size="
      << cache.page_size << ", rank=" << cache.kv_lora_rank << ", rope=" << cache.rope_dim << ", c_stride=" << c_stride
      << ", pe_stride=" << pe_stride << " (even widths and strides, strides >= widths)";
  if (n_tokens == 0) return;
  FP4MOE_CHECK(c_kv != nullptr && k_pe != nullptr && slots != nullptr && cache.kv != nullptr && error_flag != nullptr)
      << "mla_cache_append_bf16: null pointer for tokens=" << n_tokens;
  for (const void* ptr : {static_cast<const void*>(c_kv), static_cast<const void*>(k_pe),
                          static_cast<const void*>(cache.kv)}) {
    FP4MOE_CHECK(reinterpret_cast<uintptr_t>(ptr) % 4 == 0) << "mla_cache_append_bf16: pointer " << ptr
                                                           << " is not 4-byte aligned (bf16 pairs)";
  }
  const int64_t total = n_tokens * (cache.kv_lora_rank + cache.rope_dim) / 2;
  const int grid = static_cast<int>(std::clamp<int64_t>((total + 255) / 256, 1, int64_t{1} << 20));
  mla_cache_append_kernel<<<grid, 256, 0, stream>>>(c_kv, c_stride, k_pe, pe_stride, n_tokens, slots,
                                                    cache.n_blocks * cache.page_size, cache.kv_lora_rank,
                                                    cache.rope_dim, cache.kv, error_flag);
  FP4MOE_CUDA_CHECK(cudaGetLastError());
}

void mla_latent_norm_rope_append(__nv_bfloat16* kv, int64_t kv_stride, int64_t n_tokens, const MlaLatentNormRope& nr,
                                 const int32_t* slots, const MlaCacheView& cache, uint32_t* error_flag,
                                 cudaStream_t stream) {
  const int rank = cache.kv_lora_rank, rope = cache.rope_dim;
  FP4MOE_CHECK(n_tokens >= 0 && rank >= 2 && rank % 2 == 0 && rope >= 2 && rope % 2 == 0 && kv_stride >= rank + rope &&
               kv_stride % 2 == 0 && cache.n_blocks >= 1 && cache.page_size >= 1 && nr.angles.n_positions >= 1 &&
               nr.eps >= 0.0f)
      << "mla_latent_norm_rope_append: tokens=" << n_tokens << ", rank=" << rank << ", rope=" << rope
      << ", kv_stride=" << kv_stride << ", n_blocks=" << cache.n_blocks << ", page_size=" << cache.page_size
      << ", n_positions=" << nr.angles.n_positions << ", eps=" << nr.eps
      << " (even rank, rope >= 2 and kv_stride >= rank + rope; a cache of at least one block and row)";
  if (n_tokens == 0) return;
  FP4MOE_CHECK(kv != nullptr && nr.norm_w != nullptr && nr.angles.complete() && slots != nullptr &&
               cache.kv != nullptr && error_flag != nullptr)
      << "mla_latent_norm_rope_append: null pointer for tokens=" << n_tokens;
  auto aligned16 = [](const void* q) { return reinterpret_cast<uintptr_t>(q) % 16 == 0; };
  const int64_t pieces = rank / 8;
  const int vecs = static_cast<int>((pieces + 31) / 32);
  // The fused kernel: 16 B pieces of c_kv (<= 2 a lane: rank <= 512, GLM-5's), 16 B aligned cache rows, one CTA
  // per 8 tokens within the grid limit. Otherwise the three launches, in place on kv (rms_norm_bf16 picks its
  // own kernel, so the bits are those of the same three launches either way).
  const bool fused = rank % 8 == 0 && (rank + rope) % 8 == 0 && kv_stride % 8 == 0 && vecs <= 2 && aligned16(kv) &&
                     aligned16(cache.kv) && aligned16(nr.norm_w) &&
                     n_tokens <= int64_t{kGridStrideMaxCtas} * kRmsNormCtaWarps;
  if (!fused) {
    rms_norm_bf16(kv, nullptr, nr.norm_w, n_tokens, rank, kv_stride, nr.eps, kv, stream);
    rope_bf16(kv, n_tokens, 1, kv_stride, kv_stride, rank, rope, nr.angles.style, nr.angles.positions, nr.angles.cos,
              nr.angles.sin, nr.angles.n_positions, error_flag, stream);
    mla_cache_append_bf16(kv, kv_stride, kv + rank, kv_stride, n_tokens, slots, cache, error_flag, stream);
    return;
  }
  using Kernel = decltype(&mla_latent_norm_rope_append_kernel<1>);
  constexpr Kernel kByVecs[2] = {mla_latent_norm_rope_append_kernel<1>, mla_latent_norm_rope_append_kernel<2>};
  const int grid = static_cast<int>((n_tokens + kRmsNormCtaWarps - 1) / kRmsNormCtaWarps);
  kByVecs[vecs - 1]<<<grid, 32 * kRmsNormCtaWarps, 0, stream>>>(
      kv, kv_stride, n_tokens, rank, rope, nr.norm_w, nr.eps, nr.angles.positions, nr.angles.cos, nr.angles.sin,
      nr.angles.n_positions, nr.angles.style == RopeStyle::kNeox, slots, cache.n_blocks * cache.page_size, cache.kv,
      error_flag);
  FP4MOE_CUDA_CHECK(cudaGetLastError());
}

void mla_absorb_q(const __nv_bfloat16* q, const __nv_bfloat16* kv_b, const MlaDecodeDims& dims, int64_t n_seqs,
                  float* q_lat, cublasHandle_t cublas, cudaStream_t stream, const MlaQRope* q_rope) {
  check_dims("mla_absorb_q", dims);
  FP4MOE_CHECK(n_seqs >= 0) << "mla_absorb_q: n_seqs=" << n_seqs;
  if (n_seqs == 0) return;
  FP4MOE_CHECK(q != nullptr && kv_b != nullptr && q_lat != nullptr && cublas != nullptr)
      << "mla_absorb_q: null pointer or cuBLAS handle";
  FP4MOE_CHECK(q_rope == nullptr || (q_rope->angles.complete() && q_rope->error_flag != nullptr))
      << "mla_absorb_q: q_pe RoPE needs positions, cos / sin tables, an error flag and n_positions >= 1 (got "
      << (q_rope == nullptr ? 0 : q_rope->angles.n_positions) << ")";
  const int64_t H = dims.n_heads, R = dims.kv_lora_rank, nope = dims.qk_nope_head_dim, rope = dims.qk_rope_head_dim;
  const int64_t qk = nope + rope, W = R + rope, rows_per_head = nope + dims.v_head_dim;
  // Column-major view per head h: q_lat_h^T [R, n] = W_UK_h^T [R, nope] x q_nope_h^T [nope, n].
  const float one = 1.0f, zero = 0.0f;
  cublas_bind_stream(cublas, stream);
  FP4MOE_CUBLAS_CHECK(cublasGemmStridedBatchedEx(
      cublas, CUBLAS_OP_N, CUBLAS_OP_N, static_cast<int>(R), static_cast<int>(n_seqs), static_cast<int>(nope), &one,
      kv_b, CUDA_R_16BF, static_cast<int>(R), rows_per_head * R, q, CUDA_R_16BF, static_cast<int>(H * qk), qk, &zero,
      q_lat, CUDA_R_32F, static_cast<int>(H * W), W, static_cast<int>(H), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  const int64_t n_pairs = n_seqs * H * (rope / 2);
  const RopeAngles angles = q_rope == nullptr ? RopeAngles{} : q_rope->angles;  // no positions: copied as is
  mla_copy_q_pe_kernel<<<elementwise_blocks(n_pairs), kElementwiseThreads, 0, stream>>>(
      q, n_seqs, static_cast<int>(H), static_cast<int>(R), static_cast<int>(nope), static_cast<int>(rope),
      angles.positions, angles.cos, angles.sin, angles.n_positions, angles.style == RopeStyle::kNeox,
      q_rope == nullptr ? nullptr : q_rope->error_flag, q_lat);
  FP4MOE_CUDA_CHECK(cudaGetLastError());
}

MlaMmaSmemLayout mla_mma_smem_checked(const char* what, int kv_lora_rank, int rope_dim) {
  const MlaMmaSmemLayout layout = mla_mma_smem_layout(kv_lora_rank, rope_dim);
  const DeviceLimits limits = current_device_limits();
  FP4MOE_CHECK(static_cast<uint32_t>(layout.total_bytes) <= limits.smem_optin_per_block)
      << what << ": shared memory 2 key tiles x " << layout.tile_bytes << " + scores " << layout.scores_bytes
      << " + q parts " << layout.q_part3_bytes << " = " << layout.total_bytes << " B > "
      << limits.smem_optin_per_block << " B (opt-in limit of device " << limits.device << ")";
  return layout;
}

MlaWgmmaSmemLayout mla_wgmma_smem_checked(const char* what, int kv_lora_rank, int rope_dim) {
  const MlaWgmmaSmemLayout layout = mla_wgmma_smem_layout(kv_lora_rank, rope_dim);
  const DeviceLimits limits = current_device_limits();
  FP4MOE_CHECK(static_cast<uint32_t>(layout.total_bytes) <= limits.smem_optin_per_block)
      << what << ": shared memory 2 key tiles x " << layout.tile_bytes << " + q parts " << layout.q_bytes
      << " + P parts " << layout.p_bytes << " + maxima " << layout.red_bytes << " + partial scores " << layout.xch_bytes
      << " + alignment " << kMlaWgAtomBytes << " = " << layout.total_bytes << " B > " << limits.smem_optin_per_block
      << " B (opt-in limit of device " << limits.device << ")";
  return layout;
}

bool mla_decode_attention(const float* q_lat, const MlaCacheView& cache, const int32_t* block_table,
                          int64_t max_blocks_per_seq, const int32_t* seq_lens, int64_t n_seqs,
                          const MlaDecodeDims& dims, const DecodeSplit& split, float* workspace, float* latent,
                          uint32_t* error_flag, cudaStream_t stream, __nv_bfloat16* latent_parts) {
  check_dims("mla_decode_attention", dims);
  FP4MOE_CHECK(cache.kv_lora_rank == dims.kv_lora_rank && cache.rope_dim == dims.qk_rope_head_dim &&
               cache.n_blocks >= 1 && cache.page_size >= 1 && cache.page_size <= INT32_MAX &&
               max_blocks_per_seq >= 1 && n_seqs >= 0 && n_seqs <= 65535)
      << "mla_decode_attention: cache rank " << cache.kv_lora_rank << " / rope " << cache.rope_dim << ", layer wants "
      << dims.kv_lora_rank << " / " << dims.qk_rope_head_dim << "; n_blocks=" << cache.n_blocks
      << ", page_size=" << cache.page_size << ", max_blocks_per_seq=" << max_blocks_per_seq << ", n_seqs=" << n_seqs
      << " (<= 65535)";
  FP4MOE_CHECK(split.n_splits >= 1 && split.n_splits <= 65535 && split.keys_per_split >= kAttnKeysPerTile &&
               split.keys_per_split % kAttnKeysPerTile == 0)
      << "mla_decode_attention: split " << split.to_string() << " (keys a split must be a positive multiple of "
      << kAttnKeysPerTile << ")";
  FP4MOE_CHECK(split.n_splits == 1 || workspace != nullptr)
      << "mla_decode_attention: split " << split.to_string() << " needs a workspace of "
      << mla_decode_workspace_bytes(n_seqs, dims, split) << " B";
  if (n_seqs == 0) return false;
  FP4MOE_CHECK(q_lat != nullptr && cache.kv != nullptr && block_table != nullptr && seq_lens != nullptr &&
               latent != nullptr && error_flag != nullptr)
      << "mla_decode_attention: null pointer (q_lat, cache, block_table, seq_lens, latent or error_flag)";
  FP4MOE_CHECK(dims.latent_width() % 16 == 0 && dims.qk_rope_head_dim <= kMlaMaxRope)
      << "mla_decode_attention: kv_lora_rank " << dims.kv_lora_rank << " + rope " << dims.qk_rope_head_dim << " = "
      << dims.latent_width() << " must be a multiple of 16 (whole k16 tensor-core steps), rope <= " << kMlaMaxRope
      << " (the q fragments a warp holds)";
  FP4MOE_CHECK(reinterpret_cast<uintptr_t>(cache.kv) % 16 == 0 && reinterpret_cast<uintptr_t>(q_lat) % 8 == 0)
      << "mla_decode_attention: cache base " << static_cast<const void*>(cache.kv) << " (16 B) or q_lat "
      << static_cast<const void*>(q_lat) << " (8 B) is misaligned";
  const MlaWgmmaSmemLayout layout =
      mla_wgmma_smem_checked("mla_decode_attention", dims.kv_lora_rank, dims.qk_rope_head_dim);

  MlaParams p{};
  p.q_lat = q_lat;
  p.cache = cache.kv;
  p.block_table = block_table;
  p.seq_lens = seq_lens;
  p.latent = latent;
  p.error_flag = error_flag;
  p.n_blocks = cache.n_blocks;
  p.max_blocks_per_seq = max_blocks_per_seq;
  p.max_keys = split.keys_per_split * split.n_splits;
  p.page_size = static_cast<int>(cache.page_size);
  p.n_heads = dims.n_heads;
  p.rank = dims.kv_lora_rank;
  p.rope = dims.qk_rope_head_dim;
  p.n_splits = split.n_splits;
  p.scale = dims.scale;
  const int64_t n_rows = n_seqs * dims.n_heads;
  if (split.n_splits > 1) {
    p.part_o = workspace;
    p.part_lse = workspace + n_rows * split.n_splits * dims.kv_lora_rank;
  } else {
    FP4MOE_CHECK(latent_parts == nullptr || reinterpret_cast<uintptr_t>(latent_parts) % 4 == 0)
        << "mla_decode_attention: latent_parts " << static_cast<const void*>(latent_parts)
        << " is not 4-byte aligned (bf16 pairs)";
    p.parts = latent_parts;
  }
  const dim3 grid(static_cast<unsigned>((dims.n_heads + kMlaHeadsPerCta - 1) / kMlaHeadsPerCta),
                  static_cast<unsigned>(n_seqs), static_cast<unsigned>(split.n_splits));
  // (m_blocks, col_blocks) of the ranks check_dims allows with rope <= kMlaMaxRope.
  switch (layout.m_blocks * 16 + layout.col_blocks) {
    case 1 * 16 + 1:
      launch_mla_attention<1, 1>(p, grid, layout.total_bytes, stream);
      break;
    case 1 * 16 + 2:
      launch_mla_attention<1, 2>(p, grid, layout.total_bytes, stream);
      break;
    case 2 * 16 + 3:
      launch_mla_attention<2, 3>(p, grid, layout.total_bytes, stream);
      break;
    case 4 * 16 + 5:
      launch_mla_attention<4, 5>(p, grid, layout.total_bytes, stream);
      break;
    case 8 * 16 + 9:
      launch_mla_attention<8, 9>(p, grid, layout.total_bytes, stream);
      break;
    default:
      FP4MOE_FAIL() << "mla_decode_attention: kv_lora_rank " << dims.kv_lora_rank << " + rope " << dims.qk_rope_head_dim
                    << " (" << layout.m_blocks << " m64 blocks, " << layout.col_blocks << " column blocks)";
  }
  FP4MOE_CUDA_CHECK(cudaGetLastError());
  if (split.n_splits > 1) {
    if (latent_parts != nullptr) {  // the merge writes the parts (mla_project_v's split saved here too)
      launch_split_merge_to(p.part_o, p.part_lse, n_rows, split.n_splits, dims.kv_lora_rank,
                            SplitMergeBf16Parts{latent_parts, static_cast<int64_t>(dims.n_heads) * dims.kv_lora_rank},
                            stream);
      return true;
    }
    launch_split_merge(p.part_o, p.part_lse, n_rows, split.n_splits, dims.kv_lora_rank, latent, stream);
  }
  return p.parts != nullptr;
}

namespace {
// Sequences a pass of mla_project_v takes: its workspace holds this many at most (GLM-5, 64 heads: 33.5 MB
// of bf16 parts + 33.5 MB of f32 products), so a prefill chunk of thousands of tokens does not size it by
// its tokens (two GEMMs over all of them took 196 KB a token); up to 256 sequences it takes 262 KB a
// sequence (f32 products of both parts), a third more than two GEMMs did. W_UV is read once a pass.
constexpr int64_t kProjectVPassRows = 256;
// One pass's workspace: [bf16 parts: 2 n rows of n_heads x rank (hi, lo a sequence) | f32 products:
// 2 n rows of n_heads x v], each 256-byte aligned.
struct ProjectVWorkspace {
  size_t parts = 0, out = 0, bytes = 0;
  ProjectVWorkspace(int64_t n_seqs, const MlaDecodeDims& d) {
    const auto align = [](size_t b) { return (b + 255) / 256 * 256; };
    const auto n = static_cast<size_t>(std::min(n_seqs, kProjectVPassRows));
    const size_t n_lat = n * d.n_heads * d.kv_lora_rank;
    out = align(2 * n_lat * 2);
    bytes = out + align(2 * n * d.n_heads * d.v_head_dim * 4);
  }
};
}  // namespace

size_t mla_project_v_workspace_bytes(int64_t n_seqs, const MlaDecodeDims& dims) {
  FP4MOE_CHECK(n_seqs >= 0) << "mla_project_v_workspace_bytes: n_seqs=" << n_seqs;
  return ProjectVWorkspace(n_seqs, dims).bytes;
}

__nv_bfloat16* mla_project_v_parts(void* workspace, int64_t n_seqs, const MlaDecodeDims& dims) {
  FP4MOE_CHECK(n_seqs >= 0) << "mla_project_v_parts: n_seqs=" << n_seqs;
  if (workspace == nullptr || n_seqs > kProjectVPassRows) return nullptr;
  return reinterpret_cast<__nv_bfloat16*>(static_cast<char*>(workspace) + ProjectVWorkspace(n_seqs, dims).parts);
}

void mla_project_v(const float* latent, const __nv_bfloat16* kv_b, const MlaDecodeDims& dims, int64_t n_seqs,
                   void* workspace, __nv_bfloat16* out, cublasHandle_t cublas, cudaStream_t stream, bool parts_ready) {
  check_dims("mla_project_v", dims);
  FP4MOE_CHECK(n_seqs >= 0) << "mla_project_v: n_seqs=" << n_seqs;
  if (n_seqs == 0) return;
  FP4MOE_CHECK((latent != nullptr || parts_ready) && kv_b != nullptr && out != nullptr && workspace != nullptr &&
               cublas != nullptr)
      << "mla_project_v: null pointer, workspace (" << mla_project_v_workspace_bytes(n_seqs, dims)
      << " B) or cuBLAS handle";
  FP4MOE_CHECK(!parts_ready || n_seqs <= kProjectVPassRows)
      << "mla_project_v: parts_ready with " << n_seqs << " sequences (one pass holds " << kProjectVPassRows << ")";
  const int64_t H = dims.n_heads, R = dims.kv_lora_rank, nope = dims.qk_nope_head_dim, V = dims.v_head_dim;
  const ProjectVWorkspace ws(n_seqs, dims);
  auto* base = static_cast<char*>(workspace);
  auto* parts = reinterpret_cast<__nv_bfloat16*>(base + ws.parts);
  auto* acc = reinterpret_cast<float*>(base + ws.out);
  cublas_bind_stream(cublas, stream);
  const float one = 1.0f, zero = 0.0f;
  const __nv_bfloat16* w_uv = kv_b + nope * R;
  for (int64_t s0 = 0; s0 < n_seqs; s0 += kProjectVPassRows) {
    const int64_t n = std::min(kProjectVPassRows, n_seqs - s0);
    const int64_t n_lat = n * H * R;
    if (!parts_ready) {
      mla_split_bf16_kernel<<<elementwise_blocks(n_lat), kElementwiseThreads, 0, stream>>>(latent + s0 * H * R, n_lat,
                                                                                           H * R, parts);
      FP4MOE_CUDA_CHECK(cudaGetLastError());
    }
    // Column-major view per head h: acc_h^T [V, 2 n] = (W_UV_h stored [V rows of R])^T-op x parts_h^T [R, 2 n]: the
    // hi and lo rows of every sequence are columns of one GEMM, so W_UV is read once a pass.
    FP4MOE_CUBLAS_CHECK(cublasGemmStridedBatchedEx(
        cublas, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(V), static_cast<int>(2 * n), static_cast<int>(R), &one, w_uv,
        CUDA_R_16BF, static_cast<int>(R), (nope + V) * R, parts, CUDA_R_16BF, static_cast<int>(H * R), R, &zero, acc,
        CUDA_R_32F, static_cast<int>(H * V), V, static_cast<int>(H), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    const int64_t n_out = n * H * V;
    mla_sum_round_bf16_kernel<<<elementwise_blocks(n_out), kElementwiseThreads, 0, stream>>>(acc, n_out, H * V,
                                                                                             out + s0 * H * V);
    FP4MOE_CUDA_CHECK(cudaGetLastError());
  }
}

}  // namespace fp4moe::cuda
