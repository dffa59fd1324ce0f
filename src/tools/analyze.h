// `fp4moe analyze`: what the serving engine's measured counters say about its MoE GEMMs. From the
// /metrics text (per-expert token counters, active experts, the per-step expert-token histogram and
// the measured per-layer seconds) and the model config, per MoE layer and step:
//
//   S  = fp4moe:forward_steps_total                 (steps)
//   A  = sum_e moe_expert_tokens_total{layer,e} / S (token-expert assignments per step)
//   T  = A / top_k                                  (tokens through the layer per step)
//   X  = moe_active_experts_total{layer} / S        (experts that received >= 1 token per step)
//   tokens per active expert = A / X
//   routed gate_up  N=2I K=H: FLOPs 2 A 2I H, bytes X 2I H w + A (H + 2I) 2
//   routed down     N=H  K=I: FLOPs 2 A H I,  bytes X H I w  + A (I + H) 2
//   shared gate_up  N=2Is K=H (Is = n_shared_experts I), T rows: FLOPs 2 T 2Is H, bytes 2Is H w + T (H + 2Is) 2
//   shared down     N=H K=Is:                               FLOPs 2 T H Is,  bytes H Is w + T (Is + H) 2
//   w = 0.5 + 1/16 B per weight (NVFP4 codes + one e4m3 scale per 16) or 2 (BF16); activations BF16.
//   measured t = layer_seconds_total{layer,part="moe"} / layer_timed_steps_total
//   achieved TFLOP/s = FLOPs / t, GB/s = bytes / t; % of HBM and % of tensor peak against the given
//   rooflines; roofline t* = max(bytes / HBM, FLOPs / peak); fraction of roofline = t* / t.
// What-if (max-running-requests x m): decode batch B' = m B (B = measured mean decode batch, else
// T, and the table says so); each expert e is picked by a token with p_e = top_k c_e / sum(c) (the measured routing),
// so the expected active experts are sum_e 1 - (1 - p_e)^B' (at most E) and tokens per active expert B' top_k / active;
// the MoE roofline time per step sums t* over the MoE layers and the ceiling is B' / that time tokens/s (MoE GEMMs
// only: attention and dense layers excluded). Per-GEMM achieved rates need per-GEMM times: a model that reports the
// parts "moe.routed_gate_up", "moe.routed_down", "moe.shared_gate_up", "moe.shared_down" (subsets of "moe") gets them
// filled; the CPU models report "attention", "mlp" and "moe" only, so those columns print "-". Tested by
// tests/tools/test_analyze.cpp (hand-computed numbers on a fixed metrics text) and tests/tools/test_analyze_e2e.cpp
// (the real server binary, then `fp4moe analyze --url`).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/config.h"
#include "tools/prometheus_text.h"

