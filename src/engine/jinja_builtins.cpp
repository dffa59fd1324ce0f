// Builtins of the Jinja subset: Python-compatible printing, tojson, filters, tests and methods (see
// jinja_builtins.h). Python semantics are the reference since HF renders chat templates with Jinja2.
// Tested by tests/engine/test_chat_template.cpp.
#include "engine/jinja_builtins.h"

#include <utf8proc.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

#include "engine/tokenizer_text.h"

namespace fp4moe::engine::jinja {

namespace {

std::u32string to_u32(const std::string& s) {
  std::u32string out;
  size_t i = 0;
  while (i < s.size()) out.push_back(text::next_code_point(s, i));
  return out;
}

std::string from_u32(const std::u32string& s) {
  std::string out;
  for (char32_t c : s) text::append_utf8(out, c);
  return out;
}

const std::string& need_string(const Json& j, const char* what) {
  if (!j.is_string()) throw EvalError(std::string(what) + " needs a string, got " + py_repr(j));
  return j.get_ref<const std::string&>();
}

std::string arg_string(const Args& args, size_t i, const char* name, const std::string& fallback) {
  const Value* v = args.get(i, name);
  if (v == nullptr || v->is_undefined() || (v->is_json() && v->json.is_null())) return fallback;
  return need_string(v->as_json(name), name);
}

int64_t arg_int(const Args& args, size_t i, const char* name, int64_t fallback) {
  const Value* v = args.get(i, name);
  if (v == nullptr || v->is_undefined() || (v->is_json() && v->json.is_null())) return fallback;
  const Json& j = v->as_json(name);
  if (!j.is_number()) throw EvalError(std::string(name) + " must be a number, got " + py_repr(j));
  return j.get<int64_t>();
}

bool arg_bool(const Args& args, size_t i, const char* name, bool fallback) {
  const Value* v = args.get(i, name);
  return v == nullptr || v->is_undefined() ? fallback : truthy(*v);
}

// Python str.strip family; `chars` empty = whitespace.
std::string strip(const std::string& s, const std::string* chars, bool left, bool right) {
  const std::u32string u = to_u32(s), set = chars ? to_u32(*chars) : std::u32string();
  auto strip_it = [&](char32_t c) { return chars ? set.find(c) != std::u32string::npos : text::is_python_space(c); };
  size_t b = 0, e = u.size();
  if (left) while (b < e && strip_it(u[b])) ++b;
  if (right) while (e > b && strip_it(u[e - 1])) --e;
  return from_u32(u.substr(b, e - b));
}

Json split(const std::string& s, const std::string* sep, int64_t maxsplit) {
  Json out = Json::array();
  if (sep == nullptr) {  // runs of whitespace, no empty strings
    const std::u32string u = to_u32(s);
    size_t i = 0;
    while (i < u.size()) {
      while (i < u.size() && text::is_python_space(u[i])) ++i;
      if (i >= u.size()) break;
      if (maxsplit >= 0 && static_cast<int64_t>(out.size()) == maxsplit) {
        std::u32string rest = u.substr(i);
        while (!rest.empty() && text::is_python_space(rest.back())) rest.pop_back();
        out.push_back(from_u32(rest));
        break;
      }
      size_t e = i;
      while (e < u.size() && !text::is_python_space(u[e])) ++e;
      out.push_back(from_u32(u.substr(i, e - i)));
      i = e;
    }
    return out;
  }
  if (sep->empty()) throw EvalError("split: empty separator");
  size_t start = 0, hit;
  while ((maxsplit < 0 || static_cast<int64_t>(out.size()) < maxsplit) && (hit = s.find(*sep, start)) != std::string::npos) {
    out.push_back(s.substr(start, hit - start));
    start = hit + sep->size();
  }
  out.push_back(s.substr(start));
  return out;
}

std::string replace_all(const std::string& s, const std::string& from, const std::string& to, int64_t count) {
  if (from.empty()) throw EvalError("replace: empty search string");
  std::string out;
  size_t start = 0, hit;
  int64_t n = 0;
  while ((count < 0 || n < count) && (hit = s.find(from, start)) != std::string::npos) {
    out.append(s, start, hit - start);
    out += to;
    start = hit + from.size();
    ++n;
  }
  out.append(s, start);
  return out;
}

std::string map_case(const std::string& s, int mode) {  // 0 lower, 1 upper, 2 title, 3 capitalize
  std::u32string u = to_u32(s);
  bool word_start = true;
  for (size_t i = 0; i < u.size(); ++i) {
    const auto c = static_cast<utf8proc_int32_t>(u[i]);
    bool up = mode == 1 || ((mode == 2 && word_start) || (mode == 3 && i == 0));
    u[i] = static_cast<char32_t>(up ? utf8proc_toupper(c) : utf8proc_tolower(c));
    word_start = !text::is_alphanumeric(u[i]);
  }
  return from_u32(u);
}

std::string format_float(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof(buf), d, std::chars_format::scientific);
  std::string sci(buf, res.ptr);  // shortest round-trip digits: -d.ddde±XX
  const size_t e_pos = sci.find('e');
  const int exp = std::stoi(sci.substr(e_pos + 1));
  std::string digits;
  for (size_t i = 0; i < e_pos; ++i) if (std::isdigit(static_cast<unsigned char>(sci[i]))) digits += sci[i];
  const std::string sign = d < 0 ? "-" : "";
  if (exp < -4 || exp >= 16) {  // Python repr switches to exponent notation here
    std::string m = digits.substr(0, 1);
    if (digits.size() > 1) m += "." + digits.substr(1);
    char e[16];
    std::snprintf(e, sizeof(e), "e%c%02d", exp < 0 ? '-' : '+', std::abs(exp));
    return sign + m + e;
  }
  std::string out;
  if (exp < 0) {
    out = "0." + std::string(static_cast<size_t>(-exp - 1), '0') + digits;
  } else if (static_cast<int>(digits.size()) <= exp + 1) {
    out = digits + std::string(static_cast<size_t>(exp + 1 - static_cast<int>(digits.size())), '0') + ".0";
  } else {
    out = digits.substr(0, exp + 1) + "." + digits.substr(exp + 1);
  }
  return sign + out;
}

std::string json_string(const std::string& s, bool ensure_ascii) {
  std::string out = "\"";
  size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<uint8_t>(s[i]);
    char buf[16];
    if (c == '"') out += "\\\"";
    else if (c == '\\') out += "\\\\";
    else if (c == '\n') out += "\\n";
    else if (c == '\r') out += "\\r";
    else if (c == '\t') out += "\\t";
    else if (c == '\b') out += "\\b";
    else if (c == '\f') out += "\\f";
    else if (c < 0x20) {
      std::snprintf(buf, sizeof(buf), "\\u%04x", c);
      out += buf;
    } else if (c >= 0x80 && ensure_ascii) {
      const char32_t cp = text::next_code_point(s, i);
      if (cp >= 0x10000) {
        const char32_t v = cp - 0x10000;
        std::snprintf(buf, sizeof(buf), "\\u%04x\\u%04x", 0xD800 + (v >> 10), 0xDC00 + (v & 0x3FF));
      } else {
        std::snprintf(buf, sizeof(buf), "\\u%04x", static_cast<unsigned>(cp));
      }
      out += buf;
      continue;
    } else {
      out.push_back(static_cast<char>(c));
    }
    ++i;
  }
  return out + "\"";
}

