// safetensors reader/writer: writer -> reader round trips over every dtype (scalars, zero-size
// dims), the golden files made by Python, a corpus of malformed images each rejected with its rule,
// sharded checkpoint directories (index.json), and, when python3 has safetensors + numpy, Python
// reading what the writer wrote.
//   ctest --test-dir build -R test_safetensors   (or run build/tests/format/test_safetensors)
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "format/json_file.h"
#include "format/safetensors.h"
#include "testing/testing.h"

namespace fp4moe::format {
namespace {

namespace fs = std::filesystem;
using Bytes = std::vector<uint8_t>;

// A fresh directory per test, removed afterwards.
class TempDir {
 public:
  TempDir() {
    static int counter = 0;
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    path_ = fs::temp_directory_path() /
            ("fp4moe_st_" + std::to_string(::getpid()) + "_" + std::to_string(counter++) + "_" +
             (info != nullptr ? info->name() : "x"));
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  const fs::path& path() const { return path_; }
  fs::path operator/(const std::string& name) const { return path_ / name; }

 private:
  fs::path path_;
};

void write_bytes(const fs::path& p, const Bytes& b) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
  ASSERT_TRUE(out.good()) << p;
}

Bytes read_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return Bytes(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// An image: u64 LE header length `declared_len` (default: the header's size), the header, `data`
// bytes of filler.
Bytes image(const std::string& header, uint64_t n_data, std::optional<uint64_t> declared_len = {}) {
  const uint64_t n = declared_len.value_or(header.size());
  Bytes b;
  b.reserve(8 + header.size() + n_data);
  for (int i = 0; i < 8; ++i) b.push_back(static_cast<uint8_t>(n >> (8 * i)));
  for (char ch : header) b.push_back(static_cast<uint8_t>(ch));
  for (uint64_t i = 0; i < n_data; ++i) b.push_back(static_cast<uint8_t>(i * 7 + 1));
  return b;
}

// The message of the fp4moe::Error parse_safetensors throws; fails the test if it does not throw.
std::string parse_error(const Bytes& b, const std::string& source = "bad.safetensors") {
  try {
    parse_safetensors(b, source);
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "parse_safetensors accepted a malformed image";
  return "";
}

using fp4moe::testing::error_of;

Bytes random_bytes(std::mt19937_64& rng, size_t n) {
  Bytes b(n);
  for (auto& x : b) x = static_cast<uint8_t>(rng());
  return b;
}

Bytes view_bytes(const TensorView& v) { return Bytes(v.bytes.begin(), v.bytes.end()); }

// ---------------------------------------------------------------------------------------------
// Round trips

struct Written {
  std::string name;
  DType dtype;
  Shape shape;
  Bytes bytes;
};

// Every dtype as a 2-D tensor and (when it is a whole number of bytes) a scalar, plus zero-size
// tensors; shapes keep numel*bits a multiple of 8 (F4 needs even numel, F6 a multiple of 4).
std::vector<Written> all_dtype_tensors(std::mt19937_64& rng) {
  std::vector<Written> out;
  for (int i = 0; i < kNumDTypes; ++i) {
    const auto t = static_cast<DType>(i);
    const int bits = dtype_bits(t);
    const std::string base(dtype_name(t));
    const Shape matrix = bits == 4 ? Shape{3, 2} : bits == 6 ? Shape{2, 4} : Shape{2, 3};
    out.push_back({"m." + base, t, matrix, {}});
    if (bits % 8 == 0) out.push_back({"s." + base, t, Shape{}, {}});
    out.push_back({"z." + base, t, i % 2 ? Shape{0} : Shape{4, 0, 2}, {}});
  }
  for (Written& w : out) {
    w.bytes = random_bytes(rng, static_cast<size_t>(shape_numel(w.shape) * dtype_bits(w.dtype) / 8));
  }
  return out;
}

TEST(SafetensorsRoundTrip, EveryDTypeScalarsAndZeroSizeDims) {
  std::mt19937_64 rng(testing::test_seed());
  TempDir dir;
  const std::vector<Written> tensors = all_dtype_tensors(rng);
  SafetensorsWriter writer;
  // Added in reverse so that the writer's ordering, not insertion order, is what the file shows.
  for (auto it = tensors.rbegin(); it != tensors.rend(); ++it) {
    writer.add(it->name, it->dtype, it->shape, it->bytes);
  }
  writer.set_metadata("format", "pt");
  writer.set_metadata("note", "\xc3\xa9t\xc3\xa9 \"quoted\"");
  const fs::path path = dir / "all.safetensors";
  writer.write(path);
  EXPECT_EQ(fs::directory_iterator(dir.path())->path(), path) << "the temp file was left behind";
  EXPECT_EQ(std::distance(fs::directory_iterator(dir.path()), fs::directory_iterator()), 1);

  const SafetensorsFile file(path);
  ASSERT_EQ(file.tensors().size(), tensors.size());
  EXPECT_EQ(file.metadata().at("format"), "pt");
  EXPECT_EQ(file.metadata().at("note"), "\xc3\xa9t\xc3\xa9 \"quoted\"");
  for (const Written& w : tensors) {
    SCOPED_TRACE(w.name);
    const TensorInfo* info = file.find(w.name);
    ASSERT_NE(info, nullptr);
    EXPECT_EQ(info->dtype, w.dtype);
    EXPECT_EQ(info->shape, w.shape);
    EXPECT_EQ(info->numel(), shape_numel(w.shape));
    const TensorView v = file.view(w.name);
    EXPECT_EQ(v.dtype, w.dtype);
    EXPECT_EQ(v.shape, w.shape);
    EXPECT_EQ(view_bytes(v), w.bytes);
  }

  // Header padded to a multiple of 8; tensors in dtype-descending then name order, each aligned to
  // its element size (the point of that order).
  const Bytes raw = read_bytes(path);
  const SafetensorsHeader header = parse_safetensors(raw, path.string());
  EXPECT_EQ(header.data_start % 8, 0u);
  const uint8_t last = raw[header.data_start - 1];
  EXPECT_TRUE(last == ' ' || last == '}') << "padding is spaces (or the JSON ends exactly)";
  for (size_t i = 1; i < header.tensors.size(); ++i) {
    const TensorInfo& a = header.tensors[i - 1];
    const TensorInfo& b = header.tensors[i];
    if (a.begin == b.begin)
      continue;  // a zero-size tensor shares its offset; order among them is by (begin, end, name)
    EXPECT_TRUE(a.dtype > b.dtype || (a.dtype == b.dtype && a.name < b.name))
        << a.name << " before " << b.name;
  }
  for (const TensorInfo& t : header.tensors) {
    const int bits = dtype_bits(t.dtype);
    if (bits >= 8) {
      EXPECT_EQ((header.data_start + t.begin) % (bits / 8), 0u) << t.name;
    }
  }
  // The file lists exactly the tensors written: a second write of the same content is identical.
  writer.write(dir / "again.safetensors");
  EXPECT_EQ(read_bytes(dir / "again.safetensors"), raw);
}

TEST(SafetensorsRoundTrip, EmptyFileAndOverwrite) {
  TempDir dir;
  const fs::path path = dir / "empty.safetensors";
  SafetensorsWriter().write(path);
  const Bytes raw = read_bytes(path);
  EXPECT_EQ(raw.size(), 16u) << "8-byte length + \"{}\" padded to 8";
  EXPECT_TRUE(SafetensorsFile(path).tensors().empty());

  SafetensorsWriter writer;
  const Bytes one = {1, 2, 3, 4};
  writer.add("x", DType::kF32, {}, one);
  writer.write(path);  // replaces the empty file
  const SafetensorsFile file(path);
  ASSERT_EQ(file.tensors().size(), 1u);
  EXPECT_EQ(view_bytes(file.view("x")), one);
  EXPECT_EQ(file.view("x").as<float>().size(), 1u);
}

TEST(SafetensorsRoundTrip, RewritingGoldenFilesIsByteIdentical) {
  // The golden files were written by Python safetensors; our writer uses the same order, JSON
  // layout and padding, so copying every tensor reproduces each file byte for byte.
  for (const char* rel :
       {"golden/nvfp4/quant_cases.safetensors", "golden/models/glm4_moe_tiny_nvfp4/model.safetensors",
        "golden/models/glm5_tiny/model.safetensors"}) {
    SCOPED_TRACE(rel);
    const fs::path src = testing::shared_path(rel);
    const SafetensorsFile file(src);
    SafetensorsWriter writer;
    for (const TensorInfo& t : file.tensors()) writer.add(t.name, file.view(t));
    for (const auto& [k, v] : file.metadata()) writer.set_metadata(k, v);
    TempDir dir;
    writer.write(dir / "copy.safetensors");
    EXPECT_TRUE(read_bytes(dir / "copy.safetensors") == read_bytes(src));
  }
}

TEST(SafetensorsWriter, RejectsBadTensors) {
  SafetensorsWriter w;
  const Bytes four(4);
  w.add("a", DType::kF32, {1}, four);
  EXPECT_NE(error_of([&] { w.add("a", DType::kF32, {1}, four); }).find("tensor 'a': added twice"),
            std::string::npos);
  EXPECT_NE(error_of([&] { w.add("__metadata__", DType::kU8, {4}, four); }).find("reserved"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              w.add("b", DType::kF32, {2}, four);
            }).find("tensor 'b': wrong byte size: 4 bytes given but F32 [2] needs 8"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              w.add("c", DType::kF4, {}, Bytes{});
            }).find("tensor 'c': size is not a whole number of bytes (1 elements x 4 bits of F4)"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              w.add("d", DType::kU8, {2, -2}, four);
            }).find("negative dim 1"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              w.add("e", DType::kU8, {int64_t{1} << 40, int64_t{1} << 40}, four);
            }).find("overflows int64 (at dim 1)"),
            std::string::npos);
  TempDir dir;
  const std::string msg = error_of([&] { w.write(dir / "no_such_dir" / "x.safetensors"); });
  EXPECT_NE(msg.find("cannot create: No such file or directory"), std::string::npos) << msg;
  SafetensorsWriter bad_utf8;
  bad_utf8.add("bad\xff", DType::kU8, {0}, Bytes{});
  EXPECT_NE(error_of([&] { bad_utf8.write(dir / "u.safetensors"); }).find("not valid UTF-8"),
            std::string::npos);
  EXPECT_FALSE(fs::exists(dir / "u.safetensors"));
}

