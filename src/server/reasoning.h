// server::ReasoningParser: splits a reasoning model's output into its thinking and its answer, as
// SGLang's and vLLM's `--reasoning-parser` do for the OpenAI chat API (`message.reasoning_content` /
// `delta.reasoning_content` beside `content`). GLM-4.5 / GLM-5 think between `<think>` and `</think>`
// at the start of their reply (with `enable_thinking: false` the chat template closes an empty block in
// the prompt and the reply is all answer).
//
// One state machine serves both replies: the whole text is one push() + finish(); a stream pushes each
// delta and holds back only what could still be part of a tag (a `<thi` at the start, a `</thi` at the
// end of the reasoning), so the deltas concatenate to the one-shot split. Text after the start tag's
// position that is not the tag means no reasoning (unless the format forces it: DeepSeek-R1's template
// opens the block in the prompt); the answer's leading whitespace after `</think>` is dropped; a reply
// that ends inside the block is all reasoning.
// Tested by tests/server/test_reasoning.cpp.
#pragma once

#include <string>
#include <string_view>

namespace fp4moe::server {

struct ReasoningFormat {
  std::string_view name;
  std::string_view start;  // "<think>"
  std::string_view end;    // "</think>"
  bool forced = false;     // the reply starts inside the block (its start tag is in the prompt)
};

// "glm45" (also GLM-5), "qwen3", "deepseek-r1" (forced); nullptr for another name.
const ReasoningFormat* find_reasoning_format(std::string_view name);
std::string reasoning_format_names();  // "glm45, qwen3, deepseek-r1" (for errors and --help)

// Where a reply starts, read from the end of its rendered prompt: GLM-4.7 / GLM-5 templates open the block in the
// prompt ("<|assistant|><think>": the reply starts inside it), and with enable_thinking false templates close an
// empty one ("<think></think>" or "</think>": the reply is all answer); otherwise the format decides (the reply's own
// start tag, or `forced`).
enum class ReasoningStart : unsigned char { kFormat, kInside, kAnswer };
ReasoningStart reasoning_start_of_prompt(const ReasoningFormat& format, std::string_view prompt);

struct ReasoningSplit {
  std::string reasoning;
  std::string content;
};

class ReasoningParser {
 public:
  explicit ReasoningParser(const ReasoningFormat& format, ReasoningStart start = ReasoningStart::kFormat);
  // The next piece of the reply; returns what is decided so far and not returned before.
  ReasoningSplit push(std::string_view delta);
  // The end of the reply: whatever was held back.
  ReasoningSplit finish();
  // push(delta), and with `last` (the reply ends with it) finish() too, in one split.
  ReasoningSplit take(std::string_view delta, bool last);
  bool saw_reasoning() const { return saw_reasoning_; }

 private:
  enum class Phase : unsigned char { kStart, kReasoning, kContent };
  const ReasoningFormat* f_;
  Phase phase_ = Phase::kStart;
  std::string held_;
  bool content_started_ = false;
  bool saw_reasoning_ = false;
  void to_content(std::string_view s, ReasoningSplit& out);
};

// The whole reply at once.
ReasoningSplit split_reasoning(const ReasoningFormat& format, std::string_view text,
                               ReasoningStart start = ReasoningStart::kFormat);

}  // namespace fp4moe::server
