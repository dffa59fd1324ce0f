// End-to-end tests of `fp4moe serve`: each test starts the real binary on a free port, polls /health
// until 200 (with a timeout) and talks HTTP with a timeout on every request. Covers /health 503 ->
// 200, golden greedy ids on glm5_tiny, the OpenAI endpoints field by field (streaming included),
// /metrics (parsed), /get_server_info, tokenize / detokenize, 400 / 404 / 413 / 503 replies, a client
// disconnect freeing its request (streaming, and non-streaming over a raw socket; a long
// non-streaming reply with liveness spaces equal to the streamed result), SIGTERM draining, and `fp4moe bench-serving` against it.
#include <gtest/gtest.h>
#include <poll.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "format/checkpoint_edit.h"
#include "format/safetensors.h"
#include "server/http_client.h"
#include "server/reasoning.h"
#include "server_process.h"
#include "testing/testing.h"

namespace {

using fp4moe::server::find_reasoning_format;
using fp4moe::server::HttpClient;
using fp4moe::server::ReasoningSplit;
using fp4moe::server::ReasoningStart;
using fp4moe::server::split_reasoning;
using fp4moe::testing::ServerProcess;
using nlohmann::json;
namespace fs = std::filesystem;

constexpr double kTimeout = 60;  // seconds, every request

json parse(const std::string& s) {
  json j = json::parse(s, nullptr, false);
  EXPECT_FALSE(j.is_discarded()) << "not JSON: " << s.substr(0, 300);
  return j;
}

std::vector<json> sse_chunks(HttpClient& c, const std::string& path, const json& body, int* status,
                             bool* saw_done = nullptr) {
  std::vector<json> out;
  bool done = false;
  auto r = c.post_sse(path, body.dump(), [&](std::string_view d) {
    EXPECT_FALSE(done) << "data after [DONE]";
    if (d == "[DONE]") done = true;
    else out.push_back(parse(std::string(d)));
    return true;
  });
  *status = r.status;
  if (saw_done) *saw_done = done;
  return out;
}

void expect_error(const fp4moe::server::HttpResponse& r, int status, const std::string& param) {
  EXPECT_EQ(r.status, status) << r.body;
  const json j = parse(r.body);
  ASSERT_TRUE(j.contains("error")) << r.body;
  EXPECT_EQ(j["error"]["code"], status) << r.body;
  EXPECT_TRUE(j["error"]["message"].is_string() && !j["error"]["message"].get<std::string>().empty()) << r.body;
  EXPECT_TRUE(j["error"]["type"].is_string()) << r.body;
  if (!param.empty()) {
    EXPECT_EQ(j["error"]["param"], param) << r.body;
  }
  // A user's error names the field, not a check of the engine's source.
  EXPECT_EQ(r.body.find(".cpp:"), std::string::npos) << r.body;
}

// Polls /metrics until `series` equals `want` (the engine publishes its stats after each step).
double wait_metric(const std::string& url, const std::string& series, double want, double timeout_s = 10);

double metric(const std::string& url, const std::string& series) {
  HttpClient c(url, kTimeout);
  auto r = c.get("/metrics");
  EXPECT_EQ(r.status, 200);
  auto m = fp4moe::testing::parse_prometheus(r.body);
  EXPECT_TRUE(m.count(series)) << series << " missing from /metrics";
  return m.count(series) ? m[series] : -1;
}

double wait_metric(const std::string& url, const std::string& series, double want, double timeout_s) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  double v = metric(url, series);
  while (v != want && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    v = metric(url, series);
  }
  return v;
}

TEST(ServerE2E, HealthGoes503Then200AndMetricsParse) {
  ServerProcess srv(FP4MOE_CLI, {"--debug-load-delay", "1.5"});
  {
    // While loading, the model routes answer 503 as /health does (SGLang and vLLM open their port once loaded, so
    // clients read a 200 from /v1/models as "ready").
    HttpClient c(srv.url(), kTimeout);
    int health = -1;
    for (int i = 0; i < 400 && health != 503; ++i) {
      health = c.get("/health").status;
      if (health != 503) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    ASSERT_EQ(health, 503);
    for (const char* path : {"/v1/models", "/v1/models/tiny-default", "/get_model_info"}) {
      const auto r = c.get(path);
      EXPECT_EQ(r.status, 503) << path << ": " << r.body;
      EXPECT_NE(r.body.find("the model is loading"), std::string::npos) << path << ": " << r.body;
    }
  }
  std::vector<int> statuses;
  ASSERT_TRUE(srv.wait_ready(60, &statuses));
  // Connection refused (-1) may come first, then 503 during the load, then 200.
  ASSERT_GE(statuses.size(), 2u);
  EXPECT_EQ(statuses[statuses.size() - 2], 503);
  EXPECT_EQ(statuses.back(), 200);

  HttpClient c(srv.url(), kTimeout);
  auto hg = c.get("/health_generate");
  EXPECT_EQ(hg.status, 200) << hg.body;
  auto g = c.post("/generate", json{{"text", "hello"}, {"sampling_params", {{"max_new_tokens", 4}, {"temperature", 0}}}}.dump());
  ASSERT_EQ(g.status, 200) << g.body;

  EXPECT_EQ(wait_metric(srv.url(), "fp4moe:num_running_reqs", 0), 0);
  auto r = c.get("/metrics");
  ASSERT_EQ(r.status, 200);
  EXPECT_NE(r.header("Content-Type").find("text/plain"), std::string::npos);
  auto m = fp4moe::testing::parse_prometheus(r.body);
  for (const auto& [series, v] : m) EXPECT_EQ(series.rfind("fp4moe:", 0), 0u) << series;
  EXPECT_GE(m["fp4moe:prompt_tokens_total"], 1);
  EXPECT_GE(m["fp4moe:generation_tokens_total"], 4);
  EXPECT_EQ(m["fp4moe:num_running_reqs"], 0);
  EXPECT_EQ(m["fp4moe:num_queue_reqs"], 0);
  EXPECT_GT(m["fp4moe:max_total_num_tokens"], 0);
  EXPECT_TRUE(m.count("fp4moe:token_usage"));
  for (const char* h : {"time_to_first_token_seconds", "inter_token_latency_seconds", "e2e_request_latency_seconds",
                        "decode_batch_size"}) {
    EXPECT_TRUE(m.count(std::string("fp4moe:") + h + "_count")) << h;
  }
  // The /health_generate probe is not user traffic (SGLang's log_metrics): only the /generate request counts.
  EXPECT_EQ(m["fp4moe:num_requests_total"], 1);
  EXPECT_EQ(m["fp4moe:generation_tokens_total"], 4);
  EXPECT_EQ(m["fp4moe:time_to_first_token_seconds_count"], 1);
  EXPECT_EQ(m["fp4moe:e2e_request_latency_seconds_count"], 1);
  double expert_tokens = 0;
  int n_expert_series = 0;
  for (const auto& [series, v] : m) {
    if (series.rfind("fp4moe:moe_expert_tokens_total{layer=", 0) == 0) {
      EXPECT_NE(series.find(",expert=\""), std::string::npos) << series;
      expert_tokens += v;
      ++n_expert_series;
    }
  }
  EXPECT_GT(n_expert_series, 0);
  EXPECT_GT(expert_tokens, 0);
  EXPECT_EQ(srv.stop(SIGTERM, 30), 0);
}

// A NaN in one prompt's rows (its token's embedding row is NaN in this copy of glm5_tiny) fails that request
// alone: a concurrent request in the same batch finishes with the clean model's ids; a batch of prompts whose one
// prompt fails answers the error and stops its sibling choice (it ran to max_tokens); the server keeps serving.
TEST(ServerE2E, NanInOnePromptFailsOnlyThatRequest) {
  const fs::path golden = fp4moe::testing::shared_path("golden/models/glm5_tiny");
  const fs::path tok = fp4moe::testing::shared_path("golden/tokenizer");
  const fs::path dir = fs::temp_directory_path() / ("fp4moe_nan_row_" + std::to_string(::getpid()));
  fp4moe::testing::copy_checkpoint(golden, dir, [](fp4moe::testing::TensorMap& t) {
    auto& table = t.at("model.embed_tokens.weight");
    const uint16_t nan_bf16 = 0x7FC0;
    std::memcpy(table.bytes.data() + 2 * (99 * table.shape[1] + 3), &nan_bf16, 2);  // token 99, column 3
  });
  fp4moe::format::SafetensorsFile g(golden / "golden.safetensors");
  const auto ids = g.view("greedy_ids").as<int64_t>();
  const int64_t N = g.view("greedy_ids").dim(1), S = g.view("input_ids").dim(1);
  const std::vector<int64_t> clean_prompt(ids.begin(), ids.begin() + S);
  const std::vector<int64_t> expected(ids.begin() + S, ids.begin() + N);
  ASSERT_EQ(std::find(ids.begin(), ids.begin() + N, 99), ids.begin() + N) << "the golden sequence holds token 99";
  ServerProcess srv(FP4MOE_CLI, {"--model", dir.string(), "--tokenizer-path", tok.string()});
  ASSERT_TRUE(srv.wait_ready(120));
  std::vector<fp4moe::server::HttpResponse> replies(2);
  std::thread bad([&] {
    HttpClient cc(srv.url(), kTimeout);
    replies[0] =
        cc.post("/generate", json{{"input_ids", {8, 99, 42}}, {"sampling_params", {{"max_new_tokens", 4}}}}.dump());
  });
  std::thread good([&] {
    HttpClient cc(srv.url(), kTimeout);
    replies[1] = cc.post(
        "/generate",
        json{{"input_ids", clean_prompt}, {"sampling_params", {{"max_new_tokens", N - S}, {"temperature", 0}}}}.dump());
  });
  bad.join();
  good.join();
  EXPECT_NE(replies[0].body.find("is nan"), std::string::npos) << replies[0].body;
  ASSERT_EQ(replies[1].status, 200) << replies[1].body;
  EXPECT_EQ(parse(replies[1].body)["output_ids"].get<std::vector<int64_t>>(), expected);
  // A batch of two prompts, the second poisoned: the error, and the first choice is stopped, not run on.
  HttpClient c(srv.url(), kTimeout);
  const auto before = fp4moe::testing::parse_prometheus(c.get("/metrics").body);
  auto batch = c.post("/v1/completions",
                      json{{"prompt", {clean_prompt, {8, 99, 42}}}, {"max_tokens", 200}, {"ignore_eos", true}}.dump());
  EXPECT_NE(batch.body.find("is nan"), std::string::npos) << batch.body;
  const auto after = fp4moe::testing::parse_prometheus(c.get("/metrics").body);
  EXPECT_LT(after.at("fp4moe:generation_tokens_total") - before.at("fp4moe:generation_tokens_total"), 200);
  EXPECT_EQ(after.at("fp4moe:num_aborted_requests_total") - before.at("fp4moe:num_aborted_requests_total"), 1);
  ASSERT_EQ(c.post("/generate", json{{"input_ids", clean_prompt}, {"sampling_params", {{"max_new_tokens", 2}}}}.dump())
                .status,
            200);
  EXPECT_EQ(srv.stop(SIGTERM, 30), 0);
  fs::remove_all(dir);
}

TEST(ServerE2E, GoldenGlm5TinyGreedyIds) {
  const fs::path dir = fp4moe::testing::shared_path("golden/models/glm5_tiny");
  const fs::path tok = fp4moe::testing::shared_path("golden/tokenizer");
  fp4moe::format::SafetensorsFile g(dir / "golden.safetensors");
  const auto ids = g.view("greedy_ids").as<int64_t>();
  const int64_t n_seq = g.view("greedy_ids").dim(0), N = g.view("greedy_ids").dim(1);
  const int64_t S = g.view("input_ids").dim(1);
  ServerProcess srv(FP4MOE_CLI, {"--model", dir.string(), "--tokenizer-path", tok.string()});
  ASSERT_TRUE(srv.wait_ready(120));
  HttpClient c(srv.url(), kTimeout);
  for (int64_t b = 0; b < n_seq; ++b) {
    const std::vector<int64_t> prompt(ids.begin() + b * N, ids.begin() + b * N + S);
    const std::vector<int64_t> expected(ids.begin() + b * N + S, ids.begin() + (b + 1) * N);
    json body = {{"input_ids", prompt}, {"sampling_params", {{"max_new_tokens", N - S}, {"temperature", 0}}}};
    auto r = c.post("/generate", body.dump());
    ASSERT_EQ(r.status, 200) << r.body;
    const json j = parse(r.body);
    EXPECT_EQ(j["output_ids"].get<std::vector<int64_t>>(), expected) << "sequence " << b;
    EXPECT_EQ(j["meta_info"]["prompt_tokens"], S);
    EXPECT_EQ(j["meta_info"]["completion_tokens"], N - S);
    EXPECT_EQ(j["meta_info"]["finish_reason"]["type"], "length");
    // Streaming gives the same ids (cumulative output_ids in the last chunk).
    body["stream"] = true;
    int status = 0;
    bool done = false;
    auto chunks = sse_chunks(c, "/generate", body, &status, &done);
    ASSERT_EQ(status, 200);
    EXPECT_TRUE(done);
    ASSERT_FALSE(chunks.empty());
    EXPECT_EQ(chunks.back()["output_ids"].get<std::vector<int64_t>>(), expected) << "sequence " << b << " streamed";
  }
  // Both prompts at once through the batch: the same ids.
  std::vector<std::thread> threads;
  std::vector<std::vector<int64_t>> got(static_cast<size_t>(n_seq));
  for (int64_t b = 0; b < n_seq; ++b) {
    threads.emplace_back([&, b] {
      HttpClient cc(srv.url(), kTimeout);
      const std::vector<int64_t> prompt(ids.begin() + b * N, ids.begin() + b * N + S);
      auto r = cc.post("/generate", json{{"input_ids", prompt}, {"sampling_params", {{"max_new_tokens", N - S}, {"temperature", 0}}}}.dump());
      if (r.status == 200) got[static_cast<size_t>(b)] = parse(r.body)["output_ids"].get<std::vector<int64_t>>();
    });
  }
  for (auto& t : threads) t.join();
  for (int64_t b = 0; b < n_seq; ++b) {
    EXPECT_EQ(got[static_cast<size_t>(b)], std::vector<int64_t>(ids.begin() + b * N + S, ids.begin() + (b + 1) * N))
        << "sequence " << b << " batched";
  }
  // The golden tokenizer renders chat with the model's template.
  auto chat = c.post("/v1/chat/completions",
                     json{{"messages", {{{"role", "user"}, {"content", "Hi"}}}}, {"max_tokens", 3}, {"temperature", 0}}.dump());
  EXPECT_EQ(chat.status, 200) << chat.body;
  // The tokenizer has 4,096 tokens, the tiny model 512 embeddings: a text that encodes past them is a 400 naming the
  // token and its position in the encoding (not an item of the field, which is text).
  auto oov = c.post("/generate", json{{"text", "Hi, the quick"}}.dump());
  expect_error(oov, 400, "text");
  EXPECT_NE(oov.body.find("text encodes to token 2560 (\\\" qu\\\") at position 4, outside the model's vocabulary "
                          "of 512 (the tokenizer has 4096)"),
            std::string::npos)
      << oov.body;
  oov = c.post("/v1/chat/completions", json{{"messages", {{{"role", "user"}, {"content", "the quick"}}}}}.dump());
  expect_error(oov, 400, "messages");
  EXPECT_NE(
      oov.body.find("messages (as the chat template renders it) encodes to token 1674 (\\\"the\\\") at position 4"),
      std::string::npos)
      << oov.body;
  EXPECT_EQ(srv.stop(SIGTERM, 30), 0);
}

class DefaultServer : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    srv_ = new ServerProcess(FP4MOE_CLI, {"--served-model-name", "tiny-default", "--context-length", "512"});
    ASSERT_TRUE(srv_->wait_ready(60));
  }
  static void TearDownTestSuite() {
    delete srv_;
    srv_ = nullptr;
  }
  static ServerProcess* srv_;
};
ServerProcess* DefaultServer::srv_ = nullptr;

TEST_F(DefaultServer, CompletionsFieldByField) {
  HttpClient c(srv_->url(), kTimeout);
  json body = {{"model", "tiny-default"}, {"prompt", "The quick brown fox"}, {"max_tokens", 6}, {"temperature", 0},
               {"logprobs", 2}, {"ignore_eos", true}};
  auto r = c.post("/v1/completions", body.dump());
  ASSERT_EQ(r.status, 200) << r.body;
  const json j = parse(r.body);
  EXPECT_EQ(j["id"].get<std::string>().rfind("cmpl-", 0), 0u);
  EXPECT_EQ(j["object"], "text_completion");
  EXPECT_TRUE(j["created"].is_number_integer());
  EXPECT_EQ(j["model"], "tiny-default");
  ASSERT_EQ(j["choices"].size(), 1u);
  const json& ch = j["choices"][0];
  EXPECT_EQ(ch["index"], 0);
  EXPECT_TRUE(ch["text"].is_string());
  EXPECT_EQ(ch["finish_reason"], "length");
  const json& lp = ch["logprobs"];
  ASSERT_TRUE(lp.is_object());
  EXPECT_EQ(lp["tokens"].size(), 6u);
  EXPECT_EQ(lp["token_logprobs"].size(), 6u);
  EXPECT_EQ(lp["text_offset"].size(), 6u);
  ASSERT_EQ(lp["top_logprobs"].size(), 6u);
  for (const auto& t : lp["top_logprobs"]) EXPECT_EQ(t.size(), 2u);
  for (const auto& v : lp["token_logprobs"]) EXPECT_LE(v.get<double>(), 0.0);
  EXPECT_EQ(j["usage"]["completion_tokens"], 6);
  EXPECT_GT(j["usage"]["prompt_tokens"].get<int64_t>(), 0);
  EXPECT_EQ(j["usage"]["total_tokens"], j["usage"]["prompt_tokens"].get<int64_t>() + 6);

  // Streaming: deltas concatenate to the same text; usage only when asked; [DONE] last. vLLM's
  // continuous_usage_stats (with include_usage) puts the usage so far in every chunk; alone it does nothing.
  body.erase("logprobs");
  body["stream"] = true;
  for (int mode = 0; mode < 4; ++mode) {
    const bool include_usage = mode == 1 || mode == 2, continuous = mode == 2;
    body["stream_options"] = {{"include_usage", include_usage}};
    if (mode >= 2) body["stream_options"]["continuous_usage_stats"] = true;
    int status = 0;
    bool done = false;
    auto chunks = sse_chunks(c, "/v1/completions", body, &status, &done);
    ASSERT_EQ(status, 200);
    EXPECT_TRUE(done);
    std::string text;
    int n_usage = 0;
    int64_t tokens_so_far = 0;
    for (size_t i = 0; i < chunks.size(); ++i) {
      const json& k = chunks[i];
      EXPECT_EQ(k["object"], "text_completion");
      EXPECT_EQ(k["model"], "tiny-default");
      if (k.contains("usage") && k["choices"].empty()) {
        ++n_usage;
        EXPECT_EQ(k["usage"]["completion_tokens"], 6);
        EXPECT_EQ(i, chunks.size() - 1) << "usage must be the last chunk";
        continue;
      }
      EXPECT_EQ(k.contains("usage"), continuous) << "mode " << mode << ": " << k.dump();
      if (continuous && k.contains("usage")) {
        const int64_t so_far = k["usage"]["completion_tokens"].get<int64_t>();
        EXPECT_GE(so_far, tokens_so_far + 1) << k.dump();
        tokens_so_far = so_far;
        EXPECT_EQ(k["usage"]["prompt_tokens"], j["usage"]["prompt_tokens"]) << k.dump();
        EXPECT_EQ(k["usage"]["total_tokens"], so_far + j["usage"]["prompt_tokens"].get<int64_t>()) << k.dump();
      }
      ASSERT_EQ(k["choices"].size(), 1u);
      text += k["choices"][0]["text"].get<std::string>();
      const bool last_choice = i + 1 == chunks.size() - (include_usage ? 1 : 0);
      EXPECT_EQ(k["choices"][0]["finish_reason"].is_null(), !last_choice) << k.dump();
    }
    EXPECT_EQ(n_usage, include_usage ? 1 : 0);
    EXPECT_EQ(text, ch["text"].get<std::string>());
    if (continuous) {
      EXPECT_EQ(tokens_so_far, 6);
    }
  }

  // Streamed logprobs: text_offset counts on across the chunks, equal to the whole reply's (it restarted at 0 in
  // every chunk).
  body["logprobs"] = 2;
  body.erase("stream_options");
  int status = 0;
  bool done = false;
  json offsets = json::array();
  for (const json& k : sse_chunks(c, "/v1/completions", body, &status, &done)) {
    if (k["choices"].empty() || k["choices"][0]["logprobs"].is_null()) continue;
    for (const json& o : k["choices"][0]["logprobs"]["text_offset"]) offsets.push_back(o);
  }
  EXPECT_EQ(offsets, lp["text_offset"]);

  // A prompt of token ids works too.
  auto ri = c.post("/v1/completions", json{{"prompt", {10, 20, 30}}, {"max_tokens", 2}}.dump());
  ASSERT_EQ(ri.status, 200) << ri.body;
  EXPECT_EQ(parse(ri.body)["usage"]["prompt_tokens"], 3);
}

TEST_F(DefaultServer, ChatCompletionsFieldByField) {
  HttpClient c(srv_->url(), kTimeout);
  json body = {{"messages", {{{"role", "system"}, {"content", "Be brief."}}, {{"role", "user"}, {"content", "Hello!"}}}},
               {"max_tokens", 5},
               {"temperature", 0},
               {"logprobs", true},
               {"top_logprobs", 3}};
  auto r = c.post("/v1/chat/completions", body.dump());
  ASSERT_EQ(r.status, 200) << r.body;
  const json j = parse(r.body);
  EXPECT_EQ(j["id"].get<std::string>().rfind("chatcmpl-", 0), 0u);
  EXPECT_EQ(j["object"], "chat.completion");
  EXPECT_TRUE(j["created"].is_number_integer());
  EXPECT_EQ(j["model"], "tiny-default");
  ASSERT_EQ(j["choices"].size(), 1u);
  const json& ch = j["choices"][0];
  EXPECT_EQ(ch["index"], 0);
  EXPECT_EQ(ch["message"]["role"], "assistant");
  EXPECT_TRUE(ch["message"]["content"].is_string());
  EXPECT_TRUE(ch["finish_reason"] == "length" || ch["finish_reason"] == "stop") << ch["finish_reason"];
  ASSERT_TRUE(ch["logprobs"].is_object());
  const json& content = ch["logprobs"]["content"];
  EXPECT_EQ(content.size(), j["usage"]["completion_tokens"].get<size_t>());
  for (const auto& e : content) {
    EXPECT_TRUE(e["token"].is_string());
    EXPECT_LE(e["logprob"].get<double>(), 0.0);
    EXPECT_TRUE(e["bytes"].is_array());
    EXPECT_EQ(e["top_logprobs"].size(), 3u);
  }
  EXPECT_GT(j["usage"]["prompt_tokens"].get<int64_t>(), 4);

  body.erase("logprobs");
  body.erase("top_logprobs");
  body["stream"] = true;
  body["stream_options"] = {{"include_usage", true}};
  int status = 0;
  bool done = false;
  auto chunks = sse_chunks(c, "/v1/chat/completions", body, &status, &done);
  ASSERT_EQ(status, 200);
  EXPECT_TRUE(done);
  ASSERT_GE(chunks.size(), 2u);
  EXPECT_EQ(chunks[0]["choices"][0]["delta"]["role"], "assistant");
  std::string text;
  for (size_t i = 0; i + 1 < chunks.size(); ++i) {
    EXPECT_EQ(chunks[i]["object"], "chat.completion.chunk");
    EXPECT_EQ(chunks[i]["id"], chunks[0]["id"]);
    if (chunks[i]["choices"][0]["delta"].contains("content"))
      text += chunks[i]["choices"][0]["delta"]["content"].get<std::string>();
  }
  EXPECT_FALSE(chunks[chunks.size() - 2]["choices"][0]["finish_reason"].is_null());
  EXPECT_TRUE(chunks.back()["choices"].empty());
  // The same usage, but for the prompt's whole pages the stream found in the prefix cache (the
  // non-streamed request left them there).
  json usage = chunks.back()["usage"], usage0 = j["usage"];
  EXPECT_EQ(usage["prompt_tokens_details"]["cached_tokens"], (usage0["prompt_tokens"].get<int64_t>() - 1) / 16 * 16);
  usage.erase("prompt_tokens_details");
  usage0.erase("prompt_tokens_details");
  EXPECT_EQ(usage, usage0);
  EXPECT_EQ(text, ch["message"]["content"].get<std::string>());

  // OpenAI content parts: the default template prints content, so text parts are joined by "\n" and the
  // prompt is the one of that string; an image part is a 400 (a text-only model).
  auto prompt_tokens = [&](const json& content) {
    auto res = c.post("/v1/chat/completions",
                      json{{"messages", {{{"role", "user"}, {"content", content}}}}, {"max_tokens", 1}}.dump());
    EXPECT_EQ(res.status, 200) << res.body;
    return res.status == 200 ? parse(res.body)["usage"]["prompt_tokens"].get<int64_t>() : -1;
  };
  EXPECT_EQ(prompt_tokens(json::array({{{"type", "text"}, {"text", "Hello"}}, {{"type", "text"}, {"text", "you"}}})),
            prompt_tokens("Hello\nyou"));
  expect_error(
      c.post("/v1/chat/completions",
             json{{"messages",
                   {{{"role", "user"},
                     {"content", {{{"type", "image_url"}, {"image_url", {{"url", "data:image/png;base64,"}}}}}}}}}}
                 .dump()),
      400, "messages[0].content[0].type");
}

