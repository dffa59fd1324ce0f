// GLM-5 / DeepSeek-V3 MLA decode on the GPU in the absorbed form (model/mla.cpp,
// mla_attention_absorbed), BF16 storage with f32 math; the cache holds only the latent per token.
// Three steps, one query token per sequence:
//   1. mla_absorb_q:        q_lat[s,h] = [W_UK_h^T q_nope[s,h] | q_pe[s,h]]     (f32, rank + rope)
//   2. mla_decode_attention: latent[s,h] = sum_j softmax_j((q_lat . [c_kv_j | k_pe_j]) * scale) c_kv_j
//                            over keys 0..seq_len-1, split-K across CTAs + log-sum-exp merge (f32, rank)
//   3. mla_project_v:       out[s, h*v + x] = W_UV_h[x] . latent[s,h]            (bf16)
// W_UK_h / W_UV_h are the k_nope / v rows of head h in kv_b_proj [n_heads * (nope + v), rank].
// scale = 1/sqrt(nope + rope) (MlaDims::softmax_scale).
//
// Layouts (device memory, row-major):
//   q      [n_seqs, n_heads, nope + rope] bf16, q_pe rotated (interleaved RoPE for GLM-5) before, or by
//          mla_absorb_q (MlaQRope)
//   cache  [n_blocks, page_size, rank + rope] bf16: per token [c_kv (after kv_a_layernorm) | k_pe (rotated)]
//   block_table / seq_lens as in paged_attention.h (seq_len 0: a padded entry, zeros out)
// kv_lora_rank 32, 64, 128, 256 or 512; rope even, <= 128 (the attention: <= 64 and rank + rope a
// multiple of 16). The attention CTA takes 16 heads of one sequence and one key split on Hopper's wgmma
// (ops/mla_wgmma_attention.cuh, f32 accumulation): q and the probabilities enter as three bf16 parts each (their
// f32 values, so the result is f32-accurate; the cache is bf16 already), stacked along N of m64n48k16. Two
// warpgroups, 64 keys a tile: each scores the tile over half of the k16 steps (the partial sums exchanged through
// shared memory), both run the same online softmax (base 2), and each accumulates half of the latent's m64 blocks
// from P x c_kv, reading the same swizzled key tile transposed. Shared memory: mla_wgmma_smem_layout() (218,624 B at
// rank 512 + rope 64: one CTA an SM). mla_prefill.h's kernel keeps the mma.sync CTA (mla_mma_attention.cuh,
// mla_mma_smem_layout, 16 heads x 32 keys, four warps).
// Tested by tests/kernels/test_cuda_mla_decode.cpp (GPU vs model::mla_attention_absorbed) and
// tests/kernels/test_cuda_ops_host.cpp (layout and split planning).
#pragma once

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/cuda/ops/attention_geometry.h"
#include "kernels/cuda/ops/norm_rope.h"
#include "kernels/cuda/ops/paged_attention.h"
#include "plan/smem_layout.h"

