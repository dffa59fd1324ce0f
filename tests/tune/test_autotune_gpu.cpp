// GPU tests of the autotuner (label gpu; each skips with the reason without a usable GPU):
//  - AutotuneGpu.TinyShapeWinnerIsFeasibleAndCacheRoundTrips: tunes E=2, N=256, K=256 at buckets
//    1 and 8 (3 runs per config); checks one entry per bucket, the winner and runner-up are distinct
//    planner-feasible configs on this GPU, winner time <= runner-up time, both positive; the entries
//    saved under current_tune_key() load back equal from a file and the chooser for this device
//    returns the winner as "autotuned".
//  - AutotuneGpu.BenchPiecesRunUniformAndSkewed: the copy bandwidth is plausible (> 100 GB/s), and
//    the W4A16 workload and the cuBLAS BF16 peer time a small shape under uniform and Zipf counts
//    (the peer switches from the strided-batched call to the per-expert loop).
//  - GpuBenchTiming.BatchedSamplesCallEverySetInTurn: time_median_us with batch 3 calls fn warmup + runs x 3
//    times, the sets in turn across samples, and gives a positive per-call time.
//  - GpuBenchTiming.RefusesBadOptionsBeforeTheGpu (no GPU needed): runs 0, batch 0, warmup -1 or no sets
//    throw naming the numbers before any CUDA call.
//  - GpuBenchTiming.DescribesTheMethod (no GPU needed): the benchmarks' header words for single and batched samples.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "core/error.h"
#include "kernels/cuda_test_util.h"
#include "testing/testing.h"
#include "tune/autotune.h"
#include "tune/gpu_bench.h"
#include "tune/routing_counts.h"