namespace fp4moe::tools {

enum class WeightFormat { kNvfp4, kBf16 };
WeightFormat parse_weight_format(const std::string& s);  // "nvfp4" | "bf16"; fails naming the value
const char* to_string(WeightFormat f);
double bytes_per_weight(WeightFormat f);  // 0.5625 or 2
// The routed experts' format a checkpoint with this config loads: nvfp4 when its quantization config makes every
// Linear NVFP4, or (MIXED_PRECISION) lists routed experts as NVFP4 in quantized_layers; bf16 otherwise. serve labels
// its metrics with it (fp4moe:model_info's expert_weights; --dummy-weights under --load-format dummy), which
// analyze --weights auto prefers to reading the config itself.
WeightFormat checkpoint_weight_format(const model::ModelConfig& cfg);

struct Roofline {
  double hbm_gbps = 4200;     // H200 device-to-device copy, BENCHMARKS.md
  double peak_tflops = 780;   // H200 BF16 dense tensor peak (cuBLAS), BENCHMARKS.md
};
// Fails naming the flags unless both rooflines are finite and positive (analyze checks it; the command first).
void check_roofline(const Roofline& r);

// Distribution buckets of moe_expert_step_tokens: 0, 1-7, 8-15, 16-63, 64+ tokens.
inline constexpr std::array<const char*, 5> kStepTokenBuckets = {"0", "1-7", "8-15", "16-63", "64+"};

// The measured series, read from /metrics.
struct Measured {
  double steps = 0;               // forward_steps_total
  double forward_tokens = 0;      // forward_tokens_total
  double forward_seconds = 0;     // forward_seconds_total
  double step_seconds = 0;        // step_seconds_total (0 when absent): engine steps incl. the forward
  double timed_steps = 0;         // layer_timed_steps_total (0: the model reported no layer times)
  double graph_steps = 0;         // cuda_graph_steps_total (0 when absent)
  double decode_batch_mean = 0;   // decode_batch_size _sum / _count (0 when no decode step yet)
  // The prefix cache (0 when absent): prompt tokens looked up / found, tokens it holds.
  double prefix_queries = 0, prefix_hits = 0, prefix_tokens = 0;
  struct MoeLayer {
    int64_t layer = 0;
    std::vector<double> expert_tokens;  // [E] moe_expert_tokens_total
    double active_experts = 0;          // moe_active_experts_total
  };
  std::vector<MoeLayer> moe_layers;     // ascending layer
  struct PartSeconds {
    int64_t layer = 0;
    std::string part;
    double seconds = 0;
  };
  std::vector<PartSeconds> layer_seconds;       // as exported
  std::array<double, 5> step_token_buckets{};   // observations per bucket (not cumulative)
};

// Reads the series above; throws fp4moe::Error naming a missing or malformed series.
Measured read_measured(const PromText& metrics);

struct GemmRow {
  std::string name;             // "routed gate_up", "routed down", "shared gate_up", "shared down"
  int64_t n = 0, k = 0;
  double matrices = 0;          // weight matrices streamed per step (active experts, or 1 shared)
  double tokens_per_matrix = 0; // rows each one multiplies (tokens per active expert, or T)
  double flops = 0, bytes = 0;  // per step, per layer
  double roofline_s = 0;        // max(bytes / HBM, flops / peak)
  // Measured, when the model reports part "moe.<part>" (e.g. "moe.routed_gate_up"); -1 otherwise.
  double measured_s = -1;
  double tflops = 0, gbps = 0, frac_roofline = 0;
  std::string part() const;     // "routed_gate_up", ...
};

struct LayerRow {
  int64_t layer = 0;
  double tokens = 0;            // T per step
  double assignments = 0;       // A per step
  double active_experts = 0;    // X per step
  double tokens_per_expert = 0; // A / X
  double flops = 0, bytes = 0;  // the four GEMMs, per step
  double roofline_s = 0;
  double attention_s = -1;      // measured per step; -1 when not reported
  double moe_s = -1;
  double tflops = 0, gbps = 0, frac_hbm = 0, frac_peak = 0, frac_roofline = 0;  // 0 when moe_s < 0
  std::vector<GemmRow> gemms;
};

struct WhatIfRow {
  double multiplier = 1;
  int64_t max_running_requests = 0;  // 0 when the current value is unknown
  double decode_batch = 0;
  double active_experts = 0;         // mean over MoE layers
  double tokens_per_expert = 0;      // mean over MoE layers
  double flops = 0, bytes = 0;       // all MoE layers per step
  double roofline_s = 0;             // all MoE layers per step
  std::string bound;                 // "hbm" or "compute"
  double frac_peak = 0;              // FLOPs / roofline_s / peak
  double tokens_per_s = 0;           // decode_batch / roofline_s
};

struct Analysis {
  std::string model;                // config summary
  WeightFormat weights = WeightFormat::kNvfp4;
  Roofline roofline;
  int64_t n_experts = 0, top_k = 0, hidden = 0, moe_intermediate = 0, shared_intermediate = 0;
  double steps = 0, timed_steps = 0, graph_steps = 0, tokens_per_step = 0, decode_batch_mean = 0;
  double measured_tokens_per_s = 0;  // forward_tokens / forward_seconds
  // Engine time per step outside the model forward (scheduling, sampling, streaming, bookkeeping):
  // (step_seconds - forward_seconds) / steps, and as a fraction of the step; -1 without step_seconds.
  double step_ms = -1, overhead_ms = -1, overhead_fraction = -1;
  // Prefix cache: prompt tokens found / looked up (-1 when nothing was looked up), tokens held.
  double prefix_hit_rate = -1, prefix_hits = 0, prefix_queries = 0, prefix_tokens = 0;
  std::array<double, 5> step_token_fraction{};  // of expert-steps in each kStepTokenBuckets bucket
  std::vector<LayerRow> layers;
  // Over the MoE layers: tokens, assignments, active_experts are means per layer; flops, bytes,
  // times sums; tokens_per_expert = sum A / sum X; gemms: each GEMM's sums (matrices and tokens
  // per matrix: means per layer).
  LayerRow total;
  std::vector<WhatIfRow> what_if;    // x1 (measured), then the multipliers
  bool what_if_from_decode = true;   // false: no decode step measured, the batch is tokens_per_step (said so)
};

// max_running_requests: the server's current value (0 = unknown, rows then show only the multiplier).
Analysis analyze(const Measured& m, const model::ModelConfig& cfg, WeightFormat weights, const Roofline& roofline,
                 int64_t max_running_requests = 0, const std::vector<double>& multipliers = {2, 4, 8});

std::string format_analysis(const Analysis& a);   // aligned text tables
nlohmann::json analysis_json(const Analysis& a);  // schema "fp4moe.analyze.v1"

}  // namespace fp4moe::tools
