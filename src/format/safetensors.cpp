// safetensors reader (validating parser, mmap'd files, sharded checkpoint directories) and writer.
// Format: ../shared/spec/nvfp4-and-glm.md §5 and §5.1. API and guarantees: safetensors.h.
// Tested by tests/format/test_safetensors.cpp; parse_safetensors is fuzzed by fuzz/fuzz_safetensors.cpp.
#include "format/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <system_error>

#include "core/error.h"
#include "core/file.h"

// Like FP4MOE_CHECK, without the "check failed: <condition>" prefix: these messages describe a
// malformed input to its user, and start with the file name.
#define FP4MOE_REQUIRE(cond) (cond) ? (void)0 : FP4MOE_FAIL()

namespace fp4moe::format {
namespace {

using nlohmann::json;

std::string errno_text(int err) { return std::generic_category().message(err); }

// Returns the index of the first byte that does not belong to a well-formed UTF-8 sequence
// (overlong forms, surrogates and code points above U+10FFFF are ill-formed), or npos.
size_t first_invalid_utf8(std::string_view s) {
  size_t i = 0;
  const size_t n = s.size();
  while (i < n) {
    const auto c = static_cast<uint8_t>(s[i]);
    if (c < 0x80) {
      ++i;
      continue;
    }
    size_t len = 0;
    uint32_t cp = 0;
    uint32_t min_cp = 0;
    if ((c & 0xE0) == 0xC0) {
      len = 2, cp = c & 0x1F, min_cp = 0x80;
    } else if ((c & 0xF0) == 0xE0) {
      len = 3, cp = c & 0x0F, min_cp = 0x800;
    } else if ((c & 0xF8) == 0xF0) {
      len = 4, cp = c & 0x07, min_cp = 0x10000;
    } else {
      return i;  // continuation byte without a lead, or 0xF8..0xFF
    }
    if (n - i < len) return i;
    for (size_t k = 1; k < len; ++k) {
      const auto cc = static_cast<uint8_t>(s[i + k]);
      if ((cc & 0xC0) != 0x80) return i;
      cp = (cp << 6) | (cc & 0x3F);
    }
    if (cp < min_cp || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return i;
    i += len;
  }
  return std::string_view::npos;
}

// Parses JSON text with nlohmann, rejecting what it would silently accept: duplicate keys in any
// object (it keeps one of them) and nesting deeper than `max_depth` arrays/objects. Errors read
// "<source>: <kind> '<top-level key>': <rule>"; `what` names the text in JSON syntax errors
// ("<file>: header"), which carry the byte position (relative to `text`, plus `byte_base` for the
// position in the file).
json parse_json_strict(std::string_view text, const std::string& source, const std::string& what,
                       const char* kind, size_t max_depth, uint64_t byte_base) {
  std::vector<std::set<std::string>> keys_seen;  // one set per open container (arrays: empty)
  std::string top_key;                           // the top-level key being parsed
  json::parser_callback_t callback = [&](int /*depth*/, json::parse_event_t event, json& parsed) {
    switch (event) {
      case json::parse_event_t::object_start:
      case json::parse_event_t::array_start:
        if (keys_seen.size() >= max_depth) {
          FP4MOE_FAIL() << source << ": " << kind << " '" << top_key << "': JSON nests deeper than "
                        << max_depth << " levels";
        }
        keys_seen.emplace_back();
        break;
      case json::parse_event_t::object_end:
      case json::parse_event_t::array_end:
        if (!keys_seen.empty()) keys_seen.pop_back();
        break;
      case json::parse_event_t::key: {
        std::string key = parsed.get<std::string>();
        if (keys_seen.size() == 1) top_key = key;
        if (!keys_seen.empty() && !keys_seen.back().insert(key).second) {
          if (keys_seen.size() == 1) {
            FP4MOE_FAIL() << source << ": " << kind << " '" << key << "': duplicate " << kind
                          << " name (nlohmann would keep only one)";
          }
          FP4MOE_FAIL() << source << ": " << kind << " '" << top_key << "': duplicate key '" << key << "'";
        }
        break;
      }
      case json::parse_event_t::value:
        break;
    }
    return true;
  };
  // nlohmann's lexer takes a NUL byte for the end of input and would accept "{}\0garbage"; JSON
  // allows no raw NUL anywhere (inside strings it must be escaped).
  const size_t nul = text.find('\0');
  FP4MOE_REQUIRE(nul == std::string_view::npos) << what << " is not valid JSON (NUL byte at byte " << nul
                                                << " of it, file byte " << byte_base + nul << ")";
  try {
    return json::parse(text.begin(), text.end(), callback, /*allow_exceptions=*/true);
  } catch (const json::parse_error& e) {
    FP4MOE_FAIL() << what << " is not valid JSON (at byte " << e.byte << " of it, file byte "
                  << byte_base + e.byte << "): " << e.what();
  } catch (const json::exception& e) {
    FP4MOE_FAIL() << what << " is not valid JSON: " << e.what();
  }
  return json();  // unreachable: FP4MOE_FAIL throws
}

// A JSON number that is an integer >= 0 (nlohmann stores "-0" as a signed integer).
bool as_nonnegative_int(const json& j, uint64_t* out) {
  if (j.is_number_unsigned()) {
    *out = j.get<uint64_t>();
    return true;
  }
  if (j.is_number_integer() && j.get<int64_t>() >= 0) {
    *out = static_cast<uint64_t>(j.get<int64_t>());
    return true;
  }
  return false;
}

// Number of elements, checking the running product stays within int64 (as shape_numel computes
// it, so that no caller overflows). Returns false on overflow with the dimension index in *at.
bool checked_numel(const Shape& shape, int64_t* numel, size_t* at) {
  int64_t n = 1;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (__builtin_mul_overflow(n, shape[i], &n)) {
      *at = i;
      return false;
    }
  }
  *numel = n;
  return true;
}

// Byte size of numel elements of dtype; false when numel*bits is not a whole number of bytes.
bool byte_size(int64_t numel, DType dtype, uint64_t* nbytes) {
  const auto bits = static_cast<unsigned __int128>(numel) * static_cast<unsigned>(dtype_bits(dtype));
  if (bits % 8 != 0) return false;
  *nbytes = static_cast<uint64_t>(bits / 8);  // numel < 2^63 and bits <= 64: fits after / 8
  return true;
}

TensorInfo parse_tensor_entry(const std::string& name, const json& entry, uint64_t buffer_bytes,
                              const std::string& source) {
  const std::string where = source + ": tensor '" + name + "': ";
  FP4MOE_REQUIRE(entry.is_object()) << where << "entry is not an object (it is a " << entry.type_name()
                                    << ")";
  for (const auto& [key, _] : entry.items()) {
    FP4MOE_REQUIRE(key == "dtype" || key == "shape" || key == "data_offsets")
        << where << "unknown key '" << key << "' (allowed: dtype, shape, data_offsets)";
  }
  for (const char* key : {"dtype", "shape", "data_offsets"}) {
    FP4MOE_REQUIRE(entry.contains(key)) << where << "missing key '" << key << "'";
  }
  TensorInfo info;
  info.name = name;

  const json& dtype = entry["dtype"];
  FP4MOE_REQUIRE(dtype.is_string()) << where << "dtype is not a string (it is a " << dtype.type_name() << ")";
  const std::optional<DType> parsed = parse_dtype(dtype.get<std::string>());
  FP4MOE_REQUIRE(parsed.has_value()) << where << "unknown dtype '" << dtype.get<std::string>() << "'";
  info.dtype = *parsed;

  const json& shape = entry["shape"];
  FP4MOE_REQUIRE(shape.is_array()) << where << "shape is not an array (it is a " << shape.type_name() << ")";
  for (size_t i = 0; i < shape.size(); ++i) {
    uint64_t d = 0;
    FP4MOE_REQUIRE(as_nonnegative_int(shape[i], &d) &&
                   d <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
        << where << "shape[" << i << "] is not a non-negative int64 (" << shape[i].dump() << ")";
    info.shape.push_back(static_cast<int64_t>(d));
  }
  int64_t numel = 0;
  size_t overflow_at = 0;
  FP4MOE_REQUIRE(checked_numel(info.shape, &numel, &overflow_at))
      << where << "element count of shape " << shape_to_string(info.shape) << " overflows int64 (at dim "
      << overflow_at << ")";
  uint64_t nbytes = 0;
  FP4MOE_REQUIRE(byte_size(numel, info.dtype, &nbytes))
      << where << "size is not a whole number of bytes (" << numel << " elements x " << dtype_bits(info.dtype)
      << " bits of " << dtype_name(info.dtype) << ")";

  const json& offsets = entry["data_offsets"];
  uint64_t begin = 0;
  uint64_t end = 0;
  FP4MOE_REQUIRE(offsets.is_array() && offsets.size() == 2 && as_nonnegative_int(offsets[0], &begin) &&
                 as_nonnegative_int(offsets[1], &end))
      << where << "data_offsets is not [begin, end] of non-negative integers (" << offsets.dump() << ")";
  FP4MOE_REQUIRE(begin <= end) << where << "data_offsets begin > end (" << begin << " > " << end << ")";
  FP4MOE_REQUIRE(end - begin == nbytes)
      << where << "wrong byte size: data_offsets [" << begin << ", " << end << "] hold " << end - begin
      << " bytes but " << dtype_name(info.dtype) << " " << shape_to_string(info.shape) << " needs " << nbytes;
  FP4MOE_REQUIRE(end <= buffer_bytes) << where << "data_offsets end past the end of the file (end " << end
                                      << " > data buffer of " << buffer_bytes << " bytes)";
  info.begin = begin;
  info.end = end;
  return info;
}

}  // namespace

SafetensorsHeader parse_safetensors(std::span<const uint8_t> file_bytes, const std::string& source) {
  const uint64_t file_size = file_bytes.size();
  FP4MOE_REQUIRE(file_size >= 8) << source << ": truncated: file is " << file_size
                                 << " bytes, shorter than the 8-byte header length";
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | file_bytes[static_cast<size_t>(i)];
  FP4MOE_REQUIRE(n <= kSafetensorsMaxHeaderBytes)
      << source << ": header too large (" << n << " bytes > limit " << kSafetensorsMaxHeaderBytes << ")";
  FP4MOE_REQUIRE(n <= file_size - 8) << source << ": truncated: header runs past the end of the file (8 + "
                                     << n << " > " << file_size << " bytes)";
  const std::string_view text(reinterpret_cast<const char*>(file_bytes.data()) + 8, n);
  const size_t bad = first_invalid_utf8(text);
  FP4MOE_REQUIRE(bad == std::string_view::npos)
      << source << ": header is not valid UTF-8 (ill-formed byte 0x" << std::hex
      << static_cast<int>(static_cast<uint8_t>(text[bad])) << std::dec << " at header byte " << bad
      << ", file byte " << 8 + bad << ")";

  // Depth 3 = top-level object > tensor entry > shape/data_offsets array.
  const json root = parse_json_strict(text, source, source + ": header", "tensor", 3, 8);
  FP4MOE_REQUIRE(root.is_object()) << source << ": header JSON is not an object (it is a " << root.type_name()
                                   << ")";

  SafetensorsHeader header;
  header.data_start = 8 + n;
  const uint64_t buffer_bytes = file_size - header.data_start;
  for (const auto& [name, value] : root.items()) {
    if (name == "__metadata__") {
      FP4MOE_REQUIRE(value.is_object())
          << source << ": __metadata__ is not an object of strings (it is a " << value.type_name() << ")";
      for (const auto& [key, v] : value.items()) {
        FP4MOE_REQUIRE(v.is_string()) << source << ": __metadata__ is not an object of strings (key '" << key
                                      << "' holds a " << v.type_name() << ")";
        header.metadata[key] = v.get<std::string>();
      }
      continue;
    }
    header.tensors.push_back(parse_tensor_entry(name, value, buffer_bytes, source));
  }

  // Metadata::validate: sorted by offsets the tensors tile the data buffer exactly.
  std::sort(header.tensors.begin(), header.tensors.end(), [](const TensorInfo& a, const TensorInfo& b) {
    return std::tie(a.begin, a.end, a.name) < std::tie(b.begin, b.end, b.name);
  });
  uint64_t covered = 0;
  for (size_t i = 0; i < header.tensors.size(); ++i) {
    const TensorInfo& t = header.tensors[i];
    if (i == 0) {
      FP4MOE_REQUIRE(t.begin == 0) << source << ": tensor '" << t.name
                                   << "': gap: the first tensor does not start at 0 (begin " << t.begin
                                   << ")";
    } else {
      const TensorInfo& prev = header.tensors[i - 1];
      FP4MOE_REQUIRE(t.begin >= prev.end)
          << source << ": tensor '" << t.name << "': overlapping tensor '" << prev.name << "' (begin "
          << t.begin << " < its end " << prev.end << ")";
      FP4MOE_REQUIRE(t.begin == prev.end)
          << source << ": tensor '" << t.name << "': gap of " << t.begin - prev.end << " bytes after tensor '"
          << prev.name << "' (begin " << t.begin << " > its end " << prev.end << ")";
    }
    covered = t.end;
  }
  FP4MOE_REQUIRE(covered == buffer_bytes)
      << source << ": data buffer size mismatch: the tensors end at byte " << covered
      << " but the data buffer holds " << buffer_bytes << " bytes (file " << file_size
      << " bytes = 8 + header " << n << " + data)";
  return header;
}

// ---------------------------------------------------------------------------------------------
// SafetensorsFile

SafetensorsFile::SafetensorsFile(const std::filesystem::path& path) : path_(path) {
  // O_NONBLOCK: a FIFO in the file's place opens at once (and is refused below as not a regular file) instead of
  // blocking until a writer comes; reads of a regular file ignore the flag.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  const int open_errno = errno;
  FP4MOE_REQUIRE(fd >= 0) << path.string() << ": cannot open: " << errno_text(open_errno);
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    FP4MOE_FAIL() << path.string() << ": cannot stat: " << errno_text(err);
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    FP4MOE_FAIL() << path.string() << ": not a regular file";
  }
  map_bytes_ = static_cast<size_t>(st.st_size);
  if (map_bytes_ > 0) {  // mmap of length 0 is EINVAL; an empty file is rejected by the parser
    void* p = ::mmap(nullptr, map_bytes_, PROT_READ, MAP_PRIVATE, fd, 0);
    const int err = errno;
    ::close(fd);
    FP4MOE_REQUIRE(p != MAP_FAILED) << path.string() << ": cannot mmap " << map_bytes_
                                    << " bytes: " << errno_text(err);
    map_ = static_cast<const uint8_t*>(p);
  } else {
    ::close(fd);
  }
  try {
    header_ = parse_safetensors(std::span<const uint8_t>(map_, map_bytes_), path.string());
  } catch (...) {
    if (map_ != nullptr) ::munmap(const_cast<uint8_t*>(map_), map_bytes_);
    map_ = nullptr;
    throw;
  }
  for (size_t i = 0; i < header_.tensors.size(); ++i) index_.emplace(header_.tensors[i].name, i);
}

SafetensorsFile::~SafetensorsFile() {
  if (map_ != nullptr) ::munmap(const_cast<uint8_t*>(map_), map_bytes_);
}

const TensorInfo* SafetensorsFile::find(std::string_view name) const {
  const auto it = index_.find(name);
  return it == index_.end() ? nullptr : &header_.tensors[it->second];
}

TensorView SafetensorsFile::view(const TensorInfo& info) const {
  FP4MOE_REQUIRE(info.begin <= info.end && header_.data_start + info.end <= map_bytes_)
      << path_.string() << ": tensor '" << info.name << "': data_offsets [" << info.begin << ", " << info.end
      << "] are outside this file's data buffer ("
      << map_bytes_ - std::min<uint64_t>(map_bytes_, header_.data_start) << " bytes)";
  TensorView v;
  v.dtype = info.dtype;
  v.shape = info.shape;
  v.bytes = std::span<const uint8_t>(map_ + header_.data_start + info.begin, info.nbytes());
  return v;
}

TensorView SafetensorsFile::view(std::string_view name) const {
  const TensorInfo* info = find(name);
  FP4MOE_REQUIRE(info != nullptr) << path_.string() << ": no tensor named '" << name << "' (the file has "
                                  << header_.tensors.size() << " tensors)";
  return view(*info);
}

// ---------------------------------------------------------------------------------------------
// TensorStore

TensorStore::TensorStore(const std::filesystem::path& dir) : dir_(dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  FP4MOE_REQUIRE(fs::is_directory(dir, ec))
      << dir.string() << ": not a directory" << (ec ? " (" + ec.message() + ")" : std::string());
  const fs::path index_path = dir / "model.safetensors.index.json";
  std::map<std::string, std::string> weight_map;  // tensor -> shard file name
  std::vector<std::string> shard_names;
  const bool have_index = fs::exists(index_path, ec);
  if (have_index) {
    std::ifstream in(index_path, std::ios::binary);
    const int open_errno = errno;
    FP4MOE_REQUIRE(in.good()) << index_path.string() << ": cannot open: " << errno_text(open_errno);
    std::ostringstream text;
    text << in.rdbuf();
    // Depth 64: the index's "metadata" may carry nested values we ignore.
    const json index = parse_json_strict(text.str(), index_path.string(), index_path.string(), "key", 64, 0);
    FP4MOE_REQUIRE(index.is_object())
        << index_path.string() << ": not a JSON object (it is a " << index.type_name() << ")";
    FP4MOE_REQUIRE(index.contains("weight_map")) << index_path.string() << ": no \"weight_map\" key";
    const json& wm = index["weight_map"];
    FP4MOE_REQUIRE(wm.is_object()) << index_path.string() << ": weight_map is not an object (it is a "
                                   << wm.type_name() << ")";
    std::set<std::string> shards;
    for (const auto& [tensor, shard] : wm.items()) {
      FP4MOE_REQUIRE(shard.is_string()) << index_path.string() << ": weight_map: tensor '" << tensor
                                        << "' maps to a " << shard.type_name() << ", not a shard file name";
      const std::string s = shard.get<std::string>();
      FP4MOE_REQUIRE(!s.empty() && s != "." && s != ".." && s.find('/') == std::string::npos)
          << index_path.string() << ": weight_map: tensor '" << tensor << "' maps to shard '" << s
          << "', which is not a file name in " << dir.string();
      weight_map[tensor] = s;
      shards.insert(s);
    }
    for (const std::string& s : shards) {
      FP4MOE_REQUIRE(fs::is_regular_file(dir / s, ec))
          << dir.string() << ": shard '" << s << "' named by model.safetensors.index.json "
          << (fs::exists(dir / s, ec) ? "is not a regular file" : "does not exist") << " (first tensor mapped to it: '"
          << std::find_if(weight_map.begin(), weight_map.end(), [&](const auto& kv) { return kv.second == s; })->first
          << "')";
    }
    shard_names.assign(shards.begin(), shards.end());
  } else if (fs::exists(dir / "model.safetensors", ec)) {
    shard_names.push_back("model.safetensors");
  } else {
    fs::directory_iterator it(dir, ec);
    for (; !ec && it != fs::directory_iterator(); it.increment(ec)) {
      if (it->path().extension() == ".safetensors" && it->is_regular_file(ec)) {
        shard_names.push_back(it->path().filename().string());
      }
    }
    FP4MOE_REQUIRE(!ec) << dir.string() << ": cannot list the directory: " << ec.message();
    std::sort(shard_names.begin(), shard_names.end());
    FP4MOE_REQUIRE(!shard_names.empty()) << dir.string()
                                         << ": no model.safetensors.index.json, model.safetensors or "
                                            "*.safetensors file";
  }

  std::map<std::string, size_t> shard_index;
  for (const std::string& s : shard_names) {
    shard_index[s] = files_.size();
    files_.push_back(std::make_unique<SafetensorsFile>(dir / s));
    const size_t i_file = files_.size() - 1;
    for (const TensorInfo& t : files_.back()->tensors()) {
      const auto [it, inserted] = owner_.emplace(t.name, i_file);
      FP4MOE_REQUIRE(inserted) << dir.string() << ": tensor '" << t.name
                               << "' is in two files: " << files_[it->second]->path().filename().string()
                               << " and " << s;
    }
  }
  for (const auto& [tensor, shard] : weight_map) {
    const auto it = owner_.find(tensor);
    FP4MOE_REQUIRE(it != owner_.end() && it->second == shard_index.at(shard))
        << dir.string() << ": tensor '" << tensor << "' is mapped to shard '" << shard
        << "' by model.safetensors.index.json but is missing from that shard"
        << (it == owner_.end() ? std::string(" (and from every shard the index names)")
                               : " (it is in " + files_[it->second]->path().filename().string() + ")");
  }
}

std::vector<std::string> TensorStore::names() const {
  std::vector<std::string> out;
  out.reserve(owner_.size());
  for (const auto& [name, _] : owner_) out.push_back(name);
  return out;
}

bool TensorStore::contains(std::string_view name) const { return owner_.find(name) != owner_.end(); }

const TensorInfo* TensorStore::find(std::string_view name) const {
  const auto it = owner_.find(name);
  return it == owner_.end() ? nullptr : files_[it->second]->find(name);
}

const SafetensorsFile& TensorStore::file_of(std::string_view name) const {
  const auto it = owner_.find(name);
  FP4MOE_REQUIRE(it != owner_.end()) << dir_.string() << ": no tensor named '" << name << "' ("
                                     << owner_.size() << " tensors in " << files_.size() << " files)";
  return *files_[it->second];
}

TensorView TensorStore::view(std::string_view name) const { return file_of(name).view(name); }

// ---------------------------------------------------------------------------------------------
// SafetensorsWriter

void SafetensorsWriter::append(SafetensorsWriter&& other) {
  std::set<std::string> names;
  for (const Entry& e : entries_) names.insert(e.name);
  for (Entry& e : other.entries_) {
    FP4MOE_REQUIRE(names.insert(e.name).second) << "safetensors writer: tensor '" << e.name << "': added twice";
    entries_.push_back(std::move(e));
  }
  other.entries_.clear();
}

void SafetensorsWriter::add(const std::string& name, DType dtype, const Shape& shape,
                            std::span<const uint8_t> bytes) {
  const std::string where = "safetensors writer: tensor '" + name + "': ";
  FP4MOE_REQUIRE(name != "__metadata__") << where << "the name is reserved for the metadata map";
  for (const Entry& e : entries_) {
    FP4MOE_REQUIRE(e.name != name) << where << "added twice";
  }
  for (size_t i = 0; i < shape.size(); ++i) {
    FP4MOE_REQUIRE(shape[i] >= 0) << where << "shape " << shape_to_string(shape) << " has a negative dim "
                                  << i;
  }
  int64_t numel = 0;
  size_t overflow_at = 0;
  FP4MOE_REQUIRE(checked_numel(shape, &numel, &overflow_at))
      << where << "element count of shape " << shape_to_string(shape) << " overflows int64 (at dim "
      << overflow_at << ")";
  uint64_t nbytes = 0;
  FP4MOE_REQUIRE(byte_size(numel, dtype, &nbytes))
      << where << "size is not a whole number of bytes (" << numel << " elements x " << dtype_bits(dtype)
      << " bits of " << dtype_name(dtype) << ")";
  FP4MOE_REQUIRE(bytes.size() == nbytes)
      << where << "wrong byte size: " << bytes.size() << " bytes given but " << dtype_name(dtype) << " "
      << shape_to_string(shape) << " needs " << nbytes;
  entries_.push_back(Entry{name, dtype, shape, std::vector<uint8_t>(bytes.begin(), bytes.end())});
}

void SafetensorsWriter::write(const std::filesystem::path& path) const {
  // dtype descending (the enum is in increasing alignment order), then name: with an 8-aligned
  // header every tensor starts at a multiple of its element size.
  std::vector<const Entry*> order;
  for (const Entry& e : entries_) order.push_back(&e);
  std::sort(order.begin(), order.end(), [](const Entry* a, const Entry* b) {
    if (a->dtype != b->dtype) return a->dtype > b->dtype;
    return a->name < b->name;
  });

  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata_.empty()) header["__metadata__"] = metadata_;
  uint64_t offset = 0;
  for (const Entry* e : order) {
    header[e->name] = {{"dtype", std::string(dtype_name(e->dtype))},
                       {"shape", e->shape},
                       {"data_offsets", {offset, offset + e->bytes.size()}}};
    offset += e->bytes.size();
  }
  std::string text;
  try {
    text = header.dump();
  } catch (const nlohmann::json::exception& e) {
    FP4MOE_FAIL() << path.string() << ": cannot write the header (a tensor name or metadata string is "
                  << "not valid UTF-8): " << e.what();
  }
  text.resize((text.size() + 7) / 8 * 8, ' ');
  FP4MOE_REQUIRE(text.size() <= kSafetensorsMaxHeaderBytes)
      << path.string() << ": header too large (" << text.size() << " bytes > limit "
      << kSafetensorsMaxHeaderBytes << ")";