void dump(const Json& j, int indent, bool ensure_ascii, bool sort_keys, int level, std::string& out) {
  const std::string item_sep = indent >= 0 ? "," : ", ";
  auto newline = [&](int l) {
    if (indent < 0) return;
    out.push_back('\n');
    out.append(static_cast<size_t>(indent * l), ' ');
  };
  if (j.is_array()) {
    if (j.empty()) {
      out += "[]";
      return;
    }
    out += "[";
    for (size_t i = 0; i < j.size(); ++i) {
      if (i > 0) out += item_sep;
      newline(level + 1);
      dump(j[i], indent, ensure_ascii, sort_keys, level + 1, out);
    }
    newline(level);
    out += "]";
  } else if (j.is_object()) {
    if (j.empty()) {
      out += "{}";
      return;
    }
    std::vector<std::string> keys;
    for (const auto& [k, v] : j.items()) keys.push_back(k);
    if (sort_keys) std::sort(keys.begin(), keys.end());
    out += "{";
    for (size_t i = 0; i < keys.size(); ++i) {
      if (i > 0) out += item_sep;
      newline(level + 1);
      out += json_string(keys[i], ensure_ascii) + ": ";
      dump(j.at(keys[i]), indent, ensure_ascii, sort_keys, level + 1, out);
    }
    newline(level);
    out += "}";
  } else if (j.is_string()) {
    out += json_string(j.get_ref<const std::string&>(), ensure_ascii);
  } else if (j.is_number_float()) {
    const double d = j.get<double>();
    out += std::isnan(d) ? "NaN" : std::isinf(d) ? (d > 0 ? "Infinity" : "-Infinity") : format_float(d);
  } else {
    out += j.dump();  // null, true, false, integers
  }
}

