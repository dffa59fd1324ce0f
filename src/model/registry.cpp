// Architecture registry, load_model and the dummy checkpoint writer (see registry.h).
// Tested by tests/model/test_registry.cpp.
#include "model/registry.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <string_view>

#include "core/error.h"
#include "core/host_memory.h"
#include "format/checkpoint.h"
#include "kernels/cpu/thread_pool.h"
#include "model/glm4_moe.h"
#include "model/glm5.h"
#include "model/presets.h"
#include "model/weights.h"
#include "moe/weights.h"

namespace fp4moe::model {
namespace {

struct Registry {
  std::mutex mu;
  std::map<std::string, Architecture> archs;
};

Registry& registry() {
  static Registry* r = [] {
    auto* reg = new Registry;
    // One line per built-in architecture (config.json architectures[0] -> its description).
    reg->archs[kArchGlm4Moe] = glm4_moe_architecture();
    reg->archs[kArchGlmMoeDsa] = glm_moe_dsa_architecture();
    return reg;
  }();
  return *r;
}

Architecture find_architecture(const std::string& name) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  auto it = r.archs.find(name);
  if (it == r.archs.end()) {
    std::string list;
    for (const auto& [n, a] : r.archs) list += (list.empty() ? "" : ", ") + n;
    FP4MOE_FAIL() << "no model implementation registered for architecture \"" << name << "\" (registered: " << list
                  << ")";
  }
  return it->second;
}

// splitmix64 of the seed mixed with the FNV-1a hash of the tensor name: values do not depend on
// the order in which tensors are generated.
uint64_t tensor_seed(uint64_t seed, const std::string& name) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : name) h = (h ^ c) * 1099511628211ull;
  uint64_t z = seed ^ h;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

std::vector<uint8_t> bf16_bytes(const std::vector<float>& v) {
  std::vector<uint8_t> out(v.size() * 2);
  for (size_t i = 0; i < v.size(); ++i) {
    const uint16_t b = f32_to_bf16(v[i]);
    out[2 * i] = static_cast<uint8_t>(b & 0xFF);
    out[2 * i + 1] = static_cast<uint8_t>(b >> 8);
  }
  return out;
}

template <typename T>
std::span<const uint8_t> as_bytes_span(const std::vector<T>& v) {
  return {reinterpret_cast<const uint8_t*>(v.data()), v.size() * sizeof(T)};
}

std::vector<float> uniform(uint64_t seed, int64_t n, float lo, float hi) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = dist(rng);
  return v;
}

void add_linear(format::SafetensorsWriter& w, const WeightSpec& spec, bool nvfp4, uint64_t seed) {
  FP4MOE_CHECK(spec.shape.size() == 2) << "dummy Linear " << spec.name << " needs a 2-D shape, got "
                                       << shape_to_string(spec.shape);
  const int64_t out = spec.shape[0];
  const int64_t in = spec.shape[1];
  const auto lw = moe::random_linear(nvfp4 ? moe::WeightFormat::kNVFP4 : moe::WeightFormat::kBF16, out, in,
                                     tensor_seed(seed, spec.name));
  if (nvfp4) {
    w.add(spec.name + ".weight", DType::kU8, {out, in / 2}, as_bytes_span(lw.packed));
    w.add(spec.name + ".weight_scale", DType::kF8_E4M3, {out, in / format::kNvfp4BlockSize}, as_bytes_span(lw.scales));
    const std::vector<float> s2 = {lw.global_scale};
    w.add(spec.name + ".weight_scale_2", DType::kF32, {}, as_bytes_span(s2));
  } else {
    w.add(spec.name + ".weight", DType::kBF16, {out, in}, as_bytes_span(lw.bf16));
  }
}

}  // namespace

LoadFormat parse_load_format(const std::string& s) {
  if (s == "auto") return LoadFormat::kAuto;
  if (s == "dummy") return LoadFormat::kDummy;
  FP4MOE_FAIL() << "load format \"" << s << "\" is not one of: auto, dummy";
  return LoadFormat::kAuto;  // not reached
}

