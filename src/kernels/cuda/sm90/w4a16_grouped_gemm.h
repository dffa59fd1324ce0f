// sm90_nvfp4_w4a16_grouped_gemm: the MoE expert GEMM with BF16 activations and NVFP4 weights, one
// launch for all experts, on Hopper (built for sm_90a).
//
//   Y[t, n] = bf16( gs[e] * sum_k X[t, k] * (e2m1(W_e[n, k]) * e4m3(S_e[n, k / 16])) )
//   for every token row t in [offsets[e], offsets[e + 1]) of the permuted activations X.
//
// Three kernels share the API (plan/layout_sm90_w4a16.h has the configs): kStream for decode (1..32
// tokens per expert: each warp streams its weight rows' codes through its own shared-memory rings with no
// barrier; the activations come by TMA into a ring of the CTA, mbarriers), kPipeline for 32-token tiles
// (cp.async multi-stage pipeline through shared memory), both on mma.sync m16n8k16 BF16 tensor cores, and kWgmma for
// 64+ tokens and prefill (w4a16_wgmma.cu: wgmma m64nNk16 with the dequantized weights staged in shared memory). All are
// swap-AB (weight rows are the MMA M, tokens the MMA N: 1..64 tokens per expert waste no weight bandwidth) and
// dequantize in registers (exact, see w4a16_fragments.h) from the kernel weight layout (w4a16_weight_layout.h: made
// once at load by w4a16_repack). Work items (expert, token tile) are mapped on the device from the offsets, so token
// counts may change between launches without a host sync (CUDA-graph friendly): the grid is
// (floor(M_total / block_t) + min(E, M_total)) x ceil(N / block_w), an upper bound on the number of
// token tiles; CTAs past the last tile exit at once, and empty experts get no CTA.
// Tested by tests/kernels/test_cuda_w4a16.cpp; timed by bench/bench_w4a16.cu.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

#include "kernels/cuda/sm90/w4a16_weight_layout.h"
#include "plan/layout_sm90_w4a16.h"
#include "plan/w4a16_smem.h"

