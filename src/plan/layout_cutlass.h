// Exact shared-memory models of CUTLASS's block-scaled grouped GEMM as FlashInfer / TRT-LLM
// instantiate it for MoE (moe_gemm_tma_ws_launcher.inl), on SM120/SM121 and on SM100/SM103:
//   * the stage count CUTLASS's collective builder picks (StageCountAutoCarveout), and
//   * the bytes the kernel really requests (sizeof(GemmKernel::SharedStorage), the value
//     GemmUniversalAdapter::initialize() passes to cudaFuncSetAttribute),
// built from the real struct nesting, member by member. No term is fitted per tile: every byte
// below names the CUTLASS member it stands for (see docs/planner.md, "CUTLASS models").
//
// Sources (../shared/spec/smem-and-tiles.md §2-3; CUTLASS headers under third_party/cutlass):
//   mainloop  gemm/collective/sm120_blockscaled_mma_array_tma.hpp, sm100_blockscaled_mma_array_warpspecialized.hpp
//   builders  gemm/collective/builders/sm120_blockscaled_mma_builder.inl, sm100_blockscaled_umma_builder.inl,
//             sm100_pipeline_carveout.inl
//   epilogue  epilogue/collective/sm90_epilogue_array_tma_warpspecialized.hpp (SM120 reuses it),
//             sm100_epilogue_array_tma_warpspecialized.hpp, builders/sm120_builder.inl, sm100_builder.inl
//   kernels   gemm/kernel/sm90_gemm_array_tma_warpspecialized_cooperative.hpp (SM120 grouped),
//             gemm/kernel/sm100_gemm_array_tma_warpspecialized.hpp
//
// Header-only constexpr (device-includable). Tested by tests/plan/test_cutlass_tables.cpp (the
// spec's tables, to the byte) and, with CUTLASS + nvcc, tests/plan/cutlass_check/ (sizeof of the
// real CUTLASS types against this model).
#pragma once

#include <cstdint>

#include "plan/smem_layout.h"

