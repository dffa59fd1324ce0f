// Deleters for owning CUDA streams and events with std::unique_ptr<CUstream_st, StreamDeleter> /
// std::unique_ptr<CUevent_st, EventDeleter> (the GPU models' step streams and layer events), and
// SideStream, a second stream that work forks onto and joins back from (the GPU MoE layer's row-class
// and shared-expert launches, the GLM-5 model's latent branch). Header-only.
#pragma once

#include <cuda_runtime_api.h>

#include <memory>

#include "kernels/cuda/cuda_check.h"

namespace fp4moe::cuda {

struct StreamDeleter {
  void operator()(CUstream_st* s) const { cudaStreamDestroy(s); }
};
struct EventDeleter {
  void operator()(CUevent_st* e) const { cudaEventDestroy(e); }
};

// A non-blocking stream beside a caller's, ordered against it by two events without timing:
// fork(from) makes it wait for all that was issued to `from` so far and returns it; join(into) makes
// `into` wait for all that was issued to it so far. Capturable: inside a stream capture the side
// stream's work becomes a forked branch of the graph, joined back before the capture ends.
class SideStream {
 public:
  SideStream() {
    cudaStream_t s = nullptr;
    FP4MOE_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    stream_.reset(s);
    for (auto* ev : {&fork_, &join_}) {
      cudaEvent_t e = nullptr;
      FP4MOE_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
      ev->reset(e);
    }
  }
  cudaStream_t fork(cudaStream_t from) {
    FP4MOE_CUDA_CHECK(cudaEventRecord(fork_.get(), from));
    FP4MOE_CUDA_CHECK(cudaStreamWaitEvent(stream_.get(), fork_.get(), 0));
    return stream_.get();
  }
  void join(cudaStream_t into) {
    FP4MOE_CUDA_CHECK(cudaEventRecord(join_.get(), stream_.get()));
    FP4MOE_CUDA_CHECK(cudaStreamWaitEvent(into, join_.get(), 0));
  }

 private:
  std::unique_ptr<CUstream_st, StreamDeleter> stream_;
  std::unique_ptr<CUevent_st, EventDeleter> fork_, join_;
};

}  // namespace fp4moe::cuda
