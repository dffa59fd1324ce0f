// JSON schema -> regex. See json_schema.h; tests in tests/engine/test_constraint.cpp.
#include "engine/json_schema.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <set>
#include <vector>

#include "core/error.h"
#include "engine/regex_dfa.h"

namespace fp4moe::engine {
namespace {

using ojson = nlohmann::ordered_json;

// One JSON string character: anything but '"', '\\' and control characters (and '<' with without_lt:
// forced tool calls, whose values must not spell the markup's closing tags; "\u003c" still writes one),
// or an escape; a \u escape of a UTF-16 surrogate only as a high + low pair (strict parsers refuse lone
// ones).
std::string string_char(bool without_lt) {
  std::string r = R"((?:[^"\\)";
  if (without_lt) r += '<';
  r += R"(\x00-\x1F]|\\["\\/bfnrt]|\\u(?:[0-9a-cA-CefEF][0-9a-fA-F]{3}|[dD][0-7][0-9a-fA-F]{2}|)";
  r += R"([dD][89abAB][0-9a-fA-F]{2}\\u[dD][c-fC-F][0-9a-fA-F]{2})))";
  return r;
}
constexpr const char* kInteger = R"(-?(?:0|[1-9][0-9]*))";
constexpr const char* kNumber = R"(-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?)";

class SchemaRegex {
 public:
  SchemaRegex(const ojson& root, std::string ws, bool strings_without_lt)
      : root_(root), ws_("(?:" + std::move(ws) + ")"), string_char_(string_char(strings_without_lt)) {}

  std::string value(const ojson& s, const std::string& where) {
    if (depth_ >= kMaxSchemaDepth)
      fail(where, "schemas nested deeper than " + std::to_string(kMaxSchemaDepth) + " levels are not supported");
    ++depth_;
    std::string r = value_unguarded(s, where);
    --depth_;
    charge(r, where);
    return r;
  }

 private:
  static constexpr int kMaxSchemaDepth = 64;
  static constexpr size_t kMaxRegexBytes = size_t{1} << 20;
  static constexpr size_t kMaxBuiltBytes = size_t{32} << 20;  // all the strings one schema builds

  // Charges a built piece against kMaxBuiltBytes (loops over properties, alternatives and names would
  // otherwise build gigabytes before a result's own size is checked).
  const std::string& charge(const std::string& piece, const std::string& where) {
    built_ += piece.size();
    if (built_ > kMaxBuiltBytes || piece.size() > kMaxRegexBytes)
      fail(where, "the schema's regex exceeds " + std::to_string(kMaxRegexBytes) + " bytes (" + std::to_string(built_) +
                      " built); simplify the schema");
    return piece;
  }

  std::string value_unguarded(const ojson& s, const std::string& where) {
    if (s.is_boolean()) {
      if (!s.get<bool>()) fail(where, "the schema false matches nothing");
      return any_value(kAnyValueDepth);
    }
    if (!s.is_object()) fail(where, "a schema must be an object or a boolean, got " + s.dump());
    static const std::set<std::string> kKnown = {"type",
                                                 "properties",
                                                 "required",
                                                 "additionalProperties",
                                                 "items",
                                                 "minItems",
                                                 "maxItems",
                                                 "enum",
                                                 "const",
                                                 "anyOf",
                                                 "oneOf",
                                                 "allOf",
                                                 "$ref",
                                                 "$defs",
                                                 "definitions",
                                                 "minLength",
                                                 "maxLength",
                                                 "pattern",
                                                 "format",
                                                 "nullable",
                                                 "title",
                                                 "description",
                                                 "default",
                                                 "examples",
                                                 "$schema",
                                                 "$id",
                                                 "$comment",
                                                 "strict",
                                                 "minimum",
                                                 "maximum",
                                                 "exclusiveMinimum",
                                                 "exclusiveMaximum"};
    for (auto it = s.begin(); it != s.end(); ++it) {
      if (!kKnown.count(it.key()))
        fail(where,
             "keyword '" + it.key() + "' is not supported (structured outputs take the subset in docs/server.md)");
    }
    std::string r = value_of_keywords(s, where);
    if (s.contains("nullable") && s["nullable"].is_boolean() && s["nullable"].get<bool>()) r = "(?:" + r + "|null)";
    return r;
  }

