// model::ModelConfig parsing: the golden configs of both families, derived fields
// (mlp_layer_types, indexer_types, rotary dim), defaults, and errors that name the field.
//   ctest --test-dir build -R ModelConfig
#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <fstream>
#include <tuple>

#include "core/error.h"
#include "model/config.h"
#include "testing/testing.h"

namespace fp4moe::model {
namespace {

nlohmann::json read_json(const std::filesystem::path& p) {
  std::ifstream in(p);
  return nlohmann::json::parse(in);
}

std::string error_of(const nlohmann::json& j) {
  try {
    parse_model_config(j, "test.json");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(ModelConfig, Glm4MoeTiny) {
  const ModelConfig c = load_model_config(fp4moe::testing::shared_path("golden/models/glm4_moe_tiny"));
  EXPECT_EQ(c.architecture, kArchGlm4Moe);
  EXPECT_EQ(c.hidden_size, 128);
  EXPECT_EQ(c.num_attention_heads, 4);
  EXPECT_EQ(c.num_key_value_heads, 2);
  EXPECT_EQ(c.head_dim, 32);
  EXPECT_EQ(c.rotary_dim(), 16);
  EXPECT_FLOAT_EQ(c.rope_theta, 10000.0f);
  EXPECT_TRUE(c.attention_bias);
  EXPECT_FALSE(c.use_qk_norm);
  EXPECT_FALSE(c.rope_interleave);
  EXPECT_EQ(c.n_routed_experts, 16);
  EXPECT_EQ(c.num_experts_per_tok, 4);
  EXPECT_EQ(c.n_shared_experts, 1);
  EXPECT_FLOAT_EQ(c.routed_scaling_factor, 2.5f);
  EXPECT_EQ(c.mlp_layer_types, (std::vector<std::string>{"dense", "sparse", "sparse"}));
  EXPECT_FALSE(c.is_moe_layer(0));
  EXPECT_TRUE(c.is_moe_layer(2));
  EXPECT_THROW(c.is_moe_layer(3), Error);
  EXPECT_TRUE(c.eos_token_ids.empty());
  EXPECT_FALSE(c.quantization.present);
  EXPECT_NE(c.summary().find("3 layers (1 dense, 2 MoE)"), std::string::npos) << c.summary();
}

TEST(ModelConfig, Glm4MoeTinyNvfp4HasQuantization) {
  const ModelConfig c = load_model_config(fp4moe::testing::shared_path("golden/models/glm4_moe_tiny_nvfp4"));
  EXPECT_TRUE(c.quantization.present);
  EXPECT_EQ(c.quantization.quant_algo, "NVFP4");
  EXPECT_TRUE(c.quantization.is_excluded("lm_head"));
  EXPECT_TRUE(c.quantization.is_excluded("model.layers.1.mlp.gate"));
  EXPECT_FALSE(c.quantization.is_excluded("model.layers.1.mlp.experts.3.up_proj"));
}

TEST(ModelConfig, Glm5Tiny) {
  const ModelConfig c = load_model_config(fp4moe::testing::shared_path("golden/models/glm5_tiny"));
  EXPECT_EQ(c.architecture, kArchGlmMoeDsa);
  EXPECT_EQ(c.q_lora_rank, 64);
  EXPECT_EQ(c.kv_lora_rank, 32);
  EXPECT_EQ(c.qk_nope_head_dim, 32);
  EXPECT_EQ(c.qk_rope_head_dim, 16);
  EXPECT_EQ(c.qk_head_dim, 48);
  EXPECT_EQ(c.v_head_dim, 32);
  EXPECT_EQ(c.index_topk, 8);
  EXPECT_EQ(c.index_n_heads, 8);
  EXPECT_EQ(c.index_head_dim, 32);
  EXPECT_TRUE(c.rope_interleave);
  EXPECT_TRUE(c.indexer_rope_interleave);
  EXPECT_EQ(c.indexer_types, (std::vector<std::string>{"full", "full", "full"}));
  EXPECT_EQ(c.eos_token_ids, (std::vector<int64_t>{1}));
  EXPECT_EQ(c.bos_token_id, 0);
}

TEST(ModelConfig, DerivedIndexerTypesFollowHf) {
  nlohmann::json j = read_json(fp4moe::testing::shared_path("golden/models/glm5_tiny/config.json"));
  j.erase("indexer_types");
  j["num_hidden_layers"] = 6;
  j["mlp_layer_types"] = {"dense", "sparse", "sparse", "sparse", "sparse", "sparse"};
  j["index_topk_freq"] = 2;
  j["index_skip_topk_offset"] = 2;
  // full iff max(i - 2 + 1, 0) % 2 == 0: i = 0 (0), 1 (0), 3 (2), 5 (4).
  EXPECT_EQ(parse_model_config(j, "t").indexer_types,
            (std::vector<std::string>{"full", "full", "shared", "full", "shared", "full"}));
  j["index_topk_pattern"] = "FSSFFS";
  EXPECT_EQ(parse_model_config(j, "t").indexer_types,
            (std::vector<std::string>{"full", "shared", "shared", "full", "full", "shared"}));
  j["index_topk_pattern"] = "FSX";
  EXPECT_NE(error_of(j).find("index_topk_pattern has 3 letters"), std::string::npos) << error_of(j);
}

// The MoE layers' config comes from the one parse: the same as the MoE library's own reading of the file, with the
// group fill by architecture; the router's rules and scoring_func are checked at parse time, naming the file.
TEST(ModelConfig, MoeConfigFromTheOneParse) {
  for (const char* model : {"glm4_moe_tiny", "glm5_tiny"}) {
    const nlohmann::json raw =
        read_json(fp4moe::testing::shared_path(std::string("golden/models/") + model + "/config.json"));
    const moe::MoeConfig got = parse_model_config(raw, model).moe_config();
    const moe::MoeConfig want = moe::moe_config_from_hf(raw);
    EXPECT_EQ(got.to_string(), want.to_string()) << model;
    EXPECT_EQ(got.correction_bias, want.correction_bias) << model;
    EXPECT_EQ(got.shared_intermediate(), want.shared_intermediate()) << model;
  }
  const nlohmann::json base = read_json(fp4moe::testing::shared_path("golden/models/glm5_tiny/config.json"));
  EXPECT_TRUE(std::isinf(parse_model_config(base, "t").moe_config().masked_fill_value));
  nlohmann::json j = base;
  j["scoring_func"] = "softmax";
  EXPECT_NE(error_of(j).find("test.json: scoring_func 'softmax' is not supported (sigmoid only"), std::string::npos)
      << error_of(j);
  j = base;
  j["num_experts_per_tok"] = j["n_routed_experts"];
  j["n_group"] = 2;
  j["topk_group"] = 1;  // top_k past the experts of the one chosen group
  EXPECT_NE(error_of(j).find("test.json: "), std::string::npos) << error_of(j);
  EXPECT_NE(error_of(j).find("exceeds the experts of the chosen groups"), std::string::npos) << error_of(j);
  j = base;
  j["routed_scaling_factor"] = 0;  // accepted before: it zeroed the routed experts
  EXPECT_NE(error_of(j).find("routed_scaling_factor=0 must be finite and > 0"), std::string::npos) << error_of(j);
  // GLM-5's forward needs (checked at parse time now, so that inspect reports them): the indexer and rope_type.
  j = base;
  j["index_topk"] = 0;
  EXPECT_NE(error_of(j).find("test.json: bad indexer dims index_topk=0"), std::string::npos) << error_of(j);
  j = base;
  j["rope_parameters"]["rope_type"] = "yarn";
  EXPECT_NE(error_of(j).find("rope_type \"yarn\" is not implemented"), std::string::npos) << error_of(j);
  j = base;
  j.erase("n_shared_experts");  // transformers' default: one shared expert
  EXPECT_EQ(parse_model_config(j, "t").moe_config().n_shared_experts, 1);
}

TEST(ModelConfig, ErrorsNameTheField) {
  const nlohmann::json base = read_json(fp4moe::testing::shared_path("golden/models/glm4_moe_tiny/config.json"));
  nlohmann::json j = base;
  j["architectures"] = {"LlamaForCausalLM"};
  EXPECT_NE(error_of(j).find("architecture \"LlamaForCausalLM\" is not supported"), std::string::npos) << error_of(j);
  EXPECT_NE(error_of(j).find("Glm4MoeForCausalLM"), std::string::npos);
  j = base;
  j.erase("hidden_size");
  EXPECT_NE(error_of(j).find("required field \"hidden_size\" is missing"), std::string::npos) << error_of(j);
  j = base;
  j["num_key_value_heads"] = "two";
  EXPECT_NE(error_of(j).find("\"num_key_value_heads\" must be an integer"), std::string::npos) << error_of(j);
  j = base;
  j["num_key_value_heads"] = 3;
  EXPECT_NE(error_of(j).find("num_attention_heads=4 is not a multiple of num_key_value_heads=3"), std::string::npos)
      << error_of(j);
  j = base;
  j["mlp_layer_types"] = {"dense", "sparse"};
  EXPECT_NE(error_of(j).find("mlp_layer_types has 2 entries, num_hidden_layers=3"), std::string::npos) << error_of(j);
  j = base;
  j["hidden_act"] = "gelu";
  EXPECT_NE(error_of(j).find("hidden_act=\"gelu\""), std::string::npos) << error_of(j);
  // Values that load and fail far away (or never): refused naming the field.
  for (const auto& [key, value, want] :
       {std::tuple<const char*, nlohmann::json, const char*>{"rms_norm_eps", -1, "rms_norm_eps=-1 must be a positive"},
        {"rms_norm_eps", 0, "rms_norm_eps=0 must be a positive"},
        {"max_position_embeddings", 0, "max_position_embeddings=0 must be >= 1"},
        {"first_k_dense_replace", -1, "first_k_dense_replace=-1 must be >= 0"},
        {"eos_token_id", 99999, "eos_token_id 99999 is outside the vocabulary [0, 512)"},
        {"eos_token_id", nlohmann::json::array({1, -1}), "eos_token_id -1 is outside the vocabulary [0, 512)"}}) {
    j = base;
    j[key] = value;
    EXPECT_NE(error_of(j).find(want), std::string::npos) << key << ": " << error_of(j);
  }
  j = base;
  j.erase("first_k_dense_replace");  // HF default 0 -> every layer MoE
  EXPECT_EQ(parse_model_config(j, "t").mlp_layer_types, (std::vector<std::string>{"sparse", "sparse", "sparse"}));
  j = base;
  j.erase("rope_parameters");
  j["rope_theta"] = 5e5;  // legacy top-level form
  EXPECT_FLOAT_EQ(parse_model_config(j, "t").rope_theta, 5e5f);
  EXPECT_FLOAT_EQ(parse_model_config(j, "t").partial_rotary_factor, 0.5f);
}

std::string error_with_no_write(const std::filesystem::path& dir) {
  try {
    load_model_config(dir);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// generation_config.json: its eos ids join config.json's (SGLang and vLLM stop at both), its sampling values are
// kept as given (null = absent), and a malformed file or field is refused naming the file.
TEST(ModelConfig, GenerationConfig) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("fp4moe_generation_config_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  std::filesystem::copy_file(fp4moe::testing::shared_path("golden/models/glm5_tiny/config.json"), dir / "config.json",
                             std::filesystem::copy_options::overwrite_existing);
  auto with = [&](const std::string& text) {
    std::ofstream(dir / "generation_config.json") << text;
    return load_model_config(dir);
  };
  auto error_with = [&](const std::string& text) -> std::string {
    try {
      with(text);
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  const ModelConfig c = with(R"({"eos_token_id": [3, 1], "temperature": 0.6, "top_p": 0.95, "top_k": null})");
  EXPECT_EQ(c.eos_token_ids, (std::vector<int64_t>{1, 3}));  // config.json's 1, then the new 3
  EXPECT_EQ(c.generation.eos_token_ids, (std::vector<int64_t>{3, 1}));
  EXPECT_EQ(c.generation.source, (dir / "generation_config.json").string());
  EXPECT_EQ(c.generation.temperature, 0.6);
  EXPECT_EQ(c.generation.top_p, 0.95);
  EXPECT_FALSE(c.generation.top_k.has_value());
  EXPECT_FALSE(c.generation.min_p.has_value());
  EXPECT_TRUE(c.generation.has_sampling());
  EXPECT_EQ(c.generation.sampling_summary(), "temperature 0.6, top_p 0.95");
  EXPECT_EQ(with(R"({"eos_token_id": 7, "top_k": 20, "repetition_penalty": 1.05})").eos_token_ids,
            (std::vector<int64_t>{1, 7}));
  EXPECT_FALSE(with(R"({"use_cache": true})").generation.has_sampling());

  const std::string file = (dir / "generation_config.json").string();
  // A sampling field of the wrong type is kept as a problem (only serve --sampling-defaults model reads these);
  // the eos ids still count.
  const ModelConfig typed = with(R"({"eos_token_id": 7, "temperature": "hot", "top_k": 1.5, "top_p": 0.9})");
  EXPECT_EQ(typed.eos_token_ids, (std::vector<int64_t>{1, 7}));
  EXPECT_EQ(typed.generation.top_p, 0.9);
  EXPECT_FALSE(typed.generation.temperature.has_value());
  EXPECT_EQ(typed.generation.problems,
            (std::vector<std::string>{file + ": field \"temperature\" must be a number, found \"hot\"",
                                      file + ": field \"top_k\" must be an integer, found 1.5"}));
  for (const auto& [text, want] :
       {std::pair<std::string, std::string>{R"({"eos_token_id": 512})",
                                            "eos_token_id 512 is outside the vocabulary [0, 512)"},
        {R"({"eos_token_id": ["a"]})", "eos_token_id lists a non-integer"},
        {R"([1, 2])", "must be a JSON object"},
        {R"({"temperature": 0.6)", "malformed JSON"}}) {
    const std::string e = error_with(text);
    EXPECT_NE(e.find(file + ": " + want), std::string::npos) << text << " -> " << e;
  }
  // A dangling link is an error, as for config.json (a half-fetched Hugging Face snapshot), not a missing file.
  std::filesystem::remove(dir / "generation_config.json");
  std::filesystem::create_symlink(dir / "nowhere.json", dir / "generation_config.json");
  EXPECT_NE(error_with_no_write(dir).find("cannot open " + file), std::string::npos) << error_with_no_write(dir);
  std::filesystem::remove(dir / "generation_config.json");
  const ModelConfig none = load_model_config(dir);
  EXPECT_TRUE(none.generation.source.empty());
  EXPECT_EQ(none.eos_token_ids, (std::vector<int64_t>{1}));
  // config.json that is a directory is named as one (it was libstdc++'s "basic_filebuf::underflow error").
  std::filesystem::remove(dir / "config.json");
  std::filesystem::create_directory(dir / "config.json");
  try {
    load_model_config(dir);
    ADD_FAILURE() << "a config.json directory loaded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find((dir / "config.json").string() + " is a directory, not a file"),
              std::string::npos)
        << e.what();
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace fp4moe::model
