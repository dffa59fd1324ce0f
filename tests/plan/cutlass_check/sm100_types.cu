// CUTLASS's SM100 block-scaled grouped GEMM types (1-SM NVF4 schedule, static 1x1x1 cluster,
// void C as TRT-LLM uses on SM100, bf16 D) for FlashInfer's FP4 tiles 128x{64,128,256}x256.
#include "probe.cuh"

namespace fp4moe::plan::cutlass_check {
namespace {
using namespace cute;
using Nvf4 = cutlass::nv_float4_t<cutlass::float_e2m1_t>;
template <class Tile>
using Nv = GroupedGemm<cutlass::arch::Sm100, Nvf4, Nvf4, Tile, cutlass::epilogue::PtrArrayTmaWarpSpecialized1Sm,
                       cutlass::gemm::KernelPtrArrayTmaWarpSpecialized1SmNvf4Sm100, cutlass::layout::RowMajor, void, 32>;
}  // namespace

std::vector<Measured> measure_sm100() {
  return {
      Nv<Shape<_128, _64, _256>>::measure("sm100 128x64x256 nvfp4 NONE swap_ab=0", false, false),
      Nv<Shape<_128, _128, _256>>::measure("sm100 128x128x256 nvfp4 NONE swap_ab=0", false, false),
      Nv<Shape<_128, _256, _256>>::measure("sm100 128x256x256 nvfp4 NONE swap_ab=0", false, false),
  };
}

}  // namespace fp4moe::plan::cutlass_check