DummyWeights parse_dummy_weights(const std::string& s) {
  if (s == "bf16") return DummyWeights::kBF16;
  if (s == "nvfp4") return DummyWeights::kNVFP4;
  FP4MOE_FAIL() << "dummy weights \"" << s << "\" is not one of: bf16, nvfp4";
  return DummyWeights::kBF16;  // not reached
}

Device parse_device(const std::string& s) {
  if (s == "cpu") return Device::kCpu;
  if (s == "cuda") return Device::kCuda;
  FP4MOE_FAIL() << "device \"" << s << "\" is not one of: cpu, cuda";
  return Device::kCpu;  // not reached
}

const char* to_string(Device d) { return d == Device::kCuda ? "cuda" : "cpu"; }

void register_cuda_factory(const std::string& architecture, ModelFactory create_cuda) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  auto it = r.archs.find(architecture);
  FP4MOE_CHECK(it != r.archs.end()) << "register_cuda_factory: architecture " << architecture << " is not registered";
  it->second.create_cuda = std::move(create_cuda);
}

void register_architecture(const std::string& architecture, Architecture arch) {
  FP4MOE_CHECK(arch.create && arch.manifest) << "architecture " << architecture << " registered without "
                                             << (arch.create ? "a manifest" : "a factory");
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  r.archs[architecture] = std::move(arch);
}

std::vector<std::string> registered_architectures() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  std::vector<std::string> names;
  for (const auto& [n, a] : r.archs) names.push_back(n);
  return names;
}

std::unique_ptr<CausalLM> build_model(const ModelConfig& config, const format::TensorStore& store,
                                      const LoadOptions& options) {
  const Architecture arch = find_architecture(config.architecture);
  if (options.device == Device::kCpu) return arch.create(config, store, options);
  FP4MOE_CHECK(arch.create_cuda) << config.architecture << ": no GPU (--device cuda) implementation of this"
                                 << " architecture in this build (a CUDA build registers the GPU models)";
  return arch.create_cuda(config, store, options);
}

std::vector<WeightSpec> architecture_manifest(const ModelConfig& config) {
  return find_architecture(config.architecture).manifest(config);
}

