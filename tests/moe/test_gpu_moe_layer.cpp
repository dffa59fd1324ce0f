// GPU tests of the fused MoE layer (moe/gpu_moe_layer.h) and its kernels (kernels/cuda/moe/):
//   RouterKernel   route_topk vs the CPU router moe::route on the same random logits: the expert
//                  indices in order equal and the weights within 1e-6 relative. The device expf
//                  may differ from glibc's by 2 ulp, so a token whose choice values are within
//                  1e-5 of each other at a differing slot (a near tie) is accepted and counted
//                  (at most 1% of tokens).
//   RouterLogitsKernel / CombineKernel  router_logits and combine alone vs CPU sums (tolerances in
//                  their comments), shapes with partial lanes, loop remainders and partial batches.
//   DispatchKernel dispatch_plan vs moe::DispatchPlan::build: offsets, row -> token and
//                  (token, slot) -> row identical, for 0, 1, 7, 300, 4096 tokens, E=16 and E=256,
//                  uniform and skewed routing (empty experts, one expert with most rows).
//   Layer          GpuMoeLayer (NVFP4 W4A16 and BF16 cuBLAS) vs moe::MoeLayer::forward (f32, the same
//                  dequantized NVFP4 weights, the same bf16-rounded input) at 1, 7, 64, 300 tokens,
//                  three configs (GLM-style sigmoid+bias with shared expert, grouped top-k with
//                  -inf fill, softmax without normalization), with empty experts. The random layers'
//                  gate and up have different global scales (each its own amax), so the NVFP4 gate_up
//                  GEMM's SwiGLU epilogue runs with separate gate/up scales; the golden checkpoints
//                  cover the ModelOpt case (shared scales). The routing must
//                  agree except at near ties (the logits are summed in another order; differing
//                  tokens must have choice values within 1e-4 and are left out, at most 2%).
//                  Bound: NMSE = sum (y - ref)^2 / sum ref^2 <= 1e-4 over the other tokens. The
//                  GPU rounds gate/up, the SwiGLU activation, the expert outputs, the shared
//                  output and y to bf16 (each ~1.1e-3 rms relative, 2^-9 / sqrt(3); the NVFP4 path
//                  rounds act once, in the GEMM's epilogue, not gate/up first), which
//                  propagates to ~2.6e-3 rms relative at y, NMSE ~7e-6; the BF16 peer also rounds
//                  its weights (~3e-6 more). 1e-4 leaves ~10x margin while a wrong expert, a
//                  swapped gate/up or a missing scale gives NMSE >= 1e-2. SharedExpertSplitK: H =
//                  1024 (two scale groups) so the shared expert's gate_up is split over K at
//                  decode sizes, the reduction applying the SwiGLU.
//   Golden         the MoE blocks of glm4_moe_tiny_nvfp4 and glm5_tiny_nvfp4: moe_in (rounded to
//                  bf16) -> GPU vs the CPU layer on the same input (same bound and near-tie rule),
//                  and vs golden moe_out: cosine >= 0.999 per token where the expert sets equal
//                  the golden topk_idx (>= 90% of the 32 tokens; moe_in's bf16 rounding moves the
//                  logits by ~1e-3 so a near tie may flip; the count is printed).
//   Graph          CUDA-graph capture of the NVFP4 forward at 64 tokens, replayed on new input,
//                  gives the bits an eager forward gives.
// Every host -> device copy of an input goes through the forward's own (non-blocking) stream: a
// plain cudaMemcpy from pageable memory may return before its DMA lands and is not ordered with a
// cudaStreamNonBlocking stream, so a forward could read a partly written x (the routing of the later
// tokens then differs while token 0's matches).
//   Determinism    two forwards on the same input are bit-identical (NVFP4 and BF16).
// Label gpu; without a usable GPU every test skips with the reason. Run: test_gpu_moe_layer
// (FP4MOE_TEST_SEED=<n> replays a seed).
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/dtype.h"
#include "format/safetensors.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/moe/device_buffer.h"
#include "kernels/cuda/moe/moe_kernels.h"
#include "kernels/cuda/sm90/w4a16_grouped_gemm.h"
#include "kernels/cuda_test_util.h"
#include "moe/dispatch.h"
#include "moe/gpu_moe_layer.h"
#include "moe/moe_layer.h"
#include "moe/router.h"
#include "testing/testing.h"

