// `fp4moe tune`: autotunes sm90_nvfp4_w4a16_grouped_gemm on this GPU and stores the winners in the
// tune cache (docs/gpu.md, "Autotuning").
//
//   fp4moe tune --shape E,N,K[,E,N,K...] | --model DIR|PRESET [--tokens 1,2,4,...] [--cache PATH] [--iters N]
//
// --model (a checkpoint folder, or a preset name: model/presets.h) derives the shapes from its
// config: routed experts gate_up (E, N=2I, K=H) and down (E, N=H, K=I), the shared expert (E=1,
// I x n_shared_experts) when the model has one, and the dense Linears the GPU models run on the
// W4A16 GEMM (E=1: attention projections, the dense MLP; model_shapes below). The
// shapes are printed first (so they can be checked without a GPU); then, without a usable GPU, the
// command fails with the reason. A cache tuned under another key (GPU, SMs, CUDA runtime/driver,
// build, config table) is reported field by field and replaced. Progress goes to stderr on one
// line; the table of winners (time, runner-up) to stdout.
// Tested by tests/tune/test_cmd_tune.cpp (parsing, --model shapes, the no-GPU failure) and
// tests/tune/test_autotune_gpu.cpp (the tuning itself, label gpu).
#include <CLI/CLI.hpp>
#include <fmt/core.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/file.h"
#include "model/config.h"
#include "model/presets.h"
#include "model/registry.h"
#include "tools/commands.h"
#include "tune/tune_cache.h"
#ifdef FP4MOE_HAVE_CUDA
#include "kernels/cuda/device.h"
#include "tune/autotune.h"
#endif

