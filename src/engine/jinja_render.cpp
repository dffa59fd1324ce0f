// Renderer of the Jinja subset (see jinja_ast.h): scopes as in Jinja (for bodies and macro calls get
// their own frame; `set` inside a loop does not leak, hence namespace()), Python operator semantics,
// loop variables, macros and the HF globals. Errors carry name:line:column of the expression.
// Tested by tests/engine/test_chat_template.cpp.
#include <chrono>
#include <cmath>
#include <ctime>
#include <unordered_map>

#include "core/error.h"
#include "engine/jinja_ast.h"
#include "engine/jinja_builtins.h"
#include "engine/tokenizer_text.h"

namespace fp4moe::engine::jinja {

namespace {

constexpr int kMaxMacroDepth = 64;
constexpr int64_t kMaxRange = 1 << 20;

enum class Flow { kNormal, kBreak, kContinue };

class Renderer {
 public:
  Renderer(const Program& program, const Json& context) : p_(program) {
    frames_.emplace_back();
    if (!context.is_null()) {
      FP4MOE_CHECK(context.is_object()) << p_.name << ": the render context must be a JSON object";
      for (const auto& [k, v] : context.items()) frames_[0][k] = Value::of(v);
    }
  }

  std::string run() {
    std::string out;
    exec(p_.body, out);
    return out;
  }

 private:
  using Frame = std::unordered_map<std::string, Value>;

  [[noreturn]] void fail(size_t pos, const std::string& msg) const { throw Error(p_.where(pos) + ": " + msg); }

  Value lookup(const std::string& name) const {
    for (auto it = frames_.rbegin(); it != frames_.rend(); ++it) {
      auto hit = it->find(name);
      if (hit != it->end()) return hit->second;
    }
    return Value::undefined(name);
  }

  Flow exec(const Body& body, std::string& out) {
    for (const Stmt& s : body) {
      const Flow flow = exec(s, out);
      if (flow != Flow::kNormal) return flow;
    }
    return Flow::kNormal;
  }

  Flow exec(const Stmt& s, std::string& out) {
    switch (s.kind) {
      case Stmt::Kind::kText:
        out += s.text;
        return Flow::kNormal;
      case Stmt::Kind::kOutput:
        out += py_str(eval(*s.expr));
        return Flow::kNormal;
      case Stmt::Kind::kIf:
        for (const auto& [cond, body] : s.branches) {
          if (!cond || truthy(eval(*cond))) return exec(body, out);
        }
        return Flow::kNormal;
      case Stmt::Kind::kFor:
        exec_for(s, out);
        return Flow::kNormal;
      case Stmt::Kind::kSet:
        assign(s, eval(*s.expr));
        return Flow::kNormal;
      case Stmt::Kind::kSetBlock: {
        std::string captured;
        exec(s.body, captured);
        assign(s, Value::of(captured));
        return Flow::kNormal;
      }
      case Stmt::Kind::kMacro: {
        Value m;
        m.kind = Value::Kind::kMacro;
        m.macro = &s;
        frames_.back()[s.targets[0]] = m;
        return Flow::kNormal;
      }
      case Stmt::Kind::kBreak: return Flow::kBreak;
      case Stmt::Kind::kContinue: return Flow::kContinue;
      case Stmt::Kind::kScope: return exec(s.body, out);
    }
    return Flow::kNormal;
  }

  void assign(const Stmt& s, Value v) {
    if (s.targets.size() == 1) {
      frames_.back()[s.targets[0]] = std::move(v);
      return;
    }
    const Value target = lookup(s.targets[0]);
    if (target.kind != Value::Kind::kNamespace) {
      fail(s.pos, "cannot set '" + s.targets[0] + "." + s.targets[1] + "': '" + s.targets[0] + "' is not a namespace");
    }
    try {
      (*target.ns)[s.targets[1]] = v.as_json("set");
    } catch (const EvalError& e) {
      fail(s.pos, e.what());
    }
  }

