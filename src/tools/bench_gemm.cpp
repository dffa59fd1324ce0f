// `fp4moe bench gemm`: times sm90_nvfp4_w4a16_grouped_gemm against cuBLAS BF16 in the same process.
//
//   fp4moe bench gemm [--shape E,N,K[,...]] [--tokens 1,2,...,512] [--routing uniform,zipf]
//       [--zipf-s 1.1] [--seed 1] [--runs 30] [--warmup 5] [--batch 1] [--cache PATH] [--peak-tflops 780]
//       [--hbm-tbs 4.2] [--json]
//
// Default shapes: the GLM-5 expert shard E=32 (gate_up N=4096 K=6144, down N=6144 K=2048), tokens
// per expert 1..512, uniform and Zipf-skewed routing (the same total, seeded; cuBLAS then loops
// cublasGemmEx over the non-empty experts). The config is the autotuned winner when the tune cache
// has one for this GPU and build, else w4a16_default_config; the row says which. Each row: time,
// TFLOP/s, GB/s of the NVFP4 weight + scale bytes of the experts that received tokens, that as a
// fraction of the device-to-device copy bandwidth measured at the start and of the nominal HBM
// (4.2 TB/s), the fraction of the BF16 tensor peak, the peer's time and the ratio peer / ours.
// The timing method is tune/gpu_bench.h's (shared with `fp4moe tune` and bench/bench_w4a16); --batch N times
// N back-to-back launches a sample (ours and the peer alike) and reports per launch, the launch latency hidden.
// Tested by tests/tune/test_cmd_tune.cpp (option parsing and the no-GPU failure).
#include "tools/bench_gemm.h"

#include <CLI/CLI.hpp>
#include <fmt/core.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <numeric>
#include <string>
#include <vector>

#include "core/error.h"
#include "plan/w4a16_smem.h"
#include "tune/routing_counts.h"
#include "tools/cli_options.h"
#include "tune/tune_cache.h"
#ifdef FP4MOE_HAVE_CUDA
#include "kernels/cuda/device.h"
#include "kernels/cuda/sm90/w4a16_grouped_gemm.h"
#include "tune/autotune.h"
#include "tune/gpu_bench.h"
#endif

