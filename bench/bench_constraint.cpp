// Structured outputs: what a token mask costs. A synthetic byte-level vocabulary of GLM-5's size
// (154,880 tokens: the 256 bytes, then words with and without a leading space, digit runs, JSON
// punctuation pieces, CJK pieces), three constraints (a short regex, a 30-property JSON schema, JSON
// mode), and a random live path through each: per step, the time of the mask as the sampler asks for
// it (a walk of the vocabulary's byte trie the first time a state is seen, the cache after) and of the
// cached lookup. Prints a table.
//   build/bench/bench_constraint [n_states=200]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/constraint.h"
#include "engine/json_schema.h"

using namespace fp4moe::engine;

namespace {

std::vector<std::string> synthetic_vocab(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::set<std::string> seen;
  std::vector<std::string> out;
  auto add = [&](std::string s) {
    if (!s.empty() && seen.insert(s).second) out.push_back(std::move(s));
  };
  for (int b = 0; b < 256; ++b) add(std::string(1, static_cast<char>(b)));
  for (const char* p :
       {"\":", "\",", "{\"", "\"}", "},", "],", "[\"", ": ", ", ", "\n  ", "\n    ", "null", "true", "false"})
    add(p);
  const std::string letters = "etaoinshrdlcumwfgypbvkjxqz";
  std::geometric_distribution<int> len(0.22);
  std::uniform_int_distribution<int> kind(0, 9);
  while (out.size() < n) {
    const int k = kind(rng);
    std::string s;
    if (k <= 5) {  // words, most with a leading space
      if (k <= 3) s += ' ';
      const int l = 1 + std::min(len(rng), 14);
      for (int i = 0; i < l; ++i) {
        char c = letters[std::min<size_t>(static_cast<size_t>(std::geometric_distribution<int>(0.15)(rng)), 25)];
        if (i == 0 && k == 5) c = static_cast<char>(c - 'a' + 'A');
        s += c;
      }
    } else if (k == 6) {  // digit runs
      const int l = 1 + std::min(len(rng), 3);
      for (int i = 0; i < l; ++i) s += static_cast<char>('0' + rng() % 10);
    } else if (k == 7) {  // punctuation pieces
      const std::string punct = "{}[]\":,.;()<>=+-*/_'!?#\\ \n\t";
      const int l = 1 + std::min(len(rng), 3);
      for (int i = 0; i < l; ++i) s += punct[rng() % punct.size()];
    } else {  // CJK (3 bytes each), sometimes cut mid-character as byte-level BPE does
      const int l = 1 + std::min(len(rng), 2);
      for (int i = 0; i < l; ++i) {
        const uint32_t cp = 0x4E00 + static_cast<uint32_t>(rng() % 0x5000);
        s += static_cast<char>(0xE0 | (cp >> 12));
        s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
        s += static_cast<char>(0x80 | (cp & 0x3F));
      }
      if (k == 9) s.pop_back();
    }
    add(s);
  }
  return out;
}

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
  const int n_states = argc > 1 ? std::atoi(argv[1]) : 200;
  auto t0 = std::chrono::steady_clock::now();
  const std::vector<std::string> bytes = synthetic_vocab(154880, 1);
  const double t_gen = ms_since(t0);
  t0 = std::chrono::steady_clock::now();
  auto vocab = std::make_shared<const TokenVocab>(bytes);
  std::printf("vocabulary: %d tokens, %zu trie nodes; generated in %.0f ms, trie built in %.0f ms\n\n",
              vocab->vocab_size(), vocab->nodes().size(), t_gen, ms_since(t0));

  nlohmann::ordered_json props = nlohmann::ordered_json::object();
  nlohmann::ordered_json required = nlohmann::ordered_json::array();
  for (int i = 0; i < 30; ++i) {
    const std::string k = "field_" + std::to_string(i);
    if (i % 3 == 0) props[k] = {{"type", "string"}, {"maxLength", 100}};
    if (i % 3 == 1) props[k] = {{"type", "integer"}, {"minimum", 0}, {"maximum", 5000}};
    if (i % 3 == 2) props[k] = {{"type", "array"}, {"items", {{"enum", {"a", "b", "c"}}}}, {"maxItems", 5}};
    required.push_back(k);
  }
  const nlohmann::ordered_json schema = {{"type", "object"}, {"properties", props}, {"required", required}};
  struct Case {
    const char* name;
    std::shared_ptr<const ByteAutomaton> automaton;
  };
  std::vector<Case> cases;
  cases.push_back(
      {"regex (yes|no), [a-z]{2,5}\\.", std::make_shared<DfaAutomaton>(compile_regex("(yes|no), [a-z]{2,5}\\."))});
  t0 = std::chrono::steady_clock::now();
  cases.push_back({"JSON schema, 30 properties",
                   std::make_shared<DfaAutomaton>(compile_regex(json_schema_to_regex(schema, "[ ]?")))});
  std::printf("30-property schema compiled in %.0f ms\n", ms_since(t0));
  cases.push_back({"JSON mode (json_object)", std::make_shared<JsonObjectAutomaton>(20)});

  std::printf("%-30s %7s %10s %10s %10s %12s %12s\n", "constraint", "states", "mask ms", "p50 ms", "max ms",
              "cached us", "allowed avg");
  std::mt19937_64 rng(7);
  for (const Case& c : cases) {
    TokenConstraint tc(c.automaton, vocab, c.name);
    std::vector<double> fresh;
    double cached_us = 0;
    double allowed = 0;
    uint64_t st = tc.start();
    for (int i = 0; i < n_states; ++i) {
      if (!tc.can_continue(st)) st = tc.start();
      auto t = std::chrono::steady_clock::now();
      auto mask = tc.allowed(st);
      fresh.push_back(ms_since(t));
      t = std::chrono::steady_clock::now();
      mask = tc.allowed(st);
      cached_us += ms_since(t) * 1000.0;
      allowed += static_cast<double>(mask->n_allowed);
      // Move on by a random allowed token.
      std::vector<TokenId> ok;
      for (TokenId id = 0; id < vocab->vocab_size(); ++id) {
        if (mask->test(id)) ok.push_back(id);
      }
      if (ok.empty()) break;
      st = tc.advance(st, ok[rng() % ok.size()]);
    }
    std::vector<double> sorted = fresh;
    std::sort(sorted.begin(), sorted.end());
    double sum = 0;
    for (double f : fresh) sum += f;
    std::printf("%-30s %7zu %10.2f %10.2f %10.2f %12.1f %12.0f\n", c.name, fresh.size(),
                sum / static_cast<double>(fresh.size()), sorted[sorted.size() / 2], sorted.back(),
                cached_us / static_cast<double>(fresh.size()), allowed / static_cast<double>(fresh.size()));
  }
  return 0;
}
