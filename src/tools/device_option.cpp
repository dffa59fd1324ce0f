// --device and the CUDA graph options (see device_option.h).
#include "tools/device_option.h"

#include <CLI/CLI.hpp>

#include "core/error.h"
#include "model/registry.h"
#include "tools/cli_options.h"
#ifdef FP4MOE_HAVE_CUDA
#include "model/cuda/gpu_models.h"
#endif

namespace fp4moe::tools {

void add_device_options(CLI::App& cmd, DeviceArgs& args) {
  cmd.add_option("--device", args.device, "cpu (default) or cuda (the GPU model: GLM-4.5 and GLM-5 architectures)")
      ->check(parsed_by([](const std::string& v) { model::parse_device(v); }));
  cmd.add_option("--cuda-graph-max-bs", args.cuda_graph_max_bs,
                 "cuda: decode steps of up to this many sequences run as CUDA graphs, captured per padded batch "
                 "size on first use (default " + std::to_string(DeviceArgs{}.cuda_graph_max_bs) + "; 0 = off)");
  cmd.add_flag("--disable-cuda-graph,--enforce-eager", args.disable_cuda_graph,
               "cuda: run every step eagerly (--cuda-graph-max-bs 0)");
  cmd.add_option("--decode-split-min-keys", args.decode_split_min_keys,
                 "cuda: decode attention splits each sequence's keys into parts of at least this many keys "
                 "(split-K, so a small batch fills the GPU; default " +
                     std::to_string(DeviceArgs{}.decode_split_min_keys) + ")");
  cmd.add_flag("--time-moe-gemms", args.time_moe_gemms,
               "cuda: the MoE layers time their GEMMs (routed / shared gate_up and down) on every step, for "
               "`fp4moe analyze`'s per-GEMM rates and /metrics (off by default: the events cost ~0.09 ms per MoE "
               "layer of a graph-replayed step)");
}

model::Device check_device_options(const DeviceArgs& args) {
  const model::Device device = model::parse_device(args.device);
  // (A bad value was taken on the cpu, which does not read it, and refused only with cuda.)
  FP4MOE_CHECK(args.cuda_graph_max_bs >= 0) << "--cuda-graph-max-bs " << args.cuda_graph_max_bs << " must be >= 0";
  FP4MOE_CHECK(args.decode_split_min_keys >= 1)
      << "--decode-split-min-keys " << args.decode_split_min_keys << " must be >= 1";
  // (Taken on the cpu, whose MoE layers have no GPU GEMMs to time: the run looked like one without the timings.)
  if (args.time_moe_gemms && device != model::Device::kCuda)
    throw Error("--time-moe-gemms times the GPU MoE layers' GEMMs: it needs --device cuda (not " + args.device + ")");
  return device;
}

void apply_device_option(const DeviceArgs& args, int64_t max_tokens_per_step, int64_t kv_tokens, int64_t page_size,
                         model::LoadOptions& options) {
  options.device = check_device_options(args);
  if (options.device == model::Device::kCpu) return;
#ifdef FP4MOE_HAVE_CUDA
  model::register_gpu_models();
  options.gpu.max_tokens_per_step = max_tokens_per_step;
  options.gpu.kv_tokens = kv_tokens;
  options.gpu.page_size = page_size;
  options.gpu.cuda_graph_max_bs = args.disable_cuda_graph ? 0 : args.cuda_graph_max_bs;
  options.gpu.decode_split_min_keys = args.decode_split_min_keys;
  options.gpu.time_moe_gemms = args.time_moe_gemms;
#else
  (void)max_tokens_per_step;
  (void)kv_tokens;
  (void)page_size;
  FP4MOE_FAIL() << "--device cuda: this fp4moe was built without CUDA (configure with the CUDA toolkit)";
#endif
}

}  // namespace fp4moe::tools
