// --device and the CUDA graph options (tools/device_option.h): cpu leaves the CPU path, cuda sets the
// device, the GPU sizes and the graph batch limit
// (and registers the GPU models, so a GLM-4.5 architecture gains a GPU factory while GLM-5 still has
// none), anything else fails naming the value. No GPU needed: nothing is loaded.
#include <gtest/gtest.h>

#include <CLI/CLI.hpp>

#include <string>

#include "core/error.h"
#include "model/registry.h"
#include "tools/device_option.h"

namespace fp4moe::tools {
namespace {

DeviceArgs on(const std::string& device, int64_t graph_max_bs = 256, bool disable_graph = false,
              int64_t split_min_keys = 32, bool time_moe_gemms = false) {
  return DeviceArgs{device, graph_max_bs, disable_graph, split_min_keys, time_moe_gemms};
}

TEST(DeviceOption, CpuCudaAndBadValues) {
  model::LoadOptions o;
  apply_device_option(on("cpu"), 100, 200, 16, o);
  EXPECT_EQ(o.device, model::Device::kCpu);
  try {
    apply_device_option(on("gpu"), 100, 200, 16, o);
    FAIL() << "--device gpu accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("device \"gpu\" is not one of: cpu, cuda"), std::string::npos) << e.what();
  }
  // GEMM timing on the cpu (no GPU GEMMs to time) was taken and ignored.
  try {
    apply_device_option(on("cpu", 256, false, 32, /*time_moe_gemms=*/true), 100, 200, 16, o);
    FAIL() << "--time-moe-gemms on the cpu accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--time-moe-gemms times the GPU MoE layers' GEMMs: it needs --device cuda "
                                         "(not cpu)"),
              std::string::npos)
        << e.what();
  }
#ifdef FP4MOE_HAVE_CUDA
  apply_device_option(on("cuda", 48), 4112, 32768, 32, o);
  EXPECT_EQ(o.device, model::Device::kCuda);
  EXPECT_EQ(o.gpu.max_tokens_per_step, 4112);
  EXPECT_EQ(o.gpu.kv_tokens, 32768);
  EXPECT_EQ(o.gpu.page_size, 32);
  EXPECT_EQ(o.gpu.cuda_graph_max_bs, 48);
  EXPECT_EQ(std::string(model::to_string(o.device)), "cuda");
  EXPECT_EQ(o.gpu.decode_split_min_keys, 32);
  EXPECT_FALSE(o.gpu.time_moe_gemms);  // off unless asked: the events cost step time
  apply_device_option(on("cuda", 48, /*disable_graph=*/true, 256, /*time_moe_gemms=*/true), 4112, 32768, 32, o);
  EXPECT_EQ(o.gpu.cuda_graph_max_bs, 0);
  EXPECT_EQ(o.gpu.decode_split_min_keys, 256);
  EXPECT_TRUE(o.gpu.time_moe_gemms);
#else
  EXPECT_THROW(apply_device_option(on("cuda"), 1, 1, 16, o), Error);
#endif
}

TEST(DeviceOption, CudaGraphFlagsParseAndNegativeMaxBsFails) {
  CLI::App app;
  DeviceArgs a;
  add_device_options(app, a);
  EXPECT_FALSE(a.time_moe_gemms);
  app.parse("--cuda-graph-max-bs 64 --device cuda --decode-split-min-keys 128 --time-moe-gemms",
            /*program_name_included=*/false);
  EXPECT_EQ(a.device, "cuda");
  EXPECT_EQ(a.cuda_graph_max_bs, 64);
  EXPECT_FALSE(a.disable_cuda_graph);
  EXPECT_EQ(a.decode_split_min_keys, 128);
  EXPECT_TRUE(a.time_moe_gemms);
  model::LoadOptions o;
  try {
    apply_device_option(on("cuda", 8, false, 0), 100, 200, 16, o);
    FAIL() << "--decode-split-min-keys 0 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--decode-split-min-keys 0 must be >= 1"), std::string::npos) << e.what();
  }
  try {
    apply_device_option(on("cuda", -1), 100, 200, 16, o);
    FAIL() << "--cuda-graph-max-bs -1 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--cuda-graph-max-bs -1 must be >= 0"), std::string::npos) << e.what();
  }
  // On the cpu too (which does not read them): a bad value was taken there and refused only with --device cuda.
  EXPECT_THROW(apply_device_option(on("cpu", -3), 100, 200, 16, o), Error);
  EXPECT_THROW(apply_device_option(on("cpu", 8, false, 0), 100, 200, 16, o), Error);
}

}  // namespace
}  // namespace fp4moe::tools
