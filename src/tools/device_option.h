// The device options shared by `fp4moe serve`, `generate` and `bench-one-batch`: --device "cpu"
// (default) or "cuda" (the GPU models of model/cuda/gpu_models.h, registered here; a build without
// CUDA refuses naming the option), and for cuda --cuda-graph-max-bs N (decode steps of up to N
// sequences run as captured CUDA graphs, SGLang's option; 0 or --disable-cuda-graph: eager) and
// --decode-split-min-keys N (the decode attention kernels' split-K granularity) and --time-moe-gemms
// (per-GEMM timing events in the MoE layers, for `fp4moe analyze`; off by default: they cost step time).
// Tested by tests/tools/test_device_option.cpp and the GPU e2e runs.
#pragma once

#include <cstdint>
#include <string>

#include "model/registry.h"

namespace CLI {
class App;
}

namespace fp4moe::tools {

struct DeviceArgs {
  std::string device = "cpu";
  int64_t cuda_graph_max_bs = model::GpuOptions{}.cuda_graph_max_bs;
  bool disable_cuda_graph = false;
  int64_t decode_split_min_keys = model::GpuOptions{}.decode_split_min_keys;
  bool time_moe_gemms = false;
};

// Adds --device, --cuda-graph-max-bs, --disable-cuda-graph, --decode-split-min-keys and --time-moe-gemms
// to `cmd`.
void add_device_options(CLI::App& cmd, DeviceArgs& args);

// The --device asked for. Fails naming the option when --device is not a device or a cuda option's value is out of
// range: on every device (the cpu does not read them) and with every model (the embedded default one included).
model::Device check_device_options(const DeviceArgs& args);

// check_device_options, then sets options.device from args.device and, for cuda, registers the GPU
// models and sizes them: max_tokens_per_step tokens in one forward, kv_tokens of KV cache in
// blocks of page_size, CUDA graphs up to args.cuda_graph_max_bs sequences (fails naming a negative
// value; 0 when disabled) and decode attention split-K parts of at least args.decode_split_min_keys keys.
void apply_device_option(const DeviceArgs& args, int64_t max_tokens_per_step, int64_t kv_tokens, int64_t page_size,
                         model::LoadOptions& options);

}  // namespace fp4moe::tools
