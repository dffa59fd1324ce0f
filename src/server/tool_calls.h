// server::ToolCallParser: turns a model's tool-call markup into OpenAI `tool_calls`, as SGLang's and
// vLLM's `--tool-call-parser glm45` do. GLM-4.5 / GLM-5 write each call as
//
//   <tool_call>get_weather
//   <arg_key>city</arg_key>
//   <arg_value>Paris</arg_value>
//   <arg_key>days</arg_key>
//   <arg_value>3</arg_value>
//   </tool_call>
//
// (what their chat templates render for an assistant's tool_calls): the name, then key / value pairs;
// a value that parses as JSON (a number, true, an object, a quoted string) is that JSON, anything else
// the string itself, and so is any value of an argument the tool declares a string. `arguments` is the JSON object
// text, keys in the order written.
//
// As ReasoningParser (reasoning.h), one state machine for whole and streamed replies: text outside the
// calls is content (the whitespace before a call, and at the end of a reply with calls, dropped), text that may still
// become `<tool_call>` is held back, a call is released whole when its `</tool_call>` arrives; a call cut off or
// without a name stays content, as written, so nothing the model wrote is lost. Tested by
// tests/server/test_tool_calls.cpp.
#pragma once

#include <map>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace fp4moe::server {

struct ToolCallFormat {
  std::string_view name;
  std::string_view start, end;           // "<tool_call>", "</tool_call>"
  std::string_view key_open, key_close;  // "<arg_key>", "</arg_key>"
  std::string_view value_open, value_close;
};

const ToolCallFormat* find_tool_call_format(std::string_view name);  // "glm45"; nullptr for another
std::string tool_call_format_names();

struct ToolCall {
  std::string name;
  std::string arguments;  // a JSON object, as text
};

struct ToolCallSplit {
  std::string content;
  std::vector<ToolCall> calls;
};

class ToolCallParser {
 public:
  // `tools` (the request's OpenAI function definitions, or null): an argument its function declares
  // "type": "string" keeps its text as written even when it would parse as JSON ("007", "true").
  explicit ToolCallParser(const ToolCallFormat& format, const nlohmann::ordered_json& tools = nullptr);
  ToolCallSplit push(std::string_view delta);
  ToolCallSplit finish();
  // push(delta), and with `last` (the reply ends with it) finish() too, in one split.
  ToolCallSplit take(std::string_view delta, bool last);
  int64_t n_calls() const { return n_calls_; }

 private:
  void add_content(std::string_view s, ToolCallSplit& out);
  const ToolCallFormat* f_;
  std::map<std::string, std::set<std::string>> string_args_;  // function -> its string-typed arguments
  std::string held_;
  bool in_call_ = false;
  int64_t n_calls_ = 0;
  bool after_call_ = false;     // a call (or its start) was seen
  std::string pending_ws_;      // content's trailing whitespace, released before more content (dropped
                                // before a call, and at the end once a call was seen)
  std::string ws_before_call_;  // the whitespace a call dropped, given back if it is no call
};

ToolCallSplit parse_tool_calls(const ToolCallFormat& format, std::string_view text,
                               const nlohmann::ordered_json& tools = nullptr);

// OpenAI tool_choice "required" (only_name empty: one or more calls of any of `tools`) or a named
// function (exactly one call of it) as a regex (engine/regex_dfa.h) over `format`'s markup, laid out as
// the chat templates render calls: the name, then "\n<arg_key>k</arg_key>\n<arg_value>v</arg_value>"
// pairs, then "\n</tool_call>". Arguments are the function's parameters.properties, each at most once
// in their order, the `required` ones always (any names, any number, when it lists none); a value is JSON of its
// property's schema (engine/json_schema.h, compact) when the property has a type other than string; for a string one of
// its `enum` (raw), or at most `maxLength` characters without '<', otherwise raw text without "</" (a string as the
// templates write it). A property schema the JSON-schema subset refuses falls back to raw text.
// `one_call` (parallel_tool_calls false): "required" is exactly one call instead of one or more.
std::string forced_tool_call_regex(const ToolCallFormat& format, const nlohmann::ordered_json& tools,
                                   const std::string& only_name, bool one_call = false);

}  // namespace fp4moe::server
