// Unit tests of the server's protocol layer (no sockets): request parsing and its named 400s, the
// max_new_tokens defaults, error bodies, response shapes and the Prometheus rendering.
#include <gtest/gtest.h>

#include <functional>

#include <limits>

#include <nlohmann/json.hpp>

#include "engine/default_model.h"
#include "server/metrics.h"
#include "server/protocol.h"

namespace {

using nlohmann::json;
using namespace fp4moe::server;

// Expects parse to throw an ApiError 400 naming `param`, with `needle` in its message.
void expect_bad(Endpoint e, const json& body, const std::string& param, const std::string& needle) {
  try {
    parse_request(e, body);
    ADD_FAILURE() << "accepted " << body.dump();
  } catch (const ApiError& err) {
    EXPECT_EQ(err.status, 400) << body.dump();
    EXPECT_EQ(err.param, param) << body.dump() << ": " << err.message;
    EXPECT_NE(err.message.find(needle), std::string::npos) << err.message;
  }
}

TEST(ServerProtocol, GenerateParsesSamplingParams) {
  const ParsedRequest r = parse_request(
      Endpoint::kGenerate,
      json{{"input_ids", {1, 2, 3}},
           {"sampling_params",
            {{"max_new_tokens", 7}, {"temperature", 0.5}, {"top_p", 0.9}, {"top_k", 5}, {"min_p", 0.1},
             {"repetition_penalty", 1.1}, {"frequency_penalty", 0.2}, {"presence_penalty", -0.3}, {"stop", "END"},
             {"stop_token_ids", {9}}, {"ignore_eos", true}, {"sampling_seed", 42}}},
           {"stream", true},
           {"return_logprob", true},
           {"top_logprobs_num", 3}});
  ASSERT_TRUE(r.input_ids);
  EXPECT_EQ(*r.input_ids, (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(r.max_new_tokens, 7);
  EXPECT_EQ(r.sampling.temperature, 0.5);
  EXPECT_EQ(r.sampling.top_p, 0.9);
  EXPECT_EQ(r.sampling.top_k, 5);
  EXPECT_EQ(r.sampling.min_p, 0.1);
  EXPECT_EQ(r.sampling.repetition_penalty, 1.1);
  EXPECT_EQ(r.sampling.frequency_penalty, 0.2);
  EXPECT_EQ(r.sampling.presence_penalty, -0.3);
  EXPECT_EQ(r.sampling.stop, (std::vector<std::string>{"END"}));
  EXPECT_EQ(r.sampling.stop_token_ids, (std::vector<int32_t>{9}));
  EXPECT_TRUE(r.sampling.ignore_eos);
  EXPECT_EQ(r.sampling.seed, 42u);
  EXPECT_TRUE(r.stream);
  EXPECT_TRUE(r.sampling.logprobs);
  EXPECT_EQ(r.sampling.top_logprobs, 3);
}

// SGLang's /generate batch: a list of texts or of id lists (one or more), sampling_params.n > 1, a list of
// sampling_params (one per prompt, the same n), rid as a list (one per prompt) or a string; each choice is one object
// of the reply's list with its own id and prompt_tokens.
TEST(ServerProtocol, GenerateBatchForms) {
  ParsedRequest r = parse_request(Endpoint::kGenerate, json{{"text", {"a", "b c"}}});
  EXPECT_TRUE(r.batch_reply);
  ASSERT_EQ(r.batch.size(), 2u);
  EXPECT_EQ(r.batch[1].text, "b c");
  EXPECT_FALSE(r.text);
  r = parse_request(Endpoint::kGenerate, json{{"input_ids", {{1, 2}}}});  // a list of one is a batch of one
  EXPECT_TRUE(r.batch_reply);
  ASSERT_EQ(r.batch.size(), 1u);
  EXPECT_EQ(*r.batch[0].input_ids, (std::vector<int32_t>{1, 2}));
  r = parse_request(Endpoint::kGenerate, json{{"text", "a"}, {"sampling_params", {{"n", 3}, {"seed", 5}}}});
  EXPECT_TRUE(r.batch_reply);  // SGLang: n samples of one prompt reply as a list
  EXPECT_EQ(r.n, 3);
  EXPECT_EQ(r.text, "a");
  EXPECT_FALSE(parse_request(Endpoint::kGenerate, json{{"text", "a"}}).batch_reply);
  // One sampling_params per prompt, each its own (a constraint too, its schema pointer into the list).
  r = parse_request(Endpoint::kGenerate,
                    json{{"text", {"a", "b"}},
                         {"sampling_params",
                          {{{"max_new_tokens", 3}, {"temperature", 0}},
                           {{"max_new_tokens", 5}, {"stop", "x"}, {"json_schema", {{"type", "object"}}}}}},
                         {"return_logprob", true}});
  ASSERT_EQ(r.per_prompt.size(), 2u);
  EXPECT_EQ(r.per_prompt[0].max_new_tokens, 3);
  EXPECT_EQ(r.per_prompt[0].sampling.temperature, 0.0);
  EXPECT_FALSE(r.per_prompt[0].constraint);
  EXPECT_EQ(r.per_prompt[1].max_new_tokens, 5);
  EXPECT_EQ(r.per_prompt[1].sampling.stop, (std::vector<std::string>{"x"}));
  ASSERT_TRUE(r.per_prompt[1].constraint);
  EXPECT_EQ(r.per_prompt[1].constraint->param, "sampling_params[1].json_schema");
  EXPECT_EQ(r.per_prompt[1].schema_pointer, "/sampling_params/1/json_schema");
  EXPECT_TRUE(r.per_prompt[0].sampling.logprobs);  // the top-level logprob fields apply to every prompt
  EXPECT_TRUE(r.per_prompt[1].sampling.logprobs);
  // restore_key_order re-reads a per-prompt object schema in the order sent.
  const std::string body =
      R"({"text": ["a"], "sampling_params": [{"json_schema": {"type": "object", "properties": {"z": {}, "a": {}}}}]})";
  r = parse_request(Endpoint::kGenerate, parse_body(body));
  restore_key_order(r, body);
  ASSERT_TRUE(r.per_prompt.at(0).constraint);
  EXPECT_LT(r.per_prompt[0].constraint->text.find("\"z\""), r.per_prompt[0].constraint->text.find("\"a\""));
  // rid: a list names each prompt; a string names a batch's choices "{rid}_{i}" (in the server).
  r = parse_request(Endpoint::kGenerate, json{{"text", {"a", "b"}}, {"rid", {"r-a", "r-b"}}});
  EXPECT_EQ(r.rid_list, (std::vector<std::string>{"r-a", "r-b"}));
  EXPECT_EQ(parse_request(Endpoint::kGenerate, json{{"text", {"a", "b"}}, {"rid", "base"}}).rid, "base");

  // The logprob fields as lists (SGLang's, n = 1): each prompt's own; a field sent as one value applies to all.
  r = parse_request(Endpoint::kGenerate, json{{"text", {"a", "b"}},
                                              {"return_logprob", {true, false}},
                                              {"top_logprobs_num", 2},
                                              {"logprob_start_len", {0, -1}}});
  ASSERT_EQ(r.per_prompt_logprobs.size(), 2u);
  EXPECT_TRUE(r.per_prompt_logprobs[0].return_logprob);
  EXPECT_EQ(r.per_prompt_logprobs[0].top_logprobs, 2);
  EXPECT_EQ(r.per_prompt_logprobs[0].logprob_start_len, 0);
  EXPECT_FALSE(r.per_prompt_logprobs[1].return_logprob);
  EXPECT_FALSE(r.per_prompt_logprobs[1].logprob_start_len);
  ASSERT_EQ(r.per_prompt.size(), 2u);  // each prompt's sampling carries its own asks
  EXPECT_TRUE(r.per_prompt[0].sampling.logprobs);
  EXPECT_EQ(r.per_prompt[0].sampling.top_logprobs, 2);
  EXPECT_EQ(r.per_prompt[0].sampling.prompt_logprobs, 2);
  EXPECT_FALSE(r.per_prompt[1].sampling.logprobs);
  expect_bad(Endpoint::kGenerate, json{{"text", {"a", "b"}}, {"return_logprob", {true}}}, "return_logprob",
             "return_logprob is a list of 1; the batch has 2 prompts");
  expect_bad(Endpoint::kGenerate, json{{"text", "a"}, {"return_logprob", {true}}}, "return_logprob", "one prompt");
  expect_bad(Endpoint::kGenerate,
             json{{"text", {"a", "b"}}, {"return_logprob", {true, true}}, {"sampling_params", {{"n", 2}}}},
             "return_logprob", "n = 2");
  expect_bad(Endpoint::kGenerate, json{{"text", {"a", "b"}}, {"top_logprobs_num", {1, 99}}}, "top_logprobs_num",
             "top_logprobs_num = 99 is outside");
  expect_bad(Endpoint::kGenerate, json{{"text", json::array()}}, "text", "empty list");
  expect_bad(Endpoint::kGenerate, json{{"text", 5}}, "text", "a string or a list of strings");
  expect_bad(Endpoint::kGenerate, json{{"input_ids", {{1}, 2}}}, "input_ids[1]", "input_ids[1] must be an array");
  expect_bad(Endpoint::kGenerate, json{{"input_ids", {{1}, {-1}}}}, "input_ids[1]", "input_ids[1][0] = -1");
  expect_bad(Endpoint::kGenerate, json{{"text", {"a", "b"}}, {"sampling_params", {{{"n", 1}}}}}, "sampling_params",
             "a list of 1 objects; the request has 2 prompt(s)");
  expect_bad(Endpoint::kGenerate, json{{"text", {"a", "b"}}, {"sampling_params", {{{"n", 2}}, {{"n", 1}}}}},
             "sampling_params[1].n", "sampling_params[1].n = 1 differs from sampling_params[0].n = 2");
  expect_bad(Endpoint::kGenerate, json{{"text", {"a", "b"}}, {"sampling_params", {3, 4}}}, "sampling_params[0]",
             "sampling_params[0] must be an object");
  expect_bad(Endpoint::kGenerate,
             json{{"text", {"a", "b"}}, {"sampling_params", {json::object(), {{"temperature", -1}}}}},
             "sampling_params[1].temperature", "sampling_params[1].temperature = -1 is outside");
  expect_bad(Endpoint::kGenerate, json{{"text", {"a"}}, {"sampling_params", "x"}}, "sampling_params",
             "an object, or a list of objects");
  expect_bad(Endpoint::kGenerate, json{{"text", {"a", "b"}}, {"rid", {"x"}}}, "rid", "this request has 2 prompts");
  expect_bad(Endpoint::kGenerate, json{{"text", "a"}, {"rid", {"x"}}}, "rid", "this request has one prompt");
  expect_bad(Endpoint::kGenerate, json{{"text", {"a", "b"}}, {"rid", {"x", "x"}}}, "rid",
             "rid[1] = \"x\" is rid[0] too");
  expect_bad(Endpoint::kGenerate, json{{"text", {"a", "b"}}, {"rid", {"x", 3}}}, "rid", "rid[1] must be a string");
  expect_bad(Endpoint::kGenerate, json{{"text", {"a", "b"}}, {"rid", {"x", "12"}}}, "rid",
             "rid[1] = \"12\" has the form of the server's own ids");
  // With n samples a rid list still names each prompt (prompt p's sample j is rid[p]_j, in the server).
  EXPECT_EQ(parse_request(Endpoint::kGenerate,
                          json{{"text", {"a", "b"}}, {"rid", {"x", "y"}}, {"sampling_params", {{"n", 2}}}})
                .rid_list,
            (std::vector<std::string>{"x", "y"}));
  expect_bad(Endpoint::kGenerate, json{{"text", std::vector<std::string>(5, "a")}, {"sampling_params", {{"n", 64}}}},
             "text", "5 prompts x n = 64 = 320 choices > 256");
  expect_bad(Endpoint::kGenerate, json{{"input_ids", {{1}, {2}, {3}, {4}, {5}}}, {"sampling_params", {{"n", 52}}}},
             "input_ids", "5 prompts x n = 52 = 260 choices");
}

// A /generate batch reply: one object per choice, each with its id and its prompt's tokens; streamed, "index" too.
TEST(ServerProtocol, GenerateBatchResponse) {
  const ParsedRequest req = parse_request(Endpoint::kGenerate, json{{"input_ids", {{1, 2}, {3}}}});
  ResponseContext ctx;
  ctx.id = "r_0";
  ctx.prompt_tokens = 3;
  ctx.choice_ids = {"r_0", "r_1"};
  ctx.choice_prompt_tokens = {2, 1};
  std::vector<Accumulated> accs(2);
  accs[1].tokens.push_back(fp4moe::engine::GeneratedToken{7, -0.5f, {}});
  const json whole = generate_batch_response(req, ctx, accs);
  ASSERT_TRUE(whole.is_array());
  ASSERT_EQ(whole.size(), 2u);
  EXPECT_EQ(whole[0]["meta_info"]["id"], "r_0");
  EXPECT_EQ(whole[0]["meta_info"]["prompt_tokens"], 2);
  EXPECT_EQ(whole[1]["meta_info"]["id"], "r_1");
  EXPECT_EQ(whole[1]["meta_info"]["prompt_tokens"], 1);
  EXPECT_EQ(whole[1]["output_ids"], json::array({7}));
  EXPECT_FALSE(whole[1].contains("index"));
  const json chunk = generate_choice(req, ctx, 1, accs[1], true);
  EXPECT_EQ(chunk["index"], 1);
  EXPECT_EQ(chunk["meta_info"]["id"], "r_1");
}

// --sampling-defaults model: the fields an OpenAI body omits (or sends null) take the server's defaults, the fields
// it sends win; SGLang's /generate keeps its own defaults (as SGLang: only its chat route reads the model's).
TEST(ServerProtocol, SamplingDefaultsFillOmittedFields) {
  fp4moe::engine::SamplingParams d;
  d.temperature = 0.6;
  d.top_p = 0.95;
  d.top_k = 20;
  const ParsedRequest g =
      parse_request(Endpoint::kGenerate, json{{"text", "hi"}, {"sampling_params", {{"temperature", 0.0}}}}, d);
  EXPECT_EQ(g.sampling.temperature, 0.0);
  EXPECT_EQ(g.sampling.top_p, 1.0);
  EXPECT_EQ(g.sampling.top_k, -1);
  const ParsedRequest c =
      parse_request(Endpoint::kCompletions, json{{"prompt", "hi"}, {"temperature", nullptr}, {"top_k", -1}}, d);
  EXPECT_EQ(c.sampling.temperature, 0.6);
  EXPECT_EQ(c.sampling.top_k, -1);
  const ParsedRequest m = parse_request(Endpoint::kChat, json{{"messages", {{{"role", "user"}, {"content", "x"}}}}}, d);
  EXPECT_EQ(m.sampling.temperature, 0.6);
  EXPECT_EQ(m.sampling.top_p, 0.95);
  EXPECT_EQ(parse_request(Endpoint::kChat, json{{"messages", {{{"role", "user"}, {"content", "x"}}}}}).sampling.top_p,
            1.0);  // no defaults given: the API's
}

TEST(ServerProtocol, OpenAiFieldsAndNulls) {
  const ParsedRequest c = parse_request(Endpoint::kCompletions,
                                        json{{"prompt", "hi"}, {"max_tokens", 4}, {"temperature", nullptr},
                                             {"stream", true}, {"stream_options", {{"include_usage", true}}}, {"logprobs", 2}});
  EXPECT_EQ(*c.text, "hi");
  EXPECT_EQ(c.max_new_tokens, 4);
  EXPECT_EQ(c.sampling.temperature, 1.0);  // null = absent
  EXPECT_TRUE(c.include_usage);
  EXPECT_TRUE(c.sampling.logprobs);
  EXPECT_EQ(c.sampling.top_logprobs, 2);
  const ParsedRequest m = parse_request(
      Endpoint::kChat, json{{"messages", {{{"role", "user"}, {"content", "x"}}}}, {"max_completion_tokens", 9},
                            {"logprobs", true}, {"top_logprobs", 1}, {"chat_template_kwargs", {{"enable_thinking", false}}}});
  EXPECT_EQ(m.max_new_tokens, 9);
  ASSERT_TRUE(m.messages);
  EXPECT_EQ((*m.messages)[0]["role"], "user");
  EXPECT_EQ(m.chat_template_kwargs["enable_thinking"], false);
  EXPECT_EQ(m.sampling.top_logprobs, 1);
}

TEST(ServerProtocol, BadFieldsAreNamedWithTheirValues) {
  expect_bad(Endpoint::kGenerate, json::object(), "text", "exactly one");
  expect_bad(Endpoint::kGenerate, json{{"text", "a"}, {"input_ids", {1}}}, "text", "exactly one");
  expect_bad(Endpoint::kGenerate, json{{"text", {"a", 3}}}, "text", "text[1] = 3 is not a string");
  expect_bad(Endpoint::kGenerate, json{{"input_ids", {1, "x"}}}, "input_ids", "input_ids[1]");
  expect_bad(Endpoint::kGenerate, json{{"text", "a"}, {"sampling_params", 3}}, "sampling_params", "object");
  expect_bad(Endpoint::kGenerate, json{{"text", "a"}, {"sampling_params", {{"temperature", 101}}}},
             "sampling_params.temperature", "101");
  expect_bad(Endpoint::kGenerate, json{{"text", "a"}, {"sampling_params", {{"max_new_tokens", 1.5}}}},
             "sampling_params.max_new_tokens", "integer");
  expect_bad(Endpoint::kGenerate, json{{"text", "a"}, {"sampling_params", {{"stop", {"ok", 3}}}}},
             "sampling_params.stop", "stop[1]");
  expect_bad(Endpoint::kGenerate, json{{"text", "a"}, {"sampling_params", {{"n", 65}}}}, "sampling_params.n",
             "sampling_params.n = 65 is outside [1, 64]");
  expect_bad(Endpoint::kCompletions, json{{"prompt", "a"}, {"n", 0}}, "n", "n = 0 is outside [1, 64]");
  // SGLang's SamplingParams takes no other key: a misspelt one is named with the closest known key, in a list entry
  // too.
  expect_bad(Endpoint::kGenerate, json{{"text", "a"}, {"sampling_params", {{"temprature", 0}}}},
             "sampling_params.temprature",
             "sampling_params.temprature is not a sampling parameter (did you mean sampling_params.temperature?)");
  expect_bad(Endpoint::kGenerate,
             json{{"text", {"a", "b"}}, {"sampling_params", {json::object(), {{"max_tokens", 4}}}}},
             "sampling_params[1].max_tokens", "(/generate takes sampling_params.max_new_tokens)");
  expect_bad(Endpoint::kGenerate, json{{"text", "a"}, {"sampling_params", {{"beam_width", 4}}}},
             "sampling_params.beam_width", "sampling_params.beam_width is not a sampling parameter");
  expect_bad(Endpoint::kGenerate, json{{"text", "a"}, {"sampling_params", {{"stop_regex", "a+"}}}},
             "sampling_params.stop_regex", "is not supported by this server, got \"a+\"");
  expect_bad(Endpoint::kGenerate, json{{"text", "a"}, {"sampling_params", {{"spaces_between_special_tokens", 1}}}},
             "sampling_params.spaces_between_special_tokens", "must be true or false, got 1");
  expect_bad(Endpoint::kGenerate, json{{"text", "a"}, {"sampling_params", {{"stream_interval", 0}}}},
             "sampling_params.stream_interval", "sampling_params.stream_interval = 0 is outside [1, 2147483647]");
  {
    const ParsedRequest g = parse_request(Endpoint::kGenerate, json{{"text", "a"},
                                                                    {"sampling_params",
                                                                     {{"stream_interval", 3},
                                                                      {"spaces_between_special_tokens", false},
                                                                      {"stop_regex", nullptr},
                                                                      {"max_new_tokens", 0}}}});
    EXPECT_EQ(g.sampling.stream_interval, 3);
    EXPECT_EQ(g.max_new_tokens, 0);  // SGLang's prefill-only request
  }
  // The OpenAI routes ignore fields they do not know, as vLLM does; chat asks for at least one token.
  EXPECT_NO_THROW(parse_request(Endpoint::kCompletions, json{{"prompt", "a"}, {"temprature", 0}}));
  expect_bad(Endpoint::kChat, json{{"messages", {{{"role", "user"}, {"content", "a"}}}}, {"max_tokens", 0}},
             "max_tokens", "max_tokens = 0 is outside [1, 1073741824]");
  // Integers are compared exactly: 2^63 is past every range (as a double it equalled INT64_MAX and wrapped).
  expect_bad(Endpoint::kCompletions, json{{"prompt", "a"}, {"seed", 9223372036854775808ull}}, "seed",
             "seed = 9223372036854775808 is outside [-9223372036854775808, 9223372036854775807]");
  expect_bad(Endpoint::kCompletions, json{{"prompt", "a"}, {"seed", 1e19}}, "seed", "is outside");
  expect_bad(Endpoint::kCompletions, json{{"prompt", "a"}, {"seed", json::parse("-9223372036854775809")}}, "seed",
             "is outside");  // a double that rounds to -2^63
  expect_bad(Endpoint::kCompletions, json{{"prompt", "a"}, {"max_tokens", 0}, {"echo", true}, {"min_tokens", 2}},
             "min_tokens", "min_tokens = 2 > max_tokens = 0 (echo without generation)");
  // A negative seed is taken, as vLLM takes any int64: its two's complement.
  EXPECT_EQ(parse_request(Endpoint::kCompletions, json{{"prompt", "a"}, {"seed", -1}}).sampling.seed, UINT64_MAX);
  EXPECT_EQ(parse_request(Endpoint::kCompletions, json{{"prompt", "a"}, {"seed", 2.0}}).sampling.seed, 2u);
  expect_bad(Endpoint::kCompletions, json{{"prompt", "a"}, {"max_tokens", 9223372036854775808ull}}, "max_tokens",
             "is outside");
  // Ranges open at their lower end say so.
  expect_bad(Endpoint::kCompletions, json{{"prompt", "a"}, {"top_p", 1.5}}, "top_p", "top_p = 1.5 is outside (0, 1]");
  expect_bad(Endpoint::kCompletions, json{{"prompt", "a"}, {"top_p", 0}}, "top_p", "top_p = 0 is outside (0, 1]");
  expect_bad(Endpoint::kGenerate, json{{"text", "a"}, {"sampling_params", {{"repetition_penalty", 0.0}}}},
             "sampling_params.repetition_penalty", "sampling_params.repetition_penalty = 0.0 is outside (0, 2]");
  expect_bad(Endpoint::kCompletions, json{{"prompt", "a"}, {"logit_bias", {{"x", 1}}}}, "logit_bias", "not a token id");
  expect_bad(Endpoint::kCompletions, json{{"prompt", "a"}, {"logit_bias", {{"5", 101}}}}, "logit_bias", "101");
  expect_bad(Endpoint::kCompletions, json{{"prompt", "a"}, {"logit_bias", {{"5", -101}}}}, "logit_bias",
             "logit_bias[\"5\"] = -101 is not a bias in [-100, 100]");
  expect_bad(Endpoint::kCompletions, json{{"prompt", "a"}, {"logit_bias", 3}}, "logit_bias", "object");
  expect_bad(Endpoint::kCompletions, json{{"prompt", "a"}, {"response_format", {{"type", "structural_tag"}}}},
             "response_format", "is not supported; {\"type\": \"text\" | \"json_object\" | \"json_schema\"}");
  expect_bad(Endpoint::kCompletions, json{{"prompt", "a"}, {"response_format", {{"type", "json_schema"}}}},
             "response_format", "needs {\"json_schema\": {\"name\": ..., \"schema\": {...}}}");
  expect_bad(Endpoint::kCompletions, json{{"prompt", "a"}, {"regex", "a+"}, {"guided_json", {{"type", "string"}}}},
             "guided_json", "give one structured-output constraint, got regex and guided_json");
  expect_bad(Endpoint::kCompletions, json{{"prompt", "a"}, {"guided_choice", {"x", 3}}}, "guided_choice",
             "guided_choice[1] = 3 is not a non-empty string");
  expect_bad(Endpoint::kCompletions, json{{"prompt", "a"}, {"guided_grammar", "root ::= x"}}, "guided_grammar",
             "grammars (EBNF / GBNF) are not supported");
  expect_bad(Endpoint::kCompletions, json{{"prompt", "a"}, {"json_schema", 3}}, "json_schema",
             "must be a JSON schema (an object or its JSON text), got 3");
  expect_bad(Endpoint::kCompletions, json{{"prompt", "a"}, {"best_of", 3}}, "best_of", "best_of = 3");
  const json msgs = {{{"role", "user"}, {"content", "a"}}};
  expect_bad(Endpoint::kChat, json{{"messages", msgs}, {"tools", {{{"type", "function"}}}}}, "tools",
             "tools[0] must be {\"type\": \"function\", \"function\": {\"name\": ...}}");
  expect_bad(Endpoint::kChat, json{{"messages", msgs}, {"tool_choice", "required"}}, "tool_choice",
             "tool_choice \"required\" needs tools");
  expect_bad(Endpoint::kChat, json{{"messages", msgs}, {"tool_choice", "sometimes"}}, "tool_choice",
             "is not one of \"auto\", \"none\", \"required\"");
  auto tool = [](const std::string& name, json params) {
    json fn = {{"name", name}};
    if (!params.is_null()) fn["parameters"] = std::move(params);
    return json{{"type", "function"}, {"function", std::move(fn)}};
  };
  for (const json& bad_params : {json("x"), json(5), json{{"type", "array"}}, json{{"properties", json::array()}},
                                 json{{"type", "object"}, {"required", "a"}}})
    expect_bad(Endpoint::kChat, json{{"messages", msgs}, {"tools", {tool("f", bad_params)}}}, "tools",
               "tools[0].function.parameters must be the JSON schema of an object");
  expect_bad(Endpoint::kChat,
             json{{"messages", msgs}, {"tools", {tool("f", nullptr), tool("g", nullptr), tool("f", nullptr)}}}, "tools",
             "tools[2].function.name \"f\" is tools[0]'s too");
  EXPECT_NO_THROW(parse_request(
      Endpoint::kChat, json{{"messages", msgs}, {"tools", {tool("f", {{"type", "object"}}), tool("g", nullptr)}}}));
  const json one_tool = json::array({{{"type", "function"}, {"function", {{"name", "f"}}}}});
  expect_bad(Endpoint::kChat,
             json{{"messages", msgs},
                  {"tools", one_tool},
                  {"tool_choice", {{"type", "function"}, {"function", {{"name", "g"}}}}}},
             "tool_choice", "tool_choice names \"g\", not one of the tools");
  const ParsedRequest named =
      parse_request(Endpoint::kChat, json{{"messages", msgs},
                                          {"tools", one_tool},
                                          {"tool_choice", {{"type", "function"}, {"function", {{"name", "f"}}}}}});
  EXPECT_EQ(named.tool_choice, "function");
  EXPECT_EQ(named.tool_choice_name, "f");
  EXPECT_NO_THROW(
      parse_request(Endpoint::kChat, json{{"messages", msgs}, {"tools", json::array()}, {"tool_choice", "none"}}));
  expect_bad(Endpoint::kCompletions, json{{"prompt", "a"}, {"suffix", "tail"}}, "suffix", "not supported");
  expect_bad(Endpoint::kCompletions, json{{"prompt", {"a", json::array({1, 2})}}}, "prompt", "prompt[1]");
  expect_bad(Endpoint::kCompletions, json{{"prompt", {json::array({1}), json::array({2, -3})}}}, "prompt[1]",
             "prompt[1][1]");
  expect_bad(Endpoint::kCompletions, json{{"prompt", std::vector<std::string>(5, "a")}, {"n", 64}}, "prompt",
             "5 prompts x n = 64 = 320 choices > 256");
  expect_bad(Endpoint::kChat, json{{"messages", {{{"role", "user"}, {"content", "a"}}}}, {"n", 65}}, "n", "65");
  expect_bad(Endpoint::kGenerate, json{{"text", "a"}, {"top_logprobs_num", 21}}, "top_logprobs_num", "21");
  expect_bad(Endpoint::kCompletions, json{{"prompt", 5}}, "prompt", "5");
  expect_bad(Endpoint::kCompletions, json{{"prompt", "a"}, {"echo", 3}}, "echo", "echo");
  expect_bad(Endpoint::kGenerate, json{{"text", "a"}, {"logprob_start_len", -2}}, "logprob_start_len", "-2");
  expect_bad(Endpoint::kCompletions, json{{"prompt", "a"}, {"stream", "yes"}}, "stream", "\"yes\"");
  expect_bad(Endpoint::kCompletions, json{{"prompt", "a"}, {"presence_penalty", 3}}, "presence_penalty", "3");
  expect_bad(Endpoint::kChat, json{{"messages", json::array()}}, "messages", "non-empty");
  expect_bad(Endpoint::kChat, json{{"messages", {{{"role", "user"}, {"content", 7}}}}}, "messages[0].content", "7");
  expect_bad(Endpoint::kChat, json{{"messages", {{{"role", "user"}, {"content", "a"}}}}, {"top_logprobs", 2}},
             "top_logprobs", "logprobs");
  // stream_options belong to a stream (OpenAI and vLLM refuse them otherwise); null is no options.
  expect_bad(Endpoint::kCompletions, json{{"prompt", "a"}, {"stream_options", {{"include_usage", true}}}},
             "stream_options", "only allowed with stream = true, got stream = absent (false)");
  EXPECT_NO_THROW(parse_request(Endpoint::kCompletions, json{{"prompt", "a"}, {"stream_options", nullptr}}));
  expect_bad(Endpoint::kGenerate, json{{"text", "a"}, {"rid", ""}}, "rid", "1 to 256 bytes");
  expect_bad(Endpoint::kGenerate, json{{"text", "a"}, {"rid", std::string(257, 'r')}}, "rid", "257");
  for (const char* own : {"7", "cmpl-12", "chatcmpl-3"})
    expect_bad(Endpoint::kCompletions, json{{"prompt", "a"}, {"rid", own}}, "rid", "server's own ids");
  for (const char* fine : {"x7", "cmpl-", "cmpl-1a", "req-42"})
    EXPECT_EQ(parse_request(Endpoint::kGenerate, json{{"text", "a"}, {"rid", fine}}).rid, fine);
  // Truncated JSON, and a number no double holds (nlohmann's out_of_range, not a parse_error).
  for (const std::string body : {"{\"a\": ", "{\"prompt\": \"a\", \"x\": 1e999}", "{\"t\": [-1e400]}"}) {
    try {
      parse_body(body);
      ADD_FAILURE() << "accepted " << body;
    } catch (const ApiError& e) {
      EXPECT_EQ(e.status, 400) << body;
      EXPECT_EQ(e.param, "body");
      EXPECT_NE(e.message.find("malformed JSON"), std::string::npos) << e.message;
    }
  }
  // Nesting is bounded while parsing (format::try_parse_json, the parse files and schemas use too).
  const std::string deep = "{\"a\": " + std::string(65, '[') + std::string(65, ']') + "}";
  try {
    parse_body(deep);
    ADD_FAILURE() << "accepted a body nesting 66 levels";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status, 400);
    EXPECT_EQ(e.message, "the JSON body (" + std::to_string(deep.size()) + " bytes): JSON nests deeper than " +
                             std::to_string(kMaxBodyDepth) + " levels");
  }
  EXPECT_EQ(parse_body("{\"a\": " + std::string(63, '[') + std::string(63, ']') + "}").size(), 1u);
}

// OpenAI content parts on a text-only model: text parts pass (and are joined by "\n" for a template
// that prints content), media and unknown parts are a 400 naming the part.
TEST(ServerProtocol, ChatContentParts) {
  auto chat = [](json content) { return json{{"messages", {{{"role", "user"}, {"content", std::move(content)}}}}}; };
  const ParsedRequest r =
      parse_request(Endpoint::kChat, chat({{{"type", "text"}, {"text", "hi"}}, {{"type", "text"}, {"text", "there"}}}));
  EXPECT_TRUE((*r.messages)[0]["content"].is_array());
  // A template that prints content gets the parts joined; one that iterates them gets the list.
  const fp4moe::engine::ChatTemplate prints("{% for m in messages %}[{{ m.content }}]{% endfor %}", {});
  EXPECT_FALSE(prints.iterates_content());
  EXPECT_EQ(render_chat(prints, r), "[hi\nthere]");
  const fp4moe::engine::ChatTemplate iterates(
      "{% for m in messages %}{% for p in m.content %}<{{ p.text }}>{% endfor %}{% endfor %}", {});
  EXPECT_TRUE(iterates.iterates_content());
  EXPECT_EQ(render_chat(iterates, r), "<hi><there>");

  // vLLM's continue_final_message: the chat ends inside the last message, whose turn end is cut.
  const fp4moe::engine::ChatTemplate turns(
      "{% for m in messages %}<{{ m.role }}>{{ m.content }}</end>{% endfor %}{% if add_generation_prompt %}<assistant>"
      "{% endif %}",
      {});
  auto prefill = [](json content) {
    return json{{"messages", {{{"role", "user"}, {"content", "Hi"}}, {{"role", "assistant"}, {"content", content}}}},
                {"continue_final_message", true},
                {"add_generation_prompt", false}};
  };
  EXPECT_EQ(render_chat(turns, parse_request(Endpoint::kChat, prefill("Sure, {"))), "<user>Hi</end><assistant>Sure, {");
  EXPECT_EQ(render_chat(turns, parse_request(Endpoint::kChat, prefill("Sure "))), "<user>Hi</end><assistant>Sure ");
  EXPECT_EQ(
      render_chat(turns, parse_request(Endpoint::kChat, prefill(json::array({{{"type", "text"}, {"text", "ab"}}})))),
      "<user>Hi</end><assistant>ab");
  // A template that trims the text: cut at its stripped end.
  const fp4moe::engine::ChatTemplate trims(
      "{% for m in messages %}<{{ m.role }}>{{ m.content | trim }}</end>{% endfor %}", {});
  EXPECT_EQ(render_chat(trims, parse_request(Endpoint::kChat, prefill("Sure  "))), "<user>Hi</end><assistant>Sure");
  // Unicode whitespace (an ideographic space, NBSP) is whitespace, as Python's strip() and the template's trim see it.
  EXPECT_EQ(render_chat(trims, parse_request(Endpoint::kChat, prefill("\xe5\xa5\xbd\xe3\x80\x80"))),
            "<user>Hi</end><assistant>\xe5\xa5\xbd");
  EXPECT_EQ(render_chat(trims, parse_request(Endpoint::kChat, prefill("\xc2\xa0ok\xc2\xa0"))),
            "<user>Hi</end><assistant>ok");
  EXPECT_EQ(render_chat(trims, parse_request(Endpoint::kChat, prefill("abc\x1f"))),  // Python's isspace, not Unicode's
            "<user>Hi</end><assistant>abc");
  // Text parts joined for a template that prints content: the cut is after the whole text, not inside the turn's end.
  EXPECT_EQ(
      render_chat(turns, parse_request(Endpoint::kChat, prefill(json::array({{{"type", "text"}, {"text", "Let me."}},
                                                                             {{"type", "text"}, {"text", "end"}}})))),
      "<user>Hi</end><assistant>Let me.\nend");
  json both = prefill("x");
  both.erase("add_generation_prompt");  // it defaults to true
  expect_bad(Endpoint::kChat, both, "continue_final_message", "cannot both be true");
  try {
    render_chat(turns, parse_request(Endpoint::kChat, prefill("  ")));
    ADD_FAILURE() << "an empty final message was continued";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.param, "continue_final_message");
    EXPECT_NE(e.message.find("nothing to continue"), std::string::npos) << e.message;
  }
  const fp4moe::engine::ChatTemplate drops(
      "{% for m in messages %}{% if m.role == 'user' %}{{ m.content }}{% endif %}{% endfor %}", {});
  try {
    render_chat(drops, parse_request(Endpoint::kChat, prefill("never shown")));
    ADD_FAILURE() << "a final message the template drops was continued";
  } catch (const ApiError& e) {
    EXPECT_NE(e.message.find("does not appear in the chat"), std::string::npos) << e.message;
  }

  expect_bad(Endpoint::kChat, chat({{{"type", "image_url"}, {"image_url", {{"url", "http://x/y.png"}}}}}),
             "messages[0].content[0].type", "text only");
  expect_bad(Endpoint::kChat, chat({{{"type", "text"}, {"text", "a"}}, {{"type", "video"}}}),
             "messages[0].content[1].type", "\"video\"");
  expect_bad(Endpoint::kChat, chat({{{"type", "sticker"}}}), "messages[0].content[0].type",
             "\"sticker\" is not a content part type");
  expect_bad(Endpoint::kChat, chat({{{"text", "a"}}}), "messages[0].content[0].type", "nothing");
  expect_bad(Endpoint::kChat, chat({{{"type", "text"}, {"text", 5}}}), "messages[0].content[0].text", "5");
  expect_bad(Endpoint::kChat, chat(json::array({nullptr})), "messages[0].content[0]", "null");
  expect_bad(Endpoint::kChat, chat(json::array({"str"})), "messages[0].content[0]", "\"str\"");
}

TEST(ServerProtocol, DefaultsErrorsAndResponses) {
  EXPECT_EQ(default_max_new_tokens(Endpoint::kGenerate, 10, 1000), 128);
  EXPECT_EQ(default_max_new_tokens(Endpoint::kCompletions, 10, 1000), 16);
  EXPECT_EQ(default_max_new_tokens(Endpoint::kChat, 10, 1000), 990);
  EXPECT_EQ(default_max_new_tokens(Endpoint::kGenerate, 990, 1000), 10);

  ApiError e = bad_request("top_p", "top_p = 2 is outside [0, 1]");
  e.extra = {{"limit", 1}};
  const json j = e.to_json();
  EXPECT_EQ(j["error"]["code"], 400);
  EXPECT_EQ(j["error"]["param"], "top_p");
  EXPECT_EQ(j["error"]["type"], "invalid_request_error");
  EXPECT_EQ(j["error"]["limit"], 1);

  ParsedRequest req = parse_request(Endpoint::kCompletions, json{{"prompt", "x"}});
  ResponseContext ctx{"cmpl-7", "m", 123, 4, nullptr};
  Accumulated acc;
  fp4moe::engine::RequestOutput out;
  out.tokens.push_back({.id = 5});
  out.text = "ab";
  acc.add(out);
  out.tokens[0].id = 6;
  out.text = "c";
  out.finished = fp4moe::engine::Finish{};
  out.finished->reason = fp4moe::engine::FinishReason::kLength;
  out.finished->usage = {4, 2};
  acc.add(out);
  const json r = completion_response(req, ctx, acc);
  EXPECT_EQ(r["choices"][0]["text"], "abc");
  EXPECT_EQ(r["choices"][0]["finish_reason"], "length");
  EXPECT_TRUE(r["choices"][0]["logprobs"].is_null());
  EXPECT_EQ(r["usage"]["total_tokens"], 6);
  const json g = generate_response(req, ctx, acc);
  EXPECT_EQ(g["output_ids"], json({5, 6}));
  EXPECT_EQ(g["meta_info"]["finish_reason"]["type"], "length");
  EXPECT_TRUE(g["meta_info"]["ttft"].is_null());  // no token times: no first token to time (it said 0.0)
  Accumulated timed = acc;
  timed.finish->timings.ttft_s = 0.25;
  timed.finish->timings.token_times_s = {0.25, 0.5};
  EXPECT_EQ(generate_response(req, ctx, timed)["meta_info"]["ttft"], 0.25);
  EXPECT_EQ(g["meta_info"]["finish_reason"]["length"], 2);
  // logit_bias (OpenAI and SGLang), the plain response_format, best_of = n: accepted.
  const ParsedRequest lb = parse_request(Endpoint::kChat, json{{"messages", {{{"role", "user"}, {"content", "a"}}}},
                                                               {"logit_bias", {{"7", -100}, {"9", 2.5}}},
                                                               {"response_format", {{"type", "text"}}},
                                                               {"n", 2},
                                                               {"best_of", 2}});
  ASSERT_EQ(lb.sampling.logit_bias.size(), 2u);
  EXPECT_EQ(lb.sampling.logit_bias[0], (std::pair<fp4moe::engine::TokenId, float>{7, -100.0f}));
  EXPECT_EQ(lb.sampling.logit_bias[1], (std::pair<fp4moe::engine::TokenId, float>{9, 2.5f}));
  EXPECT_EQ(parse_request(Endpoint::kGenerate, json{{"text", "a"}, {"sampling_params", {{"logit_bias", {{"3", 1}}}}}})
                .sampling.logit_bias.size(),
            1u);
  EXPECT_FALSE(lb.constraint) << "response_format text asks for nothing";
  // Structured outputs: each spelling becomes one ConstraintSpec naming its field (compiled by the server).
  using Kind = fp4moe::engine::ConstraintSpec::Kind;
  const ParsedRequest jo = parse_request(Endpoint::kChat, json{{"messages", {{{"role", "user"}, {"content", "a"}}}},
                                                               {"response_format", {{"type", "json_object"}}}});
  ASSERT_TRUE(jo.constraint);
  EXPECT_EQ(jo.constraint->kind, Kind::kJsonObject);
  EXPECT_EQ(jo.constraint->param, "response_format");
  const ParsedRequest js = parse_request(
      Endpoint::kCompletions,
      json{{"prompt", "a"},
           {"response_format",
            {{"type", "json_schema"}, {"json_schema", {{"name", "n"}, {"schema", {{"type", "integer"}}}}}}}});
  ASSERT_TRUE(js.constraint);
  EXPECT_EQ(js.constraint->kind, Kind::kJsonSchema);
  EXPECT_EQ(js.constraint->text, R"({"type":"integer"})");
  const ParsedRequest rg =
      parse_request(Endpoint::kGenerate, json{{"text", "a"}, {"sampling_params", {{"regex", "[ab]+"}}}});
  ASSERT_TRUE(rg.constraint);
  EXPECT_EQ(rg.constraint->kind, Kind::kRegex);
  EXPECT_EQ(rg.constraint->param, "sampling_params.regex");
  EXPECT_EQ(rg.constraint->text, "[ab]+");
  const ParsedRequest sj = parse_request(
      Endpoint::kGenerate, json{{"text", "a"}, {"sampling_params", {{"json_schema", R"({"type": "string"})"}}}});
  ASSERT_TRUE(sj.constraint);
  EXPECT_EQ(sj.constraint->text, R"({"type": "string"})") << "SGLang sends the schema as JSON text, kept as sent";
  // parse_body sorts keys; restore_key_order re-reads an object schema and the tools as sent.
  const std::string raw = R"({"messages": [{"role": "user", "content": "a"}],
      "tools": [{"type": "function", "function": {"name": "f", "parameters": {"properties": {"z": {}, "a": {}}}}}],
      "response_format": {"type": "json_schema", "json_schema": {"schema": {"properties": {"z": {}, "a": {}}}}}})";
  ParsedRequest ord = parse_request(Endpoint::kChat, parse_body(raw));
  EXPECT_EQ(ord.schema_pointer, "/response_format/json_schema/schema");
  EXPECT_EQ(ord.constraint->text, R"({"properties":{"a":{},"z":{}}})");
  restore_key_order(ord, raw);
  EXPECT_EQ(ord.constraint->text, R"({"properties":{"z":{},"a":{}}})");
  EXPECT_EQ(ord.tools[0]["function"]["parameters"].dump(), R"({"properties":{"z":{},"a":{}}})");
  const ParsedRequest gc = parse_request(Endpoint::kCompletions, json{{"prompt", "a"}, {"guided_choice", {"x", "y"}}});
  ASSERT_TRUE(gc.constraint);
  EXPECT_EQ(gc.constraint->kind, Kind::kChoice);
  EXPECT_EQ(gc.constraint->choices, (std::vector<std::string>{"x", "y"}));
  // A batch of prompts (completions): all strings or all id lists; one id list is a single prompt.
  const ParsedRequest bt = parse_request(Endpoint::kCompletions, json{{"prompt", {"a", "bc"}}, {"n", 2}});
  ASSERT_EQ(bt.batch.size(), 2u);
  EXPECT_EQ(bt.batch[1].text, std::optional<std::string>("bc"));
  EXPECT_FALSE(bt.text.has_value());
  const ParsedRequest bi =
      parse_request(Endpoint::kCompletions, json{{"prompt", {json::array({1, 2}), json::array({3})}}});
  ASSERT_EQ(bi.batch.size(), 2u);
  EXPECT_EQ(bi.batch[0].input_ids,
            (std::optional<std::vector<fp4moe::engine::TokenId>>(std::vector<fp4moe::engine::TokenId>{1, 2})));
  const ParsedRequest one = parse_request(Endpoint::kCompletions, json{{"prompt", {json::array({4, 5})}}});
  EXPECT_TRUE(one.batch.empty());
  EXPECT_EQ(one.input_ids,
            (std::optional<std::vector<fp4moe::engine::TokenId>>(std::vector<fp4moe::engine::TokenId>{4, 5})));
  // n choices: one per Accumulated, indexed in order; usage counts the prompt once.
  ParsedRequest req3 =
      parse_request(Endpoint::kChat, json{{"messages", {{{"role", "user"}, {"content", "a"}}}}, {"n", 3}});
  EXPECT_EQ(req3.n, 3);
  EXPECT_EQ(parse_request(Endpoint::kCompletions, json{{"prompt", "x"}}).n, 1);
  Accumulated unfinished;
  out.finished.reset();
  out.text = "z";
  unfinished.add(out);
  const std::vector<Accumulated> three = {acc, unfinished, acc};
  const json c3 = chat_response(req3, ctx, three);
  ASSERT_EQ(c3["choices"].size(), 3u);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(c3["choices"][i]["index"], i);
  EXPECT_EQ(c3["choices"][1]["message"]["content"], "z");
  EXPECT_TRUE(c3["choices"][1]["finish_reason"].is_null());
  EXPECT_EQ(c3["usage"]["prompt_tokens"], 4);
  EXPECT_EQ(c3["usage"]["completion_tokens"], 2 + 1 + 2);  // finished: the engine's count; running: its tokens
  EXPECT_EQ(completion_chunk(req3, ctx, out, 2)["choices"][0]["index"], 2);
  EXPECT_EQ(chat_chunk(req3, ctx, out, true, 1)["choices"][0]["index"], 1);
  // Invalid UTF-8 never throws out of dump_json.
  EXPECT_NO_THROW(dump_json(json{{"t", std::string("\xff\xfe")}}));
}

