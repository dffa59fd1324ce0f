// engine::TokenConstraint: structured outputs (constrained decoding), what SGLang's `regex` /
// `json_schema`, vLLM's `guided_*` and OpenAI's `response_format` ask for. A request's reply must be
// a whole match of a byte automaton; at each step the sampler may only draw tokens whose bytes keep
// the automaton alive (TokenMask), and end-of-sequence only where it accepts.
//
//   ConstraintCompiler compiler(tokenizer, {});                // once per server (the vocabulary trie)
//   auto c = compiler.compile({ConstraintSpec::Kind::kRegex, "regex", "(yes|no)"});   // LRU-cached
//   uint64_t s = c->start();
//   const TokenMask& m = *c->allowed(s);   // m.test(id): id's bytes keep a match possible
//   s = c->advance(s, id);                 // after drawing id
//   c->accepting(s), c->can_continue(s);   // EOS allowed / the reply cannot go on (the request ends)
//
// The automata: a regex (engine/regex_dfa.h) for kRegex, kJsonSchema (engine/json_schema.h turns the
// schema into a regex) and kChoice (the choices as an alternation of literals); kJsonObject (OpenAI's
// JSON mode: any JSON object) is a pushdown automaton (JSON is not regular): JsonObjectAutomaton.
// Masks are computed by walking the vocabulary's byte trie from a state (a subtree is skipped as soon
// as its prefix dies) and cached per automaton state, so a state costs one walk for all requests.
// Special tokens never match (EOS is the sampler's, allowed where the automaton accepts).
//
// Tested by tests/engine/test_constraint.cpp (regexes, schemas, JSON mode, masks against brute force)
// and through the engine and server (test_scheduler.cpp, tests/server).
#pragma once

#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "engine/regex_dfa.h"
#include "engine/tokenizer.h"

namespace fp4moe::engine {

// What a request asked for; `param` names the request field (errors name it).
struct ConstraintSpec {
  enum class Kind : uint8_t { kRegex, kJsonSchema, kJsonObject, kChoice };
  Kind kind = Kind::kRegex;
  std::string param;
  std::string text;                  // kRegex: the pattern; kJsonSchema: the schema as JSON text
  std::vector<std::string> choices;  // kChoice
};

// A deterministic byte automaton whose state fits 64 bits. step() returns kDead when no continuation
// of the bytes so far can be accepted, so every live state can be completed.
class ByteAutomaton {
 public:
  static constexpr uint64_t kDead = ~uint64_t{0};
  virtual ~ByteAutomaton() = default;
  virtual uint64_t start() const = 0;
  virtual uint64_t step(uint64_t state, uint8_t byte) const = 0;
  virtual bool accepting(uint64_t state) const = 0;
  virtual bool can_continue(uint64_t state) const = 0;
};

class DfaAutomaton final : public ByteAutomaton {
 public:
  explicit DfaAutomaton(ByteDfa dfa) : dfa_(std::move(dfa)) {}
  uint64_t start() const override { return static_cast<uint64_t>(dfa_.start()); }
  uint64_t step(uint64_t state, uint8_t byte) const override {
    const int32_t t = dfa_.step(static_cast<int32_t>(state), byte);
    return t < 0 ? kDead : static_cast<uint64_t>(t);
  }
  bool accepting(uint64_t state) const override { return dfa_.accepting(static_cast<int32_t>(state)); }
  bool can_continue(uint64_t state) const override { return dfa_.can_continue(static_cast<int32_t>(state)); }
  const ByteDfa& dfa() const { return dfa_; }

 private:
  ByteDfa dfa_;
};

// OpenAI JSON mode: one JSON object (RFC 8259 syntax, strings valid UTF-8), nested at most kMaxDepth
// containers, at most max_whitespace whitespace bytes in a row between tokens, nothing after the
// closing brace.
class JsonObjectAutomaton final : public ByteAutomaton {
 public:
  static constexpr int kMaxDepth = 40;
  explicit JsonObjectAutomaton(int max_whitespace);
  uint64_t start() const override;
  uint64_t step(uint64_t state, uint8_t byte) const override;
  bool accepting(uint64_t state) const override;
  bool can_continue(uint64_t state) const override;

