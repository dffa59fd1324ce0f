// `fp4moe analyze` pieces on the CPU: the Prometheus text reader (labels, escapes, comments,
// timestamps, special values, and each malformed line rejected with its line number) and the
// analysis on a fixed metrics text whose numbers are computed by hand below (tokens per expert,
// FLOPs, bytes, achieved rates, roofline fractions, the bucket shares, the what-if rows); and the
// producer side: the CPU models' ForwardTrace::layer_times (attention then mlp/moe per layer, in
// layer order, positive) on the golden glm4_moe_tiny and glm5_tiny checkpoints.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "core/error.h"
#include "model/causal_lm.h"
#include "model/config.h"
#include "model/registry.h"
#include "testing/testing.h"
#include "tools/analyze.h"
#include "tools/prometheus_text.h"

namespace {

using fp4moe::tools::parse_prometheus_text;

TEST(PrometheusText, LabelsEscapesCommentsAndValues) {
  const std::string text =
      "# HELP fp4moe:x_total Things, counted.\n"
      "# TYPE fp4moe:x_total counter\n"
      "# a plain comment\n"
      "\n"
      "fp4moe:x_total{a=\"x\\\"y\",b=\"line\\nnext\", c = \"back\\\\slash\"} 1.5\n"
      "fp4moe:x_total{a=\"2\",} 3 1700000000\n"
      "plain 2e3\r\n"
      "inf_metric +Inf\n"
      "nan_metric NaN\n";
  const auto m = parse_prometheus_text(text);
  ASSERT_EQ(m.samples.size(), 5u);
  EXPECT_EQ(m.types.at("fp4moe:x_total"), "counter");
  EXPECT_EQ(m.help.at("fp4moe:x_total"), "Things, counted.");
  const auto& s = m.samples[0];
  EXPECT_EQ(s.line, 5);
  EXPECT_EQ(s.labels.at("a"), "x\"y");
  EXPECT_EQ(s.labels.at("b"), "line\nnext");
  EXPECT_EQ(s.labels.at("c"), "back\\slash");
  EXPECT_EQ(s.value, 1.5);
  EXPECT_EQ(m.value("fp4moe:x_total", {{"a", "2"}}), 3.0);
  EXPECT_EQ(m.value("plain"), 2000.0);
  EXPECT_TRUE(std::isinf(m.value("inf_metric")));
  EXPECT_TRUE(std::isnan(m.value("nan_metric")));
  EXPECT_EQ(m.find("fp4moe:x_total").size(), 2u);
  EXPECT_FALSE(m.get("fp4moe:x_total", {{"a", "3"}}).has_value());
  try {
    m.value("fp4moe:x_total", {{"a", "3"}});
    FAIL() << "a missing series must throw";
  } catch (const fp4moe::Error& e) {
    EXPECT_NE(std::string(e.what()).find("fp4moe:x_total{a=\"3\"} is missing"), std::string::npos) << e.what();
  }
}

// Each bad line sits at line 3 after two good ones; the error names line 3 and the problem.
TEST(PrometheusText, BadLinesNameTheirLineNumber) {
  const struct {
    const char* line;
    const char* expect;
  } cases[] = {
      {"m{a=\"x} 1", "unterminated label value"},
      {"m 1.5x", "sample value \"1.5x\" is not a number"},
      {"m inf", "sample value \"inf\" is not a number"},
      {"m{a=x} 1", "expected '\"' opening a label value"},
      {"m{a=\"1\"}", "expected a space before the sample value"},
      {"m ", "expected a sample value"},
      {"9m 1", "expected a metric name"},
      {"m{1a=\"1\"} 1", "expected a label name"},
      {"m{a=\"1\" b=\"2\"} 1", "expected ',' or '}' after a label value"},
      {"m{a=\"1\",a=\"2\"} 1", "label a appears twice"},
      {"m{a=\"\\q\"} 1", "unknown escape \\q"},
      {"m 1 12x", "timestamp \"12x\" is not an integer"},
      {"m 1 12 extra", "unexpected text after the timestamp"},
      {"# TYPE m bogus", "unknown metric type \"bogus\""},
      {"# TYPE good counter", "second # TYPE line for good"},
  };
  for (const auto& c : cases) {
    const std::string text = std::string("# TYPE good counter\ngood 1\n") + c.line + "\n";
    try {
      parse_prometheus_text(text);
      ADD_FAILURE() << "accepted: " << c.line;
    } catch (const fp4moe::Error& e) {
      const std::string msg = e.what();
      EXPECT_EQ(msg.rfind("metrics line 3 column ", 0), 0u) << c.line << " -> " << msg;
      EXPECT_NE(msg.find(c.expect), std::string::npos) << c.line << " -> " << msg;
    }
  }
  // A series given twice (label order aside) is refused naming both lines; the same name with other labels is not.
  try {
    parse_prometheus_text("m{a=\"1\",b=\"2\"} 1\nm{a=\"2\",b=\"2\"} 2\nm{b=\"2\",a=\"1\"} 3\n");
    ADD_FAILURE() << "a duplicate series accepted";
  } catch (const fp4moe::Error& e) {
    EXPECT_NE(std::string(e.what()).find("metrics line 3: series m{a=\"1\",b=\"2\"} was already given on line 1"),
              std::string::npos)
        << e.what();
  }
}

// Three layers (0 dense, 1 and 2 MoE), E=4 top-2, H=64, I=32, one shared expert.
fp4moe::model::ModelConfig tiny_config() {
  fp4moe::model::ModelConfig c;
  c.source = "test config";
  c.architecture = "GlmMoeDsaForCausalLM";
  c.num_hidden_layers = 3;
  c.mlp_layer_types = {"dense", "sparse", "sparse"};
  c.hidden_size = 64;
  c.moe_intermediate_size = 32;
  c.n_routed_experts = 4;
  c.num_experts_per_tok = 2;
  c.n_shared_experts = 1;
  return c;
}

// 10 steps of 4 tokens (decode batch 4); layer 1 routes 40/20/10/10 tokens (32 expert-steps
// active), layer 2 20 each (all 40 active); 8 of the 80 expert-steps empty, the rest 1-7 tokens.
const char* kMetrics = R"(# TYPE fp4moe:forward_steps_total counter
fp4moe:forward_steps_total 10
fp4moe:forward_tokens_total 40
fp4moe:forward_seconds_total 0.5
fp4moe:step_seconds_total 0.55
fp4moe:layer_timed_steps_total 10
fp4moe:cuda_graph_steps_total 7
fp4moe:decode_batch_size_sum 36
fp4moe:decode_batch_size_count 9
fp4moe:prefix_cache_queries_total 400
fp4moe:prefix_cache_hits_total 96
fp4moe:prefix_cache_tokens 128
fp4moe:moe_expert_tokens_total{layer="1",expert="0"} 40
fp4moe:moe_expert_tokens_total{layer="1",expert="1"} 20
fp4moe:moe_expert_tokens_total{layer="1",expert="2"} 10
fp4moe:moe_expert_tokens_total{layer="1",expert="3"} 10
fp4moe:moe_expert_tokens_total{layer="2",expert="0"} 20
fp4moe:moe_expert_tokens_total{layer="2",expert="1"} 20
fp4moe:moe_expert_tokens_total{layer="2",expert="2"} 20
fp4moe:moe_expert_tokens_total{layer="2",expert="3"} 20
fp4moe:moe_active_experts_total{layer="1"} 32
fp4moe:moe_active_experts_total{layer="2"} 40
fp4moe:moe_expert_step_tokens_bucket{le="0"} 8
fp4moe:moe_expert_step_tokens_bucket{le="7"} 80
fp4moe:moe_expert_step_tokens_bucket{le="15"} 80
fp4moe:moe_expert_step_tokens_bucket{le="63"} 80
fp4moe:moe_expert_step_tokens_bucket{le="+Inf"} 80
fp4moe:layer_seconds_total{layer="0",part="attention"} 0.001
fp4moe:layer_seconds_total{layer="0",part="mlp"} 0.001
fp4moe:layer_seconds_total{layer="1",part="attention"} 0.002
fp4moe:layer_seconds_total{layer="1",part="moe"} 0.001
fp4moe:layer_seconds_total{layer="2",part="attention"} 0.002
fp4moe:layer_seconds_total{layer="2",part="moe"} 0.002
)";

