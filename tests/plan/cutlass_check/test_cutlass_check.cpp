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
  // w4a16_swapab_m128n16k256_s4: x 8192 at 0, w 16384 at 8192, scales 2048 at 24576 -> stride
  // 26624; 4 stages = 106496, then the epilogue 16 x 272 = 4352 -> 110848 B.
  uint32_t got[4];
  layout_device_offsets(got);
  EXPECT_EQ(got[0], 26624u);
  EXPECT_EQ(got[1], 2 * 26624u + 24576u);
  EXPECT_EQ(got[3], 4 * 26624u);
  EXPECT_EQ(got[2], W4A16Layout::make(kW4A16Configs[7]).total_bytes());  // w4a16_swapab_m128n16k256_s4
  EXPECT_EQ(got[2], 110848u);
}

}  // namespace
}  // namespace fp4moe::plan::cutlass_check
