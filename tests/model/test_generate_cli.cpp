// `fp4moe generate` end to end (runs the built binary): greedy continuation and --dump-logits
// against the golden tiny GLM-4.5 models, sampling determinism and top-p, dummy loads, and
// errors for bad arguments.
//   ctest --test-dir build -R GenerateCli
#include <gtest/gtest.h>

#include <unistd.h>

#include <array>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "format/safetensors.h"
#include "testing/testing.h"

namespace {

namespace fs = std::filesystem;

struct Result {
  int rc = -1;
  std::string out;
};

Result run(const std::string& args) {
  Result r;
  r.rc = fp4moe::testing::run_command(std::string(FP4MOE_CLI) + " generate " + args, &r.out);
  return r;
}

nlohmann::json run_json(const std::string& args) {
  const Result r = run(args + " --json");
  EXPECT_EQ(r.rc, 0) << r.out;
  // The JSON object is the last line (stderr may carry other lines before it).
  const size_t start = r.out.rfind("\n{");
  return nlohmann::json::parse(start == std::string::npos ? r.out : r.out.substr(start + 1));
}

std::string csv(const std::vector<int64_t>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) {
    if (i > 0) s += ',';
    s += std::to_string(v[i]);
  }
  return s;
}

class GenerateCli : public ::testing::TestWithParam<std::string> {};

TEST_P(GenerateCli, GreedyAndDumpedLogitsMatchGolden) {
  const fs::path dir = fp4moe::testing::shared_path("golden/models/" + GetParam());
  fp4moe::format::SafetensorsFile g(dir / "golden.safetensors");
  const auto ids = g.view("greedy_ids").as<int64_t>();
  const auto ref = g.view("greedy_logits").as<float>();
  const int64_t n_seq = g.view("greedy_ids").dim(0), N = g.view("greedy_ids").dim(1);
  const int64_t S = g.view("input_ids").dim(1), V = g.view("greedy_logits").dim(2);
  std::string name = "fp4moe_test_generate_";
  name += std::to_string(getpid());
  name += ".safetensors";
  const fs::path dump = fs::temp_directory_path() / name;
  for (int64_t b = 0; b < n_seq; ++b) {
    const std::vector<int64_t> seq(ids.begin() + b * N, ids.begin() + (b + 1) * N);
    const std::vector<int64_t> prompt(seq.begin(), seq.begin() + S);
    const nlohmann::json j = run_json("--model " + dir.string() + " --prompt-ids " + csv(prompt) + " --max-new-tokens " +
                                      std::to_string(N - S) + " --greedy --dump-logits " + dump.string());
    EXPECT_EQ(j["generated_ids"].get<std::vector<int64_t>>(), std::vector<int64_t>(seq.begin() + S, seq.end()))
        << GetParam() << " sequence " << b;
    EXPECT_EQ(j["stop_reason"], "length");
    fp4moe::format::SafetensorsFile d(dump);
    const auto logits = d.view("logits");
    ASSERT_EQ(logits.shape, (fp4moe::Shape{N - 1, V}));  // every prompt position and decode step
    EXPECT_EQ(std::vector<int64_t>(d.view("token_ids").as<int64_t>().begin(), d.view("token_ids").as<int64_t>().end()),
              seq);
    float mx = 0, diff = 0;
    for (int64_t i = 0; i < (N - 1) * V; ++i) {
      mx = std::max(mx, std::fabs(ref[b * N * V + i]));
      diff = std::max(diff, std::fabs(ref[b * N * V + i] - logits.as<float>()[i]));
    }
    EXPECT_LE(diff, 2e-3f * mx) << GetParam() << " sequence " << b;
  }
  fs::remove(dump);
}

INSTANTIATE_TEST_SUITE_P(Models, GenerateCli, ::testing::Values("glm4_moe_tiny", "glm4_moe_tiny_nvfp4"));

