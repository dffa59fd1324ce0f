// --device (tools/device_option.h): cpu leaves the CPU path, cuda sets the device and the GPU sizes
// (and registers the GPU models, so a GLM-4.5 architecture gains a GPU factory while GLM-5 still has
// none), anything else fails naming the value. No GPU needed: nothing is loaded.
#include <gtest/gtest.h>

#include <string>

#include "core/error.h"
#include "model/registry.h"
#include "tools/device_option.h"

namespace fp4moe::tools {
namespace {

TEST(DeviceOption, CpuCudaAndBadValues) {
  model::LoadOptions o;
  apply_device_option("cpu", 100, 200, 16, o);
  EXPECT_EQ(o.device, model::Device::kCpu);
  try {
    apply_device_option("gpu", 100, 200, 16, o);
    FAIL() << "--device gpu accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("device \"gpu\" is not one of: cpu, cuda"), std::string::npos) << e.what();
  }
#ifdef FP4MOE_HAVE_CUDA
  apply_device_option("cuda", 4112, 32768, 32, o);
  EXPECT_EQ(o.device, model::Device::kCuda);
  EXPECT_EQ(o.gpu.max_tokens_per_step, 4112);
  EXPECT_EQ(o.gpu.kv_tokens, 32768);
  EXPECT_EQ(o.gpu.page_size, 32);
  EXPECT_EQ(std::string(model::to_string(o.device)), "cuda");
#else
  EXPECT_THROW(apply_device_option("cuda", 1, 1, 16, o), Error);
#endif
}

}  // namespace
}  // namespace fp4moe::tools
