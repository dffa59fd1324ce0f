// server::ToolCallParser (see tool_calls.h). Tested by tests/server/test_tool_calls.cpp.
#include "server/tool_calls.h"

#include <algorithm>
#include <array>
#include <optional>
#include <set>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "engine/json_schema.h"
#include "engine/regex_dfa.h"
#include "server/markup.h"
#include "server/protocol.h"

namespace fp4moe::server {

namespace {

constexpr std::array<ToolCallFormat, 1> kFormats = {{
    {"glm45", "<tool_call>", "</tool_call>", "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>"},
}};

std::string_view trim(std::string_view s) {
  const auto sp = [](char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; };
  while (!s.empty() && sp(s.front())) s.remove_prefix(1);
  while (!s.empty() && sp(s.back())) s.remove_suffix(1);
  return s;
}

std::string json_string(const std::string& s) { return dump_json(nlohmann::json(s)); }

// Compact JSON text of a value with its numbers as written: read as doubles, an integer past 64 bits
// would come back rounded (1e+137 for 138 nines; Python's json, as SGLang reads arguments, keeps it).
class CompactJson : public nlohmann::json_sax<nlohmann::json> {
 public:
  std::string out;
  bool null() override { return raw("null"); }
  bool boolean(bool v) override { return raw(v ? "true" : "false"); }
  bool number_integer(number_integer_t v) override { return raw(std::to_string(v)); }
  bool number_unsigned(number_unsigned_t v) override { return raw(std::to_string(v)); }
  bool number_float(number_float_t, const string_t& text) override { return raw(text); }
  bool string(string_t& v) override { return raw(json_string(v)); }
  bool binary(binary_t&) override { return false; }
  bool start_object(std::size_t) override { return open('{'); }
  bool key(string_t& k) override {
    comma();
    out += json_string(k);
    out += ':';
    after_key_ = true;
    return true;
  }
  bool end_object() override { return close('}'); }
  bool start_array(std::size_t) override { return open('['); }
  bool end_array() override { return close(']'); }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) override { return false; }

 private:
  std::vector<bool> first_;  // per open container: nothing written in it yet
  bool after_key_ = false;
  void comma() {
    if (after_key_) {
      after_key_ = false;
      return;
    }
    if (!first_.empty()) {
      if (!first_.back()) out += ',';
      first_.back() = false;
    }
  }
  bool raw(const std::string& text) {
    comma();
    out += text;
    return true;
  }
  bool open(char c) {
    comma();
    out += c;
    first_.push_back(true);
    return true;
  }
  bool close(char c) {
    first_.pop_back();
    out += c;
    return true;
  }
};

// `raw` as compact JSON text, or nullopt when it is not JSON.
std::optional<std::string> compact_json(std::string_view raw) {
  CompactJson w;
  if (!nlohmann::json::sax_parse(raw.begin(), raw.end(), &w, nlohmann::json::input_format_t::json, true)) {
    return std::nullopt;
  }
  return std::move(w.out);
}

// The body of one call (between the tags); nullopt when it is not name + key / value pairs.
std::optional<ToolCall> parse_call(const ToolCallFormat& f, std::string_view body,
                                   const std::map<std::string, std::set<std::string>>& string_args) {
  const size_t first_key = body.find(f.key_open);
  ToolCall call;
  call.name = std::string(trim(body.substr(0, first_key)));
  if (call.name.empty() || call.name.find_first_of(" \n\t<>") != std::string::npos) return std::nullopt;
  std::vector<std::pair<std::string, std::string>> args;  // key, JSON text of the value; a repeated key: the last
  const auto strings = string_args.find(call.name);
  size_t at = first_key;
  while (at != std::string_view::npos) {
    const size_t k0 = at + f.key_open.size();
    const size_t k1 = body.find(f.key_close, k0);
    if (k1 == std::string_view::npos) return std::nullopt;
    const size_t v_open = body.find(f.value_open, k1 + f.key_close.size());
    if (v_open == std::string_view::npos ||
        !trim(body.substr(k1 + f.key_close.size(), v_open - k1 - f.key_close.size())).empty())
      return std::nullopt;
    const size_t v0 = v_open + f.value_open.size();
    const size_t v1 = body.find(f.value_close, v0);
    if (v1 == std::string_view::npos) return std::nullopt;
    const std::string key(trim(body.substr(k0, k1 - k0)));
    const std::string_view raw = body.substr(v0, v1 - v0);
    std::string value;
    if (strings != string_args.end() && strings->second.count(key)) {
      value = json_string(std::string(raw));  // declared a string: as written
    } else {
      std::optional<std::string> parsed = compact_json(raw);
      value = parsed ? std::move(*parsed) : json_string(std::string(raw));
    }
    const auto same = std::find_if(args.begin(), args.end(), [&](const auto& kv) { return kv.first == key; });
    if (same != args.end()) {
      same->second = std::move(value);
    } else {
      args.emplace_back(key, std::move(value));
    }
    at = body.find(f.key_open, v1 + f.value_close.size());
    if (!trim(body.substr(v1 + f.value_close.size(),
                          (at == std::string_view::npos ? body.size() : at) - v1 - f.value_close.size()))
             .empty())
      return std::nullopt;
  }
  call.arguments = "{";
  for (const auto& [key, value] : args) {
    if (call.arguments.size() > 1) call.arguments += ',';
    call.arguments += json_string(key) + ":" + value;
  }
  call.arguments += "}";
  return call;
}

}  // namespace

