// `fp4moe analyze`: reads a server's measured per-layer times and per-expert token counts (from
// GET /metrics or a saved copy) and prints, per MoE GEMM and layer, tokens per expert, achieved
// TFLOP/s and GB/s, the fraction of the HBM / tensor rooflines, and what raising
// --max-running-requests would do (tools/analyze.h has the formulas; docs/server.md how to read the tables).
//
//   fp4moe analyze --url http://127.0.0.1:30000            # model and max-running from /get_server_info
//   fp4moe analyze --metrics metrics.txt [--model DIR] [--weights nvfp4|bf16]
//       [--hbm-gbps 4200] [--peak-tflops 780] [--max-running-requests N] [--json]
//
// The model config: --model DIR|PRESET, else the server's model_path (/get_server_info with --url, else the
// metrics' fp4moe:model_info line, which a saved copy carries too) when it is a local directory or a preset,
// the embedded default model when the server says it serves that; metrics that name no model need --model.
// --weights auto: the expert weights the server says it serves (fp4moe:model_info's expert_weights label: a
// checkpoint's, or --dummy-weights), else nvfp4 when the checkpoint's quantization config says NVFP4 (and for the
// embedded default model, whose experts are NVFP4), bf16 otherwise. Tested by tests/tools/test_analyze_e2e.cpp (runs
// the built binary).
#include <CLI/CLI.hpp>
#include <fmt/core.h>

#include <algorithm>
#include <filesystem>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/file.h"
#include "engine/default_model.h"
#include "model/presets.h"
#include "model/config.h"
#include "server/http_client.h"
#include "tools/analyze.h"
#include "tools/commands.h"
#include "tools/prometheus_text.h"

