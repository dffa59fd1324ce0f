// Lexer and recursive-descent parser of the Jinja subset (see jinja_ast.h). Whitespace control follows
// Jinja with HF's environment: trim_blocks (drop the newline after %} and #}), lstrip_blocks (drop the
// spaces/tabs before {% and {# on their line), `-` strips all whitespace, `+` turns both off, and one
// trailing newline of the source is dropped. Unsupported statements, filters and tests fail here with
// name:line:column. Tested by tests/engine/test_chat_template.cpp.
#include <algorithm>
#include <set>

#include "core/error.h"
#include "engine/jinja_ast.h"
#include "engine/tokenizer_text.h"

namespace fp4moe::engine::jinja {

namespace {

enum class Tok { kText, kVarBegin, kVarEnd, kBlockBegin, kBlockEnd, kName, kString, kInt, kFloat, kOp, kEof };

struct Token {
  Tok type;
  std::string value;
  size_t pos;
};

const std::set<std::string>& supported_filters() {
  static const std::set<std::string> names = {
      "trim", "strip", "length", "count", "tojson", "string", "upper", "lower", "default", "d", "join", "items",
      "replace", "first", "last", "list", "int", "float", "abs", "capitalize", "title", "safe", "reverse",
      "map", "select", "reject", "selectattr", "rejectattr", "unique", "sort", "dictsort", "sum", "min", "max", "round", "indent",
      "wordcount", "e", "escape", "attr"};
  return names;
}

const std::set<std::string>& supported_tests() {
  static const std::set<std::string> names = {
      "defined", "undefined", "none", "string", "mapping", "iterable", "sequence", "number", "integer", "float",
      "boolean", "true", "false", "odd", "even", "divisibleby", "equalto", "eq", "==", "ne", "!=", "lt", "<",
      "gt", ">", "le", "<=", "ge", ">=", "in", "lower", "upper", "callable", "sameas"};
  return names;
}

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

class Lexer {
 public:
  explicit Lexer(const Program& program) : p_(program), src_(program.source) {}

  std::vector<Token> run() {
    size_t i = 0;
    bool strip_next_all = false, trim_next_newline = false;
    while (i <= src_.size()) {
      size_t j = i;
      while (true) {
        j = src_.find('{', j);
        if (j == std::string::npos || j + 1 >= src_.size()) {
          j = std::string::npos;
          break;
        }
        const char k = src_[j + 1];
        if (k == '{' || k == '%' || k == '#') break;
        ++j;
      }
      const size_t text_end = j == std::string::npos ? src_.size() : j;
      std::string text = src_.substr(i, text_end - i);
      if (strip_next_all) {
        size_t s = 0;
        while (s < text.size() && is_space(text[s])) ++s;
        text.erase(0, s);
      } else if (trim_next_newline && !text.empty() && text[0] == '\n') {
        text.erase(0, 1);
      } else if (trim_next_newline && text.rfind("\r\n", 0) == 0) {
        text.erase(0, 2);
      }
      strip_next_all = trim_next_newline = false;
      if (j == std::string::npos) {
        push_text(std::move(text), i);
        break;
      }
      const char kind = src_[j + 1];
      size_t k = j + 2;
      const bool left_minus = k < src_.size() && src_[k] == '-';
      const bool left_plus = k < src_.size() && src_[k] == '+';
      if (left_minus || left_plus) ++k;
      if (left_minus) {
        while (!text.empty() && is_space(text.back())) text.pop_back();
      } else if ((kind == '%' || kind == '#') && !left_plus) {
        // lstrip_blocks: only spaces/tabs between the line start and the tag.
        const size_t nl = src_.rfind('\n', j == 0 ? 0 : j - 1);
        const size_t line_start = (nl == std::string::npos || j == 0) ? 0 : nl + 1;
        const bool only_blank = std::all_of(src_.begin() + line_start, src_.begin() + j,
                                            [](char c) { return c == ' ' || c == '\t'; });
        if (only_blank && line_start >= i) text.resize(text.size() - std::min(text.size(), j - line_start));
      }
      if (kind == '#') {
        const size_t end = src_.find("#}", k);
        if (end == std::string::npos) fail_at(j, "unclosed comment");
        push_text(std::move(text), i);
        set_right_flags(end > k ? src_[end - 1] : ' ', true, strip_next_all, trim_next_newline);
        i = end + 2;
        continue;
      }
      push_text(std::move(text), i);
      const bool block = kind == '%';
      tokens_.push_back({block ? Tok::kBlockBegin : Tok::kVarBegin, "", j});
      const size_t begin_index = tokens_.size();
      char right = ' ';
      i = lex_tag(k, block, right);
      tokens_.push_back({block ? Tok::kBlockEnd : Tok::kVarEnd, "", i - 2});
      set_right_flags(right, block, strip_next_all, trim_next_newline);
      if (block && tokens_.size() == begin_index + 2 && tokens_[begin_index].value == "raw" &&
          tokens_[begin_index].type == Tok::kName) {
        tokens_.resize(begin_index - 1);  // drop {% raw %}: its body is text up to {% endraw %}
        i = lex_raw(i, j, strip_next_all, trim_next_newline);
      }
    }
    tokens_.push_back({Tok::kEof, "", src_.size()});
    return std::move(tokens_);
  }

