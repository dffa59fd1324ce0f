// Byte-level BPE tokenizer from HF tokenizer.json: loading (with JSON-path errors), encoding, decoding
// and incremental detokenization (see tokenizer.h). Tested by tests/engine/test_tokenizer.cpp.
#include "engine/tokenizer.h"

#include <algorithm>
#include <fstream>
#include <mutex>
#include <queue>
#include <shared_mutex>
#include <sstream>
#include <tuple>
#include <unordered_map>
#include <variant>

#include "core/error.h"
#include "format/json_file.h"
#include "engine/tokenizer_regex.h"
#include "engine/tokenizer_text.h"

namespace fp4moe::engine {

using nlohmann::json;

namespace {

// GPT-2's pre-tokenization regex, used by ByteLevel when `use_regex` is true.
constexpr const char* kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
constexpr size_t kCacheCapacity = 10000;  // words; HF's BPE cache holds the same number

enum class SplitBehavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

struct PreTokenizerStep {
  std::shared_ptr<Regex> regex;  // Split (and Digits, as \p{N}+ or \p{N})
  SplitBehavior behavior = SplitBehavior::kIsolated;
  bool invert = false;
};

// Byte trie over added-token contents for leftmost-longest matching.
class TokenTrie {
 public:
  void insert(std::string_view s, size_t token_index) {
    int node = 0;
    for (char c : s) {
      const uint64_t key = (static_cast<uint64_t>(node) << 8) | static_cast<uint8_t>(c);
      auto it = edges_.find(key);
      if (it == edges_.end()) {
        it = edges_.emplace(key, static_cast<int>(terminal_.size())).first;
        terminal_.push_back(-1);
      }
      node = it->second;
    }
    if (node != 0) terminal_[node] = static_cast<int>(token_index);
  }
  // Longest token starting at s[pos]: (token index, length) or (-1, 0).
  std::pair<int, size_t> longest_at(std::string_view s, size_t pos) const {
    int node = 0;
    std::pair<int, size_t> best{-1, 0};
    for (size_t i = pos; i < s.size(); ++i) {
      const uint64_t key = (static_cast<uint64_t>(node) << 8) | static_cast<uint8_t>(s[i]);
      auto it = edges_.find(key);
      if (it == edges_.end()) break;
      node = it->second;
      if (terminal_[node] >= 0) best = {terminal_[node], i + 1 - pos};
    }
    return best;
  }
  bool empty() const { return edges_.empty(); }

 private:
  std::unordered_map<uint64_t, int> edges_;
  std::vector<int> terminal_{-1};  // node 0 is the root
};

// A piece of text and, when it is an added token, its id.
struct Segment {
  std::string text;
  TokenId added = -1;
};

std::string join_path(const std::string& base, const std::string& key) { return base.empty() ? key : base + "." + key; }

const json& require(const json& j, const std::string& key, const std::string& path, const std::string& origin) {
  FP4MOE_CHECK(j.is_object() && j.contains(key)) << origin << ": missing " << join_path(path, key);
  return j.at(key);
}

// A string field; another type is named (nlohmann's type_error would name neither the file nor the field).
std::string require_string(const json& j, const std::string& key, const std::string& path, const std::string& origin) {
  const json& v = require(j, key, path, origin);
  if (!v.is_string())
    throw Error(origin + ": " + join_path(path, key) + " must be a string, found " + v.dump().substr(0, 80));
  return v.get<std::string>();
}

// A list field (a Sequence's steps); another type is named with the file and the field.
const json& require_array(const json& j, const std::string& key, const std::string& path, const std::string& origin) {
  const json& v = require(j, key, path, origin);
  if (!v.is_array())
    throw Error(origin + ": " + join_path(path, key) + " must be a list, found " + v.dump().substr(0, 80));
  return v;
}

bool flag(const json& j, const char* key, bool fallback) {
  return j.contains(key) && j.at(key).is_boolean() ? j.at(key).get<bool>() : fallback;
}

// tokenizer_config.json stores special tokens either as a string or as {"content": ...}.
std::string config_token(const json& config, const char* key) {
  if (!config.is_object() || !config.contains(key)) return "";
  const json& v = config.at(key);
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v.at("content").is_string()) return v.at("content").get<std::string>();
  return "";
}

}  // namespace

