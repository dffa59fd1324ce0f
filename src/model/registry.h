// load_model(dir, options): reads config.json, picks the model class registered for its
// architecture and builds it from the checkpoint's tensors (BF16 or ModelOpt NVFP4, single file or
// sharded), or from deterministic random weights (LoadFormat::kDummy).
//
// Adding an architecture: write `std::unique_ptr<CausalLM> create_<x>(const ModelConfig&,
// const format::TensorStore&, const LoadOptions&)` in its own files and add one line to the table in
// registry.cpp (or call register_architecture() at run time, e.g. from a test).
// Tested by tests/model/test_registry.cpp.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/host_memory.h"
#include "format/safetensors.h"
#include "model/causal_lm.h"
#include "model/config.h"

namespace fp4moe::model {

enum class LoadFormat : uint8_t {
  kAuto,   // the checkpoint's tensors (each Linear BF16 or NVFP4 as stored)
  kDummy,  // random weights for the config alone (config.json is the only file read)
};
LoadFormat parse_load_format(const std::string& s);  // "auto" | "dummy"; fails naming the value

enum class DummyWeights : uint8_t {
  kBF16,   // every weight BF16
  kNVFP4,  // every Linear except lm_head and routers NVFP4 (as ModelOpt's default scope)
};
DummyWeights parse_dummy_weights(const std::string& s);  // "bf16" | "nvfp4"; fails naming the value

// Where the model runs. kCuda needs a build with CUDA and an architecture with a GPU factory
// (register_cuda_factory, done by model/cuda/gpu_models.h's register_gpu_models()).
enum class Device : uint8_t { kCpu, kCuda };
Device parse_device(const std::string& s);  // "cpu" | "cuda"; fails naming the value
const char* to_string(Device d);

// Sizes the GPU model preallocates (scratch for the largest step, the paged KV pool).
struct GpuOptions {
  int64_t max_tokens_per_step = 4096;  // tokens of one forward step (prefill chunks + decodes)
  int64_t kv_tokens = 32768;           // KV cache capacity in tokens (rounded up to pages)
  // > 0: the KV cache is what this share of the GPU's memory leaves after the weights and step buffers
  // (kv_tokens_for_memory, model/cuda/gpu_kv_cache.h; SGLang's --mem-fraction-static), kv_tokens its cap.
  double mem_fraction_static = 0.0;
  int64_t page_size = 16;              // tokens per KV block
  bool nvfp4_kernels = true;           // false: NVFP4 weights dequantized to BF16, cuBLAS (the 16-bit peer)
  int64_t cuda_graph_max_bs = 256;     // decode steps of up to this many sequences run as CUDA graphs (0: off)
  int64_t decode_split_min_keys = 32;  // decode attention: keys per split-K part at least this many
  bool time_moe_gemms = false;         // MoE layers record per-GEMM timing events (trace parts moe.*; costs step time)
};

struct LoadOptions {
  LoadFormat format = LoadFormat::kAuto;
  DummyWeights dummy_weights = DummyWeights::kBF16;
  uint64_t seed = 0;               // dummy weights: same seed + same config -> same weights
  bool progress = true;            // progress bar on stderr (only when it is a tty and slow)
  Device device = Device::kCpu;
  GpuOptions gpu;                  // device == kCuda only
};

using ModelFactory = std::function<std::unique_ptr<CausalLM>(
    const ModelConfig& config, const format::TensorStore& store, const LoadOptions& options)>;

// What a weight is, for dummy generation (value distribution, dtype, NVFP4 eligibility).
enum class WeightRole : uint8_t {
  kLinear,        // [out, in]; NVFP4 under DummyWeights::kNVFP4 (name given without ".weight")
  kLinearBF16,    // [out, in]; always BF16 (lm_head, routers mlp.gate, indexer weights_proj)
  kEmbedding,     // [vocab, hidden] BF16
  kNorm,          // [dim] BF16, values near 1
  kBias,          // [dim] BF16, small values
  kF32Bias,       // [dim] F32, small values (e_score_correction_bias)
};

struct WeightSpec {
  std::string name;  // full tensor name; for kLinear/kLinearBF16 the module name (".weight" etc. added)
  Shape shape;
  WeightRole role = WeightRole::kLinear;
  // kLinear: whether the GPU models run it as a GEMM of its own (GpuLinear, the MoE layers' GEMMs),
  // which `fp4moe tune --model` times; false for GLM-5's kv_b_proj, whose halves the absorbed MLA
  // reads dequantized to BF16 (model/cuda/glm5_cuda.cpp, kernels/cuda/ops/mla_decode.h).
  bool gpu_gemm = true;
};

// Every tensor an architecture reads for a config (the dummy checkpoint is made from it).
using ManifestFn = std::function<std::vector<WeightSpec>(const ModelConfig& config)>;

struct Architecture {
  ModelFactory create;       // the CPU model
  ManifestFn manifest;
  ModelFactory create_cuda;  // the GPU model (empty: none)
};

// Registers (or replaces) an architecture by name (config.json architectures[0]).
void register_architecture(const std::string& architecture, Architecture arch);
std::vector<std::string> registered_architectures();  // sorted
// Adds the GPU factory of a registered architecture (fails naming it when it is not registered).
void register_cuda_factory(const std::string& architecture, ModelFactory create_cuda);

// The manifest of config's architecture (every tensor it reads); fails naming the architecture when
// none is registered. `fp4moe tune --model` takes the dense Linears' shapes from it.
std::vector<WeightSpec> architecture_manifest(const ModelConfig& config);

// The tensors config's architecture reads (its manifest) against a store: what format/checkpoint.h's
// Linear checks do not cover. `fp4moe inspect` lists the problems and the unread tensors; load_model
// warns about the unread ones (the loaders themselves fail on the first problem).
struct TensorCheck {
  // A tensor the model reads that is absent, or is of the wrong shape or dtype: the module (a Linear's name)
  // or tensor, and a message naming the expected and the found shape / dtype. A config asking for layers
  // the checkpoint does not hold is one problem ("config.json"), not one a tensor.
  struct Problem {
    std::string name;
    std::string message;
    bool linear = false;  // name is a Linear module (its .weight and scales)
  };
  std::vector<Problem> problems;
  // Tensors that nothing reads, in files the model reads from (sorted); MTP layers
  // (num_nextn_predict_layers, after num_hidden_layers) are not run and not listed.
  std::vector<std::string> unread;
  // Files none of whose tensors are read (a golden.safetensors beside the model): name, tensor count.
  std::vector<std::pair<std::string, int64_t>> unread_files;
  // Linears stored otherwise than the quantization section says (format::QuantConfig::disagreement: NVFP4 with no
  // section or excluded, BF16 where it says NVFP4): name and message. They load as stored; load_model warns
  // (format::Checkpoint lists them as problems for inspect).
  std::vector<Problem> quant_disagreements;
  // Why nothing was checked, or "": a config asking for far more tensors than the store holds
  // (its manifest is not built; format::Checkpoint names the layer and expert counts).
  std::string skipped;
};
TensorCheck check_tensors(const ModelConfig& config, const format::TensorStore& store);

// Builds the model a directory describes. Fails naming the architecture when none is registered.
std::unique_ptr<CausalLM> load_model(const std::filesystem::path& dir, const LoadOptions& options);

// Same from a parsed config and an opened store (tests, dummy loads).
std::unique_ptr<CausalLM> build_model(const ModelConfig& config, const format::TensorStore& store,
                                      const LoadOptions& options);

// Writes the dummy checkpoint for a config into `dir` (model.safetensors only): every tensor of the
// architecture's manifest, random from options.seed (each tensor seeded by seed and its name, so
// the values do not depend on the order), NVFP4 Linears in ModelOpt layout when
// options.dummy_weights == kNVFP4. load_model with kDummy writes one to a temporary directory,
// maps it and deletes it.
// A model with random weights for `config` (deterministic from options.seed, format from
// options.dummy_weights), built through the ordinary loader from a temporary checkpoint.
std::unique_ptr<CausalLM> build_dummy_model(const ModelConfig& config, const LoadOptions& options);

void write_dummy_checkpoint(const ModelConfig& config, const LoadOptions& options,
                            const std::filesystem::path& dir);

// The bytes of that checkpoint (what write_dummy_checkpoint holds in memory and writes).
uint64_t dummy_checkpoint_bytes(const ModelConfig& config, const LoadOptions& options);

// Refuses, before anything is made, a dummy model this machine cannot make, naming the numbers: NVFP4 dummy weights
// for a Linear whose in_features is not a multiple of 16; a checkpoint larger than the temp folder's free space; more
// host memory than `memory` says is available (the checkpoint is made in memory; the CPU model copies it: 2x).
void check_dummy_fits(const ModelConfig& config, const LoadOptions& options, const HostMemory& memory,
                      const std::filesystem::path& temp_dir, uint64_t temp_free_bytes);

}  // namespace fp4moe::model
