// server::ElasticPool: it grows while jobs wait (N jobs that each wait for all N to run at once finish),
// shrinks back to its minimum after the idle time, and grows again after that (a pool that once reached
// its maximum and shrank could not grow again while its exited threads were counted), never past max.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "server/elastic_pool.h"

namespace fp4moe::server {
namespace {

// Runs n jobs that each wait until n are running together (or 20 s); returns how many saw all n.
int run_together(ElasticPool& pool, int n) {
  std::mutex mu;
  std::condition_variable cv;
  int running = 0, saw_all = 0, done = 0;
  for (int i = 0; i < n; ++i) {
    pool.enqueue([&] {
      std::unique_lock<std::mutex> lock(mu);
      ++running;
      cv.notify_all();
      if (cv.wait_for(lock, std::chrono::seconds(20), [&] { return running >= n; })) ++saw_all;
      ++done;
      cv.notify_all();
    });
  }
  std::unique_lock<std::mutex> lock(mu);
  cv.wait(lock, [&] { return done == n; });
  return saw_all;
}

TEST(ElasticPool, GrowsShrinksAndGrowsAgain) {
  ElasticPool pool(1, 4, std::chrono::milliseconds(50));
  EXPECT_EQ(run_together(pool, 4), 4) << "the pool did not grow to 4 threads";
  std::this_thread::sleep_for(std::chrono::milliseconds(400));  // the three extra threads end
  EXPECT_EQ(run_together(pool, 4), 4) << "the pool did not grow again after shrinking";
  pool.shutdown();
}

TEST(ElasticPool, NeverPastItsMaximum) {
  ElasticPool pool(1, 2, std::chrono::milliseconds(50));
  std::atomic<int> now{0}, peak{0}, finished{0};
  for (int i = 0; i < 8; ++i) {
    pool.enqueue([&] {
      const int n = ++now;
      int p = peak.load();
      while (n > p && !peak.compare_exchange_weak(p, n)) {
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      --now;
      ++finished;
    });
  }
  pool.shutdown();  // runs what is queued, then joins
  EXPECT_EQ(finished.load(), 8);
  EXPECT_LE(peak.load(), 2);
}

}  // namespace
}  // namespace fp4moe::server
