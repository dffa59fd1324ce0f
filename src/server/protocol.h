// The request/response shapes of the HTTP API, without any HTTP or engine threading: JSON bodies are
// parsed and validated into ParsedRequest (every bad field becomes an ApiError 400 naming it and its
// value), and finished or streamed engine outputs are formatted as SGLang-native (/generate) and
// OpenAI (/v1/completions, /v1/chat/completions) JSON.
//
// Shapes follow SGLang's /generate (text | input_ids, sampling_params, stream, return_logprob,
// top_logprobs_num; meta_info with finish_reason {type, matched|length}) and OpenAI's completions and
// chat completions (choices, usage, logprobs, stream_options.include_usage, `chat.completion.chunk`).
// Tested by tests/server/test_server_protocol.cpp (unit) and tests/server/test_server_e2e.cpp (end to end).
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/chat_template.h"
#include "engine/constraint.h"
#include "engine/engine.h"
#include "server/reasoning.h"
#include "server/tool_calls.h"

namespace fp4moe::server {

// A typed HTTP error: {"error": {"message", "type", "code", "param", ...extra}}.
struct ApiError {
  int status = 400;
  std::string type = "invalid_request_error";
  std::string message;
  std::string param;         // the offending field ("" when none)
  nlohmann::json extra;      // further numbers (e.g. prompt_tokens, context_length), an object or null
  int retry_after_s = 0;     // > 0: sent as Retry-After (503)

