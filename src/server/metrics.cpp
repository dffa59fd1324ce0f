// Prometheus rendering of EngineStats: see metrics.h.
#include "server/metrics.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <sstream>

namespace fp4moe::server {
namespace {

constexpr const char* kPrefix = "fp4moe:";

std::string num(double v) {
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  if (std::isnan(v)) return "NaN";
  char buf[64];
  for (int precision = 15; precision <= 17; ++precision) {  // the shortest text that reads back exactly
    std::snprintf(buf, sizeof buf, "%.*g", precision, v);
    if (std::strtod(buf, nullptr) == v) break;
  }
  return buf;
}

void header(std::ostringstream& o, const std::string& name, const char* type, const char* help) {
  o << "# HELP " << kPrefix << name << " " << help << "\n";
  o << "# TYPE " << kPrefix << name << " " << type << "\n";
}

void scalar(std::ostringstream& o, const std::string& name, const char* type, const char* help, double v) {
  header(o, name, type, help);
  o << kPrefix << name << " " << num(v) << "\n";
}

void histogram(std::ostringstream& o, const std::string& name, const char* help, const engine::Histogram& h) {
  header(o, name, "histogram", help);
  uint64_t cumulative = 0;
  for (size_t i = 0; i < h.bounds.size(); ++i) {
    cumulative += i < h.counts.size() ? h.counts[i] : 0;
    o << kPrefix << name << "_bucket{le=\"" << num(h.bounds[i]) << "\"} " << cumulative << "\n";
  }
  o << kPrefix << name << "_bucket{le=\"+Inf\"} " << h.count << "\n";
  o << kPrefix << name << "_sum " << num(h.sum) << "\n";
  o << kPrefix << name << "_count " << h.count << "\n";
}

// A Prometheus label value: \\, \" and \n escaped.
std::string label_value(const std::string& v) {
  std::string out;
  for (char c : v) {
    if (c == '\\' || c == '"') out.push_back('\\');
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out.push_back(c);
  }
  return out;
}

}  // namespace

std::string render_metrics(const engine::EngineStats& s, const HttpCounters& http, const ServedModel& model) {
  std::ostringstream o;
  header(o, "model_info", "gauge", "The served model (labels); always 1.");
  o << kPrefix << "model_info{model_path=\"" << label_value(model.model_path) << "\",served_model_name=\""
    << label_value(model.served_model_name) << "\"";
  if (!model.expert_weights.empty()) o << ",expert_weights=\"" << label_value(model.expert_weights) << "\"";
  o << "} 1\n";
  scalar(o, "prompt_tokens_total", "counter", "Prompt tokens of admitted requests.", static_cast<double>(s.prompt_tokens_total));
  scalar(o, "generation_tokens_total", "counter", "Generated tokens.", static_cast<double>(s.generation_tokens_total));
  scalar(o, "num_requests_total", "counter", "Requests accepted by the engine.", static_cast<double>(s.requests_submitted_total));
  scalar(o, "num_finished_requests_total", "counter", "Requests finished for any reason.",
         static_cast<double>(s.requests_finished_total));
  scalar(o, "num_aborted_requests_total", "counter", "Requests aborted (client gone or shutdown).",
         static_cast<double>(s.requests_aborted_total));
  scalar(o, "num_rejected_requests_total", "counter",
         "Requests the engine refused at submit (queue full, prompt + max tokens past the context or KV cache, a "
         "sampling field it refuses); what the HTTP layer refuses first (malformed fields, a prompt alone past the "
         "context) is in http_errors_total.",
         static_cast<double>(s.requests_rejected_total));
  scalar(o, "num_preemptions_total", "counter",
         "Running requests preempted by recompute (KV exhausted, or for a higher-priority waiting request).",
         static_cast<double>(s.preemptions_total));
  scalar(o, "forward_steps_total", "counter", "Engine steps (one model forward each).", static_cast<double>(s.steps_total));
  scalar(o, "continuous_decode_steps_total", "counter", "Extra decode steps run without re-scheduling.",
         static_cast<double>(s.continuous_steps_total));
  scalar(o, "forward_tokens_total", "counter", "Tokens through the model forward.", static_cast<double>(s.forward_tokens_total));
  scalar(o, "forward_seconds_total", "counter", "Wall seconds spent in the model forward.", s.forward_seconds_total);
  scalar(o, "step_seconds_total", "counter",
         "Wall seconds of whole engine steps (scheduling, forward, sampling, delivery to HTTP threads).",
         s.step_seconds_total);
  scalar(o, "is_ready", "gauge", "1 when the model is loaded and warmed up.", s.ready ? 1.0 : 0.0);
  scalar(o, "num_running_reqs", "gauge", "Requests in the running batch.", static_cast<double>(s.n_running));
  scalar(o, "num_queue_reqs", "gauge", "Requests waiting to be scheduled.", static_cast<double>(s.n_waiting));
  scalar(o, "num_used_tokens", "gauge", "KV cache tokens in use (whole blocks).", static_cast<double>(s.kv_used_tokens));
  scalar(o, "max_total_num_tokens", "gauge", "KV cache capacity in tokens.", static_cast<double>(s.kv_total_tokens));
  scalar(o, "token_usage", "gauge", "Fraction of the KV cache in use by requests (not the evictable prefix cache).",
         s.kv_total_tokens > 0 ? static_cast<double>(s.kv_used_tokens) / static_cast<double>(s.kv_total_tokens) : 0.0);
  scalar(o, "prefix_cache_queries_total", "counter",
         "Prompt tokens of admitted requests that looked up the prefix cache.",
         static_cast<double>(s.prefix_cache_queries_total));
  scalar(o, "prefix_cache_hits_total", "counter", "Prompt tokens whose KV came from the prefix cache.",
         static_cast<double>(s.prefix_cache_hits_total));
  scalar(o, "cache_hit_rate", "gauge",
         "Prefix cache hits / lookups of the last step that admitted requests (SGLang's; the run's: "
         "prefix_cache_hits_total / prefix_cache_queries_total).",
         s.cache_hit_rate);
  scalar(o, "prefix_cache_tokens", "gauge", "Tokens the prefix cache holds (evicted when requests need the blocks).",
         static_cast<double>(s.prefix_cache_tokens));
  histogram(o, "time_to_first_token_seconds", "Time from submit to the first generated token.", s.ttft_s);
  histogram(o, "inter_token_latency_seconds", "Time between consecutive tokens of a request.", s.inter_token_s);
  histogram(o, "e2e_request_latency_seconds", "Time from submit to finish.", s.e2e_s);
  histogram(o, "decode_batch_size", "Requests advanced by one decode token per step.", s.decode_batch_size);
  header(o, "http_errors_total", "counter", "Error replies by HTTP status.");
  for (const auto& [code, n] : http.errors_by_status) {
    o << kPrefix << "http_errors_total{code=\"" << code << "\"} " << n << "\n";
  }
  header(o, "moe_expert_tokens_total", "counter", "Tokens routed to each expert of each MoE layer.");
  for (size_t l = 0; l < s.moe_layers.size() && l < s.expert_tokens.size(); ++l) {
    for (size_t e = 0; e < s.expert_tokens[l].size(); ++e) {
      o << kPrefix << "moe_expert_tokens_total{layer=\"" << s.moe_layers[l] << "\",expert=\"" << e << "\"} "
        << s.expert_tokens[l][e] << "\n";
    }
  }
  header(o, "moe_active_experts_total", "counter", "Per MoE layer, experts that received >= 1 token, summed over steps.");
  for (size_t l = 0; l < s.moe_layers.size() && l < s.active_experts.size(); ++l) {
    o << kPrefix << "moe_active_experts_total{layer=\"" << s.moe_layers[l] << "\"} " << s.active_experts[l] << "\n";
  }
  histogram(o, "moe_expert_step_tokens", "Tokens routed to one expert of one MoE layer in one step.", s.expert_step_tokens);
  scalar(o, "layer_timed_steps_total", "counter", "Steps whose forward reported per-layer times.",
         static_cast<double>(s.layer_timed_steps_total));
  scalar(o, "cuda_graph_steps_total", "counter", "Steps the GPU model ran as a captured CUDA graph (--cuda-graph-max-bs).",
         static_cast<double>(s.cuda_graph_steps_total));
  header(o, "layer_seconds_total", "counter", "Measured wall seconds of each layer part (attention, mlp, moe; GPU models under --time-moe-gemms: moe.routed_gate_up, ... inside moe).");
  for (const engine::EngineStats::LayerPartSeconds& t : s.layer_seconds) {
    o << kPrefix << "layer_seconds_total{layer=\"" << t.layer << "\",part=\"" << t.part << "\"} " << num(t.seconds) << "\n";
  }
  return o.str();
}

}  // namespace fp4moe::server
