// `fp4moe bench moe`: the fused NVFP4 MoE layer (moe/gpu_moe_layer.h, W4A16 grouped GEMMs) against
// the BF16 MoE layer built from cuBLAS + the same routing/permute kernels, in the same run, on GLM-5
// shapes with dummy weights made on the device:
//   shard: E=32 top-8, H=6144, I=2048, one shared expert (a GLM-5 expert shard)
//   full:  E=256 top-8, same H/I (the whole GLM-5 MoE layer)
// for each token count (default 64, 512, 4096) and routing: uniform, or Zipf-skewed, forced through
// the router's e_score_correction_bias (moe::GpuDummyRouting: b_e = -s * 0.16 * ln(1 + e) on
// logits ~ N(0, 1), so expert e is chosen with probability ~ (1 + e)^-s; the realized active
// experts and max rows per expert are printed). Each forward is timed with CUDA events after an L2
// flush (a 512 MiB memset outside the events), warmup + median of --iters. Per row: time, weight
// GB/s and fraction of the HBM roofline counted over the weight + scale bytes of the experts
// actually hit (+ the shared expert) / --hbm-bw (default 4.2e12 B/s), TFLOP/s, the peer's time and
// the speedup (peer / ours), the W4A16 config used. --json prints the rows as JSON.
// The BF16 peer synchronizes once per forward (cuBLAS needs the per-expert counts on the host);
// its time includes that, as any cuBLAS-loop MoE layer's would. --graph times the NVFP4 layer as a
// CUDA-graph replay (how a serving engine runs it); the peer cannot be captured and stays eager.
//
//   fp4moe bench moe [--layer shard|full|both] [--tokens 64,512,4096] [--routing uniform|zipf|both]
//       [--zipf-s 1.0] [--warmup 5] [--iters 30] [--hbm-bw 4.2e12] [--no-peer] [--graph] [--json]
//       [--experts E --hidden H --inter I --top-k K --shared N]  (a custom shape instead of --layer)
//
// The lead's cmd_bench.cpp creates the `bench` parent and calls add_bench_moe_command on it.
// Tested by tests/tools/test_bench_moe.cpp (CLI parsing, refusals and the row arithmetic on the
// CPU; a small run on the GPU, label gpu).
#pragma once

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace CLI {
class App;
}

namespace fp4moe::tools {

struct BenchMoeOptions {
  std::string layer = "both";  // shard, full, both
  std::vector<int64_t> tokens = {64, 512, 4096};
  std::string routing = "both";  // uniform, zipf, both
  double zipf_s = 1.0;
  int warmup = 5;
  int iters = 30;
  double hbm_bytes_per_s = 4.2e12;
  bool peer = true;
  bool json = false;
  bool graph = false;  // time the NVFP4 forward as a CUDA-graph replay
  bool tuned = false;  // pick the W4A16 configs with the autotuner's cache (`fp4moe tune`), else the defaults
  std::string cache;   // tune cache path ("" = $FP4MOE_TUNE_CACHE or ~/.cache/fp4moe/tune.json)
  uint64_t seed = 1;
  // A custom shape (all > 0 together) replaces --layer.
  int experts = 0;
  int64_t hidden = 0, inter = 0;
  int top_k = 8;
  int shared = 1;

  // Throws fp4moe::Error naming the option and its value.
  void validate() const;
};

// One measured row.
struct BenchMoeRow {
  std::string layer;    // "shard", "full" or "custom"
  std::string routing;  // "uniform" or "zipf(1.0)"
  int n_experts = 0, top_k = 0;
  int64_t hidden = 0, inter = 0, shared_inter = 0;
  int64_t tokens = 0;
  int active_experts = 0;
  int64_t max_rows_per_expert = 0;
  std::string config;           // the W4A16 config(s) of the routed GEMMs (GpuMoeLayer::routed_gemm_description)
  int64_t weight_bytes = 0;     // NVFP4 weight + scale bytes read: hit experts + shared expert
  double flops = 0;             // 2 * (rows * 3 I H + tokens * 3 Is H)
  double ms = 0;                // NVFP4 layer, median
  double peer_ms = 0;           // BF16 cuBLAS layer, median (0 = not run)
  double one_config_ms = 0;     // the NVFP4 layer without expert row classes (0 = the same launches)

  double weight_gbps() const { return ms > 0 ? weight_bytes / (ms * 1e-3) / 1e9 : 0; }
  double roofline(double hbm_bytes_per_s) const {
    return ms > 0 ? (weight_bytes / hbm_bytes_per_s) / (ms * 1e-3) : 0;
  }
  double tflops() const { return ms > 0 ? flops / (ms * 1e-3) / 1e12 : 0; }
  double speedup() const { return ms > 0 && peer_ms > 0 ? peer_ms / ms : 0; }
};

// FLOPs of one forward: 2 * (tokens * top_k * 3 * I * H + tokens * 3 * Is * H).
double bench_moe_flops(int64_t tokens, int top_k, int64_t hidden, int64_t inter, int64_t shared_inter);

std::string format_bench_moe_table(const std::vector<BenchMoeRow>& rows, double hbm_bytes_per_s);
nlohmann::json bench_moe_json(const std::vector<BenchMoeRow>& rows, const BenchMoeOptions& opts);

// Runs the benchmark, printing the table (or JSON) to `out`. Throws fp4moe::Error without a usable
// GPU (with the reason) or in a build without CUDA.
std::vector<BenchMoeRow> run_bench_moe(const BenchMoeOptions& opts, std::ostream& out);

// Adds the `moe` subcommand to `bench`.
void add_bench_moe_command(CLI::App& bench);

}  // namespace fp4moe::tools