Json get_attribute(const Json& j, const std::string& attr) {
  if (j.is_object() && j.contains(attr)) return j.at(attr);
  return Json();
}

std::vector<Json> as_list(const Value& v) { return iterate(v); }

}  // namespace

const Json& Value::as_json(const char* what) const {
  if (kind == Kind::kJson) return json;
  if (kind == Kind::kNamespace) return *ns;
  if (kind == Kind::kMacro) throw EvalError(std::string(what) + ": a macro is not a value");
  throw EvalError(std::string(what) + ": '" + undefined_name + "' is undefined");
}

const Value* Args::get(size_t i, const char* name) const {
  if (i < positional.size()) return &positional[i];
  for (const auto& [k, v] : keyword) if (k == name) return &v;
  return nullptr;
}

bool truthy(const Value& v) {
  switch (v.kind) {
    case Value::Kind::kUndefined: return false;
    case Value::Kind::kNamespace:
    case Value::Kind::kMacro: return true;
    case Value::Kind::kJson: break;
  }
  const Json& j = v.json;
  if (j.is_null()) return false;
  if (j.is_boolean()) return j.get<bool>();
  if (j.is_number_integer()) return j.get<int64_t>() != 0;
  if (j.is_number()) return j.get<double>() != 0.0;
  if (j.is_string()) return !j.get_ref<const std::string&>().empty();  // json::empty() is false for strings
  if (j.is_array() || j.is_object()) return !j.empty();
  return true;
}

bool equal(const Value& a, const Value& b) {
  if (a.is_undefined() || b.is_undefined()) return a.is_undefined() && b.is_undefined();
  if (a.kind != b.kind) return false;
  if (a.kind == Value::Kind::kNamespace) return a.ns == b.ns;
  if (a.kind == Value::Kind::kMacro) return a.macro == b.macro;
  if (a.json.is_boolean() != b.json.is_boolean() && a.json.is_number() != b.json.is_number()) {
    // Python: True == 1, False == 0.
    const Json& boolean = a.json.is_boolean() ? a.json : b.json;
    const Json& number = a.json.is_boolean() ? b.json : a.json;
    if (number.is_number()) return number.get<double>() == (boolean.get<bool>() ? 1.0 : 0.0);
  }
  return a.json == b.json;
}

bool less(const Json& a, const Json& b) {
  if (a.is_number() && b.is_number()) return a.get<double>() < b.get<double>();
  if (a.is_string() && b.is_string()) return a.get_ref<const std::string&>() < b.get_ref<const std::string&>();
  throw EvalError("cannot compare " + py_repr(a) + " with " + py_repr(b));
}

std::string py_repr(const Json& j) {
  if (j.is_string()) {
    const std::string& s = j.get_ref<const std::string&>();
    const char quote = (s.find('\'') != std::string::npos && s.find('"') == std::string::npos) ? '"' : '\'';
    std::string out(1, quote);
    for (char c : s) {
      if (c == quote || c == '\\') {
        out.push_back('\\');
        out.push_back(c);
      } else if (c == '\n') out += "\\n";
      else if (c == '\r') out += "\\r";
      else if (c == '\t') out += "\\t";
      else if (static_cast<uint8_t>(c) < 0x20 || c == 0x7F) {
        char buf[8];
        std::snprintf(buf, sizeof(buf), "\\x%02x", static_cast<uint8_t>(c));
        out += buf;
      } else out.push_back(c);
    }
    return out + quote;
  }
  if (j.is_array()) {
    std::string out = "[";
    for (size_t i = 0; i < j.size(); ++i) out += (i ? ", " : "") + py_repr(j[i]);
    return out + "]";
  }
  if (j.is_object()) {
    std::string out = "{";
    bool first = true;
    for (const auto& [k, v] : j.items()) {
      out += (first ? "" : ", ") + py_repr(Json(k)) + ": " + py_repr(v);
      first = false;
    }
    return out + "}";
  }
  if (j.is_null()) return "None";
  if (j.is_boolean()) return j.get<bool>() ? "True" : "False";
  if (j.is_number_float()) return format_float(j.get<double>());
  return j.dump();
}

