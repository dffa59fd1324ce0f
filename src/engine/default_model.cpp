// The embedded default model and byte-level tokenizer (see default_model.h).
// Tested by tests/engine/test_engine_models.cpp (DefaultModel.*).
#include "engine/default_model.h"


#include <filesystem>
#include <string>
#include <system_error>

#include "engine/tokenizer_text.h"
#include "format/safetensors.h"
#include "model/config.h"
#include "model/registry.h"

namespace fp4moe::engine {
namespace {

using json = nlohmann::json;

constexpr int kNumByteTokens = 256;
constexpr int kVocabSize = 272;  // 256 bytes + specials, padded to a multiple of 16

// GLM's special tokens after the 256 byte tokens (then <|reserved_i|> up to the vocabulary size); eos = <|endoftext|>, <|user|>, <|observation|>
// (as GLM-4/5's generation_config lists).
const char* const kSpecials[] = {"<|endoftext|>", "[MASK]", "[gMASK]", "[sMASK]", "<sop>", "<eop>",
                                 "<|system|>", "<|user|>", "<|assistant|>", "<|observation|>"};

}  // namespace

json default_model_config() {
  json c;
  c["architectures"] = {"GlmMoeDsaForCausalLM"};
  c["model_type"] = "glm_moe_dsa";
  c["vocab_size"] = kVocabSize;
  c["hidden_size"] = 256;
  c["num_hidden_layers"] = 3;
  c["num_attention_heads"] = 4;
  c["num_key_value_heads"] = 4;
  c["head_dim"] = 16;
  c["intermediate_size"] = 512;
  c["max_position_embeddings"] = 8192;
  c["rms_norm_eps"] = 1e-5;
  c["hidden_act"] = "silu";
  c["tie_word_embeddings"] = false;
  c["attention_bias"] = false;
  c["mlp_bias"] = false;
  c["bos_token_id"] = nullptr;
  c["pad_token_id"] = kNumByteTokens;
  c["eos_token_id"] = {kNumByteTokens + 0, kNumByteTokens + 7, kNumByteTokens + 9};
  c["rope_parameters"] = {{"rope_theta", 10000.0}, {"rope_type", "default"}};
  c["moe_intermediate_size"] = 128;
  c["n_routed_experts"] = 16;
  c["num_experts_per_tok"] = 4;
  c["n_shared_experts"] = 1;
  c["n_group"] = 1;
  c["topk_group"] = 1;
  c["norm_topk_prob"] = true;
  c["routed_scaling_factor"] = 2.5;
  c["first_k_dense_replace"] = 1;
  c["mlp_layer_types"] = {"dense", "sparse", "sparse"};
  c["q_lora_rank"] = 128;
  c["kv_lora_rank"] = 64;
  c["qk_nope_head_dim"] = 32;
  c["qk_rope_head_dim"] = 16;
  c["qk_head_dim"] = 48;
  c["v_head_dim"] = 32;
  c["index_topk"] = 64;
  c["index_head_dim"] = 32;
  c["index_n_heads"] = 4;
  c["indexer_types"] = {"full", "full", "full"};
  c["layer_types"] = {"deepseek_sparse_attention", "deepseek_sparse_attention", "deepseek_sparse_attention"};
  return c;
}

json default_tokenizer_json() {
  const text::ByteLevelMap& map = text::ByteLevelMap::get();
  json vocab = json::object();
  for (int b = 0; b < kNumByteTokens; ++b) vocab[map.encode_byte(static_cast<uint8_t>(b))] = b;
  json added = json::array();
  int id = kNumByteTokens;
  auto add = [&](const std::string& content) {
    added.push_back({{"id", id++}, {"content", content}, {"single_word", false}, {"lstrip", false},
                     {"rstrip", false}, {"normalized", false}, {"special", true}});
  };
  for (const char* s : kSpecials) add(s);
  // Every id the model can produce names a token: pad the specials to the vocabulary size.
  for (int i = 0; id < kVocabSize; ++i) add("<|reserved_" + std::to_string(i) + "|>");
  json t;
  t["version"] = "1.0";
  t["truncation"] = nullptr;
  t["padding"] = nullptr;
  t["added_tokens"] = added;
  t["normalizer"] = {{"type", "NFC"}};
  // No regex split: with no merges every byte is its own token whatever the pieces are.
  t["pre_tokenizer"] = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", false}};
  t["post_processor"] = nullptr;
  t["decoder"] = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", false}};
  t["model"] = {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", nullptr},
                {"continuing_subword_prefix", nullptr}, {"end_of_word_suffix", nullptr},
                {"fuse_unk", false}, {"byte_fallback", false}, {"ignore_merges", false},
                {"vocab", vocab}, {"merges", json::array()}};
  return t;
}

json default_tokenizer_config() {
  json c;
  c["tokenizer_class"] = "PreTrainedTokenizerFast";
  c["eos_token"] = "<|endoftext|>";
  c["pad_token"] = "<|endoftext|>";
  c["clean_up_tokenization_spaces"] = false;
  c["model_max_length"] = 8192;
  c["chat_template"] =
      "[gMASK]<sop>{% for m in messages %}{% if m['role'] == 'system' %}<|system|>\n{{ m['content'] }}"
      "{% elif m['role'] == 'user' %}<|user|>\n{{ m['content'] }}"
      "{% elif m['role'] == 'assistant' %}<|assistant|>\n{{ m['content'] }}{% endif %}{% endfor %}"
      "{% if add_generation_prompt %}<|assistant|>\n{% endif %}";
  return c;
}

std::unique_ptr<model::CausalLM> make_default_model(uint64_t seed) {
  model::ModelConfig config = model::parse_model_config(default_model_config(), "built-in default model");
  model::LoadOptions opts;
  opts.format = model::LoadFormat::kDummy;
  opts.dummy_weights = model::DummyWeights::kNVFP4;
  opts.seed = seed;
  opts.progress = false;
  return model::build_dummy_model(config, opts);
}

std::shared_ptr<const Tokenizer> make_default_tokenizer() {
  return std::make_shared<const Tokenizer>(
      Tokenizer::from_json(default_tokenizer_json(), default_tokenizer_config(), "built-in byte-level tokenizer"));
}

}  // namespace fp4moe::engine
