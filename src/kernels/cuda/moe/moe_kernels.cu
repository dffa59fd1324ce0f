// The non-GEMM kernels of the fused MoE layer. See moe_kernels.h. Written for obvious correctness
// first, then for latency where it showed (GLM-5 shard, 64 tokens: these kernels are ~10% of the
// layer): 1 or 8 experts a block (by the grid's size) and 4 tokens for the logits (its warps over slices of H), one
// thread per token for the routing, one block for the dispatch, one block per row for gather, one thread per (token, 8
// outputs) for combine (slot rows loaded 4 at a time). Tested by tests/moe/test_gpu_moe_layer.cpp.
#include "kernels/cuda/moe/moe_kernels.h"

#include <algorithm>

#include "core/error.h"
#include "kernels/cuda/cuda_check.h"

namespace fp4moe::cuda::moe {

namespace {

constexpr int kWarp = 32;
constexpr int kSmemBudget = 48 * 1024;  // the default per-block limit: no opt-in needed

// --- router logits --------------------------------------------------------------------------------
// Block: kExperts experts and kLogitTokens tokens (each router row read once per kLogitTokens tokens,
// each token row once per kExperts experts); its kLogitWarps warps split H into equal slices of whole
// 8-element pieces (warp w: h in [w S, w S + S)), lane l of a warp covering h = w S + 8 l + 256 i. A
// token's logit is the sum over the slices in warp order of each slice's fixed xor-tree sum of its lanes'
// partial sums: the same order for every token count and for kExperts 1 and 8 (batch-invariant: the same
// bits), and every run (deterministic). The slices keep the chain of dependent loads short (H = 6144: 3
// iterations a lane, all in flight): with a warp per expert over all of H (24 iterations a lane, 4 in
// flight) a GLM-5 router at one token took ~14.5 us (256 warps on 132 SMs, H100, twenty-ninth session).
// kExperts: 8 once that grid has at least kLogitWideMinBlocks blocks, else 1 (the most blocks: decode). A
// block an expert reads every token row from L2 once per expert; at thousands of tokens that cost 5x the
// time of 8 experts a block (E = 256, 4096 tokens: 4,198 vs 789 us). Where 8 experts a block leave most
// SMs idle, the block an expert is faster. Nsight Compute on the H100 (132 SMs, thirty-first session), us a
// launch, 1 vs 8 experts a block (the 8-expert grid's blocks): E = 32 at 64 tokens 7.6 vs 8.4 (64), at 96
// tokens 8.5 vs 8.7 (96), at 128 tokens 11.2 vs 8.9 (128); E = 256 at 8 tokens 7.4 vs 9.0 (64), at 16
// tokens 10.0 vs 9.1 (128), at 64 tokens 32.4 vs 17.4 (512).
constexpr int kLogitWarps = 8;
constexpr int kLogitTokens = 4;
constexpr int kLogitWideExperts = 8;
constexpr int64_t kLogitWideMinBlocks = 128;

// Elements of H a warp's slice covers: ceil(H / kLogitWarps) rounded up to whole 8-element pieces.
constexpr int64_t router_logit_slice(int64_t hidden) { return ((hidden + kLogitWarps - 1) / kLogitWarps + 7) / 8 * 8; }

__device__ __forceinline__ void bf16x8_to_f32(const uint4& v, float* out) {
  const __nv_bfloat162* p = reinterpret_cast<const __nv_bfloat162*>(&v);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 f = __bfloat1622float2(p[i]);
    out[2 * i] = f.x;
    out[2 * i + 1] = f.y;
  }
}

template <int kExperts>
__global__ void __launch_bounds__(kLogitWarps* kWarp)
    router_logits_kernel(const __nv_bfloat16* __restrict__ x, const float* __restrict__ wg, int n_tokens, int hidden,
                         int n_experts, float* __restrict__ logits) {
  constexpr int kSums = kExperts * kLogitTokens;
  __shared__ float slice_sums[kLogitWarps][kSums];
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const int e0 = blockIdx.y * kExperts;
  const int t0 = blockIdx.x * kLogitTokens;
  const int slice = static_cast<int>(router_logit_slice(hidden));
  const int h_end = static_cast<int>(min(static_cast<int64_t>(hidden), static_cast<int64_t>(warp + 1) * slice));
  float acc[kExperts][kLogitTokens];
#pragma unroll
  for (int k = 0; k < kExperts; ++k) {
#pragma unroll
    for (int i = 0; i < kLogitTokens; ++i) acc[k][i] = 0.0f;
  }
  // Experts past n_experts read expert e0's row and tokens past n_tokens token t0's (in bounds), never
  // stored: no branch in the loop.
  const float* w_rows[kExperts];
#pragma unroll
  for (int k = 0; k < kExperts; ++k) w_rows[k] = wg + static_cast<int64_t>(e0 + k < n_experts ? e0 + k : e0) * hidden;
  const __nv_bfloat16* x_rows[kLogitTokens];
#pragma unroll
  for (int i = 0; i < kLogitTokens; ++i) {
    x_rows[i] = x + static_cast<int64_t>(t0 + i < n_tokens ? t0 + i : t0) * hidden;
  }
  // Each accumulator takes its 8 products of an iteration in j order, whatever kExperts is.
#pragma unroll(kExperts == 1 ? 4 : 1)
  for (int h = warp * slice + lane * 8; h < h_end; h += kWarp * 8) {
    float xf[kLogitTokens][8];
#pragma unroll
    for (int i = 0; i < kLogitTokens; ++i) bf16x8_to_f32(__ldg(reinterpret_cast<const uint4*>(x_rows[i] + h)), xf[i]);
#pragma unroll
    for (int k = 0; k < kExperts; ++k) {
      const float4 w0 = __ldg(reinterpret_cast<const float4*>(w_rows[k] + h));
      const float4 w1 = __ldg(reinterpret_cast<const float4*>(w_rows[k] + h + 4));
      const float wv[8] = {w0.x, w0.y, w0.z, w0.w, w1.x, w1.y, w1.z, w1.w};
#pragma unroll
      for (int i = 0; i < kLogitTokens; ++i) {
#pragma unroll
        for (int j = 0; j < 8; ++j) acc[k][i] += xf[i][j] * wv[j];
      }
    }
  }
#pragma unroll
  for (int k = 0; k < kExperts; ++k) {
#pragma unroll
    for (int i = 0; i < kLogitTokens; ++i) {
      float v = acc[k][i];
#pragma unroll
      for (int off = kWarp / 2; off > 0; off /= 2) v += __shfl_xor_sync(0xffffffffu, v, off);
      if (lane == 0) slice_sums[warp][k * kLogitTokens + i] = v;
    }
  }
  __syncthreads();
  const int k = static_cast<int>(threadIdx.x) / kLogitTokens, i = static_cast<int>(threadIdx.x) % kLogitTokens;
  if (static_cast<int>(threadIdx.x) < kSums && t0 + i < n_tokens && e0 + k < n_experts) {
    float v = 0.0f;
#pragma unroll
    for (int w = 0; w < kLogitWarps; ++w) v += slice_sums[w][threadIdx.x];
    logits[static_cast<int64_t>(t0 + i) * n_experts + e0 + k] = v;
  }
}

// --- routing --------------------------------------------------------------------------------------
// One thread per token; its E choice values live in shared memory interleaved [E][tokens_per_block]
// (stride tokens_per_block: consecutive threads hit consecutive banks).
__global__ void route_topk_kernel(RouteParams p, const float* __restrict__ logits, const float* __restrict__ bias,
                                  int n_tokens, int32_t* __restrict__ topk_idx, float* __restrict__ topk_weights) {
  extern __shared__ float route_smem[];
  const int t = blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= n_tokens) return;
  route_token(p, logits + static_cast<int64_t>(t) * p.n_experts, bias, route_smem + threadIdx.x, blockDim.x,
              topk_idx + static_cast<int64_t>(t) * p.top_k, topk_weights + static_cast<int64_t>(t) * p.top_k);
}

