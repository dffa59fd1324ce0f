// The grouped block-scaled GEMM type chain as TRT-LLM's moe_gemm_tma_ws_launcher.inl builds it
// (GroupProblemShape, pointer-array layouts, epilogue builder first, StageCountAutoCarveout of
// sizeof(CollectiveEpilogue::SharedStorage), then GemmUniversal), written for this check. Only
// sizes and constants are read; nothing is launched. Included by sm120_types.cu / sm100_types.cu.
#pragma once

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/detail/sm100_blockscaled_layout.hpp"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/group_array_problem_shape.hpp"
#include "cutlass/gemm/kernel/gemm_universal.hpp"

#include "measured.h"

namespace fp4moe::plan::cutlass_check {

using ProblemShape = cutlass::gemm::GroupProblemShape<cute::Shape<int, int, int>>;

template <class Arch, class ElementA, class ElementB, class Tile, class EpiSchedule, class KernelSchedule, class LayoutCD,
          class ElementC, int AlignAB>
struct GroupedGemm {
  using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      Arch, cutlass::arch::OpClassBlockScaledTensorOp, Tile, cute::Shape<cute::_1, cute::_1, cute::_1>,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float, ElementC, LayoutCD*, 8, cutlass::bfloat16_t, LayoutCD*, 8,
      EpiSchedule>::CollectiveOp;
  using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      Arch, cutlass::arch::OpClassBlockScaledTensorOp, ElementA, cutlass::layout::RowMajor*, AlignAB, ElementB,
      cutlass::layout::ColumnMajor*, AlignAB, float, Tile, cute::Shape<cute::_1, cute::_1, cute::_1>,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(sizeof(typename Epilogue::SharedStorage))>,
      KernelSchedule>::CollectiveOp;
  using Kernel = cutlass::gemm::kernel::GemmUniversal<ProblemShape, Mainloop, Epilogue>;

  static Measured measure(const char* name, bool mx, bool swap_ab) {
    return Measured{name,
                    static_cast<uint32_t>(cute::size<0>(Tile{})),
                    static_cast<uint32_t>(cute::size<1>(Tile{})),
                    static_cast<uint32_t>(cute::size<2>(Tile{})),
                    mx,
                    swap_ab,
                    static_cast<uint32_t>(sizeof(typename Epilogue::SharedStorage)),
                    Mainloop::DispatchPolicy::Stages,
                    static_cast<uint32_t>(Kernel::SharedStorageSize)};
  }
};

}  // namespace fp4moe::plan::cutlass_check
