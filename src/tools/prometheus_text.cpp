// Prometheus text format 0.0.4 reader: see prometheus_text.h.
#include "tools/prometheus_text.h"

#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <sstream>

#include "core/error.h"

namespace fp4moe::tools {
namespace {

bool is_name_start(char c, bool colon_ok) {
  return std::isalpha(static_cast<unsigned char>(c)) || c == '_' || (colon_ok && c == ':');
}
bool is_name_char(char c, bool colon_ok) {
  return is_name_start(c, colon_ok) || std::isdigit(static_cast<unsigned char>(c));
}

// Cursor over one line; every failure names the line and the column.
struct LineReader {
  std::string_view s;
  size_t pos = 0;
  int line = 0;

  bool done() const { return pos >= s.size(); }
  char peek() const { return done() ? '\0' : s[pos]; }
  void skip_blanks() {
    while (!done() && (s[pos] == ' ' || s[pos] == '\t')) ++pos;
  }
  [[noreturn]] void fail(const std::string& what) const {
    std::ostringstream m;
    m << "metrics line " << line << " column " << (pos + 1) << ": " << what << " in \"" << s << "\"";
    throw Error(m.str());
  }
  std::string name(bool colon_ok, const std::string& what) {
    if (!is_name_start(peek(), colon_ok)) fail("expected " + what);
    const size_t b = pos;
    while (!done() && is_name_char(s[pos], colon_ok)) ++pos;
    return std::string(s.substr(b, pos - b));
  }
  std::string quoted() {
    if (peek() != '"') fail("expected '\"' opening a label value");
    ++pos;
    std::string out;
    while (true) {
      if (done()) fail("unterminated label value");
      const char c = s[pos++];
      if (c == '"') return out;
      if (c != '\\') {
        out.push_back(c);
        continue;
      }
      if (done()) fail("unterminated escape in a label value");
      const char e = s[pos++];
      if (e == '\\') out.push_back('\\');
      else if (e == '"') out.push_back('"');
      else if (e == 'n') out.push_back('\n');
      else {
        --pos;
        fail(std::string("unknown escape \\") + e + " in a label value (known: \\\\ \\\" \\n)");
      }
    }
  }
  std::string token() {
    const size_t b = pos;
    while (!done() && s[pos] != ' ' && s[pos] != '\t') ++pos;
    return std::string(s.substr(b, pos - b));
  }
};

double parse_value(const std::string& t, LineReader& r) {
  if (t == "+Inf" || t == "Inf") return std::numeric_limits<double>::infinity();
  if (t == "-Inf") return -std::numeric_limits<double>::infinity();
  if (t == "NaN") return std::numeric_limits<double>::quiet_NaN();
  if (t.empty()) r.fail("expected a sample value");
  char* end = nullptr;
  errno = 0;
  const double v = std::strtod(t.c_str(), &end);
  // strtod also reads "inf"/"nan"/hex; the format spells only the three forms above.
  const bool bad_word = t.find_first_of("xXiInN") != std::string::npos;
  if (end != t.c_str() + t.size() || bad_word || errno == ERANGE) r.fail("sample value \"" + t + "\" is not a number");
  return v;
}

void parse_comment(LineReader& r, PromText& out) {
  ++r.pos;  // '#'
  r.skip_blanks();
  const std::string kind = r.token();
  if (kind != "HELP" && kind != "TYPE") return;  // a plain comment
  r.skip_blanks();
  const std::string name = r.name(true, "a metric name after # " + kind);
  if (kind == "HELP") {
    r.skip_blanks();
    out.help[name] = std::string(r.s.substr(r.pos));
    return;
  }
  r.skip_blanks();
  const std::string type = r.token();
  if (type != "counter" && type != "gauge" && type != "histogram" && type != "summary" && type != "untyped") {
    r.fail("unknown metric type \"" + type + "\" (known: counter gauge histogram summary untyped)");
  }
  r.skip_blanks();
  if (!r.done()) r.fail("unexpected text after the metric type");
  if (out.types.count(name)) r.fail("second # TYPE line for " + name);
  out.types[name] = type;
}

void parse_sample(LineReader& r, PromText& out) {
  PromSample smp;
  smp.line = r.line;
  smp.name = r.name(true, "a metric name");
  if (r.peek() == '{') {
    ++r.pos;
    r.skip_blanks();
    while (r.peek() != '}') {
      const std::string label = r.name(false, "a label name");
      r.skip_blanks();
      if (r.peek() != '=') r.fail("expected '=' after label " + label);
      ++r.pos;
      r.skip_blanks();
      std::string v = r.quoted();
      if (!smp.labels.emplace(label, std::move(v)).second) r.fail("label " + label + " appears twice");
      r.skip_blanks();
      if (r.peek() == ',') {
        ++r.pos;
        r.skip_blanks();
      } else if (r.peek() != '}') {
        r.fail("expected ',' or '}' after a label value");
      }
    }
    ++r.pos;  // '}'
  }
  if (r.peek() != ' ' && r.peek() != '\t') r.fail("expected a space before the sample value");
  r.skip_blanks();
  smp.value = parse_value(r.token(), r);
  r.skip_blanks();
  if (!r.done()) {
    const std::string ts = r.token();
    char* end = nullptr;
    std::strtoll(ts.c_str(), &end, 10);
    if (ts.empty() || end != ts.c_str() + ts.size()) r.fail("timestamp \"" + ts + "\" is not an integer");
    r.skip_blanks();
    if (!r.done()) r.fail("unexpected text after the timestamp");
  }
  out.samples.push_back(std::move(smp));
}

std::string series_text(const std::string& name, const std::map<std::string, std::string>& labels) {
  std::string s = name;
  if (labels.empty()) return s;
  s += "{";
  bool first = true;
  for (const auto& [k, v] : labels) {
    s += (first ? "" : ",") + k + "=\"" + v + "\"";
    first = false;
  }
  return s + "}";
}

}  // namespace

std::vector<const PromSample*> PromText::find(const std::string& name) const {
  std::vector<const PromSample*> out;
  for (const PromSample& s : samples) {
    if (s.name == name) out.push_back(&s);
  }
  return out;
}

std::optional<double> PromText::get(const std::string& name, const std::map<std::string, std::string>& labels) const {
  for (const PromSample& s : samples) {
    if (s.name == name && s.labels == labels) return s.value;
  }
  return std::nullopt;
}

double PromText::value(const std::string& name, const std::map<std::string, std::string>& labels) const {
  const std::optional<double> v = get(name, labels);
  FP4MOE_CHECK(v.has_value()) << "metrics: series " << series_text(name, labels) << " is missing ("
                              << samples.size() << " samples read)";
  return *v;
}

PromText parse_prometheus_text(std::string_view text) {
  PromText out;
  int line_no = 0;
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string_view::npos) end = text.size();
    std::string_view line = text.substr(start, end - start);
    start = end + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    LineReader r{line, 0, line_no};
    r.skip_blanks();
    if (r.done()) continue;
    if (r.peek() == '#') parse_comment(r, out);
    else parse_sample(r, out);
  }
  // A series given twice (two values for one name and label set) is refused, as Prometheus refuses such a scrape:
  // analyze would otherwise read whichever came first.
  std::map<std::pair<std::string, std::map<std::string, std::string>>, int> seen;
  for (const PromSample& s : out.samples) {
    const auto [it, fresh] = seen.emplace(std::make_pair(s.name, s.labels), s.line);
    if (!fresh) {
      throw Error("metrics line " + std::to_string(s.line) + ": series " + series_text(s.name, s.labels) +
                  " was already given on line " + std::to_string(it->second) + " (a scrape has one value a series)");
    }
  }
  return out;
}

}  // namespace fp4moe::tools