TensorCheck check_tensors(const ModelConfig& config, const format::TensorStore& store) {
  TensorCheck r;
  // The manifest has ~3 entries an expert a MoE layer: a config past the store (n_routed_experts 10^9)
  // is not expanded into names.
  size_t n_stored = 0;
  for (const auto& f : store.files()) n_stored += f->tensors().size();
  int64_t n_moe_layers = 0;
  for (int64_t l = 0; l < config.num_hidden_layers; ++l) n_moe_layers += config.is_moe_layer(l) ? 1 : 0;
  const double n_want =
      static_cast<double>(n_moe_layers) * 3.0 * static_cast<double>(std::max<int64_t>(config.n_routed_experts, 0)) +
      64.0 * static_cast<double>(std::max<int64_t>(config.num_hidden_layers, 0));
  if (n_want > 8.0 * static_cast<double>(n_stored) + 4096.0) {
    r.skipped = "config.json asks for ~" + std::to_string(static_cast<int64_t>(n_want)) + " tensors (" +
                std::to_string(config.num_hidden_layers) + " layers, " + std::to_string(config.n_routed_experts) +
                " routed experts), the checkpoint holds " + std::to_string(n_stored);
    return r;
  }
  // Layers past the checkpoint's last one are one problem (a 40-layer config over 3 layers listed 2,295).
  int64_t layers_on_disk = 0;
  for (const auto& f : store.files()) {
    for (const format::TensorInfo& t : f->tensors())
      layers_on_disk = std::max(layers_on_disk, format::layer_index(t.name) + 1);
  }
  if (config.num_hidden_layers > layers_on_disk) {
    r.problems.push_back(
        {"config.json",
         "num_hidden_layers = " + std::to_string(config.num_hidden_layers) + ": the checkpoint holds " +
             (layers_on_disk == 0 ? std::string("no layer") : "layers 0-" + std::to_string(layers_on_disk - 1)),
         false});
  }
  std::set<std::string, std::less<>> read;  // every tensor name a part of the model reads
  for (const WeightSpec& w : architecture_manifest(config)) {
    if (format::layer_index(w.name) >= layers_on_disk) continue;
    if (w.role == WeightRole::kLinear || w.role == WeightRole::kLinearBF16) {
      // The weight's shape by its format (the NVFP4 scales' are format::Checkpoint's); the scales and the
      // activation scale count as read when present.
      for (const char* part : {".weight", ".weight_scale", ".weight_scale_2", ".input_scale"})
        read.insert(w.name + part);
      const format::TensorInfo* t = store.find(w.name + ".weight");
      const int64_t out = w.shape[0], in = w.shape[1];
      if (t == nullptr) {
        r.problems.push_back({w.name,
                              "missing: " + config.architecture + " reads it (a Linear [out " + std::to_string(out) +
                                  ", in " + std::to_string(in) + "])",
                              true});
      } else if (t->dtype == DType::kU8
                     ? t->shape != Shape{out, in / 2} || in % 2 != 0
                     : (t->dtype != DType::kBF16 && t->dtype != DType::kF32) || t->shape != Shape{out, in}) {
        r.problems.push_back({w.name,
                              "weight is " + std::string(dtype_name(t->dtype)) + " " + shape_to_string(t->shape) +
                                  ", expected BF16|F32 " + shape_to_string(Shape{out, in}) + " or NVFP4 U8 " +
                                  shape_to_string(Shape{out, in / 2}),
                              true});
      } else if (std::optional<std::string> why = config.quantization.disagreement(w.name, t->dtype == DType::kU8)) {
        r.quant_disagreements.push_back({w.name, *why, true});
      }
      continue;
    }
    read.insert(w.name);
    const format::TensorInfo* t = store.find(w.name);
    const std::string want = "BF16|F32 " + shape_to_string(w.shape);  // as load_vector_f32 / load_matrix_bf16 read
    if (t == nullptr) {
      r.problems.push_back({w.name, "missing: " + config.architecture + " reads it (expected " + want + ")"});
    } else if ((t->dtype != DType::kBF16 && t->dtype != DType::kF32) || t->shape != w.shape) {
      r.problems.push_back(
          {w.name, "is " + std::string(dtype_name(t->dtype)) + " " + shape_to_string(t->shape) + ", expected " + want});
    }
  }
  const int64_t mtp_begin = config.num_hidden_layers,
                mtp_end = config.num_hidden_layers + std::max<int64_t>(config.num_nextn_predict_layers, 0);
  for (const auto& f : store.files()) {
    std::vector<std::string> unread;
    for (const format::TensorInfo& t : f->tensors()) {
      if (read.count(t.name) != 0) continue;
      const int64_t layer = format::layer_index(t.name);
      if (layer >= mtp_begin && layer < mtp_end) continue;
      unread.push_back(t.name);
    }
    if (unread.empty()) continue;
    if (unread.size() == f->tensors().size()) {
      r.unread_files.push_back({f->path().filename().string(), static_cast<int64_t>(unread.size())});
    } else {
      r.unread.insert(r.unread.end(), unread.begin(), unread.end());
    }
  }
  std::sort(r.unread.begin(), r.unread.end());
  return r;
}

uint64_t dummy_checkpoint_bytes(const ModelConfig& config, const LoadOptions& options) {
  const bool nvfp4 = options.dummy_weights == DummyWeights::kNVFP4;
  uint64_t bytes = 0;
  for (const WeightSpec& spec : architecture_manifest(config)) {
    const auto n = static_cast<uint64_t>(shape_numel(spec.shape));
    if (spec.role == WeightRole::kLinear && nvfp4) {
      bytes += n / 2 + n / format::kNvfp4BlockSize + 4;  // codes, e4m3 scales, the global scale
    } else {
      bytes += n * (spec.role == WeightRole::kF32Bias ? 4 : 2);
    }
  }
  return bytes;
}

