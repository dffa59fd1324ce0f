// `fp4moe bench moe`: NVFP4 fused MoE layer vs the BF16 cuBLAS MoE layer. See bench_moe.h.
// Tested by tests/tools/test_bench_moe.cpp.
#include "tools/bench_moe.h"

#include <CLI/CLI.hpp>
#include <fmt/core.h>

#include <algorithm>
#include <iostream>
#include <memory>
#include <random>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/dtype.h"
#include "core/error.h"
#include "moe/config.h"
#include "tools/cli_options.h"

#if defined(FP4MOE_HAVE_CUDA)
#include <cuda_runtime_api.h>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/moe/device_buffer.h"
#include "kernels/cuda/sm90/w4a16_grouped_gemm.h"
#include "moe/gpu_moe_layer.h"
#include "tune/autotune.h"
#endif

namespace fp4moe::tools {

void BenchMoeOptions::validate() const {
  FP4MOE_CHECK(layer == "shard" || layer == "full" || layer == "both")
      << "bench moe: --layer '" << layer << "' must be shard, full or both";
  FP4MOE_CHECK(routing == "uniform" || routing == "zipf" || routing == "both")
      << "bench moe: --routing '" << routing << "' must be uniform, zipf or both";
  FP4MOE_CHECK(!tokens.empty()) << "bench moe: --tokens is empty";
  for (int64_t t : tokens) {
    FP4MOE_CHECK(t >= 1 && t <= (int64_t{1} << 20)) << "bench moe: --tokens " << t << " must be in [1, 1048576]";
  }
  FP4MOE_CHECK(zipf_s >= 0 && zipf_s <= 8) << "bench moe: --zipf-s " << zipf_s << " must be in [0, 8]";
  FP4MOE_CHECK(warmup >= 0 && iters >= 1) << "bench moe: --warmup " << warmup << " must be >= 0 and --iters " << iters
                                          << " >= 1";
  FP4MOE_CHECK(hbm_bytes_per_s > 0) << "bench moe: --hbm-bw " << hbm_bytes_per_s << " must be > 0";
  const bool custom = experts > 0 || hidden > 0 || inter > 0;
  if (custom) {
    FP4MOE_CHECK(experts > 0 && hidden > 0 && inter > 0)
        << "bench moe: a custom shape needs --experts, --hidden and --inter together (got " << experts << ", " << hidden
        << ", " << inter << ")";
  }
  FP4MOE_CHECK(top_k >= 1 && shared >= 0) << "bench moe: --top-k " << top_k << " must be >= 1 and --shared " << shared
                                          << " >= 0";
}

double bench_moe_flops(int64_t tokens, int top_k, int64_t hidden, int64_t inter, int64_t shared_inter) {
  return 2.0 * (static_cast<double>(tokens) * top_k * 3.0 * inter * hidden +
                static_cast<double>(tokens) * 3.0 * shared_inter * hidden);
}

std::string format_bench_moe_table(const std::vector<BenchMoeRow>& rows, double hbm_bytes_per_s) {
  std::string s = fmt::format("{:<7} {:<10} {:>5} {:>7} {:>7} {:>6} {:<30} {:>10} {:>8} {:>8} {:>8} {:>10} {:>10} {:>7}\n",
                              "layer", "routing", "E", "tokens", "active", "max/e", "w4a16 config", "time_us",
                              "GB/s", "roofline", "TFLOP/s", "1cfg_us", "bf16_us", "speedup");
  for (const BenchMoeRow& r : rows) {
    s += fmt::format("{:<7} {:<10} {:>5} {:>7} {:>7} {:>6} {:<30} {:>10.1f} {:>8.0f} {:>7.1f}% {:>8.1f} {:>10} {:>10} {:>7}\n",
                     r.layer, r.routing, r.n_experts, r.tokens, r.active_experts, r.max_rows_per_expert, r.config,
                     r.ms * 1e3, r.weight_gbps(), 100.0 * r.roofline(hbm_bytes_per_s), r.tflops(),
                     r.one_config_ms > 0 ? fmt::format("{:.1f}", r.one_config_ms * 1e3) : std::string("-"),
                     r.peer_ms > 0 ? fmt::format("{:.1f}", r.peer_ms * 1e3) : std::string("-"),
                     r.peer_ms > 0 ? fmt::format("{:.2f}x", r.speedup()) : std::string("-"));
  }
  return s;
}

nlohmann::json bench_moe_json(const std::vector<BenchMoeRow>& rows, const BenchMoeOptions& opts) {
  nlohmann::json j;
  j["bench"] = "moe";
  j["hbm_bytes_per_s"] = opts.hbm_bytes_per_s;
  j["warmup"] = opts.warmup;
  j["iters"] = opts.iters;
  j["graph"] = opts.graph;
  j["rows"] = nlohmann::json::array();
  for (const BenchMoeRow& r : rows) {
    j["rows"].push_back({{"layer", r.layer},
                         {"routing", r.routing},
                         {"n_experts", r.n_experts},
                         {"top_k", r.top_k},
                         {"hidden", r.hidden},
                         {"inter", r.inter},
                         {"shared_inter", r.shared_inter},
                         {"tokens", r.tokens},
                         {"active_experts", r.active_experts},
                         {"max_rows_per_expert", r.max_rows_per_expert},
                         {"config", r.config},
                         {"weight_bytes", r.weight_bytes},
                         {"flops", r.flops},
                         {"time_us", r.ms * 1e3},
                         {"weight_gbps", r.weight_gbps()},
                         {"roofline", r.roofline(opts.hbm_bytes_per_s)},
                         {"tflops", r.tflops()},
                         {"peer_time_us", r.peer_ms > 0 ? nlohmann::json(r.peer_ms * 1e3) : nlohmann::json(nullptr)},
                         {"one_config_time_us", r.one_config_ms > 0 ? nlohmann::json(r.one_config_ms * 1e3) : nlohmann::json(nullptr)},
                         {"speedup", r.peer_ms > 0 ? nlohmann::json(r.speedup()) : nlohmann::json(nullptr)}});
  }
  return j;
}

#if defined(FP4MOE_HAVE_CUDA)
namespace {

struct Shape {
  std::string name;
  moe::MoeConfig cfg;
};

moe::MoeConfig glm5_moe_config(int experts, int64_t hidden, int64_t inter, int top_k, int shared) {
  moe::MoeConfig c;
  c.hidden = hidden;
  c.moe_intermediate = inter;
  c.n_experts = experts;
  c.top_k = top_k;
  c.n_group = 1;
  c.topk_group = 1;
  c.norm_topk_prob = true;
  c.routed_scaling_factor = 2.5f;
  c.scoring = moe::ScoringFunc::kSigmoid;
  c.correction_bias = true;
  c.masked_fill_value = -INFINITY;
  c.n_shared_experts = shared;
  return c;
}

class Timer {
 public:
  Timer() {
    FP4MOE_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    FP4MOE_CUDA_CHECK(cudaEventCreate(&start_));
    FP4MOE_CUDA_CHECK(cudaEventCreate(&stop_));
  }
  ~Timer() {
    cudaEventDestroy(start_);
    cudaEventDestroy(stop_);
    cudaStreamDestroy(stream_);
  }
  cudaStream_t stream() const { return stream_; }
  // Median milliseconds of fn() over `iters` runs after `warmup`, each after an L2 flush.
  template <typename Fn>
  double median_ms(int warmup, int iters, Fn&& fn) {
    for (int i = 0; i < warmup; ++i) fn();
    std::vector<float> ms(static_cast<size_t>(iters));
    for (int i = 0; i < iters; ++i) {
      FP4MOE_CUDA_CHECK(cudaMemsetAsync(flush_.as<void>(), i & 0xFF, flush_.bytes(), stream_));
      FP4MOE_CUDA_CHECK(cudaEventRecord(start_, stream_));
      fn();
      FP4MOE_CUDA_CHECK(cudaEventRecord(stop_, stream_));
      FP4MOE_CUDA_CHECK(cudaEventSynchronize(stop_));
      FP4MOE_CUDA_CHECK(cudaEventElapsedTime(&ms[i], start_, stop_));
    }
    std::nth_element(ms.begin(), ms.begin() + iters / 2, ms.end());
    return ms[iters / 2];
  }