std::string py_str(const Value& v) {
  if (v.is_undefined()) return "";
  if (v.kind == Value::Kind::kMacro) return "<macro>";
  if (v.kind == Value::Kind::kNamespace) return "<Namespace " + py_repr(*v.ns) + ">";
  if (v.json.is_string()) return v.json.get<std::string>();
  return py_repr(v.json);
}

std::string to_json(const Json& j, int indent, bool ensure_ascii, bool sort_keys) {
  std::string out;
  dump(j, indent, ensure_ascii, sort_keys, 0, out);
  return out;
}

std::vector<Json> iterate(const Value& v) {
  if (v.is_undefined()) return {};
  const Json& j = v.as_json("iteration");
  std::vector<Json> out;
  if (j.is_array()) {
    out.assign(j.begin(), j.end());
  } else if (j.is_object()) {
    for (const auto& [k, val] : j.items()) out.emplace_back(k);
  } else if (j.is_string()) {
    const std::string& s = j.get_ref<const std::string&>();
    size_t i = 0;
    while (i < s.size()) {
      const size_t b = i;
      text::next_code_point(s, i);
      out.emplace_back(s.substr(b, i - b));
    }
  } else {
    throw EvalError(py_repr(j) + " is not iterable");
  }
  return out;
}

bool apply_test(const std::string& name, const Value& v, const Args& args) {
  const Json* j = v.is_json() ? &v.json : v.kind == Value::Kind::kNamespace ? v.ns.get() : nullptr;
  auto arg = [&](size_t i) -> const Value& {
    const Value* a = args.get(i, "value");
    if (a == nullptr) throw EvalError("test '" + name + "' needs an argument");
    return *a;
  };
  if (name == "defined") return !v.is_undefined();
  if (name == "undefined") return v.is_undefined();
  if (name == "callable") return v.kind == Value::Kind::kMacro;
  if (name == "mapping") return j != nullptr && j->is_object();
  if (name == "equalto" || name == "eq" || name == "==" || name == "sameas") return equal(v, arg(0));
  if (name == "ne" || name == "!=") return !equal(v, arg(0));
  if (j == nullptr || v.kind == Value::Kind::kNamespace) {
    if (name == "iterable" || name == "sequence" || name == "string" || name == "none" || name == "number" ||
        name == "integer" || name == "float" || name == "boolean" || name == "true" || name == "false" ||
        name == "lower" || name == "upper")
      return false;
    throw EvalError("test '" + name + "' on " + (v.is_undefined() ? "an undefined value" : "a non-value"));
  }
  if (name == "none") return j->is_null();
  if (name == "string") return j->is_string();
  if (name == "iterable") return j->is_array() || j->is_object() || j->is_string();
  if (name == "sequence") return j->is_array() || j->is_object() || j->is_string();
  if (name == "number") return j->is_number() || j->is_boolean();
  if (name == "integer") return j->is_number_integer();
  if (name == "float") return j->is_number_float();
  if (name == "boolean") return j->is_boolean();
  if (name == "true") return j->is_boolean() && j->get<bool>();
  if (name == "false") return j->is_boolean() && !j->get<bool>();
  if (name == "lower" || name == "upper") {
    if (!j->is_string()) return false;
    return map_case(j->get<std::string>(), name == "lower" ? 0 : 1) == j->get<std::string>();
  }
  if (name == "odd" || name == "even" || name == "divisibleby") {
    if (!j->is_number_integer()) throw EvalError("test '" + name + "' needs an integer, got " + py_repr(*j));
    const int64_t n = j->get<int64_t>();
    if (name == "divisibleby") {
      const int64_t d = arg(0).as_json("divisibleby").get<int64_t>();
      if (d == 0) throw EvalError("divisibleby(0)");
      return n % d == 0;
    }
    return (std::abs(n) % 2 == 1) == (name == "odd");
  }
  if (name == "in") {
    const Json& container = arg(0).as_json("in");
    if (container.is_string()) return j->is_string() && container.get<std::string>().find(j->get<std::string>()) != std::string::npos;
    if (container.is_object()) return j->is_string() && container.contains(j->get<std::string>());
    for (const Json& item : container) if (equal(Value::of(item), v)) return true;
    return false;
  }
  const Json& other = arg(0).as_json(name.c_str());
  if (name == "lt" || name == "<") return less(*j, other);
  if (name == "gt" || name == ">") return less(other, *j);
  if (name == "le" || name == "<=") return !less(other, *j);
  if (name == "ge" || name == ">=") return !less(*j, other);
  throw EvalError("unsupported test '" + name + "'");
}