struct Tokenizer::Impl {
  std::string origin;
  // Model (BPE).
  std::unordered_map<std::string, TokenId> vocab;
  std::vector<std::string> id_to_token;  // "" for ids without a vocabulary entry
  std::vector<uint8_t> has_token;
  std::unordered_map<uint64_t, std::pair<int32_t, TokenId>> merges;  // (left<<32|right) -> (rank, merged)
  std::optional<TokenId> unk;
  bool ignore_merges = false;
  // Added tokens.
  std::vector<AddedToken> added;
  std::unordered_map<TokenId, size_t> added_by_id;
  std::unordered_map<std::string, TokenId> added_by_content;
  TokenTrie raw_trie, normalized_trie;
  // Pipeline.
  std::vector<text::NormalForm> normalizers;
  std::vector<PreTokenizerStep> pre_tokenizers;
  bool add_prefix_space = false;
  bool has_byte_level = false;
  std::vector<std::variant<TokenId, char>> post_single;  // ids, or 'A' for the sequence
  bool has_post_template = false;
  // Config.
  json config;
  std::string bos, eos;
  std::optional<TokenId> bos_id, eos_id;
  bool clean_up = false;
  // Word cache.
  mutable std::shared_mutex cache_mutex;
  mutable std::unordered_map<std::string, std::vector<TokenId>> cache;

  void load_model(const json& model);
  void load_added(const json& added_json);
  void load_normalizer(const json& n, const std::string& path);
  void load_pre_tokenizer(const json& p, const std::string& path, bool last);
  void load_post_processor(const json& p, const std::string& path);
  void load_decoder(const json& d);

  std::vector<Segment> split_added(const std::string& s, const TokenTrie& trie, bool parse_special) const;
  std::vector<std::string> pre_tokenize(const std::string& s) const;
  void encode_plain(const std::string& s, std::vector<TokenId>& out) const;
  void bpe(const std::string& word, std::vector<TokenId>& out) const;
  void append_token_bytes(TokenId id, std::string& bytes) const;
};

void Tokenizer::Impl::load_model(const json& model) {
  FP4MOE_CHECK(model.is_object()) << origin << ": model must be an object (a BPE model), found " << model.type_name();
  const std::string type = model.value("type", std::string("BPE"));
  FP4MOE_CHECK(type == "BPE") << origin << ": model.type is '" << type << "'; only BPE is supported";
  FP4MOE_CHECK(!model.contains("dropout") || model.at("dropout").is_null())
      << origin << ": model.dropout is set; BPE dropout is not supported";
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    FP4MOE_CHECK(!model.contains(key) || model.at(key).is_null() || model.at(key) == "")
        << origin << ": model." << key << " is set; only byte-level BPE without affixes is supported";
  }
  FP4MOE_CHECK(!flag(model, "byte_fallback", false))
      << origin << ": model.byte_fallback is true; byte-level BPE never needs it and it is not supported";
  ignore_merges = flag(model, "ignore_merges", false);
  const json& v = require(model, "vocab", "model", origin);
  FP4MOE_CHECK(v.is_object()) << origin << ": model.vocab is not an object";
  for (const auto& [token, id_json] : v.items()) {
    FP4MOE_CHECK(id_json.is_number_integer() && id_json.get<int64_t>() >= 0 && id_json.get<int64_t>() < (1 << 30))
        << origin << ": model.vocab[\"" << token << "\"] is not a valid id: " << id_json.dump();
    const auto id = id_json.get<TokenId>();
    vocab[token] = id;
    if (static_cast<size_t>(id) >= id_to_token.size()) {
      id_to_token.resize(id + 1);
      has_token.resize(id + 1, 0);
    }
    id_to_token[id] = token;
    has_token[id] = 1;
  }
  if (model.contains("unk_token") && model.at("unk_token").is_string()) {
    const std::string u = model.at("unk_token").get<std::string>();
    auto it = vocab.find(u);
    FP4MOE_CHECK(it != vocab.end()) << origin << ": model.unk_token '" << u << "' is not in model.vocab";
    unk = it->second;
  }
  const json& m = require(model, "merges", "model", origin);
  FP4MOE_CHECK(m.is_array()) << origin << ": model.merges is not an array";
  merges.reserve(m.size());
  for (size_t i = 0; i < m.size(); ++i) {
    std::string a, b;
    if (m[i].is_string()) {  // "a b" (older files)
      const std::string s = m[i].get<std::string>();
      const size_t sp = s.find(' ', 1);
      FP4MOE_CHECK(sp != std::string::npos) << origin << ": model.merges[" << i << "] '" << s << "' has no space";
      a = s.substr(0, sp);
      b = s.substr(sp + 1);
    } else {
      FP4MOE_CHECK(m[i].is_array() && m[i].size() == 2 && m[i][0].is_string() && m[i][1].is_string())
          << origin << ": model.merges[" << i << "] is neither \"a b\" nor [a, b]: " << m[i].dump();
      a = m[i][0].get<std::string>();
      b = m[i][1].get<std::string>();
    }
    auto ia = vocab.find(a), ib = vocab.find(b), im = vocab.find(a + b);
    FP4MOE_CHECK(ia != vocab.end() && ib != vocab.end() && im != vocab.end())
        << origin << ": model.merges[" << i << "] (" << a << ", " << b << ") names a token missing from model.vocab";
    const uint64_t key = (static_cast<uint64_t>(ia->second) << 32) | static_cast<uint32_t>(ib->second);
    merges.emplace(key, std::make_pair(static_cast<int32_t>(i), im->second));  // first (lowest) rank wins
  }
}