const ToolCallFormat* find_tool_call_format(std::string_view name) { return markup::find_by_name(kFormats, name); }

std::string tool_call_format_names() { return markup::names_of(kFormats); }

ToolCallParser::ToolCallParser(const ToolCallFormat& format, const nlohmann::ordered_json& tools) : f_(&format) {
  if (!tools.is_array()) return;
  for (const auto& t : tools) {
    if (!t.is_object() || !t.contains("function") || !t["function"].is_object()) continue;
    const auto& fn = t["function"];
    if (!fn.contains("name") || !fn["name"].is_string() || !fn.contains("parameters") ||
        !fn["parameters"].is_object() || !fn["parameters"].contains("properties") ||
        !fn["parameters"]["properties"].is_object())
      continue;
    for (auto it = fn["parameters"]["properties"].begin(); it != fn["parameters"]["properties"].end(); ++it) {
      if (it.value().is_object() && it.value().contains("type") && it.value()["type"] == "string")
        string_args_[fn["name"].get<std::string>()].insert(it.key());
    }
  }
}

void ToolCallParser::add_content(std::string_view s, ToolCallSplit& out) {
  const size_t last = s.find_last_not_of(" \n\r\t");
  if (last == std::string_view::npos) {
    pending_ws_ += s;
    return;
  }
  out.content += pending_ws_;
  out.content += s.substr(0, last + 1);
  pending_ws_ = std::string(s.substr(last + 1));
}

ToolCallSplit ToolCallParser::push(std::string_view delta) {
  ToolCallSplit out;
  held_ += delta;
  while (!held_.empty()) {
    if (!in_call_) {
      const size_t p = held_.find(f_->start);
      if (p == std::string::npos) {
        const size_t keep = markup::partial_tag_suffix(held_, f_->start);
        add_content(std::string_view(held_).substr(0, held_.size() - keep), out);
        held_.erase(0, held_.size() - keep);
        return out;
      }
      add_content(std::string_view(held_).substr(0, p), out);
      ws_before_call_ = std::move(pending_ws_);
      pending_ws_.clear();
      held_.erase(0, p + f_->start.size());
      in_call_ = true;
      after_call_ = true;
      continue;
    }
    const size_t e = held_.find(f_->end);
    if (e == std::string::npos) return out;  // the call is not complete yet
    if (std::optional<ToolCall> call = parse_call(*f_, std::string_view(held_).substr(0, e), string_args_)) {
      out.calls.push_back(std::move(*call));
      ++n_calls_;
    } else {  // not a call after all: the text as written
      pending_ws_ = std::move(ws_before_call_);
      add_content(std::string(f_->start) + held_.substr(0, e + f_->end.size()), out);
    }
    held_.erase(0, e + f_->end.size());
    in_call_ = false;
  }
  return out;
}

ToolCallSplit ToolCallParser::finish() {
  ToolCallSplit out;
  if (in_call_) {
    out.content = ws_before_call_ + std::string(f_->start) + held_;  // cut off inside a call: as written
  } else {
    add_content(held_, out);
    if (!after_call_) out.content += pending_ws_;  // a reply without calls keeps its text as it is
  }
  pending_ws_.clear();
  held_.clear();
  in_call_ = false;
  return out;
}

ToolCallSplit ToolCallParser::take(std::string_view delta, bool last) {
  ToolCallSplit out = push(delta);
  if (last) {
    ToolCallSplit tail = finish();
    out.content += tail.content;
    for (ToolCall& c : tail.calls) out.calls.push_back(std::move(c));
  }
  return out;
}

