// The --device option shared by `fp4moe serve`, `generate` and `bench-one-batch`: "cpu" (default)
// or "cuda" (the GPU models of model/cuda/gpu_models.h, registered here; a build without CUDA
// refuses naming the option). Tested by tests/tools/test_device_option.cpp and the GPU e2e runs.
#pragma once

#include <string>

#include "model/registry.h"

namespace fp4moe::tools {

// Sets options.device from `device` (fails naming the value) and, for cuda, registers the GPU
// models and sizes them: max_tokens_per_step tokens in one forward, kv_tokens of KV cache in
// blocks of page_size.
void apply_device_option(const std::string& device, int64_t max_tokens_per_step, int64_t kv_tokens,
                         int64_t page_size, model::LoadOptions& options);

}  // namespace fp4moe::tools