TEST_F(DefaultServer, GenerateStopModelsTokenizeInfo) {
  HttpClient c(srv_->url(), kTimeout);
  auto m = c.get("/v1/models");
  ASSERT_EQ(m.status, 200);
  const json mj = parse(m.body);
  EXPECT_EQ(mj["object"], "list");
  ASSERT_EQ(mj["data"].size(), 1u);
  EXPECT_EQ(mj["data"][0]["id"], "tiny-default");
  EXPECT_EQ(mj["data"][0]["object"], "model");
  EXPECT_EQ(mj["data"][0]["max_model_len"], 512);
  // Retrieve one model (OpenAI GET /v1/models/{id}): its card, or a 404 naming the id.
  auto one = c.get("/v1/models/tiny-default");
  ASSERT_EQ(one.status, 200) << one.body;
  // SGLang's /get_model_info.
  auto model_info = c.get("/get_model_info");
  ASSERT_EQ(model_info.status, 200) << model_info.body;
  const json mi = parse(model_info.body);
  EXPECT_EQ(mi["is_generation"], true);
  EXPECT_EQ(mi["served_model_name"], "tiny-default");
  EXPECT_EQ(mi["context_length"], 512);
  EXPECT_EQ(mi["architectures"].size(), 1u);
  EXPECT_TRUE(mi.contains("model_path")) << mi.dump();
  EXPECT_EQ(parse(one.body)["id"], "tiny-default");
  EXPECT_EQ(parse(one.body)["object"], "model");
  auto other = c.get("/v1/models/gpt-4");
  expect_error(other, 404, "model");
  EXPECT_NE(other.body.find("the model 'gpt-4' does not exist"), std::string::npos) << other.body;
  auto post_one = c.post("/v1/models/tiny-default", "{}");  // the pattern route takes GET only
  expect_error(post_one, 405, "");
  EXPECT_EQ(post_one.headers.find("Allow")->second, "GET");

  auto t = c.post("/v1/tokenize", json{{"prompt", "abc"}, {"add_special_tokens", false}}.dump());
  ASSERT_EQ(t.status, 200) << t.body;
  const json tj = parse(t.body);
  EXPECT_EQ(tj["count"], tj["tokens"].size());
  EXPECT_EQ(tj["max_model_len"], 512);
  auto d = c.post("/v1/detokenize", json{{"tokens", tj["tokens"]}}.dump());
  ASSERT_EQ(d.status, 200) << d.body;
  EXPECT_EQ(parse(d.body)["text"], "abc");

  auto info = c.get("/get_server_info");
  ASSERT_EQ(info.status, 200);
  const json ij = parse(info.body);
  for (const char* k :
       {"max_running_requests", "max_total_num_tokens", "chunked_prefill_size", "max_prefill_tokens",
        "num_continuous_decode_steps", "max_queued_requests", "schedule_policy", "context_length", "vocab_size",
        "internal_states", "served_model_name", "device_sampling", "schedule_conservativeness"}) {
    EXPECT_TRUE(ij.contains(k)) << k;
  }
  EXPECT_EQ(ij["context_length"], 512);
  EXPECT_EQ(ij["device_sampling"], true);  // the default (the CPU model has no device to draw on)
  EXPECT_EQ(ij["max_http_threads"], std::max<int64_t>(2048, ij["http_threads"].get<int64_t>()));  // effective, not 0
  EXPECT_EQ(ij["decode_log_interval"], 40);  // the defaults of the server's own levers, as SGLang shows its
  EXPECT_EQ(ij["watchdog_timeout"], 300.0);
  EXPECT_EQ(ij["drain_timeout"], 600.0);

  // Greedy /generate with a stop token: it ends at that token with finish_reason stop.
  json body = {{"input_ids", {72, 101, 108, 108, 111}}, {"sampling_params", {{"max_new_tokens", 8}, {"temperature", 0}}},
               {"return_logprob", true}};
  auto g = c.post("/generate", body.dump());
  ASSERT_EQ(g.status, 200) << g.body;
  const json gj = parse(g.body);
  const auto out = gj["output_ids"].get<std::vector<int64_t>>();
  ASSERT_EQ(out.size(), 8u);
  EXPECT_EQ(gj["meta_info"]["output_token_logprobs"].size(), 8u);
  body["sampling_params"]["stop_token_ids"] = {out[2]};
  auto gs = c.post("/generate", body.dump());
  ASSERT_EQ(gs.status, 200) << gs.body;
  const json gsj = parse(gs.body);
  const auto out_s = gsj["output_ids"].get<std::vector<int64_t>>();
  ASSERT_FALSE(out_s.empty());
  EXPECT_LE(out_s.size(), 3u);
  EXPECT_EQ(gsj["meta_info"]["finish_reason"]["type"], "stop");
}

TEST_F(DefaultServer, BadRequestsGet400And413AndServerKeepsServing) {
  HttpClient c(srv_->url(), kTimeout);
  expect_error(c.post("/generate", "{not json"), 400, "body");
  expect_error(c.post("/generate", "[1,2]"), 400, "body");
  expect_error(c.post("/v1/completions", R"({"prompt": "a", "temperature": 1e999})"), 400, "body");  // no double
  expect_error(c.post("/generate", json{{"sampling_params", {{"max_new_tokens", 2}}}}.dump()), 400, "text");
  expect_error(c.post("/generate", json{{"text", "a"}, {"sampling_params", {{"temperature", -1}}}}.dump()), 400,
               "sampling_params.temperature");
  expect_error(c.post("/generate", json{{"text", "a"}, {"sampling_params", {{"top_p", 0}}}}.dump()), 400,
               "sampling_params.top_p");
  expect_error(c.post("/generate", json{{"input_ids", {1, -2}}}.dump()), 400, "input_ids");
  expect_error(c.post("/generate", json{{"input_ids", {1, 100000}}}.dump()), 400, "input_ids");
  expect_error(c.post("/generate", json{{"input_ids", json::array()}}.dump()), 400, "input_ids");
  expect_error(c.post("/v1/completions", json{{"prompt", "a"}, {"max_tokens", "many"}}.dump()), 400, "max_tokens");
  expect_error(c.post("/v1/completions", json{{"prompt", "a"}, {"priority", 2}}.dump()), 400, "priority");  // fcfs
  expect_error(c.post("/v1/completions", json{{"prompt", "a"}, {"n", 65}}.dump()), 400, "n");
  expect_error(c.post("/v1/completions", json{{"max_tokens", 2}}.dump()), 400, "prompt");
  expect_error(c.post("/v1/chat/completions", json{{"messages", "hi"}}.dump()), 400, "messages");
  expect_error(c.post("/v1/chat/completions", json{{"messages", {{{"content", "hi"}}}}}.dump()), 400,
               "messages[0].role");
  expect_error(c.post("/v1/detokenize", json{{"tokens", {1, 999999}}}.dump()), 400, "tokens");
  // A list of lists with a bare item: 400 naming it (a bare id was a 500, null / {} decoded as "").
  expect_error(c.post("/v1/detokenize", R"({"tokens": [[1], 2]})"), 400, "tokens[1]");
  expect_error(c.post("/v1/detokenize", R"({"tokens": [[1], null]})"), 400, "tokens[1]");
  // Chat messages: an unknown role, a user turn without content, tool_calls that are not a list of objects.
  expect_error(c.post("/v1/chat/completions", R"({"messages": [{"role": "bogus", "content": "hi"}]})"), 400,
               "messages[0].role");
  expect_error(c.post("/v1/chat/completions", R"({"messages": [{"role": "user"}]})"), 400, "messages[0].content");
  expect_error(c.post("/v1/chat/completions",
                      R"({"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "tool_calls": [5]}]})"),
               400, "messages[1].tool_calls");
  // Fields the engine would refuse are refused here, by name (the parser's ranges are the engine's).
  const json a = {{"prompt", "a"}};
  auto with = [&](json extra) {
    json b = a;
    b.update(extra);
    return b.dump();
  };
  expect_error(c.post("/v1/completions", with({{"max_tokens", 0}})), 400, "max_tokens");
  auto bad_regex = c.post("/v1/completions", with({{"regex", "(a"}}));
  expect_error(bad_regex, 400, "regex");
  EXPECT_EQ(parse(bad_regex.body)["error"]["message"].get<std::string>().rfind("regex: missing ')'", 0), 0u)
      << bad_regex.body;
  expect_error(c.post("/abort_request", json{{"abort_all", "x"}}.dump()), 400, "abort_all");
  // The bad value is in the message.
  auto bad_rid = c.post("/abort_request", json{{"rid", 5}}.dump());
  expect_error(bad_rid, 400, "rid");
  EXPECT_NE(bad_rid.body.find("got rid = 5"), std::string::npos) << bad_rid.body;
  auto bad_special = c.post("/v1/tokenize", json{{"prompt", "a"}, {"add_special_tokens", "x"}}.dump());
  expect_error(bad_special, 400, "add_special_tokens");
  EXPECT_NE(bad_special.body.find("got \\\"x\\\""), std::string::npos) << bad_special.body;
  auto bad_tok = c.post("/v1/tokenize", json{{"prompt", 5}}.dump());
  expect_error(bad_tok, 400, "prompt");
  EXPECT_NE(bad_tok.body.find("got 5"), std::string::npos) << bad_tok.body;
  expect_error(c.post("/v1/completions", with({{"stop", ""}})), 400, "stop");
  expect_error(c.post("/v1/completions", with({{"stop_token_ids", {1, 100000}}})), 400, "stop_token_ids");
  expect_error(c.post("/v1/completions", with({{"logit_bias", {{"999999", 1}}}})), 400, "logit_bias");
  expect_error(c.post("/v1/completions", with({{"max_tokens", 2}, {"min_tokens", 3}})), 400, "min_tokens");
  expect_error(c.post("/v1/completions", with({{"repetition_penalty", 2.5}})), 400, "repetition_penalty");
  const auto oov = c.post("/generate", json{{"text", "a"}, {"sampling_params", {{"stop_token_ids", {100000}}}}}.dump());
  expect_error(oov, 400, "sampling_params.stop_token_ids");
  // The message names the field as the API does, and no choice (every choice shares it).
  EXPECT_EQ(
      parse(oov.body)["error"]["message"].get<std::string>().rfind("sampling_params.stop_token_ids[0] = 100000", 0), 0u)
      << oov.body;
  const auto oov_n = c.post(
      "/v1/chat/completions",
      json{{"messages", {{{"role", "user"}, {"content", "a"}}}}, {"n", 2}, {"logit_bias", {{"99999", 1}}}}.dump());
  expect_error(oov_n, 400, "logit_bias");
  EXPECT_EQ(oov_n.body.find("choice"), std::string::npos) << oov_n.body;
  expect_error(c.post("/generate", json{{"text", "a"}, {"sampling_params", {{"max_new_tokens", -1}}}}.dump()), 400,
               "sampling_params.max_new_tokens");
  expect_error(c.post("/generate", json{{"text", "a"}, {"sampling_params", {{"temprature", 0}}}}.dump()), 400,
               "sampling_params.temprature");
  // Unknown route: a typed 404. A known route asked with another method: a 405 naming the methods it takes.
  expect_error(c.get("/no/such/route"), 404, "");
  for (const auto& [res, allow] :
       {std::pair{c.get("/v1/completions"), "POST"}, std::pair{c.post("/health", "{}"), "GET"}}) {
    expect_error(res, 405, "");
    const auto h = res.headers.find("Allow");
    ASSERT_NE(h, res.headers.end()) << res.body;
    EXPECT_EQ(h->second, allow);
    EXPECT_NE(parse(res.body)["error"]["message"].get<std::string>().find(std::string("takes ") + allow),
              std::string::npos)
        << res.body;
  }
  // A body past the limit: 413 naming it.
  auto big = c.post("/v1/completions", std::string((size_t{64} << 20) + 1, ' '));
  expect_error(big, 413, "");
  EXPECT_NE(big.body.find("64 MiB"), std::string::npos) << big.body;

  // 400 (as OpenAI, vLLM and SGLang): the prompt does not fit the context (512); both lengths are in the reply.
  std::vector<int> long_prompt(600, 65);
  auto r = c.post("/generate", json{{"input_ids", long_prompt}}.dump());
  expect_error(r, 400, "input_ids");
  const json e = parse(r.body)["error"];
  EXPECT_EQ(e["type"], "context_length_exceeded");
  EXPECT_EQ(e["prompt_tokens"], 600);
  EXPECT_EQ(e["context_length"], 512);
  EXPECT_NE(e["message"].get<std::string>().find("600"), std::string::npos);
  EXPECT_NE(e["message"].get<std::string>().find("512"), std::string::npos);
  // Prompt fits but prompt + max_new_tokens does not: 400 naming the budget with the numbers.
  auto r2 = c.post("/generate", json{{"input_ids", std::vector<int>(500, 65)}, {"sampling_params", {{"max_new_tokens", 100}}}}.dump());
  expect_error(r2, 400, "sampling_params.max_new_tokens");

  // Still serving.
  auto ok = c.post("/generate", json{{"text", "ok"}, {"sampling_params", {{"max_new_tokens", 2}}}}.dump());
  EXPECT_EQ(ok.status, 200) << ok.body;
  EXPECT_EQ(c.get("/health").status, 200);
  auto m = fp4moe::testing::parse_prometheus(c.get("/metrics").body);
  EXPECT_GE(m["fp4moe:http_errors_total{code=\"400\"}"], 14);
  EXPECT_GE(m["fp4moe:http_errors_total{code=\"413\"}"], 1);
}

TEST_F(DefaultServer, ClientDisconnectMidStreamFreesItsRequest) {
  HttpClient c(srv_->url(), kTimeout);
  json body = {{"text", "go"},
               {"sampling_params", {{"max_new_tokens", 400}, {"ignore_eos", true}, {"temperature", 0}}},
               {"stream", true}};
  // The hang-up races the reply's own end (400 tokens, ~0.5 s here): a round in which all 400 were
  // generated is retried; one round must see the request aborted and freed.
  bool aborted = false;
  for (int round = 0; round < 5 && !aborted; ++round) {
    const double aborted_before = metric(srv_->url(), "fp4moe:num_aborted_requests_total");
    const double generated_before = metric(srv_->url(), "fp4moe:generation_tokens_total");
    int n_chunks = 0;
    double running_while_streaming = -1;
    auto r = c.post_sse("/generate", body.dump(), [&](std::string_view d) {
      if (d == "[DONE]") return true;
      if (++n_chunks == 3) {
        running_while_streaming = metric(srv_->url(), "fp4moe:num_running_reqs");
        return false;  // hang up
      }
      return true;
    });
    EXPECT_EQ(r.status, -1);  // we closed it
    EXPECT_EQ(n_chunks, 3);
    // The server notices at its next write, aborts the request and frees its KV.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    double running = 1, used = 1;
    while (std::chrono::steady_clock::now() < deadline) {
      running = metric(srv_->url(), "fp4moe:num_running_reqs");
      used = metric(srv_->url(), "fp4moe:num_used_tokens");
      if (running == 0 && used == 0) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    EXPECT_EQ(running, 0);
    EXPECT_EQ(used, 0);
    const double generated = metric(srv_->url(), "fp4moe:generation_tokens_total") - generated_before;
    const double n_aborted = metric(srv_->url(), "fp4moe:num_aborted_requests_total") - aborted_before;
    if (generated == 400) {  // it ended before the hang-up reached it
      EXPECT_EQ(n_aborted, 0);
      continue;
    }
    EXPECT_EQ(running_while_streaming, 1);
    EXPECT_EQ(n_aborted, 1);
    EXPECT_LT(generated, 400);
    aborted = true;
  }
  EXPECT_TRUE(aborted) << "in 5 rounds the hang-up never came before the reply's end";
  HttpClient c2(srv_->url(), kTimeout);
  EXPECT_EQ(c2.get("/health").status, 200);
}

// A raw HTTP/1.1 POST on a plain socket (so the test controls when the connection closes, and may
// leave out the Content-Length header).
int raw_connect(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  if (fd < 0 || ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    ADD_FAILURE() << "cannot connect to 127.0.0.1:" << port;
    if (fd >= 0) ::close(fd);
    return -1;
  }
  return fd;
}

int raw_post(int port, const std::string& path, const std::string& body, bool with_length = true,
             const std::string& version = "HTTP/1.1", const std::string& connection = "close") {
  const int fd = raw_connect(port);
  if (fd < 0) return -1;
  const std::string length = with_length ? "Content-Length: " + std::to_string(body.size()) + "\r\n" : "";
  const std::string msg = "POST " + path + " " + version + "\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n" +
                          length + "Connection: " + connection + "\r\n\r\n" + body;
  EXPECT_EQ(::send(fd, msg.data(), msg.size(), MSG_NOSIGNAL), static_cast<ssize_t>(msg.size()));
  return fd;
}

// Everything the server sends on fd until it closes the connection (or timeout_s passes).
std::string read_until_closed(int fd, double timeout_s) {
  std::string got;
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  char buf[4096];
  while (std::chrono::steady_clock::now() < end) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 100) <= 0) continue;
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) break;
    got.append(buf, static_cast<size_t>(n));
  }
  return got;
}

// A Content-Length that is not a byte count, or past 2^64, is answered at once (httplib alone waited 30 s for such a
// body) and the connection closed (the unread body was read as the next request); the server keeps serving.
TEST_F(DefaultServer, BadContentLengthIsAnsweredAtOnce) {
  for (const auto& [length, reply] : std::vector<std::pair<std::string, std::string>>{
           {"-5", "HTTP/1.1 400"}, {"abc", "HTTP/1.1 400"}, {"100000000000000000000", "HTTP/1.1 413"}}) {
    const int fd = raw_connect(srv_->port());
    ASSERT_GE(fd, 0);
    // The body that follows would have been a second request on the connection.
    const std::string msg = "POST /generate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: " + length +
                            "\r\n\r\nGET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n";
    ASSERT_EQ(::send(fd, msg.data(), msg.size(), MSG_NOSIGNAL), static_cast<ssize_t>(msg.size()));
    const auto t0 = std::chrono::steady_clock::now();
    const std::string got = read_until_closed(fd, 20);
    ::close(fd);
    EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(2))
        << "closed at once: " << length << ": " << got;
    EXPECT_EQ(got.find("HTTP/1.1 200"), std::string::npos) << "the body was served as a request: " << got;
    EXPECT_EQ(got.rfind(reply, 0), 0u) << length << ": " << got;
    EXPECT_NE(got.find("Connection: close"), std::string::npos) << got;
    EXPECT_NE(got.find(length.size() < 10 ? "is not a byte count" : "MiB a request may send"), std::string::npos)
        << got;
  }
  HttpClient c(srv_->url(), kTimeout);
  EXPECT_EQ(c.post("/v1/completions", json{{"prompt", "still here"}, {"max_tokens", 2}}.dump()).status, 200);
}

// An HTTP/1.0 client gets its reply delimited by the connection's close: HTTP/1.0 has no chunked coding (httplib's
// chunked provider sent "Transfer-Encoding: chunked" to it, which ApacheBench and other 1.0 clients cannot read).
// The server closes at once, also when the client asked for keep-alive (as `ab -k` does; it waited 5 s a reply).
TEST_F(DefaultServer, Http10RepliesAreNotChunked) {
  for (const auto& [stream, connection] :
       {std::pair<bool, const char*>{false, "close"}, {true, "close"}, {false, "Keep-Alive"}, {true, "Keep-Alive"}}) {
    const json body = {{"prompt", "hi"}, {"max_tokens", 4}, {"temperature", 0}, {"stream", stream}};
    const auto t0 = std::chrono::steady_clock::now();
    const int fd = raw_post(srv_->port(), "/v1/completions", body.dump(), true, "HTTP/1.0", connection);
    ASSERT_GE(fd, 0);
    const std::string reply = read_until_closed(fd, kTimeout);
    ::close(fd);
    EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 2.0) << connection;
    const size_t head_end = reply.find("\r\n\r\n");
    ASSERT_NE(head_end, std::string::npos) << reply;
    const std::string head = reply.substr(0, head_end), payload = reply.substr(head_end + 4);
    EXPECT_NE(head.find(" 200 "), std::string::npos) << head;
    EXPECT_EQ(head.find("chunked"), std::string::npos) << head;
    EXPECT_NE(head.find("Connection: close"), std::string::npos) << head;
    if (!stream) {
      EXPECT_EQ(parse(payload)["usage"]["completion_tokens"], 4) << payload;
    } else {
      EXPECT_EQ(payload.rfind("data: {", 0), 0u) << payload;
      EXPECT_NE(payload.find("data: [DONE]\n\n"), std::string::npos) << payload;
    }
  }
}

// text_offset counts characters of the reply text, also past tokens that are not whole UTF-8 (a byte-level model
// samples stray continuation bytes, shown as U+FFFD): each one-character ASCII token sits at its offset.
TEST_F(DefaultServer, TextOffsetsIndexTheReplyText) {
  HttpClient c(srv_->url(), kTimeout);
  int checked = 0, odd = 0;
  for (int seed = 1; seed <= 8; ++seed) {
    const json body = {{"prompt", "hi"}, {"max_tokens", 40}, {"logprobs", 0}, {"temperature", 1}, {"seed", seed}};
    const std::string full = c.post("/v1/completions", body.dump()).body;
    const json ch = parse(full)["choices"][0];
    std::vector<std::string> chars;  // the reply text's code points
    for (const unsigned char b : ch["text"].get<std::string>()) {
      if ((b & 0xC0) == 0x80 && !chars.empty())
        chars.back() += static_cast<char>(b);
      else
        chars.push_back(std::string(1, static_cast<char>(b)));
    }
    const json& lp = ch["logprobs"];
    for (size_t i = 0; i < lp["tokens"].size(); ++i) {
      const std::string t = lp["tokens"][i];
      if (t.rfind("bytes:", 0) == 0) ++odd;
      if (t.size() != 1 || static_cast<unsigned char>(t[0]) >= 0x80) continue;
      const size_t at = lp["text_offset"][i];
      ASSERT_LT(at, chars.size()) << full;
      EXPECT_EQ(chars[at], t) << "token " << i << ": " << full;
      ++checked;
    }
    // Streamed, the offsets count on across the chunks to the same values.
    json streamed = body;
    streamed["stream"] = true;
    json offsets = json::array();
    c.post_sse("/v1/completions", streamed.dump(), [&](std::string_view data) {
      if (data == "[DONE]") return true;
      const json k = parse(std::string(data));
      if (k["choices"][0]["logprobs"].is_object())
        for (const json& o : k["choices"][0]["logprobs"]["text_offset"]) offsets.push_back(o);
      return true;
    });
    EXPECT_EQ(offsets, lp["text_offset"]) << seed;
  }
  EXPECT_GT(checked, 20);
  EXPECT_GT(odd, 0) << "no token that is not whole UTF-8 was sampled: the case is not covered";
}

