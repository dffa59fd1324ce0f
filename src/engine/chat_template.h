// A model's chat template: the Jinja `chat_template` of tokenizer_config.json (or chat_template.jinja),
// parsed once at start-up (an unsupported construct fails there with name:line:column) and rendered per
// chat request the way HF's apply_chat_template does: messages, add_generation_prompt, tools (None when
// absent) and the special tokens of tokenizer_config.json (bos_token, eos_token, ...).
//
//   auto tmpl = fp4moe::engine::ChatTemplate::load(model_dir);
//   std::string prompt = tmpl.render(messages, {.add_generation_prompt = true});
//
// Messages should be parsed as nlohmann::ordered_json so that `tojson` keeps their key order.
// Tested by tests/engine/test_chat_template.cpp against shared/golden/tokenizer/encode_cases.json.
#pragma once

#include <filesystem>
#include <memory>
#include <string>
#include <utility>

#include <nlohmann/json.hpp>

namespace fp4moe::engine {

namespace jinja {
struct Program;
}

class ChatTemplate {
 public:
  struct RenderOptions {
    bool add_generation_prompt = true;
    nlohmann::ordered_json tools;  // null: no tools (rendered as None)
    // Further template variables (e.g. {"enable_thinking": false}); they override nothing above.
    nlohmann::ordered_json extra = nlohmann::ordered_json::object();
  };

  // DIR/chat_template.jinja when present, else tokenizer_config.json's chat_template.
  static ChatTemplate load(const std::filesystem::path& dir);
  // From a parsed tokenizer_config.json; `chat_template` may be a string or a list of
  // {"name", "template"} (the one named "default" is used).
  static ChatTemplate from_config(const nlohmann::json& config, const std::string& origin = "tokenizer_config.json");
  // The template text from_config takes from `config`, and its name for errors ("origin:chat_template[1]").
  static std::pair<std::string, std::string> config_source(const nlohmann::json& config, const std::string& origin);
  // A template given apart from the model (serve / tokenize --chat-template): `source` as the template, the special
  // tokens of `config` (a parsed tokenizer_config.json, or null) visible to it.
  static ChatTemplate from_source(const std::string& source, const nlohmann::json& config, const std::string& origin);
  // `special_tokens`: names -> strings made visible to the template (bos_token, eos_token, ...).
  ChatTemplate(const std::string& source, nlohmann::ordered_json special_tokens, const std::string& name = "chat_template");

  std::string render(const nlohmann::ordered_json& messages, const RenderOptions& options) const;
  std::string render(const nlohmann::ordered_json& messages) const { return render(messages, RenderOptions{}); }
  const std::string& source() const;
  // Whether the template loops over a message's content (`for x in m.content`, `m['content']`, or a
  // variable or macro parameter named content): it takes OpenAI's list of content parts. Else it prints
  // content as a string, and a list of text parts is joined before rendering (vLLM's content format
  // detection, "openai" vs "string").
  bool iterates_content() const { return iterates_content_; }

 private:
  std::shared_ptr<const jinja::Program> program_;
  nlohmann::ordered_json special_tokens_;
  bool iterates_content_ = false;
};

}  // namespace fp4moe::engine
