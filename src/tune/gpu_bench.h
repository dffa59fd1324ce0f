// GPU timing of the W4A16 grouped GEMM and its cuBLAS BF16 peer, shared by the autotuner
// (autotune.h), `fp4moe bench gemm` (tools/bench_gemm.cpp) and bench/bench_w4a16: one
// implementation of the method (CUDA events around each launch on the default stream, warm-ups,
// median; weight sets rotated so that one round touches more than 3x the L2, so no timed launch
// finds its weights in L2) and of the HBM roofline (a device-to-device copy).
// Built only with CUDA. Tested on the GPU by tests/tune/test_autotune_gpu.cpp (label gpu).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "tune/tune_cache.h"

namespace fp4moe::tune {

struct TimingOptions {
  int warmup = 5;
  int runs = 30;  // median of these
  // Calls of fn a timed sample (back to back between its two events; the sample's time / batch). 1: each
  // call alone on an idle GPU, so its time includes the launch's own latency (the events' gap to the
  // kernel, ~2-5 us); more: that latency hidden behind the queued calls, as a model step's launches are
  // (each kernel's own fill and drain stays in).
  int batch = 1;
};

// Median over opts.runs samples of opts.batch back-to-back fn(set) calls timed with CUDA events on the
// default stream (per call: the sample's time / batch), after opts.warmup untimed calls; `set` cycles
// 0..n_sets-1 over every call. Microseconds. Throws naming the numbers unless runs >= 1, warmup >= 0,
// batch >= 1 and n_sets >= 1 (before touching the GPU).
double time_median_us(const std::function<void(int set)>& fn, int n_sets, const TimingOptions& opts);
// The method in words, for the benchmarks' headers: "median of 30 after 5 warm-ups", and with batch > 1
// ", a sample 10 back-to-back launches (times per launch)" after it.
std::string describe_timing(const TimingOptions& opts);

// The device's L2 size in bytes (cudaDevAttrL2CacheSize of the current device).
int64_t device_l2_bytes();

// Device-to-device cudaMemcpy of 2 x 1 GiB buffers, median of 10: bytes read + written per second.
double measure_copy_bandwidth();

// Weights (NVFP4 codes + e4m3 scales + global scales), activations, outputs and offsets for one
// shape, with enough weight sets to defeat the L2. Filled with deterministic random values.
class W4A16Workload {
 public:
  // Buffers for up to max_m_total token rows in all. E = 1 (a dense Linear) also gets the split-K
  // workspace GpuLinear passes (w4a16_splitk_plan), so E = 1 timings are the model's.
  W4A16Workload(const GemmShape& shape, int64_t max_m_total);
  ~W4A16Workload();
  W4A16Workload(const W4A16Workload&) = delete;
  W4A16Workload& operator=(const W4A16Workload&) = delete;

  // Tokens per expert (size E, sum <= max_m_total): uploads the offsets.
  void set_counts(const std::vector<int32_t>& counts);
  // One launch of config `config_id` on weight set `set` (the default stream).
  void launch(int config_id, int set);
  // Median time of config `config_id` over the rotating weight sets.
  double time_config_us(int config_id, const TimingOptions& opts);

  int n_sets() const;
  int64_t m_total() const;
  const GemmShape& shape() const;
  // NVFP4 codes + e4m3 scales of one set in the kernel layout (what a launch with every expert
  // active reads; the checkpoint's E x N x K x 9/16 bytes when N % 16 == 0 and K % 512 == 0).
  double weight_bytes() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// cuBLAS BF16 on the same problem: the BF16 weights [E, N, K], the same token rows. Uniform
// counts run one cublasGemmStridedBatchedEx; uneven counts a loop of cublasGemmEx over the
// non-empty experts (the 16-bit path a skewed batch would take without a grouped kernel).
class CublasBf16Peer {
 public:
  CublasBf16Peer(const GemmShape& shape, int64_t max_m_total);
  ~CublasBf16Peer();
  CublasBf16Peer(const CublasBf16Peer&) = delete;
  CublasBf16Peer& operator=(const CublasBf16Peer&) = delete;

  void set_counts(const std::vector<int32_t>& counts);
  double time_us(const TimingOptions& opts);
  // "cublasGemmStridedBatchedEx" or "cublasGemmEx x<n> (loop)" for the current counts.
  std::string method() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace fp4moe::tune