// One keep-alive connection carries many requests (httplib's default closed it after 5, so a benchmark client paid a
// new handshake every fifth request); each reply keeps it open.
TEST_F(DefaultServer, KeepAliveConnectionCarriesManyRequests) {
  const int fd = raw_connect(srv_->port());
  ASSERT_GE(fd, 0);
  for (int i = 0; i < 12; ++i) {
    const std::string msg = "GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n";
    ASSERT_EQ(::send(fd, msg.data(), msg.size(), MSG_NOSIGNAL), static_cast<ssize_t>(msg.size())) << "request " << i;
    std::string reply;  // one reply: the head, then Content-Length bytes
    char buf[4096];
    size_t head_end = std::string::npos, want = 0;
    while (head_end == std::string::npos || reply.size() < want) {
      pollfd p{fd, POLLIN, 0};
      ASSERT_GT(::poll(&p, 1, 5000), 0) << "no reply to request " << i << ": " << reply;
      const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
      ASSERT_GT(n, 0) << "the server closed the connection before reply " << i;
      reply.append(buf, static_cast<size_t>(n));
      head_end = reply.find("\r\n\r\n");
      if (head_end != std::string::npos) {
        const size_t cl = reply.find("Content-Length: ");
        ASSERT_NE(cl, std::string::npos) << reply;
        want = head_end + 4 + std::stoul(reply.substr(cl + 16));
      }
    }
    EXPECT_NE(reply.find(" 200 "), std::string::npos) << reply;
    EXPECT_EQ(reply.find("Connection: close"), std::string::npos) << "reply " << i << ": " << reply;
  }
  ::close(fd);
}

// A JSON body sent as curl -d sends it (Content-Type application/x-www-form-urlencoded) is read as JSON at any size:
// httplib refused such a body past 8 KiB with a 413 that claimed it exceeded the 64 MiB limit.
TEST_F(DefaultServer, FormEncodedJsonBodyOfAnySizeIsRead) {
  HttpClient c(srv_->url(), kTimeout);
  const std::string pad(9000, ' ');  // JSON's whitespace: a 9 KB body with a short prompt
  for (const char* type : {"application/x-www-form-urlencoded", "Application/X-WWW-Form-Urlencoded; charset=utf-8",
                           "application/x-www-form-urlencodedx"}) {  // (httplib caps any type starting so)
    auto r = c.post("/v1/completions", json{{"prompt", "hi"}, {"max_tokens", 2}}.dump() + pad, type);
    EXPECT_EQ(r.status, 200) << type << ": " << r.body;
  }
  auto g = c.post("/generate", json{{"text", "hi"}, {"sampling_params", {{"max_new_tokens", 2}}}}.dump() + pad,
                  "application/x-www-form-urlencoded");
  EXPECT_EQ(g.status, 200) << g.body;
}

// A non-streaming request that would run for many seconds; its client reads nothing and closes
// the socket soon after the request starts. The server must abort it (the aborted counter rises, far
// fewer tokens than asked are generated) and free its KV within a bound.
TEST(ServerE2E, ClientDisconnectNonStreamingFreesItsRequest) {
  ServerProcess srv(FP4MOE_CLI, {"--context-length", "8192"});
  ASSERT_TRUE(srv.wait_ready(60));
  const std::string url = srv.url();
  const int max_new = 8000;
  const json body = {{"text", "go"},
                     {"sampling_params", {{"max_new_tokens", max_new}, {"ignore_eos", true}, {"temperature", 0}}}};
  const int fd = raw_post(srv.port(), "/generate", body.dump());
  ASSERT_GE(fd, 0);
  // Running and generating, then the client goes.
  const auto start_deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  double generated = 0;
  while (std::chrono::steady_clock::now() < start_deadline) {
    generated = metric(url, "fp4moe:generation_tokens_total");
    if (generated >= 1) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_GE(generated, 1) << "the request never produced a token";
  EXPECT_EQ(metric(url, "fp4moe:num_running_reqs"), 1);
  EXPECT_GT(metric(url, "fp4moe:num_used_tokens"), 0);
  // While it runs the server writes nothing after the headers (it wrote a space every 150 ms, so a client's read
  // timeout never fired): the client's silence bound works as with SGLang, and its close is seen on the socket.
  const std::string waiting = read_until_closed(fd, 1.0);
  EXPECT_EQ(waiting.rfind("HTTP/1.1 200", 0), 0u) << waiting;
  EXPECT_EQ(waiting.size(), waiting.find("\r\n\r\n") + 4) << "bytes after the headers: " << waiting;
  const auto closed_at = std::chrono::steady_clock::now();
  ::close(fd);
  constexpr double kBoundS = 3.0;  // the server probes every 150 ms; the second failed probe aborts
  double running = 1, used = 1;
  while (std::chrono::steady_clock::now() - closed_at < std::chrono::duration<double>(kBoundS)) {
    running = metric(url, "fp4moe:num_running_reqs");
    used = metric(url, "fp4moe:num_used_tokens");
    if (running == 0 && used == 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  const double freed_after_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - closed_at).count();
  EXPECT_EQ(running, 0) << "still running " << freed_after_s << " s after the client closed";
  EXPECT_EQ(used, 0) << "KV still in use " << freed_after_s << " s after the client closed";
  EXPECT_EQ(metric(url, "fp4moe:num_aborted_requests_total"), 1);
  EXPECT_LT(metric(url, "fp4moe:generation_tokens_total"), max_new / 2) << "it ran on instead of being aborted";
  HttpClient c(url, kTimeout);
  EXPECT_EQ(c.get("/health").status, 200);
  // The server keeps serving non-streaming requests.
  auto ok = c.post("/generate", json{{"text", "ok"}, {"sampling_params", {{"max_new_tokens", 2}}}}.dump());
  EXPECT_EQ(ok.status, 200) << ok.body;
  EXPECT_EQ(parse(ok.body)["meta_info"]["completion_tokens"], 2);
  std::fprintf(stderr, "non-streaming disconnect: freed %.3f s after the close\n", freed_after_s);

  // n = 3 choices: the client goes, all three engine requests are aborted and freed.
  const json n3 = {{"prompt", "go"}, {"max_tokens", max_new}, {"n", 3}, {"ignore_eos", true}, {"temperature", 0}};
  const int fd3 = raw_post(srv.port(), "/v1/completions", n3.dump());
  ASSERT_GE(fd3, 0);
  const auto n3_deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (std::chrono::steady_clock::now() < n3_deadline && metric(url, "fp4moe:num_running_reqs") < 3) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_EQ(metric(url, "fp4moe:num_running_reqs"), 3) << "the three choices never ran together";
  ::close(fd3);
  const auto n3_closed = std::chrono::steady_clock::now();
  while (std::chrono::steady_clock::now() - n3_closed < std::chrono::duration<double>(kBoundS) &&
         (metric(url, "fp4moe:num_running_reqs") > 0 || metric(url, "fp4moe:num_used_tokens") > 0)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_EQ(metric(url, "fp4moe:num_running_reqs"), 0);
  EXPECT_EQ(metric(url, "fp4moe:num_used_tokens"), 0);
  EXPECT_EQ(metric(url, "fp4moe:num_aborted_requests_total"), 1 + 3);
}

// A model that fails to load at once: the server prints the error and exits non-zero. (Its listener
// thread could be stopped before it ran, and the join then waited forever; seen 1 in 2-4 starts.)
TEST(ServerE2E, ModelThatFailsToLoadExitsWithItsError) {
  for (int i = 0; i < 20; ++i) {
    std::string out;
    const int rc = fp4moe::testing::run_command(
        std::string("timeout 30 ") + FP4MOE_CLI + " serve --model-path /nonexistent/model --port 0 </dev/null 2>&1",
        &out);
    ASSERT_NE(rc, 0) << out;
    ASSERT_NE(rc, 124) << "start " << i << " hung after the load failed:\n" << out;
    ASSERT_NE(out.find("/nonexistent/model is neither a model directory nor a preset"), std::string::npos) << out;
  }
}

// Connections that hold a worker (clients that send half a request, as streams hold theirs) do not
// stall the others: the pool grows past --http-threads. httplib's fixed pool made /health wait for a
// held connection's read timeout (30 s).
TEST(ServerE2E, HeldConnectionsDoNotStallHealth) {
  ServerProcess srv(FP4MOE_CLI, {"--http-threads", "2", "--max-http-threads", "64"});
  ASSERT_TRUE(srv.wait_ready(60));
  std::vector<int> held;
  for (int i = 0; i < 6; ++i) {
    const int fd = raw_connect(srv.port());
    ASSERT_GE(fd, 0);
    const std::string half = "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n";  // no blank line: unfinished
    EXPECT_EQ(::send(fd, half.data(), half.size(), MSG_NOSIGNAL), static_cast<ssize_t>(half.size()));
    held.push_back(fd);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // accepted and read by now
  HttpClient c(srv.url(), kTimeout);
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(c.get("/health").status, 200);
  auto g = c.post("/generate", json{{"text", "hi"}, {"sampling_params", {{"max_new_tokens", 2}}}}.dump());
  EXPECT_EQ(g.status, 200) << g.body;
  const double took_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(took_s, 10.0) << "the held connections stalled the server";
  for (int fd : held) ::close(fd);
  std::fprintf(stderr, "with 6 held connections and 2 threads kept: /health + /generate in %.3f s\n", took_s);
}

// OpenAI `n`: n choices of one request (each its own engine request, choice i seeded with seed + i),
// non-streaming and streaming, with usage counting the prompt once.
TEST_F(DefaultServer, NChoicesNonStreamingAndStreaming) {
  HttpClient c(srv_->url(), kTimeout);
  const json body = {{"prompt", "The quick brown fox"},
                     {"max_tokens", 5},
                     {"n", 3},
                     {"temperature", 1.0},
                     {"seed", 11},
                     {"ignore_eos", true}};
  auto r = c.post("/v1/completions", body.dump());
  ASSERT_EQ(r.status, 200) << r.body;
  const json j = parse(r.body);
  ASSERT_EQ(j["choices"].size(), 3u);
  std::set<std::string> texts;
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(j["choices"][i]["index"], i);
    EXPECT_EQ(j["choices"][i]["finish_reason"], "length");
    texts.insert(j["choices"][i]["text"].get<std::string>());
  }
  EXPECT_GE(texts.size(), 2u) << "three seeds drew the same 5 tokens: " << r.body;
  const int64_t prompt_tokens = j["usage"]["prompt_tokens"].get<int64_t>();
  EXPECT_EQ(j["usage"]["completion_tokens"], 15);
  EXPECT_EQ(j["usage"]["total_tokens"], prompt_tokens + 15);
  // Seeded: the same request gives the same choices; choice 0 is the n = 1 request's.
  EXPECT_EQ(parse(c.post("/v1/completions", body.dump()).body)["choices"], j["choices"]);
  json one = body;
  one["n"] = 1;
  EXPECT_EQ(parse(c.post("/v1/completions", one.dump()).body)["choices"][0]["text"], j["choices"][0]["text"]);

  // Chat, streaming: every choice's deltas, a finish_reason each, one usage chunk with the sum, one [DONE].
  json chat = {{"messages", {{{"role", "user"}, {"content", "Hello!"}}}},
               {"max_tokens", 4},
               {"n", 2},
               {"temperature", 0},
               {"ignore_eos", true},
               {"stream", true},
               {"stream_options", {{"include_usage", true}}}};
  int status = 0;
  bool done = false;
  const auto chunks = sse_chunks(c, "/v1/chat/completions", chat, &status, &done);
  ASSERT_EQ(status, 200);
  EXPECT_TRUE(done);
  std::string text[2];
  int finishes[2] = {0, 0}, roles[2] = {0, 0}, n_usage = 0;
  for (const json& k : chunks) {
    if (k["choices"].empty()) {
      ++n_usage;
      EXPECT_EQ(k["usage"]["completion_tokens"], 8);
      continue;
    }
    ASSERT_EQ(k["choices"].size(), 1u);
    const int i = k["choices"][0]["index"].get<int>();
    ASSERT_TRUE(i == 0 || i == 1) << k.dump();
    const json& d = k["choices"][0]["delta"];
    if (d.contains("role")) ++roles[i];
    if (d.contains("content")) text[i] += d["content"].get<std::string>();
    if (!k["choices"][0]["finish_reason"].is_null()) ++finishes[i];
  }
  EXPECT_EQ(n_usage, 1);
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(finishes[i], 1) << "choice " << i;
    EXPECT_EQ(roles[i], 1) << "choice " << i;
  }
  EXPECT_EQ(text[0], text[1]) << "greedy choices differ";
}

// A batch of prompts on /v1/completions: choice p n + j is prompt p's choice j, each prompt's choices
// what the prompt gives alone, usage with every prompt counted once.
TEST_F(DefaultServer, BatchOfPromptsWithNChoices) {
  HttpClient c(srv_->url(), kTimeout);
  const std::vector<std::string> prompts = {"The quick brown fox", "hello"};
  std::vector<std::string> alone;
  int64_t prompt_tokens = 0;
  for (const std::string& p : prompts) {
    auto r = c.post("/v1/completions",
                    json{{"prompt", p}, {"max_tokens", 3}, {"temperature", 0}, {"ignore_eos", true}}.dump());
    ASSERT_EQ(r.status, 200) << r.body;
    const json j = parse(r.body);
    alone.push_back(j["choices"][0]["text"].get<std::string>());
    prompt_tokens += j["usage"]["prompt_tokens"].get<int64_t>();
  }
  const json body = {{"prompt", prompts}, {"max_tokens", 3}, {"n", 2}, {"temperature", 0}, {"ignore_eos", true}};
  auto r = c.post("/v1/completions", body.dump());
  ASSERT_EQ(r.status, 200) << r.body;
  const json j = parse(r.body);
  ASSERT_EQ(j["choices"].size(), 4u);
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(j["choices"][i]["index"], i);
    EXPECT_EQ(j["choices"][i]["text"], alone[static_cast<size_t>(i / 2)]) << "choice " << i;
  }
  EXPECT_EQ(j["usage"]["prompt_tokens"], prompt_tokens);
  EXPECT_EQ(j["usage"]["completion_tokens"], 12);
  // Streamed: every index finishes once, one [DONE].
  json sb = body;
  sb["stream"] = true;
  int status = 0;
  bool done = false;
  const auto chunks = sse_chunks(c, "/v1/completions", sb, &status, &done);
  ASSERT_EQ(status, 200);
  EXPECT_TRUE(done);
  std::vector<int> finishes(4, 0);
  std::vector<std::string> text(4);
  for (const json& k : chunks) {
    ASSERT_EQ(k["choices"].size(), 1u) << k.dump();
    const int i = k["choices"][0]["index"].get<int>();
    ASSERT_TRUE(i >= 0 && i < 4) << k.dump();
    text[static_cast<size_t>(i)] += k["choices"][0]["text"].get<std::string>();
    if (!k["choices"][0]["finish_reason"].is_null()) ++finishes[static_cast<size_t>(i)];
  }
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(finishes[static_cast<size_t>(i)], 1) << "choice " << i;
    EXPECT_EQ(text[static_cast<size_t>(i)], alone[static_cast<size_t>(i / 2)]) << "choice " << i;
  }
  // A bad prompt of the batch is named.
  expect_error(c.post("/v1/completions", json{{"prompt", {json::array({1}), json::array({99999})}}}.dump()), 400,
               "prompt");
}

// vLLM's root routes: /tokenize (a prompt, or a chat rendered as /v1/chat/completions renders it, with token strings
// on request), /detokenize, /version and the /ping probe.
TEST_F(DefaultServer, VllmRootRoutes) {
  HttpClient c(srv_->url(), kTimeout);
  const std::string prompt = "The quick brown fox";
  auto r = c.post("/tokenize", json{{"prompt", prompt}, {"return_token_strs", true}}.dump());
  ASSERT_EQ(r.status, 200) << r.body;
  json j = parse(r.body);
  const auto sglang = parse(c.post("/v1/tokenize", json{{"prompt", prompt}}.dump()).body);
  EXPECT_EQ(j["tokens"], sglang["tokens"]);
  EXPECT_EQ(j["count"], j["tokens"].size());
  EXPECT_EQ(j["max_model_len"], 512);
  ASSERT_EQ(j["token_strs"].size(), j["tokens"].size());
  EXPECT_TRUE(parse(c.post("/tokenize", json{{"prompt", prompt}}.dump()).body)["token_strs"].is_null());
  auto d = c.post("/detokenize", json{{"tokens", j["tokens"]}}.dump());
  ASSERT_EQ(d.status, 200) << d.body;
  EXPECT_EQ(parse(d.body)["prompt"], prompt);  // vLLM's key
  EXPECT_EQ(parse(d.body)["text"], prompt);    // SGLang's
  // One handler serves both clients' routes: a list of prompts (SGLang's) gives lists, token strings too.
  r = c.post("/tokenize", json{{"prompt", {prompt, "hi"}}, {"return_token_strs", true}}.dump());
  ASSERT_EQ(r.status, 200) << r.body;
  json list = parse(r.body);
  ASSERT_EQ(list["tokens"].size(), 2u);
  EXPECT_EQ(list["tokens"][0], j["tokens"]);
  EXPECT_EQ(list["count"][0], j["count"]);
  ASSERT_EQ(list["token_strs"].size(), 2u);
  EXPECT_EQ(list["token_strs"][0], j["token_strs"]);
  EXPECT_EQ(parse(c.post("/v1/tokenize", json{{"prompt", {prompt, "hi"}}}.dump()).body)["tokens"], list["tokens"]);
  // A chat: the tokens /v1/chat/completions counts as its prompt.
  const json messages = {{{"role", "user"}, {"content", "Hi there"}}};
  r = c.post("/tokenize", json{{"messages", messages}}.dump());
  ASSERT_EQ(r.status, 200) << r.body;
  const auto chat = c.post("/v1/chat/completions", json{{"messages", messages}, {"max_tokens", 1}}.dump());
  ASSERT_EQ(chat.status, 200) << chat.body;
  EXPECT_EQ(parse(r.body)["count"], parse(chat.body)["usage"]["prompt_tokens"]);
  // continue_final_message (vLLM's): the rendered chat ends with the assistant's prefilled text, the reply continues
  // it.
  const json prefill = {
      {"messages", {{{"role", "user"}, {"content", "Hi"}}, {{"role", "assistant"}, {"content", "Sure, {"}}}},
      {"continue_final_message", true},
      {"add_generation_prompt", false}};
  r = c.post("/tokenize", prefill.dump());
  ASSERT_EQ(r.status, 200) << r.body;
  const std::string rendered =
      parse(c.post("/detokenize", json{{"tokens", parse(r.body)["tokens"]}}.dump()).body)["text"].get<std::string>();
  EXPECT_EQ(rendered.substr(rendered.size() - 7), "Sure, {") << rendered;
  json cont = prefill;
  cont["max_tokens"] = 2;
  const auto cr = c.post("/v1/chat/completions", cont.dump());
  ASSERT_EQ(cr.status, 200) << cr.body;
  EXPECT_EQ(parse(cr.body)["usage"]["prompt_tokens"], parse(r.body)["count"]);
  json both = prefill;
  both.erase("add_generation_prompt");
  expect_error(c.post("/v1/chat/completions", both.dump()), 400, "continue_final_message");
  // Version and probes.
  const auto v = c.get("/version");
  ASSERT_EQ(v.status, 200) << v.body;
  EXPECT_NE(parse(v.body)["version"].get<std::string>().find('.'), std::string::npos) << v.body;
  EXPECT_EQ(parse(c.get("/get_server_info").body)["version"], parse(v.body)["version"]);
  EXPECT_EQ(c.get("/ping").status, 200);
  EXPECT_EQ(c.post("/ping", "{}").status, 200);
  // Bad requests are named.
  expect_error(c.post("/tokenize", json::object().dump()), 400, "prompt");
  expect_error(c.post("/tokenize", json{{"prompt", "a"}, {"messages", messages}}.dump()), 400, "prompt");
  expect_error(c.post("/tokenize", json{{"prompt", {"a", 3}}}.dump()), 400, "prompt");
  expect_error(c.post("/tokenize", json{{"prompt", 3}}.dump()), 400, "prompt");
  expect_error(c.post("/tokenize", json{{"prompt", "a"}, {"return_token_strs", "yes"}}.dump()), 400,
               "return_token_strs");
  expect_error(c.post("/tokenize", json{{"messages", {{{"content", "no role"}}}}}.dump()), 400, "messages[0].role");
  expect_error(c.post("/detokenize", json{{"tokens", {1, -2}}}.dump()), 400, "tokens");
  expect_error(c.post("/detokenize", json::object().dump()), 400, "tokens");
}

