// FakeCommunicator: N ranks as threads around a two-barrier rendezvous. See fake_communicator.h.
// Tested by tests/dist/test_communicator.cpp.
#include "dist/fake_communicator.h"

#include <cstring>
#include <exception>
#include <sstream>
#include <thread>

#include "core/error.h"

namespace fp4moe::dist {

namespace {

std::string rank_list(const std::vector<int>& ranks) {
  std::ostringstream os;
  for (size_t i = 0; i < ranks.size(); ++i) os << (i ? ", " : "") << ranks[i];
  return os.str();
}

int64_t element_bytes(DType dtype) {
  FP4MOE_CHECK(dtype == DType::kF32 || dtype == DType::kBF16)
      << "collective reduction on " << dtype_name(dtype) << ": only F32 and BF16 are supported";
  return dtype == DType::kF32 ? 4 : 2;
}

float load_element(const void* base, int64_t i, DType dtype) {
  if (dtype == DType::kF32) return static_cast<const float*>(base)[i];
  return bf16_to_f32(static_cast<const uint16_t*>(base)[i]);
}

void store_elements(const std::vector<float>& values, void* dst, DType dtype) {
  if (dtype == DType::kF32) {
    std::memcpy(dst, values.data(), values.size() * 4);
  } else {
    auto* d = static_cast<uint16_t*>(dst);
    for (size_t i = 0; i < values.size(); ++i) d[i] = f32_to_bf16(values[i]);
  }
}

}  // namespace

FakeWorld::FakeWorld(int world_size, std::chrono::milliseconds timeout)
    : n_(world_size), timeout_(timeout) {
  FP4MOE_CHECK(world_size >= 1) << "FakeWorld: world size " << world_size << " must be >= 1";
  FP4MOE_CHECK(timeout.count() > 0) << "FakeWorld: timeout " << timeout.count() << " ms must be > 0";
  passed_.assign(static_cast<size_t>(n_), 0);
  exited_.assign(static_cast<size_t>(n_), false);
  calls_.resize(static_cast<size_t>(n_));
}

void FakeWorld::fail(int rank, const std::string& why) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!failed_) {
      failed_ = true;
      failure_ = "rank " + std::to_string(rank) + " failed: " + why;
    }
  }
  cv_.notify_all();
}

void FakeWorld::exited(int rank) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    exited_[static_cast<size_t>(rank)] = true;
  }
  cv_.notify_all();
}

bool FakeWorld::failed() const {
  std::lock_guard<std::mutex> lock(mu_);
  return failed_;
}

std::string FakeWorld::failure() const {
  std::lock_guard<std::mutex> lock(mu_);
  return failure_;
}

void FakeWorld::barrier(std::unique_lock<std::mutex>& lock, int rank, const char* op, int phase) {
  if (failed_) {
    FP4MOE_FAIL() << "rank " << rank << ": " << op << " cannot run: " << failure_;
  }
  const uint64_t mine = ++passed_[static_cast<size_t>(rank)];
  const uint64_t gen = generation_;
  if (++arrived_ == n_) {
    arrived_ = 0;
    ++generation_;
    cv_.notify_all();
    return;
  }
  const auto deadline = std::chrono::steady_clock::now() + timeout_;
  for (;;) {
    if (generation_ != gen) return;
    if (failed_) {
      FP4MOE_FAIL() << "rank " << rank << ": " << op << " (phase " << phase << ") cannot complete: " << failure_;
    }
    std::vector<int> gone, missing;
    for (int q = 0; q < n_; ++q) {
      if (passed_[static_cast<size_t>(q)] >= mine) continue;
      missing.push_back(q);
      if (exited_[static_cast<size_t>(q)]) gone.push_back(q);
    }
    if (!gone.empty()) {
      failed_ = true;
      failure_ = "rank " + rank_list(gone) + " exited (its function returned) without joining " + op +
                 " that rank " + std::to_string(rank) + " waits in";
      cv_.notify_all();
      FP4MOE_FAIL() << "rank " << rank << ": " << failure_;
    }
    if (cv_.wait_until(lock, deadline) == std::cv_status::timeout && generation_ == gen && !failed_) {
      failed_ = true;
      failure_ = "rank " + rank_list(missing) + " did not join " + op + " within " +
                 std::to_string(timeout_.count()) + " ms (timed out; rank " + std::to_string(rank) + " waited)";
      cv_.notify_all();
      FP4MOE_FAIL() << "rank " << rank << ": " << failure_;
    }
  }
}

