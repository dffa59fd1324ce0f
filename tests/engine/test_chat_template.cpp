// Chat template tests: the golden GLM chat (rendered text and its ids), the Jinja subset against
// outputs of Jinja2 3.1 rendered with HF's environment (trim_blocks, lstrip_blocks, loopcontrols, HF's
// tojson), GLM- and Qwen-style templates, and the errors with their line:column.
// Run: test_chat_template (needs shared/golden/tokenizer).
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "core/error.h"
#include "engine/chat_template.h"
#include "engine/jinja_ast.h"
#include "engine/tokenizer.h"
#include "testing/testing.h"

namespace fp4moe::engine {
namespace {

using nlohmann::ordered_json;

struct JinjaCase {
  const char* name;
  const char* source;
  const char* context;   // JSON object
  const char* expected;  // what Jinja2 3.1 renders with HF's settings
};

// Expected strings were produced by Jinja2 3.1.6 (ImmutableSandboxedEnvironment(trim_blocks=True,
// lstrip_blocks=True, extensions=[loopcontrols]) with HF's tojson and raise_exception), as
// transformers' apply_chat_template sets it up.
const JinjaCase kCases[] = {
    {"ws_blocks",
     R"J(  {% if true %}
A
  {% endif %}
B)J",
     R"J({})J",
     R"J(A
B)J"},
    {"ws_minus",
     R"J(a  {%- if true -%}  x  {%- endif -%}  b
)J",
     R"J({})J",
     R"J(axb)J"},
    {"ws_plus",
     R"J(  {%+ if true %}x{% endif +%}
y)J",
     R"J({})J",
     R"J(  x
y)J"},
    {"ws_comment",
     R"J(a
  {# note #}
b {#- x -#} c)J",
     R"J({})J",
     R"J(a
bc)J"},
    {"loop_vars",
     R"J({% for x in [1,2,3] %}{{ loop.index0 }}{{ loop.index }}{{ loop.first }}{{ loop.last }}{{ loop.length }}{{ loop.revindex }};{% endfor %})J",
     R"J({})J",
     R"J(01TrueFalse33;12FalseFalse32;23FalseTrue31;)J"},
    {"loop_filter_else",
     R"J({% for x in xs if x is even %}{{ x }}{% else %}none{% endfor %}|{% for x in [] %}x{% else %}empty{% endfor %})J",
     R"J({"xs": [1, 2, 3, 4]})J",
     R"J(24|empty)J"},
    {"loop_items",
     R"J({% for k, v in d.items() %}{{ k }}={{ v }},{% endfor %}{% for k in d %}{{ k }}{% endfor %})J",
     R"J({"d": {"b": 1, "a": [2]}})J",
     R"J(b=1,a=[2],ba)J"},
    {"loop_break",
     R"J({% for i in range(6) %}{% if i == 4 %}{% break %}{% endif %}{% if i == 1 %}{% continue %}{% endif %}{{ i }}{% endfor %})J",
     R"J({})J",
     R"J(023)J"},
    {"scope",
     R"J({% set x = 1 %}{% for i in [1] %}{% set x = 2 %}{{ x }}{% endfor %}{{ x }}{% if true %}{% set x = 3 %}{% endif %}{{ x }})J",
     R"J({})J",
     R"J(213)J"},
    {"namespace",
     R"J({% set ns = namespace(x=1, found=false) %}{% for i in [1, 2] %}{% set ns.x = ns.x + i %}{% endfor %}{{ ns.x }}{{ ns.found }})J",
     R"J({})J",
     R"J(4False)J"},
    {"macro",
     R"J({% macro greet(name, punct='!') -%}
  Hi {{ name }}{{ punct }}
{%- endmacro %}{{ greet('a') }}{{ greet('b', punct='?') }}{{ greet(name='c') }})J",
     R"J({})J",
     R"J(Hi a!Hi b?Hi c!)J"},
    {"set_block",
     R"J({% set x %}in {{ 1 + 1 }}{% endset %}[{{ x }}])J",
     R"J({})J",
     R"J([in 2])J"},
    {"filters1",
     R"J({{ '  x  ' | trim }}|{{ [1,2] | length }}|{{ 'héllo' | length }}|{{ 'ab' | upper }}{{ 'CD' | lower }}|{{ missing | default('d') }}|{{ '' | default('e', true) }}|{{ ['a','b'] | join(', ') }}|{{ 'aXbX' | replace('X', '-') }})J",
     R"J({})J",
     R"J(x|2|5|ABcd|d|e|a, b|a-b-)J"},
    {"filters2",
     R"J({% for k, v in d | items %}{{ k }}{{ v }}{% endfor %}|{{ [3,1,2] | first }}{{ [3,1,2] | last }}|{{ 42 | string }}{{ '7' | int + 1 }}|{{ [1, 2] | reverse | list }}|{{ users | map(attribute='n') | join }}|{{ users | selectattr('ok') | map(attribute='n') | list }}|{{ users | rejectattr('n', 'equalto', 'a') | list | length }}|{{ ['x', 'code', 'y'] | reject('equalto', 'code') | join(', ') }}|{{ [0, 1, 2, 3] | select('odd') | list }}{{ [0, '', 'a'] | select | list }})J",
     R"J({"d": {"k": "v"}, "users": [{"n": "a", "ok": true}, {"n": "b", "ok": false}]})J",
     R"J(kv|32|428|[2, 1]|ab|['a']|1|x, y|[1, 3]['a'])J"},
    {"tojson",
     R"J({{ v | tojson }}|{{ v | tojson(indent=2) }}|{{ 'é"\n' | tojson(ensure_ascii=True) }}|{{ {'z': 1, 'a': 2} | tojson(sort_keys=True) }})J",
     R"J({"v": {"a": [1, "é", null, true, 1.5], "b": {}}})J",
     R"J({"a": [1, "é", null, true, 1.5], "b": {}}|{
  "a": [
    1,
    "é",
    null,
    true,
    1.5
  ],
  "b": {}
}|"\u00e9\"\n"|{"a": 2, "z": 1})J"},
    {"methods",
     R"J({{ 'a</think>b'.split('</think>')[-1] }}|{{ '\n\nx\n'.lstrip('\n') }}|{{ ' y '.strip() }}|{{ 'abc'.startswith('ab') }}{{ 'abc'.endswith(('x', 'bc')) }}|{{ 'a b  c'.split() }}|{{ 'A-b'.upper() }}{{ 'A-b'.lower() }}|{{ d.get('k') }}{{ d.get('z', 'dz') }}{{ d.keys() | list }}|{{ 'x,y'.split(',', 1) }}|{{ 'abcabc'.find('c') }}{{ 'hello world'.title() }})J",
     R"J({"d": {"k": "v"}})J",
     R"J(b|x
|y|TrueTrue|['a', 'b', 'c']|A-Ba-b|vdz['k']|['x', 'y']|2Hello World)J"},
    {"tests",
     R"J({{ x is defined }}{{ y is defined }}{{ n is none }}{{ 's' is string }}{{ {} is mapping }}{{ [] is iterable }}{{ 1 is string }}{{ 3 is odd }}{{ 4 is divisibleby(2) }}{{ x is not none }}{{ 1 is number }}{{ 1.5 is integer }}{{ 'a' is sequence }})J",
     R"J({"x": 1, "n": null})J",
     R"J(TrueFalseTrueTrueTrueTrueFalseTrueTrueTrueTrueFalseTrue)J"},
    {"ops",
     R"J({{ 1 + 2 * 3 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 'a' ~ 1 ~ none }} {{ 'b' in 'abc' }} {{ 2 not in [1] }} {{ 1 < 2 and 3 >= 3 }} {{ 'x' if false else 'y' }} {{ 1 / 2 }} {{ 2 ** 10 }} {{ 0 or 'z' }} {{ 1 and 'w' }} {{ not [] }} {{ 'k' in {'k': 1} }} {{ [1] + [2] }} {{ 'ab' * 2 }} {{ 1 == 1.0 }} {{ 3 - 5 }})J",
     R"J({})J",
     R"J(7 3 -4 1 2 a1None True True True y 0.5 1024 z w True True [1, 2] abab True -2)J"},
    {"printing",
     R"J({{ none }}|{{ true }}|{{ [1, 'a', none, 'it\'s'] }}|{{ {'k': 'v', 'n': 2.5} }}|{{ 1.0 }}|{{ 1e-7 }}|{{ 123456789.125 }}|{{ missing }}|)J",
     R"J({})J",
     R"J(None|True|[1, 'a', None, "it's"]|{'k': 'v', 'n': 2.5}|1.0|1e-07|123456789.125||)J"},
    {"slicing",
     R"J({{ [1,2,3][::-1] }}{{ 'hello'[1:3] }}{{ xs[1:] | length }}{{ xs[-1] }}{{ 'hello'[-2:] }}{{ xs[:-1] }}{{ xs[::2] }})J",
     R"J({"xs": [1, 2, 3, 4, 5]})J",
     R"J([3, 2, 1]el45lo[1, 2, 3, 4][1, 3, 5])J"},
    {"strings",
     R"J({{ 'a\tb' }}|{{ "q'" }}|{{ 'x' 'y' }}|{{ '\u00e9' }})J",
     R"J({})J",
     R"J(a	b|q'|xy|é)J"},
    {"raw",
     R"J({% raw %}{{ x }}{% if %}{% endraw %}!)J",
     R"J({})J",
     R"J({{ x }}{% if %}!)J"},
    {"trailing_nl",
     R"J(x
)J",
     R"J({})J",
     R"J(x)J"},
    {"cond_precedence",
     R"J({{ 'a' if x is defined and x > 1 else 'b' }}{{ not x is defined }}{{ x|default(0) + 1 }})J",
     R"J({"x": 5})J",
     R"J(aFalse6)J"},
    {"messages_glm_like",
     R"J([gMASK]<sop>
{%- if tools -%}
<|system|>
# Tools
{% for tool in tools %}
{{ tool | tojson(ensure_ascii=False) }}
{% endfor %}
{%- endif -%}
{%- macro visible_text(content) -%}
    {%- if content is string -%}
        {{- content }}
    {%- elif content is iterable and content is not mapping -%}
        {%- for item in content -%}
            {%- if item is mapping and item.type == 'text' -%}
                {{- item.text }}
            {%- elif item is string -%}
                {{- item }}
            {%- endif -%}
        {%- endfor -%}
    {%- else -%}
        {{- content }}
    {%- endif -%}
{%- endmacro -%}
{%- set ns = namespace(last_user_index=-1) %}
{%- for m in messages %}
    {%- if m.role == 'user' %}
        {% set ns.last_user_index = loop.index0 -%}
    {%- endif %}
{%- endfor %}
{% for m in messages %}
{%- if m.role == 'user' -%}<|user|>
{{ visible_text(m.content) }}
{{- '/nothink' if (enable_thinking is defined and not enable_thinking and not visible_text(m.content).endswith("/nothink")) else '' -}}
{%- elif m.role == 'assistant' -%}
<|assistant|>
{%- set reasoning_content = '' %}
{%- set content = visible_text(m.content) %}
{%- if m.reasoning_content is string %}
    {%- set reasoning_content = m.reasoning_content %}
{%- else %}
    {%- if '</think>' in content %}
        {%- set reasoning_content = content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') %}
        {%- set content = content.split('</think>')[-1].lstrip('\n') %}
    {%- endif %}
{%- endif %}
{%- if loop.index0 > ns.last_user_index and reasoning_content -%}
{{ '\n<think>' + reasoning_content.strip() +  '</think>'}}
{%- else -%}
{{ '\n<think></think>' }}
{%- endif -%}
{%- if content.strip() -%}
{{ '\n' + content.strip() }}
{%- endif -%}
{%- elif m.role == 'tool' -%}
{%- if loop.first or (messages[loop.index0 - 1].role != "tool") %}
    {{- '<|observation|>' }}
{%- endif %}
{{- '\n<tool_response>\n' }}
{{- m.content }}
{{- '\n</tool_response>' }}
{%- elif m.role == 'system' -%}
<|system|>
{{ visible_text(m.content) }}
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
    <|assistant|>{{- '\n<think></think>' if (enable_thinking is defined and not enable_thinking) else '' -}}
{%- endif -%}
)J",
     R"J({"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": [{"type": "text", "text": "What is 2+2?"}]}, {"role": "assistant", "content": "<think>\nadd</think>\n\n4"}, {"role": "tool", "content": "{\"r\": 4}"}, {"role": "user", "content": "And 3+3?"}, {"role": "assistant", "content": "x", "reasoning_content": " because "}], "tools": [{"type": "function", "function": {"name": "calc", "parameters": {"x": "é"}}}], "add_generation_prompt": true, "enable_thinking": false})J",
     R"J([gMASK]<sop><|system|>
