// Load test of `fp4moe serve` on the embedded default model: 256 greedy requests (64 distinct
// prompts of mixed lengths, each sent 4 times, a quarter of them streamed) at concurrency 64 against
// --max-running-requests 16. Every request must complete with exactly the ids the same prompt gets
// when sent alone, none may be lost, and the server must end idle (no running request, no KV in use).
// Prints the latency percentiles. Random lengths come from fp4moe::testing::test_seed().
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <random>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "server/http_client.h"
#include "server_process.h"
#include "testing/testing.h"

namespace {

using nlohmann::json;
using fp4moe::server::HttpClient;
using fp4moe::testing::ServerProcess;

struct Case {
  std::vector<int> prompt;
  int max_new_tokens = 0;
};

// Greedy ids for one case; streamed requests read the cumulative output_ids of the last chunk.
std::vector<int64_t> run_case(const std::string& url, const Case& c, bool stream, int* status) {
  HttpClient client(url, 120);
  json body = {{"input_ids", c.prompt},
               {"sampling_params", {{"max_new_tokens", c.max_new_tokens}, {"temperature", 0}, {"ignore_eos", true}}},
               {"stream", stream}};
  if (!stream) {
    auto r = client.post("/generate", body.dump());
    *status = r.status;
    if (r.status != 200) {
      ADD_FAILURE() << "HTTP " << r.status << " " << r.error << " " << r.body.substr(0, 300);
      return {};
    }
    return json::parse(r.body)["output_ids"].get<std::vector<int64_t>>();
  }
  std::vector<int64_t> ids;
  bool done = false;
  auto r = client.post_sse("/generate", body.dump(), [&](std::string_view d) {
    if (d == "[DONE]") done = true;
    else ids = json::parse(d)["output_ids"].get<std::vector<int64_t>>();
    return true;
  });
  *status = done ? r.status : -1;
  if (*status != 200) ADD_FAILURE() << "stream: HTTP " << r.status << " " << r.error << " " << r.body.substr(0, 300);
  return ids;
}

TEST(ServerLoad, ConcurrentRequestsMatchSentAloneGreedy) {
  ServerProcess srv(FP4MOE_CLI, {"--max-running-requests", "16", "--http-threads", "96"});
  ASSERT_TRUE(srv.wait_ready(60));
  std::mt19937_64 rng(fp4moe::testing::test_seed());
  std::vector<Case> cases(64);
  for (auto& c : cases) {
    c.prompt.resize(std::uniform_int_distribution<size_t>(1, 96)(rng));
    for (auto& t : c.prompt) t = std::uniform_int_distribution<int>(0, 255)(rng);
    c.max_new_tokens = std::uniform_int_distribution<int>(1, 32)(rng);
  }
  // Each case alone, twice: the second run takes its prompt from the prefix cache, as the concurrent copies below do
  // (they forward the prompt's last token alone, where the first run forwarded it inside the whole prompt's chunk: the
  // CPU model's MLA picks its expanded or absorbed form by the chunk, equal in exact arithmetic, not bit for bit, so a
  // near-tie's greedy token could flip between the two; seed 68300376325758 did at case 25's 13th token).
  std::vector<std::vector<int64_t>> alone(cases.size());
  for (size_t i = 0; i < cases.size(); ++i) {
    int status = 0;
    alone[i] = run_case(srv.url(), cases[i], false, &status);
    ASSERT_EQ(status, 200) << "case " << i;
    alone[i] = run_case(srv.url(), cases[i], false, &status);
    ASSERT_EQ(status, 200) << "case " << i;
    ASSERT_EQ(alone[i].size(), static_cast<size_t>(cases[i].max_new_tokens)) << "case " << i;
  }

  constexpr int kRequests = 256, kConcurrency = 64;
  std::vector<std::vector<int64_t>> got(kRequests);
  std::vector<int> statuses(kRequests, 0);
  std::vector<double> latency_ms(kRequests, 0);
  std::atomic<int> next{0};
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::thread> workers;
  for (int w = 0; w < kConcurrency; ++w) {
    workers.emplace_back([&] {
      for (int i = next++; i < kRequests; i = next++) {
        const auto s = std::chrono::steady_clock::now();
        got[i] = run_case(srv.url(), cases[static_cast<size_t>(i) % cases.size()], i % 4 == 3, &statuses[i]);
        latency_ms[i] = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - s).count();
      }
    });
  }
  for (auto& t : workers) t.join();
  const double wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  int n_ok = 0;
  for (int i = 0; i < kRequests; ++i) {
    const size_t c = static_cast<size_t>(i) % cases.size();
    EXPECT_EQ(statuses[i], 200) << "request " << i;
    EXPECT_EQ(got[i], alone[c]) << "request " << i << " (case " << c << ", prompt " << cases[c].prompt.size()
                                << " tokens, " << cases[c].max_new_tokens << " new, "
                                << (i % 4 == 3 ? "streamed" : "plain") << ") differs from the same prompt sent alone";
    n_ok += statuses[i] == 200 && got[i] == alone[c];
  }
  EXPECT_EQ(n_ok, kRequests);
  std::vector<double> sorted = latency_ms;
  std::sort(sorted.begin(), sorted.end());
  auto pct = [&](double p) { return sorted[static_cast<size_t>(p / 100.0 * (sorted.size() - 1))]; };
  std::printf("load: %d requests at concurrency %d in %.2f s; latency ms p50 %.1f p90 %.1f p99 %.1f max %.1f\n",
              kRequests, kConcurrency, wall_s, pct(50), pct(90), pct(99), sorted.back());

  HttpClient c(srv.url(), 30);
  // The last replies can reach the clients a moment before the engine's step frees their requests
  // and publishes the counts: wait (up to 5 s) for running / used tokens to settle, then check.
  auto m = fp4moe::testing::parse_prometheus(c.get("/metrics").body);
  for (int i = 0; i < 100 && (m["fp4moe:num_running_reqs"] != 0 || m["fp4moe:num_used_tokens"] != 0); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    m = fp4moe::testing::parse_prometheus(c.get("/metrics").body);
  }
  EXPECT_EQ(m["fp4moe:num_running_reqs"], 0);
  EXPECT_EQ(m["fp4moe:num_queue_reqs"], 0);
  EXPECT_EQ(m["fp4moe:num_used_tokens"], 0);
  EXPECT_EQ(m["fp4moe:num_finished_requests_total"], kRequests + 2 * static_cast<double>(cases.size()));
  EXPECT_LE(m["fp4moe:decode_batch_size_sum"] / std::max(1.0, m["fp4moe:decode_batch_size_count"]), 16.0);
  std::printf("load: mean decode batch %.2f over %.0f decode steps, %.0f preemptions\n",
              m["fp4moe:decode_batch_size_sum"] / std::max(1.0, m["fp4moe:decode_batch_size_count"]),
              m["fp4moe:decode_batch_size_count"], m["fp4moe:num_preemptions_total"]);
  EXPECT_EQ(srv.stop(SIGTERM, 30), 0);
}

}  // namespace
