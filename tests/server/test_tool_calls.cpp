// server::ToolCallParser (glm45): calls with typed and string arguments in order, content around them,
// malformed and cut-off calls kept as text, and streams cut at every place equal to the one-shot parse;
// a tool round trip through a GLM-4.5-style template (the calls it renders parse back to themselves).
#include <gtest/gtest.h>

#include <random>
#include <set>
#include <string>
#include <vector>

#include "engine/chat_template.h"
#include "engine/constraint.h"
#include "engine/regex_dfa.h"
#include "server/protocol.h"
#include "server/tool_calls.h"
#include "testing/testing.h"

namespace fp4moe::server {
namespace {

const ToolCallFormat& glm45() { return *find_tool_call_format("glm45"); }

TEST(ToolCalls, FormatsByName) {
  ASSERT_NE(find_tool_call_format("glm45"), nullptr);
  EXPECT_EQ(find_tool_call_format("hermes"), nullptr);
  EXPECT_EQ(tool_call_format_names(), "glm45");
}

TEST(ToolCalls, OneShotParse) {
  ToolCallSplit s = parse_tool_calls(glm45(),
                                     "Let me check.\n<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris"
                                     "</arg_value>\n<arg_key>days</arg_key>\n<arg_value>3</arg_value>\n<arg_key>opts"
                                     "</arg_key>\n<arg_value>{\"unit\": \"C\"}</arg_value>\n</tool_call>\n<tool_call>"
                                     "now\n</tool_call>\n");
  EXPECT_EQ(s.content, "Let me check.");
  ASSERT_EQ(s.calls.size(), 2u);
  EXPECT_EQ(s.calls[0].name, "get_weather");
  EXPECT_EQ(s.calls[0].arguments, R"({"city":"Paris","days":3,"opts":{"unit":"C"}})");
  EXPECT_EQ(s.calls[1].name, "now");
  EXPECT_EQ(s.calls[1].arguments, "{}");

  s = parse_tool_calls(glm45(), "<tool_call>f\n<arg_key>q</arg_key><arg_value>\"7\"</arg_value></tool_call>");
  ASSERT_EQ(s.calls.size(), 1u);
  EXPECT_EQ(s.calls[0].arguments, R"({"q":"7"})") << "a quoted value is the JSON string";
  EXPECT_EQ(s.content, "");

  // Numbers as written (a double would round the integers past 64 bits), JSON values compacted, a repeated
  // key's last value in the first one's place, text that is not JSON (even almost) a string.
  const std::string nines(138, '9');
  s = parse_tool_calls(glm45(), "<tool_call>f\n<arg_key>a</arg_key><arg_value>" + nines +
                                    "</arg_value><arg_key>b</arg_key><arg_value> {\"x\": [1, 18446744073709551616, "
                                    "-2.50e3, true], \"y\" : {\"z\":null, \"w\":\"\\u00e9\"}} </arg_value>"
                                    "<arg_key>a</arg_key><arg_value>-0</arg_value><arg_key>c</arg_key><arg_value>[1,"
                                    "</arg_value></tool_call>");
  ASSERT_EQ(s.calls.size(), 1u);
  EXPECT_EQ(s.calls[0].arguments,
            R"({"a":0,"b":{"x":[1,18446744073709551616,-2.50e3,true],"y":{"z":null,"w":"é"}},"c":"[1,"})");
  s = parse_tool_calls(glm45(), "<tool_call>f\n<arg_key>big</arg_key><arg_value>" + nines + "</arg_value></tool_call>");
  ASSERT_EQ(s.calls.size(), 1u);
  EXPECT_EQ(s.calls[0].arguments, "{\"big\":" + nines + "}");
  EXPECT_EQ(nlohmann::json::parse(s.calls[0].arguments)["big"].is_number(), true);

  s = parse_tool_calls(glm45(), "  A plain answer.\n");
  EXPECT_TRUE(s.calls.empty());
  EXPECT_EQ(s.content, "  A plain answer.\n") << "no call: the text as it is";

  s = parse_tool_calls(glm45(), "x <tool_call>bad name\n<arg_key>a</arg_key></tool_call> y");
  EXPECT_TRUE(s.calls.empty());
  EXPECT_EQ(s.content, "x <tool_call>bad name\n<arg_key>a</arg_key></tool_call> y") << "malformed: kept as text";

  s = parse_tool_calls(glm45(), "<tool_call>f\n<arg_key>a</arg_key>\n<arg_value>1");
  EXPECT_TRUE(s.calls.empty());
  EXPECT_EQ(s.content, "<tool_call>f\n<arg_key>a</arg_key>\n<arg_value>1") << "cut off: kept as text";
}

TEST(ToolCalls, StreamsEqualTheOneShotParse) {
  const std::vector<std::string> pieces = {"<tool_call>",
                                           "</tool_call>",
                                           "f",
                                           "\n",
                                           " ",
                                           "<arg_key>k</arg_key>",
                                           "<arg_value>1</arg_value>",
                                           "<arg_value>v w</arg_value>",
                                           "<tool",
                                           "_call>",
                                           "text",
                                           "<",
                                           ">",
                                           "</arg_key>"};
  std::mt19937_64 rng(testing::test_seed() + 11);
  for (int trial = 0; trial < 3000; ++trial) {
    std::string text;
    const int n = static_cast<int>(rng() % 14);
    for (int i = 0; i < n; ++i) text += pieces[rng() % pieces.size()];
    const ToolCallSplit whole = parse_tool_calls(glm45(), text);
    ToolCallParser p(glm45());
    ToolCallSplit streamed;
    for (size_t at = 0; at < text.size();) {
      const size_t len = std::min<size_t>(text.size() - at, 1 + rng() % 5);
      ToolCallSplit d = p.push(std::string_view(text).substr(at, len));
      streamed.content += d.content;
      for (auto& c : d.calls) streamed.calls.push_back(c);
      at += len;
    }
    ToolCallSplit tail = p.finish();
    streamed.content += tail.content;
    for (auto& c : tail.calls) streamed.calls.push_back(c);
    ASSERT_EQ(streamed.content, whole.content) << "\"" << text << "\"";
    ASSERT_EQ(streamed.calls.size(), whole.calls.size()) << "\"" << text << "\"";
    for (size_t i = 0; i < whole.calls.size(); ++i) {
      ASSERT_EQ(streamed.calls[i].name, whole.calls[i].name);
      ASSERT_EQ(streamed.calls[i].arguments, whole.calls[i].arguments);
    }
  }
}

// A client sends back the assistant's tool_calls (arguments as JSON text) with the tool's result: the
// request parser hands the template objects, a template written the way GLM-4.5's renders assistant
// calls (name, then key / value pairs; non-string values as JSON) and the tool turn, and the glm45
// parser reads the rendered calls back as the same name and arguments.
TEST(ToolCalls, RoundTripThroughAGlmStyleTemplate) {
  const std::string source = R"J({%- for m in messages -%}
{%- if m.role == 'user' -%}<|user|>
{{ m.content }}
{%- elif m.role == 'assistant' -%}<|assistant|>
{{ m.content or '' }}
{%- if m.tool_calls -%}
{%- for tc in m.tool_calls -%}
{%- if tc.function %}{%- set tc = tc.function %}{%- endif %}
{{ '<tool_call>' + tc.name }}
{% for k, v in tc.arguments.items() -%}
<arg_key>{{ k }}</arg_key>
<arg_value>{{ v | tojson(ensure_ascii=False) if v is not string else v }}</arg_value>
{% endfor -%}
</tool_call>
{%- endfor -%}
{%- endif -%}
{%- elif m.role == 'tool' -%}<|observation|>
<tool_response>{{ m.content }}</tool_response>
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt %}<|assistant|>{% endif -%})J";
  const engine::ChatTemplate tmpl(source, nlohmann::ordered_json::object());
  const std::string args_text = R"({"city": "Paris", "days": 3, "opts": {"unit": "C"}, "note": "a b"})";
  const nlohmann::json body = {{"messages",
                                {{{"role", "user"}, {"content", "Weather?"}},
                                 {{"role", "assistant"},
                                  {"content", ""},
                                  {"tool_calls",
                                   {{{"id", "call_1"},
                                     {"type", "function"},
                                     {"function", {{"name", "get_weather"}, {"arguments", args_text}}}}}}},
                                 {{"role", "tool"}, {"content", "sunny"}}}}};
  const ParsedRequest req = parse_request(Endpoint::kChat, body);
  const std::string rendered = tmpl.render(*req.messages);
  EXPECT_NE(rendered.find("<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>"),
            std::string::npos)
      << rendered;
  EXPECT_NE(rendered.find("<tool_response>sunny</tool_response>"), std::string::npos) << rendered;
  const size_t a = rendered.find("<tool_call>"), b = rendered.find("</tool_call>") + std::string("</tool_call>").size();
  ASSERT_NE(a, std::string::npos);
  const ToolCallSplit back = parse_tool_calls(glm45(), rendered.substr(a, b - a));
  ASSERT_EQ(back.calls.size(), 1u) << rendered;
  EXPECT_EQ(back.calls[0].name, "get_weather");
  EXPECT_EQ(back.calls[0].arguments, R"({"city":"Paris","days":3,"opts":{"unit":"C"},"note":"a b"})");
}

// tool_choice "required" / a named function: the forced-call regex accepts the calls the templates
// render and refuses others; random texts it accepts parse into calls of the tools with typed values.
TEST(ToolCalls, ForcedCallRegex) {
  const auto tools = nlohmann::ordered_json::parse(R"([
    {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}, "days": {"type": "integer", "minimum": 1, "maximum": 14},
        "unit": {"type": "string", "enum": ["C", "F"]}, "note": {"type": "string", "maxLength": 3}}}}},
    {"type": "function", "function": {"name": "ping"}},
    {"type": "function", "function": {"name": "must", "parameters": {"properties": {"a": {"type": "boolean"}},
        "required": ["a"]}}}])");
  const engine::ByteDfa any = engine::compile_regex(forced_tool_call_regex(glm45(), tools, ""));
  const engine::ByteDfa ping = engine::compile_regex(forced_tool_call_regex(glm45(), tools, "ping"));
  const std::string weather =
      "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris <3</arg_value>\n<arg_key>days</arg_key>\n"
      "<arg_value>3</arg_value>\n</tool_call>";
  const std::string pong = "<tool_call>ping\n<arg_key>host</arg_key>\n<arg_value>a.b</arg_value>\n</tool_call>";
  EXPECT_TRUE(any.matches(weather));
  EXPECT_TRUE(any.matches(weather + "\n" + pong));
  EXPECT_TRUE(any.matches("<tool_call>ping\n</tool_call>"));
  EXPECT_FALSE(any.matches("Sure. " + weather)) << "a forced reply is calls only";
  EXPECT_FALSE(any.matches("<tool_call>get_time\n</tool_call>"));
  EXPECT_FALSE(any.matches("<tool_call>get_weather\n<arg_key>town</arg_key>\n<arg_value>x</arg_value>\n</tool_call>"));
  EXPECT_FALSE(any.matches("<tool_call>get_weather\n<arg_key>days</arg_key>\n<arg_value>15</arg_value>\n</tool_call>"));
  EXPECT_FALSE(
      any.matches("<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>a</b</arg_value>\n</tool_call>"));
  const std::string pre = "<tool_call>get_weather\n<arg_key>";
  EXPECT_TRUE(any.matches(pre + "unit</arg_key>\n<arg_value>F</arg_value>\n</tool_call>"));
  EXPECT_FALSE(any.matches(pre + "unit</arg_key>\n<arg_value>K</arg_value>\n</tool_call>"));
  EXPECT_TRUE(any.matches(pre + "note</arg_key>\n<arg_value>abc</arg_value>\n</tool_call>"));
  EXPECT_FALSE(any.matches(pre + "note</arg_key>\n<arg_value>abcd</arg_value>\n</tool_call>"));
  EXPECT_FALSE(any.matches(pre + "note</arg_key>\n<arg_value>a</arg_value>\n<arg_key>note</arg_key>\n"
                                 "<arg_value>b</arg_value>\n</tool_call>"))
      << "an argument at most once";
  EXPECT_FALSE(any.matches(pre + "days</arg_key>\n<arg_value>3</arg_value>\n<arg_key>city</arg_key>\n"
                                 "<arg_value>b</arg_value>\n</tool_call>"))
      << "in the schema's order";
  EXPECT_TRUE(any.matches("<tool_call>must\n<arg_key>a</arg_key>\n<arg_value>true</arg_value>\n</tool_call>"));
  EXPECT_FALSE(any.matches("<tool_call>must\n</tool_call>")) << "a required argument";
  EXPECT_TRUE(ping.matches(pong));
  // parallel_tool_calls false: "required" is exactly one call.
  const engine::ByteDfa one = engine::compile_regex(forced_tool_call_regex(glm45(), tools, "", /*one_call=*/true));
  EXPECT_TRUE(one.matches(weather));
  EXPECT_TRUE(one.matches(pong));
  EXPECT_FALSE(one.matches(weather + "\n" + pong));
  // A typed value's JSON strings cannot spell the closing tags.
  const auto obj_tool = nlohmann::ordered_json::parse(R"([{"type": "function", "function": {"name": "f", "parameters":
      {"properties": {"o": {"type": "object", "properties": {"note": {"type": "string"}}}}}}}])");
  const engine::ByteDfa obj = engine::compile_regex(forced_tool_call_regex(glm45(), obj_tool, ""));
  const std::string f_pre = "<tool_call>f\n<arg_key>o</arg_key>\n<arg_value>";
  EXPECT_TRUE(obj.matches(f_pre + R"({"note":"a\u003cb"})" + "</arg_value>\n</tool_call>"));
  EXPECT_FALSE(obj.matches(f_pre + R"({"note":"a</arg_value>b"})" + "</arg_value>\n</tool_call>"));
  EXPECT_FALSE(ping.matches(weather));
  EXPECT_FALSE(ping.matches(pong + "\n" + pong)) << "a named function: one call";
  EXPECT_NE(testing::error_of([&] { forced_tool_call_regex(glm45(), tools, "nope"); }).find("not among the tools"),
            std::string::npos);
  // A typed parameter outside the schema subset is refused, naming the tool and the parameter (as the same
  // schema in response_format is), rather than left unconstrained.
  for (const char* bad : {R"({"type": "bogus"})", R"({"type": "array", "uniqueItems": true})"}) {
    auto bad_tool = nlohmann::ordered_json::parse(R"([{"type": "function", "function": {"name": "f", "parameters":
        {"properties": {"x": 0}}}}])");
    bad_tool[0]["function"]["parameters"]["properties"]["x"] = nlohmann::ordered_json::parse(bad);
    const std::string err = testing::error_of([&] { forced_tool_call_regex(glm45(), bad_tool, "f"); });
    EXPECT_NE(err.find("tool \"f\", parameter \"x\": "), std::string::npos) << bad << ": " << err;
  }

  // Random accepted texts parse into calls of the tools, days an integer in range.
  engine::DfaAutomaton a(engine::compile_regex(forced_tool_call_regex(glm45(), tools, "")));
  std::mt19937_64 rng(testing::test_seed());
  int n_texts = 0;
  for (int walk = 0; walk < 200 && n_texts < 40; ++walk) {
    std::string text;
    uint64_t st = a.start();
    while (text.size() < 400) {
      if (a.accepting(st) && (!a.can_continue(st) || rng() % 4 == 0)) break;
      std::vector<std::pair<char, uint64_t>> next;
      for (int b = 0; b < 128; ++b) {  // ASCII keeps the walks short
        const uint64_t t = a.step(st, static_cast<uint8_t>(b));
        if (t != engine::ByteAutomaton::kDead) next.emplace_back(static_cast<char>(b), t);
      }
      if (next.empty()) break;
      // Prefer closing markup so walks end: a byte that starts "</" or "\n" half the time when allowed.
      auto pick = next[rng() % next.size()];
      for (auto& n : next) {
        if ((n.first == '<' || n.first == '\n') && rng() % 2 == 0) pick = n;
      }
      text.push_back(pick.first);
      st = pick.second;
    }
    if (!a.accepting(st)) continue;
    ++n_texts;
    const ToolCallSplit split = parse_tool_calls(glm45(), text);
    ASSERT_FALSE(split.calls.empty()) << text;
    EXPECT_EQ(split.content, "") << text;
    for (const ToolCall& c : split.calls) {
      ASSERT_TRUE(c.name == "get_weather" || c.name == "ping" || c.name == "must") << text;
      const auto args = nlohmann::json::parse(c.arguments);
      if (c.name == "get_weather" && args.contains("days")) {
        ASSERT_TRUE(args["days"].is_number_integer()) << text;
        EXPECT_GE(args["days"].get<int>(), 1);
        EXPECT_LE(args["days"].get<int>(), 14);
      }
    }
  }
  EXPECT_GT(n_texts, 5);
}