void check_dummy_fits(const ModelConfig& config, const LoadOptions& options, const HostMemory& memory,
                      const std::filesystem::path& temp_dir, uint64_t temp_free_bytes) {
  if (options.dummy_weights == DummyWeights::kNVFP4) {
    for (const WeightSpec& spec : architecture_manifest(config)) {
      if (spec.role == WeightRole::kLinear && spec.shape.size() == 2 && spec.shape[1] % format::kNvfp4BlockSize != 0)
        throw Error("--dummy-weights nvfp4: " + spec.name + " is [" + std::to_string(spec.shape[0]) + ", " +
                    std::to_string(spec.shape[1]) + "], and NVFP4 needs in_features a multiple of " +
                    std::to_string(format::kNvfp4BlockSize) + " (its scale block); use --dummy-weights bf16");
    }
  }
  const uint64_t bytes = dummy_checkpoint_bytes(config, options);
  const auto gb = [](double b) { return fmt::format("{:.1f} GB", b / 1e9); };
  const std::string what = "dummy " + std::string(options.dummy_weights == DummyWeights::kNVFP4 ? "NVFP4" : "BF16") +
                           " weights of " + config.architecture + " (" + std::to_string(config.num_hidden_layers) +
                           " layers): a " + gb(static_cast<double>(bytes)) + " checkpoint";
  if (bytes > temp_free_bytes) {
    throw Error(what + " is written to " + temp_dir.string() + ", which has " +
                gb(static_cast<double>(temp_free_bytes)) + " free (TMPDIR picks another folder)");
  }
  // The checkpoint is made in memory before it is written; the CPU model then holds its own copy of the weights
  // (while the file's pages are read), the GPU model uploads them.
  const double need = static_cast<double>(bytes) * (options.device == Device::kCpu ? 2.0 : 1.0);
  if (!memory.source.empty() && need > memory.bytes) {
    throw Error(what +
                (options.device == Device::kCpu ? " made in memory, then copied by the CPU model: ~" + gb(need)
                                                : std::string(" made in memory")) +
                " of host memory; this machine has " + gb(memory.bytes) + " available (" + memory.source +
                "); a smaller model or --dummy-weights nvfp4 needs less");
  }
}

void write_dummy_checkpoint(const ModelConfig& config, const LoadOptions& options, const std::filesystem::path& dir) {
  const bool nvfp4 = options.dummy_weights == DummyWeights::kNVFP4;
  const std::vector<WeightSpec> manifest = architecture_manifest(config);
  uint64_t total = 0;  // progress in BF16-equivalent bytes
  for (const WeightSpec& spec : manifest) total += static_cast<uint64_t>(shape_numel(spec.shape)) * 2;
  LoadProgress progress("dummy weights", total, options.progress);
  // Each tensor is random from its own seed (options.seed and its name), so the tensors are made in
  // parallel on the CPU thread pool and added in manifest order: the file does not depend on the
  // thread count. Each task writes into its own writer; the shards are merged in order.
  std::vector<format::SafetensorsWriter> parts(manifest.size());
  std::mutex progress_mu;
  kernels::cpu::default_thread_pool().parallel_for(static_cast<int64_t>(manifest.size()), [&](int64_t i) {
    const WeightSpec& spec = manifest[static_cast<size_t>(i)];
    format::SafetensorsWriter& w = parts[static_cast<size_t>(i)];
    const uint64_t s = tensor_seed(options.seed, spec.name);
    const int64_t n = shape_numel(spec.shape);
    switch (spec.role) {
      case WeightRole::kLinear:
        add_linear(w, spec, nvfp4, options.seed);
        break;
      case WeightRole::kLinearBF16:
        add_linear(w, spec, false, options.seed);
        break;
      case WeightRole::kEmbedding:
        w.add(spec.name, DType::kBF16, spec.shape, bf16_bytes(uniform(s, n, -1.0f, 1.0f)));
        break;
      case WeightRole::kNorm:
        w.add(spec.name, DType::kBF16, spec.shape, bf16_bytes(uniform(s, n, 0.8f, 1.2f)));
        break;
      case WeightRole::kBias:
        w.add(spec.name, DType::kBF16, spec.shape, bf16_bytes(uniform(s, n, -0.05f, 0.05f)));
        break;
      case WeightRole::kF32Bias: {
        const std::vector<float> v = uniform(s, n, -0.05f, 0.05f);
        w.add(spec.name, DType::kF32, spec.shape, as_bytes_span(v));
        break;
      }
    }
    std::lock_guard<std::mutex> lock(progress_mu);
    progress.advance(static_cast<uint64_t>(n) * 2);
  });
  progress.finish();
  format::SafetensorsWriter w;
  for (format::SafetensorsWriter& part : parts) w.append(std::move(part));
  w.set_metadata("format", "pt");
  w.set_metadata("fp4moe_dummy_seed", std::to_string(options.seed));
  std::filesystem::create_directories(dir);
  w.write(dir / "model.safetensors");
}