 private:
  [[noreturn]] void fail_at(size_t pos, const std::string& msg) const { throw Error(p_.where(pos) + ": " + msg); }

  void push_text(std::string text, size_t pos) {
    if (!text.empty()) tokens_.push_back({Tok::kText, std::move(text), pos});
  }

  static void set_right_flags(char right, bool block, bool& strip_all, bool& trim_newline) {
    strip_all = right == '-';
    trim_newline = block && right != '-' && right != '+';
  }

  size_t lex_raw(size_t i, size_t raw_pos, bool& strip_all, bool& trim_newline) {
    size_t search = i;
    while (true) {
      const size_t open = src_.find("{%", search);
      if (open == std::string::npos) fail_at(raw_pos, "{% raw %} without {% endraw %}");
      size_t k = open + 2;
      if (k < src_.size() && (src_[k] == '-' || src_[k] == '+')) ++k;
      while (k < src_.size() && is_space(src_[k])) ++k;
      if (src_.compare(k, 6, "endraw") != 0) {
        search = open + 2;
        continue;
      }
      k += 6;
      while (k < src_.size() && is_space(src_[k])) ++k;
      char right = ' ';
      if (k < src_.size() && (src_[k] == '-' || src_[k] == '+')) right = src_[k++];
      if (src_.compare(k, 2, "%}") != 0) fail_at(open, "malformed {% endraw %}");
      std::string body = src_.substr(i, open - i);
      if (strip_all) body.erase(0, std::find_if(body.begin(), body.end(), [](char c) { return !is_space(c); }) - body.begin());
      else if (trim_newline && !body.empty() && body[0] == '\n') body.erase(0, 1);
      if (src_[open + 2] == '-') while (!body.empty() && is_space(body.back())) body.pop_back();
      push_text(std::move(body), i);
      set_right_flags(right, true, strip_all, trim_newline);
      return k + 2;
    }
  }