namespace fp4moe::moe {
namespace {

using cuda::DeviceBuffer;
using kernels::cpu::WeightFormat;

MoeConfig make_config(int64_t H, int64_t I, int E, int k, int n_group, int topk_group, ScoringFunc scoring,
                      bool norm, float scale, float fill, int n_shared) {
  MoeConfig c;
  c.hidden = H;
  c.moe_intermediate = I;
  c.n_experts = E;
  c.top_k = k;
  c.n_group = n_group;
  c.topk_group = topk_group;
  c.scoring = scoring;
  c.correction_bias = scoring == ScoringFunc::kSigmoid;
  c.norm_topk_prob = norm;
  c.routed_scaling_factor = scale;
  c.masked_fill_value = fill;
  c.n_shared_experts = n_shared;
  return c;
}

// The choice values the router compares for one token (after group masking), on the host.
std::vector<float> choice_values(const MoeConfig& cfg, const float* logits, const float* bias) {
  const cuda::moe::RouteParams p = route_params(cfg);
  std::vector<float> choice(static_cast<size_t>(cfg.n_experts));
  std::vector<int32_t> idx(static_cast<size_t>(cfg.top_k));
  std::vector<float> w(static_cast<size_t>(cfg.top_k));
  cuda::moe::route_token(p, logits, bias, choice.data(), 1, idx.data(), w.data());
  return choice;
}

// True when token t's routing differs from the reference only between near-tied experts
// (|choice difference| <= tol at every differing slot).
bool near_tie(const std::vector<float>& choice, const int32_t* got, const int32_t* want, int k, float tol) {
  for (int s = 0; s < k; ++s) {
    if (got[s] != want[s] && !(std::abs(choice[got[s]] - choice[want[s]]) <= tol)) return false;
  }
  return true;
}

std::vector<uint16_t> random_bf16(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<uint16_t> v(n);
  for (auto& b : v) b = f32_to_bf16(u(rng));
  return v;
}

std::vector<float> to_f32(const std::vector<uint16_t>& b) {
  std::vector<float> f(b.size());
  for (size_t i = 0; i < b.size(); ++i) f[i] = bf16_to_f32(b[i]);
  return f;
}

// --- router and dispatch kernels ------------------------------------------------------------------

void check_router_kernel(const MoeConfig& cfg, int64_t n_tokens, uint64_t seed) {
  SCOPED_TRACE(cfg.to_string() + " tokens " + std::to_string(n_tokens) + " seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd(0.0f, 2.0f);
  const int E = cfg.n_experts, K = cfg.top_k;
  std::vector<float> logits(static_cast<size_t>(n_tokens * E)), bias(static_cast<size_t>(E));
  for (float& v : logits) v = nd(rng);
  for (float& v : bias) v = nd(rng) * 0.05f;
  std::vector<int32_t> want_idx(static_cast<size_t>(n_tokens * K));
  std::vector<float> want_w(want_idx.size());
  route(cfg, logits.data(), bias.data(), n_tokens, want_idx.data(), want_w.data());

  DeviceBuffer d_logits = DeviceBuffer::from_host(logits), d_bias = DeviceBuffer::from_host(bias);
  DeviceBuffer d_idx(want_idx.size() * 4), d_w(want_idx.size() * 4);
  cuda::moe::route_topk(route_params(cfg), d_logits.as<float>(), d_bias.as<float>(), n_tokens, d_idx.as<int32_t>(),
                        d_w.as<float>(), nullptr);
  FP4MOE_CUDA_CHECK(cudaDeviceSynchronize());
  const auto got_idx = d_idx.to_host<int32_t>(want_idx.size());
  const auto got_w = d_w.to_host<float>(want_idx.size());
  int n_ties = 0;
  for (int64_t t = 0; t < n_tokens; ++t) {
    const int32_t* gi = got_idx.data() + t * K;
    const int32_t* wi = want_idx.data() + t * K;
    if (!std::equal(gi, gi + K, wi)) {
      const auto choice = choice_values(cfg, logits.data() + t * E, bias.data());
      ASSERT_TRUE(near_tie(choice, gi, wi, K, 1e-5f)) << "token " << t << ": GPU experts differ beyond a near tie";
      ++n_ties;
      continue;
    }
    for (int s = 0; s < K; ++s) {
      const float w = want_w[t * K + s], g = got_w[t * K + s];
      ASSERT_LE(std::abs(g - w), 1e-6f * std::abs(w) + 1e-30f) << "token " << t << " slot " << s << " expert " << wi[s];
    }
  }
  EXPECT_LE(n_ties, std::max<int64_t>(1, n_tokens / 100)) << "near ties";
}

TEST(RouterKernel, MatchesCpuRoute) {
  SKIP_WITHOUT_GPU();
  const uint64_t seed = testing::test_seed();
  check_router_kernel(make_config(64, 64, 256, 8, 1, 1, ScoringFunc::kSigmoid, true, 2.5f, -INFINITY, 1), 300, seed);
  check_router_kernel(make_config(64, 64, 64, 4, 8, 4, ScoringFunc::kSigmoid, true, 1.5f, 0.0f, 0), 300, seed + 1);
  check_router_kernel(make_config(64, 64, 64, 6, 8, 2, ScoringFunc::kSigmoid, false, 1.0f, -INFINITY, 0), 77, seed + 2);
  check_router_kernel(make_config(64, 64, 16, 4, 1, 1, ScoringFunc::kSigmoid, true, 2.5f, 0.0f, 1), 1, seed + 3);
  check_router_kernel(make_config(64, 64, 64, 6, 1, 1, ScoringFunc::kSoftmax, true, 1.0f, 0.0f, 0), 300, seed + 4);
  check_router_kernel(make_config(64, 64, 8, 2, 1, 1, ScoringFunc::kSoftmax, false, 1.0f, 0.0f, 0), 33, seed + 5);
  // The Layer.GlmStyle routing config (E=16 top-4, fill 0) with many tokens per block.
  check_router_kernel(make_config(64, 64, 16, 4, 1, 1, ScoringFunc::kSigmoid, true, 2.5f, 0.0f, 1), 300, seed + 6);
  // Past the warp-per-token kernel (E <= 256, n_group <= 32): the thread-per-token one, grouped.
  check_router_kernel(make_config(64, 64, 384, 8, 8, 4, ScoringFunc::kSigmoid, true, 2.5f, 0.0f, 1), 100, seed + 7);
  check_router_kernel(make_config(64, 64, 256, 8, 64, 8, ScoringFunc::kSigmoid, true, 1.0f, -INFINITY, 1), 50, seed + 8);
}

// router_logits vs a double-precision CPU sum of the same bf16 x and f32 weights: |diff| <= 1e-5 x
// sum |x w| per logit (f32 accumulation over H terms). The block's 8 warps take slices of H (whole
// 8-element pieces): shapes cover a slice of one piece with 7 warps empty (H=8), partial lanes in every
// slice (H=256: 32 elements, H=192: 24), the last slices short or empty (H=264:
// slices of 40, warp 6 gets 24, warp 7 none), a slice past 256 (H=2304: 288, two iterations for some
// lanes), the unrolled loop (H=16384: 2048 a slice, 8 iterations a lane) and GLM-5 (H=6144), token
// counts that are not multiples of the 4-token block; 8 experts a block once that grid has 128 blocks (token
// blocks x ceil(E / 8)), E a multiple of 8 or not.
void check_router_logits(int64_t H, int E, int64_t T, uint64_t seed) {
  SCOPED_TRACE("H=" + std::to_string(H) + " E=" + std::to_string(E) + " tokens " + std::to_string(T));
  const auto xb = random_bf16(static_cast<size_t>(T * H), seed);
  std::mt19937_64 rng(seed + 1);
  std::uniform_real_distribution<float> u(-0.1f, 0.1f);
  std::vector<float> w(static_cast<size_t>(E * H));
  for (float& v : w) v = u(rng);
  cudaStream_t stream = nullptr;
  FP4MOE_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  DeviceBuffer d_x(xb.size() * 2), d_w(w.size() * 4), d_logits(static_cast<size_t>(T * E + 1) * 4);
  FP4MOE_CUDA_CHECK(cudaMemcpyAsync(d_x.as<void>(), xb.data(), xb.size() * 2, cudaMemcpyHostToDevice, stream));
  FP4MOE_CUDA_CHECK(cudaMemcpyAsync(d_w.as<void>(), w.data(), w.size() * 4, cudaMemcpyHostToDevice, stream));
  FP4MOE_CUDA_CHECK(cudaMemsetAsync(d_logits.as<void>(), 0xFF, static_cast<size_t>(T * E + 1) * 4, stream));
  cuda::moe::router_logits(d_x.as<__nv_bfloat16>(), d_w.as<float>(), T, H, E, d_logits.as<float>(), stream);
  FP4MOE_CUDA_CHECK(cudaStreamSynchronize(stream));
  FP4MOE_CUDA_CHECK(cudaStreamDestroy(stream));
  const auto got = d_logits.to_host<float>(static_cast<size_t>(T * E + 1));
  const auto x = to_f32(xb);
  for (int64_t t = 0; t < T; ++t) {
    for (int e = 0; e < E; ++e) {
      double want = 0, mag = 0;
      for (int64_t h = 0; h < H; ++h) {
        want += static_cast<double>(x[t * H + h]) * w[e * H + h];
        mag += std::abs(static_cast<double>(x[t * H + h]) * w[e * H + h]);
      }
      ASSERT_LE(std::abs(got[t * E + e] - want), 1e-5 * mag + 1e-30) << "token " << t << " expert " << e;
    }
  }
  uint32_t sentinel = 0;
  std::memcpy(&sentinel, &got[static_cast<size_t>(T * E)], 4);
  EXPECT_EQ(sentinel, 0xFFFFFFFFu) << "router_logits wrote past [T, E]";
}

// The same token rows give the same logit bits at 64 tokens (an expert a block) and at 300 (8 experts a
// block): the sum order does not depend on the token count.
TEST(RouterLogitsKernel, SameBitsAtAnyTokenCount) {
  SKIP_WITHOUT_GPU();
  const int64_t H = 6144, T = 300, few = 64;
  const int E = 40;
  const auto xb = random_bf16(static_cast<size_t>(T * H), testing::test_seed());
  std::mt19937_64 rng(testing::test_seed() + 1);
  std::uniform_real_distribution<float> u(-0.1f, 0.1f);
  std::vector<float> w(static_cast<size_t>(E * H));
  for (float& v : w) v = u(rng);
  DeviceBuffer d_x(xb.size() * 2), d_w(w.size() * 4), d_all(static_cast<size_t>(T * E) * 4),
      d_few(static_cast<size_t>(few * E) * 4);
  FP4MOE_CUDA_CHECK(cudaMemcpy(d_x.as<void>(), xb.data(), xb.size() * 2, cudaMemcpyHostToDevice));
  FP4MOE_CUDA_CHECK(cudaMemcpy(d_w.as<void>(), w.data(), w.size() * 4, cudaMemcpyHostToDevice));
  cuda::moe::router_logits(d_x.as<__nv_bfloat16>(), d_w.as<float>(), T, H, E, d_all.as<float>(), nullptr);
  cuda::moe::router_logits(d_x.as<__nv_bfloat16>(), d_w.as<float>(), few, H, E, d_few.as<float>(), nullptr);
  FP4MOE_CUDA_CHECK(cudaDeviceSynchronize());
  const auto all = d_all.to_host<uint32_t>(static_cast<size_t>(T * E));
  const auto part = d_few.to_host<uint32_t>(static_cast<size_t>(few * E));
  for (size_t i = 0; i < part.size(); ++i) {
    ASSERT_EQ(part[i], all[i]) << "token " << i / E << " expert " << i % E;
  }
}

TEST(RouterLogitsKernel, MatchesCpuSum) {
  SKIP_WITHOUT_GPU();
  const uint64_t seed = testing::test_seed();
  check_router_logits(256, 16, 7, seed);
  check_router_logits(192, 8, 33, seed + 1);
  check_router_logits(640, 24, 5, seed + 2);
  check_router_logits(2304, 40, 9, seed + 3);
  check_router_logits(6144, 32, 64, seed + 4);
  check_router_logits(8, 5, 2, seed + 5);
  check_router_logits(264, 9, 3, seed + 6);
  check_router_logits(16384, 3, 6, seed + 7);
  // 8 experts a block (grids of >= 128 blocks): E a multiple of 8 (50 x 4 blocks), not (9: one expert in the
  // last block; 65 x 2), 24 (43 x 3); and the grid of 127 blocks (127 x 1) just below, on an expert a block.
  check_router_logits(6144, 32, 200, seed + 8);
  check_router_logits(2304, 9, 257, seed + 9);
  check_router_logits(264, 24, 170, seed + 10);
  check_router_logits(264, 8, 508, seed + 11);
  // A grid row an expert: more than 65535 experts, or H past 2^30, are refused with the numbers.
  try {
    cuda::moe::router_logits(nullptr, nullptr, 1, 6144, 70000, nullptr, nullptr);
    ADD_FAILURE() << "70000 experts accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("n_experts=70000 (1..65535"), std::string::npos) << e.what();
  }
}

// combine vs the CPU: y[t] = bf16(sum_s w[t, s] * down_out[entry_of[t, s]] (+ shared[t])) in f32, slot
// order; the GPU may fuse multiply-adds, so each output is within 1e-5 relative of the f32 sum before
// the bf16 rounding (<= 1 bf16 ulp after it). top_k 8 and 6 (a partial batch of 4), H = 6144 and 200
// (a partial block of 128 threads), with and without the shared expert's output.
void check_combine(int64_t T, int K, int64_t H, bool with_shared, uint64_t seed) {
  SCOPED_TRACE("tokens " + std::to_string(T) + " top-" + std::to_string(K) + " H=" + std::to_string(H) +
               (with_shared ? " shared" : ""));
  std::mt19937_64 rng(seed);
  const int64_t R = T * K;
  const auto down = random_bf16(static_cast<size_t>(R * H), seed + 1);
  const auto shared = random_bf16(static_cast<size_t>(T * H), seed + 2);
  std::vector<int32_t> entry_of(static_cast<size_t>(R));
  std::iota(entry_of.begin(), entry_of.end(), 0);
  std::shuffle(entry_of.begin(), entry_of.end(), rng);
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  std::vector<float> wts(static_cast<size_t>(R));
  for (float& v : wts) v = u(rng);
  DeviceBuffer d_down = DeviceBuffer::from_host(down), d_shared = DeviceBuffer::from_host(shared);
  DeviceBuffer d_entry = DeviceBuffer::from_host(entry_of), d_w = DeviceBuffer::from_host(wts);
  DeviceBuffer d_y(static_cast<size_t>(T * H) * 2);
  FP4MOE_CUDA_CHECK(cudaDeviceSynchronize());  // the pageable uploads above, before the legacy-stream launch
  cuda::moe::combine(d_down.as<__nv_bfloat16>(), d_entry.as<int32_t>(), d_w.as<float>(),
                     with_shared ? d_shared.as<__nv_bfloat16>() : nullptr, T, K, H, d_y.as<__nv_bfloat16>(), nullptr);
  FP4MOE_CUDA_CHECK(cudaDeviceSynchronize());
  const auto y = to_f32(d_y.to_host<uint16_t>(static_cast<size_t>(T * H)));
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t h = 0; h < H; ++h) {
      float acc = 0.0f, mag = 0.0f;
      for (int s = 0; s < K; ++s) {
        const float o = bf16_to_f32(down[static_cast<size_t>(entry_of[t * K + s] * H + h)]);
        acc += wts[t * K + s] * o;
        mag += std::abs(wts[t * K + s] * o);
      }
      if (with_shared) {
        acc += bf16_to_f32(shared[t * H + h]);
        mag += std::abs(bf16_to_f32(shared[t * H + h]));
      }
      // bf16 rounding (2^-9 relative) + f32 ordering/fusion slack.
      ASSERT_LE(std::abs(y[t * H + h] - acc), std::abs(acc) * 0.00391f + mag * 1e-5f + 1e-30f)
          << "token " << t << " h " << h;
    }
  }
}

TEST(CombineKernel, MatchesCpuSlotOrderSum) {
  SKIP_WITHOUT_GPU();
  const uint64_t seed = testing::test_seed();
  check_combine(5, 8, 6144, true, seed);
  check_combine(3, 6, 200, false, seed + 1);
  check_combine(64, 8, 1024, true, seed + 2);
}

void check_dispatch(int64_t n_tokens, int k, int E, bool skewed, uint64_t seed) {
  SCOPED_TRACE("tokens " + std::to_string(n_tokens) + " top-" + std::to_string(k) + " E=" + std::to_string(E) +
               (skewed ? " skewed" : " uniform") + " seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  std::vector<int32_t> idx(static_cast<size_t>(n_tokens * k));
  for (int64_t t = 0; t < n_tokens; ++t) {
    std::vector<int32_t> experts(static_cast<size_t>(E));
    for (int e = 0; e < E; ++e) experts[e] = e;
    if (skewed) {  // expert min(3, E-1) in every token, the rest from the first 2k experts (most experts empty)
      std::shuffle(experts.begin(), experts.begin() + std::min(E, 2 * k), rng);
      std::iter_swap(experts.begin(), std::find(experts.begin(), experts.end(), std::min(3, E - 1)));
    } else {
      std::shuffle(experts.begin(), experts.end(), rng);
    }
    for (int s = 0; s < k; ++s) idx[t * k + s] = experts[s];
  }
  const DispatchPlan want = DispatchPlan::build(idx.data(), n_tokens, k, E);
  DeviceBuffer d_idx = DeviceBuffer::from_host(idx);
  DeviceBuffer d_off((E + 1) * 4), d_row_token(idx.size() * 4), d_entry_of(idx.size() * 4), d_shared(8);
  FP4MOE_CUDA_CHECK(cudaMemset(d_off.as<void>(), 0xFF, (E + 1) * 4));
  cuda::moe::dispatch_plan(d_idx.as<int32_t>(), n_tokens, k, E, d_off.as<int32_t>(), d_row_token.as<int32_t>(),
                           d_entry_of.as<int32_t>(), d_shared.as<int32_t>(), nullptr);
  FP4MOE_CUDA_CHECK(cudaDeviceSynchronize());
  const auto off = d_off.to_host<int32_t>(E + 1);
  const auto row_token = d_row_token.to_host<int32_t>(idx.size());
  const auto entry_of = d_entry_of.to_host<int32_t>(idx.size());
  const auto shared = d_shared.to_host<int32_t>(2);
  for (int e = 0; e <= E; ++e) ASSERT_EQ(off[e], want.offsets[e]) << "offsets[" << e << "]";
  for (size_t i = 0; i < idx.size(); ++i) {
    ASSERT_EQ(row_token[i], want.token[i]) << "row_token[" << i << "]";
    ASSERT_EQ(entry_of[i], want.entry_of[i]) << "entry_of[" << i << "] (token " << i / k << " slot " << i % k << ")";
  }
  EXPECT_EQ(shared[0], 0);
  EXPECT_EQ(shared[1], n_tokens);
}

TEST(DispatchKernel, MatchesCpuDispatchPlan) {
  SKIP_WITHOUT_GPU();
  const uint64_t seed = testing::test_seed();
  for (int64_t n : {0, 1, 7, 300, 4096}) {
    check_dispatch(n, 4, 16, false, seed + n);
    check_dispatch(n, 8, 256, false, seed + n + 1);
    check_dispatch(n, 8, 256, true, seed + n + 2);
  }
  check_dispatch(100, 1, 1, false, seed + 3);  // one expert
}

// --- the whole layer ------------------------------------------------------------------------------

struct LayerRun {
  std::vector<float> y;  // [T, H] f32 of the bf16 output
  GpuMoeLayer::Routing routing;
};

// Copies `host` into `dst` on `stream` (ordered before the stream's later work; see the header).
void upload_on(cudaStream_t stream, const DeviceBuffer& dst, const std::vector<uint16_t>& host) {
  ASSERT_LE(host.size() * 2, dst.bytes());
  FP4MOE_CUDA_CHECK(cudaMemcpyAsync(dst.as<void>(), host.data(), host.size() * 2, cudaMemcpyHostToDevice, stream));
}

LayerRun run_gpu(GpuMoeLayer& g, const std::vector<uint16_t>& x_bf16, int64_t n_tokens) {
  const int64_t H = g.config().hidden;
  cudaStream_t stream = nullptr;
  FP4MOE_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  DeviceBuffer d_x(x_bf16.size() * 2);
  DeviceBuffer d_y(static_cast<size_t>(n_tokens * H) * 2);
  upload_on(stream, d_x, x_bf16);
  // Poison y: a token the forward does not write shows up as NaN instead of a stale value.
  FP4MOE_CUDA_CHECK(cudaMemsetAsync(d_y.as<void>(), 0xFF, static_cast<size_t>(n_tokens * H) * 2, stream));
  g.forward(d_x.as<__nv_bfloat16>(), n_tokens, d_y.as<__nv_bfloat16>(), stream);
  FP4MOE_CUDA_CHECK(cudaStreamSynchronize(stream));
  FP4MOE_CUDA_CHECK(cudaStreamDestroy(stream));
  LayerRun r;
  r.y = to_f32(d_y.to_host<uint16_t>(static_cast<size_t>(n_tokens * H)));
  r.routing = g.download_routing(n_tokens);
  return r;
}

// Compares a GPU run with the CPU layer on the same (bf16-rounded) input; returns the NMSE.
double compare_with_cpu(const MoeLayer& cpu, const LayerRun& got, const std::vector<float>& x, int64_t n_tokens,
                        const std::string& what) {
  const MoeConfig& cfg = cpu.config();
  const int64_t H = cfg.hidden, K = cfg.top_k, E = cfg.n_experts;
  std::vector<float> want(static_cast<size_t>(n_tokens * H));
  MoeTrace trace;
  cpu.forward(x.data(), n_tokens, want.data(), &trace);
  const float* bias = cpu.correction_bias().empty() ? nullptr : cpu.correction_bias().data();
  double err = 0, ref = 0, max_diff = 0;
  int n_ties = 0, n_empty = 0;
  for (int e = 0; e < E; ++e) n_empty += got.routing.offsets[e + 1] == got.routing.offsets[e] ? 1 : 0;
  for (int64_t t = 0; t < n_tokens; ++t) {
    const int32_t* gi = got.routing.topk_idx.data() + t * K;
    const int32_t* wi = trace.topk_idx.data() + t * K;
    if (!std::equal(gi, gi + K, wi)) {
      const auto choice = choice_values(cfg, trace.router_logits.data() + t * E, bias);
      EXPECT_TRUE(near_tie(choice, gi, wi, static_cast<int>(K), 1e-4f))
          << what << ": token " << t << " routed differently beyond a near tie";
      ++n_ties;
      continue;
    }
    for (int64_t h = 0; h < H; ++h) {
      const double d = got.y[t * H + h] - want[t * H + h];
      err += d * d;
      ref += static_cast<double>(want[t * H + h]) * want[t * H + h];
      max_diff = std::max(max_diff, std::abs(d));
    }
  }
  const double nmse = ref > 0 ? err / ref : err;
  std::printf("[%s] tokens %lld: NMSE %.3e, max|diff| %.3e, near-tie tokens %d, empty experts %d/%lld\n",
              what.c_str(), static_cast<long long>(n_tokens), nmse, max_diff, n_ties, n_empty,
              static_cast<long long>(E));
  EXPECT_LE(n_ties, std::max<int64_t>(1, n_tokens / 50)) << what << ": near-tie tokens";
  EXPECT_LE(nmse, 1e-4) << what << ": tokens " << n_tokens;
  // The GPU router logits follow the CPU's within f32 summation error.
  float max_logit = 0, max_logit_diff = 0;
  for (size_t i = 0; i < trace.router_logits.size(); ++i) {
    max_logit = std::max(max_logit, std::abs(trace.router_logits[i]));
    max_logit_diff = std::max(max_logit_diff, std::abs(trace.router_logits[i] - got.routing.logits[i]));
  }
  EXPECT_LE(max_logit_diff, 1e-5f * std::max(1.0f, max_logit)) << what << ": router logits";
  return nmse;
}

void check_layer(const MoeConfig& cfg, uint64_t seed) {
  SCOPED_TRACE(cfg.to_string() + " seed " + std::to_string(seed));
  const MoeLayer cpu = MoeLayer::random(cfg, WeightFormat::kNVFP4, seed);
  // 8192 tokens reach the NVFP4 layer's dequantized prefill path (>= kNvfp4DequantMinRows rows per
  // expert) where top_k / E >= 2048 / 8192; 300, 600 and 1600 run the wgmma W4A16 tiles (> 64 rows per
  // expert where top_k / E >= 1 / 4).
  const std::vector<int64_t> token_counts = {1, 7, 64, 300, 600, 1600, 8192};
  // NVFP4 with the expert row classes (the default: two launches per GEMM once an expert can outgrow
  // the routed config's token tile) and without (one config for every expert), and the BF16 peer.
  for (int variant : {0, 1, 2}) {
    const GpuExpertGemm gemm = variant < 2 ? GpuExpertGemm::kNvfp4W4A16 : GpuExpertGemm::kBf16Cublas;
    GpuMoeLayer g = GpuMoeLayer::from_cpu(cpu, gemm, 8192);
    if (gemm == GpuExpertGemm::kNvfp4W4A16) {  // random gate/up scales differ: the separate-scale epilogue runs
      EXPECT_NE(g.describe().find("swiglu-epilogue (gs gate != up)"), std::string::npos) << g.describe();
    }
    g.set_row_classes(variant == 0);
    for (int64_t n : token_counts) {
      const auto xb = random_bf16(static_cast<size_t>(n * cfg.hidden), seed * 31 + n);
      const LayerRun got = run_gpu(g, xb, n);
      const bool dequant = g.dequant_path(n);
      EXPECT_EQ(dequant, gemm == GpuExpertGemm::kNvfp4W4A16 && gpu_moe_dequant_path(n, cfg.top_k, cfg.n_experts));
      const size_t n_classes = g.routed_gemm_classes(n).size();
      const uint32_t t0 = cuda::sm90::w4a16_config(g.routed_gemm_config(n)).block_t;
      EXPECT_EQ(n_classes > 1, variant == 0 && n > t0 && t0 < 256)
          << n << " tokens: " << g.routed_gemm_description(n);
      compare_with_cpu(cpu, got, to_f32(xb), n,
                       std::string(gpu_expert_gemm_name(gemm)) + (dequant ? " (dequantized to bf16 + cuBLAS) " : " ") +
                           g.describe() + ", routed " + g.routed_gemm_description(n));
    }
  }
}

// H = 1024 is two scale groups: at decode sizes the shared expert's gate_up (one expert, 256 rows,
// 4 CTAs) is split over K with the SwiGLU applied by the reduction (the split-K workspace is the
// dequantized path's idle weight scratch, which max_tokens 8192 allocates).
TEST(Layer, SharedExpertSplitK) {
  SKIP_WITHOUT_GPU();
  const MoeConfig cfg = make_config(1024, 128, 16, 4, 1, 1, ScoringFunc::kSigmoid, true, 2.5f, 0.0f, 1);
  cuda::sm90::W4A16GroupedGemmArgs a;
  a.m_total = 7;
  a.n = 2 * cfg.shared_intermediate();
  a.k = cfg.hidden;
  a.n_experts = 1;
  a.epilogue = cuda::sm90::W4A16Epilogue::kSwiGlu;
  a.splitk_workspace = reinterpret_cast<float*>(uintptr_t{256});  // never dereferenced
  a.splitk_workspace_bytes = size_t{1} << 26;
  ASSERT_EQ(
      cuda::sm90::w4a16_splitk_plan(a, cuda::sm90::w4a16_config(cuda::sm90::w4a16_default_config(7, 1)), 132).parts, 2);
  check_layer(cfg, testing::test_seed() + 1);
}

TEST(Layer, GlmStyleSigmoidWithSharedExpert) {
  SKIP_WITHOUT_GPU();
  EXPECT_TRUE(gpu_moe_dequant_path(8192, 4, 16));   // this config runs the dequantized path at 8192 tokens
  EXPECT_FALSE(gpu_moe_dequant_path(1600, 4, 16));  // and the wgmma W4A16 tiles at 1600 (400 rows per expert)
  check_layer(make_config(256, 128, 16, 4, 1, 1, ScoringFunc::kSigmoid, true, 2.5f, 0.0f, 1), testing::test_seed());
}

TEST(Layer, GroupedTopKMinusInfFill) {
  SKIP_WITHOUT_GPU();
  check_layer(make_config(128, 64, 32, 4, 4, 2, ScoringFunc::kSigmoid, true, 1.0f, -INFINITY, 0),
              testing::test_seed() + 1);
}

TEST(Layer, SoftmaxUnnormalized) {
  SKIP_WITHOUT_GPU();
  check_layer(make_config(192, 64, 8, 2, 1, 1, ScoringFunc::kSoftmax, false, 1.0f, 0.0f, 2), testing::test_seed() + 2);
}

TEST(Layer, RefusesTooManyTokens) {
  SKIP_WITHOUT_GPU();
  const MoeConfig cfg = make_config(128, 64, 8, 2, 1, 1, ScoringFunc::kSigmoid, true, 1.0f, 0.0f, 0);
  GpuMoeLayer g = GpuMoeLayer::from_cpu(MoeLayer::random(cfg, WeightFormat::kNVFP4, 3), GpuExpertGemm::kNvfp4W4A16, 4);
  try {
    g.forward(nullptr, 5, nullptr, nullptr);
    FAIL() << "forward accepted 5 tokens with max_tokens 4";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("n_tokens=5 outside [0, 4]"), std::string::npos) << e.what();
  }
}

// --- golden MoE blocks ----------------------------------------------------------------------------

class GpuMoeGolden : public ::testing::TestWithParam<std::string> {};

TEST_P(GpuMoeGolden, MoeBlockMatches) {
  SKIP_WITHOUT_GPU();
  const auto dir = testing::shared_path("golden/models/" + GetParam());
  nlohmann::json config;
  std::ifstream(dir / "config.json") >> config;
  const MoeConfig cfg = moe_config_from_hf(config);
  format::TensorStore store(dir);
  format::SafetensorsFile golden(dir / "golden.safetensors");
  const int64_t layer_index = golden.view("moe_layer").as<int64_t>()[0];
  const MoeLayer cpu = MoeLayer::load(store, "model.layers." + std::to_string(layer_index) + ".mlp", cfg);
  const int64_t H = cfg.hidden, K = cfg.top_k, n = 32;
  const auto moe_in = golden.view("moe_in").as<float>();
  const auto moe_out = golden.view("moe_out").as<float>();
  const auto want_idx = golden.view("topk_idx").as<int64_t>();
  ASSERT_EQ(static_cast<int64_t>(moe_in.size()), n * H);
  std::vector<uint16_t> xb(moe_in.size());
  for (size_t i = 0; i < xb.size(); ++i) xb[i] = f32_to_bf16(moe_in[i]);

  for (GpuExpertGemm gemm : {GpuExpertGemm::kNvfp4W4A16, GpuExpertGemm::kBf16Cublas}) {
    GpuMoeLayer g = GpuMoeLayer::from_cpu(cpu, gemm, n);
    const std::string what = GetParam() + " " + g.describe();
    const LayerRun got = run_gpu(g, xb, n);
    compare_with_cpu(cpu, got, to_f32(xb), n, what);
    int same_sets = 0;
    double min_cos = 1.0;
    for (int64_t t = 0; t < n; ++t) {
      std::set<int64_t> want_set(want_idx.begin() + t * K, want_idx.begin() + (t + 1) * K);
      std::set<int64_t> got_set(got.routing.topk_idx.begin() + t * K, got.routing.topk_idx.begin() + (t + 1) * K);
      if (want_set != got_set) continue;
      ++same_sets;
      double dot = 0, na = 0, nb = 0;
      for (int64_t h = 0; h < H; ++h) {
        dot += static_cast<double>(got.y[t * H + h]) * moe_out[t * H + h];
        na += static_cast<double>(got.y[t * H + h]) * got.y[t * H + h];
        nb += static_cast<double>(moe_out[t * H + h]) * moe_out[t * H + h];
      }
      const double cos = dot / std::sqrt(na * nb);
      min_cos = std::min(min_cos, cos);
      EXPECT_GE(cos, 0.999) << what << ": token " << t << " vs golden moe_out";
    }
    std::printf("[%s] vs golden: expert sets equal for %d/32 tokens, min cosine %.6f\n", what.c_str(), same_sets,
                min_cos);
    EXPECT_GE(same_sets, 29) << what << ": tokens whose expert set equals the golden topk_idx";
  }
}

INSTANTIATE_TEST_SUITE_P(Models, GpuMoeGolden, ::testing::Values("glm4_moe_tiny_nvfp4", "glm5_tiny_nvfp4"));

// --- CUDA graph and determinism ---------------------------------------------------------------------

TEST(Layer, GraphReplayEqualsEager) {
  SKIP_WITHOUT_GPU();
  const uint64_t seed = testing::test_seed();
  const MoeConfig cfg = make_config(256, 128, 16, 4, 1, 1, ScoringFunc::kSigmoid, true, 2.5f, 0.0f, 1);
  GpuMoeLayer g = GpuMoeLayer::from_cpu(MoeLayer::random(cfg, WeightFormat::kNVFP4, seed), GpuExpertGemm::kNvfp4W4A16, 64);
  ASSERT_TRUE(g.capturable());
  const int64_t n = 64, H = cfg.hidden;
  DeviceBuffer d_x(static_cast<size_t>(n * H) * 2);
  DeviceBuffer d_y_graph(static_cast<size_t>(n * H) * 2), d_y_eager(static_cast<size_t>(n * H) * 2);
  cudaStream_t stream = nullptr;
  FP4MOE_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  upload_on(stream, d_x, random_bf16(static_cast<size_t>(n * H), seed + 1));
  g.forward(d_x.as<__nv_bfloat16>(), n, d_y_eager.as<__nv_bfloat16>(), stream);  // warm-up (kernel attributes)
  // GEMM timing is off by default: no events, all times 0.
  EXPECT_FALSE(g.gemm_timing());
  FP4MOE_CUDA_CHECK(cudaStreamSynchronize(stream));
  EXPECT_EQ(g.last_gemm_times().routed_gate_up, 0.0);
  EXPECT_EQ(g.last_gemm_times().shared_down, 0.0);
  ASSERT_TRUE(g.has_shared_expert());
  // Untimed, the shared expert runs on the layer's second side stream (a forked branch of the graph);
  // timed, after the routed GEMMs on the one stream. Both graphs must replay the eager forward.
  for (const bool timed : {false, true}) {
    SCOPED_TRACE(timed ? "GEMM timing on" : "GEMM timing off");
    g.set_gemm_timing(timed);  // before the capture: the events become graph nodes
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    FP4MOE_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    g.forward(d_x.as<__nv_bfloat16>(), n, d_y_graph.as<__nv_bfloat16>(), stream);
    FP4MOE_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
    FP4MOE_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    for (int round = 0; round < 2; ++round) {
      // New input each round: the replay must recompute, not reuse.
      const auto xb = random_bf16(static_cast<size_t>(n * H), seed + 10 + round + (timed ? 2 : 0));
      upload_on(stream, d_x, xb);  // on the graph's stream: ordered before the replay
      FP4MOE_CUDA_CHECK(cudaMemsetAsync(d_y_graph.as<void>(), 0, static_cast<size_t>(n * H) * 2, stream));
      FP4MOE_CUDA_CHECK(cudaGraphLaunch(exec, stream));
      FP4MOE_CUDA_CHECK(cudaStreamSynchronize(stream));
      const auto y_graph = d_y_graph.to_host<uint16_t>(static_cast<size_t>(n * H));
      if (timed) {  // the GEMM phases' timing events are recorded by the replay too (external event records)
        const GpuMoeLayer::GemmTimes t = g.last_gemm_times();
        EXPECT_GT(t.routed_gate_up, 0.0);
        EXPECT_GT(t.routed_down, 0.0);
        EXPECT_GT(t.shared_gate_up, 0.0);
        EXPECT_GT(t.shared_down, 0.0);
      }
      g.forward(d_x.as<__nv_bfloat16>(), n, d_y_eager.as<__nv_bfloat16>(), stream);
      FP4MOE_CUDA_CHECK(cudaStreamSynchronize(stream));
      const auto y_eager = d_y_eager.to_host<uint16_t>(static_cast<size_t>(n * H));
      ASSERT_EQ(y_graph, y_eager) << "round " << round << ": graph replay differs from the eager forward";
    }
    FP4MOE_CUDA_CHECK(cudaGraphExecDestroy(exec));
    FP4MOE_CUDA_CHECK(cudaGraphDestroy(graph));
  }
  FP4MOE_CUDA_CHECK(cudaStreamDestroy(stream));
}

TEST(Layer, TwoRunsBitIdentical) {
  SKIP_WITHOUT_GPU();
  const uint64_t seed = testing::test_seed();
  const MoeConfig cfg = make_config(256, 128, 32, 8, 4, 2, ScoringFunc::kSigmoid, true, 2.5f, 0.0f, 1);
  const MoeLayer cpu = MoeLayer::random(cfg, WeightFormat::kNVFP4, seed);
  for (GpuExpertGemm gemm : {GpuExpertGemm::kNvfp4W4A16, GpuExpertGemm::kBf16Cublas}) {
    GpuMoeLayer g = GpuMoeLayer::from_cpu(cpu, gemm, 300);
    const auto xb = random_bf16(static_cast<size_t>(300 * cfg.hidden), seed + 5);
    const LayerRun a = run_gpu(g, xb, 300);
    const LayerRun b = run_gpu(g, xb, 300);
    ASSERT_EQ(a.routing.topk_idx, b.routing.topk_idx) << gpu_expert_gemm_name(gemm);
    ASSERT_EQ(a.routing.entry_of, b.routing.entry_of) << gpu_expert_gemm_name(gemm);
    for (size_t i = 0; i < a.y.size(); ++i) {
      ASSERT_EQ(f32_to_bf16(a.y[i]), f32_to_bf16(b.y[i])) << gpu_expert_gemm_name(gemm) << " element " << i;
    }
  }
}

}  // namespace
}  // namespace fp4moe::moe
