// Token masks for structured outputs: the JSON-mode pushdown automaton, the vocabulary trie, the
// per-state mask cache and the compiler's LRU. See constraint.h; tests in tests/engine/test_constraint.cpp.
#include "engine/constraint.h"

#include <algorithm>
#include <numeric>
#include <string>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "engine/json_schema.h"
#include "format/json_file.h"

namespace fp4moe::engine {

// ---- JsonObjectAutomaton ------------------------------------------------------------------------
// State bits: [0, 6) lexical state, [6, 11) aux (hex digits / UTF-8 bytes / literal progress left),
// [11, 16) whitespace run, 16 in a key, [17, 23) depth, [23, 63) one bit a level: 1 object, 0 array.
namespace {

enum Lex : uint64_t {
  kTop,         // before the top-level '{'
  kValue,       // a value is due (after ':' or an array's ',')
  kObjOpen,     // after '{': a key or '}'
  kObjKey,      // after an object's ',': a key
  kColon,       // after a key
  kAfterValue,  // after a value in a container: ',' or its closing bracket
  kArrOpen,     // after '[': a value or ']'
  kString,
  kEscape,
  kHexFirst,   // after \u: the first hex digit ('d' may start a surrogate)
  kHexAfterD,  // after \ud: 0-7 plain, 8-B a high surrogate, C-F a lone low one (refused)
  kHex,        // aux: hex digits left
  kHigh,       // aux: hex digits of a high surrogate left; then its low half must follow
  kLowBackslash,
  kLowU,
  kLowD,
  kLowC,      // after \ud of the low half: C-F
  kUtf8,      // aux: continuation bytes left (80-BF)
  kUtf8E0,    // after E0: A0-BF, then 1 more
  kUtf8ED,    // after ED: 80-9F (no surrogates), then 1 more
  kUtf8F0,    // after F0: 90-BF, then 2 more
  kUtf8F4,    // after F4: 80-8F, then 2 more
  kNumMinus,  // after '-': a digit
  kNumZero,   // a leading 0
  kNumInt,
  kNumDot,  // after '.': a digit
  kNumFrac,
  kNumExp,      // after e/E: sign or digit
  kNumExpSign,  // after the sign: a digit
  kNumExpDigits,
  kLiteral,  // aux: literal (2 bits: true, false, null) << 3 | bytes matched
  kDone,
};

constexpr int kAuxShift = 6, kWsShift = 11, kKeyBit = 16, kDepthShift = 17, kStackShift = 23;
constexpr const char* kLiterals[] = {"true", "false", "null"};

struct JState {
  uint64_t lex, aux, ws, key, depth, stack;
  static JState of(uint64_t s) {
    return {s & 63,          (s >> kAuxShift) & 31, (s >> kWsShift) & 31, (s >> kKeyBit) & 1, (s >> kDepthShift) & 63,
            s >> kStackShift};
  }
  uint64_t pack() const {
    return lex | aux << kAuxShift | ws << kWsShift | key << kKeyBit | depth << kDepthShift | stack << kStackShift;
  }
  bool in_object() const { return depth > 0 && ((stack >> (depth - 1)) & 1) != 0; }
};

bool is_ws(uint8_t b) { return b == ' ' || b == '\t' || b == '\n' || b == '\r'; }

}  // namespace

JsonObjectAutomaton::JsonObjectAutomaton(int max_whitespace) : max_whitespace_(max_whitespace) {
  FP4MOE_CHECK(max_whitespace >= 0 && max_whitespace <= 31)
      << "json_object whitespace bound " << max_whitespace << " outside [0, 31]";
}

uint64_t JsonObjectAutomaton::start() const { return JState{kTop, 0, 0, 0, 0, 0}.pack(); }
bool JsonObjectAutomaton::accepting(uint64_t state) const { return (state & 63) == kDone; }
bool JsonObjectAutomaton::can_continue(uint64_t state) const { return (state & 63) != kDone; }

uint64_t JsonObjectAutomaton::step(uint64_t state, uint8_t b) const {
  JState s = JState::of(state);
  auto go = [&](uint64_t lex, uint64_t aux = 0) {
    s.lex = lex;
    s.aux = aux;
    s.ws = 0;
    return s.pack();
  };
  auto open = [&](bool object) -> uint64_t {
    if (s.depth >= static_cast<uint64_t>(kMaxDepth)) return kDead;
    if (object)
      s.stack |= uint64_t{1} << s.depth;
    else
      s.stack &= ~(uint64_t{1} << s.depth);
    ++s.depth;
    return go(object ? kObjOpen : kArrOpen);
  };
  auto close = [&](bool object) -> uint64_t {
    if (s.depth == 0 || s.in_object() != object) return kDead;
    --s.depth;
    return go(s.depth == 0 ? kDone : kAfterValue);
  };
  auto end_value = [&]() { return go(s.depth == 0 ? kDone : kAfterValue); };
  auto whitespace = [&]() -> uint64_t {
    if (s.ws >= static_cast<uint64_t>(max_whitespace_)) return kDead;
    ++s.ws;
    return s.pack();
  };
  // A value's first byte (kValue and kArrOpen).
  auto value = [&]() -> uint64_t {
    if (b == '"') {
      s.key = 0;
      return go(kString);
    }
    if (b == '{') return open(true);
    if (b == '[') return open(false);
    if (b == '-') return go(kNumMinus);
    if (b == '0') return go(kNumZero);
    if (b >= '1' && b <= '9') return go(kNumInt);
    for (uint64_t l = 0; l < 3; ++l) {
      if (b == static_cast<uint8_t>(kLiterals[l][0])) return go(kLiteral, l << 3 | 1);
    }
    return kDead;
  };
  // After a number's last possible byte: the number ends and `b` is read as what follows it.
  auto after_number = [&]() -> uint64_t {
    if (s.depth == 0) return kDead;
    return step(end_value(), b);
  };
  auto digit = [&]() { return b >= '0' && b <= '9'; };
  auto hex = [&]() { return digit() || (b >= 'a' && b <= 'f') || (b >= 'A' && b <= 'F'); };

  switch (s.lex) {
    case kTop:
      if (b == '{') return open(true);
      return is_ws(b) ? whitespace() : kDead;
    case kValue:
      if (is_ws(b)) return whitespace();
      return value();
    case kArrOpen:
      if (is_ws(b)) return whitespace();
      if (b == ']') return close(false);
      return value();
    case kObjOpen:
    case kObjKey:
      if (is_ws(b)) return whitespace();
      if (b == '}' && s.lex == kObjOpen) return close(true);
      if (b == '"') {
        s.key = 1;
        return go(kString);
      }
      return kDead;
    case kColon:
      if (is_ws(b)) return whitespace();
      return b == ':' ? go(kValue) : kDead;
    case kAfterValue:
      if (is_ws(b)) return whitespace();
      if (b == ',') return go(s.in_object() ? kObjKey : kValue);
      if (b == '}' || b == ']') return close(b == '}');
      return kDead;
    case kString:
      if (b == '"') return s.key ? go(kColon) : end_value();
      if (b == '\\') return go(kEscape);
      if (b < 0x20) return kDead;
      if (b < 0x80) return state;
      if (b >= 0xC2 && b <= 0xDF) return go(kUtf8, 1);
      if (b == 0xE0) return go(kUtf8E0);
      if (b == 0xED) return go(kUtf8ED);
      if (b >= 0xE1 && b <= 0xEF) return go(kUtf8, 2);
      if (b == 0xF0) return go(kUtf8F0);
      if (b >= 0xF1 && b <= 0xF3) return go(kUtf8, 3);
      if (b == 0xF4) return go(kUtf8F4);
      return kDead;
    case kUtf8:
      if ((b & 0xC0) != 0x80) return kDead;
      return s.aux > 1 ? go(kUtf8, s.aux - 1) : go(kString);
    case kUtf8E0: return b >= 0xA0 && b <= 0xBF ? go(kUtf8, 1) : kDead;
    case kUtf8ED: return b >= 0x80 && b <= 0x9F ? go(kUtf8, 1) : kDead;
    case kUtf8F0: return b >= 0x90 && b <= 0xBF ? go(kUtf8, 2) : kDead;
    case kUtf8F4: return b >= 0x80 && b <= 0x8F ? go(kUtf8, 2) : kDead;
    case kEscape:
      if (b == 'u') return go(kHexFirst);
      return std::string_view("\"\\/bfnrt").find(static_cast<char>(b)) != std::string_view::npos ? go(kString) : kDead;
    case kHexFirst:
      if (b == 'd' || b == 'D') return go(kHexAfterD);
      return hex() ? go(kHex, 3) : kDead;
    case kHexAfterD:
      if (b >= '0' && b <= '7') return go(kHex, 2);
      if ((b >= '8' && b <= '9') || (b >= 'a' && b <= 'b') || (b >= 'A' && b <= 'B')) return go(kHigh, 2);
      return kDead;
    case kHex:
      if (!hex()) return kDead;
      return s.aux > 1 ? go(kHex, s.aux - 1) : go(kString);
    case kHigh:
      if (!hex()) return kDead;
      return s.aux > 1 ? go(kHigh, s.aux - 1) : go(kLowBackslash);
    case kLowBackslash: return b == '\\' ? go(kLowU) : kDead;
    case kLowU: return b == 'u' ? go(kLowD) : kDead;
    case kLowD: return b == 'd' || b == 'D' ? go(kLowC) : kDead;
    case kLowC: return (b >= 'c' && b <= 'f') || (b >= 'C' && b <= 'F') ? go(kHex, 2) : kDead;
    case kNumMinus:
      if (b == '0') return go(kNumZero);
      return b >= '1' && b <= '9' ? go(kNumInt) : kDead;
    case kNumZero:
      if (b == '.') return go(kNumDot);
      if (b == 'e' || b == 'E') return go(kNumExp);
      return after_number();
    case kNumInt:
      if (digit()) return state;
      if (b == '.') return go(kNumDot);
      if (b == 'e' || b == 'E') return go(kNumExp);
      return after_number();
    case kNumDot: return digit() ? go(kNumFrac) : kDead;
    case kNumFrac:
      if (digit()) return state;
      if (b == 'e' || b == 'E') return go(kNumExp);
      return after_number();
    case kNumExp:
      if (b == '+' || b == '-') return go(kNumExpSign);
      return digit() ? go(kNumExpDigits) : kDead;
    case kNumExpSign: return digit() ? go(kNumExpDigits) : kDead;
    case kNumExpDigits: return digit() ? state : after_number();
    case kLiteral: {
      const uint64_t l = s.aux >> 3, i = s.aux & 7;
      const std::string_view lit = kLiterals[l];
      if (b != static_cast<uint8_t>(lit[i])) return kDead;
      return i + 1 == lit.size() ? end_value() : go(kLiteral, l << 3 | (i + 1));
    }
    default: return kDead;  // kDone: nothing may follow
  }
}

// ---- TokenVocab ---------------------------------------------------------------------------------

TokenVocab::TokenVocab(const Tokenizer& tokenizer) : vocab_size_(tokenizer.vocab_size()) {
  bytes_.resize(static_cast<size_t>(vocab_size_));
  for (TokenId id = 0; id < vocab_size_; ++id) {
    if (!tokenizer.is_special(id)) bytes_[static_cast<size_t>(id)] = tokenizer.token_bytes(id);
  }
  build_trie();
}

TokenVocab::TokenVocab(std::vector<std::string> token_bytes)
    : vocab_size_(static_cast<int32_t>(token_bytes.size())), bytes_(std::move(token_bytes)) {
  build_trie();
}

void TokenVocab::build_trie() {
  std::vector<TokenId> order;
  for (TokenId id = 0; id < vocab_size_; ++id) {
    if (!bytes_[static_cast<size_t>(id)].empty()) order.push_back(id);
  }
  std::sort(order.begin(), order.end(), [&](TokenId a, TokenId b) {
    return bytes_[static_cast<size_t>(a)] < bytes_[static_cast<size_t>(b)] ||
           (bytes_[static_cast<size_t>(a)] == bytes_[static_cast<size_t>(b)] && a < b);
  });
  // Sorted strings make a preorder trie: keep the path of the previous string, pop to the common
  // prefix, push the rest. A node's subtree ends where the next node of its depth or less begins.
  nodes_.push_back(Node{});
  std::vector<uint32_t> path{0};  // path[d] = node at depth d
  const std::string* prev = nullptr;
  for (TokenId id : order) {
    const std::string& s = bytes_[static_cast<size_t>(id)];
    size_t common = 0;
    if (prev != nullptr) {
      while (common < s.size() && common < prev->size() && s[common] == (*prev)[common]) ++common;
    }
    if (prev != nullptr && common == s.size() && common == prev->size()) {
      duplicates_.emplace_back(path.back(), id);
      continue;
    }
    path.resize(common + 1);
    for (size_t d = common; d < s.size(); ++d) {
      Node n;
      n.byte = static_cast<uint8_t>(s[d]);
      n.depth = static_cast<uint16_t>(std::min<size_t>(d + 1, 65535));
      FP4MOE_CHECK(d + 1 <= 65535) << "token " << id << " has " << s.size() << " bytes (> 65535)";
      nodes_.push_back(n);
      path.push_back(static_cast<uint32_t>(nodes_.size() - 1));
    }
    nodes_[path.back()].token = id;
    prev = &s;
  }
  for (const Node& n : nodes_) max_depth_ = std::max<uint32_t>(max_depth_, n.depth);
  // subtree_end: one forward scan; a node's subtree ends at the next node no deeper than it.
  std::vector<uint32_t> open;
  const auto n = static_cast<uint32_t>(nodes_.size());
  for (uint32_t i = 0; i < n; ++i) {
    while (!open.empty() && nodes_[open.back()].depth >= nodes_[i].depth) {
      nodes_[open.back()].subtree_end = i;
      open.pop_back();
    }
    open.push_back(i);
  }
  for (uint32_t i : open) nodes_[i].subtree_end = n;
}

// ---- TokenConstraint ----------------------------------------------------------------------------

TokenConstraint::TokenConstraint(std::shared_ptr<const ByteAutomaton> automaton,
                                 std::shared_ptr<const TokenVocab> vocab, std::string description)
    : automaton_(std::move(automaton)), vocab_(std::move(vocab)), description_(std::move(description)) {}

std::shared_ptr<const TokenMask> TokenConstraint::allowed(uint64_t state) const {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (auto it = masks_.find(state); it != masks_.end()) return it->second;
  }
  auto mask = std::make_shared<TokenMask>();
  mask->bits.assign((static_cast<size_t>(vocab_->vocab_size()) + 63) / 64, 0);
  const std::vector<TokenVocab::Node>& nodes = vocab_->nodes();
  std::vector<uint64_t> at_depth(vocab_->max_depth() + 1u, state);
  auto allow = [&](TokenId id) {
    mask->bits[static_cast<size_t>(id) / 64] |= uint64_t{1} << (static_cast<size_t>(id) % 64);
    ++mask->n_allowed;
  };
  // The walk: a node's prefix dies -> skip its subtree. The DFA case is written out so its step inlines
  // (a table load per node: ~2x faster than the virtual call on a 563k-node trie).
  auto walk = [&](auto&& step) {
    for (uint32_t i = 1; i < nodes.size();) {
      const TokenVocab::Node& n = nodes[i];
      const uint64_t t = step(at_depth[n.depth - 1u], n.byte);
      if (t == ByteAutomaton::kDead) {
        i = n.subtree_end;  // no token under this prefix can continue a match
        continue;
      }
      at_depth[n.depth] = t;
      if (n.token >= 0) allow(n.token);
      ++i;
    }
  };
  if (const auto* d = dynamic_cast<const DfaAutomaton*>(automaton_.get())) {
    const ByteDfa& dfa = d->dfa();
    walk([&dfa](uint64_t st, uint8_t b) {
      const int32_t t = dfa.step(static_cast<int32_t>(st), b);
      return t < 0 ? ByteAutomaton::kDead : static_cast<uint64_t>(t);
    });
  } else {
    walk([this](uint64_t st, uint8_t b) { return automaton_->step(st, b); });
  }
  for (auto [node, id] : vocab_->duplicates()) {
    if (mask->test(nodes[node].token)) allow(id);  // the same bytes as the node's own token
  }
  std::lock_guard<std::mutex> lock(mu_);
  // At most kMaxMasks (vocab / 8 bytes each: 19 KB at GLM's 154,880 tokens, 5 MB for all); when full the
  // cache starts over (a walk costs milliseconds; a regex reply rarely visits this many states).
  constexpr size_t kMaxMasks = 256;
  if (masks_.size() >= kMaxMasks) masks_.clear();
  return masks_.emplace(state, std::move(mask)).first->second;
}