TEST(Analyze, HandComputedNumbers) {
  using namespace fp4moe::tools;
  const Measured m = read_measured(parse_prometheus_text(kMetrics));
  const Roofline r{4200, 780};
  const Analysis a = analyze(m, tiny_config(), WeightFormat::kNvfp4, r, /*max_running_requests=*/4);
  EXPECT_DOUBLE_EQ(a.tokens_per_step, 4.0);
  EXPECT_DOUBLE_EQ(a.decode_batch_mean, 4.0);
  EXPECT_DOUBLE_EQ(a.measured_tokens_per_s, 80.0);
  EXPECT_NEAR(a.step_ms, 55.0, 1e-9);       // 0.55 s over 10 steps
  EXPECT_NEAR(a.overhead_ms, 5.0, 1e-9);    // (0.55 - 0.5) s over 10 steps
  EXPECT_NEAR(a.overhead_fraction, 5.0 / 55.0, 1e-12);
  EXPECT_DOUBLE_EQ(a.prefix_hit_rate, 0.24);  // 96 of 400 prompt tokens from the prefix cache
  EXPECT_DOUBLE_EQ(a.prefix_tokens, 128);
  EXPECT_DOUBLE_EQ(a.shared_intermediate, 32);
  EXPECT_DOUBLE_EQ(a.step_token_fraction[0], 0.1);
  EXPECT_DOUBLE_EQ(a.step_token_fraction[1], 0.9);
  EXPECT_DOUBLE_EQ(a.step_token_fraction[2] + a.step_token_fraction[3] + a.step_token_fraction[4], 0.0);
  ASSERT_EQ(a.layers.size(), 2u);

  // Layer 1: A = 80/10 = 8 assignments, T = 4, X = 3.2 active, 2.5 tokens per active expert.
  const LayerRow& l1 = a.layers[0];
  EXPECT_EQ(l1.layer, 1);
  EXPECT_DOUBLE_EQ(l1.assignments, 8.0);
  EXPECT_DOUBLE_EQ(l1.tokens, 4.0);
  EXPECT_DOUBLE_EQ(l1.active_experts, 3.2);
  EXPECT_DOUBLE_EQ(l1.tokens_per_expert, 2.5);
  ASSERT_EQ(l1.gemms.size(), 4u);
  // gate_up 64x64: FLOPs 2*8*64*64 = 65536; bytes 3.2*4096*0.5625 + 8*(64+64)*2 = 7372.8 + 2048.
  EXPECT_EQ(l1.gemms[0].n, 64);
  EXPECT_EQ(l1.gemms[0].k, 64);
  EXPECT_DOUBLE_EQ(l1.gemms[0].flops, 65536.0);
  EXPECT_NEAR(l1.gemms[0].bytes, 9420.8, 1e-9);
  // down 64x32: FLOPs 2*8*64*32 = 32768; bytes 3.2*2048*0.5625 + 8*(32+64)*2 = 3686.4 + 1536.
  EXPECT_EQ(l1.gemms[1].n, 64);
  EXPECT_EQ(l1.gemms[1].k, 32);
  EXPECT_DOUBLE_EQ(l1.gemms[1].flops, 32768.0);
  EXPECT_NEAR(l1.gemms[1].bytes, 5222.4, 1e-9);
  // shared gate_up over T = 4 rows: 2*4*64*64 = 32768 FLOPs, 4096*0.5625 + 4*128*2 = 2304 + 1024 bytes.
  EXPECT_DOUBLE_EQ(l1.gemms[2].flops, 32768.0);
  EXPECT_DOUBLE_EQ(l1.gemms[2].bytes, 3328.0);
  // shared down: 2*4*64*32 = 16384 FLOPs, 2048*0.5625 + 4*96*2 = 1152 + 768 bytes.
  EXPECT_DOUBLE_EQ(l1.gemms[3].flops, 16384.0);
  EXPECT_DOUBLE_EQ(l1.gemms[3].bytes, 1920.0);
  EXPECT_DOUBLE_EQ(l1.flops, 147456.0);
  EXPECT_NEAR(l1.bytes, 19891.2, 1e-9);
  // Measured: 0.001 s / 10 steps = 100 us moe, 200 us attention.
  EXPECT_DOUBLE_EQ(l1.moe_s, 1e-4);
  EXPECT_DOUBLE_EQ(l1.attention_s, 2e-4);
  EXPECT_NEAR(l1.tflops, 147456.0 / 1e-4 / 1e12, 1e-15);
  EXPECT_NEAR(l1.gbps, 19891.2 / 1e-4 / 1e9, 1e-12);
  EXPECT_NEAR(l1.frac_hbm, 0.198912 / 4200, 1e-15);
  EXPECT_NEAR(l1.frac_peak, 1.47456e-3 / 780, 1e-15);
  // HBM bound: 19891.2 B / 4.2e12 B/s = 4.736e-9 s > 147456 / 780e12.
  EXPECT_NEAR(l1.roofline_s, 4.736e-9, 1e-20);
  EXPECT_NEAR(l1.frac_roofline, 4.736e-9 / 1e-4, 1e-15);

  // Layer 2: X = 4, tokens per active expert 2; bytes 4*4096*0.5625 + 2048 + 4*2048*0.5625 + 1536 + 3328 + 1920.
  const LayerRow& l2 = a.layers[1];
  EXPECT_DOUBLE_EQ(l2.tokens_per_expert, 2.0);
  EXPECT_DOUBLE_EQ(l2.bytes, 22656.0);
  EXPECT_DOUBLE_EQ(l2.moe_s, 2e-4);

  // Totals over both MoE layers.
  EXPECT_DOUBLE_EQ(a.total.flops, 294912.0);
  EXPECT_NEAR(a.total.bytes, 42547.2, 1e-9);
  EXPECT_NEAR(a.total.moe_s, 3e-4, 1e-18);
  EXPECT_NEAR(a.total.attention_s, 4e-4, 1e-18);
  EXPECT_DOUBLE_EQ(a.total.tokens_per_expert, 16.0 / 7.2);
  EXPECT_DOUBLE_EQ(a.total.active_experts, 3.6);  // mean per layer
  EXPECT_DOUBLE_EQ(a.total.assignments, 8.0);
  EXPECT_DOUBLE_EQ(a.total.tokens, 4.0);
  EXPECT_NEAR(a.total.roofline_s, 4.736e-9 + 22656.0 / 4.2e12, 1e-20);
  ASSERT_EQ(a.total.gemms.size(), 4u);
  EXPECT_DOUBLE_EQ(a.total.gemms[0].matrices, 3.6);  // mean of 3.2 and 4
  EXPECT_DOUBLE_EQ(a.total.gemms[0].flops, 131072.0);

  // What-if. Layer 1 picks experts with p = 2c/80 = 1, 0.5, 0.25, 0.25; layer 2 p = 0.5 each.
  ASSERT_EQ(a.what_if.size(), 4u);
  const WhatIfRow& w1 = a.what_if[0];
  EXPECT_EQ(w1.max_running_requests, 4);
  EXPECT_DOUBLE_EQ(w1.decode_batch, 4.0);
  // B = 4: layer 1 active 1 + (1 - 0.5^4) + 2 (1 - 0.75^4) = 3.3046875; layer 2 4 (1 - 0.5^4) = 3.75.
  EXPECT_NEAR(w1.active_experts, (3.3046875 + 3.75) / 2, 1e-12);
  EXPECT_NEAR(w1.tokens_per_expert, (8 / 3.3046875 + 8 / 3.75) / 2, 1e-12);
  const WhatIfRow& w2 = a.what_if[1];
  EXPECT_EQ(w2.max_running_requests, 8);
  EXPECT_DOUBLE_EQ(w2.decode_batch, 8.0);
  // B = 8: layer 1 X = 1 + (1 - 1/256) + 2 (1 - 0.75^8) = 3.795867919921875, bytes X*3456 + 14208;
  // layer 2 X = 4 (1 - 1/256) = 3.984375, bytes 27978. FLOPs per layer 294912. HBM bound.
  const double x1 = 3.795867919921875, b1 = x1 * 3456 + 14208, b2 = 27978.0;
  EXPECT_NEAR(w2.bytes, b1 + b2, 1e-9);
  EXPECT_DOUBLE_EQ(w2.flops, 589824.0);
  EXPECT_EQ(w2.bound, "hbm");
  EXPECT_NEAR(w2.roofline_s, (b1 + b2) / 4.2e12, 1e-20);
  EXPECT_NEAR(w2.tokens_per_s, 8 / ((b1 + b2) / 4.2e12), 1e-3);
  EXPECT_NEAR(w2.frac_peak, 589824.0 / w2.roofline_s / 780e12, 1e-12);
  EXPECT_EQ(a.what_if[3].max_running_requests, 32);
  // More requests never lower the ceiling while HBM bound.
  for (size_t i = 1; i < a.what_if.size(); ++i) EXPECT_GT(a.what_if[i].tokens_per_s, a.what_if[i - 1].tokens_per_s);

  // The tables and the JSON carry the same numbers.
  const std::string text = format_analysis(a);
  EXPECT_NE(text.find("steps 10 (with layer times: 10, as CUDA graphs: 7)"), std::string::npos) << text;
  EXPECT_NE(text.find("routed gate_up"), std::string::npos) << text;
  EXPECT_NE(text.find("tok/s ceiling"), std::string::npos) << text;
  EXPECT_NE(text.find("8 (x2)"), std::string::npos) << text;
  EXPECT_NE(text.find("prefix cache: 24.0% of prompt tokens found (96 of 400), 128 tokens held"), std::string::npos)
      << text;
  const auto j = analysis_json(a);
  EXPECT_DOUBLE_EQ(j["prefix_hit_rate"].get<double>(), 0.24);
  EXPECT_EQ(j["schema"], "fp4moe.analyze.v1");
  EXPECT_DOUBLE_EQ(j["layers"][0]["tokens_per_expert"].get<double>(), 2.5);
  EXPECT_DOUBLE_EQ(j["step_token_fraction"]["1-7"].get<double>(), 0.9);
  EXPECT_DOUBLE_EQ(j["graph_steps"].get<double>(), 7.0);
}

