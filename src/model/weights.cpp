// Checked tensor access and the load progress bar (see weights.h).
#include "model/weights.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <sstream>

#include "core/error.h"
#include "format/checkpoint.h"
#include "model/ops.h"

namespace fp4moe::model {

TensorView require_tensor(const format::TensorStore& store, const std::string& name, const Shape& shape,
                          std::initializer_list<DType> dtypes) {
  std::ostringstream want;
  for (DType d : dtypes) want << (want.tellp() > 0 ? "|" : "") << dtype_name(d);
  const format::TensorInfo* info = store.find(name);
  FP4MOE_CHECK(info != nullptr) << store.dir().string() << ": tensor " << name << " is missing (expected "
                                << want.str() << " " << shape_to_string(shape) << ")";
  bool dtype_ok = false;
  for (DType d : dtypes) dtype_ok = dtype_ok || d == info->dtype;
  FP4MOE_CHECK(info->shape == shape && dtype_ok)
      << store.dir().string() << ": tensor " << name << " is " << dtype_name(info->dtype) << " "
      << shape_to_string(info->shape) << ", expected " << want.str() << " " << shape_to_string(shape);
  return store.view(name);
}

std::vector<float> load_vector_f32(const format::TensorStore& store, const std::string& name, int64_t n) {
  return to_f32(require_tensor(store, name, {n}, {DType::kBF16, DType::kF32}));
}

std::vector<uint16_t> load_matrix_bf16(const format::TensorStore& store, const std::string& name, int64_t rows,
                                       int64_t cols) {
  const TensorView t = require_tensor(store, name, {rows, cols}, {DType::kBF16, DType::kF32});
  std::vector<uint16_t> out(static_cast<size_t>(rows * cols));
  if (t.dtype == DType::kBF16) {
    auto v = t.as<uint16_t>();
    std::copy(v.begin(), v.end(), out.begin());
  } else {
    auto v = t.as<float>();
    for (size_t i = 0; i < out.size(); ++i) out[i] = f32_to_bf16(v[i]);
  }
  return out;
}

std::vector<uint64_t> layer_tensor_bytes(const format::TensorStore& store, int64_t n_layers) {
  // Counted per layer seen first, so that a config asking for more layers than the checkpoint holds
  // (num_hidden_layers 10^7) is refused before anything is sized by it.
  std::map<int64_t, uint64_t> seen;  // layer (or -1: not a layer's) -> bytes
  for (const auto& file : store.files()) {
    for (const auto& t : file->tensors()) {
      const int64_t layer = format::layer_index(t.name);
      seen[layer] += t.nbytes();
    }
  }
  const int64_t on_disk = seen.empty() ? 0 : std::max<int64_t>(seen.rbegin()->first + 1, 0);
  FP4MOE_CHECK(n_layers <= on_disk) << store.dir().string() << ": config.json num_hidden_layers = " << n_layers
                                    << ", but the checkpoint's tensors hold "
                                    << (on_disk == 0 ? std::string("no model.layers.N.*")
                                                     : "layers 0-" + std::to_string(on_disk - 1));
  std::vector<uint64_t> bytes(static_cast<size_t>(n_layers + 1), 0);
  for (const auto& [layer, b] : seen) bytes[static_cast<size_t>(layer < 0 ? n_layers : std::min(layer, n_layers))] += b;
  return bytes;
}

LoadProgress::LoadProgress(std::string what, uint64_t total_bytes, bool enabled)
    : what_(std::move(what)), total_(total_bytes), enabled_(enabled && isatty(STDERR_FILENO) == 1) {
  start_ = std::chrono::steady_clock::now();
  last_draw_ = start_;
}

LoadProgress::~LoadProgress() {
  if (drawn_) std::fputc('\n', stderr);
}

void LoadProgress::advance(uint64_t bytes) {
  done_ += bytes;
  if (!enabled_) return;
  const auto now = std::chrono::steady_clock::now();
  // Quiet for the first second (small loads print nothing), then at most 10 redraws a second.
  if (now - start_ < std::chrono::seconds(1) || now - last_draw_ < std::chrono::milliseconds(100)) return;
  last_draw_ = now;
  draw(false);
}

void LoadProgress::finish() {
  if (drawn_) {
    draw(true);
    std::fputc('\n', stderr);
    drawn_ = false;
  }
}

void LoadProgress::draw(bool final_draw) {
  constexpr int kWidth = 30;
  const double frac = total_ > 0 ? std::min(1.0, static_cast<double>(done_) / static_cast<double>(total_)) : 1.0;
  const int filled = static_cast<int>(frac * kWidth);
  std::string bar(static_cast<size_t>(kWidth), ' ');
  for (int i = 0; i < filled; ++i) bar[static_cast<size_t>(i)] = '=';
  if (filled < kWidth && !final_draw) bar[static_cast<size_t>(filled)] = '>';
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  std::fprintf(stderr, "\rLoading %s [%s] %3d%% %.2f/%.2f GB %.1f s", what_.c_str(), bar.c_str(),
               static_cast<int>(frac * 100.0), static_cast<double>(done_) / 1e9, static_cast<double>(total_) / 1e9,
               secs);
  std::fflush(stderr);
  drawn_ = true;
}

}  // namespace fp4moe::model
