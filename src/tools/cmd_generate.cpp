// `fp4moe generate`: loads a model on the CPU (checkpoint, or --load-format dummy), prefills the
// prompt ids (or the --prompt text, tokenized with the directory's tokenizer.json) and decodes
// token by token through the KV cache, greedy or sampled with engine::Sampler (temperature, top-k,
// top-p, min-p; the serving engine's sampler).
//
//   fp4moe generate --model DIR --prompt-ids 1,2,3 [--max-new-tokens N]
//       [--greedy | --temperature T --top-k K --top-p P --min-p M --seed S] [--dump-logits FILE.safetensors] [--json]
//       [--load-format auto|dummy] [--dummy-weights bf16|nvfp4] [--dummy-seed S] [--ignore-eos]
//
// Prints the generated ids (and their text when DIR has tokenizer.json). --dump-logits writes
// `logits` F32 [positions, vocab] (row i = the logits at position i, i.e. predicting token i + 1,
// for every prompt position and every decode step) and `token_ids` I64 [prompt + generated].
// Tested by tests/model/test_generate_cli.cpp (runs the binary on the golden tiny models).
#include <CLI/CLI.hpp>
#include <fmt/core.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/file.h"
#include "engine/sampler.h"
#include "engine/tokenizer.h"
#include "format/safetensors.h"
#include "model/ops.h"
#include "model/registry.h"
#include "tools/cli_options.h"
#include "tools/commands.h"
#include "tools/device_option.h"