// echo / logprob_start_len turn on the engine's prompt logprobs only with logprobs asked for; the
// echoed event starts with the prompt's text and entries, the first entry's logprob written null.
TEST(ServerProtocol, EchoAndPromptLogprobs) {
  EXPECT_EQ(parse_request(Endpoint::kCompletions, json{{"prompt", "x"}, {"echo", true}}).sampling.prompt_logprobs, -1);
  const ParsedRequest req =
      parse_request(Endpoint::kCompletions, json{{"prompt", "x"}, {"echo", true}, {"logprobs", 2}});
  EXPECT_TRUE(req.echo);
  EXPECT_EQ(req.sampling.prompt_logprobs, 2);
  EXPECT_EQ(parse_request(Endpoint::kCompletions, json{{"prompt", "x"}, {"logprobs", 2}}).sampling.prompt_logprobs, -1);
  EXPECT_EQ(parse_request(Endpoint::kGenerate, json{{"text", "x"}, {"logprob_start_len", 0}}).sampling.prompt_logprobs,
            -1);
  const ParsedRequest gen =
      parse_request(Endpoint::kGenerate,
                    json{{"text", "x"}, {"return_logprob", true}, {"logprob_start_len", 1}, {"top_logprobs_num", 1}});
  EXPECT_EQ(gen.sampling.prompt_logprobs, 1);
  EXPECT_FALSE(
      parse_request(Endpoint::kGenerate, json{{"text", "x"}, {"logprob_start_len", -1}}).logprobs.logprob_start_len);

  fp4moe::engine::RequestOutput out;
  out.tokens.push_back({.id = 9, .logprob = -0.5f});
  out.text = "!";
  out.prompt_logprobs.push_back({.id = 3, .logprob = std::numeric_limits<float>::quiet_NaN()});
  out.prompt_logprobs.push_back({.id = 4, .logprob = -1.25f, .top_logprobs = {{4, -1.25f}, {5, -2.0f}}});
  fp4moe::engine::RequestOutput plain = out;
  apply_echo(parse_request(Endpoint::kCompletions, json{{"prompt", "x"}}), "ab", plain);  // no echo: untouched
  EXPECT_EQ(plain.text, "!");
  EXPECT_EQ(plain.tokens.size(), 1u);
  apply_echo(req, "ab", out);
  EXPECT_EQ(out.text, "ab!");
  ASSERT_EQ(out.tokens.size(), 3u);
  out.finished = fp4moe::engine::Finish{};
  Accumulated acc;
  acc.add(out);
  const ResponseContext ctx{"cmpl-1", "m", 1, 2, nullptr};
  const json lp = completion_response(req, ctx, acc)["choices"][0]["logprobs"];
  EXPECT_EQ(lp["token_logprobs"], json({nullptr, -1.25, -0.5}));
  EXPECT_TRUE(lp["top_logprobs"][0].is_null());
  EXPECT_EQ(lp["top_logprobs"][1].size(), 1u);  // both ids print as "" without a tokenizer: one key
  // /generate: input_token_logprobs from logprob_start_len on.
  Accumulated gacc;
  fp4moe::engine::RequestOutput gout = out;
  gout.tokens = {out.tokens.back()};
  gacc.add(gout);
  const json meta = generate_response(gen, ctx, gacc)["meta_info"];
  EXPECT_EQ(meta["input_token_logprobs"], json::array({json::array({-1.25, 4, nullptr})}));
  EXPECT_EQ(meta["input_top_logprobs"],
            json::array({json::array({json::array({-1.25, 4, nullptr}), json::array({-2.0, 5, nullptr})})}));
}

