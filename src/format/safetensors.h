// safetensors reading (memory-mapped, fully validated) and writing, plus sharded checkpoints
// (model.safetensors.index.json). Format facts: ../shared/spec/nvfp4-and-glm.md §5.
//
// Every malformed input raises fp4moe::Error naming the file, the tensor (when there is one) and
// the violated rule; no input makes the reader crash or read out of bounds (fuzz/fuzz_safetensors.cpp).
// Tested by tests/format/test_safetensors.cpp.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/tensor.h"

namespace fp4moe::format {

// Reader limit on the JSON header length (huggingface/safetensors MAX_HEADER_SIZE).
inline constexpr uint64_t kSafetensorsMaxHeaderBytes = 100'000'000;

struct TensorInfo {
  std::string name;
  DType dtype = DType::kU8;
  Shape shape;
  uint64_t begin = 0;  // offsets relative to the data buffer (byte 8 + header length)
  uint64_t end = 0;

  int64_t numel() const { return shape_numel(shape); }
  uint64_t nbytes() const { return end - begin; }
};

// The parsed, validated header of one file.
struct SafetensorsHeader {
  std::vector<TensorInfo> tensors;  // in file order (sorted by begin offset)
  std::map<std::string, std::string> metadata;  // "__metadata__"
  uint64_t data_start = 0;  // 8 + header length
};

// Parses and validates a whole safetensors image held in memory. `source` names it in errors
// (usually the file path). Throws fp4moe::Error on any violation.
SafetensorsHeader parse_safetensors(std::span<const uint8_t> file_bytes, const std::string& source);

// One memory-mapped safetensors file.
class SafetensorsFile {
 public:
  explicit SafetensorsFile(const std::filesystem::path& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::filesystem::path& path() const { return path_; }
  const std::vector<TensorInfo>& tensors() const { return header_.tensors; }
  const std::map<std::string, std::string>& metadata() const { return header_.metadata; }

  const TensorInfo* find(std::string_view name) const;  // nullptr when absent
  TensorView view(const TensorInfo& info) const;
  TensorView view(std::string_view name) const;  // throws naming the file when absent

 private:
  std::filesystem::path path_;
  const uint8_t* map_ = nullptr;
  size_t map_bytes_ = 0;
  SafetensorsHeader header_;
  std::map<std::string, size_t, std::less<>> index_;
};

// All tensors of a checkpoint directory: model.safetensors, or the shards named by
// model.safetensors.index.json (every weight_map entry must exist in its shard), or, lacking
// both, every *.safetensors file in the directory. Duplicate names across files are an error.
class TensorStore {
 public:
  explicit TensorStore(const std::filesystem::path& dir);

  const std::filesystem::path& dir() const { return dir_; }
  std::vector<std::string> names() const;  // sorted
  bool contains(std::string_view name) const;
  const TensorInfo* find(std::string_view name) const;
  TensorView view(std::string_view name) const;  // throws naming the dir and tensor when absent
  const SafetensorsFile& file_of(std::string_view name) const;
  const std::vector<std::unique_ptr<SafetensorsFile>>& files() const { return files_; }

 private:
  std::filesystem::path dir_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, size_t, std::less<>> owner_;  // tensor name -> index into files_
};

// Writes files the Python safetensors library reads: header JSON padded with spaces to a multiple
// of 8, tensors sorted by dtype (descending) then name, contiguous.
class SafetensorsWriter {
 public:
  void add(const std::string& name, DType dtype, const Shape& shape, std::span<const uint8_t> bytes);
  void add(const std::string& name, const TensorView& view) { add(name, view.dtype, view.shape, view.bytes); }
  // Moves every tensor of `other` (in its order) after this writer's; a name already here fails as
  // add() does. Metadata of `other` is not taken.
  void append(SafetensorsWriter&& other);
  void set_metadata(const std::string& key, const std::string& value) { metadata_[key] = value; }
  void write(const std::filesystem::path& path) const;

 private:
  struct Entry {
    std::string name;
    DType dtype;
    Shape shape;
    std::vector<uint8_t> bytes;
  };
  std::vector<Entry> entries_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace fp4moe::format
