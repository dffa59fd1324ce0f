// Regex -> AST (parser) -> Thompson NFA over bytes -> DFA over byte classes -> live states only.
// See regex_dfa.h for the syntax and tests/engine/test_constraint.cpp for the tests.
#include "engine/regex_dfa.h"

#include <algorithm>
#include <bitset>
#include <unordered_map>
#include <unordered_set>

#include "core/error.h"

namespace fp4moe::engine {
namespace {

using ByteSet = std::bitset<256>;

struct CpRange {
  uint32_t lo = 0, hi = 0;
};

constexpr uint32_t kMaxCp = 0x10FFFF;
constexpr int32_t kMaxCount = 1000;  // the largest {n,m} bound (Python's re allows more; a DFA would not)
constexpr int kMaxNesting = 200;     // group nesting (the parser recurses)

std::string show_pattern(std::string_view p) {
  constexpr size_t kShown = 160;
  if (p.size() <= kShown) return "'" + std::string(p) + "'";
  return "'" + std::string(p.substr(0, kShown)) + "...' (" + std::to_string(p.size()) + " bytes)";
}

// The ranges sorted and merged; the complement over the Unicode scalar values.
std::vector<CpRange> normalized(std::vector<CpRange> r) {
  std::sort(r.begin(), r.end(), [](const CpRange& a, const CpRange& b) { return a.lo < b.lo; });
  std::vector<CpRange> out;
  for (const CpRange& x : r) {
    if (!out.empty() && x.lo <= out.back().hi + 1) {
      out.back().hi = std::max(out.back().hi, x.hi);
    } else {
      out.push_back(x);
    }
  }
  return out;
}
std::vector<CpRange> complement(const std::vector<CpRange>& r) {
  std::vector<CpRange> out;
  uint32_t next = 0;
  for (const CpRange& x : normalized(r)) {
    if (x.lo > next) out.push_back({next, x.lo - 1});
    next = x.hi + 1;
  }
  if (next <= kMaxCp) out.push_back({next, kMaxCp});
  return out;
}

int utf8_length(uint32_t cp) { return cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4; }
void utf8_encode(uint32_t cp, uint8_t* b) {
  switch (utf8_length(cp)) {
    case 1: b[0] = static_cast<uint8_t>(cp); break;
    case 2:
      b[0] = static_cast<uint8_t>(0xC0 | (cp >> 6));
      b[1] = static_cast<uint8_t>(0x80 | (cp & 0x3F));
      break;
    case 3:
      b[0] = static_cast<uint8_t>(0xE0 | (cp >> 12));
      b[1] = static_cast<uint8_t>(0x80 | ((cp >> 6) & 0x3F));
      b[2] = static_cast<uint8_t>(0x80 | (cp & 0x3F));
      break;
    default:
      b[0] = static_cast<uint8_t>(0xF0 | (cp >> 18));
      b[1] = static_cast<uint8_t>(0x80 | ((cp >> 12) & 0x3F));
      b[2] = static_cast<uint8_t>(0x80 | ((cp >> 6) & 0x3F));
      b[3] = static_cast<uint8_t>(0x80 | (cp & 0x3F));
  }
}

// A code point range (one encoded length, no surrogates) as sequences of byte ranges: split until
// every continuation byte either spans its whole 0x80-0xBF range or is fixed, then pair lo's and hi's
// bytes (the construction RE2 and Rust's utf8-ranges use).
using ByteRangeSeq = std::vector<std::pair<uint8_t, uint8_t>>;
void utf8_sequences(uint32_t lo, uint32_t hi, std::vector<ByteRangeSeq>& out) {
  for (uint32_t edge : {0x7Fu, 0x7FFu, 0xFFFFu}) {
    if (lo <= edge && hi > edge) {
      utf8_sequences(lo, edge, out);
      utf8_sequences(edge + 1, hi, out);
      return;
    }
  }
  const int n = utf8_length(lo);
  for (int i = 1; i < n; ++i) {
    const uint32_t m = (1u << (6 * i)) - 1;
    if ((lo & ~m) != (hi & ~m)) {
      if ((lo & m) != 0) {
        utf8_sequences(lo, lo | m, out);
        utf8_sequences((lo | m) + 1, hi, out);
        return;
      }
      if ((hi & m) != m) {
        utf8_sequences(lo, (hi & ~m) - 1, out);
        utf8_sequences(hi & ~m, hi, out);
        return;
      }
    }
  }
  uint8_t a[4], b[4];
  utf8_encode(lo, a);
  utf8_encode(hi, b);
  ByteRangeSeq seq;
  for (int i = 0; i < n; ++i) seq.emplace_back(a[i], b[i]);
  out.push_back(std::move(seq));
}

struct Node {
  enum class Kind : uint8_t { kEmpty, kBytes, kSeq, kAlt, kRepeat };
  Kind kind = Kind::kEmpty;
  ByteSet bytes;
  std::vector<int32_t> kids;
  int32_t min = 0, max = 0;  // kRepeat; max -1: unbounded
};

class Parser {
 public:
  explicit Parser(std::string_view p) : p_(p) {}

