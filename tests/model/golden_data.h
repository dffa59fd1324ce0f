// The golden reference of one model directory (../shared/golden/models/<name>/golden.safetensors, its
// README): prompts, their logits, greedy continuations and their logits, per sequence. Shared by the
// CPU GLM-4.5 test and the GPU model test.
#pragma once

#include <cstdint>
#include <filesystem>
#include <vector>

#include "core/tensor.h"
#include "format/safetensors.h"

namespace fp4moe::model::golden {

struct Golden {
  int64_t n_seq = 0, prompt_len = 0, total_len = 0, vocab = 0;
  std::vector<std::vector<int32_t>> input_ids;   // [n_seq][prompt_len]
  std::vector<std::vector<int32_t>> greedy_ids;  // [n_seq][total_len]
  std::vector<float> logits;                     // [n_seq, prompt_len, vocab]
  std::vector<float> greedy_logits;              // [n_seq, total_len, vocab]
};

inline std::vector<std::vector<int32_t>> ids_2d(const TensorView& t) {
  auto v = t.as<int64_t>();
  std::vector<std::vector<int32_t>> out(static_cast<size_t>(t.dim(0)));
  for (int64_t b = 0; b < t.dim(0); ++b) {
    for (int64_t i = 0; i < t.dim(1); ++i) out[static_cast<size_t>(b)].push_back(static_cast<int32_t>(v[b * t.dim(1) + i]));
  }
  return out;
}

inline Golden read_golden(const std::filesystem::path& dir) {
  format::SafetensorsFile f(dir / "golden.safetensors");
  Golden g;
  const TensorView logits = f.view("logits"), greedy = f.view("greedy_logits");
  g.input_ids = ids_2d(f.view("input_ids"));
  g.greedy_ids = ids_2d(f.view("greedy_ids"));
  g.n_seq = logits.dim(0);
  g.prompt_len = logits.dim(1);
  g.vocab = logits.dim(2);
  g.total_len = greedy.dim(1);
  g.logits.assign(logits.as<float>().begin(), logits.as<float>().end());
  g.greedy_logits.assign(greedy.as<float>().begin(), greedy.as<float>().end());
  return g;
}

}  // namespace fp4moe::model::golden
