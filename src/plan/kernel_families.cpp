// Candidate lists and SMEM sizing per kernel family (see kernel_families.h).
// Tested by tests/plan/test_planner.cpp and tests/plan/test_cutlass_tables.cpp.
#include "plan/kernel_families.h"

#include <sstream>

#include "core/error.h"

namespace fp4moe::plan {
namespace {

// FlashInfer's SM120 tile list (`all_tiles[]`, cutlass_heuristic.cpp, after PR #3152), in
// elements (the enum's K is in bytes of FP4 activations, so K elements = 2 x the enum's K).
// The order decides the tactic numbers. Verified from a public trace of FlashInfer tactics on
// SM120 (base 2 = 256x128x64B, 6 = 128x32x128B, 7 = 128x32x64B, 8 = 128x64x128B); the order of
// the other six is an assumption (docs/planner.md). 128x128x256B and 256x128x128B have no
// SHAPE_CASE in the dispatch and always throw.
struct Sm120Tile {
  uint32_t m, n, k;
  bool has_dispatch;
};
constexpr Sm120Tile kSm120Tiles[] = {
    {128, 128, 128, true},   // 0: 128x128x64B
    {128, 256, 128, true},   // 1: 128x256x64B
    {256, 128, 128, true},   // 2: 256x128x64B
    {128, 128, 256, true},   // 3: 128x128x128B
    {128, 128, 512, false},  // 4: 128x128x256B (no SHAPE_CASE)
    {256, 128, 256, false},  // 5: 256x128x128B (no SHAPE_CASE)
    {128, 32, 256, true},    // 6: 128x32x128B
    {128, 32, 128, true},    // 7: 128x32x64B
    {128, 64, 256, true},    // 8: 128x64x128B
    {128, 64, 128, true},    // 9: 128x64x64B
};
constexpr int kNumSm120Tiles = sizeof(kSm120Tiles) / sizeof(kSm120Tiles[0]);

// FlashInfer get_candidate_configs_sm100, FP4, 1-SM, cluster 1x1x1: 128x64x128B (sm100 only),
// 128x128x128B, 128x256x128B, i.e. K = 256 elements.
constexpr uint32_t kSm100TileN[] = {64, 128, 256};

std::string padding_name() { return "padding (alignment, struct tails)"; }

// Groups a layout's regions: padding collapsed into one item, the rest by name in order.
std::vector<BreakdownItem> group_regions(const SmemLayout& l) {
  std::vector<BreakdownItem> out;
  uint32_t padding = 0;
  for (int i = 0; i < l.n_regions; ++i) {
    const SmemRegion& r = l.regions[i];
    if (r.kind == RegionKind::kPadding) {
      padding += r.bytes;
      continue;
    }
    bool merged = false;
    for (BreakdownItem& b : out) {
      if (b.name == r.name) {
        b.bytes += r.bytes;
        merged = true;
        break;
      }
    }
    if (!merged) out.push_back({r.name, r.bytes});
  }
  if (padding != 0) out.push_back({padding_name(), padding});
  return out;
}

SmemCheck check_cutlass(const TileCandidate& c, const GpuSpec& gpu, const CutlassRules& rules) {
  const bool sm100 = c.family == KernelFamily::kCutlassSm100;
  // CUTLASS's builder divides its compile-time constant, not the device's value.
  const CutlassGroupedModel m = sm100 ? model_cutlass_sm100(c.cutlass, rules) : model_cutlass_sm120(c.cutlass, rules);
  SmemCheck out;
  out.limit = gpu.smem_optin_per_block;
  out.stage_bytes = m.stage_operand_bytes;
  out.epilogue_bytes = m.epilogue_storage;
  // With too few stages, size the smallest buildable pipeline, to say by how much it misses.
  const int stages = m.invalid_reason == nullptr ? m.stages : m.min_stages;
  const SmemLayout layout = sm100 ? sm100_kernel_layout(c.cutlass, rules, stages) : sm120_kernel_layout(c.cutlass, rules, stages);
  out.stages = stages;
  out.bytes = layout.total_bytes;
  out.overhead_bytes = out.bytes - static_cast<uint32_t>(stages) * out.stage_bytes - out.epilogue_bytes;
  out.breakdown = group_regions(layout);
  std::ostringstream sum;
  sum << stages << (stages == 1 ? " stage x " : " stages x ") << out.stage_bytes << " + epilogue " << out.epilogue_bytes
      << " + overhead " << out.overhead_bytes << " = " << out.bytes << " B";
  out.summary = sum.str();

  const uint32_t budget_left = m.builder_capacity - m.epilogue_storage;
  std::ostringstream note;
  note << "builder: (" << m.builder_capacity << " - " << m.epilogue_storage << ") / " << m.builder_stage_bytes << " = "
       << (m.builder_capacity > m.epilogue_storage ? budget_left / m.builder_stage_bytes : 0) << " stage(s)";
  out.fits = out.bytes <= out.limit;
  if (m.invalid_reason != nullptr && m.tile_ok) {
    out.fits = false;
    out.rule = "builder-min-stages";
    out.reason = std::string(m.invalid_reason) + " (" + note.str() + ")";
  } else if (m.invalid_reason != nullptr) {
    out.fits = false;
    out.rule = "tile";
    out.reason = m.invalid_reason;
  } else if (!out.fits) {
    // The builder believed `stages` fit: its budget leaves out part of the kernel's storage.
    const bool builder_thought_fit = static_cast<uint64_t>(stages) * m.builder_stage_bytes + m.epilogue_storage <= m.builder_capacity;
    out.rule = builder_thought_fit ? "builder-overflow" : "smem-opt-in";
    std::ostringstream r;
    r << "needs " << out.bytes << " B, " << out.bytes - out.limit << " B over the opt-in";
    if (builder_thought_fit) {
      const uint32_t counted = static_cast<uint32_t>(stages) * m.builder_stage_bytes + m.epilogue_storage;
      std::ostringstream bn;
      bn << note.str() << " fit in its budget, but the kernel also needs "
         << out.bytes - counted << " B the budget does not count (pipelines, scheduler responses, TMA descriptors, padding)";
      const SmemLayout fewer = sm100 ? sm100_kernel_layout(c.cutlass, rules, stages - 1) : sm120_kernel_layout(c.cutlass, rules, stages - 1);
      if (stages - 1 >= m.min_stages) bn << "; " << stages - 1 << " stages would need " << fewer.total_bytes << " B";
      out.builder_note = bn.str();
      r << " (CUTLASS builder picked " << stages << " stages)";
    }
    out.reason = r.str();
  } else {
    out.builder_note = note.str();
  }
  if (!c.has_dispatch) {
    out.fits = false;
    if (out.rule.empty()) {
      out.rule = "dispatch";
      out.reason = "FlashInfer has no SHAPE_CASE for this tile: the tactic always throws";
    } else {
      out.reason += "; FlashInfer has no SHAPE_CASE for it either";
    }
  }
  return out;
}

// The shipped kernel's configs have a fixed stage count (a template argument): no builder picks
// one. Fit and refusal come from plan::w4a16_smem_refusal, the function the launcher's
// w4a16_check_config throws with, so the planner rejects exactly what the launcher would refuse.
SmemCheck check_ours(const TileCandidate& c, const GpuSpec& gpu) {
  SmemCheck out;
  out.limit = gpu.smem_optin_per_block;
  const W4A16Layout l = W4A16Layout::make(c.ours);
  const std::string refusal = w4a16_smem_refusal(c.ours, out.limit);
  out.summary = w4a16_smem_summary(c.ours);
  if (!l.valid()) {
    out.rule = "tile";
    out.reason = refusal;
    return out;
  }
  out.stages = static_cast<int>(c.ours.stages);
  out.bytes = l.total_bytes();
  out.stage_bytes = l.stage_stride;
  // The wgmma kind's epilogue tile reuses the stages (no bytes of its own); its A tiles and mbarriers
  // are the overhead.
  out.epilogue_bytes = w4a16_is_wgmma(c.ours.kind) ? 0 : l.epilogue_bytes;
  out.overhead_bytes = out.bytes - c.ours.stages * out.stage_bytes - out.epilogue_bytes;  // padding / A tiles / barriers
  out.breakdown = group_regions(l.layout);
  out.fits = refusal.empty();
  if (!out.fits) {
    out.rule = "smem-opt-in";
    out.reason = refusal;
  }
  return out;
}

}  // namespace

std::string describe(const SmemLayout& l) {
  std::ostringstream os;
  for (int i = 0; i < l.n_regions; ++i) {
    const SmemRegion& r = l.regions[i];
    os << "  " << r.offset << " +" << r.bytes << " (align " << r.align << ") " << r.name << "\n";
  }
  os << "  total " << l.total_bytes << " B\n";
  return os.str();
}

SmemLayout candidate_layout(const TileCandidate& c, const GpuSpec& /*gpu: no family sizes by the device*/, const CutlassRules& rules) {
  if (c.family == KernelFamily::kSm90W4A16) return W4A16Layout::make(c.ours).layout;
  const bool sm100 = c.family == KernelFamily::kCutlassSm100;
  const CutlassGroupedModel m = sm100 ? model_cutlass_sm100(c.cutlass, rules) : model_cutlass_sm120(c.cutlass, rules);
  const int stages = m.invalid_reason == nullptr ? m.stages : m.min_stages;
  return sm100 ? sm100_kernel_layout(c.cutlass, rules, stages) : sm120_kernel_layout(c.cutlass, rules, stages);
}

const char* family_name(KernelFamily f) {
  switch (f) {
    case KernelFamily::kSm90W4A16: return "sm90_nvfp4_w4a16_grouped_gemm";
    case KernelFamily::kCutlassSm120: return "cutlass-sm120-moe";
    case KernelFamily::kCutlassSm100: return "cutlass-sm100-moe";
  }
  return "?";
}

KernelFamily parse_family(std::string_view name) {
  if (name == "ours" || name == "sm90_nvfp4_w4a16_grouped_gemm" || name == "sm90-nvfp4-w4a16") return KernelFamily::kSm90W4A16;
  if (name == "cutlass-sm120-moe" || name == "cutlass-sm120") return KernelFamily::kCutlassSm120;
  if (name == "cutlass-sm100-moe" || name == "cutlass-sm100") return KernelFamily::kCutlassSm100;
  FP4MOE_FAIL() << "unknown kernel family '" << name
                << "'; known: ours (sm90_nvfp4_w4a16_grouped_gemm), cutlass-sm120-moe, cutlass-sm100-moe";
  return KernelFamily::kSm90W4A16;
}

KernelFamily default_family(const GpuSpec& gpu) {
  if (gpu.sm >= 120) return KernelFamily::kCutlassSm120;
  if (gpu.sm >= 100) return KernelFamily::kCutlassSm100;
  return KernelFamily::kSm90W4A16;
}

std::string TileCandidate::to_string() const {
  if (family == KernelFamily::kSm90W4A16) return w4a16_config_name(ours);
  std::ostringstream os;
  os << tile_m() << "x" << tile_n() << "x" << tile_k();
  if (cutlass.operands != OperandKind::kNvfp4) os << " " << operand_name(cutlass.operands);
  os << " " << fusion_name(cutlass.epilogue);
  os << " swap_ab=" << (swap_ab() ? 1 : 0);
  return os.str();
}

std::vector<TileCandidate> family_candidates(KernelFamily family, bool finalize) {
  std::vector<TileCandidate> out;
  if (family == KernelFamily::kSm90W4A16) {
    // Exactly the configs the kernel is compiled for; GEMM1 and GEMM2 use the same list (the
    // kernel has no fused finalize epilogue).
    for (int i = 0; i < kNumW4A16Configs; ++i) {
      TileCandidate c;
      c.family = family;
      c.ours = kW4A16Configs[i];
      c.base_tile_index = i;
      out.push_back(c);
    }
    return out;
  }
  const std::vector<EpilogueFusion> fusions =
      finalize ? std::vector<EpilogueFusion>{EpilogueFusion::kNone, EpilogueFusion::kFinalize} : std::vector<EpilogueFusion>{EpilogueFusion::kNone};
  for (bool swap : {false, true}) {
    for (EpilogueFusion f : fusions) {
      if (family == KernelFamily::kCutlassSm120) {
        for (int i = 0; i < kNumSm120Tiles; ++i) {
          TileCandidate c;
          c.family = family;
          c.cutlass = CutlassGroupedConfig{kSm120Tiles[i].m, kSm120Tiles[i].n, kSm120Tiles[i].k, OperandKind::kNvfp4, f, swap};
          c.base_tile_index = i;
          c.has_dispatch = kSm120Tiles[i].has_dispatch;
          out.push_back(c);
        }
      } else {
        int i = 0;
        for (uint32_t n : kSm100TileN) {
          TileCandidate c;
          c.family = family;
          c.cutlass = CutlassGroupedConfig{128, n, 256, OperandKind::kNvfp4, f, swap};
          c.base_tile_index = i++;
          out.push_back(c);
        }
      }
    }
  }
  return out;
}

std::string arch_mismatch(const TileCandidate& c, const GpuSpec& gpu) {
  std::ostringstream os;
  switch (c.family) {
    case KernelFamily::kSm90W4A16:
      // mma.sync m16n8k16 BF16 and cp.async: sm_80 features (the build's FP4MOE_CUDA_GENCODE decides
      // which archs the binary carries; the planner answers what would fit); the stream tiles' activations
      // come by TMA boxes into the CTA's ring (mbarrier transaction counts): sm_90+; the wgmma tiles sm_90a.
      if (gpu.sm < 80 || !gpu.has(kMmaSync)) {
        os << "needs mma.sync BF16 + cp.async (sm_80+); " << gpu.name << " is " << gpu.sm_name();
      } else if (c.ours.kind == W4A16Kind::kStream && !gpu.has(kTma)) {
        os << "stream tiles need TMA (cp.async.bulk.tensor, sm_90+); " << gpu.name << " is " << gpu.sm_name();
      } else if (w4a16_is_wgmma(c.ours.kind) && (gpu.sm != 90 || !gpu.has(kWgmma))) {
        os << "wgmma tiles need sm_90a (wgmma.mma_async); " << gpu.name << " is " << gpu.sm_name();
      }
      break;
    case KernelFamily::kCutlassSm120:
      if (gpu.sm != 120 && gpu.sm != 121) os << "is built for sm_120/sm_121 (mma.sync block-scaled FP4); " << gpu.name << " is " << gpu.sm_name();
      break;
    case KernelFamily::kCutlassSm100:
      if (gpu.sm != 100 && gpu.sm != 103) os << "is built for sm_100/sm_103 (tcgen05); " << gpu.name << " is " << gpu.sm_name();
      break;
  }
  return os.str();
}

SmemCheck check_smem(const TileCandidate& c, const GpuSpec& gpu, const CutlassRules& rules) {
  SmemCheck out = c.family == KernelFamily::kSm90W4A16 ? check_ours(c, gpu) : check_cutlass(c, gpu, rules);
  const std::string arch = arch_mismatch(c, gpu);
  if (!arch.empty()) {
    out.fits = false;
    out.rule = "arch";
    out.reason = std::string(family_name(c.family)) + " " + arch;
  }
  return out;
}

int flashinfer_tactic(const TileCandidate& c, bool gemm2) {
  if (c.family != KernelFamily::kCutlassSm120 || c.base_tile_index < 0) return -1;
  // getTmaWarpSpecializedConfigs: the tile list; for GEMM2 the list again with FINALIZE appended;
  // then the whole list again with swap_ab=true. The runner concatenates GEMM1's tactics and GEMM2's.
  const int swap = c.cutlass.swap_ab ? 1 : 0;
  if (!gemm2) return c.base_tile_index + kNumSm120Tiles * swap;
  const int fin = c.cutlass.epilogue == EpilogueFusion::kFinalize ? 1 : 0;
  return 2 * kNumSm120Tiles + c.base_tile_index + kNumSm120Tiles * fin + 2 * kNumSm120Tiles * swap;
}

}  // namespace fp4moe::plan