TEST(GenerateCliSampling, SeededSamplingIsReproducibleAndTinyTopPIsGreedy) {
  const std::string model = "--model " + fp4moe::testing::shared_path("golden/models/glm4_moe_tiny").string() +
                            " --prompt-ids 7,8,9,10 --max-new-tokens 12";
  const auto greedy = run_json(model)["generated_ids"];
  const auto s1 = run_json(model + " --temperature 1.5 --top-p 0.95 --seed 11")["generated_ids"];
  const auto s2 = run_json(model + " --temperature 1.5 --top-p 0.95 --seed 11")["generated_ids"];
  EXPECT_EQ(s1, s2);
  // Twelve tokens at temperature 1.5 from a 512-token vocabulary: some differ from greedy.
  EXPECT_NE(s1, greedy);
  // top-p so small that only the most likely token survives: sampling becomes greedy.
  EXPECT_EQ(run_json(model + " --temperature 1.0 --top-p 1e-9 --seed 5")["generated_ids"], greedy);
  EXPECT_EQ(run_json(model + " --temperature 0")["generated_ids"], greedy);
}

TEST(GenerateCliSampling, DummyLoadIsDeterministic) {
  const std::string model = "--model " + fp4moe::testing::shared_path("golden/models/glm4_moe_tiny").string() +
                            " --prompt-ids 1,2,3 --max-new-tokens 6 --load-format dummy";
  const auto a = run_json(model + " --dummy-seed 3 --dummy-weights nvfp4")["generated_ids"];
  EXPECT_EQ(run_json(model + " --dummy-seed 3 --dummy-weights nvfp4")["generated_ids"], a);
  EXPECT_EQ(a.size(), 6u);
}