  int32_t parse() {
    if (!p_.empty() && p_[0] == '^') i_ = 1;
    const int32_t root = parse_alt(0);
    if (i_ < p_.size()) fail(i_, "unbalanced ')'");
    return root;
  }
  std::vector<Node> nodes;

 private:
  [[noreturn]] void fail(size_t at, const std::string& what) const {
    throw Error("regex: " + what + " at offset " + std::to_string(at) + " of " + show_pattern(p_));
  }
  bool at_end() const { return i_ >= p_.size(); }

  int32_t add(Node n) {
    nodes.push_back(std::move(n));
    return static_cast<int32_t>(nodes.size() - 1);
  }
  int32_t add_list(Node::Kind kind, std::vector<int32_t> kids) {
    if (kids.empty()) return add(Node{});
    if (kids.size() == 1) return kids[0];
    Node n;
    n.kind = kind;
    n.kids = std::move(kids);
    return add(std::move(n));
  }
  int32_t add_bytes(const ByteSet& s) {
    Node n;
    n.kind = Node::Kind::kBytes;
    n.bytes = s;
    return add(std::move(n));
  }

  int32_t parse_alt(int depth) {
    std::vector<int32_t> alts{parse_seq(depth)};
    while (!at_end() && p_[i_] == '|') {
      ++i_;
      alts.push_back(parse_seq(depth));
    }
    return add_list(Node::Kind::kAlt, std::move(alts));
  }

  int32_t parse_seq(int depth) {
    std::vector<int32_t> items;
    while (!at_end() && p_[i_] != '|' && p_[i_] != ')') {
      if (p_[i_] == '$') {
        if (i_ + 1 != p_.size()) fail(i_, "'$' is supported only at the end (the whole text must match)");
        ++i_;
        continue;
      }
      items.push_back(parse_repeat(depth));
    }
    return add_list(Node::Kind::kSeq, std::move(items));
  }

  // {n}, {n,}, {,m}, {n,m} at i_; false (nothing consumed) when the brace is not a quantifier.
  bool parse_counted(int32_t& lo, int32_t& hi) {
    size_t j = i_ + 1;
    auto number = [&](int32_t& v) {
      const size_t from = j;
      int64_t x = 0;
      while (j < p_.size() && p_[j] >= '0' && p_[j] <= '9') {
        x = std::min<int64_t>(x * 10 + (p_[j] - '0'), int64_t{1} << 40);
        ++j;
      }
      v = static_cast<int32_t>(std::min<int64_t>(x, kMaxCount + 1));
      return j > from;
    };
    int32_t a = 0, b = -1;
    const bool has_a = number(a);
    if (j < p_.size() && p_[j] == '}') {
      if (!has_a) return false;
      b = a;
    } else if (j < p_.size() && p_[j] == ',') {
      ++j;
      const bool has_b = number(b);
      if (!has_b) b = -1;
      if (!has_a) a = 0;
      if (j >= p_.size() || p_[j] != '}') return false;  // {,} is {0,} (Python's re)
    } else {
      return false;
    }
    if (a > kMaxCount || b > kMaxCount)
      fail(i_, "a counted repetition above " + std::to_string(kMaxCount) + " is not supported");
    if (b >= 0 && b < a) fail(i_, "repetition {" + std::to_string(a) + "," + std::to_string(b) + "} has min > max");
    lo = a;
    hi = b;
    i_ = j + 1;
    return true;
  }