// The sigmoid router with a warp per token (E <= 256, n_group <= 32, top_k <= 32): lane l holds
// the choices of experts l, l + 32, .. in registers; group scores are route_group_score over the
// warp's shared-memory copy, one lane a group; each of the topk_group and top_k picks is a warp-wide
// max under route_ranks_before over what ranks after the previous pick (the CPU loop's rule, so
// the same picks for finite values); lane s keeps pick s, and the weights are summed in slot order
// as the CPU does (the one-thread-per-token kernel took ~25 us for 64 GLM-5 tokens on the H200).
constexpr int kRouteWarpMaxExperts = 256;
constexpr int kRouteWarpsPerCta = 8;

// The best (value, index) under route_ranks_before across the warp; index -1 = none.
__device__ __forceinline__ void route_warp_best(float& v, int& i) {
#pragma unroll
  for (int off = 16; off > 0; off /= 2) {
    const float ov = __shfl_xor_sync(0xffffffffu, v, off);
    const int oi = __shfl_xor_sync(0xffffffffu, i, off);
    if (oi >= 0 && (i < 0 || route_ranks_before(ov, oi, v, i))) {
      v = ov;
      i = oi;
    }
  }
}

__global__ void __launch_bounds__(kRouteWarpsPerCta * kWarp)
    route_topk_warp_kernel(RouteParams p, const float* __restrict__ logits, const float* __restrict__ bias,
                           int n_tokens, int32_t* __restrict__ topk_idx, float* __restrict__ topk_weights) {
  constexpr int kPerLane = kRouteWarpMaxExperts / kWarp;
  __shared__ float choice_s[kRouteWarpsPerCta][kRouteWarpMaxExperts];
  const int warp = static_cast<int>(threadIdx.x) / kWarp, lane = static_cast<int>(threadIdx.x) % kWarp;
  const int t = blockIdx.x * kRouteWarpsPerCta + warp;
  if (t >= n_tokens) return;  // warp-uniform; no block barrier below
  const int E = p.n_experts;
  const float* row = logits + static_cast<int64_t>(t) * E;
  float v[kPerLane];
#pragma unroll
  for (int j = 0; j < kPerLane; ++j) {
    const int e = lane + kWarp * j;
    v[j] = e < E ? route_sigmoid_choice(p, row[e], bias, e) : 0.0f;
  }
  if (p.n_group > 1) {
    const int per_group = E / p.n_group;
#pragma unroll
    for (int j = 0; j < kPerLane; ++j) {
      if (lane + kWarp * j < E) choice_s[warp][lane + kWarp * j] = v[j];
    }
    __syncwarp();
    const float score = lane < p.n_group ? route_group_score(choice_s[warp], 1, lane * per_group, per_group) : 0.0f;
    uint32_t groups_on = 0;
    int prev_g = -1;
    float prev_score = 0.0f;
    for (int r = 0; r < p.topk_group; ++r) {
      const bool ok = lane < p.n_group && (r == 0 || route_ranks_before(prev_score, prev_g, score, lane));
      float bv = score;
      int bi = ok ? lane : -1;
      route_warp_best(bv, bi);
      if (bi < 0) break;  // only with NaN scores
      groups_on |= 1u << bi;
      prev_g = bi;
      prev_score = bv;
    }
#pragma unroll
    for (int j = 0; j < kPerLane; ++j) {
      const int e = lane + kWarp * j;
      if (e < E && ((groups_on >> (e / per_group)) & 1u) == 0) v[j] = p.masked_fill_value;
    }
  }
  int my_pick = 0;
  int prev = -1;
  float prev_v = 0.0f;
  for (int s = 0; s < p.top_k; ++s) {
    float bv = 0.0f;
    int bi = -1;
#pragma unroll
    for (int j = 0; j < kPerLane; ++j) {
      const int e = lane + kWarp * j;
      if (e >= E || (s > 0 && !route_ranks_before(prev_v, prev, v[j], e))) continue;
      if (bi < 0 || route_ranks_before(v[j], e, bv, bi)) {
        bv = v[j];
        bi = e;
      }
    }
    route_warp_best(bv, bi);
    if (bi < 0) bi = s % E;  // only with NaN scores: keep the index in range
    if (lane == s) my_pick = bi;
    prev = bi;
    prev_v = bv;
  }
  // Weights: the unbiased sigmoid of each pick, summed in slot order (every lane the same sum).
  const float w = lane < p.top_k ? route_sigmoid(row[my_pick]) : 0.0f;
  float sum = 0.0f;
  for (int s = 0; s < p.top_k; ++s) sum += __shfl_sync(0xffffffffu, w, s);
  if (lane < p.top_k) {
    topk_idx[static_cast<int64_t>(t) * p.top_k + lane] = my_pick;
    topk_weights[static_cast<int64_t>(t) * p.top_k + lane] = route_final_weight(p, w, sum);
  }
}

