// Editing a golden checkpoint for a test: copy its config.json and tensors into a scratch directory with
// tensors dropped or replaced (a wrong shape, a NaN weight). Shared by the registry test (CPU) and the GPU model
// test.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <system_error>
#include <vector>

#include "core/dtype.h"
#include "core/tensor.h"
#include "format/safetensors.h"
#include "testing/testing.h"

namespace fp4moe::model::checkpoint_edit {

// A scratch directory under the system's temp dir, removed with its contents.
struct TempDir {
  std::filesystem::path path;
  explicit TempDir(const std::string& tag = "edit") {
    static int n = 0;
    path = std::filesystem::temp_directory_path() /
           ("fp4moe_test_" + tag + "_" + std::to_string(getpid()) + "_" + std::to_string(n++));
    std::filesystem::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
};

struct Replacement {
  DType dtype;
  Shape shape;
  std::vector<uint8_t> bytes;
};

inline std::filesystem::path golden(const std::string& name) {
  return fp4moe::testing::shared_path("golden/models/" + name);
}

// Copies a golden checkpoint's config.json (and hf_quant_config.json and generation_config.json, where it has them)
// and tensors into dir; `edit` may drop a tensor (return false) or replace it (fill `out`).
inline void copy_checkpoint(const std::filesystem::path& src, const std::filesystem::path& dir,
                            const std::function<bool(const std::string&, std::optional<Replacement>&)>& edit) {
  std::filesystem::copy_file(src / "config.json", dir / "config.json");
  for (const char* json : {"hf_quant_config.json", "generation_config.json"}) {
    if (std::filesystem::exists(src / json)) std::filesystem::copy_file(src / json, dir / json);
  }
  format::SafetensorsFile f(src / "model.safetensors");
  format::SafetensorsWriter w;
  for (const auto& info : f.tensors()) {
    std::optional<Replacement> rep;
    if (!edit(info.name, rep)) continue;
    if (rep) {
      w.add(info.name, rep->dtype, rep->shape, rep->bytes);
    } else {
      w.add(info.name, f.view(info));
    }
  }
  w.write(dir / "model.safetensors");
}

// Copies golden `model` to `to` with one element of the BF16 matrix `name` (row `row`, column `col`) set to NaN.
// Fails (throws) when `name` is not a BF16 matrix of the checkpoint.
inline void copy_with_nan(const std::string& model, const std::filesystem::path& to, const std::string& name,
                          int64_t row, int64_t col) {
  bool found = false;
  copy_checkpoint(golden(model), to, [&](const std::string& n, std::optional<Replacement>& r) {
    if (n != name) return true;
    format::SafetensorsFile f(golden(model) / "model.safetensors");
    const TensorView v = f.view(*f.find(n));
    FP4MOE_CHECK(v.dtype == DType::kBF16 && v.shape.size() == 2 && row < v.shape[0] && col < v.shape[1])
        << n << " is not a BF16 matrix holding [" << row << ", " << col << "]";
    r = Replacement{v.dtype, v.shape, std::vector<uint8_t>(v.bytes.begin(), v.bytes.end())};
    const uint16_t nan_bf16 = 0x7FC0;
    std::memcpy(r->bytes.data() + 2 * (row * v.shape[1] + col), &nan_bf16, 2);
    found = true;
    return true;
  });
  FP4MOE_CHECK(found) << model << " has no tensor " << name;
}

}  // namespace fp4moe::model::checkpoint_edit
