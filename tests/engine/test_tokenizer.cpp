// Tokenizer tests: the golden HF cases (ids, decode), the load-time rejections with their JSON paths,
// added-token flags, random text round trips, and the incremental detokenizer on split characters.
// Run: test_tokenizer (needs shared/golden/tokenizer; FP4MOE_TEST_SEED replays the random cases).
#include <gtest/gtest.h>

#include <atomic>
#include <fstream>
#include <random>
#include <sstream>
#include <thread>

#include "core/error.h"
#include "engine/tokenizer.h"
#include "engine/tokenizer_text.h"
#include "testing/testing.h"

namespace fp4moe::engine {
namespace {

using nlohmann::json;

json read_json(const std::filesystem::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return json::parse(ss.str());
}

const Tokenizer& golden_tokenizer() {
  static const Tokenizer tok = Tokenizer::load(testing::shared_path("golden/tokenizer"));
  return tok;
}

std::string ids_str(const std::vector<TokenId>& ids) {
  std::string s;
  for (TokenId id : ids) s += std::to_string(id) + " ";
  return s;
}

TEST(TokenizerGolden, EncodeCasesMatchHf) {
  const json cases = read_json(testing::shared_path("golden/tokenizer/encode_cases.json"));
  const Tokenizer& tok = golden_tokenizer();
  ASSERT_GE(cases.at("cases").size(), 10u);
  for (const json& c : cases.at("cases")) {
    const std::string text = c.at("text").get<std::string>();
    const std::vector<TokenId> expected = c.at("ids").get<std::vector<TokenId>>();
    const std::vector<TokenId> got = tok.encode(text);
    EXPECT_EQ(got, expected) << "text: " << text << "\n got: " << ids_str(got) << "\nwant: " << ids_str(expected);
    const auto tokens = c.at("tokens").get<std::vector<std::string>>();
    ASSERT_EQ(tokens.size(), expected.size());
    for (size_t i = 0; i < tokens.size(); ++i) EXPECT_EQ(tok.id_to_token(expected[i]), tokens[i]) << "token " << i;
    EXPECT_EQ(tok.decode(expected), c.at("decoded").get<std::string>()) << "text: " << text;
  }
}

TEST(TokenizerGolden, ChatIdsMatchHf) {
  const json chat = read_json(testing::shared_path("golden/tokenizer/encode_cases.json")).at("chat");
  EXPECT_EQ(golden_tokenizer().encode(chat.at("rendered").get<std::string>()), chat.at("ids").get<std::vector<TokenId>>());
}

TEST(TokenizerGolden, ConfigTokensAndVocab) {
  const Tokenizer& tok = golden_tokenizer();
  EXPECT_EQ(tok.vocab_size(), 4096);
  EXPECT_EQ(tok.eos_token(), "<|endoftext|>");
  ASSERT_TRUE(tok.eos_id().has_value());
  EXPECT_EQ(*tok.eos_id(), 0);
  EXPECT_FALSE(tok.bos_id().has_value());
  EXPECT_TRUE(tok.is_special(7));
  EXPECT_EQ(tok.token_to_id("<|user|>"), std::optional<TokenId>(7));
  EXPECT_EQ(tok.token_bytes(232), " ");  // "Ġ"
  EXPECT_THROW(tok.id_to_token(1 << 20), Error);
}

TEST(TokenizerGolden, SkipSpecialTokensAndParseSpecialOff) {
  const Tokenizer& tok = golden_tokenizer();
  const std::vector<TokenId> ids = tok.encode("<|user|>\nhi<|assistant|>\n");
  EXPECT_EQ(tok.decode(ids, {.skip_special_tokens = true}), "\nhi\n");
  const std::vector<TokenId> literal = tok.encode("<|user|>", {.parse_special = false});
  EXPECT_GT(literal.size(), 1u) << ids_str(literal);
  for (TokenId id : literal) EXPECT_FALSE(tok.is_special(id));
  EXPECT_EQ(tok.decode(literal), "<|user|>");
}

TEST(TokenizerGolden, NfdInputIsComposed) {
  const Tokenizer& tok = golden_tokenizer();
  EXPECT_EQ(tok.normalize("e\xCC\x81"), "\xC3\xA9");  // e + U+0301 -> U+00E9
  EXPECT_EQ(tok.encode("e\xCC\x81"), tok.encode("\xC3\xA9"));
}

TEST(TokenizerGolden, InvalidUtf8IsRejectedWithOffset) {
  try {
    golden_tokenizer().encode(std::string("ab\xFF" "c"));
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("invalid UTF-8 at byte 2 of 4"), std::string::npos) << e.what();
  }
}

// Random strings of code points from several scripts (combining marks included), specials and
// whitespace: decode(encode(s)) must give back s with each stretch between special tokens in NFC (HF
// splits out non-normalized added tokens before normalizing, so NFC never composes across them), and
// every id must be a real token.
TEST(TokenizerGolden, RandomTextRoundTrips) {
  const Tokenizer& tok = golden_tokenizer();
  std::mt19937_64 rng(testing::test_seed());
  const std::vector<std::pair<char32_t, char32_t>> ranges = {
      {0x20, 0x7E}, {0x09, 0x0D}, {0xA0, 0x24F}, {0x300, 0x36F}, {0x400, 0x4FF},
      {0x4E00, 0x4FFF}, {0x3000, 0x303F}, {0x1F600, 0x1F64F}, {0x10000, 0x10FFFF}};
  const std::vector<std::string> specials = {"<|user|>", "<|assistant|>", "[gMASK]", "<sop>", "</think>"};
  for (int trial = 0; trial < 300; ++trial) {
    std::string s, expected, plain;
    const int n = static_cast<int>(rng() % 60);
    for (int i = 0; i <= n; ++i) {
      if (i == n || rng() % 25 == 0) {
        expected += tok.normalize(plain);
        plain.clear();
        if (i == n) break;
        const std::string& special = specials[rng() % specials.size()];
        s += special;
        expected += special;
        continue;
      }
      auto [lo, hi] = ranges[rng() % ranges.size()];
      char32_t cp = lo + static_cast<char32_t>(rng() % (hi - lo + 1));
      if (cp >= 0xD800 && cp <= 0xDFFF) cp = 'x';
      std::string c;
      text::append_utf8(c, cp);
      s += c;
      plain += c;
    }
    const std::vector<TokenId> ids = tok.encode(s);
    for (TokenId id : ids) ASSERT_TRUE(id >= 0 && id < tok.vocab_size()) << id;
    ASSERT_EQ(tok.decode(ids), expected) << "trial " << trial << " ids " << ids_str(ids);
  }
}

// Random byte strings (mostly invalid UTF-8) through the byte-level path: the bytes of the tokens of a
// valid string concatenate back to it, and token_bytes/decode agree on lossy conversion.
TEST(TokenizerGolden, RandomBytesDecodeLossily) {
  const Tokenizer& tok = golden_tokenizer();
  std::mt19937_64 rng(testing::test_seed() + 1);
  for (int trial = 0; trial < 300; ++trial) {
    std::vector<TokenId> ids;
    std::string bytes;
    const int n = static_cast<int>(rng() % 40);
    for (int i = 0; i < n; ++i) {
      const TokenId id = 12 + static_cast<TokenId>(rng() % (tok.vocab_size() - 12));  // ids >= 12 are BPE tokens
      ids.push_back(id);
      bytes += tok.token_bytes(id);
    }
    std::string expected;
    text::append_lossy_utf8(expected, bytes, true);
    ASSERT_EQ(tok.decode(ids), expected) << "trial " << trial;
    ASSERT_FALSE(text::find_invalid_utf8(expected).has_value());
    if (!text::find_invalid_utf8(bytes)) {
      ASSERT_EQ(tok.decode(tok.encode(bytes)), tok.normalize(bytes));
    }
  }
}

// Long single-class runs: one huge pre-token each (BPE over 200k symbols, regex backtracking over
// 200k spaces); they must round-trip (and, with the heap-based merge, finish in well under a second).
TEST(TokenizerGolden, LongRunsRoundTrip) {
  const Tokenizer& tok = golden_tokenizer();
  for (const std::string unit : {"a", " ", "\n", "7", "é", "😀", " \n"}) {
    std::string s;
    while (s.size() < 200000) s += unit;
    const std::vector<TokenId> ids = tok.encode(s);
    ASSERT_EQ(tok.decode(ids), s) << "unit '" << unit << "' n_ids " << ids.size();
  }
}

// The word cache is shared: encoding from several threads at once must give the single-thread ids.
TEST(TokenizerGolden, ConcurrentEncodesAgree) {
  const json cases = read_json(testing::shared_path("golden/tokenizer/encode_cases.json"));
  const Tokenizer tok = Tokenizer::load(testing::shared_path("golden/tokenizer"));  // fresh, empty cache
  std::vector<std::thread> threads;
  std::atomic<int> n_mismatches{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int round = 0; round < 20; ++round) {
        for (size_t i = 0; i < cases["cases"].size(); ++i) {
          const json& c = cases["cases"][(i + t) % cases["cases"].size()];
          if (tok.encode(c["text"].get<std::string>()) != c["ids"].get<std::vector<TokenId>>()) ++n_mismatches;
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(n_mismatches.load(), 0);
}

TEST(IncrementalDetokenizer, HoldsSplitCharactersUntilComplete) {
  const Tokenizer& tok = golden_tokenizer();
  // "机器" is split mid-character by the golden BPE (ids 2784 "æľ", 2936 "ºå", ...).
  const std::string text = "机器学习是人工智能的一个分支。 Emoji 😀🚀 <|user|>x";
  const std::vector<TokenId> ids = tok.encode(text);
  IncrementalDetokenizer detok(tok);
  std::string streamed;
  bool held_back = false;
  for (TokenId id : ids) {
    const std::string piece = detok.push(id);
    EXPECT_FALSE(text::find_invalid_utf8(piece).has_value()) << "push emitted a partial character";
    held_back = held_back || detok.pending_bytes() > 0;
    streamed += piece;
  }
  streamed += detok.flush();
  EXPECT_TRUE(held_back) << "the case never split a character; it tests nothing";
  EXPECT_EQ(streamed, tok.decode(ids));
  EXPECT_EQ(streamed, text);
}

// skip_special_tokens drops special tokens but those asked to be kept (a reasoning parser's tags where the
// tokenizer marks them special: the golden tokenizer's <think> 10 and </think> 11).
TEST(IncrementalDetokenizer, KeepsTheSpecialTokensAskedFor) {
  const Tokenizer& tok = golden_tokenizer();
  const std::vector<TokenId> ids = tok.encode("<think>plan</think>answer<|user|>");
  ASSERT_TRUE(tok.is_special(10) && tok.is_special(11));
  auto stream = [&](IncrementalDetokenizer d) {
    std::string out;
    for (TokenId id : ids) out += d.push(id);
    return out + d.flush();
  };
  EXPECT_EQ(stream(IncrementalDetokenizer(tok, true)), "plananswer");
  EXPECT_EQ(stream(IncrementalDetokenizer(tok, true, {10, 11})), "<think>plan</think>answer");
  EXPECT_EQ(stream(IncrementalDetokenizer(tok, false, {10})), "<think>plan</think>answer<|user|>");
}

TEST(IncrementalDetokenizer, FlushTurnsTruncatedCharacterIntoReplacement) {
  const Tokenizer& tok = golden_tokenizer();
  IncrementalDetokenizer detok(tok);
  const TokenId first_half = 2784;  // "æľ" = bytes E6 9C: two of the three bytes of 机
  EXPECT_EQ(detok.push(first_half), "");
  EXPECT_EQ(detok.pending_bytes(), 2u);
  EXPECT_EQ(detok.flush(), "\xEF\xBF\xBD");
  EXPECT_EQ(tok.decode(std::vector<TokenId>{first_half}), "\xEF\xBF\xBD");
  // A special token in between ends the pending bytes, as decode() does.
  EXPECT_EQ(detok.push(first_half), "");
  EXPECT_EQ(detok.push(7), "\xEF\xBF\xBD<|user|>");
  IncrementalDetokenizer skipping(tok, /*skip_special_tokens=*/true);
  EXPECT_EQ(skipping.push(7), "");
}

TEST(UtfLossy, MaximalSubpartsBecomeOneReplacementEach) {
  std::string out;
  // E0 80: E0 needs A0..BF next, so E0 alone is one subpart and 80 another.
  EXPECT_EQ(text::append_lossy_utf8(out, "a\xE0\x80z", true), 4u);
  EXPECT_EQ(out, "a\xEF\xBF\xBD\xEF\xBF\xBDz");
  out.clear();
  // F0 9F 98 is a valid prefix of 😀 cut short: one replacement when final, held when not.
  EXPECT_EQ(text::append_lossy_utf8(out, "\xF0\x9F\x98", false), 0u);
  EXPECT_EQ(text::append_lossy_utf8(out, "\xF0\x9F\x98", true), 3u);
  EXPECT_EQ(out, "\xEF\xBF\xBD");
  EXPECT_EQ(text::find_invalid_utf8("ok\xED\xA0\x80"), std::optional<size_t>(2));  // surrogate
}

TEST(ByteLevelMap, IsABijectionOverAllBytes) {
  const auto& map = text::ByteLevelMap::get();
  EXPECT_EQ(map.encode_byte(' '), "\xC4\xA0");   // Ġ
  EXPECT_EQ(map.encode_byte('\n'), "\xC4\x8A");  // Ċ
  EXPECT_EQ(map.encode_byte('A'), "A");
  for (int b = 0; b < 256; ++b) {
    const std::string& c = map.encode_byte(static_cast<uint8_t>(b));
    size_t i = 0;
    EXPECT_EQ(map.decode_char(text::next_code_point(c, i)), b);
  }
}

// A minimal tokenizer.json to exercise loader rules and added-token flags without the golden file.
json tiny_tokenizer_json() {
  json vocab = json::object();
  const auto& map = text::ByteLevelMap::get();
  for (int b = 0; b < 256; ++b) vocab[map.encode_byte(static_cast<uint8_t>(b))] = b;
  vocab["ab"] = 256;
  vocab["abc"] = 257;
  return json{
      {"added_tokens",
       json::array({json{{"id", 300}, {"content", "<s>"}, {"special", true}, {"normalized", false}},
                    json{{"id", 301}, {"content", "<mask>"}, {"special", true}, {"normalized", false},
                         {"lstrip", true}, {"rstrip", true}},
                    json{{"id", 302}, {"content", "word"}, {"special", false}, {"normalized", true},
                         {"single_word", true}}})},
      {"normalizer", {{"type", "Sequence"}, {"normalizers", json::array({json{{"type", "NFC"}}})}}},
      {"pre_tokenizer",
       {{"type", "Sequence"},
        {"pretokenizers",
         json::array({json{{"type", "Split"}, {"pattern", {{"Regex", "\\s+"}}}, {"behavior", "Removed"},
                           {"invert", false}},
                      json{{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}})}}},
      {"post_processor",
       {{"type", "TemplateProcessing"},
        {"single", json::array({json{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}},
                                json{{"Sequence", {{"id", "A"}, {"type_id", 0}}}}})},
        {"special_tokens", {{"<s>", {{"id", "<s>"}, {"ids", {300}}, {"tokens", {"<s>"}}}}}}}},
      {"decoder", {{"type", "ByteLevel"}}},
      {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", json::array({"a b", json::array({"ab", "c"})})}}}};
}

TEST(TokenizerLoad, AddedTokenFlagsAndPostProcessor) {
  const Tokenizer tok = Tokenizer::from_json(tiny_tokenizer_json(), json());
  // Split/Removed drops whitespace; "abc" merges twice (string and array merge forms).
  EXPECT_EQ(tok.encode("abc  ab"), (std::vector<TokenId>{257, 256}));
  // lstrip/rstrip: <mask> swallows the spaces around it.
  EXPECT_EQ(tok.encode("ab <mask> c"), (std::vector<TokenId>{256, 301, 'c'}));
  // single_word: "word" inside "swordfish" is not the added token.
  EXPECT_EQ(tok.encode("a word"), (std::vector<TokenId>{'a', 302}));
  EXPECT_EQ(tok.encode("swords").size(), 6u);
  EXPECT_EQ(tok.encode("ab", {.add_special_tokens = true}), (std::vector<TokenId>{300, 256}));
}

// The five Split behaviours on HF's documentation example ("the-final--countdown" split on "-"),
// and `invert`.
TEST(TokenizerLoad, SplitBehaviorsMatchHf) {
  using Pieces = std::vector<std::string>;
  const std::vector<std::pair<std::string, Pieces>> expected = {
      {"Removed", {"the", "final", "countdown"}},
      {"Isolated", {"the", "-", "final", "-", "-", "countdown"}},
      {"MergedWithPrevious", {"the-", "final-", "-", "countdown"}},
      {"MergedWithNext", {"the", "-final", "-", "-countdown"}},
      {"Contiguous", {"the", "-", "final", "--", "countdown"}}};
  for (const auto& [behavior, pieces] : expected) {
    json tj = tiny_tokenizer_json();
    tj["pre_tokenizer"]["pretokenizers"][0] =
        json{{"type", "Split"}, {"pattern", {{"String", "-"}}}, {"behavior", behavior}, {"invert", false}};
    EXPECT_EQ(Tokenizer::from_json(tj, json()).pre_tokenize("the-final--countdown"), pieces) << behavior;
  }
  json tj = tiny_tokenizer_json();
  tj["pre_tokenizer"]["pretokenizers"][0] =
      json{{"type", "Split"}, {"pattern", {{"Regex", "[a-z]+"}}}, {"behavior", "Removed"}, {"invert", true}};
  EXPECT_EQ(Tokenizer::from_json(tj, json()).pre_tokenize("ab-cd"), (Pieces{"ab", "cd"}));
  EXPECT_EQ(golden_tokenizer().pre_tokenize("I'm x  1234\n\n"),
            (Pieces{"I", "'m", " x", " ", " ", "123", "4", "\n\n"}));
}

void expect_load_error(const json& tj, const std::string& needle) {
  try {
    Tokenizer::from_json(tj, json(), "t.json");
    FAIL() << "loaded; expected an error containing: " << needle;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(TokenizerLoad, UnsupportedPartsNameTheirJsonPath) {
  json tj = tiny_tokenizer_json();
  tj["normalizer"]["normalizers"][0]["type"] = "Lowercase";
  expect_load_error(tj, "t.json: normalizer.normalizers[0].type is 'Lowercase'");
  tj = tiny_tokenizer_json();
  tj["pre_tokenizer"]["pretokenizers"][0] = json{{"type", "Whitespace"}};
  expect_load_error(tj, "pre_tokenizer.pretokenizers[0].type is 'Whitespace'");
  tj = tiny_tokenizer_json();
  tj["model"]["type"] = "Unigram";
  expect_load_error(tj, "model.type is 'Unigram'");
  tj = tiny_tokenizer_json();
  tj["decoder"] = json{{"type", "Metaspace"}};
  expect_load_error(tj, "decoder.type is 'Metaspace'");
  tj = tiny_tokenizer_json();
  tj["model"]["merges"].push_back("x yz");
  expect_load_error(tj, "model.merges[2] (x, yz)");
  tj = tiny_tokenizer_json();
  tj["pre_tokenizer"]["pretokenizers"][0]["pattern"] = json{{"Regex", "(unclosed"}};
  expect_load_error(tj,
                    "t.json: pre_tokenizer.pretokenizers[0].pattern.Regex: cannot compile regex /(unclosed/ at offset "
                    "9: missing closing parenthesis");
  tj["pre_tokenizer"]["pretokenizers"][0]["pattern"] = json{{"Regex", 3}};
  expect_load_error(tj, "t.json: pre_tokenizer.pretokenizers[0].pattern.Regex must be a string, found 3");
  tj = tiny_tokenizer_json();
  tj["pre_tokenizer"]["pretokenizers"] = 5;
  expect_load_error(tj, "t.json: pre_tokenizer.pretokenizers must be a list, found 5");
  tj = tiny_tokenizer_json();
  tj["added_tokens"][0]["content"] = 5;
  expect_load_error(tj, "t.json: added_tokens[0].content must be a string, found 5");
  tj = tiny_tokenizer_json();
  tj["model"] = 5;  // was nlohmann's "cannot use value() with number"
  expect_load_error(tj, "t.json: model must be an object (a BPE model), found number");
}

}  // namespace
}  // namespace fp4moe::engine