// Completions logprobs as the OpenAI API and vLLM give them: a position's top_logprobs hold the token taken there
// (logprobs + 1 entries when it is not among the top ones; with logprobs 0 that token alone), and text_offset counts
// characters of the text, not bytes ("h\u00e9llo \u20ac!": the bytes made "\u20ac" start at 8, not 7).
TEST(ServerProtocol, CompletionLogprobsHoldTheTakenTokenAndCountCharacters) {
  const auto tok = fp4moe::engine::make_default_tokenizer();
  const std::vector<std::string> chars = {"h", "\xC3\xA9", "l", "l", "o", " ", "\xE2\x82\xAC", "!"};
  const ResponseContext ctx{"cmpl-1", "m", 1, 2, tok.get()};
  for (const int64_t k : {1, 0}) {
    SCOPED_TRACE(k);
    fp4moe::engine::RequestOutput out;  // as the engine gives it for logprobs k
    std::vector<size_t> first_token_of_char;
    for (const std::string& ch : chars) {
      first_token_of_char.push_back(out.tokens.size());
      for (const auto id : tok->encode(ch)) {
        fp4moe::engine::GeneratedToken t{.id = id, .logprob = -2.0f};
        // The top-1 entry is another token: the taken one must be added beside it.
        if (k == 1) t.top_logprobs = {{static_cast<fp4moe::engine::TokenId>(id == 65 ? 66 : 65), -0.25f}};
        out.tokens.push_back(t);
      }
    }
    out.finished = fp4moe::engine::Finish{};
    Accumulated acc;
    acc.add(out);
    const ParsedRequest req = parse_request(Endpoint::kCompletions, json{{"prompt", "x"}, {"logprobs", k}});
    const json lp = completion_response(req, ctx, acc)["choices"][0]["logprobs"];
    ASSERT_EQ(lp["top_logprobs"].size(), out.tokens.size());
    for (size_t i = 0; i < out.tokens.size(); ++i) {
      const json& top = lp["top_logprobs"][i];
      EXPECT_EQ(top.size(), 1u + static_cast<size_t>(k)) << top.dump();
      EXPECT_EQ(top.at(lp["tokens"][i].get<std::string>()), -2.0f) << top.dump();
    }
    for (size_t c = 0; c < chars.size(); ++c) EXPECT_EQ(lp["text_offset"][first_token_of_char[c]], c) << c;
  }
}

