// The GPU models (model/cuda/gpu_models.h, --device cuda) on the golden GLM-4.5 and GLM-5 checkpoints
// (../shared/golden/models/glm4_moe_tiny{,_nvfp4}, glm5_tiny{,_nvfp4}; the GpuGolden cases run on all
// four), label gpu, skipped without a GPU. Checks, with
// the GPU bf16 tolerances of ../shared/golden/README.md (cosine >= 0.999 per position, top-1
// agreement >= 95%), and prints the numbers:
//   - prompt logits vs the golden logits (W4A16 kernels; the BF16 peer path on the BF16 checkpoint);
//   - teacher-forced greedy steps (prefill positions + decode through the paged KV cache): argmax
//     equal to the CPU model's and to the golden one on >= 95% of steps, cosine >= 0.999;
//   - prefill then decode == one full forward, two sequences in one step == each alone;
//   - a KV pool too small for a request refuses with the numbers and leaves the states usable;
//   - GLM-5: the golden checks run pinned to the f32 CPU model's DSA selections (bf16 flips near-ties
//     of the golden index scores; see "fragile in bf16" below); the GPU's own selections agree with
//     the CPU's on >= 90% of the keys; the selection matters (a dense copy, index_topk 2^20, is
//     further from the golden logits) and the dense copy matches the CPU dense model; "shared"
//     indexer layers with top-k 4 on dummy BF16/NVFP4 weights vs the CPU model, sparse decode ==
//     full forward, a mixed decode + prefill step with argmax;
//   - decode steps as captured CUDA graphs == the same steps run eagerly (GpuCudaGraphs);
//   - a NaN in one sequence's rows fails that sequence alone (SequenceError from the logits rows' flags, prefill and
//     decode), states unchanged, the other going on as on the unmodified model; a NaN weight all rows read: Error;
//   - without a GPU (CPU-only runs) GLM-5 with --device cuda fails naming the missing GPU (its GPU
//     factory is registered), not the registry's "no GPU implementation" refusal.
#include <cublas_v2.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <map>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "core/error.h"
#include "format/safetensors.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda_test_util.h"
#include "kernels/cpu/linear.h"
#include "kernels/cuda/moe/device_buffer.h"
#include "model/cuda/gpu_kv_cache.h"
#include "model/cuda/gpu_linear.h"
#include "model/cuda/gpu_models.h"
#include "moe/weights.h"
#include "core/dtype.h"
#include "model/checkpoint_edit.h"
#include "model/config.h"
#include "model/glm5.h"
#include "model/registry.h"
#include "model/dsa_selection_log.h"
#include "model/golden_data.h"
#include "engine/sampler.h"
#include "testing/testing.h"
#include "tune/autotune.h"
#include "tune/tune_cache.h"

namespace fp4moe::model {
namespace {

using golden::Golden;
using dsa_test::log_into;
using dsa_test::pinned_to;
using dsa_test::SelectionLog;
using golden::read_golden;

double cosine(const float* a, const float* b, int64_t n) {
  double ab = 0, aa = 0, bb = 0;
  for (int64_t i = 0; i < n; ++i) {
    ab += static_cast<double>(a[i]) * b[i];
    aa += static_cast<double>(a[i]) * a[i];
    bb += static_cast<double>(b[i]) * b[i];
  }
  return ab / std::sqrt(aa * bb + 1e-300);
}

int64_t argmax_of(const float* x, int64_t n) { return std::max_element(x, x + n) - x; }

// Per-row agreement of two [rows, V] logit sets.
struct Agreement {
  double min_cos = 1.0;
  int64_t top1_equal = 0, rows = 0, tight = 0;  // tight: rows with cosine >= 0.999
  void add(const float* got, const float* ref, int64_t V) {
    const double c = cosine(got, ref, V);
    min_cos = std::min(min_cos, c);
    tight += c >= 0.999;
    top1_equal += argmax_of(got, V) == argmax_of(ref, V);
    ++rows;
  }
  double top1() const { return rows ? static_cast<double>(top1_equal) / rows : 0.0; }
};

// The golden bf16 tolerance (README): cosine >= 0.999 at every position, top-1 >= 95%. Where the
// golden router has a near-tie that a bf16 MoE input flips (`router_near_tie`), the flipped token
// and the positions attending to it are off by one expert: there >= 90% of the positions must be
// >= 0.999 and none below 0.9 (measured on the H200: 30 of 32 prompt positions, 43 of 46
// teacher-forced ones, min cosine 0.949; the other positions 0.99993+). Measured on the f32 CPU model (2026-12-03): rounding nothing but
// the MoE layers' inputs to bf16 moves glm5_tiny's sequence 0 logits by 0.208 of the max logit
// (0.0016 on glm5_tiny_nvfp4, whose MLP weights differ); the golden README checks the greedy and
// DSA margins, not the router's.
void expect_bf16_tolerance(const Agreement& a, bool router_near_tie, const std::string& what) {
  if (router_near_tie) {
    EXPECT_GE(static_cast<double>(a.tight), 0.9 * static_cast<double>(a.rows)) << what;
    EXPECT_GE(a.min_cos, 0.9) << what;
  } else {
    EXPECT_GE(a.min_cos, 0.999) << what;
  }
  EXPECT_GE(a.top1(), 0.95) << what;
}

// Golden checkpoints with a router near-tie that bf16 activations flip (see above).
bool router_near_tie(const std::string& model) { return model == "glm5_tiny"; }

LoadOptions gpu_options(bool nvfp4_kernels = true, int64_t kv_tokens = 4096) {
  LoadOptions o;
  o.progress = false;
  o.device = Device::kCuda;
  o.gpu.max_tokens_per_step = 256;
  o.gpu.kv_tokens = kv_tokens;
  o.gpu.page_size = 16;
  o.gpu.nvfp4_kernels = nvfp4_kernels;
  return o;
}

// ---- GLM-5's DSA selections are fragile in bf16 ----
// The golden README promises a margin > 1e-4 between the k-th and (k+1)-th index scores: enough for
// an f32 forward, not for bf16 activations. The f32 CPU model with nothing but its attention inputs
// rounded to bf16 already picks other keys (max |logit diff| 0.64 of the max logit on glm5_tiny
// sequence 1; measured 2026-12-03), and the GPU model, bf16 throughout, flips some near-ties the
// same way. So the golden checks of the GLM-5 models run the GPU pinned to the f32 CPU model's
// selections (everything else in the forward must then meet the bf16 tolerance), and the GPU's own
// selections are compared with the CPU's separately (GpuGlm5.SparseSelection...: key overlap).

// The f32 CPU model's selections over one whole sequence (a prefix of it selects the same keys).
SelectionLog cpu_selections(const std::filesystem::path& dir, std::span<const int32_t> ids) {
  LoadOptions o;
  o.progress = false;
  auto cpu = load_model(dir, o);
  auto* dsa = dynamic_cast<GlmMoeDsaModel*>(cpu.get());
  EXPECT_NE(dsa, nullptr);
  SelectionLog log;
  if (dsa == nullptr) return log;
  dsa->set_dsa_observer(log_into(log, /*include_reused=*/false));
  auto st = cpu->new_state();
  cpu->forward_one(*st, ids, false);
  return log;
}

class GpuGolden : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    dir_ = fp4moe::testing::shared_path("golden/models/" + GetParam());
    golden_ = read_golden(dir_);
    SKIP_WITHOUT_GPU();
    register_gpu_models();
    if (GetParam().rfind("glm5", 0) == 0) {
      for (const auto& ids : golden_.greedy_ids) selections_.push_back(cpu_selections(dir_, ids));
    }
  }
  // GLM-5: pins `lm` to the CPU model's selections of golden sequence b (a no-op for GLM-4.5).
  void pin(CausalLM& lm, int64_t b) const {
    if (selections_.empty()) return;
    auto* dsa = dynamic_cast<GlmMoeDsaModel*>(&lm);
    ASSERT_NE(dsa, nullptr);
    dsa->set_dsa_selection_override(pinned_to(selections_[static_cast<size_t>(b)]));
  }
  const char* pinned_note() const { return selections_.empty() ? "" : ", DSA selections pinned to the CPU model's"; }
  std::filesystem::path dir_;
  Golden golden_;
  std::vector<SelectionLog> selections_;  // GLM-5: per golden sequence
};