  int32_t parse_repeat(int depth) {
    int32_t atom = parse_atom(depth);
    int n_stacked = 0;  // a** ... : each one nests the NFA build a level deeper
    while (!at_end()) {
      const char c = p_[i_];
      int32_t lo = 0, hi = 0;
      if (c == '*') {
        lo = 0, hi = -1, ++i_;
      } else if (c == '+') {
        lo = 1, hi = -1, ++i_;
      } else if (c == '?') {
        lo = 0, hi = 1, ++i_;
      } else if (c != '{' || !parse_counted(lo, hi)) {
        break;
      }
      if (!at_end() && p_[i_] == '?') {
        ++i_;  // lazy: the same language
      } else if (!at_end() && p_[i_] == '+') {
        fail(i_, "possessive quantifiers are not supported");
      }
      if (++n_stacked > 8) fail(i_, "more than 8 quantifiers on one atom");
      Node n;
      n.kind = Node::Kind::kRepeat;
      n.kids = {atom};
      n.min = lo;
      n.max = hi;
      atom = add(std::move(n));
    }
    return atom;
  }

  uint32_t decode_utf8() {
    const auto b0 = static_cast<uint8_t>(p_[i_]);
    const int n = b0 < 0x80 ? 1 : (b0 >> 5) == 6 ? 2 : (b0 >> 4) == 14 ? 3 : (b0 >> 3) == 30 ? 4 : 0;
    if (n == 0 || i_ + n > p_.size()) fail(i_, "invalid UTF-8 in the pattern");
    uint32_t cp = n == 1 ? b0 : n == 2 ? (b0 & 0x1F) : n == 3 ? (b0 & 0x0F) : (b0 & 0x07);
    for (int k = 1; k < n; ++k) {
      const auto b = static_cast<uint8_t>(p_[i_ + k]);
      if ((b & 0xC0) != 0x80) fail(i_, "invalid UTF-8 in the pattern");
      cp = (cp << 6) | (b & 0x3F);
    }
    i_ += n;
    return cp;
  }

  uint32_t hex(int n_digits) {
    if (i_ + n_digits > p_.size()) fail(i_, "expected " + std::to_string(n_digits) + " hex digits");
    uint32_t v = 0;
    for (int k = 0; k < n_digits; ++k) {
      const char c = p_[i_ + k];
      const int d = c >= '0' && c <= '9'   ? c - '0'
                    : c >= 'a' && c <= 'f' ? c - 'a' + 10
                    : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                           : -1;
      if (d < 0) fail(i_ + k, "expected a hex digit");
      v = v * 16 + static_cast<uint32_t>(d);
    }
    i_ += n_digits;
    if (v > kMaxCp || (v >= 0xD800 && v <= 0xDFFF)) fail(i_, "escape names no Unicode scalar value");
    return v;
  }

  // After a backslash: true with `set` for a class escape (\d ...), false with `cp` for one character.
  bool parse_escape(std::vector<CpRange>& set, uint32_t& cp) {
    if (at_end()) fail(i_ - 1, "the pattern ends with a backslash");
    const size_t at = i_ - 1;
    const char c = p_[i_];
    static const std::vector<CpRange> kDigit = {{'0', '9'}};
    static const std::vector<CpRange> kWord = {{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}};
    static const std::vector<CpRange> kSpace = {{'\t', '\r'}, {' ', ' '}};
    auto cls = [&](const std::vector<CpRange>& r, bool negate) {
      ++i_;
      set = negate ? complement(r) : r;
      return true;
    };
    switch (c) {
      case 'd': return cls(kDigit, false);
      case 'D': return cls(kDigit, true);
      case 'w': return cls(kWord, false);
      case 'W': return cls(kWord, true);
      case 's': return cls(kSpace, false);
      case 'S': return cls(kSpace, true);
      case 'n': cp = '\n'; break;
      case 't': cp = '\t'; break;
      case 'r': cp = '\r'; break;
      case 'f': cp = '\f'; break;
      case 'v': cp = '\v'; break;
      case 'a': cp = 0x07; break;
      case '0': {  // \0, \0o, \0oo: octal, as Python's re
        ++i_;
        cp = 0;
        for (int k = 0; k < 2 && !at_end() && p_[i_] >= '0' && p_[i_] <= '7'; ++k)
          cp = cp * 8 + static_cast<uint32_t>(p_[i_++] - '0');
        return false;
      }
      case 'x':
        ++i_;
        cp = hex(2);
        return false;
      case 'u':
        ++i_;
        cp = hex(4);
        return false;
      case 'U':
        ++i_;
        cp = hex(8);
        return false;
      case 'b':
      case 'B': fail(at, "word boundaries (\\b, \\B) are not supported");
      case 'A':
      case 'Z':
      case 'z': fail(at, "\\A / \\Z are not supported (the whole text must match: use ^ / $ or nothing)");
      case 'p':
      case 'P': fail(at, "Unicode property classes (\\p{...}) are not supported");
      default:
        if (c >= '1' && c <= '9') fail(at, "backreferences are not supported");
        if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) fail(at, std::string("unknown escape \\") + c);
        cp = decode_utf8();
        return false;
    }
    ++i_;
    return false;
  }

