// ThreadPool: persistent workers woken per parallel_for; tasks handed out with an atomic counter.
// See thread_pool.h. Tested by tests/moe/test_linear.cpp (ThreadPool.*).
#include "kernels/cpu/thread_pool.h"

#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"

namespace fp4moe::kernels::cpu {

namespace {
// True on pool workers and on a caller while it runs a parallel_for: nested calls run inline.
thread_local bool t_in_parallel_region = false;
}  // namespace

struct ThreadPool::State {
  std::mutex call_mutex;  // serializes parallel_for calls from different threads
  std::mutex mutex;
  std::condition_variable wake;
  std::condition_variable done;
  std::vector<std::thread> workers;
  uint64_t generation = 0;  // bumped per parallel_for; workers wait for a new one
  bool stop = false;
  int n_busy = 0;  // workers still inside the current generation

  // The current job.
  const std::function<void(int64_t)>* fn = nullptr;
  int64_t n_tasks = 0;
  std::atomic<int64_t> next{0};
  std::atomic<bool> failed{false};
  std::exception_ptr error;

  void run_tasks() {
    while (!failed.load(std::memory_order_relaxed)) {
      int64_t i = next.fetch_add(1, std::memory_order_relaxed);
      if (i >= n_tasks) break;
      try {
        (*fn)(i);
      } catch (...) {
        std::lock_guard<std::mutex> lock(mutex);
        if (!error) error = std::current_exception();
        failed.store(true, std::memory_order_relaxed);
      }
    }
  }

  void worker_loop() {
    t_in_parallel_region = true;
    uint64_t seen = 0;
    for (;;) {
      {
        std::unique_lock<std::mutex> lock(mutex);
        wake.wait(lock, [&] { return stop || generation != seen; });
        if (stop) return;
        seen = generation;
      }
      run_tasks();
      {
        std::lock_guard<std::mutex> lock(mutex);
        if (--n_busy == 0) done.notify_all();
      }
    }
  }
};

ThreadPool::ThreadPool(int n_threads) : n_threads_(n_threads), state_(new State) {
  FP4MOE_CHECK(n_threads >= 1) << "thread pool size " << n_threads << " must be >= 1";
  for (int i = 1; i < n_threads; ++i) state_->workers.emplace_back([s = state_] { s->worker_loop(); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(state_->mutex);
    state_->stop = true;
  }
  state_->wake.notify_all();
  for (auto& t : state_->workers) t.join();
  delete state_;
}

void ThreadPool::parallel_for(int64_t n_tasks, const std::function<void(int64_t)>& fn) {
  if (n_tasks <= 0) return;
  if (n_threads_ == 1 || n_tasks == 1 || t_in_parallel_region) {
    for (int64_t i = 0; i < n_tasks; ++i) fn(i);
    return;
  }
  State& s = *state_;
  std::lock_guard<std::mutex> call_lock(s.call_mutex);
  {
    std::lock_guard<std::mutex> lock(s.mutex);
    s.fn = &fn;
    s.n_tasks = n_tasks;
    s.next.store(0);
    s.failed.store(false);
    s.error = nullptr;
    s.n_busy = static_cast<int>(s.workers.size());
    ++s.generation;
  }
  s.wake.notify_all();
  t_in_parallel_region = true;
  s.run_tasks();
  t_in_parallel_region = false;
  std::exception_ptr error;
  {
    std::unique_lock<std::mutex> lock(s.mutex);
    s.done.wait(lock, [&] { return s.n_busy == 0; });
    s.fn = nullptr;
    error = s.error;
    s.error = nullptr;
  }
  if (error) std::rethrow_exception(error);
}

int default_cpu_threads() {
  if (const char* env = std::getenv("FP4MOE_CPU_THREADS"); env != nullptr && *env != '\0') {
    char* end = nullptr;
    long n = std::strtol(env, &end, 10);
    FP4MOE_CHECK(end != env && *end == '\0' && n >= 1 && n <= 4096)
        << "FP4MOE_CPU_THREADS='" << env << "' must be an integer in [1, 4096]";
    return static_cast<int>(n);
  }
  unsigned hw = std::thread::hardware_concurrency();
  return hw == 0 ? 1 : static_cast<int>(hw);
}

ThreadPool& default_thread_pool() {
  static ThreadPool pool(default_cpu_threads());
  return pool;
}

}  // namespace fp4moe::kernels::cpu