int route_tokens_per_block(int n_experts) {
  return std::clamp(kSmemBudget / (n_experts * static_cast<int>(sizeof(float))), 1, kWarp);
}

// --- dispatch -------------------------------------------------------------------------------------
// One block of n_warps warps; warp w owns the contiguous pair range [w * seg, (w + 1) * seg), so
// concatenating the warps' ranges in warp order keeps the (token, slot) order. Pass 1 counts per
// (warp, expert) with __match_any_sync (the lowest lane of each group of equal experts adds the group
// size); the prefix over warps and the exclusive scan over experts turn the counts into each warp's
// first row per expert; pass 2 repeats the walk and hands rows out in lane order.
__global__ void dispatch_kernel(const int32_t* __restrict__ topk_idx, int n_pairs, int top_k, int n_experts,
                                int n_tokens, int32_t* __restrict__ expert_offsets, int32_t* __restrict__ row_token,
                                int32_t* __restrict__ entry_of, int32_t* __restrict__ shared_offsets) {
  extern __shared__ int32_t dispatch_smem[];
  const int n_warps = blockDim.x / kWarp;
  int32_t* cursor = dispatch_smem;                            // [n_warps][E]
  int32_t* expert_base = dispatch_smem + n_warps * n_experts;  // [E]
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  for (int i = threadIdx.x; i < n_warps * n_experts; i += blockDim.x) cursor[i] = 0;
  __syncthreads();

  const int seg = (n_pairs + n_warps - 1) / n_warps;
  const int begin = warp * seg;
  const int end = min(begin + seg, n_pairs);
  int32_t* my_cursor = cursor + warp * n_experts;
  const unsigned lanes_below = (1u << lane) - 1u;
  for (int base = begin; base < end; base += kWarp) {  // uniform across the warp
    const int i = base + lane;
    const int e = i < end ? topk_idx[i] : -1;
    const unsigned peers = __match_any_sync(0xffffffffu, e);
    if (e >= 0 && e < n_experts && (peers & lanes_below) == 0) my_cursor[e] += __popc(peers);
    __syncwarp();
  }
  __syncthreads();

  // Per expert: prefix over warps (cursor becomes the offset inside the expert) and the total.
  for (int e = threadIdx.x; e < n_experts; e += blockDim.x) {
    int32_t run = 0;
    for (int w = 0; w < n_warps; ++w) {
      const int32_t c = cursor[w * n_experts + e];
      cursor[w * n_experts + e] = run;
      run += c;
    }
    expert_base[e] = run;
  }
  __syncthreads();
  if (threadIdx.x == 0) {  // exclusive scan over experts, in expert order
    int32_t run = 0;
    for (int e = 0; e < n_experts; ++e) {
      const int32_t c = expert_base[e];
      expert_base[e] = run;
      expert_offsets[e] = run;
      run += c;
    }
    expert_offsets[n_experts] = run;
    if (shared_offsets != nullptr) {
      shared_offsets[0] = 0;
      shared_offsets[1] = n_tokens;
    }
  }
  __syncthreads();
  for (int i = threadIdx.x; i < n_warps * n_experts; i += blockDim.x) cursor[i] += expert_base[i % n_experts];
  __syncthreads();

  for (int base = begin; base < end; base += kWarp) {
    const int i = base + lane;
    const int e = i < end ? topk_idx[i] : -1;
    const unsigned peers = __match_any_sync(0xffffffffu, e);
    const bool valid = e >= 0 && e < n_experts;
    const int32_t first = valid ? my_cursor[e] : 0;
    __syncwarp();
    if (valid) {
      const int32_t row = first + __popc(peers & lanes_below);
      row_token[row] = i / top_k;
      entry_of[i] = row;
      if ((peers & lanes_below) == 0) my_cursor[e] = first + __popc(peers);
    }
    __syncwarp();
  }
}

