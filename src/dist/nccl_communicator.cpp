// NcclCommunicator: non-blocking NCCL communicator with polled, time-limited waits. See
// nccl_communicator.h. Tested by tests/dist/test_nccl.cpp (gpu label; world size 1).
#include "dist/nccl_communicator.h"

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <thread>

#include "core/error.h"
#include "kernels/cuda/cuda_check.h"

namespace fp4moe::dist {

namespace {

ncclDataType_t nccl_dtype(DType dtype) {
  switch (dtype) {
    case DType::kF32: return ncclFloat32;
    case DType::kBF16: return ncclBfloat16;
    default: break;
  }
  FP4MOE_FAIL() << "NCCL reduction on " << dtype_name(dtype) << ": only F32 and BF16 are supported";
  return ncclFloat32;
}

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

}  // namespace

void throw_nccl_error(ncclResult_t result, const char* call, const char* file, int line, const std::string& detail) {
  std::ostringstream os;
  os << "NCCL error " << ncclGetErrorString(result) << " (" << static_cast<int>(result) << ") in `" << call << "` at "
     << file << ":" << line;
  if (!detail.empty()) os << ": " << detail;
  throw Error(os.str());
}

#define FP4MOE_NCCL_COMM_CALL(call) check((call), #call, __FILE__, __LINE__)

NcclCommunicator::NcclCommunicator(int world_size, int rank, int device, const std::vector<uint8_t>& unique_id,
                                   double timeout_s)
    : world_size_(world_size), rank_(rank), device_(device), timeout_s_(timeout_s) {
  FP4MOE_CHECK(world_size >= 1 && rank >= 0 && rank < world_size)
      << "NcclCommunicator: rank " << rank << " outside a world of " << world_size;
  FP4MOE_CHECK(unique_id.size() == sizeof(ncclUniqueId))
      << "NcclCommunicator: unique id of " << unique_id.size() << " bytes, expected " << sizeof(ncclUniqueId);
  FP4MOE_CHECK(timeout_s > 0) << "NcclCommunicator: timeout " << timeout_s << " s must be > 0";
  // Keep NVLink multicast off unless the environment says otherwise (issue #8).
  setenv("NCCL_NVLS_ENABLE", "0", /*overwrite=*/0);
  FP4MOE_CUDA_CHECK(cudaSetDevice(device));
  FP4MOE_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  FP4MOE_CUDA_CHECK(cudaMalloc(&scratch_, sizeof(float)));
  ncclUniqueId id;
  std::memcpy(&id, unique_id.data(), sizeof(id));
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  const ncclResult_t r = ncclCommInitRankConfig(&comm_, world_size, id, rank, &config);
  if (r != ncclSuccess && r != ncclInProgress) {
    if (comm_ != nullptr) ncclCommAbort(comm_);
    comm_ = nullptr;
    cudaFree(scratch_);
    cudaStreamDestroy(stream_);
    throw_nccl_error(r, "ncclCommInitRankConfig(&comm_, world_size, id, rank, &config)", __FILE__, __LINE__,
                     describe());
  }
  try {
    wait_ready("ncclCommInitRankConfig (waiting for every rank to join)");
  } catch (...) {
    cudaFree(scratch_);
    cudaStreamDestroy(stream_);
    throw;
  }
}

NcclCommunicator::~NcclCommunicator() {
  if (comm_ != nullptr) {
    // Finalize flushes outstanding work; being non-blocking, it is polled (bounded by the timeout)
    // before the destroy. Anything but a clean finalize aborts instead, which never blocks.
    ncclResult_t state = ncclCommFinalize(comm_);
    const auto t0 = Clock::now();
    while ((state == ncclSuccess || state == ncclInProgress) && seconds_since(t0) < timeout_s_) {
      if (ncclCommGetAsyncError(comm_, &state) != ncclSuccess) state = ncclInternalError;
      if (state != ncclInProgress) break;
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
    if (state == ncclSuccess) {
      ncclCommDestroy(comm_);
    } else {
      ncclCommAbort(comm_);
    }
  }
  if (scratch_ != nullptr) cudaFree(scratch_);
  if (stream_ != nullptr) cudaStreamDestroy(stream_);
}

std::vector<uint8_t> NcclCommunicator::new_unique_id() {
  ncclUniqueId id;
  FP4MOE_NCCL_CHECK(ncclGetUniqueId(&id));
  std::vector<uint8_t> bytes(sizeof(id));
  std::memcpy(bytes.data(), &id, sizeof(id));
  return bytes;
}

std::string NcclCommunicator::nccl_version() {
  int v = 0;
  FP4MOE_NCCL_CHECK(ncclGetVersion(&v));
  // NCCL >= 2.9: major*10000 + minor*100 + patch.
  return std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." + std::to_string(v % 100);
}

std::string NcclCommunicator::describe() const {
  return "nccl rank " + std::to_string(rank_) + "/" + std::to_string(world_size_) + " (device " +
         std::to_string(device_) + ")";
}

void NcclCommunicator::require_live(const char* what) const {
  FP4MOE_CHECK(comm_ != nullptr) << describe() << ": " << what << " on an aborted communicator (" << abort_reason_
                                 << ")";
}

void NcclCommunicator::abort_and_throw(ncclResult_t result, const std::string& what, const std::string& detail) {
  const char* last_error = comm_ != nullptr ? ncclGetLastError(comm_) : nullptr;
  const std::string last = last_error != nullptr ? last_error : "";
  if (comm_ != nullptr) ncclCommAbort(comm_);
  comm_ = nullptr;
  std::ostringstream os;
  os << describe() << ": " << what << ": " << detail;
  if (result != ncclSuccess) os << ": NCCL " << ncclGetErrorString(result) << " (" << static_cast<int>(result) << ")";
  if (!last.empty()) os << ", last error: " << last;
  os << "; communicator aborted";
  abort_reason_ = os.str();
  throw Error(abort_reason_);
}

void NcclCommunicator::check(ncclResult_t result, const char* call, const char* file, int line) {
  if (result == ncclSuccess) return;
  if (result == ncclInProgress) {
    wait_ready(call);
    return;
  }
  std::ostringstream where;
  where << "`" << call << "` at " << file << ":" << line;
  abort_and_throw(result, where.str(), "failed");
}

void NcclCommunicator::wait_ready(const char* what) {
  const auto t0 = Clock::now();
  for (;;) {
    ncclResult_t state = ncclSuccess;
    const ncclResult_t q = ncclCommGetAsyncError(comm_, &state);
    if (q != ncclSuccess) abort_and_throw(q, what, "ncclCommGetAsyncError failed");
    if (state == ncclSuccess) return;
    if (state != ncclInProgress) abort_and_throw(state, what, "asynchronous error");
    if (seconds_since(t0) > timeout_s_) {
      abort_and_throw(ncclSuccess, what,
                      "timed out after " + std::to_string(timeout_s_) + " s (a peer rank died or never joined)");
    }
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
}

void NcclCommunicator::wait_stream(const char* what) {
  const auto t0 = Clock::now();
  for (;;) {
    const cudaError_t q = cudaStreamQuery(stream_);
    ncclResult_t state = ncclSuccess;
    const ncclResult_t a = ncclCommGetAsyncError(comm_, &state);
    if (a != ncclSuccess) abort_and_throw(a, what, "ncclCommGetAsyncError failed");
    if (state != ncclSuccess && state != ncclInProgress) abort_and_throw(state, what, "asynchronous error");
    if (q == cudaSuccess) return;
    if (q != cudaErrorNotReady) {
      abort_and_throw(ncclSuccess, what,
                      std::string("cudaStreamQuery: ") + cudaGetErrorName(q) + " (" + cudaGetErrorString(q) + ")");
    }
    if (seconds_since(t0) > timeout_s_) {
      abort_and_throw(ncclSuccess, what,
                      "timed out after " + std::to_string(timeout_s_) +
                          " s waiting for the collective (a peer rank died or called a different one)");
    }
    std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
}

void NcclCommunicator::all_reduce_sum(void* data, int64_t count, DType dtype) {
  require_live("all_reduce_sum");
  FP4MOE_CHECK(count >= 0) << describe() << ": all_reduce_sum count " << count;
  const ncclDataType_t t = nccl_dtype(dtype);
  FP4MOE_NCCL_COMM_CALL(ncclAllReduce(data, data, static_cast<size_t>(count), t, ncclSum, comm_, stream_));
  wait_stream("ncclAllReduce");
}

void NcclCommunicator::reduce_scatter_sum(const void* send, void* recv, int64_t recv_count, DType dtype) {
  require_live("reduce_scatter_sum");
  FP4MOE_CHECK(recv_count >= 0) << describe() << ": reduce_scatter_sum recv_count " << recv_count;
  const ncclDataType_t t = nccl_dtype(dtype);
  FP4MOE_NCCL_COMM_CALL(ncclReduceScatter(send, recv, static_cast<size_t>(recv_count), t, ncclSum, comm_, stream_));
  wait_stream("ncclReduceScatter");
}

void NcclCommunicator::all_gather(const void* send, void* recv, int64_t bytes) {
  require_live("all_gather");
  FP4MOE_CHECK(bytes >= 0) << describe() << ": all_gather bytes " << bytes;
  FP4MOE_NCCL_COMM_CALL(ncclAllGather(send, recv, static_cast<size_t>(bytes), ncclUint8, comm_, stream_));
  wait_stream("ncclAllGather");
}

void NcclCommunicator::all_to_all_v(const void* send, const int64_t* send_bytes, void* recv,
                                    const int64_t* recv_bytes) {
  require_live("all_to_all_v");
  for (int p = 0; p < world_size_; ++p) {
    FP4MOE_CHECK(send_bytes[p] >= 0 && recv_bytes[p] >= 0)
        << describe() << ": all_to_all_v peer " << p << " send " << send_bytes[p] << " recv " << recv_bytes[p]
        << " bytes";
  }
  FP4MOE_NCCL_COMM_CALL(ncclGroupStart());
  try {
    int64_t send_off = 0, recv_off = 0;
    for (int p = 0; p < world_size_; ++p) {
      // Zero-byte messages are skipped on both sides (sizes agree by the contract of all_to_all_v).
      if (send_bytes[p] > 0) {
        FP4MOE_NCCL_COMM_CALL(ncclSend(static_cast<const uint8_t*>(send) + send_off,
                                       static_cast<size_t>(send_bytes[p]), ncclUint8, p, comm_, stream_));
      }
      if (recv_bytes[p] > 0) {
        FP4MOE_NCCL_COMM_CALL(ncclRecv(static_cast<uint8_t*>(recv) + recv_off, static_cast<size_t>(recv_bytes[p]),
                                       ncclUint8, p, comm_, stream_));
      }
      send_off += send_bytes[p];
      recv_off += recv_bytes[p];
    }
  } catch (...) {
    ncclGroupEnd();  // close this thread's group; the communicator is already aborted
    throw;
  }
  FP4MOE_NCCL_COMM_CALL(ncclGroupEnd());
  wait_stream("all_to_all_v (ncclGroupStart + ncclSend/ncclRecv + ncclGroupEnd)");
}

void NcclCommunicator::barrier() {
  require_live("barrier");
  FP4MOE_NCCL_COMM_CALL(ncclAllReduce(scratch_, scratch_, 1, ncclFloat32, ncclSum, comm_, stream_));
  wait_stream("barrier (ncclAllReduce of one float)");
}

}  // namespace fp4moe::dist
