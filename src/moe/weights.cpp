// load_linear (TensorStore -> LinearWeight) and random weights. See weights.h.
#include "moe/weights.h"

#include <cmath>
#include <random>

#include "core/error.h"
#include "format/nvfp4.h"

namespace fp4moe::moe {

LinearWeight load_linear(const format::TensorStore& store, const std::string& module, int64_t out, int64_t in,
                         bool bias) {
  // Views live in optionals so that absent tensors become nullptr in LinearTensors.
  auto find = [&](const std::string& suffix) -> std::optional<TensorView> {
    const std::string name = module + suffix;
    if (!store.contains(name)) return std::nullopt;
    return store.view(name);
  };
  const auto weight = find(".weight");
  FP4MOE_CHECK(weight.has_value()) << module << ".weight: missing from the checkpoint in " << store.dir().string()
                                   << " (expected a Linear [" << out << ", " << in << "])";
  const auto weight_scale = find(".weight_scale");
  const auto weight_scale_2 = find(".weight_scale_2");
  const auto input_scale = find(".input_scale");
  const auto bias_view = bias ? find(".bias") : std::nullopt;
  kernels::cpu::LinearTensors t;
  t.module = module;
  t.weight = &*weight;
  t.weight_scale = weight_scale ? &*weight_scale : nullptr;
  t.weight_scale_2 = weight_scale_2 ? &*weight_scale_2 : nullptr;
  t.input_scale = input_scale ? &*input_scale : nullptr;
  t.bias = bias_view ? &*bias_view : nullptr;
  return kernels::cpu::linear_weight_from_tensors(t, out, in, bias);
}

LinearWeight random_linear(WeightFormat format, int64_t out, int64_t in, uint64_t seed, bool bias) {
  FP4MOE_CHECK(out >= 1 && in >= 1) << "random_linear: shape [" << out << ", " << in << "] must be positive";
  std::mt19937_64 rng(seed);
  const float a = 1.0f / std::sqrt(static_cast<float>(in));
  std::uniform_real_distribution<float> uni(-a, a);
  const size_t n = static_cast<size_t>(out * in);
  std::vector<float> b;
  if (bias) {
    b.resize(static_cast<size_t>(out));
    for (auto& v : b) v = uni(rng);
  }
  switch (format) {
    case WeightFormat::kF32: {
      std::vector<float> w(n);
      for (auto& v : w) v = uni(rng);
      return LinearWeight::from_f32(out, in, std::move(w), std::move(b));
    }
    case WeightFormat::kBF16: {
      std::vector<uint16_t> w(n);
      for (auto& v : w) v = f32_to_bf16(uni(rng));
      return LinearWeight::from_bf16(out, in, std::move(w), std::move(b));
    }
    case WeightFormat::kNVFP4: {
      // U(-a, a) quantized with the ModelOpt recipe (format/nvfp4.h).
      FP4MOE_CHECK(in % format::kNvfp4BlockSize == 0)
          << "random_linear: NVFP4 needs in_features (" << in << ") to be a multiple of " << format::kNvfp4BlockSize;
      std::vector<float> w(n);
      for (auto& v : w) v = uni(rng);
      format::Nvfp4Matrix q = format::nvfp4_quantize(w, out, in);
      return LinearWeight::from_nvfp4(out, in, std::move(q.packed), std::move(q.scales), q.global_scale,
                                      std::nullopt, std::move(b));
    }
  }
  FP4MOE_FAIL() << "random_linear: unknown weight format " << static_cast<int>(format);
  return {};
}

}  // namespace fp4moe::moe