  // Expression tokens of one tag; returns the offset after its closing `}}` / `%}`.
  size_t lex_tag(size_t k, bool block, char& right) {
    const char close = block ? '%' : '}';
    while (true) {
      while (k < src_.size() && is_space(src_[k])) ++k;
      if (k >= src_.size()) fail_at(tokens_.back().pos, block ? "unclosed {%" : "unclosed {{");
      const char c = src_[k];
      if ((c == '-' || c == '+') && k + 2 < src_.size() && src_[k + 1] == close && src_[k + 2] == '}') {
        right = c;
        return k + 3;
      }
      if (c == close && k + 1 < src_.size() && src_[k + 1] == '}') return k + 2;
      if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
        size_t e = k;
        while (e < src_.size() && (std::isalnum(static_cast<unsigned char>(src_[e])) || src_[e] == '_')) ++e;
        tokens_.push_back({Tok::kName, src_.substr(k, e - k), k});
        k = e;
      } else if (std::isdigit(static_cast<unsigned char>(c))) {
        size_t e = k;
        while (e < src_.size() && std::isdigit(static_cast<unsigned char>(src_[e]))) ++e;
        bool is_float = false;
        if (e + 1 < src_.size() && src_[e] == '.' && std::isdigit(static_cast<unsigned char>(src_[e + 1]))) {
          is_float = true;
          ++e;
          while (e < src_.size() && std::isdigit(static_cast<unsigned char>(src_[e]))) ++e;
        }
        if (e < src_.size() && (src_[e] == 'e' || src_[e] == 'E')) {
          size_t f = e + 1;
          if (f < src_.size() && (src_[f] == '+' || src_[f] == '-')) ++f;
          if (f < src_.size() && std::isdigit(static_cast<unsigned char>(src_[f]))) {
            is_float = true;
            e = f;
            while (e < src_.size() && std::isdigit(static_cast<unsigned char>(src_[e]))) ++e;
          }
        }
        tokens_.push_back({is_float ? Tok::kFloat : Tok::kInt, src_.substr(k, e - k), k});
        k = e;
      } else if (c == '\'' || c == '"') {
        k = lex_string(k);
      } else {
        static const char* kOps[] = {"//", "**", "==", "!=", "<=", ">=", "+", "-", "*", "/", "%", "~", "<", ">",
                                     "=", "(", ")", "[", "]", "{", "}", ".", ",", ":", "|"};
        bool found = false;
        for (const char* op : kOps) {
          const size_t n = std::char_traits<char>::length(op);
          if (src_.compare(k, n, op) == 0) {
            tokens_.push_back({Tok::kOp, op, k});
            k += n;
            found = true;
            break;
          }
        }
        if (!found) fail_at(k, std::string("unexpected character '") + c + "'");
      }
    }
  }

  // Python-style escapes, as Jinja decodes string literals.
  size_t lex_string(size_t k) {
    const char quote = src_[k];
    std::string value;
    size_t e = k + 1;
    while (true) {
      if (e >= src_.size()) fail_at(k, "unterminated string literal");
      const char c = src_[e];
      if (c == quote) break;
      if (c != '\\' || e + 1 >= src_.size()) {
        value.push_back(c);
        ++e;
        continue;
      }
      const char n = src_[e + 1];
      e += 2;
      switch (n) {
        case 'n': value.push_back('\n'); break;
        case 't': value.push_back('\t'); break;
        case 'r': value.push_back('\r'); break;
        case '0': value.push_back('\0'); break;
        case 'a': value.push_back('\a'); break;
        case 'b': value.push_back('\b'); break;
        case 'f': value.push_back('\f'); break;
        case 'v': value.push_back('\v'); break;
        case '\\': case '\'': case '"': value.push_back(n); break;
        case '\n': break;  // line continuation
        case 'x': case 'u': case 'U': {
          const size_t digits = n == 'x' ? 2 : n == 'u' ? 4 : 8;
          if (e + digits > src_.size()) fail_at(e - 2, std::string("truncated \\") + n + " escape");
          const char32_t cp = static_cast<char32_t>(std::stoul(src_.substr(e, digits), nullptr, 16));
          text::append_utf8(value, cp);
          e += digits;
          break;
        }
        default:  // unknown escapes stay as written
          value.push_back('\\');
          value.push_back(n);
      }
    }
    tokens_.push_back({Tok::kString, std::move(value), k});
    return e + 1;
  }

  const Program& p_;
  const std::string& src_;
  std::vector<Token> tokens_;
};

class Parser {
 public:
  Parser(const Program& program, std::vector<Token> tokens) : p_(program), t_(std::move(tokens)) {}

  Body parse_template() {
    std::string stop;
    Body body = parse_body({}, stop);
    return body;
  }

 private:
  const Token& peek(size_t ahead = 0) const { return t_[std::min(i_ + ahead, t_.size() - 1)]; }
  const Token& next() { return t_[std::min(i_++, t_.size() - 1)]; }
  bool at_op(const char* op) const { return peek().type == Tok::kOp && peek().value == op; }
  bool at_name(const char* name) const { return peek().type == Tok::kName && peek().value == name; }
  [[noreturn]] void fail(size_t pos, const std::string& msg) const { throw Error(p_.where(pos) + ": " + msg); }
  void expect_op(const char* op) {
    if (!at_op(op)) fail(peek().pos, std::string("expected '") + op + "', found " + describe(peek()));
    ++i_;
  }
  std::string expect_name() {
    if (peek().type != Tok::kName) fail(peek().pos, "expected a name, found " + describe(peek()));
    return next().value;
  }
  void expect_block_end() {
    if (peek().type != Tok::kBlockEnd) fail(peek().pos, "expected '%}', found " + describe(peek()));
    ++i_;
  }
  static std::string describe(const Token& t) {
    switch (t.type) {
      case Tok::kEof: return "end of template";
      case Tok::kBlockEnd: return "'%}'";
      case Tok::kVarEnd: return "'}}'";
      case Tok::kText: return "text";
      default: return "'" + t.value + "'";
    }
  }