// ---------------------------------------------------------------------------------------------
// Golden files (written by Python on the reference machine)

TEST(SafetensorsGolden, QuantCases) {
  const SafetensorsFile file(testing::shared_path("golden/nvfp4/quant_cases.safetensors"));
  EXPECT_EQ(file.tensors().size(), 48u);
  EXPECT_TRUE(file.metadata().empty());
  struct Known {
    const char* name;
    DType dtype;
    Shape shape;
  };
  for (const Known& k : {Known{"normal.weight", DType::kU8, {64, 128}},
                         Known{"normal.weight_scale", DType::kF8_E4M3, {64, 16}},
                         Known{"normal.weight_scale_2", DType::kF32, {}},
                         Known{"normal.weight_scale_swizzled", DType::kU8, {2048}},
                         Known{"ragged_rows.input", DType::kF32, {200, 48}}}) {
    SCOPED_TRACE(k.name);
    const TensorInfo* t = file.find(k.name);
    ASSERT_NE(t, nullptr);
    EXPECT_EQ(dtype_name(t->dtype), dtype_name(k.dtype));
    EXPECT_EQ(shape_to_string(t->shape), shape_to_string(k.shape));
  }
  // Every case is self-consistent: input [N,K] -> weight [N,K/2], weight_scale [N,K/16].
  for (const char* c :
       {"normal", "outliers", "zero_blocks", "tiny", "huge", "ragged_rows", "ties", "bf16_weights"}) {
    SCOPED_TRACE(c);
    const std::string p(c);
    const TensorView input = file.view(p + ".input");
    ASSERT_EQ(input.rank(), 2);
    EXPECT_EQ(file.view(p + ".weight").shape, (Shape{input.dim(0), input.dim(1) / 2}));
    EXPECT_EQ(file.view(p + ".weight_scale").shape, (Shape{input.dim(0), input.dim(1) / 16}));
    EXPECT_EQ(file.view(p + ".dequant").shape, input.shape);
    EXPECT_EQ(file.view(p + ".weight_scale_2").numel(), 1);
    // weight_scale_2 = amax / (6 * 448) in f32: checks we read the right bytes of both tensors.
    float amax = 0.0f;
    for (float x : input.as<float>()) amax = std::max(amax, std::fabs(x));
    EXPECT_FLOAT_EQ(file.view(p + ".weight_scale_2").as<float>()[0], amax / 2688.0f);
  }
}