TEST_P(GpuGolden, PromptLogitsMatchGoldenOnBothPaths) {
  for (bool fp4 : {true, false}) {
    auto lm = load_model(dir_, gpu_options(fp4));
    ASSERT_EQ(lm->vocab_size(), golden_.vocab);
    const int64_t V = golden_.vocab, S = golden_.prompt_len;
    Agreement a;
    for (int64_t b = 0; b < golden_.n_seq; ++b) {
      pin(*lm, b);
      auto st = lm->new_state();
      const std::vector<float> logits = lm->forward_one(*st, golden_.input_ids[static_cast<size_t>(b)], true);
      for (int64_t t = 0; t < S; ++t) a.add(logits.data() + t * V, golden_.logits.data() + (b * S + t) * V, V);
    }
    std::printf("%s (%s%s): prompt logits vs golden: min cosine %.6f (%lld of %lld positions >= 0.999), top-1 "
                "agreement %.1f%%\n",
                GetParam().c_str(), fp4 ? "W4A16 kernels" : "BF16 peer", pinned_note(), a.min_cos,
                static_cast<long long>(a.tight), static_cast<long long>(a.rows), 100 * a.top1());
    // The BF16 peer of an NVFP4 checkpoint rounds the dequantized weights to bf16: a different model,
    // not the golden one (the CPU f32 forward with those rounded weights already has min cosine 0.931
    // vs the golden logits on glm4_moe_tiny_nvfp4, one routing flip). It is checked on the BF16
    // checkpoint, where it runs the golden weights; for NVFP4 its numbers are printed only.
    const bool nvfp4_checkpoint = GetParam().find("nvfp4") != std::string::npos;
    if (fp4 || !nvfp4_checkpoint) {
      expect_bf16_tolerance(a, router_near_tie(GetParam()), fp4 ? "W4A16" : "BF16 peer");
    }
    if (fp4) std::printf("%s\n", lm->describe().c_str());
  }
}

// Teacher forcing over the golden greedy sequences: the prompt's positions come from one prefill
// (all logits), the rest from decode steps fed the golden tokens, on the GPU and the CPU model alike.
// Every position is one greedy step: its argmax must equal the CPU model's on >= 95% of them and the
// golden argmax on >= 95% (README), cosine >= 0.999 each. Free-running greedy is printed.
TEST_P(GpuGolden, TeacherForcedStepsAgreeWithCpuAndGolden) {
  auto gpu = load_model(dir_, gpu_options());
  LoadOptions cpu_opts;
  cpu_opts.progress = false;
  auto cpu = load_model(dir_, cpu_opts);
  const int64_t V = golden_.vocab, S = golden_.prompt_len, N = golden_.total_len;
  Agreement vs_golden, decode_vs_golden;
  int64_t same_as_cpu = 0, steps = 0, decode_same = 0, decode_steps = 0, greedy_equal = 0, greedy_total = 0;
  for (int64_t b = 0; b < golden_.n_seq; ++b) {
    const auto& ids = golden_.greedy_ids[static_cast<size_t>(b)];
    pin(*gpu, b);
    auto gs = gpu->new_state();
    auto cs = cpu->new_state();
    const std::vector<int32_t> prompt(ids.begin(), ids.begin() + S);
    const std::vector<float> gp = gpu->forward_one(*gs, prompt, true);
    const std::vector<float> cp = cpu->forward_one(*cs, prompt, true);
    for (int64_t t = 0; t + 1 < N; ++t) {  // position t predicts token t + 1
      std::vector<float> gl, cl;
      const float* g = nullptr;
      const float* c = nullptr;
      if (t < S) {
        g = gp.data() + t * V;
        c = cp.data() + t * V;
      } else {
        const std::vector<int32_t> tok{ids[static_cast<size_t>(t)]};
        gl = gpu->forward_one(*gs, tok, false);
        cl = cpu->forward_one(*cs, tok, false);
        g = gl.data();
        c = cl.data();
      }
      const float* ref = golden_.greedy_logits.data() + (b * N + t) * V;
      vs_golden.add(g, ref, V);
      const bool same = argmax_of(g, V) == argmax_of(c, V);
      same_as_cpu += same;
      ++steps;
      if (t >= S - 1) {
        decode_vs_golden.add(g, ref, V);
        decode_same += same;
        ++decode_steps;
      }
    }
    EXPECT_EQ(gs->length(), N - 1);
    auto fs = gpu->new_state();  // free-running greedy on the GPU alone, until it first differs
    std::vector<float> l = gpu->forward_one(*fs, prompt, false);
    for (int64_t i = 0; S + i < N; ++i) {
      const auto next = static_cast<int32_t>(argmax_of(l.data(), V));
      ++greedy_total;
      if (next != ids[static_cast<size_t>(S + i)]) break;
      ++greedy_equal;
      if (S + i + 1 < N) l = gpu->forward_one(*fs, std::vector<int32_t>{next}, false);
    }
  }
  std::printf("%s%s: %lld teacher-forced steps: vs golden min cosine %.6f, top-1 %.1f%%; argmax = CPU model on %.1f%%"
              " (generated positions only: top-1 %.1f%%, = CPU %lld of %lld); free greedy = golden for %lld of %lld"
              " tokens before the first difference\n",
              GetParam().c_str(), pinned_note(), static_cast<long long>(steps), vs_golden.min_cos, 100 * vs_golden.top1(),
              100.0 * static_cast<double>(same_as_cpu) / static_cast<double>(steps), 100 * decode_vs_golden.top1(),
              static_cast<long long>(decode_same), static_cast<long long>(decode_steps),
              static_cast<long long>(greedy_equal), static_cast<long long>(greedy_total));
  std::printf("%s: %lld of %lld teacher-forced positions >= 0.999\n", GetParam().c_str(),
              static_cast<long long>(vs_golden.tight), static_cast<long long>(vs_golden.rows));
  expect_bf16_tolerance(vs_golden, router_near_tie(GetParam()), "teacher-forced steps vs golden");
  EXPECT_GE(static_cast<double>(same_as_cpu), 0.95 * static_cast<double>(steps));
}

// The prefix cache's copies (KvState::copy_prefix: the GPU state shares whole pages): a copy of the
// first 32 tokens continued with the rest gives the full forward's logits; the source, still holding
// the shared pages, continues unchanged by the copy's writes (its next step equals that of a state
// no one copied); the pages are freed when both are gone.
TEST_P(GpuGolden, CopiedPrefixContinuesLikeTheFullForward) {
  auto lm = load_model(dir_, gpu_options());
  const int64_t V = golden_.vocab, N = golden_.total_len;
  const auto& ids = golden_.greedy_ids[1];
  ASSERT_GT(N, 18);  // a whole page of 16 to copy and at least one token past it (golden: 24)
  auto full_state = lm->new_state();
  const std::vector<float> full = lm->forward_one(*full_state, ids, true);

  auto src = lm->new_state();
  lm->forward_one(*src, std::span<const int32_t>(ids.data(), static_cast<size_t>(N - 1)), false);
  std::unique_ptr<KvState> copy = src->copy_prefix(N - 2);
  ASSERT_NE(copy, nullptr);
  const int64_t n = copy->length();
  EXPECT_EQ(n, (N - 2) / 16 * 16) << "whole pages of 16";
  const std::vector<float> rest =
      lm->forward_one(*copy, std::span<const int32_t>(ids.data() + n, static_cast<size_t>(N - n)), true);
  for (int64_t t = n; t < N; ++t) {
    EXPECT_GE(cosine(rest.data() + (t - n) * V, full.data() + t * V, V), 0.9999) << "copy, position " << t;
    EXPECT_EQ(argmax_of(rest.data() + (t - n) * V, V), argmax_of(full.data() + t * V, V)) << "copy, position " << t;
  }
  const std::vector<float> src_next = lm->forward_one(*src, std::span<const int32_t>(ids.data() + N - 1, 1), false);
  EXPECT_GE(cosine(src_next.data(), full.data() + (N - 1) * V, V), 0.9999) << "the source after the copy's writes";
  auto* gs = dynamic_cast<GpuKvState*>(src.get());
  ASSERT_NE(gs, nullptr);
  const int32_t shared_block = gs->blocks()[0];
  EXPECT_EQ(dynamic_cast<GpuKvState&>(*copy).blocks()[0], shared_block);
  src.reset();
  copy.reset();
  auto probe = lm->new_state();
  lm->forward_one(*probe, std::span<const int32_t>(ids.data(), 1), false);  // the pool still works
  EXPECT_EQ(probe->length(), 1);
}

