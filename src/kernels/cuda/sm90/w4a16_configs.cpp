// Host side of sm90_nvfp4_w4a16_grouped_gemm that needs no GPU: config names and lookup, the
// shared-memory refusal (worded by plan/w4a16_smem.h, shared with the planner), and the problem
// checks. The launch itself is in w4a16_grouped_gemm.cu. Tested by tests/kernels/test_cuda_w4a16.cpp (CPU tests).
#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.h"
#include "kernels/cuda/sm90/w4a16_grouped_gemm.h"
#include "plan/w4a16_smem.h"

namespace fp4moe::cuda::sm90 {

namespace {
constexpr const char* kKernel = plan::kW4A16KernelName;
}  // namespace

int w4a16_num_configs() { return kNumW4A16Configs; }

const W4A16Config& w4a16_config(int config_id) {
  FP4MOE_CHECK(config_id >= 0 && config_id < kNumW4A16Configs)
      << kKernel << ": config id " << config_id << " is out of range (" << kNumW4A16Configs
      << " configs, ids 0.." << kNumW4A16Configs - 1 << ")";
  return kW4A16Configs[config_id];
}

std::vector<std::string> w4a16_config_names() {
  std::vector<std::string> out;
  for (const W4A16Config& c : kW4A16Configs) out.push_back(w4a16_config_name(c));
  return out;
}

int w4a16_config_id(std::string_view name) {
  std::string known;
  for (int i = 0; i < kNumW4A16Configs; ++i) {
    const std::string n = w4a16_config_name(kW4A16Configs[i]);
    if (n == name) return i;
    known += (i == 0 ? "" : ", ") + n;
  }
  FP4MOE_FAIL() << kKernel << ": unknown config '" << name << "'; known: " << known;
  return -1;
}

void w4a16_check_config(const W4A16Config& c, uint32_t smem_limit) {
  const std::string refusal = plan::w4a16_smem_refusal(c, smem_limit);
  FP4MOE_CHECK(refusal.empty()) << kKernel << ": " << refusal;
}

void w4a16_check_problem(const W4A16GroupedGemmArgs& a, const W4A16Config& c) {
  const std::string what = std::string(kKernel) + " (" + w4a16_config_name(c) + ", M_total=" +
                           std::to_string(a.m_total) + ", N=" + std::to_string(a.n) + ", K=" +
                           std::to_string(a.k) + ", E=" + std::to_string(a.n_experts) + ")";
  FP4MOE_CHECK(W4A16Layout::make(c).valid()) << what << ": invalid config";
  const std::string k_refusal = plan::w4a16_k_refusal(a.k), n_refusal = plan::w4a16_n_refusal(a.n);
  FP4MOE_CHECK(k_refusal.empty()) << what << ": " << k_refusal;
  FP4MOE_CHECK(a.n <= std::numeric_limits<int32_t>::max() && a.k <= std::numeric_limits<int32_t>::max())
      << what << ": N and K must be < 2^31";
  FP4MOE_CHECK(n_refusal.empty()) << what << ": " << n_refusal;
  FP4MOE_CHECK(a.epilogue != W4A16Epilogue::kSwiGlu || a.n % 16 == 0)
      << what << ": the SwiGLU epilogue needs N = 2 x I with I % 8 == 0 (gate/up interleaved by 8 rows); N % 16 = "
      << a.n % 16;
  FP4MOE_CHECK(a.n_experts >= 1 && a.n_experts <= std::numeric_limits<int32_t>::max())
      << what << ": E=" << a.n_experts << " must be >= 1";
  FP4MOE_CHECK(a.m_total >= 0 && a.m_total <= std::numeric_limits<int32_t>::max())
      << what << ": M_total=" << a.m_total << " must be in [0, 2^31) (int32 expert offsets)";
  if (a.m_total == 0) return;
  FP4MOE_CHECK(a.expert_offsets != nullptr || a.n_experts == 1)
      << what << ": expert_offsets may be null only for one expert (rows [0, M_total))";
  FP4MOE_CHECK(a.x != nullptr && a.w_packed != nullptr &&
               a.w_scales != nullptr && a.w_global_scales != nullptr && a.y != nullptr)
      << what << ": null pointer (x " << static_cast<const void*>(a.x) << ", w_packed "
      << static_cast<const void*>(a.w_packed) << ", w_scales " << static_cast<const void*>(a.w_scales)
      << ", w_global_scales " << static_cast<const void*>(a.w_global_scales) << ", y "
      << static_cast<const void*>(a.y) << ")";
  auto misaligned = [](const void* p, uintptr_t align) { return reinterpret_cast<uintptr_t>(p) % align != 0; };
  FP4MOE_CHECK(!misaligned(a.x, 16) && !misaligned(a.w_packed, 16) && !misaligned(a.y, 16) &&
               !misaligned(a.w_scales, 16) && !misaligned(a.expert_offsets, 4) &&
               !misaligned(a.w_global_scales, 4) && !misaligned(a.splitk_workspace, 16))
      << what << ": x " << static_cast<const void*>(a.x) << ", w_packed "
      << static_cast<const void*>(a.w_packed) << ", w_scales " << static_cast<const void*>(a.w_scales) << " and y "
      << static_cast<const void*>(a.y) << " (and a split-K workspace " << static_cast<const void*>(a.splitk_workspace)
      << ") must be 16 B aligned, expert_offsets and w_global_scales 4 B aligned "
      << "(cp.async / vector accesses)";
  FP4MOE_CHECK(!a.filters_experts() || (a.expert_offsets != nullptr && a.min_expert_rows >= 0 &&
                                          a.min_expert_rows <= a.max_expert_rows))
      << what << ": an expert row class needs expert_offsets and 0 <= min_expert_rows <= max_expert_rows (got "
      << a.min_expert_rows << " .. " << a.max_expert_rows << ", offsets " << static_cast<const void*>(a.expert_offsets) << ")";
  // The wgmma kind launches the grid transposed (row blocks along x, token tiles along y: w4a16_wgmma.cu).
  const W4A16Grid grid = w4a16_grid(a, c);
  const bool transposed = w4a16_is_wgmma(c.kind);
  const int64_t launch_x = transposed ? grid.y : grid.x, launch_y = transposed ? grid.x : grid.y;
  FP4MOE_CHECK(launch_x <= std::numeric_limits<int32_t>::max() && launch_y <= 65535)
      << what << ": grid " << launch_x << " x " << launch_y << " exceeds CUDA's limits (2^31-1 x 65535)"
      << (transposed ? " (the wgmma tiles launch row blocks along x, token tiles along y)" : "");
}

W4A16Grid w4a16_grid(const W4A16GroupedGemmArgs& a, const W4A16Config& c) {
  int64_t items = a.n_experts == 1 ? (a.m_total + c.block_t - 1) / c.block_t
                                   : a.m_total / c.block_t + std::min<int64_t>(a.n_experts, a.m_total);
  if (a.filters_experts() && a.expert_offsets != nullptr) {
    const int64_t in_class = std::min<int64_t>(a.n_experts, a.m_total / std::max<int64_t>(1, a.min_expert_rows));
    const int64_t bound = a.max_expert_rows <= static_cast<int64_t>(c.block_t) ? in_class : a.m_total / c.block_t + in_class;
    items = std::min(items, bound);
  }
  return W4A16Grid{items, (a.n + c.block_w - 1) / c.block_w};
}

W4A16SplitK w4a16_splitk_plan(const W4A16GroupedGemmArgs& a, const W4A16Config& c, int n_sms) {
  W4A16SplitK s;
  const int64_t k_groups = w4a16_k_groups(a.k);
  s.groups_per_part = static_cast<int>(k_groups);
  if (a.splitk_workspace == nullptr || a.m_total <= 0 || k_groups < 2 || n_sms < 1 || a.filters_experts()) {
    return s;
  }
  const int64_t ctas = w4a16_grid(a, c).ctas();
  const int64_t plane_bytes = a.m_total * a.n * static_cast<int64_t>(sizeof(float));
  const int64_t max_parts = std::min<int64_t>({kW4A16MaxSplitK, k_groups, static_cast<int64_t>(a.splitk_workspace_bytes) / plane_bytes});
  int64_t parts = 1;
  if (w4a16_is_wgmma(c.kind)) {
    // 1-2 resident CTAs per SM, each a long chain of K chunks: the fewest waves x groups per CTA (+1
    // for the prologue, epilogue and partial store), i.e. whole waves rather than a ragged last one.
    const int64_t resident = static_cast<int64_t>(w4a16_ctas_per_sm(c, W4A16Layout::make(c).total_bytes())) * n_sms;
    int64_t best_cost = -1;
    for (int64_t p = 1; p <= max_parts; ++p) {
      const int64_t per = (k_groups + p - 1) / p, used = (k_groups + per - 1) / per;
      const int64_t cost = (ctas * used + resident - 1) / resident * (per + 1);
      if (best_cost < 0 || cost < best_cost) {
        best_cost = cost;
        parts = used;
      }
    }
  } else {
    const int64_t target = static_cast<int64_t>(kW4A16SplitKTargetCtasPerSm) * n_sms;
    parts = std::min<int64_t>((target + ctas - 1) / ctas, max_parts);
  }
  if (parts < 2) return s;
  const int64_t per = (k_groups + parts - 1) / parts;  // whole groups; no part left empty
  s.groups_per_part = static_cast<int>(per);
  s.parts = static_cast<int>((k_groups + per - 1) / per);
  return s;
}

W4A16SplitKReduce w4a16_splitk_reduce_launch(const W4A16GroupedGemmArgs& a) {
  const int64_t quads = a.m_total * (a.epilogue == W4A16Epilogue::kSwiGlu ? a.n / 2 : a.n) / 4;
  W4A16SplitKReduce r;
  r.blocks = static_cast<int>(std::min<int64_t>((quads + 255) / 256, 4096));
  r.loads_first = r.blocks <= kW4A16ReduceLoadsFirstMaxBlocks;
  return r;
}

int w4a16_default_config(int64_t tokens_per_expert, int64_t n_experts) {
  // Decode: the streaming kernel (per-warp code rings), 128 rows a CTA (4 warps of two row tiles: the
  // 64-row tiles' 2 warps ran 226 vs 179 us on gate_up at 16 tokens, BENCHMARKS.md 2026-12-04
  // thirteenth session), up to 32 tokens (the n32 tile: 0.91-0.97x the time of wgmma m128n32 at 24-32
  // tokens, BENCHMARKS.md 2026-12-05 nineteenth session run 2); past that the wgmma tiles, the fastest of
  // each bucket on the GLM-5 shard (H200, BENCHMARKS.md 2026-12-04 seventeenth session runs 1 and 3,
  // producer warpgroup; no wgmma tile is faster than the streaming kernel at 16 tokens, m128n16 was
  // 1.4-1.55x slower; 64 tokens m128n64 1.48-1.55x cuBLAS BF16, 128 m256n128 1.07-1.13x, 256 m128n256
  // 0.94-0.98x). With the activations in the rings (twenty-third session, H100 same-run A/B) the 16- and
  // 32-token tiles run a 4-deep ring (m128n16_d8 then had 2 CTAs an SM left, 3 since the CTA activation
  // ring; d4 4: 5-9% faster at 16 tokens).
  // Up to 16 tokens, CTAs of 256 weight rows (8 warps): each token row's activations come from L2 once
  // per 256 rows instead of per 128 (L2 traffic at 16 tokens 5.21 -> 4.78 TB/s), 2-7% faster at 1-16
  // tokens (88-92% of HBM at 1-8; H100 same-run A/B, BENCHMARKS.md 2026-12-05 twenty-fourth session).
  // 17-32 tokens also 256 rows a CTA (w4a16_stream_m256n32_d4, the CTA activation ring: one box per 256
  // rows): 2-6% faster than m128n32_d4 on gate_up and down at 24-32 tokens (H100, twenty-sixth session).
  if (tokens_per_expert <= 8) return w4a16_config_id("w4a16_stream_m256n8_d4");
  if (tokens_per_expert <= 16) return w4a16_config_id("w4a16_stream_m256n16_d4");
  // One expert (a dense Linear): N / 256 row blocks are few (24 for GLM-5's o_proj), and at 17-32 rows the
  // 128-row CTAs are 5-12% faster on o_proj and the dense MLP's gate / up / down, within 1% on q_b
  // (H100, thirtieth session run 3, 10 launches a sample).
  if (tokens_per_expert <= 32) {
    return w4a16_config_id(n_experts == 1 ? "w4a16_stream_m128n32_d4" : "w4a16_stream_m256n32_d4");
  }
  if (tokens_per_expert <= 64) return w4a16_config_id("w4a16_wgmma_m128n64_s4");
  if (tokens_per_expert <= 128) return w4a16_config_id("w4a16_wgmma_m256n128_s4");
  return w4a16_config_id("w4a16_wgmma_m128n256_s4");
}

}  // namespace fp4moe::cuda::sm90
