// Test helpers (header only): temporary directories and edited copies of checkpoints (tensors
// dropped or replaced, JSON files changed, split into shards with model.safetensors.index.json).
// Used by tests/format/test_checkpoint.cpp, tests/format/test_quantize_checkpoint.cpp and
// tests/tools/test_inspect.cpp.
#pragma once

#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/tensor.h"
#include "format/safetensors.h"

namespace fp4moe::testing {

// A directory under the system temp folder, removed when the object dies.
class TempDir {
 public:
  explicit TempDir(const std::string& tag) {
    static std::atomic<int> counter{0};
    path_ = std::filesystem::temp_directory_path() /
            ("fp4moe_" + tag + "_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

struct OwnedTensor {
  DType dtype = DType::kU8;
  Shape shape;
  std::vector<uint8_t> bytes;
};
using TensorMap = std::map<std::string, OwnedTensor>;

inline nlohmann::ordered_json read_json(const std::filesystem::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return nlohmann::ordered_json::parse(ss.str());
}

inline void write_json(const std::filesystem::path& p, const nlohmann::ordered_json& j) {
  std::ofstream out(p);
  out << j.dump(2) << "\n";
}

inline TensorMap read_tensors(const std::filesystem::path& dir) {
  format::TensorStore store(dir);
  TensorMap m;
  for (const std::string& name : store.names()) {
    TensorView v = store.view(name);
    m[name] = OwnedTensor{v.dtype, v.shape, std::vector<uint8_t>(v.bytes.begin(), v.bytes.end())};
  }
  return m;
}

// Writes `tensors` into `dir` as model.safetensors (n_shards == 1) or as n_shards files
// model-0000i-of-0000n.safetensors plus model.safetensors.index.json.
inline void write_tensors(const std::filesystem::path& dir, const TensorMap& tensors,
                          int n_shards = 1) {
  if (n_shards == 1) {
    format::SafetensorsWriter w;
    for (const auto& [name, t] : tensors) w.add(name, t.dtype, t.shape, t.bytes);
    w.write(dir / "model.safetensors");
    return;
  }
  std::vector<format::SafetensorsWriter> writers(static_cast<size_t>(n_shards));
  nlohmann::ordered_json index;
  index["metadata"]["total_size"] = 0;
  size_t i = 0;
  uint64_t total = 0;
  for (const auto& [name, t] : tensors) {
    const size_t shard = i++ * static_cast<size_t>(n_shards) / tensors.size();
    writers[shard].add(name, t.dtype, t.shape, t.bytes);
    char file[64];
    std::snprintf(file, sizeof(file), "model-%05zu-of-%05d.safetensors", shard + 1, n_shards);
    index["weight_map"][name] = file;
    total += t.bytes.size();
  }
  index["metadata"]["total_size"] = total;
  for (size_t s = 0; s < writers.size(); ++s) {
    char file[64];
    std::snprintf(file, sizeof(file), "model-%05zu-of-%05d.safetensors", s + 1, n_shards);
    writers[s].write(dir / file);
  }
  write_json(dir / "model.safetensors.index.json", index);
}

// Copies checkpoint `src` into `dst` (created): JSON files through `edit_json(filename, json)`,
// tensors through `edit_tensors`, written in `n_shards` shards.
inline void copy_checkpoint(
    const std::filesystem::path& src, const std::filesystem::path& dst,
    const std::function<void(TensorMap&)>& edit_tensors = nullptr,
    const std::function<void(const std::string&, nlohmann::ordered_json&)>& edit_json = nullptr,
    int n_shards = 1) {
  std::filesystem::create_directories(dst);
  for (const auto& e : std::filesystem::directory_iterator(src)) {
    const std::string name = e.path().filename().string();
    if (e.path().extension() != ".json" || name == "model.safetensors.index.json") continue;
    nlohmann::ordered_json j = read_json(e.path());
    if (edit_json) edit_json(name, j);
    write_json(dst / name, j);
  }
  TensorMap tensors = read_tensors(src);
  if (edit_tensors) edit_tensors(tensors);
  write_tensors(dst, tensors, n_shards);
}

}  // namespace fp4moe::testing
