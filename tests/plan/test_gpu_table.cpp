// The GPU table: names and arch lookups, the capacities the spec pins, and the runtime override
// (merge_runtime with a fabricated runtime report; query_runtime_gpu without a GPU).
#include <gtest/gtest.h>

#include "core/error.h"
#include "plan/gpu_table.h"
#include "plan/smem_layout.h"

namespace fp4moe::plan {
namespace {

TEST(GpuTable, ProductNames) {
  for (const char* name : {"h100", "h200", "b200", "gb200", "b300", "rtx-pro-6000", "rtx-5090", "dgx-spark", "gb10", "a100",
                           "rtx-4090", "l40s", "H200", "rtx_pro_6000"}) {
    EXPECT_TRUE(find_gpu(name).has_value()) << name;
  }
  EXPECT_EQ(find_gpu("dgx-spark")->name, "gb10");
  EXPECT_FALSE(find_gpu("h300").has_value());
  EXPECT_FALSE(find_gpu("sm_99999999999").has_value());  // past int: was std::stoi's out_of_range, "stoi"
  try {
    require_gpu("h300");
    FAIL() << "require_gpu accepted h300";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("unknown GPU 'h300'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("rtx-pro-6000"), std::string::npos) << e.what();
  }
}

TEST(GpuTable, ArchNames) {
  EXPECT_EQ(find_gpu("sm_90")->sm, 90);
  EXPECT_EQ(find_gpu("sm120")->sm, 120);
  EXPECT_EQ(find_gpu("sm_121")->name, "gb10");
  EXPECT_EQ(find_gpu("sm_103")->name, "b300");
  EXPECT_EQ(find_gpu("sm_86")->sm, 86);
  EXPECT_EQ(find_gpu("sm_89")->sm, 89);
  // nvcc's arch-specific names (what `fp4moe version` prints for the build) are the chip's.
  EXPECT_EQ(find_gpu("sm_90a")->sm, 90);
  EXPECT_EQ(find_gpu("SM_100A")->sm, 100);
  EXPECT_EQ(find_gpu("sm_120f")->sm, 120);
  EXPECT_FALSE(find_gpu("sm_90b").has_value());
  EXPECT_FALSE(find_gpu("a").has_value());
  EXPECT_EQ(find_gpu("sm_80")->name, "a100");
  EXPECT_FALSE(find_gpu("sm_75").has_value());
}

TEST(GpuTable, CapacitiesFromTheSpec) {
  // §1: opt-in = per-SM - 1 KiB; reserved 1024 for cc >= 8.0.
  EXPECT_EQ(require_gpu("a100").smem_optin_per_block, 166912u);
  EXPECT_EQ(require_gpu("rtx-4090").smem_optin_per_block, 101376u);
  EXPECT_EQ(require_gpu("h200").smem_optin_per_block, 232448u);
  EXPECT_EQ(require_gpu("h200").smem_per_sm, 233472u);
  for (const char* n : {"h100", "h200"}) {  // smem_layout.h's compile-time copy of the sm_90 rows
    EXPECT_EQ(require_gpu(n).smem_per_sm, kSm90SmemPerSmBytes) << n;
    EXPECT_EQ(require_gpu(n).smem_reserved_per_block, kSm90SmemReservedPerCtaBytes) << n;
  }
  EXPECT_EQ(require_gpu("b200").smem_optin_per_block, 232448u);
  EXPECT_EQ(require_gpu("b300").smem_optin_per_block, 232448u);
  for (const char* n : {"rtx-pro-6000", "rtx-5090", "gb10"}) {
    EXPECT_EQ(require_gpu(n).smem_optin_per_block, 101376u) << n;
    EXPECT_EQ(require_gpu(n).smem_per_sm, 102400u) << n;
  }
  for (const GpuSpec& g : gpu_table()) {
    EXPECT_EQ(g.smem_per_sm - g.smem_optin_per_block, 1024u) << g.name;
    EXPECT_EQ(g.smem_reserved_per_block, 1024u) << g.name;
    EXPECT_GT(g.n_sms, 0) << g.name;
    EXPECT_GT(g.hbm_gbps, 0) << g.name;
    EXPECT_FALSE(g.source.empty()) << g.name;
  }
}

TEST(GpuTable, Features) {
  EXPECT_TRUE(require_gpu("h200").has(kWgmma));
  EXPECT_FALSE(require_gpu("h200").has(kBlockScaledFp4));
  EXPECT_TRUE(require_gpu("b200").has(kTcgen05));
  EXPECT_TRUE(require_gpu("rtx-pro-6000").has(kBlockScaledFp4));
  EXPECT_FALSE(require_gpu("rtx-pro-6000").has(kTcgen05));
  EXPECT_FALSE(require_gpu("rtx-pro-6000").has(kWgmma));
  EXPECT_EQ(require_gpu("h200").features_string(), "mma.sync wgmma tma fp8");
}

TEST(GpuTable, RuntimeOverridesAndReportsDisagreements) {
  RuntimeGpu rt;
  rt.name = "NVIDIA RTX PRO 6000 Blackwell Workstation Edition";
  rt.sm = 120;
  rt.smem_per_sm = 102400;
  rt.smem_optin_per_block = 99328;  // a driver reporting less than the table
  rt.smem_reserved_per_block = 1024;
  rt.smem_default_per_block = 49152;
  rt.n_sms = 188;
  const ResolvedGpu r = resolve_runtime_gpu(rt);
  EXPECT_EQ(r.spec.name, "rtx-pro-6000");
  EXPECT_TRUE(r.from_runtime);
  EXPECT_EQ(r.spec.smem_optin_per_block, 99328u);
  ASSERT_EQ(r.disagreements.size(), 1u);
  EXPECT_EQ(r.disagreements[0], "smem_optin_per_block: table 101376, runtime 99328 (using the runtime's)");

  RuntimeGpu h = rt;
  h.name = "NVIDIA H200";
  h.sm = 90;
  h.smem_per_sm = 233472;
  h.smem_optin_per_block = 232448;
  h.n_sms = 132;
  const ResolvedGpu hr = resolve_runtime_gpu(h);
  EXPECT_EQ(hr.spec.name, "h200");
  EXPECT_TRUE(hr.disagreements.empty());

  RuntimeGpu gb = h;
  gb.name = "NVIDIA GB200";
  gb.sm = 100;
  gb.n_sms = 148;
  EXPECT_EQ(resolve_runtime_gpu(gb).spec.name, "gb200");  // longest match, not "b200"
}

TEST(GpuTable, QueryRuntimeSaysWhy) {
  std::string why;
  const auto rt = query_runtime_gpu(0, &why);
#if defined(FP4MOE_HAVE_CUDA)
  if (!rt) {
    EXPECT_NE(why.find("no GPU"), std::string::npos) << why;
  }
#else
  EXPECT_FALSE(rt.has_value());
  EXPECT_EQ(why, "no GPU: fp4moe was built without CUDA");
#endif
}

}  // namespace
}  // namespace fp4moe::plan