TEST(Analyze, Bf16WeightsAndCompute) {
  using namespace fp4moe::tools;
  const Measured m = read_measured(parse_prometheus_text(kMetrics));
  // 1 GB/s and 1 GFLOP/s: layer 1 in bf16 moves weights 3.2*(4096+2048)*2 + (4096+2048)*2 = 39321.6 + 12288
  // and activations 2048 + 1536 + 1024 + 768 = 5376: 56985.6 bytes = 57 us < 147456 FLOPs = 147 us (compute bound).
  const Analysis a = analyze(m, tiny_config(), WeightFormat::kBf16, Roofline{1, 0.001});
  EXPECT_NEAR(a.layers[0].bytes, 56985.6, 1e-9);
  EXPECT_NEAR(a.layers[0].roofline_s, 147456e-9, 1e-18);
  EXPECT_EQ(a.what_if[0].bound, "compute");
  EXPECT_EQ(a.what_if[0].max_running_requests, 0);
  EXPECT_NE(format_analysis(a).find("x2"), std::string::npos);
}

TEST(Analyze, RejectsMismatchedConfigAndEmptyMetrics) {
  using namespace fp4moe::tools;
  const Measured m = read_measured(parse_prometheus_text(kMetrics));
  auto cfg = tiny_config();
  cfg.n_routed_experts = 8;
  try {
    analyze(m, cfg, WeightFormat::kNvfp4, Roofline{});
    FAIL() << "expert count mismatch accepted";
  } catch (const fp4moe::Error& e) {
    EXPECT_NE(std::string(e.what()).find("metrics report 4 experts in layer 1 but test config has n_routed_experts 8"),
              std::string::npos)
        << e.what();
  }
  cfg = tiny_config();
  cfg.mlp_layer_types = {"dense", "dense", "sparse"};
  EXPECT_THROW(analyze(m, cfg, WeightFormat::kNvfp4, Roofline{}), fp4moe::Error);
  Measured none = m;
  none.steps = 0;
  try {
    analyze(none, tiny_config(), WeightFormat::kNvfp4, Roofline{});
    FAIL() << "zero steps accepted";
  } catch (const fp4moe::Error& e) {
    EXPECT_NE(std::string(e.what()).find("no forward step yet"), std::string::npos) << e.what();
  }
  // A missing series is named.
  std::string text = kMetrics;
  const std::string gone = "fp4moe:moe_active_experts_total{layer=\"2\"} 40\n";
  text.erase(text.find(gone), gone.size());
  try {
    read_measured(parse_prometheus_text(text));
    FAIL() << "missing active-experts series accepted";
  } catch (const fp4moe::Error& e) {
    EXPECT_NE(std::string(e.what()).find("fp4moe:moe_active_experts_total{layer=\"2\"} is missing"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(parse_weight_format("fp8"), fp4moe::Error);
  // A negative counter (a corrupt copy) is refused, naming its line.
  text = kMetrics;
  const std::string steps = "\nfp4moe:forward_steps_total ";
  const size_t at = text.find(steps);
  ASSERT_NE(at, std::string::npos);
  text.insert(at + steps.size(), "-");
  try {
    read_measured(parse_prometheus_text(text));
    FAIL() << "negative counter accepted";
  } catch (const fp4moe::Error& e) {
    EXPECT_NE(std::string(e.what()).find(": fp4moe:forward_steps_total = -"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("a counter is finite and >= 0"), std::string::npos) << e.what();
  }
}

// A model that also times the GEMMs inside "moe" gets per-GEMM achieved rates.
TEST(Analyze, PerGemmTimesWhenReported) {
  using namespace fp4moe::tools;
  const std::string text = std::string(kMetrics) +
                           "fp4moe:layer_seconds_total{layer=\"1\",part=\"moe.routed_gate_up\"} 0.0005\n"
                           "fp4moe:layer_seconds_total{layer=\"2\",part=\"moe.routed_gate_up\"} 0.0005\n"
                           "fp4moe:layer_seconds_total{layer=\"2\",part=\"moe.routed_down\"} 0.0002\n";
  const Analysis a = analyze(read_measured(parse_prometheus_text(text)), tiny_config(), WeightFormat::kNvfp4, Roofline{});
  // Layer 1 gate_up: 5e-5 s per step, 65536 FLOPs, 9420.8 bytes.
  const GemmRow& g = a.layers[0].gemms[0];
  EXPECT_EQ(g.part(), "routed_gate_up");
  EXPECT_DOUBLE_EQ(g.measured_s, 5e-5);
  EXPECT_NEAR(g.tflops, 65536.0 / 5e-5 / 1e12, 1e-15);
  EXPECT_NEAR(g.gbps, 9420.8 / 5e-5 / 1e9, 1e-12);
  EXPECT_NEAR(g.frac_roofline, (9420.8 / 4.2e12) / 5e-5, 1e-15);
  EXPECT_LT(a.layers[0].gemms[1].measured_s, 0);  // layer 1 down not reported
  EXPECT_DOUBLE_EQ(a.layers[1].gemms[1].measured_s, 2e-5);
  // Totals: gate_up timed in both layers (1e-4 s for 131072 FLOPs); down only in one -> not measured.
  EXPECT_NEAR(a.total.gemms[0].measured_s, 1e-4, 1e-18);
  EXPECT_NEAR(a.total.gemms[0].tflops, 131072.0 / 1e-4 / 1e12, 1e-15);
  EXPECT_LT(a.total.gemms[1].measured_s, 0);
  EXPECT_EQ(format_analysis(a).find("measured per-GEMM times need"), std::string::npos);
}

TEST(Analyze, NoLayerTimesLeavesMeasuredColumnsEmpty) {
  using namespace fp4moe::tools;
  std::string text = kMetrics;
  const std::string timed = "fp4moe:layer_timed_steps_total 10";
  text.replace(text.find(timed), timed.size(), "fp4moe:layer_timed_steps_total 0");
  const Analysis a = analyze(read_measured(parse_prometheus_text(text)), tiny_config(), WeightFormat::kNvfp4, Roofline{});
  EXPECT_LT(a.layers[0].moe_s, 0);
  EXPECT_EQ(a.layers[0].tflops, 0);
  EXPECT_NE(format_analysis(a).find("no layer times"), std::string::npos);
}

// Metrics with no decode step (every step a prefill): the what-if rows scale the mean tokens per step, and say so
// (it read as a decode batch larger than --max-running-requests).
TEST(Analyze, WhatIfWithoutDecodeStepsSaysWhatItScales) {
  using namespace fp4moe::tools;
  std::string text = kMetrics;
  for (const char* line : {"fp4moe:decode_batch_size_sum 36", "fp4moe:decode_batch_size_count 9"}) {
    text.replace(text.find(line), std::string(line).size(),
                 std::string(line).substr(0, std::string(line).rfind(' ')) + " 0");
  }
  const Analysis a =
      analyze(read_measured(parse_prometheus_text(text)), tiny_config(), WeightFormat::kNvfp4, Roofline{});
  EXPECT_FALSE(a.what_if_from_decode);
  EXPECT_DOUBLE_EQ(a.what_if[0].decode_batch, 4.0);  // 40 tokens over 10 steps
  EXPECT_NE(
      format_analysis(a).find("(no decode step in these metrics: the batch below is the mean tokens per step, 4.0"),
      std::string::npos)
      << format_analysis(a);
  EXPECT_EQ(analysis_json(a)["what_if_batch"], "tokens_per_step");
  const Analysis measured =
      analyze(read_measured(parse_prometheus_text(kMetrics)), tiny_config(), WeightFormat::kNvfp4, Roofline{});
  EXPECT_TRUE(measured.what_if_from_decode);
  EXPECT_EQ(format_analysis(measured).find("no decode step"), std::string::npos);
  EXPECT_EQ(analysis_json(measured)["what_if_batch"], "decode_batch_mean");
}

// --weights auto's reading of a checkpoint config (serve labels its metrics with it): NVFP4 / W4A16_NVFP4 make every
// Linear NVFP4; MIXED_PRECISION only where quantized_layers lists routed experts as NVFP4.
TEST(Analyze, CheckpointWeightFormat) {
  using namespace fp4moe::tools;
  fp4moe::model::ModelConfig c = tiny_config();
  EXPECT_EQ(checkpoint_weight_format(c), WeightFormat::kBf16);
  c.quantization.quant_algo = "W4A16_NVFP4";
  EXPECT_EQ(checkpoint_weight_format(c), WeightFormat::kNvfp4);
  c.quantization.quant_algo = "MIXED_PRECISION";
  c.quantization.quantized_layers = {{"model.layers.1.self_attn.o_proj", "NVFP4"}};
  EXPECT_EQ(checkpoint_weight_format(c), WeightFormat::kBf16);
  c.quantization.quantized_layers["model.layers.1.mlp.experts.0.down_proj"] = "NVFP4";
  EXPECT_EQ(checkpoint_weight_format(c), WeightFormat::kNvfp4);
  c.quantization.quantized_layers = {{"model.layers.1.mlp.experts.0.down_proj", "FP8"}};
  EXPECT_EQ(checkpoint_weight_format(c), WeightFormat::kBf16);
}

class LayerTimes : public ::testing::TestWithParam<std::string> {};

TEST_P(LayerTimes, CpuModelsReportAttentionThenMlpPerLayer) {
  fp4moe::model::LoadOptions lo;
  lo.progress = false;
  auto lm = fp4moe::model::load_model(fp4moe::testing::shared_path("golden/models/" + GetParam()), lo);
  const auto& cfg = lm->config();
  auto a = lm->new_state(), b = lm->new_state();
  const std::vector<int32_t> ta = {1, 2, 3, 4, 5}, tb = {7};
  std::vector<float> la(static_cast<size_t>(lm->vocab_size())), lb(la.size());
  fp4moe::model::SeqChunk chunks[] = {{a.get(), ta, la.data(), false}, {b.get(), tb, lb.data(), false}};
  fp4moe::model::ForwardTrace trace;
  lm->forward(chunks, &trace);
  ASSERT_EQ(trace.layer_times.size(), static_cast<size_t>(2 * cfg.num_hidden_layers));
  int64_t n_moe = 0;
  for (int64_t l = 0; l < cfg.num_hidden_layers; ++l) {
    const auto& at = trace.layer_times[static_cast<size_t>(2 * l)];
    const auto& mt = trace.layer_times[static_cast<size_t>(2 * l + 1)];
    EXPECT_EQ(at.layer, l);
    EXPECT_EQ(at.part, "attention") << "layer " << l;
    EXPECT_EQ(mt.layer, l);
    EXPECT_EQ(mt.part, cfg.is_moe_layer(l) ? "moe" : "mlp") << "layer " << l;
    EXPECT_GT(at.seconds, 0.0) << "layer " << l;
    EXPECT_GT(mt.seconds, 0.0) << "layer " << l;
    n_moe += cfg.is_moe_layer(l);
  }
  EXPECT_EQ(static_cast<int64_t>(trace.moe_layers.size()), n_moe);
  ASSERT_GT(n_moe, 0);
  // Without a trace the same batch runs untimed and gives the same logits.
  auto c = lm->new_state(), d = lm->new_state();
  std::vector<float> lc(la.size()), ld(la.size());
  fp4moe::model::SeqChunk again[] = {{c.get(), ta, lc.data(), false}, {d.get(), tb, ld.data(), false}};
  lm->forward(again);
  EXPECT_EQ(lc, la);
  EXPECT_EQ(ld, lb);
}

INSTANTIATE_TEST_SUITE_P(GoldenModels, LayerTimes, ::testing::Values("glm4_moe_tiny", "glm5_tiny"));

}  // namespace
