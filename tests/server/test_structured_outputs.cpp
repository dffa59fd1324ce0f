// End to end: structured outputs through `fp4moe serve` on the embedded default model (random weights,
// so only the constraint makes the replies well-formed): SGLang's regex / json_schema (/generate and
// OpenAI bodies), vLLM's guided_choice, OpenAI's response_format json_object / json_schema, streamed
// and whole, n > 1; bad constraints get 400 naming the field and the server keeps serving.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/regex_dfa.h"
#include "server/http_client.h"
#include "server_process.h"
#include "testing/testing.h"

namespace {

using fp4moe::server::HttpClient;
using fp4moe::testing::ServerProcess;
using nlohmann::json;

constexpr double kTimeout = 60;

json parse(const std::string& s) {
  json j = json::parse(s, nullptr, false);
  EXPECT_FALSE(j.is_discarded()) << "not JSON: " << s.substr(0, 300);
  return j;
}

void expect_400(const fp4moe::server::HttpResponse& r, const std::string& param, const std::string& needle) {
  EXPECT_EQ(r.status, 400) << r.body;
  const json j = parse(r.body);
  EXPECT_EQ(j["error"]["param"], param) << r.body;
  EXPECT_NE(j["error"]["message"].get<std::string>().find(needle), std::string::npos) << r.body;
}

TEST(StructuredOutputs, RepliesMatchTheirConstraint) {
  std::string out;
  EXPECT_NE(fp4moe::testing::run_command(
                std::string(FP4MOE_CLI) + " serve --port 0 --constrained-json-whitespace-pattern '[ ]{2,1}'", &out),
            0);
  EXPECT_NE(out.find("--constrained-json-whitespace-pattern: regex: repetition {2,1} has min > max"), std::string::npos)
      << out;

  EXPECT_NE(fp4moe::testing::run_command(
                std::string(FP4MOE_CLI) + " serve --port 0 --constrained-json-whitespace-pattern '[ ]*$'", &out),
            0);
  EXPECT_NE(out.find("'$' is supported only at the end"), std::string::npos) << out;

  ServerProcess srv(FP4MOE_CLI, {"--constrained-json-whitespace-pattern", "[ ]?", "--tool-call-parser", "glm45"});
  ASSERT_TRUE(srv.wait_ready(60));
  HttpClient c(srv.url(), kTimeout);
  EXPECT_EQ(parse(c.get("/get_server_info").body)["constrained_json_whitespace_pattern"], "[ ]?");

  // SGLang /generate with sampling_params.regex: a bounded pattern ends the reply by itself (stop).
  const std::string pattern = R"((red|green|blue) [0-9]{1,3}\.)";
  const fp4moe::engine::ByteDfa dfa = fp4moe::engine::compile_regex(pattern);
  auto g = c.post(
      "/generate",
      json{{"text", "Color: "}, {"sampling_params", {{"regex", pattern}, {"temperature", 1.0}, {"max_new_tokens", 40}}}}
          .dump());
  ASSERT_EQ(g.status, 200) << g.body;
  const json gj = parse(g.body);
  EXPECT_TRUE(dfa.matches(gj["text"].get<std::string>())) << g.body;
  EXPECT_EQ(gj["meta_info"]["finish_reason"]["type"], "stop") << g.body;

  // OpenAI completions, n = 3, regex at the top of the body (SGLang's extra field).
  auto n3 = c.post("/v1/completions",
                   json{{"prompt", "x"}, {"regex", pattern}, {"n", 3}, {"max_tokens", 40}, {"seed", 5}}.dump());
  ASSERT_EQ(n3.status, 200) << n3.body;
  for (const json& ch : parse(n3.body)["choices"]) {
    EXPECT_TRUE(dfa.matches(ch["text"].get<std::string>())) << n3.body;
    EXPECT_EQ(ch["finish_reason"], "stop") << n3.body;
  }

  // Chat with response_format json_schema: content is JSON of the schema; streamed the same way.
  const json schema = {{"type", "object"},
                       {"properties",
                        {{"city", {{"type", "string"}, {"maxLength", 12}}},
                         {"sunny", {{"type", "boolean"}}},
                         {"level", {{"enum", {"low", "high"}}}}}},
                       {"required", {"city", "sunny", "level"}}};
  const json body = {
      {"messages", {{{"role", "user"}, {"content", "Weather as JSON"}}}},
      {"response_format", {{"type", "json_schema"}, {"json_schema", {{"name", "w"}, {"schema", schema}}}}},
      {"max_tokens", 80},
      {"temperature", 0.8},
      {"seed", 11}};
  auto whole = c.post("/v1/chat/completions", body.dump());
  ASSERT_EQ(whole.status, 200) << whole.body;
  const json wj = parse(whole.body);
  const std::string content = wj["choices"][0]["message"]["content"].get<std::string>();
  const json reply = parse(content);
  EXPECT_TRUE(reply["city"].is_string() && reply["sunny"].is_boolean()) << content;
  EXPECT_TRUE(reply["level"] == "low" || reply["level"] == "high") << content;
  EXPECT_EQ(wj["choices"][0]["finish_reason"], "stop") << whole.body;

  json sbody = body;
  sbody["stream"] = true;
  std::string streamed;
  auto s = c.post_sse("/v1/chat/completions", sbody.dump(), [&](std::string_view d) {
    if (d == "[DONE]") return true;
    const json ch = parse(std::string(d));
    if (!ch["choices"].empty() && ch["choices"][0]["delta"].contains("content") &&
        ch["choices"][0]["delta"]["content"].is_string())
      streamed += ch["choices"][0]["delta"]["content"].get<std::string>();
    return true;
  });
  ASSERT_EQ(s.status, 200);
  EXPECT_EQ(streamed, content) << "same seed, same constrained draws";

  // The reply writes the properties in the order the schema lists them (the body as sent, not sorted).
  const std::string raw = R"({"prompt": "p", "max_tokens": 60, "response_format": {"type": "json_schema",
      "json_schema": {"name": "o", "schema": {"type": "object", "properties": {"zeta": {"type": "boolean"},
      "alpha": {"type": "boolean"}}, "required": ["zeta", "alpha"]}}}})";
  auto ordered = c.post("/v1/completions", raw);
  ASSERT_EQ(ordered.status, 200) << ordered.body;
  const std::string otext = parse(ordered.body)["choices"][0]["text"].get<std::string>();
  EXPECT_EQ(otext.rfind("{\"zeta\":", 0), 0u) << otext;
  EXPECT_NE(otext.find("\"alpha\":"), std::string::npos) << otext;

  // JSON mode and vLLM's guided_choice.
  auto jm = c.post("/v1/completions", json{{"prompt", "{"},
                                           {"response_format", {{"type", "json_object"}}},
                                           {"max_tokens", 150},
                                           {"temperature", 0.7},
                                           {"seed", 3}}
                                          .dump());
  ASSERT_EQ(jm.status, 200) << jm.body;
  const json jmj = parse(jm.body);
  if (jmj["choices"][0]["finish_reason"] == "stop") {
    EXPECT_TRUE(parse(jmj["choices"][0]["text"].get<std::string>()).is_object()) << jm.body;
  }
  auto gc = c.post("/v1/completions",
                   json{{"prompt", "pick"}, {"guided_choice", {"alpha", "beta", "gamma"}}, {"max_tokens", 10}}.dump());
  ASSERT_EQ(gc.status, 200) << gc.body;
  const std::string pick = parse(gc.body)["choices"][0]["text"].get<std::string>();
  EXPECT_TRUE(pick == "alpha" || pick == "beta" || pick == "gamma") << gc.body;

  // tool_choice "required" / a named function: the reply is calls of the tools (the random default
  // model would write none), finish_reason tool_calls, but "stop" for the named function (OpenAI's rule).
  const json tools = json::parse(R"([
    {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "enum": ["Paris", "Oslo"]}, "days": {"type": "integer", "minimum": 1, "maximum": 14}}}}},
    {"type": "function", "function": {"name": "ping", "parameters": {"properties": {"host": {"type": "string", "maxLength": 8}}}}}])");
  const json ask = {{{"role", "user"}, {"content", "Weather in Paris?"}}};
  for (const json& choice : {json("required"), json{{"type", "function"}, {"function", {{"name", "ping"}}}}}) {
    auto tc = c.post("/v1/chat/completions", json{{"messages", ask},
                                                  {"tools", tools},
                                                  {"tool_choice", choice},
                                                  {"max_tokens", 200},
                                                  {"temperature", 0.7},
                                                  {"seed", 4}}
                                                 .dump());
    ASSERT_EQ(tc.status, 200) << tc.body;
    const json m = parse(tc.body)["choices"][0];
    ASSERT_TRUE(m["message"]["tool_calls"].is_array() && !m["message"]["tool_calls"].empty()) << tc.body;
    EXPECT_EQ(m["finish_reason"], choice.is_object() ? "stop" : "tool_calls") << tc.body;
    for (const json& call : m["message"]["tool_calls"]) {
      const std::string name = call["function"]["name"];
      if (choice.is_object()) {
        EXPECT_EQ(name, "ping") << tc.body;
      }
      EXPECT_TRUE(name == "ping" || name == "get_weather") << tc.body;
      EXPECT_TRUE(parse(call["function"]["arguments"].get<std::string>()).is_object()) << tc.body;
    }
    if (choice.is_object()) {
      EXPECT_EQ(m["message"]["tool_calls"].size(), 1u) << tc.body;
    }
  }
  // Streamed, a forced call's markup is held back by the parser: no chunk goes out empty (it sent ~130 chunks of
  // "delta": {} before the one with the tool_calls), and the calls arrive.
  int empty_chunks = 0, call_chunks = 0, n_chunks = 0;
  auto streamed_call = c.post_sse("/v1/chat/completions",
                                  json{{"messages", ask},
                                       {"tools", tools},
                                       {"tool_choice", "required"},
                                       {"max_tokens", 200},
                                       {"temperature", 0.7},
                                       {"seed", 4},
                                       {"stream", true}}
                                      .dump(),
                                  [&](std::string_view d) {
                                    if (d == "[DONE]") return true;
                                    const json ch = parse(std::string(d));
                                    if (ch["choices"].empty()) return true;
                                    const json& c0 = ch["choices"][0];
                                    ++n_chunks;
                                    if (n_chunks > 1 && c0["delta"].empty() && c0["finish_reason"].is_null())
                                      ++empty_chunks;
                                    if (c0["delta"].contains("tool_calls")) ++call_chunks;
                                    return true;
                                  });
  ASSERT_EQ(streamed_call.status, 200);
  EXPECT_GE(call_chunks, 1);
  EXPECT_EQ(empty_chunks, 0) << n_chunks << " chunks";
  expect_400(c.post("/v1/chat/completions", json{{"messages", ask},
                                                 {"tools", tools},
                                                 {"tool_choice", "required"},
                                                 {"response_format", {{"type", "json_object"}}}}
                                                .dump()),
             "tool_choice", "forces a call; it cannot be combined with response_format");

  // Bad constraints: 400 naming the field; the server goes on serving.
  expect_400(c.post("/v1/completions", json{{"prompt", "a"}, {"regex", "(a"}}.dump()), "regex",
             "missing ')' at offset 0");
  json bad_schema = body;
  bad_schema["response_format"]["json_schema"]["schema"]["properties"]["city"]["minLength"] = "x";
  expect_400(c.post("/v1/chat/completions", bad_schema.dump()), "response_format", "minLength must be an integer");
  bad_schema["response_format"]["json_schema"]["schema"] = {{"type", "array"}, {"uniqueItems", true}};
  expect_400(c.post("/v1/chat/completions", bad_schema.dump()), "response_format",
             "keyword 'uniqueItems' is not supported");
  expect_400(c.post("/generate", json{{"text", "a"}, {"sampling_params", {{"json_schema", "{nope"}}}}.dump()),
             "sampling_params.json_schema", "the JSON schema: malformed JSON");
  expect_400(c.post("/generate", json{{"text", "a"}, {"sampling_params", {{"ebnf", "root ::= \"a\""}}}}.dump()),
             "sampling_params.ebnf", "grammars (EBNF / GBNF) are not supported");
  EXPECT_EQ(c.post("/v1/completions", json{{"prompt", "a"}, {"max_tokens", 2}}.dump()).status, 200);
  EXPECT_EQ(srv.stop(SIGTERM, 30), 0);
}

}  // namespace