namespace fp4moe::tools {
namespace {

struct GenerateArgs {
  std::string model_dir;
  std::string prompt_ids;
  std::string prompt_text;
  int64_t max_new_tokens = 16;
  bool greedy = false;
  std::optional<double> temperature;
  int64_t top_k = -1;
  double top_p = 1.0;
  double min_p = 0.0;
  uint64_t seed = 0;
  std::string dump_logits;
  bool json = false;
  bool ignore_eos = false;
  std::string load_format = "auto";
  std::string dummy_weights = "bf16";
  uint64_t dummy_seed = 0;
  DeviceArgs device;
};

std::vector<int32_t> parse_ids(const std::string& s) {
  std::vector<int32_t> ids;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    const auto b = item.find_first_not_of(" \t");
    const auto e = item.find_last_not_of(" \t");
    FP4MOE_CHECK(b != std::string::npos) << "--prompt-ids \"" << s << "\" has an empty entry";
    const std::string t = item.substr(b, e - b + 1);
    size_t used = 0;
    long long v = 0;
    try {
      v = std::stoll(t, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    FP4MOE_CHECK(used == t.size() && v >= 0 && v <= INT32_MAX)
        << "--prompt-ids entry \"" << t << "\" is not a token id (a non-negative integer)";
    ids.push_back(static_cast<int32_t>(v));
  }
  FP4MOE_CHECK(!ids.empty()) << "--prompt-ids is empty";
  return ids;
}

std::string join_ids(const std::vector<int32_t>& ids) {
  std::string s;
  for (size_t i = 0; i < ids.size(); ++i) s += (i ? "," : "") + std::to_string(ids[i]);
  return s;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// A --dump-logits path that is a file the model is read from (its JSON files, its safetensors): the dump would
// replace it (an earlier dump beside the model, or golden.safetensors, may be replaced).
void refuse_model_file(const std::filesystem::path& dump, const std::filesystem::path& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return;  // a preset: no files
  const fs::path out = fs::weakly_canonical(dump, ec);
  if (!fs::exists(out, ec) || out.parent_path() != fs::weakly_canonical(dir, ec)) return;
  bool read = out.extension() == ".json" || out.extension() == ".jinja";
  if (!read && out.extension() == ".safetensors") {
    const format::TensorStore store(dir);
    for (const auto& f : store.files()) read = read || fs::equivalent(f->path(), out, ec);
  }
  FP4MOE_CHECK(!read) << "--dump-logits " << dump.string() << " is a file the model in " << dir.string()
                      << " is read from; the dump would replace it";
}

void run_generate(const GenerateArgs& a) {
  FP4MOE_CHECK(a.prompt_ids.empty() != a.prompt_text.empty()) << "give exactly one of --prompt-ids and --prompt";
  // Bounded before any sum with it (the prompt + it wrapped past INT64_MAX and skipped the position check).
  FP4MOE_CHECK(a.max_new_tokens >= 1 && a.max_new_tokens <= INT32_MAX)
      << "--max-new-tokens " << a.max_new_tokens << " must be in [1, " << INT32_MAX << "]";
  FP4MOE_CHECK(!(a.greedy && a.temperature)) << "--greedy and --temperature exclude each other";
  const bool greedy = !a.temperature || *a.temperature == 0.0;
  engine::SamplingParams sp;
  sp.temperature = greedy ? 0.0 : *a.temperature;
  sp.top_k = a.top_k;
  sp.top_p = a.top_p;
  sp.min_p = a.min_p;
  sp.max_new_tokens = a.max_new_tokens;
  check_sampling_flags(sp);  // as the server checks them, before the model loads
  if (greedy) {              // they were taken and ignored: the run was greedy
    const std::string ignored = a.top_k > 0      ? fmt::format("--top-k {}", a.top_k)
                                : a.top_p != 1.0 ? fmt::format("--top-p {}", a.top_p)
                                : a.min_p != 0.0 ? fmt::format("--min-p {}", a.min_p)
                                                 : std::string();
    FP4MOE_CHECK(ignored.empty()) << ignored << " shapes sampling, which needs --temperature > 0 ("
                                  << (a.temperature ? "--temperature 0 is" : "without it the run is")
                                  << " greedy and would ignore it)";
  }
  const std::filesystem::path dir = a.model_dir;
  if (!a.dump_logits.empty()) {
    // Before the run: a path that cannot be written, or one of the model's own files (it would be replaced).
    check_writable_file(a.dump_logits, "--dump-logits", /*create_parents=*/false, /*via_rename=*/true);
    refuse_model_file(a.dump_logits, dir);
  }

  std::optional<engine::Tokenizer> tokenizer;
  if (std::filesystem::exists(dir / "tokenizer.json")) tokenizer = engine::Tokenizer::load(dir);
  std::vector<int32_t> prompt;
  if (!a.prompt_text.empty()) {
    FP4MOE_CHECK(tokenizer.has_value()) << "--prompt needs a tokenizer, and " << (dir / "tokenizer.json").string()
                                        << " does not exist (give --prompt-ids instead)";
    prompt = tokenizer->encode(a.prompt_text);
    FP4MOE_CHECK(!prompt.empty()) << "--prompt \"" << a.prompt_text << "\" tokenizes to no tokens";
  } else {
    prompt = parse_ids(a.prompt_ids);
  }

  model::LoadOptions opts;
  opts.format = model::parse_load_format(a.load_format);
  opts.dummy_weights = model::parse_dummy_weights(a.dummy_weights);
  opts.seed = a.dummy_seed;
  const auto n_prompt = static_cast<int64_t>(prompt.size());
  apply_device_option(a.device, n_prompt, n_prompt + a.max_new_tokens, 16, opts);
  const auto t_load = std::chrono::steady_clock::now();
  std::unique_ptr<model::CausalLM> lm = model::load_model(dir, opts);
  const double load_s = seconds_since(t_load);
  const model::ModelConfig& cfg = lm->config();
  const int64_t V = cfg.vocab_size;
  for (size_t i = 0; i < prompt.size(); ++i) {
    FP4MOE_CHECK(prompt[i] < V) << "prompt token " << prompt[i] << " at position " << i
                                << " is outside the vocabulary [0, " << V << ")";
  }
  // As bench-one-batch and serve: positions past the model's trained range are refused, not run.
  const int64_t n_positions = static_cast<int64_t>(prompt.size()) + a.max_new_tokens;
  FP4MOE_CHECK(n_positions <= cfg.max_position_embeddings)
      << "the prompt's " << prompt.size() << " tokens + --max-new-tokens " << a.max_new_tokens << " = " << n_positions
      << " exceed the model's max_position_embeddings " << cfg.max_position_embeddings;

  const bool dump = !a.dump_logits.empty();
  std::vector<float> dumped;  // [positions, V]
  engine::Sampler sampler(sp, V, a.seed);
  auto choose = [&](const float* logits) {
    if (greedy) return static_cast<int32_t>(model::argmax(logits, V));
    const int32_t id = sampler.sample(logits).id;
    sampler.accept(id);
    return id;
  };
  auto is_eos = [&](int32_t t) {
    return !a.ignore_eos && std::find(cfg.eos_token_ids.begin(), cfg.eos_token_ids.end(), t) != cfg.eos_token_ids.end();
  };

  auto state = lm->new_state();
  const auto t_prefill = std::chrono::steady_clock::now();
  std::vector<float> logits = lm->forward_one(*state, prompt, dump);
  const double prefill_s = seconds_since(t_prefill);
  if (dump) dumped = logits;
  const float* last = logits.data() + (dump ? (prompt.size() - 1) * static_cast<size_t>(V) : 0);
  std::vector<int32_t> generated = {choose(last)};
  std::string stop_reason = "length";
  const auto t_decode = std::chrono::steady_clock::now();
  int64_t n_decode_steps = 0;
  while (true) {
    if (is_eos(generated.back())) {
      stop_reason = "eos";
      break;
    }
    if (static_cast<int64_t>(generated.size()) >= a.max_new_tokens) break;
    logits = lm->forward_one(*state, std::span<const int32_t>(&generated.back(), 1), false);
    ++n_decode_steps;
    if (dump) dumped.insert(dumped.end(), logits.begin(), logits.end());
    generated.push_back(choose(logits.data()));
  }
  const double decode_s = seconds_since(t_decode);
  const double tok_s = n_decode_steps > 0 && decode_s > 0 ? static_cast<double>(n_decode_steps) / decode_s : 0.0;

  if (dump) {
    format::SafetensorsWriter w;
    const int64_t rows = static_cast<int64_t>(dumped.size()) / V;
    w.add("logits", DType::kF32, {rows, V},
          {reinterpret_cast<const uint8_t*>(dumped.data()), dumped.size() * sizeof(float)});
    std::vector<int64_t> all(prompt.begin(), prompt.end());
    all.insert(all.end(), generated.begin(), generated.end());
    w.add("token_ids", DType::kI64, {static_cast<int64_t>(all.size())},
          {reinterpret_cast<const uint8_t*>(all.data()), all.size() * sizeof(int64_t)});
    w.set_metadata("prompt_len", std::to_string(prompt.size()));
    w.set_metadata("n_generated", std::to_string(generated.size()));
    w.write(a.dump_logits);
  }

  std::optional<std::string> text;
  if (tokenizer) text = tokenizer->decode(generated);
  if (a.json) {
    nlohmann::json j;
    j["model"] = dir.string();
    j["architecture"] = cfg.architecture;
    j["prompt_ids"] = prompt;
    j["generated_ids"] = generated;
    if (text) j["text"] = *text;
    j["stop_reason"] = stop_reason;
    j["sampling"] = greedy ? nlohmann::json{{"greedy", true}}
                           : nlohmann::json{{"temperature", *a.temperature}, {"top_k", a.top_k}, {"top_p", a.top_p},
                                            {"min_p", a.min_p}, {"seed", a.seed}};
    j["timing"] = {{"load_s", load_s}, {"prefill_s", prefill_s}, {"prefill_tokens", prompt.size()},
                   {"decode_s", decode_s}, {"decode_steps", n_decode_steps}, {"decode_tokens_per_s", tok_s}};
    if (dump) j["dump_logits"] = a.dump_logits;
    fmt::print("{}\n", j.dump());
  } else {
    fmt::print("generated ids: {}\n", join_ids(generated));
    if (text) fmt::print("text: {}\n", *text);
    fmt::print(stderr, "{}: load {:.2f} s, prefill {} tokens {:.3f} s, decode {} steps {:.3f} s ({:.1f} tokens/s), stop: {}\n",
               cfg.architecture, load_s, prompt.size(), prefill_s, n_decode_steps, decode_s, tok_s, stop_reason);
  }
}

}  // namespace

void register_generate_command(CLI::App& app) {
  auto args = std::make_shared<GenerateArgs>();
  CLI::App* cmd = app.add_subcommand("generate", "Generate tokens with the CPU reference forward");
  cmd->add_option("--model", args->model_dir, "Model directory (config.json + safetensors), or a preset with --load-format dummy (glm5-shard, glm5-small, glm45-air-shard)")->required();
  cmd->add_option("--prompt-ids", args->prompt_ids, "Prompt token ids, comma separated (e.g. 1,2,3)");
  cmd->add_option("--prompt", args->prompt_text, "Prompt text (needs tokenizer.json in the model directory)");
  cmd->add_option("--max-new-tokens", args->max_new_tokens, "Tokens to generate (default 16)");
  cmd->add_flag("--greedy", args->greedy, "Greedy decoding (the default)");
  cmd->add_option("--temperature", args->temperature, "Sampling temperature (0 = greedy)");
  cmd->add_option("--top-k", args->top_k, "Keep the K most likely tokens (default -1: off)");
  cmd->add_option("--top-p", args->top_p, "Nucleus sampling threshold in (0, 1] (default 1)");
  cmd->add_option("--min-p", args->min_p, "Drop tokens below min_p * p_max, in [0, 1] (default 0)");
  cmd->add_option("--seed", args->seed, "Sampling seed (default 0)")->check(unsigned_64());
  cmd->add_option("--dump-logits", args->dump_logits,
                  "Write F32 logits [positions, vocab] of every prompt position and decode step (safetensors)");
  cmd->add_flag("--json", args->json, "Print one JSON object");
  cmd->add_flag("--ignore-eos", args->ignore_eos,
                "Do not stop at the model's eos_token_id (config.json's and generation_config.json's)");
  cmd->add_option("--load-format", args->load_format, "auto (checkpoint) or dummy (random weights)")
      ->check(parsed_by([](const std::string& v) { model::parse_load_format(v); }));
  CLI::Option* dummy_weights =
      cmd->add_option("--dummy-weights", args->dummy_weights, "Dummy weight format: bf16 or nvfp4 (default bf16)")
          ->check(parsed_by([](const std::string& v) { model::parse_dummy_weights(v); }));
  CLI::Option* dummy_seed =
      cmd->add_option("--dummy-seed", args->dummy_seed, "Dummy weight seed (default 0)")->check(unsigned_64());
  add_device_options(*cmd, args->device);
  cmd->callback([args, dummy_weights, dummy_seed] {
    require_dummy_load({dummy_weights, dummy_seed}, args->load_format);
    run_generate(*args);
  });
}

}  // namespace fp4moe::tools