namespace fp4moe::tools {
namespace {

struct BenchGemmArgs {
  std::string shapes;  // empty: the GLM-5 shard
  std::string tokens = "1,2,4,8,16,32,64,128,256,512";
  std::string routing = "uniform,zipf";
  double zipf_s = 1.1;
  uint64_t seed = 1;
  int runs = 30;
  int warmup = 5;
  int batch = 1;  // launches a timed sample (tune::TimingOptions::batch)
  std::string cache;
  double peak_tflops = 780;  // H200 BF16 dense (cuBLAS measured on the device machine)
  double hbm_tbs = 4.2;      // nominal HBM of an H200 (fraction shown next to the measured copy roofline)
  bool json = false;
};

struct NamedShape {
  std::string name;
  tune::GemmShape shape;
};

struct Plan {
  std::vector<NamedShape> shapes;
  std::vector<int64_t> tokens;
  std::vector<std::string> routings;
};

// Everything that can be checked without a GPU, so bad options fail the same way everywhere.
Plan make_plan(const BenchGemmArgs& a) {
  Plan p;
  if (a.shapes.empty()) {
    p.shapes = {{"gate_up", {32, 4096, 6144}}, {"down", {32, 6144, 2048}}};
  } else {
    int i = 0;
    for (const tune::GemmShape& s : tune::parse_shape_list(a.shapes)) p.shapes.push_back({"gemm" + std::to_string(i++), s});
  }
  p.tokens = tune::parse_positive_list(a.tokens, "--tokens");
  std::string_view rest = a.routing;
  while (true) {
    const size_t comma = rest.find(',');
    const std::string r(rest.substr(0, comma));
    FP4MOE_CHECK(r == "uniform" || r == "zipf")
        << "fp4moe bench gemm: --routing '" << a.routing << "': unknown routing '" << r << "' (uniform, zipf)";
    p.routings.push_back(r);
    if (comma == std::string_view::npos) break;
    rest = rest.substr(comma + 1);
  }
  FP4MOE_CHECK(a.zipf_s > 0) << "fp4moe bench gemm: --zipf-s " << a.zipf_s << " must be > 0";
  FP4MOE_CHECK(a.runs >= 1 && a.warmup >= 0) << "fp4moe bench gemm: --runs " << a.runs << " must be >= 1 and --warmup "
                                              << a.warmup << " >= 0";
  FP4MOE_CHECK(a.batch >= 1) << "fp4moe bench gemm: --batch " << a.batch << " must be >= 1 (launches a timed sample)";
  FP4MOE_CHECK(a.peak_tflops > 0 && a.hbm_tbs > 0)
      << "fp4moe bench gemm: --peak-tflops " << a.peak_tflops << " and --hbm-tbs " << a.hbm_tbs << " must be > 0";
  return p;
}

#ifdef FP4MOE_HAVE_CUDA
void run_bench_gemm(const BenchGemmArgs& a) {
  const Plan p = make_plan(a);
  std::string why;
  FP4MOE_CHECK(cuda::cuda_device_available(&why)) << "fp4moe bench gemm needs a usable GPU: " << why;
  const tune::TimingOptions timing{a.warmup, a.runs, a.batch};
  const std::string cache_path = a.cache.empty() ? tune::default_cache_path() : a.cache;
  const tune::TuneCache cache = tune::TuneCache::load(cache_path);
  for (const std::string& w : cache.warnings()) fmt::print(stderr, "fp4moe bench gemm: warning: {}\n", w);
  const tune::TuneKey key = tune::current_tune_key();
  if (const auto diffs = cache.stale_fields(key); !diffs.empty()) {
    fmt::print(stderr, "fp4moe bench gemm: {}; using the default configs\n", tune::describe_stale(cache_path, diffs));
  }
  const std::string device = cuda::cuda_device_description(0);
  const double copy_bps = tune::measure_copy_bandwidth();
  const double peak = a.peak_tflops * 1e12, nominal_hbm = a.hbm_tbs * 1e12;
  if (!a.json) {
    fmt::print("bench gemm: {}; {}; tune cache {}\n", device, tune::describe_timing(timing), cache_path);
    fmt::print("HBM roofline (D2D copy, read + write, this run): {:.2f} TB/s (nominal {:.1f}); BF16 peak {:.0f} TFLOP/s\n",
               copy_bps / 1e12, a.hbm_tbs, a.peak_tflops);
    fmt::print("{:<8} {:>4} {:>5} {:>5} {:>5} {:<7} | {:<28} {:<7} {:>8} {:>7} {:>6} {:>6} {:>6} {:>6} | {:<24} {:>8} {:>6}\n",
               "shape", "E", "N", "K", "tok/e", "routing", "config", "source", "us", "TFLOP/s", "GB/s", "%copy",
               "%HBM", "%bf16", "peer", "peer us", "ratio");
  }
  nlohmann::json rows = nlohmann::json::array();
  const int64_t max_tokens = *std::max_element(p.tokens.begin(), p.tokens.end());
  for (const NamedShape& ns : p.shapes) {
    const tune::GemmShape& s = ns.shape;
    tune::W4A16Workload ours(s, s.n_experts * max_tokens);
    tune::CublasBf16Peer peer(s, s.n_experts * max_tokens);
    const double bytes_per_expert = ours.weight_bytes() / static_cast<double>(s.n_experts);
    for (int64_t t : p.tokens) {
      for (const std::string& routing : p.routings) {
        const std::vector<int32_t> counts = routing == "uniform"
                                                ? tune::uniform_counts(s.n_experts, t)
                                                : tune::zipf_counts(s.n_experts, s.n_experts * t, a.zipf_s, a.seed);
        ours.set_counts(counts);
        peer.set_counts(counts);
        const std::optional<int> tuned = cache.lookup(key, s, t);
        const int config = tuned ? *tuned : cuda::sm90::w4a16_default_config(t, s.n_experts);
        const double us = ours.time_config_us(config, timing);
        const double peer_us = peer.time_us(timing);
        const int64_t m_total = std::accumulate(counts.begin(), counts.end(), int64_t{0});
        const auto active = std::count_if(counts.begin(), counts.end(), [](int32_t c) { return c > 0; });
        const double flops = 2.0 * static_cast<double>(m_total) * static_cast<double>(s.n) * static_cast<double>(s.k);
        const double bytes = bytes_per_expert * static_cast<double>(active);
        const double bps = bytes / (us * 1e-6), flops_s = flops / (us * 1e-6);
        const std::string config_name = plan::w4a16_config_name(plan::kW4A16Configs[config]);
        const std::string source = tuned ? "tuned" : "default";
        nlohmann::json row = {{"shape", ns.name},
                              {"E", s.n_experts},
                              {"N", s.n},
                              {"K", s.k},
                              {"tokens_per_expert", t},
                              {"routing", routing},
                              {"counts", routing == "uniform" ? "uniform" : tune::describe_counts(counts)},
                              {"active_experts", active},
                              {"config", config_name},
                              {"config_source", source},
                              {"time_us", us},
                              {"tflops", flops_s / 1e12},
                              {"weight_gbps", bps / 1e9},
                              {"frac_copy_bw", bps / copy_bps},
                              {"frac_nominal_hbm", bps / nominal_hbm},
                              {"frac_bf16_peak", flops_s / peak},
                              {"peer", peer.method()},
                              {"peer_us", peer_us},
                              {"ratio", peer_us / us}};
        rows.push_back(row);
        if (!a.json) {
          fmt::print("{:<8} {:>4} {:>5} {:>5} {:>5} {:<7} | {:<28} {:<7} {:>8.1f} {:>7.1f} {:>6.0f} {:>5.1f}% {:>5.1f}% "
                     "{:>5.1f}% | {:<24} {:>8.1f} {:>5.2f}x\n",
                     ns.name, s.n_experts, s.n, s.k, t, routing, config_name, source, us, flops_s / 1e12, bps / 1e9,
                     100.0 * bps / copy_bps, 100.0 * bps / nominal_hbm, 100.0 * flops_s / peak, peer.method(), peer_us,
                     peer_us / us);
          std::fflush(stdout);
        }
      }
    }
  }
  if (a.json) {
    const nlohmann::json out = {{"schema", "fp4moe.bench.gemm.v1"},
                                {"device", device},
                                {"tune_cache", cache_path},
                                {"copy_bandwidth_tbs", copy_bps / 1e12},
                                {"nominal_hbm_tbs", a.hbm_tbs},
                                {"bf16_peak_tflops", a.peak_tflops},
                                {"runs", a.runs},
                                {"warmup", a.warmup},
                                {"batch", a.batch},
                                {"zipf_s", a.zipf_s},
                                {"seed", a.seed},
                                {"rows", rows}};
    fmt::print("{}\n", out.dump(2));
  }
}
#else
void run_bench_gemm(const BenchGemmArgs& a) {
  make_plan(a);
  FP4MOE_FAIL() << "fp4moe bench gemm needs a GPU, and this build has no CUDA (configured without nvcc or with "
                   "-DFP4MOE_CUDA=OFF)";
}
#endif

}  // namespace

void add_bench_gemm_command(CLI::App& bench) {
  auto args = std::make_shared<BenchGemmArgs>();
  CLI::App* cmd = bench.add_subcommand("gemm", "W4A16 grouped GEMM vs cuBLAS BF16 on MoE expert shapes");
  cmd->add_option("--shape", args->shapes, "shapes E,N,K[,E,N,K...] (default: GLM-5 shard 32,4096,6144,32,6144,2048)");
  cmd->add_option("--tokens", args->tokens, "tokens per expert (default 1,2,4,...,512)");
  cmd->add_option("--routing", args->routing, "uniform, zipf or both (default uniform,zipf)");
  cmd->add_option("--zipf-s", args->zipf_s, "Zipf exponent of the skewed routing (default 1.1)");
  cmd->add_option("--seed", args->seed, "seed of the skewed routing draw (default 1)")->check(unsigned_64());
  cmd->add_option("--runs", args->runs, "timed runs per row; the median is reported (default 30)");
  cmd->add_option("--warmup", args->warmup, "untimed runs first (default 5)");
  cmd->add_option("--batch", args->batch,
                  "launches a timed sample, back to back; times are per launch (default 1: each launch alone)");
  cmd->add_option("--cache", args->cache, "tune cache (default $FP4MOE_TUNE_CACHE or ~/.cache/fp4moe/tune.json)");
  cmd->add_option("--peak-tflops", args->peak_tflops, "BF16 tensor peak for the fraction column (default 780)");
  cmd->add_option("--hbm-tbs", args->hbm_tbs, "nominal HBM bandwidth in TB/s for the fraction column (default 4.2)");
  cmd->add_flag("--json", args->json, "print JSON (schema fp4moe.bench.gemm.v1)");
  cmd->callback([args] { run_bench_gemm(*args); });
}

}  // namespace fp4moe::tools