  [[noreturn]] static void fail(const std::string& where, const std::string& what) {
    throw Error("JSON schema at " + (where.empty() ? std::string("#") : where) + ": " + what);
  }
  static std::string literal(const ojson& v) { return regex_escape(v.dump()); }

  // The first keyword of `s` that constrains a value, besides the annotations and `except` (the keyword
  // that decides the value alone there); "" when none.
  static std::string constraining(const ojson& s, std::initializer_list<const char*> except) {
    static const std::set<std::string> kAnnotations = {"title", "description", "default", "examples", "$schema",
                                                       "$id",   "$comment",    "strict",  "$defs",    "definitions"};
    for (auto it = s.begin(); it != s.end(); ++it) {
      bool skip = kAnnotations.count(it.key()) > 0;
      for (const char* e : except) skip = skip || it.key() == e;
      if (!skip) return it.key();
    }
    return std::string();
  }
  std::string sep() const { return ws_ + "," + ws_; }

  std::string value_of_keywords(const ojson& s, const std::string& where) {
    if (s.contains("$ref")) {
      const ojson& ref = s["$ref"];
      if (!ref.is_string()) fail(where, "$ref must be a string");
      const std::string path = ref.get<std::string>();
      if (const std::string other = constraining(s, {"$ref"}); !other.empty())
        fail(where, "$ref next to '" + other + "' is not supported (put it in the referenced schema)");
      if (path.rfind("#", 0) != 0) fail(where, "$ref '" + path + "' is not inside this schema (only #/... refs)");
      for (const std::string& open : refs_) {
        if (open == path) fail(where, "$ref '" + path + "' refers to itself (recursive schemas are not supported)");
      }
      const ojson* target = nullptr;
      try {
        target = &root_.at(ojson::json_pointer(path.substr(1)));
      } catch (const std::exception&) {
        fail(where, "$ref '" + path + "' points at nothing");
      }
      refs_.push_back(path);
      std::string r = value(*target, path.substr(1));
      refs_.pop_back();
      return r;
    }
    for (const char* key : {"anyOf", "oneOf", "allOf"}) {
      if (!s.contains(key)) continue;
      if (const std::string other = constraining(s, {key, "nullable"}); !other.empty())
        fail(where, std::string(key) + " next to '" + other + "' is not supported (move it into each alternative)");
    }
    if (s.contains("const") || s.contains("enum")) {
      // The listed values, those of the schema's type(s) only.
      const bool is_const = s.contains("const");
      const ojson values = is_const ? ojson::array({s["const"]}) : s["enum"];
      if (!values.is_array() || values.empty()) fail(where, "enum must be a non-empty list");
      if (const std::string other = constraining(s, {is_const ? "const" : "enum", "type", "nullable"}); !other.empty())
        fail(where, std::string(is_const ? "const" : "enum") + " next to '" + other + "' is not supported");
      std::string r;
      int n = 0;
      for (const ojson& v : values) {
        if (s.contains("type") && !of_type(v, s["type"], where)) continue;
        r += n++ ? "|" : "";
        r += literal(v);
      }
      if (n == 0) fail(where, std::string(is_const ? "const" : "enum") + " has no value of the schema's type");
      return "(?:" + r + ")";
    }
    for (const char* key : {"anyOf", "oneOf"}) {
      if (!s.contains(key)) continue;
      const ojson& alts = s[key];
      if (!alts.is_array() || alts.empty()) fail(where, std::string(key) + " must be a non-empty list");
      std::string r;
      for (size_t i = 0; i < alts.size(); ++i) {
        r += i ? "|" : "";
        r += value(alts[i], where + "/" + key + "/" + std::to_string(i));
        charge(r, where);
      }
      return "(?:" + r + ")";
    }
    if (s.contains("allOf")) {
      const ojson& all = s["allOf"];
      if (!all.is_array() || all.size() != 1) fail(where, "allOf is supported with exactly one schema");
      return value(all[0], where + "/allOf/0");
    }
    std::vector<std::string> types;
    if (s.contains("type")) {
      const ojson& t = s["type"];
      if (t.is_string()) {
        types.push_back(t.get<std::string>());
      } else if (t.is_array() && !t.empty()) {
        for (const ojson& x : t) {
          if (!x.is_string()) fail(where, "type must be a string or a list of strings");
          types.push_back(x.get<std::string>());
        }
      } else {
        fail(where, "type must be a string or a list of strings");
      }
    } else if (s.contains("properties") || s.contains("additionalProperties") || s.contains("required")) {
      types = {"object"};
    } else if (s.contains("items") || s.contains("minItems") || s.contains("maxItems")) {
      types = {"array"};
    } else if (s.contains("minLength") || s.contains("maxLength") || s.contains("pattern") || s.contains("format")) {
      types = {"string"};
    } else if (s.contains("minimum") || s.contains("maximum") || s.contains("exclusiveMinimum") ||
               s.contains("exclusiveMaximum")) {
      fail(where, "numeric bounds without a type: give \"type\": \"integer\"");
    } else {
      return any_value(kAnyValueDepth);
    }
    std::string r;
    for (size_t i = 0; i < types.size(); ++i) {
      r += i ? "|" : "";
      r += typed(types[i], s, where);
    }
    return types.size() == 1 ? r : "(?:" + r + ")";
  }

