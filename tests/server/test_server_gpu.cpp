// `fp4moe serve --device cuda` end to end on the golden GLM-5 NVFP4 checkpoint (GPU; skipped with the reason
// without one): the KV cache sized from GPU memory (--mem-fraction-static, SGLang's option) is the capacity the
// engine schedules with and /get_server_info reports, capped by --max-total-tokens; a share the load already passed
// stops the server before /health answers 200, naming the numbers. A greedy request is served; one past the pool is a
// 400 naming the capacity. Run alone (RUN_SERIAL): other tests' processes would change the free memory while the
// model loads (1e-7 of it is a few KB: any load passes it unless memory is freed meanwhile).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "format/safetensors.h"
#include "kernels/cuda_test_util.h"
#include "server/http_client.h"
#include "server_process.h"
#include "testing/testing.h"

namespace {

using fp4moe::server::HttpClient;
using fp4moe::testing::ServerProcess;
using nlohmann::json;

TEST(ServerGpuE2E, KvCacheSizedFromMemoryFractionIsTheEnginesCapacity) {
  SKIP_WITHOUT_GPU();
  const std::string model = fp4moe::testing::shared_path("golden/models/glm5_tiny_nvfp4").string();
  const std::string tok = fp4moe::testing::shared_path("golden/tokenizer").string();
  fp4moe::format::SafetensorsFile g(fp4moe::testing::shared_path("golden/models/glm5_tiny_nvfp4/golden.safetensors"));
  const auto ids = g.view("greedy_ids").as<int64_t>();
  const int64_t N = g.view("greedy_ids").dim(1), S = g.view("input_ids").dim(1);
  const std::vector<int64_t> prompt(ids.begin(), ids.begin() + S);
  {
    // 0.999 of the free memory leaves room for the cap beside other tests' allocations; the cap, rounded down to
    // pages of 16, is the pool.
    ServerProcess srv(FP4MOE_CLI, {"--model", model, "--tokenizer-path", tok, "--device", "cuda",
                                   "--mem-fraction-static", "0.999", "--max-total-tokens", "2010"});
    ASSERT_TRUE(srv.wait_ready(300)) << srv.log();
    HttpClient c(srv.url(), 120);
    const json info = json::parse(c.get("/get_server_info").body);
    EXPECT_EQ(info["max_total_num_tokens"], 2000) << info.dump();
    EXPECT_EQ(info["mem_fraction_static"], 0.999) << info.dump();
    EXPECT_NE(srv.log().find("fp4moe serve: KV cache: 125 blocks x 16 tokens ("), std::string::npos) << srv.log();
    EXPECT_NE(srv.log().find("sized by --mem-fraction-static 0.999 ("), std::string::npos) << srv.log();
    EXPECT_NE(srv.log().find("KV 2000 tokens"), std::string::npos) << srv.log();
    const auto r = c.post(
        "/generate", json{{"input_ids", prompt},
                          {"sampling_params", {{"max_new_tokens", N - S}, {"temperature", 0}, {"ignore_eos", true}}}}
                         .dump());
    ASSERT_EQ(r.status, 200) << r.body;
    const json out = json::parse(r.body);
    EXPECT_EQ(out["meta_info"]["completion_tokens"], N - S) << r.body;
    const auto big =
        c.post("/generate",
               json{{"input_ids", std::vector<int64_t>(1995, 5)}, {"sampling_params", {{"max_new_tokens", 8}}}}.dump());
    EXPECT_EQ(big.status, 400) << big.body;  // 1995 + 8 tokens: past the pool's 2000
    EXPECT_NE(big.body.find("KV capacity 2000 tokens"), std::string::npos) << big.body;
    EXPECT_EQ(srv.stop(SIGTERM, 60), 0);
  }
  {
    ServerProcess srv(FP4MOE_CLI,
                      {"--model", model, "--tokenizer-path", tok, "--device", "cuda", "--mem-fraction-static", "1e-7"});
    std::vector<int> statuses;
    EXPECT_FALSE(srv.wait_ready(300, &statuses));
    for (int s : statuses) EXPECT_NE(s, 200);
    EXPECT_NE(srv.log().find("--mem-fraction-static 1e-07 leaves -"), std::string::npos) << srv.log();
    EXPECT_NE(srv.log().find("the load took"), std::string::npos) << srv.log();
  }
}

}  // namespace
