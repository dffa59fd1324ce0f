// Checks the structural CUTLASS model (src/plan/layout_cutlass.h, rules kCutlass420) against
// CUTLASS 4.2.0's own types: sizeof(CollectiveEpilogue::SharedStorage), the builder's stage
// count and GemmKernel::SharedStorageSize, for the SM120 and SM100 block-scaled grouped GEMMs.
// Built only with nvcc and the CUTLASS headers (FP4MOE_CUTLASS_INCLUDE); see tests/plan/CMakeLists.txt.
#include <gtest/gtest.h>

#include "measured.h"
#include "plan/layout_cutlass.h"
#include "plan/layout_sm90_w4a16.h"

namespace fp4moe::plan::cutlass_check {
namespace {

void check(const std::vector<Measured>& all, bool sm100) {
  ASSERT_FALSE(all.empty());
  for (const Measured& m : all) {
    const CutlassGroupedConfig c{m.m, m.n, m.k, m.mx ? OperandKind::kMxfp8Mxfp4 : OperandKind::kNvfp4, EpilogueFusion::kNone,
                                 m.swap_ab};
    const CutlassGroupedModel model = sm100 ? model_cutlass_sm100(c, kCutlass420) : model_cutlass_sm120(c, kCutlass420);
    ASSERT_EQ(model.invalid_reason, nullptr) << m.name << ": " << model.invalid_reason;
    EXPECT_EQ(model.epilogue_storage, m.epilogue_storage) << m.name << ": epilogue SharedStorage";
    EXPECT_EQ(model.stages, m.stages) << m.name << ": builder stages";
    EXPECT_EQ(model.layout.total_bytes, m.kernel_storage) << m.name << ": kernel SharedStorageSize";
  }
}

TEST(CutlassCheck, Sm120MatchesCutlassTypes) { check(measure_sm120(), false); }
TEST(CutlassCheck, Sm100MatchesCutlassTypes) { check(measure_sm100(), true); }

TEST(CutlassCheck, LayoutHeadersCompileForTheDevice) {
  // swap-AB 128 weights x 16 tokens x K 128, 8 stages: x 4096 at 0, w 8192 at 4096, scales 1024
  // at 12288 -> stride 13312; 8 stages = 106496, then w_dequant.
  uint32_t got[4];
  layout_device_offsets(got);
  EXPECT_EQ(got[0], 13312u);
  EXPECT_EQ(got[1], 2 * 13312u + 12288u);
  EXPECT_EQ(got[3], 8 * 13312u);
  EXPECT_EQ(got[2], Sm90W4A16Layout::make({128, 16, 128, 0, true}).total_bytes());
}

}  // namespace
}  // namespace fp4moe::plan::cutlass_check
