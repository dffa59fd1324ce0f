// CPU decode-step throughput of whole models (the CPU reference forward through the KV cache):
// for each model directory and batch size, prefill `--context` prompt tokens per sequence, then
// time single-token decode steps (one batched forward per step over `batch` sequences) and print
// one table row: median / p10 / p90 step time of >= 30 timed steps after warm-up, and tokens/s
// (batch / median step). The KV cache grows by one token per step, as in real decoding.
// Run: build/bench/bench_cpu_decode [--steps N] [--context N] [--models DIR,DIR,...] [--dummy bf16|nvfp4]
//      (default: the golden tiny models under $FP4MOE_SHARED or ../shared; --dummy: random weights
//      for each DIR's config.json, e.g. a larger config no checkpoint exists for; threads: FP4MOE_CPU_THREADS)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include "kernels/cpu/thread_pool.h"
#include "model/registry.h"

namespace {

namespace fs = std::filesystem;
using fp4moe::model::CausalLM;
using fp4moe::model::KvState;
using fp4moe::model::SeqChunk;

struct Row {
  std::string model;
  int batch = 0;
  double median_ms = 0, p10_ms = 0, p90_ms = 0;
};

Row bench_model(CausalLM& lm, const std::string& name, int batch, int context, int steps) {
  const int64_t V = lm.vocab_size();
  std::vector<std::unique_ptr<KvState>> states;
  std::vector<std::vector<float>> logits(static_cast<size_t>(batch), std::vector<float>(static_cast<size_t>(V)));
  std::vector<int32_t> next(static_cast<size_t>(batch));
  for (int b = 0; b < batch; ++b) {
    states.push_back(lm.new_state());
    std::vector<int32_t> prompt(static_cast<size_t>(context));
    for (int i = 0; i < context; ++i) prompt[static_cast<size_t>(i)] = static_cast<int32_t>((7 * i + 13 * b + 1) % V);
    logits[static_cast<size_t>(b)] = lm.forward_one(*states.back(), prompt, false);
  }
  auto step = [&] {
    std::vector<SeqChunk> chunks;
    for (int b = 0; b < batch; ++b) {
      const auto& l = logits[static_cast<size_t>(b)];
      next[static_cast<size_t>(b)] = static_cast<int32_t>(std::max_element(l.begin(), l.end()) - l.begin());
      chunks.push_back({states[static_cast<size_t>(b)].get(), std::span<const int32_t>(&next[static_cast<size_t>(b)], 1),
                        logits[static_cast<size_t>(b)].data(), false});
    }
    lm.forward(chunks);
  };
  for (int i = 0; i < 5; ++i) step();  // warm-up
  std::vector<double> ms;
  for (int i = 0; i < steps; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    step();
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(ms.begin(), ms.end());
  Row r;
  r.model = name;
  r.batch = batch;
  r.median_ms = ms[ms.size() / 2];
  r.p10_ms = ms[ms.size() / 10];
  r.p90_ms = ms[ms.size() * 9 / 10];
  return r;
}

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  int steps = 30, context = 16;
  std::vector<std::string> models;
  std::string dummy;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--steps") == 0 && i + 1 < argc) {
      steps = std::max(30, std::atoi(argv[++i]));
    } else if (std::strcmp(argv[i], "--context") == 0 && i + 1 < argc) {
      context = std::max(1, std::atoi(argv[++i]));
    } else if (std::strcmp(argv[i], "--models") == 0 && i + 1 < argc) {
      models = split(argv[++i]);
    } else if (std::strcmp(argv[i], "--dummy") == 0 && i + 1 < argc &&
               (std::strcmp(argv[i + 1], "bf16") == 0 || std::strcmp(argv[i + 1], "nvfp4") == 0)) {
      dummy = argv[++i];
    } else {
      std::fprintf(stderr, "usage: %s [--steps N>=30] [--context N] [--models DIR,DIR,...] [--dummy bf16|nvfp4]\n",
                   argv[0]);
      return 2;
    }
  }
  if (models.empty()) {
    const char* env = std::getenv("FP4MOE_SHARED");
    const fs::path shared = env != nullptr && env[0] != '\0' ? fs::path(env) : fs::path(FP4MOE_SHARED_DEFAULT);
    for (const char* m : {"glm4_moe_tiny", "glm4_moe_tiny_nvfp4", "glm5_tiny", "glm5_tiny_nvfp4"}) {
      models.push_back((shared / "golden/models" / m).string());
    }
  }
  std::printf("CPU decode step, %d threads, context %d + growing, %d timed steps after 5 warm-up\n",
              fp4moe::kernels::cpu::default_cpu_threads(), context, steps);
  std::printf("%-24s %-22s %5s %10s %10s %10s %12s\n", "model", "architecture", "batch", "median ms", "p10 ms",
              "p90 ms", "tokens/s");
  int failures = 0;
  for (const std::string& dir : models) {
    const std::string name = fs::path(dir).filename().string() + (dummy.empty() ? "" : " (dummy " + dummy + ")");
    try {
      fp4moe::model::LoadOptions opts;
      opts.progress = false;
      if (!dummy.empty()) {
        opts.format = fp4moe::model::LoadFormat::kDummy;
        opts.dummy_weights = dummy == "nvfp4" ? fp4moe::model::DummyWeights::kNVFP4 : fp4moe::model::DummyWeights::kBF16;
      }
      auto lm = fp4moe::model::load_model(dir, opts);
      for (int batch : {1, 4}) {
        const Row r = bench_model(*lm, name, batch, context, steps);
        std::printf("%-24s %-22s %5d %10.3f %10.3f %10.3f %12.1f\n", r.model.c_str(), lm->config().architecture.c_str(),
                    r.batch, r.median_ms, r.p10_ms, r.p90_ms, 1000.0 * r.batch / r.median_ms);
      }
    } catch (const std::exception& e) {
      std::printf("%-24s error: %s\n", name.c_str(), e.what());
      ++failures;
    }
  }
  return failures == 0 ? 0 : 1;
}