  int32_t parse_class() {
    const size_t open = i_;
    ++i_;  // '['
    bool negate = false;
    if (!at_end() && p_[i_] == '^') negate = true, ++i_;
    std::vector<CpRange> ranges;
    bool first = true;
    while (true) {
      if (at_end()) fail(open, "missing ']'");
      if (p_[i_] == ']' && !first) break;
      first = false;
      uint32_t lo = 0;
      if (p_[i_] == '\\') {
        ++i_;
        std::vector<CpRange> set;
        if (parse_escape(set, lo)) {
          ranges.insert(ranges.end(), set.begin(), set.end());
          continue;
        }
      } else {
        lo = decode_utf8();
      }
      uint32_t hi = lo;
      if (i_ + 1 < p_.size() && p_[i_] == '-' && p_[i_ + 1] != ']') {
        const size_t dash = i_;
        ++i_;
        if (p_[i_] == '\\') {
          ++i_;
          std::vector<CpRange> set;
          if (parse_escape(set, hi)) fail(dash, "a class escape cannot end a range");
        } else {
          hi = decode_utf8();
        }
        if (hi < lo) fail(dash, "bad character range (end before start)");
      }
      ranges.push_back({lo, hi});
    }
    ++i_;  // ']'
    return add_codepoints(negate ? complement(ranges) : normalized(ranges));
  }

  // A set of code points (surrogates skipped) as an alternation of UTF-8 byte sequences.
  int32_t add_codepoints(const std::vector<CpRange>& ranges) {
    std::vector<ByteRangeSeq> seqs;
    for (const CpRange& r : ranges) {
      if (r.lo <= 0xDFFF && r.hi >= 0xD800) {
        if (r.lo < 0xD800) utf8_sequences(r.lo, 0xD7FF, seqs);
        if (r.hi > 0xDFFF) utf8_sequences(0xE000, r.hi, seqs);
      } else {
        utf8_sequences(r.lo, r.hi, seqs);
      }
    }
    ByteSet single;
    std::vector<int32_t> alts;
    for (const ByteRangeSeq& seq : seqs) {
      if (seq.size() == 1) {
        for (int b = seq[0].first; b <= seq[0].second; ++b) single.set(static_cast<size_t>(b));
        continue;
      }
      std::vector<int32_t> items;
      for (auto [a, b] : seq) {
        ByteSet s;
        for (int x = a; x <= b; ++x) s.set(static_cast<size_t>(x));
        items.push_back(add_bytes(s));
      }
      alts.push_back(add_list(Node::Kind::kSeq, std::move(items)));
    }
    if (single.any()) alts.insert(alts.begin(), add_bytes(single));
    if (alts.empty()) {
      // An empty class ([^\x00-\x{10FFFF}]) matches nothing: a byte set with no byte.
      return add_bytes(ByteSet{});
    }
    return add_list(Node::Kind::kAlt, std::move(alts));
  }

  int32_t add_literal(uint32_t cp) {
    uint8_t b[4];
    utf8_encode(cp, b);
    std::vector<int32_t> items;
    for (int k = 0; k < utf8_length(cp); ++k) items.push_back(add_bytes(ByteSet().set(b[k])));
    return add_list(Node::Kind::kSeq, std::move(items));
  }

