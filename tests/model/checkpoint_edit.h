// Editing a golden checkpoint for a model test, on top of testing::copy_checkpoint (tests/format/checkpoint_edit.h):
// per-tensor edits (drop or replace a tensor by name) and a NaN planted in one element of a BF16 matrix. Shared by
// the registry test (CPU) and the GPU model test.
#pragma once

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>

#include "core/error.h"
#include "format/checkpoint_edit.h"
#include "testing/testing.h"

namespace fp4moe::model::checkpoint_edit {

using Replacement = fp4moe::testing::OwnedTensor;  // {dtype, shape, bytes}

inline std::filesystem::path golden(const std::string& name) {
  return fp4moe::testing::shared_path("golden/models/" + name);
}

// Copies checkpoint `src` (its JSON files and tensors) into dir; `edit(name, out)` may drop a tensor (return false)
// or replace it (fill `out`).
inline void copy_checkpoint(const std::filesystem::path& src, const std::filesystem::path& dir,
                            const std::function<bool(const std::string&, std::optional<Replacement>&)>& edit) {
  fp4moe::testing::copy_checkpoint(src, dir, [&](fp4moe::testing::TensorMap& tensors) {
    for (auto it = tensors.begin(); it != tensors.end();) {
      std::optional<Replacement> rep;
      if (!edit(it->first, rep)) {
        it = tensors.erase(it);
        continue;
      }
      if (rep) it->second = std::move(*rep);
      ++it;
    }
  });
}

// Copies golden `model` to `to` with one element of the BF16 matrix `name` (row `row`, column `col`) set to NaN.
// Fails (throws) when `name` is not a BF16 matrix of the checkpoint.
inline void copy_with_nan(const std::string& model, const std::filesystem::path& to, const std::string& name,
                          int64_t row, int64_t col) {
  fp4moe::testing::copy_checkpoint(golden(model), to, [&](fp4moe::testing::TensorMap& tensors) {
    auto it = tensors.find(name);
    FP4MOE_CHECK(it != tensors.end()) << model << " has no tensor " << name;
    Replacement& w = it->second;
    FP4MOE_CHECK(w.dtype == DType::kBF16 && w.shape.size() == 2 && row < w.shape[0] && col < w.shape[1])
        << name << " is not a BF16 matrix holding [" << row << ", " << col << "]";
    const uint16_t nan_bf16 = 0x7FC0;
    std::memcpy(w.bytes.data() + 2 * (row * w.shape[1] + col), &nan_bf16, 2);
  });
}

}  // namespace fp4moe::model::checkpoint_edit
