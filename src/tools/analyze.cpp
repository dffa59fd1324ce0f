// `fp4moe analyze` computations and tables: see analyze.h for the formulas.
#include "tools/analyze.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>

#include "core/error.h"

namespace fp4moe::tools {
namespace {

constexpr const char* kP = "fp4moe:";

int64_t int_label(const PromSample& s, const std::string& label) {
  auto it = s.labels.find(label);
  FP4MOE_CHECK(it != s.labels.end()) << "metrics line " << s.line << ": " << s.name << " has no label " << label;
  char* end = nullptr;
  const long long v = std::strtoll(it->second.c_str(), &end, 10);
  FP4MOE_CHECK(!it->second.empty() && *end == '\0' && v >= 0)
      << "metrics line " << s.line << ": " << s.name << " label " << label << "=\"" << it->second
      << "\" is not a non-negative integer";
  return static_cast<int64_t>(v);
}

double roofline_seconds(double flops, double bytes, const Roofline& r) {
  return std::max(bytes / (r.hbm_gbps * 1e9), flops / (r.peak_tflops * 1e12));
}

// The four GEMMs of one MoE layer for A assignments over X active experts and T tokens.
std::vector<GemmRow> layer_gemms(double A, double X, double T, int64_t H, int64_t I, int64_t Is, double w,
                                 const Roofline& r) {
  const double h = static_cast<double>(H), i = static_cast<double>(I), is = static_cast<double>(Is);
  const double tpe = X > 0 ? A / X : 0.0;
  std::vector<GemmRow> g;
  g.push_back({"routed gate_up", 2 * I, H, X, tpe, 2 * A * 2 * i * h, X * 2 * i * h * w + A * (h + 2 * i) * 2, 0});
  g.push_back({"routed down", H, I, X, tpe, 2 * A * h * i, X * h * i * w + A * (i + h) * 2, 0});
  if (Is > 0) {
    g.push_back({"shared gate_up", 2 * Is, H, 1, T, 2 * T * 2 * is * h, 2 * is * h * w + T * (h + 2 * is) * 2, 0});
    g.push_back({"shared down", H, Is, 1, T, 2 * T * h * is, h * is * w + T * (is + h) * 2, 0});
  }
  for (GemmRow& row : g) row.roofline_s = roofline_seconds(row.flops, row.bytes, r);
  return g;
}

void set_gemm_achieved(GemmRow& g, double seconds) {
  g.measured_s = seconds;
  if (seconds <= 0) return;
  g.tflops = g.flops / seconds / 1e12;
  g.gbps = g.bytes / seconds / 1e9;
  g.frac_roofline = g.roofline_s / seconds;
}

void sum_gemms(LayerRow& row, const Roofline& r) {
  row.flops = row.bytes = 0;
  for (const GemmRow& g : row.gemms) {
    row.flops += g.flops;
    row.bytes += g.bytes;
  }
  row.roofline_s = roofline_seconds(row.flops, row.bytes, r);
}

void set_achieved(LayerRow& row, const Roofline& r) {
  if (row.moe_s <= 0) return;
  row.tflops = row.flops / row.moe_s / 1e12;
  row.gbps = row.bytes / row.moe_s / 1e9;
  row.frac_hbm = row.gbps / r.hbm_gbps;
  row.frac_peak = row.tflops / r.peak_tflops;
  row.frac_roofline = row.roofline_s / row.moe_s;
}

// Right-aligned text table; the first column left-aligned.
std::string table(const std::vector<std::string>& head, const std::vector<std::vector<std::string>>& rows) {
  std::vector<size_t> w(head.size());
  for (size_t c = 0; c < head.size(); ++c) w[c] = head[c].size();
  for (const auto& row : rows) {
    for (size_t c = 0; c < row.size() && c < w.size(); ++c) w[c] = std::max(w[c], row[c].size());
  }
  auto line = [&](const std::vector<std::string>& cells) {
    std::string s;
    for (size_t c = 0; c < head.size(); ++c) {
      const std::string& v = c < cells.size() ? cells[c] : std::string();
      s += c == 0 ? fmt::format("  {:<{}}", v, w[c]) : fmt::format("  {:>{}}", v, w[c]);
    }
    return s + "\n";
  };
  std::string out = line(head);
  std::vector<std::string> rule;
  for (size_t c = 0; c < head.size(); ++c) rule.push_back(std::string(w[c], '-'));
  out += line(rule);
  for (const auto& row : rows) out += line(row);
  return out;
}

std::string f(double v, int prec = 1) { return fmt::format("{:.{}f}", v, prec); }
std::string g4(double v) { return fmt::format("{:.4g}", v); }  // 4 significant digits, any magnitude
std::string pct(double v) {
  const double p = 100 * v;
  return p != 0 && p < 0.1 ? fmt::format("{:.2g}%", p) : fmt::format("{:.1f}%", p);
}
std::string us_or_dash(double s) { return s < 0 ? "-" : g4(s * 1e6); }

}  // namespace

std::string GemmRow::part() const {
  std::string p = name;
  std::replace(p.begin(), p.end(), ' ', '_');
  return p;
}

WeightFormat parse_weight_format(const std::string& s) {
  if (s == "nvfp4") return WeightFormat::kNvfp4;
  if (s == "bf16") return WeightFormat::kBf16;
  FP4MOE_FAIL() << "--weights \"" << s << "\": expected nvfp4 or bf16";
  return WeightFormat::kNvfp4;
}

const char* to_string(WeightFormat f) { return f == WeightFormat::kNvfp4 ? "nvfp4" : "bf16"; }

double bytes_per_weight(WeightFormat f) { return f == WeightFormat::kNvfp4 ? 0.5 + 1.0 / 16 : 2.0; }

WeightFormat checkpoint_weight_format(const model::ModelConfig& cfg) {
  const format::QuantConfig& q = cfg.quantization;
  if (q.nvfp4_by_default()) return WeightFormat::kNvfp4;
  if (q.quant_algo == "MIXED_PRECISION") {  // the routed experts' own entries in quantized_layers
    for (const auto& [module, algo] : q.quantized_layers) {
      if (module.find(".mlp.experts.") != std::string::npos && (algo == "NVFP4" || algo == "W4A16_NVFP4")) {
        return WeightFormat::kNvfp4;
      }
    }
  }
  return WeightFormat::kBf16;
}

Measured read_measured(const PromText& p) {
  Measured m;
  const std::string P = kP;
  // Counters only grow from 0: a negative or non-finite one is a corrupt copy, and would give negative rates.
  for (const PromSample& s : p.samples) {
    const bool counter =
        s.name.rfind(P, 0) == 0 && s.name.size() > 6 && s.name.compare(s.name.size() - 6, 6, "_total") == 0;
    FP4MOE_CHECK(!counter || (std::isfinite(s.value) && s.value >= 0))
        << "metrics line " << s.line << ": " << s.name << " = " << s.value << ", but a counter is finite and >= 0";
  }
  m.steps = p.value(P + "forward_steps_total");
  m.forward_tokens = p.value(P + "forward_tokens_total");
  m.forward_seconds = p.value(P + "forward_seconds_total");
  m.step_seconds = p.get(P + "step_seconds_total").value_or(0.0);
  m.timed_steps = p.get(P + "layer_timed_steps_total").value_or(0.0);
  m.graph_steps = p.get(P + "cuda_graph_steps_total").value_or(0.0);
  m.prefix_queries = p.get(P + "prefix_cache_queries_total").value_or(0.0);
  m.prefix_hits = p.get(P + "prefix_cache_hits_total").value_or(0.0);
  m.prefix_tokens = p.get(P + "prefix_cache_tokens").value_or(0.0);
  const double dsum = p.get(P + "decode_batch_size_sum").value_or(0.0);
  const double dcount = p.get(P + "decode_batch_size_count").value_or(0.0);
  m.decode_batch_mean = dcount > 0 ? dsum / dcount : 0.0;

  std::map<int64_t, std::map<int64_t, double>> tokens;  // layer -> expert -> tokens
  for (const PromSample* s : p.find(P + "moe_expert_tokens_total")) {
    const int64_t layer = int_label(*s, "layer"), expert = int_label(*s, "expert");
    FP4MOE_CHECK(tokens[layer].emplace(expert, s->value).second)
        << "metrics line " << s->line << ": second sample for layer " << layer << " expert " << expert;
  }
  for (const auto& [layer, by_expert] : tokens) {
    Measured::MoeLayer L;
    L.layer = layer;
    const int64_t n = static_cast<int64_t>(by_expert.size());
    FP4MOE_CHECK(by_expert.rbegin()->first == n - 1)
        << "metrics: layer " << layer << " has " << n << " expert counters but the largest expert index is "
        << by_expert.rbegin()->first << " (expected 0.." << n - 1 << ")";
    for (const auto& [e, v] : by_expert) L.expert_tokens.push_back(v);
    L.active_experts = p.value(P + "moe_active_experts_total", {{"layer", std::to_string(layer)}});
    m.moe_layers.push_back(std::move(L));
  }
  for (const PromSample* s : p.find(P + "layer_seconds_total")) {
    auto it = s->labels.find("part");
    FP4MOE_CHECK(it != s->labels.end()) << "metrics line " << s->line << ": layer_seconds_total has no label part";
    m.layer_seconds.push_back({int_label(*s, "layer"), it->second, s->value});
  }
  const char* les[] = {"0", "7", "15", "63", "+Inf"};
  double prev = 0;
  for (size_t b = 0; b < 5; ++b) {
    const double cum = p.value(P + "moe_expert_step_tokens_bucket", {{"le", les[b]}});
    FP4MOE_CHECK(cum >= prev) << "metrics: moe_expert_step_tokens_bucket{le=\"" << les[b] << "\"} = " << cum
                              << " is below the previous bucket " << prev;
    m.step_token_buckets[b] = cum - prev;
    prev = cum;
  }
  return m;
}

void check_roofline(const Roofline& r) {
  FP4MOE_CHECK(std::isfinite(r.hbm_gbps) && std::isfinite(r.peak_tflops) && r.hbm_gbps > 0 && r.peak_tflops > 0)
      << "rooflines must be finite and positive: --hbm-gbps " << r.hbm_gbps << ", --peak-tflops " << r.peak_tflops;
}

Analysis analyze(const Measured& m, const model::ModelConfig& cfg, WeightFormat weights, const Roofline& r,
                 int64_t max_running_requests, const std::vector<double>& multipliers) {
  check_roofline(r);
  FP4MOE_CHECK(m.steps > 0) << "fp4moe:forward_steps_total = " << m.steps << ": no forward step yet; send requests first";
  FP4MOE_CHECK(!m.moe_layers.empty()) << "metrics have no fp4moe:moe_expert_tokens_total series (" << cfg.summary()
                                      << "): is this a MoE model's server?";
  FP4MOE_CHECK(cfg.num_experts_per_tok > 0 && cfg.moe_intermediate_size > 0)
      << cfg.source << ": num_experts_per_tok " << cfg.num_experts_per_tok << ", moe_intermediate_size "
      << cfg.moe_intermediate_size << " must be positive";
  Analysis a;
  a.model = cfg.summary();
  a.weights = weights;
  a.roofline = r;
  a.n_experts = cfg.n_routed_experts;
  a.top_k = cfg.num_experts_per_tok;
  a.hidden = cfg.hidden_size;
  a.moe_intermediate = cfg.moe_intermediate_size;
  a.shared_intermediate = cfg.n_shared_experts * cfg.moe_intermediate_size;
  a.steps = m.steps;
  a.timed_steps = m.timed_steps;
  a.graph_steps = m.graph_steps;
  a.tokens_per_step = m.forward_tokens / m.steps;
  a.decode_batch_mean = m.decode_batch_mean;
  a.measured_tokens_per_s = m.forward_seconds > 0 ? m.forward_tokens / m.forward_seconds : 0.0;
  a.prefix_queries = m.prefix_queries;
  a.prefix_hits = m.prefix_hits;
  a.prefix_tokens = m.prefix_tokens;
  if (m.prefix_queries > 0) a.prefix_hit_rate = m.prefix_hits / m.prefix_queries;
  if (m.step_seconds > 0) {
    a.step_ms = 1e3 * m.step_seconds / m.steps;
    a.overhead_ms = 1e3 * std::max(0.0, m.step_seconds - m.forward_seconds) / m.steps;
    a.overhead_fraction = a.overhead_ms / a.step_ms;
  }
  double n_obs = 0;
  for (double b : m.step_token_buckets) n_obs += b;
  for (size_t b = 0; b < 5; ++b) a.step_token_fraction[b] = n_obs > 0 ? m.step_token_buckets[b] / n_obs : 0.0;

  const double w = bytes_per_weight(weights), k = static_cast<double>(a.top_k);
  std::map<std::pair<int64_t, std::string>, double> secs;
  for (const Measured::PartSeconds& s : m.layer_seconds) secs[{s.layer, s.part}] += s.seconds;
  auto per_step = [&](int64_t layer, const char* part) {
    auto it = secs.find({layer, part});
    return m.timed_steps > 0 && it != secs.end() ? it->second / m.timed_steps : -1.0;
  };

  a.total.layer = -1;
  bool all_moe_timed = true, all_attn_timed = true;
  double sum_attn = 0, sum_moe = 0;
  for (const Measured::MoeLayer& L : m.moe_layers) {
    FP4MOE_CHECK(L.layer < cfg.num_hidden_layers && cfg.is_moe_layer(L.layer))
        << "metrics report MoE layer " << L.layer << " but " << cfg.source << " (" << cfg.summary()
        << ") has no MoE layer " << L.layer << ": is --model the served model?";
    FP4MOE_CHECK(static_cast<int64_t>(L.expert_tokens.size()) == cfg.n_routed_experts)
        << "metrics report " << L.expert_tokens.size() << " experts in layer " << L.layer << " but " << cfg.source
        << " has n_routed_experts " << cfg.n_routed_experts << ": is --model the served model?";
    LayerRow row;
    row.layer = L.layer;
    double sum_c = 0;
    for (double c : L.expert_tokens) sum_c += c;
    row.assignments = sum_c / m.steps;
    row.tokens = row.assignments / k;
    row.active_experts = L.active_experts / m.steps;
    row.tokens_per_expert = row.active_experts > 0 ? row.assignments / row.active_experts : 0.0;
    row.gemms = layer_gemms(row.assignments, row.active_experts, row.tokens, a.hidden, a.moe_intermediate,
                            a.shared_intermediate, w, r);
    sum_gemms(row, r);
    for (GemmRow& g : row.gemms) {
      const std::string part = "moe." + g.part();
      set_gemm_achieved(g, per_step(L.layer, part.c_str()));
    }
    row.attention_s = per_step(L.layer, "attention");
    row.moe_s = per_step(L.layer, "moe");
    set_achieved(row, r);
    a.total.tokens += row.tokens;
    a.total.assignments += row.assignments;
    a.total.active_experts += row.active_experts;
    a.total.flops += row.flops;
    a.total.bytes += row.bytes;
    a.total.roofline_s += row.roofline_s;
    all_moe_timed = all_moe_timed && row.moe_s >= 0;
    all_attn_timed = all_attn_timed && row.attention_s >= 0;
    sum_attn += std::max(row.attention_s, 0.0);
    sum_moe += std::max(row.moe_s, 0.0);
    a.layers.push_back(std::move(row));
  }
  const double n_layers = static_cast<double>(a.layers.size());
  a.total.tokens /= n_layers;
  a.total.tokens_per_expert = a.total.active_experts > 0 ? a.total.assignments / a.total.active_experts : 0.0;
  a.total.assignments /= n_layers;  // shown as means per layer; FLOPs, bytes and times stay sums
  a.total.active_experts /= n_layers;
  if (all_attn_timed) a.total.attention_s = sum_attn;
  if (all_moe_timed) {
    a.total.moe_s = sum_moe;
    set_achieved(a.total, r);
  }
  // The per-GEMM totals: each GEMM summed over the MoE layers (measured only when every layer has it).
  std::vector<bool> gemm_timed;
  for (const LayerRow& row : a.layers) {
    for (size_t g = 0; g < row.gemms.size(); ++g) {
      if (a.total.gemms.size() <= g) a.total.gemms.push_back({row.gemms[g].name, row.gemms[g].n, row.gemms[g].k, 0, 0, 0, 0, 0});
      GemmRow& t = a.total.gemms[g];
      t.matrices += row.gemms[g].matrices / n_layers;  // mean per layer
      t.tokens_per_matrix += row.gemms[g].tokens_per_matrix / n_layers;
      t.flops += row.gemms[g].flops;
      t.bytes += row.gemms[g].bytes;
      t.roofline_s += row.gemms[g].roofline_s;
      if (gemm_timed.size() <= g) gemm_timed.push_back(true);
      gemm_timed[g] = gemm_timed[g] && row.gemms[g].measured_s > 0;
      if (row.gemms[g].measured_s > 0) t.measured_s = std::max(t.measured_s, 0.0) + row.gemms[g].measured_s;
    }
  }
  for (size_t g = 0; g < a.total.gemms.size(); ++g) {
    GemmRow& t = a.total.gemms[g];
    set_gemm_achieved(t, gemm_timed[g] ? t.measured_s : -1.0);
  }

  // What-if: the decode batch scaled with max-running-requests, routing as measured.
  a.what_if_from_decode = m.decode_batch_mean > 0;
  const double base = a.what_if_from_decode ? m.decode_batch_mean : a.tokens_per_step;
  std::vector<double> mults = {1.0};
  mults.insert(mults.end(), multipliers.begin(), multipliers.end());
  for (double mult : mults) {
    WhatIfRow wr;
    wr.multiplier = mult;
    wr.max_running_requests = max_running_requests > 0 ? static_cast<int64_t>(std::llround(mult * max_running_requests)) : 0;
    wr.decode_batch = mult * base;
    double t_bytes = 0, t_flops = 0;
    for (const Measured::MoeLayer& L : m.moe_layers) {
      double sum_c = 0;
      for (double c : L.expert_tokens) sum_c += c;
      const double E = static_cast<double>(L.expert_tokens.size());
      double active = 0;
      for (double c : L.expert_tokens) {
        const double p = std::clamp(sum_c > 0 ? k * c / sum_c : k / E, 0.0, 1.0);
        active += 1.0 - std::pow(1.0 - p, wr.decode_batch);
      }
      const double A = wr.decode_batch * k;
      LayerRow lr;
      lr.gemms = layer_gemms(A, active, wr.decode_batch, a.hidden, a.moe_intermediate, a.shared_intermediate, w, r);
      sum_gemms(lr, r);
      wr.active_experts += active / n_layers;
      wr.tokens_per_expert += (active > 0 ? A / active : 0.0) / n_layers;
      wr.flops += lr.flops;
      wr.bytes += lr.bytes;
      wr.roofline_s += lr.roofline_s;
      t_bytes += lr.bytes / (r.hbm_gbps * 1e9);
      t_flops += lr.flops / (r.peak_tflops * 1e12);
    }
    wr.bound = t_bytes >= t_flops ? "hbm" : "compute";
    wr.frac_peak = wr.roofline_s > 0 ? wr.flops / wr.roofline_s / (r.peak_tflops * 1e12) : 0.0;
    wr.tokens_per_s = wr.roofline_s > 0 ? wr.decode_batch / wr.roofline_s : 0.0;
    a.what_if.push_back(std::move(wr));
  }
  return a;
}

std::string format_analysis(const Analysis& a) {
  std::string o;
  o += fmt::format("fp4moe analyze: {}\n", a.model);
  o += fmt::format("MoE: E={} top-{} H={} I={} shared I={}; weights {} ({} B/weight), activations bf16\n", a.n_experts,
                   a.top_k, a.hidden, a.moe_intermediate, a.shared_intermediate, to_string(a.weights),
                   bytes_per_weight(a.weights));
  o += fmt::format("rooflines: HBM {} GB/s, tensor {} TFLOP/s\n", a.roofline.hbm_gbps, a.roofline.peak_tflops);
  o += fmt::format("steps {} (with layer times: {}, as CUDA graphs: {}), tokens/step {}, mean decode batch {}, forward {} "
                   "tokens/s\n\n",
                   a.steps, a.timed_steps, a.graph_steps, f(a.tokens_per_step, 2), f(a.decode_batch_mean, 2),
                   f(a.measured_tokens_per_s));
  if (a.step_ms >= 0) {
    o.insert(o.size() - 1, fmt::format("engine step {} ms, of which outside the forward (scheduling, sampling, "
                                       "streaming, bookkeeping) {} ms = {:.1f}%\n",
                                       f(a.step_ms, 3), f(a.overhead_ms, 3), 100 * a.overhead_fraction));
  }
  if (a.prefix_hit_rate >= 0) {
    o.insert(o.size() - 1, fmt::format("prefix cache: {:.1f}% of prompt tokens found ({:.0f} of {:.0f}), {:.0f} "
                                       "tokens held\n",
                                       100 * a.prefix_hit_rate, a.prefix_hits, a.prefix_queries, a.prefix_tokens));
  }

  o += "Tokens one expert receives in one step (all MoE layers, measured):\n";
  {
    std::vector<std::string> head = {"tokens"}, row = {"share of expert-steps"};
    for (size_t b = 0; b < 5; ++b) {
      head.push_back(kStepTokenBuckets[b]);
      row.push_back(pct(a.step_token_fraction[b]));
    }
    o += table(head, {row}) + "\n";
  }

  o += "Per GEMM, per step, summed over the MoE layers (tok/expert: rows per weight matrix, mean per layer):\n";
  {
    std::vector<std::vector<std::string>> rows;
    for (const GemmRow& g : a.total.gemms) {
      const double ai = g.bytes > 0 ? g.flops / g.bytes : 0.0;
      const bool t = g.measured_s > 0;
      rows.push_back({g.name, fmt::format("{}x{}", g.n, g.k), f(g.matrices), f(g.tokens_per_matrix, 2),
                      g4(g.flops / 1e9), g4(g.bytes / 1e6), f(ai, 2), g4(g.roofline_s * 1e6), us_or_dash(g.measured_s),
                      t ? g4(g.tflops) : "-", t ? g4(g.gbps) : "-", t ? pct(g.gbps / a.roofline.hbm_gbps) : "-",
                      t ? pct(g.frac_roofline) : "-"});
    }
    o += table({"gemm", "NxK", "matrices", "tok/expert", "GFLOP", "MB", "FLOP/B", "roofline us", "measured us",
                "TFLOP/s", "GB/s", "% HBM", "% roofline"},
               rows);
    if (std::none_of(a.total.gemms.begin(), a.total.gemms.end(), [](const GemmRow& g) { return g.measured_s > 0; })) {
      o += "  (measured per-GEMM times need parts moe.routed_gate_up, ... in layer_seconds_total: start `fp4moe serve "
           "--device cuda` with --time-moe-gemms; see the layer table)\n";
    }
    o += "\n";
  }

  o += "Per MoE layer, per step (moe us: measured router + experts + shared; achieved = the four GEMMs' FLOPs and\n"
       "bytes over it; % roofline = max(bytes/HBM, FLOPs/peak) / measured; row all: tokens and active experts\n"
       "are means per layer, the rest sums):\n";
  {
    std::vector<std::vector<std::string>> rows;
    auto add = [&](const LayerRow& L, const std::string& name) {
      const bool t = L.moe_s > 0;
      rows.push_back({name, f(L.tokens, 2), f(L.active_experts, 1), f(L.tokens_per_expert, 2), g4(L.flops / 1e9),
                      g4(L.bytes / 1e6), us_or_dash(L.attention_s), us_or_dash(L.moe_s), t ? g4(L.tflops) : "-",
                      t ? g4(L.gbps) : "-", t ? pct(L.frac_hbm) : "-", t ? pct(L.frac_peak) : "-",
                      g4(L.roofline_s * 1e6), t ? pct(L.frac_roofline) : "-"});
    };
    for (const LayerRow& L : a.layers) add(L, std::to_string(L.layer));
    add(a.total, "all");
    o += table({"layer", "tokens", "active", "tok/expert", "GFLOP", "MB", "attn us", "moe us", "TFLOP/s", "GB/s",
                "% HBM", "% peak", "roofline us", "% roofline"},
               rows);
    if (a.timed_steps <= 0) o += "  (no layer times in these metrics: the served model does not report them)\n";
    o += "\n";
  }

  o += "What raising --max-running-requests would do (decode batch scaled, routing as measured; MoE GEMMs only):\n";
  if (!a.what_if_from_decode) {
    o += fmt::format(
        "  (no decode step in these metrics: the batch below is the mean tokens per step, {}, prefill included)\n",
        f(a.tokens_per_step, 1));
  }
  {
    std::vector<std::vector<std::string>> rows;
    for (const WhatIfRow& w : a.what_if) {
      const std::string mrr = w.max_running_requests > 0 ? fmt::format("{} (x{})", w.max_running_requests, w.multiplier)
                                                         : fmt::format("x{}", w.multiplier);
      rows.push_back({mrr, f(w.decode_batch, 1), f(w.active_experts, 1), f(w.tokens_per_expert, 2), g4(w.bytes / 1e9),
                      g4(w.flops / 1e12), g4(w.roofline_s * 1e3), w.bound, pct(w.frac_peak), f(w.tokens_per_s, 0)});
    }
    o += table({"max-running", "decode batch", "active", "tok/expert", "GB/step", "TFLOP/step", "roofline ms", "bound",
                "% peak", "tok/s ceiling"},
               rows);
  }
  return o;
}

nlohmann::json analysis_json(const Analysis& a) {
  using nlohmann::json;
  auto gemm = [](const GemmRow& g) {
    json j{{"name", g.name}, {"n", g.n}, {"k", g.k}, {"matrices", g.matrices}, {"tokens_per_matrix", g.tokens_per_matrix},
           {"flops", g.flops}, {"bytes", g.bytes}, {"roofline_s", g.roofline_s},
           {"measured_s", g.measured_s > 0 ? json(g.measured_s) : json()}};
    if (g.measured_s > 0) {
      j["tflops"] = g.tflops;
      j["gbps"] = g.gbps;
      j["frac_roofline"] = g.frac_roofline;
    }
    return j;
  };
  auto layer = [&](const LayerRow& L) {
    json j{{"layer", L.layer}, {"tokens", L.tokens}, {"assignments", L.assignments}, {"active_experts", L.active_experts},
           {"tokens_per_expert", L.tokens_per_expert}, {"flops", L.flops}, {"bytes", L.bytes}, {"roofline_s", L.roofline_s},
           {"attention_s", L.attention_s >= 0 ? json(L.attention_s) : json()},
           {"moe_s", L.moe_s >= 0 ? json(L.moe_s) : json()}};
    if (L.moe_s > 0) {
      j["tflops"] = L.tflops;
      j["gbps"] = L.gbps;
      j["frac_hbm"] = L.frac_hbm;
      j["frac_peak"] = L.frac_peak;
      j["frac_roofline"] = L.frac_roofline;
    }
    j["gemms"] = json::array();
    for (const GemmRow& g : L.gemms) j["gemms"].push_back(gemm(g));
    return j;
  };
  json j{{"schema", "fp4moe.analyze.v1"},
         {"model", a.model},
         {"weights", to_string(a.weights)},
         {"bytes_per_weight", bytes_per_weight(a.weights)},
         {"hbm_gbps", a.roofline.hbm_gbps},
         {"peak_tflops", a.roofline.peak_tflops},
         {"n_experts", a.n_experts},
         {"top_k", a.top_k},
         {"hidden", a.hidden},
         {"moe_intermediate", a.moe_intermediate},
         {"shared_intermediate", a.shared_intermediate},
         {"steps", a.steps},
         {"timed_steps", a.timed_steps},
         {"graph_steps", a.graph_steps},
         {"tokens_per_step", a.tokens_per_step},
         {"decode_batch_mean", a.decode_batch_mean},
         {"measured_tokens_per_s", a.measured_tokens_per_s},
         {"step_ms", a.step_ms},
         {"overhead_ms", a.overhead_ms},
         {"overhead_fraction", a.overhead_fraction},
         {"prefix_hit_rate", a.prefix_hit_rate},
         {"prefix_hits", a.prefix_hits},
         {"prefix_queries", a.prefix_queries},
         {"prefix_tokens", a.prefix_tokens}};
  json dist = json::object();
  for (size_t b = 0; b < 5; ++b) dist[kStepTokenBuckets[b]] = a.step_token_fraction[b];
  j["step_token_fraction"] = dist;
  j["layers"] = json::array();
  for (const LayerRow& L : a.layers) j["layers"].push_back(layer(L));
  j["total"] = layer(a.total);
  j["what_if_batch"] = a.what_if_from_decode ? "decode_batch_mean" : "tokens_per_step";
  j["what_if"] = json::array();
  for (const WhatIfRow& w : a.what_if) {
    j["what_if"].push_back({{"multiplier", w.multiplier}, {"max_running_requests", w.max_running_requests},
                            {"decode_batch", w.decode_batch}, {"active_experts", w.active_experts},
                            {"tokens_per_expert", w.tokens_per_expert}, {"flops", w.flops}, {"bytes", w.bytes},
                            {"roofline_s", w.roofline_s}, {"bound", w.bound}, {"frac_peak", w.frac_peak},
                            {"tokens_per_s", w.tokens_per_s}});
  }
  return j;
}

}  // namespace fp4moe::tools