TEST_P(GpuGolden, PrefillDecodeAndBatchingAgreeWithOneFullForward) {
  auto lm = load_model(dir_, gpu_options());
  const int64_t V = golden_.vocab, N = golden_.total_len;
  const auto& ids = golden_.greedy_ids[1];
  auto full_state = lm->new_state();
  const std::vector<float> full = lm->forward_one(*full_state, ids, true);
  for (int64_t split : {int64_t{1}, int64_t{17}, N - 1}) {
    auto st = lm->new_state();
    std::vector<float> got = lm->forward_one(*st, std::span<const int32_t>(ids.data(), static_cast<size_t>(split)), true);
    for (int64_t t = split; t < N; ++t) {
      std::vector<float> step = lm->forward_one(*st, std::span<const int32_t>(ids.data() + t, 1), false);
      got.insert(got.end(), step.begin(), step.end());
    }
    ASSERT_EQ(got.size(), full.size());
    for (int64_t t = 0; t < N; ++t) {
      EXPECT_GE(cosine(got.data() + t * V, full.data() + t * V, V), 0.9999) << "prefill " << split << " position " << t;
    }
  }
  // Two sequences of different lengths in one step (and then one decode step each, together).
  const auto& a_ids = golden_.greedy_ids[0];
  const int64_t na = 9, nb = N;
  auto sa = lm->new_state(), sb = lm->new_state();
  std::vector<float> la(static_cast<size_t>(na * V)), lb(static_cast<size_t>(V));
  const SeqChunk chunks[] = {{sa.get(), std::span<const int32_t>(a_ids.data(), na), la.data(), true},
                             {sb.get(), std::span<const int32_t>(ids.data(), nb), lb.data(), false}};
  lm->forward(chunks);
  auto alone = lm->new_state();
  const std::vector<float> la_alone = lm->forward_one(*alone, std::span<const int32_t>(a_ids.data(), na), true);
  for (int64_t t = 0; t < na; ++t) EXPECT_GE(cosine(la.data() + t * V, la_alone.data() + t * V, V), 0.9999) << t;
  EXPECT_GE(cosine(lb.data(), full.data() + (N - 1) * V, V), 0.9999);
  EXPECT_EQ(sa->length(), na);
  EXPECT_EQ(sb->length(), nb);
  // SeqChunk::argmax: a, argmax only; b, logits and argmax, in one decode step.
  ASSERT_TRUE(lm->supports_argmax());
  const int32_t ta = a_ids[static_cast<size_t>(na)], tb = 7;
  int32_t am_a = -1, am_b = -1;
  std::vector<float> lb2(static_cast<size_t>(V));
  const SeqChunk step[] = {{sa.get(), std::span<const int32_t>(&ta, 1), nullptr, false, &am_a},
                           {sb.get(), std::span<const int32_t>(&tb, 1), lb2.data(), false, &am_b}};
  lm->forward(step);
  EXPECT_EQ(am_b, argmax_of(lb2.data(), V));
  std::vector<int32_t> a_hist(a_ids.begin(), a_ids.begin() + na + 1);
  auto a2 = lm->new_state();
  const std::vector<float> la2 = lm->forward_one(*a2, a_hist, false);
  EXPECT_EQ(am_a, argmax_of(la2.data(), V));
}

// SeqChunk::sample (the engine's --device cuda default for temperature / top-k / top-p / min-p): the
// model draws on the device. Twin states fed the same tokens in the same batch shapes return their
// logits instead, and engine::sample_from on those logits with the same knobs and u must give the
// device's token: decode-only steps of two sequences (a CUDA graph on GLM-4.5; DSA steps run eagerly)
// and steps with a prefill chunk beside them (eager, the lm_head passes of run_lm_head).
TEST_P(GpuGolden, DeviceSamplingEqualsTheHostDrawOnTheSameLogits) {
  auto lm = load_model(dir_, gpu_options());
  const int64_t V = golden_.vocab;
  const auto& ids = golden_.greedy_ids[0];
  std::mt19937_64 rng(testing::test_seed());
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  const DeviceSampling knobs[] = {{0.0, 1.0, 1.0, 0.0, -1}, {0.0, 0.7, 0.9, 0.0, 20}, {0.0, 1.3, 0.95, 0.05, -1},
                                  {0.0, 0.5, 1.0, 0.0, 5}};
  const auto host_draw = [&](const float* logits, const DeviceSampling& d) {
    engine::SamplingParams p;
    p.temperature = d.temperature;
    p.top_k = d.top_k;
    p.top_p = d.top_p;
    p.min_p = d.min_p;
    return engine::sample_from(logits, V, p, d.u);
  };
  std::unique_ptr<KvState> dev[2], host[2];
  int64_t len[2] = {8, 13};
  for (int s = 0; s < 2; ++s) {
    dev[s] = lm->new_state();
    host[s] = lm->new_state();
    const std::span<const int32_t> prompt(ids.data(), static_cast<size_t>(len[s]));
    lm->forward_one(*dev[s], prompt, false);
    lm->forward_one(*host[s], prompt, false);
  }
  int64_t draws = 0;
  for (int step = 0; step < 6; ++step) {
    const bool with_prefill = step % 2 == 1;
    DeviceSampling d[2];
    int32_t tok[2] = {-1, -1}, fresh_tok = -1;
    std::vector<float> l[2] = {std::vector<float>(static_cast<size_t>(V)), std::vector<float>(static_cast<size_t>(V))};
    std::vector<float> fresh_logits(static_cast<size_t>(V));
    const int32_t in[2] = {ids[static_cast<size_t>(len[0])], ids[static_cast<size_t>(len[1])]};
    for (int s = 0; s < 2; ++s) {
      d[s] = knobs[(step + s) % 4];
      d[s].u = unit(rng);
    }
    auto fresh_dev = lm->new_state(), fresh_host = lm->new_state();
    const std::span<const int32_t> fresh_prompt(ids.data(), 5);
    std::vector<SeqChunk> dev_step = {{dev[0].get(), std::span<const int32_t>(&in[0], 1), nullptr, false, &tok[0], &d[0]},
                                      {dev[1].get(), std::span<const int32_t>(&in[1], 1), nullptr, false, &tok[1], &d[1]}};
    std::vector<SeqChunk> host_step = {{host[0].get(), std::span<const int32_t>(&in[0], 1), l[0].data(), false},
                                       {host[1].get(), std::span<const int32_t>(&in[1], 1), l[1].data(), false}};
    if (with_prefill) {
      dev_step.push_back({fresh_dev.get(), fresh_prompt, nullptr, false, &fresh_tok});
      host_step.push_back({fresh_host.get(), fresh_prompt, fresh_logits.data(), false});
    }
    lm->forward(dev_step);
    lm->forward(host_step);
    for (int s = 0; s < 2; ++s) {
      EXPECT_EQ(tok[s], host_draw(l[s].data(), d[s]))
          << "step " << step << (with_prefill ? " (with a prefill chunk)" : " (decode only)") << ", sequence " << s
          << ": T " << d[s].temperature << ", top_k " << d[s].top_k << ", top_p " << d[s].top_p << ", min_p "
          << d[s].min_p << ", u " << d[s].u;
      ++draws;
      ++len[s];
    }
    if (with_prefill) {
      EXPECT_EQ(fresh_tok, argmax_of(fresh_logits.data(), V)) << "step " << step;
    }
  }
  EXPECT_EQ(draws, 12);
}