TEST(SafetensorsGolden, E4M3DecodeTable) {
  const SafetensorsFile file(testing::shared_path("golden/nvfp4/e4m3_decode.safetensors"));
  const auto codes = file.view("codes").as<uint8_t>();
  const auto values = file.view("values").as<float>();
  ASSERT_EQ(codes.size(), 256u);
  ASSERT_EQ(values.size(), 256u);
  for (int i = 0; i < 256; ++i) EXPECT_EQ(codes[i], i);
  EXPECT_EQ(values[0x38], 1.0f);
  EXPECT_EQ(values[0x7E], 448.0f);
  EXPECT_EQ(values[0xB8], -1.0f);
  EXPECT_TRUE(std::isnan(values[0x7F]));
}

TEST(SafetensorsGolden, Models) {
  struct Case {
    const char* dir;
    size_t n_tensors;
  };
  for (const Case& c : {Case{"glm4_moe_tiny", 139}, Case{"glm4_moe_tiny_nvfp4", 490}, Case{"glm5_tiny", 154},
                        Case{"glm5_tiny_nvfp4", 469}}) {
    SCOPED_TRACE(c.dir);
    const fs::path dir = testing::shared_path(std::string("golden/models/") + c.dir);
    const SafetensorsFile file(dir / "model.safetensors");
    EXPECT_EQ(file.tensors().size(), c.n_tensors);
    EXPECT_EQ(file.metadata().at("format"), "pt");
    const TensorView lm_head = file.view("lm_head.weight");
    EXPECT_EQ(lm_head.dtype, DType::kBF16);
    EXPECT_EQ(lm_head.shape, (Shape{512, 128}));
    EXPECT_EQ(file.view("model.norm.weight").shape, (Shape{128}));
    const std::string down = "model.layers.1.mlp.experts.3.down_proj.";
    if (std::string(c.dir).ends_with("_nvfp4")) {
      EXPECT_EQ(file.view(down + "weight").dtype, DType::kU8);
      EXPECT_EQ(file.view(down + "weight").shape, (Shape{128, 32}));
      EXPECT_EQ(file.view(down + "weight_scale").dtype, DType::kF8_E4M3);
      EXPECT_EQ(file.view(down + "weight_scale").shape, (Shape{128, 4}));
      EXPECT_EQ(file.view(down + "weight_scale_2").shape, Shape{});
    } else {
      EXPECT_EQ(file.view(down + "weight").dtype, DType::kBF16);
      EXPECT_EQ(file.view(down + "weight").shape, (Shape{128, 64}));
    }
    EXPECT_EQ(file.view("model.layers.1.mlp.gate.e_score_correction_bias").dtype, DType::kF32);
    // The directory holds golden.safetensors too; the store reads model.safetensors only.
    const TensorStore store(dir);
    EXPECT_EQ(store.names().size(), c.n_tensors);
    EXPECT_EQ(store.files().size(), 1u);
    EXPECT_FALSE(store.contains("logits"));
    EXPECT_EQ(view_bytes(store.view("lm_head.weight")), view_bytes(lm_head));
  }
}

