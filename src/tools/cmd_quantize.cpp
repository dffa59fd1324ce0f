// `fp4moe quantize IN_DIR OUT_DIR [--exclude PATTERN ...] [--calib-prompts FILE | --no-calibration]`:
// BF16 checkpoint -> ModelOpt-layout NVFP4 checkpoint (format/quantize_checkpoint.h).
//
// input_scale comes from calibration: the BF16 model runs on the CPU over a prompt set (a file of
// token ids, or a small built-in set) while an observer records the amax of every Linear's input.
// --no-calibration writes a weight-only W4A16_NVFP4 checkpoint without input_scale instead, and
// says so; a checkpoint with a guessed input_scale is never written.
// Tested by tests/tools/test_quantize.cpp.
#include <CLI/CLI.hpp>
#include <fmt/core.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <memory>
#include <mutex>
#include <regex>

#include "core/error.h"
#include "format/quantize_checkpoint.h"
#include "model/registry.h"
#include "tools/commands.h"
#include "tools/quantize.h"

namespace fp4moe::tools {
namespace fs = std::filesystem;

PromptIds read_prompt_ids(const fs::path& file) {
  std::error_code ec;
  FP4MOE_CHECK(!fs::is_directory(file, ec)) << "prompt file " << file.string() << " is a directory, not a file";
  std::ifstream in(file);
  FP4MOE_CHECK(in.good()) << "cannot open prompt file " << file.string();
  PromptIds prompts;
  std::string line;
  int64_t line_no = 0;
  while (std::getline(in, line)) {
    ++line_no;
    const size_t first = line.find_first_not_of(" \t\r");
    if (first == std::string::npos || line[first] == '#') continue;
    std::vector<int32_t> ids;
    std::string tok;
    auto flush = [&] {
      if (tok.empty()) return;
      FP4MOE_CHECK(std::all_of(tok.begin(), tok.end(), ::isdigit) && tok.size() <= 9)
          << file.string() << ":" << line_no << ": '" << tok << "' is not a token id";
      ids.push_back(static_cast<int32_t>(std::stol(tok)));
      tok.clear();
    };
    for (char ch : line) {
      if (ch == ',' || ch == ' ' || ch == '\t' || ch == '\r') {
        flush();
      } else {
        tok += ch;
      }
    }
    flush();
    FP4MOE_CHECK(!ids.empty()) << file.string() << ":" << line_no << ": the prompt holds no token id";
    prompts.push_back(std::move(ids));
  }
  FP4MOE_CHECK(!prompts.empty()) << "prompt file " << file.string() << " holds no prompts";
  return prompts;
}

PromptIds builtin_calibration_prompts(int64_t vocab_size) {
  FP4MOE_CHECK(vocab_size > 0) << "vocab_size " << vocab_size;
  uint64_t state = 0x5EEDCA11B0A7ull;
  PromptIds prompts(8, std::vector<int32_t>(64));
  for (auto& p : prompts) {
    for (auto& id : p) {
      state = state * 6364136223846793005ull + 1442695040888963407ull;  // LCG (Knuth MMIX)
      id = static_cast<int32_t>((state >> 33) % static_cast<uint64_t>(vocab_size));
    }
  }
  return prompts;
}

Calibration calibrate_input_amax(const fs::path& model_dir, const PromptIds& prompts,
                                 const std::vector<std::string>& modules) {
  model::LoadOptions load;
  load.progress = false;
  std::unique_ptr<model::CausalLM> lm = model::load_model(model_dir, load);
  const int64_t vocab = lm->vocab_size();

  std::mutex mu;
  std::map<std::string, float> seen;
  lm->set_linear_observer([&](const std::string& module, const float* x, int64_t rows, int64_t cols) {
    float amax = 0.0f;
    for (int64_t i = 0; i < rows * cols; ++i) amax = std::max(amax, std::fabs(x[i]));
    std::lock_guard<std::mutex> lock(mu);
    float& a = seen[module];
    a = std::max(a, amax);
  });
  Calibration cal;
  for (size_t i = 0; i < prompts.size(); ++i) {
    const auto& p = prompts[i];
    // Counted from 1, as the prompt file's prompts (its lines other than blanks and # comments).
    FP4MOE_CHECK(!p.empty()) << "calibration prompt #" << i + 1 << " is empty";
    for (int32_t id : p) {
      FP4MOE_CHECK(id >= 0 && id < vocab) << "calibration prompt #" << i + 1 << " (of " << prompts.size()
                                          << "): token id " << id << " is outside the vocabulary [0, " << vocab << ")";
    }
    auto state = lm->new_state();
    lm->forward_one(*state, p, /*all_logits=*/false);
    ++cal.n_prompts;
    cal.n_tokens += static_cast<int64_t>(p.size());
  }
  lm->set_linear_observer({});

  // "model.layers.L.mlp.experts.E.proj" -> ("model.layers.L.mlp.experts.*.proj").
  static const std::regex kExpert(R"((.*\.mlp\.experts\.)(\d+)(\.[a-z_]+))");
  std::map<std::string, float> expert_max;  // per layer and projection, over calibrated experts
  for (const auto& [name, amax] : seen) {
    std::smatch m;
    if (std::regex_match(name, m, kExpert)) {
      float& e = expert_max[m[1].str() + "*" + m[3].str()];
      e = std::max(e, amax);
    }
  }
  std::vector<std::string> missing;
  for (const std::string& name : modules) {
    auto it = seen.find(name);
    if (it != seen.end() && it->second > 0.0f) {
      cal.input_amax[name] = it->second;
      continue;
    }
    std::smatch m;
    if (std::regex_match(name, m, kExpert)) {
      auto e = expert_max.find(m[1].str() + "*" + m[3].str());
      if (e != expert_max.end() && e->second > 0.0f) {
        cal.input_amax[name] = e->second;
        cal.filled_experts.push_back(name);
        continue;
      }
    }
    missing.push_back(name);
  }
  if (!missing.empty()) {
    FP4MOE_FAIL() << "calibration over " << cal.n_prompts << " prompts (" << cal.n_tokens
                  << " tokens) observed no input for " << missing.size() << " of " << modules.size()
                  << " modules, first " << missing.front();
  }
  return cal;
}

namespace {

struct QuantizeArgs {
  std::string in_dir;
  std::string out_dir;
  std::vector<std::string> exclude;
  std::string calib_prompts;
  bool no_calibration = false;
};

void run_quantize(const QuantizeArgs& a) {
  format::QuantizeOptions opt;
  opt.exclude = a.exclude;
  opt.producer_version = FP4MOE_VERSION;
  const format::Checkpoint in(a.in_dir);  // its safetensors headers, read once
  // Refused before a long calibration pass.
  format::check_quantize_paths(in, a.out_dir);
  // The modules it will quantize (an empty --exclude, K not a multiple of 16: refused now, not after calibrating).
  const std::vector<std::string> modules = format::modules_to_quantize(in, a.exclude);
  // One that cannot be made fails now, not after calibrating; a run that fails later leaves nothing in it.
  format::QuantizeOutput output(a.out_dir);
  // Files none of whose tensors the architecture reads (test data beside the weights, read as a shard by a folder
  // without an index) are not written as shards of the output. A config the model loader cannot read skips nothing.
  try {
    const model::TensorCheck check = model::check_tensors(model::load_model_config(a.in_dir), in.store());
    for (const auto& [file, n] : check.unread_files) {
      opt.skip_files.insert(file);
      fmt::print(stderr, "quantize: warning: {} holds {} tensor(s), none of which {} reads: not written\n", file, n,
                 in.config().architecture);
    }
  } catch (const Error&) {
  }
  for (const std::string& p : format::unmatched_exclusions(in, a.exclude)) {
    fmt::print(stderr, "quantize: warning: --exclude '{}' matches no Linear module of {} (it keeps nothing in BF16)\n",
               p, a.in_dir);
  }
  if (a.no_calibration) {
    fmt::print(stderr,
               "quantize: --no-calibration: writing a weight-only W4A16_NVFP4 checkpoint without "
               "input_scale (fine for W4A16 inference; W4A4 loaders need a calibrated checkpoint)\n");
  } else {
    PromptIds prompts;
    std::string source;
    if (!a.calib_prompts.empty()) {
      prompts = read_prompt_ids(a.calib_prompts);
      source = a.calib_prompts;
    } else {
      prompts = builtin_calibration_prompts(in.config().vocab_size);
      source = "the built-in set (deterministic random token ids; pass --calib-prompts for real text)";
    }
    Calibration cal = calibrate_input_amax(a.in_dir, prompts, modules);
    fmt::print(stderr, "quantize: calibrated {} modules on {} prompts ({} tokens) from {}\n",
               cal.input_amax.size(), cal.n_prompts, cal.n_tokens, source);
    if (!cal.filled_experts.empty()) {
      fmt::print(stderr,
                 "quantize: {} routed experts received no calibration token and take the max "
                 "amax of their layer's experts (first: {})\n",
                 cal.filled_experts.size(), cal.filled_experts.front());
    }
    opt.input_amax = std::move(cal.input_amax);
  }
  const format::QuantizeReport r = format::quantize_checkpoint(in, a.out_dir, opt);
  output.commit();
  fmt::print("quantized {} Linears to {} ({} scale-sharing groups), kept {} in BF16 (exclude: ",
             r.n_quantized, r.quant_algo, r.n_scale_groups, r.n_kept);
  for (size_t i = 0; i < r.exclude_modules.size(); ++i) {
    fmt::print("{}{}", i ? ", " : "", r.exclude_modules[i]);
  }
  fmt::print("); {} -> {} bytes; input_scale {}; wrote {}\n", r.bytes_in, r.bytes_out,
             r.has_input_scales ? "calibrated" : "not written", a.out_dir);
}

}  // namespace

void register_quantize_command(CLI::App& app) {
  auto args = std::make_shared<QuantizeArgs>();
  auto* cmd = app.add_subcommand("quantize", "BF16 checkpoint -> ModelOpt NVFP4 checkpoint");
  cmd->add_option("in_dir", args->in_dir, "BF16 checkpoint directory")->required();
  cmd->add_option("out_dir", args->out_dir, "output directory (created)")->required();
  cmd->add_option("--exclude", args->exclude,
                  "keep modules matching this pattern in BF16 (fnmatch; repeatable); lm_head and "
                  "model.layers.*.mlp.gate are always kept")
      ->expected(1)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  auto* calib = cmd->add_option("--calib-prompts", args->calib_prompts,
                                "calibration prompts: one per line, token ids separated by commas or spaces");
  cmd->add_flag("--no-calibration", args->no_calibration,
                "skip calibration: weight-only W4A16_NVFP4 output without input_scale")
      ->excludes(calib);
  cmd->callback([args] { run_quantize(*args); });
}

}  // namespace fp4moe::tools