  // Statements until a {% <stop word> %}; `stop` receives the word (its tag is consumed up to the name).
  Body parse_body(const std::set<std::string>& stops, std::string& stop) {
    Body body;
    while (true) {
      const Token& t = peek();
      if (t.type == Tok::kEof) {
        if (!stops.empty()) {
          std::string expected;
          for (const std::string& w : stops) expected += " {% " + w + " %}";
          fail(t.pos, "unexpected end of template; expected one of" + expected);
        }
        return body;
      }
      if (t.type == Tok::kText) {
        Stmt s;
        s.kind = Stmt::Kind::kText;
        s.pos = t.pos;
        s.text = next().value;
        body.push_back(std::move(s));
      } else if (t.type == Tok::kVarBegin) {
        next();
        Stmt s;
        s.kind = Stmt::Kind::kOutput;
        s.pos = peek().pos;
        s.expr = parse_expr();
        if (peek().type != Tok::kVarEnd) fail(peek().pos, "expected '}}', found " + describe(peek()));
        next();
        body.push_back(std::move(s));
      } else if (t.type == Tok::kBlockBegin) {
        next();
        const Token& kw = peek();
        if (kw.type == Tok::kName && stops.count(kw.value)) {
          stop = next().value;
          return body;
        }
        body.push_back(parse_statement());
      } else {
        fail(t.pos, "unexpected " + describe(t));
      }
    }
  }

  Stmt parse_statement() {
    const Token kw = peek();
    if (kw.type != Tok::kName) fail(kw.pos, "expected a statement name, found " + describe(kw));
    next();
    Stmt s;
    s.pos = kw.pos;
    const std::string& name = kw.value;
    std::string stop;
    if (name == "if") {
      s.kind = Stmt::Kind::kIf;
      ExprPtr cond = parse_expr();
      while (true) {
        expect_block_end();
        Body body = parse_body({"elif", "else", "endif"}, stop);
        s.branches.emplace_back(cond, std::move(body));
        if (stop == "endif") break;
        if (stop == "else") {
          expect_block_end();
          s.branches.emplace_back(nullptr, parse_body({"endif"}, stop));
          break;
        }
        cond = parse_expr();
      }
      expect_block_end();
    } else if (name == "for") {
      s.kind = Stmt::Kind::kFor;
      s.targets.push_back(expect_name());
      while (at_op(",")) {
        next();
        s.targets.push_back(expect_name());
      }
      if (!at_name("in")) fail(peek().pos, "expected 'in' in for loop, found " + describe(peek()));
      next();
      s.expr = parse_or();
      if (at_name("if")) {
        next();
        s.filter = parse_or();
      }
      if (at_name("recursive")) fail(peek().pos, "recursive for loops are not supported");
      expect_block_end();
      ++loop_depth_;
      s.body = parse_body({"else", "endfor"}, stop);
      --loop_depth_;
      if (stop == "else") {
        expect_block_end();
        s.else_body = parse_body({"endfor"}, stop);
      }
      expect_block_end();
    } else if (name == "set") {
      s.targets.push_back(expect_name());
      if (at_op(".")) {
        next();
        s.targets.push_back(expect_name());
      }
      if (at_op(",")) fail(peek().pos, "tuple assignment in set is not supported");
      if (at_op("=")) {
        next();
        s.kind = Stmt::Kind::kSet;
        s.expr = parse_expr();
        expect_block_end();
      } else {
        s.kind = Stmt::Kind::kSetBlock;
        expect_block_end();
        s.body = parse_body({"endset"}, stop);
        expect_block_end();
      }
    } else if (name == "macro") {
      s.kind = Stmt::Kind::kMacro;
      s.targets.push_back(expect_name());
      expect_op("(");
      while (!at_op(")")) {
        std::string param = expect_name();
        ExprPtr def;
        if (at_op("=")) {
          next();
          def = parse_expr();
        }
        s.params.emplace_back(std::move(param), def);
        if (!at_op(",")) break;
        next();
      }
      expect_op(")");
      expect_block_end();
      s.body = parse_body({"endmacro"}, stop);
      if (peek().type == Tok::kName && peek().value == s.targets[0]) next();
      expect_block_end();
    } else if (name == "break" || name == "continue") {
      if (loop_depth_ == 0) fail(kw.pos, "'" + name + "' outside a for loop");
      s.kind = name == "break" ? Stmt::Kind::kBreak : Stmt::Kind::kContinue;
      expect_block_end();
    } else if (name == "generation") {  // HF's AssistantTracker extension: renders its body unchanged
      s.kind = Stmt::Kind::kScope;
      expect_block_end();
      s.body = parse_body({"endgeneration"}, stop);
      expect_block_end();
    } else {
      static const std::set<std::string> known_unsupported = {
          "include", "import", "from", "extends", "block", "call", "filter", "with", "autoescape", "do", "trans"};
      if (known_unsupported.count(name)) fail(kw.pos, "unsupported statement '" + name + "'");
      fail(kw.pos, "unknown or misplaced statement '" + name + "'");
    }
    return s;
  }

