// Structured outputs: regex -> DFA against std::regex on random strings, UTF-8 classes, the refused
// syntax; JSON schema -> regex (accepted / refused texts, random accepted texts parse and satisfy the
// schema); the JSON-mode pushdown automaton; token masks against a brute force over the golden
// tokenizer's vocabulary; and constrained requests through the engine on the embedded default model.
// Run: test_constraint (needs shared/golden/tokenizer; FP4MOE_TEST_SEED replays the random cases).
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <regex>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "engine/constraint.h"
#include "engine/default_model.h"
#include "engine/engine.h"
#include "engine/json_schema.h"
#include "engine/regex_dfa.h"
#include "scripted_model.h"
#include "testing/testing.h"

namespace fp4moe::engine {
namespace {

using ojson = nlohmann::ordered_json;

std::mt19937_64& rng() {
  static std::mt19937_64 g(testing::test_seed());
  return g;
}

// A random text the automaton accepts: from the start, draw among the live bytes (stopping at an
// accepting state with probability p_stop), at most max_len bytes before heading for the shortest
// way out is not tracked, so walks that run long are dropped (nullopt).
std::optional<std::string> random_accepted(const ByteAutomaton& a, double p_stop, size_t max_len) {
  std::string s;
  uint64_t st = a.start();
  while (s.size() < max_len) {
    if (a.accepting(st) && (!a.can_continue(st) || std::uniform_real_distribution<double>(0, 1)(rng()) < p_stop))
      return s;
    std::vector<std::pair<uint8_t, uint64_t>> next;
    for (int b = 0; b < 256; ++b) {
      const uint64_t t = a.step(st, static_cast<uint8_t>(b));
      if (t != ByteAutomaton::kDead) next.emplace_back(static_cast<uint8_t>(b), t);
    }
    if (next.empty()) return std::nullopt;  // a live state always continues or accepts
    auto [b, t] = next[std::uniform_int_distribution<size_t>(0, next.size() - 1)(rng())];
    s.push_back(static_cast<char>(b));
    st = t;
  }
  return std::nullopt;
}

bool accepts(const ByteAutomaton& a, const std::string& s) {
  uint64_t st = a.start();
  for (char c : s) {
    st = a.step(st, static_cast<uint8_t>(c));
    if (st == ByteAutomaton::kDead) return false;
  }
  return a.accepting(st);
}

TEST(RegexDfa, MatchesLikeStdRegexOnRandomStrings) {
  const std::vector<std::string> patterns = {"a*b",          "(ab|a)*",    "[a-c]{2,4}",     "x?y+z*",
                                             "(?:a|b)+c",    "[^ab]*",     "\\d+(\\.\\d+)?", "a{3}",
                                             "(a|b)*abb",    "[-a]+",      "\\w+\\s\\w+",    "(a*)*b",
                                             "a{0,2}b{1,}",  ".*a.*",      "((a|b)c?){2,3}", "[a-z0-9_]{1,3}-?",
                                             "(x|y|)z{0,1}", "\\D\\W\\S?", "[\\]a]+",        "0|[1-9][0-9]*",
                                             "(a|b){2}?c*?", "^ab$",       "[.]+\\.?"};
  const std::string alphabet = "abcxyz019 .-_]\n";
  for (const std::string& p : patterns) {
    SCOPED_TRACE("pattern " + p);
    const ByteDfa dfa = compile_regex(p);
    const std::regex ref(p == "^ab$" ? "ab" : p, std::regex::ECMAScript);
    for (int i = 0; i < 3000; ++i) {
      std::string s;
      const int n = std::uniform_int_distribution<int>(0, 7)(rng());
      for (int k = 0; k < n; ++k) s += alphabet[std::uniform_int_distribution<size_t>(0, alphabet.size() - 1)(rng())];
      ASSERT_EQ(dfa.matches(s), std::regex_match(s, ref)) << "text '" << s << "'";
    }
  }
}

TEST(RegexDfa, Utf8ClassesAndDotMatchWholeCharacters) {
  const ByteDfa greek = compile_regex("[α-ω]+");
  EXPECT_TRUE(greek.matches("αβγω"));
  EXPECT_FALSE(greek.matches("a"));
  EXPECT_FALSE(greek.matches("Ω"));
  EXPECT_FALSE(greek.matches("\xCE"));  // half of α
  const ByteDfa dot = compile_regex(".");
  for (const char* ok : {"a", "é", "€", "😀", "\xEF\xBF\xBF"}) EXPECT_TRUE(dot.matches(ok)) << ok;
  for (const char* bad : {"\n", "\xC3", "\xED\xA0\x80", "\xC0\x80", "\xF4\x90\x80\x80", "ab"})
    EXPECT_FALSE(dot.matches(bad)) << bad;
  const ByteDfa neg = compile_regex("[^a]");
  EXPECT_TRUE(neg.matches("é"));
  EXPECT_TRUE(neg.matches("\n"));
  EXPECT_FALSE(neg.matches("a"));
  EXPECT_TRUE(compile_regex("caf\\xe9 \\u20ac").matches("café €"));
  EXPECT_TRUE(compile_regex("日本+").matches("日本本"));
  EXPECT_TRUE(compile_regex("a{,2}").matches("aa"));  // Python's {,n}
  EXPECT_FALSE(compile_regex("a{,2}").matches("aaa"));
  EXPECT_TRUE(compile_regex("a{x").matches("a{x")) << "a brace that is no quantifier is a literal";
}

TEST(RegexDfa, DeadAndFinalStates) {
  const ByteDfa d = compile_regex("ab|ac|a+");
  int32_t s = d.step(d.start(), 'a');
  ASSERT_NE(s, ByteDfa::kDead);
  EXPECT_TRUE(d.accepting(s));
  EXPECT_TRUE(d.can_continue(s));
  EXPECT_EQ(d.step(s, 'd'), ByteDfa::kDead);
  const int32_t b = d.step(s, 'b');
  EXPECT_TRUE(d.accepting(b));
  EXPECT_FALSE(d.can_continue(b)) << "nothing may follow 'ab'";
  EXPECT_EQ(d.step(d.start(), 'x'), ByteDfa::kDead);
  // "a(b|c)d" where only "abd" can be completed: the 'c' branch is pruned at once.
  const ByteDfa pruned = compile_regex("a(b|c[^\\x00-\\U0010FFFF])d");
  EXPECT_EQ(pruned.step(pruned.step(pruned.start(), 'a'), 'c'), ByteDfa::kDead);
  EXPECT_TRUE(pruned.matches("abd"));
}

TEST(RegexDfa, RefusedSyntaxAndLimitsNameWhatAndWhere) {
  auto err = [](const std::string& p, RegexLimits l = {}) { return testing::error_of([&] { compile_regex(p, l); }); };
  EXPECT_NE(err("a(?=b)").find("lookaround, inline flags and other (?...) groups are not supported at offset 1"),
            std::string::npos)
      << err("a(?=b)");
  EXPECT_NE(err("(ab").find("missing ')' at offset 0"), std::string::npos) << err("(ab");
  EXPECT_NE(err("ab)").find("unbalanced ')' at offset 2"), std::string::npos) << err("ab)");
  EXPECT_NE(err("*a").find("nothing to repeat before '*' at offset 0"), std::string::npos) << err("*a");
  EXPECT_NE(err("(a)\\1").find("backreferences are not supported at offset 3"), std::string::npos);
  EXPECT_NE(err("a{3,1}").find("min > max"), std::string::npos) << err("a{3,1}");
  EXPECT_NE(err("[b-a]").find("bad character range"), std::string::npos) << err("[b-a]");
  EXPECT_NE(err("a\\bc").find("word boundaries"), std::string::npos);
  EXPECT_NE(err("a^b").find("'^' is supported only at the start"), std::string::npos);
  EXPECT_NE(err("a\\q").find("unknown escape \\q"), std::string::npos);
  EXPECT_NE(err("[^\\x00-\\U0010FFFF]").find("matches nothing"), std::string::npos) << err("[^\\x00-\\U0010FFFF]");
  RegexLimits small;
  small.max_nfa_states = 50;
  EXPECT_NE(err("(a|b){20}", small).find("more than 50 NFA states"), std::string::npos) << err("(a|b){20}", small);
  small = {};
  small.max_dfa_states = 1000;  // the n-th symbol from the end is an 'a': 2^13 states
  EXPECT_NE(err("(a|b)*a(a|b){12}", small).find("more than 1000 DFA states"), std::string::npos);
  EXPECT_EQ(compile_regex("(a|b)*a(a|b){12}").n_states(), 8192);
  small = {};
  small.max_work = 10000;
  EXPECT_NE(err("(a|b)*a(a|b){12}", small).find("takes more than 10000 NFA state visits"), std::string::npos)
      << err("(a|b)*a(a|b){12}", small);
}

// Found by review: inputs that must be refused (not crash) or read as Python's re reads them.
TEST(RegexDfa, StackedQuantifiersOctalAndOpenCounts) {
  for (const std::string& p : {"a" + std::string(100000, '*'), [] {
                                 std::string s = "a";
                                 for (int i = 0; i < 100000; ++i) s += "{1}";
                                 return s;
                               }()}) {
    EXPECT_NE(testing::error_of([&] { compile_regex(p); }).find("more than 8 quantifiers on one atom"),
              std::string::npos);
  }
  EXPECT_TRUE(compile_regex("a**").matches("aaa"));
  EXPECT_TRUE(compile_regex("a{,}").matches("aaa"));
  EXPECT_TRUE(compile_regex("a{,}").matches(""));
  EXPECT_TRUE(compile_regex("\\012").matches("\n"));
  EXPECT_TRUE(compile_regex("x\\0y").matches(std::string("x\0y", 3)));
}

TEST(RegexDfa, EscapeMakesLiterals) {
  const std::string text = "a.b*c?(d)[e]{f}|g\\h^$+-/";
  EXPECT_TRUE(compile_regex(regex_escape(text)).matches(text));
  EXPECT_FALSE(compile_regex(regex_escape(text)).matches("aXb*c?(d)[e]{f}|g\\h^$+-/"));
}

std::unique_ptr<DfaAutomaton> schema_automaton(const ojson& schema, const std::string& ws = "[ ]?") {
  return std::make_unique<DfaAutomaton>(compile_regex(json_schema_to_regex(schema, ws)));
}

TEST(JsonSchema, AcceptsWhatTheSchemaAllowsAndNothingElse) {
  const ojson schema = ojson::parse(R"({
    "type": "object",
    "properties": {
      "name": {"type": "string", "maxLength": 8},
      "age": {"type": "integer"},
      "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 3},
      "ok": {"type": "boolean"},
      "nick": {"type": ["string", "null"]}
    },
    "required": ["name", "age"]})");
  const auto a = schema_automaton(schema);
  EXPECT_LT(a->dfa().n_classes(), 48) << "the table has a column per byte class, not per byte";
  for (const char* ok : {R"({"name":"x","age":3})", R"({ "name": "x", "age": -10, "tags": ["a", "b"] })",
                         R"({"name":"","age":0,"ok":true,"nick":null})", R"({"name":"\"é\u00e9","age":1,"tags":[]})",
                         R"({"name":"\ud83d\ude00","age":1})"})
    EXPECT_TRUE(accepts(*a, ok)) << ok;
  for (const char* bad :
       {R"({"age":3,"name":"x"})", R"({"name":"x"})", R"({"name":"x","age":3.5})", R"({"name":"123456789","age":1})",
        R"({"name":"x","age":1,"tags":["c"]})", R"({"name":"x","age":1,"extra":1})", R"({"name":"x","age":01})",
        R"({"name":"x","age":1,"tags":["a","a","a","a"]})", R"({"name":"x","age":1}  )", R"({"name":"a\qb","age":1})",
        R"({"name":"\udc00","age":1})"})
    EXPECT_FALSE(accepts(*a, bad)) << bad;

  // Random accepted texts are JSON the schema allows.
  int n_checked = 0;
  for (int i = 0; i < 300; ++i) {
    auto text = random_accepted(*a, 0.3, 400);
    if (!text) continue;
    ++n_checked;
    const auto j = ojson::parse(*text, nullptr, false);
    ASSERT_TRUE(j.is_object()) << *text;
    ASSERT_TRUE(j.contains("name") && j["name"].is_string()) << *text;
    // (an integer past 64 bits parses as a float)
    ASSERT_TRUE(j.contains("age") && (j["age"].is_number_integer() ||
                                      (j["age"].is_number_float() && std::abs(j["age"].get<double>()) > 9e18)))
        << *text;
    for (auto it = j.begin(); it != j.end(); ++it) ASSERT_TRUE(schema["properties"].contains(it.key())) << *text;
    if (j.contains("tags")) {
      ASSERT_LE(j["tags"].size(), 3u) << *text;
      for (const auto& t : j["tags"]) ASSERT_TRUE(t == "a" || t == "b") << *text;
    }
  }
  EXPECT_GT(n_checked, 100);
}

