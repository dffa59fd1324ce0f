// The Jinja subset of chat templates: syntax tree, parser entry point and renderer entry point.
//
//   auto program = jinja::parse(source, "chat_template");   // throws with line:column on anything unsupported
//   std::string text = jinja::render(*program, context);     // context: ordered JSON object of variables
//
// Supported (what real GLM / Qwen / DeepSeek / Llama chat templates use): {{ }}, {% %}, {# #}, `-`/`+`
// whitespace control with HF's trim_blocks + lstrip_blocks, raw; if/elif/else, for (tuple targets,
// `if` filter, else, loop.*), break/continue, set (names, ns.attr, blocks), namespace(), macros,
// generation blocks; literals, subscripts and slices, attributes, methods of str/dict, filters, tests,
// `in`, `~`, arithmetic, comparisons, conditional expressions, raise_exception. Values are
// nlohmann::ordered_json (so tojson keeps key order) plus undefined, namespaces and macros.
// Parsed by jinja_parser.cpp, rendered by jinja_render.cpp with builtins in jinja_builtins.cpp.
// Tested by tests/engine/test_chat_template.cpp.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace fp4moe::engine::jinja {

using Json = nlohmann::ordered_json;

struct Expr;
using ExprPtr = std::shared_ptr<const Expr>;

struct Expr {
  enum class Kind {
    kLiteral,    // literal
    kName,       // name
    kList,       // args = items
    kDict,       // args = key0, value0, key1, value1, ...
    kAttr,       // args[0].name
    kSubscript,  // args[0][args[1]]
    kSlice,      // args[0][args[1]:args[2]:args[3]] (null parts allowed)
    kCall,       // args[0](args[1..], kwargs)
    kFilter,     // args[0] | name(args[1..], kwargs)
    kTest,       // args[0] is [not] name(args[1..])
    kUnary,      // name in {not, -, +}; args[0]
    kBinary,     // name is the operator; args[0], args[1]
    kCond,       // args[1] if args[0] else args[2] (args[2] may be null)
  };
  Kind kind = Kind::kLiteral;
  size_t pos = 0;  // byte offset in the template source
  Json literal;
  std::string name;
  std::vector<ExprPtr> args;
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
  bool negated = false;  // `is not`
};

struct Stmt;
using Body = std::vector<Stmt>;

struct Stmt {
  enum class Kind { kText, kOutput, kIf, kFor, kSet, kSetBlock, kMacro, kBreak, kContinue, kScope };
  Kind kind = Kind::kText;
  size_t pos = 0;
  std::string text;                                // kText
  ExprPtr expr;                                    // kOutput, kFor (iterable), kSet (value)
  std::vector<std::pair<ExprPtr, Body>> branches;  // kIf: (condition, or null for else; body)
  std::vector<std::string> targets;                // kFor loop variables; kSet/kSetBlock: {name} or {ns, attr}; kMacro: {name}
  ExprPtr filter;                                  // kFor `if` clause
  Body body, else_body;                            // kFor, kSetBlock, kMacro, kScope
  std::vector<std::pair<std::string, ExprPtr>> params;  // kMacro (default may be null)
};

struct Program {
  std::string name;    // for messages, e.g. "chat_template"
  std::string source;  // after Jinja's trailing-newline removal
  Body body;
  // "name:line:column" of a byte offset, for errors.
  std::string where(size_t pos) const;
};

// Parses a template with HF's settings (trim_blocks, lstrip_blocks, no trailing newline).
std::shared_ptr<const Program> parse(std::string_view source, const std::string& name = "template");

// Renders with the given top-level variables (a JSON object) and these globals: raise_exception,
// namespace, range, dict, strftime_now. raise_exception throws fp4moe::Error with "raise_exception: ".
std::string render(const Program& program, const Json& context);

}  // namespace fp4moe::engine::jinja