  nlohmann::json to_json() const;
};

ApiError bad_request(const std::string& param, const std::string& message);

enum class Endpoint : uint8_t { kGenerate, kCompletions, kChat };

struct ParsedRequest {
  Endpoint endpoint = Endpoint::kGenerate;
  // Exactly one of: ids, text (to tokenize), messages (chat; rendered with the chat template), batch.
  std::optional<std::vector<engine::TokenId>> input_ids;
  std::optional<std::string> text;
  std::optional<nlohmann::ordered_json> messages;
  // SGLang's `rid`: the client's id for the reply (its id / meta_info.id, and what POST /abort_request
  // names), instead of the server's own ("7", "cmpl-7", "chatcmpl-7"; a rid of those forms is refused).
  std::optional<std::string> rid;
  nlohmann::ordered_json chat_template_kwargs = nlohmann::ordered_json::object();
  bool add_generation_prompt = true;
  // vLLM's continue_final_message: the rendered chat ends inside the last message (what follows its text, the turn's
  // end markers, is cut), so that the reply continues it (an assistant turn "prefilled" by the client).
  bool continue_final_message = false;
  // max_new_tokens as sent; nullopt -> the endpoint's default (applied once the prompt length is known).
  std::optional<int64_t> max_new_tokens;
  engine::SamplingParams sampling;
  bool stream = false;
  bool include_usage = false;  // OpenAI stream_options.include_usage
  // vLLM's stream_options.continuous_usage_stats (with include_usage): every chunk carries its choice's usage so far.
  bool continuous_usage = false;
  // The logprob asks: OpenAI's logprobs / top_logprobs, SGLang's return_logprob / top_logprobs_num and (/generate)
  // logprob_start_len: with return_logprob, meta_info.input_token_logprobs (and input_top_logprobs) from that prompt
  // position on; nullopt / -1: none.
  struct PromptLogprobs {
    bool return_logprob = false;
    int64_t top_logprobs = 0;
    std::optional<int64_t> logprob_start_len;
  };
  PromptLogprobs logprobs;
  // /v1/completions `echo`: each choice's text starts with its prompt and, with logprobs, its logprobs
  // start with the prompt tokens' (the first one null), as OpenAI / vLLM reply; lm-eval's
  // loglikelihood requests (echo, logprobs 1, max_tokens 1) read them. See apply_echo.
  bool echo = false;
  // /generate (SGLang): the logprob tuples' third element is the token's text instead of null.
  bool return_text_in_logprobs = false;
  // OpenAI `n` (SGLang's sampling_params.n on /generate): choices per request, each its own engine request (with a
  // seed, choice i samples with seed + i, so the choices differ and the request reproduces).
  int64_t n = 1;
  // /v1/completions with a list of prompts (2+ strings or 2+ id lists), /generate with a list of texts or of id lists
  // (1 or more): one entry each (text or ids), and then text / input_ids above are unset. Choice p n + j is prompt p's
  // choice j.
  struct BatchPrompt {
    std::optional<std::vector<engine::TokenId>> input_ids;
    std::optional<std::string> text;
  };
  std::vector<BatchPrompt> batch;
  // /generate as SGLang batches it: a list of texts / input_ids, or sampling_params.n > 1. The reply is a JSON list
  // with one object per choice (p n + j), each with its own meta_info.id and prompt_tokens; a stream's chunks are
  // those objects with "index" (the choice) added.
  bool batch_reply = false;
  // /generate's sampling_params as a list, one per prompt: each prompt's own. Empty: `sampling`, `max_new_tokens`,
  // `constraint` and `schema_pointer` serve every prompt. (n is the same in all: SGLang's rule.)
  struct PromptSampling {
    engine::SamplingParams sampling;
    std::optional<int64_t> max_new_tokens;
    std::optional<engine::ConstraintSpec> constraint;
    std::string schema_pointer;
  };
  std::vector<PromptSampling> per_prompt;
  // /generate's return_logprob / top_logprobs_num / logprob_start_len as lists (SGLang's, n = 1): each prompt's own
  // (a field sent as one value applies to every prompt); empty: `logprobs` serves all.
  std::vector<PromptLogprobs> per_prompt_logprobs;
  // /generate's rid as a list (one per prompt, n = 1): the choices' ids. A string rid names a batch's choices
  // "{rid}_{i}" (SGLang's names).
  std::vector<std::string> rid_list;
  std::string model;  // as sent (informational)
  // vLLM's / SGLang's request priority under priority scheduling (the order: EngineOptions::priority_low_first);
  // nullopt when the request names none (vLLM's 0; SGLang's last of all: EngineOptions::absent_priority_last).
  std::optional<int64_t> priority;
  // Chat: SGLang's `separate_reasoning` as sent (the server's --reasoning-parser applies unless false),
  // and the format the reply is split with (set by the server; null: the text is all content).
  std::optional<bool> separate_reasoning;
  const ReasoningFormat* reasoning = nullptr;
  ReasoningStart reasoning_start = ReasoningStart::kFormat;  // from the rendered prompt's end (set by the server)
  // Chat `tools` (OpenAI function definitions, rendered by the chat template) and `tool_choice` ("auto"
  // or "none"); the format the reply's calls are parsed with (set by the server's --tool-call-parser
  // when tools came and tool_choice is not "none"; null: no tool_calls).
  nlohmann::ordered_json tools;  // null: none
  // "required" and "function" (a named one, tool_choice_name) force calls: the server constrains the
  // reply to the call markup (tool_calls.h, forced_tool_call_regex).
  std::string tool_choice = "auto";
  std::string tool_choice_name;
  const ToolCallFormat* tool_calls = nullptr;
  // OpenAI's parallel_tool_calls (default true): false keeps one call a reply (a forced call is exactly one).
  bool parallel_tool_calls = true;
  // Structured outputs as asked (regex, json_schema, response_format, guided_*); the server compiles it
  // into sampling.constraint.
  std::optional<engine::ConstraintSpec> constraint;
  std::string schema_pointer;  // where an object schema sat in the body ("" otherwise), for restore_key_order
};
inline constexpr int64_t kMaxChoices = 64;        // the largest `n`
inline constexpr int kMaxBodyDepth = 64;          // JSON nesting of a request body
inline constexpr int64_t kMaxBatchChoices = 256;  // prompts x n of one completions request

// Parses a request body (already JSON) for an endpoint; throws ApiError (400) naming the field. On the OpenAI routes
// the sampling fields the body omits keep `defaults`' values (the server's --sampling-defaults; as vLLM, which
// applies the model's to chat and completions); /generate keeps SGLang's own defaults, as SGLang does.
ParsedRequest parse_request(Endpoint endpoint, const nlohmann::json& body, const engine::SamplingParams& defaults = {});
// parse_body's JSON keeps object keys sorted; where the order sent matters it is re-read from the raw
// body: `tools` (rendered into the prompt as sent, as HF's templates do) and an object JSON schema (its
// properties are written in their order). Call after parse_request on the same body.
void restore_key_order(ParsedRequest& r, const std::string& body);

// The field a batch's errors name: "prompt" (completions' list), "text" / "input_ids" (/generate's); "" without one.
std::string batch_param(const ParsedRequest& r);

// Parses the raw body text; malformed JSON or a non-object throws ApiError 400 with nlohmann's position.
nlohmann::json parse_body(const std::string& body);

// The max_new_tokens default per endpoint when the request names none: /generate 128 (SGLang),
// completions 16 (OpenAI), chat what the context has left; never more than the context has left.
int64_t default_max_new_tokens(Endpoint endpoint, int64_t prompt_tokens, int64_t context_length);

// Everything a request produced so far (accumulated from RequestOutput events).
struct Accumulated {
  std::vector<engine::GeneratedToken> tokens;
  std::string text;
  std::optional<engine::Finish> finish;
  std::vector<engine::GeneratedToken> prompt_logprobs;  // RequestOutput::prompt_logprobs, once they came
  void add(const engine::RequestOutput& out);
};

// `echo` on a choice's first event: its text starts with the prompt's text and, when the request
// asked for logprobs, its tokens with the prompt's entries (out.prompt_logprobs, the first one
// without a logprob, written null), so that the stream and the whole body both carry them in front.
// For a choice that asked for no tokens (max_new_tokens / max_tokens 0: SGLang's prefill-only /generate, vLLM's echo
// without generation, for scoring clients), which the engine runs as one token (its prefill gives the prompt
// logprobs): the event without what was generated (tokens, text), its finish a "length" with no completion tokens.
void drop_generated(engine::RequestOutput& event);
void apply_echo(const ParsedRequest& req, const std::string& prompt_text, engine::RequestOutput& first_event);

struct ResponseContext {
  std::string id;            // "cmpl-..." / "chatcmpl-..." / the SGLang rid (a /generate batch: its first choice's)
  std::string model;         // served model name
  int64_t created = 0;       // unix seconds
  int64_t prompt_tokens = 0;                     // a batch of prompts: their sum (each prompt counted once, whatever n)
  const engine::Tokenizer* tokenizer = nullptr;  // for logprob token strings
  std::vector<int64_t> choice_prompt_tokens;     // each choice's prompt length (a batch's prompts differ)
  std::vector<std::string> choice_ids;           // a /generate batch (ParsedRequest::batch_reply): each choice's id
  // --log-requests (server/request_log.h): the route and what its line shows of the body (no route: no line), and
  // when the request was admitted (an aborted request's latency).
  std::string log_route, log_body;
  std::chrono::steady_clock::time_point log_started;
};

// OpenAI finish_reason: "stop" | "length" | "abort" (SGLang reports aborts the same way).
std::string finish_reason_string(const engine::Finish& f);

// SGLang /generate: {"text", "output_ids", "meta_info": {...}} (cumulative when streaming).
nlohmann::json generate_response(const ParsedRequest& req, const ResponseContext& ctx, const Accumulated& acc);
// A /generate batch's choice `index` (its id and prompt_tokens from ctx.choice_ids / choice_prompt_tokens); with
// `streamed`, "index" is added (SGLang's batch stream). The whole reply is the list of every choice's object.
nlohmann::json generate_choice(const ParsedRequest& req, const ResponseContext& ctx, size_t index,
                               const Accumulated& acc, bool streamed);
nlohmann::json generate_batch_response(const ParsedRequest& req, const ResponseContext& ctx,
                                       std::span<const Accumulated> choices);

// OpenAI non-streaming bodies: one choice per Accumulated (index = its position), usage with the prompt
// counted once and the completion tokens of every choice.
nlohmann::json completion_response(const ParsedRequest& req, const ResponseContext& ctx,
                                   std::span<const Accumulated> choices);
nlohmann::json chat_response(const ParsedRequest& req, const ResponseContext& ctx,
                             std::span<const Accumulated> choices);
inline nlohmann::json completion_response(const ParsedRequest& req, const ResponseContext& ctx,
                                          const Accumulated& acc) {
  return completion_response(req, ctx, std::span<const Accumulated>(&acc, 1));
}
inline nlohmann::json chat_response(const ParsedRequest& req, const ResponseContext& ctx, const Accumulated& acc) {
  return chat_response(req, ctx, std::span<const Accumulated>(&acc, 1));
}
// The usage of a request's choices: ctx.prompt_tokens (each prompt once), the completion tokens of all.
engine::Usage choices_usage(const ResponseContext& ctx, std::span<const Accumulated> choices);
// One choice's usage so far (vLLM's continuous_usage_stats): its prompt's tokens and what it generated (an echoed
// prompt's logprob entries not counted).
engine::Usage choice_usage(const ParsedRequest& req, const ResponseContext& ctx, size_t index, const Accumulated& acc);

// Where completions logprobs' text_offset stands: characters of the text so far (code points, a stray UTF-8
// continuation byte counting as the U+FFFD it is shown as) and the continuation bytes the last character still
// expects (a token may end inside one).
struct TextOffset {
  size_t chars = 0;
  int pending = 0;
};

// OpenAI streaming chunks for one engine event of choice `index` (its new tokens and text;
// finish_reason on the choice's last). text_offset (a stream keeps one per choice): the logprobs' text_offset
// counts on from it, as in the whole reply, and it is advanced past this chunk's tokens.
nlohmann::json completion_chunk(const ParsedRequest& req, const ResponseContext& ctx, const engine::RequestOutput& out,
                                int64_t index = 0, TextOffset* text_offset = nullptr);
// One chat choice's parsers (--reasoning-parser, --tool-call-parser), kept across a stream's events;
// a whole reply is one take(text, true).
struct ChatChoiceStream {
  std::optional<ReasoningParser> reasoning;
  std::optional<ToolCallParser> tools;
  int64_t n_calls = 0;  // tool calls taken so far (the next one's index)
  // Calls kept: those of functions among the request's tools (SGLang's detectors drop others), at most one with
  // parallel_tool_calls false (vLLM keeps the first).
  std::vector<std::string> tool_names;
  bool parallel_tool_calls = true;
  static ChatChoiceStream for_request(const ParsedRequest& req);
  struct Pieces {
    std::string reasoning, content;  // without a parser: "" and the text
    std::vector<ToolCall> calls;
  };
  // The next piece of the choice's text through the reasoning parser, then the tool-call parser on
  // what is answer; `last`: the reply ends with it (held-back text released).
  Pieces take(std::string_view text, bool last);
};
// With a stream state (req.reasoning / req.tool_calls), the delta carries `reasoning_content`, `content`
// and complete `tool_calls` as the parsers release them, held-back text with the last event, whose
// finish_reason is "tool_calls" when the choice called a tool.
nlohmann::json chat_chunk(const ParsedRequest& req, const ResponseContext& ctx, const engine::RequestOutput& out,
                          bool first, int64_t index = 0, ChatChoiceStream* stream = nullptr);
// The final usage-only chunk (stream_options.include_usage): "choices": [] and "usage".
nlohmann::json usage_chunk(const ParsedRequest& req, const ResponseContext& ctx, const engine::Usage& usage);

nlohmann::json usage_json(const engine::Usage& u);

// A chat request's prompt text: its messages (as parse_request checked them) through the template, with its tools,
// chat_template_kwargs and add_generation_prompt. For a template that prints `content` instead of iterating its parts
// (engine::ChatTemplate::iterates_content) a message's list of text parts is one string, the parts' texts joined by
// "\n" (vLLM's "string" content format). Throws ApiError (param messages) when the template rejects them. The
// server and `fp4moe tokenize --chat` render with it.
std::string render_chat(const engine::ChatTemplate& tmpl, const ParsedRequest& req);

// JSON text that never throws on invalid UTF-8 (it is replaced by U+FFFD).
std::string dump_json(const nlohmann::json& j);

}  // namespace fp4moe::server