  static ExprPtr make(Expr::Kind kind, size_t pos, std::string name, std::vector<ExprPtr> args) {
    auto e = std::make_shared<Expr>();
    e->kind = kind;
    e->pos = pos;
    e->name = std::move(name);
    e->args = std::move(args);
    return e;
  }

  ExprPtr parse_expr() {
    ExprPtr value = parse_or();
    while (at_name("if")) {
      const size_t pos = next().pos;
      ExprPtr cond = parse_or();
      ExprPtr otherwise;
      if (at_name("else")) {
        next();
        otherwise = parse_expr();
      }
      value = make(Expr::Kind::kCond, pos, "", {cond, value, otherwise});
    }
    return value;
  }

  ExprPtr parse_or() {
    ExprPtr left = parse_and();
    while (at_name("or")) {
      const size_t pos = next().pos;
      left = make(Expr::Kind::kBinary, pos, "or", {left, parse_and()});
    }
    return left;
  }

  ExprPtr parse_and() {
    ExprPtr left = parse_not();
    while (at_name("and")) {
      const size_t pos = next().pos;
      left = make(Expr::Kind::kBinary, pos, "and", {left, parse_not()});
    }
    return left;
  }

  ExprPtr parse_not() {
    if (at_name("not")) {
      const size_t pos = next().pos;
      return make(Expr::Kind::kUnary, pos, "not", {parse_not()});
    }
    return parse_compare();
  }

  ExprPtr parse_compare() {
    ExprPtr left = parse_math1();
    while (true) {
      const Token& t = peek();
      std::string op;
      if (t.type == Tok::kOp && (t.value == "==" || t.value == "!=" || t.value == "<" || t.value == "<=" ||
                                 t.value == ">" || t.value == ">=")) {
        op = t.value;
        next();
      } else if (at_name("in")) {
        op = "in";
        next();
      } else if (at_name("not") && peek(1).type == Tok::kName && peek(1).value == "in") {
        op = "not in";
        next();
        next();
      } else {
        return left;
      }
      left = make(Expr::Kind::kBinary, t.pos, op, {left, parse_math1()});
    }
  }

  ExprPtr parse_math1() {
    ExprPtr left = parse_concat();
    while (at_op("+") || at_op("-")) {
      const Token& t = next();
      left = make(Expr::Kind::kBinary, t.pos, t.value, {left, parse_concat()});
    }
    return left;
  }

  ExprPtr parse_concat() {
    ExprPtr left = parse_math2();
    while (at_op("~")) {
      const size_t pos = next().pos;
      left = make(Expr::Kind::kBinary, pos, "~", {left, parse_math2()});
    }
    return left;
  }