TEST_P(GpuGolden, ShortKvPoolRefusesWithNumbersAndKeepsServing) {
  auto lm = load_model(dir_, gpu_options(true, /*kv_tokens=*/32));  // 2 blocks of 16
  const auto& ids = golden_.greedy_ids[0];
  auto a = lm->new_state();
  lm->forward_one(*a, std::span<const int32_t>(ids.data(), 20), false);  // 2 blocks
  auto b = lm->new_state();
  try {
    lm->forward_one(*b, std::span<const int32_t>(ids.data(), 4), false);
    FAIL() << "a step beyond the KV pool succeeded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("but only 0 of 2 are free"), std::string::npos) << e.what();
  }
  EXPECT_EQ(b->length(), 0);
  a.reset();  // frees its blocks
  const std::vector<float> l = lm->forward_one(*b, std::span<const int32_t>(ids.data(), 4), false);
  EXPECT_EQ(b->length(), 4);
  EXPECT_TRUE(std::isfinite(l[0]));
}

// --mem-fraction-static: the pool is made after the weights and buffers from what the share of the free GPU memory
// leaves, --max-total-tokens (kv_tokens) its cap (0.999 leaves room for 64 tokens beside other tests' allocations).
// The refusal of a share the load passed is test_server_gpu's (run alone: other tests' processes change the free
// memory while a model loads) and GpuKvMemory's arithmetic.
TEST_P(GpuGolden, KvPoolSizedFromMemoryFractionIsCapped) {
  LoadOptions o = gpu_options(true, /*kv_tokens=*/64);
  o.gpu.mem_fraction_static = 0.999;
  auto lm = load_model(dir_, o);
  EXPECT_EQ(lm->kv_pool_tokens(), 64);
  EXPECT_EQ(lm->describe_kv_pool().rfind("KV cache: 4 blocks x 16 tokens", 0), 0u) << lm->describe_kv_pool();
  EXPECT_NE(lm->describe_kv_pool().find("sized by --mem-fraction-static 0.999 ("), std::string::npos)
      << lm->describe_kv_pool();
  EXPECT_NE(lm->describe().find(lm->describe_kv_pool()), std::string::npos) << lm->describe();
  const auto& ids = golden_.greedy_ids[0];
  auto s = lm->new_state();
  const std::vector<float> l = lm->forward_one(*s, std::span<const int32_t>(ids.data(), 20), false);
  EXPECT_TRUE(std::isfinite(l[0]));
  lm.reset();
  auto fixed = load_model(dir_, gpu_options(true, 48));  // the fixed size: kv_tokens
  EXPECT_EQ(fixed->kv_pool_tokens(), 48);
  EXPECT_EQ(fixed->describe_kv_pool().find("sized by"), std::string::npos) << fixed->describe_kv_pool();
}

// GpuLinear alone: both paths (W4A16 kernels, BF16 cuBLAS from the dequantized weight) and the
// f32-output lm_head path vs kernels::cpu::linear_forward on the same bf16 inputs, random NVFP4 and
// BF16 weights with and without bias, 1..600 rows: cosine >= 0.9999 per row. NVFP4 Linears also run
// with a dequantization scratch: 600 rows then take the prefill path (bf16 weights + cuBLAS).
TEST(GpuLinear, BothPathsMatchTheCpuLinear) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(fp4moe::testing::test_seed());
  cublasHandle_t h = nullptr;
  ASSERT_EQ(cublasCreate(&h), CUBLAS_STATUS_SUCCESS);
  for (const auto fmt : {kernels::cpu::WeightFormat::kNVFP4, kernels::cpu::WeightFormat::kBF16}) {
    for (const auto& [out, in] : {std::pair<int64_t, int64_t>{64, 128}, {4096, 6144}, {136, 2064}}) {
      for (bool bias : {false, true}) {
        const auto w = moe::random_linear(fmt, out, in, rng(), bias);
        for (int64_t m : {int64_t{1}, int64_t{7}, int64_t{300}, int64_t{600}}) {
          if (m == 600 && out * in > 1000000) continue;  // the CPU reference of 600 x 4096 x 6144 is slow
          std::vector<uint16_t> xb(static_cast<size_t>(m * in));
          std::normal_distribution<float> d(0.0f, 1.0f);
          for (auto& v : xb) v = f32_to_bf16(d(rng));
          std::vector<float> xf(xb.size()), ref(static_cast<size_t>(m * out));
          for (size_t i = 0; i < xb.size(); ++i) xf[i] = bf16_to_f32(xb[i]);
          kernels::cpu::linear_forward(w, xf.data(), m, ref.data());
          cuda::DeviceBuffer dx = cuda::DeviceBuffer::from_host(xb), dy(static_cast<size_t>(m * out) * 4);
          for (int variant : {0, 1, 2}) {  // W4A16 (NVFP4 weights), + dequantization scratch, BF16 cuBLAS
            const bool fp4 = variant < 2;
            GpuLinear g = GpuLinear::upload(w, 1024, "test", fp4);
            if (variant == 1) share_dequant_scratch({&g});
            const bool nvfp4 = g.path() == GpuLinear::Path::kNvfp4W4A16;
            EXPECT_EQ(g.dequant_path(m), variant == 1 && nvfp4 && m >= kLinearDequantMinRows) << g.describe();
            g.forward(h, dx.as<__nv_bfloat16>(), m, dy.as<__nv_bfloat16>(), nullptr);
            ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
            const std::vector<uint16_t> yb = dy.to_host<uint16_t>(static_cast<size_t>(m * out));
            std::vector<float> y(yb.size());
            for (size_t i = 0; i < yb.size(); ++i) y[i] = bf16_to_f32(yb[i]);
            for (int64_t r = 0; r < m; ++r) {
              ASSERT_GE(cosine(y.data() + r * out, ref.data() + r * out, out), 0.9999)
                  << g.describe() << " m=" << m << " row " << r;
            }
            if (!bias && !fp4) {
              g.forward_f32(h, dx.as<__nv_bfloat16>(), m, dy.as<float>(), nullptr);
              const std::vector<float> yf = dy.to_host<float>(static_cast<size_t>(m * out));
              for (int64_t r = 0; r < m; ++r) {
                ASSERT_GE(cosine(yf.data() + r * out, ref.data() + r * out, out), 0.9999) << "f32 out, row " << r;
              }
            }
          }
        }
      }
    }
  }
  cublasDestroy(h);
}

INSTANTIATE_TEST_SUITE_P(Glm4, GpuGolden, ::testing::Values("glm4_moe_tiny", "glm4_moe_tiny_nvfp4"));
INSTANTIATE_TEST_SUITE_P(Glm5, GpuGolden, ::testing::Values("glm5_tiny", "glm5_tiny_nvfp4"));

// ---- GLM-5 (GlmMoeDsaForCausalLM) beyond the golden cases above ----
// The golden glm5_tiny has index_topk 8 < its 16/24-token sequences, so GpuGolden already runs the
// sparse DSA path there: prefill with a CSR key selection (mla_prefill_attention), decode steps
// past 8 keys through mla_prefill_attention with q_len 1 and the selection, the dense decode kernel
// (mla_decode_attention) for the first steps of the prefill-1 case, mixed batches and SeqChunk::argmax.

// Per-row agreement on dummy weights (a fresh seed per run; FP4MOE_TEST_SEED replays one), whose
// router and logits have near-ties that bf16 activations flip: >= 80% of the rows at cosine >=
// 0.999, none below 0.9, argmax equal on >= 85% (measured on the H200, pinned to the CPU's DSA
// selections: over 4 seeds 19-20 of 20 rows, min cosine 0.993, top-1 90-100%; over 7 more in the
// eleventh session 17-20 of 20, min cosine 0.9856, top-1 90-100% — seed 113840501385 has 17, with
// the MoE row classes on or off alike, so 90% failed one seed in ~10).
void expect_close_rows(const std::vector<float>& got, const std::vector<float>& ref, int64_t V, const std::string& what) {
  ASSERT_EQ(got.size(), ref.size()) << what;
  const int64_t n = static_cast<int64_t>(ref.size()) / V;
  Agreement a;
  for (int64_t t = 0; t < n; ++t) a.add(got.data() + t * V, ref.data() + t * V, V);
  std::printf("%s: min cosine %.6f, %lld of %lld rows >= 0.999, top-1 agreement %.1f%%\n", what.c_str(), a.min_cos,
              static_cast<long long>(a.tight), static_cast<long long>(n), 100 * a.top1());
  EXPECT_GE(a.min_cos, 0.9) << what;
  EXPECT_GE(static_cast<double>(a.tight), 0.8 * static_cast<double>(n)) << what;
  EXPECT_GE(a.top1(), 0.85) << what;
}