// vLLM's min_tokens / include_stop_str_in_output on the OpenAI routes, SGLang's min_new_tokens / no_stop_trim on
// /generate.
TEST(ServerProtocol, MinTokensAndStopTrimByEachApisName) {
  EXPECT_EQ(parse_request(Endpoint::kCompletions, json{{"prompt", "x"}, {"min_tokens", 4}}).sampling.min_new_tokens, 4);
  EXPECT_EQ(
      parse_request(Endpoint::kChat, json{{"messages", {{{"role", "user"}, {"content", "a"}}}}, {"min_tokens", 2}})
          .sampling.min_new_tokens,
      2);
  EXPECT_EQ(parse_request(Endpoint::kGenerate, json{{"text", "x"}, {"sampling_params", {{"min_new_tokens", 3}}}})
                .sampling.min_new_tokens,
            3);
  expect_bad(Endpoint::kCompletions, json{{"prompt", "x"}, {"min_tokens", -1}}, "min_tokens", "-1");
  // The request priority (top level on every route).
  EXPECT_EQ(parse_request(Endpoint::kGenerate, json{{"text", "x"}, {"priority", -3}}).priority, -3);
  EXPECT_FALSE(parse_request(Endpoint::kGenerate, json{{"text", "x"}}).priority.has_value());  // none named
  EXPECT_EQ(parse_request(Endpoint::kChat, json{{"messages", {{{"role", "user"}, {"content", "a"}}}}, {"priority", 7}})
                .priority,
            7);
  expect_bad(Endpoint::kCompletions, json{{"prompt", "x"}, {"priority", 1.5}}, "priority", "integer");
  // The stop string kept in the text: vLLM's include_stop_str_in_output, SGLang's no_stop_trim.
  EXPECT_TRUE(parse_request(Endpoint::kCompletions, json{{"prompt", "x"}, {"include_stop_str_in_output", true}})
                  .sampling.include_stop_str);
  EXPECT_TRUE(parse_request(Endpoint::kGenerate, json{{"text", "x"}, {"sampling_params", {{"no_stop_trim", true}}}})
                  .sampling.include_stop_str);
}