int dispatch_warps(int n_experts) {
  return std::clamp(kSmemBudget / static_cast<int>(sizeof(int32_t)) / n_experts - 1, 1, kWarp);
}

// --- gather, SwiGLU, combine ---------------------------------------------------------------------
__global__ void gather_rows_kernel(const __nv_bfloat16* __restrict__ x, const int32_t* __restrict__ row_token,
                                   int hidden, __nv_bfloat16* __restrict__ xp) {
  const int64_t r = blockIdx.x;
  const uint4* src = reinterpret_cast<const uint4*>(x + static_cast<int64_t>(row_token[r]) * hidden);
  uint4* dst = reinterpret_cast<uint4*>(xp + r * hidden);
  for (int v = threadIdx.x; v < hidden / 8; v += blockDim.x) dst[v] = src[v];
}

__global__ void swiglu_kernel(const __nv_bfloat16* __restrict__ gate, const __nv_bfloat16* __restrict__ up,
                              int64_t ld_in, int64_t rows, int64_t inter, __nv_bfloat16* __restrict__ act) {
  const int64_t vecs_per_row = inter / 8;
  const int64_t n_vecs = rows * vecs_per_row;
  for (int64_t v = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; v < n_vecs;
       v += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = v / vecs_per_row, j = (v % vecs_per_row) * 8;
    float g[8], u[8];
    bf16x8_to_f32(*reinterpret_cast<const uint4*>(gate + r * ld_in + j), g);
    bf16x8_to_f32(*reinterpret_cast<const uint4*>(up + r * ld_in + j), u);
    uint4 out;
    __nv_bfloat162* o = reinterpret_cast<__nv_bfloat162*>(&out);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float a = g[2 * i] / (1.0f + expf(-g[2 * i])) * u[2 * i];
      const float b = g[2 * i + 1] / (1.0f + expf(-g[2 * i + 1])) * u[2 * i + 1];
      o[i] = __floats2bfloat162_rn(a, b);
    }
    *reinterpret_cast<uint4*>(act + r * inter + j) = out;
  }
}