// A model directory with the golden tokenizer (4,096 tokens) and dummy weights for a config with
// that vocabulary: --prompt text is tokenized and the generated ids are decoded to text.
TEST(GenerateCliSampling, PromptTextAndDecodedTextWithTokenizer) {
  const fs::path dir = fs::temp_directory_path() / ("fp4moe_test_generate_tok_" + std::to_string(getpid()));
  fs::create_directories(dir);
  nlohmann::json cfg;
  {
    std::ifstream in(fp4moe::testing::shared_path("golden/models/glm4_moe_tiny/config.json"));
    cfg = nlohmann::json::parse(in);
  }
  cfg["vocab_size"] = 4096;
  std::ofstream(dir / "config.json") << cfg.dump();
  for (const char* f : {"tokenizer.json", "tokenizer_config.json"}) {
    fs::copy_file(fp4moe::testing::shared_path(std::string("golden/tokenizer/") + f), dir / f);
  }
  const nlohmann::json j = run_json("--model " + dir.string() +
                                    " --prompt \"def main():\" --max-new-tokens 5 --load-format dummy");
  EXPECT_EQ(j["prompt_ids"].size() > 0, true);
  EXPECT_EQ(j["generated_ids"].size(), 5u);
  ASSERT_TRUE(j.contains("text")) << j.dump();
  EXPECT_TRUE(j["text"].is_string());
  // Plain output prints the ids and the text line.
  const Result r = run("--model " + dir.string() + " --prompt-ids 10,20,30 --max-new-tokens 3 --load-format dummy");
  EXPECT_EQ(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find("generated ids: "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("text: "), std::string::npos) << r.out;
  fs::remove_all(dir);
}

TEST(GenerateCliSampling, BadArgumentsAreReported) {
  const std::string model = "--model " + fp4moe::testing::shared_path("golden/models/glm4_moe_tiny").string();
  Result r = run(model + " --prompt-ids 1,x");
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.out.find("--prompt-ids entry \"x\""), std::string::npos) << r.out;
  r = run(model + " --prompt-ids 1,512");
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.out.find("prompt token 512 at position 1 is outside the vocabulary [0, 512)"), std::string::npos) << r.out;
  r = run(model + " --prompt-ids 1 --greedy --temperature 0.5");
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.out.find("--greedy and --temperature exclude each other"), std::string::npos) << r.out;
  // The sampling flags as the server checks them, named as flags, before the model loads (nan was "must be >= 0";
  // 150 and the others named SamplingParams' fields).
  for (const auto& [flags, message] : std::vector<std::pair<std::string, std::string>>{
           {"--temperature nan", "--temperature nan must be in [0, 100] (0 = greedy)"},
           {"--temperature 150", "--temperature 150 must be in [0, 100]"},
           {"--temperature 0.5 --top-k -5", "--top-k -5 must be -1 (off), 0 (off) or in [1, 2^31)"},
           {"--temperature 0.5 --min-p 2", "--min-p 2 must be in [0, 1]"},
           {"--top-p 0", "--top-p 0 must be in (0, 1]"},
           // Sampling flags on a greedy run were taken and ignored.
           {"--top-k 50 --top-p 0.9",
            "--top-k 50 shapes sampling, which needs --temperature > 0 (without it the run "
            "is greedy and would ignore it)"},
           {"--temperature 0 --min-p 0.1",
            "--min-p 0.1 shapes sampling, which needs --temperature > 0 (--temperature "
            "0 is greedy and would ignore it)"},
           {"--greedy --top-p 0.5", "--top-p 0.5 shapes sampling"}}) {
    r = run(model + " --prompt-ids 1 " + flags);
    EXPECT_EQ(r.rc, 1) << flags;
    EXPECT_NE(r.out.find(message), std::string::npos) << flags << ": " << r.out;
  }
  r = run(model + " --prompt-ids 1 --load-format fast");
  EXPECT_EQ(r.rc, 2);  // a value outside the option's set: a usage error
  EXPECT_NE(r.out.find("--load-format: load format \"fast\" is not one of: auto, dummy"), std::string::npos) << r.out;
  r = run(model + " --prompt hello");
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.out.find("tokenizer.json"), std::string::npos) << r.out;
  // Past the model's positions: refused, as bench-one-batch and serve refuse it (it generated on).
  r = run(model + " --prompt-ids 1,2,3 --max-new-tokens 5000 --ignore-eos");
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.out.find("the prompt's 3 tokens + --max-new-tokens 5000 = 5003 exceed the model's "
                       "max_position_embeddings 4096"),
            std::string::npos)
      << r.out;
  // A seed out of [0, 2^64) is a usage error (CLI11 read -1 as 2^64 - 1 and saturated 2^64: one run for three seeds).
  for (const char* seed : {"-1", "18446744073709551616", "1.5"}) {
    r = run(model + " --prompt-ids 1 --seed " + seed);
    EXPECT_EQ(r.rc, 2) << seed;
    EXPECT_NE(r.out.find("'" + std::string(seed) + "' is not an integer in [0, 2^64)"), std::string::npos) << r.out;
  }
  // An empty option value is a usage error (it meant no dump); --dump-logits is checked before the run: a device
  // or one of the model's own files would be replaced by the rename (both were, with rc 0).
  r = run(model + " --prompt-ids 1 --dump-logits ''");
  EXPECT_EQ(r.rc, 2);
  EXPECT_NE(r.out.find("--dump-logits: is empty"), std::string::npos) << r.out;
  r = run(model + " --prompt-ids 1 --dump-logits /dev/null");
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.out.find("--dump-logits /dev/null: /dev/null exists and is not a regular file"), std::string::npos)
      << r.out;
  const fs::path copy = fs::temp_directory_path() / ("fp4moe_generate_own_file_" + std::to_string(getpid()));
  fs::remove_all(copy);
  fs::copy(fp4moe::testing::shared_path("golden/models/glm4_moe_tiny"), copy, fs::copy_options::recursive);
  for (const char* own : {"model.safetensors", "config.json"}) {
    r = run("--model " + copy.string() + " --prompt-ids 1 --dump-logits " + (copy / own).string());
    EXPECT_EQ(r.rc, 1) << own;
    EXPECT_NE(r.out.find(" is a file the model in " + copy.string() + " is read from"), std::string::npos) << r.out;
  }
  EXPECT_TRUE(fp4moe::format::SafetensorsFile(copy / "model.safetensors").find("model.norm.weight") != nullptr);
  // A dump beside the model (not read by it) may be written again.
  for (int i = 0; i < 2; ++i) {
    r = run("--model " + copy.string() + " --prompt-ids 1 --dump-logits " + (copy / "logits.safetensors").string());
    EXPECT_EQ(r.rc, 0) << r.out;
  }
  fs::remove_all(copy);
}

}  // namespace
