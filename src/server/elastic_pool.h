// The HTTP server's worker pool (an httplib::TaskQueue). Tested by tests/server/test_elastic_pool.cpp.
#pragma once

#include <httplib.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <system_error>
#include <thread>
#include <vector>

#include "core/error.h"

namespace fp4moe::server {

// httplib's task queue, grown on demand: `min` threads always, one more (up to `max`) whenever a
// connection arrives while none is idle, the extra ones ending after `idle_exit` without work. With
// httplib's fixed ThreadPool, N slow or idle connections (N streams, clients that send half a header)
// held every thread, so /health and /abort_request waited for one to end or time out (30 s).
class ElasticPool : public httplib::TaskQueue {
 public:
  static constexpr std::chrono::milliseconds kIdleExit{30'000};
  ElasticPool(size_t min, size_t max, std::chrono::milliseconds idle_exit)
      : min_(min), max_(std::max(min, max)), idle_exit_(idle_exit) {
    std::lock_guard<std::mutex> lock(mu_);
    for (size_t i = 0; i < min_; ++i) spawn_locked();
    FP4MOE_CHECK(!threads_.empty()) << "cannot start any HTTP thread";
  }
  ~ElasticPool() override { shutdown(); }
  void enqueue(std::function<void()> fn) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      jobs_.push_back(std::move(fn));
      reap_locked();
      if (idle_ < jobs_.size() && threads_.size() < max_) spawn_locked();
    }
    cv_.notify_one();
  }
  void shutdown() override {
    std::map<uint64_t, std::thread> all;
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
      all.swap(threads_);
      exited_.clear();
    }
    cv_.notify_all();
    for (auto& [id, t] : all) t.join();
  }

 private:
  void reap_locked() {
    for (uint64_t id : exited_) {  // those have left run(): join them
      threads_.at(id).join();
      threads_.erase(id);
    }
    exited_.clear();
  }
  // A thread the system refuses (a pids limit): the job waits for a busy thread, as in a full pool;
  // said once. (std::thread's system_error out of enqueue would end the process on httplib's listener.)
  void spawn_locked() {
    const uint64_t id = next_id_++;
    try {
      threads_.emplace(id, std::thread([this, id] { run(id); }));
    } catch (const std::system_error& e) {
      if (!spawn_failed_)
        std::fprintf(stderr, "fp4moe serve: cannot start another HTTP thread (%zu running): %s\n", threads_.size(),
                     e.what());
      spawn_failed_ = true;
    }
  }
  void run(uint64_t id) {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      ++idle_;
      const bool woken = cv_.wait_for(lock, idle_exit_, [&] { return stopping_ || !jobs_.empty(); });
      --idle_;
      if (jobs_.empty()) {
        if (stopping_) return;
        if (!woken && threads_.size() - exited_.size() > min_) break;
        continue;
      }
      std::function<void()> fn = std::move(jobs_.front());
      jobs_.pop_front();
      lock.unlock();
      fn();
      lock.lock();
    }
    exited_.push_back(id);  // joined by the next spawn or by shutdown
  }

  const size_t min_, max_;
  const std::chrono::milliseconds idle_exit_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> jobs_;
  std::map<uint64_t, std::thread> threads_;
  std::vector<uint64_t> exited_;
  uint64_t next_id_ = 0;
  size_t idle_ = 0;
  bool stopping_ = false;
  bool spawn_failed_ = false;
};

}  // namespace fp4moe::server