namespace fp4moe::tune {
namespace {

TEST(AutotuneGpu, TinyShapeWinnerIsFeasibleAndCacheRoundTrips) {
  SKIP_WITHOUT_GPU();
  const GemmShape shape{2, 256, 256};
  const plan::GpuSpec gpu = current_gpu_spec();
  TuneOptions opts;
  opts.buckets = {1, 8};
  opts.timing = TimingOptions{1, 3};
  int calls = 0, last_done = -1, total = 0;
  opts.progress = [&](const TuneProgress& p) {
    ++calls;
    EXPECT_GT(p.done, last_done);
    last_done = p.done;
    total = p.total;
  };
  const std::vector<TuneEntry> entries = autotune({shape}, opts, gpu);
  ASSERT_EQ(entries.size(), 2u);
  EXPECT_EQ(last_done, total);
  EXPECT_EQ(calls, total + 1);
  for (size_t i = 0; i < entries.size(); ++i) {
    const TuneEntry& e = entries[i];
    const std::vector<int> feasible = feasible_configs(shape, opts.buckets[i], gpu);
    EXPECT_EQ(e.bucket, opts.buckets[i]);
    EXPECT_EQ(e.shape, shape);
    EXPECT_NE(std::find(feasible.begin(), feasible.end(), e.config_id), feasible.end()) << e.config;
    EXPECT_EQ(e.n_candidates, static_cast<int>(feasible.size()));
    EXPECT_GT(e.time_us, 0.0);
    if (feasible.size() > 1) {
      EXPECT_NE(e.runner_up_id, e.config_id);
      EXPECT_NE(std::find(feasible.begin(), feasible.end(), e.runner_up_id), feasible.end()) << e.runner_up;
      EXPECT_LE(e.time_us, e.runner_up_us);
    }
  }
  const TuneKey key = current_tune_key();
  EXPECT_EQ(key.layout_version, layout_version());
  EXPECT_GT(key.n_sms, 0);
  TuneCache cache;
  for (const TuneEntry& e : entries) cache.put(key, e);
  const auto dir = std::filesystem::temp_directory_path() / ("fp4moe_autotune_gpu_" + std::to_string(::getpid()));
  const std::string path = (dir / "tune.json").string();
  cache.save(path);
  const TuneCache loaded = TuneCache::load(path);
  EXPECT_TRUE(loaded.warnings().empty());
  EXPECT_EQ(loaded.to_json(), cache.to_json());
  EXPECT_EQ(loaded.lookup(key, shape, 5), entries[1].config_id);
  const ConfigChoice c = chooser_for_current_device(path).choose_config(shape, 1);
  EXPECT_TRUE(c.autotuned) << c.reason;
  EXPECT_EQ(c.config_id, entries[0].config_id) << c.reason;
  std::filesystem::remove_all(dir);
}

TEST(AutotuneGpu, BenchPiecesRunUniformAndSkewed) {
  SKIP_WITHOUT_GPU();
  EXPECT_GT(measure_copy_bandwidth(), 100e9);
  const GemmShape shape{8, 512, 512};
  W4A16Workload ours(shape, 8 * 16);
  CublasBf16Peer peer(shape, 8 * 16);
  EXPECT_GE(ours.n_sets(), 2);
  EXPECT_DOUBLE_EQ(ours.weight_bytes(), 8.0 * 512 * 512 / 2 + 8.0 * 512 * 512 / 16);  // K = 512: no padding
  const TimingOptions t{1, 3};
  for (const std::vector<int32_t>& counts : {uniform_counts(8, 16), zipf_counts(8, 8 * 16, 1.1, testing::test_seed())}) {
    ours.set_counts(counts);
    peer.set_counts(counts);
    EXPECT_EQ(ours.m_total(), 128);
    EXPECT_GT(ours.time_config_us(0, t), 0.0);
    EXPECT_GT(peer.time_us(t), 0.0) << peer.method();
  }
  EXPECT_EQ(peer.method().rfind("cublasGemmEx x", 0), 0u) << peer.method();
  ours.set_counts(uniform_counts(8, 16));
  peer.set_counts(uniform_counts(8, 16));
  EXPECT_EQ(peer.method(), "cublasGemmStridedBatchedEx");
}

TEST(GpuBenchTiming, BatchedSamplesCallEverySetInTurn) {
  SKIP_WITHOUT_GPU();
  std::vector<int> sets;
  const double us = time_median_us([&](int set) { sets.push_back(set); }, 2, TimingOptions{1, 2, 3});
  EXPECT_GE(us, 0.0);
  EXPECT_EQ(sets, (std::vector<int>{0, 1, 0, 1, 0, 1, 0}));  // 1 warm-up + 2 samples x 3 calls
}

TEST(GpuBenchTiming, RefusesBadOptionsBeforeTheGpu) {
  int calls = 0;
  const auto fn = [&](int) { ++calls; };
  const auto message = [&](int n_sets, const TimingOptions& o) {
    try {
      time_median_us(fn, n_sets, o);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  const std::string want = " (want runs >= 1, warmup >= 0, batch >= 1, n_sets >= 1)";
  EXPECT_NE(message(1, TimingOptions{5, 30, 0}).find("runs=30 warmup=5 batch=0 n_sets=1" + want), std::string::npos);
  EXPECT_NE(message(1, TimingOptions{5, 0, 1}).find("runs=0 warmup=5 batch=1 n_sets=1" + want), std::string::npos);
  EXPECT_NE(message(1, TimingOptions{-1, 3, 1}).find("runs=3 warmup=-1 batch=1 n_sets=1" + want), std::string::npos);
  EXPECT_NE(message(0, TimingOptions{}).find("runs=30 warmup=5 batch=1 n_sets=0" + want), std::string::npos);
  EXPECT_EQ(calls, 0);
}

TEST(GpuBenchTiming, DescribesTheMethod) {
  EXPECT_EQ(describe_timing(TimingOptions{5, 30, 1}), "median of 30 after 5 warm-ups");
  EXPECT_EQ(describe_timing(TimingOptions{2, 20, 10}),
            "median of 20 after 2 warm-ups, a sample 10 back-to-back launches (times per launch)");
}

}  // namespace
}  // namespace fp4moe::tune