namespace fp4moe::cuda::sm90 {

// The configs and the shared-memory layout are the planner's (plan/layout_sm90_w4a16.h): one
// definition for the kernel's carve, the launcher's request and `fp4moe plan`.
using plan::kNumW4A16Configs;
using plan::kSm90SmemOptinBytes;
using plan::kW4A16Configs;
using plan::kW4A16StreamTilesPerWarp;
using plan::kW4A16StreamXRingBytes;
using plan::w4a16_config_name;
using plan::w4a16_ctas_per_sm;
using plan::w4a16_is_wgmma;
using plan::w4a16_smem_summary;
using plan::W4A16Config;
using plan::W4A16Kind;
using plan::W4A16Layout;

// What the epilogue writes. kNone: y [m_total, n]. kSwiGlu (the MoE gate_up GEMM): the weight is
// gate and up interleaved by w4a16_repack_gate_up (n = 2 I rows), and y [m_total, n / 2] =
// bf16(silu(gate) * up) computed from the f32 accumulators (silu(v) = v / (1 + e^-v)).
enum class W4A16Epilogue { kNone, kSwiGlu };

// All pointers are device memory, row-major, experts stacked:
struct W4A16GroupedGemmArgs {
  const __nv_bfloat16* x = nullptr;       // [m_total, k] permuted activations (16 B aligned)
  const int32_t* expert_offsets = nullptr;  // [n_experts + 1], nondecreasing, offsets[E] <= m_total;
                                            // nullptr with n_experts == 1: rows [0, m_total) (a dense
                                            // Linear; m_total is a kernel argument, so a captured
                                            // graph replays its own count)
  const uint8_t* w_packed = nullptr;      // codes in the kernel layout (w4a16_repack), 16 B aligned
  const uint8_t* w_scales = nullptr;      // scales in the kernel layout (w4a16_repack), 16 B aligned
  const float* w_global_scales = nullptr; // [n_experts] weight_scale_2 (kSwiGlu: of gate_proj)
  const float* w_global_scales_up = nullptr;  // kSwiGlu: [n_experts] of up_proj; nullptr = shared
  W4A16Epilogue epilogue = W4A16Epilogue::kNone;
  __nv_bfloat16* y = nullptr;             // [m_total, n] or [m_total, n / 2] (kSwiGlu), 16 B aligned;
                                          // rows outside every expert range are not written
  int64_t m_total = 0, n = 0, k = 0, n_experts = 0;
  // Optional split-K workspace (f32, 16 B aligned; see w4a16_splitk_plan). nullptr: never split.
  float* splitk_workspace = nullptr;
  size_t splitk_workspace_bytes = 0;
  // Expert row classes (grouped launches, expert_offsets set): only experts with min_expert_rows ..
  // max_expert_rows rows (inclusive) are computed, the other experts' output rows are not written. Two
  // launches with complementary classes and different configs cover skewed routing (few experts with
  // many rows, many with few) without a host sync: the device reads the counts. A filtered launch
  // never splits K, and its grid shrinks to what the class can hold (w4a16_grid).
  int32_t min_expert_rows = 0;
  int32_t max_expert_rows = std::numeric_limits<int32_t>::max();
  bool filters_experts() const { return min_expert_rows > 0 || max_expert_rows < std::numeric_limits<int32_t>::max(); }
};

// Split-K of a launch (every kernel kind, either epilogue): when the (token tile x row block)
// grid has fewer working CTAs than kW4A16SplitKTargetCtasPerSm x SMs (a dense E = 1 Linear at
// decode: GLM-5's o_proj, N = 6144, is 96 CTAs of 64 rows, each streaming all of K = 16384; at 64
// tokens the pipelined 128-row tile makes it 48), K is cut into `parts` ranges of whole scale
// groups (512 K each) on grid.z; each part writes its f32 products to the workspace [parts,
// m_total, n] (f32 per weight row; SwiGLU: up rows scaled by their global scale) and
// w4a16_splitk_reduce_kernel sums the parts in order (deterministic) into y, applying the SwiGLU
// there (MoE's shared expert at decode: one expert's 2I rows make few CTAs).
// The wgmma kind (1-2 resident CTAs per SM) instead takes the part count that minimizes waves x
// (groups per part + 1), so the parts fill whole waves (o_proj at 64 tokens, m128n64: 48 CTAs, 264
// resident -> 5 parts of 7 groups in one wave, not 8 parts of 4 in 1.45 waves).
// parts = 1 (no split) for no workspace, an expert row class (filters_experts), or a grid that fills the GPU already;
// parts <= kW4A16MaxSplitK and the workspace must hold them. The same CTA target serves both mma.sync kernels:
// capping the pipelined 128 x 64 tile (1 CTA per SM) at one wave measured slower on the H200 (o_proj
// at 64 tokens: 2 parts 101 us, 8 parts 74 us, unsplit 173 us).
inline constexpr int kW4A16MaxSplitK = 8;
inline constexpr int kW4A16SplitKTargetCtasPerSm = 4;
struct W4A16SplitK {
  int parts = 1;
  int groups_per_part = 0;  // scale groups per part (all of them when parts == 1)
};
W4A16SplitK w4a16_splitk_plan(const W4A16GroupedGemmArgs& args, const W4A16Config& c, int n_sms);

// The reduction launch of a split launch: 4 outputs a thread, 256 threads a block, at most 4096 blocks (a
// grid-stride loop past that). Small grids (decode: a few rows) wait on latency, large ones on bandwidth: up
// to kW4A16ReduceLoadsFirstMaxBlocks blocks the kernel issues every part's load before its adds, without
// waiting for the expert offsets (loads_first; H100, BENCHMARKS.md 2026-12-06 thirty-first session run 5,
// thirty-second session run 2), larger grids sum the parts in a loop after them.
inline constexpr int kW4A16ReduceLoadsFirstMaxBlocks = 256;
struct W4A16SplitKReduce {
  int blocks = 0;
  bool loads_first = false;
};
W4A16SplitKReduce w4a16_splitk_reduce_launch(const W4A16GroupedGemmArgs& args);

// The shipped configurations, in kW4A16Configs order (the config id is the index).
int w4a16_num_configs();
const W4A16Config& w4a16_config(int config_id);  // throws naming the id and the count
// w4a16_config_name(c): "w4a16_swapab_m128n16k256_s4" (plan/w4a16_smem.h)
std::vector<std::string> w4a16_config_names();
// The id of a shipped config by name; throws listing the names.
int w4a16_config_id(std::string_view name);

// w4a16_smem_summary(c): "4 stages x (x_tile 8192 + w_packed 16384 + w_scales 2048) + epilogue 4352 = 110848 B"

// Throws fp4moe::Error unless `c` builds and its layout fits `smem_limit` bytes (the device's
// opt-in maximum per block), e.g.
//   "sm90_nvfp4_w4a16_grouped_gemm: config w4a16_swapab_m128n64k256_s6 needs 6 stages x (...) = 324608 B
//    of shared memory > 232448 B (the device's opt-in limit per block) by 92160 B"
// The message is plan::w4a16_smem_refusal's (the planner rejects a config with the same
// computation). Needs no GPU.
void w4a16_check_config(const W4A16Config& c, uint32_t smem_limit);

// Throws fp4moe::Error naming the numbers unless the problem can run with config `c`: k > 0 and
// k % 16 == 0 (one NVFP4 block; the kernel layout pads K to 64 with zeros), n > 0 and
// n % 8 == 0 (16 B output stores), n_experts >= 1, m_total >= 0, pointers non-null and aligned,
// and the grid within CUDA's limits. Needs no GPU.
void w4a16_check_problem(const W4A16GroupedGemmArgs& args, const W4A16Config& c);

// The launch grid of config `c` over `args` (one definition for the check, the split-K plan and the
// launcher): x = m_total / block_t + min(E, m_total) work items (token tiles over all experts; an
// upper bound, surplus CTAs exit), exactly ceil(m_total / block_t) for one expert; y = ceil(n /
// block_w) weight-row tiles. grid.z is the split-K part. An expert row class bounds x tighter: at
// most min(E, m_total / max(1, min_expert_rows)) experts are in it, each ceil(rows / block_t) <=
// rows / block_t + 1 tiles, exactly one when max_expert_rows <= block_t.
struct W4A16Grid {
  int64_t x = 0, y = 0;
  int64_t ctas() const { return x * y; }
};
W4A16Grid w4a16_grid(const W4A16GroupedGemmArgs& args, const W4A16Config& c);

// Checks (as above, against the current device's opt-in limit) and launches on `stream`.
// m_total == 0 launches nothing. Launch errors throw fp4moe::Error.
void w4a16_grouped_gemm(const W4A16GroupedGemmArgs& args, int config_id, cudaStream_t stream);

// The id of a reasonable config for a typical number of tokens per expert, without tuning: the
// smallest token tile that holds them (8, 16, 32, 64); the fastest measured (w4a16_configs.cpp says
// where). n_experts: the GEMM's experts (1, a dense Linear: its few row blocks take smaller CTAs at
// 17-32 rows; a shared expert asks for at most 16 rows below 129, gpu_moe_tokens_per_expert).
int w4a16_default_config(int64_t tokens_per_expert, int64_t n_experts);

}  // namespace fp4moe::cuda::sm90