  ExprPtr parse_math2() {
    ExprPtr left = parse_pow();
    while (at_op("*") || at_op("/") || at_op("//") || at_op("%")) {
      const Token& t = next();
      left = make(Expr::Kind::kBinary, t.pos, t.value, {left, parse_pow()});
    }
    return left;
  }

  ExprPtr parse_pow() {
    ExprPtr left = parse_unary(true);
    while (at_op("**")) {
      const size_t pos = next().pos;
      left = make(Expr::Kind::kBinary, pos, "**", {left, parse_unary(true)});
    }
    return left;
  }

  ExprPtr parse_unary(bool with_filter) {
    ExprPtr node;
    if (at_op("-") || at_op("+")) {
      const Token& t = next();
      node = make(Expr::Kind::kUnary, t.pos, t.value, {parse_unary(false)});
    } else {
      node = parse_postfix(parse_primary());
    }
    return with_filter ? parse_filters(node) : node;
  }

  ExprPtr parse_primary() {
    const Token t = next();
    auto lit = [&](Json v) {
      auto e = std::make_shared<Expr>();
      e->kind = Expr::Kind::kLiteral;
      e->pos = t.pos;
      e->literal = std::move(v);
      return e;
    };
    switch (t.type) {
      case Tok::kName:
        if (t.value == "true" || t.value == "True") return lit(true);
        if (t.value == "false" || t.value == "False") return lit(false);
        if (t.value == "none" || t.value == "None") return lit(nullptr);
        return make(Expr::Kind::kName, t.pos, t.value, {});
      case Tok::kString: {
        std::string s = t.value;
        while (peek().type == Tok::kString) s += next().value;  // adjacent literals concatenate
        return lit(s);
      }
      case Tok::kInt:
        return lit(Json(std::stoll(t.value)));
      case Tok::kFloat:
        return lit(Json(std::stod(t.value)));
      case Tok::kOp:
        if (t.value == "(") {
          if (at_op(")")) {
            next();
            return make(Expr::Kind::kList, t.pos, "", {});
          }
          ExprPtr inner = parse_expr();
          if (at_op(",")) {  // tuple: a list here
            std::vector<ExprPtr> items{inner};
            while (at_op(",")) {
              next();
              if (at_op(")")) break;
              items.push_back(parse_expr());
            }
            expect_op(")");
            return make(Expr::Kind::kList, t.pos, "", std::move(items));
          }
          expect_op(")");
          return inner;
        }
        if (t.value == "[") {
          std::vector<ExprPtr> items;
          while (!at_op("]")) {
            items.push_back(parse_expr());
            if (!at_op(",")) break;
            next();
          }
          expect_op("]");
          return make(Expr::Kind::kList, t.pos, "", std::move(items));
        }
        if (t.value == "{") {
          std::vector<ExprPtr> items;
          while (!at_op("}")) {
            items.push_back(parse_expr());
            expect_op(":");
            items.push_back(parse_expr());
            if (!at_op(",")) break;
            next();
          }
          expect_op("}");
          return make(Expr::Kind::kDict, t.pos, "", std::move(items));
        }
        break;
      default:
        break;
    }
    fail(t.pos, "unexpected " + describe(t) + " in expression");
  }

  ExprPtr parse_postfix(ExprPtr node) {
    while (true) {
      if (at_op(".")) {
        const size_t pos = next().pos;
        if (peek().type == Tok::kInt) {
          auto index = std::make_shared<Expr>();
          index->kind = Expr::Kind::kLiteral;
          index->pos = peek().pos;
          index->literal = std::stoll(next().value);
          node = make(Expr::Kind::kSubscript, pos, "", {node, index});
        } else {
          const size_t name_pos = peek().pos;
          node = make(Expr::Kind::kAttr, name_pos, expect_name(), {node});
        }
      } else if (at_op("[")) {
        const size_t pos = next().pos;
        ExprPtr parts[3];
        int n_colons = 0;
        while (true) {
          if (at_op(":")) {
            if (++n_colons > 2) fail(peek().pos, "too many ':' in slice");
            next();
            continue;
          }
          if (at_op("]")) break;
          parts[n_colons] = parse_expr();
          if (!at_op(":") && !at_op("]")) fail(peek().pos, "expected ':' or ']', found " + describe(peek()));
        }
        next();
        if (n_colons == 0) {
          if (!parts[0]) fail(pos, "empty subscript");
          node = make(Expr::Kind::kSubscript, pos, "", {node, parts[0]});
        } else {
          node = make(Expr::Kind::kSlice, pos, "", {node, parts[0], parts[1], parts[2]});
        }
      } else if (at_op("(")) {
        node = parse_call(node);
      } else {
        return node;
      }
    }
  }