// The sparse selection on the GPU, and the dense attention path on its own, on glm5_tiny's first
// greedy sequence (24 tokens, index_topk 8):
//   - the GPU's own selections vs the f32 CPU model's: >= 90% of the keys of the sparse queries
//     (position >= 8) agree (bf16 flips some near-ties; a broken indexer would keep ~half);
//   - pinned to the CPU's selections the GPU logits match the golden ones (expect_bf16_tolerance), and
//     unpinned they do at every position before the first sparse query; the rest is printed;
//   - a copy with index_topk 2^20 (every query keeps all its keys: no indexer selection, dense
//     mla_prefill_attention, mla_decode_attention for decode) agrees with the CPU model of that
//     config (cosine >= 0.999, top-1 >= 95%) and is further from the golden (sparse) logits than
//     the pinned sparse GPU model is; prefill 5 + dense decode steps == the dense full forward;
//   - an override that is not a selection the indexer could make is refused with the numbers and
//     the state is unchanged.
TEST(GpuGlm5, SparseSelectionAgreesWithCpuAndDenseCopyMatchesCpu) {
  const std::filesystem::path dir = fp4moe::testing::shared_path("golden/models/glm5_tiny");
  const Golden g = read_golden(dir);
  SKIP_WITHOUT_GPU();
  register_gpu_models();
  const ModelConfig cfg = load_model_config(dir);
  ModelConfig dense_cfg = cfg;
  dense_cfg.index_topk = 1 << 20;
  format::TensorStore store(dir);
  LoadOptions cpu_opts;
  cpu_opts.progress = false;
  auto sparse_gpu = create_glm5_cuda(cfg, store, gpu_options());
  auto dense_gpu = create_glm5_cuda(dense_cfg, store, gpu_options());
  auto dense_cpu = create_glm_moe_dsa(dense_cfg, store, cpu_opts);
  auto* dsa = dynamic_cast<GlmMoeDsaModel*>(sparse_gpu.get());
  ASSERT_NE(dsa, nullptr);
  const int64_t V = g.vocab, N = g.total_len, topk = cfg.index_topk;
  const std::vector<int32_t>& ids = g.greedy_ids[0];
  const SelectionLog cpu_sel = cpu_selections(dir, ids);

  SelectionLog gpu_sel;
  dsa->set_dsa_observer(log_into(gpu_sel, /*include_reused=*/false));
  auto s0 = sparse_gpu->new_state();
  const std::vector<float> own = sparse_gpu->forward_one(*s0, ids, true);
  dsa->set_dsa_observer({});
  ASSERT_EQ(gpu_sel.size(), cpu_sel.size());
  int64_t keys = 0, keys_same = 0, lists = 0, lists_same = 0;
  for (const auto& [key, c] : cpu_sel) {
    const auto it = gpu_sel.find(key);
    ASSERT_NE(it, gpu_sel.end()) << "layer " << key.first << " position " << key.second;
    ASSERT_EQ(it->second.size(), c.size()) << "layer " << key.first << " position " << key.second;
    if (key.second < topk) {
      EXPECT_EQ(it->second, c) << "dense query: layer " << key.first << " position " << key.second;
      continue;
    }
    for (int32_t k : c) keys_same += std::binary_search(it->second.begin(), it->second.end(), k);
    keys += static_cast<int64_t>(c.size());
    lists_same += it->second == c;
    ++lists;
  }

  dsa->set_dsa_selection_override(pinned_to(cpu_sel));
  auto s1 = sparse_gpu->new_state();
  const std::vector<float> pinned = sparse_gpu->forward_one(*s1, ids, true);
  auto s2 = dense_gpu->new_state(), s3 = dense_cpu->new_state();
  const std::vector<float> dense = dense_gpu->forward_one(*s2, ids, true);
  const std::vector<float> dense_ref = dense_cpu->forward_one(*s3, ids, true);
  Agreement own_vs_golden, own_dense_part, pinned_vs_golden, dense_vs_golden, dense_vs_cpu;
  for (int64_t t = 0; t < N; ++t) {
    const float* golden = g.greedy_logits.data() + t * V;
    own_vs_golden.add(own.data() + t * V, golden, V);
    if (t < topk) own_dense_part.add(own.data() + t * V, golden, V);
    pinned_vs_golden.add(pinned.data() + t * V, golden, V);
    dense_vs_golden.add(dense.data() + t * V, golden, V);
    dense_vs_cpu.add(dense.data() + t * V, dense_ref.data() + t * V, V);
  }
  std::printf("glm5_tiny GPU selections vs the CPU's (%lld sparse queries x %d full layers): %.1f%% of keys, %lld of "
              "%lld lists identical\n",
              static_cast<long long>(N - topk), static_cast<int>(lists / std::max<int64_t>(N - topk, 1)),
              100.0 * static_cast<double>(keys_same) / static_cast<double>(std::max<int64_t>(keys, 1)),
              static_cast<long long>(lists_same), static_cast<long long>(lists));
  std::printf("glm5_tiny GPU vs golden: own selections min cosine %.6f top-1 %.1f%% (positions < %lld: %.6f); pinned "
              "%.6f top-1 %.1f%%; dense (top-k 2^20) %.6f, vs the CPU dense model %.6f (top-1 %.1f%%)\n",
              own_vs_golden.min_cos, 100 * own_vs_golden.top1(), static_cast<long long>(topk), own_dense_part.min_cos,
              pinned_vs_golden.min_cos, 100 * pinned_vs_golden.top1(), dense_vs_golden.min_cos, dense_vs_cpu.min_cos,
              100 * dense_vs_cpu.top1());
  EXPECT_GT(lists, 0);
  EXPECT_GE(static_cast<double>(keys_same), 0.9 * static_cast<double>(keys));
  EXPECT_GE(own_dense_part.min_cos, 0.999);
  std::printf("glm5_tiny pinned: %lld of %lld positions >= 0.999\n", static_cast<long long>(pinned_vs_golden.tight),
              static_cast<long long>(pinned_vs_golden.rows));
  expect_bf16_tolerance(pinned_vs_golden, router_near_tie("glm5_tiny"), "pinned to the CPU's selections");
  EXPECT_GE(dense_vs_cpu.min_cos, 0.999);
  EXPECT_GE(dense_vs_cpu.top1(), 0.95);
  EXPECT_LT(dense_vs_golden.min_cos, pinned_vs_golden.min_cos) << "the DSA selection does not change the GPU logits";

  // A key past the query's position: refused with the numbers, nothing committed.
  dsa->set_dsa_selection_override([&](int64_t layer, size_t chunk, std::span<const int64_t> q_pos) {
    KeySelection k = pinned_to(cpu_sel)(layer, chunk, q_pos);
    k.idx.back() = static_cast<int32_t>(q_pos.back() + 1);
    return k;
  });
  auto s4 = sparse_gpu->new_state();
  try {
    sparse_gpu->forward_one(*s4, ids, false);
    ADD_FAILURE() << "a selection with a future key was used";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("(keys must be ascending, distinct, in 0.." + std::to_string(N - 1) + ")"),
              std::string::npos)
        << e.what();
  }
  EXPECT_EQ(s4->length(), 0);
  dsa->set_dsa_selection_override({});

  auto st = dense_gpu->new_state();
  std::vector<float> inc = dense_gpu->forward_one(*st, std::span<const int32_t>(ids.data(), 5), true);
  for (int64_t t = 5; t < N; ++t) {
    const std::vector<float> l = dense_gpu->forward_one(*st, std::span<const int32_t>(ids.data() + t, 1), false);
    inc.insert(inc.end(), l.begin(), l.end());
  }
  ASSERT_EQ(inc.size(), dense.size());
  for (int64_t t = 0; t < N; ++t) {
    EXPECT_GE(cosine(inc.data() + t * V, dense.data() + t * V, V), 0.9999) << "dense decode, position " << t;
  }
}

