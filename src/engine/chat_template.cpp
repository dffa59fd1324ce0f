// Chat template loading and rendering (see chat_template.h). Tested by tests/engine/test_chat_template.cpp.
#include "engine/chat_template.h"

#include <fstream>
#include <set>
#include <sstream>

#include "core/error.h"
#include "core/file.h"
#include "engine/jinja_ast.h"
#include "format/json_file.h"

namespace fp4moe::engine {

namespace {

// HF's special_tokens_map: the named special tokens of tokenizer_config.json, as strings.
nlohmann::ordered_json special_tokens_of(const nlohmann::json& config) {
  nlohmann::ordered_json out = nlohmann::ordered_json::object();
  if (!config.is_object()) return out;
  for (const char* key : {"bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token"}) {
    if (!config.contains(key)) continue;
    const auto& v = config.at(key);
    if (v.is_string()) out[key] = v.get<std::string>();
    else if (v.is_object() && v.contains("content") && v.at("content").is_string()) out[key] = v.at("content").get<std::string>();
  }
  return out;
}

// `content`, `x.content`, `x['content']`, one of `aliases` (names set from such an expression), or a
// filter or test of one (`m.content | selectattr(...)`).
bool names_content(const jinja::Expr& e, const std::set<std::string>& aliases) {
  using K = jinja::Expr::Kind;
  if (e.kind == K::kName) return e.name == "content" || aliases.count(e.name) > 0;
  if (e.kind == K::kAttr) return e.name == "content";
  if (e.kind == K::kFilter || e.kind == K::kTest)
    return !e.args.empty() && e.args[0] && names_content(*e.args[0], aliases);
  return e.kind == K::kSubscript && e.args.size() == 2 && e.args[1] && e.args[1]->kind == K::kLiteral &&
         e.args[1]->literal == "content";
}

// Visits every statement of `body` (branches, loop bodies, macros, blocks).
template <class F>
void for_each_stmt(const jinja::Body& body, const F& f) {
  for (const jinja::Stmt& st : body) {
    f(st);
    for (const auto& branch : st.branches) for_each_stmt(branch.second, f);
    for_each_stmt(st.body, f);
    for_each_stmt(st.else_body, f);
  }
}

// Whether a for loop anywhere iterates a message's content (vLLM's "openai" content format).
bool loops_over_content(const jinja::Body& body) {
  std::set<std::string> aliases;  // {% set c = m['content'] %}
  for_each_stmt(body, [&](const jinja::Stmt& st) {
    if (st.kind == jinja::Stmt::Kind::kSet && st.targets.size() == 1 && st.expr && names_content(*st.expr, {}))
      aliases.insert(st.targets[0]);
  });
  bool found = false;
  for_each_stmt(body, [&](const jinja::Stmt& st) {
    found = found || (st.kind == jinja::Stmt::Kind::kFor && st.expr && names_content(*st.expr, aliases));
  });
  return found;
}

}  // namespace

ChatTemplate::ChatTemplate(const std::string& source, nlohmann::ordered_json special_tokens, const std::string& name)
    : program_(jinja::parse(source, name)),
      special_tokens_(std::move(special_tokens)),
      iterates_content_(loops_over_content(program_->body)) {}

std::pair<std::string, std::string> ChatTemplate::config_source(const nlohmann::json& config,
                                                                const std::string& origin) {
  FP4MOE_CHECK(config.is_object() && config.contains("chat_template"))
      << origin << " has no chat_template; chat requests need one";
  const nlohmann::json& t = config.at("chat_template");
  if (t.is_string()) return {t.get<std::string>(), origin + ":chat_template"};
  FP4MOE_CHECK(t.is_array()) << origin << ": chat_template is neither a string nor a list of {name, template}";
  for (size_t i = 0; i < t.size(); ++i) {
    if (t[i].value("name", std::string()) == "default") {
      FP4MOE_CHECK(t[i].contains("template") && t[i]["template"].is_string())
          << origin << ": chat_template[" << i << "].template is not a string";
      return {t[i]["template"].get<std::string>(), origin + ":chat_template[" + std::to_string(i) + "]"};
    }
  }
  FP4MOE_FAIL() << origin << ": chat_template lists " << t.size() << " templates and none is named 'default'";
  return {};
}

ChatTemplate ChatTemplate::from_config(const nlohmann::json& config, const std::string& origin) {
  auto [source, name] = config_source(config, origin);
  return ChatTemplate(source, special_tokens_of(config), name);
}

ChatTemplate ChatTemplate::from_source(const std::string& source, const nlohmann::json& config,
                                       const std::string& origin) {
  return ChatTemplate(source, special_tokens_of(config), origin);
}

ChatTemplate ChatTemplate::load(const std::filesystem::path& dir) {
  const auto config_path = dir / "tokenizer_config.json";
  nlohmann::json config;
  if (std::filesystem::exists(config_path)) config = format::read_json_file(config_path);
  const auto jinja_path = dir / "chat_template.jinja";
  if (std::filesystem::exists(jinja_path)) {
    return ChatTemplate(read_file(jinja_path), special_tokens_of(config), jinja_path.string());
  }
  FP4MOE_CHECK(!config.is_null()) << "no chat template in " << dir.string()
                                  << " (neither chat_template.jinja nor tokenizer_config.json)";
  return from_config(config, config_path.string());
}

std::string ChatTemplate::render(const nlohmann::ordered_json& messages, const RenderOptions& options) const {
  FP4MOE_CHECK(messages.is_array()) << program_->name << ": messages must be a JSON array, got "
                                    << messages.type_name();
  nlohmann::ordered_json context = special_tokens_;
  if (options.extra.is_object()) {
    for (const auto& [k, v] : options.extra.items()) context[k] = v;
  }
  context["messages"] = messages;
  context["add_generation_prompt"] = options.add_generation_prompt;
  context["tools"] = options.tools;
  return jinja::render(*program_, context);
}

const std::string& ChatTemplate::source() const { return program_->source; }

}  // namespace fp4moe::engine