TEST(ServerProtocol, MetricsRenderCumulativeHistograms) {
  fp4moe::engine::EngineStats s;
  s.ttft_s = fp4moe::engine::Histogram({0.1, 1.0});
  s.ttft_s.observe(0.05);
  s.ttft_s.observe(0.5);
  s.ttft_s.observe(5.0);
  s.moe_layers = {1, 2};
  s.expert_tokens = {{3, 0}, {1, 2}};
  s.kv_used_tokens = 16;
  s.kv_total_tokens = 64;
  const std::string text = render_metrics(s, HttpCounters{{{400, 3}}}, ServedModel{"/m/a\"b", "glm"});
  for (const char* line : {"fp4moe:time_to_first_token_seconds_bucket{le=\"0.1\"} 1\n",
                           "fp4moe:time_to_first_token_seconds_bucket{le=\"1\"} 2\n",
                           "fp4moe:time_to_first_token_seconds_bucket{le=\"+Inf\"} 3\n",
                           "fp4moe:time_to_first_token_seconds_count 3\n", "fp4moe:token_usage 0.25\n",
                           "fp4moe:moe_expert_tokens_total{layer=\"2\",expert=\"1\"} 2\n",
                           "fp4moe:http_errors_total{code=\"400\"} 3\n",
                           "fp4moe:model_info{model_path=\"/m/a\\\"b\",served_model_name=\"glm\"} 1\n",
                           "# TYPE fp4moe:e2e_request_latency_seconds histogram\n"}) {
    EXPECT_NE(text.find(line), std::string::npos) << line << "\n" << text;
  }
  EXPECT_NE(render_metrics(s, {}, ServedModel{"/m", "glm", "nvfp4"})
                .find("fp4moe:model_info{model_path=\"/m\",served_model_name=\"glm\",expert_weights=\"nvfp4\"} 1\n"),
            std::string::npos);
}