  // Whether a listed value (enum / const) is of the schema's type (a name or a list of names).
  static bool of_type(const ojson& v, const ojson& type, const std::string& where) {
    auto one = [&](const ojson& t) {
      if (!t.is_string()) fail(where, "type must be a string or a list of strings");
      const std::string n = t.get<std::string>();
      if (n == "integer")
        return v.is_number_integer() || (v.is_number_float() && std::floor(v.get<double>()) == v.get<double>());
      if (n == "number") return v.is_number();
      if (n == "string") return v.is_string();
      if (n == "boolean") return v.is_boolean();
      if (n == "null") return v.is_null();
      if (n == "array") return v.is_array();
      if (n == "object") return v.is_object();
      fail(where, "unknown type '" + n + "'");
    };
    if (!type.is_array()) return one(type);
    for (const ojson& t : type) {
      if (one(t)) return true;
    }
    return false;
  }

  static int64_t count(const ojson& s, const char* key, const std::string& where, int64_t dflt) {
    if (!s.contains(key)) return dflt;
    const ojson& v = s[key];
    if (!v.is_number_integer() || v.get<int64_t>() < 0) fail(where, std::string(key) + " must be an integer >= 0");
    return v.get<int64_t>();
  }

  static std::string bounds(int64_t lo, int64_t hi) {
    std::string r = "{";
    if (hi < 0 && lo == 0) return "*";
    r += std::to_string(lo);
    r += ",";
    if (hi >= 0) r += std::to_string(hi);
    r += "}";
    return r;
  }