# Tools
{"type": "function", "function": {"name": "calc", "parameters": {"x": "é"}}}
<|system|>
Be brief.<|user|>
What is 2+2?/nothink<|assistant|>
<think></think>
4<|observation|>
<tool_response>
{"r": 4}
</tool_response><|user|>
And 3+3?/nothink<|assistant|>
<think>because</think>
x<|assistant|>
<think></think>)J"},
    {"qwen_like",
     R"J({%- for message in messages[::-1] %}
    {%- set index = (messages|length - 1) - loop.index0 %}
    {%- if message.role == "user" %}{{ index }}:{{ message.content }};{% endif %}
{%- endfor %}
{%- for message in messages %}
{{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
)J",
     R"J({"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}, {"role": "user", "content": "c"}], "add_generation_prompt": true})J",
     R"J(2:c;0:a;<|im_start|>user
a<|im_end|>
<|im_start|>assistant
b<|im_end|>
<|im_start|>user
c<|im_end|>
<|im_start|>assistant
)J"},
};

TEST(JinjaSubset, MatchesJinja2) {
  for (const JinjaCase& c : kCases) {
    SCOPED_TRACE(c.name);
    try {
      auto program = jinja::parse(c.source, c.name);
      EXPECT_EQ(jinja::render(*program, ordered_json::parse(c.context)), c.expected);
    } catch (const Error& e) {
      ADD_FAILURE() << e.what();
    }
  }
}

