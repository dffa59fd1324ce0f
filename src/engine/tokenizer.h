// The HF `tokenizer.json` byte-level BPE tokenizer (GLM / Qwen / DeepSeek / GPT-2 family).
//
//   auto tok = fp4moe::engine::Tokenizer::load("path/to/model");   // tokenizer.json [+ tokenizer_config.json]
//   std::vector<int32_t> ids = tok.encode("Hello <|user|>");        // special-token text is matched
//   std::string text = tok.decode(ids);
//
// Pipeline (as HF `tokenizers` runs it): added tokens are split out of the raw text (leftmost-longest,
// honouring special / normalized / lstrip / rstrip / single_word), the rest is normalized (NFC, ...),
// pre-tokenized (Split regexes through PCRE2 with UTF+UCP, then ByteLevel's byte -> char map) and each
// piece is BPE-merged by merge rank (with a word cache). Decoding maps characters back to bytes and
// converts them lossily (U+FFFD), added tokens verbatim. Anything the loader does not implement is
// rejected at load with the JSON path of the offending part (e.g. `pre_tokenizer.pretokenizers[1].type`).
// Thread-safe after load (the word cache is guarded). Tested by tests/engine/test_tokenizer.cpp against
// shared/golden/tokenizer/encode_cases.json.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace fp4moe::engine {

using TokenId = int32_t;

// One entry of tokenizer.json's `added_tokens`.
struct AddedToken {
  TokenId id = -1;
  std::string content;
  bool special = false;
  bool normalized = false;
  bool lstrip = false;
  bool rstrip = false;
  bool single_word = false;
};

struct EncodeOptions {
  bool add_special_tokens = false;  // apply the post_processor template (BOS etc.)
  bool parse_special = true;        // match special-token text as special tokens (llama.cpp's default)
};

struct DecodeOptions {
  bool skip_special_tokens = false;
  // nullopt: tokenizer_config.json's clean_up_tokenization_spaces (false when absent).
  std::optional<bool> clean_up_tokenization_spaces;
};

class Tokenizer {
 public:
  // Reads DIR/tokenizer.json and, when present, DIR/tokenizer_config.json.
  static Tokenizer load(const std::filesystem::path& dir);
  // From already-parsed files; `config` may be null. `origin` names the source in error messages.
  static Tokenizer from_json(const nlohmann::json& tokenizer_json, const nlohmann::json& config,
                             const std::string& origin = "tokenizer.json");

  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

  std::vector<TokenId> encode(std::string_view text, const EncodeOptions& options = {}) const;
  std::string decode(std::span<const TokenId> ids, const DecodeOptions& options = {}) const;

  // The token's string as stored in the vocabulary (byte-level form, e.g. "Ġworld"); throws for an
  // id outside [0, vocab_size()) that names no token.
  const std::string& id_to_token(TokenId id) const;
  std::optional<TokenId> token_to_id(std::string_view token) const;
  // The raw bytes a token stands for (may be an incomplete UTF-8 character); added tokens: content.
  std::string token_bytes(TokenId id) const;
  // Highest id + 1 over the vocabulary and the added tokens.
  int32_t vocab_size() const;
  const AddedToken* added_token(TokenId id) const;  // nullptr when `id` is not an added token
  bool is_special(TokenId id) const;
  const std::vector<AddedToken>& added_tokens() const;

  // bos/eos from tokenizer_config.json (string or {"content": ...}); empty when absent.
  const std::string& bos_token() const;
  const std::string& eos_token() const;
  std::optional<TokenId> bos_id() const;
  std::optional<TokenId> eos_id() const;
  // tokenizer_config.json as read (null when the file was absent).
  const nlohmann::json& config() const;

  // The normalizer alone, and the pre-tokenizer's pieces of normalized text (raw bytes, before the
  // byte-level map); for tests and tools.
  std::string normalize(std::string_view text) const;
  std::vector<std::string> pre_tokenize(std::string_view normalized) const;

 private:
  struct Impl;
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  static Tokenizer from_json_checked(const nlohmann::json& tokenizer_json, const nlohmann::json& config,
                                     const std::string& origin);
  std::unique_ptr<Impl> impl_;
  friend class IncrementalDetokenizer;
};

// Streams text out of generated ids: each push returns only complete characters; bytes of a
// character split across tokens wait for the rest. Concatenating every push() and the final
// flush() gives decode(ids) (without clean-up). One instance per sequence; not thread-safe; the
// Tokenizer must outlive it and stay where it is (hold it in a shared_ptr when it is shared).
class IncrementalDetokenizer {
 public:
  // `keep`: special tokens rendered even when skip_special_tokens drops the others (a reasoning parser's
  // <think> / </think> where the tokenizer marks them special).
  explicit IncrementalDetokenizer(const Tokenizer& tokenizer, bool skip_special_tokens = false,
                                  std::vector<TokenId> keep = {});
  std::string push(TokenId id);
  // Emits what is still pending (an incomplete character becomes U+FFFD) and resets.
  std::string flush();
  size_t pending_bytes() const { return pending_.size(); }

 private:
  const Tokenizer* tokenizer_;
  bool skip_special_tokens_;
  std::vector<TokenId> keep_;
  std::string pending_;
};

}  // namespace fp4moe::engine
