// NcclCommunicator: the Communicator over NCCL (from the CUDA toolkit) for one process per GPU.
// Buffers are DEVICE pointers (buffers_on_device() is true). Built only when CMake finds NCCL
// (library fp4moe_dist_nccl, which defines FP4MOE_HAVE_NCCL); see src/dist/CMakeLists.txt.
//
//   auto id = dist::bootstrap_id(rank, "/tmp/run42/nccl_id", sizeof(ncclUniqueId), 60s,
//                                [] { return dist::NcclCommunicator::new_unique_id(); });
//   dist::NcclCommunicator comm(world, rank, /*device=*/rank, id);
//   comm.all_reduce_sum(d_buf, n);  // enqueued on comm.stream(), returns when complete
//
// Bootstrap: dist/bootstrap.h (FP4MOE_NCCL_ID or a shared id file written by rank 0).
// NVLink multicast (NVLS) stays off: NCCL_NVLS_ENABLE is set to 0 before ncclCommInitRank unless
// the environment already sets it (then it is left as is).
// Never hang: the communicator is non-blocking (ncclConfig_t.blocking = 0); init and every call
// are waited for by polling ncclCommGetAsyncError / cudaStreamQuery with a timeout; on an NCCL
// error or the timeout the communicator is aborted (ncclCommAbort) and the call throws
// fp4moe::Error naming the NCCL call, ncclGetErrorString, ncclGetLastError and the rank. Later
// calls on an aborted communicator throw at once.
// Calls are synchronous (enqueue on stream(), then wait) so that errors surface at the call.
// all_to_all_v is ncclGroupStart + ncclSend/ncclRecv per peer + ncclGroupEnd.
// Tested by tests/dist/test_nccl.cpp (label gpu: world size 1 through the NCCL path; skips with
// the reason where no GPU is visible).
#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstdint>
#include <string>
#include <vector>

#include "dist/communicator.h"

namespace fp4moe::dist {

// Throws fp4moe::Error: "NCCL error <ncclGetErrorString> (<code>) in `<call>` at file:line: <detail>".
[[noreturn]] void throw_nccl_error(ncclResult_t result, const char* call, const char* file, int line,
                                   const std::string& detail);

}  // namespace fp4moe::dist

// For calls outside a communicator (ncclGetUniqueId, ncclGetVersion).
#define FP4MOE_NCCL_CHECK(call)                                                         \
  do {                                                                                  \
    const ncclResult_t fp4moe_nccl_res_ = (call);                                       \
    if (fp4moe_nccl_res_ != ncclSuccess) {                                              \
      ::fp4moe::dist::throw_nccl_error(fp4moe_nccl_res_, #call, __FILE__, __LINE__, ""); \
    }                                                                                   \
  } while (0)

namespace fp4moe::dist {

class NcclCommunicator final : public Communicator {
 public:
  // Sets the CUDA device, NCCL_NVLS_ENABLE=0 when unset, creates a non-blocking communicator of
  // world_size ranks from `unique_id` (sizeof(ncclUniqueId) bytes) and a stream, and waits up to
  // timeout_s for every rank to join.
  NcclCommunicator(int world_size, int rank, int device, const std::vector<uint8_t>& unique_id,
                   double timeout_s = 300.0);
  ~NcclCommunicator() override;
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  // ncclGetUniqueId as bytes (rank 0, or a launcher).
  static std::vector<uint8_t> new_unique_id();
  // "2.28.3"
  static std::string nccl_version();

  int rank() const override { return rank_; }
  int world_size() const override { return world_size_; }
  bool buffers_on_device() const override { return true; }
  std::string describe() const override;
  int device() const { return device_; }
  cudaStream_t stream() const { return stream_; }
  bool aborted() const { return comm_ == nullptr; }

  using Communicator::all_reduce_sum;
  using Communicator::reduce_scatter_sum;
  void all_reduce_sum(void* data, int64_t count, DType dtype) override;
  void reduce_scatter_sum(const void* send, void* recv, int64_t recv_count, DType dtype) override;
  void all_gather(const void* send, void* recv, int64_t bytes) override;
  void all_to_all_v(const void* send, const int64_t* send_bytes, void* recv, const int64_t* recv_bytes) override;
  void barrier() override;

 private:
  // The result of an NCCL call on comm_: ncclInProgress waits for the communicator to be ready;
  // any other error aborts and throws.
  void check(ncclResult_t result, const char* call, const char* file, int line);
  // Polls ncclCommGetAsyncError until ncclSuccess; aborts and throws on an error or the timeout.
  void wait_ready(const char* what);
  // Waits for stream_ to drain, watching ncclCommGetAsyncError; aborts and throws on error/timeout.
  void wait_stream(const char* what);
  [[noreturn]] void abort_and_throw(ncclResult_t result, const std::string& what, const std::string& detail);
  void require_live(const char* what) const;

  int world_size_ = 0;
  int rank_ = 0;
  int device_ = 0;
  double timeout_s_ = 300.0;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  float* scratch_ = nullptr;  // one float for barrier()
  std::string abort_reason_;
};

}  // namespace fp4moe::dist
