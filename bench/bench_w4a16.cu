// Benchmark of sm90_nvfp4_w4a16_grouped_gemm against cuBLAS BF16 (cublasGemmStridedBatchedEx, uniform
// routing) on the GLM-5 expert shard: E=32, gate_up N=4096 K=6144 and down N=6144 K=2048, tokens per
// expert 1..256 (or --tokens a,b,c). Every shipped config is timed; the table shows the fastest
// (and the default config's time, the best mma.sync config's and the best wgmma config's), TFLOP/s, GB/s of NVFP4
// weight + scale bytes, the fraction of the HBM roofline (device-to-device copy bandwidth measured in the same run,
// bytes read + written) and of the BF16 tensor peak (780 TFLOP/s on an H200), the cuBLAS time and the speedup (cuBLAS
// time / ours). The method and the workloads are tune/gpu_bench.h's, shared with `fp4moe tune` and `fp4moe bench gemm`
// (which also covers Zipf routing and the autotuned choice): CUDA events around each launch, 5 warm-ups, median of 30;
// weight sets rotate so the bytes touched between two launches of a set exceed 3x the L2. --batch N times N
// back-to-back launches a sample (ours and the peer alike) and reports the sample / N: the launch's own latency (events
// to kernel, ~2-5 us a launch) hidden as in a model step's stream of launches; each kernel's fill and drain stay in.
// --shape E,N,K (repeatable) replaces the two shard shapes, e.g. --shape 1,6144,16384 for a dense
// E = 1 Linear (GLM-5's o_proj). --all-configs adds, under each row, every config's time (us), to pick
// defaults between configs the row's best hides. Run: bench_w4a16 [--tokens 1,2,8] [--shape E,N,K]...
// [--runs 30] [--batch 1] [--all-configs].
// Needs a Hopper GPU; exits non-zero on errors.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "core/error.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/sm90/w4a16_grouped_gemm.h"
#include "tune/gpu_bench.h"
#include "tune/routing_counts.h"
#include "tune/tune_cache.h"