namespace fp4moe::plan {

// Operand formats of the block-scaled MMA. Bits are what the operand occupies in SMEM.
enum class OperandKind : uint8_t {
  kNvfp4,        // NVFP4 x NVFP4: e2m1 packed 4-bit, ue4m3 scale per 16 (MXF4_NVF4 instruction)
  kMxfp4,        // MXFP4 x MXFP4: e2m1 packed 4-bit, ue8m0 scale per 32 (auto schedule: MXF4_NVF4 too)
  kMxfp8Mxfp4,   // MXFP8 x MXFP4 (TRT-LLM WFP4AFP8): MXF4F6F8 instruction, FP4 padded to 1 byte in SMEM
};
FP4MOE_HD constexpr uint32_t operand_a_smem_bits(OperandKind o) { return o == OperandKind::kMxfp8Mxfp4 ? 8 : 4; }
FP4MOE_HD constexpr uint32_t operand_b_smem_bits(OperandKind o) { return o == OperandKind::kMxfp8Mxfp4 ? 8 : 4; }
// Activation bits as stored in global memory: the tile enum's K is in bytes of these.
FP4MOE_HD constexpr uint32_t operand_a_gmem_bits(OperandKind o) { return o == OperandKind::kMxfp8Mxfp4 ? 8 : 4; }
FP4MOE_HD constexpr uint32_t sf_vector_size(OperandKind o) { return o == OperandKind::kNvfp4 ? 16 : 32; }
inline const char* operand_name(OperandKind o) {
  return o == OperandKind::kNvfp4 ? "nvfp4" : o == OperandKind::kMxfp4 ? "mxfp4" : "mxfp8xmxfp4";
}

enum class EpilogueFusion : uint8_t {
  kNone,      // LinearCombination, bf16 C (SM120: ElementC = ElementD) / void C (SM100)
  kFinalize,  // TRT-LLM ScaledAcc{PerColBiasPerRowScale|PerRowBiasPerColScale}Scatter (GEMM2 only)
};
inline const char* fusion_name(EpilogueFusion f) { return f == EpilogueFusion::kNone ? "NONE" : "FINALIZE"; }

// The version-dependent parts of CUTLASS. Two presets: the pinned headers of this repo (4.2.0) and
// the commit FlashInfer pins (b46b16d, after the 4.4.2 carve-out fix), which the spec's tables use.
struct CutlassRules {
  const char* name = "";
  // SM120 builder subtracts scheduler pipeline + 2 tensor maps + tensormap-ready pipeline from the
  // capacity before dividing (v4.4.2 "carve-out fix"); before, it divided the raw 101376.
  bool sm120_capacity_carveout = false;
  // Per-stage barrier budget in the block-scaled stage_bytes: sizeof(PipelineTmaUmmaAsync<1>::
  // SharedStorage) = 16 B (4.2.0), rounded up to this alignment (b46b16d: 128).
  uint32_t stage_barrier_round = 1;
  // SFB sized for max(N,128) rows ("Small Tile N BlockScaled GEMM"). Without it, CUTLASS sizes SFB
  // for N/128*128 rows, i.e. zero rows when N < 128: such tiles are reported unsupported.
  bool small_n_sfb = false;
  // SM100 grouped kernel: copies of each TMA descriptor kept in SMEM (b46b16d: "five tensormaps"),
  // CLC responses (b46b16d: one for the TMA updater, one for the other warps), the
  // tensormap-ready pipeline, and the number of TMEM base pointers.
  uint32_t sm100_tensormap_copies = 1;
  uint32_t sm100_clc_responses = 1;
  bool sm100_tensormap_ready_pipeline = false;
  uint32_t sm100_tmem_base_ptrs = 1;
  // SM100 epilogue sub-tile N for a CTA tile N of 256 (4.2.0 EpilogueTileAuto: 128; b46b16d: 64).
  uint32_t sm100_n256_epi_tile_n = 128;
};

inline constexpr CutlassRules kCutlass420{"cutlass-4.2.0", false, 1, false, 1, 1, false, 1, 128};
inline constexpr CutlassRules kCutlassB46b16d{"cutlass-b46b16d", true, 128, true, 5, 2, true, 8, 64};
FP4MOE_HD constexpr CutlassRules without_capacity_carveout(CutlassRules r) {
  r.sm120_capacity_carveout = false;
  return r;
}

// One CUTLASS tile config. m, n, k are the CTA tile in elements in the kernel's own coordinates:
// with swap_ab the weights are the MMA's A operand (m) and tokens are n.
struct CutlassGroupedConfig {
  uint32_t m = 128, n = 128, k = 128;
  OperandKind operands = OperandKind::kNvfp4;
  EpilogueFusion epilogue = EpilogueFusion::kNone;
  bool swap_ab = false;
};

// Everything the planner needs about one config on one capacity.
struct CutlassGroupedModel {
  CutlassGroupedConfig config{};
  uint32_t stage_operand_bytes = 0;  // A + B + SFA + SFB of one stage
  uint32_t builder_stage_bytes = 0;  // stage_operand_bytes + barrier budget (what the builder divides by)
  uint32_t builder_capacity = 0;     // the capacity the builder divides (after any kernel carve-out)
  uint32_t epilogue_storage = 0;     // sizeof(CollectiveEpilogue::SharedStorage) = TRT-LLM's carveout
  int stages = 0;                    // what the builder picks
  int min_stages = 1;                // the mainloop's static_assert
  SmemLayout layout{};               // kernel SharedStorage at `stages` (valid when invalid_reason == nullptr)
  const char* invalid_reason = nullptr;  // the builder/mainloop cannot instantiate this config
  bool tile_ok = false;              // the tile shape itself is accepted (invalid only by stage count)
};

// ---------------------------------------------------------------------------------------------
// Shared pieces.

// Epilogue smem tile alignment (cutlass::detail::alignment_for_swizzle): the contiguous extent of
// one epilogue tile row picks the swizzle (32/64/128 B), which repeats every 8 rows.
FP4MOE_HD constexpr uint32_t epilogue_swizzle_align(uint32_t contiguous_bytes) {
  return contiguous_bytes >= 128 ? 1024 : contiguous_bytes >= 64 ? 512 : contiguous_bytes >= 32 ? 256 : 16;
}

struct EpilogueShape {
  uint32_t tile_m, tile_n;     // epilogue sub-tile
  uint32_t stages_c, stages_d;
  bool has_c;                  // ElementC non-void: C staging is allocated
  bool reuse_c;                // D reuses C's buffers (union)
  bool m_major;                // column-major C/D (swap_ab)
  uint32_t fusion_bytes;       // FusionCallbacks::SharedStorage (an empty struct still takes 1 byte)
  uint32_t n_d_descriptors;    // NumEpilogueWarpGroups D tensormaps (+1 for C)
};

// Appends CollectiveEpilogue::TensorStorage as regions; returns its alignment.
FP4MOE_HD constexpr uint32_t add_epilogue_tensors(SmemLayout& l, const EpilogueShape& e) {
  const uint32_t tile_bytes = e.tile_m * e.tile_n * 2;  // bf16 C/D
  const uint32_t align = epilogue_swizzle_align((e.m_major ? e.tile_m : e.tile_n) * 2);
  l.open_struct("epilogue TensorStorage padding", 1);
  if (!e.has_c) {
    l.add("epilogue smem_D", e.stages_d * tile_bytes, align, RegionKind::kEpilogue, true);
  } else if (e.reuse_c) {
    // union { smem_C[StagesC]; smem_D[StagesC] }: D uses C's StagesC buffers.
    l.add("epilogue smem_C/D (shared)", e.stages_c * tile_bytes, align, RegionKind::kEpilogue, true);
  } else {
    l.add("epilogue smem_C", e.stages_c * tile_bytes, align, RegionKind::kEpilogue, true);
    l.add("epilogue smem_D", e.stages_d * tile_bytes, align, RegionKind::kEpilogue, true);
  }
  l.add("epilogue fusion storage", e.fusion_bytes, 1, RegionKind::kEpilogue, true);
  return l.close_struct(true);
}

// sizeof(CollectiveEpilogue::SharedStorage): TensorStorage + TensorMapStorage (aligned 128)
// + PipelineStorage (the C-load PipelineTransactionAsync<StagesC>: full+empty barrier per stage).
FP4MOE_HD constexpr uint32_t epilogue_storage_bytes(const EpilogueShape& e) {
  SmemLayout l{};
  l.open_struct("", 1);
  add_epilogue_tensors(l, e);
  l.add("", (1 + e.n_d_descriptors) * kTmaDescriptorBytes, 128, RegionKind::kDescriptor);
  l.add("", e.stages_c * 2 * kMbarrierBytes, kMbarrierBytes, RegionKind::kBarrier);
  l.close_struct();
  return l.total_bytes;
}

// Per-stage operand bytes and the builder's stage_bytes (sm100_compute_stage_count_or_override_
// blockscaled, used by SM100 and SM120). SF atoms: Blk_MN = 128 rows x K/VS bytes (1 B per scale).
// SM100's SF atom always covers max(N,128) rows; SM120's did so only after the small-tile-N fix.
FP4MOE_HD constexpr uint32_t sf_rows_b(uint32_t n, const CutlassRules& r, bool sm100) {
  return sm100 || r.small_n_sfb ? max_u32(n, 128) : n / 128 * 128;
}
FP4MOE_HD constexpr uint32_t sf_rows_a(uint32_t m) { return max_u32(m, 128); }

struct StageBytes {
  uint32_t a, b, sfa, sfb;
  FP4MOE_HD constexpr uint32_t operands() const { return a + b + sfa + sfb; }
};
FP4MOE_HD constexpr StageBytes stage_bytes(const CutlassGroupedConfig& c, const CutlassRules& r, bool sm100) {
  const uint32_t vs = sf_vector_size(c.operands);
  return StageBytes{c.m * c.k * operand_a_smem_bits(c.operands) / 8, c.n * c.k * operand_b_smem_bits(c.operands) / 8,
                    sf_rows_a(c.m) * c.k / vs, sf_rows_b(c.n, r, sm100) * c.k / vs};
}
FP4MOE_HD constexpr uint32_t builder_stage_bytes(const CutlassGroupedConfig& c, const CutlassRules& r, bool sm100) {
  return stage_bytes(c, r, sm100).operands() + round_up(2 * kMbarrierBytes, r.stage_barrier_round);
}

// StageCountAutoCarveout as both block-scaled builders compute it: (capacity - carveout) / stage_bytes,
// 0 when the carve-out alone exceeds the capacity.
FP4MOE_HD constexpr int builder_stage_count(uint32_t capacity, uint32_t carveout, uint32_t stage_bytes) {
  return capacity > carveout ? static_cast<int>((capacity - carveout) / stage_bytes) : 0;
}

// Mainloop TensorStorage regions. SM120: smem_A/smem_B alignas(1024); SM100: aligned_struct<128>.
FP4MOE_HD constexpr void add_mainloop_tensors(SmemLayout& l, const StageBytes& s, int stages, uint32_t ab_align) {
  l.open_struct("mainloop TensorStorage padding", 128);
  l.add("mainloop smem_A", s.a * stages, ab_align, RegionKind::kStageOperand);
  l.add("mainloop smem_B", s.b * stages, ab_align, RegionKind::kStageOperand);
  l.add("mainloop smem_SFA", s.sfa * stages, 16, RegionKind::kStageOperand);
  l.add("mainloop smem_SFB", s.sfb * stages, 16, RegionKind::kStageOperand);
  l.close_struct();
}

// ---------------------------------------------------------------------------------------------
// SM120 / SM121 (RTX PRO 6000, RTX 5090, DGX Spark GB10).

inline constexpr uint32_t kSm120SmemCapacity = 101376;     // cutlass sm120_smem_capacity_bytes
inline constexpr uint32_t kSm120SchedulerStages = 8;       // GroupScheduler PipelineAsync<8> in the kernel
inline constexpr uint32_t kSm120BuilderSchedulerStages = 3;  // SchedulerPipelineStageCount in the builder
inline constexpr uint32_t kSm120EpilogueWarpGroups = 2;    // cooperative: 2 consumer warp groups, 1 D map each

// Epilogue as TRT-LLM builds it on SM120: EpilogueTileAuto = 64x32, StagesD = min(EpiTiles,2) = 2,
// ElementC = ElementD = bf16 so ReuseSmem = true and StagesC = max(2, StagesD+1) = 3 (NONE). With
// FINALIZE ElementD is void (output goes through the scatter fusion): no reuse, StagesC = StagesD = 2,
// and the fusion keeps one row-broadcast vector of the CTA's N extent in SMEM: the per-column bias
// (bf16) with swap_ab=0, the per-column router scale (fp32) with swap_ab=1. That vector is inferred
// (TRT-LLM's fusion is not in CUTLASS); any size from 1 to 512 B (1024 B swapped) gives the same
// totals, which the spec's probe pins: 13312 / 14336 / 17408 / 18432 B.
FP4MOE_HD constexpr EpilogueShape sm120_epilogue_shape(const CutlassGroupedConfig& c) {
  const bool fin = c.epilogue == EpilogueFusion::kFinalize;
  const uint32_t fusion = fin ? c.n * (c.swap_ab ? 4u : 2u) : 1u;
  return EpilogueShape{64, 32, fin ? 2u : 3u, 2, true, !fin, c.swap_ab, fusion, kSm120EpilogueWarpGroups};
}

// Capacity the SM120 builder divides: raw, or minus the kernel-level storage it knows about
// (v4.4.2: SchedulerPipelineStorage PipelineAsync<8> 128 + TensorMapStorage 2 x 128 +
// TensorMapReadyPipelineStorage PipelineAsync<3> 48 + CLCResponseStorage 0) = 100944.
FP4MOE_HD constexpr uint32_t sm120_builder_capacity(uint32_t capacity, const CutlassRules& r) {
  if (!r.sm120_capacity_carveout) return capacity;
  return capacity - kSm120SchedulerStages * 2 * kMbarrierBytes - 2 * kTmaDescriptorBytes -
         kSm120BuilderSchedulerStages * 2 * kMbarrierBytes;
}

// sizeof(GemmKernel::SharedStorage) of the SM120 grouped kernel (sm90_gemm_array_tma_warpspecialized_
// cooperative.hpp) at a given stage count:
//   TensorStorage (aligned_struct<128>) { mainloop TensorStorage; epilogue TensorStorage; }
//   PipelineStorage (aligned 16) { scheduler PipelineAsync<8>; mainloop PipelineTmaAsync<S>;
//                                  epi_load PipelineTransactionAsync<StagesC>; load_order OrderedSequenceBarrier<1,2> }
//   alignas(16) scheduler_response[8]  (PersistentTileSchedulerSm90Group::WorkTileInfo: 4 x int32)
//   TensorMapStorage (aligned 128) { mainloop: A, B, SFA, SFB maps; epilogue: C + 2 D maps }
FP4MOE_HD constexpr SmemLayout sm120_kernel_layout(const CutlassGroupedConfig& c, const CutlassRules& r, int stages) {
  const EpilogueShape e = sm120_epilogue_shape(c);
  SmemLayout l{};
  l.open_struct("SharedStorage tail padding", 1);
  l.open_struct("TensorStorage padding", 128);
  add_mainloop_tensors(l, stage_bytes(c, r, false), stages, kSwizzle128Align);
  add_epilogue_tensors(l, e);
  l.close_struct();
  l.open_struct("PipelineStorage padding", 16);
  l.add("scheduler pipeline (8 stages x full+empty)", kSm120SchedulerStages * 2 * kMbarrierBytes, 16, RegionKind::kBarrier);
  l.add("mainloop pipeline (full+empty per stage)", static_cast<uint32_t>(stages) * 2 * kMbarrierBytes, 16, RegionKind::kBarrier);
  l.add("epilogue load pipeline (full+empty per C stage)", e.stages_c * 2 * kMbarrierBytes, 16, RegionKind::kBarrier);
  l.add("load order barrier (1x2)", 2 * kMbarrierBytes, 16, RegionKind::kBarrier);
  l.close_struct();
  l.add("scheduler responses (8 x 16 B)", kSm120SchedulerStages * 16, 16, RegionKind::kScheduler);
  l.open_struct("TensorMapStorage padding", 128);
  l.add("mainloop TMA descriptors (A, B, SFA, SFB)", 4 * kTmaDescriptorBytes, 128, RegionKind::kDescriptor);
  l.add("epilogue TMA descriptors (C + 2 D)", (1 + e.n_d_descriptors) * kTmaDescriptorBytes, 128, RegionKind::kDescriptor);
  l.close_struct();
  l.close_struct();
  return l;
}

FP4MOE_HD constexpr CutlassGroupedModel model_cutlass_sm120(const CutlassGroupedConfig& c, const CutlassRules& r,
                                                            uint32_t capacity = kSm120SmemCapacity) {
  CutlassGroupedModel out{};
  out.config = c;
  out.min_stages = 2;  // static_assert(DispatchPolicy::Stages >= 2) in sm120_blockscaled_mma_array_tma.hpp
  const StageBytes s = stage_bytes(c, r, false);
  out.stage_operand_bytes = s.operands();
  out.builder_stage_bytes = builder_stage_bytes(c, r, false);
  out.builder_capacity = sm120_builder_capacity(capacity, r);
  out.epilogue_storage = epilogue_storage_bytes(sm120_epilogue_shape(c));
  if (c.n < 32 || c.n % 32 != 0 || c.m % 128 != 0 || c.k % 128 != 0) {
    out.invalid_reason = "tile shape not supported by the SM120 block-scaled builder (M multiple of 128, N >= 32, K multiple of 128)";
    return out;
  }
  if (sf_rows_b(c.n, r, false) == 0) {
    out.invalid_reason = "this CUTLASS sizes SFB for N/128*128 = 0 rows when N < 128 (needs the small-tile-N fix)";
    return out;
  }
  out.tile_ok = true;
  out.stages = builder_stage_count(out.builder_capacity, out.epilogue_storage, out.builder_stage_bytes);
  if (out.stages < out.min_stages) {
    out.invalid_reason = "the builder computes fewer than 2 stages; the SM120 mainloop static_asserts Stages >= 2";
    return out;
  }
  out.layout = sm120_kernel_layout(c, r, out.stages);
  return out;
}

// ---------------------------------------------------------------------------------------------
// SM100 / SM103 (B200, GB200, B300), 1-SM MMA, static 1x1x1 cluster, grouped (array) kernel.

inline constexpr uint32_t kSm100SmemCapacity = 232448;  // cutlass::arch::sm100_smem_capacity_bytes
inline constexpr uint32_t kSm100SchedulerStages = 8;    // SchedulerPipelineStageCount for grouped GEMM
inline constexpr uint32_t kSm100ClcResponseBytes = 16;  // sizeof(CLCResponse)

// Epilogue as TRT-LLM builds it on SM100: void C (no C staging), bf16 D, epilogue sub-tile
// M = min(CTA M, 32 x 4 warps) = 128, N = 4096 / M = 32 (EpilogueTileAuto, no source), or for a
// CTA N of 256 the rules' sub-tile; StagesD = 2. FINALIZE adds the same row-broadcast vector as SM120.
FP4MOE_HD constexpr EpilogueShape sm100_epilogue_shape(const CutlassGroupedConfig& c, const CutlassRules& r) {
  const bool fin = c.epilogue == EpilogueFusion::kFinalize;
  const uint32_t tile_m = min_u32(c.m, 128);
  const uint32_t tile_n = c.n == 256 ? r.sm100_n256_epi_tile_n : min_u32(c.n, 4096 / tile_m);
  const uint32_t fusion = fin ? c.n * (c.swap_ab ? 4u : 2u) : 1u;
  return EpilogueShape{tile_m, tile_n, 1, 2, false, false, c.swap_ab, fusion, 1};
}

FP4MOE_HD constexpr uint32_t sm100_accumulator_stages(const CutlassGroupedConfig& c) { return c.n == 256 ? 1 : 2; }

// Sm100DenseGemmTmaUmmaCarveout for a grouped GEMM (sm100_pipeline_carveout.inl): every
// kernel-level member of SharedStorage, summed without padding.
FP4MOE_HD constexpr uint32_t sm100_kernel_carveout(const CutlassGroupedConfig& c, const CutlassRules& r) {
  const uint32_t pipe8 = kSm100SchedulerStages * 2 * kMbarrierBytes;  // PipelineAsync<8> / CLC fetch <8>
  return sm100_accumulator_stages(c) * 2 * kMbarrierBytes       // AccumulatorPipeline
         + pipe8 * r.sm100_clc_responses                           // CLCPipeline (one per CLC response)
         + 2 * kMbarrierBytes                                      // LoadOrderBarrier <1,2>
         + kMbarrierBytes                                          // TmemDealloc barrier
         + pipe8                                                   // CLCThrottlePipeline
         + kSm100SchedulerStages * kSm100ClcResponseBytes * r.sm100_clc_responses  // CLC responses
         + kSm100SchedulerStages * 4                               // TmemBasePtrsStorage (counted per scheduler stage)
         + 4 * kTmaDescriptorBytes * r.sm100_tensormap_copies      // A, SFA, B, SFB maps
         + (r.sm100_tensormap_ready_pipeline ? pipe8 : 0);         // TensorMapReady pipeline
}

// sizeof(GemmKernel::SharedStorage) of sm100_gemm_array_tma_warpspecialized.hpp:
//   PipelineStorage (aligned 16) { mainloop, epi_load, load_order, clc (x responses), accumulator,
//                                  clc_throttle, tmem_dealloc [, tensormap_ready] }
//   alignas(16) clc_response[8 x responses]; tmem_base_ptr(s)
//   TensorMapStorage (aligned 128) { epilogue C+D maps, mainloop 4 maps } x tensormap copies
//   TensorStorage (aligned 128) { epilogue TensorStorage; mainloop TensorStorage }
// The b46b16d terms (5 descriptor copies, 2 CLC responses, tensormap-ready pipeline, 8 TMEM
// pointers) come from its Sm100DenseGemmTmaUmmaCarveout; their placement follows 4.2.0's struct.
FP4MOE_HD constexpr SmemLayout sm100_kernel_layout(const CutlassGroupedConfig& c, const CutlassRules& r, int stages) {
  const EpilogueShape e = sm100_epilogue_shape(c, r);
  const uint32_t pipe8 = kSm100SchedulerStages * 2 * kMbarrierBytes;
  SmemLayout l{};
  l.open_struct("SharedStorage tail padding", 1);
  l.open_struct("PipelineStorage padding", 16);
  l.add("mainloop pipeline (full+empty per stage)", static_cast<uint32_t>(stages) * 2 * kMbarrierBytes, 16, RegionKind::kBarrier);
  l.add("epilogue load pipeline", e.stages_c * 2 * kMbarrierBytes, 16, RegionKind::kBarrier);
  l.add("load order barrier (1x2)", 2 * kMbarrierBytes, 16, RegionKind::kBarrier);
  l.add("CLC pipeline(s) (8 stages)", pipe8 * r.sm100_clc_responses, 16, RegionKind::kBarrier);
  l.add("accumulator pipeline", sm100_accumulator_stages(c) * 2 * kMbarrierBytes, 16, RegionKind::kBarrier);
  l.add("CLC throttle pipeline (8 stages)", pipe8, 16, RegionKind::kBarrier);
  l.add("TMEM dealloc barrier", kMbarrierBytes, 16, RegionKind::kBarrier);
  if (r.sm100_tensormap_ready_pipeline) l.add("tensormap ready pipeline (8 stages)", pipe8, 16, RegionKind::kBarrier);
  l.close_struct();
  l.add("CLC responses", kSm100SchedulerStages * kSm100ClcResponseBytes * r.sm100_clc_responses, 16, RegionKind::kScheduler);
  l.add("TMEM base pointer(s)", 4 * r.sm100_tmem_base_ptrs, 4, RegionKind::kScheduler);
  l.open_struct("TensorMapStorage padding", 128);
  l.add("epilogue TMA descriptors (C, D)", (1 + e.n_d_descriptors) * kTmaDescriptorBytes * r.sm100_tensormap_copies, 128,
        RegionKind::kDescriptor);
  l.add("mainloop TMA descriptors (A, B, SFA, SFB)", 4 * kTmaDescriptorBytes * r.sm100_tensormap_copies, 128,
        RegionKind::kDescriptor);
  l.close_struct();
  l.open_struct("TensorStorage padding", 128);
  add_epilogue_tensors(l, e);
  add_mainloop_tensors(l, stage_bytes(c, r, true), stages, 128);
  l.close_struct();
  l.close_struct();
  return l;
}

FP4MOE_HD constexpr CutlassGroupedModel model_cutlass_sm100(const CutlassGroupedConfig& c, const CutlassRules& r,
                                                            uint32_t capacity = kSm100SmemCapacity) {
  CutlassGroupedModel out{};
  out.config = c;
  out.min_stages = 1;  // static_assert(PipelineStages > 0) in sm100_blockscaled_umma_builder.inl
  const StageBytes s = stage_bytes(c, r, true);
  out.stage_operand_bytes = s.operands();
  out.builder_stage_bytes = builder_stage_bytes(c, r, true);
  out.builder_capacity = capacity - sm100_kernel_carveout(c, r);
  out.epilogue_storage = epilogue_storage_bytes(sm100_epilogue_shape(c, r));
  if (c.m != 128 || c.n < 64 || c.n > 256 || c.n % 64 != 0 || c.k % 128 != 0) {
    out.invalid_reason = "tile shape not supported by the SM100 1-SM block-scaled builder (M = 128, N in 64..256 step 64)";
    return out;
  }
  out.tile_ok = true;
  out.stages = builder_stage_count(out.builder_capacity, out.epilogue_storage, out.builder_stage_bytes);
  if (out.stages < out.min_stages) {
    out.invalid_reason = "the builder computes 0 stages (static_assert PipelineStages > 0)";
    return out;
  }
  out.layout = sm100_kernel_layout(c, r, out.stages);
  return out;
}

}  // namespace fp4moe::plan