// One thread per 8 consecutive outputs of one token: blockIdx.x = token, blockIdx.y * 128 +
// threadIdx.x = the 8-wide chunk. The slots' rows are loaded kCombineBatch at a time before they
// are summed (the loads of a batch are in flight together; the sum stays in slot order).
constexpr int kCombineThreads = 128;
constexpr int kCombineBatch = 4;

__global__ void combine_kernel(const __nv_bfloat16* __restrict__ down_out, const int32_t* __restrict__ entry_of,
                               const float* __restrict__ topk_weights, const __nv_bfloat16* __restrict__ shared,
                               int top_k, int hidden, __nv_bfloat16* __restrict__ y) {
  const int64_t t = blockIdx.x;
  const int h = (blockIdx.y * kCombineThreads + threadIdx.x) * 8;
  if (h >= hidden) return;
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  const int32_t* rows = entry_of + t * top_k;
  const float* ws = topk_weights + t * top_k;
  for (int s0 = 0; s0 < top_k; s0 += kCombineBatch) {
    uint4 v[kCombineBatch];
    float w[kCombineBatch];
#pragma unroll
    for (int b = 0; b < kCombineBatch; ++b) {
      const bool ok = s0 + b < top_k;
      w[b] = ok ? ws[s0 + b] : 0.0f;
      v[b] = ok ? *reinterpret_cast<const uint4*>(down_out + static_cast<int64_t>(rows[s0 + b]) * hidden + h)
                : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int b = 0; b < kCombineBatch; ++b) {
      if (s0 + b < top_k) {
        float o[8];
        bf16x8_to_f32(v[b], o);
#pragma unroll
        for (int j = 0; j < 8; ++j) acc[j] += w[b] * o[j];
      }
    }
  }
  if (shared != nullptr) {
    float sh[8];
    bf16x8_to_f32(*reinterpret_cast<const uint4*>(shared + t * hidden + h), sh);
#pragma unroll
    for (int j = 0; j < 8; ++j) acc[j] = acc[j] + sh[j];  // routed + shared, as the CPU layer adds them
  }
  uint4 out;
  __nv_bfloat162* o2 = reinterpret_cast<__nv_bfloat162*>(&out);
#pragma unroll
  for (int i = 0; i < 4; ++i) o2[i] = __floats2bfloat162_rn(acc[2 * i], acc[2 * i + 1]);
  *reinterpret_cast<uint4*>(y + t * hidden + h) = out;
}