  int32_t parse_atom(int depth) {
    const char c = p_[i_];
    switch (c) {
      case '(': {
        const size_t open = i_;
        if (depth >= kMaxNesting) fail(i_, "groups nested deeper than " + std::to_string(kMaxNesting));
        ++i_;
        if (p_.substr(i_, 2) == "?:") {
          i_ += 2;
        } else if (p_.substr(i_, 3) == "?P<" ||
                   (p_.substr(i_, 2) == "?<" && p_.substr(i_, 3) != "?<=" && p_.substr(i_, 3) != "?<!")) {
          const size_t close = p_.find('>', i_);
          if (close == std::string_view::npos) fail(open, "unterminated group name");
          i_ = close + 1;
        } else if (!at_end() && p_[i_] == '?') {
          fail(open, "lookaround, inline flags and other (?...) groups are not supported");
        }
        const int32_t inner = parse_alt(depth + 1);
        if (at_end() || p_[i_] != ')') fail(open, "missing ')'");
        ++i_;
        return inner;
      }
      case '[': return parse_class();
      case '.': ++i_; return add_codepoints({{0, '\n' - 1}, {'\n' + 1, kMaxCp}});
      case '*':
      case '+':
      case '?': fail(i_, std::string("nothing to repeat before '") + c + "'");
      case '^': fail(i_, "'^' is supported only at the start (the whole text must match)");
      case '\\': {
        ++i_;
        std::vector<CpRange> set;
        uint32_t cp = 0;
        if (parse_escape(set, cp)) return add_codepoints(normalized(set));
        return add_literal(cp);
      }
      default: return add_literal(decode_utf8());
    }
  }

  std::string_view p_;
  size_t i_ = 0;
};

// Thompson NFA: a state reads one byte of `sets[set]` to `out`, or (set -1) moves on `eps` for free.
struct Nfa {
  struct State {
    int32_t set = -1;
    int32_t out = -1;
    std::vector<int32_t> eps;
  };
  std::vector<State> states;
  std::vector<ByteSet> sets;
  int64_t limit = 0;
  std::string_view pattern;

  int32_t add() {
    if (static_cast<int64_t>(states.size()) >= limit)
      throw Error("regex: the automaton needs more than " + std::to_string(limit) + " NFA states for " +
                  show_pattern(pattern) + "; lower its counted repetitions");
    states.emplace_back();
    return static_cast<int32_t>(states.size() - 1);
  }
  void link(int32_t from, int32_t to) { states[static_cast<size_t>(from)].eps.push_back(to); }

  // Returns {start, end}; end has no outgoing moves yet.
  std::pair<int32_t, int32_t> build(const std::vector<Node>& nodes, int32_t id) {
    const Node& n = nodes[static_cast<size_t>(id)];
    switch (n.kind) {
      case Node::Kind::kEmpty: {
        const int32_t s = add();
        return {s, s};
      }
      case Node::Kind::kBytes: {
        const int32_t s = add(), e = add();
        sets.push_back(n.bytes);
        states[static_cast<size_t>(s)].set = static_cast<int32_t>(sets.size() - 1);
        states[static_cast<size_t>(s)].out = e;
        return {s, e};
      }
      case Node::Kind::kSeq: {
        auto [s, e] = build(nodes, n.kids[0]);
        for (size_t k = 1; k < n.kids.size(); ++k) {
          auto [s2, e2] = build(nodes, n.kids[k]);
          link(e, s2);
          e = e2;
        }
        return {s, e};
      }
      case Node::Kind::kAlt: {
        const int32_t s = add(), e = add();
        for (int32_t kid : n.kids) {
          auto [s2, e2] = build(nodes, kid);
          link(s, s2);
          link(e2, e);
        }
        return {s, e};
      }
      case Node::Kind::kRepeat: {
        const int32_t s = add();
        int32_t e = s;
        for (int32_t k = 0; k < n.min; ++k) {
          auto [s2, e2] = build(nodes, n.kids[0]);
          link(e, s2);
          e = e2;
        }
        if (n.max < 0) {
          const int32_t hub = add();
          link(e, hub);
          auto [s2, e2] = build(nodes, n.kids[0]);
          link(hub, s2);
          link(e2, hub);
          return {s, hub};
        }
        std::vector<int32_t> skips;
        for (int32_t k = n.min; k < n.max; ++k) {
          auto [s2, e2] = build(nodes, n.kids[0]);
          skips.push_back(e);
          link(e, s2);
          e = e2;
        }
        const int32_t fin = add();
        link(e, fin);
        for (int32_t from : skips) link(from, fin);
        return {s, fin};
      }
    }
    return {-1, -1};
  }
};

struct VecHash {
  size_t operator()(const std::vector<int32_t>& v) const {
    uint64_t h = 1469598103934665603ull;
    for (int32_t x : v) h = (h ^ static_cast<uint32_t>(x)) * 1099511628211ull;
    return static_cast<size_t>(h);
  }
};

}  // namespace