void Tokenizer::Impl::load_added(const json& added_json) {
  if (added_json.is_null()) return;
  FP4MOE_CHECK(added_json.is_array()) << origin << ": added_tokens is not an array";
  for (size_t i = 0; i < added_json.size(); ++i) {
    const json& a = added_json[i];
    const std::string path = "added_tokens[" + std::to_string(i) + "]";
    AddedToken t;
    const json& id = require(a, "id", path, origin);
    FP4MOE_CHECK(id.is_number_integer() && id.get<int64_t>() >= 0 && id.get<int64_t>() < (1 << 30))
        << origin << ": " << path << ".id is not a valid id: " << id.dump();
    t.id = id.get<TokenId>();
    t.content = require_string(a, "content", path, origin);
    FP4MOE_CHECK(!t.content.empty()) << origin << ": " << path << ".content is empty";
    t.special = flag(a, "special", false);
    t.normalized = flag(a, "normalized", !t.special);
    t.lstrip = flag(a, "lstrip", false);
    t.rstrip = flag(a, "rstrip", false);
    t.single_word = flag(a, "single_word", false);
    added_by_id[t.id] = added.size();
    added_by_content[t.content] = t.id;
    added.push_back(std::move(t));
  }
}

void Tokenizer::Impl::load_normalizer(const json& n, const std::string& path) {
  if (n.is_null()) return;
  const std::string type = require_string(n, "type", path, origin);
  if (type == "Sequence") {
    const json& list = require_array(n, "normalizers", path, origin);
    for (size_t i = 0; i < list.size(); ++i) load_normalizer(list[i], path + ".normalizers[" + std::to_string(i) + "]");
  } else if (type == "NFC") {
    normalizers.push_back(text::NormalForm::kNfc);
  } else if (type == "NFD") {
    normalizers.push_back(text::NormalForm::kNfd);
  } else if (type == "NFKC") {
    normalizers.push_back(text::NormalForm::kNfkc);
  } else if (type == "NFKD") {
    normalizers.push_back(text::NormalForm::kNfkd);
  } else {
    FP4MOE_FAIL() << origin << ": " << path << ".type is '" << type
                  << "'; supported normalizers: NFC, NFD, NFKC, NFKD, Sequence";
  }
}