std::unique_ptr<CausalLM> load_model(const std::filesystem::path& dir, const LoadOptions& options) {
  if (!std::filesystem::exists(dir)) {  // a preset (model/presets.h), or an error naming both
    const ModelConfig preset = load_config_or_preset(dir.string());
    FP4MOE_CHECK(options.format == LoadFormat::kDummy)
        << "preset " << dir.string() << " has no weights: load it with --load-format dummy";
    return build_dummy_model(preset, options);
  }
  ModelConfig config = load_model_config(dir);
  if (options.format == LoadFormat::kAuto) {
    format::TensorStore store(dir);
    // Tensors nothing reads are likely a config / checkpoint mismatch (an extra layer or expert, a
    // shared expert with n_shared_experts 0): warned, not refused (HF loaders do the same).
    const TensorCheck check = check_tensors(config, store);
    if (!check.quant_disagreements.empty()) {
      // As vLLM / SGLang would refuse (their layers take the section's format); these Linears load as stored.
      const TensorCheck::Problem& first = check.quant_disagreements.front();
      std::fprintf(stderr,
                   "fp4moe: warning: %s: %zu Linear(s) are stored otherwise than the quantization config says, e.g. "
                   "%s: %s; each loads as stored (`fp4moe inspect %s` lists them)\n",
                   dir.string().c_str(), check.quant_disagreements.size(), first.name.c_str(), first.message.c_str(),
                   dir.string().c_str());
    }
    if (!check.unread.empty()) {
      std::string some;
      for (size_t i = 0; i < std::min<size_t>(check.unread.size(), 3); ++i) some += (i ? ", " : "") + check.unread[i];
      std::fprintf(stderr,
                   "fp4moe: warning: %s: %zu tensor(s) that %s does not read: %s%s (`fp4moe inspect %s` lists them)\n",
                   dir.string().c_str(), check.unread.size(), config.architecture.c_str(), some.c_str(),
                   check.unread.size() > 3 ? ", ..." : "", dir.string().c_str());
    }
    return build_model(config, store, options);
  }
  config.quantization = format::QuantConfig{};  // dummy weights ignore the directory's quantization
  return build_dummy_model(config, options);
}

std::unique_ptr<CausalLM> build_dummy_model(const ModelConfig& config, const LoadOptions& options) {
  // Write the random checkpoint to a private temporary directory, map it, delete the files
  // (the mapping stays valid) and build from it through the ordinary loader.
  static std::atomic<int> counter{0};
  const std::filesystem::path tmp = std::filesystem::temp_directory_path() /
                                    ("fp4moe-dummy-" + std::to_string(getpid()) + "-" + std::to_string(counter++));
  struct Cleanup {
    std::filesystem::path p;
    ~Cleanup() {
      std::error_code ec;
      std::filesystem::remove_all(p, ec);
    }
  } cleanup{tmp};
  std::error_code ec;
  const std::filesystem::space_info space = std::filesystem::space(tmp.parent_path(), ec);
  check_dummy_fits(config, options, host_memory_available(), tmp.parent_path(), ec ? UINT64_MAX : space.available);
  write_dummy_checkpoint(config, options, tmp);
  format::TensorStore store(tmp);
  return build_model(config, store, options);
}

}  // namespace fp4moe::model