TEST(JsonSchema, RefsAnyOfConstFormatsAndFreeValues) {
  const auto arr = schema_automaton(ojson::parse(R"({
    "$defs": {"P": {"type": "object", "properties": {"x": {"type": "number"}}, "required": ["x"]}},
    "type": "array", "items": {"$ref": "#/$defs/P"}, "minItems": 1})"));
  EXPECT_TRUE(accepts(*arr, R"([{"x":1.5e3}, {"x":-0.25}])"));
  EXPECT_FALSE(accepts(*arr, "[]"));
  const auto any = schema_automaton(ojson::parse(R"({"anyOf": [{"const": {"k": [1, "two"]}}, {"type": "null"}]})"));
  EXPECT_TRUE(accepts(*any, R"({"k":[1,"two"]})"));
  EXPECT_TRUE(accepts(*any, "null"));
  EXPECT_FALSE(accepts(*any, R"({"k":[1,"three"]})"));
  const auto date = schema_automaton(ojson::parse(R"({"type": "string", "format": "date"})"));
  EXPECT_TRUE(accepts(*date, R"("2026-12-05")"));
  EXPECT_FALSE(accepts(*date, R"("2026-13-05")"));
  const auto pat = schema_automaton(ojson::parse(R"({"type": "string", "pattern": "^[A-Z]{2}\\d$"})"));
  EXPECT_TRUE(accepts(*pat, R"("AB1")"));
  EXPECT_FALSE(accepts(*pat, R"("AB12")"));
  // {} is any JSON value (containers nested kAnyValueDepth deep); a dict of integers.
  const auto free = schema_automaton(ojson::parse("{}"));
  EXPECT_TRUE(accepts(*free, R"({"a": [1, 2], "c": {"b": null}})"));
  EXPECT_FALSE(accepts(*free, R"([[[1]]])")) << "three levels > kAnyValueDepth";
  const auto dict =
      schema_automaton(ojson::parse(R"({"type": "object", "additionalProperties": {"type": "integer"}})"));
  EXPECT_TRUE(accepts(*dict, R"({"a": 1, "b": 2})"));
  EXPECT_TRUE(accepts(*dict, "{}"));
  EXPECT_FALSE(accepts(*dict, R"({"a": "1"})"));
  // Optional properties only: any subset in order, the empty object too.
  const auto opt =
      schema_automaton(ojson::parse(R"({"properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}})"));
  for (const char* ok : {"{}", R"({"a":1})", R"({"b":2})", R"({"a":1,"b":2})"}) EXPECT_TRUE(accepts(*opt, ok)) << ok;
  for (const char* bad : {R"({,"b":2})", R"({"a":1,})", R"({"b":2,"a":1})"}) EXPECT_FALSE(accepts(*opt, bad)) << bad;
  // The whitespace pattern decides the layout.
  const ojson s = ojson::parse(R"({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]})");
  EXPECT_FALSE(accepts(*schema_automaton(s, "[ ]?"), "{\n  \"a\": 1\n}"));
  EXPECT_TRUE(accepts(*schema_automaton(s, "[ \\t\\n\\r]{0,20}"), "{\n  \"a\": 1\n}"));
}