void Tokenizer::Impl::load_pre_tokenizer(const json& p, const std::string& path, bool last) {
  const std::string type = require_string(p, "type", path, origin);
  if (type == "Sequence") {
    const json& list = require_array(p, "pretokenizers", path, origin);
    for (size_t i = 0; i < list.size(); ++i) {
      load_pre_tokenizer(list[i], path + ".pretokenizers[" + std::to_string(i) + "]", last && i + 1 == list.size());
    }
  } else if (type == "Split") {
    const json& pattern = require(p, "pattern", path, origin);
    PreTokenizerStep step;
    // A pattern PCRE2 cannot compile is named with the file and the step.
    const auto compile = [&](const char* key, bool literal) {
      const std::string text = require_string(pattern, key, path + ".pattern", origin);
      try {
        return std::make_shared<Regex>(text, literal);
      } catch (const Error& e) {
        throw Error(origin + ": " + path + ".pattern." + key + ": " + e.what());
      }
    };
    if (pattern.is_object() && pattern.contains("Regex")) {
      step.regex = compile("Regex", false);
    } else if (pattern.is_object() && pattern.contains("String")) {
      step.regex = compile("String", true);
    } else {
      FP4MOE_FAIL() << origin << ": " << path << ".pattern is neither {\"Regex\": ...} nor {\"String\": ...}";
    }
    const std::string behavior = require_string(p, "behavior", path, origin);
    if (behavior == "Removed") step.behavior = SplitBehavior::kRemoved;
    else if (behavior == "Isolated") step.behavior = SplitBehavior::kIsolated;
    else if (behavior == "MergedWithPrevious") step.behavior = SplitBehavior::kMergedWithPrevious;
    else if (behavior == "MergedWithNext") step.behavior = SplitBehavior::kMergedWithNext;
    else if (behavior == "Contiguous") step.behavior = SplitBehavior::kContiguous;
    else FP4MOE_FAIL() << origin << ": " << path << ".behavior '" << behavior << "' is unknown";
    step.invert = flag(p, "invert", false);
    pre_tokenizers.push_back(std::move(step));
  } else if (type == "Digits") {
    PreTokenizerStep step;
    step.regex = std::make_shared<Regex>(flag(p, "individual_digits", false) ? R"(\p{N})" : R"(\p{N}+)", false);
    pre_tokenizers.push_back(std::move(step));
  } else if (type == "ByteLevel") {
    // Everything before works on text, the byte -> char map comes last; so ByteLevel must be the last step.
    FP4MOE_CHECK(last) << origin << ": " << path << " (ByteLevel) is not the last pre-tokenizer; not supported";
    add_prefix_space = flag(p, "add_prefix_space", false);
    has_byte_level = true;
    if (flag(p, "use_regex", true)) {
      PreTokenizerStep step;
      step.regex = std::make_shared<Regex>(kGpt2Pattern, false);
      pre_tokenizers.push_back(std::move(step));
    }
  } else {
    FP4MOE_FAIL() << origin << ": " << path << ".type is '" << type
                  << "'; supported pre-tokenizers: Sequence, Split, Digits, ByteLevel";
  }
}

void Tokenizer::Impl::load_post_processor(const json& p, const std::string& path) {
  if (p.is_null()) return;
  const std::string type = require_string(p, "type", path, origin);
  if (type == "ByteLevel") return;  // only adjusts offsets
  if (type == "Sequence") {
    const json& list = require(p, "processors", path, origin);
    for (size_t i = 0; i < list.size(); ++i) load_post_processor(list[i], path + ".processors[" + std::to_string(i) + "]");
    return;
  }
  FP4MOE_CHECK(type == "TemplateProcessing")
      << origin << ": " << path << ".type is '" << type << "'; supported: TemplateProcessing, ByteLevel, Sequence";
  FP4MOE_CHECK(!has_post_template) << origin << ": " << path << " is a second TemplateProcessing; not supported";
  has_post_template = true;
  const json& single = require(p, "single", path, origin);
  const json& specials = p.value("special_tokens", json::object());
  for (size_t i = 0; i < single.size(); ++i) {
    const std::string item_path = path + ".single[" + std::to_string(i) + "]";
    if (single[i].contains("Sequence")) {
      post_single.emplace_back('A');
    } else if (single[i].contains("SpecialToken")) {
      const std::string name = single[i]["SpecialToken"].value("id", std::string());
      FP4MOE_CHECK(specials.contains(name) && specials[name].contains("ids"))
          << origin << ": " << item_path << " names special token '" << name << "' missing from "
          << path << ".special_tokens";
      for (const json& id : specials[name]["ids"]) post_single.emplace_back(id.get<TokenId>());
    } else {
      FP4MOE_FAIL() << origin << ": " << item_path << " is neither Sequence nor SpecialToken";
    }
  }
}

void Tokenizer::Impl::load_decoder(const json& d) {
  FP4MOE_CHECK(!d.is_null()) << origin << ": decoder is null; byte-level BPE needs the ByteLevel decoder";
  const std::string type = require_string(d, "type", "decoder", origin);
  FP4MOE_CHECK(type == "ByteLevel") << origin << ": decoder.type is '" << type << "'; only ByteLevel is supported";
}

Tokenizer Tokenizer::from_json(const json& tj, const json& config, const std::string& origin) {
  try {
    return from_json_checked(tj, config, origin);
  } catch (const json::exception& e) {  // a field of the wrong JSON type
    FP4MOE_FAIL() << origin << ": unexpected JSON type: " << e.what();
  }
  return Tokenizer(nullptr);
}