uint64_t TokenConstraint::advance(uint64_t state, TokenId id) const {
  return vocab_->usable(id) ? advance(state, vocab_->bytes(id)) : ByteAutomaton::kDead;
}

uint64_t TokenConstraint::advance(uint64_t state, std::string_view bytes) const {
  for (char c : bytes) {
    state = automaton_->step(state, static_cast<uint8_t>(c));
    if (state == ByteAutomaton::kDead) break;
  }
  return state;
}

// ---- ConstraintCompiler -------------------------------------------------------------------------

ConstraintCompiler::ConstraintCompiler(const Tokenizer& tokenizer, ConstraintOptions options)
    : options_(std::move(options)), vocab_(std::make_shared<TokenVocab>(tokenizer)) {
  compile_regex("(?:" + options_.json_whitespace + ")", options_.limits);  // as schemas use it; fails early
}

std::shared_ptr<const TokenConstraint> ConstraintCompiler::compile(const ConstraintSpec& spec) {
  std::string key = std::to_string(static_cast<int>(spec.kind)) + '\n' + spec.text;
  for (const std::string& c : spec.choices) key += '\n' + std::to_string(c.size()) + ':' + c;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = lru_.begin(); it != lru_.end(); ++it) {
      if (it->first == key) {
        lru_.splice(lru_.begin(), lru_, it);
        return lru_.front().second;
      }
    }
  }
  std::shared_ptr<const ByteAutomaton> automaton;
  std::string what;
  auto shown = [](const std::string& s) { return s.size() <= 80 ? s : s.substr(0, 77) + "..."; };
  switch (spec.kind) {
    case ConstraintSpec::Kind::kRegex:
      automaton = std::make_shared<DfaAutomaton>(compile_regex(spec.text, options_.limits));
      what = "regex '" + shown(spec.text) + "'";
      break;
    case ConstraintSpec::Kind::kJsonSchema: {
      // Depth-bounded like request bodies (SGLang sends the schema as text, parsed only here): the
      // regex builder recurses per level.
      constexpr int kMaxSchemaTextDepth = 64;
      format::JsonParseFailure failure;
      const auto schema = format::try_parse_json<nlohmann::ordered_json>(spec.text, kMaxSchemaTextDepth, &failure);
      if (!schema) throw Error("the JSON schema: " + failure.message);
      const std::string regex = json_schema_to_regex(*schema, options_.json_whitespace);
      automaton = std::make_shared<DfaAutomaton>(compile_regex(regex, options_.limits));
      what = "JSON schema " + shown(spec.text);
      break;
    }
    case ConstraintSpec::Kind::kJsonObject:
      automaton = std::make_shared<JsonObjectAutomaton>(options_.json_object_max_whitespace);
      what = "JSON object";
      break;
    case ConstraintSpec::Kind::kChoice: {
      if (spec.choices.empty()) throw Error("the list of choices is empty");
      std::string regex;
      for (size_t i = 0; i < spec.choices.size(); ++i) {
        if (spec.choices[i].empty()) throw Error("choice " + std::to_string(i) + " is the empty string");
        regex += (i ? "|" : "") + ("(?:" + regex_escape(spec.choices[i]) + ")");
      }
      automaton = std::make_shared<DfaAutomaton>(compile_regex(regex, options_.limits));
      what = "one of " + std::to_string(spec.choices.size()) + " choices";
      break;
    }
  }
  auto compiled = std::make_shared<const TokenConstraint>(std::move(automaton), vocab_, std::move(what));
  std::lock_guard<std::mutex> lock(mu_);
  lru_.emplace_front(std::move(key), compiled);
  while (lru_.size() > std::max<size_t>(options_.cache_entries, 1)) lru_.pop_back();
  return compiled;
}

}  // namespace fp4moe::engine