  // Temp file in the same directory, then rename: readers never see a partial file. A symlink is followed (the file
  // it names is replaced, the link kept); anything but a regular file there (a device such as /dev/null, a FIFO) is
  // refused: the rename would replace it.
  const std::filesystem::path target = rename_target(path, path.string());
  const std::filesystem::path tmp = target.string() + ".tmp." + std::to_string(::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  const int open_errno = errno;
  FP4MOE_REQUIRE(fd >= 0) << tmp.string() << ": cannot create: " << errno_text(open_errno);
  auto write_all = [&](const void* data, size_t n) {
    const auto* p = static_cast<const uint8_t*>(data);
    while (n > 0) {
      const ssize_t w = ::write(fd, p, n);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) {
        const int err = errno;
        ::close(fd);
        ::unlink(tmp.c_str());
        FP4MOE_FAIL() << tmp.string() << ": write failed with " << n << " bytes left: " << errno_text(err);
      }
      p += w;
      n -= static_cast<size_t>(w);
    }
  };
  uint8_t len_le[8];
  for (int i = 0; i < 8; ++i) len_le[i] = static_cast<uint8_t>(static_cast<uint64_t>(text.size()) >> (8 * i));
  write_all(len_le, 8);
  write_all(text.data(), text.size());
  for (const Entry* e : order) write_all(e->bytes.data(), e->bytes.size());
  const int sync_rc = ::fsync(fd);
  const int sync_errno = errno;
  const int close_rc = ::close(fd);
  if (sync_rc != 0 || close_rc != 0) {
    const int err = sync_rc != 0 ? sync_errno : errno;
    ::unlink(tmp.c_str());
    FP4MOE_FAIL() << tmp.string() << ": cannot flush: " << errno_text(err);
  }
  if (::rename(tmp.c_str(), target.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    FP4MOE_FAIL() << target.string() << ": cannot rename " << tmp.string() << " to it: " << errno_text(err);
  }
}

}  // namespace fp4moe::format

#undef FP4MOE_REQUIRE