Tokenizer Tokenizer::from_json_checked(const json& tj, const json& config, const std::string& origin) {
  auto impl = std::make_unique<Impl>();
  impl->origin = origin;
  FP4MOE_CHECK(tj.is_object()) << origin << ": the top level is not an object";
  impl->load_model(require(tj, "model", "", origin));
  impl->load_added(tj.value("added_tokens", json()));
  impl->load_normalizer(tj.value("normalizer", json()), "normalizer");
  const json& pre = tj.value("pre_tokenizer", json());
  FP4MOE_CHECK(!pre.is_null()) << origin << ": pre_tokenizer is null; byte-level BPE needs a ByteLevel pre-tokenizer";
  impl->load_pre_tokenizer(pre, "pre_tokenizer", true);
  FP4MOE_CHECK(impl->has_byte_level)
      << origin << ": pre_tokenizer has no ByteLevel step; only byte-level BPE is supported";
  impl->load_post_processor(tj.value("post_processor", json()), "post_processor");
  impl->load_decoder(tj.value("decoder", json()));
  for (const char* key : {"truncation", "padding"}) {
    FP4MOE_CHECK(!tj.contains(key) || tj.at(key).is_null())
        << origin << ": " << key << " is set; truncation and padding belong to the server, not the tokenizer";
  }

  // Added tokens match on the raw text (normalized == false) or on the normalized text.
  for (size_t i = 0; i < impl->added.size(); ++i) {
    const AddedToken& t = impl->added[i];
    if (t.normalized) {
      std::string n = t.content;
      for (auto form : impl->normalizers) n = text::normalize(n, form);
      impl->normalized_trie.insert(n, i);
    } else {
      impl->raw_trie.insert(t.content, i);
    }
    if (static_cast<size_t>(t.id) >= impl->id_to_token.size()) {
      impl->id_to_token.resize(t.id + 1);
      impl->has_token.resize(t.id + 1, 0);
    }
  }

  impl->config = config;
  impl->bos = config_token(config, "bos_token");
  impl->eos = config_token(config, "eos_token");
  Tokenizer tok(std::move(impl));
  Impl& im = *tok.impl_;
  if (!im.bos.empty()) im.bos_id = tok.token_to_id(im.bos);
  if (!im.eos.empty()) {
    im.eos_id = tok.token_to_id(im.eos);
    FP4MOE_CHECK(im.eos_id.has_value()) << "tokenizer_config.json: eos_token '" << im.eos << "' is not a token of "
                                        << origin;
  }
  im.clean_up = config.is_object() && config.contains("clean_up_tokenization_spaces") &&
                config.at("clean_up_tokenization_spaces").is_boolean() &&
                config.at("clean_up_tokenization_spaces").get<bool>();
  return tok;
}

Tokenizer Tokenizer::load(const std::filesystem::path& dir) {
  const auto tj_path = dir / "tokenizer.json";
  std::error_code ec;
  if (std::filesystem::is_regular_file(dir, ec)) {
    throw Error(dir.string() + " is a file, not a tokenizer folder (one holding tokenizer.json and, optionally, " +
                "tokenizer_config.json): give " + (dir.has_parent_path() ? dir.parent_path().string() : "."));
  }
  if (!std::filesystem::exists(dir, ec)) throw Error("tokenizer folder " + dir.string() + " does not exist");
  if (!std::filesystem::exists(tj_path, ec))
    throw Error("no tokenizer.json in " + dir.string() + " (a tokenizer folder holds tokenizer.json and, optionally, " +
                "tokenizer_config.json)");
  const auto config_path = dir / "tokenizer_config.json";
  json config = std::filesystem::exists(config_path) ? format::read_json_file(config_path) : json();
  return from_json(format::read_json_file(tj_path), config, tj_path.string());
}

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

