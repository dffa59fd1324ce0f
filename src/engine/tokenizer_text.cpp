// UTF-8, normalization and byte-level-map helpers of the tokenizer (see tokenizer_text.h).
// Tested by tests/engine/test_tokenizer.cpp.
#include "engine/tokenizer_text.h"

#include <utf8proc.h>

#include <cstdlib>
#include <memory>

#include "core/error.h"

namespace fp4moe::engine::text {

namespace {

// Result of looking at the UTF-8 sequence starting at s[i].
struct SeqScan {
  size_t length;    // bytes of a complete valid sequence, or of the maximal valid prefix
  bool complete;    // a whole valid character
  bool truncated;   // input ended inside a sequence that could still become valid
};

// The valid ranges of the second byte for each lead byte (Unicode Table 3-7); later bytes are 80..BF.
SeqScan scan_sequence(std::string_view s, size_t i) {
  const auto b0 = static_cast<uint8_t>(s[i]);
  if (b0 < 0x80) return {1, true, false};
  size_t need = 0;
  uint8_t lo = 0x80, hi = 0xBF;
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 1;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    need = 2;
    if (b0 == 0xE0) lo = 0xA0;
    if (b0 == 0xED) hi = 0x9F;
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    need = 3;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;
  } else {
    return {1, false, false};
  }
  size_t j = 1;
  for (; j <= need; ++j) {
    if (i + j >= s.size()) return {j, false, true};
    const auto b = static_cast<uint8_t>(s[i + j]);
    const uint8_t l = (j == 1) ? lo : 0x80;
    const uint8_t h = (j == 1) ? hi : 0xBF;
    if (b < l || b > h) return {j, false, false};
  }
  return {need + 1, true, false};
}

constexpr std::string_view kReplacement = "\xEF\xBF\xBD";  // U+FFFD

}  // namespace

std::optional<size_t> find_invalid_utf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const SeqScan scan = scan_sequence(s, i);
    if (!scan.complete) return i;
    i += scan.length;
  }
  return std::nullopt;
}

size_t append_lossy_utf8(std::string& out, std::string_view bytes, bool final) {
  size_t i = 0;
  while (i < bytes.size()) {
    const SeqScan scan = scan_sequence(bytes, i);
    if (scan.complete) {
      out.append(bytes.substr(i, scan.length));
    } else if (scan.truncated && !final) {
      return i;  // wait for the rest of the character
    } else {
      out.append(kReplacement);
    }
    i += scan.length;
  }
  return i;
}

char32_t next_code_point(std::string_view s, size_t& i) {
  const auto b0 = static_cast<uint8_t>(s[i]);
  if (b0 < 0x80) {
    ++i;
    return b0;
  }
  const size_t n = b0 >= 0xF0 ? 4 : b0 >= 0xE0 ? 3 : 2;
  char32_t cp = b0 & (n == 2 ? 0x1F : n == 3 ? 0x0F : 0x07);
  for (size_t k = 1; k < n && i + k < s.size(); ++k) cp = (cp << 6) | (static_cast<uint8_t>(s[i + k]) & 0x3F);
  i += n;
  return cp;
}

void append_utf8(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

bool is_whitespace(char32_t cp) {
  // Unicode White_Space: 9..13, space, U+0085, U+00A0, U+1680, U+2000..200A, 2028, 2029, 202F, 205F, 3000.
  if ((cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680) return true;
  if (cp >= 0x2000 && cp <= 0x200A) return true;
  return cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

bool is_python_space(char32_t cp) { return is_whitespace(cp) || (cp >= 0x1C && cp <= 0x1F); }

bool is_alphanumeric(char32_t cp) {
  switch (utf8proc_category(static_cast<utf8proc_int32_t>(cp))) {
    case UTF8PROC_CATEGORY_LU:
    case UTF8PROC_CATEGORY_LL:
    case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM:
    case UTF8PROC_CATEGORY_LO:
    case UTF8PROC_CATEGORY_ND:
    case UTF8PROC_CATEGORY_NL:
    case UTF8PROC_CATEGORY_NO:
      return true;
    default:
      return false;
  }
}

std::string normalize(std::string_view s, NormalForm form) {
  bool ascii = true;
  for (char c : s) ascii = ascii && static_cast<uint8_t>(c) < 0x80;
  if (ascii) return std::string(s);  // every normal form of ASCII is itself
  int options = UTF8PROC_STABLE;
  const char* name = "NFC";
  switch (form) {
    case NormalForm::kNfc: options |= UTF8PROC_COMPOSE; break;
    case NormalForm::kNfd: options |= UTF8PROC_DECOMPOSE; name = "NFD"; break;
    case NormalForm::kNfkc: options |= UTF8PROC_COMPOSE | UTF8PROC_COMPAT; name = "NFKC"; break;
    case NormalForm::kNfkd: options |= UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT; name = "NFKD"; break;
  }
  utf8proc_uint8_t* dst = nullptr;
  const utf8proc_ssize_t n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(s.data()),
                                          static_cast<utf8proc_ssize_t>(s.size()), &dst,
                                          static_cast<utf8proc_option_t>(options));
  std::unique_ptr<utf8proc_uint8_t, void (*)(void*)> owned(dst, std::free);
  FP4MOE_CHECK(n >= 0) << name << " normalization of " << s.size() << " bytes failed: " << utf8proc_errmsg(n);
  return std::string(reinterpret_cast<const char*>(dst), static_cast<size_t>(n));
}

ByteLevelMap::ByteLevelMap() {
  char_to_byte_.fill(-1);
  int next_extra = 256;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
    const int cp = printable ? b : next_extra++;
    std::string utf8;
    append_utf8(utf8, static_cast<char32_t>(cp));
    byte_to_utf8_[b] = utf8;
    char_to_byte_[cp] = static_cast<int16_t>(b);
  }
}

const ByteLevelMap& ByteLevelMap::get() {
  static const ByteLevelMap map;
  return map;
}

std::string ByteLevelMap::encode(std::string_view raw) const {
  std::string out;
  out.reserve(raw.size() * 2);
  for (char c : raw) out += byte_to_utf8_[static_cast<uint8_t>(c)];
  return out;
}

}  // namespace fp4moe::engine::text