// ---------------------------------------------------------------------------------------------
// Malformed images

std::string entry(const std::string& name, const std::string& dtype, const std::string& shape, uint64_t begin,
                  uint64_t end) {
  return "\"" + name + "\":{\"dtype\":\"" + dtype + "\",\"shape\":" + shape + ",\"data_offsets\":[" +
         std::to_string(begin) + "," + std::to_string(end) + "]}";
}

struct BadCase {
  const char* what;
  Bytes bytes;
  std::vector<std::string> expect;  // substrings of the message
};

std::vector<BadCase> bad_cases() {
  const std::string a8 = entry("a", "F32", "[2]", 0, 8);
  std::vector<BadCase> c;
  c.push_back({"shorter than 8 bytes",
               Bytes{1, 0, 0, 0, 0},
               {"truncated: file is 5 bytes, shorter than the 8-byte"}});
  c.push_back({"empty", Bytes{}, {"truncated: file is 0 bytes"}});
  c.push_back({"header past EOF",
               image("{" + a8 + "}", 0, 100),
               {"truncated: header runs past the end of the file (8 + 100 > 62 bytes)"}});
  c.push_back({"header length near 2^64",
               image("{}", 0, ~uint64_t{0}),
               {"header too large (18446744073709551615 bytes > limit 100000000)"}});
  c.push_back({"header too large",
               image("{}", 0, 100'000'001),
               {"header too large (100000001 bytes > limit 100000000)"}});
  c.push_back({"data short",
               image("{" + a8 + "}", 5),
               {"tensor 'a': data_offsets end past the end of the file (end 8 > data buffer of 5 bytes)"}});
  c.push_back({"offsets past EOF",
               image("{" + entry("a", "U8", "[4]", 0, 4) + "," + entry("b", "U8", "[4]", 4, 8) + "}", 4),
               {"tensor 'b': data_offsets end past the end of the file (end 8 > data buffer of 4 bytes)"}});
  c.push_back({"trailing data",
               image("{" + a8 + "}", 12),
               {"data buffer size mismatch: the tensors end at byte 8 but the data buffer holds 12 bytes"}});
  c.push_back({"non-UTF-8 byte",
               image("{\"a\xff\":1}", 0),
               {"header is not valid UTF-8 (ill-formed byte 0xff at header byte 3, file byte 11)"}});
  c.push_back({"overlong UTF-8",
               image("{\"\xc0\xaf\":1}", 0),
               {"not valid UTF-8 (ill-formed byte 0xc0 at header byte 2"}});
  c.push_back(
      {"UTF-8 surrogate", image("{\"\xed\xa0\x80\":1}", 0), {"not valid UTF-8 (ill-formed byte 0xed"}});
  c.push_back({"UTF-8 cut short",
               image("{\"a\":1}\xe2\x82", 0),
               {"not valid UTF-8 (ill-formed byte 0xe2 at header byte 7"}});
  c.push_back({"not JSON",
               image("{\"a\": ", 0),
               {"bad.safetensors: header is not valid JSON (at byte 7 of it, file byte 15)"}});
  c.push_back({"empty header", image("", 0), {"header is not valid JSON"}});
  c.push_back({"NUL padding",
               image(std::string("{}\0\0\0\0\0\0", 8), 0),
               {"header is not valid JSON (NUL byte at byte 2 of it, file byte 10)"}});
  c.push_back({"trailing garbage", image("{} x", 0), {"header is not valid JSON"}});
  c.push_back({"JSON array", image("[1,2]", 0), {"header JSON is not an object (it is a array)"}});
  c.push_back({"JSON string", image("\"x\"", 0), {"header JSON is not an object (it is a string)"}});
  c.push_back(
      {"entry not object", image("{\"a\":5}", 0), {"tensor 'a': entry is not an object (it is a number)"}});
  c.push_back({"bad dtype",
               image("{" + entry("a", "F33", "[2]", 0, 8) + "}", 8),
               {"tensor 'a': unknown dtype 'F33'"}});
  c.push_back({"dtype not string",
               image("{\"a\":{\"dtype\":7,\"shape\":[],\"data_offsets\":[0,1]}}", 1),
               {"tensor 'a': dtype is not a string (it is a number)"}});
  c.push_back({"negative dim",
               image("{" + entry("a", "U8", "[-1]", 0, 0) + "}", 0),
               {"tensor 'a': shape[0] is not a non-negative int64 (-1)"}});
  c.push_back({"fractional dim",
               image("{" + entry("a", "U8", "[2,1.5]", 0, 3) + "}", 3),
               {"tensor 'a': shape[1] is not a non-negative int64 (1.5)"}});
  c.push_back({"dim above int64",
               image("{" + entry("a", "U8", "[9223372036854775808]", 0, 0) + "}", 0),
               {"shape[0] is not a non-negative int64 (9223372036854775808)"}});
  c.push_back({"shape not array",
               image("{" + entry("a", "U8", "\"2\"", 0, 2) + "}", 2),
               {"tensor 'a': shape is not an array (it is a string)"}});
  c.push_back(
      {"shape overflow",
       image("{" + entry("a", "U8", "[4294967296,4294967296,0]", 0, 0) + "}", 0),
       {"tensor 'a': element count of shape [4294967296, 4294967296, 0] overflows int64 (at dim 1)"}});
  c.push_back({"nested shape",
               image("{" + entry("a", "U8", "[[1]]", 0, 1) + "}", 1),
               {"tensor 'a': JSON nests deeper than 3 levels"}});
  c.push_back({"odd F4 count",
               image("{" + entry("a", "F4", "[3]", 0, 2) + "}", 2),
               {"tensor 'a': size is not a whole number of bytes (3 elements x 4 bits of F4)"}});
  c.push_back({"wrong byte size",
               image("{" + entry("a", "F32", "[2]", 0, 4) + "}", 4),
               {"tensor 'a': wrong byte size: data_offsets [0, 4] hold 4 bytes but F32 [2] needs 8"}});
  c.push_back({"begin > end",
               image("{" + entry("a", "U8", "[0]", 8, 4) + "}", 8),
               {"tensor 'a': data_offsets begin > end (8 > 4)"}});
  c.push_back({"offsets not a pair",
               image("{\"a\":{\"dtype\":\"U8\",\"shape\":[],\"data_offsets\":[0]}}", 1),
               {"tensor 'a': data_offsets is not [begin, end] of non-negative integers ([0])"}});
  c.push_back({"negative offset",
               image("{\"a\":{\"dtype\":\"U8\",\"shape\":[],\"data_offsets\":[-1,0]}}", 1),
               {"tensor 'a': data_offsets is not [begin, end]"}});
  c.push_back({"overlapping",
               image("{" + entry("a", "U8", "[8]", 0, 8) + "," + entry("b", "U8", "[8]", 4, 12) + "}", 12),
               {"tensor 'b': overlapping tensor 'a' (begin 4 < its end 8)"}});
  c.push_back({"gap",
               image("{" + entry("a", "U8", "[4]", 0, 4) + "," + entry("b", "U8", "[4]", 8, 12) + "}", 12),
               {"tensor 'b': gap of 4 bytes after tensor 'a' (begin 8 > its end 4)"}});
  c.push_back({"first not at 0",
               image("{" + entry("a", "U8", "[4]", 4, 8) + "}", 8),
               {"tensor 'a': gap: the first tensor does not start at 0 (begin 4)"}});
  c.push_back({"duplicate name", image("{" + a8 + "," + a8 + "}", 8), {"tensor 'a': duplicate tensor name"}});
  c.push_back({"duplicate key in entry",
               image("{\"a\":{\"dtype\":\"U8\",\"dtype\":\"U8\",\"shape\":[],\"data_offsets\":[0,1]}}", 1),
               {"tensor 'a': duplicate key 'dtype'"}});
  c.push_back({"unknown key",
               image("{\"a\":{\"dtype\":\"U8\",\"shape\":[],\"data_offsets\":[0,1],\"offsets\":[0,1]}}", 1),
               {"tensor 'a': unknown key 'offsets' (allowed: dtype, shape, data_offsets)"}});
  c.push_back({"missing key",
               image("{\"a\":{\"dtype\":\"U8\",\"shape\":[]}}", 1),
               {"tensor 'a': missing key 'data_offsets'"}});
  c.push_back({"metadata not object",
               image("{\"__metadata__\":\"pt\"}", 0),
               {"__metadata__ is not an object of strings (it is a string)"}});
  c.push_back({"metadata value not string",
               image("{\"__metadata__\":{\"format\":\"pt\",\"n\":3}}", 0),
               {"__metadata__ is not an object of strings (key 'n' holds a number)"}});
  c.push_back({"metadata nested",
               image("{\"__metadata__\":{\"x\":{\"y\":[1]}}}", 0),
               {"JSON nests deeper than 3 levels"}});
  return c;
}