// --reasoning-parser on the chat routes: the non-streaming message carries reasoning_content beside the
// answer (null when the reply had no block); streamed, each delta carries what its event decided, the
// last one what was held back; separate_reasoning is parsed; without a format the text is all content.
TEST(ServerProtocol, ChatReasoningContentWholeAndStreamed) {
  ParsedRequest req = parse_request(
      Endpoint::kChat, json{{"messages", {{{"role", "user"}, {"content", "a"}}}}, {"separate_reasoning", false}});
  EXPECT_EQ(req.separate_reasoning, std::optional<bool>(false));
  EXPECT_FALSE(parse_request(Endpoint::kChat, json{{"messages", {{{"role", "user"}, {"content", "a"}}}}})
                   .separate_reasoning.has_value());
  ResponseContext ctx{"chatcmpl-1", "m", 123, 4, nullptr};
  std::vector<std::string> pieces = {"<thi", "nk>Two and", " two.</th", "ink>\n\nFour", "."};
  Accumulated acc;
  fp4moe::engine::RequestOutput out;
  for (size_t i = 0; i < pieces.size(); ++i) {
    out.text = pieces[i];
    if (i + 1 == pieces.size()) {
      out.finished = fp4moe::engine::Finish{};
      out.finished->usage = {4, 5};
    }
    acc.add(out);
  }
  json plain = chat_response(req, ctx, acc);  // no format: as before
  EXPECT_EQ(plain["choices"][0]["message"]["content"], "<think>Two and two.</think>\n\nFour.");
  EXPECT_FALSE(plain["choices"][0]["message"].contains("reasoning_content"));
  req.reasoning = find_reasoning_format("glm45");
  json split = chat_response(req, ctx, acc);
  EXPECT_EQ(split["choices"][0]["message"]["content"], "Four.");
  EXPECT_EQ(split["choices"][0]["message"]["reasoning_content"], "Two and two.");

  ChatChoiceStream parser = ChatChoiceStream::for_request(req);
  std::string reasoning, content;
  out.finished.reset();
  for (size_t i = 0; i < pieces.size(); ++i) {
    out.text = pieces[i];
    if (i + 1 == pieces.size()) out.finished = acc.finish;
    const json d = chat_chunk(req, ctx, out, i == 0, 0, &parser)["choices"][0]["delta"];
    if (i == 0) {
      EXPECT_EQ(d["role"], "assistant");
      EXPECT_EQ(d["content"], "") << "the first delta carries the role and an empty content";
    }
    if (d.contains("reasoning_content")) reasoning += d["reasoning_content"].get<std::string>();
    if (d.contains("content")) content += d["content"].get<std::string>();
    EXPECT_EQ(d.dump().find("think>"), std::string::npos) << d.dump();
  }
  EXPECT_EQ(reasoning, "Two and two.");
  EXPECT_EQ(content, "Four.");

  Accumulated no_block;
  out.text = "Just an answer.";
  out.finished = acc.finish;
  no_block.add(out);
  const json nb = chat_response(req, ctx, no_block);
  EXPECT_EQ(nb["choices"][0]["message"]["content"], "Just an answer.");
  EXPECT_TRUE(nb["choices"][0]["message"]["reasoning_content"].is_null());
}

