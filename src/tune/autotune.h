// The autotuner of sm90_nvfp4_w4a16_grouped_gemm: for each problem shape and token-count bucket,
// time every config the planner accepts on this GPU (uniform routing, bucket tokens per expert;
// gpu_bench.h's method) and keep the fastest, with the runner-up. Needs a GPU; built only with CUDA.
//
//   TuneKey key = current_tune_key();
//   for (const TuneEntry& e : autotune(shapes, opts, current_gpu_spec())) cache.put(key, e);
//
// Tested by tests/tune/test_autotune_gpu.cpp (label gpu: skips with the reason without a GPU).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "plan/gpu_table.h"
#include "tune/gpu_bench.h"
#include "tune/tune_cache.h"

namespace fp4moe::tune {

// The key of device 0 now: name, SM count, CUDA runtime and driver versions, build_id(),
// layout_version(). Throws (with the CUDA error) without a device.
TuneKey current_tune_key();
// The planner's view of device 0: the GPU table entry with the runtime's limits written over it.
plan::GpuSpec current_gpu_spec();

struct TuneProgress {
  int done = 0, total = 0;  // configs timed so far / in all
  std::string what;         // "E=32,N=4096,K=6144 tok/e 8 w4a16_swapab_m64n8k256_s4"
};

struct TuneOptions {
  std::vector<int64_t> buckets{std::begin(kTokenBuckets), std::end(kTokenBuckets)};
  TimingOptions timing{};
  std::function<void(const TuneProgress&)> progress;  // called before each config is timed
};

// One TuneEntry per (shape, bucket), in shape-then-bucket order. Throws the planner's message when
// no config fits a shape.
std::vector<TuneEntry> autotune(const std::vector<GemmShape>& shapes, const TuneOptions& opts, const plan::GpuSpec& gpu);

// The chooser for device 0 with the cache at `path` (TuneCache::load: corrupt files are ignored
// with a warning in cache().warnings()).
ConfigChooser chooser_for_current_device(const std::string& path = default_cache_path());

}  // namespace fp4moe::tune