TEST(SafetensorsMalformed, EachRejectedWithItsRule) {
  for (const BadCase& c : bad_cases()) {
    SCOPED_TRACE(c.what);
    const std::string msg = parse_error(c.bytes);
    EXPECT_EQ(msg.rfind("bad.safetensors: ", 0), 0u) << msg;
    for (const std::string& s : c.expect) EXPECT_NE(msg.find(s), std::string::npos) << "message: " << msg;
  }
}

TEST(SafetensorsMalformed, EveryTruncationOfAValidFileIsRejected) {
  // Cutting a valid file anywhere must raise an error (never crash or read past the end).
  std::mt19937_64 rng(testing::test_seed());
  TempDir dir;
  SafetensorsWriter w;
  for (const Written& t : all_dtype_tensors(rng)) w.add(t.name, t.dtype, t.shape, t.bytes);
  w.write(dir / "v.safetensors");
  const Bytes full = read_bytes(dir / "v.safetensors");
  EXPECT_NO_THROW(parse_safetensors(full, "v"));
  for (size_t n = 0; n < full.size(); ++n) {
    const Bytes cut(full.begin(), full.begin() + static_cast<ptrdiff_t>(n));
    EXPECT_THROW(parse_safetensors(cut, "v"), Error) << "cut at " << n << " of " << full.size();
  }
}