__device__ __forceinline__ uint64_t splitmix64(uint64_t z) {
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

__global__ void fill_hash_bytes_kernel(uint8_t* __restrict__ dst, int64_t n, uint64_t seed, uint8_t base,
                                       uint8_t mask) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    dst[i] = static_cast<uint8_t>(base + (splitmix64(seed ^ (static_cast<uint64_t>(i) * 0xD1B54A32D192ED03ull)) & mask));
  }
}

void check_aligned(const void* p, const char* what, const char* fn) {
  FP4MOE_CHECK(p != nullptr && reinterpret_cast<uintptr_t>(p) % 16 == 0)
      << fn << ": " << what << " = " << p << " must be a non-null 16-byte aligned device pointer";
}

void check_launch(const char* fn) {
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) throw_cuda_error(err, fn, __FILE__, __LINE__);
}

constexpr int64_t kMaxInt32 = 0x7fffffff;
constexpr int64_t kMaxGridY = 65535;
constexpr int64_t kMaxRouterHidden = int64_t{1} << 30;  // the kernel's int h + 256 stays below 2^31

}  // namespace

void router_logits(const __nv_bfloat16* x, const float* wg, int64_t n_tokens, int64_t hidden, int n_experts,
                   float* logits, cudaStream_t stream) {
  FP4MOE_CHECK(hidden > 0 && hidden % 8 == 0 && hidden <= kMaxRouterHidden && n_experts >= 1 &&
               n_experts <= kMaxGridY && n_tokens >= 0 && n_tokens <= kMaxInt32)
      << "router_logits: hidden=" << hidden << " (must be a positive multiple of 8, at most " << kMaxRouterHidden
      << "), n_experts=" << n_experts << " (1.." << kMaxGridY << ": a block row each), n_tokens=" << n_tokens;
  if (n_tokens == 0) return;
  check_aligned(x, "x", "router_logits");
  check_aligned(wg, "wg", "router_logits");
  FP4MOE_CHECK(logits != nullptr) << "router_logits: logits is null";
  const int64_t token_blocks = (n_tokens + kLogitTokens - 1) / kLogitTokens;
  const auto launch = [&](auto kernel, int experts_per_block) {
    const dim3 grid(static_cast<unsigned>(token_blocks),
                    static_cast<unsigned>((n_experts + experts_per_block - 1) / experts_per_block));
    kernel<<<grid, kLogitWarps * kWarp, 0, stream>>>(x, wg, static_cast<int>(n_tokens), static_cast<int>(hidden),
                                                     n_experts, logits);
  };
  if (token_blocks * ((n_experts + kLogitWideExperts - 1) / kLogitWideExperts) >= kLogitWideMinBlocks) {
    launch(router_logits_kernel<kLogitWideExperts>, kLogitWideExperts);
  } else {
    launch(router_logits_kernel<1>, 1);
  }
  check_launch("router_logits_kernel<<<>>>");
}