  void exec_for(const Stmt& s, std::string& out) {
    std::vector<Json> items;
    try {
      items = iterate(eval(*s.expr));
    } catch (const EvalError& e) {
      fail(s.expr->pos, e.what());
    }
    auto bind = [&](Frame& frame, const Json& item) {
      if (s.targets.size() == 1) {
        frame[s.targets[0]] = Value::of(item);
        return;
      }
      if (!item.is_array() || item.size() != s.targets.size()) {
        fail(s.pos, "cannot unpack " + py_repr(item) + " into " + std::to_string(s.targets.size()) + " loop variables");
      }
      for (size_t i = 0; i < s.targets.size(); ++i) frame[s.targets[i]] = Value::of(item[i]);
    };
    if (s.filter) {
      std::vector<Json> kept;
      for (const Json& item : items) {
        frames_.emplace_back();
        bind(frames_.back(), item);
        const bool keep = truthy(eval(*s.filter));
        frames_.pop_back();
        if (keep) kept.push_back(item);
      }
      items = std::move(kept);
    }
    if (items.empty()) {
      exec(s.else_body, out);
      return;
    }
    const auto n = static_cast<int64_t>(items.size());
    for (int64_t i = 0; i < n; ++i) {
      frames_.emplace_back();
      bind(frames_.back(), items[i]);
      Json loop = {{"index", i + 1}, {"index0", i}, {"revindex", n - i}, {"revindex0", n - i - 1},
                   {"first", i == 0}, {"last", i == n - 1}, {"length", n}, {"depth", 1}, {"depth0", 0}};
      loop["previtem"] = i > 0 ? items[i - 1] : Json();
      loop["nextitem"] = i + 1 < n ? items[i + 1] : Json();
      frames_.back()["loop"] = Value::of(std::move(loop));
      const Flow flow = exec(s.body, out);
      frames_.pop_back();
      if (flow == Flow::kBreak) break;
    }
  }

  Args eval_args(const Expr& e, size_t first) {
    Args args;
    for (size_t i = first; i < e.args.size(); ++i) args.positional.push_back(eval(*e.args[i]));
    for (const auto& [k, v] : e.kwargs) args.keyword.emplace_back(k, eval(*v));
    return args;
  }

  Value eval(const Expr& e) {
    try {
      return eval_inner(e);
    } catch (const EvalError& err) {
      fail(e.pos, err.what());
    }
  }

  Value eval_inner(const Expr& e) {
    switch (e.kind) {
      case Expr::Kind::kLiteral: return Value::of(e.literal);
      case Expr::Kind::kName: return lookup(e.name);
      case Expr::Kind::kList: {
        Json out = Json::array();
        for (const ExprPtr& item : e.args) out.push_back(eval(*item).as_json("list item"));
        return Value::of(out);
      }
      case Expr::Kind::kDict: {
        Json out = Json::object();
        for (size_t i = 0; i + 1 < e.args.size(); i += 2) {
          const Value key = eval(*e.args[i]);
          out[py_str(key)] = eval(*e.args[i + 1]).as_json("dict value");
        }
        return Value::of(out);
      }
      case Expr::Kind::kAttr: {
        const Value object = eval(*e.args[0]);
        if (object.is_undefined()) {
          throw EvalError("'" + object.undefined_name + "' is undefined (reading ." + e.name + ")");
        }
        const Json& j = object.as_json("attribute");
        if (j.is_object() && j.contains(e.name)) return Value::of(j.at(e.name));
        return Value::undefined(e.name);
      }
      case Expr::Kind::kSubscript: return subscript(eval(*e.args[0]), eval(*e.args[1]));
      case Expr::Kind::kSlice: return slice(e);
      case Expr::Kind::kCall: return call(e);
      case Expr::Kind::kFilter: {
        const Value input = eval(*e.args[0]);
        return apply_filter(e.name, input, eval_args(e, 1));
      }
      case Expr::Kind::kTest: {
        const Value input = eval(*e.args[0]);
        return Value::of(apply_test(e.name, input, eval_args(e, 1)) != e.negated);
      }
      case Expr::Kind::kUnary: {
        const Value v = eval(*e.args[0]);
        if (e.name == "not") return Value::of(!truthy(v));
        const Json& j = v.as_json("unary operand");
        if (!j.is_number()) throw EvalError("bad operand for unary " + e.name + ": " + py_repr(j));
        if (e.name == "+") return v;
        return j.is_number_integer() ? Value::of(-j.get<int64_t>()) : Value::of(-j.get<double>());
      }
      case Expr::Kind::kBinary: return binary(e);
      case Expr::Kind::kCond: {
        if (truthy(eval(*e.args[0]))) return eval(*e.args[1]);
        return e.args[2] ? eval(*e.args[2]) : Value::undefined("conditional without else");
      }
    }
    throw EvalError("unknown expression");
  }