// "shared" indexer layers (reusing layer 0's selection) and a small top-k (4, so nearly every query
// is sparse), on deterministic dummy weights (BF16 and NVFP4; tests/model/test_glm5.cpp's config):
//   - the GPU full forward (20 tokens, all logits) vs the CPU model on the same checkpoint;
//   - prefill 9 then 11 decode steps (DSA decode through mla_prefill_attention, q_len 1) == the GPU
//     full forward (cosine >= 0.9999 per position);
//   - a mixed step: one sequence decoding, one prefilling 6 tokens, argmax only for the first ==
//     each alone.
ModelConfig glm5_shared_indexer_config() {
  nlohmann::json j = load_model_config(fp4moe::testing::shared_path("golden/models/glm5_tiny")).raw;
  j["indexer_types"] = {"full", "shared", "shared"};
  j["index_topk"] = 4;
  return parse_model_config(j, "glm5_tiny with shared indexer layers and index_topk 4");
}

TEST(GpuGlm5, SharedIndexerLayersAndSparseDecodeMatchCpu) {
  const ModelConfig cfg = glm5_shared_indexer_config();
  SKIP_WITHOUT_GPU();
  register_gpu_models();
  const int64_t V = cfg.vocab_size;
  for (DummyWeights dw : {DummyWeights::kBF16, DummyWeights::kNVFP4}) {
    const std::string name = dw == DummyWeights::kNVFP4 ? "dummy NVFP4" : "dummy BF16";
    LoadOptions cpu_opts;
    cpu_opts.progress = false;
    cpu_opts.seed = fp4moe::testing::test_seed();
    cpu_opts.dummy_weights = dw;
    const std::filesystem::path tmp =
        std::filesystem::temp_directory_path() /
        ("fp4moe-test-gpu-glm5-" + std::to_string(static_cast<int>(dw)) + "-" + std::to_string(getpid()));
    write_dummy_checkpoint(cfg, cpu_opts, tmp);
    std::unique_ptr<CausalLM> gpu, cpu;
    {
      format::TensorStore store(tmp);
      gpu = create_glm5_cuda(cfg, store, gpu_options());
      cpu = create_glm_moe_dsa(cfg, store, cpu_opts);
    }
    std::filesystem::remove_all(tmp);
    std::vector<int32_t> ids(20);
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>((cpu_opts.seed + 37 * i) % cfg.vocab_size);

    // vs the CPU model: pinned to the CPU's selections (top-k 4 of dummy index scores has near-ties
    // that bf16 flips, as on the golden model), then the GPU's own selections' key overlap.
    SelectionLog cpu_sel, gpu_sel;
    auto* cpu_dsa = dynamic_cast<GlmMoeDsaModel*>(cpu.get());
    auto* gpu_dsa = dynamic_cast<GlmMoeDsaModel*>(gpu.get());
    ASSERT_TRUE(cpu_dsa != nullptr && gpu_dsa != nullptr);
    cpu_dsa->set_dsa_observer(log_into(cpu_sel, /*include_reused=*/false));
    auto cs = cpu->new_state();
    const std::vector<float> ref = cpu->forward_one(*cs, ids, true);
    gpu_dsa->set_dsa_selection_override(pinned_to(cpu_sel));
    auto ps = gpu->new_state();
    const std::vector<float> pinned = gpu->forward_one(*ps, ids, true);
    gpu_dsa->set_dsa_selection_override({});
    expect_close_rows(pinned, ref, V, name + " GPU full forward (CPU's selections) vs CPU");
    gpu_dsa->set_dsa_observer(log_into(gpu_sel, /*include_reused=*/false));
    auto gs = gpu->new_state();
    const std::vector<float> full = gpu->forward_one(*gs, ids, true);
    gpu_dsa->set_dsa_observer({});
    int64_t keys = 0, same = 0;
    for (const auto& [key, c] : cpu_sel) {
      const std::vector<int32_t>& g = gpu_sel.at(key);
      for (int32_t k : c) same += std::binary_search(g.begin(), g.end(), k);
      keys += static_cast<int64_t>(c.size());
    }
    std::printf("%s: GPU selections keep %.1f%% of the CPU's %lld keys\n", name.c_str(),
                100.0 * static_cast<double>(same) / static_cast<double>(keys), static_cast<long long>(keys));
    EXPECT_GE(static_cast<double>(same), 0.9 * static_cast<double>(keys)) << name;

    auto st = gpu->new_state();
    std::vector<float> inc = gpu->forward_one(*st, std::span<const int32_t>(ids.data(), 9), true);
    for (size_t t = 9; t < ids.size(); ++t) {
      const std::vector<float> l = gpu->forward_one(*st, std::span<const int32_t>(ids.data() + t, 1), false);
      inc.insert(inc.end(), l.begin(), l.end());
    }
    ASSERT_EQ(inc.size(), full.size());
    for (size_t t = 0; t < ids.size(); ++t) {
      EXPECT_GE(cosine(inc.data() + t * V, full.data() + t * V, V), 0.9999) << name << " position " << t;
    }

    // Mixed step: a (12 cached, decodes token 12, argmax only) with b (prefill of 6 tokens, all logits).
    auto a = gpu->new_state(), b = gpu->new_state();
    gpu->forward_one(*a, std::span<const int32_t>(ids.data(), 12), false);
    int32_t am_a = -1;
    std::vector<float> lb(static_cast<size_t>(6 * V));
    const SeqChunk step[] = {{a.get(), std::span<const int32_t>(ids.data() + 12, 1), nullptr, false, &am_a},
                             {b.get(), std::span<const int32_t>(ids.data() + 3, 6), lb.data(), true}};
    gpu->forward(step);
    EXPECT_EQ(am_a, argmax_of(full.data() + 12 * V, V)) << name;
    auto b_alone = gpu->new_state();
    const std::vector<float> lb_alone = gpu->forward_one(*b_alone, std::span<const int32_t>(ids.data() + 3, 6), true);
    for (int64_t t = 0; t < 6; ++t) {
      EXPECT_GE(cosine(lb.data() + t * V, lb_alone.data() + t * V, V), 0.9999) << name << " mixed step row " << t;
    }
  }
}

// ---- CUDA graphs (GpuOptions::cuda_graph_max_bs, --cuda-graph-max-bs) ----
// Decode steps run as captured graphs against the same steps run eagerly (cuda_graph_max_bs 0), on
// the golden NVFP4 checkpoints (GLM-5 with index_topk raised to 4096 so that every decode step is
// dense, i.e. capturable): 3 then 5 sequences (batch buckets 4 and 8: padding rows), prompts of
// 10..14 tokens decoded 24 steps (tables of 1, 2 and 3 blocks: table buckets 1, 2 and 4, each a new
// capture), the same arbitrary tokens fed to both; some rows ask only for the argmax. Per row cosine
// >= 0.9999 and argmax equal on >= 95% of rows (padding changes the W4A16 tile config and cuBLAS's
// algorithm, not the math), every decode step of the graph model ran as a graph, and its per-layer
// times (events recorded inside the graph) are there, with the MoE GEMM phases (the graph model runs
// with --time-moe-gemms; the eager one without, and its trace has no such parts). glm4_moe_tiny's BF16
// MoE layer reads its expert offsets on the host, so it cannot be captured: all its steps run eagerly
// and describe() says why.
// kGlm5DummyNvfp4: glm5_tiny's config on dummy NVFP4 weights for every Linear (the golden
// glm5_tiny_nvfp4 keeps its attention projections in BF16), so the GLM-5 latent branch runs on the
// model's second stream, inside the captured graphs too.
constexpr const char* kGlm5DummyNvfp4 = "glm5_tiny config, dummy nvfp4 weights";
std::unique_ptr<CausalLM> load_for_graphs(const std::string& name, int64_t graph_max_bs, bool time_moe_gemms = false) {
  const bool dummy = name == kGlm5DummyNvfp4;
  const std::filesystem::path dir = fp4moe::testing::shared_path("golden/models/" + (dummy ? std::string("glm5_tiny") : name));
  LoadOptions o = gpu_options();
  o.gpu.cuda_graph_max_bs = graph_max_bs;
  o.gpu.time_moe_gemms = time_moe_gemms;
  if (name.rfind("glm5", 0) != 0) return load_model(dir, o);
  nlohmann::json j = load_model_config(dir).raw;
  j["index_topk"] = 4096;
  const ModelConfig cfg = parse_model_config(j, name + " with index_topk 4096 (dense decode)");
  if (!dummy) {
    format::TensorStore store(dir);
    return create_glm5_cuda(cfg, store, o);
  }
  LoadOptions w;  // the same weights for every call: a fixed seed
  w.progress = false;
  w.seed = 1234;
  w.dummy_weights = DummyWeights::kNVFP4;
  const std::filesystem::path tmp = std::filesystem::temp_directory_path() /
                                    ("fp4moe-test-graphs-glm5-dummy-" + std::to_string(getpid()));
  write_dummy_checkpoint(cfg, w, tmp);
  std::unique_ptr<CausalLM> lm;
  {
    format::TensorStore store(tmp);
    lm = create_glm5_cuda(cfg, store, o);
  }
  std::filesystem::remove_all(tmp);
  return lm;
}