TEST(SafetensorsValid, AcceptedEdgeCases) {
  // Empty file list, unpadded and space-padded headers, unsorted JSON order, unaligned offsets,
  // zero-size tensors anywhere (sharing an offset), "-0" as an offset.
  const std::string unsorted = "{" + entry("z", "U8", "[3]", 0, 3) + "," + entry("e", "U8", "[2,0]", 3, 3) +
                               "," + entry("b", "F32", "[]", 3, 7) + "," + entry("a", "U8", "[0]", 7, 7) +
                               "}";
  for (const Bytes& b : {image("{}", 0), image("{}      ", 0), image("{\"__metadata__\":{}}", 0),
                         image(unsorted, 7), image(unsorted + "   \n\t ", 7),
                         image("{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[-0,1]}}", 1)}) {
    SafetensorsHeader h;
    ASSERT_NO_THROW(h = parse_safetensors(b, "ok")) << std::string(b.begin() + 8, b.end());
    EXPECT_EQ(h.data_start, 8u + b[0] + 256u * b[1]);
  }
  const SafetensorsHeader h = parse_safetensors(image(unsorted, 7), "ok");
  ASSERT_EQ(h.tensors.size(), 4u);
  EXPECT_EQ(h.tensors[0].name, "z");
  EXPECT_EQ(h.tensors[1].name, "e");  // [3,3) before [3,7): sorted by (begin, end)
  EXPECT_EQ(h.tensors[2].name, "b");
  EXPECT_EQ(h.tensors[2].shape, Shape{});
  EXPECT_EQ(h.tensors[2].nbytes(), 4u);
  EXPECT_EQ(h.tensors[3].name, "a");
}

TEST(SafetensorsFileErrors, OpenAndLookup) {
  TempDir dir;
  std::string msg = error_of([&] { SafetensorsFile f(dir / "missing.safetensors"); });
  EXPECT_NE(msg.find("missing.safetensors: cannot open: No such file or directory"), std::string::npos)
      << msg;
  write_bytes(dir / "empty.safetensors", {});
  msg = error_of([&] { SafetensorsFile f(dir / "empty.safetensors"); });
  EXPECT_NE(msg.find("empty.safetensors: truncated: file is 0 bytes"), std::string::npos) << msg;
  msg = error_of([&] { SafetensorsFile f(dir.path()); });
  EXPECT_NE(msg.find("not a regular file"), std::string::npos) << msg;
  // A FIFO in a checkpoint file's place is refused at once (opening it waited for a writer forever), as is one in
  // place of a model's JSON file.
  ASSERT_EQ(::mkfifo((dir / "fifo.safetensors").c_str(), 0600), 0);
  msg = error_of([&] { SafetensorsFile f(dir / "fifo.safetensors"); });
  EXPECT_NE(msg.find("fifo.safetensors: not a regular file"), std::string::npos) << msg;
  ASSERT_EQ(::mkfifo((dir / "config.json").c_str(), 0600), 0);
  msg = error_of([&] { fp4moe::format::read_json_file(dir / "config.json"); });
  EXPECT_NE(msg.find("config.json is not a regular file (a FIFO"), std::string::npos) << msg;
  write_bytes(dir / "gap.safetensors", image("{" + entry("a", "U8", "[4]", 4, 8) + "}", 8));
  msg = error_of([&] { SafetensorsFile f(dir / "gap.safetensors"); });
  EXPECT_NE(msg.find("gap.safetensors: tensor 'a': gap"), std::string::npos) << msg;

  write_bytes(dir / "ok.safetensors", image("{" + entry("a", "U8", "[4]", 0, 4) + "}", 4));
  const SafetensorsFile f(dir / "ok.safetensors");
  EXPECT_EQ(f.find("b"), nullptr);
  msg = error_of([&] { f.view("b"); });
  EXPECT_NE(msg.find("ok.safetensors: no tensor named 'b' (the file has 1 tensors)"), std::string::npos)
      << msg;
  EXPECT_EQ(view_bytes(f.view("a")), (Bytes{1, 8, 15, 22}));
}

// ---------------------------------------------------------------------------------------------
// Sharded checkpoints

// Splits the golden glm4_moe_tiny model into two shards + index.json under `dir`, with one extra
// tensor in shard 2 that the index does not map (allowed).
void write_sharded(const fs::path& dir, const SafetensorsFile& src, const std::string& index_override = "") {
  const std::string s1 = "model-00001-of-00002.safetensors";
  const std::string s2 = "model-00002-of-00002.safetensors";
  SafetensorsWriter w1, w2;
  std::ostringstream map;
  const auto& ts = src.tensors();
  for (size_t i = 0; i < ts.size(); ++i) {
    const bool first = i % 2 == 0;  // interleave so both shards hold every dtype
    (first ? w1 : w2).add(ts[i].name, src.view(ts[i]));
    map << (i ? "," : "") << "\"" << ts[i].name << "\":\"" << (first ? s1 : s2) << "\"";
  }
  const Bytes extra = {9, 9};
  w2.add("extra.unmapped", DType::kU8, {2}, extra);
  w1.set_metadata("format", "pt");
  w1.write(dir / s1);
  w2.write(dir / s2);
  std::ofstream(dir / "model.safetensors.index.json")
      << (index_override.empty()
              ? "{\"metadata\":{\"total_size\":123,\"format\":{\"nested\":[1]}},\"weight_map\":{" +
                    map.str() + "}}"
              : index_override);
}