  static int64_t normalize_index(int64_t i, int64_t n) { return i < 0 ? i + n : i; }

  Value subscript(const Value& object, const Value& key) {
    if (object.is_undefined()) throw EvalError("'" + object.undefined_name + "' is undefined (subscripted)");
    const Json& j = object.as_json("subscript");
    const Json& k = key.as_json("subscript key");
    if (j.is_object()) {
      const std::string name = k.is_string() ? k.get<std::string>() : py_str(key);
      return j.contains(name) ? Value::of(j.at(name)) : Value::undefined(name);
    }
    if (!k.is_number_integer()) {
      if (k.is_string()) return Value::undefined(k.get<std::string>());  // attribute of a list/string
      throw EvalError("index must be an integer, got " + py_repr(k));
    }
    if (j.is_array()) {
      const int64_t i = normalize_index(k.get<int64_t>(), static_cast<int64_t>(j.size()));
      if (i < 0 || i >= static_cast<int64_t>(j.size())) return Value::undefined("index " + std::to_string(k.get<int64_t>()));
      return Value::of(j[static_cast<size_t>(i)]);
    }
    if (j.is_string()) {
      const std::vector<Json> chars = iterate(object);
      const int64_t i = normalize_index(k.get<int64_t>(), static_cast<int64_t>(chars.size()));
      if (i < 0 || i >= static_cast<int64_t>(chars.size())) return Value::undefined("index " + std::to_string(k.get<int64_t>()));
      return Value::of(chars[static_cast<size_t>(i)]);
    }
    throw EvalError(py_repr(j) + " is not subscriptable");
  }

  Value slice(const Expr& e) {
    const Value object = eval(*e.args[0]);
    const Json& j = object.as_json("slice");
    if (!j.is_array() && !j.is_string()) throw EvalError(py_repr(j) + " cannot be sliced");
    const std::vector<Json> items = iterate(object);
    const auto n = static_cast<int64_t>(items.size());
    auto part = [&](size_t i, bool& given) -> int64_t {
      given = false;
      if (!e.args[i]) return 0;
      const Value v = eval(*e.args[i]);
      if (v.is_json() && v.json.is_null()) return 0;
      const Json& x = v.as_json("slice bound");
      if (!x.is_number_integer()) throw EvalError("slice bounds must be integers, got " + py_repr(x));
      given = true;
      return x.get<int64_t>();
    };
    bool has_start, has_stop, has_step;
    int64_t start = part(1, has_start), stop = part(2, has_stop), step = part(3, has_step);
    if (!has_step) step = 1;
    if (step == 0) throw EvalError("slice step cannot be zero");
    // Python's PySlice_AdjustIndices.
    auto adjust = [&](int64_t v, bool given, int64_t fallback) {
      if (!given) return fallback;
      if (v < 0) v += n;
      if (v < 0) return step < 0 ? int64_t{-1} : int64_t{0};
      if (v >= n) return step < 0 ? n - 1 : n;
      return v;
    };
    start = adjust(start, has_start, step < 0 ? n - 1 : 0);
    stop = adjust(stop, has_stop, step < 0 ? -1 : n);
    Json out = Json::array();
    std::string s;
    for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
      if (j.is_string()) s += items[static_cast<size_t>(i)].get<std::string>();
      else out.push_back(items[static_cast<size_t>(i)]);
    }
    return j.is_string() ? Value::of(s) : Value::of(out);
  }

