// Kernel families the planner knows, their candidate tile lists, and how a candidate is sized on
// a GPU: the stage count its builder picks, the bytes the kernel requests, the per-region
// breakdown, and whether (and why) it cannot run there. All sizes come from the constexpr layouts
// (layout_cutlass.h, layout_sm90_w4a16.h); this file only enumerates and words them.
// Tested by tests/plan/test_planner.cpp and tests/plan/test_cutlass_tables.cpp.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "plan/gpu_table.h"
#include "plan/layout_cutlass.h"
#include "plan/layout_sm90_w4a16.h"
#include "plan/w4a16_smem.h"

namespace fp4moe::plan {

enum class KernelFamily : uint8_t {
  kSm90W4A16,     // ours: sm90_nvfp4_w4a16_grouped_gemm
  kCutlassSm120,  // cutlass-sm120-moe (FlashInfer / TRT-LLM, SM120/SM121)
  kCutlassSm100,  // cutlass-sm100-moe (FlashInfer / TRT-LLM, SM100/SM103, 1-SM, cluster 1x1x1)
};
const char* family_name(KernelFamily f);  // "sm90_nvfp4_w4a16_grouped_gemm", "cutlass-sm120-moe", ...
// Accepts the names above and "ours"; throws fp4moe::Error listing them otherwise.
KernelFamily parse_family(std::string_view name);
// What `fp4moe plan` uses without --kernel: ours on Hopper, the CUTLASS family of the arch otherwise.
KernelFamily default_family(const GpuSpec& gpu);

struct TileCandidate {
  KernelFamily family = KernelFamily::kSm90W4A16;
  W4A16Config ours{};        // ours: one of kW4A16Configs (the shipped kernel's configs)
  CutlassGroupedConfig cutlass{};
  int base_tile_index = -1;  // CUTLASS: index in the FlashInfer tile list (for tactic numbers); ours: config id
  bool has_dispatch = true;  // CUTLASS: FlashInfer has a SHAPE_CASE for the tile

  uint32_t tile_m() const { return family == KernelFamily::kSm90W4A16 ? ours.block_w : cutlass.m; }
  uint32_t tile_n() const { return family == KernelFamily::kSm90W4A16 ? ours.block_t : cutlass.n; }
  uint32_t tile_k() const { return family == KernelFamily::kSm90W4A16 ? ours.block_k : cutlass.k; }
  // Ours is always swap-AB: weights are the MMA M (tile_m = block_w), tokens the MMA N (tile_n = block_t).
  bool swap_ab() const { return family == KernelFamily::kSm90W4A16 || cutlass.swap_ab; }
  uint32_t token_tile() const { return swap_ab() ? tile_n() : tile_m(); }
  uint32_t weight_tile() const { return swap_ab() ? tile_m() : tile_n(); }
  bool finalize() const { return family != KernelFamily::kSm90W4A16 && cutlass.epilogue == EpilogueFusion::kFinalize; }
  // "128x256x128 FINALIZE swap_ab=0" (CUTLASS) or the config name "w4a16_swapab_m128n32k128_s4" (ours).
  std::string to_string() const;
};

// The candidates of a family for one GEMM (finalize: the GEMM2 of a MoE, which also gets the
// FINALIZE epilogue on the CUTLASS families). In FlashInfer's tactic order for CUTLASS SM120; ours:
// kW4A16Configs in order, the shipped kernel's configs (base_tile_index = the config id).
std::vector<TileCandidate> family_candidates(KernelFamily family, bool finalize);

// A named slice of the shared memory, for breakdowns.
struct BreakdownItem {
  std::string name;
  uint32_t bytes = 0;
};

// A candidate sized for one GPU.
struct SmemCheck {
  int stages = 0;               // the builder's choice (ours: the config's own, fixed at compile time)
  uint32_t bytes = 0;           // what the kernel requests (cudaFuncAttributeMaxDynamicSharedMemorySize)
  uint32_t limit = 0;           // the GPU's opt-in per block
  bool fits = false;
  std::string rule;             // empty when it runs; else "smem-opt-in", "builder-overflow", "arch", "tile", "dispatch"
  std::string summary;          // "3 stages x 27648 + epilogue 17408 + overhead 2048 = 102400 B"
  std::string reason;           // one line for tables: why it does not run, or a note
  std::string builder_note;     // CUTLASS: how the builder's budget differs from the kernel's request
  std::vector<BreakdownItem> breakdown;  // regions grouped, summing to `bytes`
  uint32_t stage_bytes = 0, epilogue_bytes = 0, overhead_bytes = 0;
  int64_t margin() const { return static_cast<int64_t>(limit) - static_cast<int64_t>(bytes); }
};

SmemCheck check_smem(const TileCandidate& c, const GpuSpec& gpu, const CutlassRules& rules);

// The region table of a layout, one line per region ("  1024 +8192 (align 1024) mainloop smem_B").
std::string describe(const SmemLayout& layout);
// The layout a candidate is sized with on `gpu` (the one behind check_smem's numbers).
SmemLayout candidate_layout(const TileCandidate& c, const GpuSpec& gpu, const CutlassRules& rules);

// The arch requirement of a candidate (its family's; ours' wgmma tiles also need wgmma), or an empty
// string when the GPU has it.
std::string arch_mismatch(const TileCandidate& c, const GpuSpec& gpu);

// FlashInfer's global tactic index of a CUTLASS SM120 candidate (GEMM1 tactics first, then GEMM2),
// or -1 for other families. See kernel_families.cpp for the order and what is verified of it.
int flashinfer_tactic(const TileCandidate& c, bool gemm2);

}  // namespace fp4moe::plan
