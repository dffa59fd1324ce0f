// `fp4moe bench-one-batch`: a static batch straight through the model, without the scheduler
// (SGLang's bench_one_batch): for each batch size, the prefill of batch x input_len tokens, then
// output_len decode steps of one token per sequence (greedy), timed per step. Prints prefill
// latency and throughput, median decode step latency and decode throughput, as a table or JSON.
//
//   fp4moe bench-one-batch [--model DIR [--load-format dummy]] [--batch-size 1,4,16]
//       [--input-len 64] [--output-len 16] [--max-prefill-tokens 4096] [--warmup 1] [--seed S]
//       [--breakdown] [--profile-decode] [--json]
//
// The prefill runs in forwards of at most --max-prefill-tokens tokens (the server's step budget of
// that name and default; the prompts in order, one may span two forwards), so a large batch of long
// prompts needs no workspace for all its tokens at once; the prefill time is the sum of the forwards.
//
// --breakdown traces the decode steps (ForwardTrace: per-layer attention / mlp / moe times from the
// model's events) and prints, per batch size, where the mean step goes: attention, dense MLP and MoE
// layers summed over layers, and the rest (embedding, final norm, lm_head, the host's share and the
// sync), with how many steps ran as CUDA graphs. The traced steps include the trace's own copies
// (per-expert counts), as the server's steps do; compare step times with and without it accordingly.
//
// --profile-decode (--device cuda) brackets each measured run's decode steps (not the warm-ups, not the
// prefill) with cudaProfilerStart / cudaProfilerStop, so that `ncu --profile-from-start off` or
// `nsys profile --capture-range=cudaProfilerApi` records only those steps (scripts/gpu_step_profile.sh).
//
// Without --model it runs the embedded default model (engine/default_model.h).
// Tested by tests/tools/test_bench_one_batch.cpp (runs the binary on the default model).
#include <CLI/CLI.hpp>
#include <fmt/core.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <random>
#include <span>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/host_memory.h"
#include "engine/default_model.h"
#include "engine/sampler.h"
#include "model/registry.h"
#include "tools/cli_options.h"
#include "tools/commands.h"
#include "tools/device_option.h"
#include "tune/tune_cache.h"

#ifdef FP4MOE_HAVE_CUDA
#include "kernels/cuda/device.h"
#endif