Value apply_filter(const std::string& name, const Value& input, const Args& args) {
  if (name == "default" || name == "d") {
    const bool boolean = arg_bool(args, 1, "boolean", false);
    if (input.is_undefined() || (boolean && !truthy(input))) {
      const Value* fallback = args.get(0, "default_value");
      return fallback ? *fallback : Value::of("");
    }
    return input;
  }
  if (name == "safe") return input;
  if (name == "string") return Value::of(py_str(input));
  if (name == "length" || name == "count") {
    if (input.is_undefined()) return Value::of(0);
    const Json& j = input.as_json("length");
    if (j.is_string()) return Value::of(static_cast<int64_t>(to_u32(j.get<std::string>()).size()));
    if (j.is_array() || j.is_object()) return Value::of(static_cast<int64_t>(j.size()));
    throw EvalError("length of " + py_repr(j));
  }
  if (name == "tojson") {
    const Value* indent = args.get(0, "indent");
    const int ind = (indent && indent->is_json() && indent->json.is_number()) ? indent->json.get<int>() : -1;
    return Value::of(to_json(input.as_json("tojson"), ind, arg_bool(args, 99, "ensure_ascii", false),
                             arg_bool(args, 99, "sort_keys", false)));
  }
  if (name == "list") return Value::of(Json(as_list(input)));
  if (name == "items") {
    if (input.is_undefined()) return Value::of(Json::array());
    const Json& j = input.as_json("items");
    if (!j.is_object()) throw EvalError("items of " + py_repr(j));
    Json out = Json::array();
    for (const auto& [k, v] : j.items()) out.push_back(Json::array({k, v}));
    return Value::of(out);
  }
  if (name == "join") {
    const std::string sep = arg_string(args, 0, "d", "");
    const Value* attribute = args.get(1, "attribute");
    std::string out;
    bool first = true;
    for (const Json& item : as_list(input)) {
      if (!first) out += sep;
      first = false;
      out += py_str(Value::of(attribute ? get_attribute(item, py_str(*attribute)) : item));
    }
    return Value::of(out);
  }
  if (name == "first" || name == "last") {
    std::vector<Json> items = as_list(input);
    if (items.empty()) return Value::undefined(name + " of an empty sequence");
    return Value::of(name == "first" ? items.front() : items.back());
  }
  if (name == "reverse") {
    const Json& j = input.as_json("reverse");
    if (j.is_string()) {
      std::u32string u = to_u32(j.get<std::string>());
      std::reverse(u.begin(), u.end());
      return Value::of(from_u32(u));
    }
    std::vector<Json> items = as_list(input);
    std::reverse(items.begin(), items.end());
    return Value::of(Json(items));
  }
  if (name == "map" || name == "selectattr" || name == "rejectattr") {
    Json out = Json::array();
    for (const Json& item : as_list(input)) {
      if (name == "map") {
        if (const Value* attribute = args.get(99, "attribute")) {
          const Json got = get_attribute(item, py_str(*attribute));
          const Value* fallback = args.get(99, "default");
          out.push_back(got.is_null() && fallback ? fallback->as_json("map default") : got);
        } else {
          Args rest;
          if (args.positional.empty()) throw EvalError("map needs a filter name or attribute=");
          rest.positional.assign(args.positional.begin() + 1, args.positional.end());
          out.push_back(apply_filter(py_str(args.positional[0]), Value::of(item), rest).as_json("map"));
        }
        continue;
      }
      if (args.positional.empty()) throw EvalError(name + " needs an attribute name");
      const std::string attr = py_str(args.positional[0]);
      const Value field = item.is_object() && item.contains(attr) ? Value::of(item.at(attr)) : Value::undefined(attr);
      bool pass = truthy(field);
      if (args.positional.size() > 1) {
        Args test_args;
        test_args.positional.assign(args.positional.begin() + 2, args.positional.end());
        pass = apply_test(py_str(args.positional[1]), field, test_args);
      }
      if (pass == (name == "selectattr")) out.push_back(item);
    }
    return Value::of(out);
  }
  if (name == "select" || name == "reject") {  // select(test, args...); no test: truthiness
    Json out = Json::array();
    for (const Json& item : as_list(input)) {
      bool pass = truthy(Value::of(item));
      if (!args.positional.empty()) {
        Args test_args;
        test_args.positional.assign(args.positional.begin() + 1, args.positional.end());
        pass = apply_test(py_str(args.positional[0]), Value::of(item), test_args);
      }
      if (pass == (name == "select")) out.push_back(item);
    }
    return Value::of(out);
  }
  if (name == "unique") {
    Json out = Json::array();
    for (const Json& item : as_list(input)) {
      if (std::find(out.begin(), out.end(), item) == out.end()) out.push_back(item);
    }
    return Value::of(out);
  }
  if (name == "sort" || name == "dictsort") {
    std::vector<Json> items;
    if (name == "dictsort") {
      const Json& j = input.as_json("dictsort");
      for (const auto& [k, v] : j.items()) items.push_back(Json::array({k, v}));
    } else {
      items = as_list(input);
    }
    const bool reverse = arg_bool(args, 0, "reverse", false);
    const Value* attribute = args.get(99, "attribute");
    auto key = [&](const Json& x) -> Json {
      if (name == "dictsort") return x[0];
      return attribute ? get_attribute(x, py_str(*attribute)) : x;
    };
    std::stable_sort(items.begin(), items.end(), [&](const Json& a, const Json& b) {
      return reverse ? less(key(b), key(a)) : less(key(a), key(b));
    });
    return Value::of(Json(items));
  }
  if (name == "sum" || name == "min" || name == "max") {
    std::vector<Json> items = as_list(input);
    if (name == "sum") {
      double total = 0;
      bool integral = true;
      for (const Json& x : items) {
        if (!x.is_number()) throw EvalError("sum of " + py_repr(x));
        integral = integral && x.is_number_integer();
        total += x.get<double>();
      }
      return integral ? Value::of(static_cast<int64_t>(total)) : Value::of(total);
    }
    if (items.empty()) return Value::undefined(name + " of an empty sequence");
    Json best = items[0];
    for (const Json& x : items) if (name == "min" ? less(x, best) : less(best, x)) best = x;
    return Value::of(best);
  }
  if (name == "attr") return Value::of(get_attribute(input.as_json("attr"), arg_string(args, 0, "name", "")));
  // The remaining filters take a scalar.
  const Json& j = input.as_json(name.c_str());
  if (name == "int") {
    if (j.is_number()) return Value::of(static_cast<int64_t>(j.get<double>()));
    if (j.is_boolean()) return Value::of(j.get<bool>() ? 1 : 0);
    if (j.is_string()) {
      try {
        return Value::of(static_cast<int64_t>(std::stoll(j.get<std::string>())));
      } catch (const std::exception&) {
      }
    }
    return Value::of(arg_int(args, 0, "default", 0));
  }
  if (name == "float") {
    if (j.is_number()) return Value::of(j.get<double>());
    if (j.is_string()) {
      try {
        return Value::of(std::stod(j.get<std::string>()));
      } catch (const std::exception&) {
      }
    }
    return Value::of(0.0);
  }
  if (name == "abs") {
    if (j.is_number_integer()) return Value::of(std::abs(j.get<int64_t>()));
    if (j.is_number()) return Value::of(std::fabs(j.get<double>()));
    throw EvalError("abs of " + py_repr(j));
  }
  if (name == "round") {
    if (!j.is_number()) throw EvalError("round of " + py_repr(j));
    const double scale = std::pow(10.0, static_cast<double>(arg_int(args, 0, "precision", 0)));
    const std::string method = arg_string(args, 1, "method", "common");
    const double x = j.get<double>() * scale;
    const double r = method == "floor" ? std::floor(x) : method == "ceil" ? std::ceil(x) : std::round(x);
    return Value::of(r / scale);
  }
  const std::string s = py_str(input);
  if (name == "trim" || name == "strip") {
    const Value* chars = args.get(0, "chars");
    const std::string c = chars ? py_str(*chars) : "";
    return Value::of(strip(s, chars ? &c : nullptr, true, true));
  }
  if (name == "upper") return Value::of(map_case(s, 1));
  if (name == "lower") return Value::of(map_case(s, 0));
  if (name == "title") return Value::of(map_case(s, 2));
  if (name == "capitalize") return Value::of(map_case(map_case(s, 0), 3));
  if (name == "replace") {
    return Value::of(replace_all(s, arg_string(args, 0, "old", ""), arg_string(args, 1, "new", ""),
                                 arg_int(args, 2, "count", -1)));
  }
  if (name == "wordcount") return Value::of(static_cast<int64_t>(split(s, nullptr, -1).size()));
  if (name == "e" || name == "escape") {
    std::string out;
    for (char c : s) {
      switch (c) {
        case '&': out += "&amp;"; break;
        case '<': out += "&lt;"; break;
        case '>': out += "&gt;"; break;
        case '"': out += "&#34;"; break;
        case '\'': out += "&#39;"; break;
        default: out.push_back(c);
      }
    }
    return Value::of(out);
  }
  if (name == "indent") {
    const Value* width_v = args.get(0, "width");
    const std::string pad = width_v && width_v->is_json() && width_v->json.is_string()
                                ? width_v->json.get<std::string>()
                                : std::string(static_cast<size_t>(arg_int(args, 0, "width", 4)), ' ');
    const bool first = arg_bool(args, 1, "first", false), blank = arg_bool(args, 2, "blank", false);
    std::string out;
    size_t start = 0;
    bool first_line = true;
    while (true) {
      const size_t nl = s.find('\n', start);
      const std::string line = s.substr(start, nl == std::string::npos ? std::string::npos : nl - start);
      if ((first_line ? first : true) && (blank || !line.empty())) out += pad;
      out += line;
      if (nl == std::string::npos) break;
      out += "\n";
      start = nl + 1;
      first_line = false;
    }
    return Value::of(out);
  }
  throw EvalError("unsupported filter '" + name + "'");
}