void route_topk(const RouteParams& p, const float* logits, const float* bias, int64_t n_tokens, int32_t* topk_idx,
                float* topk_weights, cudaStream_t stream) {
  FP4MOE_CHECK(p.n_experts >= 1 && p.top_k >= 1 && p.top_k <= p.n_experts && p.n_group >= 1 &&
               p.n_group <= kMaxRouteGroups && p.n_experts % p.n_group == 0 && p.topk_group >= 1 &&
               p.topk_group <= p.n_group)
      << "route_topk: E=" << p.n_experts << " top_k=" << p.top_k << " n_group=" << p.n_group
      << " topk_group=" << p.topk_group << " (need 1 <= top_k <= E, E % n_group == 0, 1 <= topk_group <= n_group <= "
      << kMaxRouteGroups << ")";
  FP4MOE_CHECK(p.n_experts * static_cast<int64_t>(sizeof(float)) <= kSmemBudget)
      << "route_topk: E=" << p.n_experts << " needs " << p.n_experts * 4 << " B of shared memory per token > "
      << kSmemBudget << " B";
  FP4MOE_CHECK(n_tokens >= 0 && n_tokens <= kMaxInt32) << "route_topk: n_tokens=" << n_tokens;
  FP4MOE_CHECK(!(p.sigmoid && p.has_bias) || bias != nullptr)
      << "route_topk: the sigmoid router with a correction bias needs bias [" << p.n_experts << "], got null";
  if (n_tokens == 0) return;
  FP4MOE_CHECK(logits != nullptr && topk_idx != nullptr && topk_weights != nullptr)
      << "route_topk: null logits/topk_idx/topk_weights";
  if (p.sigmoid && p.n_experts <= kRouteWarpMaxExperts && p.n_group <= kWarp && p.top_k <= kWarp) {
    const unsigned grid = static_cast<unsigned>((n_tokens + kRouteWarpsPerCta - 1) / kRouteWarpsPerCta);
    route_topk_warp_kernel<<<grid, kRouteWarpsPerCta * kWarp, 0, stream>>>(p, logits, bias, static_cast<int>(n_tokens),
                                                                          topk_idx, topk_weights);
    check_launch("route_topk_warp_kernel<<<>>>");
    return;
  }
  const int tpb = route_tokens_per_block(p.n_experts);
  const size_t smem = static_cast<size_t>(tpb) * p.n_experts * sizeof(float);
  const unsigned grid = static_cast<unsigned>((n_tokens + tpb - 1) / tpb);
  route_topk_kernel<<<grid, tpb, smem, stream>>>(p, logits, bias, static_cast<int>(n_tokens), topk_idx,
                                                 topk_weights);
  check_launch("route_topk_kernel<<<>>>");
}

void dispatch_plan(const int32_t* topk_idx, int64_t n_tokens, int top_k, int n_experts, int32_t* expert_offsets,
                   int32_t* row_token, int32_t* entry_of, int32_t* shared_offsets, cudaStream_t stream) {
  FP4MOE_CHECK(n_experts >= 1 && n_experts <= kMaxDispatchExperts && top_k >= 1 && n_tokens >= 0 &&
               n_tokens * top_k <= kMaxInt32)
      << "dispatch_plan: n_experts=" << n_experts << " (1.." << kMaxDispatchExperts << "), top_k=" << top_k
      << ", n_tokens=" << n_tokens << " (n_tokens * top_k must fit int32)";
  FP4MOE_CHECK(expert_offsets != nullptr && (n_tokens == 0 || (topk_idx != nullptr && row_token != nullptr &&
                                                               entry_of != nullptr)))
      << "dispatch_plan: null output or input pointer";
  const int n_warps = dispatch_warps(n_experts);
  const size_t smem = static_cast<size_t>(n_warps + 1) * n_experts * sizeof(int32_t);
  dispatch_kernel<<<1, n_warps * kWarp, smem, stream>>>(topk_idx, static_cast<int>(n_tokens * top_k), top_k,
                                                        n_experts, static_cast<int>(n_tokens), expert_offsets,
                                                        row_token, entry_of, shared_offsets);
  check_launch("dispatch_kernel<<<>>>");
}