ByteDfa compile_regex(std::string_view pattern, const RegexLimits& limits) {
  Parser parser(pattern);
  const int32_t root = parser.parse();
  Nfa nfa;
  nfa.limit = limits.max_nfa_states;
  nfa.pattern = pattern;
  const auto [nfa_start, nfa_end] = nfa.build(parser.nodes, root);
  const int32_t nfa_accept = nfa_end;  // (lambdas below capture it: not a structured binding)

  // Byte classes: bytes no set tells apart share a class (JSON-schema regexes have a few dozen).
  std::vector<int32_t> class_of(256, 0);
  int32_t n_classes = 1;
  std::unordered_set<ByteSet> distinct(nfa.sets.begin(), nfa.sets.end());
  for (const ByteSet& s : distinct) {
    std::unordered_map<int64_t, int32_t> split;
    int32_t n = 0;
    std::vector<int32_t> next(256);
    for (int b = 0; b < 256; ++b) {
      const int64_t key = int64_t{class_of[static_cast<size_t>(b)]} * 2 + (s.test(static_cast<size_t>(b)) ? 1 : 0);
      auto [it, added] = split.emplace(key, n);
      if (added) ++n;
      next[static_cast<size_t>(b)] = it->second;
    }
    class_of = std::move(next);
    n_classes = n;
  }
  std::vector<int> rep(static_cast<size_t>(n_classes), -1);
  for (int b = 255; b >= 0; --b) rep[static_cast<size_t>(class_of[static_cast<size_t>(b)])] = b;

  // Subset construction. A DFA state is the sorted set of the closure's byte-reading states, plus the
  // accept state when the closure reaches it.
  std::unordered_map<std::vector<int32_t>, int32_t, VecHash> ids;
  std::vector<std::vector<int32_t>> dstates;
  std::vector<int32_t> dnext;  // [state * n_classes]
  std::vector<uint32_t> stamp(nfa.states.size(), 0);
  uint32_t epoch = 0;
  std::vector<int32_t> stack;
  int64_t visits = 0;
  auto charge = [&](size_t n) {
    visits += static_cast<int64_t>(n);
    if (visits > limits.max_work)
      throw Error("regex: compiling " + show_pattern(pattern) + " takes more than " + std::to_string(limits.max_work) +
                  " NFA state visits (" + std::to_string(dstates.size()) + " DFA states so far); simplify the pattern");
  };
  auto closure = [&](const std::vector<int32_t>& from) {
    ++epoch;
    std::vector<int32_t> key;
    stack.assign(from.begin(), from.end());
    for (int32_t s : from) stamp[static_cast<size_t>(s)] = epoch;
    while (!stack.empty()) {
      const int32_t s = stack.back();
      stack.pop_back();
      const Nfa::State& st = nfa.states[static_cast<size_t>(s)];
      if (st.set >= 0 || s == nfa_accept) key.push_back(s);
      for (int32_t t : st.eps) {
        if (stamp[static_cast<size_t>(t)] != epoch) {
          stamp[static_cast<size_t>(t)] = epoch;
          stack.push_back(t);
        }
      }
    }
    std::sort(key.begin(), key.end());
    charge(key.size() + from.size());
    return key;
  };
  auto intern = [&](std::vector<int32_t> key) -> int32_t {
    if (key.empty()) return ByteDfa::kDead;
    auto it = ids.find(key);
    if (it != ids.end()) return it->second;
    if (static_cast<int64_t>(dstates.size()) >= limits.max_dfa_states)
      throw Error("regex: the automaton needs more than " + std::to_string(limits.max_dfa_states) + " DFA states for " +
                  show_pattern(pattern) +
                  "; simplify the pattern (counted repetitions of alternatives multiply states)");
    const auto id = static_cast<int32_t>(dstates.size());
    ids.emplace(key, id);
    dstates.push_back(std::move(key));
    return id;
  };
  intern(closure({nfa_start}));
  std::vector<int32_t> targets;
  for (size_t d = 0; d < dstates.size(); ++d) {
    dnext.resize((d + 1) * static_cast<size_t>(n_classes), ByteDfa::kDead);
    for (int32_t c = 0; c < n_classes; ++c) {
      targets.clear();
      charge(dstates[d].size());
      const auto b = static_cast<size_t>(rep[static_cast<size_t>(c)]);
      for (int32_t s : dstates[d]) {
        const Nfa::State& st = nfa.states[static_cast<size_t>(s)];
        if (st.set >= 0 && nfa.sets[static_cast<size_t>(st.set)].test(b)) targets.push_back(st.out);
      }
      if (targets.empty()) continue;
      const int32_t t = intern(closure(targets));
      dnext[d * static_cast<size_t>(n_classes) + static_cast<size_t>(c)] = t;
    }
  }

  // Keep the states from which an accepting state is reachable.
  const size_t n = dstates.size();
  std::vector<std::vector<int32_t>> preds(n);
  std::vector<uint8_t> live(n, 0);
  std::vector<int32_t> work;
  for (size_t d = 0; d < n; ++d) {
    for (int32_t c = 0; c < n_classes; ++c) {
      const int32_t t = dnext[d * static_cast<size_t>(n_classes) + static_cast<size_t>(c)];
      if (t >= 0) preds[static_cast<size_t>(t)].push_back(static_cast<int32_t>(d));
    }
    if (std::binary_search(dstates[d].begin(), dstates[d].end(), nfa_accept)) {
      live[d] = 1;
      work.push_back(static_cast<int32_t>(d));
    }
  }
  while (!work.empty()) {
    const int32_t d = work.back();
    work.pop_back();
    for (int32_t p : preds[static_cast<size_t>(d)]) {
      if (!live[static_cast<size_t>(p)]) {
        live[static_cast<size_t>(p)] = 1;
        work.push_back(p);
      }
    }
  }
  if (!live[0]) throw Error("regex: " + show_pattern(pattern) + " matches nothing");
  std::vector<int32_t> renum(n, ByteDfa::kDead);
  int32_t n_live = 0;
  for (size_t d = 0; d < n; ++d) {
    if (live[d]) renum[d] = n_live++;
  }
  ByteDfa dfa;
  dfa.n_classes_ = n_classes;
  for (int b = 0; b < 256; ++b) dfa.class_of_[b] = static_cast<uint8_t>(class_of[static_cast<size_t>(b)]);
  dfa.next_.assign(static_cast<size_t>(n_live) * static_cast<size_t>(n_classes), ByteDfa::kDead);
  dfa.accepting_.assign(static_cast<size_t>(n_live), 0);
  dfa.can_continue_.assign(static_cast<size_t>(n_live), 0);
  for (size_t d = 0; d < n; ++d) {
    if (!live[d]) continue;
    const auto r = static_cast<size_t>(renum[d]);
    dfa.accepting_[r] = std::binary_search(dstates[d].begin(), dstates[d].end(), nfa_accept) ? 1 : 0;
    for (int32_t c = 0; c < n_classes; ++c) {
      const int32_t t = dnext[d * static_cast<size_t>(n_classes) + static_cast<size_t>(c)];
      const int32_t rt = t >= 0 ? renum[static_cast<size_t>(t)] : ByteDfa::kDead;
      dfa.next_[r * static_cast<size_t>(n_classes) + static_cast<size_t>(c)] = rt;
      if (rt >= 0) dfa.can_continue_[r] = 1;
    }
  }
  return dfa;
}

bool ByteDfa::matches(std::string_view text) const {
  int32_t s = start();
  for (char c : text) {
    s = step(s, static_cast<uint8_t>(c));
    if (s == kDead) return false;
  }
  return accepting(s);
}

std::string regex_escape(std::string_view text) {
  std::string out;
  for (char c : text) {
    if (std::string_view(".^$*+?()[]{}|\\-/").find(c) != std::string_view::npos) out += '\\';
    out += c;
  }
  return out;
}

}  // namespace fp4moe::engine
