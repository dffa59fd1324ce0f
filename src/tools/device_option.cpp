// --device (see device_option.h).
#include "tools/device_option.h"

#include "core/error.h"
#ifdef FP4MOE_HAVE_CUDA
#include "model/cuda/gpu_models.h"
#endif

namespace fp4moe::tools {

void apply_device_option(const std::string& device, int64_t max_tokens_per_step, int64_t kv_tokens,
                         int64_t page_size, model::LoadOptions& options) {
  options.device = model::parse_device(device);
  if (options.device == model::Device::kCpu) return;
#ifdef FP4MOE_HAVE_CUDA
  model::register_gpu_models();
  options.gpu.max_tokens_per_step = max_tokens_per_step;
  options.gpu.kv_tokens = kv_tokens;
  options.gpu.page_size = page_size;
#else
  (void)max_tokens_per_step;
  (void)kv_tokens;
  (void)page_size;
  FP4MOE_FAIL() << "--device cuda: this fp4moe was built without CUDA (configure with the CUDA toolkit)";
#endif
}

}  // namespace fp4moe::tools
