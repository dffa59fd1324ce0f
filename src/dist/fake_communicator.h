// FakeCommunicator: an in-process N-rank communicator, each rank a thread, for the CPU path and
// the tests of the parallel layers (the two-rank simulation of issue #8).
//
//   dist::run_ranks(4, [&](dist::Communicator& comm) { ... comm.all_reduce_sum(buf, n); ... });
//
// A FakeWorld is the shared rendezvous. Each collective is two barriers: after the first, every
// rank has published its buffers and computes its own result into private memory (reading the
// peers' buffers); after the second, everyone has finished reading, so each rank writes its output
// (in-place all-reduce is safe). Reductions sum in rank order, ((r0 + r1) + r2) + ..., so results are
// bit-identical run to run and the same on every rank.
// Failure never hangs: a rank that throws (run_ranks catches it), returns early, calls a different
// collective or sizes, or waits longer than the timeout marks the world failed; every rank waiting
// or arriving later throws fp4moe::Error naming the failed rank and what it did.
// Tested by tests/dist/test_communicator.cpp.
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "dist/communicator.h"

namespace fp4moe::dist {

class FakeWorld {
 public:
  // timeout: how long a rank waits in one barrier before declaring the missing ranks timed out.
  explicit FakeWorld(int world_size, std::chrono::milliseconds timeout = std::chrono::seconds(60));

  int world_size() const { return n_; }
  // Marks the world failed (first failure wins) and wakes every waiting rank.
  void fail(int rank, const std::string& why);
  // Marks rank as finished: a peer still waiting for it fails at once instead of timing out.
  void exited(int rank);
  bool failed() const;
  std::string failure() const;

  // One published call: what and where. Used by FakeCommunicator.
  struct Call {
    std::string op;
    int64_t count = 0;
    DType dtype = DType::kU8;
    const void* send = nullptr;
    const int64_t* send_bytes = nullptr;  // all_to_all_v
    const int64_t* recv_bytes = nullptr;  // all_to_all_v
  };
  // Barrier 1 (publishing `call`), then fn() computes this rank's result, barrier 2.
  void collective(int rank, const Call& call, const std::function<void(const std::vector<Call>&)>& compute);

 private:
  void barrier(std::unique_lock<std::mutex>& lock, int rank, const char* op, int phase);

  const int n_;
  const std::chrono::milliseconds timeout_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  int arrived_ = 0;
  uint64_t generation_ = 0;
  std::vector<uint64_t> passed_;  // barriers each rank has entered
  std::vector<bool> exited_;
  std::vector<Call> calls_;
  bool failed_ = false;
  std::string failure_;
};

class FakeCommunicator final : public Communicator {
 public:
  FakeCommunicator(std::shared_ptr<FakeWorld> world, int rank);

  int rank() const override { return rank_; }
  int world_size() const override { return world_->world_size(); }
  bool buffers_on_device() const override { return false; }
  std::string describe() const override;

  using Communicator::all_reduce_sum;
  using Communicator::reduce_scatter_sum;
  void all_reduce_sum(void* data, int64_t count, DType dtype) override;
  void reduce_scatter_sum(const void* send, void* recv, int64_t recv_count, DType dtype) override;
  void all_gather(const void* send, void* recv, int64_t bytes) override;
  void all_to_all_v(const void* send, const int64_t* send_bytes, void* recv, const int64_t* recv_bytes) override;
  void barrier() override;

 private:
  std::shared_ptr<FakeWorld> world_;
  int rank_;
};

// Runs fn on world_size threads, one FakeCommunicator each, and joins them. When ranks fail, it
// throws fp4moe::Error with the first failure (the original one, not the peers' consequences) and
// every rank's message. timeout as in FakeWorld.
void run_ranks(int world_size, const std::function<void(Communicator&)>& fn,
               std::chrono::milliseconds timeout = std::chrono::seconds(60));

}  // namespace fp4moe::dist