  std::string typed(const std::string& type, const ojson& s, const std::string& where) {
    if (type == "null") return "null";
    if (type == "boolean") return "(?:true|false)";
    if (type == "integer") return integer_regex(s, where);
    if (type == "number") {
      for (const char* key : {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"}) {
        if (s.contains(key)) fail(where, std::string(key) + " is supported on integers only, not on numbers");
      }
      return kNumber;
    }
    if (type == "string") return string_regex(s, where);
    if (type == "array") return array_regex(s, where);
    if (type == "object") return object_regex(s, where);
    fail(where, "unknown type '" + type + "'");
  }

  // An integer type with minimum / maximum / exclusiveMinimum / exclusiveMaximum: the decimal texts of
  // the range, no leading zeros (the range-to-regex construction: split by digit count, then by the
  // first digit that differs).
  std::string integer_regex(const ojson& s, const std::string& where) {
    std::optional<int64_t> lo, hi;
    auto bound = [&](const char* key, bool lower, bool exclusive) {
      if (!s.contains(key)) return;
      const ojson& v = s[key];
      if (!v.is_number()) fail(where, std::string(key) + " must be a number");
      constexpr int64_t kLimit = 1'000'000'000'000'000'000;
      int64_t x = 0;
      if (v.is_number_integer()) {  // exact: a double would round past 2^53
        if (v.is_number_unsigned() ? v.get<uint64_t>() > static_cast<uint64_t>(kLimit)
                                   : v.get<int64_t>() < -kLimit || v.get<int64_t>() > kLimit)
          fail(where, std::string(key) + " beyond +-1e18 is not supported");
        x = v.get<int64_t>();
        if (exclusive) x += lower ? 1 : -1;
      } else {
        const double d = v.get<double>();
        if (!(std::fabs(d) <= 1e18)) fail(where, std::string(key) + " beyond +-1e18 is not supported");
        x = static_cast<int64_t>(lower ? std::ceil(d) : std::floor(d));
        if (exclusive && static_cast<double>(x) == d) x += lower ? 1 : -1;
      }
      std::optional<int64_t>& b = lower ? lo : hi;
      b = !b ? x : lower ? std::max(*b, x) : std::min(*b, x);
    };
    bound("minimum", true, false);
    bound("exclusiveMinimum", true, true);
    bound("maximum", false, false);
    bound("exclusiveMaximum", false, true);
    if (!lo && !hi) return kInteger;
    if (lo && hi && *lo > *hi)
      fail(where, "the integer range [" + std::to_string(*lo) + ", " + std::to_string(*hi) + "] is empty");
    std::vector<std::string> alts;
    // Negative part: "-" and the magnitudes |hi'| .. |lo| (hi' = min(hi, -1)).
    if (!lo || *lo < 0) {
      const int64_t top = hi ? std::min<int64_t>(*hi, -1) : -1;
      std::string neg = "-";
      neg += natural_range(-top, lo ? std::optional<int64_t>(-*lo) : std::nullopt);
      alts.push_back(std::move(neg));
    }
    if (!hi || *hi >= 0) alts.push_back(natural_range(lo ? std::max<int64_t>(*lo, 0) : 0, hi));
    std::string r = "(?:";
    for (size_t i = 0; i < alts.size(); ++i) {
      r += i ? "|" : "";
      r += alts[i];
    }
    return r + ")";
  }

  // Decimal texts of a..b (b nullopt: no end), a >= 0.
  static std::string natural_range(int64_t a, std::optional<int64_t> b) {
    std::vector<std::string> parts;
    const std::string as = std::to_string(a);
    if (!b) {
      // a .. 10^len(a) - 1, then every longer number.
      parts.push_back(same_length(as, std::string(as.size(), '9')));
      parts.push_back("[1-9][0-9]{" + std::to_string(as.size()) + ",}");
    } else {
      const std::string bs = std::to_string(*b);
      for (size_t len = as.size(); len <= bs.size(); ++len) {
        std::string from = as;
        if (len != as.size()) from = std::string(1, '1').append(len - 1, '0');
        const std::string to = len == bs.size() ? bs : std::string(len, '9');
        parts.push_back(same_length(from, to));
      }
    }
    std::string r = "(?:";
    for (size_t i = 0; i < parts.size(); ++i) {
      r += i ? "|" : "";
      r += parts[i];
    }
    return r + ")";
  }

  // Numbers from x to y (same digit count, x <= y) as a regex.
  static std::string same_length(const std::string& x, const std::string& y) {
    if (x.empty()) return "";
    const auto digit_class = [](char a, char b) {
      if (a == b) return std::string(1, a);
      return std::string{'[', a, '-', b, ']'};
    };
    const size_t rest = x.size() - 1;
    if (x[0] == y[0]) return std::string(1, x[0]) + same_length(x.substr(1), y.substr(1));
    if (x.substr(1) == std::string(rest, '0') && y.substr(1) == std::string(rest, '9'))
      return digit_class(x[0], y[0]) + (rest ? "[0-9]{" + std::to_string(rest) + "}" : "");
    std::string r = "(?:" + std::string(1, x[0]) + same_length(x.substr(1), std::string(rest, '9'));
    if (y[0] - x[0] > 1) {
      r += "|";
      r += digit_class(static_cast<char>(x[0] + 1), static_cast<char>(y[0] - 1));
      r += "[0-9]{" + std::to_string(rest) + "}";
    }
    r += "|";
    r += std::string(1, y[0]) + same_length(std::string(rest, '0'), y.substr(1));
    return r + ")";
  }

  std::string string_regex(const ojson& s, const std::string& where) {
    if ((s.contains("pattern") || s.contains("format")) && (s.contains("minLength") || s.contains("maxLength")))
      fail(where, "minLength / maxLength next to pattern or format are not supported (bound the pattern instead)");
    if (s.contains("pattern")) {
      if (!s["pattern"].is_string()) fail(where, "pattern must be a string");
      std::string p = s["pattern"].get<std::string>();
      if (!p.empty() && p.front() == '^') p.erase(0, 1);
      size_t n_backslashes = 0;  // a final '$' is an anchor unless escaped (an odd run of backslashes)
      while (p.size() >= 2 + n_backslashes && p[p.size() - 2 - n_backslashes] == '\\') ++n_backslashes;
      if (!p.empty() && p.back() == '$' && n_backslashes % 2 == 0) p.pop_back();
      // The pattern must stand alone (no breaking out of its group) and spell only characters a JSON
      // string holds as they are: the reply's bytes between the quotes are matched, not the decoded string.
      ByteDfa dfa;
      try {
        compile_regex(p);                      // alone: no breaking out of its group ("a)|(b")
        dfa = compile_regex("(?:" + p + ")");  // as it is embedded: anchors left inside are refused here
      } catch (const Error& e) {
        fail(where + "/pattern", e.what());
      }
      for (int32_t st = 0; st < dfa.n_states(); ++st) {
        for (int b = 0; b < 0x20; ++b) {
          if (dfa.step(st, static_cast<uint8_t>(b)) != ByteDfa::kDead)
            fail(where, "pattern may match a control character, which a JSON string must escape; not supported");
        }
        if (dfa.step(st, '"') != ByteDfa::kDead || dfa.step(st, '\\') != ByteDfa::kDead)
          fail(where, "pattern may match '\"' or '\\', which a JSON string must escape; not supported");
      }
      return "\"(?:" + p + ")\"";
    }
    if (s.contains("format")) {
      if (!s["format"].is_string()) fail(where, "format must be a string");
      const std::string f = s["format"].get<std::string>();
      const std::string date = R"([0-9]{4}-(?:0[1-9]|1[0-2])-(?:0[1-9]|[12][0-9]|3[01]))";
      const std::string time =
          R"((?:[01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](?:\.[0-9]+)?(?:Z|[+-](?:[01][0-9]|2[0-3]):[0-5][0-9])?)";
      if (f == "date") return "\"" + date + "\"";
      if (f == "time") return "\"" + time + "\"";
      if (f == "date-time") return "\"" + date + "T" + time + "\"";
      if (f == "uuid") return R"("[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")";
      fail(where, "format '" + f + "' is not supported (date, time, date-time, uuid)");
    }
    const int64_t lo = count(s, "minLength", where, 0), hi = count(s, "maxLength", where, -1);
    if (hi >= 0 && hi < lo) fail(where, "maxLength < minLength");
    return std::string("\"") + string_char_ + bounds(lo, hi) + "\"";
  }

  std::string array_regex(const ojson& s, const std::string& where) {
    const int64_t lo = count(s, "minItems", where, 0), hi = count(s, "maxItems", where, -1);
    if (hi >= 0 && hi < lo) fail(where, "maxItems < minItems");
    const std::string item = s.contains("items") ? value(s["items"], where + "/items") : any_value(kAnyValueDepth);
    const std::string open = "\\[" + ws_, close = ws_ + "\\]";
    if (hi == 0) return open + close;
    const std::string more = "(?:" + sep() + "(?:" + item + "))" + bounds(lo > 0 ? lo - 1 : 0, hi < 0 ? -1 : hi - 1);
    const std::string items = "(?:" + item + ")" + more;
    return open + (lo == 0 ? "(?:" + items + ")?" : items) + close;
  }

  std::string object_regex(const ojson& s, const std::string& where) {
    std::vector<std::pair<std::string, std::string>> props;  // (key regex, value regex)
    std::vector<bool> required;
    std::set<std::string> req_names;
    if (s.contains("required")) {
      if (!s["required"].is_array()) fail(where, "required must be a list of names");
      for (const ojson& n : s["required"]) {
        if (!n.is_string()) fail(where, "required must be a list of names");
        req_names.insert(n.get<std::string>());
      }
    }
    const ojson* properties = s.contains("properties") ? &s["properties"] : nullptr;
    if (properties != nullptr && !properties->is_object()) fail(where, "properties must be an object");
    std::set<std::string> listed;
    auto key_regex = [](const std::string& name) { return regex_escape(ojson(name).dump()); };
    if (properties != nullptr) {
      for (auto it = properties->begin(); it != properties->end(); ++it) {
        listed.insert(it.key());
        props.emplace_back(key_regex(it.key()), value(it.value(), where + "/properties/" + it.key()));
        required.push_back(req_names.count(it.key()) > 0);
      }
    }
    const ojson* extra = s.contains("additionalProperties") ? &s["additionalProperties"] : nullptr;
    for (const std::string& name : req_names) {  // required but not in properties: additionalProperties' value
      if (listed.count(name)) continue;
      if (extra != nullptr && extra->is_boolean() && !extra->get<bool>())
        fail(where, "'" + name + "' is required but neither in properties nor allowed by additionalProperties: false");
      props.emplace_back(key_regex(name),
                         extra != nullptr ? value(*extra, where + "/additionalProperties") : any_value(kAnyValueDepth));
      required.push_back(true);
    }
    const std::string open = "\\{" + ws_, close = ws_ + "\\}";
    if (props.empty()) {
      if (extra != nullptr && extra->is_boolean() && !extra->get<bool>()) return open + close;
      const std::string v =
          extra != nullptr ? value(*extra, where + "/additionalProperties") : any_value(kAnyValueDepth);
      const std::string member = std::string("\"") + string_char_ + "*\"" + ws_ + ":" + ws_ + "(?:" + v + ")";
      return open + "(?:" + member + "(?:" + sep() + member + ")*)?" + close;
    }
    // rest(i, first): properties i.. when none has been written yet (first) or some has. Optional ones
    // may be skipped; linear in the properties when one has been written, quadratic before.
    const size_t n = props.size();
    std::vector<std::string> after(n + 1);  // rest(i, false): each present property is preceded by ','
    for (size_t i = n; i-- > 0;) {
      const std::string member = sep() + props[i].first + ws_ + ":" + ws_ + "(?:" + props[i].second + ")";
      after[i] = required[i] ? member + after[i + 1] : "(?:" + member + ")?" + after[i + 1];
      charge(after[i], where);
    }
    std::string first;  // rest(0, true)
    std::vector<std::string> alts;
    for (size_t i = 0; i < n; ++i) {
      const std::string member = props[i].first + ws_ + ":" + ws_ + "(?:" + props[i].second + ")";
      alts.push_back(member + after[i + 1]);  // property i is the first one written
      charge(alts.back(), where);
      if (required[i]) break;                 // none after a required one can come first
    }
    const bool all_optional = std::none_of(required.begin(), required.end(), [](bool b) { return b; });
    std::string body = "(?:";
    for (size_t i = 0; i < alts.size(); ++i) body += (i ? "|" : "") + alts[i];
    body += ")";
    if (all_optional) body += "?";
    return open + body + close;
  }

  // Any JSON value with containers nested at most `depth` deep.
  std::string any_value(int depth) {
    const std::string string = std::string("\"") + string_char_ + "*\"";
    std::string r = "(?:" + string + "|" + kNumber + "|true|false|null";
    if (depth > 0) {
      const std::string v = any_value(depth - 1);
      const std::string member = string + ws_ + ":" + ws_ + v;
      r += "|\\{" + ws_ + "(?:" + member + "(?:" + sep() + member + ")*)?" + ws_ + "\\}";
      r += "|\\[" + ws_ + "(?:" + v + "(?:" + sep() + v + ")*)?" + ws_ + "\\]";
    }
    return r + ")";
  }

  const ojson& root_;
  std::string ws_;
  std::string string_char_;
  std::vector<std::string> refs_;
  int depth_ = 0;
  size_t built_ = 0;
};

}  // namespace

std::string json_schema_to_regex(const nlohmann::ordered_json& schema, const std::string& whitespace,
                                 bool strings_without_lt) {
  SchemaRegex b(schema, whitespace, strings_without_lt);
  return b.value(schema, "");
}

}  // namespace fp4moe::engine
