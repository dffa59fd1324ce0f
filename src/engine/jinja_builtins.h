// Values and builtins of the Jinja subset (internal to the engine): the value type, Python's str()/repr()
// of JSON values, json.dumps as HF's tojson calls it, truthiness, comparison, and the filters, tests and
// str/dict/list methods. Builtins report bad arguments by throwing EvalError, which the renderer turns
// into an fp4moe::Error with the template location. Tested by tests/engine/test_chat_template.cpp.
#pragma once

#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "engine/jinja_ast.h"

namespace fp4moe::engine::jinja {

struct EvalError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct Value {
  enum class Kind { kUndefined, kJson, kNamespace, kMacro };
  Kind kind = Kind::kUndefined;
  Json json;                    // kJson
  std::shared_ptr<Json> ns;     // kNamespace: a mutable object shared by every copy
  const Stmt* macro = nullptr;  // kMacro
  std::string undefined_name;   // kUndefined: what was looked up, for messages

  static Value undefined(std::string name = "") {
    Value v;
    v.undefined_name = std::move(name);
    return v;
  }
  static Value of(Json j) {
    Value v;
    v.kind = Kind::kJson;
    v.json = std::move(j);
    return v;
  }
  bool is_undefined() const { return kind == Kind::kUndefined; }
  bool is_json() const { return kind == Kind::kJson; }
  // The JSON value (a namespace reads as its object); throws EvalError for undefined/macros.
  const Json& as_json(const char* what) const;
};

struct Args {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keyword;
  // positional[i], else keyword `name`, else nullptr.
  const Value* get(size_t i, const char* name) const;
};

bool truthy(const Value& v);
bool equal(const Value& a, const Value& b);
// a < b for numbers and strings (throws EvalError otherwise).
bool less(const Json& a, const Json& b);

std::string py_str(const Value& v);   // {{ v }}
std::string py_repr(const Json& j);   // repr() as in lists and dicts
std::string to_json(const Json& j, int indent, bool ensure_ascii, bool sort_keys);

// Elements of an iterable: list items, dict keys (in order), string characters.
std::vector<Json> iterate(const Value& v);

Value apply_filter(const std::string& name, const Value& input, const Args& args);
bool apply_test(const std::string& name, const Value& input, const Args& args);
// Methods of strings (strip, split, startswith, ...), dicts (items, keys, values, get) and lists.
// Returns false when `object` has no such method (the caller then reports it).
bool call_method(const Json& object, const std::string& name, const Args& args, Value& result);

}  // namespace fp4moe::engine::jinja