ToolCallSplit parse_tool_calls(const ToolCallFormat& format, std::string_view text,
                               const nlohmann::ordered_json& tools) {
  return ToolCallParser(format, tools).take(text, /*last=*/true);
}

std::string forced_tool_call_regex(const ToolCallFormat& f, const nlohmann::ordered_json& tools,
                                   const std::string& only_name, bool one_call) {
  using engine::regex_escape;
  const std::string text = "(?:[^<]|<+[^</])*<*";  // no "</": cannot close the value early
  // A longer maxLength is not counted (a counted UTF-8 character costs ~35 DFA states a position).
  constexpr uint64_t kMaxCountedLength = 256;
  constexpr size_t kMaxRegexBytes = size_t{1} << 20;
  std::string calls;
  int n_calls = 0;
  for (const auto& tool : tools) {
    const nlohmann::ordered_json& fn = tool["function"];
    const std::string name = fn["name"].get<std::string>();
    if (!only_name.empty() && name != only_name) continue;
    std::string pairs;
    const nlohmann::ordered_json* props = nullptr;
    if (fn.contains("parameters") && fn["parameters"].is_object() && fn["parameters"].contains("properties") &&
        fn["parameters"]["properties"].is_object() && !fn["parameters"]["properties"].empty())
      props = &fn["parameters"]["properties"];
    auto pair = [&](const std::string& key, const std::string& value) {
      std::string p = "\n";
      p += regex_escape(f.key_open);
      p += key;
      p += regex_escape(f.key_close);
      p += "\n";
      p += regex_escape(f.value_open);
      p += "(?:" + value + ")";
      p += regex_escape(f.value_close);
      return p;
    };
    std::set<std::string> required;
    if (fn.contains("parameters") && fn["parameters"].is_object() && fn["parameters"].contains("required") &&
        fn["parameters"]["required"].is_array()) {
      for (const auto& r : fn["parameters"]["required"]) {
        if (r.is_string()) required.insert(r.get<std::string>());
      }
    }
    if (props == nullptr) {
      pairs = "(?:" + pair("[^<\n]+", text) + ")*";  // arguments not described: any names, any number
    } else {
      for (auto it = props->begin(); it != props->end(); ++it) {
        const nlohmann::ordered_json& ps = it.value();
        std::string value = text;
        const bool typed = ps.is_object() && ps.contains("type") && ps["type"] != "string";
        if (!typed && ps.is_object() && ps.contains("enum") && ps["enum"].is_array() && !ps["enum"].empty()) {
          value.clear();  // raw strings, as written between the tags
          for (const auto& v : ps["enum"]) {
            value += value.empty() ? "" : "|";
            value += regex_escape(v.is_string() ? v.get<std::string>() : v.dump());
          }
        } else if (!typed && ps.is_object() && ps.contains("maxLength") && ps["maxLength"].is_number_unsigned() &&
                   ps["maxLength"].get<uint64_t>() <= kMaxCountedLength) {
          value = "[^<]{0," + std::to_string(ps["maxLength"].get<uint64_t>()) + "}";
        } else if (typed) {
          try {
            value = engine::json_schema_to_regex(ps, "[ ]?", /*strings_without_lt=*/true);
          } catch (const Error& e) {  // as response_format's schema would be: refused, not left unconstrained
            throw Error("tool \"" + name + "\", parameter \"" + it.key() + "\": " + e.what());
          }
        }
        // Each argument at most once, in the schema's order; a required one always.
        const std::string one = pair(regex_escape(it.key()), value);
        pairs += required.count(it.key()) ? one : "(?:" + one + ")?";
        if (pairs.size() > kMaxRegexBytes)
          throw Error("the forced-call regex of tool \"" + name + "\" exceeds " + std::to_string(kMaxRegexBytes) +
                      " bytes; simplify its parameters");
      }
    }
    calls += n_calls++ ? "|" : "";
    calls += regex_escape(f.start) + regex_escape(name) + pairs + "\n" + regex_escape(f.end);
    if (calls.size() > kMaxRegexBytes)
      throw Error("the forced-call regex of these tools exceeds " + std::to_string(kMaxRegexBytes) +
                  " bytes; name one function or simplify the parameters");
  }
  FP4MOE_CHECK(n_calls > 0) << "tool_choice names \"" << only_name << "\", which is not among the tools";
  // "required": calls one after another (a newline between them optional, as the parser trims), the
  // alternation written once.
  return only_name.empty() && !one_call ? "(?:(?:" + calls + ")\n?)+" : "(?:" + calls + ")";
}

}  // namespace fp4moe::server
