// Text helpers of the tokenizer: UTF-8 validation and lossy decoding (the U+FFFD rules of Rust's
// String::from_utf8_lossy, which HF `tokenizers` uses), Unicode normalization forms through
// libutf8proc, character classes, and GPT-2's byte <-> printable-character map of byte-level BPE.
// Tested by tests/engine/test_tokenizer.cpp (UtfLossy*, ByteLevelMap*, Normalize*).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace fp4moe::engine::text {

// Byte offset of the first invalid or truncated UTF-8 sequence, or nullopt when `s` is valid.
std::optional<size_t> find_invalid_utf8(std::string_view s);

// Appends `bytes` to `out` as UTF-8, replacing each maximal invalid subpart with U+FFFD.
// With `final == false` a trailing sequence that is incomplete but could still become valid is not
// consumed; the return value is the number of bytes consumed (== bytes.size() when final).
size_t append_lossy_utf8(std::string& out, std::string_view bytes, bool final);

// Decodes one code point at `i` of valid UTF-8 `s`; advances `i`.
char32_t next_code_point(std::string_view s, size_t& i);
// Appends the UTF-8 encoding of `cp`.
void append_utf8(std::string& out, char32_t cp);

// Unicode White_Space (what Rust's char::is_whitespace tests).
bool is_whitespace(char32_t cp);
// Python's str.isspace / strip (the chat templates' Jinja): White_Space and U+001C..U+001F.
bool is_python_space(char32_t cp);
// Letter or number (Rust's char::is_alphanumeric).
bool is_alphanumeric(char32_t cp);

enum class NormalForm { kNfc, kNfd, kNfkc, kNfkd };
// Normalizes valid UTF-8 text (throws fp4moe::Error naming the form when utf8proc fails).
std::string normalize(std::string_view s, NormalForm form);

// GPT-2's bytes_to_unicode(): bytes 33..126, 161..172 and 174..255 map to themselves, the other 68
// bytes to U+0100.. in order, so every byte is a printable character.
class ByteLevelMap {
 public:
  static const ByteLevelMap& get();
  // UTF-8 of the character standing for byte b.
  const std::string& encode_byte(uint8_t b) const { return byte_to_utf8_[b]; }
  // Maps every byte of `raw` to its character.
  std::string encode(std::string_view raw) const;
  // The byte a code point stands for, or -1 when it is not one of the 256 characters.
  int decode_char(char32_t cp) const { return cp < char_to_byte_.size() ? char_to_byte_[cp] : -1; }

 private:
  ByteLevelMap();
  std::array<std::string, 256> byte_to_utf8_;
  std::array<int16_t, 324> char_to_byte_;  // highest mapped code point is U+0143 (323)
};

}  // namespace fp4moe::engine::text