TEST(TensorStoreSharded, SplitGoldenModelReadsBackIdentical) {
  const SafetensorsFile src(testing::shared_path("golden/models/glm4_moe_tiny/model.safetensors"));
  TempDir dir;
  write_sharded(dir.path(), src);
  write_bytes(dir / "decoy.safetensors", image("{}", 0));  // not named by the index: ignored
  const TensorStore store(dir.path());
  EXPECT_EQ(store.files().size(), 2u);
  const std::vector<std::string> names = store.names();
  EXPECT_EQ(names.size(), src.tensors().size() + 1);
  EXPECT_TRUE(std::is_sorted(names.begin(), names.end()));
  for (const TensorInfo& t : src.tensors()) {
    SCOPED_TRACE(t.name);
    ASSERT_TRUE(store.contains(t.name));
    const TensorView v = store.view(t.name);
    EXPECT_EQ(v.dtype, t.dtype);
    EXPECT_EQ(v.shape, t.shape);
    EXPECT_EQ(view_bytes(v), view_bytes(src.view(t)));
    EXPECT_EQ(store.find(t.name)->shape, t.shape);
  }
  EXPECT_EQ(view_bytes(store.view("extra.unmapped")), (Bytes{9, 9}));
  EXPECT_EQ(store.file_of("extra.unmapped").path().filename(), "model-00002-of-00002.safetensors");
  EXPECT_EQ(store.find("nope"), nullptr);
  const std::string msg = error_of([&] { store.view("nope"); });
  EXPECT_NE(msg.find(dir.path().string() + ": no tensor named 'nope'"), std::string::npos) << msg;
}