 private:
  cudaStream_t stream_ = nullptr;
  cudaEvent_t start_ = nullptr, stop_ = nullptr;
  cuda::DeviceBuffer flush_{size_t{512} << 20};  // > 3x the 50 MiB L2 of an H100/H200
};

}  // namespace

std::vector<BenchMoeRow> run_bench_moe(const BenchMoeOptions& opts, std::ostream& out) {
  opts.validate();
  std::string why;
  FP4MOE_CHECK(cuda::cuda_device_available(&why)) << "bench moe: no usable GPU: " << why;
  std::vector<Shape> shapes;
  if (opts.experts > 0) {
    shapes.push_back({"custom", glm5_moe_config(opts.experts, opts.hidden, opts.inter, opts.top_k, opts.shared)});
  } else {
    if (opts.layer != "full") shapes.push_back({"shard", glm5_moe_config(32, 6144, 2048, opts.top_k, opts.shared)});
    if (opts.layer != "shard") shapes.push_back({"full", glm5_moe_config(256, 6144, 2048, opts.top_k, opts.shared)});
  }
  std::vector<double> skews;
  if (opts.routing != "zipf") skews.push_back(0.0);
  if (opts.routing != "uniform") skews.push_back(opts.zipf_s);
  const int64_t max_tokens = *std::max_element(opts.tokens.begin(), opts.tokens.end());
  if (!opts.json) out << "fp4moe bench moe on " << cuda::cuda_device_description(0) << "\n";

  std::vector<BenchMoeRow> rows;
  Timer timer;
  for (const Shape& shape : shapes) {
    const moe::MoeConfig& cfg = shape.cfg;
    cfg.validate();
    // x ~ U(-1, 1) in bf16 (the dummy router's logit scale assumes it), max_tokens rows.
    std::mt19937_64 rng(opts.seed);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    std::vector<uint16_t> xh(static_cast<size_t>(max_tokens * cfg.hidden));
    for (auto& v : xh) v = f32_to_bf16(u(rng));
    cuda::DeviceBuffer x = cuda::DeviceBuffer::from_host(xh);
    cuda::DeviceBuffer y(static_cast<size_t>(max_tokens * cfg.hidden) * 2);
    // A pageable cudaMemcpy may return before its DMA lands, unordered with the timer's non-blocking
    // stream: the first forward (whose routing histogram is printed) must see all of x.
    FP4MOE_CUDA_CHECK(cudaDeviceSynchronize());
    for (double s : skews) {
      moe::GpuDummyRouting routing;
      routing.zipf_s = s;
      const std::string routing_name = s == 0 ? std::string("uniform") : fmt::format("zipf({:.2g})", s);
      const size_t first = rows.size();
      {
        moe::GpuMoeLayer layer =
            moe::GpuMoeLayer::dummy(cfg, moe::GpuExpertGemm::kNvfp4W4A16, max_tokens, routing, opts.seed);
        if (opts.tuned) {
          layer.set_config_chooser(std::make_shared<const tune::ConfigChooser>(
              tune::TuneCache::load(opts.cache.empty() ? tune::default_cache_path() : opts.cache),
              tune::current_tune_key(), tune::current_gpu_spec()));
        }
        for (int64_t t : opts.tokens) {
          BenchMoeRow r;
          r.layer = shape.name;
          r.routing = routing_name;
          r.n_experts = cfg.n_experts;
          r.top_k = cfg.top_k;
          r.hidden = cfg.hidden;
          r.inter = cfg.moe_intermediate;
          r.shared_inter = cfg.shared_intermediate();
          r.tokens = t;
          auto fwd = [&] { layer.forward(x.as<__nv_bfloat16>(), t, y.as<__nv_bfloat16>(), timer.stream()); };
          fwd();
          const auto routed = layer.download_routing(t);
          for (int e = 0; e < cfg.n_experts; ++e) {
            const int64_t rows_e = routed.offsets[e + 1] - routed.offsets[e];
            r.active_experts += rows_e > 0 ? 1 : 0;
            r.max_rows_per_expert = std::max(r.max_rows_per_expert, rows_e);
          }
          r.config = layer.routed_gemm_description(t);
          r.weight_bytes = r.active_experts * layer.routed_expert_bytes() + layer.shared_expert_bytes();
          r.flops = bench_moe_flops(t, cfg.top_k, cfg.hidden, cfg.moe_intermediate, cfg.shared_intermediate());
          if (opts.graph) {  // the forward as one CUDA-graph replay (no launch overhead)
            cudaGraph_t graph = nullptr;
            cudaGraphExec_t exec = nullptr;
            FP4MOE_CUDA_CHECK(cudaStreamBeginCapture(timer.stream(), cudaStreamCaptureModeThreadLocal));
            fwd();
            FP4MOE_CUDA_CHECK(cudaStreamEndCapture(timer.stream(), &graph));
            FP4MOE_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
            r.ms = timer.median_ms(opts.warmup, opts.iters,
                                   [&] { FP4MOE_CUDA_CHECK(cudaGraphLaunch(exec, timer.stream())); });
            FP4MOE_CUDA_CHECK(cudaGraphExecDestroy(exec));
            FP4MOE_CUDA_CHECK(cudaGraphDestroy(graph));
          } else {
            r.ms = timer.median_ms(opts.warmup, opts.iters, fwd);
            if (layer.routed_gemm_classes(t).size() > 1) {  // the same layer with one config for every expert
              layer.set_row_classes(false);
              r.one_config_ms = timer.median_ms(opts.warmup, opts.iters, fwd);
              layer.set_row_classes(true);
            }
          }
          rows.push_back(r);
        }
      }
      if (opts.peer) {  // the NVFP4 layer is freed first: the full BF16 layer alone holds ~20 GB
        moe::GpuMoeLayer peer =
            moe::GpuMoeLayer::dummy(cfg, moe::GpuExpertGemm::kBf16Cublas, max_tokens, routing, opts.seed);
        for (size_t i = 0; i < opts.tokens.size(); ++i) {
          const int64_t t = opts.tokens[i];
          rows[first + i].peer_ms = timer.median_ms(opts.warmup, opts.iters, [&] {
            peer.forward(x.as<__nv_bfloat16>(), t, y.as<__nv_bfloat16>(), timer.stream());
          });
        }
      }
      if (!opts.json) {
        out << format_bench_moe_table({rows.begin() + static_cast<std::ptrdiff_t>(first), rows.end()},
                                      opts.hbm_bytes_per_s)
            << std::flush;
      }
    }
  }
  if (opts.json) out << bench_moe_json(rows, opts).dump(2) << "\n";
  return rows;
}

#else

std::vector<BenchMoeRow> run_bench_moe(const BenchMoeOptions& opts, std::ostream&) {
  opts.validate();
  FP4MOE_FAIL() << "bench moe: this fp4moe was built without CUDA (FP4MOE_CUDA=OFF or no nvcc)";
}

#endif

void add_bench_moe_command(CLI::App& bench) {
  auto opts = std::make_shared<BenchMoeOptions>();
  CLI::App* sub = bench.add_subcommand(
      "moe", "Time the NVFP4 fused MoE layer against the BF16 cuBLAS MoE layer (GLM-5 shapes, dummy weights)");
  sub->add_option("--layer", opts->layer, "shard (E=32), full (E=256) or both")->capture_default_str();
  sub->add_option("--tokens", opts->tokens, "token counts, comma-separated")->delimiter(',')->capture_default_str();
  sub->add_option("--routing", opts->routing, "uniform, zipf or both")->capture_default_str();
  sub->add_option("--zipf-s", opts->zipf_s, "Zipf exponent of the skewed routing")->capture_default_str();
  sub->add_option("--warmup", opts->warmup, "untimed forwards before timing")->capture_default_str();
  sub->add_option("--iters", opts->iters, "timed forwards (the median is reported)")->capture_default_str();
  sub->add_option("--hbm-bw", opts->hbm_bytes_per_s, "HBM bandwidth in B/s for the roofline")->capture_default_str();
  sub->add_flag("--no-peer", [opts](int64_t) { opts->peer = false; }, "skip the BF16 cuBLAS layer");
  sub->add_flag("--json", opts->json, "print the rows as JSON");
  sub->add_flag("--graph", opts->graph, "time the NVFP4 layer as a CUDA-graph replay (the peer stays eager)");
  sub->add_flag("--tuned", opts->tuned,
                "choose the W4A16 configs with the autotuner's cache (fp4moe tune), falling back to the planner");
  sub->add_option("--cache", opts->cache, "tune cache for --tuned (default $FP4MOE_TUNE_CACHE or ~/.cache/fp4moe/tune.json)");
  sub->add_option("--seed", opts->seed, "seed of the dummy weights and inputs")
      ->check(unsigned_64())
      ->capture_default_str();
  sub->add_option("--experts", opts->experts, "custom shape: number of routed experts (replaces --layer)");
  sub->add_option("--hidden", opts->hidden, "custom shape: hidden size");
  sub->add_option("--inter", opts->inter, "custom shape: expert intermediate size");
  sub->add_option("--top-k", opts->top_k, "experts per token")->capture_default_str();
  sub->add_option("--shared", opts->shared, "shared experts (0 = none)")->capture_default_str();
  sub->callback([opts] { run_bench_moe(*opts, std::cout); });
}

}  // namespace fp4moe::tools
