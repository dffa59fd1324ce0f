// Request parsing and response formatting: see protocol.h.
#include "server/protocol.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <optional>
#include <sstream>
#include <string>
#include <utility>

#include "core/names.h"
#include "engine/tokenizer_text.h"
#include "format/json_file.h"

namespace fp4moe::server {
namespace {

using nlohmann::json;

std::string show(const json& v) {
  std::string s = v.dump(-1, ' ', false, json::error_handler_t::replace);
  if (s.size() > 80) s = s.substr(0, 77) + "...";
  return s;
}

// Typed access to optional fields of one JSON object; `prefix` names nested objects in errors
// ("sampling_params.temperature"). A null value counts as absent (OpenAI clients send nulls).
class Fields {
 public:
  // `pointer_base`: the object's JSON pointer in the body when its name is not one (an item of a list,
  // "sampling_params[1]." -> "/sampling_params/1").
  Fields(const json& obj, std::string prefix, std::string pointer_base = "")
      : obj_(obj), prefix_(std::move(prefix)), pointer_base_(std::move(pointer_base)) {}

  std::string name(const std::string& key) const { return prefix_ + key; }
  // The field as a JSON pointer into the body ("sampling_params.json_schema" -> "/sampling_params/json_schema").
  std::string pointer(const std::string& key) const {
    if (!pointer_base_.empty()) return pointer_base_ + "/" + key;
    std::string p = "/" + name(key);
    std::replace(p.begin(), p.end(), '.', '/');
    return p;
  }
  const json* find(const std::string& key) const {
    if (std::find(asked_.begin(), asked_.end(), key) == asked_.end()) asked_.push_back(key);
    auto it = obj_.find(key);
    if (it == obj_.end() || it->is_null()) return nullptr;
    return &*it;
  }
  // A number in [lo, hi], or in (lo, hi] when lo_open.
  std::optional<double> number(const std::string& key, double lo, double hi, bool lo_open = false) const {
    const json* v = find(key);
    if (!v) return std::nullopt;
    if (!v->is_number()) throw bad_request(name(key), name(key) + " must be a number, got " + show(*v));
    const double d = v->get<double>();
    if (!std::isfinite(d) || d < lo || (lo_open && d == lo) || d > hi) {
      std::ostringstream m;
      m << name(key) << " = " << show(*v) << " is outside " << (lo_open ? "(" : "[") << lo << ", " << hi << "]";
      throw bad_request(name(key), m.str());
    }
    return d;
  }
  std::optional<int64_t> integer(const std::string& key, int64_t lo, int64_t hi) const {
    const json* v = find(key);
    if (!v) return std::nullopt;
    if (!v->is_number_integer() && !(v->is_number_float() && std::floor(v->get<double>()) == v->get<double>()))
      throw bad_request(name(key), name(key) + " must be an integer, got " + show(*v));
    // Compared as integers (as doubles, 2^63 equalled INT64_MAX and wrapped negative): an unsigned past INT64_MAX or a
    // float outside [-2^63, 2^63) is out of every range.
    std::optional<int64_t> x;
    if (v->is_number_unsigned()) {
      if (v->get<uint64_t>() <= static_cast<uint64_t>(INT64_MAX)) x = static_cast<int64_t>(v->get<uint64_t>());
    } else if (v->is_number_integer()) {
      x = v->get<int64_t>();
    } else if (const double d = v->get<double>(); d > -0x1p63 && d < 0x1p63) {  // (a double at -2^63 may be below it)
      x = static_cast<int64_t>(d);
    }
    if (!x || *x < lo || *x > hi) {
      std::ostringstream m;
      m << name(key) << " = " << show(*v) << " is outside [" << lo << ", " << hi << "]";
      throw bad_request(name(key), m.str());
    }
    return x;
  }
  std::optional<bool> boolean(const std::string& key) const {
    const json* v = find(key);
    if (!v) return std::nullopt;
    if (!v->is_boolean()) throw bad_request(name(key), name(key) + " must be true or false, got " + show(*v));
    return v->get<bool>();
  }
  std::optional<std::string> string(const std::string& key) const {
    const json* v = find(key);
    if (!v) return std::nullopt;
    if (!v->is_string()) throw bad_request(name(key), name(key) + " must be a string, got " + show(*v));
    return v->get<std::string>();
  }
  std::vector<engine::TokenId> ids(const json& v, const std::string& field) const {
    if (!v.is_array()) throw bad_request(field, field + " must be an array of token ids, got " + show(v));
    std::vector<engine::TokenId> out;
    for (size_t i = 0; i < v.size(); ++i) {
      const json& e = v[i];
      if (!e.is_number_integer() || e.get<int64_t>() < 0 || e.get<int64_t>() > INT32_MAX) {
        throw bad_request(field, field + "[" + std::to_string(i) + "] = " + show(e) +
                                     " is not a token id (a non-negative integer)");
      }
      out.push_back(static_cast<engine::TokenId>(e.get<int64_t>()));
    }
    return out;
  }
  std::vector<std::string> strings_or_string(const std::string& key) const {
    const json* v = find(key);
    if (!v) return {};
    if (v->is_string()) {
      if (v->get<std::string>().empty()) throw bad_request(name(key), name(key) + " is an empty stop string");
      return {v->get<std::string>()};
    }
    if (!v->is_array()) throw bad_request(name(key), name(key) + " must be a string or a list of strings, got " + show(*v));
    std::vector<std::string> out;
    for (size_t i = 0; i < v->size(); ++i) {
      if (!(*v)[i].is_string())
        throw bad_request(name(key), name(key) + "[" + std::to_string(i) + "] = " + show((*v)[i]) + " is not a string");
      if ((*v)[i].get<std::string>().empty())
        throw bad_request(name(key), name(key) + "[" + std::to_string(i) + "] is an empty stop string");
      out.push_back((*v)[i].get<std::string>());
    }
    return out;
  }

  // OpenAI / SGLang logit_bias: {"<token id>": bias, ...}, bias in [-100, 100].
  std::vector<std::pair<engine::TokenId, float>> logit_bias(const std::string& key) const {
    const json* v = find(key);
    if (!v) return {};
    if (!v->is_object())
      throw bad_request(name(key), name(key) + " must be an object of token id -> bias, got " + show(*v));
    std::vector<std::pair<engine::TokenId, float>> out;
    for (const auto& [k, b] : v->items()) {
      const std::string at = name(key) + "[\"" + k + "\"]";
      char* end = nullptr;
      const long long id = std::strtoll(k.c_str(), &end, 10);
      if (k.empty() || *end != '\0' || id < 0 || id > INT32_MAX)
        throw bad_request(name(key), at + ": the key is not a token id (a non-negative integer)");
      if (!b.is_number() || !std::isfinite(b.get<double>()) || b.get<double>() < -engine::kMaxAbsLogitBias ||
          b.get<double>() > engine::kMaxAbsLogitBias) {
        std::ostringstream m;
        m << at << " = " << show(b) << " is not a bias in [" << -engine::kMaxAbsLogitBias << ", "
          << engine::kMaxAbsLogitBias << "]";
        throw bad_request(name(key), m.str());
      }
      out.emplace_back(static_cast<engine::TokenId>(id), b.get<float>());
    }
    return out;
  }

  // The keys read so far (present or not), in the order first read: what a parser of this object takes.
  const std::vector<std::string>& asked() const { return asked_; }
  const json& obj() const { return obj_; }

