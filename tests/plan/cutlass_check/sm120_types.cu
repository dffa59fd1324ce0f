// CUTLASS's SM120 block-scaled grouped GEMM types for the spec's tiles (NVFP4 x NVFP4 and
// MXFP8 x MXFP4, LinearCombination epilogue with bf16 C = D, swap_ab via column-major C/D).
// CUTLASS 4.2.0 has no FINALIZE fusion (TRT-LLM's ScaledAcc...Scatter lives in TRT-LLM) and sizes
// SFB for N/128*128 rows, so N < 128 tiles are not instantiated here (see docs/planner.md).
#include "probe.cuh"

namespace fp4moe::plan::cutlass_check {
namespace {
using namespace cute;
using Nvf4 = cutlass::nv_float4_t<cutlass::float_e2m1_t>;
using Mxf8 = cutlass::mx_float8_t<cutlass::float_e4m3_t>;
using Mxf4 = cutlass::mx_float4_t<cutlass::float_e2m1_t>;
using EpiCoop = cutlass::epilogue::PtrArrayTmaWarpSpecializedCooperative;
using KCoop = cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperative;
using Row = cutlass::layout::RowMajor;
using Col = cutlass::layout::ColumnMajor;
using Bf16 = cutlass::bfloat16_t;

template <class Tile, class LayoutCD>
using Nv = GroupedGemm<cutlass::arch::Sm120, Nvf4, Nvf4, Tile, EpiCoop, KCoop, LayoutCD, Bf16, 32>;
}  // namespace

std::vector<Measured> measure_sm120() {
  return {
      Nv<Shape<_128, _128, _128>, Row>::measure("sm120 128x128x128 nvfp4 NONE swap_ab=0", false, false),
      Nv<Shape<_128, _128, _128>, Col>::measure("sm120 128x128x128 nvfp4 NONE swap_ab=1", false, true),
      Nv<Shape<_128, _128, _256>, Row>::measure("sm120 128x128x256 nvfp4 NONE swap_ab=0", false, false),
      Nv<Shape<_128, _256, _128>, Row>::measure("sm120 128x256x128 nvfp4 NONE swap_ab=0", false, false),
      Nv<Shape<_256, _128, _128>, Row>::measure("sm120 256x128x128 nvfp4 NONE swap_ab=0", false, false),
      GroupedGemm<cutlass::arch::Sm120, Mxf8, Mxf4, Shape<_128, _128, _128>, EpiCoop, KCoop, Row, Bf16, 128>::measure(
          "sm120 128x128x128 mxfp8xmxfp4 NONE swap_ab=0", true, false),
  };
}

}  // namespace fp4moe::plan::cutlass_check
