// A small persistent thread pool for the CPU kernels: parallel_for over task indices, the calling
// thread participating. Size: FP4MOE_CPU_THREADS when set (>= 1), else std::thread::hardware_concurrency().
// A parallel_for issued from inside a task (e.g. a Linear inside a per-expert task) runs inline on
// that thread, so nesting never deadlocks; concurrent callers from different threads are serialized.
// The first exception thrown by a task is rethrown to the caller after all tasks have stopped.
// Tested by tests/moe/test_linear.cpp (ThreadPool.*).
#pragma once

#include <cstdint>
#include <functional>

namespace fp4moe::kernels::cpu {

class ThreadPool {
 public:
  explicit ThreadPool(int n_threads);  // n_threads >= 1 (the caller counts as one)
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int n_threads() const { return n_threads_; }

  // Runs fn(i) for every i in [0, n_tasks), tasks handed out dynamically in increasing i.
  void parallel_for(int64_t n_tasks, const std::function<void(int64_t)>& fn);

  struct State;

 private:
  int n_threads_ = 1;
  State* state_ = nullptr;
};

// FP4MOE_CPU_THREADS (>= 1) when set, else hardware_concurrency() (at least 1).
int default_cpu_threads();

// The process-wide pool the kernels use, created on first use with default_cpu_threads().
ThreadPool& default_thread_pool();

}  // namespace fp4moe::kernels::cpu
