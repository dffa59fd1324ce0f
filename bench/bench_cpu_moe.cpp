// CPU MoE layer throughput (tokens/s) for the golden tiny shape and a mid-size shape, experts in
// BF16 and NVFP4, prints one table row per (shape, format, tokens): median of >= 30 timed runs
// after warm-up, rotating among input buffers; GFLOP/s counts router + routed + shared matmuls,
// GB/s the expert weight bytes the step touches (active experts + shared).
// Run: build/bench/bench_cpu_moe [--runs N] (threads: FP4MOE_CPU_THREADS, default all cores).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/thread_pool.h"
#include "moe/moe_layer.h"

namespace {

using fp4moe::kernels::cpu::WeightFormat;
using fp4moe::moe::MoeConfig;
using fp4moe::moe::MoeLayer;
using fp4moe::moe::MoeTrace;

struct Shape {
  const char* name;
  int n_experts, top_k, n_shared;
  int64_t hidden, intermediate;
};

MoeConfig make_config(const Shape& s) {
  MoeConfig c;
  c.hidden = s.hidden;
  c.moe_intermediate = s.intermediate;
  c.n_experts = s.n_experts;
  c.top_k = s.top_k;
  c.n_shared_experts = s.n_shared;
  c.routed_scaling_factor = 2.5f;
  return c;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  int runs = 30;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--runs") == 0 && i + 1 < argc) {
      runs = std::max(1, std::atoi(argv[++i]));
    } else {
      std::fprintf(stderr, "usage: %s [--runs N]\n", argv[0]);
      return 2;
    }
  }
  const Shape shapes[] = {
      {"tiny E16 top4 H128 I64 +1", 16, 4, 1, 128, 64},      // the golden glm*_tiny MoE layer
      {"mid E64 top8 H1024 I256 +1", 64, 8, 1, 1024, 256},
  };
  const int64_t token_counts[] = {1, 8, 64};
  std::printf("CPU MoE layer, %d threads, median of %d runs\n", fp4moe::kernels::cpu::default_thread_pool().n_threads(),
              runs);
  std::printf("%-28s %-6s %6s %10s %12s %9s %8s %7s %6s\n", "shape", "format", "tokens", "ms", "tokens/s", "GFLOP/s",
              "GB/s", "active", "max/e");
  for (const Shape& s : shapes) {
    const MoeConfig cfg = make_config(s);
    for (WeightFormat fmt : {WeightFormat::kBF16, WeightFormat::kNVFP4}) {
      const MoeLayer layer = MoeLayer::random(cfg, fmt, 1234);
      const int64_t expert_bytes = layer.experts()[0].gate.weight_bytes() * 3;
      const int64_t shared_bytes =
          layer.shared() ? layer.shared()->gate.weight_bytes() + layer.shared()->up.weight_bytes() +
                               layer.shared()->down.weight_bytes()
                         : 0;
      for (int64_t n : token_counts) {
        // 4 input buffers rotated so repeated runs do not see identical data in cache.
        std::mt19937_64 rng(static_cast<uint64_t>(n));
        std::normal_distribution<float> nd(0.0f, 1.0f);
        std::vector<std::vector<float>> xs(4, std::vector<float>(static_cast<size_t>(n * cfg.hidden)));
        for (auto& x : xs) {
          for (auto& v : x) v = nd(rng);
        }
        std::vector<float> y(static_cast<size_t>(n * cfg.hidden));
        MoeTrace trace;
        for (int w = 0; w < 3; ++w) layer.forward(xs[w % 4].data(), n, y.data(), &trace);
        std::vector<double> ms;
        double active = 0, max_per_expert = 0;
        for (int r = 0; r < runs; ++r) {
          const auto t0 = std::chrono::steady_clock::now();
          layer.forward(xs[r % 4].data(), n, y.data(), &trace);
          const auto t1 = std::chrono::steady_clock::now();
          ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
          active += trace.plan.n_active_experts();
          max_per_expert += static_cast<double>(trace.plan.max_tokens_per_expert());
        }
        active /= runs;
        max_per_expert /= runs;
        const double t = median(ms);
        const double flops = 2.0 * static_cast<double>(n) *
                             (static_cast<double>(cfg.n_experts * cfg.hidden) +
                              3.0 * static_cast<double>(cfg.hidden * cfg.moe_intermediate) * cfg.top_k +
                              3.0 * static_cast<double>(cfg.hidden * cfg.shared_intermediate()));
        const double bytes = active * static_cast<double>(expert_bytes) + static_cast<double>(shared_bytes);
        std::printf("%-28s %-6s %6lld %10.3f %12.1f %9.2f %8.2f %7.1f %6.1f\n", s.name,
                    std::string(fp4moe::kernels::cpu::weight_format_name(fmt)).c_str(), static_cast<long long>(n), t,
                    static_cast<double>(n) / (t / 1e3), flops / (t / 1e3) / 1e9, bytes / (t / 1e3) / 1e9, active,
                    max_per_expert);
      }
    }
  }
  return 0;
}