TEST(TensorStoreSharded, IndexErrors) {
  const SafetensorsFile src(testing::shared_path("golden/nvfp4/e4m3_decode.safetensors"));  // codes, values
  const std::string s1 = "model-00001-of-00002.safetensors";
  const std::string s2 = "model-00002-of-00002.safetensors";
  struct Case {
    const char* what;
    std::string index;
    std::string expect;
  };
  const std::vector<Case> cases = {
      {"missing shard",
       "{\"weight_map\":{\"codes\":\"" + s1 + "\",\"values\":\"model-00003-of-00003.safetensors\"}}",
       ": shard 'model-00003-of-00003.safetensors' named by model.safetensors.index.json does not exist "
       "(first tensor "
       "mapped to it: 'values')"},
      {"tensor missing from shard", "{\"weight_map\":{\"codes\":\"" + s1 + "\",\"ghost\":\"" + s1 + "\"}}",
       ": tensor 'ghost' is mapped to shard '" + s1 +
           "' by model.safetensors.index.json but is missing from that "
           "shard (and from every shard the index names)"},
      {"tensor in the other shard", "{\"weight_map\":{\"codes\":\"" + s2 + "\",\"values\":\"" + s1 + "\"}}",
       ": tensor 'codes' is mapped to shard '" + s2 +
           "' by model.safetensors.index.json but is missing from that shard "
           "(it is in " +
           s1 + ")"},
      {"not JSON", "{\"weight_map\":", "model.safetensors.index.json is not valid JSON (at byte 15"},
      {"not an object", "[]", "model.safetensors.index.json: not a JSON object (it is a array)"},
      {"no weight_map", "{\"metadata\":{}}", "model.safetensors.index.json: no \"weight_map\" key"},
      {"weight_map not object", "{\"weight_map\":[]}", "weight_map is not an object (it is a array)"},
      {"shard not string", "{\"weight_map\":{\"codes\":1}}",
       "weight_map: tensor 'codes' maps to a number, not a shard file name"},
      {"shard outside dir", "{\"weight_map\":{\"codes\":\"../x.safetensors\"}}",
       "tensor 'codes' maps to shard '../x.safetensors', which is not a file name in"},
      {"duplicate map entry", "{\"weight_map\":{\"codes\":\"" + s1 + "\",\"codes\":\"" + s2 + "\"}}",
       "key 'weight_map': duplicate key 'codes'"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    TempDir dir;
    SafetensorsWriter w1, w2;
    w1.add("codes", src.view("codes"));
    w2.add("values", src.view("values"));
    w1.write(dir / s1);
    w2.write(dir / s2);
    std::ofstream(dir / "model.safetensors.index.json") << c.index;
    const std::string msg = error_of([&] { TensorStore store(dir.path()); });
    EXPECT_NE(msg.find(c.expect), std::string::npos) << "message: " << msg;
  }
}

TEST(TensorStoreSharded, DirectoryModes) {
  TempDir dir;
  std::string msg = error_of([&] { TensorStore s(dir.path()); });
  EXPECT_NE(msg.find("no model.safetensors.index.json, model.safetensors or *.safetensors file"),
            std::string::npos)
      << msg;
  msg = error_of([&] { TensorStore s(dir / "absent"); });
  EXPECT_NE(msg.find("absent: not a directory"), std::string::npos) << msg;

  // No index, no model.safetensors: every *.safetensors file; a name in two files is an error.
  write_bytes(dir / "a.safetensors", image("{" + entry("x", "U8", "[2]", 0, 2) + "}", 2));
  write_bytes(dir / "b.safetensors", image("{" + entry("y", "U8", "[1]", 0, 1) + "}", 1));
  write_bytes(dir / "notes.txt", Bytes{1, 2, 3});
  {
    const TensorStore s(dir.path());
    EXPECT_EQ(s.names(), (std::vector<std::string>{"x", "y"}));
    EXPECT_EQ(s.file_of("y").path().filename(), "b.safetensors");
  }
  write_bytes(dir / "c.safetensors", image("{" + entry("x", "U8", "[1]", 0, 1) + "}", 1));
  msg = error_of([&] { TensorStore s(dir.path()); });
  EXPECT_NE(msg.find(": tensor 'x' is in two files: a.safetensors and c.safetensors"), std::string::npos)
      << msg;
  // A malformed shard reports the shard's path and the tensor.
  write_bytes(dir / "c.safetensors", image("{" + entry("z", "U8", "[2]", 0, 1) + "}", 1));
  msg = error_of([&] { TensorStore s(dir.path()); });
  EXPECT_NE(msg.find("c.safetensors: tensor 'z': wrong byte size"), std::string::npos) << msg;
}

// ---------------------------------------------------------------------------------------------
// Python interop

TEST(SafetensorsPython, PythonReadsWhatTheWriterWrote) {
  if (std::system("python3 -c 'import safetensors, numpy' >/dev/null 2>&1") != 0) {
    GTEST_SKIP() << "python3 with the safetensors and numpy packages is not importable "
                    "(scripts/setup.sh installs them)";
  }
  std::mt19937_64 rng(testing::test_seed());
  TempDir dir;
  const std::vector<Written> tensors = all_dtype_tensors(rng);
  SafetensorsWriter w;
  for (const Written& t : tensors) w.add(t.name, t.dtype, t.shape, t.bytes);
  w.set_metadata("format", "pt");
  w.write(dir / "all.safetensors");
  // numpy-loadable file too (numpy lacks bf16/fp8): values checked numerically.
  SafetensorsWriter wn;
  const std::vector<float> f = {1.5f, -2.0f, 0.25f, 1e30f, -0.0f, 3.0f};
  const std::vector<int64_t> i64 = {-5, 1LL << 40};
  wn.add("f", DType::kF32, {2, 3}, {reinterpret_cast<const uint8_t*>(f.data()), f.size() * 4});
  wn.add("i", DType::kI64, {2}, {reinterpret_cast<const uint8_t*>(i64.data()), i64.size() * 8});
  wn.write(dir / "np.safetensors");

  std::ofstream(dir / "read.py") << R"(import sys
from safetensors import deserialize, safe_open
from safetensors.numpy import load_file
path, np_path = sys.argv[1], sys.argv[2]
with safe_open(path, framework="numpy") as fh:
    print("metadata", sorted(fh.metadata().items()))
for name, t in sorted(deserialize(open(path, "rb").read())):
    print(name, t["dtype"], list(t["shape"]), bytes(t["data"]).hex())
d = load_file(np_path)
print("f", d["f"].dtype, d["f"].shape, d["f"].tolist())
print("i", d["i"].dtype, d["i"].tolist())
)";
  const std::string cmd = "python3 " + (dir / "read.py").string() + " " + (dir / "all.safetensors").string() +
                          " " + (dir / "np.safetensors").string() + " 2>&1";
  FILE* pipe = ::popen(cmd.c_str(), "r");
  ASSERT_NE(pipe, nullptr);
  std::string out;
  char buf[4096];
  for (size_t n; (n = std::fread(buf, 1, sizeof(buf), pipe)) > 0;) out.append(buf, n);
  ASSERT_EQ(::pclose(pipe), 0) << out;

  std::vector<const Written*> sorted;
  for (const Written& t : tensors) sorted.push_back(&t);
  std::sort(sorted.begin(), sorted.end(), [](auto* a, auto* b) { return a->name < b->name; });
  std::ostringstream want;
  want << "metadata [('format', 'pt')]\n";
  for (const Written* t : sorted) {
    want << t->name << " " << dtype_name(t->dtype) << " [";
    for (size_t k = 0; k < t->shape.size(); ++k) want << (k ? ", " : "") << t->shape[k];
    want << "] ";
    for (uint8_t b : t->bytes) {
      char hex[3];
      std::snprintf(hex, sizeof(hex), "%02x", b);
      want << hex;
    }
    want << "\n";
  }
  want << "f float32 (2, 3) [[1.5, -2.0, 0.25], [1.0000000150474662e+30, -0.0, 3.0]]\n";
  want << "i int64 [-5, 1099511627776]\n";
  EXPECT_EQ(out, want.str());
}

}  // namespace
}  // namespace fp4moe::format