// SGLang's /generate batch: a list of texts or id lists, sampling_params.n, a list of sampling_params, rid as a string
// or a list. The reply is a list with one object per choice (prompt-major), each as the prompt alone would give it
// under its own id; streamed, each chunk is one choice's cumulative object with "index"; one choice can be aborted by
// its id while the others run on.
TEST_F(DefaultServer, GenerateBatchesAsSglangDoes) {
  HttpClient c(srv_->url(), kTimeout);
  const std::vector<std::string> prompts = {"The quick brown fox", "hello"};
  const json greedy = {{"max_new_tokens", 3}, {"temperature", 0}, {"ignore_eos", true}};
  std::vector<json> alone;
  for (const std::string& p : prompts) {
    auto r = c.post("/generate", json{{"text", p}, {"sampling_params", greedy}}.dump());
    ASSERT_EQ(r.status, 200) << r.body;
    alone.push_back(parse(r.body));
  }
  auto check_item = [&](const json& item, size_t prompt, const std::string& what) {
    EXPECT_EQ(item["output_ids"], alone[prompt]["output_ids"]) << what;
    EXPECT_EQ(item["text"], alone[prompt]["text"]) << what;
    EXPECT_EQ(item["meta_info"]["prompt_tokens"], alone[prompt]["meta_info"]["prompt_tokens"]) << what;
    EXPECT_EQ(item["meta_info"]["completion_tokens"], 3) << what;
  };
  // A list of texts, then the same as id lists.
  auto r = c.post("/generate", json{{"text", prompts}, {"sampling_params", greedy}}.dump());
  ASSERT_EQ(r.status, 200) << r.body;
  json j = parse(r.body);
  ASSERT_TRUE(j.is_array()) << j.dump();
  ASSERT_EQ(j.size(), 2u);
  for (size_t i = 0; i < 2; ++i) check_item(j[i], i, "text list, item " + std::to_string(i));
  EXPECT_NE(j[0]["meta_info"]["id"], j[1]["meta_info"]["id"]);
  std::vector<std::vector<int64_t>> ids;
  for (const std::string& p : prompts) {
    auto t = c.post("/v1/tokenize", json{{"prompt", p}}.dump());
    ASSERT_EQ(t.status, 200) << t.body;
    ids.push_back(parse(t.body)["tokens"].get<std::vector<int64_t>>());
  }
  r = c.post("/generate",
             json{{"input_ids", ids}, {"sampling_params", greedy}, {"rid", {"batch-a", "batch-b"}}}.dump());
  ASSERT_EQ(r.status, 200) << r.body;
  j = parse(r.body);
  ASSERT_EQ(j.size(), 2u);
  for (size_t i = 0; i < 2; ++i) check_item(j[i], i, "id lists, item " + std::to_string(i));
  EXPECT_EQ(j[0]["meta_info"]["id"], "batch-a");
  EXPECT_EQ(j[1]["meta_info"]["id"], "batch-b");
  // n samples: prompt-major (prompt p's sample k at p n + k), a string rid names them "{rid}_{i}".
  json nbody = {{"text", prompts}, {"sampling_params", greedy}, {"rid", "nb"}};
  nbody["sampling_params"]["n"] = 2;
  r = c.post("/generate", nbody.dump());
  ASSERT_EQ(r.status, 200) << r.body;
  j = parse(r.body);
  ASSERT_EQ(j.size(), 4u);
  for (size_t i = 0; i < 4; ++i) {
    check_item(j[i], i / 2, "n = 2, item " + std::to_string(i));
    EXPECT_EQ(j[i]["meta_info"]["id"], "nb_" + std::to_string(i));
  }
  // One sampling_params per prompt: each prompt's own budget.
  r = c.post("/generate",
             json{{"text", prompts},
                  {"sampling_params",
                   {{{"max_new_tokens", 2}, {"ignore_eos", true}}, {{"max_new_tokens", 5}, {"ignore_eos", true}}}}}
                 .dump());
  ASSERT_EQ(r.status, 200) << r.body;
  j = parse(r.body);
  ASSERT_EQ(j.size(), 2u);
  EXPECT_EQ(j[0]["meta_info"]["completion_tokens"], 2);
  EXPECT_EQ(j[1]["meta_info"]["completion_tokens"], 5);
  // Streamed: each chunk one choice's cumulative object with its index; each ends once, one [DONE].
  json sb = {{"text", prompts}, {"sampling_params", greedy}, {"stream", true}};
  int status = 0;
  bool done = false;
  const auto chunks = sse_chunks(c, "/generate", sb, &status, &done);
  ASSERT_EQ(status, 200);
  EXPECT_TRUE(done);
  std::vector<json> last(2);
  std::vector<int> finishes(2, 0);
  for (const json& k : chunks) {
    ASSERT_TRUE(k.contains("index")) << k.dump();
    const size_t i = k["index"].get<size_t>();
    ASSERT_LT(i, 2u) << k.dump();
    last[i] = k;
    if (!k["meta_info"]["finish_reason"].is_null()) ++finishes[i];
  }
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(finishes[i], 1) << "choice " << i;
    check_item(last[i], i, "streamed, choice " + std::to_string(i));
  }
  // The logprob fields as lists: each prompt's own (here the first asks for them, from its prompt's start; the second
  // for none), the same values as alone.
  r = c.post("/generate", json{{"text", prompts},
                               {"sampling_params", greedy},
                               {"return_logprob", {true, false}},
                               {"logprob_start_len", {0, -1}},
                               {"top_logprobs_num", 1}}
                              .dump());
  ASSERT_EQ(r.status, 200) << r.body;
  j = parse(r.body);
  ASSERT_EQ(j.size(), 2u);
  for (size_t i = 0; i < 2; ++i) check_item(j[i], i, "logprob lists, item " + std::to_string(i));
  EXPECT_EQ(j[0]["meta_info"]["output_token_logprobs"].size(), 3u) << j[0].dump();
  EXPECT_EQ(j[0]["meta_info"]["input_token_logprobs"].size(), j[0]["meta_info"]["prompt_tokens"].get<size_t>());
  EXPECT_EQ(j[0]["meta_info"]["output_top_logprobs"].size(), 3u);
  EXPECT_FALSE(j[1]["meta_info"].contains("output_token_logprobs")) << j[1].dump();
  auto lone = c.post("/generate", json{{"text", prompts[0]},
                                       {"sampling_params", greedy},
                                       {"return_logprob", true},
                                       {"logprob_start_len", 0},
                                       {"top_logprobs_num", 1}}
                                      .dump());
  ASSERT_EQ(lone.status, 200) << lone.body;
  const json alone_lp = parse(lone.body)["meta_info"]["output_token_logprobs"];
  const json& batch_lp = j[0]["meta_info"]["output_token_logprobs"];
  ASSERT_EQ(alone_lp.size(), batch_lp.size());
  for (size_t i = 0; i < alone_lp.size(); ++i) {
    EXPECT_EQ(alone_lp[i][1], batch_lp[i][1]) << i;  // the token
    EXPECT_NEAR(alone_lp[i][0].get<double>(), batch_lp[i][0].get<double>(), 1e-4) << i;
  }
  // A rid list with n samples: prompt p's sample j is rid[p]_j.
  nbody["rid"] = {"q", "r"};
  r = c.post("/generate", nbody.dump());
  ASSERT_EQ(r.status, 200) << r.body;
  j = parse(r.body);
  ASSERT_EQ(j.size(), 4u);
  for (size_t i = 0; i < 4; ++i)
    EXPECT_EQ(j[i]["meta_info"]["id"], std::string(i < 2 ? "q_" : "r_") + std::to_string(i % 2)) << j[i].dump();
  // A field of one prompt's own sampling_params that the engine refuses is named in its list entry.
  auto own =
      c.post("/generate",
             json{{"text", prompts},
                  {"sampling_params", {{{"max_new_tokens", 2}}, {{"max_new_tokens", 2}, {"stop_token_ids", {99999}}}}}}
                 .dump());
  expect_error(own, 400, "sampling_params[1].stop_token_ids");
  EXPECT_NE(parse(own.body)["error"]["message"].get<std::string>().rfind("sampling_params[1].stop_token_ids", 0),
            std::string::npos)
      << own.body;
  // A bad prompt of the batch is named; the server keeps serving.
  expect_error(c.post("/generate", json{{"input_ids", {json::array({1}), json::array({99999})}}}.dump()), 400,
               "input_ids");
  expect_error(c.post("/generate", json{{"text", {"a", ""}}}.dump()), 400, "text");
  // One choice aborted by its id; the other runs to its end. Each round races the replies' own end (480 tokens):
  // a round where the abort came too late is retried.
  bool aborted_one = false;
  for (int round = 0; round < 5 && !aborted_one; ++round) {
    const std::string base = "ab" + std::to_string(round);
    std::atomic<bool> both_started{false};
    std::vector<json> ends(2);
    std::thread streamer([&] {
      HttpClient s(srv_->url(), kTimeout);
      std::vector<bool> seen(2, false);
      const json body = {{"text", prompts},
                         {"stream", true},
                         {"rid", base},
                         {"sampling_params", {{"max_new_tokens", 480}, {"ignore_eos", true}}}};
      s.post_sse("/generate", body.dump(), [&](std::string_view data) {
        if (data == "[DONE]") return true;
        const json k = json::parse(data);
        const size_t i = k["index"].get<size_t>();
        seen[i] = true;
        ends[i] = k;
        if (seen[0] && seen[1]) both_started = true;
        return true;
      });
    });
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (!both_started && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    auto a = c.post("/abort_request", json{{"rid", base + "_1"}}.dump());
    streamer.join();
    ASSERT_TRUE(both_started.load());
    const std::string end0 = ends[0]["meta_info"]["finish_reason"]["type"].get<std::string>();
    const std::string end1 = ends[1]["meta_info"]["finish_reason"]["type"].get<std::string>();
    EXPECT_EQ(end0, "length") << ends[0].dump();  // never aborted with its sibling
    if (a.status == 404 && end1 == "length") continue;
    ASSERT_EQ(a.status, 200) << a.body;
    EXPECT_EQ(parse(a.body)["requests"], 1);
    EXPECT_EQ(end1, "abort") << ends[1].dump();
    EXPECT_EQ(ends[0]["meta_info"]["completion_tokens"], 480);
    aborted_one = true;
  }
  EXPECT_TRUE(aborted_one) << "in 5 rounds the abort of one choice never came before the reply's end";
}

