// check_serve_parallel: validate --tp-size / --ep-size and refuse multi-GPU serving until the GPU
// model forward exists. See serve_parallel.h. Tested by tests/dist/test_sharding.cpp.
#include "dist/serve_parallel.h"

#include "core/error.h"
#include "dist/sharding.h"

#ifdef FP4MOE_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace fp4moe::dist {

std::string visible_gpus_description() {
#ifdef FP4MOE_HAVE_CUDA
  int n = 0;
  const cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess) {
    return std::string("cudaGetDeviceCount failed: ") + cudaGetErrorName(err) + " (" + cudaGetErrorString(err) + ")";
  }
  return std::to_string(n) + " CUDA device" + (n == 1 ? "" : "s") + " visible";
#else
  return "CUDA not built into this binary";
#endif
}

void check_serve_parallel(int tp_size, int ep_size) {
  const ParallelConfig p = ParallelConfig::make(tp_size, ep_size);  // throws naming bad sizes
  FP4MOE_CHECK(p.tp_size == 1 && p.ep_size == 1)
      << "--tp-size " << tp_size << " --ep-size " << ep_size
      << ": multi-GPU serving (one process per GPU over NCCL) needs the GPU model forward (issue #7) and "
      << tp_size << " GPUs (" << visible_gpus_description()
      << "); this build serves on one device only, so use --tp-size 1 --ep-size 1";
}

}  // namespace fp4moe::dist