// The GPU models load the tune cache ($FP4MOE_TUNE_CACHE) at start, for the MoE layers and the dense
// Linears, and say so. Winners naming stream_m128n8_d4, which differs from the default stream_m256n8_d4
// only in the weight rows a CTA takes (each warp's arithmetic the same, in the same order; K = 128 is one
// scale group, so neither splits K), for the MoE gate_up shape at decode
// (bucket 1) and for the E = 1 shape [128, 128] (q_proj, o_proj and the shared expert's gate_up) and
// the dense MLP's gate / up [256, 128] at the prompt's 5 rows (bucket 8) and decode, give bit-identical
// logits; the load log names the cache, its winner count and what uses it.
TEST(GpuTuneCache, ModelLoadUsesTheCacheAndSaysSo) {
  const std::filesystem::path dir = fp4moe::testing::shared_path("golden/models/glm4_moe_tiny_nvfp4");
  SKIP_WITHOUT_GPU();
  register_gpu_models();
  const std::filesystem::path tmp =
      std::filesystem::temp_directory_path() / ("fp4moe_tune_model_" + std::to_string(::getpid()));
  std::filesystem::create_directories(tmp);
  const std::string path = (tmp / "tune.json").string();
  const char* old_env = std::getenv("FP4MOE_TUNE_CACHE");
  const std::string saved = old_env != nullptr ? old_env : "";
  ::setenv("FP4MOE_TUNE_CACHE", path.c_str(), 1);
  const ModelConfig cfg = load_model_config(dir);
  const std::vector<int32_t> prompt = {3, 17, 42, 5, 9};
  auto logits_of = [&](CausalLM& lm) {
    auto st = lm.new_state();
    lm.forward_one(*st, prompt, false);
    return lm.forward_one(*st, std::vector<int32_t>{7}, false);  // a decode step: 1 token
  };
  auto plain = load_model(dir, gpu_options());
  EXPECT_NE(plain->describe().find("W4A16 configs: no tune cache at " + path + ": built-in default for every shape"),
            std::string::npos)
      << plain->describe();
  const std::vector<float> want = logits_of(*plain);
  plain.reset();

  tune::TuneCache cache;
  const tune::GemmShape moe_gate_up{cfg.n_routed_experts, 2 * cfg.moe_intermediate_size, cfg.hidden_size};
  const tune::GemmShape dense_qo{1, cfg.hidden_size, cfg.hidden_size},
      dense_gate{1, cfg.intermediate_size, cfg.hidden_size};
  ASSERT_EQ(cfg.num_attention_heads * cfg.head_dim, cfg.hidden_size) << "q_proj is not [H, H] any more";
  for (const auto& [shape, bucket] : {std::pair{moe_gate_up, int64_t{1}},
                                      {dense_qo, int64_t{1}},
                                      {dense_qo, int64_t{8}},
                                      {dense_gate, int64_t{1}},
                                      {dense_gate, int64_t{8}}}) {
    tune::TuneEntry e;
    e.shape = shape;
    e.bucket = bucket;
    e.config = "w4a16_stream_m128n8_d4";
    e.config_id = tune::config_id_by_name(e.config);
    e.time_us = 1.0;
    e.iters = 1;
    e.n_candidates = 1;
    cache.put(tune::current_tune_key(), e);
  }
  cache.save(path);
  auto tuned = load_model(dir, gpu_options());
  // 2 MoE layers; 3 layers x q, k, v, o + the dense layer's gate, up, down, all NVFP4.
  EXPECT_NE(tuned->describe().find("W4A16 configs: tune cache " + path + ": 5 winners for this GPU and build"),
            std::string::npos)
      << tuned->describe();
  EXPECT_NE(tuned->describe().find("; used by 2 MoE layers and 15 dense Linears\n"), std::string::npos)
      << tuned->describe();
  EXPECT_EQ(logits_of(*tuned), want);
  tuned.reset();
  if (old_env != nullptr) {
    ::setenv("FP4MOE_TUNE_CACHE", saved.c_str(), 1);
  } else {
    ::unsetenv("FP4MOE_TUNE_CACHE");
  }
  std::filesystem::remove_all(tmp);
}

TEST(GpuCudaGraphs, DecodeStepsMatchEagerOnEveryBucket) {
  fp4moe::testing::shared_path("golden/models");  // fails when the golden data is missing
  SKIP_WITHOUT_GPU();
  register_gpu_models();
  for (const std::string& name :
       std::vector<std::string>{"glm4_moe_tiny_nvfp4", "glm5_tiny_nvfp4", kGlm5DummyNvfp4, "glm4_moe_tiny"}) {
    auto eager = load_for_graphs(name, 0);
    auto graph = load_for_graphs(name, 16, /*time_moe_gemms=*/true);
    if (name.rfind("glm5", 0) == 0) {  // the latent branch's stream: only with NVFP4 kv_a / wk
      EXPECT_EQ(graph->describe().find("latent branch (kv_a, indexer wk) on a second stream") != std::string::npos,
                name == kGlm5DummyNvfp4)
          << graph->describe();
    }
    EXPECT_NE(graph->describe().find("MoE GEMM timing events on (--time-moe-gemms)"), std::string::npos) << name;
    EXPECT_EQ(eager->describe().find("MoE GEMM timing events"), std::string::npos) << name;
    const bool capturable = name.find("nvfp4") != std::string::npos;
    EXPECT_NE(graph->describe().find(capturable ? "CUDA graphs: decode batches 1 2 4 8 16 (captured on first use)"
                                                : "CUDA graphs: off (a BF16 MoE layer"),
              std::string::npos)
        << graph->describe();
    const int64_t V = eager->vocab_size();
    const size_t n_layers = static_cast<size_t>(eager->config().num_hidden_layers);
    int64_t steps = 0, graph_steps = 0, rows = 0, top1 = 0;
    double min_cos = 1.0;
    for (int64_t n_seqs : {3, 5}) {
      std::vector<std::unique_ptr<KvState>> se, sg;
      for (int64_t i = 0; i < n_seqs; ++i) {
        std::vector<int32_t> prompt(static_cast<size_t>(10 + i));
        for (size_t k = 0; k < prompt.size(); ++k) prompt[k] = static_cast<int32_t>((31 * k + 7 * i + 1) % V);
        se.push_back(eager->new_state());
        sg.push_back(graph->new_state());
        eager->forward_one(*se.back(), prompt, false);
        graph->forward_one(*sg.back(), prompt, false);
      }
      for (int64_t s = 0; s < 24; ++s) {
        std::vector<int32_t> tok(static_cast<size_t>(n_seqs)), am(static_cast<size_t>(n_seqs), -1);
        std::vector<float> le(static_cast<size_t>(n_seqs * V)), lg(le.size());
        std::vector<SeqChunk> ce, cg;
        for (int64_t i = 0; i < n_seqs; ++i) {
          tok[static_cast<size_t>(i)] = static_cast<int32_t>((13 * s + 5 * i + 3) % V);
          const std::span<const int32_t> t(&tok[static_cast<size_t>(i)], 1);
          ce.push_back({se[static_cast<size_t>(i)].get(), t, le.data() + i * V, false});
          const bool argmax_only = s % 3 == 0 && i % 2 == 1;
          cg.push_back({sg[static_cast<size_t>(i)].get(), t, argmax_only ? nullptr : lg.data() + i * V, false,
                        argmax_only ? &am[static_cast<size_t>(i)] : nullptr});
        }
        ForwardTrace tr_eager;
        eager->forward(ce, s == 0 ? &tr_eager : nullptr);
        for (const LayerTiming& lt : tr_eager.layer_times) {
          EXPECT_NE(lt.part.rfind("moe.", 0), 0u) << name << ": GEMM phase " << lt.part << " without --time-moe-gemms";
        }
        if (s == 0) {
          EXPECT_EQ(tr_eager.layer_times.size(), 2 * n_layers) << name;
        }
        ForwardTrace tr;
        graph->forward(cg, &tr);
        ++steps;
        graph_steps += tr.cuda_graph_steps;
        // "attention" and "mlp" / "moe" per layer; after each "moe" its GEMM phases ("moe.routed_gate_up",
        // "moe.routed_down", and the shared expert's when it has one), each positive, together within it.
        size_t n_parts = 0;
        std::map<int64_t, double> moe_s, gemm_s;
        std::map<int64_t, int> gemm_parts;
        for (const LayerTiming& lt : tr.layer_times) {
          EXPECT_GT(lt.seconds, 0.0) << name << " layer " << lt.layer << " " << lt.part;
          if (lt.part.rfind("moe.", 0) == 0) {
            gemm_s[lt.layer] += lt.seconds;
            ++gemm_parts[lt.layer];
          } else {
            ++n_parts;
            if (lt.part == "moe") moe_s[lt.layer] = lt.seconds;
          }
        }
        EXPECT_EQ(n_parts, 2 * n_layers) << name << " step " << s;
        EXPECT_FALSE(moe_s.empty()) << name;
        for (const auto& [layer, t] : moe_s) {
          EXPECT_TRUE(gemm_parts[layer] == 2 || gemm_parts[layer] == 4) << name << " layer " << layer;
          EXPECT_LE(gemm_s[layer], t * 1.001 + 1e-6) << name << " layer " << layer << ": GEMM phases outside the moe part";
        }
        for (int64_t i = 0; i < n_seqs; ++i) {
          const float* e = le.data() + i * V;
          ++rows;
          if (cg[static_cast<size_t>(i)].logits == nullptr) {
            top1 += am[static_cast<size_t>(i)] == argmax_of(e, V);
            continue;
          }
          const float* g = lg.data() + i * V;
          min_cos = std::min(min_cos, cosine(g, e, V));
          top1 += argmax_of(g, V) == argmax_of(e, V);
        }
      }
    }
    std::printf("%s: %lld decode steps, %lld as CUDA graphs; vs eager: min cosine %.6f, argmax equal on %lld of %lld rows\n",
                name.c_str(), static_cast<long long>(steps), static_cast<long long>(graph_steps), min_cos,
                static_cast<long long>(top1), static_cast<long long>(rows));
    EXPECT_EQ(graph_steps, capturable ? steps : 0) << name;
    EXPECT_GE(min_cos, 0.9999) << name;
    EXPECT_GE(static_cast<double>(top1), 0.95 * static_cast<double>(rows)) << name;
  }
}