// With the tools, an argument declared a string keeps its text even when it would parse as JSON.
TEST(ToolCalls, DeclaredStringArgumentsStayStrings) {
  const auto tools = nlohmann::ordered_json::parse(R"([{"type": "function", "function": {"name": "zip",
      "parameters": {"properties": {"code": {"type": "string"}, "n": {"type": "integer"}}}}}])");
  const std::string call =
      "<tool_call>zip\n<arg_key>code</arg_key>\n<arg_value>007</arg_value>\n<arg_key>n</arg_key>\n"
      "<arg_value>7</arg_value>\n</tool_call>";
  EXPECT_EQ(parse_tool_calls(glm45(), call, tools).calls.at(0).arguments, R"({"code":"007","n":7})");
  EXPECT_EQ(parse_tool_calls(glm45(), call).calls.at(0).arguments, R"({"code":"007","n":7})")
      << "007 is no JSON number: a string either way";
  const std::string t = "<tool_call>zip\n<arg_key>code</arg_key>\n<arg_value>true</arg_value>\n</tool_call>";
  EXPECT_EQ(parse_tool_calls(glm45(), t, tools).calls.at(0).arguments, R"({"code":"true"})");
  EXPECT_EQ(parse_tool_calls(glm45(), t).calls.at(0).arguments, R"({"code":true})");
}

}  // namespace
}  // namespace fp4moe::server
