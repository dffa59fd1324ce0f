// server::ReasoningParser: the one-shot split (tags at the start only, whitespace around them, an empty
// or unterminated block, the forced format), and streams cut at every place: the deltas concatenate to
// the one-shot split and a tag split across deltas never leaks into either part.
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "server/reasoning.h"
#include "testing/testing.h"

namespace fp4moe::server {
namespace {

const ReasoningFormat& glm45() { return *find_reasoning_format("glm45"); }
const ReasoningFormat& r1() { return *find_reasoning_format("deepseek-r1"); }

void expect_split(const ReasoningFormat& f, const std::string& text, const std::string& reasoning,
                  const std::string& content) {
  const ReasoningSplit s = split_reasoning(f, text);
  EXPECT_EQ(s.reasoning, reasoning) << f.name << ": \"" << text << "\"";
  EXPECT_EQ(s.content, content) << f.name << ": \"" << text << "\"";
}

TEST(Reasoning, FormatsByName) {
  ASSERT_NE(find_reasoning_format("glm45"), nullptr);
  EXPECT_EQ(glm45().start, "<think>");
  EXPECT_EQ(glm45().end, "</think>");
  EXPECT_FALSE(glm45().forced);
  EXPECT_TRUE(r1().forced);
  EXPECT_NE(find_reasoning_format("qwen3"), nullptr);
  EXPECT_EQ(find_reasoning_format("glm4"), nullptr);
  EXPECT_EQ(reasoning_format_names(), "glm45, qwen3, deepseek-r1");
}

TEST(Reasoning, OneShotSplit) {
  expect_split(glm45(), "<think>plan it</think>\n\nThe answer.", "plan it", "The answer.");
  expect_split(glm45(), "\n<think>\nplan\n</think>answer  ", "\nplan\n", "answer  ");
  expect_split(glm45(), "<think></think>Answer", "", "Answer");
  expect_split(glm45(), "<think>still thinking", "still thinking", "");  // cut off inside the block
  expect_split(glm45(), "<think>a</think>", "a", "");
  expect_split(glm45(), "Hello <think>x</think>", "", "Hello <think>x</think>");  // the tag counts at the start only
  expect_split(glm45(), "  plain reply ", "", "  plain reply ");                  // no block: the text as it is
  expect_split(glm45(), "<thinking about it", "", "<thinking about it");
  expect_split(glm45(), "<thi", "", "<thi");
  expect_split(glm45(), "  ", "", "  ");
  expect_split(glm45(), "", "", "");
  expect_split(glm45(), "<think>a</think>b</think>c", "a", "b</think>c");  // one block
  expect_split(r1(), "plan</think>answer", "plan", "answer");              // forced: the prompt opened the block
  expect_split(r1(), "<think>plan</think>answer", "plan", "answer");
  expect_split(r1(), "plan", "plan", "");
}

// Where the reply starts, from the rendered prompt's end: a template that opened the block (GLM-4.7 / GLM-5's
// "<|assistant|><think>") starts it inside; one that closed an empty block (enable_thinking false) makes it all
// answer; otherwise the format decides.
TEST(Reasoning, StartDecidedByThePromptsEnd) {
  EXPECT_EQ(reasoning_start_of_prompt(glm45(), "<|user|>hi<|assistant|><think>"), ReasoningStart::kInside);
  EXPECT_EQ(reasoning_start_of_prompt(glm45(), "<|assistant|>\n<think>\n"), ReasoningStart::kInside);
  EXPECT_EQ(reasoning_start_of_prompt(glm45(), "<|assistant|></think>"), ReasoningStart::kAnswer);
  EXPECT_EQ(reasoning_start_of_prompt(glm45(), "<|assistant|>\n<think></think>\n"), ReasoningStart::kAnswer);
  EXPECT_EQ(reasoning_start_of_prompt(glm45(), "<|user|>hi<|assistant|>"), ReasoningStart::kFormat);
  EXPECT_EQ(reasoning_start_of_prompt(glm45(), "<think>old</think>x<|assistant|>"), ReasoningStart::kFormat);
  auto split = [](std::string_view text, ReasoningStart start) { return split_reasoning(glm45(), text, start); };
  ReasoningSplit s = split("plan</think>\nThe answer.", ReasoningStart::kInside);
  EXPECT_EQ(s.reasoning, "plan");
  EXPECT_EQ(s.content, "The answer.");
  s = split("still thinking", ReasoningStart::kInside);
  EXPECT_EQ(s.reasoning, "still thinking");
  EXPECT_EQ(s.content, "");
  s = split("<think>x</think>y", ReasoningStart::kAnswer);  // thinking off: the text as it is
  EXPECT_EQ(s.reasoning, "");
  EXPECT_EQ(s.content, "<think>x</think>y");
  // Streamed in single bytes, the same split.
  for (const ReasoningStart start : {ReasoningStart::kInside, ReasoningStart::kAnswer}) {
    const std::string text = "a</think> b";
    ReasoningParser p(glm45(), start);
    ReasoningSplit streamed;
    for (size_t i = 0; i < text.size(); ++i) {
      const ReasoningSplit d = p.take(text.substr(i, 1), i + 1 == text.size());
      streamed.reasoning += d.reasoning;
      streamed.content += d.content;
    }
    EXPECT_EQ(streamed.reasoning, split(text, start).reasoning);
    EXPECT_EQ(streamed.content, split(text, start).content);
  }
}

// Random replies from pieces that make and break tags, cut into random deltas (down to one byte each).
TEST(Reasoning, StreamsEqualTheOneShotSplit) {
  const std::vector<std::string> pieces = {"<think>", "</think>", "<th", "</", "think>", "a",
                                           " ",       "\n",       "x<",  "<",  ">"};
  std::mt19937_64 rng(testing::test_seed() + 7);
  for (const ReasoningFormat* f : {&glm45(), &r1()}) {
    for (int trial = 0; trial < 2000; ++trial) {
      std::string text;
      const int n = static_cast<int>(rng() % 12);
      if (rng() % 2) text += std::string(rng() % 3, ' ') + "<think>";
      for (int i = 0; i < n; ++i) text += pieces[rng() % pieces.size()];
      const ReasoningSplit whole = split_reasoning(*f, text);
      ReasoningParser p(*f);
      ReasoningSplit streamed;
      for (size_t at = 0; at < text.size();) {
        const size_t len = std::min<size_t>(text.size() - at, 1 + rng() % 4);
        const ReasoningSplit d = p.push(std::string_view(text).substr(at, len));
        streamed.reasoning += d.reasoning;
        streamed.content += d.content;
        at += len;
      }
      const ReasoningSplit tail = p.finish();
      streamed.reasoning += tail.reasoning;
      streamed.content += tail.content;
      ASSERT_EQ(streamed.reasoning, whole.reasoning) << f->name << ": \"" << text << "\"";
      ASSERT_EQ(streamed.content, whole.content) << f->name << ": \"" << text << "\"";
    }
  }
}

// What a client sees early: the reasoning flows while it is generated (only a possible "</think>"
// prefix is held), and nothing of a tag shows.
TEST(Reasoning, StreamReleasesReasoningAsItComes) {
  ReasoningParser p(glm45());
  EXPECT_EQ(p.push("<thi").reasoning, "");
  ReasoningSplit d = p.push("nk>Let me");
  EXPECT_EQ(d.reasoning, "Let me");
  EXPECT_TRUE(p.saw_reasoning());
  d = p.push(" see.</th");
  EXPECT_EQ(d.reasoning, " see.");
  d = p.push("ink>\n");
  EXPECT_EQ(d.reasoning, "");
  EXPECT_EQ(d.content, "");
  d = p.push("Four.");
  EXPECT_EQ(d.content, "Four.");
  d = p.finish();
  EXPECT_EQ(d.reasoning + d.content, "");
}

}  // namespace
}  // namespace fp4moe::server
