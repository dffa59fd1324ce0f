// The autotuner (see autotune.h): the tuning loop and the running device's key.
// Tested by tests/tune/test_autotune_gpu.cpp.
#include "tune/autotune.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <limits>

#include "core/error.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device.h"
#include "plan/w4a16_smem.h"
#include "tune/routing_counts.h"

namespace fp4moe::tune {

TuneKey current_tune_key() {
  std::string why;
  FP4MOE_CHECK(cuda::cuda_device_available(&why)) << "cannot key the tune cache: no usable GPU: " << why;
  int device = 0;
  FP4MOE_CUDA_CHECK(cudaGetDevice(&device));
  cudaDeviceProp prop{};
  FP4MOE_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  TuneKey k;
  k.gpu_name = prop.name;
  k.n_sms = prop.multiProcessorCount;
  FP4MOE_CUDA_CHECK(cudaRuntimeGetVersion(&k.cuda_runtime));
  FP4MOE_CUDA_CHECK(cudaDriverGetVersion(&k.cuda_driver));
  k.build_id = build_id();
  k.layout_version = layout_version();
  return k;
}

plan::GpuSpec current_gpu_spec() {
  int device = 0;
  FP4MOE_CUDA_CHECK(cudaGetDevice(&device));
  std::string why;
  const std::optional<plan::RuntimeGpu> rt = plan::query_runtime_gpu(device, &why);
  FP4MOE_CHECK(rt.has_value()) << "cannot read the limits of device " << device << ": " << why;
  return plan::resolve_runtime_gpu(*rt).spec;
}

std::vector<TuneEntry> autotune(const std::vector<GemmShape>& shapes, const TuneOptions& opts, const plan::GpuSpec& gpu) {
  FP4MOE_CHECK(!shapes.empty() && !opts.buckets.empty())
      << "autotune: " << shapes.size() << " shapes and " << opts.buckets.size() << " token buckets: nothing to tune";
  // Feasible configs of every (shape, bucket) first: the progress total, and planner errors
  // before any GPU memory is taken.
  std::vector<std::vector<std::vector<int>>> feasible(shapes.size());
  int total = 0;
  for (size_t s = 0; s < shapes.size(); ++s) {
    for (int64_t b : opts.buckets) {
      FP4MOE_CHECK(token_bucket(b) == b) << "autotune: " << b << " is not a token-count bucket";
      feasible[s].push_back(feasible_configs(shapes[s], b, gpu));
      total += static_cast<int>(feasible[s].back().size());
    }
  }
  const int64_t max_bucket = *std::max_element(opts.buckets.begin(), opts.buckets.end());
  std::vector<TuneEntry> out;
  int done = 0;
  for (size_t s = 0; s < shapes.size(); ++s) {
    const GemmShape& shape = shapes[s];
    FP4MOE_CHECK(shape.n_experts * max_bucket <= std::numeric_limits<int32_t>::max())
        << "autotune: " << shape.to_string() << " x " << max_bucket << " tokens per expert exceeds int32 rows";
    W4A16Workload work(shape, shape.n_experts * max_bucket);
    for (size_t bi = 0; bi < opts.buckets.size(); ++bi) {
      const int64_t bucket = opts.buckets[bi];
      work.set_counts(uniform_counts(shape.n_experts, bucket));
      std::vector<std::pair<double, int>> timed;
      for (int id : feasible[s][bi]) {
        if (opts.progress) {
          opts.progress({done, total,
                         shape.to_string() + " tok/e " + std::to_string(bucket) + " " +
                             plan::w4a16_config_name(plan::kW4A16Configs[id])});
        }
        timed.emplace_back(work.time_config_us(id, opts.timing), id);
        ++done;
      }
      std::stable_sort(timed.begin(), timed.end());
      TuneEntry e;
      e.shape = shape;
      e.bucket = bucket;
      e.config_id = timed[0].second;
      e.config = plan::w4a16_config_name(plan::kW4A16Configs[e.config_id]);
      e.time_us = timed[0].first;
      if (timed.size() > 1) {
        e.runner_up_id = timed[1].second;
        e.runner_up = plan::w4a16_config_name(plan::kW4A16Configs[e.runner_up_id]);
        e.runner_up_us = timed[1].first;
      }
      e.iters = opts.timing.runs;
      e.n_candidates = static_cast<int>(timed.size());
      out.push_back(e);
    }
  }
  if (opts.progress) opts.progress({done, total, "done"});
  return out;
}

ConfigChooser chooser_for_current_device(const std::string& path) {
  return ConfigChooser(TuneCache::load(path), current_tune_key(), current_gpu_spec());
}

}  // namespace fp4moe::tune
