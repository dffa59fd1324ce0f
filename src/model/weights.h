// Helpers for model builders reading a checkpoint: checked tensor access (errors name the tensor,
// the expected and the found shape/dtype) and the load progress bar on stderr (drawn only when
// stderr is a terminal and the load has taken more than 1 s). Linears load through
// moe/weights.h (load_linear), MLPs and MoE blocks through moe/mlp.h and moe/moe_layer.h.
// Tested by tests/model/test_registry.cpp (load errors).
#pragma once

#include <chrono>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "format/safetensors.h"

namespace fp4moe::model {

// The tensor `name` with exactly `shape` and one of `dtypes`; throws naming the checkpoint
// directory, the tensor, the expected and the found shape/dtype.
TensorView require_tensor(const format::TensorStore& store, const std::string& name, const Shape& shape,
                          std::initializer_list<DType> dtypes);

// A BF16/F32 vector tensor [n] (norm weight, bias) as f32.
std::vector<float> load_vector_f32(const format::TensorStore& store, const std::string& name, int64_t n);

// A BF16/F32 [rows, cols] tensor kept as bf16 bits (embedding tables): F32 is rounded to bf16.
std::vector<uint16_t> load_matrix_bf16(const format::TensorStore& store, const std::string& name, int64_t rows,
                                       int64_t cols);

// Bytes of the tensors of each decoder layer ("model.layers.<L>."), [n_layers + 1]: the last entry
// holds every other tensor (embeddings, final norm, lm_head, MTP layers). Progress accounting.
std::vector<uint64_t> layer_tensor_bytes(const format::TensorStore& store, int64_t n_layers);

// "Loading <what> [=====>     ] 41% 1.2/2.9 GB 3.1 s" on stderr, redrawn at most 10 times a second.
class LoadProgress {
 public:
  LoadProgress(std::string what, uint64_t total_bytes, bool enabled);
  ~LoadProgress();  // ends the line if one was drawn
  LoadProgress(const LoadProgress&) = delete;
  LoadProgress& operator=(const LoadProgress&) = delete;

  void advance(uint64_t bytes);
  void finish();

 private:
  void draw(bool final_draw);

  std::string what_;
  uint64_t total_ = 0;
  uint64_t done_ = 0;
  bool enabled_ = false;
  bool drawn_ = false;
  std::chrono::steady_clock::time_point start_;
  std::chrono::steady_clock::time_point last_draw_;
};

}  // namespace fp4moe::model