  Value binary(const Expr& e) {
    const std::string& op = e.name;
    if (op == "and") {
      Value a = eval(*e.args[0]);
      return truthy(a) ? eval(*e.args[1]) : a;
    }
    if (op == "or") {
      Value a = eval(*e.args[0]);
      return truthy(a) ? a : eval(*e.args[1]);
    }
    const Value a = eval(*e.args[0]);
    const Value b = eval(*e.args[1]);
    if (op == "~") return Value::of(py_str(a) + py_str(b));
    if (op == "==") return Value::of(equal(a, b));
    if (op == "!=") return Value::of(!equal(a, b));
    if (op == "in" || op == "not in") {
      Args args;
      args.positional.push_back(b);
      if (b.is_undefined()) return Value::of(op == "not in");
      return Value::of(apply_test("in", a, args) == (op == "in"));
    }
    const Json& x = a.as_json(("left operand of " + op).c_str());
    const Json& y = b.as_json(("right operand of " + op).c_str());
    if (op == "<") return Value::of(less(x, y));
    if (op == ">") return Value::of(less(y, x));
    if (op == "<=") return Value::of(!less(y, x));
    if (op == ">=") return Value::of(!less(x, y));
    if (op == "+") {
      if (x.is_string() && y.is_string()) return Value::of(x.get<std::string>() + y.get<std::string>());
      if (x.is_array() && y.is_array()) {
        Json out = x;
        for (const Json& item : y) out.push_back(item);
        return Value::of(out);
      }
    }
    if (op == "*" && (x.is_string() || y.is_string()) && (x.is_number_integer() || y.is_number_integer())) {
      const std::string& s = x.is_string() ? x.get_ref<const std::string&>() : y.get_ref<const std::string&>();
      const int64_t times = x.is_string() ? y.get<int64_t>() : x.get<int64_t>();
      std::string out;
      for (int64_t i = 0; i < times; ++i) out += s;
      return Value::of(out);
    }
    if (!x.is_number() || !y.is_number()) {
      throw EvalError("unsupported operands for " + op + ": " + py_repr(x) + " and " + py_repr(y));
    }
    const bool ints = x.is_number_integer() && y.is_number_integer();
    if (ints && op != "/" && op != "**") {
      const int64_t p = x.get<int64_t>(), q = y.get<int64_t>();
      if (op == "+") return Value::of(p + q);
      if (op == "-") return Value::of(p - q);
      if (op == "*") return Value::of(p * q);
      if (q == 0) throw EvalError("integer division or modulo by zero");
      int64_t quot = p / q, rem = p % q;
      if (rem != 0 && ((rem < 0) != (q < 0))) {  // Python floors
        --quot;
        rem += q;
      }
      return Value::of(op == "//" ? quot : rem);
    }
    const double p = x.get<double>(), q = y.get<double>();
    if (op == "+") return Value::of(p + q);
    if (op == "-") return Value::of(p - q);
    if (op == "*") return Value::of(p * q);
    if (op == "**") {
      const double r = std::pow(p, q);
      return ints && q >= 0 ? Value::of(static_cast<int64_t>(r)) : Value::of(r);
    }
    if (q == 0) throw EvalError("division by zero");
    if (op == "/") return Value::of(p / q);
    if (op == "//") return Value::of(std::floor(p / q));
    return Value::of(p - q * std::floor(p / q));
  }