std::vector<Segment> Tokenizer::Impl::split_added(const std::string& s, const TokenTrie& trie,
                                                  bool parse_special) const {
  std::vector<Segment> out;
  if (trie.empty()) {
    out.push_back({s, -1});
    return out;
  }
  size_t prev_stop = 0;  // end of the last emitted token (text before it is already out)
  size_t pos = 0;
  auto char_before = [&](size_t i) {
    size_t j = i - 1;
    while (j > 0 && (static_cast<uint8_t>(s[j]) & 0xC0) == 0x80) --j;
    return text::next_code_point(s, j);
  };
  while (pos < s.size()) {
    auto [index, length] = trie.longest_at(s, pos);
    if (index < 0) {
      ++pos;
      continue;
    }
    const AddedToken& t = added[index];
    size_t start = pos, stop = pos + length;
    pos = stop;  // matches never overlap (like aho-corasick's leftmost-longest iteration)
    if (t.special && !parse_special) continue;
    if (t.single_word) {
      size_t after = stop;
      const bool left_ok = start == 0 || !text::is_alphanumeric(char_before(start));
      const bool right_ok = stop == s.size() || !text::is_alphanumeric(text::next_code_point(s, after));
      if (!left_ok || !right_ok) continue;
    }
    if (t.lstrip) {
      while (start > prev_stop) {
        size_t j = start - 1;
        while (j > prev_stop && (static_cast<uint8_t>(s[j]) & 0xC0) == 0x80) --j;
        size_t k = j;
        if (!text::is_whitespace(text::next_code_point(s, k))) break;
        start = j;
      }
    }
    if (t.rstrip) {
      while (stop < s.size()) {
        size_t k = stop;
        if (!text::is_whitespace(text::next_code_point(s, k))) break;
        stop = k;
      }
      pos = stop;
    }
    if (start > prev_stop) out.push_back({s.substr(prev_stop, start - prev_stop), -1});
    out.push_back({"", t.id});
    prev_stop = stop;
  }
  if (prev_stop < s.size()) out.push_back({s.substr(prev_stop), -1});
  return out;
}

std::vector<std::string> Tokenizer::Impl::pre_tokenize(const std::string& s) const {
  std::vector<std::string> pieces{s};
  for (const PreTokenizerStep& step : pre_tokenizers) {
    std::vector<std::string> next;
    for (const std::string& piece : pieces) {
      // Parts covering the piece: (begin, end, is_match) after `invert`.
      std::vector<std::tuple<size_t, size_t, bool>> parts;
      size_t cursor = 0;
      for (auto [b, e] : step.regex->find_all(piece)) {
        if (b > cursor) parts.emplace_back(cursor, b, step.invert);
        parts.emplace_back(b, e, !step.invert);
        cursor = e;
      }
      if (cursor < piece.size()) parts.emplace_back(cursor, piece.size(), step.invert);
      std::vector<std::pair<size_t, size_t>> ranges;
      switch (step.behavior) {
        case SplitBehavior::kRemoved:
          for (auto [b, e, m] : parts) if (!m) ranges.emplace_back(b, e);
          break;
        case SplitBehavior::kIsolated:
          for (auto [b, e, m] : parts) ranges.emplace_back(b, e);
          break;
        case SplitBehavior::kMergedWithPrevious: {  // a delimiter joins the non-delimiter before it
          bool prev_match = false;
          for (auto [b, e, m] : parts) {
            if (m && !prev_match && !ranges.empty()) ranges.back().second = e;
            else ranges.emplace_back(b, e);
            prev_match = m;
          }
          break;
        }
        case SplitBehavior::kMergedWithNext: {  // ... the non-delimiter after it (HF folds in reverse)
          bool next_match = false;
          for (auto it = parts.rbegin(); it != parts.rend(); ++it) {
            auto [b, e, m] = *it;
            if (m && !next_match && !ranges.empty()) ranges.back().first = b;
            else ranges.emplace_back(b, e);
            next_match = m;
          }
          std::reverse(ranges.begin(), ranges.end());
          break;
        }
        case SplitBehavior::kContiguous: {
          bool prev_match = false;
          for (auto [b, e, m] : parts) {
            if (m == prev_match && !ranges.empty()) ranges.back().second = e;
            else ranges.emplace_back(b, e);
            prev_match = m;
          }
          break;
        }
      }
      for (auto [b, e] : ranges) next.push_back(piece.substr(b, e - b));
    }
    pieces = std::move(next);
  }
  return pieces;
}

void Tokenizer::Impl::encode_plain(const std::string& s, std::vector<TokenId>& out) const {
  const auto& map = text::ByteLevelMap::get();
  for (const std::string& piece : pre_tokenize(s)) {
    bpe(map.encode(add_prefix_space && piece[0] != ' ' ? " " + piece : piece), out);
  }
}