// Integer bounds: every integer in a window is accepted exactly when it is in range, on random ranges
// (negative, positive, across zero, open on either side, exclusive bounds).
TEST(JsonSchema, IntegerRangesAreExact) {
  std::uniform_int_distribution<int64_t> pick(-1100, 1100);
  for (int c = 0; c < 40; ++c) {
    ojson s = {{"type", "integer"}};
    std::optional<int64_t> lo, hi;
    const int shape = c % 4;  // 0 both, 1 only min, 2 only max, 3 exclusive both
    int64_t a = pick(rng()), b = pick(rng());
    if (a > b) std::swap(a, b);
    if (shape == 0 || shape == 1) s["minimum"] = a, lo = a;
    if (shape == 0 || shape == 2) s["maximum"] = b, hi = b;
    if (shape == 3) s["exclusiveMinimum"] = a, s["exclusiveMaximum"] = b + 2, lo = a + 1, hi = b + 1;
    SCOPED_TRACE(s.dump());
    const auto dfa = schema_automaton(s);
    for (int64_t n = -1300; n <= 1300; ++n) {
      const bool want = (!lo || n >= *lo) && (!hi || n <= *hi);
      ASSERT_EQ(accepts(*dfa, std::to_string(n)), want) << n;
    }
    for (int64_t n : {int64_t{123456}, int64_t{-98765}, int64_t{1000000000000}})
      ASSERT_EQ(accepts(*dfa, std::to_string(n)), (!lo || n >= *lo) && (!hi || n <= *hi)) << n;
    EXPECT_FALSE(accepts(*dfa, "-0"));
    EXPECT_FALSE(accepts(*dfa, "007"));
  }
  const auto frac = schema_automaton(ojson::parse(R"({"type": "integer", "minimum": 1.5, "maximum": 3.5})"));
  EXPECT_FALSE(accepts(*frac, "1"));
  EXPECT_TRUE(accepts(*frac, "2"));
  EXPECT_TRUE(accepts(*frac, "3"));
  EXPECT_FALSE(accepts(*frac, "4"));
}

