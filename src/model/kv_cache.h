// ContiguousKvState: the CPU KV cache of one sequence, contiguous per layer and stream (f32 rows,
// grown as tokens arrive). A model picks its streams per layer: GLM-4.x caches K [n_kv_heads *
// head_dim] and V; GLM-5 caches the MLA latent (c_kv + k_pe) and the indexer keys.
//
// A forward appends each layer's new rows (append), reads the cached prefix (rows), and after the
// last layer commits the new length; on an error it rolls every stream back to length(), so a
// failed step leaves the cache as it was. A paged cache for the server comes with the engine.
// Tested by tests/model/test_kv_cache.cpp and, end to end, tests/model/test_glm4_moe.cpp.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "model/causal_lm.h"

namespace fp4moe::model {

class ContiguousKvState : public KvState {
 public:
  // `owner` identifies the model that created it (forward() checks it); stream_widths are the
  // floats per token of each stream, the same for every layer.
  ContiguousKvState(const void* owner, int64_t n_layers, std::vector<int64_t> stream_widths);

  int64_t length() const override { return length_; }
  void truncate(int64_t n_tokens) override;
  size_t bytes() const override;
  std::unique_ptr<KvState> copy_prefix(int64_t n_tokens) const override;  // copies the rows

  const void* owner() const { return owner_; }
  int64_t n_layers() const { return n_layers_; }
  int n_streams() const { return static_cast<int>(widths_.size()); }
  int64_t width(int stream) const { return widths_.at(static_cast<size_t>(stream)); }

  // Grows (layer, stream) by n rows and returns the first new row (row rows_in(layer, stream) - n).
  // Pointers stay valid until the next append to the same (layer, stream).
  float* append(int64_t layer, int stream, int64_t n);
  // All rows of (layer, stream): [rows_in, width].
  const float* rows(int64_t layer, int stream) const;
  int64_t rows_in(int64_t layer, int stream) const;

  // After a successful step: every (layer, stream) must hold length() + n rows.
  void commit(int64_t n);
  // After a failed step: drop every row beyond length().
  void rollback();

 private:
  std::vector<float>& buf(int64_t layer, int stream);
  const std::vector<float>& buf(int64_t layer, int stream) const;

  const void* owner_;
  int64_t n_layers_;
  std::vector<int64_t> widths_;
  std::vector<std::vector<float>> bufs_;  // [layer * n_streams + stream]
  int64_t length_ = 0;
};

}  // namespace fp4moe::model