void FakeWorld::collective(int rank, const Call& call,
                           const std::function<void(const std::vector<Call>&)>& compute) {
  FP4MOE_CHECK(rank >= 0 && rank < n_) << "FakeWorld: rank " << rank << " outside [0, " << n_ << ")";
  std::vector<Call> calls;
  {
    std::unique_lock<std::mutex> lock(mu_);
    calls_[static_cast<size_t>(rank)] = call;
    barrier(lock, rank, call.op.c_str(), 1);
    calls = calls_;  // stable until barrier 2: nobody publishes the next call before then
  }
  // Every rank runs the same checks on the same calls, so all of them throw or none does.
  for (int q = 0; q < n_; ++q) {
    const Call& c = calls[static_cast<size_t>(q)];
    if (c.op != call.op || c.count != call.count || c.dtype != call.dtype) {
      const std::string why = "collective mismatch: rank " + std::to_string(rank) + " called " + call.op + "(count " +
                              std::to_string(call.count) + ", " + std::string(dtype_name(call.dtype)) + ") but rank " +
                              std::to_string(q) + " called " + c.op + "(count " + std::to_string(c.count) + ", " +
                              std::string(dtype_name(c.dtype)) + ")";
      fail(rank, why);
      FP4MOE_FAIL() << why;
    }
  }
  try {
    compute(calls);
  } catch (const std::exception& e) {
    fail(rank, e.what());
    throw;
  }
  std::unique_lock<std::mutex> lock(mu_);
  barrier(lock, rank, call.op.c_str(), 2);
}

FakeCommunicator::FakeCommunicator(std::shared_ptr<FakeWorld> world, int rank) : world_(std::move(world)), rank_(rank) {
  FP4MOE_CHECK(world_ != nullptr && rank >= 0 && rank < world_->world_size())
      << "FakeCommunicator: rank " << rank << " outside the world of " << (world_ ? world_->world_size() : 0);
}

std::string FakeCommunicator::describe() const {
  return "fake rank " + std::to_string(rank_) + "/" + std::to_string(world_size());
}

void FakeCommunicator::all_reduce_sum(void* data, int64_t count, DType dtype) {
  element_bytes(dtype);
  FP4MOE_CHECK(count >= 0) << describe() << ": all_reduce_sum count " << count;
  std::vector<float> sum(static_cast<size_t>(count));
  world_->collective(rank_, {"all_reduce_sum", count, dtype, data}, [&](const std::vector<FakeWorld::Call>& calls) {
    for (int64_t i = 0; i < count; ++i) {
      float s = load_element(calls[0].send, i, dtype);
      for (size_t q = 1; q < calls.size(); ++q) s += load_element(calls[q].send, i, dtype);  // rank order
      sum[static_cast<size_t>(i)] = s;
    }
  });
  store_elements(sum, data, dtype);
}

void FakeCommunicator::reduce_scatter_sum(const void* send, void* recv, int64_t recv_count, DType dtype) {
  element_bytes(dtype);
  FP4MOE_CHECK(recv_count >= 0) << describe() << ": reduce_scatter_sum recv_count " << recv_count;
  std::vector<float> sum(static_cast<size_t>(recv_count));
  const int64_t base = rank_ * recv_count;
  world_->collective(rank_, {"reduce_scatter_sum", recv_count, dtype, send},
                     [&](const std::vector<FakeWorld::Call>& calls) {
                       for (int64_t i = 0; i < recv_count; ++i) {
                         float s = load_element(calls[0].send, base + i, dtype);
                         for (size_t q = 1; q < calls.size(); ++q) s += load_element(calls[q].send, base + i, dtype);
                         sum[static_cast<size_t>(i)] = s;
                       }
                     });
  store_elements(sum, recv, dtype);
}

