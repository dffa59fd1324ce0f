// Communicator: the collectives the parallel layers need, as an abstract interface with two
// implementations: FakeCommunicator (dist/fake_communicator.h: N ranks as threads of one process,
// host buffers, for the CPU path and the tests) and NcclCommunicator (dist/nccl_communicator.h:
// one process per GPU, device buffers). Where buffers live is the implementation's
// (buffers_on_device()); the layers built on the CPU path use host buffers.
//
// Every rank must make the same sequence of calls with matching sizes. Reductions support F32 and
// BF16 (BF16 sums in f32 and rounds once); data movement is by bytes. A collective that cannot
// complete (a peer failed, exited or timed out) throws fp4moe::Error naming the rank; it never hangs.
// Tested by tests/dist/test_communicator.cpp (FakeCommunicator vs serial results) and
// tests/dist/test_nccl.cpp (world size 1 on a GPU).
#pragma once

#include <cstdint>
#include <string>

#include "core/dtype.h"

namespace fp4moe::dist {

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  virtual bool buffers_on_device() const = 0;
  // "fake rank 1/4", "nccl rank 0/8 (device 0)"
  virtual std::string describe() const = 0;

  // data[count] = sum over ranks of data[count] (in place). dtype: kF32 or kBF16.
  virtual void all_reduce_sum(void* data, int64_t count, DType dtype) = 0;
  // recv[recv_count] = sum over ranks r of send[rank()*recv_count .. +recv_count]:
  // send holds world_size blocks of recv_count elements, block p destined for rank p.
  virtual void reduce_scatter_sum(const void* send, void* recv, int64_t recv_count, DType dtype) = 0;
  // recv[world_size * bytes] = the `bytes` bytes of send of every rank, in rank order.
  virtual void all_gather(const void* send, void* recv, int64_t bytes) = 0;
  // send_bytes[p]: bytes for rank p, packed in rank order in send; recv_bytes[p]: bytes from
  // rank p, packed in rank order in recv. send_bytes[q] of rank p must equal recv_bytes[p] of rank q.
  virtual void all_to_all_v(const void* send, const int64_t* send_bytes, void* recv, const int64_t* recv_bytes) = 0;
  virtual void barrier() = 0;

  // Typed conveniences.
  void all_reduce_sum(float* data, int64_t count) { all_reduce_sum(data, count, DType::kF32); }
  void all_reduce_sum_bf16(uint16_t* data, int64_t count) { all_reduce_sum(data, count, DType::kBF16); }
  void reduce_scatter_sum(const float* send, float* recv, int64_t recv_count) {
    reduce_scatter_sum(send, recv, recv_count, DType::kF32);
  }
};

}  // namespace fp4moe::dist