  Value call(const Expr& e) {
    const Expr& callee = *e.args[0];
    if (callee.kind == Expr::Kind::kAttr) {
      const Value object = eval(*callee.args[0]);
      if (object.is_undefined()) {
        throw EvalError("'" + object.undefined_name + "' is undefined (calling ." + callee.name + "())");
      }
      const Args args = eval_args(e, 1);
      Value result;
      if (object.is_json() && call_method(object.json, callee.name, args, result)) return result;
      throw EvalError("no method '" + callee.name + "' on " + py_repr(object.as_json("method call")));
    }
    if (callee.kind != Expr::Kind::kName) throw EvalError("this expression cannot be called");
    const Value target = lookup(callee.name);
    const Args args = eval_args(e, 1);
    if (target.kind == Value::Kind::kMacro) return call_macro(*target.macro, args);
    if (!target.is_undefined()) throw EvalError("'" + callee.name + "' is not callable");
    const std::string& fn = callee.name;
    if (fn == "raise_exception") {
      const std::string msg = args.positional.empty() ? "" : py_str(args.positional[0]);
      throw Error(p_.where(e.pos) + ": raise_exception: " + msg);
    }
    if (fn == "namespace" || fn == "dict") {
      Json obj = Json::object();
      for (const Value& v : args.positional) {
        const Json& j = v.as_json(fn.c_str());
        if (!j.is_object()) throw EvalError(fn + "() positional argument must be a mapping, got " + py_repr(j));
        for (const auto& [k, x] : j.items()) obj[k] = x;
      }
      for (const auto& [k, v] : args.keyword) obj[k] = v.as_json(fn.c_str());
      if (fn == "dict") return Value::of(obj);
      Value ns;
      ns.kind = Value::Kind::kNamespace;
      ns.ns = std::make_shared<Json>(std::move(obj));
      return ns;
    }
    if (fn == "range") {
      std::vector<int64_t> bounds;
      for (const Value& v : args.positional) {
        const Json& j = v.as_json("range");
        if (!j.is_number_integer()) throw EvalError("range() needs integers, got " + py_repr(j));
        bounds.push_back(j.get<int64_t>());
      }
      if (bounds.empty() || bounds.size() > 3) throw EvalError("range() takes 1 to 3 arguments");
      const int64_t start = bounds.size() == 1 ? 0 : bounds[0];
      const int64_t stop = bounds.size() == 1 ? bounds[0] : bounds[1];
      const int64_t step = bounds.size() == 3 ? bounds[2] : 1;
      if (step == 0) throw EvalError("range() step must not be zero");
      Json out = Json::array();
      for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
        out.push_back(i);
        if (static_cast<int64_t>(out.size()) > kMaxRange) throw EvalError("range() longer than " + std::to_string(kMaxRange));
      }
      return Value::of(out);
    }
    if (fn == "strftime_now") {
      const std::string format = args.positional.empty() ? "%Y-%m-%d" : py_str(args.positional[0]);
      const std::time_t now = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
      std::tm tm{};
      localtime_r(&now, &tm);
      char buf[256];
      const size_t n = std::strftime(buf, sizeof(buf), format.c_str(), &tm);
      return Value::of(std::string(buf, n));
    }
    throw EvalError("'" + fn + "' is undefined (called as a function)");
  }

  Value call_macro(const Stmt& m, const Args& args) {
    if (args.positional.size() > m.params.size()) {
      throw EvalError("macro '" + m.targets[0] + "' takes " + std::to_string(m.params.size()) + " arguments, got " +
                      std::to_string(args.positional.size()));
    }
    if (depth_ >= kMaxMacroDepth) throw EvalError("macro recursion deeper than " + std::to_string(kMaxMacroDepth));
    Frame frame;
    for (size_t i = 0; i < m.params.size(); ++i) {
      const auto& [name, def] = m.params[i];
      const Value* given = args.get(i, name.c_str());
      frame[name] = given ? *given : def ? eval(*def) : Value::undefined(name);
    }
    for (const auto& [k, v] : args.keyword) {
      bool known = false;
      for (const auto& [name, def] : m.params) known = known || name == k;
      if (!known) throw EvalError("macro '" + m.targets[0] + "' has no parameter '" + k + "'");
    }
    // A macro sees the template's top-level names and its arguments, not the caller's locals.
    std::vector<Frame> saved;
    saved.swap(frames_);
    frames_.push_back(saved.front());
    frames_.push_back(std::move(frame));
    ++depth_;
    std::string out;
    try {
      exec(m.body, out);
    } catch (...) {
      --depth_;
      frames_.swap(saved);
      throw;
    }
    --depth_;
    // Macros defined or names set at the top level inside the macro do not leak out.
    frames_.swap(saved);
    return Value::of(out);
  }

  const Program& p_;
  std::vector<Frame> frames_;
  int depth_ = 0;
};

}  // namespace

std::string render(const Program& program, const Json& context) { return Renderer(program, context).run(); }

}  // namespace fp4moe::engine::jinja