bool call_method(const Json& object, const std::string& name, const Args& args, Value& result) {
  if (object.is_string()) {
    const std::string& s = object.get_ref<const std::string&>();
    if (name == "strip" || name == "lstrip" || name == "rstrip") {
      const Value* chars = args.get(0, "chars");
      const bool has = chars && !(chars->is_json() && chars->json.is_null());
      const std::string c = has ? need_string(chars->as_json(name.c_str()), name.c_str()) : "";
      result = Value::of(strip(s, has ? &c : nullptr, name != "rstrip", name != "lstrip"));
    } else if (name == "split") {
      const Value* sep = args.get(0, "sep");
      const bool has = sep && !(sep->is_json() && sep->json.is_null());
      const std::string sp = has ? need_string(sep->as_json("split"), "split") : "";
      result = Value::of(split(s, has ? &sp : nullptr, arg_int(args, 1, "maxsplit", -1)));
    } else if (name == "startswith" || name == "endswith") {
      const Value* arg = args.get(0, "prefix");
      if (arg == nullptr) throw EvalError(name + " needs an argument");
      const Json& a = arg->as_json(name.c_str());
      std::vector<std::string> options;
      if (a.is_array()) for (const Json& x : a) options.push_back(need_string(x, name.c_str()));
      else options.push_back(need_string(a, name.c_str()));
      bool hit = false;
      for (const std::string& o : options) {
        hit = hit || (o.size() <= s.size() && (name == "startswith" ? s.compare(0, o.size(), o) == 0
                                                                    : s.compare(s.size() - o.size(), o.size(), o) == 0));
      }
      result = Value::of(hit);
    } else if (name == "replace") {
      result = Value::of(replace_all(s, arg_string(args, 0, "old", ""), arg_string(args, 1, "new", ""),
                                     arg_int(args, 2, "count", -1)));
    } else if (name == "upper" || name == "lower" || name == "title" || name == "capitalize") {
      const int mode = name == "lower" ? 0 : name == "upper" ? 1 : name == "title" ? 2 : 3;
      result = Value::of(map_case(mode == 3 ? map_case(s, 0) : s, mode));
    } else if (name == "find" || name == "rfind" || name == "count") {
      const std::string sub = arg_string(args, 0, "sub", "");
      if (name == "count") {
        int64_t n = 0;
        if (!sub.empty()) for (size_t at = s.find(sub); at != std::string::npos; at = s.find(sub, at + sub.size())) ++n;
        result = Value::of(n);
      } else {
        const size_t at = name == "find" ? s.find(sub) : s.rfind(sub);
        // Python counts characters, not bytes.
        result = Value::of(at == std::string::npos ? int64_t{-1} : static_cast<int64_t>(to_u32(s.substr(0, at)).size()));
      }
    } else if (name == "join") {
      const Value* items = args.get(0, "iterable");
      if (items == nullptr) throw EvalError("join needs an argument");
      std::string out;
      bool first = true;
      for (const Json& item : iterate(*items)) {
        if (!first) out += s;
        first = false;
        out += need_string(item, "join");
      }
      result = Value::of(out);
    } else if (name == "splitlines") {
      Json out = Json::array();
      size_t start = 0;
      while (start < s.size()) {
        size_t nl = s.find('\n', start);
        if (nl == std::string::npos) nl = s.size();
        std::string line = s.substr(start, nl - start);
        if (!line.empty() && line.back() == '\r') line.pop_back();
        out.push_back(line);
        start = nl + 1;
      }
      result = Value::of(out);
    } else if (name == "isdigit" || name == "isspace" || name == "isalpha" || name == "isalnum") {
      const std::u32string u = to_u32(s);
      bool ok = !u.empty();
      for (char32_t c : u) {
        const auto cat = utf8proc_category(static_cast<utf8proc_int32_t>(c));
        const bool alpha = cat >= UTF8PROC_CATEGORY_LU && cat <= UTF8PROC_CATEGORY_LO;
        const bool digit = cat == UTF8PROC_CATEGORY_ND;
        ok = ok && (name == "isdigit"   ? digit
                    : name == "isspace" ? text::is_python_space(c)
                    : name == "isalpha" ? alpha
                                        : (alpha || digit));
      }
      result = Value::of(ok);
    } else {
      return false;
    }
    return true;
  }
  if (object.is_object()) {
    if (name == "items") {
      Json out = Json::array();
      for (const auto& [k, v] : object.items()) out.push_back(Json::array({k, v}));
      result = Value::of(out);
    } else if (name == "keys" || name == "values") {
      Json out = Json::array();
      for (const auto& [k, v] : object.items()) out.push_back(name == "keys" ? Json(k) : v);
      result = Value::of(out);
    } else if (name == "get") {
      const std::string key = arg_string(args, 0, "key", "");
      if (object.contains(key)) {
        result = Value::of(object.at(key));
      } else {
        const Value* fallback = args.get(1, "default");
        result = fallback ? *fallback : Value::of(nullptr);
      }
    } else {
      return false;
    }
    return true;
  }
  if (object.is_array()) {
    if (name == "index" || name == "count") {
      const Value* x = args.get(0, "value");
      if (x == nullptr) throw EvalError(name + " needs an argument");
      int64_t n = 0, first = -1;
      for (size_t i = 0; i < object.size(); ++i) {
        if (equal(Value::of(object[i]), *x)) {
          ++n;
          if (first < 0) first = static_cast<int64_t>(i);
        }
      }
      if (name == "index" && first < 0) throw EvalError(py_str(*x) + " is not in list");
      result = Value::of(name == "index" ? first : n);
      return true;
    }
  }
  return false;
}

}  // namespace fp4moe::engine::jinja