void gather_rows(const __nv_bfloat16* x, const int32_t* row_token, int64_t n_rows, int64_t hidden,
                 __nv_bfloat16* xp, cudaStream_t stream) {
  FP4MOE_CHECK(hidden > 0 && hidden % 8 == 0 && hidden <= kMaxInt32 && n_rows >= 0 && n_rows <= kMaxInt32)
      << "gather_rows: hidden=" << hidden << " (must be a positive multiple of 8), n_rows=" << n_rows;
  if (n_rows == 0) return;
  check_aligned(x, "x", "gather_rows");
  check_aligned(xp, "xp", "gather_rows");
  FP4MOE_CHECK(row_token != nullptr) << "gather_rows: row_token is null";
  gather_rows_kernel<<<static_cast<unsigned>(n_rows), 128, 0, stream>>>(x, row_token, static_cast<int>(hidden), xp);
  check_launch("gather_rows_kernel<<<>>>");
}

void swiglu(const __nv_bfloat16* gate, const __nv_bfloat16* up, int64_t ld_in, int64_t rows, int64_t inter,
            __nv_bfloat16* act, cudaStream_t stream) {
  FP4MOE_CHECK(inter > 0 && inter % 8 == 0 && ld_in % 8 == 0 && ld_in >= inter && rows >= 0)
      << "swiglu: inter=" << inter << " ld_in=" << ld_in << " rows=" << rows
      << " (inter and ld_in multiples of 8, ld_in >= inter)";
  if (rows == 0) return;
  check_aligned(gate, "gate", "swiglu");
  check_aligned(up, "up", "swiglu");
  check_aligned(act, "act", "swiglu");
  const int64_t n_vecs = rows * (inter / 8);
  const unsigned grid = static_cast<unsigned>(std::min<int64_t>((n_vecs + 255) / 256, 65536));
  swiglu_kernel<<<grid, 256, 0, stream>>>(gate, up, ld_in, rows, inter, act);
  check_launch("swiglu_kernel<<<>>>");
}

void combine(const __nv_bfloat16* down_out, const int32_t* entry_of, const float* topk_weights,
             const __nv_bfloat16* shared, int64_t n_tokens, int top_k, int64_t hidden, __nv_bfloat16* y,
             cudaStream_t stream) {
  FP4MOE_CHECK(hidden > 0 && hidden % 8 == 0 && hidden <= kMaxInt32 && top_k >= 1 && n_tokens >= 0 &&
               n_tokens <= kMaxInt32)
      << "combine: hidden=" << hidden << " (must be a positive multiple of 8), top_k=" << top_k
      << ", n_tokens=" << n_tokens;
  if (n_tokens == 0) return;
  check_aligned(down_out, "down_out", "combine");
  check_aligned(y, "y", "combine");
  if (shared != nullptr) check_aligned(shared, "shared", "combine");
  FP4MOE_CHECK(entry_of != nullptr && topk_weights != nullptr) << "combine: null entry_of/topk_weights";
  const int64_t chunks = hidden / 8;
  const dim3 grid(static_cast<unsigned>(n_tokens),
                  static_cast<unsigned>((chunks + kCombineThreads - 1) / kCombineThreads));
  combine_kernel<<<grid, kCombineThreads, 0, stream>>>(down_out, entry_of, topk_weights, shared, top_k,
                                                       static_cast<int>(hidden), y);
  check_launch("combine_kernel<<<>>>");
}

void fill_hash_bytes(uint8_t* dst, int64_t n, uint64_t seed, uint8_t base, uint8_t mask, cudaStream_t stream) {
  FP4MOE_CHECK(n >= 0) << "fill_hash_bytes: n=" << n;
  if (n == 0) return;
  FP4MOE_CHECK(dst != nullptr) << "fill_hash_bytes: dst is null";
  const unsigned grid = static_cast<unsigned>(std::min<int64_t>((n + 255) / 256, 65536));
  fill_hash_bytes_kernel<<<grid, 256, 0, stream>>>(dst, n, seed, base, mask);
  check_launch("fill_hash_bytes_kernel<<<>>>");
}

}  // namespace fp4moe::cuda::moe