std::string error_of(const std::string& source, const ordered_json& context = ordered_json::object()) {
  try {
    auto program = jinja::parse(source, "t");
    jinja::render(*program, context);
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(JinjaSubset, LoadErrorsNameLineAndColumn) {
  EXPECT_EQ(error_of("ab\n  {{ x | nope }}"), "t:2:10: unsupported filter 'nope'");
  EXPECT_EQ(error_of("{% include 'x.j2' %}"), "t:1:4: unsupported statement 'include'");
  EXPECT_EQ(error_of("x\n{% for a in b recursive %}{% endfor %}"), "t:2:15: recursive for loops are not supported");
  EXPECT_EQ(error_of("{{ x is frobnicated }}"), "t:1:9: unsupported test 'frobnicated'");
  EXPECT_EQ(error_of("{% if x %}abc"), "t:1:14: unexpected end of template; expected one of {% elif %} {% else %} {% endif %}");
  EXPECT_EQ(error_of("{{ 'abc }}"), "t:1:4: unterminated string literal");
  EXPECT_EQ(error_of("{% break %}"), "t:1:4: 'break' outside a for loop");
  EXPECT_EQ(error_of("{{ a ? b }}"), "t:1:6: unexpected character '?'");
  EXPECT_EQ(error_of("{% endfor %}"), "t:1:4: unknown or misplaced statement 'endfor'");
}

TEST(JinjaSubset, RenderErrorsNameLineAndColumn) {
  EXPECT_EQ(error_of("\n\n  {{ 1 + 'a' }}"), "t:3:8: unsupported operands for +: 1 and 'a'");
  EXPECT_EQ(error_of("{{ m.content }}", {{"m", nullptr}}), "(no error)");  // None.attr is undefined, as in Jinja
  EXPECT_EQ(error_of("{{ m.content.x }}", {{"m", nullptr}}), "t:1:14: 'content' is undefined (reading .x)");
  EXPECT_EQ(error_of("{{ m.role }}"), "t:1:6: 'm' is undefined (reading .role)");
  EXPECT_EQ(error_of("{{ 'x'.nosuch() }}"), "t:1:8: no method 'nosuch' on 'x'");
  EXPECT_EQ(error_of("{% if r != 'user' %}{{ raise_exception('Only user roles: ' ~ r) }}{% endif %}", {{"r", "bot"}}),
            "t:1:24: raise_exception: Only user roles: bot");
  EXPECT_EQ(error_of("{% set x = 1 %}{% set x.y = 2 %}"), "t:1:19: cannot set 'x.y': 'x' is not a namespace");
}

TEST(ChatTemplateGolden, RendersAndTokenizesLikeHf) {
  const auto dir = testing::shared_path("golden/tokenizer");
  std::ifstream in(testing::shared_path("golden/tokenizer/encode_cases.json"));
  std::stringstream ss;
  ss << in.rdbuf();
  const ordered_json chat = ordered_json::parse(ss.str()).at("chat");
  const ChatTemplate tmpl = ChatTemplate::load(dir);
  const std::string rendered = tmpl.render(chat.at("messages"), {.add_generation_prompt = true});
  EXPECT_EQ(rendered, chat.at("rendered").get<std::string>());
  const Tokenizer tok = Tokenizer::load(dir);
  EXPECT_EQ(tok.encode(rendered), chat.at("ids").get<std::vector<TokenId>>());
  // Without the generation prompt the trailing "<|assistant|>\n" is absent.
  const std::string no_prompt = tmpl.render(chat.at("messages"), {.add_generation_prompt = false});
  EXPECT_EQ(no_prompt + "<|assistant|>\n", rendered);
}

TEST(ChatTemplate, SpecialTokensToolsAndExtraVariables) {
  const nlohmann::json config = {{"bos_token", "<s>"},
                                 {"eos_token", {{"content", "</s>"}, {"special", true}}},
                                 {"chat_template",
                                  "{{ bos_token }}{% for m in messages %}{{ m.content }}{{ eos_token }}{% endfor %}"
                                  "{{ tools is none }}{{ enable_thinking }}"}};
  const ChatTemplate tmpl = ChatTemplate::from_config(config);
  ChatTemplate::RenderOptions options;
  options.extra = {{"enable_thinking", false}};
  EXPECT_EQ(tmpl.render(ordered_json::parse(R"([{"role":"user","content":"hi"}])"), options), "<s>hi</s>TrueFalse");
  options.tools = ordered_json::array({{{"name", "f"}}});
  EXPECT_EQ(tmpl.render(ordered_json::array(), options), "<s>FalseFalse");
}

// vLLM's content-format detection: a loop over a message's content (through a macro parameter, an
// attribute or a subscript) takes OpenAI's list of parts; printing content takes a string.
TEST(ChatTemplate, IteratesContentIsDetected) {
  const JinjaCase* glm = nullptr;
  for (const JinjaCase& c : kCases)
    if (std::string(c.name) == "messages_glm_like") glm = &c;
  ASSERT_NE(glm, nullptr);
  EXPECT_TRUE(ChatTemplate(glm->source, ordered_json::object()).iterates_content());  // visible_text(content)
  EXPECT_TRUE(ChatTemplate("{% for m in messages %}{% for p in m['content'] %}{{ p.text }}{% endfor %}{% endfor %}",
                           ordered_json::object())
                  .iterates_content());
  EXPECT_TRUE(ChatTemplate("{% if x %}{% else %}{% for p in messages[0].content if p.type == 'text' %}{% endfor %}"
                           "{% endif %}",
                           ordered_json::object())
                  .iterates_content());
  EXPECT_TRUE(ChatTemplate("{% for m in messages %}{% for p in m.content | selectattr('type', 'equalto', 'text') %}"
                           "{{ p.text }}{% endfor %}{% endfor %}",
                           ordered_json::object())
                  .iterates_content());  // through a filter
  EXPECT_TRUE(ChatTemplate("{% for m in messages %}{% set c = m['content'] %}{% for p in c %}{% endfor %}{% endfor %}",
                           ordered_json::object())
                  .iterates_content());  // through a variable set from it
  EXPECT_FALSE(ChatTemplate::load(testing::shared_path("golden/tokenizer")).iterates_content());
  EXPECT_FALSE(ChatTemplate("{% for m in messages %}{{ m.content }}{% for c in m.contents %}{% endfor %}{% endfor %}",
                            ordered_json::object())
                   .iterates_content());
}

TEST(ChatTemplate, NamedTemplateListAndMissingTemplate) {
  const nlohmann::json config = {
      {"chat_template", {{{"name", "tool_use"}, {"template", "T"}}, {{"name", "default"}, {"template", "D"}}}}};
  EXPECT_EQ(ChatTemplate::from_config(config).render(ordered_json::array()), "D");
  try {
    ChatTemplate::from_config(nlohmann::json{{"eos_token", "x"}}, "cfg.json");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cfg.json has no chat_template"), std::string::npos) << e.what();
  }
  try {
    ChatTemplate::from_config(nlohmann::json{{"chat_template", "a\n{% macro %}"}}, "cfg.json");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "cfg.json:chat_template:2:10: expected a name, found '%}'");
  }
}

}  // namespace
}  // namespace fp4moe::engine