// A NaN confined to one sequence of a step (the embedding row of a token only it holds) is blamed on that batch
// entry: a SequenceError from the lm_head rows' NaN / Inf flags (cuda::argmax_rows), so the engine fails that
// request alone. In a prefill step with logits and in a decode step of argmaxes (a captured graph where the layers
// allow one), with the states unchanged; the other sequence then goes on exactly as on the unmodified
// model. A NaN weight every row reads is a plain Error (every request of the step fails).
TEST(GpuModel, NonFiniteLogitsAreBlamedOnTheirSequence) {
  SKIP_WITHOUT_GPU();
  register_gpu_models();
  const auto failure = [](const std::function<void()>& fn) -> std::pair<int64_t, std::string> {
    try {
      fn();
    } catch (const SequenceError& e) {
      return {e.entry(), e.what()};
    } catch (const Error& e) {
      return {-1, e.what()};
    }
    return {-2, "no error"};
  };
  for (const char* model : {"glm4_moe_tiny_nvfp4", "glm5_tiny_nvfp4"}) {
    SCOPED_TRACE(model);
    fp4moe::testing::TempDir t("gpu_nan");
    checkpoint_edit::copy_with_nan(model, t.path(), "model.embed_tokens.weight", 99, 3);  // token 99's row
    auto lm = load_model(t.path(), gpu_options());
    auto clean = load_model(checkpoint_edit::golden(model), gpu_options());
    const auto V = static_cast<size_t>(lm->vocab_size());
    const std::vector<int32_t> a = {5, 17, 3}, b = {8, 99, 42}, b_clean = {8, 9, 42}, da = {7}, db = {99};
    auto sa = lm->new_state(), sb = lm->new_state();
    std::vector<float> la(V), lb(V);
    const SeqChunk prefill[] = {{sa.get(), a, la.data()}, {sb.get(), b, lb.data()}};
    auto [entry, what] = failure([&] { lm->forward(prefill); });
    EXPECT_EQ(entry, 1) << what;
    EXPECT_EQ(what.rfind("the logits (model.norm, lm_head) of batch entry 1 at position 2 holds NaN or Inf: ", 0), 0u)
        << what;
    EXPECT_EQ(sa->length(), 0);
    EXPECT_EQ(sb->length(), 0);

    const SeqChunk prefill_clean[] = {{sa.get(), a, la.data()}, {sb.get(), b_clean, lb.data()}};
    lm->forward(prefill_clean);
    int32_t am = -1, bm = -1;
    const SeqChunk decode[] = {{sa.get(), da, nullptr, false, &am}, {sb.get(), db, nullptr, false, &bm}};
    std::tie(entry, what) = failure([&] { lm->forward(decode); });
    EXPECT_EQ(entry, 1) << what;
    EXPECT_NE(what.find("of batch entry 1 at position 3 holds NaN or Inf"), std::string::npos) << what;
    EXPECT_EQ(sa->length(), 3);
    EXPECT_EQ(sb->length(), 3);

    // a goes on alone; the unmodified model, given the same steps, gives the same logits.
    std::vector<float> got(V), want(V);
    const SeqChunk decode_a[] = {{sa.get(), da, got.data()}};
    lm->forward(decode_a);
    auto ca = clean->new_state(), cb = clean->new_state();
    const SeqChunk clean_prefill[] = {{ca.get(), a, la.data()}, {cb.get(), b_clean, lb.data()}};
    clean->forward(clean_prefill);
    const SeqChunk clean_decode[] = {{ca.get(), da, want.data()}};
    clean->forward(clean_decode);
    EXPECT_EQ(got, want);
  }
  // A NaN in a weight every row reads: every entry's rows are non-finite, no one entry is blamed.
  fp4moe::testing::TempDir t("gpu_nan_all");
  checkpoint_edit::copy_with_nan("glm4_moe_tiny", t.path(), "model.layers.1.self_attn.o_proj.weight", 0, 3);
  auto lm = load_model(t.path(), gpu_options());
  const std::vector<int32_t> a = {5, 17, 3}, b = {8, 9, 42};
  auto sa = lm->new_state(), sb = lm->new_state();
  int32_t am = -1, bm = -1;
  const SeqChunk batch[] = {{sa.get(), a, nullptr, false, &am}, {sb.get(), b, nullptr, false, &bm}};
  const auto [entry, what] = failure([&] { lm->forward(batch); });
  EXPECT_EQ(entry, -1) << what;
  EXPECT_NE(what.find("of batch entry 0 at position 2 holds NaN or Inf (and rows of 1 other batch entries)"),
            std::string::npos)
      << what;
}

// GLM-5 has a registered GPU factory now: without a GPU, loading glm5_tiny with --device cuda fails
// in the GLM-5 GPU model's constructor, naming the missing GPU, no longer with the registry's "no GPU
// (--device cuda) implementation" refusal. Runs (on the CPU) only where no usable GPU is visible.
TEST(GpuModel, Glm5CudaWithoutGpuNamesTheMissingGpu) {
  std::string why;
  if (cuda::cuda_device_available(&why)) GTEST_SKIP() << "a GPU is visible: the GLM-5 GPU cases run instead";
  register_gpu_models();
  try {
    load_model(fp4moe::testing::shared_path("golden/models/glm5_tiny"), gpu_options());
    FAIL() << "GLM-5 loaded with --device cuda and no GPU";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("--device cuda: no usable GPU"), std::string::npos) << m;
    EXPECT_EQ(m.find("no GPU (--device cuda) implementation"), std::string::npos) << m;
  }
}

}  // namespace
}  // namespace fp4moe::model