namespace fp4moe::cuda {

struct MlaDecodeDims {
  int n_heads = 0;
  int kv_lora_rank = 0;
  int qk_nope_head_dim = 0;
  int qk_rope_head_dim = 0;
  int v_head_dim = 0;
  float scale = 0.0f;  // 1/sqrt(qk_nope_head_dim + qk_rope_head_dim)
  int latent_width() const { return kv_lora_rank + qk_rope_head_dim; }
};

struct MlaCacheView {
  __nv_bfloat16* kv = nullptr;  // [n_blocks, page_size, rank + rope]
  int64_t n_blocks = 0;
  int64_t page_size = 0;
  int kv_lora_rank = 0;
  int rope_dim = 0;
};

inline constexpr int kMlaWarps = 4;
inline constexpr int kMlaHeadsPerCta = 16;  // one m16 MMA tile of heads per CTA

// Shared memory of the mma.sync attention CTA (mla_prefill_attention; decode takes the wgmma CTA below): two 32-key
// tiles of cache rows in bf16 (cp.async double buffer), each row padded by 16 B so that ldmatrix's eight row addresses
// fall in eight different 16 B bank groups (row_bytes / 16 is odd), then the four warps' partial score tiles (16 heads
// x 32 keys f32 each; warp w sums the four of its n-tile of 8 keys, in warp order), then the third bf16 part of each
// warp's q fragments. Needs (rank + rope) % 16 == 0 (whole k16 MMA steps). Largest k16 steps of q one warp holds (three
// bf16 parts): width <= rank + kMlaMaxRope.
inline constexpr int kMlaMaxRope = 64;
inline constexpr int kMlaMaxQStepsPerWarp = 9;

// The scores region is reused within a key tile once the partial scores are summed: warp w's n-tile
// maxima go to the first 2 KB (the slots of warp 0's partials, [n-tile][lane] x 16 B: warp w read its
// own n-tile's slots before it writes there), then P as kMlaPParts bf16 parts of 16 heads x 32 keys
// (rows of kMlaPRowBytes: 64 B + 16 B of padding, so ldmatrix's eight rows hit eight bank groups).
inline constexpr int kMlaPParts = 3;
inline constexpr int kMlaPRowBytes = kAttnKeysPerTile * 2 + 16;
inline constexpr int kMlaMaxSlotsBytes = kAttnKeysPerTile / 8 * 32 * 16;
static_assert(kMlaMaxSlotsBytes + kMlaPParts * kMlaHeadsPerCta * kMlaPRowBytes <=
                  kMlaWarps * kMlaHeadsPerCta * kAttnKeysPerTile * 4,
              "the tile maxima and P fit the scores region");

struct MlaMmaSmemLayout {
  int width = 0;      // rank + rope
  int row_bytes = 0;  // width * 2 + 16
  int tile_bytes = 0;
  int scores_offset = 0;
  int scores_bytes = 0;
  int p_offset = 0;   // inside the scores region (see above)
  int q_part3_offset = 0;  // the third bf16 part of each warp's q fragments: [warp][step][lane] x 16 B
  int q_part3_bytes = 0;
  int total_bytes = 0;
};
FP4MOE_ATTN_HD constexpr MlaMmaSmemLayout mla_mma_smem_layout(int kv_lora_rank, int rope_dim) {
  MlaMmaSmemLayout l;
  l.width = kv_lora_rank + rope_dim;
  l.row_bytes = l.width * 2 + 16;
  l.tile_bytes = kAttnKeysPerTile * l.row_bytes;
  l.scores_offset = 2 * l.tile_bytes;
  l.scores_bytes = kMlaWarps * kMlaHeadsPerCta * kAttnKeysPerTile * 4;
  l.p_offset = l.scores_offset + kMlaMaxSlotsBytes;
  l.q_part3_offset = l.scores_offset + l.scores_bytes;
  l.q_part3_bytes = kMlaWarps * kMlaMaxQStepsPerWarp * 32 * 16;
  l.total_bytes = l.q_part3_offset + l.q_part3_bytes;
  return l;
}
static_assert(mla_mma_smem_layout(512, 64).total_bytes == 2 * 32 * 1168 + 8192 + 18432,
              "GLM-5: 101,376 B (2 CTAs per SM)");

// The layout for (rank, rope), after checking it against the current device's opt-in limit per
// block: throws naming `what`, the byte breakdown and the limit (mla_prefill_attention's; decode checks its wgmma
// layout with mla_wgmma_smem_checked).
MlaMmaSmemLayout mla_mma_smem_checked(const char* what, int kv_lora_rank, int rope_dim);

// The wgmma attention CTA (ops/mla_wgmma_attention.cuh: decode, two warpgroups, 16 heads of one sequence, 64 keys a
// tile). Every operand region is in the wgmma's canonical 128B-swizzled layout: rows of 128 B (64 bf16) in
// "column blocks", 8 rows (1,024 B) a swizzle atom, 16 B chunk c of row r stored at chunk c ^ (r % 8):
//   tiles  2 x [col_blocks][64 keys][128 B]  cache rows [c_kv | k_pe] (cp.async double buffer; dims past
//          rank + rope zero); a tile is A of the scores (K-major: keys x dims) and, column block b, A of
//          P x c_kv for latent dims 64 b .. 64 b + 63 (MN-major: the same bytes read transposed)
//   q      [col_blocks][48 rows][128 B]  q's three bf16 parts (row part x 16 + head): B of the scores, the parts
//          stacked along N (one m64n48k16 a k16 step, the parts' sums added per score afterwards)
//   p      [48 rows][128 B]             P's three bf16 parts (row part x 16 + head, keys along the row): B of
//          P x c_kv, K-major, the parts stacked along N as q's
//   red    [2 warpgroups][4 warps][16 heads] f32  the warps' tile maxima, then their softmax sums
//   xch    [2 warpgroups][128 threads][8] f32     each warpgroup's partial scores (its half of the k16 steps)
// The base is aligned to 1,024 B in the kernel (dynamic shared memory guarantees 16 B): total_bytes has the slack.
inline constexpr int kMlaWgWarps = 8;                             // two warpgroups
inline constexpr int kMlaWgKeysPerTile = 64;                      // one m64 block of keys
inline constexpr int kMlaWgColBytes = 128;                        // a swizzled row: 64 bf16
inline constexpr int kMlaWgAtomBytes = 1024;                      // 8 rows x 128 B
inline constexpr int kMlaWgQRows = kMlaPParts * kMlaHeadsPerCta;  // 48: q's (and P's) parts stacked along N

struct MlaWgmmaSmemLayout {
  int width = 0;           // rank + rope
  int col_blocks = 0;      // ceil(width / 64)
  int m_blocks = 0;        // ceil(rank / 64): P x c_kv's m64 blocks of latent dims
  int tile_col_bytes = 0;  // 64 keys x 128 B
  int tile_bytes = 0;      // col_blocks x tile_col_bytes
  int tiles_offset = 0;
  int q_col_bytes = 0;  // 48 rows x 128 B
  int q_offset = 0;
  int q_bytes = 0;
  int p_offset = 0;
  int p_bytes = 0;  // 48 rows x 128 B
  int red_offset = 0;
  int red_bytes = 0;
  int xch_offset = 0;
  int xch_bytes = 0;
  int total_bytes = 0;  // + kMlaWgAtomBytes of alignment slack
};
FP4MOE_ATTN_HD constexpr MlaWgmmaSmemLayout mla_wgmma_smem_layout(int kv_lora_rank, int rope_dim) {
  MlaWgmmaSmemLayout l;
  l.width = kv_lora_rank + rope_dim;
  l.col_blocks = (l.width + 63) / 64;
  l.m_blocks = (kv_lora_rank + 63) / 64;
  l.tile_col_bytes = kMlaWgKeysPerTile * kMlaWgColBytes;
  l.tile_bytes = l.col_blocks * l.tile_col_bytes;
  l.tiles_offset = 0;
  l.q_col_bytes = kMlaWgQRows * kMlaWgColBytes;
  l.q_offset = l.tiles_offset + 2 * l.tile_bytes;
  l.q_bytes = l.col_blocks * l.q_col_bytes;
  l.p_offset = l.q_offset + l.q_bytes;
  l.p_bytes = kMlaWgQRows * kMlaWgColBytes;
  l.red_offset = l.p_offset + l.p_bytes;
  l.red_bytes = kMlaWgWarps * kMlaHeadsPerCta * 4;
  l.xch_offset = l.red_offset + l.red_bytes;
  l.xch_bytes = kMlaWgWarps * 32 * 8 * 4;
  l.total_bytes = l.xch_offset + l.xch_bytes + kMlaWgAtomBytes;
  return l;
}
// The layout after checking it against the device's opt-in limit (throws with the byte breakdown).
MlaWgmmaSmemLayout mla_wgmma_smem_checked(const char* what, int kv_lora_rank, int rope_dim);
static_assert(mla_wgmma_smem_layout(512, 64).total_bytes == 2 * 9 * 8192 + 9 * 6144 + 6144 + 512 + 8192 + 1024,
              "GLM-5: 218,624 B (one CTA an SM)");

// CTAs an SM of the two MLA attention CTAs at GLM-5 dims (sm_90, by shared memory): what the split planners fill.
inline constexpr int kMlaMmaCtasPerSm = 2;  // mla_mma_attention.cuh: mla_prefill_attention (prefill, DSA)
inline constexpr int kMlaWgCtasPerSm = 1;   // mla_wgmma_attention.cuh: mla_decode_attention
static_assert(plan::sm90_ctas_per_sm_by_smem(mla_mma_smem_layout(512, 64).total_bytes) == kMlaMmaCtasPerSm);
static_assert(plan::sm90_ctas_per_sm_by_smem(mla_wgmma_smem_layout(512, 64).total_bytes) == kMlaWgCtasPerSm);

// The keys [begin, end) split `split` of n_splits walks for a decode sequence of seq_len keys: the sequence's own keys
// cut into parts of ceil(seq_len / n_splits) rounded up to whole kMlaWgKeysPerTile-key tiles (trailing splits may be
// empty). A split planned for a longer list (a CUDA graph plans for its block-table bucket, up to twice the longest
// sequence; a batch mixes lengths) still spreads each sequence over all of its splits: with fixed-size splits a
// sequence of half the planned length filled the first half of them and left the rest empty, so the CTAs of the first
// ones did all the work (thirty-sixth session: batch 16 at 1,032 keys, planned for 2,048).
FP4MOE_ATTN_HD inline void mla_decode_split_keys(int64_t seq_len, int n_splits, int split, int64_t* begin,
                                                 int64_t* end) {
  const int64_t kps = split_part_keys(seq_len, n_splits, kMlaWgKeysPerTile);
  *begin = static_cast<int64_t>(split) * kps;
  *end = *begin + kps < seq_len ? *begin + kps : seq_len;
  if (*end < *begin) *end = *begin;
}

// A split plan's time model for a CTA kind: a CTA takes cta_us + tile_us a key tile of its split, CTAs run in waves of
// n_sms x ctas_per_sm, and more than one split adds the merge launch: merge_us + merge_part_us for every (row, head,
// split) partial (written by the CTAs, read by the merge).
struct MlaSplitCost {
  double cta_us = 0;
  double tile_us = 0;
  double merge_us = 0;
  double merge_part_us = 0;
};
// The wgmma decode CTA at GLM-5 dims (rank 512 + rope 64), fitted by least squares to bench_mla_decode's 168 points
// (1-128 sequences x 256-2,048 keys x power-of-two split counts; H100, thirty-sixth session, BENCHMARKS.md): the
// split it picks is the measured fastest or within 1.1% of it at every point; at 3-56 sequences and every count
// (run 4) within 1.5% but at 6 x 2,048 keys (9.2%: 144 CTAs on 132 SMs ran faster than the two waves it counts).
inline constexpr MlaSplitCost kMlaWgSplitCost{4.55, 2.84, 2.07, 0.0014};
// With a cost model, more than one split only while the split CTAs fill at most this many waves: the split workspace
// (a partial of rank + 1 f32 a head, 16 heads a CTA) stays under 4 x slots x 16 x (rank + 1) x 4 B (17.3 MB at GLM-5
// on 132 SMs; CUDA graphs grow it to their largest plan). Past 4 waves of one split the last wave's tail is under a
// quarter of the time; the measured best plans used at most 2.9 waves.
inline constexpr int64_t kMlaMaxSplitWaves = 4;

// Splits for n_rows query rows (decode: sequences; prefill / DSA: query tokens) of n_heads MLA heads (ceil(n_heads /
// 16) CTAs each) over key lists of at most max_keys, each split of the longest list a multiple of keys_per_tile keys
// and at least max(min_keys_per_split, keys_per_tile) of them (a shorter split leaves part of every key tile empty; a
// shorter sequence's parts are shorter, down to one tile), at most kMaxDecodeSplits. With a cost model (decode): the count of the least modelled time (waves x (CTA + its tiles) +
// the merge) among those whose CTAs fill at most kMlaMaxSplitWaves waves, e.g. GLM-5 at 48 sequences x 2,048 keys 2
// splits (192 CTAs fill 1.45 waves of 132; 2 splits fill 2.9 of half the length: 164 vs 191 us measured), at 64
// sequences 1, at 1 sequence x 1,024 keys 16 (with the engine's 32 min keys). Without (prefill / DSA: no measured model for the mma.sync CTA): as many
// as fit the GPU's n_sms x ctas_per_sm CTA slots once (floor(slots / CTAs), at least 1: more add a wave and the merge).
DecodeSplit plan_mla_split(int64_t n_rows, int64_t n_heads, int64_t max_keys, int n_sms, int64_t min_keys_per_split,
                           int ctas_per_sm, int keys_per_tile, const MlaSplitCost* cost = nullptr);
// mla_decode_attention's splits: plan_mla_split for the wgmma CTA (kMlaWgCtasPerSm an SM, kMlaWgKeysPerTile keys a
// tile, kMlaWgSplitCost). The kernel cuts each sequence by its own length (mla_decode_split_keys); max_seq_len bounds
// them (a longer one is refused).
inline DecodeSplit plan_mla_decode_split(int64_t n_seqs, int64_t n_heads, int64_t max_seq_len, int n_sms,
                                         int64_t min_keys_per_split = 256) {
  return plan_mla_split(n_seqs, n_heads, max_seq_len, n_sms, min_keys_per_split, kMlaWgCtasPerSm, kMlaWgKeysPerTile,
                        &kMlaWgSplitCost);
}
// f32 workspace of mla_decode_attention's split path (0 for one split): [n_seqs, n_heads, n_splits, rank] + lse.
size_t mla_decode_workspace_bytes(int64_t n_seqs, const MlaDecodeDims& dims, const DecodeSplit& split);

// Writes [c_kv | k_pe] of n_tokens tokens (token strides in elements, even) into slots (-1: skipped;
// >= n_blocks * page_size: kDeviceErrorKvSlot).
void mla_cache_append_bf16(const __nv_bfloat16* c_kv, int64_t c_stride, const __nv_bfloat16* k_pe, int64_t pe_stride,
                           int64_t n_tokens, const int32_t* slots, const MlaCacheView& cache, uint32_t* error_flag,
                           cudaStream_t stream);

// The latent branch's tail: for each of n_tokens rows of kv [c_kv (rank) | k_pe (rope)] (token stride kv_stride,
// elements), cache[slots[t]] = [rms_norm(c_kv) (norm_w, eps) | k_pe rotated at positions[t]] in one launch (a warp
// a token), with the bits and error flags of rms_norm_bf16 (in place) + rope_bf16 (offset rank, one head) +
// mla_cache_append_bf16; kv is then not written. Where the fused kernel does not apply (rank, rank + rope or the
// stride not multiples of 8, rank > 512, unaligned kv / cache / weights, more than 2^23 tokens) it runs those
// three launches, in place on kv.
struct MlaLatentNormRope {
  const float* norm_w = nullptr;  // [rank] f32
  float eps = 0.0f;
  RopeAngles angles;  // positions [n_tokens]
};
void mla_latent_norm_rope_append(__nv_bfloat16* kv, int64_t kv_stride, int64_t n_tokens, const MlaLatentNormRope& nr,
                                 const int32_t* slots, const MlaCacheView& cache, uint32_t* error_flag,
                                 cudaStream_t stream);

// q_pe's RoPE done by mla_absorb_q's copy of q_pe (one launch less than rope_bf16 on q first, the same
// bits): the q rows' positions [n_seqs] and the cos / sin tables as rope_bf16 takes them.
struct MlaQRope {
  RopeAngles angles;               // positions [n_seqs]
  uint32_t* error_flag = nullptr;  // kDeviceErrorRopePosition (that row's q_pe is copied unrotated)
};

// Step 1: q [n_seqs, n_heads, nope + rope] bf16, kv_b [n_heads * (nope + v), rank] bf16 ->
// q_lat [n_seqs, n_heads, rank + rope] f32. One cuBLAS strided-batched GEMM over the heads
// (q_nope_h [n_seqs, nope] x W_UK_h [nope, rank], bf16 in, f32 accumulate and out) and a copy of q_pe,
// rotated on the way when q_rope is given (q's own q_pe is then left unrotated).
void mla_absorb_q(const __nv_bfloat16* q, const __nv_bfloat16* kv_b, const MlaDecodeDims& dims, int64_t n_seqs,
                  float* q_lat, cublasHandle_t cublas, cudaStream_t stream, const MlaQRope* q_rope = nullptr);

// Step 2: latent [n_seqs, n_heads, rank] f32. workspace: mla_decode_workspace_bytes (null for one split). split:
// plan_mla_decode_split; its n_splits cut each sequence by its own length (mla_decode_split_keys), a seq_len above
// n_splits x keys_per_split sets kDeviceErrorSeqLen.
// latent_parts (optional, mla_project_v_parts): step 3's bf16 hi / lo rows are written there instead of latent
// (mla_project_v's split launch saved), by the CTAs with one split, by the merge with several; it then returns
// true, false when it wrote latent.
bool mla_decode_attention(const float* q_lat, const MlaCacheView& cache, const int32_t* block_table,
                          int64_t max_blocks_per_seq, const int32_t* seq_lens, int64_t n_seqs,
                          const MlaDecodeDims& dims, const DecodeSplit& split, float* workspace, float* latent,
                          uint32_t* error_flag, cudaStream_t stream, __nv_bfloat16* latent_parts = nullptr);

// Step 3: out [n_seqs, n_heads * v] bf16 (the o_proj input). The f32 latent is split into two bf16
// parts (hi = bf16(latent), lo = bf16(latent - hi): ~2^-17 relative together), stored as two rows per
// sequence, and one cuBLAS strided-batched GEMM over the heads ([hi; lo]_h [2 n_seqs, rank] x W_UV_h^T,
// f32 accumulate) gives both parts' products (W_UV read once: two GEMMs, one a part, read its 16.8 MB
// a GLM-5 layer twice); their f32 sum is rounded to bf16 once. In passes of up to 256 sequences, so the
// workspace (mla_project_v_workspace_bytes) stays that of 256 sequences for any n_seqs.
// parts_ready: the workspace's parts rows (mla_project_v_parts) hold the split already (mla_decode_attention's
// latent_parts; n_seqs <= 256), latent is not read.
size_t mla_project_v_workspace_bytes(int64_t n_seqs, const MlaDecodeDims& dims);
void mla_project_v(const float* latent, const __nv_bfloat16* kv_b, const MlaDecodeDims& dims, int64_t n_seqs,
                   void* workspace, __nv_bfloat16* out, cublasHandle_t cublas, cudaStream_t stream,
                   bool parts_ready = false);
// Where mla_project_v's workspace holds the bf16 parts rows of n_seqs sequences when one pass takes them all
// (n_seqs <= 256); nullptr otherwise (or for a null workspace).
__nv_bfloat16* mla_project_v_parts(void* workspace, int64_t n_seqs, const MlaDecodeDims& dims);

}  // namespace fp4moe::cuda