 private:
  int max_whitespace_;
};

// The tokenizer's tokens as bytes in a trie laid out in preorder (a subtree is a contiguous range),
// special tokens and tokens without bytes left out.
class TokenVocab {
 public:
  explicit TokenVocab(const Tokenizer& tokenizer);
  // Token id -> its bytes (empty: never allowed), e.g. a synthetic vocabulary for bench_constraint.
  explicit TokenVocab(std::vector<std::string> token_bytes);
  int32_t vocab_size() const { return vocab_size_; }
  const std::string& bytes(TokenId id) const { return bytes_[static_cast<size_t>(id)]; }
  bool usable(TokenId id) const { return id >= 0 && id < vocab_size_ && !bytes_[static_cast<size_t>(id)].empty(); }

  struct Node {
    uint8_t byte = 0;
    uint16_t depth = 0;        // bytes from the root
    int32_t token = -1;        // the token these bytes spell (-1: none)
    uint32_t subtree_end = 0;  // one past this node's last descendant
  };
  const std::vector<Node>& nodes() const { return nodes_; }  // nodes_[0] is the root
  uint32_t max_depth() const { return max_depth_; }          // the longest token's bytes
  const std::vector<std::pair<uint32_t, TokenId>>& duplicates() const { return duplicates_; }

 private:
  void build_trie();
  int32_t vocab_size_ = 0;
  std::vector<std::string> bytes_;
  std::vector<Node> nodes_;
  uint32_t max_depth_ = 0;
  std::vector<std::pair<uint32_t, TokenId>> duplicates_;  // (node, token) of tokens spelling the same bytes
};

struct TokenMask {
  std::vector<uint64_t> bits;  // [ceil(vocab / 64)]
  int64_t n_allowed = 0;
  bool test(TokenId id) const {
    const auto i = static_cast<size_t>(id);
    return id >= 0 && i / 64 < bits.size() && ((bits[i / 64] >> (i % 64)) & 1) != 0;
  }
};

class TokenConstraint {
 public:
  TokenConstraint(std::shared_ptr<const ByteAutomaton> automaton, std::shared_ptr<const TokenVocab> vocab,
                  std::string description);
  uint64_t start() const { return automaton_->start(); }
  // The tokens allowed in `state` (cached; safe to call from several threads).
  std::shared_ptr<const TokenMask> allowed(uint64_t state) const;
  // The state after `id`'s bytes (ByteAutomaton::kDead when id is not allowed there).
  uint64_t advance(uint64_t state, TokenId id) const;
  // The state after `bytes` (kDead once they leave every match).
  uint64_t advance(uint64_t state, std::string_view bytes) const;
  bool accepting(uint64_t state) const { return automaton_->accepting(state); }
  bool can_continue(uint64_t state) const { return automaton_->can_continue(state); }
  const std::string& description() const { return description_; }  // e.g. "regex '(yes|no)'"
  const ByteAutomaton& automaton() const { return *automaton_; }
  const TokenVocab& vocab() const { return *vocab_; }

 private:
  std::shared_ptr<const ByteAutomaton> automaton_;
  std::shared_ptr<const TokenVocab> vocab_;
  std::string description_;
  mutable std::mutex mu_;
  mutable std::unordered_map<uint64_t, std::shared_ptr<const TokenMask>> masks_;
};

struct ConstraintOptions {
  // Whitespace allowed between JSON tokens of a json_schema reply (SGLang's
  // --constrained-json-whitespace-pattern): a regex. Bounded by default so a weak model cannot emit
  // whitespace forever; 20 bytes leave room for pretty-printed JSON a few levels deep.
  std::string json_whitespace = "[ \\t\\n\\r]{0,20}";
  int json_object_max_whitespace = 20;  // the same bound for json_object (JSON mode)
  size_t cache_entries = 32;            // compiled constraints kept (least recently used dropped)
  RegexLimits limits;
};

class ConstraintCompiler {
 public:
  ConstraintCompiler(const Tokenizer& tokenizer, ConstraintOptions options);
  // Fails (fp4moe::Error) with what is wrong, prefixed by nothing: the caller names spec.param.
  std::shared_ptr<const TokenConstraint> compile(const ConstraintSpec& spec);
  const ConstraintOptions& options() const { return options_; }

 private:
  ConstraintOptions options_;
  std::shared_ptr<const TokenVocab> vocab_;
  std::mutex mu_;
  std::list<std::pair<std::string, std::shared_ptr<const TokenConstraint>>> lru_;  // most recent first
};

}  // namespace fp4moe::engine
