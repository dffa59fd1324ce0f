// Structured outputs on the GPU model: constrained requests (a regex, a JSON schema) through the engine
// with golden glm4_moe_tiny_nvfp4 on the GPU and the golden tokenizer, greedy and sampled, batched with
// an unconstrained request the GPU samples itself: the constrained ones copy their logits to the host
// (SamplingParams::needs_logits) and their replies match; the other is unaffected.
// Run: test_gpu_constrained (label gpu; skips with the reason where no GPU is visible).
#include <gtest/gtest.h>

#include <map>
#include <string>

#include <nlohmann/json.hpp>

#include "engine/constraint.h"
#include "engine/engine.h"
#include "kernels/cuda_test_util.h"
#include "model/cuda/gpu_models.h"
#include "model/registry.h"
#include "testing/testing.h"

namespace fp4moe::engine {
namespace {

struct Reply {
  std::string text;
  std::optional<Finish> finish;
};

TEST(GpuConstrained, RepliesMatchAlongsideDeviceSampledRequests) {
  const auto dir = testing::shared_path("golden/models/glm4_moe_tiny_nvfp4");
  auto tok = std::make_shared<const Tokenizer>(Tokenizer::load(testing::shared_path("golden/tokenizer")));
  SKIP_WITHOUT_GPU();
  model::register_gpu_models();
  model::LoadOptions lo;
  lo.progress = false;
  lo.device = model::Device::kCuda;
  lo.gpu.max_tokens_per_step = 256;
  lo.gpu.kv_tokens = 4096;
  lo.gpu.page_size = 16;
  Engine e(EngineOptions{}, model::load_model(dir, lo), tok);
  ConstraintCompiler compiler(*tok, {});
  const std::string pattern = "(alpha|beta|gamma) [0-9]{1,3};";
  auto regex = compiler.compile({ConstraintSpec::Kind::kRegex, "regex", pattern, {}});
  auto schema = compiler.compile(
      {ConstraintSpec::Kind::kJsonSchema,
       "json_schema",
       R"({"type":"object","properties":{"ok":{"type":"boolean"},"n":{"type":"integer","minimum":0,"maximum":99}},"required":["ok","n"]})",
       {}});
  std::map<RequestId, Reply> replies;
  std::map<RequestId, std::string> kind;
  auto submit = [&](SamplingParams sp, const std::string& what) {
    // Ids below the model's vocabulary (512 of the tokenizer's 4,096, all 256 single-byte tokens among them).
    SubmitResult r = e.submit({{68, 69, 70, 32, 77}, sp}, [&](const RequestOutput& out) {
      replies[out.id].text += out.text;
      if (out.finished) replies[out.id].finish = out.finished;
    });
    ASSERT_TRUE(r.ok()) << (r.rejection ? r.rejection->message : "");
    kind[r.id] = what;
  };
  for (double t : {0.0, 1.0}) {
    SamplingParams sp;
    sp.temperature = t;
    sp.seed = 3;
    sp.max_new_tokens = 60;
    sp.constraint = regex;
    submit(sp, "regex");
    sp.constraint = schema;
    submit(sp, "schema");
  }
  SamplingParams free_run;
  free_run.temperature = 1.0;
  free_run.seed = 5;
  free_run.max_new_tokens = 20;
  free_run.ignore_eos = true;
  submit(free_run, "free");
  e.run_until_idle();
  const ByteDfa dfa = compile_regex(pattern);
  for (const auto& [id, r] : replies) {
    ASSERT_TRUE(r.finish) << id;
    SCOPED_TRACE(kind[id] + ": '" + r.text + "'");
    if (kind[id] == "free") {
      EXPECT_EQ(r.finish->reason, FinishReason::kLength);
      EXPECT_EQ(r.finish->usage.completion_tokens, 20);
      continue;
    }
    EXPECT_EQ(r.finish->reason, FinishReason::kStop);
    if (kind[id] == "regex") {
      EXPECT_TRUE(dfa.matches(r.text));
    } else {
      const auto j = nlohmann::json::parse(r.text, nullptr, false);
      ASSERT_TRUE(j.is_object());
      EXPECT_TRUE(j["ok"].is_boolean());
      EXPECT_TRUE(j["n"].is_number_integer() && j["n"].get<int>() >= 0 && j["n"].get<int>() <= 99);
    }
  }
}

}  // namespace
}  // namespace fp4moe::engine