void Tokenizer::Impl::bpe(const std::string& word, std::vector<TokenId>& out) const {
  {
    std::shared_lock lock(cache_mutex);
    auto it = cache.find(word);
    if (it != cache.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  std::vector<TokenId> ids;
  auto whole = ignore_merges ? vocab.find(word) : vocab.end();
  if (whole != vocab.end()) {
    ids.push_back(whole->second);
  } else {
    // Symbols in a linked list; merges pop from a heap ordered by (rank, position) as HF does.
    struct Symbol {
      TokenId id;
      int prev, next;
    };
    std::vector<Symbol> sym;
    size_t i = 0;
    while (i < word.size()) {
      const size_t begin = i;
      text::next_code_point(word, i);
      auto it = vocab.find(word.substr(begin, i - begin));
      if (it != vocab.end()) sym.push_back({it->second, 0, 0});
      else if (unk) sym.push_back({*unk, 0, 0});  // no unk: the character is dropped, as HF does
    }
    const int n = static_cast<int>(sym.size());
    for (int k = 0; k < n; ++k) {
      sym[k].prev = k - 1;
      sym[k].next = k + 1 < n ? k + 1 : -1;
    }
    using Entry = std::tuple<int32_t, int, TokenId, TokenId, TokenId>;  // rank, pos, left, right, merged
    std::priority_queue<Entry, std::vector<Entry>, std::greater<>> heap;
    auto push_pair = [&](int left) {
      if (left < 0 || sym[left].next < 0) return;
      const TokenId a = sym[left].id, b = sym[sym[left].next].id;
      auto it = merges.find((static_cast<uint64_t>(a) << 32) | static_cast<uint32_t>(b));
      if (it != merges.end()) heap.emplace(it->second.first, left, a, b, it->second.second);
    };
    for (int k = 0; k + 1 < n; ++k) push_pair(k);
    std::vector<uint8_t> alive(n, 1);
    while (!heap.empty()) {
      auto [rank, pos, a, b, merged] = heap.top();
      heap.pop();
      if (!alive[pos] || sym[pos].id != a || sym[pos].next < 0 || sym[sym[pos].next].id != b) continue;
      const int right = sym[pos].next;
      sym[pos].id = merged;
      sym[pos].next = sym[right].next;
      if (sym[right].next >= 0) sym[sym[right].next].prev = pos;
      alive[right] = 0;
      push_pair(sym[pos].prev);
      push_pair(pos);
    }
    for (int k = 0; k < n; ++k) if (alive[k]) ids.push_back(sym[k].id);
  }
  out.insert(out.end(), ids.begin(), ids.end());
  std::unique_lock lock(cache_mutex);
  if (cache.size() < kCacheCapacity) cache.emplace(word, std::move(ids));
}

std::vector<TokenId> Tokenizer::encode(std::string_view input, const EncodeOptions& options) const {
  const Impl& im = *impl_;
  if (auto bad = text::find_invalid_utf8(input)) {
    FP4MOE_FAIL() << "cannot tokenize: invalid UTF-8 at byte " << *bad << " of " << input.size();
  }
  std::vector<TokenId> ids;
  for (Segment& raw : im.split_added(std::string(input), im.raw_trie, options.parse_special)) {
    if (raw.added >= 0) {
      ids.push_back(raw.added);
      continue;
    }
    std::string normalized = std::move(raw.text);
    for (auto form : im.normalizers) normalized = text::normalize(normalized, form);
    for (const Segment& seg : im.split_added(normalized, im.normalized_trie, options.parse_special)) {
      if (seg.added >= 0) ids.push_back(seg.added);
      else if (!seg.text.empty()) im.encode_plain(seg.text, ids);
    }
  }
  if (options.add_special_tokens && im.has_post_template) {
    std::vector<TokenId> wrapped;
    for (const auto& item : im.post_single) {
      if (std::holds_alternative<char>(item)) wrapped.insert(wrapped.end(), ids.begin(), ids.end());
      else wrapped.push_back(std::get<TokenId>(item));
    }
    ids = std::move(wrapped);
  }
  return ids;
}

void Tokenizer::Impl::append_token_bytes(TokenId id, std::string& bytes) const {
  if (id < 0 || static_cast<size_t>(id) >= has_token.size() || !has_token[id]) return;  // HF skips unknown ids
  const std::string& tok = id_to_token[id];
  const auto& map = text::ByteLevelMap::get();
  std::string mapped;
  size_t i = 0;
  while (i < tok.size()) {
    const int b = map.decode_char(text::next_code_point(tok, i));
    if (b < 0) {  // not a byte-level token: HF's ByteLevel decoder then keeps the token's own bytes
      bytes += tok;
      return;
    }
    mapped.push_back(static_cast<char>(b));
  }
  bytes += mapped;
}

std::string Tokenizer::decode(std::span<const TokenId> ids, const DecodeOptions& options) const {
  const Impl& im = *impl_;
  std::string out, chunk;
  for (TokenId id : ids) {
    if (const AddedToken* t = added_token(id)) {
      if (options.skip_special_tokens && t->special) continue;
      text::append_lossy_utf8(out, chunk, true);
      chunk.clear();
      out += t->content;
    } else {
      im.append_token_bytes(id, chunk);
    }
  }
  text::append_lossy_utf8(out, chunk, true);
  if (options.clean_up_tokenization_spaces.value_or(im.clean_up)) {
    // transformers' clean_up_tokenization: drop the space before punctuation and English contractions.
    static const std::pair<std::string_view, std::string_view> kRules[] = {
        {" .", "."}, {" ?", "?"}, {" !", "!"}, {" ,", ","}, {" ' ", "'"},
        {" n't", "n't"}, {" 'm", "'m"}, {" 's", "'s"}, {" 've", "'ve"}, {" 're", "'re"}};
    for (auto [from, to] : kRules) {
      std::string replaced;
      size_t start = 0, hit;
      while ((hit = out.find(from, start)) != std::string::npos) {
        replaced.append(out, start, hit - start);
        replaced.append(to);
        start = hit + from.size();
      }
      replaced.append(out, start);
      out = std::move(replaced);
    }
  }
  return out;
}

const std::string& Tokenizer::id_to_token(TokenId id) const {
  if (const AddedToken* t = added_token(id)) return t->content;
  FP4MOE_CHECK(id >= 0 && static_cast<size_t>(id) < impl_->has_token.size() && impl_->has_token[id])
      << "token id " << id << " names no token (vocab_size " << vocab_size() << ")";
  return impl_->id_to_token[id];
}

std::optional<TokenId> Tokenizer::token_to_id(std::string_view token) const {
  const std::string key(token);
  if (auto hit = impl_->added_by_content.find(key); hit != impl_->added_by_content.end()) return hit->second;
  auto it = impl_->vocab.find(key);
  if (it == impl_->vocab.end()) return std::nullopt;
  return it->second;
}

std::string Tokenizer::token_bytes(TokenId id) const {
  if (const AddedToken* t = added_token(id)) return t->content;
  std::string bytes;
  impl_->append_token_bytes(id, bytes);
  return bytes;
}

int32_t Tokenizer::vocab_size() const { return static_cast<int32_t>(impl_->id_to_token.size()); }

const AddedToken* Tokenizer::added_token(TokenId id) const {
  auto it = impl_->added_by_id.find(id);
  return it == impl_->added_by_id.end() ? nullptr : &impl_->added[it->second];
}

bool Tokenizer::is_special(TokenId id) const {
  const AddedToken* t = added_token(id);
  return t != nullptr && t->special;
}

const std::vector<AddedToken>& Tokenizer::added_tokens() const { return impl_->added; }
const std::string& Tokenizer::bos_token() const { return impl_->bos; }
const std::string& Tokenizer::eos_token() const { return impl_->eos; }
std::optional<TokenId> Tokenizer::bos_id() const { return impl_->bos_id; }
std::optional<TokenId> Tokenizer::eos_id() const { return impl_->eos_id; }
const json& Tokenizer::config() const { return impl_->config; }

std::vector<std::string> Tokenizer::pre_tokenize(std::string_view normalized) const {
  return impl_->pre_tokenize(std::string(normalized));
}

std::string Tokenizer::normalize(std::string_view input) const {
  std::string s(input);
  for (auto form : impl_->normalizers) s = text::normalize(s, form);
  return s;
}

IncrementalDetokenizer::IncrementalDetokenizer(const Tokenizer& tokenizer, bool skip_special_tokens,
                                               std::vector<TokenId> keep)
    : tokenizer_(&tokenizer), skip_special_tokens_(skip_special_tokens), keep_(std::move(keep)) {}

std::string IncrementalDetokenizer::push(TokenId id) {
  std::string out;
  if (const AddedToken* t = tokenizer_->added_token(id)) {
    if (skip_special_tokens_ && t->special && std::find(keep_.begin(), keep_.end(), id) == keep_.end()) return out;
    out = flush();  // decode() converts the bytes before an added token on their own, too
    out += t->content;
    return out;
  }
  tokenizer_->impl_->append_token_bytes(id, pending_);
  const size_t consumed = text::append_lossy_utf8(out, pending_, false);
  pending_.erase(0, consumed);
  return out;
}

std::string IncrementalDetokenizer::flush() {
  std::string out;
  text::append_lossy_utf8(out, pending_, true);
  pending_.clear();
  return out;
}

}  // namespace fp4moe::engine
