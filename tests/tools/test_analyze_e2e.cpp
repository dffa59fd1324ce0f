// `fp4moe analyze` end to end: starts the real `fp4moe serve` binary on the embedded default model
// (GLM-5 synthetic: 3 layers, 16 experts top-4 + 1 shared), sends a few concurrent requests, checks
// that /metrics now carries nonzero per-layer times (layer_seconds_total, attention and moe parts)
// and consistent MoE counters, then runs `fp4moe analyze --url` (tables) and `--json`, and
// `--metrics FILE` on a saved copy, and checks the tables are there with nonzero measured layer
// times, tokens per expert and achieved rates, and that bad input is named.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "server/http_client.h"
#include "server/server_process.h"
#include "testing/testing.h"

namespace {

using fp4moe::server::HttpClient;
using fp4moe::testing::ServerProcess;
using nlohmann::json;

int run(const std::string& args, std::string* out) {
  return fp4moe::testing::run_command(std::string(FP4MOE_CLI) + " analyze " + args + " 2>&1", out);
}

TEST(AnalyzeE2E, ServerMetricsThenAnalyze) {
  ServerProcess srv(FP4MOE_CLI, {"--max-running-requests", "4", "--context-length", "512"});
  ASSERT_TRUE(srv.wait_ready(60));
  // Four concurrent requests so that decode steps batch several sequences.
  std::vector<std::thread> clients;
  std::vector<int> statuses(4, 0);
  for (int i = 0; i < 4; ++i) {
    clients.emplace_back([&, i] {
      HttpClient c(srv.url(), 60);
      const json body = {{"text", "request " + std::to_string(i) + " says hello"},
                         {"sampling_params", {{"max_new_tokens", 8}, {"temperature", 0}, {"ignore_eos", true}}}};
      statuses[static_cast<size_t>(i)] = c.post("/generate", body.dump()).status;
    });
  }
  for (auto& t : clients) t.join();
  for (int s : statuses) ASSERT_EQ(s, 200);

  HttpClient c(srv.url(), 30);
  const auto r = c.get("/metrics");
  ASSERT_EQ(r.status, 200);
  const auto m = fp4moe::testing::parse_prometheus(r.body);
  ASSERT_TRUE(m.count("fp4moe:layer_timed_steps_total"));
  EXPECT_GT(m.at("fp4moe:layer_timed_steps_total"), 0);
  EXPECT_EQ(m.at("fp4moe:layer_timed_steps_total"), m.at("fp4moe:forward_steps_total"));
  ASSERT_TRUE(m.count("fp4moe:cuda_graph_steps_total"));
  EXPECT_EQ(m.at("fp4moe:cuda_graph_steps_total"), 0);  // the CPU backend captures nothing
  // The default model: layer 0 dense, layers 1-2 MoE (default_model.h).
  for (const char* series : {"fp4moe:layer_seconds_total{layer=\"0\",part=\"attention\"}",
                             "fp4moe:layer_seconds_total{layer=\"1\",part=\"attention\"}",
                             "fp4moe:layer_seconds_total{layer=\"1\",part=\"moe\"}",
                             "fp4moe:layer_seconds_total{layer=\"2\",part=\"moe\"}"}) {
    ASSERT_TRUE(m.count(series)) << series << "\n" << r.body;
    EXPECT_GT(m.at(series), 0) << series;
  }
  // Active expert-steps + empty expert-steps = steps x 16 experts, per MoE layer (two layers).
  const double steps = m.at("fp4moe:forward_steps_total");
  const double active = m.at("fp4moe:moe_active_experts_total{layer=\"1\"}") +
                        m.at("fp4moe:moe_active_experts_total{layer=\"2\"}");
  EXPECT_EQ(m.at("fp4moe:moe_expert_step_tokens_count"), steps * 16 * 2);
  EXPECT_EQ(m.at("fp4moe:moe_expert_step_tokens_bucket{le=\"0\"}") + active, steps * 16 * 2);
  // Tokens routed = forward tokens x top-4 per layer.
  EXPECT_EQ(m.at("fp4moe:moe_expert_step_tokens_sum"), m.at("fp4moe:forward_tokens_total") * 4 * 2);

  std::string out;
  ASSERT_EQ(run("--url " + srv.url(), &out), 0) << out;
  for (const char* want : {"Tokens one expert receives in one step", "routed gate_up", "routed down", "shared gate_up",
                           "Per MoE layer", "moe us", "% roofline", "What raising --max-running-requests",
                           "4 (x1)", "8 (x2)", "32 (x8)", "E=16 top-4"}) {
    EXPECT_NE(out.find(want), std::string::npos) << want << "\n" << out;
  }
  EXPECT_EQ(out.find("no layer times"), std::string::npos) << out;

  ASSERT_EQ(run("--url " + srv.url() + " --json", &out), 0) << out;
  const json j = json::parse(out);
  EXPECT_EQ(j["schema"], "fp4moe.analyze.v1");
  EXPECT_EQ(j["weights"], "nvfp4");
  EXPECT_EQ(j["n_experts"], 16);
  ASSERT_EQ(j["layers"].size(), 2u);
  for (const auto& L : j["layers"]) {
    EXPECT_GT(L["moe_s"].get<double>(), 0) << L.dump();
    EXPECT_GT(L["attention_s"].get<double>(), 0) << L.dump();
    EXPECT_GT(L["tokens_per_expert"].get<double>(), 0) << L.dump();
    EXPECT_GT(L["tflops"].get<double>(), 0) << L.dump();
    EXPECT_GT(L["gbps"].get<double>(), 0) << L.dump();
    EXPECT_GT(L["frac_roofline"].get<double>(), 0) << L.dump();
    EXPECT_LE(L["active_experts"].get<double>(), 16.0) << L.dump();
  }
  ASSERT_EQ(j["what_if"].size(), 4u);
  EXPECT_EQ(j["what_if"][1]["max_running_requests"], 8);

  // A saved copy gives the same analysis (the metrics do not move while nothing runs).
  const std::string path = (std::filesystem::temp_directory_path() /
                            ("fp4moe_analyze_" + std::to_string(srv.port()) + ".txt")).string();
  const auto again = c.get("/metrics");
  { std::ofstream(path) << again.body; }
  std::string from_file;
  EXPECT_EQ(run("--metrics " + path + " --max-running-requests 4 --json", &from_file), 0) << from_file;
  const json jf = json::parse(from_file);
  EXPECT_EQ(jf["layers"], j["layers"]);
  EXPECT_EQ(jf["what_if"], j["what_if"]);
  // The copy names its model (fp4moe:model_info): without it, and without --model, analyze refuses rather than
  // assume the embedded default model's widths.
  EXPECT_NE(again.body.find("fp4moe:model_info{model_path=\"(embedded default)\",served_model_name=\""),
            std::string::npos)
      << again.body;
  // --weights auto takes the experts' format the server labels (expert_weights: the embedded model's are NVFP4);
  // a copy that says bf16 is read at 2 B/weight.
  EXPECT_EQ(j["weights"], "nvfp4");
  EXPECT_NE(again.body.find(",expert_weights=\"nvfp4\"} 1"), std::string::npos) << again.body;
  {
    std::string bf16 = again.body;
    const std::string said = ",expert_weights=\"nvfp4\"";
    bf16.replace(bf16.find(said), said.size(), ",expert_weights=\"bf16\"");
    std::ofstream(path) << bf16;
  }
  EXPECT_EQ(run("--metrics " + path + " --json", &from_file), 0) << from_file;
  EXPECT_EQ(json::parse(from_file)["weights"], "bf16");
  std::string stripped;
  {
    std::istringstream in(again.body);
    for (std::string line; std::getline(in, line);) {
      if (line.rfind("fp4moe:model_info", 0) != 0) stripped += line + "\n";
    }
  }
  { std::ofstream(path) << stripped; }
  EXPECT_NE(run("--metrics " + path, &from_file), 0) << from_file;
  EXPECT_NE(from_file.find("--metrics " + path + " names no model (no fp4moe:model_info line"), std::string::npos)
      << from_file;
  // --model still decides: a preset that is not the served model is caught by the expert count.
  EXPECT_NE(run("--metrics " + path + " --model glm5-shard", &from_file), 0) << from_file;
  EXPECT_NE(from_file.find("is --model the served model?"), std::string::npos) << from_file;
  std::filesystem::remove(path);

  EXPECT_EQ(srv.stop(SIGTERM, 30), 0);
}

TEST(AnalyzeE2E, BadInputIsNamed) {
  std::string out;
  EXPECT_NE(run("", &out), 0);
  EXPECT_NE(out.find("give exactly one of --metrics FILE and --url"), std::string::npos) << out;
  EXPECT_NE(run("--metrics /nonexistent/metrics.txt", &out), 0);
  EXPECT_NE(out.find("cannot open /nonexistent/metrics.txt: No such file or directory"), std::string::npos) << out;
  // A directory and a file without fp4moe series say so (they read "names no model (no fp4moe:model_info line)").
  EXPECT_NE(run("--metrics " + std::filesystem::temp_directory_path().string(), &out), 0);
  EXPECT_NE(out.find(std::filesystem::temp_directory_path().string() + " is a directory, not a file"),
            std::string::npos)
      << out;
  EXPECT_NE(run("--metrics /dev/null", &out), 0);
  EXPECT_NE(out.find("--metrics /dev/null holds no fp4moe: series"), std::string::npos) << out;
  const std::string path = (std::filesystem::temp_directory_path() / "fp4moe_analyze_bad.txt").string();
  { std::ofstream(path) << "# TYPE x counter\nx{a=\"1\" 2\n"; }
  EXPECT_NE(run("--metrics " + path, &out), 0);
  EXPECT_NE(out.find("metrics line 2 column"), std::string::npos) << out;
  { std::ofstream(path) << "fp4moe:forward_steps_total 1\n"; }
  EXPECT_EQ(run("--metrics " + path + " --weights fp8", &out), 2);  // a usage error, as every fixed set's
  EXPECT_NE(out.find("--weights: fp8 not in {auto,nvfp4,bf16}"), std::string::npos) << out;
  // Flags: a roofline that is not finite, a max-running-requests below 1 (a usage error).
  EXPECT_NE(run("--metrics " + path + " --model glm5-shard --hbm-gbps inf", &out), 0);
  EXPECT_NE(out.find("rooflines must be finite and positive: --hbm-gbps inf"), std::string::npos) << out;
  EXPECT_EQ(run("--metrics " + path + " --max-running-requests -4", &out), 2) << out;
  // Metrics of a server that was still loading: said so, not which MoE series they lack.
  { std::ofstream(path) << "fp4moe:is_ready 0\nfp4moe:forward_steps_total 0\n"; }
  EXPECT_NE(run("--metrics " + path + " --model glm5-shard", &out), 0);
  EXPECT_NE(out.find("the server was still loading its model (fp4moe:is_ready 0)"), std::string::npos) << out;
  // A server shutting down reads is_ready 0 too, with its steps counted: not called loading.
  { std::ofstream(path) << "fp4moe:is_ready 0\nfp4moe:forward_steps_total 3\n"; }
  EXPECT_NE(run("--metrics " + path + " --model glm5-shard", &out), 0);
  EXPECT_EQ(out.find("still loading"), std::string::npos) << out;
  std::filesystem::remove(path);
}

}  // namespace