namespace fp4moe::tools {
namespace {

struct TuneArgs {
  std::string shapes;
  std::string model_dir;
  std::string tokens = "1,2,4,8,16,32,64,128,256,512";
  std::string cache;
  int iters = 30;
};

struct NamedShape {
  std::string name;
  tune::GemmShape shape;
};

// --model: the MoE GEMMs (routed experts' gate_up and down, the shared expert's, as GpuMoeLayer runs
// them) and the dense Linears the GPU models run on the W4A16 GEMM (E = 1, GpuLinear): every
// NVFP4-eligible Linear of the architecture's manifest outside the experts (WeightRole::kLinear: a
// checkpoint that keeps one in BF16 runs it on cuBLAS, and its shape is tuned for nothing), one entry
// per distinct [out, in] (module names joined by '/'); left out: a Linear the GPU models do not run as
// a GEMM (WeightSpec::gpu_gemm) and a shape the W4A16 GEMM refuses (out % 8, in % 16: cuBLAS).
std::vector<NamedShape> model_shapes(const std::string& dir_or_preset) {
  const model::ModelConfig c = model::load_config_or_preset(dir_or_preset);
  std::vector<NamedShape> out;
  if (c.n_routed_experts > 0 && c.moe_intermediate_size > 0) {
    const int64_t h = c.hidden_size, i = c.moe_intermediate_size, e = c.n_routed_experts;
    out.push_back({"experts gate_up", {e, 2 * i, h}});
    out.push_back({"experts down", {e, h, i}});
    if (c.n_shared_experts > 0) {
      const int64_t is = i * c.n_shared_experts;
      out.push_back({"shared gate_up", {1, 2 * is, h}});
      out.push_back({"shared down", {1, h, is}});
    }
    for (const NamedShape& s : out) tune::check_shape(s.shape, c.source + " " + s.name);
  }
  std::vector<NamedShape> dense;
  for (const model::WeightSpec& w : model::architecture_manifest(c)) {
    if (w.role != model::WeightRole::kLinear || !w.gpu_gemm || w.shape.size() != 2 ||
        w.name.find(".experts.") != std::string::npos || w.name.find(".shared_experts.") != std::string::npos) {
      continue;
    }
    const tune::GemmShape shape{1, w.shape[0], w.shape[1]};
    try {
      tune::check_shape(shape, w.name);  // the W4A16 GEMM's shape rule
    } catch (const Error&) {
      continue;  // GpuLinear's BF16 fallback
    }
    const std::string leaf = w.name.substr(w.name.rfind('.') + 1);
    auto same = std::find_if(dense.begin(), dense.end(), [&](const NamedShape& d) { return d.shape == shape; });
    if (same == dense.end()) {
      dense.push_back({"dense " + leaf, shape});
    } else if (("/" + same->name.substr(6) + "/").find("/" + leaf + "/") == std::string::npos) {
      same->name += "/" + leaf;
    }
  }
  out.insert(out.end(), dense.begin(), dense.end());
  FP4MOE_CHECK(!out.empty()) << c.source << ": no MoE GEMM and no NVFP4-eligible Linear to tune";
  return out;
}

std::vector<NamedShape> requested_shapes(const TuneArgs& a) {
  FP4MOE_CHECK(a.shapes.empty() != a.model_dir.empty())
      << "fp4moe tune: give exactly one of --shape E,N,K[,...] or --model DIR|PRESET";
  if (!a.model_dir.empty()) return model_shapes(a.model_dir);
  std::vector<NamedShape> out;
  for (const tune::GemmShape& s : tune::parse_shape_list(a.shapes)) out.push_back({"gemm", s});
  return out;
}

#ifdef FP4MOE_HAVE_CUDA
// One stderr line, rewritten with \r: "[#########...........]  37/120  E=32,N=4096,K=6144 tok/e 8 <config>".
void print_progress(const tune::TuneProgress& p) {
  constexpr int kWidth = 30;
  const int filled = p.total > 0 ? p.done * kWidth / p.total : kWidth;
  std::string bar(static_cast<size_t>(filled), '#');
  bar.resize(kWidth, '.');
  std::string what = p.what;
  if (what.size() > 70) what.resize(70);
  std::fprintf(stderr, "\r[%s] %4d/%-4d %-70s", bar.c_str(), p.done, p.total, what.c_str());
  if (p.done == p.total) std::fprintf(stderr, "\n");
  std::fflush(stderr);
}
#endif

void run_tune(const TuneArgs& a) {
  std::vector<NamedShape> named = requested_shapes(a);
  std::vector<tune::GemmShape> shapes;
  for (const NamedShape& s : named) {
    if (std::find(shapes.begin(), shapes.end(), s.shape) == shapes.end()) shapes.push_back(s.shape);
  }
  const std::vector<int64_t> buckets = tune::parse_bucket_list(a.tokens);
  FP4MOE_CHECK(a.iters >= 1) << "fp4moe tune: --iters " << a.iters << " must be >= 1";
  const std::string path = a.cache.empty() ? tune::default_cache_path() : a.cache;
  fmt::print("tuning {} shape(s) x {} token bucket(s), cache {}\n", shapes.size(), buckets.size(), path);
  for (const NamedShape& s : named) fmt::print("  {:<26} {}\n", s.name, s.shape.to_string());
  std::fflush(stdout);
  // Before the tuning, not after it; TuneCache::save writes a temporary file beside the cache and renames it.
  check_writable_file(path, "tune cache", /*create_parents=*/true, /*via_rename=*/true);
#ifndef FP4MOE_HAVE_CUDA
  FP4MOE_FAIL() << "fp4moe tune needs a GPU, and this build has no CUDA (configured without nvcc or with "
                   "-DFP4MOE_CUDA=OFF)";
#else
  std::string why;
  FP4MOE_CHECK(cuda::cuda_device_available(&why)) << "fp4moe tune needs a usable GPU: " << why;
  tune::TuneCache cache = tune::TuneCache::load(path);
  for (const std::string& w : cache.warnings()) fmt::print(stderr, "fp4moe tune: warning: {}\n", w);
  const tune::TuneKey key = tune::current_tune_key();
  const plan::GpuSpec gpu = tune::current_gpu_spec();
  if (const std::vector<tune::KeyDiff> diffs = cache.stale_fields(key); !diffs.empty()) {
    fmt::print(stderr, "fp4moe tune: {}; retuning, its {} entries are replaced\n", tune::describe_stale(path, diffs),
               cache.entries().size());
  }
  fmt::print("key: {}\n", key.to_string());
  std::fflush(stdout);
  tune::TuneOptions opts;
  opts.buckets = buckets;
  opts.timing.runs = a.iters;
  opts.progress = print_progress;
  const std::vector<tune::TuneEntry> winners = tune::autotune(shapes, opts, gpu);
  for (const tune::TuneEntry& e : winners) cache.put(key, e);
  cache.save(path);

  fmt::print("{:<20} {:>6} | {:<28} {:>9} | {:<28} {:>9} {:>7} {:>5}\n", "shape", "tok/e", "winner", "us", "runner-up",
             "us", "margin", "cfgs");
  for (const tune::TuneEntry& e : winners) {
    const bool has_second = e.runner_up_id >= 0;
    fmt::print("{:<20} {:>6} | {:<28} {:>9.1f} | {:<28} {:>9} {:>6.1f}% {:>5}\n", e.shape.to_string(), e.bucket, e.config,
               e.time_us, has_second ? e.runner_up : "-",
               has_second ? fmt::format("{:.1f}", e.runner_up_us) : std::string("-"),
               has_second ? 100.0 * (e.runner_up_us / e.time_us - 1.0) : 0.0, e.n_candidates);
  }
  fmt::print("wrote {} entries ({} in the file) to {}\n", winners.size(), cache.entries().size(), path);
#endif
}

}  // namespace

void register_tune_command(CLI::App& app) {
  auto args = std::make_shared<TuneArgs>();
  CLI::App* cmd = app.add_subcommand("tune", "Autotune the W4A16 grouped GEMM configs on this GPU (writes the tune cache)");
  cmd->add_option("--shape", args->shapes, "GEMM shapes E,N,K[,E,N,K...] (E experts, N outputs, K inputs)");
  cmd->add_option("--model", args->model_dir,
                  "checkpoint folder or preset (glm5-shard, ...): tune its MoE GEMMs and dense NVFP4 Linears "
                  "(from config.json)");
  cmd->add_option("--tokens", args->tokens, "token-count buckets (tokens per expert; default 1,2,4,...,512)");
  cmd->add_option("--cache", args->cache, "cache file (default $FP4MOE_TUNE_CACHE or ~/.cache/fp4moe/tune.json)");
  cmd->add_option("--iters", args->iters, "timed runs per config; the median is kept (default 30)");
  cmd->callback([args] { run_tune(*args); });
}

}  // namespace fp4moe::tools