namespace fp4moe::tools {
namespace {

namespace fs = std::filesystem;

struct AnalyzeArgs {
  std::string metrics_file, url, model_dir, weights = "auto", api_key;
  Roofline roofline;
  int64_t max_running_requests = 0;
  double timeout_s = 30;
  bool json_out = false;
};

void run_analyze(AnalyzeArgs a) {
  FP4MOE_CHECK(a.metrics_file.empty() != a.url.empty())
      << "give exactly one of --metrics FILE and --url http://host:port (got "
      << (a.metrics_file.empty() ? "neither" : "both") << ")";
  check_roofline(a.roofline);
  // A bad --weights fails before any other work.
  const bool weights_auto = a.weights == "auto";
  const WeightFormat asked = weights_auto ? WeightFormat::kNvfp4 : parse_weight_format(a.weights);
  std::string text;
  std::string model_path;  // from the server, when it says
  if (!a.url.empty()) {
    server::HttpClient client(a.url, a.timeout_s);
    client.set_bearer_token(a.api_key);
    const server::HttpResponse r = client.get("/metrics");
    FP4MOE_CHECK(r.status == 200) << "GET " << a.url << "/metrics: status " << r.status
                                  << (r.error.empty() ? "" : " (" + r.error + ")");
    text = r.body;
    const server::HttpResponse info = client.get("/get_server_info");
    FP4MOE_CHECK(info.status != 401) << "GET " << a.url << "/get_server_info: 401, "
                                     << (a.api_key.empty() ? "the server wants its API key: pass --api-key"
                                                           : "the server refused the key given with --api-key");
    if (info.status == 200) {
      const nlohmann::json j = nlohmann::json::parse(info.body, nullptr, /*allow_exceptions=*/false);
      if (j.is_object() && j.contains("model_path") && j["model_path"].is_string()) model_path = j["model_path"];
      if (a.max_running_requests == 0 && j.is_object() && j.contains("max_running_requests") &&
          j["max_running_requests"].is_number_integer()) {
        a.max_running_requests = j["max_running_requests"].get<int64_t>();
      }
    }
  } else {
    text = read_file(a.metrics_file);  // a directory, a missing file: named as such
  }

  const PromText metrics = parse_prometheus_text(text);
  // (An empty file, or another exporter's page, was "names no model (no fp4moe:model_info line)".)
  const bool ours = std::any_of(metrics.samples.begin(), metrics.samples.end(),
                                [](const PromSample& s) { return s.name.rfind("fp4moe:", 0) == 0; });
  FP4MOE_CHECK(ours) << (a.url.empty() ? "--metrics " + a.metrics_file : a.url + "/metrics")
                     << " holds no fp4moe: series (an empty file, or not a saved fp4moe /metrics page)";
  // A server still loading its model serves /metrics without the MoE series yet: say that, not which series lacks.
  for (const PromSample* s : metrics.find("fp4moe:is_ready")) {
    // (A server shutting down also reads 0, with its steps counted: those metrics are analyzed.)
    FP4MOE_CHECK(s->value != 0.0 || metrics.get("fp4moe:forward_steps_total").value_or(0.0) > 0)
        << (a.url.empty() ? "--metrics " + a.metrics_file : a.url)
        << ": the server was still loading its model (fp4moe:is_ready 0): analyze its "
           "metrics once /health answers 200 and it has served requests";
  }
  // The model: --model, else the server's model_path (/get_server_info, else the metrics' own model_info line,
  // which a saved copy carries too).
  if (model_path.empty()) {
    for (const PromSample* s : metrics.find("fp4moe:model_info")) {
      if (auto it = s->labels.find("model_path"); it != s->labels.end()) model_path = it->second;
    }
  }
  model::ModelConfig cfg;
  bool embedded = false;
  if (!a.model_dir.empty()) {
    cfg = model::load_config_or_preset(a.model_dir);
  } else if (!model_path.empty() && model_path != "(embedded default)") {
    FP4MOE_CHECK(fs::is_directory(model_path) || model::preset_config(model_path).has_value())
        << "the server serves " << model_path << ", which is neither a directory here nor a preset: pass --model DIR";
    cfg = model::load_config_or_preset(model_path);
  } else {
    FP4MOE_CHECK(!model_path.empty())
        << (a.url.empty() ? "--metrics " + a.metrics_file + " names no model (no fp4moe:model_info line)"
                          : a.url + " names no model (no model_path in /get_server_info, no fp4moe:model_info line)")
        << ": pass --model DIR|PRESET";
    cfg = model::parse_model_config(engine::default_model_config(), "the embedded default model");
    embedded = true;
  }
  // --weights auto: what the server says it serves (model_info's expert_weights: dummy weights too), else the
  // config's quantization.
  std::string served_weights;
  for (const PromSample* s : metrics.find("fp4moe:model_info")) {
    if (auto it = s->labels.find("expert_weights"); it != s->labels.end()) served_weights = it->second;
  }
  WeightFormat weights = WeightFormat::kBf16;
  if (!weights_auto) {
    weights = asked;
  } else if (!served_weights.empty()) {
    FP4MOE_CHECK(served_weights == "nvfp4" || served_weights == "bf16")
        << "fp4moe:model_info says expert_weights=\"" << served_weights
        << "\": expected nvfp4 or bf16 (pass --weights)";
    weights = parse_weight_format(served_weights);
  } else {
    weights = embedded ? WeightFormat::kNvfp4 : checkpoint_weight_format(cfg);
  }

  const Measured m = read_measured(metrics);
  const Analysis an = analyze(m, cfg, weights, a.roofline, a.max_running_requests);
  if (a.json_out) {
    fmt::print("{}\n", analysis_json(an).dump(2));
  } else {
    fmt::print("{}", format_analysis(an));
  }
}

}  // namespace

void register_analyze_command(CLI::App& app) {
  auto a = std::make_shared<AnalyzeArgs>();
  auto* cmd = app.add_subcommand(
      "analyze", "Tokens per expert, achieved TFLOP/s and GB/s vs roofline, and a max-running-requests what-if, "
                 "from a server's /metrics");
  cmd->add_option("--metrics", a->metrics_file, "A saved /metrics text");
  cmd->add_option("--url", a->url, "A running server, http://host:port (reads /metrics and /get_server_info)");
  cmd->add_option(
      "--model,--model-path", a->model_dir,
      "Model directory or preset for the config (default: the model the server or the metrics' model_info name)");
  cmd->add_option("--weights", a->weights, "Expert weight format: auto, nvfp4 (0.5625 B/weight) or bf16 (default auto)")
      ->check(CLI::IsMember({"auto", "nvfp4", "bf16"}));
  cmd->add_option("--hbm-gbps", a->roofline.hbm_gbps, "HBM roofline in GB/s (default 4200: H200 copy bandwidth)");
  cmd->add_option("--peak-tflops", a->roofline.peak_tflops, "Tensor roofline in TFLOP/s (default 780: H200 BF16)");
  cmd->add_option("--max-running-requests", a->max_running_requests,
                  "The server's current value, for the what-if rows (default: from /get_server_info with --url)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 31));
  cmd->add_option("--timeout", a->timeout_s, "HTTP timeout in seconds (default 30)");
  cmd->add_option("--api-key", a->api_key, "The server's --api-key (sent as Authorization: Bearer)");
  cmd->add_flag("--json", a->json_out, "Print JSON (schema fp4moe.analyze.v1) instead of tables");
  cmd->callback([a] { run_analyze(*a); });
}

}  // namespace fp4moe::tools
