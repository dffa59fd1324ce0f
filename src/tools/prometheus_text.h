// A reader for the Prometheus text exposition format 0.0.4 (what GET /metrics serves), for
// `fp4moe analyze`:
//
//   PromText m = parse_prometheus_text(body);
//   double steps = m.value("fp4moe:forward_steps_total");                    // throws when absent
//   for (const PromSample* s : m.find("fp4moe:moe_expert_tokens_total")) use(s->labels.at("layer"), s->value);
//
// Accepted: blank lines; `# HELP name text` and `# TYPE name counter|gauge|histogram|summary|untyped`
// (other `#` lines are comments); samples `name{label="value",...} value [timestamp]` with the
// escapes \\ \" \n in label values, values as floats or +Inf / -Inf / NaN. Anything else throws
// fp4moe::Error naming the line number and what was expected there.
// Tested by tests/tools/test_analyze.cpp (PrometheusText.*).
#pragma once

#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace fp4moe::tools {

struct PromSample {
  std::string name;
  std::map<std::string, std::string> labels;  // unescaped values
  double value = 0.0;
  int line = 0;  // 1-based line in the text
};

struct PromText {
  std::vector<PromSample> samples;           // in text order
  std::map<std::string, std::string> types;  // metric family -> "counter", "gauge", ...
  std::map<std::string, std::string> help;   // metric family -> help text

  // Every sample called `name` (any labels), in text order.
  std::vector<const PromSample*> find(const std::string& name) const;
  // The sample called `name` whose labels equal `labels` exactly, if any.
  std::optional<double> get(const std::string& name, const std::map<std::string, std::string>& labels = {}) const;
  // Like get, but throws fp4moe::Error naming the series when it is absent.
  double value(const std::string& name, const std::map<std::string, std::string>& labels = {}) const;
};

PromText parse_prometheus_text(std::string_view text);

}  // namespace fp4moe::tools