void FakeCommunicator::all_gather(const void* send, void* recv, int64_t bytes) {
  FP4MOE_CHECK(bytes >= 0) << describe() << ": all_gather bytes " << bytes;
  std::vector<uint8_t> out(static_cast<size_t>(bytes * world_size()));
  world_->collective(rank_, {"all_gather", bytes, DType::kU8, send}, [&](const std::vector<FakeWorld::Call>& calls) {
    for (size_t q = 0; q < calls.size(); ++q) {
      if (bytes > 0) std::memcpy(out.data() + q * bytes, calls[q].send, static_cast<size_t>(bytes));
    }
  });
  if (!out.empty()) std::memcpy(recv, out.data(), out.size());
}

void FakeCommunicator::all_to_all_v(const void* send, const int64_t* send_bytes, void* recv,
                                    const int64_t* recv_bytes) {
  const int n = world_size();
  int64_t total_recv = 0;
  for (int p = 0; p < n; ++p) {
    FP4MOE_CHECK(send_bytes[p] >= 0 && recv_bytes[p] >= 0)
        << describe() << ": all_to_all_v peer " << p << " send " << send_bytes[p] << " recv " << recv_bytes[p] << " bytes";
    total_recv += recv_bytes[p];
  }
  std::vector<uint8_t> out(static_cast<size_t>(total_recv));
  FakeWorld::Call call{"all_to_all_v", 0, DType::kU8, send};
  call.send_bytes = send_bytes;
  call.recv_bytes = recv_bytes;
  world_->collective(rank_, call, [&](const std::vector<FakeWorld::Call>& calls) {
    for (int p = 0; p < n; ++p) {
      for (int q = 0; q < n; ++q) {
        FP4MOE_CHECK(calls[p].send_bytes[q] == calls[q].recv_bytes[p])
            << "all_to_all_v: rank " << p << " sends " << calls[p].send_bytes[q] << " bytes to rank " << q
            << ", which expects " << calls[q].recv_bytes[p];
      }
    }
    int64_t dst = 0;
    for (int p = 0; p < n; ++p) {
      int64_t src = 0;
      for (int q = 0; q < rank_; ++q) src += calls[p].send_bytes[q];
      const int64_t len = calls[p].send_bytes[rank_];
      if (len > 0) std::memcpy(out.data() + dst, static_cast<const uint8_t*>(calls[p].send) + src, static_cast<size_t>(len));
      dst += len;
    }
  });
  if (!out.empty()) std::memcpy(recv, out.data(), out.size());
}

void FakeCommunicator::barrier() {
  world_->collective(rank_, {"barrier", 0, DType::kU8, nullptr}, [](const std::vector<FakeWorld::Call>&) {});
}

void run_ranks(int world_size, const std::function<void(Communicator&)>& fn, std::chrono::milliseconds timeout) {
  auto world = std::make_shared<FakeWorld>(world_size, timeout);
  std::vector<std::string> errors(static_cast<size_t>(world_size));
  std::vector<std::thread> threads;
  threads.reserve(static_cast<size_t>(world_size));
  for (int r = 0; r < world_size; ++r) {
    threads.emplace_back([&, r] {
      try {
        FakeCommunicator comm(world, r);
        fn(comm);
      } catch (const std::exception& e) {
        errors[static_cast<size_t>(r)] = e.what();
        world->fail(r, std::string("threw: ") + e.what());
      } catch (...) {
        errors[static_cast<size_t>(r)] = "a non-standard exception";
        world->fail(r, "threw a non-standard exception");
      }
      world->exited(r);
    });
  }
  for (auto& t : threads) t.join();
  if (!world->failed()) return;
  std::ostringstream os;
  os << world->failure();
  for (int r = 0; r < world_size; ++r) {
    if (!errors[static_cast<size_t>(r)].empty()) os << "\n  rank " << r << ": " << errors[static_cast<size_t>(r)];
  }
  throw Error(os.str());
}

}  // namespace fp4moe::dist