  // `(`args`)` after a callee/filter/test; positional args go after `head` in args.
  ExprPtr parse_call(ExprPtr callee) {
    next();
    auto e = std::make_shared<Expr>();
    e->kind = Expr::Kind::kCall;
    e->pos = callee->pos;  // errors point at the function or method name
    e->args.push_back(std::move(callee));
    parse_args(*e);
    return e;
  }

  void parse_args(Expr& e) {
    while (!at_op(")")) {
      if (peek().type == Tok::kName && peek(1).type == Tok::kOp && peek(1).value == "=") {
        std::string key = next().value;
        next();
        e.kwargs.emplace_back(std::move(key), parse_expr());
      } else {
        if (!e.kwargs.empty()) fail(peek().pos, "positional argument after keyword argument");
        e.args.push_back(parse_expr());
      }
      if (!at_op(",")) break;
      next();
    }
    expect_op(")");
  }

  ExprPtr parse_filters(ExprPtr node) {
    while (true) {
      if (at_op("|")) {
        next();
        const Token& name = peek();
        std::string filter = expect_name();
        if (!supported_filters().count(filter)) fail(name.pos, "unsupported filter '" + filter + "'");
        auto e = std::make_shared<Expr>();
        e->kind = Expr::Kind::kFilter;
        e->pos = name.pos;
        e->name = filter;
        e->args.push_back(node);
        if (at_op("(")) {
          next();
          parse_args(*e);
        }
        node = e;
      } else if (at_name("is")) {
        next();
        auto e = std::make_shared<Expr>();
        e->kind = Expr::Kind::kTest;
        if (at_name("not")) {
          next();
          e->negated = true;
        }
        const Token& name = peek();
        e->pos = name.pos;
        std::string test;
        if (name.type == Tok::kName) test = next().value;
        else if (name.type == Tok::kOp && supported_tests().count(name.value)) test = next().value;
        else fail(name.pos, "expected a test name after 'is', found " + describe(name));
        if (!supported_tests().count(test)) fail(name.pos, "unsupported test '" + test + "'");
        e->name = test;
        e->args.push_back(node);
        if (at_op("(")) {
          next();
          parse_args(*e);
        } else if (peek().type == Tok::kString || peek().type == Tok::kInt || peek().type == Tok::kFloat ||
                   (peek().type == Tok::kName && !at_name("and") && !at_name("or") && !at_name("else") &&
                    !at_name("if") && !at_name("in") && !at_name("not") && !at_name("is"))) {
          e->args.push_back(parse_primary());  // `is divisibleby 3`, `is sameas x`
        }
        node = e;
      } else if (at_op("(")) {
        node = parse_call(node);
      } else {
        return node;
      }
    }
  }

  const Program& p_;
  std::vector<Token> t_;
  size_t i_ = 0;
  int loop_depth_ = 0;
};

}  // namespace

std::string Program::where(size_t pos) const {
  size_t line = 1, col = 1;
  for (size_t i = 0; i < pos && i < source.size(); ++i) {
    if (source[i] == '\n') {
      ++line;
      col = 1;
    } else if ((static_cast<uint8_t>(source[i]) & 0xC0) != 0x80) {
      ++col;
    }
  }
  return name + ":" + std::to_string(line) + ":" + std::to_string(col);
}

std::shared_ptr<const Program> parse(std::string_view source, const std::string& name) {
  auto program = std::make_shared<Program>();
  program->name = name;
  program->source = std::string(source);
  // Jinja's default keep_trailing_newline=False drops one trailing newline.
  if (!program->source.empty() && program->source.back() == '\n') {
    program->source.pop_back();
    if (!program->source.empty() && program->source.back() == '\r') program->source.pop_back();
  }
  Lexer lexer(*program);
  Parser parser(*program, lexer.run());
  program->body = parser.parse_template();
  return program;
}

}  // namespace fp4moe::engine::jinja
