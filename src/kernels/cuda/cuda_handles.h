// Deleters for owning CUDA streams and events with std::unique_ptr<CUstream_st, StreamDeleter> /
// std::unique_ptr<CUevent_st, EventDeleter> (the GPU models' step streams and layer events, the GPU
// MoE layer's row-class side stream). Header-only.
#pragma once

#include <cuda_runtime_api.h>

namespace fp4moe::cuda {

struct StreamDeleter {
  void operator()(CUstream_st* s) const { cudaStreamDestroy(s); }
};
struct EventDeleter {
  void operator()(CUevent_st* e) const { cudaEventDestroy(e); }
};

}  // namespace fp4moe::cuda
