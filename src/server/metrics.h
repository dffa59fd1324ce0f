// Prometheus text exposition (format 0.0.4) of the engine's statistics for GET /metrics, every name
// with the `fp4moe:` prefix (SGLang's `sglang:` names where one exists):
//   counters   fp4moe:prompt_tokens_total, generation_tokens_total, num_requests_total,
//              num_finished_requests_total, num_aborted_requests_total, num_rejected_requests_total,
//              num_preemptions_total, forward_steps_total, continuous_decode_steps_total,
//              http_errors_total{code}, moe_expert_tokens_total{layer, expert},
//              moe_active_experts_total{layer}, layer_seconds_total{layer, part}, layer_timed_steps_total
//   gauges     fp4moe:num_running_reqs, num_queue_reqs, num_used_tokens, max_total_num_tokens,
//              token_usage (KV fraction), is_ready, model_info{model_path, served_model_name} (always 1: the
//              labels say which model the series are about, so a saved copy can be analyzed without --model)
//   histograms fp4moe:time_to_first_token_seconds, inter_token_latency_seconds,
//              e2e_request_latency_seconds, decode_batch_size, moe_expert_step_tokens
// `fp4moe analyze` (tools/analyze.h) reads the MoE and layer-time series.
// Tested by tests/server/test_server_e2e.cpp, which parses the text with its own parser, and
// tests/tools/test_analyze_e2e.cpp (the MoE and layer-time series).
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "engine/engine.h"

namespace fp4moe::server {

// HTTP-side counts the engine does not see (error replies by status code).
struct HttpCounters {
  std::map<int, uint64_t> errors_by_status;
};

// Which model the server serves: the labels of fp4moe:model_info.
struct ServedModel {
  std::string model_path;  // as launched ("(embedded default)" when none was given)
  std::string served_model_name;
  std::string expert_weights;  // "nvfp4" / "bf16": the routed experts' format (analyze's bytes); empty: not said
};

std::string render_metrics(const engine::EngineStats& stats, const HttpCounters& http, const ServedModel& model = {});

}  // namespace fp4moe::server