// echo as lm-eval's loglikelihood requests send it (echo, logprobs 1, max_tokens 1): the text is the
// prompt followed by the completion, the logprobs cover the prompt (the first token's null) and then
// the generated token, with the values /generate's input_token_logprobs reports for the same ids;
// streamed, the first chunk carries the prompt.
TEST_F(DefaultServer, EchoWithPromptLogprobs) {
  HttpClient c(srv_->url(), kTimeout);
  const std::string prompt = "The quick brown fox";
  json body = {{"prompt", prompt}, {"max_tokens", 1}, {"temperature", 0}, {"logprobs", 1}, {"ignore_eos", true}};
  auto plain = c.post("/v1/completions", body.dump());
  ASSERT_EQ(plain.status, 200) << plain.body;
  const json pj = parse(plain.body);
  body["echo"] = true;
  auto r = c.post("/v1/completions", body.dump());
  ASSERT_EQ(r.status, 200) << r.body;
  const json j = parse(r.body);
  const json& ch = j["choices"][0];
  EXPECT_EQ(ch["text"], prompt + pj["choices"][0]["text"].get<std::string>());
  const int64_t n_prompt = j["usage"]["prompt_tokens"].get<int64_t>();
  EXPECT_EQ(j["usage"]["completion_tokens"], 1);
  const json& lp = ch["logprobs"];
  ASSERT_EQ(lp["tokens"].size(), static_cast<size_t>(n_prompt + 1)) << lp.dump();
  ASSERT_EQ(lp["token_logprobs"].size(), static_cast<size_t>(n_prompt + 1));
  ASSERT_EQ(lp["top_logprobs"].size(), static_cast<size_t>(n_prompt + 1));
  ASSERT_EQ(lp["text_offset"].size(), static_cast<size_t>(n_prompt + 1));
  EXPECT_TRUE(lp["token_logprobs"][0].is_null());
  EXPECT_TRUE(lp["top_logprobs"][0].is_null());
  for (int64_t i = 1; i <= n_prompt; ++i) {
    ASSERT_TRUE(lp["token_logprobs"][i].is_number()) << i;
    EXPECT_LE(lp["token_logprobs"][i].get<double>(), 0.0);
    // The most likely token, and the prompt's own when it is another (as the OpenAI API and vLLM: up to logprobs + 1).
    const json& top = lp["top_logprobs"][i];
    EXPECT_TRUE(top.size() == 1u || top.size() == 2u) << top.dump();
    EXPECT_EQ(top.at(lp["tokens"][i].get<std::string>()), lp["token_logprobs"][i]) << top.dump();
    EXPECT_GE(lp["text_offset"][i].get<int64_t>(), lp["text_offset"][i - 1].get<int64_t>());
  }
  EXPECT_NEAR(lp["token_logprobs"][n_prompt].get<double>(),
              pj["choices"][0]["logprobs"]["token_logprobs"][0].get<double>(), 1e-5);

  // Token ids: the echo is the ids decoded; the prompt logprobs equal /generate's input_token_logprobs.
  const std::vector<int> ids = {84, 104, 101, 32, 113, 117, 105, 99, 107};  // "The quick" as bytes
  auto ri = c.post(
      "/v1/completions",
      json{
          {"prompt", ids}, {"max_tokens", 2}, {"temperature", 0}, {"logprobs", 0}, {"echo", true}, {"ignore_eos", true}}
          .dump());
  ASSERT_EQ(ri.status, 200) << ri.body;
  const json ij = parse(ri.body);
  EXPECT_EQ(ij["choices"][0]["text"].get<std::string>().rfind("The quick", 0), 0u) << ri.body;
  const json& ilp = ij["choices"][0]["logprobs"]["token_logprobs"];
  ASSERT_EQ(ilp.size(), ids.size() + 2);
  // max_tokens 0 with echo (vLLM's echo without generation): the prompt and its logprobs alone, the same logprobs,
  // streamed or not; without echo a 400 naming max_tokens.
  const json only = {{"prompt", ids}, {"max_tokens", 0}, {"logprobs", 0}, {"echo", true}};
  const double gen_before = metric(srv_->url(), "fp4moe:generation_tokens_total"),
               ttft_before = metric(srv_->url(), "fp4moe:time_to_first_token_seconds_count"),
               requests_before = metric(srv_->url(), "fp4moe:num_requests_total");
  auto ro = c.post("/v1/completions", only.dump());
  ASSERT_EQ(ro.status, 200) << ro.body;
  // Its one internal token is not output: the counters agree with completion_tokens 0; the request counts.
  EXPECT_EQ(metric(srv_->url(), "fp4moe:generation_tokens_total"), gen_before);
  EXPECT_EQ(metric(srv_->url(), "fp4moe:time_to_first_token_seconds_count"), ttft_before);
  EXPECT_EQ(metric(srv_->url(), "fp4moe:num_requests_total"), requests_before + 1);
  const json oj = parse(ro.body);
  EXPECT_EQ(oj["choices"][0]["text"], "The quick") << ro.body;
  EXPECT_EQ(oj["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(oj["usage"]["completion_tokens"], 0);
  EXPECT_EQ(oj["usage"]["prompt_tokens"], ids.size());
  const json& olp = oj["choices"][0]["logprobs"]["token_logprobs"];
  ASSERT_EQ(olp.size(), ids.size());
  for (size_t i = 1; i < ids.size(); ++i) EXPECT_NEAR(olp[i].get<double>(), ilp[i].get<double>(), 1e-6) << i;
  json only_streamed = only;
  only_streamed["stream"] = true;
  std::string streamed_text;
  auto rs = c.post_sse("/v1/completions", only_streamed.dump(), [&](std::string_view data) {
    if (data != "[DONE]") streamed_text += parse(std::string(data))["choices"][0]["text"].get<std::string>();
    return true;
  });
  ASSERT_EQ(rs.status, 200) << rs.body;
  EXPECT_EQ(streamed_text, "The quick");
  expect_error(c.post("/v1/completions", json{{"prompt", ids}, {"max_tokens", 0}}.dump()), 400, "max_tokens");
  auto g = c.post("/generate", json{{"input_ids", ids},
                                    {"sampling_params", {{"max_new_tokens", 2}, {"temperature", 0}}},
                                    {"return_logprob", true},
                                    {"logprob_start_len", 0},
                                    {"top_logprobs_num", 2}}
                                   .dump());
  ASSERT_EQ(g.status, 200) << g.body;
  const json meta = parse(g.body)["meta_info"];
  ASSERT_EQ(meta["input_token_logprobs"].size(), ids.size()) << meta.dump();
  ASSERT_EQ(meta["input_top_logprobs"].size(), ids.size());
  EXPECT_TRUE(meta["input_token_logprobs"][0][0].is_null());
  for (size_t i = 0; i < ids.size(); ++i) {
    EXPECT_EQ(meta["input_token_logprobs"][i][1], ids[i]);
    if (i == 0) continue;
    EXPECT_NEAR(meta["input_token_logprobs"][i][0].get<double>(), ilp[i].get<double>(), 1e-5) << i;
    EXPECT_EQ(meta["input_top_logprobs"][i].size(), 2u);
    EXPECT_TRUE(meta["input_token_logprobs"][i][2].is_null());  // the text only when asked for
  }
  // SGLang's return_text_in_logprobs: each tuple's third element is its token's text.
  auto gt = c.post("/generate", json{{"input_ids", ids},
                                     {"sampling_params", {{"max_new_tokens", 2}, {"temperature", 0}}},
                                     {"return_logprob", true},
                                     {"logprob_start_len", 0},
                                     {"top_logprobs_num", 1},
                                     {"return_text_in_logprobs", true}}
                                    .dump());
  ASSERT_EQ(gt.status, 200) << gt.body;
  const json gtj = parse(gt.body);
  const json& tmeta = gtj["meta_info"];
  for (size_t i = 0; i < ids.size(); ++i)
    EXPECT_EQ(tmeta["input_token_logprobs"][i][2], std::string(1, static_cast<char>(ids[i]))) << i;
  std::string output_text;
  for (const json& t : tmeta["output_token_logprobs"]) output_text += t[2].get<std::string>();
  EXPECT_EQ(output_text, gtj["text"].get<std::string>()) << gt.body;
  EXPECT_TRUE(tmeta["output_top_logprobs"][0][0][2].is_string()) << gt.body;
  auto g2 = c.post("/generate", json{{"input_ids", ids},
                                     {"sampling_params", {{"max_new_tokens", 1}}},
                                     {"return_logprob", true},
                                     {"logprob_start_len", 5}}
                                    .dump());
  ASSERT_EQ(g2.status, 200) << g2.body;
  EXPECT_EQ(parse(g2.body)["meta_info"]["input_token_logprobs"].size(), ids.size() - 5);
  // max_new_tokens 0 (SGLang's prefill-only request): "" and the prompt's logprobs, finish_reason length 0, in a batch
  // beside a prompt that generates.
  auto g0 = c.post("/generate", json{{"input_ids", {ids, ids}},
                                     {"sampling_params", {{{"max_new_tokens", 0}}, {{"max_new_tokens", 2}}}},
                                     {"return_logprob", true},
                                     {"logprob_start_len", 0}}
                                    .dump());
  ASSERT_EQ(g0.status, 200) << g0.body;
  const json g0j = parse(g0.body);
  ASSERT_EQ(g0j.size(), 2u) << g0.body;
  EXPECT_EQ(g0j[0]["text"], "") << g0.body;
  EXPECT_TRUE(g0j[0]["output_ids"].empty());
  EXPECT_EQ(g0j[0]["meta_info"]["completion_tokens"], 0);
  EXPECT_EQ(g0j[0]["meta_info"]["finish_reason"], (json{{"type", "length"}, {"length", 0}}));
  EXPECT_TRUE(g0j[0]["meta_info"]["output_token_logprobs"].empty());
  ASSERT_EQ(g0j[0]["meta_info"]["input_token_logprobs"].size(), ids.size());
  for (size_t i = 1; i < ids.size(); ++i)
    EXPECT_NEAR(g0j[0]["meta_info"]["input_token_logprobs"][i][0].get<double>(), ilp[i].get<double>(), 1e-5) << i;
  EXPECT_EQ(g0j[1]["meta_info"]["completion_tokens"], 2);

  // A batch of prompts with n = 2: choice p n + j echoes prompt p.
  auto rb =
      c.post("/v1/completions",
             json{{"prompt", {"ab", "xyz"}}, {"n", 2}, {"max_tokens", 1}, {"echo", true}, {"ignore_eos", true}}.dump());
  ASSERT_EQ(rb.status, 200) << rb.body;
  const json bj = parse(rb.body);
  ASSERT_EQ(bj["choices"].size(), 4u);
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(bj["choices"][i]["text"].get<std::string>().rfind(i < 2 ? "ab" : "xyz", 0), 0u) << bj.dump();
  }

  // Streamed: the first chunk starts with the prompt, the text and the tokens are the whole reply's.
  body["stream"] = true;
  int status = 0;
  bool done = false;
  const auto chunks = sse_chunks(c, "/v1/completions", body, &status, &done);
  ASSERT_EQ(status, 200);
  ASSERT_FALSE(chunks.empty());
  EXPECT_EQ(chunks[0]["choices"][0]["text"].get<std::string>().rfind(prompt, 0), 0u) << chunks[0].dump();
  std::string text;
  size_t n_tokens = 0;
  for (const json& k : chunks) {
    text += k["choices"][0]["text"].get<std::string>();
    n_tokens += k["choices"][0]["logprobs"]["tokens"].size();
  }
  EXPECT_EQ(text, ch["text"].get<std::string>());
  EXPECT_EQ(n_tokens, static_cast<size_t>(n_prompt + 1));
}

// POST /abort_request (SGLang): a streamed /generate aborted by the rid its chunks carry ends with
// finish_reason "abort"; abort_all ends every open reply (two non-streamed completions); an unknown rid
// is a 404 naming it, a body without rid or abort_all a 400. The server keeps serving.
TEST_F(DefaultServer, AbortRequestByRidAndAll) {
  HttpClient c(srv_->url(), kTimeout);
  // Each abort races its reply's own end (480 tokens, ~0.6 s here): a round where the reply ended first
  // (the abort a 404, the stream ended by "length") is retried; one round must abort it. Odd rounds send
  // the client's own rid (SGLang's `rid`): the chunks carry it, and while the reply is open the same rid
  // is refused.
  bool rid_aborted = false, client_rid_aborted = false;
  for (int round = 0; round < 10 && !(rid_aborted && client_rid_aborted); ++round) {
    const bool client_rid = round % 2 == 1;
    const std::string sent_rid = "client-rid-" + std::to_string(round);
    std::atomic<bool> have_rid{false};
    std::string rid;
    json last;
    std::thread streamer([&] {
      HttpClient s(srv_->url(), kTimeout);
      json body = {{"text", "count with me"},
                   {"stream", true},
                   {"sampling_params", {{"max_new_tokens", 480}, {"ignore_eos", true}}}};
      if (client_rid) body["rid"] = sent_rid;
      s.post_sse("/generate", body.dump(), [&](std::string_view data) {
        if (data == "[DONE]") return true;
        last = json::parse(data);
        if (!have_rid) {
          rid = last["meta_info"]["id"].get<std::string>();
          have_rid = true;
        }
        return true;
      });
    });
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (!have_rid && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    if (!have_rid) streamer.join();
    ASSERT_TRUE(have_rid.load());
    if (client_rid) {
      EXPECT_EQ(rid, sent_rid);
    } else {
      EXPECT_EQ(rid.find("client-rid"), std::string::npos) << rid;
    }
    const int dup_status =
        client_rid ? c.post("/generate",
                            json{{"text", "x"}, {"rid", sent_rid}, {"sampling_params", {{"max_new_tokens", 1}}}}.dump())
                         .status
                   : 400;
    auto r = c.post("/abort_request", json{{"rid", rid}}.dump());
    streamer.join();
    const std::string finish = last["meta_info"]["finish_reason"]["type"].get<std::string>();
    if (r.status == 404 && finish == "length") {
      EXPECT_EQ(last["meta_info"]["completion_tokens"], 480) << last.dump();
      continue;
    }
    ASSERT_EQ(r.status, 200) << r.body;
    EXPECT_EQ(parse(r.body)["requests"], 1);
    EXPECT_EQ(finish, "abort") << last.dump();
    EXPECT_LT(last["meta_info"]["completion_tokens"].get<int64_t>(), 480);
    EXPECT_EQ(dup_status, 400) << "a second request took the open rid " << sent_rid;
    (client_rid ? client_rid_aborted : rid_aborted) = true;
  }
  EXPECT_TRUE(rid_aborted) << "in 5 rounds the abort by the server's rid never came before the reply's end";
  EXPECT_TRUE(client_rid_aborted) << "in 5 rounds the abort by the client's rid never came before the reply's end";
  // The rid is free again once its reply has ended: freed before the reply's last byte, so a client reusing
  // it at once is never refused (30 back to back, streamed and not).
  for (int i = 0; i < 30; ++i) {
    json body = {{"text", "x"}, {"rid", "client-rid-1"}, {"sampling_params", {{"max_new_tokens", 1}}}};
    if (i % 2 == 1) {
      body["stream"] = true;
      auto st = c.post_sse("/generate", body.dump(), [](std::string_view) { return true; });
      ASSERT_EQ(st.status, 200) << "reuse " << i << ": " << st.body;
      continue;
    }
    auto again = c.post("/generate", body.dump());
    ASSERT_EQ(again.status, 200) << "reuse " << i << ": " << again.body;
    EXPECT_EQ(parse(again.body)["meta_info"]["id"], "client-rid-1");
  }

  // abort_all races the two replies' own end: on a loaded machine one may reach max_tokens between the
  // poll that saw both running and the abort. Such a round must still agree with itself (the replies
  // counted are the ones that end "abort", the rest end "length"); it is retried until one round finds
  // both open, which only a working abort_all can pass.
  int64_t both_aborted_round = -1;
  for (int round = 0; round < 5 && both_aborted_round < 0; ++round) {
    std::vector<std::string> reasons(2);
    std::vector<std::thread> clients;
    for (int i = 0; i < 2; ++i) {
      clients.emplace_back([&, i] {
        HttpClient k(srv_->url(), kTimeout);
        auto res =
            k.post("/v1/completions",
                   json{{"prompt", "go " + std::to_string(i)}, {"max_tokens", 480}, {"ignore_eos", true}}.dump());
        if (res.status == 200) reasons[static_cast<size_t>(i)] = parse(res.body)["choices"][0]["finish_reason"];
      });
    }
    int64_t running = 0;
    const auto deadline2 = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (running < 2 && std::chrono::steady_clock::now() < deadline2) {
      running = parse(c.get("/get_server_info").body)["internal_states"][0]["num_running_reqs"].get<int64_t>();
    }
    auto all = c.post("/abort_request", json{{"abort_all", true}}.dump());
    for (auto& t : clients) t.join();
    ASSERT_EQ(all.status, 200) << all.body;
    const int64_t n_counted = parse(all.body)["requests"].get<int64_t>();
    const auto n_abort = std::count(reasons.begin(), reasons.end(), "abort");
    EXPECT_EQ(n_counted, n_abort) << all.body << " round " << round;
    EXPECT_EQ(std::count(reasons.begin(), reasons.end(), "length"), 2 - n_abort) << "round " << round;
    if (n_counted == 2) both_aborted_round = round;
  }
  EXPECT_GE(both_aborted_round, 0) << "in 5 rounds abort_all never ended two open replies";

  expect_error(c.post("/abort_request", json{{"rid", "cmpl-999999"}}.dump()), 404, "rid");
  expect_error(c.post("/abort_request", json::object().dump()), 400, "rid");
  EXPECT_EQ(c.post("/v1/completions", json{{"prompt", "still here"}, {"max_tokens", 2}}.dump()).status, 200);
}

// logit_bias reaches the sampler: +100 on one token makes every greedy and sampled step pick it, -100
// on the unbiased greedy token keeps it out; unsupported OpenAI fields are refused by name.
TEST_F(DefaultServer, LogitBiasAndRefusedFields) {
  HttpClient c(srv_->url(), kTimeout);
  for (double temperature : {0.0, 1.0}) {
    auto r = c.post("/generate", json{{"text", "hello"},
                                      {"sampling_params",
                                       {{"max_new_tokens", 4},
                                        {"temperature", temperature},
                                        {"ignore_eos", true},
                                        {"logit_bias", {{"65", 100}}}}}}
                                     .dump());
    ASSERT_EQ(r.status, 200) << r.body;
    EXPECT_EQ(parse(r.body)["output_ids"], json({65, 65, 65, 65})) << "temperature " << temperature;
  }
  auto ids = c.post("/generate",
                    json{{"text", "hello"}, {"sampling_params", {{"max_new_tokens", 1}, {"temperature", 0}}}}.dump());
  ASSERT_EQ(ids.status, 200) << ids.body;
  const int64_t argmax = parse(ids.body)["output_ids"][0].get<int64_t>();
  auto bid = c.post(
      "/generate", json{{"text", "hello"},
                        {"sampling_params",
                         {{"max_new_tokens", 1}, {"temperature", 0}, {"logit_bias", {{std::to_string(argmax), -100}}}}}}
                       .dump());
  ASSERT_EQ(bid.status, 200) << bid.body;
  EXPECT_NE(parse(bid.body)["output_ids"][0].get<int64_t>(), argmax);
  // The OpenAI route takes it too (the same -100 ban; any other token).
  auto oc = c.post(
      "/v1/completions",
      json{{"prompt", "hello"}, {"max_tokens", 2}, {"temperature", 0}, {"logit_bias", {{std::to_string(argmax), -100}}}}
          .dump());
  EXPECT_EQ(oc.status, 200) << oc.body;
  // Outside the vocabulary (272 tokens): 400 from the engine's validation, naming the token.
  expect_error(c.post("/v1/completions", json{{"prompt", "a"}, {"logit_bias", {{"99999", 5}}}}.dump()), 400,
               "logit_bias");
  expect_error(c.post("/v1/completions", json{{"prompt", "a"}, {"response_format", {{"type", "grammar"}}}}.dump()), 400,
               "response_format");
  expect_error(
      c.post("/v1/chat/completions", json{{"messages", {{{"role", "user"}, {"content", "a"}}}}, {"best_of", 4}}.dump()),
      400, "best_of");
  // Tools without --tool-call-parser: refused, naming the flag.
  auto tl = c.post("/v1/chat/completions", json{{"messages", {{{"role", "user"}, {"content", "a"}}}},
                                                {"tools", {{{"type", "function"}, {"function", {{"name", "f"}}}}}}}
                                               .dump());
  expect_error(tl, 400, "tools");
  EXPECT_NE(tl.body.find("--tool-call-parser glm45"), std::string::npos) << tl.body;
  EXPECT_EQ(c.get("/health").status, 200);
}

// A long non-streaming reply is one JSON object (no liveness spaces in front: the server watches its socket instead),
// equal field by field to the last cumulative object of the same greedy stream.
TEST_F(DefaultServer, LongNonStreamingReplyEqualsStreamedResult) {
  HttpClient c(srv_->url(), kTimeout);
  json body = {{"text", "The quick brown fox"},
               {"sampling_params", {{"max_new_tokens", 300}, {"ignore_eos", true}, {"temperature", 0}}},
               {"return_logprob", true}};
  // Bit-equal logprobs need the same computation: both requests prefill the whole prompt (a prefix
  // cache hit, from an earlier test or the first request, splits the prefill at a page boundary and
  // changes f32 rounding: 5e-3 by token 298).
  ASSERT_EQ(c.post("/flush_cache", "").status, 200);
  const auto t0 = std::chrono::steady_clock::now();
  auto r = c.post("/generate", body.dump());
  const double took_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.header("Content-Type").rfind("application/json", 0), 0u) << r.header("Content-Type");
  EXPECT_EQ(r.body.front(), '{') << "bytes before the JSON object after a " << took_s << " s wait";
  EXPECT_EQ(r.body.back(), '}') << "bytes after the JSON object";
  const json j = parse(r.body);
  ASSERT_TRUE(j.contains("text") && j.contains("output_ids") && j.contains("meta_info")) << r.body.substr(0, 300);
  EXPECT_EQ(j["output_ids"].size(), 300u);
  EXPECT_EQ(j["meta_info"]["completion_tokens"], 300);
  EXPECT_EQ(j["meta_info"]["finish_reason"]["type"], "length");
  EXPECT_EQ(j["meta_info"]["output_token_logprobs"].size(), 300u);
  EXPECT_EQ(j["meta_info"]["cached_tokens"], 0);

  ASSERT_EQ(c.post("/flush_cache", "").status, 200);
  body["stream"] = true;
  int status = 0;
  auto chunks = sse_chunks(c, "/generate", body, &status);
  ASSERT_EQ(status, 200);
  ASSERT_FALSE(chunks.empty());
  const json& last = chunks.back();
  EXPECT_EQ(last["meta_info"]["cached_tokens"], 0);
  EXPECT_EQ(last["text"], j["text"]);
  EXPECT_EQ(last["output_ids"], j["output_ids"]);
  std::vector<std::string> keys, stream_keys;
  for (const auto& [k, v] : j["meta_info"].items()) keys.push_back(k);
  for (const auto& [k, v] : last["meta_info"].items()) stream_keys.push_back(k);
  EXPECT_EQ(keys, stream_keys);
  for (const char* k : {"prompt_tokens", "completion_tokens", "finish_reason", "output_token_logprobs"}) {
    EXPECT_EQ(last["meta_info"][k], j["meta_info"][k]) << k;
  }
}

TEST(ServerE2E, QueueFullGets503WithRetryAfter) {
  ServerProcess srv(FP4MOE_CLI, {"--max-running-requests", "1", "--max-queued-requests", "1"});
  ASSERT_TRUE(srv.wait_ready(60));
  {
    // More choices than the queue holds can never be admitted: a 400 naming n, not a 503 to retry forever.
    HttpClient c(srv.url(), kTimeout);
    auto r = c.post("/v1/completions", json{{"prompt", "a"}, {"n", 2}, {"max_tokens", 1}}.dump());
    expect_error(r, 400, "n");
    EXPECT_NE(r.body.find("could never be admitted"), std::string::npos) << r.body;
  }
  std::atomic<int> n_ok{0}, n_503{0}, n_other{0}, n_retry_after{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < 8; ++i) {
    threads.emplace_back([&, i] {
      HttpClient c(srv.url(), kTimeout);
      auto r = c.post("/generate", json{{"input_ids", {1 + i, 2, 3}},
                                        {"sampling_params", {{"max_new_tokens", 48}, {"ignore_eos", true}}}}
                                       .dump());
      if (r.status == 200) {
        ++n_ok;
      } else if (r.status == 503) {
        ++n_503;
        const json j = json::parse(r.body, nullptr, false);
        if (!r.header("Retry-After").empty() && j.contains("error") && j["error"]["code"] == 503) ++n_retry_after;
      } else {
        ++n_other;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_GE(n_ok.load(), 1);
  EXPECT_GE(n_503.load(), 1);
  EXPECT_EQ(n_retry_after.load(), n_503.load());
  EXPECT_EQ(n_other.load(), 0);
  HttpClient c(srv.url(), kTimeout);
  EXPECT_EQ(c.post("/generate", json{{"text", "x"}, {"sampling_params", {{"max_new_tokens", 2}}}}.dump()).status, 200);
  EXPECT_EQ(srv.stop(SIGTERM, 30), 0);
}

// --disable-device-sampling: reported by /get_server_info; seeded sampled requests still repeat.
// The prefix cache over HTTP: the same long prompt twice, the second's usage counts its cached whole
// pages (prompt_tokens_details.cached_tokens, meta_info.cached_tokens on /generate) and the text is
// the same; /metrics counts queries and hits; /flush_cache empties it; --disable-radix-cache turns it
// off (/flush_cache then a 400 naming the flag, /get_server_info says so).
TEST(ServerE2E, PrefixCacheHitsMetricsFlushAndDisable) {
  const std::string prompt(60, 'x');  // the embedded default's byte-level tokens: 60 + specials
  {
    ServerProcess srv(FP4MOE_CLI, {});
    ASSERT_TRUE(srv.wait_ready(60));
    HttpClient c(srv.url(), kTimeout);
    const json body = {{"prompt", prompt}, {"max_tokens", 8}, {"temperature", 0}};
    auto a = c.post("/v1/completions", body.dump());
    auto b = c.post("/v1/completions", body.dump());
    ASSERT_EQ(a.status, 200) << a.body;
    ASSERT_EQ(b.status, 200) << b.body;
    const json ja = parse(a.body), jb = parse(b.body);
    EXPECT_EQ(ja["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    const int64_t n_prompt = jb["usage"]["prompt_tokens"].get<int64_t>();
    EXPECT_EQ(jb["usage"]["prompt_tokens_details"]["cached_tokens"], (n_prompt - 1) / 16 * 16) << b.body;
    EXPECT_EQ(ja["choices"][0]["text"], jb["choices"][0]["text"]);
    auto g = c.post("/generate", json{{"text", prompt}, {"sampling_params", {{"max_new_tokens", 2}}}}.dump());
    ASSERT_EQ(g.status, 200) << g.body;
    EXPECT_GE(parse(g.body)["meta_info"]["cached_tokens"].get<int64_t>(), 16) << g.body;
    EXPECT_GT(metric(srv.url(), "fp4moe:prefix_cache_hits_total"), 0);
    EXPECT_GT(metric(srv.url(), "fp4moe:prefix_cache_queries_total"),
              metric(srv.url(), "fp4moe:prefix_cache_hits_total"));
    EXPECT_GT(metric(srv.url(), "fp4moe:cache_hit_rate"), 0);
    EXPECT_GT(metric(srv.url(), "fp4moe:prefix_cache_tokens"), 0);
    EXPECT_EQ(parse(c.get("/get_server_info").body)["disable_radix_cache"], false);
    // curl -X POST without -d sends no Content-Length: an empty body, answered at once (httplib alone
    // would wait 30 s for a body); a bodiless POST to a route that needs one is a 400 naming it.
    auto raw_reply = [&](const std::string& path) {
      const int fd = raw_post(srv.port(), path, "", /*with_length=*/false);
      if (fd < 0) return std::string();
      timeval tv{10, 0};
      setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
      std::string reply;
      char buf[4096];
      for (ssize_t n; (n = ::recv(fd, buf, sizeof buf, 0)) > 0;) reply.append(buf, static_cast<size_t>(n));
      ::close(fd);
      return reply;
    };
    const auto t_raw = std::chrono::steady_clock::now();
    const std::string flushed = raw_reply("/flush_cache");
    EXPECT_EQ(flushed.rfind("HTTP/1.1 200", 0), 0u) << flushed;
    EXPECT_NE(flushed.find("Cache flushed."), std::string::npos) << flushed;
    const std::string pinged = raw_reply("/ping");  // vLLM's probe reads no body
    EXPECT_EQ(pinged.rfind("HTTP/1.1 200", 0), 0u) << pinged;
    const std::string refused = raw_reply("/generate");
    EXPECT_EQ(refused.rfind("HTTP/1.1 400", 0), 0u) << refused;
    EXPECT_NE(refused.find("POST /generate came without a body"), std::string::npos) << refused;
    // Without a body, an unknown route is still a 404 and a GET route a 405 naming GET (both were "came without a
    // body" 400s).
    const std::string unknown = raw_reply("/no/such/route");
    EXPECT_EQ(unknown.rfind("HTTP/1.1 404", 0), 0u) << unknown;
    EXPECT_NE(unknown.find("no route for POST /no/such/route"), std::string::npos) << unknown;
    const std::string get_only = raw_reply("/health");
    EXPECT_EQ(get_only.rfind("HTTP/1.1 405", 0), 0u) << get_only;
    EXPECT_NE(get_only.find("Allow: GET"), std::string::npos) << get_only;
    EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t_raw).count(), 5.0);
    // While a request runs the cache is not flushed: SGLang's 400 with the counts (it flushed under running requests).
    {
      HttpClient streamer(srv.url(), kTimeout);
      fp4moe::server::HttpResponse busy;
      const json long_one = {{"prompt", prompt}, {"max_tokens", 4000}, {"ignore_eos", true}, {"stream", true}};
      streamer.post_sse("/v1/completions", long_one.dump(), [&](std::string_view) {
        busy = HttpClient(srv.url(), kTimeout).post("/flush_cache", "");
        return false;  // then the stream is dropped (the request aborted)
      });
      expect_error(busy, 400, "");
      EXPECT_NE(busy.body.find("Cache not flushed because there are pending requests. #running-req: 1, #queue-req: 0"),
                std::string::npos)
          << busy.body;
      EXPECT_GT(metric(srv.url(), "fp4moe:prefix_cache_tokens"), 0);
      EXPECT_EQ(wait_metric(srv.url(), "fp4moe:num_running_reqs", 0), 0);
    }
    auto f = c.post("/flush_cache", "");
    EXPECT_EQ(f.status, 200) << f.body;
    EXPECT_EQ(wait_metric(srv.url(), "fp4moe:prefix_cache_tokens", 0), 0);
    auto d = c.post("/v1/completions", body.dump());
    ASSERT_EQ(d.status, 200) << d.body;
    EXPECT_EQ(parse(d.body)["usage"]["prompt_tokens_details"]["cached_tokens"], 0) << "flushed";
    EXPECT_EQ(srv.stop(SIGTERM, 30), 0);
  }
  ServerProcess srv(FP4MOE_CLI, {"--disable-radix-cache"});
  ASSERT_TRUE(srv.wait_ready(60));
  HttpClient c(srv.url(), kTimeout);
  const json body = {{"prompt", prompt}, {"max_tokens", 2}, {"temperature", 0}};
  ASSERT_EQ(c.post("/v1/completions", body.dump()).status, 200);
  auto b = c.post("/v1/completions", body.dump());
  ASSERT_EQ(b.status, 200) << b.body;
  EXPECT_EQ(parse(b.body)["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
  EXPECT_EQ(parse(c.get("/get_server_info").body)["disable_radix_cache"], true);
  auto f = c.get("/flush_cache");
  expect_error(f, 400, "");
  EXPECT_NE(f.body.find("prefix cache is off"), std::string::npos) << f.body;
  EXPECT_EQ(srv.stop(SIGTERM, 30), 0);
}

// A /generate of `text` for `tokens` tokens (ignore_eos) under `priority` (nullopt: the field left out); the reply's
// completion tokens, -1 when it is not a 200.
int generate_with_priority(const std::string& url, const std::string& text, std::optional<int> priority, int tokens) {
  json body = {{"text", text}, {"sampling_params", {{"max_new_tokens", tokens}, {"ignore_eos", true}}}};
  if (priority) body["priority"] = *priority;
  const auto r = HttpClient(url, kTimeout).post("/generate", body.dump());
  EXPECT_EQ(r.status, 200) << r.body;
  return r.status == 200 ? parse(r.body)["meta_info"]["completion_tokens"].get<int>() : -1;
}

// SGLang's --enable-priority-scheduling: the priority policy with higher values first (vLLM's --schedule-policy
// priority orders lower first); /get_server_info says which; a request's priority is then taken.
TEST(ServerE2E, SglangPrioritySchedulingFlags) {
  for (const auto& [flags, low_first] : std::vector<std::pair<std::vector<std::string>, bool>>{
           {{"--enable-priority-scheduling"}, false},
           {{"--enable-priority-scheduling", "--schedule-low-priority-values-first"}, true},
           {{"--schedule-policy", "priority"}, false}}) {  // vLLM's order (lower first), but not SGLang's flag
    ServerProcess srv(FP4MOE_CLI, flags);
    ASSERT_TRUE(srv.wait_ready(60));
    HttpClient c(srv.url(), kTimeout);
    const json info = parse(c.get("/get_server_info").body);
    EXPECT_EQ(info["schedule_policy"], "priority");
    EXPECT_EQ(info["enable_priority_scheduling"], true);
    EXPECT_EQ(info["schedule_low_priority_values_first"], low_first) << flags.front();
    // SGLang's priority preemption: on (threshold 10) with its flag, not with vLLM's policy.
    const bool sglang = flags.front() == "--enable-priority-scheduling";
    EXPECT_EQ(info["priority_scheduling_preemption_threshold"], sglang ? json(10) : json()) << flags.front();
    EXPECT_EQ(info["disable_priority_preemption"], !sglang) << flags.front();
    EXPECT_EQ(
        c.post("/generate", json{{"text", "a"}, {"priority", 5}, {"sampling_params", {{"max_new_tokens", 2}}}}.dump())
            .status,
        200);
    EXPECT_EQ(srv.stop(SIGTERM, 30), 0);
  }
  // Served one at a time behind a long request: SGLang's order, higher first, and a request that names no priority
  // after all that do (its scheduler gives it the lowest); with low values first, lower first and it still last.
  for (const bool low_first : {false, true}) {
    std::vector<std::string> flags = {"--enable-priority-scheduling", "--max-running-requests", "1"};
    if (low_first) flags.push_back("--schedule-low-priority-values-first");
    ServerProcess srv(FP4MOE_CLI, flags);
    ASSERT_TRUE(srv.wait_ready(60));
    std::mutex mu;
    std::vector<std::string> done;
    auto send = [&](const std::string& name, std::optional<int> priority, int tokens) {
      generate_with_priority(srv.url(), name, priority, tokens);
      std::lock_guard<std::mutex> lock(mu);
      done.push_back(name);
    };
    std::vector<std::thread> clients;
    clients.emplace_back(send, "long", std::optional<int>(0), 400);
    while (metric(srv.url(), "fp4moe:num_running_reqs") < 1) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    const std::vector<std::pair<std::string, std::optional<int>>> queued = {
        {"m5", -5}, {"none", std::nullopt}, {"p10", 10}, {"p1", 1}};
    for (const auto& [name, priority] : queued) {
      clients.emplace_back(send, name, priority, 4);
      std::this_thread::sleep_for(std::chrono::milliseconds(30));
    }
    for (auto& t : clients) t.join();
    EXPECT_EQ(done, low_first ? (std::vector<std::string>{"long", "m5", "p1", "p10", "none"})
                              : (std::vector<std::string>{"long", "p10", "p1", "m5", "none"}));
    EXPECT_EQ(srv.stop(SIGTERM, 30), 0);
  }
  // SGLang's priority preemption: behind the long request (priority 0, the one slot), a request ranking above it by
  // more than the threshold (10) preempts it and finishes first: priority 11, or one naming none under
  // --default-priority-value 11; with --disable-priority-preemption, or a threshold of 11, it waits. The long
  // request's reply is whole either way (recomputed after its preemption).
  for (const auto& [flags, preempts] : std::vector<std::pair<std::vector<std::string>, bool>>{
           {{}, true},
           {{"--default-priority-value", "11"}, true},
           {{"--disable-priority-preemption"}, false},
           {{"--priority-scheduling-preemption-threshold", "11"}, false}}) {
    std::vector<std::string> all = {"--enable-priority-scheduling", "--max-running-requests", "1"};
    all.insert(all.end(), flags.begin(), flags.end());
    SCOPED_TRACE(flags.empty() ? "defaults" : flags.front());
    ServerProcess srv(FP4MOE_CLI, all);
    ASSERT_TRUE(srv.wait_ready(60));
    const bool by_default = !flags.empty() && flags.front() == "--default-priority-value";
    if (by_default)
      EXPECT_EQ(parse(HttpClient(srv.url(), kTimeout).get("/get_server_info").body)["default_priority_value"], 11);
    std::mutex mu;
    std::vector<std::string> done;
    std::vector<int> lengths;
    auto send = [&](const std::string& name, std::optional<int> priority, int tokens) {
      const int n = generate_with_priority(srv.url(), name, priority, tokens);
      std::lock_guard<std::mutex> lock(mu);
      done.push_back(name);
      lengths.push_back(n);
    };
    std::thread long_client(send, "long", std::optional<int>(0), 400);
    while (metric(srv.url(), "fp4moe:num_running_reqs") < 1) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    send("high", by_default ? std::nullopt : std::optional<int>(11), 4);
    long_client.join();
    EXPECT_EQ(done, preempts ? (std::vector<std::string>{"high", "long"}) : (std::vector<std::string>{"long", "high"}));
    EXPECT_EQ(lengths, preempts ? (std::vector<int>{4, 400}) : (std::vector<int>{400, 4}));
    EXPECT_EQ(metric(srv.url(), "fp4moe:num_preemptions_total"), preempts ? 1 : 0);
    EXPECT_EQ(srv.stop(SIGTERM, 30), 0);
  }
}

// A user's SGLang / vLLM command line: their spellings of fp4moe's flags are aliases, flags whose meaning always holds
// here are taken, --dtype / --kv-cache-dtype / --quantization are checked against what fp4moe serves (a BF16
// checkpoint under --quantization modelopt_fp4 is refused, not served in BF16), --log-level warning drops the batch
// lines; an unknown option is named with the closest option or what fp4moe has instead (exit 2, as a usage error).
// (bench-serving's --host / --port: BenchServingRequestOptions.)
TEST(ServerE2E, OtherServersFlags) {
  const std::string nvfp4 = fp4moe::testing::shared_path("golden/models/glm5_tiny_nvfp4").string();
  const std::string bf16 = fp4moe::testing::shared_path("golden/models/glm5_tiny").string();
  const std::string tok = fp4moe::testing::shared_path("golden/tokenizer").string();
  {
    ServerProcess srv(FP4MOE_CLI, {nvfp4,  // vLLM's positional model
                                   "--tokenizer",
                                   tok,
                                   "--trust-remote-code",
                                   "--quantization",
                                   "modelopt_fp4",
                                   "--tp",
                                   "1",
                                   "--ep",
                                   "1",
                                   "--dtype",
                                   "bfloat16",
                                   "--kv-cache-dtype",
                                   "auto",
                                   "--enable-metrics",
                                   "--enable-cache-report",
                                   "--disable-overlap-schedule",
                                   "--enable-chunked-prefill",
                                   "--enable-prefix-caching",
                                   "--disable-log-requests",
                                   "--log-level",
                                   "WARNING",
                                   "--max-num-seqs",
                                   "4",
                                   "--block-size",
                                   "32",
                                   "--max-model-len",
                                   "2048",
                                   "--enforce-eager",
                                   "--decode-log-interval",
                                   "1"});
    ASSERT_TRUE(srv.wait_ready(60));
    HttpClient c(srv.url(), kTimeout);
    const json info = parse(c.get("/get_server_info").body);
    EXPECT_EQ(info["max_running_requests"], 4);
    EXPECT_EQ(info["page_size"], 32);
    EXPECT_EQ(info["context_length"], 2048);
    EXPECT_EQ(info["cuda_graph_max_bs"], 0) << "--enforce-eager";
    EXPECT_EQ(parse(c.get("/get_model_info").body)["model_path"], nvfp4) << "vLLM's positional model";
    const auto r = c.post("/generate", json{{"text", "hi"}, {"sampling_params", {{"max_new_tokens", 3}}}}.dump());
    EXPECT_EQ(r.status, 200) << r.body;
    EXPECT_EQ(srv.stop(SIGTERM, 30), 0);
    EXPECT_EQ(srv.log().find("Decode batch."), std::string::npos) << "--log-level warning: " << srv.log();
    EXPECT_EQ(srv.log().find("Prefill batch."), std::string::npos) << srv.log();
  }
  {
    // SGLang's --log-requests: a line per request when it ends; level 1 shows the body without its prompt.
    ServerProcess srv(FP4MOE_CLI, {"--log-requests", "--log-requests-level", "1"});
    ASSERT_TRUE(srv.wait_ready(60));
    EXPECT_EQ(
        HttpClient(srv.url(), kTimeout)
            .post("/generate", json{{"text", "hi"}, {"sampling_params", {{"max_new_tokens", 3}}}, {"rid", "r1"}}.dump())
            .status,
        200);
    EXPECT_EQ(srv.stop(SIGTERM, 30), 0);
    EXPECT_NE(srv.log().find("] Finish: rid=r1, route=/generate, choices=1, prompt_tokens=2, completion_tokens=3, "
                             "cached_tokens=0, finish_reason=length, e2e_latency="),
              std::string::npos)
        << srv.log();
    EXPECT_NE(srv.log().find(R"(, request={"rid":"r1","sampling_params":{"max_new_tokens":3},"text":"<2 bytes>"})"),
              std::string::npos)
        << srv.log();
    EXPECT_EQ(srv.log().find("output="), std::string::npos) << "level 1: " << srv.log();
  }
  {
    ServerProcess srv(FP4MOE_CLI, {"--disable-log-stats", "--decode-log-interval", "1"});
    ASSERT_TRUE(srv.wait_ready(60));
    EXPECT_EQ(HttpClient(srv.url(), kTimeout)
                  .post("/generate", json{{"text", "hi"}, {"sampling_params", {{"max_new_tokens", 3}}}}.dump())
                  .status,
              200);
    EXPECT_EQ(srv.stop(SIGTERM, 30), 0);
    EXPECT_EQ(srv.log().find("Decode batch."), std::string::npos) << "--disable-log-stats: " << srv.log();
  }
  for (const auto& [command, code, message] : std::vector<std::tuple<std::string, int, std::string>>{
           {"serve --dtype float16", 2,
            "--dtype: float16 is not served: activations are bf16 (W4A16); give auto, "
            "bfloat16 or bf16"},
           {"serve --kv-cache-dtype fp8_e4m3", 2, "fp8_e4m3 is not served: the KV cache is bf16"},
           {"serve --quantization fp8", 2,
            "fp8 is not served: fp4moe serves ModelOpt NVFP4 checkpoints (modelopt_fp4) and BF16 ones"},
           {"serve --log-level verbose", 2, "--log-level: verbose not in {debug,info,warning,error,critical}"},
           {"serve --enable-prefix-caching --disable-radix-cache", 2, "excludes"},
           {"serve --quantization modelopt_fp4 --model " + bf16 + " --tokenizer-path " + tok, 1,
            "--quantization modelopt_fp4 asks for an NVFP4 model, but " + bf16 +
                " has no quantization section (hf_quant_config.json, config.json quantization_config): BF16 weights"},
           {"serve --quantization modelopt_fp4 --model glm5-small --load-format dummy", 1,
            "--quantization modelopt_fp4 asks for an NVFP4 model, but --dummy-weights is bf16: give --dummy-weights "
            "nvfp4"},
           {"serve --max-num-batched-tokens 8192", 2,
            "fp4moe serve: unknown option --max-num-batched-tokens; vLLM's per-step token budget; here "
            "--chunked-prefill-size"},
           {"serve --cuda-graph-bs 1 2 4", 2, "unknown option --cuda-graph-bs; SGLang's list of captured batch sizes"},
           {"serve --max-running-request=4", 2,
            "fp4moe serve: unknown option --max-running-request (did you mean --max-running-requests?)"},
           {"serve --frobnicate", 2, "fp4moe serve: unknown option --frobnicate (fp4moe serve --help lists"},
           {"bench-serving --host localhost --base-url http://localhost:1", 2, "--url excludes --host"},
           {"bench-serving --max-num-seqs 4", 2, "fp4moe bench-serving: unknown option --max-num-seqs ("},
           {"serve --log-requests-level 1", 2, "--log-requests-level requires --log-requests"},
           {"serve --log-requests --log-requests-level 4", 2, "--log-requests-level: Value 4 not in range 0 to 3"},
           {"serve --tp 2", 1, "--tp-size 2 --ep-size 1: multi-GPU serving"},
           {"serve --expert-parallel-size 2 --tensor-parallel-size 2", 1, "--tp-size 2 --ep-size 2: multi-GPU"},
           {"serve /a --model-path /b", 1, "the model is given twice, /a and --model /b: give one"},
           // An option's value words are its own, whatever they look like.
           {"tokenize --tokenizer " + tok + " --text ---", 0, "-> '---'"},
           {"serve --enable-log-requests", 2, "unknown option --enable-log-requests; here --log-requests"},
           {"generate --tempreature 1", 2,
            "fp4moe generate: unknown option --tempreature (did you mean --temperature?)"},
       }) {
    std::string text;
    EXPECT_EQ(fp4moe::testing::run_command(std::string(FP4MOE_CLI) + " " + command + " 2>&1", &text), code)
        << command << ": " << text;
    EXPECT_NE(text.find(message), std::string::npos) << command << ": " << text;
  }
}

// The engine's flags are checked before the model loads and named as flags (the messages named EngineOptions' fields:
// "max_running_requests 0 must be >= 1"); --drain-timeout must be a time (-1 and nan were taken).
TEST(ServerE2E, BadEngineFlagsAreNamedAsFlags) {
  for (const auto& [flags, message] : std::vector<std::pair<std::string, std::string>>{
           {"--max-running-requests 0", "--max-running-requests 0 must be >= 1"},
           {"--page-size 0", "--page-size 0 must be >= 1"},
           {"--max-total-tokens 8", "--max-total-tokens 8 must be >= 16 (one KV page)"},
           {"--schedule-conservativeness -1", "--schedule-conservativeness -1 must be in [0, 100]"},
           {"--num-continuous-decode-steps 0", "--num-continuous-decode-steps 0 must be >= 1"},
           {"--context-length -1", "--context-length -1 must be >= 0 (0 = the model's)"},
           {"--drain-timeout -1", "--drain-timeout -1 must be a time in [0, 1e+09] seconds"},
           {"--drain-timeout nan", "--drain-timeout nan must be a time in [0, 1e+09] seconds"},
           {"--drain-timeout 1e10", "--drain-timeout 1e+10 must be a time in [0, 1e+09] seconds"},
           {"--cuda-graph-max-bs -3", "--cuda-graph-max-bs -3 must be >= 0"},
           {"--decode-split-min-keys 0", "--decode-split-min-keys 0 must be >= 1"},
           {"--mem-fraction-static 0", "--mem-fraction-static 0 must be in (0, 1]"},
           {"--watchdog-timeout -1", "--watchdog-timeout -1 must be a time in [0, 1e+09] seconds (0: none)"},
           {"--debug-step-delay inf", "--debug-step-delay inf must be a time in [0, 1e9] seconds"},
           {"--mem-fraction-static 1.5", "--mem-fraction-static 1.5 must be in (0, 1]"},
           {"--gpu-memory-utilization nan", "--mem-fraction-static nan must be in (0, 1]"},
           {"--schedule-low-priority-values-first",
            "--schedule-low-priority-values-first orders priority scheduling: it needs "
            "--enable-priority-scheduling"},
           {"--priority-scheduling-preemption-threshold 5",
            "--priority-scheduling-preemption-threshold sets how waiting requests preempt running ones by priority: "
            "it needs --enable-priority-scheduling (or --schedule-policy priority)"},
           {"--disable-priority-preemption", "--disable-priority-preemption sets how waiting requests preempt"},
           {"--enable-priority-scheduling --priority-scheduling-preemption-threshold -1",
            "--priority-scheduling-preemption-threshold -1 must be >= 0"},
           {"--enable-priority-scheduling --disable-priority-preemption --priority-scheduling-preemption-threshold 3",
            "--priority-scheduling-preemption-threshold and --disable-priority-preemption contradict each other"},
           {"--schedule-policy priority --default-priority-value 3",
            "--default-priority-value is the priority of requests that name none under SGLang's "
            "--enable-priority-scheduling: it needs that flag"},
           // A wrong --tokenizer-path is named (a file, a missing folder), before the model loads.
           {"--model " + fp4moe::testing::shared_path("golden/models/glm5_tiny").string() + " --tokenizer-path " +
                fp4moe::testing::shared_path("golden/tokenizer/tokenizer.json").string(),
            "tokenizer.json is a file, not a tokenizer folder (one holding tokenizer.json and, optionally, "
            "tokenizer_config.json): give "},
           {"--model " + fp4moe::testing::shared_path("golden/models/glm5_tiny").string() +
                " --tokenizer-path /nonexistent/tok",
            "tokenizer folder /nonexistent/tok does not exist"},
           {"--model " + fp4moe::testing::shared_path("golden/models/glm5_tiny").string(),
            "glm5_tiny has no tokenizer.json; pass --tokenizer-path DIR (a folder holding one)"}}) {
    std::string text;
    EXPECT_EQ(fp4moe::testing::run_command(std::string(FP4MOE_CLI) + " serve --port 0 " + flags + " 2>&1", &text), 1)
        << flags << ": " << text;
    EXPECT_NE(text.find(message), std::string::npos) << flags << ": " << text;
  }
  // A value outside a fixed set is a usage error (exit 2), named with its flag.
  for (const auto& [flags, message] : std::vector<std::pair<std::string, std::string>>{
           {"--schedule-policy lifo", "--schedule-policy: schedule policy \"lifo\" is not one of: fcfs, priority"},
           {"--device tpu", "--device: device \"tpu\" is not one of: cpu, cuda"},
           {"--load-format pt", "--load-format: load format \"pt\" is not one of: auto, dummy"},
           {"--sampling-defaults hf", "--sampling-defaults: hf not in {model,openai}"}}) {
    std::string text;
    EXPECT_EQ(fp4moe::testing::run_command(std::string(FP4MOE_CLI) + " serve --port 0 " + flags + " 2>&1", &text), 2)
        << flags << ": " << text;
    EXPECT_NE(text.find(message), std::string::npos) << flags << ": " << text;
  }
}

// sglang.bench_serving's request options: --disable-stream (whole replies: TTFT is the latency, no ITL, the counts
// from the reply), --extra-request-body (merged into every body: max_tokens 2 caps each reply), --warmup-requests
// (untimed requests before the run, seen by the server), --disable-ignore-eos; bad values are named.
TEST_F(DefaultServer, BenchServingRequestOptions) {
  const fs::path out = fs::temp_directory_path() / ("fp4moe_bench_opts_" + std::to_string(getpid()) + ".jsonl");
  std::string text, line;
  for (const std::string backend : {"sglang", "openai"}) {
    fs::remove(out);
    const double before = metric(srv_->url(), "fp4moe:num_requests_total");
    // The server as --url, or (sglang.bench_serving's and vllm bench serve's other way) as --host and --port.
    const std::string port = srv_->url().substr(srv_->url().rfind(':') + 1);
    const std::string server = backend == "openai" ? " --host 127.0.0.1 --port " + port : " --url " + srv_->url();
    ASSERT_EQ(
        fp4moe::testing::run_command(std::string(FP4MOE_CLI) + " bench-serving" + server + " --backend " + backend +
                                         " --num-prompts 4 --input-len 12 --output-len 6 --disable-stream"
                                         " --warmup-requests 2 --output-file " +
                                         out.string() + " 2>&1",
                                     &text),
        0)
        << backend << ": " << text;
    EXPECT_EQ(metric(srv_->url(), "fp4moe:num_requests_total") - before, 4 + 2) << backend;
    std::ifstream f(out);
    ASSERT_TRUE(std::getline(f, line));
    const json run = parse(line);
    EXPECT_EQ(run["completed"], 4) << line;
    EXPECT_EQ(run["url"], srv_->url()) << line;
    EXPECT_EQ(run["total_output_tokens"], 4 * 6) << line;
    EXPECT_EQ(run["total_input_tokens"], 4 * 12) << line;
    EXPECT_EQ(run["disable_stream"], true) << line;
    EXPECT_EQ(run["warmup_requests"], 2) << line;
    EXPECT_GT(run["mean_ttft_ms"].get<double>(), 0.0) << line;
    EXPECT_DOUBLE_EQ(run["mean_ttft_ms"].get<double>(), run["mean_e2e_latency_ms"].get<double>()) << line;
    EXPECT_EQ(run["mean_itl_ms"], 0.0) << line;
  }
  // --output-details: sglang.bench_serving's per-request lists, in prompt order.
  fs::remove(out);
  ASSERT_EQ(fp4moe::testing::run_command(std::string(FP4MOE_CLI) + " bench-serving --url " + srv_->url() +
                                             " --num-prompts 3 --input-len 5 --output-len 4 --warmup-requests 0"
                                             " --output-details --output-file " +
                                             out.string() + " 2>&1",
                                         &text),
            0)
      << text;
  {
    std::ifstream f(out);
    ASSERT_TRUE(std::getline(f, line));
    const json run = parse(line);
    EXPECT_EQ(run["input_lens"], json({5, 5, 5})) << line;
    EXPECT_EQ(run["output_lens"], json({4, 4, 4})) << line;
    EXPECT_EQ(run["errors"], json({"", "", ""})) << line;
    ASSERT_EQ(run["ttfts"].size(), 3u) << line;
    ASSERT_EQ(run["itls"].size(), 3u) << line;
    for (size_t i = 0; i < 3; ++i) {
      EXPECT_GT(run["ttfts"][i].get<double>(), 0.0) << line;
      // At most one a token after the first (a chunk whose text so far is empty is not timed, as sglang.bench_serving).
      EXPECT_LE(run["itls"][i].size(), 3u) << line;
      for (const json& itl : run["itls"][i]) EXPECT_GT(itl.get<double>(), 0.0) << line;
    }
  }
  EXPECT_EQ(fp4moe::testing::run_command(
                std::string(FP4MOE_CLI) + " bench-serving --url " + srv_->url() + " --output-details 2>&1", &text),
            2);
  EXPECT_NE(text.find("--output-details requires --output-file"), std::string::npos) << text;
  // --extra-request-body: max_tokens 9 past --output-len 6 on /v1/completions (the replies are checked against the
  // body's own bound), max_new_tokens 3 at the top level on /generate (moved into sampling_params, where SGLang reads
  // it).
  for (const auto& [backend, extra, expected] : std::vector<std::tuple<std::string, std::string, int>>{
           {"openai", R"({"max_tokens": 9})", 9},
           {"sglang", R"({"max_new_tokens": 3})", 3},
           {"sglang", R"({"sampling_params": {"max_new_tokens": 2}})", 2}}) {
    fs::remove(out);
    ASSERT_EQ(fp4moe::testing::run_command(std::string(FP4MOE_CLI) + " bench-serving --url " + srv_->url() +
                                               " --backend " + backend +
                                               " --num-prompts 3 --output-len 6 --warmup-requests 0"
                                               " --extra-request-body '" +
                                               extra + "' --output-file " + out.string() + " 2>&1",
                                           &text),
              0)
        << backend << " " << extra << ": " << text;
    std::ifstream f(out);
    ASSERT_TRUE(std::getline(f, line));
    EXPECT_EQ(parse(line)["total_output_tokens"], 3 * expected) << extra << ": " << line;
    EXPECT_EQ(parse(line)["extra_request_body"], parse(extra)) << line;
  }
  fs::remove(out);
  for (const auto& [flags, message] : std::vector<std::pair<std::string, std::string>>{
           {" --extra-request-body '[1]'", "--extra-request-body must be a JSON object, got: [1]"},
           {" --extra-request-body '{\"stream\": false}'", "--extra-request-body sets \"stream\""},
           {" --warmup-requests -1", "--warmup-requests -1 must be >= 0"},
           // every warm-up request refused by the server (sent together; the run stops only when all fail)
           {" --warmup-requests 3 --extra-request-body '{\"temperature\": -1}'",
            "all 3 warm-up request(s) failed; first: HTTP 400"},
           {" --extra-request-body '{\"n\": 2}'",
            "--extra-request-body sets \"n\": each benchmark request is one choice"},
           {" --extra-request-body '{\"sampling_params\": {\"n\": 2}}'", "--extra-request-body sets \"n\""}}) {
    EXPECT_EQ(fp4moe::testing::run_command(
                  std::string(FP4MOE_CLI) + " bench-serving --url " + srv_->url() + flags + " 2>&1", &text),
              1)
        << flags;
    EXPECT_NE(text.find(message), std::string::npos) << flags << ": " << text;
  }
}

// bench-serving's random dataset with a file against a tokenizer that adds special tokens to a text prompt (the golden
// GLM tokenizer with a post-processor putting [gMASK]<sop> first, as GLM's does): the prompts are built 2 tokens
// shorter, so the server counts exactly the drawn lengths (they came out 2 over); --dataset with --dataset-path is
// refused.
TEST(ServerE2E, BenchServingRandomTextPromptsLeaveRoomForSpecialTokens) {
  const fs::path tmp = fs::temp_directory_path() / ("fp4moe_bos_tok_" + std::to_string(getpid()));
  fs::create_directories(tmp);
  const fs::path golden_tok = fp4moe::testing::shared_path("golden/tokenizer");
  std::stringstream tok_text;
  tok_text << std::ifstream(golden_tok / "tokenizer.json").rdbuf();
  json tj = parse(tok_text.str());
  tj["post_processor"] = {{"type", "TemplateProcessing"},
                          {"single", json::array({json{{"SpecialToken", {{"id", "[gMASK]"}, {"type_id", 0}}}},
                                                  json{{"SpecialToken", {{"id", "<sop>"}, {"type_id", 0}}}},
                                                  json{{"Sequence", {{"id", "A"}, {"type_id", 0}}}}})},
                          {"special_tokens",
                           {{"[gMASK]", {{"id", "[gMASK]"}, {"ids", {2}}, {"tokens", {"[gMASK]"}}}},
                            {"<sop>", {{"id", "<sop>"}, {"ids", {4}}, {"tokens", {"<sop>"}}}}}}};
  std::ofstream(tmp / "tokenizer.json") << tj.dump();
  fs::copy_file(golden_tok / "tokenizer_config.json", tmp / "tokenizer_config.json");
  const fs::path share = tmp / "share.json";
  json convs = json::array();
  std::string tildes;  // "~|" tokens are 105, 103 (below the tiny model's 512) and never merge
  for (int i = 0; i < 3; ++i)
    convs.push_back(
        {{"conversations", {{{"from", "human"}, {"value", tildes += "~|"}}, {{"from", "gpt"}, {"value", "ok"}}}}});
  std::ofstream(share) << convs.dump();
  ServerProcess srv(FP4MOE_CLI, {"--model", fp4moe::testing::shared_path("golden/models/glm5_tiny").string(),
                                 "--tokenizer-path", tmp.string(), "--decode-log-interval", "0"});
  ASSERT_TRUE(srv.wait_ready(120));
  HttpClient c(srv.url(), kTimeout);
  ASSERT_EQ(parse(c.post("/v1/tokenize", json{{"prompt", ""}}.dump()).body)["count"], 2) << "the post-processor";
  const fs::path out = tmp / "out.jsonl";
  std::string text;
  ASSERT_EQ(
      fp4moe::testing::run_command(
          std::string(FP4MOE_CLI) + " bench-serving --url " + srv.url() + " --dataset-name random --dataset-path " +
              share.string() + " --num-prompts 5 --input-len 30 --output-len 2 --output-file " + out.string() + " 2>&1",
          &text),
      0)
      << text;
  std::ifstream f(out);
  std::string line;
  ASSERT_TRUE(std::getline(f, line));
  EXPECT_EQ(parse(line)["total_input_tokens"], 5 * 30) << line;
  EXPECT_EQ(fp4moe::testing::run_command(std::string(FP4MOE_CLI) + " bench-serving --url " + srv.url() + " --dataset " +
                                             share.string() + " --dataset-path " + share.string() + " 2>&1",
                                         &text),
            1)
      << text;
  EXPECT_NE(text.find("(a ShareGPT file) are two loads: give one"), std::string::npos) << text;
  EXPECT_EQ(srv.stop(SIGTERM, 30), 0);
  fs::remove_all(tmp);
}

// --watchdog-timeout (SGLang's): a step that runs longer (here every step sleeps 3 s before its forward,
// --debug-step-delay) is taken for a hung GPU: the server exits with status 3, naming why, while the request waits;
// 0 turns the watchdog off and the slow request is served.
TEST(ServerE2E, WatchdogExitsWhenAStepHangs) {
  const std::string request = json{{"text", "hi"}, {"sampling_params", {{"max_new_tokens", 1}}}}.dump();
  {
    ServerProcess srv(FP4MOE_CLI, {"--watchdog-timeout", "1", "--debug-step-delay", "3", "--decode-log-interval", "0"});
    ASSERT_TRUE(srv.wait_ready(60));
    std::thread client([&] {
      HttpClient c(srv.url(), 20);
      (void)c.post("/generate", request);  // cut off by the exit
    });
    EXPECT_EQ(srv.wait_exit(15), 3) << srv.log();
    client.join();
    EXPECT_NE(srv.log().find("fp4moe serve: watchdog: the engine's current step has run "), std::string::npos)
        << srv.log();
    EXPECT_NE(srv.log().find("past --watchdog-timeout 1 s: the forward is taken to be hung; exiting (status 3)"),
              std::string::npos)
        << srv.log();
  }
  ServerProcess srv(FP4MOE_CLI, {"--watchdog-timeout", "0", "--debug-step-delay", "1.5", "--decode-log-interval", "0"});
  ASSERT_TRUE(srv.wait_ready(60));
  HttpClient c(srv.url(), 20);
  EXPECT_EQ(c.post("/generate", request).status, 200);
  EXPECT_EQ(srv.stop(SIGTERM, 30), 0);
}

// The batch log (server/batch_log.h, SGLang's scheduler lines) on the server's stderr: a prefill line for the request
// and, with --decode-log-interval 2, a decode line every two decode steps; 0 turns both off. A negative interval stops
// the server at start. --stream-interval 4 streams the first token alone, then groups of 4.
TEST(ServerE2E, BatchLogLinesFollowDecodeLogInterval) {
  const std::string request =
      json{{"input_ids", {5, 6, 7}}, {"sampling_params", {{"max_new_tokens", 9}, {"ignore_eos", true}}}}.dump();
  {
    ServerProcess srv(FP4MOE_CLI, {"--decode-log-interval", "2", "--stream-interval", "4"});
    ASSERT_TRUE(srv.wait_ready(60));
    HttpClient c(srv.url(), kTimeout);
    ASSERT_EQ(c.post("/generate", request).status, 200);
    // --stream-interval 4: the first token alone, then tokens 2-5, then 6-9 with the finish.
    json streamed = json::parse(request);
    streamed["stream"] = true;
    int status = 0;
    bool done = false;
    const auto chunks = sse_chunks(c, "/generate", streamed, &status, &done);
    EXPECT_EQ(status, 200);
    EXPECT_TRUE(done);
    std::vector<size_t> counts;
    for (const json& ch : chunks) counts.push_back(ch["output_ids"].size());
    EXPECT_EQ(counts, (std::vector<size_t>{1, 5, 9})) << json(chunks).dump();
    // A request's own sampling_params.stream_interval (SGLang's) goes before the server's: 1, 4, 7, 9.
    streamed["sampling_params"]["stream_interval"] = 3;
    counts.clear();
    for (const json& ch : sse_chunks(c, "/generate", streamed, &status, &done))
      counts.push_back(ch["output_ids"].size());
    EXPECT_EQ(counts, (std::vector<size_t>{1, 4, 7, 9}));
    EXPECT_EQ(srv.stop(SIGTERM, 30), 0);
    const std::string log = srv.log();
    EXPECT_NE(log.find("] Prefill batch. #new-seq: 1, #new-token: 3, #cached-token: 0, token usage: 0.00, "
                       "#running-req: 0, #queue-req: 0"),
              std::string::npos)
        << log;
    // Three requests of 9 tokens: each the first from the prefill, 8 decode steps, a line every 2.
    size_t n = 0;
    for (size_t at = log.find("] Decode batch. #running-req: 1, #token: "); at != std::string::npos;
         at = log.find("] Decode batch.", at + 1))
      ++n;
    EXPECT_EQ(n, 12u) << log;
    EXPECT_NE(log.find("cuda graph: False, gen throughput (token/s): "), std::string::npos) << log;
  }
  {
    // (--mem-fraction-static sizes a GPU's KV cache: the cpu says it does not read it, and reports none.)
    ServerProcess srv(FP4MOE_CLI, {"--decode-log-interval", "0", "--mem-fraction-static", "0.5"});
    ASSERT_TRUE(srv.wait_ready(60));
    HttpClient c(srv.url(), kTimeout);
    ASSERT_EQ(c.post("/generate", request).status, 200);
    const json info = parse(c.get("/get_server_info").body);
    EXPECT_TRUE(info["mem_fraction_static"].is_null()) << info.dump();
    EXPECT_EQ(info["max_total_num_tokens"], 32768);
    EXPECT_EQ(srv.stop(SIGTERM, 30), 0);
    EXPECT_EQ(srv.log().find(" batch. #"), std::string::npos) << srv.log();
    EXPECT_NE(srv.log().find("--mem-fraction-static is read with --device cuda only; the cpu's KV capacity is "
                             "--max-total-tokens (32768 tokens)"),
              std::string::npos)
        << srv.log();
  }
  std::string text;
  EXPECT_EQ(
      fp4moe::testing::run_command(std::string(FP4MOE_CLI) + " serve --port 0 --decode-log-interval -1 2>&1", &text),
      1);
  EXPECT_NE(text.find("--decode-log-interval -1 must be >= 0 (0: no batch log)"), std::string::npos) << text;
}

// --chat-template (SGLang's and vLLM's): a file (or the template itself) in place of the model's; one that cannot be
// read or parsed stops the server before it listens, naming the flag.
TEST(ServerE2E, ChatTemplateFlagReplacesTheModels) {
  const fs::path file = fs::temp_directory_path() / ("fp4moe_template_" + std::to_string(getpid()) + ".jinja");
  std::ofstream(file) << "{% for m in messages %}<<{{ m.role }}|{{ m.content }}>>{% endfor %}"
                         "{% if add_generation_prompt %}<<assistant|{% endif %}";
  ServerProcess srv(FP4MOE_CLI, {"--chat-template", file.string()});
  ASSERT_TRUE(srv.wait_ready(60));
  HttpClient c(srv.url(), kTimeout);
  const json messages = {{{"role", "user"}, {"content", "Hi"}}};
  auto t = c.post("/tokenize", json{{"messages", messages}}.dump());
  ASSERT_EQ(t.status, 200) << t.body;
  const auto d = c.post("/detokenize", json{{"tokens", parse(t.body)["tokens"]}}.dump());
  EXPECT_EQ(parse(d.body)["text"], "<<user|Hi>><<assistant|") << d.body;
  auto chat = c.post("/v1/chat/completions", json{{"messages", messages}, {"max_tokens", 1}}.dump());
  ASSERT_EQ(chat.status, 200) << chat.body;
  EXPECT_EQ(parse(chat.body)["usage"]["prompt_tokens"], parse(t.body)["count"]);
  EXPECT_EQ(parse(c.get("/get_server_info").body)["chat_template"], file.string());  // SGLang's server info shows it
  EXPECT_EQ(srv.stop(SIGTERM, 30), 0);
  fs::remove(file);
  std::string text;
  EXPECT_EQ(fp4moe::testing::run_command(
                std::string(FP4MOE_CLI) + " serve --port 0 --chat-template '{% for m in messages %' 2>&1", &text),
            1);
  EXPECT_NE(text.find("--chat-template:1:22: unclosed {%"), std::string::npos) << text;
  EXPECT_EQ(fp4moe::testing::run_command(
                std::string(FP4MOE_CLI) + " serve --port 0 --chat-template " + file.string() + " 2>&1", &text),
            1);
  EXPECT_NE(text.find("is neither a file nor a Jinja template"), std::string::npos) << text;
}

// --reasoning-parser glm45: chat replies split into reasoning_content and content, streamed and not,
// agreeing with the parser applied to the same reply unsplit (separate_reasoning: false); an unknown
// parser name stops the server before it listens, naming the known ones.
TEST(ServerE2E, ReasoningParserSplitsChatReplies) {
  std::string text;
  // Usage errors (exit 2), as a value outside CLI11's own sets.
  EXPECT_EQ(fp4moe::testing::run_command(std::string(FP4MOE_CLI) + " serve --port 0 --reasoning-parser glm4", &text),
            2);
  EXPECT_NE(text.find("--reasoning-parser: reasoning parser \"glm4\" is not one of: glm45, qwen3, deepseek-r1"),
            std::string::npos)
      << text;
  EXPECT_EQ(fp4moe::testing::run_command(std::string(FP4MOE_CLI) + " serve --port 0 --tool-call-parser hermes", &text),
            2);
  EXPECT_NE(text.find("--tool-call-parser: tool-call parser \"hermes\" is not one of: glm45"), std::string::npos)
      << text;

  ServerProcess srv(FP4MOE_CLI, {"--reasoning-parser", "glm45", "--tool-call-parser", "glm45"});
  ASSERT_TRUE(srv.wait_ready(60));
  HttpClient c(srv.url(), kTimeout);
  EXPECT_EQ(parse(c.get("/get_server_info").body)["reasoning_parser"], "glm45");
  EXPECT_EQ(parse(c.get("/get_server_info").body)["tool_call_parser"], "glm45");
  // Tools are rendered into the prompt and the reply parsed for calls: tool_calls is there (the random
  // default model calls none); an unknown tool_choice is refused by name (forced calls:
  // test_structured_outputs).
  const json tools = json::array({{{"type", "function"}, {"function", {{"name", "get_weather"}}}}});
  const json weather = {{{"role", "user"}, {"content", "Weather?"}}};
  auto t = c.post("/v1/chat/completions", json{{"messages", weather}, {"tools", tools}, {"max_tokens", 4}}.dump());
  ASSERT_EQ(t.status, 200) << t.body;
  EXPECT_TRUE(parse(t.body)["choices"][0]["message"]["tool_calls"].is_array()) << t.body;
  expect_error(
      c.post("/v1/chat/completions", json{{"messages", weather}, {"tools", tools}, {"tool_choice", "always"}}.dump()),
      400, "tool_choice");
  expect_error(c.post("/v1/completions", json{{"prompt", "a"}, {"tools", tools}}.dump()), 400, "tools");
  const json bogus =
      json::array({{{"type", "function"},
                    {"function", {{"name", "f"}, {"parameters", {{"properties", {{"x", {{"type", "bogus"}}}}}}}}}}});
  auto forced =
      c.post("/v1/chat/completions", json{{"messages", weather}, {"tools", bogus}, {"tool_choice", "required"}}.dump());
  expect_error(forced, 400, "tool_choice");
  EXPECT_NE(parse(forced.body)["error"]["message"].get<std::string>().find("parameter \"x\""), std::string::npos)
      << forced.body;
  json body = {{"messages", {{{"role", "user"}, {"content", "Think, then answer."}}}},
               {"max_tokens", 40},
               {"temperature", 0},
               {"separate_reasoning", false}};
  // Each request recomputes its prompt (no prefix-cache hit), so the three replies are the same tokens.
  ASSERT_EQ(c.post("/flush_cache", "").status, 200);
  auto whole = c.post("/v1/chat/completions", body.dump());
  ASSERT_EQ(whole.status, 200) << whole.body;
  const std::string reply = parse(whole.body)["choices"][0]["message"]["content"].get<std::string>();
  EXPECT_FALSE(parse(whole.body)["choices"][0]["message"].contains("reasoning_content"));
  const ReasoningSplit want = split_reasoning(*find_reasoning_format("glm45"), reply);

  body.erase("separate_reasoning");
  ASSERT_EQ(c.post("/flush_cache", "").status, 200);
  auto split = c.post("/v1/chat/completions", body.dump());
  ASSERT_EQ(split.status, 200) << split.body;
  const json msg = parse(split.body)["choices"][0]["message"];
  EXPECT_EQ(msg["content"], want.content);
  EXPECT_EQ(msg["reasoning_content"], want.reasoning.empty() ? json(nullptr) : json(want.reasoning));

  body["stream"] = true;
  ASSERT_EQ(c.post("/flush_cache", "").status, 200);
  int status = 0;
  auto chunks = sse_chunks(c, "/v1/chat/completions", body, &status);
  ASSERT_EQ(status, 200);
  std::string reasoning, content;
  for (const json& ch : chunks) {
    if (ch["choices"].empty()) continue;
    const json& d = ch["choices"][0]["delta"];
    if (d.contains("reasoning_content")) reasoning += d["reasoning_content"].get<std::string>();
    if (d.contains("content")) content += d["content"].get<std::string>();
  }
  EXPECT_EQ(reasoning, want.reasoning);
  EXPECT_EQ(content, want.content);
  // No empty chunk: after the first (the role), each carries a delta, logprobs or the finish_reason (text a parser
  // held back sent chunks of "delta": {}; a forced tool call ~130 of them).
  for (size_t i = 1; i < chunks.size(); ++i) {
    if (chunks[i]["choices"].empty()) continue;
    const json& ch = chunks[i]["choices"][0];
    EXPECT_TRUE(!ch["delta"].empty() || !ch["finish_reason"].is_null()) << chunks[i].dump();
  }
  EXPECT_EQ(srv.stop(SIGTERM, 30), 0);
}

// GLM-4.7 / GLM-5 templates open the reasoning block in the prompt ("<|assistant|><think>") and close an empty one
// with enable_thinking false: the reply starts inside the block, or is all answer with the structured output applied
// from its first token (the parser looked for <think> at the reply's start: the reasoning came out as content, and
// with thinking off the whole answer as reasoning with the regex never enforced).
TEST(ServerE2E, ReasoningStartsWhereTheTemplateLeftIt) {
  fp4moe::testing::TempDir tmp("serve_reasoning_template");
  const fs::path file = tmp.path() / "glm5.jinja";
  std::ofstream(file) << "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}{% endfor %}"
                         "{% if add_generation_prompt %}<|assistant|>"
                         "{{ '</think>' if (enable_thinking is defined and not enable_thinking) else '<think>' }}"
                         "{% endif %}";
  ServerProcess srv(FP4MOE_CLI, {"--chat-template", file.string(), "--reasoning-parser", "glm45"});
  ASSERT_TRUE(srv.wait_ready(60));
  HttpClient c(srv.url(), kTimeout);
  const json messages = json::array({{{"role", "user"}, {"content", "2 + 2?"}}});
  // Thinking off: all answer, the regex from the first token.
  auto off = c.post("/v1/chat/completions", json{{"messages", messages},
                                                 {"max_tokens", 20},
                                                 {"temperature", 0},
                                                 {"regex", "Answer: 4"},
                                                 {"chat_template_kwargs", {{"enable_thinking", false}}}}
                                                .dump());
  ASSERT_EQ(off.status, 200) << off.body;
  const json off_msg = parse(off.body)["choices"][0]["message"];
  EXPECT_EQ(off_msg["content"], "Answer: 4") << off.body;
  EXPECT_TRUE(off_msg["reasoning_content"].is_null()) << off.body;
  EXPECT_EQ(parse(off.body)["choices"][0]["finish_reason"], "stop") << off.body;
  // Thinking on: the reply starts inside the block (split as the parser splits the unsplit reply from there).
  json body = {{"messages", messages}, {"max_tokens", 12}, {"temperature", 0}, {"separate_reasoning", false}};
  ASSERT_EQ(c.post("/flush_cache", "").status, 200);
  auto whole = c.post("/v1/chat/completions", body.dump());
  ASSERT_EQ(whole.status, 200) << whole.body;
  const std::string reply = parse(whole.body)["choices"][0]["message"]["content"].get<std::string>();
  const ReasoningSplit want = split_reasoning(*find_reasoning_format("glm45"), reply, ReasoningStart::kInside);
  ASSERT_FALSE(want.reasoning.empty()) << reply;
  body.erase("separate_reasoning");
  ASSERT_EQ(c.post("/flush_cache", "").status, 200);
  auto split = c.post("/v1/chat/completions", body.dump());
  ASSERT_EQ(split.status, 200) << split.body;
  const json msg = parse(split.body)["choices"][0]["message"];
  EXPECT_EQ(msg["reasoning_content"], want.reasoning) << split.body;
  EXPECT_EQ(msg["content"], want.content) << split.body;
  EXPECT_EQ(srv.stop(SIGTERM, 30), 0);
}

TEST(ServerE2E, DisableDeviceSamplingFlag) {
  ServerProcess srv(FP4MOE_CLI, {"--disable-device-sampling"});
  ASSERT_TRUE(srv.wait_ready(60));
  HttpClient c(srv.url(), kTimeout);
  auto info = c.get("/get_server_info");
  ASSERT_EQ(info.status, 200);
  EXPECT_EQ(parse(info.body)["device_sampling"], false);
  const json body = {{"text", "seeded"},
                     {"sampling_params", {{"max_new_tokens", 6}, {"temperature", 0.8}, {"top_p", 0.9}, {"seed", 7}}}};
  auto a = c.post("/generate", body.dump());
  auto b = c.post("/generate", body.dump());
  ASSERT_EQ(a.status, 200) << a.body;
  ASSERT_EQ(b.status, 200) << b.body;
  EXPECT_EQ(parse(a.body)["output_ids"], parse(b.body)["output_ids"]);
  EXPECT_EQ(srv.stop(SIGTERM, 30), 0);
}

TEST(ServerE2E, SigtermDrainsRunningRequestsAndExitsZero) {
  ServerProcess srv(FP4MOE_CLI, {});
  ASSERT_TRUE(srv.wait_ready(60));
  std::atomic<int> chunks{0};
  std::vector<int64_t> final_ids;
  int status = 0;
  bool done = false;
  std::thread client([&] {
    HttpClient c(srv.url(), kTimeout);
    json body = {{"text", "drain"},
                 {"sampling_params", {{"max_new_tokens", 60}, {"ignore_eos", true}}},
                 {"stream", true}};
    auto r = c.post_sse("/generate", body.dump(), [&](std::string_view d) {
      if (d == "[DONE]") {
        done = true;
        return true;
      }
      ++chunks;
      final_ids = json::parse(d)["output_ids"].get<std::vector<int64_t>>();
      return true;
    });
    status = r.status;
  });
  while (chunks.load() < 2) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  const int rc = srv.stop(SIGTERM, 60);
  client.join();
  EXPECT_EQ(rc, 0);
  EXPECT_EQ(status, 200);
  EXPECT_TRUE(done);
  EXPECT_EQ(final_ids.size(), 60u);  // the running request finished
}

// A second server on a port in use stops with the reason (httplib's default SO_REUSEPORT let it bind beside the
// first, and the kernel split the connections between the two models); the first keeps serving.
TEST(ServerE2E, PortInUseIsRefused) {
  ServerProcess first(FP4MOE_CLI, {});
  ASSERT_TRUE(first.wait_ready(60));
  const std::string port = std::to_string(first.port());
  std::string text;
  EXPECT_EQ(fp4moe::testing::run_command(
                std::string("timeout 60 ") + FP4MOE_CLI + " serve --port " + port + " </dev/null 2>&1", &text),
            1);
  EXPECT_NE(text.find("cannot listen on 127.0.0.1:" + port + " (port taken"), std::string::npos) << text;
  HttpClient c(first.url(), kTimeout);
  EXPECT_EQ(c.get("/health").status, 200);
}

// --context-length past the model's max_position_embeddings is refused at start, naming both (it served 9,000
// positions of an 8,192-position model).
TEST(ServerE2E, ContextLengthPastTheModelIsRefused) {
  std::string text;
  EXPECT_EQ(
      fp4moe::testing::run_command(std::string(FP4MOE_CLI) + " serve --port 0 --context-length 100000 2>&1", &text), 1);
  EXPECT_NE(text.find("context length 100000 is past the model's max_position_embeddings 8192"), std::string::npos)
      << text;
}

// The model's generation_config.json: its eos_token_id ends a reply as config.json's does, and under
// --sampling-defaults model (the default) its sampling values fill what an OpenAI request omits (here temperature 0:
// a completion without one is greedy; /generate keeps SGLang's own defaults). --sampling-defaults openai ignores the
// values; a value out of a request's range stops the start, naming the file.
TEST(ServerE2E, GenerationConfigEosAndSamplingDefaults) {
  const fs::path golden = fp4moe::testing::shared_path("golden/models/glm5_tiny");
  const fs::path tok = fp4moe::testing::shared_path("golden/tokenizer");
  fp4moe::format::SafetensorsFile g(golden / "golden.safetensors");
  const auto ids = g.view("greedy_ids").as<int64_t>();
  const int64_t N = g.view("greedy_ids").dim(1), S = g.view("input_ids").dim(1);
  const std::vector<int64_t> prompt(ids.begin(), ids.begin() + S);
  const std::vector<int64_t> greedy(ids.begin() + S, ids.begin() + N);
  // The first generated token not seen before it and not config.json's eos (1) becomes generation_config's eos.
  size_t k = 1;
  while (k < greedy.size() && (greedy[k] == 1 || std::find(greedy.begin(), greedy.begin() + static_cast<long>(k),
                                                           greedy[k]) != greedy.begin() + static_cast<long>(k)))
    ++k;
  ASSERT_LT(k, greedy.size());
  const int64_t eos = greedy[k];
  fp4moe::testing::TempDir tmp("serve_generation_config");
  auto write_generation = [&](const json& j) { std::ofstream(tmp.path() / "generation_config.json") << j.dump(); };
  fp4moe::testing::copy_checkpoint(golden, tmp.path());
  write_generation({{"eos_token_id", {1, eos}}, {"temperature", 0.0}, {"top_p", 0.5}});
  const json greedy_generate = {{"input_ids", prompt},
                                {"sampling_params", {{"max_new_tokens", N - S}, {"temperature", 0}}}};
  {
    ServerProcess srv(FP4MOE_CLI, {"--model", tmp.path().string(), "--tokenizer-path", tok.string()});
    ASSERT_TRUE(srv.wait_ready(120));
    HttpClient c(srv.url(), kTimeout);
    // The greedy reply stops at generation_config's eos, after the golden tokens before it.
    auto r = c.post("/generate", greedy_generate.dump());
    ASSERT_EQ(r.status, 200) << r.body;
    const json j = parse(r.body);
    const auto out = j["output_ids"].get<std::vector<int64_t>>();
    ASSERT_GE(out.size(), k);
    EXPECT_EQ(std::vector<int64_t>(out.begin(), out.begin() + static_cast<long>(k)),
              std::vector<int64_t>(greedy.begin(), greedy.begin() + static_cast<long>(k)));
    EXPECT_EQ(j["meta_info"]["finish_reason"]["type"], "stop") << j.dump();
    EXPECT_EQ(j["meta_info"]["finish_reason"]["matched"], eos) << j.dump();
    // A completion without temperature takes the file's 0: the same greedy text, ended by the same eos.
    for (int i = 0; i < 2; ++i) {
      auto cr = c.post("/v1/completions", json{{"prompt", {prompt}}, {"max_tokens", N - S}}.dump());
      ASSERT_EQ(cr.status, 200) << cr.body;
      const json cj = parse(cr.body);
      EXPECT_EQ(cj["choices"][0]["text"], j["text"]) << cr.body;
      EXPECT_EQ(cj["choices"][0]["finish_reason"], "stop") << cr.body;
    }
    auto info = c.get("/get_server_info");
    ASSERT_EQ(info.status, 200);
    const json ij = parse(info.body);
    EXPECT_EQ(ij["sampling_defaults"], "model");
    EXPECT_EQ(ij["default_sampling_params"]["temperature"], 0.0);
    EXPECT_EQ(ij["default_sampling_params"]["top_p"], 0.5);
    EXPECT_EQ(srv.stop(SIGTERM, 30), 0);
  }
  {
    ServerProcess srv(FP4MOE_CLI, {"--model", tmp.path().string(), "--tokenizer-path", tok.string(),
                                   "--sampling-defaults", "openai"});
    ASSERT_TRUE(srv.wait_ready(120));
    HttpClient c(srv.url(), kTimeout);
    const json ij = parse(c.get("/get_server_info").body);
    EXPECT_EQ(ij["default_sampling_params"]["temperature"], 1.0);
    EXPECT_EQ(ij["default_sampling_params"]["top_p"], 1.0);
    // The eos still ends a greedy reply (it is not a sampling default).
    auto r = c.post("/generate", greedy_generate.dump());
    ASSERT_EQ(r.status, 200) << r.body;
    EXPECT_EQ(parse(r.body)["meta_info"]["finish_reason"]["matched"], eos) << r.body;
    EXPECT_EQ(srv.stop(SIGTERM, 30), 0);
  }
  write_generation({{"temperature", -1}});
  std::string text;
  EXPECT_EQ(fp4moe::testing::run_command(std::string("timeout 60 ") + FP4MOE_CLI + " serve --port 0 --model " +
                                             tmp.path().string() + " --tokenizer-path " + tok.string() + " 2>&1",
                                         &text),
            1);
  EXPECT_NE(text.find((tmp.path() / "generation_config.json").string() + ": temperature -1 must be in [0, 100]"),
            std::string::npos)
      << text;
  EXPECT_EQ(text.find("listening"), std::string::npos) << text;  // refused before the socket opens
}

// An idle keep-alive connection does not hold a SIGTERM's exit (httplib's workers waited out their 5 s keep-alive
// read; uvicorn closes idle connections at shutdown): the connection ends, the process exits at once.
TEST(ServerE2E, IdleKeepAliveConnectionDoesNotDelayShutdown) {
  ServerProcess srv(FP4MOE_CLI, {});
  ASSERT_TRUE(srv.wait_ready(60));
  const int fd =
      raw_post(srv.port(), "/generate", json{{"text", "hi"}, {"sampling_params", {{"max_new_tokens", 2}}}}.dump(),
               /*with_length=*/true, "HTTP/1.1", "keep-alive");
  ASSERT_GE(fd, 0);
  char buf[4096];
  pollfd p{fd, POLLIN, 0};
  ASSERT_EQ(::poll(&p, 1, 10000), 1);
  const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
  ASSERT_GT(n, 0);
  EXPECT_EQ(std::string(buf, static_cast<size_t>(n)).rfind("HTTP/1.1 200", 0), 0u);
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(srv.stop(SIGTERM, 30), 0);
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 3.0);
  ::close(fd);
}

// --drain-timeout bounds the drain: a request that would run long is aborted when it expires (the engine thread
// was joined first, so a 3,000-token request kept the process up ~18 s past --drain-timeout 1); a repeated SIGTERM
// is ignored (`timeout` sends one to the process and one to its group), SIGINT while draining exits at once.
TEST(ServerE2E, DrainTimeoutAbortsWhatIsLeftAndSigintExits) {
  enum class Then { kNothing, kSigterm, kSigint };
  for (Then then : {Then::kNothing, Then::kSigterm, Then::kSigint}) {
    SCOPED_TRACE(then == Then::kNothing ? "drain timeout" : then == Then::kSigterm ? "SIGTERM again" : "then SIGINT");
    ServerProcess srv(FP4MOE_CLI, {"--drain-timeout", then == Then::kSigint ? "600" : "1"});
    ASSERT_TRUE(srv.wait_ready(60));
    std::atomic<int> chunks{0};
    std::string finish;
    size_t n_ids = 0;
    std::thread client([&] {
      HttpClient c(srv.url(), kTimeout);
      json body = {
          {"text", "drain"}, {"sampling_params", {{"max_new_tokens", 3000}, {"ignore_eos", true}}}, {"stream", true}};
      c.post_sse("/generate", body.dump(), [&](std::string_view d) {
        if (d == "[DONE]") return true;
        ++chunks;
        const json j = json::parse(d);
        n_ids = j["output_ids"].size();
        if (j["meta_info"]["finish_reason"].is_object()) finish = j["meta_info"]["finish_reason"]["type"];
        return true;
      });
    });
    while (chunks.load() < 2) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    const auto t0 = std::chrono::steady_clock::now();
    if (then != Then::kNothing) {
      ::kill(srv.pid(), SIGTERM);
      std::this_thread::sleep_for(std::chrono::milliseconds(300));  // two pending signals of one kind would merge
    }
    const int rc = srv.stop(then == Then::kSigint ? SIGINT : SIGTERM, 30);
    const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    client.join();
    EXPECT_EQ(rc, then == Then::kSigint ? 1 : 0);
    EXPECT_LT(took, 8.0);
    EXPECT_LT(n_ids, 3000u);
    if (then != Then::kSigint) {
      EXPECT_EQ(finish, "abort");
    }
  }
}

// --api-key: every route but the probes and /metrics wants the Bearer key (401 naming the header
// otherwise, counted in /metrics), /get_server_info never shows the key, and bench-serving / analyze
// send it with their --api-key.
TEST(ServerE2E, ApiKeyGuardsEveryRouteButTheProbes) {
  // An empty FP4MOE_API_KEY (an unset variable in a script) is a usage error, not a server without authentication.
  std::string env_text;
  EXPECT_EQ(fp4moe::testing::run_command(
                std::string("FP4MOE_API_KEY= timeout 30 ") + FP4MOE_CLI + " serve --port 0 </dev/null 2>&1", &env_text),
            2)
      << env_text;
  EXPECT_NE(env_text.find("FP4MOE_API_KEY: is set but empty (for --api-key)"), std::string::npos) << env_text;
  const std::string key = "s3cret-key";
  ServerProcess srv(FP4MOE_CLI, {"--api-key", key});
  ASSERT_TRUE(srv.wait_ready(60));
  HttpClient open(srv.url(), kTimeout), wrong(srv.url(), kTimeout), keyed(srv.url(), kTimeout);
  wrong.set_bearer_token("not-it");
  keyed.set_bearer_token(key);
  const json body = {{"prompt", "hi"}, {"max_tokens", 2}};
  for (HttpClient* c : {&open, &wrong}) {
    for (const auto& r :
         {c->get("/v1/models"), c->get("/get_server_info"), c->post("/v1/completions", body.dump()),
          c->post("/generate", json{{"text", "hi"}}.dump()), c->post("/tokenize", json{{"prompt", "hi"}}.dump())}) {
      EXPECT_EQ(r.status, 401) << r.body;
      const json j = parse(r.body);
      EXPECT_EQ(j["error"]["type"], "authentication_error");
      EXPECT_NE(j["error"]["message"].get<std::string>().find("--api-key"), std::string::npos) << r.body;
      EXPECT_EQ(r.header("WWW-Authenticate"), "Bearer");
    }
  }
  EXPECT_EQ(open.get("/health").status, 200);
  EXPECT_EQ(open.get("/health_generate").status, 200);
  EXPECT_EQ(open.get("/metrics").status, 200);
  EXPECT_EQ(open.get("/ping").status, 200);
  {
    // A refused request's body is not read: the connection closes after the 401, or the body would be taken for the
    // next request (a 20 KB prompt answered as a 414).
    const int fd = raw_post(srv.port(), "/generate", json{{"text", std::string(20000, 'a')}}.dump(), true, "HTTP/1.1",
                            "keep-alive");
    ASSERT_GE(fd, 0);
    const auto t0 = std::chrono::steady_clock::now();
    const std::string got = read_until_closed(fd, 20);
    ::close(fd);
    EXPECT_EQ(got.rfind("HTTP/1.1 401", 0), 0u) << got;
    EXPECT_EQ(got.find("HTTP/1.1 414"), std::string::npos) << got;
    EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(2)) << "closed at once: " << got;
  }
  EXPECT_EQ(keyed.post("/v1/completions", body.dump()).status, 200);
  const auto info = keyed.get("/get_server_info");
  ASSERT_EQ(info.status, 200);
  EXPECT_EQ(info.body.find(key), std::string::npos) << "the key leaks: " << info.body;
  EXPECT_EQ(parse(info.body)["api_key"], "(set)");
  EXPECT_GE(metric(srv.url(), "fp4moe:http_errors_total{code=\"401\"}"), 10.0);

  std::string text;
  const std::string bench =
      std::string(FP4MOE_CLI) + " bench-serving --url " + srv.url() + " --num-prompts 2 --input-len 8 --output-len 2";
  EXPECT_NE(fp4moe::testing::run_command(bench, &text), 0) << text;
  EXPECT_NE(text.find("401"), std::string::npos) << text;
  EXPECT_EQ(fp4moe::testing::run_command(bench + " --api-key " + key, &text), 0) << text;
  const std::string analyze = std::string(FP4MOE_CLI) + " analyze --url " + srv.url();
  EXPECT_NE(fp4moe::testing::run_command(analyze, &text), 0) << text;
  EXPECT_NE(text.find("the server wants its API key: pass --api-key"), std::string::npos) << text;
  EXPECT_NE(fp4moe::testing::run_command(analyze + " --api-key wrong-key", &text), 0) << text;
  EXPECT_NE(text.find("the server refused the key given with --api-key"), std::string::npos) << text;
  EXPECT_EQ(fp4moe::testing::run_command(analyze + " --api-key " + key, &text), 0) << text;

  // The key from the environment (FP4MOE_API_KEY), out of the process list.
  ::setenv("FP4MOE_API_KEY", "from-env", 1);
  ServerProcess env_srv(FP4MOE_CLI, {});
  ::unsetenv("FP4MOE_API_KEY");
  ASSERT_TRUE(env_srv.wait_ready(60));
  HttpClient env_open(env_srv.url(), kTimeout), env_keyed(env_srv.url(), kTimeout);
  env_keyed.set_bearer_token("from-env");
  EXPECT_EQ(env_open.get("/v1/models").status, 401);
  EXPECT_EQ(env_keyed.get("/v1/models").status, 200);
}

TEST(ServerE2E, BenchServingReportsAndPlots) {
  ServerProcess srv(FP4MOE_CLI, {});
  ASSERT_TRUE(srv.wait_ready(60));
  const fs::path out = fs::temp_directory_path() / ("fp4moe_bench_" + std::to_string(getpid()) + ".jsonl");
  const fs::path svg = fs::temp_directory_path() / ("fp4moe_bench_" + std::to_string(getpid()) + ".svg");
  fs::remove(out);
  std::string text;
  int rc = fp4moe::testing::run_command(std::string(FP4MOE_CLI) + " bench-serving --url " + srv.url() +
                                            " --num-prompts 12 --max-concurrency 2,6 --input-len 24 --output-len 6"
                                            " --output-file " +
                                            out.string() + " --plot " + svg.string(),
                                        &text);
  ASSERT_EQ(rc, 0) << text;
  {
    // Each --output-file line says how its run was made.
    std::ifstream f(out);
    std::string line;
    ASSERT_TRUE(std::getline(f, line));
    const json run = json::parse(line);
    EXPECT_EQ(run["random_input_len"], 24);
    EXPECT_EQ(run["random_output_len"], 6);
    EXPECT_EQ(run["random_range_ratio"], 1.0);
    EXPECT_EQ(run["seed"], 1);
    EXPECT_EQ(run["sampling"], json({{"temperature", 0.0}}));
    EXPECT_EQ(run["request_rate"], "inf");
  }
  EXPECT_NE(text.find("Traffic request rate:                    inf"), std::string::npos) << text;
  for (const char* k : {"Serving Benchmark Result", "Successful requests:", "Request throughput (req/s):",
                        "Input token throughput (tok/s):", "Output token throughput (tok/s):", "Mean TTFT (ms):",
                        "Median TTFT (ms):", "P99 TTFT (ms):", "Mean TPOT (ms):", "P99 ITL (ms):", "Median ITL (ms):"}) {
    EXPECT_NE(text.find(k), std::string::npos) << k << "\n" << text;
  }
  std::ifstream f(out);
  std::string line;
  std::vector<json> runs;
  while (std::getline(f, line)) runs.push_back(parse(line));
  ASSERT_EQ(runs.size(), 2u);
  for (size_t i = 0; i < runs.size(); ++i) {
    EXPECT_EQ(runs[i]["max_concurrency"], i == 0 ? 2 : 6);
    EXPECT_EQ(runs[i]["completed"], 12);
    EXPECT_EQ(runs[i]["failed"], 0);
    EXPECT_EQ(runs[i]["total_output_tokens"], 72);
    EXPECT_EQ(runs[i]["total_input_tokens"], 12 * 24);
    EXPECT_EQ(runs[i]["total_cached_input_tokens"], 0) << "each run starts from a flushed prefix cache";
    EXPECT_GT(runs[i]["output_throughput"].get<double>(), 0);
    EXPECT_GT(runs[i]["median_ttft_ms"].get<double>(), 0);
    EXPECT_GE(runs[i]["p99_itl_ms"].get<double>(), runs[i]["median_itl_ms"].get<double>());
  }
  std::ifstream s(svg);
  std::stringstream ss;
  ss << s.rdbuf();
  EXPECT_EQ(ss.str().rfind("<svg", 0), 0u);
  EXPECT_NE(ss.str().find("c=6"), std::string::npos);
  EXPECT_NE(ss.str().find("</svg>"), std::string::npos);
  // The six labels of each axis are distinct (small latencies printed "0 1 2 2 3 4").
  for (const char* anchor : {"text-anchor=\"middle\">", "text-anchor=\"end\">"}) {
    std::vector<std::string> labels;
    for (size_t at = ss.str().find(anchor); at != std::string::npos; at = ss.str().find(anchor, at + 1)) {
      const size_t from = at + std::string(anchor).size();
      const std::string label = ss.str().substr(from, ss.str().find('<', from) - from);
      if (!label.empty() && (std::isdigit(static_cast<unsigned char>(label[0])) != 0)) labels.push_back(label);
    }
    ASSERT_EQ(labels.size(), 6u) << anchor << "\n" << ss.str();
    for (size_t i = 1; i < labels.size(); ++i) EXPECT_NE(labels[i], labels[i - 1]) << anchor;
  }
  fs::remove(out);
  fs::remove(svg);

  // --request-rate: requests arrive as a Poisson process (10 a second: 11 gaps of mean 0.1 s), whatever the
  // concurrency allows; the run lasts at least until the last one is sent. --burstiness needs a rate.
  const fs::path rate_out = fs::temp_directory_path() / ("fp4moe_bench_rate_" + std::to_string(getpid()) + ".jsonl");
  rc =
      fp4moe::testing::run_command(std::string(FP4MOE_CLI) + " bench-serving --url " + srv.url() +
                                       " --num-prompts 12 --request-rate 10 --burstiness 4 --input-len 8 --output-len 2"
                                       " --output-file " +
                                       rate_out.string(),
                                   &text);
  ASSERT_EQ(rc, 0) << text;
  EXPECT_NE(text.find("Traffic request rate:                    10"), std::string::npos) << text;
  {
    std::ifstream rf(rate_out);
    std::string rate_line;
    ASSERT_TRUE(std::getline(rf, rate_line));
    const json run = parse(rate_line);
    EXPECT_EQ(run["request_rate"], 10.0);
    EXPECT_EQ(run["burstiness"], 4.0);
    EXPECT_EQ(run["completed"], 12);
    // Gamma(4) gaps of mean 0.1 s: 11 of them sum to 1.1 s give or take ~0.17 s (one standard deviation).
    EXPECT_GT(run["duration"].get<double>(), 0.5) << rate_line;
    EXPECT_LT(run["request_throughput"].get<double>(), 20.0) << rate_line;
  }
  fs::remove(rate_out);
  EXPECT_EQ(fp4moe::testing::run_command(
                std::string(FP4MOE_CLI) + " bench-serving --url " + srv.url() + " --burstiness 2 2>&1", &text),
            2)
      << text;
  EXPECT_NE(text.find("--burstiness requires --request-rate"), std::string::npos) << text;
  EXPECT_EQ(fp4moe::testing::run_command(
                std::string(FP4MOE_CLI) + " bench-serving --url " + srv.url() + " --request-rate 0 2>&1", &text),
            1)
      << text;
  EXPECT_NE(text.find("--request-rate 0 must be >= 1.15741e-05 requests/s (one a day), or inf"), std::string::npos)
      << text;

  // sglang.bench_serving's sharegpt load: conversations of two turns or more, the first turn the prompt and the
  // second's token count (by the server's tokenizer) the output length, or --sharegpt-output-len; a one-turn
  // conversation and one of 1-token turns are skipped.
  const fs::path share = fs::temp_directory_path() / ("fp4moe_sharegpt_" + std::to_string(getpid()) + ".json");
  const std::string answer = "Here is a short answer with several words.";
  {
    json convs = json::array();
    for (int i = 0; i < 5; ++i)
      convs.push_back({{"conversations",
                        {{{"from", "human"}, {"value", "Tell me about topic " + std::to_string(i)}},
                         {{"from", "gpt"}, {"value", answer}}}}});
    convs.push_back({{"conversations", {{{"from", "human"}, {"value", "only one turn"}}}}});
    convs.push_back({{"conversations", {{{"from", "human"}, {"value", "a"}}, {{"from", "gpt"}, {"value", "b"}}}}});
    // A turn without a text string: skipped (it ended the run), as is a conversation that is not an object.
    convs.push_back({{"conversations", {{{"from", "human"}, {"value", nullptr}}, {{"from", "gpt"}, {"value", "x"}}}}});
    convs.push_back(3);
    std::ofstream(share) << convs.dump();
  }
  HttpClient tc(srv.url(), kTimeout);
  const int64_t answer_len =
      parse(tc.post("/v1/tokenize", json{{"prompt", answer}}.dump()).body)["count"];  // as sglang counts it
  for (const std::string& extra : {std::string(), std::string(" --sharegpt-output-len 4")}) {
    fs::remove(out);
    rc = fp4moe::testing::run_command(std::string(FP4MOE_CLI) + " bench-serving --url " + srv.url() +
                                          " --dataset-name sharegpt --dataset-path " + share.string() +
                                          " --num-prompts 10 --max-concurrency 3 --output-file " + out.string() + extra,
                                      &text);
    ASSERT_EQ(rc, 0) << text;
    std::ifstream sf(out);
    ASSERT_TRUE(std::getline(sf, line));
    const json run = parse(line);
    EXPECT_EQ(run["dataset"], "sharegpt");
    EXPECT_EQ(run["completed"], 5) << "the one-turn, the 1-token and the malformed conversations are skipped";
    EXPECT_EQ(run["total_output_tokens"], 5 * (extra.empty() ? answer_len : 4)) << line;
  }
  // The OpenAI routes (--backend openai / openai-chat) count the same tokens through their usage.
  for (const std::string backend : {"openai", "sglang-oai-chat"}) {
    fs::remove(out);
    rc = fp4moe::testing::run_command(std::string(FP4MOE_CLI) + " bench-serving --url " + srv.url() + " --backend " +
                                          backend + " --dataset-name sharegpt --dataset-path " + share.string() +
                                          " --num-prompts 10 --sharegpt-output-len 4 --output-file " + out.string(),
                                      &text);
    ASSERT_EQ(rc, 0) << backend << ": " << text;
    std::ifstream bf(out);
    ASSERT_TRUE(std::getline(bf, line));
    const json run = parse(line);
    EXPECT_EQ(run["backend"], backend);
    EXPECT_EQ(run["completed"], 5) << line;
    EXPECT_EQ(run["total_output_tokens"], 5 * 4) << line;
    EXPECT_GT(run["total_input_tokens"].get<int64_t>(), 0) << line;
    EXPECT_GT(run["median_ttft_ms"].get<double>(), 0) << line;
  }
  // sglang.bench_serving's random dataset with a file: prompts of the random lengths made of the first turns' text
  // (their tokens repeated to the length), sent as text, so a chat backend takes them too; the embedded model's
  // byte-level tokenizer decodes and re-encodes them to exactly the drawn lengths.
  for (const std::string backend : {"sglang", "sglang-oai-chat"}) {
    fs::remove(out);
    rc =
        fp4moe::testing::run_command(std::string(FP4MOE_CLI) + " bench-serving --url " + srv.url() + " --backend " +
                                         backend + " --dataset-name random --dataset-path " + share.string() +
                                         " --num-prompts 7 --input-len 40 --output-len 3 --output-file " + out.string(),
                                     &text);
    ASSERT_EQ(rc, 0) << backend << ": " << text;
    std::ifstream rf(out);
    ASSERT_TRUE(std::getline(rf, line));
    const json run = parse(line);
    EXPECT_EQ(run["dataset"], "random") << line;
    EXPECT_EQ(run["dataset_path"], share.string()) << line;
    EXPECT_EQ(run["completed"], 7) << line;
    EXPECT_EQ(run["total_output_tokens"], 7 * 3) << line;
    if (backend == "sglang")
      EXPECT_EQ(run["total_input_tokens"], 7 * 40) << line;
    else
      EXPECT_GT(run["total_input_tokens"].get<int64_t>(), 7 * 40) << line;  // the chat template's tokens too
  }
  // Loads that cannot run fail naming why.
  const std::string sharegpt = " --dataset-name sharegpt --dataset-path " + share.string();
  for (const auto& [flags, message] : std::vector<std::pair<std::string, std::string>>{
           {" --backend openai-chat --num-prompts 2",
            "--backend openai-chat sends each prompt as a user message's text"},
           {sharegpt + " --sharegpt-context-len 8", "no conversation passed the filters"},
           {sharegpt + " --sharegpt-output-len 3",
            "--sharegpt-output-len 3 must be 0 (the conversation's own) or >= 4"},
           {" --dataset-name sharegpt", "--dataset-name sharegpt needs --dataset-path FILE"},
           {" --dataset-name generated-shared-prefix --dataset-path " + share.string(),
            "--dataset-path is a ShareGPT file for --dataset-name sharegpt or random"}}) {
    rc = fp4moe::testing::run_command(std::string(FP4MOE_CLI) + " bench-serving --url " + srv.url() + flags + " 2>&1",
                                      &text);
    EXPECT_NE(rc, 0) << flags;
    EXPECT_NE(text.find(message), std::string::npos) << flags << ": " << text;
  }
  fs::remove(share);
  fs::remove(out);

  // SGLang's generated-shared-prefix dataset, one request at a time: 2 groups x 4 prompts of a 48-token
  // system prompt + an 8-token question; all but each group's first find the 3 system pages cached.
  rc = fp4moe::testing::run_command(std::string(FP4MOE_CLI) + " bench-serving --url " + srv.url() +
                                        " --dataset-name generated-shared-prefix --gsp-num-groups 2"
                                        " --gsp-prompts-per-group 4 --gsp-system-prompt-len 48 --gsp-question-len 8"
                                        " --gsp-output-len 4 --max-concurrency 1 --output-file " +
                                        out.string(),
                                    &text);
  ASSERT_EQ(rc, 0) << text;
  EXPECT_NE(text.find("Prefix-cached input tokens:"), std::string::npos) << text;
  std::ifstream f1(out);
  ASSERT_TRUE(std::getline(f1, line));
  const json gsp = parse(line);
  EXPECT_EQ(gsp["dataset"], "generated-shared-prefix");
  EXPECT_EQ(gsp["completed"], 8);
  EXPECT_EQ(gsp["total_input_tokens"], 8 * 56);
  EXPECT_EQ(gsp["total_output_tokens"], 8 * 4);
  EXPECT_EQ(gsp["total_cached_input_tokens"], 2 * 3 * 48);
  fs::remove(out);
  // --no-flush-cache: the first run finds the warm-up request's prompt (its first prompt: one whole page of 16 tokens)
  // and the second run the first's prompts (one whole page of each 24-token prompt).
  rc = fp4moe::testing::run_command(std::string(FP4MOE_CLI) + " bench-serving --url " + srv.url() +
                                        " --num-prompts 12 --max-concurrency 4,4 --input-len 24 --output-len 2"
                                        " --seed 9 --no-flush-cache --output-file " +
                                        out.string(),
                                    &text);
  ASSERT_EQ(rc, 0) << text;
  runs.clear();
  std::ifstream f2(out);
  while (std::getline(f2, line)) runs.push_back(parse(line));
  ASSERT_EQ(runs.size(), 2u);
  EXPECT_EQ(runs[0]["total_cached_input_tokens"], 16);
  EXPECT_EQ(runs[1]["total_cached_input_tokens"], 12 * 16);
  fs::remove(out);

  // A dataset with blank lines and fewer prompts than --num-prompts: they repeat (it read past its end).
  const fs::path ds = fs::temp_directory_path() / ("fp4moe_bench_ds_" + std::to_string(getpid()) + ".jsonl");
  std::ofstream(ds) << "\n{\"prompt\": \"hi\", \"output_len\": 2}\n\n";
  rc = fp4moe::testing::run_command(
      std::string(FP4MOE_CLI) + " bench-serving --url " + srv.url() + " --num-prompts 3 --dataset " + ds.string(),
      &text);
  EXPECT_EQ(rc, 0) << text;
  EXPECT_NE(text.find("Successful requests:                     3"), std::string::npos) << text;
  std::ofstream(ds) << "{\"prompt\": \"hi\", \"output_len\": \"x\"}\n";
  rc = fp4moe::testing::run_command(
      std::string(FP4MOE_CLI) + " bench-serving --url " + srv.url() + " --num-prompts 1 --dataset " + ds.string(),
      &text);
  EXPECT_EQ(rc, 1) << text;
  EXPECT_NE(text.find(ds.string() + ":1: output_len must be an integer, got \"x\""), std::string::npos) << text;
  fs::remove(ds);
  // Bad flags fail at once, before any request: a zero timeout (it aborted the process from a worker
  // thread), an output file that cannot be written (it failed after the whole run).
  rc = fp4moe::testing::run_command(std::string(FP4MOE_CLI) + " bench-serving --url " + srv.url() + " --timeout 0",
                                    &text);
  EXPECT_EQ(rc, 1) << text;
  EXPECT_NE(text.find("--timeout 0 must be > 0 seconds"), std::string::npos) << text;
  rc = fp4moe::testing::run_command(
      std::string(FP4MOE_CLI) + " bench-serving --url " + srv.url() + " --dataset-name sharegpt-v2", &text);
  EXPECT_EQ(rc, 2) << text;  // a usage error, also beside --dataset (it was ignored there)
  EXPECT_NE(text.find("--dataset-name: sharegpt-v2 not in {random,generated-shared-prefix,sharegpt}"),
            std::string::npos)
      << text;
  rc = fp4moe::testing::run_command(std::string(FP4MOE_CLI) + " bench-serving --url " + srv.url() +
                                        " --dataset /dev/null --dataset-name generated-shared-prefix",
                                    &text);
  EXPECT_EQ(rc, 1) << text;
  EXPECT_NE(text.find("--dataset /dev/null (JSON-lines prompts) and --dataset-name generated-shared-prefix are two "
                      "loads: give one"),
            std::string::npos)
      << text;
  // What a run builds before its first request is bounded (--num-prompts 10^8 died with std::bad_alloc).
  rc = fp4moe::testing::run_command(
      std::string(FP4MOE_CLI) + " bench-serving --url " + srv.url() + " --num-prompts 100000000", &text);
  EXPECT_EQ(rc, 1) << text;
  EXPECT_NE(text.find("--num-prompts 100000000 must be in [1, 10000000]"), std::string::npos) << text;
  rc = fp4moe::testing::run_command(
      std::string(FP4MOE_CLI) + " bench-serving --url " + srv.url() + " --num-prompts 2000000 --input-len 100", &text);
  EXPECT_EQ(rc, 1) << text;
  EXPECT_NE(text.find("2000000 prompts of --input-len = 100 tokens are past 134217728 prompt tokens"),
            std::string::npos)
      << text;
  rc = fp4moe::testing::run_command(std::string(FP4MOE_CLI) + " bench-serving --url " + srv.url() +
                                        " --num-prompts 1 --output-file " + fs::temp_directory_path().string(),
                                    &text);
  EXPECT_EQ(rc, 1) << text;
  EXPECT_NE(text.find("--output-file " + fs::temp_directory_path().string() + " is a directory, not a file"),
            std::string::npos)
      << text;
  EXPECT_EQ(text.find("Serving Benchmark Result"), std::string::npos) << text;
  // Sampled requests with a large --seed: each request's seed (seed x 1000003 + i) is sent as an int64, which the
  // server takes whole (as a uint64 past INT64_MAX every request was a 400).
  rc = fp4moe::testing::run_command(std::string(FP4MOE_CLI) + " bench-serving --url " + srv.url() +
                                        " --num-prompts 2 --input-len 4 --output-len 2 --temperature 1 --seed "
                                        "10000000000000",
                                    &text);
  EXPECT_EQ(rc, 0) << text;
  EXPECT_EQ(srv.stop(SIGTERM, 30), 0);
  // Nothing listening: the message says so in words.
  rc = fp4moe::testing::run_command(std::string(FP4MOE_CLI) + " bench-serving --url " + srv.url(), &text);
  EXPECT_EQ(rc, 1) << text;
  EXPECT_NE(text.find("/get_server_info: could not connect to 127.0.0.1:"), std::string::npos) << text;
  // Every flag's value is checked before the server is asked (with none listening, these said only "could not
  // connect"); the sampling flags as the server checks them (a bad one failed every request, nan was sent as null).
  for (const auto& [flags, message] : std::vector<std::pair<std::string, std::string>>{
           {"--max-concurrency 0", "--max-concurrency '0': entry 1 '0' is not a positive integer"},
           {"--input-len -5", "--input-len -5 and --output-len 32 must be >= 1"},
           {"--dataset /nonexistent/prompts.jsonl", "cannot open /nonexistent/prompts.jsonl"},
           {"--dataset-name generated-shared-prefix --gsp-num-groups 0", "--gsp-num-groups 0, "},
           {"--temperature -1", "--temperature -1 must be in [0, 100] (0 = greedy)"},
           {"--temperature nan", "--temperature nan must be in [0, 100]"},
           {"--temperature 0.5 --top-p 0", "--top-p 0 must be in (0, 1]"},
           {"--temperature 0.5 --top-k -3", "--top-k -3 must be -1 (off), 0 (off) or in [1, 2^31)"},
           {"--temperature 0.5 --top-k 3000000000", "--top-k 3000000000 must be -1 (off), 0 (off) or in [1, 2^31)"},
           {"--dataset-name generated-shared-prefix --gsp-system-prompt-len 9223372036854775807 --gsp-question-len 1",
            "must be <= 134217728 tokens, the most one run builds"}}) {
    rc = fp4moe::testing::run_command(std::string(FP4MOE_CLI) + " bench-serving --url " + srv.url() + " " + flags,
                                      &text);
    EXPECT_EQ(rc, 1) << flags << ": " << text;
    EXPECT_NE(text.find(message), std::string::npos) << flags << ": " << text;
    EXPECT_EQ(text.find("could not connect"), std::string::npos) << flags << ": " << text;
  }
  rc = fp4moe::testing::run_command(
      std::string(FP4MOE_CLI) + " bench-serving --url " + srv.url() + " --flush-cache --no-flush-cache", &text);
  EXPECT_EQ(rc, 2) << text;  // both were taken (the last one won)
  EXPECT_NE(text.find("--no-flush-cache excludes --flush-cache"), std::string::npos) << text;
}

}  // namespace
