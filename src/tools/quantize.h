// Calibration for `fp4moe quantize`: the amax of every Linear's input over a prompt set, observed
// in the CPU reference forward (model::CausalLM::set_linear_observer). The weight quantization
// itself is format/quantize_checkpoint.h. Implemented in cmd_quantize.cpp; tested by
// tests/tools/test_quantize.cpp.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

namespace fp4moe::tools {

using PromptIds = std::vector<std::vector<int32_t>>;

// A prompt file: one prompt per non-empty line, token ids separated by commas and/or spaces;
// lines starting with '#' are comments. Fails naming the file, line and token.
PromptIds read_prompt_ids(const std::filesystem::path& file);

// The built-in set when no file is given: 8 prompts of 64 ids drawn deterministically (fixed
// seed) from [0, vocab). No tokenizer is needed; real text calibrates better (--calib-prompts).
PromptIds builtin_calibration_prompts(int64_t vocab_size);

struct Calibration {
  std::map<std::string, float> input_amax;  // module -> amax(|input|), only `modules`
  int64_t n_prompts = 0;
  int64_t n_tokens = 0;
  // Routed experts that no calibration token reached: they take the max amax of the calibrated
  // experts of the same layer and projection (fp4moe policy; listed here so it is visible).
  std::vector<std::string> filled_experts;
};

// Loads the BF16 model in `model_dir`, runs every prompt through the CPU forward and records the
// input amax of each module in `modules`. Fails naming the module when one was never observed
// (and cannot be filled as above) or a prompt id is outside the vocabulary.
Calibration calibrate_input_amax(const std::filesystem::path& model_dir, const PromptIds& prompts,
                                 const std::vector<std::string>& modules);

}  // namespace fp4moe::tools