namespace {

using namespace fp4moe;
constexpr double kBf16PeakFlops = 780e12;  // H200 cuBLAS BF16 measured on the device machine (H200.md)

struct Shape {
  std::string name;
  tune::GemmShape shape;
};

int run(const std::vector<Shape>& shapes, const std::vector<int64_t>& tokens_list, int runs, int batch,
        bool all_configs) {
  std::string why;
  if (!cuda::cuda_device_available(&why)) {
    std::fprintf(stderr, "bench_w4a16: no usable GPU: %s\n", why.c_str());
    return 1;
  }
  const tune::TimingOptions timing{5, runs, batch};
  std::printf("bench_w4a16: %s, L2 %lld MB, %s\n", cuda::cuda_device_description(0).c_str(),
              static_cast<long long>(tune::device_l2_bytes() >> 20), tune::describe_timing(timing).c_str());
  const double hbm_bps = tune::measure_copy_bandwidth();
  std::printf("HBM roofline (D2D copy, read + write, this run): %.2f TB/s; BF16 peak used: %.0f TFLOP/s\n",
              hbm_bps / 1e12, kBf16PeakFlops / 1e12);
  const int64_t max_tokens = *std::max_element(tokens_list.begin(), tokens_list.end());
  std::printf("%-8s %6s %6s %5s | %-28s %9s %9s %7s %7s %7s %9s %9s %9s | %9s %7s\n", "shape", "N", "K", "tok/e",
              "best config", "time us", "TFLOP/s", "GB/s", "%HBM", "%bf16pk", "dflt us", "mma.s us", "wgmma us",
              "cuBLAS us", "speedup");
  for (const Shape& s : shapes) {
    const tune::GemmShape& g = s.shape;
    tune::W4A16Workload ours(g, g.n_experts * max_tokens);
    tune::CublasBf16Peer peer(g, g.n_experts * max_tokens);
    for (int64_t tokens : tokens_list) {
      const std::vector<int32_t> counts = tune::uniform_counts(g.n_experts, tokens);
      ours.set_counts(counts);
      peer.set_counts(counts);
      double best_us = 1e30, default_us = 0;
      double best_mma_sync_us = 1e30, best_wgmma_us = 1e30;  // per kernel kind
      int best_cfg = -1;
      std::string every;  // --all-configs: "name us" of each config
      const int default_cfg = cuda::sm90::w4a16_default_config(tokens, g.n_experts);
      for (int cfg = 0; cfg < cuda::sm90::w4a16_num_configs(); ++cfg) {
        const double us = ours.time_config_us(cfg, timing);
        if (all_configs) {
          char item[96];
          std::snprintf(item, sizeof(item), "%s %s %.1f", every.empty() ? "" : ",",
                        cuda::sm90::w4a16_config_name(cuda::sm90::w4a16_config(cfg)).c_str(), us);
          every += item;
        }
        if (us < best_us) {
          best_us = us;
          best_cfg = cfg;
        }
        if (cfg == default_cfg) default_us = us;
        const cuda::sm90::W4A16Kind kind = cuda::sm90::w4a16_config(cfg).kind;
        double& kind_best = kind == cuda::sm90::W4A16Kind::kWgmma ? best_wgmma_us : best_mma_sync_us;
        kind_best = std::min(kind_best, us);
      }
      const double cublas_us = peer.time_us(timing);
      const double flops = 2.0 * static_cast<double>(ours.m_total()) * static_cast<double>(g.n) * static_cast<double>(g.k);
      const double gbps = ours.weight_bytes() / (best_us * 1e-6) / 1e9;
      const double tflops = flops / (best_us * 1e-6) / 1e12;
      std::printf("%-8s %6lld %6lld %5lld | %-28s %9.1f %9.1f %7.0f %6.1f%% %6.2f%% %9.1f %9.1f %9.1f | %9.1f %6.2fx\n",
                  s.name.c_str(),
                  static_cast<long long>(g.n), static_cast<long long>(g.k), static_cast<long long>(tokens),
                  cuda::sm90::w4a16_config_name(cuda::sm90::w4a16_config(best_cfg)).c_str(), best_us, tflops, gbps,
                  100.0 * gbps * 1e9 / hbm_bps, 100.0 * tflops * 1e12 / kBf16PeakFlops, default_us, best_mma_sync_us,
                  best_wgmma_us, cublas_us, cublas_us / best_us);
      if (all_configs) std::printf("  every config (us):%s\n", every.c_str());
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    std::vector<int64_t> tokens = {1, 2, 4, 8, 16, 32, 64, 128, 256};
    std::vector<Shape> shapes;
    int runs = 30, batch = 1;
    bool all_configs = false;
    for (int i = 1; i < argc; ++i) {
      const std::string arg = argv[i];
      if (arg == "--tokens" && i + 1 < argc) {
        tokens = fp4moe::tune::parse_positive_list(argv[++i], "--tokens");
      } else if (arg == "--shape" && i + 1 < argc) {
        const std::vector<int64_t> enk = fp4moe::tune::parse_positive_list(argv[++i], "--shape");
        if (enk.size() != 3) {
          std::fprintf(stderr, "bench_w4a16: --shape %s: want E,N,K (3 numbers, got %zu)\n", argv[i], enk.size());
          return 2;
        }
        char name[32];
        std::snprintf(name, sizeof(name), "E%lld", static_cast<long long>(enk[0]));
        shapes.push_back({name, {enk[0], enk[1], enk[2]}});
      } else if (arg == "--runs" && i + 1 < argc) {
        runs = std::max(1, std::atoi(argv[++i]));
      } else if (arg == "--batch" && i + 1 < argc) {
        batch = std::max(1, std::atoi(argv[++i]));
      } else if (arg == "--all-configs") {
        all_configs = true;
      } else {
        std::fprintf(
            stderr, "usage: bench_w4a16 [--tokens 1,2,8] [--shape E,N,K]... [--runs 30] [--batch 1] [--all-configs]\n");
        return 2;
      }
    }
    if (shapes.empty()) shapes = {{"gate_up", {32, 4096, 6144}}, {"down", {32, 6144, 2048}}};
    return run(shapes, tokens, runs, batch, all_configs);
  } catch (const fp4moe::Error& e) {
    std::fprintf(stderr, "bench_w4a16: %s\n", e.what());
    return 1;
  }
}