// Found by review: deep or exploding schemas are refused, not a crash or gigabytes; keywords are not
// silently dropped; values stay valid JSON of the schema.
TEST(JsonSchema, ReviewFindings) {
  auto err = [](const std::string& s) { return testing::error_of([&] { json_schema_to_regex(ojson::parse(s), ""); }); };
  std::string deep;
  for (int i = 0; i < 10000; ++i) deep += "{\"anyOf\":[";
  deep += "{\"type\":\"null\"}";
  for (int i = 0; i < 10000; ++i) deep += "]}";
  EXPECT_NE(err(deep).find("nested deeper than 64 levels"), std::string::npos);
  std::string arrays;
  for (int i = 0; i < 22; ++i) arrays += "{\"items\":";
  arrays += "{\"type\":\"integer\"}" + std::string(22, '}');
  EXPECT_NE(err(arrays).find("regex exceeds 1048576 bytes"), std::string::npos) << err(arrays);
  EXPECT_NE(err(R"({"type":"string","pattern":"^.*$"})").find("which a JSON string must escape; not supported"),
            std::string::npos)
      << err(R"({"type":"string","pattern":"^.*$"})");
  EXPECT_NE(err(R"({"type":"string","pattern":"^[a-z\"]+$"})").find("may match '\"' or '\\'"), std::string::npos)
      << err(R"({"type":"string","pattern":"^[a-z\"]+$"})");
  EXPECT_NE(err(R"({"type":"string","pattern":"a)|(b"})").find("at /pattern: regex: unbalanced ')'"), std::string::npos)
      << err(R"({"type":"string","pattern":"a)|(b"})");
  EXPECT_TRUE(accepts(*schema_automaton(ojson::parse(R"({"type":"string","pattern":"^a\\$$"})")), R"("a$")"));
  EXPECT_NE(err(R"({"type":"string","pattern":"^\\d+$","minLength":3})").find("minLength / maxLength next to pattern"),
            std::string::npos);
  EXPECT_NE(err(R"({"minimum":5})").find("numeric bounds without a type"), std::string::npos);
  const auto typed_enum = schema_automaton(ojson::parse(R"({"type":"string","enum":["a",1]})"));
  EXPECT_TRUE(accepts(*typed_enum, R"("a")"));
  EXPECT_FALSE(accepts(*typed_enum, "1"));
  EXPECT_NE(err(R"({"type":"string","enum":[1]})").find("enum has no value of the schema's type"), std::string::npos);
  EXPECT_NE(err(R"({"type":"object","properties":{"a":{"type":"integer"}},"anyOf":[{"required":["a"]}]})")
                .find("anyOf next to 'type' is not supported"),
            std::string::npos);
  EXPECT_NE(err(R"({"$ref":"#/$defs/A","type":"string","$defs":{"A":{}}})").find("$ref next to 'type'"),
            std::string::npos);
  const auto count = schema_automaton(
      ojson::parse(R"({"type":"object","required":["count"],"additionalProperties":{"type":"integer"}})"));
  EXPECT_TRUE(accepts(*count, R"({"count":3})"));
  EXPECT_FALSE(accepts(*count, R"({"count":"x"})"));
  EXPECT_NE(err(R"({"type":"object","required":["a"],"additionalProperties":false})")
                .find("'a' is required but neither in properties nor allowed by additionalProperties: false"),
            std::string::npos);
  EXPECT_NE(err(R"({"type":"integer","minimum":-9223372036854775808})").find("beyond +-1e18"), std::string::npos);
  std::string many = R"({"type":"object","properties":{)";
  for (int i = 0; i < 3000; ++i)
    many += (i ? "," : "") + std::string("\"p") + std::to_string(i) + "\":{\"type\":\"boolean\"}";
  many += "}}";
  EXPECT_NE(err(many).find("built); simplify the schema"), std::string::npos) << "refused before gigabytes";
  EXPECT_NE(err(R"({"type":"string","pattern":"^^a"})").find("/pattern: regex: '^' is supported only at the start"),
            std::string::npos)
      << err(R"({"type":"string","pattern":"^^a"})");
  const auto big = schema_automaton(ojson::parse(R"({"type":"integer","minimum":9007199254740993})"));
  EXPECT_FALSE(accepts(*big, "9007199254740992"));
  EXPECT_TRUE(accepts(*big, "9007199254740993"));
}

TEST(JsonSchema, RefusedKeywordsNameTheirPlace) {
  auto err = [](const char* s) { return testing::error_of([&] { json_schema_to_regex(ojson::parse(s), ""); }); };
  EXPECT_NE(
      err(R"({"type": "array", "uniqueItems": true})").find("JSON schema at #: keyword 'uniqueItems' is not supported"),
      std::string::npos)
      << err(R"({"type": "array", "uniqueItems": true})");
  EXPECT_NE(err(R"({"type": "number", "minimum": 0})").find("minimum is supported on integers only"),
            std::string::npos);
  EXPECT_NE(err(R"({"type": "integer", "minimum": 5, "maximum": 4})").find("the integer range [5, 4] is empty"),
            std::string::npos);
  EXPECT_NE(err(R"({"properties": {"a": {"type": "array", "prefixItems": []}}})")
                .find("JSON schema at /properties/a: keyword 'prefixItems'"),
            std::string::npos);
  const char* rec =
      R"({"$defs": {"N": {"type": "object", "properties": {"next": {"$ref": "#/$defs/N"}}}}, "$ref": "#/$defs/N"})";
  EXPECT_NE(err(rec).find("$ref '#/$defs/N' refers to itself (recursive schemas are not supported)"), std::string::npos)
      << err(rec);
  EXPECT_NE(err(R"({"$ref": "#/$defs/missing"})").find("points at nothing"), std::string::npos);
  EXPECT_NE(err("false").find("matches nothing"), std::string::npos);
  EXPECT_NE(err(R"({"type": "strin"})").find("unknown type 'strin'"), std::string::npos);
  EXPECT_NE(err(R"({"type": "string", "format": "email"})").find("format 'email' is not supported"), std::string::npos);
}

TEST(JsonObjectAutomaton, AcceptsJsonObjectsOnly) {
  const JsonObjectAutomaton a(20);
  for (const char* ok :
       {"{}", R"({"a":1})", R"( { "a" : [1, -2.5e+3, 0, true, false, null, "x\n\u00e9é\uD83D\uDE00"], "b": {} })",
        R"({"k":{"k":{"k":[[[]]]}}})", R"({"":0.0})", "{\"😀\":\"日本\"}"})
    EXPECT_TRUE(accepts(a, ok)) << ok;
  for (const char* bad :
       {"[]", "1", R"({"a":1,})", R"({a:1})", R"({"a":01})", R"({"a":1.})", R"({"a":"\x"})", "{\"a\":\"\t\"}",
        R"({"a":1} x)", R"({"a":1}})", R"({"a":tru})", R"({"a":1 "b":2})", "{\"a\":\"\xED\xA0\x80\"}",
        R"({"a":"\udc00"})", R"({"a":"\ud800x"})", "{\"a\":\"\xC3\"}", R"({"a":-})", R"({"a":[1,]})"})
    EXPECT_FALSE(accepts(a, bad)) << bad;
  std::string deep = "{\"a\":";
  for (int i = 1; i < JsonObjectAutomaton::kMaxDepth; ++i) deep += "[";
  std::string closed = deep;
  for (int i = 1; i < JsonObjectAutomaton::kMaxDepth; ++i) closed += "]";
  EXPECT_TRUE(accepts(a, closed + "}"));
  EXPECT_FALSE(accepts(a, deep + "[]" + closed.substr(deep.size()) + "}")) << "one level too deep";
  EXPECT_FALSE(accepts(a, "{" + std::string(21, ' ') + "}")) << "whitespace runs are bounded";
  EXPECT_TRUE(accepts(a, "{" + std::string(20, ' ') + "}"));
  int n_checked = 0;
  for (int i = 0; i < 300; ++i) {
    auto text = random_accepted(a, 0.5, 300);
    if (!text) continue;
    ++n_checked;
    // nlohmann refuses numbers that overflow a double (valid JSON): exponents outside strings made 0.
    std::string tame;
    bool in_string = false;
    for (size_t i = 0; i < text->size(); ++i) {
      const char c = (*text)[i];
      tame += c;
      if (in_string) {
        if (c == '\\')
          tame += (*text)[++i];
        else if (c == '"')
          in_string = false;
      } else if (c == '"') {
        in_string = true;
      } else if ((c == 'e' || c == 'E') && i > 0 && (*text)[i - 1] >= '0' && (*text)[i - 1] <= '9') {
        while (i + 1 < text->size() && std::string_view("+-0123456789").find((*text)[i + 1]) != std::string_view::npos)
          ++i;
        tame += '0';
      }
    }
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(tame);
    } catch (const std::exception& e) {
      FAIL() << e.what() << ": " << *text;
    }
    ASSERT_TRUE(j.is_object()) << *text;
  }
  EXPECT_GT(n_checked, 50);
}

const Tokenizer& golden_tokenizer() {
  static const Tokenizer tok = Tokenizer::load(testing::shared_path("golden/tokenizer"));
  return tok;
}

// allowed(state) is exactly the tokens whose bytes keep the automaton alive, at states along random
// accepted texts; special tokens never.
TEST(TokenConstraint, MasksEqualBruteForceOverTheVocabulary) {
  const Tokenizer& tok = golden_tokenizer();
  ConstraintCompiler compiler(tok, {});
  std::vector<ConstraintSpec> specs = {
      {ConstraintSpec::Kind::kRegex, "regex", "\\d{1,3}(, \\d{1,3})*|[a-z ]+\\.", {}},
      {ConstraintSpec::Kind::kJsonObject, "response_format", "", {}},
      {ConstraintSpec::Kind::kJsonSchema,
       "json_schema",
       R"({"type":"object","properties":{"code":{"type":"string"},"n":{"type":"integer"}},"required":["code"]})",
       {}},
      {ConstraintSpec::Kind::kChoice, "guided_choice", "", {"def main", "class Foo", "import os"}}};
  for (const ConstraintSpec& spec : specs) {
    auto c = compiler.compile(spec);
    SCOPED_TRACE(c->description());
    EXPECT_EQ(compiler.compile(spec), c) << "cached";
    int n_states = 0;
    for (int walk = 0; walk < 4; ++walk) {
      // States along a random live path of up to 60 bytes.
      uint64_t st = c->start();
      std::string text;
      for (int step = 0; step < 60 && c->can_continue(st); ++step) {
        if (step % 10 == 0) {
          const auto mask = c->allowed(st);
          int64_t n = 0;
          for (TokenId id = 0; id < tok.vocab_size(); ++id) {
            const bool want =
                !tok.is_special(id) && !tok.token_bytes(id).empty() && c->advance(st, id) != ByteAutomaton::kDead;
            ASSERT_EQ(mask->test(id), want)
                << "token " << id << " '" << tok.token_bytes(id) << "' after '" << text << "'";
            n += want;
          }
          EXPECT_EQ(mask->n_allowed, n);
          EXPECT_GT(n, 0) << "a live state always has a byte-level token that continues it";
          ++n_states;
        }
        std::vector<std::pair<char, uint64_t>> next;
        for (int b = 0; b < 256; ++b) {
          const uint64_t t = c->automaton().step(st, static_cast<uint8_t>(b));
          if (t != ByteAutomaton::kDead) next.emplace_back(static_cast<char>(b), t);
        }
        ASSERT_FALSE(next.empty());
        auto [b, t] = next[std::uniform_int_distribution<size_t>(0, next.size() - 1)(rng())];
        text.push_back(b);
        st = t;
      }
    }
    EXPECT_GT(n_states, 0);
  }
  EXPECT_NE(testing::error_of([&] {
              compiler.compile({ConstraintSpec::Kind::kChoice, "guided_choice", "", {}});
            }).find("the list of choices is empty"),
            std::string::npos);
  EXPECT_NE(testing::error_of([&] {
              compiler.compile({ConstraintSpec::Kind::kJsonSchema, "json_schema", "{", {}});
            }).find("the JSON schema: malformed JSON: "),
            std::string::npos);
  // Choices are literals: "a|b" is the three characters.
  auto lit = compiler.compile({ConstraintSpec::Kind::kChoice, "guided_choice", "", {"a|b", "c"}});
  EXPECT_TRUE(accepts(lit->automaton(), "a|b"));
  EXPECT_FALSE(accepts(lit->automaton(), "a"));
}

// A schema sent as text (SGLang's json_schema string) is depth-bounded like request bodies.
TEST(TokenConstraint, DeepSchemaTextIsRefused) {
  ConstraintCompiler compiler(golden_tokenizer(), {});
  const std::string deep_enum = R"({"enum":[)" + std::string(100000, '[') + std::string(100000, ']') + "]}";
  EXPECT_NE(testing::error_of([&] {
              compiler.compile({ConstraintSpec::Kind::kJsonSchema, "json_schema", deep_enum, {}});
            }).find("the JSON schema: JSON nests deeper than 64 levels"),
            std::string::npos);
}

// Tokens spelling the same bytes are allowed together; an empty token never.
TEST(TokenConstraint, DuplicateAndEmptyTokens) {
  auto vocab = std::make_shared<const TokenVocab>(std::vector<std::string>{"a", "ab", "a", "", "b", "ba"});
  EXPECT_EQ(vocab->max_depth(), 2u);
  TokenConstraint c(std::make_shared<DfaAutomaton>(compile_regex("ab?")), vocab, "test");
  const auto m = c.allowed(c.start());
  EXPECT_EQ(m->n_allowed, 3);
  for (TokenId id : {0, 1, 2}) EXPECT_TRUE(m->test(id)) << id;
  for (TokenId id : {3, 4, 5, 6, -1}) EXPECT_FALSE(m->test(id)) << id;
  const uint64_t after_a = c.advance(c.start(), 2);
  EXPECT_TRUE(c.accepting(after_a));
  EXPECT_TRUE(c.allowed(after_a)->test(4));
  EXPECT_EQ(c.advance(c.start(), 3), ByteAutomaton::kDead);
}

struct Reply {
  std::string text;
  std::vector<TokenId> ids;
  std::optional<Finish> finish;
};

Reply run_default(const SamplingParams& sp, const std::string& prompt = "Answer: ") {
  auto tok = make_default_tokenizer();
  Engine e(EngineOptions{}, make_default_model(0), tok);
  Reply r;
  SubmitResult s = e.submit({tok->encode(prompt), sp}, [&](const RequestOutput& out) {
    r.text += out.text;
    for (const auto& t : out.tokens) r.ids.push_back(t.id);
    if (out.finished) r.finish = out.finished;
  });
  EXPECT_TRUE(s.ok()) << (s.rejection ? s.rejection->message : "");
  e.run_until_idle();
  return r;
}

// The embedded default model (random weights) writes what the constraint allows: sampled and greedy,
// a bounded regex and a bounded schema end by themselves (stop, no EOS step), JSON mode parses.
TEST(ConstrainedEngine, DefaultModelRepliesMatch) {
  auto tok = make_default_tokenizer();
  ConstraintCompiler compiler(*tok, {});
  const std::string pattern = "(yes|no), [a-z]{2,5}\\.";
  const ByteDfa dfa = compile_regex(pattern);
  for (double temperature : {0.0, 1.0}) {
    for (uint64_t seed = 1; seed <= 3; ++seed) {
      SamplingParams sp;
      sp.temperature = temperature;
      sp.seed = seed;
      sp.max_new_tokens = 64;
      sp.constraint = compiler.compile({ConstraintSpec::Kind::kRegex, "regex", pattern, {}});
      const Reply r = run_default(sp);
      ASSERT_TRUE(r.finish);
      EXPECT_EQ(r.finish->reason, FinishReason::kStop) << r.text;
      EXPECT_FALSE(r.finish->matched_stop_token) << "ended by the automaton, not an EOS";
      EXPECT_TRUE(dfa.matches(r.text)) << "T " << temperature << " seed " << seed << ": '" << r.text << "'";
    }
  }
  const std::string schema =
      R"({"type":"object","properties":{"ok":{"type":"boolean"},"pick":{"enum":["red","green",7]}},"required":["ok","pick"]})";
  SamplingParams sp;
  sp.temperature = 1.0;
  sp.seed = 7;
  sp.max_new_tokens = 80;
  sp.constraint = compiler.compile({ConstraintSpec::Kind::kJsonSchema, "json_schema", schema, {}});
  Reply r = run_default(sp, "JSON: ");
  ASSERT_TRUE(r.finish);
  EXPECT_EQ(r.finish->reason, FinishReason::kStop) << r.text;
  const auto j = nlohmann::json::parse(r.text, nullptr, false);
  ASSERT_TRUE(j.is_object()) << r.text;
  EXPECT_TRUE(j["ok"].is_boolean()) << r.text;
  EXPECT_TRUE(j["pick"] == "red" || j["pick"] == "green" || j["pick"] == 7) << r.text;

  // Review findings: min_new_tokens banning the only ways on ends the request with an error naming why
  // (it used to draw a banned token and read past the automaton); top logprobs list no banned token.
  const TokenId b = tok->encode("b").at(0);
  SamplingParams stuck;
  stuck.temperature = 0.0;
  stuck.max_new_tokens = 8;
  stuck.min_new_tokens = 5;
  stuck.stop_token_ids = {b};
  stuck.constraint = compiler.compile({ConstraintSpec::Kind::kRegex, "regex", "a(?:b)?", {}});
  r = run_default(stuck);
  ASSERT_TRUE(r.finish);
  EXPECT_EQ(r.finish->reason, FinishReason::kError);
  EXPECT_NE(r.finish->error.find("allows no token of the vocabulary after 1 generated tokens (min_new_tokens 5"),
            std::string::npos)
      << r.finish->error;
  SamplingParams lp;
  lp.temperature = 1.0;
  lp.seed = 2;
  lp.logprobs = true;
  lp.top_logprobs = 5;
  lp.max_new_tokens = 8;
  lp.constraint = compiler.compile({ConstraintSpec::Kind::kChoice, "guided_choice", "", {"yes", "no"}});
  {
    Engine e(EngineOptions{}, make_default_model(0), tok);
    std::vector<GeneratedToken> toks;
    ASSERT_TRUE(e.submit({tok->encode("?"), lp}, [&](const RequestOutput& out) {
                   toks.insert(toks.end(), out.tokens.begin(), out.tokens.end());
                 }).ok());
    e.run_until_idle();
    ASSERT_FALSE(toks.empty());
    for (const GeneratedToken& g : toks) {
      EXPECT_TRUE(std::isfinite(g.logprob));
      EXPECT_FALSE(g.top_logprobs.empty());
      for (const TokenLogprob& t : g.top_logprobs) EXPECT_TRUE(std::isfinite(t.logprob)) << t.id;
    }
    EXPECT_EQ(toks.size() > 1 ? toks[1].top_logprobs.size() : 1u, 1u) << "after 'y' or 'n' one token continues";
  }

  // JSON mode: the text is always a live prefix of a JSON object, and a whole one when it stopped.
  auto json_mode = compiler.compile({ConstraintSpec::Kind::kJsonObject, "response_format", "", {}});
  int n_whole = 0;
  for (uint64_t seed = 1; seed <= 4; ++seed) {
    sp.seed = seed;
    sp.max_new_tokens = 200;
    sp.constraint = json_mode;
    r = run_default(sp, "{");
    ASSERT_TRUE(r.finish);
    uint64_t st = json_mode->start();
    for (char c : r.text) st = json_mode->automaton().step(st, static_cast<uint8_t>(c));
    ASSERT_NE(st, ByteAutomaton::kDead) << r.text;
    if (r.finish->reason == FinishReason::kStop) {
      ++n_whole;
      EXPECT_TRUE(nlohmann::json::parse(r.text, nullptr, false).is_object()) << r.text;
    } else {
      EXPECT_EQ(r.finish->reason, FinishReason::kLength) << r.text;
    }
  }
  std::printf("json_object: %d of 4 sampled replies closed within 200 tokens\n", n_whole);
}

// A reasoning model thinks first: with constraint_after_reasoning the block between the tags is free
// and the constraint applies from the token after the end tag. A scripted model (golden tokenizer:
// <think> = 10, </think> = 11, both special) writes "<think>", three tokens, "</think>", then its
// favourites, which the constraint overrides; greedy, so each case is one deterministic reply.
TEST(ConstrainedEngine, ReasoningBlockIsFreeThenTheConstraintApplies) {
  auto tok = std::make_shared<const Tokenizer>(Tokenizer::load(testing::shared_path("golden/tokenizer")));
  ASSERT_EQ(tok->token_to_id("<think>"), std::optional<TokenId>(10));
  ASSERT_EQ(tok->token_to_id("</think>"), std::optional<TokenId>(11));
  ConstraintCompiler compiler(*tok, {});
  const std::vector<TokenId> prompt = {20, 21, 22};
  const std::vector<TokenId> thought = tok->encode("hmm ok");
  ASSERT_FALSE(thought.empty());
  // The script: generated index i -> the favourite token.
  auto script = [&](bool open_tag) {
    return [=](std::span<const int32_t> h) -> int32_t {
      const size_t i = h.size() - prompt.size();
      size_t k = 0;
      if (open_tag && i == k++) return 10;
      for (TokenId t : thought) {
        if (i == k++) return t;
      }
      if (i == k) return 11;
      return static_cast<int32_t>((h.size() * 7919) % 4000 + 12);  // anything (masked by the constraint)
    };
  };
  struct Out {
    std::vector<TokenId> ids;
    std::optional<Finish> finish;
  };
  auto run = [&](testing::ScriptedModel::NextFn next, std::optional<SamplingParams::ReasoningSpan> span) {
    auto lm = std::make_unique<testing::ScriptedModel>(4096, std::move(next));
    Engine e(EngineOptions{}, std::move(lm), tok);
    SamplingParams sp;
    sp.temperature = 0.0;
    sp.max_new_tokens = 40;
    sp.skip_special_tokens = false;
    sp.constraint = compiler.compile({ConstraintSpec::Kind::kRegex, "regex", "(yes|no)!", {}});
    sp.constraint_after_reasoning = span;
    Out out;
    EXPECT_TRUE(e.submit({prompt, sp}, [&](const RequestOutput& o) {
                   for (const auto& t : o.tokens) out.ids.push_back(t.id);
                   if (o.finished) out.finish = o.finished;
                 }).ok());
    e.run_until_idle();
    return out;
  };
  const ByteDfa dfa = compile_regex("(yes|no)!");
  // The reply after the end tag (a special token, or spelled by plain tokens), whitespace skipped: one
  // whitespace token may follow the tag (the reasoning parser drops it).
  auto after_think = [&](const std::vector<TokenId>& ids) {
    const std::string text = tok->decode(ids);
    const size_t at = text.find("</think>");
    EXPECT_NE(at, std::string::npos) << text;
    if (at == std::string::npos) return std::string();
    std::string reply = text.substr(at + 8);
    reply.erase(0, reply.find_first_not_of(" \t\n\r"));
    return reply;
  };
  const SamplingParams::ReasoningSpan glm{"<think>", "</think>", false};

  // The model thinks: the block as scripted, then a match.
  Out o = run(script(true), glm);
  ASSERT_TRUE(o.finish);
  EXPECT_EQ(o.finish->reason, FinishReason::kStop);
  ASSERT_GT(o.ids.size(), thought.size() + 2);
  EXPECT_EQ(o.ids[0], 10);
  EXPECT_EQ(std::vector<TokenId>(o.ids.begin() + 1, o.ids.begin() + 1 + static_cast<long>(thought.size())), thought);
  EXPECT_TRUE(dfa.matches(after_think(o.ids))) << "'" << after_think(o.ids) << "'";

  // Without the span the tags are special tokens the mask never allows: constrained from the start.
  o = run(script(true), std::nullopt);
  EXPECT_TRUE(dfa.matches(tok->decode(o.ids))) << "'" << tok->decode(o.ids) << "'";
  EXPECT_EQ(std::count(o.ids.begin(), o.ids.end(), 10), 0);

  // The template opened the block (deepseek-r1): free until the end tag, then a match.
  o = run(script(false), SamplingParams::ReasoningSpan{"<think>", "</think>", true});
  EXPECT_EQ(std::vector<TokenId>(o.ids.begin(), o.ids.begin() + static_cast<long>(thought.size())), thought);
  EXPECT_TRUE(dfa.matches(after_think(o.ids))) << "'" << after_think(o.ids) << "'";

  // The end tag spelled by plain tokens, the last one running past it ("...>" + "\n"): the reply
  // starts after it, its whitespace skipped.
  const std::vector<TokenId> split_end =
      tok->encode("</think>\n", {.add_special_tokens = false, .parse_special = false});
  ASSERT_GT(split_end.size(), 1u);
  o = run(
      [&](std::span<const int32_t> h) -> int32_t {
        const size_t i = h.size() - prompt.size();
        if (i == 0) return 10;
        if (i - 1 < split_end.size()) return split_end[i - 1];
        return static_cast<int32_t>((h.size() * 7919) % 4000 + 12);
      },
      glm);
  ASSERT_TRUE(o.finish);
  EXPECT_EQ(o.finish->reason, FinishReason::kStop);
  EXPECT_TRUE(dfa.matches(after_think(o.ids))) << "'" << tok->decode(o.ids) << "'";

  // The model does not think (its first favourite is no start tag): the constraint applies at once.
  o = run(script(false), glm);
  EXPECT_NE(o.ids.at(0), 10);
  EXPECT_TRUE(dfa.matches(tok->decode(o.ids))) << "'" << tok->decode(o.ids) << "'";
  EXPECT_EQ(o.finish->reason, FinishReason::kStop);
}

}  // namespace
}  // namespace fp4moe::engine