namespace fp4moe::tools {
namespace {

struct BenchArgs {
  std::string model_dir;
  std::string load_format = "auto";
  std::string dummy_weights = "nvfp4";
  std::string batch_sizes = "1,4,16";
  int64_t input_len = 64;
  int64_t output_len = 16;
  int64_t warmup = 1;
  int64_t max_prefill_tokens = 4096;
  uint64_t seed = 0;
  bool json = false;
  bool breakdown = false;
  bool profile_decode = false;
  DeviceArgs device;
  bool bf16_peer = false;
};


double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

struct Row {
  int64_t batch = 0;
  // FNV-1a over the greedy tokens fed back (step by step, sequence by sequence), to compare runs: the
  // CPU models give the same hash for any --max-prefill-tokens (tested); on the GPU a different batch
  // padding or kernel config may flip a near-tie argmax.
  uint64_t tokens_hash = 14695981039346656037ull;
  double prefill_s = 0, decode_median_s = 0, decode_total_s = 0;
  int64_t decode_steps = 0;
  // --breakdown: per decode step on average (seconds), and the steps that ran as CUDA graphs.
  double attention_s = 0, mlp_s = 0, moe_s = 0;
  int64_t graph_steps = 0;
};

// One static batch: prefill, then decode steps; returns the timings.
// profile: the decode steps between cudaProfilerStart and cudaProfilerStop (--profile-decode).
// The prompts come from `seed` and B alone (--seed x 1000003 + B), so a batch size's output hash does not depend
// on the other batch sizes or the warm-up runs of the command.
Row run_batch(model::CausalLM& lm, int64_t B, int64_t input_len, int64_t output_len, int64_t prefill_chunk,
              bool breakdown, bool profile, uint64_t seed) {
  const int64_t V = lm.vocab_size();
  std::mt19937_64 rng(seed * 1000003 + static_cast<uint64_t>(B));
  std::vector<std::unique_ptr<model::KvState>> states;
  std::vector<std::vector<int32_t>> prompts(static_cast<size_t>(B));
  for (auto& p : prompts) {
    p.resize(static_cast<size_t>(input_len));
    for (auto& t : p) t = static_cast<int32_t>(rng() % static_cast<uint64_t>(V));
    states.push_back(lm.new_state());
  }
  // Greedy: a model that can returns the argmax only (the GPU models: no logits over PCIe), as the
  // engine asks it for plain greedy requests; else the host takes the argmax of the logits.
  const bool model_argmax = lm.supports_argmax();
  std::vector<float> logits(model_argmax ? 0 : static_cast<size_t>(B * V));
  std::vector<int32_t> next(static_cast<size_t>(B));
  Row r;
  r.batch = B;
  // Prefill: forwards of at most prefill_chunk tokens, the prompts in order (one may span forwards,
  // as in the server's chunked prefill); the piece that ends a prompt asks for its next token.
  std::vector<int64_t> done(static_cast<size_t>(B), 0);
  double t0 = now_s();
  for (int64_t first = 0; first < B;) {
    std::vector<model::SeqChunk> part;
    int64_t budget = prefill_chunk;
    for (int64_t b = first; b < B && budget > 0; ++b) {
      const size_t i = static_cast<size_t>(b);
      const int64_t take = std::min(input_len - done[i], budget);
      const bool ends = done[i] + take == input_len;
      part.push_back({states[i].get(), std::span<const int32_t>(prompts[i].data() + done[i], static_cast<size_t>(take)),
                      ends && !model_argmax ? logits.data() + b * V : nullptr, false,
                      ends && model_argmax ? &next[i] : nullptr});
      done[i] += take;
      budget -= take;
    }
    lm.forward(part);
    while (first < B && done[static_cast<size_t>(first)] == input_len) ++first;
  }
  r.prefill_s = now_s() - t0;
  std::vector<model::SeqChunk> chunks;
  for (int64_t b = 0; b < B; ++b) {
    chunks.push_back({states[static_cast<size_t>(b)].get(), {}, model_argmax ? nullptr : logits.data() + b * V, false,
                      model_argmax ? &next[static_cast<size_t>(b)] : nullptr});
  }
  std::vector<double> steps;
#ifdef FP4MOE_HAVE_CUDA
  if (profile) cuda::cuda_profiler_start();
#else
  (void)profile;  // refused in run_bench
#endif
  for (int64_t step = 0; step < output_len; ++step) {
    for (int64_t b = 0; b < B; ++b) {
      if (!model_argmax) next[static_cast<size_t>(b)] = engine::argmax_token(logits.data() + b * V, V);
      chunks[static_cast<size_t>(b)].tokens = std::span<const int32_t>(&next[static_cast<size_t>(b)], 1);
      r.tokens_hash = (r.tokens_hash ^ static_cast<uint32_t>(next[static_cast<size_t>(b)])) * 1099511628211ull;
    }
    model::ForwardTrace trace;
    t0 = now_s();
    lm.forward(chunks, breakdown ? &trace : nullptr);
    steps.push_back(now_s() - t0);
    for (const model::LayerTiming& t : trace.layer_times) {  // sub-parts ("moe.routed_down", ...) are inside "moe"
      if (t.part == "attention") r.attention_s += t.seconds;
      if (t.part == "mlp") r.mlp_s += t.seconds;
      if (t.part == "moe") r.moe_s += t.seconds;
    }
    r.graph_steps += trace.cuda_graph_steps;
  }
#ifdef FP4MOE_HAVE_CUDA
  if (profile) cuda::cuda_profiler_stop();  // forward() ended with a sync: the steps' kernels are done
#endif
  if (output_len > 0) {
    r.attention_s /= static_cast<double>(output_len);
    r.mlp_s /= static_cast<double>(output_len);
    r.moe_s /= static_cast<double>(output_len);
  }
  r.decode_steps = output_len;
  for (double s : steps) r.decode_total_s += s;
  if (!steps.empty()) {
    std::sort(steps.begin(), steps.end());
    r.decode_median_s = steps[steps.size() / 2];
  }
  return r;
}

double mean_step(const Row& r) {
  return r.decode_steps > 0 ? r.decode_total_s / static_cast<double>(r.decode_steps) : 0.0;
}

// The CPU backend holds every sequence's KV cache and one forward's activations in host memory: a batch that
// cannot fit is refused before it is allocated (batch 10^7 grew to 6 GB and ended in "std::bad_alloc"). The
// KV bytes a token are measured, the model's own (KvState::bytes of a 16-token prompt, / 16); the activations
// a row are a rough upper bound (hidden + MLP widths x 8 f32 buffers) plus the logits.
void check_cpu_memory(model::CausalLM& lm, int64_t batch, int64_t tokens_per_seq, int64_t prefill_chunk) {
  constexpr int64_t kProbe = 16;
  const auto state = lm.new_state();
  const std::vector<int32_t> probe(kProbe, 0);
  lm.forward_one(*state, probe, false);
  const int64_t kv_token = static_cast<int64_t>(state->bytes()) / kProbe;
  const model::ModelConfig& c = lm.config();
  const int64_t row = 8 *
                      (c.hidden_size + std::max(c.intermediate_size, c.moe_intermediate_size * c.num_experts_per_tok)) *
                      static_cast<int64_t>(sizeof(float));
  const int64_t step_rows = std::min(batch * tokens_per_seq, std::max(prefill_chunk, batch));
  const double kv_bytes =
      static_cast<double>(batch) * static_cast<double>(tokens_per_seq) * static_cast<double>(kv_token);
  const double act_bytes = static_cast<double>(step_rows) * static_cast<double>(row) +
                           static_cast<double>(batch) * static_cast<double>(c.vocab_size) * sizeof(float);
  const HostMemory avail = host_memory_available();  // MemAvailable, or the cgroup limit when that is lower
  FP4MOE_CHECK(avail.source.empty() || kv_bytes + act_bytes <= avail.bytes)
      << "--batch-size " << batch << " x " << tokens_per_seq << " tokens need ~"
      << fmt::format("{:.1f}", kv_bytes / 1e9) << " GB of CPU KV cache (" << kv_token << " B a token) and ~"
      << fmt::format("{:.1f}", act_bytes / 1e9) << " GB of activations (" << step_rows
      << " rows in a forward; --max-prefill-tokens bounds them); this machine has "
      << fmt::format("{:.1f}", avail.bytes / 1e9) << " GB available (" << avail.source << ")";
}

void run_bench(const BenchArgs& a) {
  check_device_options(a.device);  // named before the checks that depend on it, with every model
  // Bounded before any sum or product with them (input + output wrapped past INT64_MAX and skipped the position
  // check; the batch's token count overflowed a vector's size).
  FP4MOE_CHECK(a.input_len >= 1 && a.input_len <= INT32_MAX)
      << "--input-len " << a.input_len << " must be in [1, " << INT32_MAX << "]";
  FP4MOE_CHECK(a.output_len >= 0 && a.output_len <= INT32_MAX)
      << "--output-len " << a.output_len << " must be in [0, " << INT32_MAX << "]";
  FP4MOE_CHECK(a.warmup >= 0) << "--warmup " << a.warmup << " must be >= 0";
  FP4MOE_CHECK(a.max_prefill_tokens == -1 || a.max_prefill_tokens >= 1)
      << "--max-prefill-tokens " << a.max_prefill_tokens << " must be >= 1, or -1 (the whole batch in one forward)";
  FP4MOE_CHECK(!a.profile_decode || a.device.device == "cuda")
      << "--profile-decode brackets GPU kernels for a profiler: it needs --device cuda (not " << a.device.device << ")";
#ifndef FP4MOE_HAVE_CUDA
  FP4MOE_CHECK(!a.profile_decode) << "--profile-decode: this fp4moe was built without CUDA";
#endif
  // (It was ignored on the cpu, whose model has one path for NVFP4 weights: the run looked like a BF16 measurement.)
  FP4MOE_CHECK(!a.bf16_peer || a.device.device == "cuda")
      << "--bf16-peer runs the GPU model's 16-bit cuBLAS path: it needs --device cuda (not " << a.device.device << ")";
  const std::vector<int64_t> sizes = tune::parse_positive_list(a.batch_sizes, "--batch-size");
  const int64_t max_b = *std::max_element(sizes.begin(), sizes.end());
  const int64_t prefill_chunk = a.max_prefill_tokens == -1 ? max_b * a.input_len : a.max_prefill_tokens;
  std::unique_ptr<model::CausalLM> lm;
  std::string model_name;
  if (a.model_dir.empty()) {
    FP4MOE_CHECK(a.device.device == "cpu") << "--device " << a.device.device << ": the embedded default model is built for the cpu only;"
                                    << " pass --model DIR or a preset (--load-format dummy) for the GPU";
    lm = engine::make_default_model(a.seed);
    model_name = engine::kDefaultModelName;
  } else {
    model::LoadOptions opts;
    opts.format = model::parse_load_format(a.load_format);
    opts.dummy_weights = model::parse_dummy_weights(a.dummy_weights);
    opts.seed = a.seed;
    // Every sequence holds whole pages: size the KV pool per sequence rounded up to the page.
    constexpr int64_t kPage = 16;
    const int64_t pages_per_seq = (a.input_len + a.output_len + 1 + kPage - 1) / kPage;
    // A forward holds at most one prefill chunk or one decode step of the largest batch.
    const int64_t max_step = std::max(std::min(max_b * a.input_len, prefill_chunk), max_b);
    apply_device_option(a.device, max_step, max_b * pages_per_seq * kPage, kPage, opts);
    opts.gpu.nvfp4_kernels = !a.bf16_peer;
    lm = model::load_model(a.model_dir, opts);
    model_name = a.model_dir;
  }
  const int64_t max_pos = lm->config().max_position_embeddings;
  FP4MOE_CHECK(a.input_len + a.output_len <= max_pos)
      << "--input-len " << a.input_len << " + --output-len " << a.output_len << " = " << a.input_len + a.output_len
      << " exceeds the model's max_position_embeddings " << max_pos;
  if (a.device.device == "cpu") check_cpu_memory(*lm, max_b, a.input_len + a.output_len, prefill_chunk);
  // Each batch size is warmed up with its own shapes first (the same prefill and decode steps): the
  // first use of a GEMM shape loads its kernels (cuBLAS, CUDA lazy loading) and the first step of a
  // batch / block-table bucket captures its CUDA graph, which would otherwise land in timed steps.
  std::vector<Row> rows;
  for (int64_t B : sizes) {
    for (int64_t w = 0; w < a.warmup; ++w) {
      run_batch(*lm, B, a.input_len, a.output_len, prefill_chunk, false, false, a.seed);
    }
    rows.push_back(run_batch(*lm, B, a.input_len, a.output_len, prefill_chunk, a.breakdown, a.profile_decode, a.seed));
  }

  if (a.json) {
    nlohmann::json j;
    j["model"] = model_name;
    j["architecture"] = lm->config().architecture;
    j["input_len"] = a.input_len;
    j["output_len"] = a.output_len;
    for (const Row& r : rows) {
      const double prefill_tok = static_cast<double>(r.batch * a.input_len);
      j["results"].push_back(
          {{"batch_size", r.batch},
           {"prefill_latency_s", r.prefill_s},
           {"prefill_throughput_tok_s", r.prefill_s > 0 ? prefill_tok / r.prefill_s : 0.0},
           {"median_decode_latency_s", r.decode_median_s},
           {"median_decode_throughput_tok_s", r.decode_median_s > 0 ? r.batch / r.decode_median_s : 0.0},
           {"total_latency_s", r.prefill_s + r.decode_total_s},
           {"output_tokens_fnv1a", fmt::format("{:016x}", r.tokens_hash)}});
      if (a.breakdown) {
        j["results"].back()["decode_breakdown_s"] = {{"attention", r.attention_s}, {"mlp", r.mlp_s}, {"moe", r.moe_s},
                                                     {"rest", mean_step(r) - r.attention_s - r.mlp_s - r.moe_s}};
        j["results"].back()["cuda_graph_steps"] = r.graph_steps;
      }
    }
    fmt::print("{}\n", j.dump());
    return;
  }
  fmt::print("model: {} ({}), input_len {}, output_len {}\n", model_name, lm->config().architecture, a.input_len,
             a.output_len);
  fmt::print("{:>6} {:>12} {:>14} {:>14} {:>14} {:>12}\n", "batch", "prefill ms", "prefill tok/s",
             "decode ms/step", "decode tok/s", "total s");
  for (const Row& r : rows) {
    const double prefill_tok = static_cast<double>(r.batch * a.input_len);
    fmt::print("{:>6} {:>12.2f} {:>14.1f} {:>14.2f} {:>14.1f} {:>12.3f}\n", r.batch, r.prefill_s * 1e3,
               r.prefill_s > 0 ? prefill_tok / r.prefill_s : 0.0, r.decode_median_s * 1e3,
               r.decode_median_s > 0 ? r.batch / r.decode_median_s : 0.0, r.prefill_s + r.decode_total_s);
  }
  if (!a.breakdown) return;
  fmt::print("decode step breakdown (mean per step, ms; layer parts from the model's events, summed over layers):\n");
  fmt::print("{:>6} {:>10} {:>10} {:>10} {:>10} {:>10} {:>12}\n", "batch", "step", "attention", "mlp", "moe", "rest",
             "graph steps");
  for (const Row& r : rows) {
    const double step = mean_step(r);
    fmt::print("{:>6} {:>10.3f} {:>10.3f} {:>10.3f} {:>10.3f} {:>10.3f} {:>6}/{:<5}\n", r.batch, step * 1e3,
               r.attention_s * 1e3, r.mlp_s * 1e3, r.moe_s * 1e3, (step - r.attention_s - r.mlp_s - r.moe_s) * 1e3,
               r.graph_steps, r.decode_steps);
  }
}

}  // namespace

void register_bench_one_batch_command(CLI::App& app) {
  auto args = std::make_shared<BenchArgs>();
  CLI::App* cmd = app.add_subcommand("bench-one-batch",
                                     "Prefill and decode latency of a static batch through the model (no scheduler)");
  cmd->add_option("--model", args->model_dir, "Model directory or a preset with --load-format dummy (glm5-shard, glm5-small, glm45-air-shard; default: the embedded default model)");
  cmd->add_option("--load-format", args->load_format, "auto (checkpoint) or dummy (random weights)")
      ->check(parsed_by([](const std::string& v) { model::parse_load_format(v); }));
  CLI::Option* dummy_weights =
      cmd->add_option("--dummy-weights", args->dummy_weights, "Dummy weight format: bf16 or nvfp4 (default nvfp4)")
          ->check(parsed_by([](const std::string& v) { model::parse_dummy_weights(v); }));
  cmd->add_option("--batch-size", args->batch_sizes, "Batch sizes, comma separated (default 1,4,16)");
  cmd->add_option("--input-len", args->input_len, "Prompt tokens per sequence (default 64)");
  cmd->add_option("--output-len", args->output_len, "Decode steps (default 16)");
  cmd->add_option("--max-prefill-tokens", args->max_prefill_tokens,
                  "Prompt tokens per prefill forward (default 4096, as `serve`; -1: the whole batch in one forward, "
                  "which sizes the GPU model's workspaces for batch x input tokens)");
  cmd->add_option("--warmup", args->warmup, "Warm-up runs of each batch size before measuring it (default 1)");
  cmd->add_option("--seed", args->seed, "Seed of the random prompts and dummy weights (default 0)")->check(unsigned_64());
  add_device_options(*cmd, args->device);
  cmd->add_flag("--bf16-peer", args->bf16_peer,
                "cuda: run NVFP4 weights dequantized to BF16 through cuBLAS (the 16-bit path, for comparison)");
  cmd->add_flag("--breakdown", args->breakdown,
                "Trace the decode steps: mean time in attention, MLP, MoE and the rest (lm_head, host, sync)");
  cmd->add_flag("--profile-decode", args->profile_decode,
                "cuda: bracket the measured decode steps with cudaProfilerStart / Stop (for ncu --profile-from-start "
                "off, nsys --capture-range=cudaProfilerApi)");
  cmd->add_flag("--json", args->json, "Print one JSON object");
  cmd->callback([args, dummy_weights] {
    require_dummy_load({dummy_weights}, args->load_format);
    run_bench(*args);
  });
}

}  // namespace fp4moe::tools