// --tool-call-parser on the chat route: tools and tool_choice parsed ("required" without tools refused);
// the reply's calls become message.tool_calls (content null when nothing else was said, finish_reason
// "tool_calls"); streamed, each call arrives whole in one delta with its index, after the reasoning.
TEST(ServerProtocol, ChatToolCallsWholeAndStreamed) {
  const json tools = json::array(
      {{{"type", "function"}, {"function", {{"name", "get_weather"}, {"parameters", {{"type", "object"}}}}}}});
  ParsedRequest req = parse_request(
      Endpoint::kChat,
      json{{"messages", {{{"role", "user"}, {"content", "a"}}}}, {"tools", tools}, {"tool_choice", "auto"}});
  ASSERT_TRUE(req.tools.is_array());
  EXPECT_EQ(req.tools[0]["function"]["name"], "get_weather");
  EXPECT_EQ(req.tool_choice, "auto");
  const json msgs = {{{"role", "user"}, {"content", "a"}}};
  auto param_of = [](const std::function<void()>& fn) {
    try {
      fn();
    } catch (const ApiError& e) {
      return e.param;
    }
    return std::string("(accepted)");
  };
  EXPECT_EQ(param_of([&] {
              parse_request(Endpoint::kChat, json{{"messages", msgs}, {"tool_choice", "required"}});
            }),
            "tool_choice");
  EXPECT_EQ(param_of([&] {
              parse_request(Endpoint::kChat, json{{"messages", msgs}, {"tools", {{{"type", "x"}}}}});
            }),
            "tools");
  EXPECT_EQ(parse_request(Endpoint::kChat, json{{"messages", msgs}, {"tool_choice", "none"}}).tool_choice, "none");
  // A tool round trip's assistant turn: arguments text becomes the object the template iterates.
  const json turn = {
      {{"role", "user"}, {"content", "a"}},
      {{"role", "assistant"},
       {"tool_calls",
        {{{"id", "c1"}, {"type", "function"}, {"function", {{"name", "f"}, {"arguments", R"({"b": 2, "a": [1]})"}}}}}}},
      {{"role", "tool"}, {"content", "ok"}}};
  const ParsedRequest rt = parse_request(Endpoint::kChat, json{{"messages", turn}});
  const auto& args = (*rt.messages)[1]["tool_calls"][0]["function"]["arguments"];
  ASSERT_TRUE(args.is_object());
  EXPECT_EQ(args.dump(), R"({"b":2,"a":[1]})") << "keys in the order sent";
  // Arguments text that is not JSON stays text; text nesting past the body's bound is a 400 naming it (the template
  // walks the object: a deep one overflowed the stack).
  json odd = turn;
  odd[1]["tool_calls"][0]["function"]["arguments"] = "{not json";
  EXPECT_EQ(
      (*parse_request(Endpoint::kChat, json{{"messages", odd}}).messages)[1]["tool_calls"][0]["function"]["arguments"],
      "{not json");
  const auto nested = [](int arrays) {
    return "{\"a\": " + std::string(static_cast<size_t>(arrays), '[') + std::string(static_cast<size_t>(arrays), ']') +
           "}";
  };
  odd[1]["tool_calls"][0]["function"]["arguments"] = nested(100000);
  expect_bad(Endpoint::kChat, json{{"messages", odd}}, "messages[1].tool_calls[0].function.arguments",
             "JSON nests deeper than 58 levels");
  // The bound keeps the body, the object in place, within kMaxBodyDepth: the object and 58 arrays in it pass (the
  // body then nests exactly 64 levels deep: it parses again), one more array is refused.
  odd[1]["tool_calls"][0]["function"]["arguments"] = nested(58);
  const ParsedRequest deepest = parse_request(Endpoint::kChat, json{{"messages", odd}});
  EXPECT_TRUE((*deepest.messages)[1]["tool_calls"][0]["function"]["arguments"].is_object());
  EXPECT_EQ(parse_body(json{{"messages", *deepest.messages}}.dump()).size(), 1u);
  odd[1]["tool_calls"][0]["function"]["arguments"] = nested(59);
  expect_bad(Endpoint::kChat, json{{"messages", odd}}, "messages[1].tool_calls[0].function.arguments",
             "JSON nests deeper than 58 levels");

  req.reasoning = find_reasoning_format("glm45");
  req.tool_calls = find_tool_call_format("glm45");
  ResponseContext ctx{"chatcmpl-9", "m", 123, 4, nullptr};
  const std::vector<std::string> pieces = {"<think>need the weather</think>\n", "<tool_c",
                                           "all>get_weather\n<arg_key>city",
                                           "</arg_key>\n<arg_value>Paris</arg_value>\n</tool_call>"};
  Accumulated acc;
  fp4moe::engine::RequestOutput out;
  for (size_t i = 0; i < pieces.size(); ++i) {
    out.text = pieces[i];
    if (i + 1 == pieces.size()) {
      out.finished = fp4moe::engine::Finish{};
      out.finished->reason = fp4moe::engine::FinishReason::kStop;
    }
    acc.add(out);
  }
  const json whole = chat_response(req, ctx, acc);
  const json& m = whole["choices"][0]["message"];
  EXPECT_EQ(m["reasoning_content"], "need the weather");
  EXPECT_TRUE(m["content"].is_null());
  ASSERT_EQ(m["tool_calls"].size(), 1u);
  EXPECT_EQ(m["tool_calls"][0]["type"], "function");
  EXPECT_EQ(m["tool_calls"][0]["function"]["name"], "get_weather");
  EXPECT_EQ(m["tool_calls"][0]["function"]["arguments"], R"({"city":"Paris"})");
  EXPECT_EQ(m["tool_calls"][0]["id"].get<std::string>().rfind("call_", 0), 0u);
  EXPECT_EQ(whole["choices"][0]["finish_reason"], "tool_calls");

  ChatChoiceStream stream = ChatChoiceStream::for_request(req);
  out.finished.reset();
  std::vector<json> calls;
  std::string reasoning;
  json last;
  for (size_t i = 0; i < pieces.size(); ++i) {
    out.text = pieces[i];
    if (i + 1 == pieces.size()) out.finished = acc.finish;
    last = chat_chunk(req, ctx, out, i == 0, 0, &stream)["choices"][0];
    const json& d = last["delta"];
    if (d.contains("reasoning_content")) reasoning += d["reasoning_content"].get<std::string>();
    if (d.contains("content")) {
      EXPECT_EQ(d["content"], "") << d.dump();
    }
    if (d.contains("tool_calls")) {
      for (const json& c : d["tool_calls"]) calls.push_back(c);
    }
  }
  EXPECT_EQ(reasoning, "need the weather");
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_EQ(calls[0]["index"], 0);
  EXPECT_EQ(calls[0]["function"]["arguments"], R"({"city":"Paris"})");
  EXPECT_EQ(calls[0]["id"], m["tool_calls"][0]["id"]);
  EXPECT_EQ(last["finish_reason"], "tool_calls");

  // No call in the reply: content as usual, an empty tool_calls list, the engine's finish_reason.
  Accumulated plain;
  out.text = "It is sunny.";
  plain.add(out);
  const json p = chat_response(req, ctx, plain)["choices"][0];
  EXPECT_EQ(p["message"]["content"], "It is sunny.");
  EXPECT_TRUE(p["message"]["tool_calls"].empty());
  EXPECT_EQ(p["finish_reason"], "stop");

  // A call of a function not among the tools is dropped (SGLang's detectors drop it); parallel_tool_calls false
  // keeps the first call (vLLM's) and parses as false from the request.
  const std::string call = "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Oslo</arg_value>\n</tool_call>";
  Accumulated three;
  out.text = call + "\n<tool_call>rm_rf\n</tool_call>\n" + call;
  three.add(out);
  EXPECT_EQ(chat_response(req, ctx, three)["choices"][0]["message"]["tool_calls"].size(), 2u);
  ParsedRequest one = req;
  one.parallel_tool_calls = false;
  const json single = chat_response(one, ctx, three)["choices"][0];
  ASSERT_EQ(single["message"]["tool_calls"].size(), 1u);
  EXPECT_EQ(single["message"]["tool_calls"][0]["function"]["arguments"], R"({"city":"Oslo"})");
  EXPECT_EQ(single["finish_reason"], "tool_calls");
  EXPECT_FALSE(parse_request(Endpoint::kChat,
                             json{{"messages", {{{"role", "user"}, {"content", "x"}}}}, {"parallel_tool_calls", false}})
                   .parallel_tool_calls);
}

}  // namespace