 private:
  const json& obj_;
  mutable std::vector<std::string> asked_;
  std::string prefix_;
  std::string pointer_base_;
};

constexpr int64_t kMaxTokensLimit = int64_t{1} << 30;
using engine::kMaxTopLogprobs;
constexpr size_t kMaxRidBytes = 256;

void parse_constraint(const Fields& f, ParsedRequest* r, bool openai);

// The sampling fields SGLang's sampling_params and OpenAI's bodies share (OpenAI names the token
// budget max_tokens / max_completion_tokens; SGLang max_new_tokens).
void parse_sampling(const Fields& f, ParsedRequest* r, bool openai) {
  engine::SamplingParams& s = r->sampling;
  // No tokens (0): the prompt's logprobs alone, on /generate (SGLang's prefill-only request) and /v1/completions with
  // echo (vLLM's; checked once echo is read). OpenAI's chat asks for at least one.
  if (openai) {
    auto mt = f.integer("max_completion_tokens", 1, kMaxTokensLimit);
    if (!mt) mt = f.integer("max_tokens", r->endpoint == Endpoint::kCompletions ? 0 : 1, kMaxTokensLimit);
    r->max_new_tokens = mt;
  } else {
    r->max_new_tokens = f.integer("max_new_tokens", 0, kMaxTokensLimit);
  }
  if (auto v = f.number("temperature", 0.0, engine::kMaxTemperature)) s.temperature = *v;
  if (auto v = f.number("top_p", 0.0, 1.0, /*lo_open=*/true)) s.top_p = *v;
  if (auto v = f.integer("top_k", -1, INT32_MAX)) s.top_k = *v;
  if (auto v = f.number("min_p", 0.0, 1.0)) s.min_p = *v;
  if (auto v = f.number("repetition_penalty", 0.0, engine::kMaxRepetitionPenalty, /*lo_open=*/true))
    s.repetition_penalty = *v;  // SGLang's
  if (auto v = f.number("frequency_penalty", -engine::kMaxAbsPenalty, engine::kMaxAbsPenalty)) s.frequency_penalty = *v;
  if (auto v = f.number("presence_penalty", -engine::kMaxAbsPenalty, engine::kMaxAbsPenalty)) s.presence_penalty = *v;
  // Any int64, as vLLM takes it (a negative one is its two's complement: distinct seeds stay distinct).
  std::optional<int64_t> seed = f.integer("seed", INT64_MIN, INT64_MAX);
  if (!seed) seed = f.integer("sampling_seed", INT64_MIN, INT64_MAX);  // SGLang's name
  if (seed) s.seed = static_cast<uint64_t>(*seed);
  s.stop = f.strings_or_string("stop");
  if (const json* v = f.find("stop_token_ids")) s.stop_token_ids = f.ids(*v, f.name("stop_token_ids"));
  if (auto v = f.boolean("ignore_eos")) s.ignore_eos = *v;
  if (auto v = f.boolean(openai ? "include_stop_str_in_output" : "no_stop_trim")) s.include_stop_str = *v;
  if (auto v = f.integer(openai ? "min_tokens" : "min_new_tokens", 0, kMaxTokensLimit)) s.min_new_tokens = *v;
  if (auto v = f.boolean("skip_special_tokens")) s.skip_special_tokens = *v;
  s.logit_bias = f.logit_bias("logit_bias");
  if (auto n = f.integer("n", 1, kMaxChoices)) r->n = *n;
  if (!openai) {
    if (auto v = f.integer("stream_interval", 1, INT32_MAX)) s.stream_interval = *v;
  }
  parse_constraint(f, r, openai);
}

// /generate's sampling_params are SGLang's SamplingParams, which takes no other keyword: after parse_sampling has read
// the object, a key it did not ask for (a misspelt "temprature" would otherwise sample at the default) is a 400 naming
// it and the closest key it did ask for. SGLang's keys this server does not implement are refused by name unless
// null; spaces_between_special_tokens is taken and has no effect (as in HF's fast tokenizers, which tokenizer.json
// models use).
void check_sampling_keys(const Fields& f) {
  if (const json* v = f.find("spaces_between_special_tokens"); v != nullptr && !v->is_boolean())
    throw bad_request(f.name("spaces_between_special_tokens"),
                      f.name("spaces_between_special_tokens") + " must be true or false, got " + show(*v));
  static const std::vector<std::string> kNotImplemented = {"stop_regex", "structural_tag", "custom_params"};
  // The OpenAI names of SGLang's fields, and fields /generate takes beside sampling_params.
  static const std::vector<std::pair<std::string, std::string>> kElsewhere = {
      {"max_tokens", "sampling_params.max_new_tokens"},
      {"max_completion_tokens", "sampling_params.max_new_tokens"},
      {"min_tokens", "sampling_params.min_new_tokens"},
      {"include_stop_str_in_output", "sampling_params.no_stop_trim"},
      {"logprobs", "return_logprob, beside sampling_params"},
      {"return_logprob", "return_logprob, beside sampling_params"},
      {"top_logprobs", "top_logprobs_num, beside sampling_params"},
      {"top_logprobs_num", "top_logprobs_num, beside sampling_params"},
      {"stream", "stream, beside sampling_params"}};
  const std::vector<std::string>& known = f.asked();
  for (const auto& [key, value] : f.obj().items()) {
    if (std::find(known.begin(), known.end(), key) != known.end()) continue;
    if (std::find(kNotImplemented.begin(), kNotImplemented.end(), key) != kNotImplemented.end()) {
      if (value.is_null()) continue;
      throw bad_request(f.name(key), f.name(key) + " is not supported by this server, got " + show(value));
    }
    for (const auto& [other, ours] : kElsewhere) {
      if (key == other)
        throw bad_request(f.name(key), f.name(key) + " is not a sampling parameter (/generate takes " + ours + ")");
    }
    std::string m = f.name(key) + " is not a sampling parameter";
    if (const auto best = closest_name(key, known)) m += " (did you mean " + f.name(*best) + "?)";
    throw bad_request(f.name(key), m);
  }
}

// Structured outputs (engine/constraint.h): SGLang's regex / json_schema / ebnf (in sampling_params on
// /generate, at the top of OpenAI bodies), vLLM's guided_json / guided_regex / guided_choice /
// guided_grammar and OpenAI's response_format. At most one may be given.
void parse_constraint(const Fields& f, ParsedRequest* r, bool openai) {
  std::vector<engine::ConstraintSpec> given;
  auto add = [&](engine::ConstraintSpec::Kind kind, const std::string& key, std::string text) {
    engine::ConstraintSpec c;
    c.kind = kind;
    c.param = f.name(key);
    c.text = std::move(text);
    given.push_back(std::move(c));
  };
  // An object schema's text is re-read from the body in the order sent (restore_key_order): the order
  // of its properties is the order a reply writes them.
  auto schema_text = [&](const std::string& key, const json& v, const std::string& pointer) {
    if (v.is_string()) return v.get<std::string>();  // SGLang sends the schema as a JSON string
    if (v.is_object()) r->schema_pointer = pointer;
    if (v.is_object() || v.is_boolean()) return v.dump();
    throw bad_request(f.name(key), f.name(key) + " must be a JSON schema (an object or its JSON text), got " + show(v));
  };
  for (const char* key : {"ebnf", "guided_grammar"}) {
    if (f.find(key))
      throw bad_request(f.name(key), f.name(key) +
                                         ": grammars (EBNF / GBNF) are not supported; use regex, json_schema or "
                                         "response_format");
  }
  for (const char* key : {"regex", "guided_regex"}) {
    if (auto v = f.string(key)) add(engine::ConstraintSpec::Kind::kRegex, key, *v);
  }
  for (const char* key : {"json_schema", "guided_json"}) {
    if (const json* v = f.find(key))
      add(engine::ConstraintSpec::Kind::kJsonSchema, key, schema_text(key, *v, f.pointer(key)));
  }
  if (const json* v = f.find("guided_choice")) {
    if (!v->is_array() || v->empty())
      throw bad_request(f.name("guided_choice"),
                        f.name("guided_choice") + " must be a non-empty list of strings, got " + show(*v));
    engine::ConstraintSpec c;
    c.kind = engine::ConstraintSpec::Kind::kChoice;
    c.param = f.name("guided_choice");
    for (size_t i = 0; i < v->size(); ++i) {
      if (!(*v)[i].is_string() || (*v)[i].get<std::string>().empty())
        throw bad_request(c.param,
                          c.param + "[" + std::to_string(i) + "] = " + show((*v)[i]) + " is not a non-empty string");
      c.choices.push_back((*v)[i].get<std::string>());
    }
    given.push_back(std::move(c));
  }
  if (const json* rf = openai ? f.find("response_format") : nullptr) {
    const std::string p = f.name("response_format");
    const json* type = rf->is_object() && rf->contains("type") ? &(*rf)["type"] : nullptr;
    const std::string t = type != nullptr && type->is_string() ? type->get<std::string>() : std::string();
    if (t == "json_object") {
      add(engine::ConstraintSpec::Kind::kJsonObject, "response_format", "");
    } else if (t == "json_schema") {
      const json* js = rf->contains("json_schema") ? &(*rf)["json_schema"] : nullptr;
      if (js == nullptr || !js->is_object() || !js->contains("schema"))
        throw bad_request(
            p,
            p + " of type json_schema needs {\"json_schema\": {\"name\": ..., \"schema\": {...}}}, got " + show(*rf));
      add(engine::ConstraintSpec::Kind::kJsonSchema, "response_format",
          schema_text("response_format", (*js)["schema"], f.pointer("response_format") + "/json_schema/schema"));
    } else if (t != "text") {
      throw bad_request(
          p, p + " " + show(*rf) + " is not supported; {\"type\": \"text\" | \"json_object\" | \"json_schema\"}");
    }
  }
  if (given.size() > 1)
    throw bad_request(given[1].param,
                      "give one structured-output constraint, got " + given[0].param + " and " + given[1].param);
  if (!given.empty()) r->constraint = std::move(given[0]);
}

void parse_stream(const Fields& f, ParsedRequest* r) {
  if (auto v = f.boolean("stream")) r->stream = *v;
  if (const json* so = f.find("stream_options"); so != nullptr && !so->is_null()) {
    if (!so->is_object()) throw bad_request("stream_options", "stream_options must be an object, got " + show(*so));
    if (!r->stream)  // as the OpenAI API and vLLM: the options of a stream that is not one are a client mistake
      throw bad_request("stream_options",
                        "stream_options is only allowed with stream = true, got stream = " +
                            std::string(f.find("stream") != nullptr ? show(*f.find("stream")) : "absent (false)"));
    const Fields options(*so, "stream_options.");
    if (auto v = options.boolean("include_usage")) r->include_usage = *v;
    if (auto v = options.boolean("continuous_usage_stats")) r->continuous_usage = *v && r->include_usage;
  }
}

}  // namespace

json ApiError::to_json() const {
  json e = {{"message", message}, {"type", type}, {"code", status}};
  e["param"] = param.empty() ? json(nullptr) : json(param);
  if (extra.is_object()) {
    for (auto it = extra.begin(); it != extra.end(); ++it) e[it.key()] = it.value();
  }
  return json{{"error", e}};
}

ApiError bad_request(const std::string& param, const std::string& message) {
  ApiError e;
  e.status = 400;
  e.type = "invalid_request_error";
  e.param = param;
  e.message = message;
  return e;
}

json parse_body(const std::string& body) {
  // Depth-bounded: what reads a body later (dump, schemas, templates) recurses per level.
  format::JsonParseFailure failure;
  std::optional<json> parsed = format::try_parse_json(body, kMaxBodyDepth, &failure);
  if (!parsed) {
    throw bad_request("body", "the JSON body (" + std::to_string(body.size()) + " bytes): " + failure.message);
  }
  json j = std::move(*parsed);
  if (!j.is_object()) throw bad_request("body", "the body must be a JSON object, got " + show(j));
  return j;
}

namespace {

// OpenAI content parts of a text-only model: {"type": "text", "text": string}. A media part (the served
// model has no encoder for it) or an unknown type is a 400 naming the part and its type.
void check_content_parts(const json& parts, const std::string& at) {
  for (size_t j = 0; j < parts.size(); ++j) {
    const json& part = parts[j];
    const std::string where = at + "[" + std::to_string(j) + "]";
    if (!part.is_object()) throw bad_request(where, where + " must be an object {\"type\", ...}, got " + show(part));
    const auto type = part.find("type");
    if (type == part.end() || !type->is_string())
      throw bad_request(where + ".type", where + ".type must be a string, got " +
                                             (type == part.end() ? std::string("nothing") : show(*type)));
    const std::string t = type->get<std::string>();
    if (t == "text") {
      const auto text = part.find("text");
      if (text == part.end() || !text->is_string())
        throw bad_request(where + ".text", where + ".text must be a string, got " +
                                               (text == part.end() ? std::string("nothing") : show(*text)));
    } else if (t == "image_url" || t == "input_image" || t == "image" || t == "input_audio" || t == "audio" ||
               t == "video_url" || t == "video" || t == "file") {
      throw bad_request(where + ".type", where + ".type = " + show(*type) +
                                             ": the served model takes text only (content parts of type \"text\")");
    } else {
      throw bad_request(where + ".type", where + ".type = " + show(*type) + " is not a content part type (\"text\")");
    }
  }
}

void flatten_text_parts(nlohmann::ordered_json* messages) {
  if (!messages->is_array()) return;
  for (auto& msg : *messages) {
    if (!msg.is_object() || !msg.contains("content") || !msg["content"].is_array()) continue;
    std::string text;
    bool first = true;
    for (const auto& part : msg["content"]) {
      if (!part.is_object() || part.value("type", std::string()) != "text" || !part.contains("text") ||
          !part["text"].is_string())
        continue;  // parse_request refused these
      if (!first) text += '\n';
      text += part["text"].get<std::string>();
      first = false;
    }
    msg["content"] = std::move(text);
  }
}

}  // namespace

namespace {

// continue_final_message (vLLM's, as transformers' apply_chat_template cuts it): the rendered chat up to the end of
// the last message's text, found as its last occurrence (whitespace around the text as the template kept it).
std::string cut_after_final_message(const std::string& rendered, const nlohmann::ordered_json& messages) {
  std::string text;
  bool found_text = false;
  if (!messages.empty()) {
    const auto& content = messages.back().contains("content") ? messages.back()["content"] : nlohmann::ordered_json();
    if (content.is_string()) {
      text = content.get<std::string>();
      found_text = true;
    } else if (content.is_array()) {
      for (auto it = content.rbegin(); it != content.rend() && !found_text; ++it) {
        if (it->is_object() && it->contains("text") && (*it)["text"].is_string()) {
          text = (*it)["text"].get<std::string>();
          found_text = true;
        }
      }
    }
  }
  if (!found_text)
    throw bad_request("continue_final_message",
                      "continue_final_message: the last message has no text to continue (a string content or a text "
                      "part)");
  // Python's str.strip: Unicode whitespace (U+3000, NBSP, U+001F, ...), as the templates' own strip() removes it.
  const auto trim = [](const std::string& s, bool left, bool right) {
    size_t b = s.size(), e = 0;  // the first non-space code point's start, the last one's end
    for (size_t i = 0; i < s.size();) {
      const size_t at = i;
      const char32_t cp = engine::text::next_code_point(s, i);
      if (engine::text::is_python_space(cp)) continue;
      b = std::min(b, at);
      e = i;
    }
    if (b >= e) return std::string();  // all whitespace
    return s.substr(left ? b : 0, (right ? e : s.size()) - (left ? b : 0));
  };
  const std::string stripped = trim(text, true, true);
  if (stripped.empty())
    throw bad_request("continue_final_message",
                      "continue_final_message: the last message's text is empty, nothing to continue (to start a new "
                      "turn: add_generation_prompt)");
  const size_t at = rendered.rfind(stripped);
  if (at == std::string::npos)
    throw bad_request("continue_final_message",
                      "continue_final_message: the last message's text does not appear in the chat as the template "
                      "renders it, so it cannot be continued");
  // Through its trailing whitespace when the template kept the text as sent; else up to its stripped end.
  const size_t kept = trim(text, true, false).size();
  if (rendered.substr(at, kept) == text) return rendered.substr(0, at + kept);
  return rendered.substr(0, at + stripped.size());
}

}  // namespace

std::string render_chat(const engine::ChatTemplate& tmpl, const ParsedRequest& req) {
  FP4MOE_CHECK(req.messages.has_value()) << "render_chat: not a chat request";
  try {
    engine::ChatTemplate::RenderOptions ro;
    ro.add_generation_prompt = req.add_generation_prompt && !req.continue_final_message;
    ro.extra = req.chat_template_kwargs;
    if (!req.tools.is_null()) ro.tools = req.tools;
    // continue_final_message looks for the last message's text as the template got it: a list of text parts joined
    // for a template that prints content (its last part, as transformers takes it, for one that iterates the parts).
    if (tmpl.iterates_content()) {
      const std::string rendered = tmpl.render(*req.messages, ro);
      return req.continue_final_message ? cut_after_final_message(rendered, *req.messages) : rendered;
    }
    nlohmann::ordered_json messages = *req.messages;
    flatten_text_parts(&messages);
    const std::string rendered = tmpl.render(messages, ro);
    return req.continue_final_message ? cut_after_final_message(rendered, messages) : rendered;
  } catch (const ApiError&) {
    throw;
  } catch (const fp4moe::Error& e) {
    throw bad_request("messages", std::string("the chat template rejected the messages: ") + e.what());
  }
}

ParsedRequest parse_request(Endpoint endpoint, const json& body, const engine::SamplingParams& defaults) {
  ParsedRequest r;
  r.endpoint = endpoint;
  if (endpoint != Endpoint::kGenerate) r.sampling = defaults;  // SGLang's /generate takes none
  Fields top(body, "");
  if (auto m = top.string("model")) r.model = *m;
  switch (endpoint) {
    case Endpoint::kGenerate: {
      const json* text = top.find("text");
      const json* ids = top.find("input_ids");
      if ((text != nullptr) == (ids != nullptr))
        throw bad_request("text", "give exactly one of \"text\" and \"input_ids\"");
      // SGLang's batch: a list of texts, or a list of id lists (one or more: the reply is a list either way).
      if (text && text->is_array()) {
        if (text->empty()) throw bad_request("text", "text is an empty list: give a string or a list of strings");
        for (size_t i = 0; i < text->size(); ++i) {
          const json& e = (*text)[i];
          if (!e.is_string())
            throw bad_request("text", "text[" + std::to_string(i) + "] = " + show(e) +
                                          " is not a string (a batch of texts is a list of strings)");
          r.batch.push_back({std::nullopt, e.get<std::string>()});
        }
        r.batch_reply = true;
      } else if (text) {
        if (!text->is_string())
          throw bad_request("text", "text must be a string or a list of strings, got " + show(*text));
        r.text = text->get<std::string>();
      } else if (ids->is_array() && !ids->empty() && (*ids)[0].is_array()) {
        for (size_t i = 0; i < ids->size(); ++i)
          r.batch.push_back({top.ids((*ids)[i], "input_ids[" + std::to_string(i) + "]"), std::nullopt});
        r.batch_reply = true;
      } else {
        r.input_ids = top.ids(*ids, "input_ids");
      }
      if (const json* sp = top.find("sampling_params")) {
        if (sp->is_object()) {
          const Fields f(*sp, "sampling_params.");
          parse_sampling(f, &r, false);
          check_sampling_keys(f);
        } else if (sp->is_array()) {
          // One object per prompt, each parsed on its own (SGLang: the same n in all).
          const size_t n_prompts = r.batch.empty() ? 1 : r.batch.size();
          if (sp->size() != n_prompts)
            throw bad_request("sampling_params", "sampling_params is a list of " + std::to_string(sp->size()) +
                                                     " objects; the request has " + std::to_string(n_prompts) +
                                                     " prompt(s), and the list gives one per prompt");
          for (size_t i = 0; i < sp->size(); ++i) {
            const std::string at = "sampling_params[" + std::to_string(i) + "]";
            if (!(*sp)[i].is_object()) throw bad_request(at, at + " must be an object, got " + show((*sp)[i]));
            ParsedRequest one;
            one.endpoint = endpoint;
            const Fields f((*sp)[i], at + ".", "/sampling_params/" + std::to_string(i));
            parse_sampling(f, &one, false);
            check_sampling_keys(f);
            if (i > 0 && one.n != r.n)
              throw bad_request(at + ".n", at + ".n = " + std::to_string(one.n) +
                                               " differs from sampling_params[0].n = " + std::to_string(r.n) +
                                               " (n is one for the whole request)");
            r.n = one.n;
            r.per_prompt.push_back({std::move(one.sampling), one.max_new_tokens, std::move(one.constraint),
                                    std::move(one.schema_pointer)});
          }
        } else {
          throw bad_request("sampling_params",
                            "sampling_params must be an object, or a list of objects (one per "
                            "prompt), got " +
                                show(*sp));
        }
      }
      if (r.n > 1) r.batch_reply = true;  // SGLang: n samples of one prompt are a batch too
      if (auto v = top.boolean("stream")) r.stream = *v;
      // The logprob fields: one value, or (SGLang's) a list of one per prompt of a batch without parallel samples.
      const auto listed = [&](const char* key) {
        const json* v = top.find(key);
        return v != nullptr && v->is_array();
      };
      const bool lists = listed("return_logprob") || listed("top_logprobs_num") || listed("logprob_start_len");
      auto read_logprobs = [&](const Fields& f, ParsedRequest::PromptLogprobs* out) {
        if (auto v = f.boolean("return_logprob")) out->return_logprob = *v;
        if (auto v = f.integer("top_logprobs_num", 0, kMaxTopLogprobs)) out->top_logprobs = *v;
        if (auto v = f.integer("logprob_start_len", -1, std::numeric_limits<int32_t>::max()); v && *v >= 0)
          out->logprob_start_len = *v;
      };
      if (!lists) {
        read_logprobs(top, &r.logprobs);
      } else {
        if (r.batch.empty() || r.n > 1)
          throw bad_request("return_logprob",
                            "return_logprob / top_logprobs_num / logprob_start_len as lists give each prompt of a "
                            "batch its own (n = 1); this request has " +
                                (r.batch.empty() ? std::string("one prompt") : "n = " + std::to_string(r.n)));
        for (size_t p = 0; p < r.batch.size(); ++p) {
          // Prompt p's values: its entry of each list, the single value of a field sent as one.
          json view = json::object();
          for (const char* key : {"return_logprob", "top_logprobs_num", "logprob_start_len"}) {
            const json* v = top.find(key);
            if (v == nullptr) continue;
            if (v->is_array() && v->size() != r.batch.size())
              throw bad_request(key, std::string(key) + " is a list of " + std::to_string(v->size()) +
                                         "; the batch has " + std::to_string(r.batch.size()) + " prompts");
            view[key] = v->is_array() ? (*v)[p] : *v;
          }
          ParsedRequest::PromptLogprobs one;
          read_logprobs(Fields(view, ""), &one);
          r.per_prompt_logprobs.push_back(one);
        }
      }
      if (auto v = top.boolean("return_text_in_logprobs")) r.return_text_in_logprobs = *v;
      break;
    }
    case Endpoint::kCompletions: {
      const json* p = top.find("prompt");
      if (!p) throw bad_request("prompt", "prompt is required (a string or a list of token ids)");
      if (p->is_string()) {
        r.text = p->get<std::string>();
      } else if (p->is_array() && p->size() == 1 && (*p)[0].is_string()) {
        r.text = (*p)[0].get<std::string>();
      } else if (p->is_array() && p->size() == 1 && (*p)[0].is_array()) {
        r.input_ids = top.ids((*p)[0], "prompt[0]");
      } else if (p->is_array() && p->size() >= 2 && ((*p)[0].is_string() || (*p)[0].is_array())) {
        for (size_t i = 0; i < p->size(); ++i) {  // a batch: all strings or all id lists
          const json& e = (*p)[i];
          const std::string at = "prompt[" + std::to_string(i) + "]";
          ParsedRequest::BatchPrompt bp;
          if (e.is_string() && (*p)[0].is_string()) {
            bp.text = e.get<std::string>();
          } else if (e.is_array() && (*p)[0].is_array()) {
            bp.input_ids = top.ids(e, at);
          } else {
            throw bad_request("prompt",
                              at + " = " + show(e) + ": a batch of prompts is all strings or all token id lists");
          }
          r.batch.push_back(std::move(bp));
        }
      } else if (p->is_array() && !p->empty() && (*p)[0].is_number_integer()) {
        r.input_ids = top.ids(*p, "prompt");
      } else {
        throw bad_request("prompt", "prompt must be a string, a one-string list or a list of token ids, got " + show(*p));
      }
      parse_sampling(top, &r, true);
      parse_stream(top, &r);
      if (auto v = top.integer("logprobs", 0, kMaxTopLogprobs)) {
        r.logprobs.return_logprob = true;
        r.logprobs.top_logprobs = *v;
      }
      if (auto v = top.boolean("echo")) r.echo = *v;
      if (r.max_new_tokens == 0) {
        if (!r.echo)
          throw bad_request("max_tokens",
                            "max_tokens = 0 generates nothing: it is for echo: true (the prompt and its "
                            "logprobs alone); otherwise give max_tokens in [1, " +
                                std::to_string(kMaxTokensLimit) + "]");
        if (r.sampling.min_new_tokens > 0)
          throw bad_request("min_tokens", "min_tokens = " + std::to_string(r.sampling.min_new_tokens) +
                                              " > max_tokens = 0 (echo without generation)");
      }
      if (auto v = top.string("suffix"); v && !v->empty())
        throw bad_request("suffix", "suffix (insertion) is not supported, got " + show(json(*v)));
      break;
    }
    case Endpoint::kChat: {
      const json* m = top.find("messages");
      if (!m || !m->is_array() || m->empty())
        throw bad_request("messages", "messages must be a non-empty list, got " + (m ? show(*m) : std::string("nothing")));
      for (size_t i = 0; i < m->size(); ++i) {
        const json& msg = (*m)[i];
        const std::string at = "messages[" + std::to_string(i) + "]";
        if (!msg.is_object()) throw bad_request(at, at + " must be an object, got " + show(msg));
        auto role = msg.find("role");
        if (role == msg.end() || !role->is_string()) throw bad_request(at + ".role", at + ".role must be a string");
        const std::string who = role->get<std::string>();
        static const char* const kRoles[] = {"system", "developer", "user",       "assistant",
                                             "tool",   "function",  "observation"};
        if (std::find(std::begin(kRoles), std::end(kRoles), who) == std::end(kRoles))
          throw bad_request(at + ".role", at + ".role = " + show(*role) +
                                              " is not a role (system, developer, user, assistant, tool, function, "
                                              "observation)");
        auto content = msg.find("content");
        // content may be null (or absent) on an assistant turn (its tool_calls) and on a legacy function message.
        if (who != "assistant" && who != "function" && (content == msg.end() || content->is_null()))
          throw bad_request(at + ".content", at + ".content is required for a " + who + " message");
        if (auto calls = msg.find("tool_calls"); calls != msg.end() && !calls->is_null()) {
          if (!calls->is_array())
            throw bad_request(at + ".tool_calls", at + ".tool_calls must be a list, got " + show(*calls));
          for (size_t k = 0; k < calls->size(); ++k) {
            if (!(*calls)[k].is_object())
              throw bad_request(at + ".tool_calls", at + ".tool_calls[" + std::to_string(k) +
                                                        "] must be an object, got " + show((*calls)[k]));
          }
        }
        if (content != msg.end() && !content->is_string() && !content->is_null() && !content->is_array())
          throw bad_request(at + ".content", at + ".content must be a string or a list of parts, got " + show(*content));
        if (content != msg.end() && content->is_array()) check_content_parts(*content, at + ".content");
      }
      // Re-parse with key order kept: the template's tojson prints keys as the client sent them.
      r.messages = nlohmann::ordered_json::parse(m->dump());
      // An assistant turn's tool_calls carry `arguments` as JSON text (OpenAI); the GLM templates iterate
      // them as a mapping (arguments.items()), so an object's text becomes the object, as vLLM does.
      for (size_t i = 0; i < r.messages->size(); ++i) {
        auto& msg = (*r.messages)[i];
        if (!msg.is_object() || !msg.contains("tool_calls") || !msg["tool_calls"].is_array()) continue;
        for (size_t k = 0; k < msg["tool_calls"].size(); ++k) {
          auto& tc = msg["tool_calls"][k];
          if (!tc.is_object() || !tc.contains("function") || !tc["function"].is_object()) continue;
          auto& args = tc["function"]["arguments"];
          if (!args.is_string()) continue;
          // Depth-bounded so that the body, the object in place, still nests at most kMaxBodyDepth levels: the
          // template walks it (a deep one overflowed its stack). Text that is not JSON stays text, as vLLM keeps it.
          constexpr int kArgumentsDepth = 6;  // body > messages > [i] > tool_calls > [k] > function > arguments
          format::JsonParseFailure failure;
          auto parsed = format::try_parse_json<nlohmann::ordered_json>(args.get<std::string>(),
                                                                       kMaxBodyDepth - kArgumentsDepth, &failure);
          if (!parsed && failure.too_deep) {
            throw bad_request(
                "messages[" + std::to_string(i) + "].tool_calls[" + std::to_string(k) + "].function.arguments",
                failure.message);
          }
          if (parsed && parsed->is_object()) args = std::move(*parsed);
        }
      }
      parse_sampling(top, &r, true);
      parse_stream(top, &r);
      if (auto v = top.boolean("logprobs")) r.logprobs.return_logprob = *v;
      if (auto v = top.integer("top_logprobs", 0, kMaxTopLogprobs)) {
        if (!r.logprobs.return_logprob && *v > 0)
          throw bad_request("top_logprobs", "top_logprobs needs logprobs = true");
        r.logprobs.top_logprobs = *v;
      }
      if (auto v = top.boolean("add_generation_prompt")) r.add_generation_prompt = *v;
      if (auto v = top.boolean("continue_final_message")) r.continue_final_message = *v;
      if (r.continue_final_message && r.add_generation_prompt)
        throw bad_request("continue_final_message",
                          "continue_final_message and add_generation_prompt cannot both be true (add_generation_prompt "
                          "defaults to true: send add_generation_prompt: false), as vLLM refuses them");
      if (auto v = top.boolean("separate_reasoning")) r.separate_reasoning = *v;
      if (auto v = top.boolean("parallel_tool_calls")) r.parallel_tool_calls = *v;
      if (const json* kw = top.find("chat_template_kwargs")) {
        if (!kw->is_object())
          throw bad_request("chat_template_kwargs", "chat_template_kwargs must be an object, got " + show(*kw));
        r.chat_template_kwargs = nlohmann::ordered_json::parse(kw->dump());
      }
      break;
    }
  }
  if (auto v = top.integer("priority", std::numeric_limits<int32_t>::min(), std::numeric_limits<int32_t>::max()))
    r.priority = *v;
  auto check_rid = [](const std::string& v, const std::string& field) {
    if (v.empty() || v.size() > kMaxRidBytes)
      throw bad_request(
          "rid", field + " must be 1 to " + std::to_string(kMaxRidBytes) + " bytes, got " + std::to_string(v.size()));
    const size_t digits = v.find_first_of("0123456789");
    const std::string head = v.substr(0, digits);
    if (digits != std::string::npos && (head.empty() || head == "cmpl-" || head == "chatcmpl-") &&
        v.find_first_not_of("0123456789", digits) == std::string::npos)
      throw bad_request("rid", field + " = " + show(json(v)) +
                                   " has the form of the server's own ids (N, cmpl-N, chatcmpl-N); choose another");
  };
  if (const json* rids = endpoint == Endpoint::kGenerate ? top.find("rid") : nullptr; rids && rids->is_array()) {
    // SGLang: one rid per prompt of a batch (with n samples, prompt p's sample j is rid[p]_j in the server).
    if (r.batch.empty() || rids->size() != r.batch.size())
      throw bad_request(
          "rid", "rid as a list names each prompt of a batch (a list of texts or id lists): this request has " +
                     (r.batch.empty() ? std::string("one prompt") : std::to_string(r.batch.size()) + " prompts") +
                     ", the list " + std::to_string(rids->size()) + " rids");
    for (size_t i = 0; i < rids->size(); ++i) {
      const std::string at = "rid[" + std::to_string(i) + "]";
      if (!(*rids)[i].is_string()) throw bad_request("rid", at + " must be a string, got " + show((*rids)[i]));
      check_rid((*rids)[i].get<std::string>(), at);
      for (size_t k = 0; k < i; ++k) {
        if ((*rids)[k] == (*rids)[i])
          throw bad_request("rid", at + " = " + show((*rids)[i]) + " is rid[" + std::to_string(k) + "] too");
      }
      r.rid_list.push_back((*rids)[i].get<std::string>());
    }
  } else if (auto v = top.string("rid")) {
    check_rid(*v, "rid");
    r.rid = *v;
  }
  if (!r.batch.empty() && static_cast<int64_t>(r.batch.size()) * r.n > kMaxBatchChoices) {
    throw bad_request(batch_param(r), std::to_string(r.batch.size()) + " prompts x n = " + std::to_string(r.n) + " = " +
                                          std::to_string(static_cast<int64_t>(r.batch.size()) * r.n) + " choices > " +
                                          std::to_string(kMaxBatchChoices) + " a request");
  }
  if (endpoint != Endpoint::kGenerate) {
    // OpenAI fields this server cannot honour are refused by name, not ignored (a request relying on
    // them would otherwise get a quietly different result). Unknown fields are ignored, as vLLM does.
    if (const json* tools = top.find("tools"); tools != nullptr && !tools->is_null()) {
      if (!tools->is_array()) throw bad_request("tools", "tools must be a list of functions, got " + show(*tools));
      for (size_t i = 0; i < tools->size(); ++i) {
        const json& t = (*tools)[i];
        const bool ok = t.is_object() && t.contains("type") && t["type"] == "function" && t.contains("function") &&
                        t["function"].is_object() && t["function"].contains("name") &&
                        t["function"]["name"].is_string();
        if (!ok)
          throw bad_request("tools", "tools[" + std::to_string(i) +
                                         "] must be {\"type\": \"function\", \"function\": {\"name\": ...}}, got " +
                                         show(t));
        // OpenAI's rule for function names; other names could not be read back from the call markup.
        const std::string name = t["function"]["name"].get<std::string>();
        const bool name_ok = !name.empty() && name.size() <= 64 && std::all_of(name.begin(), name.end(), [](char c) {
          return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.';
        });
        if (!name_ok)
          throw bad_request("tools", "tools[" + std::to_string(i) + "].function.name \"" + name +
                                         "\" is not 1-64 letters, digits, '_', '-' or '.'");
        for (size_t k = 0; k < i; ++k) {
          if ((*tools)[k]["function"]["name"] == name)
            throw bad_request("tools", "tools[" + std::to_string(i) + "].function.name \"" + name + "\" is tools[" +
                                           std::to_string(k) + "]'s too; a call could not tell them apart");
        }
        // OpenAI: parameters is a JSON schema of an object (absent: no arguments described).
        if (const auto ps = t["function"].find("parameters"); ps != t["function"].end() && !ps->is_null()) {
          const bool object_schema = ps->is_object() && (!ps->contains("type") || (*ps)["type"] == "object") &&
                                     (!ps->contains("properties") || (*ps)["properties"].is_object()) &&
                                     (!ps->contains("required") || (*ps)["required"].is_array());
          if (!object_schema)
            throw bad_request("tools", "tools[" + std::to_string(i) +
                                           "].function.parameters must be the JSON schema of an object ({\"type\": "
                                           "\"object\", \"properties\": {...}, \"required\": [...]}), got " +
                                           show(*ps));
        }
      }
      if (!tools->empty()) r.tools = nlohmann::ordered_json::parse(tools->dump());  // key order: restore_key_order
    }
    if (const json* tc = top.find("tool_choice"); tc != nullptr && !tc->is_null()) {
      // "auto", "none", "required", or {"type": "function", "function": {"name": ...}} naming one of the tools.
      const bool named = tc->is_object() && tc->contains("type") && (*tc)["type"] == "function" &&
                         tc->contains("function") && (*tc)["function"].is_object() &&
                         (*tc)["function"].contains("name") && (*tc)["function"]["name"].is_string();
      const std::string choice = tc->is_string() ? tc->get<std::string>() : named ? "function" : std::string();
      if (choice != "auto" && choice != "none" && choice != "required" && !named)
        throw bad_request("tool_choice", "tool_choice " + show(*tc) +
                                             " is not one of \"auto\", \"none\", \"required\", "
                                             "{\"type\": \"function\", \"function\": {\"name\": ...}}");
      if ((choice == "required" || named) && r.tools.is_null())
        throw bad_request("tool_choice", "tool_choice " + show(*tc) + " needs tools");
      if (named) {
        r.tool_choice_name = (*tc)["function"]["name"].get<std::string>();
        bool found = false;
        for (const auto& t : r.tools) found = found || t["function"]["name"] == r.tool_choice_name;
        if (!found)
          throw bad_request("tool_choice", "tool_choice names \"" + r.tool_choice_name + "\", not one of the tools");
      }
      r.tool_choice = choice;
    }
    if (auto b = top.integer("best_of", 1, kMaxChoices); b && *b != r.n)
      throw bad_request("best_of", "best_of = " + std::to_string(*b) +
                                       " is not supported (only best_of = n = " + std::to_string(r.n) + ")");
  }
  auto set_logprobs = [&r](engine::SamplingParams& s, const ParsedRequest::PromptLogprobs& ask) {
    s.logprobs = ask.return_logprob;
    s.top_logprobs = ask.return_logprob ? ask.top_logprobs : 0;
    if (ask.return_logprob && (r.echo || ask.logprob_start_len)) s.prompt_logprobs = ask.top_logprobs;
  };
  set_logprobs(r.sampling, r.logprobs);
  if (!r.per_prompt_logprobs.empty() && r.per_prompt.empty()) {
    // Each prompt's own logprob asks need each its own sampling: the shared one, copied.
    for (size_t p = 0; p < r.batch.size(); ++p)
      r.per_prompt.push_back({r.sampling, r.max_new_tokens, r.constraint, r.schema_pointer});
  }
  for (size_t p = 0; p < r.per_prompt.size(); ++p)
    set_logprobs(r.per_prompt[p].sampling, r.per_prompt_logprobs.empty() ? r.logprobs : r.per_prompt_logprobs[p]);
  return r;
}

std::string batch_param(const ParsedRequest& r) {
  if (r.batch.empty()) return "";
  return r.endpoint != Endpoint::kGenerate ? "prompt" : r.batch.front().text ? "text" : "input_ids";
}

void restore_key_order(ParsedRequest& r, const std::string& body) {
  const bool per_prompt_schema =
      std::any_of(r.per_prompt.begin(), r.per_prompt.end(),
                  [](const ParsedRequest::PromptSampling& p) { return !p.schema_pointer.empty(); });
  if (r.tools.is_null() && r.schema_pointer.empty() && !per_prompt_schema) return;
  const auto ordered = nlohmann::ordered_json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (!ordered.is_object()) return;  // parse_body accepted it: cannot happen
  if (!r.tools.is_null() && ordered.contains("tools")) r.tools = ordered["tools"];
  auto restore = [&](const std::string& pointer, std::optional<engine::ConstraintSpec>& constraint) {
    if (pointer.empty() || !constraint) return;
    const nlohmann::ordered_json::json_pointer ptr(pointer);
    if (ordered.contains(ptr)) constraint->text = ordered[ptr].dump();
  };
  restore(r.schema_pointer, r.constraint);
  for (ParsedRequest::PromptSampling& p : r.per_prompt) restore(p.schema_pointer, p.constraint);
}

int64_t default_max_new_tokens(Endpoint endpoint, int64_t prompt_tokens, int64_t context_length) {
  const int64_t left = std::max<int64_t>(context_length - prompt_tokens, 0);
  switch (endpoint) {
    case Endpoint::kGenerate: return std::min<int64_t>(128, left);
    case Endpoint::kCompletions: return std::min<int64_t>(16, left);
    case Endpoint::kChat: return left;
  }
  return left;
}

void Accumulated::add(const engine::RequestOutput& out) {
  if (!out.prompt_logprobs.empty()) prompt_logprobs = out.prompt_logprobs;
  tokens.insert(tokens.end(), out.tokens.begin(), out.tokens.end());
  text += out.text;
  if (out.finished) finish = out.finished;
}

void drop_generated(engine::RequestOutput& event) {
  event.tokens.clear();
  event.text.clear();
  if (event.finished && event.finished->reason != engine::FinishReason::kError &&
      event.finished->reason != engine::FinishReason::kAbort) {
    event.finished->reason = engine::FinishReason::kLength;
    event.finished->matched_stop_str.reset();
    event.finished->matched_stop_token.reset();
    event.finished->usage.completion_tokens = 0;
  }
}

void apply_echo(const ParsedRequest& req, const std::string& prompt_text, engine::RequestOutput& first_event) {
  if (!req.echo) return;
  first_event.text = prompt_text + first_event.text;
  if (req.logprobs.return_logprob) {
    first_event.tokens.insert(first_event.tokens.begin(), first_event.prompt_logprobs.begin(),
                              first_event.prompt_logprobs.end());
  }
}

std::string finish_reason_string(const engine::Finish& f) { return engine::to_string(f.reason); }

json usage_json(const engine::Usage& u) {
  return {{"prompt_tokens", u.prompt_tokens},
          {"completion_tokens", u.completion_tokens},
          {"total_tokens", u.prompt_tokens + u.completion_tokens},
          {"prompt_tokens_details", {{"cached_tokens", u.cached_tokens}}}};
}

std::string dump_json(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

namespace {

bool valid_utf8(const std::string& s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    const size_t n = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 0;
    if (n == 0 || i + n > s.size()) return false;
    for (size_t k = 1; k < n; ++k) {
      if ((static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) return false;
    }
    i += n;
  }
  return true;
}

std::string token_bytes(const ResponseContext& ctx, engine::TokenId id) {
  if (!ctx.tokenizer || id < 0 || id >= ctx.tokenizer->vocab_size()) return "";
  try {
    return ctx.tokenizer->token_bytes(id);
  } catch (const std::exception&) {
    return "";  // an id inside the model's vocabulary that the tokenizer does not name
  }
}

// A token's text for logprobs. A token that is not whole UTF-8 (part of a multi-byte character) is
// written "bytes:\xNN..." as vLLM does, so distinct tokens never collapse into one U+FFFD key.
std::string token_text(const ResponseContext& ctx, engine::TokenId id) {
  const std::string b = token_bytes(ctx, id);
  if (valid_utf8(b)) return b;
  std::string out = "bytes:";
  static constexpr char kHex[] = "0123456789abcdef";
  for (unsigned char c : b) {
    out += "\\x";
    out += kHex[c >> 4];
    out += kHex[c & 15];
  }
  return out;
}

json bytes_of(const std::string& s) {
  json b = json::array();
  for (unsigned char c : s) b.push_back(static_cast<int>(c));
  return b;
}

json finish_json(const engine::Finish& f) {
  json j = {{"type", finish_reason_string(f)}};
  if (f.matched_stop_str) j["matched"] = *f.matched_stop_str;
  else if (f.matched_stop_token) j["matched"] = *f.matched_stop_token;
  if (f.reason == engine::FinishReason::kLength) j["length"] = f.usage.completion_tokens;
  if (f.reason == engine::FinishReason::kError) j["message"] = f.error;
  return j;
}

// OpenAI completions logprobs: {tokens, token_logprobs, top_logprobs: [{token: lp}], text_offset}. As the OpenAI API
// and vLLM, a position's top_logprobs always hold the token taken there (up to logprobs + 1 entries). text_offset
// counts characters of the text (TextOffset; a token that starts inside a character counts from the character after
// it; a generated special token the text skips, skip_special_tokens, counts none); text_offset: where the first of
// `tokens` starts (a stream's earlier chunks); *end: after the last. The first n_echoed tokens are the echoed
// prompt's, whose text is the prompt as sent.
json completion_logprobs(const ParsedRequest& req, const ResponseContext& ctx,
                         const std::vector<engine::GeneratedToken>& tokens, size_t n_echoed, TextOffset text_offset,
                         TextOffset* end = nullptr) {
  json tok = json::array(), lps = json::array(), tops = json::array(), offs = json::array();
  TextOffset off = text_offset;
  for (size_t i = 0; i < tokens.size(); ++i) {
    const engine::GeneratedToken& t = tokens[i];
    tok.push_back(token_text(ctx, t.id));
    const bool none = std::isnan(t.logprob);  // an echoed prompt's first token: nothing precedes it
    lps.push_back(none ? json(nullptr) : json(t.logprob));
    json top = json::object();
    for (const auto& e : t.top_logprobs) top[token_text(ctx, e.id)] = e.logprob;
    if (!none) top.emplace(token_text(ctx, t.id), t.logprob);  // no-op when it is among them
    tops.push_back(none ? json(nullptr) : top);
    offs.push_back(off.chars);
    const bool skipped = i >= n_echoed && req.sampling.skip_special_tokens && ctx.tokenizer != nullptr && t.id >= 0 &&
                         t.id < ctx.tokenizer->vocab_size() && ctx.tokenizer->is_special(t.id);
    if (skipped) continue;
    for (const char ch : token_bytes(ctx, t.id)) {
      const auto c = static_cast<unsigned char>(ch);
      if ((c & 0xC0) == 0x80 && off.pending > 0) {  // inside a character
        --off.pending;
        continue;
      }
      ++off.chars;  // a lead byte, or a stray continuation byte (one U+FFFD)
      off.pending = c >= 0xF8 ? 0 : c >= 0xF0 ? 3 : c >= 0xE0 ? 2 : c >= 0xC0 ? 1 : 0;  // (0xF8-0xFF: no lead)
    }
  }
  if (end != nullptr) *end = off;
  return {{"tokens", tok}, {"token_logprobs", lps}, {"top_logprobs", tops}, {"text_offset", offs}};
}

// OpenAI chat logprobs: {"content": [{token, logprob, bytes, top_logprobs: [{token, logprob, bytes}]}]}.
json chat_logprobs(const ResponseContext& ctx, const std::vector<engine::GeneratedToken>& tokens) {
  json content = json::array();
  for (const auto& t : tokens) {
    json top = json::array();
    for (const auto& e : t.top_logprobs) {
      top.push_back({{"token", token_text(ctx, e.id)}, {"logprob", e.logprob}, {"bytes", bytes_of(token_bytes(ctx, e.id))}});
    }
    content.push_back({{"token", token_text(ctx, t.id)},
                       {"logprob", t.logprob},
                       {"bytes", bytes_of(token_bytes(ctx, t.id))},
                       {"top_logprobs", top}});
  }
  return {{"content", content}};
}

}  // namespace

namespace {

// SGLang's /generate object of one choice, its logprobs as `ask` says.
json generate_object(const ParsedRequest::PromptLogprobs& ask, bool return_text_in_logprobs, const ResponseContext& ctx,
                     const Accumulated& acc) {
  json ids = json::array();
  for (const auto& t : acc.tokens) ids.push_back(t.id);
  json meta = {{"id", ctx.id},
               {"prompt_tokens", ctx.prompt_tokens},
               {"completion_tokens", static_cast<int64_t>(acc.tokens.size())},
               {"cached_tokens", acc.finish ? acc.finish->usage.cached_tokens : 0}};
  meta["finish_reason"] = acc.finish ? finish_json(*acc.finish) : json(nullptr);
  if (acc.finish) {
    meta["e2e_latency"] = acc.finish->timings.e2e_s;
    // No first token (aborted or failed before it): null, not 0 (the TTFT histogram leaves such requests out too).
    meta["ttft"] = acc.finish->timings.token_times_s.empty() ? json(nullptr) : json(acc.finish->timings.ttft_s);
    meta["queue_time"] = acc.finish->timings.queue_s;
  }
  if (ask.return_logprob) {
    // SGLang: [[logprob, token_id, token_text_or_null], ...]; top: one list per position.
    const auto text_of = [&](engine::TokenId id) {
      return return_text_in_logprobs ? json(token_text(ctx, id)) : json(nullptr);
    };
    json lp = json::array(), top = json::array();
    for (const auto& t : acc.tokens) {
      lp.push_back(json::array({t.logprob, t.id, text_of(t.id)}));
      json row = json::array();
      for (const auto& e : t.top_logprobs) row.push_back(json::array({e.logprob, e.id, text_of(e.id)}));
      top.push_back(row);
    }
    meta["output_token_logprobs"] = lp;
    if (ask.top_logprobs > 0) meta["output_top_logprobs"] = top;
    if (ask.logprob_start_len) {
      // SGLang: the prompt's entries from logprob_start_len on, the first prompt token's logprob null.
      json in_lp = json::array(), in_top = json::array();
      for (size_t i = static_cast<size_t>(*ask.logprob_start_len); i < acc.prompt_logprobs.size(); ++i) {
        const engine::GeneratedToken& t = acc.prompt_logprobs[i];
        const bool none = std::isnan(t.logprob);
        in_lp.push_back(json::array({none ? json(nullptr) : json(t.logprob), t.id, text_of(t.id)}));
        json row = json::array();
        for (const auto& e : t.top_logprobs) row.push_back(json::array({e.logprob, e.id, text_of(e.id)}));
        in_top.push_back(none ? json(nullptr) : row);
      }
      meta["input_token_logprobs"] = in_lp;
      if (ask.top_logprobs > 0) meta["input_top_logprobs"] = in_top;
    }
  }
  return {{"text", acc.text}, {"output_ids", ids}, {"meta_info", meta}};
}

}  // namespace

json generate_response(const ParsedRequest& req, const ResponseContext& ctx, const Accumulated& acc) {
  return generate_object(req.logprobs, req.return_text_in_logprobs, ctx, acc);
}

json generate_choice(const ParsedRequest& req, const ResponseContext& ctx, size_t index, const Accumulated& acc,
                     bool streamed) {
  FP4MOE_CHECK(index < ctx.choice_ids.size() && index < ctx.choice_prompt_tokens.size())
      << "generate_choice: choice " << index << " of " << ctx.choice_ids.size();
  ResponseContext one;  // without the per-choice lists (copied per streamed event)
  one.id = ctx.choice_ids[index];
  one.model = ctx.model;
  one.created = ctx.created;
  one.prompt_tokens = ctx.choice_prompt_tokens[index];
  one.tokenizer = ctx.tokenizer;
  // A batch with per-prompt logprob asks has n = 1: choice i is prompt i.
  json j = req.per_prompt_logprobs.empty()
               ? generate_response(req, one, acc)
               : generate_object(req.per_prompt_logprobs.at(index), req.return_text_in_logprobs, one, acc);
  if (streamed) j["index"] = index;
  return j;
}

json generate_batch_response(const ParsedRequest& req, const ResponseContext& ctx,
                             std::span<const Accumulated> choices) {
  json out = json::array();
  for (size_t i = 0; i < choices.size(); ++i) out.push_back(generate_choice(req, ctx, i, choices[i], false));
  return out;
}

namespace {

// The fields every OpenAI body and chunk carries around its choices.
json openai_envelope(const ResponseContext& ctx, const char* object, json choices) {
  return {{"id", ctx.id},
          {"object", object},
          {"created", ctx.created},
          {"model", ctx.model},
          {"choices", std::move(choices)}};
}

}  // namespace

engine::Usage choices_usage(const ResponseContext& ctx, std::span<const Accumulated> choices) {
  engine::Usage u{ctx.prompt_tokens, 0};
  for (const Accumulated& acc : choices) {
    u.completion_tokens += acc.finish ? acc.finish->usage.completion_tokens : static_cast<int64_t>(acc.tokens.size());
    // The prompt is counted once: its tokens from the prefix cache are the most any choice had.
    if (acc.finish) u.cached_tokens = std::max(u.cached_tokens, acc.finish->usage.cached_tokens);
  }
  return u;
}

engine::Usage choice_usage(const ParsedRequest& req, const ResponseContext& ctx, size_t index, const Accumulated& acc) {
  engine::Usage u{index < ctx.choice_prompt_tokens.size() ? ctx.choice_prompt_tokens[index] : ctx.prompt_tokens, 0};
  if (acc.finish) {
    u.completion_tokens = acc.finish->usage.completion_tokens;
    u.cached_tokens = acc.finish->usage.cached_tokens;
  } else {
    const size_t echoed = req.echo && req.logprobs.return_logprob ? acc.prompt_logprobs.size() : 0;
    u.completion_tokens = static_cast<int64_t>(acc.tokens.size() - std::min(echoed, acc.tokens.size()));
  }
  return u;
}

json completion_response(const ParsedRequest& req, const ResponseContext& ctx, std::span<const Accumulated> choices) {
  json out = json::array();
  for (size_t i = 0; i < choices.size(); ++i) {
    const Accumulated& acc = choices[i];
    json choice = {{"index", i}, {"text", acc.text}};
    choice["logprobs"] =
        req.logprobs.return_logprob
            ? completion_logprobs(req, ctx, acc.tokens, req.echo ? acc.prompt_logprobs.size() : 0, TextOffset{})
            : json(nullptr);
    choice["finish_reason"] = acc.finish ? json(finish_reason_string(*acc.finish)) : json(nullptr);
    out.push_back(std::move(choice));
  }
  json body = openai_envelope(ctx, "text_completion", std::move(out));
  body["usage"] = usage_json(choices_usage(ctx, choices));
  return body;
}

// OpenAI: "tool_calls" when the model stopped after calling tools (tool_choice "auto" or "required"); a call of the
// function the request named ends "stop" (the OpenAI API's rule, vLLM's whole replies).
std::string chat_finish_reason(const ParsedRequest& req, const engine::Finish& f, bool called_tools) {
  return called_tools && req.tool_choice != "function" && f.reason == engine::FinishReason::kStop
             ? "tool_calls"
             : finish_reason_string(f);
}

json tool_call_json(const ResponseContext& ctx, size_t choice, size_t k, const ToolCall& c) {
  return {{"id", "call_" + std::to_string(choice) + "_" + std::to_string(k) + "_" + ctx.id},
          {"type", "function"},
          {"function", {{"name", c.name}, {"arguments", c.arguments}}}};
}

json chat_response(const ParsedRequest& req, const ResponseContext& ctx, std::span<const Accumulated> choices) {
  json out = json::array();
  for (size_t i = 0; i < choices.size(); ++i) {
    const Accumulated& acc = choices[i];
    ChatChoiceStream::Pieces p = ChatChoiceStream::for_request(req).take(acc.text, /*last=*/true);
    const bool called = !p.calls.empty();
    json choice = {
        {"index", i},
        {"message",
         {{"role", "assistant"}, {"content", called && p.content.empty() ? json(nullptr) : json(p.content)}}}};
    if (req.reasoning != nullptr) {  // --reasoning-parser: the thinking apart from the answer
      choice["message"]["reasoning_content"] = p.reasoning.empty() ? json(nullptr) : json(p.reasoning);
    }
    if (req.tool_calls != nullptr) {  // --tool-call-parser: the answer's calls as tool_calls
      json calls = json::array();
      for (size_t k = 0; k < p.calls.size(); ++k) calls.push_back(tool_call_json(ctx, i, k, p.calls[k]));
      choice["message"]["tool_calls"] = std::move(calls);
    }
    choice["logprobs"] = req.logprobs.return_logprob ? chat_logprobs(ctx, acc.tokens) : json(nullptr);
    choice["finish_reason"] = acc.finish ? json(chat_finish_reason(req, *acc.finish, called)) : json(nullptr);
    out.push_back(std::move(choice));
  }
  json body = openai_envelope(ctx, "chat.completion", std::move(out));
  body["usage"] = usage_json(choices_usage(ctx, choices));
  return body;
}

json completion_chunk(const ParsedRequest& req, const ResponseContext& ctx, const engine::RequestOutput& out,
                      int64_t index, TextOffset* text_offset) {
  json choice = {{"index", index}, {"text", out.text}};
  const TextOffset start = text_offset != nullptr ? *text_offset : TextOffset{};
  choice["logprobs"] =
      req.logprobs.return_logprob
          ? completion_logprobs(req, ctx, out.tokens, req.echo ? out.prompt_logprobs.size() : 0, start, text_offset)
          : json(nullptr);
  choice["finish_reason"] = out.finished ? json(finish_reason_string(*out.finished)) : json(nullptr);
  return openai_envelope(ctx, "text_completion", json::array({choice}));
}

ChatChoiceStream ChatChoiceStream::for_request(const ParsedRequest& req) {
  ChatChoiceStream s;
  if (req.reasoning != nullptr) s.reasoning.emplace(*req.reasoning, req.reasoning_start);
  if (req.tool_calls != nullptr) {
    s.tools.emplace(*req.tool_calls, req.tools);
    for (const auto& t : req.tools) s.tool_names.push_back(t["function"]["name"].get<std::string>());
    s.parallel_tool_calls = req.parallel_tool_calls;
  }
  return s;
}

ChatChoiceStream::Pieces ChatChoiceStream::take(std::string_view text, bool last) {
  Pieces p;
  p.content = std::string(text);
  if (reasoning) {
    ReasoningSplit split = reasoning->take(text, last);
    p.reasoning = std::move(split.reasoning);
    p.content = std::move(split.content);
  }
  if (tools) {
    ToolCallSplit split = tools->take(p.content, last);
    p.content = std::move(split.content);
    for (ToolCall& call : split.calls) {
      if (std::find(tool_names.begin(), tool_names.end(), call.name) == tool_names.end()) continue;
      if (!parallel_tool_calls && n_calls > 0) continue;
      p.calls.push_back(std::move(call));
      ++n_calls;
    }
  }
  return p;
}

json chat_chunk(const ParsedRequest& req, const ResponseContext& ctx, const engine::RequestOutput& out, bool first,
                int64_t index, ChatChoiceStream* stream) {
  json delta = json::object();
  if (first) delta["role"] = "assistant";
  ChatChoiceStream::Pieces p;
  if (stream != nullptr) {
    const int64_t before = stream->n_calls;
    p = stream->take(out.text, out.finished.has_value());
    if (!p.reasoning.empty()) delta["reasoning_content"] = std::move(p.reasoning);
    json calls = json::array();
    for (size_t k = 0; k < p.calls.size(); ++k) {
      const int64_t call_index = before + static_cast<int64_t>(k);
      json call = tool_call_json(ctx, static_cast<size_t>(index), static_cast<size_t>(call_index), p.calls[k]);
      call["index"] = call_index;
      calls.push_back(std::move(call));
    }
    if (!calls.empty()) delta["tool_calls"] = std::move(calls);
  } else {
    p.content = out.text;
  }
  if (!p.content.empty() || first) delta["content"] = std::move(p.content);
  json choice = {{"index", index}, {"delta", delta}};
  choice["logprobs"] =
      req.logprobs.return_logprob && !out.tokens.empty() ? chat_logprobs(ctx, out.tokens) : json(nullptr);
  const bool called = stream != nullptr && stream->n_calls > 0;
  choice["finish_reason"] = out.finished ? json(chat_finish_reason(req, *out.finished, called)) : json(nullptr);
  return openai_envelope(ctx, "chat.completion.chunk", json::array({choice}));
}

json usage_chunk(const ParsedRequest& req, const ResponseContext& ctx, const engine::Usage& usage) {
  json chunk = openai_envelope(ctx, req.endpoint == Endpoint::kChat ? "chat.completion.chunk" : "text_completion",
                               json::array());
  chunk["usage"] = usage_json(usage);
  return chunk;
}

}  // namespace fp4moe::server
