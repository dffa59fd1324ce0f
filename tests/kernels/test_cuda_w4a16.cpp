// GPU test of sm90_nvfp4_w4a16_grouped_gemm (src/kernels/cuda/sm90/w4a16_grouped_gemm.h) against a
// CPU f64 reference on the dequantized weights (kernels/cpu/linear.h dequantize_row, the exact
// ModelOpt order w = e2m1 * (f32(scale) * global_scale)), fresh random inputs every run:
//   * GLM-5 expert shard E=32: gate_up N=4096 K=6144 and down N=6144 K=2048, with 1, 2, 8, 16,
//     64, 128 tokens per expert (uniform routing), each with the default config for that count;
//   * every shipped config on a smaller ragged problem (counts 0..70, empty experts);
//   * edges: one token in total, empty first/last experts, token counts not a multiple of the
//     tile, skewed routing (one expert with 300 tokens), N not a multiple of the weight tile,
//     K = 64 x odd (a partial last K stage), K = 16 x odd (padded chunks), rows outside every
//     expert range left untouched, the same launch twice gives the same bits;
//   * split-K of dense Linears (E = 1, long K, few CTAs): parts of whole scale groups, a partial
//     last part, a workspace smaller than the plan wants; both reductions (loads-first and looped, either
//     epilogue) with expert rows starting above row 0.
// Weights go through w4a16_repack (checkpoint -> kernel layout) as a loader does.
// Error bound per output (bf16 output rounding + f32 accumulation), with S = sum_k |x_k w_k|:
//   |y - ref| <= 2^-8 |ref| + K * 2^-22 * S
// (half an ulp of bf16 is 2^-9 relative, doubled to cover the accumulation error being rounded
// too; K * 2^-22 * S is a worst-case f32 summation bound allowing truncating tensor-core adds),
// and over all checked outputs NMSE = sum (y - ref)^2 / sum ref^2 <= 1e-5 (bf16 rounding alone
// gives ~1.3e-6; one wrong or missing 16-element block at K=2048 would give ~1e-2).
// Large cases check every token against a sample of 320 output columns (first 64, last 64,
// 192 random), the rest every output. Label gpu; without a usable GPU the tests skip with the reason.
// Run: test_cuda_w4a16 (FP4MOE_TEST_SEED=<n> replays a seed).
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <mutex>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "format/nvfp4.h"
#include "kernels/cpu/linear.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/sm90/w4a16_dequant.h"
#include "kernels/cuda/sm90/w4a16_grouped_gemm.h"
#include "kernels/cuda_test_util.h"
#include "testing/testing.h"

namespace fp4moe::cuda::sm90 {
namespace {

using gpu_test::DevicePtr;
using gpu_test::download;
using gpu_test::upload;

// One grouped problem on the host.
struct Problem {
  int64_t n_experts = 0, n = 0, k = 0, m_total = 0;
  std::vector<int32_t> offsets;  // [E + 1]
  std::vector<uint16_t> x;       // [m_total, k] bf16
  std::vector<uint8_t> packed;   // [E, n, k/2]
  std::vector<uint8_t> scales;   // [E, n, k/16]
  std::vector<float> global_scales;

  std::string describe(int config_id) const {
    std::string counts;
    for (int64_t e = 0; e < n_experts && e < 12; ++e) {
      if (e > 0) counts += ",";
      counts += std::to_string(offsets[static_cast<size_t>(e + 1)] - offsets[static_cast<size_t>(e)]);
    }
    if (n_experts > 12) counts += ",...";
    return "E=" + std::to_string(n_experts) + " N=" + std::to_string(n) + " K=" + std::to_string(k) +
           " M_total=" + std::to_string(m_total) +
           (offsets.front() != 0 ? " offsets[0]=" + std::to_string(offsets.front()) : std::string()) +
           " tokens/expert [" + counts + "] config " + w4a16_config_name(w4a16_config(config_id));
  }
};

// Random weights: uniform e2m1 codes, e4m3 block scales of magnitude 2^[-6, 2] through
// format::f32_to_e4m3 (the quantizer's rounding), a global scale ~ 1/2688 as ModelOpt makes it.
// lead_rows: the experts' rows start there (offsets[0] = lead_rows); rows before it belong to no expert.
Problem make_problem(std::mt19937_64& rng, int64_t n_experts, int64_t n, int64_t k, const std::vector<int32_t>& counts,
                     int64_t extra_rows = 0, int32_t lead_rows = 0) {
  Problem p;
  p.n_experts = n_experts;
  p.n = n;
  p.k = k;
  p.offsets.assign(static_cast<size_t>(n_experts + 1), lead_rows);
  for (int64_t e = 0; e < n_experts; ++e) p.offsets[static_cast<size_t>(e + 1)] = p.offsets[static_cast<size_t>(e)] + counts[static_cast<size_t>(e)];
  p.m_total = p.offsets.back() + extra_rows;
  p.x.resize(static_cast<size_t>(p.m_total * k));
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (uint16_t& v : p.x) v = f32_to_bf16(normal(rng));
  p.packed.resize(static_cast<size_t>(n_experts * n * k / 2));
  for (size_t i = 0; i < p.packed.size(); i += 8) {
    const uint64_t r = rng();
    std::memcpy(&p.packed[i], &r, std::min<size_t>(8, p.packed.size() - i));
  }
  p.scales.resize(static_cast<size_t>(n_experts * n * k / 16));
  std::uniform_real_distribution<float> log2_scale(-6.0f, 2.0f);
  for (uint8_t& s : p.scales) s = format::f32_to_e4m3(std::exp2(log2_scale(rng)));
  std::uniform_real_distribution<float> gs(0.5f, 2.0f);
  p.global_scales.resize(static_cast<size_t>(n_experts));
  for (float& g : p.global_scales) g = gs(rng) / 2688.0f;
  return p;
}

// bytes > 0: a split-K workspace of that size for `a`, poisoned with NaNs (owned by the result).
DevicePtr<float> attach_splitk_workspace(W4A16GroupedGemmArgs& a, size_t bytes) {
  if (bytes == 0) return {};
  DevicePtr<float> ws = upload(std::vector<float>(bytes / sizeof(float), std::nanf("")));
  a.splitk_workspace = ws.get();
  a.splitk_workspace_bytes = bytes;
  return ws;
}

// The launch arguments' shape fields of a problem (the device pointers are the caller's).
W4A16GroupedGemmArgs problem_shape_args(const Problem& p) {
  W4A16GroupedGemmArgs a;
  a.m_total = p.m_total;
  a.n = p.n;
  a.k = p.k;
  a.n_experts = p.n_experts;
  return a;
}

// One launch of a config over an expert row class (W4A16GroupedGemmArgs::min/max_expert_rows).
struct ClassLaunch {
  int config_id = 0;
  int32_t min_rows = 0, max_rows = std::numeric_limits<int32_t>::max();
};

// Runs the launches in order; returns Y [m_total, n] as bf16 bits (poisoned with 0xFFFF before the
// launches). splitk_bytes > 0: a split-K workspace of that size, poisoned with NaNs. null_offsets (one
// expert over all rows, as GpuLinear calls it): expert_offsets = nullptr.
std::vector<uint16_t> run_gpu_launches(const Problem& p, const std::vector<ClassLaunch>& launches, int repeats = 1,
                                       size_t splitk_bytes = 0, bool null_offsets = false) {
  auto d_x = upload(p.x);
  auto d_off = upload(p.offsets);
  std::vector<uint8_t> codes_kl, scales_kl;  // the kernel layout, as a loader makes it once
  w4a16_repack(p.packed.data(), p.scales.data(), p.n_experts, p.n, p.k, codes_kl, scales_kl, "test weight");
  auto d_packed = upload(codes_kl);
  auto d_scales = upload(scales_kl);
  auto d_gs = upload(p.global_scales);
  std::vector<uint16_t> y(static_cast<size_t>(p.m_total * p.n), 0xFFFF);
  auto d_y = upload(y);
  W4A16GroupedGemmArgs a = problem_shape_args(p);
  a.x = reinterpret_cast<const __nv_bfloat16*>(d_x.get());
  a.expert_offsets = null_offsets ? nullptr : d_off.get();
  a.w_packed = d_packed.get();
  a.w_scales = d_scales.get();
  a.w_global_scales = d_gs.get();
  a.y = reinterpret_cast<__nv_bfloat16*>(d_y.get());
  const DevicePtr<float> d_ws = attach_splitk_workspace(a, splitk_bytes);
  for (int r = 0; r < repeats; ++r) {
    for (const ClassLaunch& l : launches) {
      a.min_expert_rows = l.min_rows;
      a.max_expert_rows = l.max_rows;
      w4a16_grouped_gemm(a, l.config_id, nullptr);
    }
  }
  FP4MOE_CUDA_CHECK(cudaDeviceSynchronize());
  FP4MOE_CUDA_CHECK(cudaMemcpy(y.data(), d_y.get(), y.size() * 2, cudaMemcpyDeviceToHost));
  return y;
}

std::vector<uint16_t> run_gpu(const Problem& p, int config_id, int repeats = 1, size_t splitk_bytes = 0,
                              bool null_offsets = false) {
  return run_gpu_launches(p, {ClassLaunch{config_id}}, repeats, splitk_bytes, null_offsets);
}

// Compares y with the f64 reference; returns the number of failures (prints the first few).
void check_against_reference(const Problem& p, const std::vector<uint16_t>& y, int config_id, uint64_t col_seed) {
  const std::string what = p.describe(config_id);
  // Columns to check: all of them when the reference is cheap, else a sample.
  std::vector<int64_t> cols;
  if (p.m_total * p.n * p.k <= (int64_t{1} << 31)) {
    cols.resize(static_cast<size_t>(p.n));
    std::iota(cols.begin(), cols.end(), 0);
  } else {
    std::set<int64_t> pick;
    for (int64_t c = 0; c < std::min<int64_t>(64, p.n); ++c) pick.insert(c);
    for (int64_t c = std::max<int64_t>(0, p.n - 64); c < p.n; ++c) pick.insert(c);
    std::mt19937_64 rng(col_seed);
    while (static_cast<int64_t>(pick.size()) < std::min<int64_t>(320, p.n)) pick.insert(static_cast<int64_t>(rng() % static_cast<uint64_t>(p.n)));
    cols.assign(pick.begin(), pick.end());
  }
  std::vector<float> xf(p.x.size());
  for (size_t i = 0; i < xf.size(); ++i) xf[i] = bf16_to_f32(p.x[i]);

  std::mutex mu;
  double sum_err2 = 0, sum_ref2 = 0;
  int64_t n_checked = 0, n_bad = 0;
  std::vector<std::string> first_bad;
  kernels::cpu::default_thread_pool().parallel_for(p.n_experts, [&](int64_t e) {
    const int64_t t0 = p.offsets[static_cast<size_t>(e)], t1 = p.offsets[static_cast<size_t>(e + 1)];
    if (t1 == t0) return;
    const size_t wb = static_cast<size_t>(e * p.n * p.k / 2), sb = static_cast<size_t>(e * p.n * p.k / 16);
    const kernels::cpu::LinearWeight lw = kernels::cpu::LinearWeight::from_nvfp4(
        p.n, p.k, std::vector<uint8_t>(p.packed.begin() + static_cast<ptrdiff_t>(wb), p.packed.begin() + static_cast<ptrdiff_t>(wb + static_cast<size_t>(p.n * p.k / 2))),
        std::vector<uint8_t>(p.scales.begin() + static_cast<ptrdiff_t>(sb), p.scales.begin() + static_cast<ptrdiff_t>(sb + static_cast<size_t>(p.n * p.k / 16))),
        p.global_scales[static_cast<size_t>(e)]);
    std::vector<float> w(static_cast<size_t>(p.k));
    double l_err2 = 0, l_ref2 = 0;
    int64_t l_checked = 0, l_bad = 0;
    std::vector<std::string> l_first;
    for (int64_t n : cols) {
      kernels::cpu::dequantize_row(lw, n, w.data());
      for (int64_t t = t0; t < t1; ++t) {
        const float* xr = &xf[static_cast<size_t>(t * p.k)];
        double ref = 0, mag = 0;
        for (int64_t k = 0; k < p.k; ++k) {
          const double prod = static_cast<double>(xr[k]) * w[static_cast<size_t>(k)];
          ref += prod;
          mag += std::fabs(prod);
        }
        const double got = bf16_to_f32(y[static_cast<size_t>(t * p.n + n)]);
        const double tol = std::ldexp(std::fabs(ref), -8) + static_cast<double>(p.k) * std::ldexp(mag, -22);
        const double err = got - ref;
        ++l_checked;
        if (!(std::fabs(err) <= tol)) {  // NaN fails too
          ++l_bad;
          if (l_first.size() < 5) {
            l_first.push_back("expert " + std::to_string(e) + " token row " + std::to_string(t) + " col " +
                              std::to_string(n) + ": got " + std::to_string(got) + " ref " + std::to_string(ref) +
                              " tol " + std::to_string(tol));
          }
        } else {
          l_err2 += err * err;
          l_ref2 += ref * ref;
        }
      }
    }
    std::lock_guard<std::mutex> lock(mu);
    sum_err2 += l_err2;
    sum_ref2 += l_ref2;
    n_checked += l_checked;
    n_bad += l_bad;
    for (auto& s : l_first) {
      if (first_bad.size() < 8) first_bad.push_back(std::move(s));
    }
  });
  for (const std::string& s : first_bad) ADD_FAILURE() << what << ": " << s;
  EXPECT_EQ(n_bad, 0) << what << ": " << n_bad << " of " << n_checked << " outputs outside the bound";
  const double nmse = sum_ref2 > 0 ? sum_err2 / sum_ref2 : 0;
  EXPECT_LE(nmse, 1e-5) << what << ": NMSE " << nmse;
  // Rows outside every expert range are never written.
  int64_t touched = 0;
  for (int64_t t = p.offsets.back(); t < p.m_total; ++t) {
    for (int64_t n = 0; n < p.n; ++n) touched += y[static_cast<size_t>(t * p.n + n)] != 0xFFFF;
  }
  for (int64_t t = 0; t < p.offsets.front(); ++t) {
    for (int64_t n = 0; n < p.n; ++n) touched += y[static_cast<size_t>(t * p.n + n)] != 0xFFFF;
  }
  EXPECT_EQ(touched, 0) << what << ": " << touched << " outputs written outside the expert ranges";
  std::printf("[w4a16] %s: %lld outputs checked (%zu cols), NMSE %.3g\n", what.c_str(),
              static_cast<long long>(n_checked), cols.size(), nmse);
}

void run_and_check(std::mt19937_64& rng, int64_t n_experts, int64_t n, int64_t k, const std::vector<int32_t>& counts,
                   int config_id, int64_t extra_rows = 0, size_t splitk_bytes = 0, bool null_offsets = false,
                   int32_t lead_rows = 0) {
  const Problem p = make_problem(rng, n_experts, n, k, counts, extra_rows, lead_rows);
  const std::vector<uint16_t> y = run_gpu(p, config_id, 1, splitk_bytes, null_offsets);
  check_against_reference(p, y, config_id, rng());
}

// The SwiGLU epilogue (the MoE gate_up GEMM): gate and up are two problems with the same
// activations and counts; the kernel runs on w4a16_repack_gate_up of both and writes
// silu(gate) * up. Bound per output h = silu(g) u, from the bf16 output rounding and the f32
// accumulations of g and u (S_g, S_u = sum_k |x_k w_k|):
//   |h - ref| <= 2^-8 |ref| + K 2^-22 (|u| S_g + |silu(g)| S_u) + 1e-30
// lead_rows: as make_problem's (rows before offsets[0] must stay unwritten).
void run_and_check_swiglu(std::mt19937_64& rng, int64_t n_experts, int64_t inter, int64_t k,
                          const std::vector<int32_t>& counts, int config_id, size_t splitk_bytes = 0,
                          int32_t lead_rows = 0) {
  const Problem gate = make_problem(rng, n_experts, inter, k, counts, 0, lead_rows);
  Problem up = make_problem(rng, n_experts, inter, k, counts, 0, lead_rows);
  up.x = gate.x;
  std::vector<uint8_t> codes_kl, scales_kl;
  w4a16_repack_gate_up(gate.packed.data(), gate.scales.data(), up.packed.data(), up.scales.data(), n_experts, inter, k,
                       codes_kl, scales_kl);
  auto d_x = upload(gate.x);
  auto d_off = upload(gate.offsets);
  auto d_packed = upload(codes_kl);
  auto d_scales = upload(scales_kl);
  auto d_gs = upload(gate.global_scales);
  auto d_gs_up = upload(up.global_scales);
  std::vector<uint16_t> y(static_cast<size_t>(gate.m_total * inter), 0xFFFF);
  auto d_y = upload(y);
  W4A16GroupedGemmArgs a = problem_shape_args(gate);
  a.n = 2 * inter;
  a.x = reinterpret_cast<const __nv_bfloat16*>(d_x.get());
  a.expert_offsets = d_off.get();
  a.w_packed = d_packed.get();
  a.w_scales = d_scales.get();
  a.w_global_scales = d_gs.get();
  a.w_global_scales_up = d_gs_up.get();
  a.epilogue = W4A16Epilogue::kSwiGlu;
  a.y = reinterpret_cast<__nv_bfloat16*>(d_y.get());
  const DevicePtr<float> d_ws = attach_splitk_workspace(a, splitk_bytes);
  w4a16_grouped_gemm(a, config_id, nullptr);
  FP4MOE_CUDA_CHECK(cudaDeviceSynchronize());
  FP4MOE_CUDA_CHECK(cudaMemcpy(y.data(), d_y.get(), y.size() * 2, cudaMemcpyDeviceToHost));

  const std::string what = "SwiGLU " + gate.describe(config_id);
  auto linear = [&](const Problem& p, int64_t e) {
    const size_t wb = static_cast<size_t>(e * p.n * p.k / 2), sb = static_cast<size_t>(e * p.n * p.k / 16);
    return kernels::cpu::LinearWeight::from_nvfp4(
        p.n, p.k, std::vector<uint8_t>(p.packed.begin() + static_cast<ptrdiff_t>(wb), p.packed.begin() + static_cast<ptrdiff_t>(wb + static_cast<size_t>(p.n * p.k / 2))),
        std::vector<uint8_t>(p.scales.begin() + static_cast<ptrdiff_t>(sb), p.scales.begin() + static_cast<ptrdiff_t>(sb + static_cast<size_t>(p.n * p.k / 16))),
        p.global_scales[static_cast<size_t>(e)]);
  };
  int64_t n_bad = 0, n_checked = 0;
  double err2 = 0, ref2 = 0;
  for (int64_t e = 0; e < n_experts; ++e) {
    const int64_t t0 = gate.offsets[static_cast<size_t>(e)], t1 = gate.offsets[static_cast<size_t>(e + 1)];
    if (t0 == t1) continue;
    const kernels::cpu::LinearWeight lg = linear(gate, e), lu = linear(up, e);
    std::vector<float> wg(static_cast<size_t>(k)), wu(static_cast<size_t>(k));
    for (int64_t n = 0; n < inter; ++n) {
      kernels::cpu::dequantize_row(lg, n, wg.data());
      kernels::cpu::dequantize_row(lu, n, wu.data());
      for (int64_t t = t0; t < t1; ++t) {
        double g = 0, u = 0, sg = 0, su = 0;
        for (int64_t kk = 0; kk < k; ++kk) {
          const double xv = bf16_to_f32(gate.x[static_cast<size_t>(t * k + kk)]);
          g += xv * wg[static_cast<size_t>(kk)];
          u += xv * wu[static_cast<size_t>(kk)];
          sg += std::fabs(xv * wg[static_cast<size_t>(kk)]);
          su += std::fabs(xv * wu[static_cast<size_t>(kk)]);
        }
        const double silu = g / (1.0 + std::exp(-g));
        const double ref = silu * u;
        const double got = bf16_to_f32(y[static_cast<size_t>(t * inter + n)]);
        const double tol = std::ldexp(std::fabs(ref), -8) +
                           static_cast<double>(k) * std::ldexp(std::fabs(u) * sg + std::fabs(silu) * su, -22) + 1e-30;
        ++n_checked;
        if (!(std::fabs(got - ref) <= tol)) {
          if (++n_bad <= 5) {
            ADD_FAILURE() << what << ": expert " << e << " token row " << t << " col " << n << ": got " << got
                          << " ref " << ref << " tol " << tol;
          }
        } else {
          err2 += (got - ref) * (got - ref);
          ref2 += ref * ref;
        }
      }
    }
  }
  EXPECT_EQ(n_bad, 0) << what << ": " << n_bad << " of " << n_checked << " outside the bound";
  EXPECT_LE(ref2 > 0 ? err2 / ref2 : 0, 1e-5) << what;
  int64_t touched = 0;  // rows before offsets[0] belong to no expert
  for (size_t i = 0; i < static_cast<size_t>(gate.offsets.front() * inter); ++i) touched += y[i] != 0xFFFF;
  EXPECT_EQ(touched, 0) << what << ": " << touched << " outputs written before the first expert's rows";
  std::printf("[w4a16] %s: %lld outputs checked, NMSE %.3g\n", what.c_str(), static_cast<long long>(n_checked),
              ref2 > 0 ? err2 / ref2 : 0.0);
}

// w4a16_dequant_expert (the prefill path's NVFP4 -> BF16): every expert of a random stack (K = 208:
// a padded last chunk; zero scales in some blocks; every code value) against the host formula
// bf16_rn(f32(e2m1 x e4m3) x gs), bit for bit (compared as floats: a zero-scale block gives +0 where
// e2m1 x 0 could be -0); the gate_up stack (w4a16_repack_gate_up) comes back de-interleaved, gate rows
// then up rows, each with its own global scale.
TEST(W4A16Dequant, EveryExpertMatchesTheHostFormula) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(testing::test_seed() ^ 0xDE0ull);
  const int64_t E = 3, I = 24, K = 208;
  Problem gate = make_problem(rng, E, I, K, {0, 0, 0}), up = make_problem(rng, E, I, K, {0, 0, 0});
  for (size_t i = 0; i < gate.scales.size(); i += 37) gate.scales[i] = 0;  // some zero-scale blocks
  auto reference = [&](const Problem& p, int64_t e, int64_t r, int64_t c) {
    const size_t w = static_cast<size_t>((e * p.n + r) * p.k + c);
    const uint8_t code = (p.packed[w / 2] >> (4 * (w % 2))) & 0xF;
    const float prod = format::e2m1_to_f32(code) * format::e4m3_to_f32(p.scales[w / 16]);  // exact
    return bf16_to_f32(f32_to_bf16(prod * p.global_scales[static_cast<size_t>(e)]));
  };
  int64_t checked = 0, mismatches = 0;
  auto expect_rows = [&](const std::vector<uint16_t>& got, int64_t row0, const Problem& p, int64_t e,
                         const std::string& what) {
    for (int64_t r = 0; r < p.n; ++r) {
      for (int64_t c = 0; c < K; ++c) {
        const float g = bf16_to_f32(got[static_cast<size_t>((row0 + r) * K + c)]), want = reference(p, e, r, c);
        ++checked;
        if (g != want && ++mismatches <= 5) ADD_FAILURE() << what << " expert " << e << " row " << r << " col " << c
                                                          << ": " << g << " != " << want;
      }
    }
  };
  std::vector<uint8_t> codes_kl, scales_kl;
  {  // plain stack: the gate problem as an n = 24 weight
    w4a16_repack(gate.packed.data(), gate.scales.data(), E, I, K, codes_kl, scales_kl);
    auto d_codes = upload(codes_kl);
    auto d_scales = upload(scales_kl);
    auto d_gs = upload(gate.global_scales);
    auto d_out = gpu_test::device_alloc<__nv_bfloat16>(static_cast<size_t>(I * K));
    for (int64_t e = 0; e < E; ++e) {
      W4A16DequantArgs a;
      a.codes = d_codes.get();
      a.scales = d_scales.get();
      a.global_scales = d_gs.get();
      a.expert = e;
      a.n = I;
      a.k = K;
      a.out = d_out.get();
      w4a16_dequant_expert(a, nullptr);
      FP4MOE_CUDA_CHECK(cudaDeviceSynchronize());
      const auto bits = download(reinterpret_cast<const uint16_t*>(d_out.get()), static_cast<size_t>(I * K));
      expect_rows(bits, 0, gate, e, "plain");
    }
  }
  {  // gate_up: 2 I rows interleaved by 8 in the kernel layout -> gate rows, then up rows
    w4a16_repack_gate_up(gate.packed.data(), gate.scales.data(), up.packed.data(), up.scales.data(), E, I, K, codes_kl,
                         scales_kl);
    auto d_codes = upload(codes_kl);
    auto d_scales = upload(scales_kl);
    auto d_gs = upload(gate.global_scales);
    auto d_gs_up = upload(up.global_scales);
    auto d_out = gpu_test::device_alloc<__nv_bfloat16>(static_cast<size_t>(2 * I * K));
    for (int64_t e = 0; e < E; ++e) {
      W4A16DequantArgs a;
      a.codes = d_codes.get();
      a.scales = d_scales.get();
      a.global_scales = d_gs.get();
      a.global_scales_up = d_gs_up.get();
      a.expert = e;
      a.n = 2 * I;
      a.k = K;
      a.gate_up = true;
      a.out = d_out.get();
      w4a16_dequant_expert(a, nullptr);
      FP4MOE_CUDA_CHECK(cudaDeviceSynchronize());
      const auto bits = download(reinterpret_cast<const uint16_t*>(d_out.get()), static_cast<size_t>(2 * I * K));
      expect_rows(bits, 0, gate, e, "gate_up (gate rows)");
      expect_rows(bits, I, up, e, "gate_up (up rows)");
    }
  }
  EXPECT_EQ(mismatches, 0) << "of " << checked;
  W4A16DequantArgs bad;
  bad.codes = bad.scales = codes_kl.data();
  bad.global_scales = gate.global_scales.data();
  bad.out = reinterpret_cast<__nv_bfloat16*>(codes_kl.data());
  bad.n = 24;
  bad.k = 200;
  try {
    w4a16_dequant_expert(bad, nullptr);
    FAIL() << "k = 200 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("k=200 (k must be a positive multiple of 16"), std::string::npos) << e.what();
  }
}

TEST(W4A16Gpu, SwiGluEpilogueEveryConfig) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(testing::test_seed() ^ 0x5616ull);
  const std::vector<int32_t> counts = {0, 3, 40, 1, 0, 17};
  for (int cfg = 0; cfg < w4a16_num_configs(); ++cfg) run_and_check_swiglu(rng, 6, 136, 336, counts, cfg);
}

class GlmShard : public ::testing::TestWithParam<int> {};

TEST_P(GlmShard, GateUpAndDownMatchReference) {
  SKIP_WITHOUT_GPU();
  const int tokens = GetParam();
  std::mt19937_64 rng(testing::test_seed() ^ (0x6A7Eull * static_cast<uint64_t>(tokens)));
  const int cfg = w4a16_default_config(tokens, 32);
  const std::vector<int32_t> counts(32, tokens);
  run_and_check(rng, 32, 4096, 6144, counts, cfg);  // gate_up
  run_and_check(rng, 32, 6144, 2048, counts, cfg);  // down
}
INSTANTIATE_TEST_SUITE_P(TokensPerExpert, GlmShard, ::testing::Values(1, 2, 8, 16, 64, 128));

// Prefill on the wgmma tiles at the GLM-5 shard's shapes (gate_up N = 4096, K = 6144; down N = 6144,
// K = 2048): 256 and 512 tokens per expert, and Zipf-like skewed counts with empty experts.
TEST(W4A16Gpu, WgmmaPrefillGlmShapes) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(testing::test_seed() ^ 0x96ull);
  for (const char* name : {"w4a16_wgmma_m128n64_s4", "w4a16_wgmma_m128n128_s4", "w4a16_wgmma_m128n256_s4",
                           "w4a16_wgmma_m256n64_s4", "w4a16_wgmma_m256n128_s4"}) {
    const int cfg = w4a16_config_id(name);
    run_and_check(rng, 4, 4096, 6144, std::vector<int32_t>(4, 256), cfg);
    run_and_check(rng, 4, 6144, 2048, std::vector<int32_t>(4, 512), cfg);
  }
  std::vector<int32_t> zipf(32);
  for (size_t e = 0; e < zipf.size(); ++e) zipf[e] = static_cast<int32_t>(1000 / (e + 1)) - 40;  // 960 .. -9
  for (int32_t& c : zipf) c = std::max(c, 0);
  run_and_check(rng, 32, 6144, 2048, zipf, w4a16_config_id("w4a16_wgmma_m128n256_s4"));
  run_and_check(rng, 32, 4096, 6144, zipf, w4a16_config_id("w4a16_wgmma_m256n128_s4"));
  run_and_check(rng, 32, 4096, 6144, zipf, w4a16_config_id("w4a16_wgmma_m128n256_s4"));
  run_and_check(rng, 32, 6144, 2048, zipf, w4a16_config_id("w4a16_wgmma_m256n128_s4"));
  run_and_check_swiglu(rng, 32, 256, 2048, zipf, w4a16_config_id("w4a16_wgmma_m128n128_s4"));  // a checked-in-full size
  run_and_check_swiglu(rng, 32, 256, 2048, zipf, w4a16_config_id("w4a16_wgmma_m128n256_s4"));
}

TEST(W4A16Gpu, EveryConfigOnARaggedProblem) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(testing::test_seed() ^ 0xA11ull);
  // 12 experts, counts 0..70 with empty ones (first and last included), N=328 (not a multiple of
  // 64 or 128), K=1216 = 64 x 19 (not a multiple of 128 or 256: a partial last stage).
  const std::vector<int32_t> counts = {0, 1, 70, 9, 0, 16, 33, 64, 7, 0, 65, 0};
  for (int cfg = 0; cfg < w4a16_num_configs(); ++cfg) run_and_check(rng, 12, 328, 1216, counts, cfg);
}

TEST(W4A16Gpu, OneTokenInTotal) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(testing::test_seed() ^ 0x1ull);
  std::vector<int32_t> counts(32, 0);
  counts[5] = 1;
  run_and_check(rng, 32, 4096, 6144, counts, w4a16_default_config(1, 32));
  counts.assign(32, 0);
  counts[31] = 1;
  run_and_check(rng, 32, 512, 2048, counts, 0);
}

TEST(W4A16Gpu, SkewedRoutingAndUnusedTrailingRows) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(testing::test_seed() ^ 0x5CEull);
  std::vector<int32_t> counts(16);
  for (int32_t& c : counts) c = static_cast<int32_t>(rng() % 6);
  counts[3] = 300;
  counts[0] = 0;
  // 5 extra rows past offsets[E] stay unwritten.
  for (int cfg : {w4a16_default_config(4, 16), w4a16_default_config(64, 16)}) {
    run_and_check(rng, 16, 1024, 2048, counts, cfg, /*extra_rows=*/5);
  }
}

TEST(W4A16Gpu, SmallKAndSingleExpert) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(testing::test_seed() ^ 0x64ull);
  run_and_check(rng, 1, 64, 64, {3}, 0);         // one 64-wide K chunk, a dense Linear (E = 1)
  run_and_check(rng, 1, 136, 320, {77}, 4);      // K = 64 x 5, N = 8 x 17
  run_and_check(rng, 3, 256, 192, {8, 0, 17}, 2);
  run_and_check(rng, 3, 256, 192, {8, 0, 17}, 8);
}

TEST(W4A16Gpu, DeterministicAcrossLaunches) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(testing::test_seed() ^ 0xDE7ull);
  const Problem p = make_problem(rng, 8, 512, 2048, {3, 0, 40, 1, 8, 64, 2, 9});
  const std::vector<uint16_t> y1 = run_gpu(p, 3);
  const std::vector<uint16_t> y2 = run_gpu(p, 3, /*repeats=*/3);
  EXPECT_TRUE(y1 == y2) << p.describe(3) << ": outputs differ between launches";
}

// K = 16 x odd (the golden tiny models' down projections): the kernel layout pads K to 64 with
// zero codes; every config, partial chunks and partial scale groups.
TEST(W4A16Gpu, KSixteenTimesOdd) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(testing::test_seed() ^ 0x0DDull);
  for (int cfg = 0; cfg < w4a16_num_configs(); ++cfg) {
    run_and_check(rng, 3, 64, 1040, {2, 0, 19}, cfg);  // 16 x 65: 17 chunks, 3 scale groups
    run_and_check(rng, 2, 24, 48, {5, 1}, cfg);        // 16 x 3, N = 24 (half a row tile)
  }
}

// Split-K (w4a16_splitk_plan): a dense Linear with few CTAs and a long K is cut into K parts on
// grid.z whose f32 sums a second kernel adds up, in both kernels (mostly called as GpuLinear does:
// no expert offsets, one expert over all rows). Parts of 4 scale groups (K = 16384: 8 parts), a
// K of 3 groups with a partial last one (3 parts of one group), a workspace that holds only two
// parts, rows past the expert ranges left unwritten by the reduction, and the same bits twice. The
// stream tiles' CTA activation ring counts its slots and parities from the part's first chunk (n32) or
// first scale group (n8 / n16).
TEST(W4A16Gpu, SplitKMatchesReference) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(testing::test_seed() ^ 0x5B1ull);
  const size_t big = size_t{64} << 20;
  for (int cfg : {w4a16_config_id("w4a16_stream_m64n8_d8"), w4a16_config_id("w4a16_stream_m128n16_d8"),
                  w4a16_config_id("w4a16_stream_m128n32_d4"), w4a16_config_id("w4a16_stream_m256n32_d4"),
                  w4a16_config_id("w4a16_swapab_m64n8k256_s4"), w4a16_config_id("w4a16_swapab_m128n32k128_s4"),
                  w4a16_config_id("w4a16_swapab_m128n64k128_s4"), w4a16_config_id("w4a16_wgmma_m128n64_s4"),
                  w4a16_config_id("w4a16_wgmma_m128n256_s4"), w4a16_config_id("w4a16_wgmma_m256n64_s4"),
                  w4a16_config_id("w4a16_wgmma_m256n128_s4")}) {
    for (int32_t m : {1, 5, 16}) run_and_check(rng, 1, 1024, 16384, {m}, cfg, 0, big, /*null_offsets=*/m != 5);
    if (w4a16_config(cfg).block_t >= 32) run_and_check(rng, 1, 1024, 6144, {64}, cfg, 0, big, true);
    run_and_check(rng, 1, 200, 1040, {37}, cfg, 0, 0, true);  // no offsets, no split: 37 rows, ragged N
    run_and_check(rng, 1, 520, 1040, {3}, cfg, 0, big);
    run_and_check(rng, 1, 1024, 4096, {7}, cfg, 0, size_t{2} * 7 * 1024 * 4);  // room for 2 parts
    run_and_check(rng, 2, 256, 2048, {3, 0}, cfg, /*extra_rows=*/4, big);
  }
  // The SwiGLU epilogue split too (MoE's shared expert: one expert, 2I rows): the reduction applies it.
  for (int cfg : {w4a16_config_id("w4a16_stream_m64n16_d8"), w4a16_config_id("w4a16_stream_m128n32_d4"),
                  w4a16_config_id("w4a16_stream_m256n32_d4"), w4a16_config_id("w4a16_swapab_m128n64k128_s4"),
                  w4a16_config_id("w4a16_wgmma_m128n128_s4"), w4a16_config_id("w4a16_wgmma_m256n64_s4"),
                  w4a16_config_id("w4a16_wgmma_m128n256_s4")}) {
    run_and_check_swiglu(rng, 1, 512, 6144, {64}, cfg, big);
    run_and_check_swiglu(rng, 1, 520, 2064, {5}, cfg, big);  // K = 16 x 129: a partial last group
    run_and_check_swiglu(rng, 2, 256, 4096, {3, 0}, cfg, big);
  }
  // Reductions of more than 256 blocks (64 rows x 6144 outputs: 384 blocks) sum their parts in a loop after the
  // offsets; the smaller ones above issue every part's load first (w4a16_splitk_reduce_kernel).
  for (int cfg : {w4a16_config_id("w4a16_stream_m128n32_d4"), w4a16_config_id("w4a16_stream_m256n32_d4")}) {
    run_and_check(rng, 2, 6144, 4096, {60, 0}, cfg, /*extra_rows=*/4, big);
    run_and_check_swiglu(rng, 1, 6144, 2048, {64}, cfg, big);
  }
  // Expert rows that start above row 0 (offsets[0] > 0): both reductions store only [offsets[0], offsets[E]);
  // the loads-first one reads every row's parts, so its rows before offsets[0] are the ones it must skip.
  // Each case asserts that its launch splits K and which reduction it gets.
  struct LeadCase {
    int64_t n, k;
    std::vector<int32_t> counts;
    int64_t extra_rows;
    int32_t lead_rows;
    bool swiglu;
    bool loads_first;
    std::vector<const char*> configs;
  };
  const LeadCase lead_cases[] = {
      {256,
       2048,
       {3, 0},
       4,
       5,
       false,
       true,
       {"w4a16_stream_m64n16_d8", "w4a16_stream_m256n32_d4", "w4a16_wgmma_m128n64_s4"}},
      {6144, 4096, {0, 40}, 2, 21, false, false, {"w4a16_stream_m256n32_d4", "w4a16_wgmma_m128n64_s4"}},
      {512, 2048, {6, 0}, 0, 7, true, true, {"w4a16_stream_m256n32_d4", "w4a16_wgmma_m128n64_s4"}}};
  for (const LeadCase& lc : lead_cases) {
    for (const char* name : lc.configs) {
      const int cfg = w4a16_config_id(name);
      // The launch arguments' shape, as the run below makes them (SwiGLU: n is the intermediate size, 2n weight
      // rows): the split and the reduction it gets.
      W4A16GroupedGemmArgs shape = problem_shape_args(
          Problem{2, lc.swiglu ? 2 * lc.n : lc.n, lc.k, lc.lead_rows + lc.counts[0] + lc.counts[1] + lc.extra_rows});
      if (lc.swiglu) shape.epilogue = W4A16Epilogue::kSwiGlu;
      const DevicePtr<float> ws = attach_splitk_workspace(shape, big);
      ASSERT_GT(w4a16_splitk_plan(shape, w4a16_config(cfg), current_device_limits().sm_count).parts, 1)
          << name << " N=" << shape.n << " K=" << lc.k;
      ASSERT_EQ(w4a16_splitk_reduce_launch(shape).loads_first, lc.loads_first)
          << name << " N=" << shape.n << ": " << w4a16_splitk_reduce_launch(shape).blocks << " reduction blocks";
      if (lc.swiglu) {
        run_and_check_swiglu(rng, 2, lc.n, lc.k, lc.counts, cfg, big, lc.lead_rows);
      } else {
        run_and_check(rng, 2, lc.n, lc.k, lc.counts, cfg, lc.extra_rows, big, /*null_offsets=*/false, lc.lead_rows);
      }
    }
  }
  const Problem p = make_problem(rng, 1, 768, 8192, {9});
  for (int cfg : {w4a16_config_id("w4a16_stream_m64n16_d8"), w4a16_config_id("w4a16_swapab_m128n64k128_s4"),
                  w4a16_config_id("w4a16_wgmma_m128n64_s4"), w4a16_config_id("w4a16_wgmma_m256n128_s4")}) {
    EXPECT_TRUE(run_gpu(p, cfg, 1, big) == run_gpu(p, cfg, 2, big)) << p.describe(cfg) << ": split-K outputs differ";
  }
}

// Expert row classes: two launches that skip each other's experts by their device-side counts write
// every expert's rows once, matching the f64 reference (and, class by class, the unfiltered launch of
// the same config bit for bit, though a workspace is offered: a class launch never splits K); one class
// alone leaves the other experts' rows untouched.
TEST(W4A16Gpu, ExpertRowClassesPartitionTheExperts) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(testing::test_seed() ^ 0xC1A55ull);
  const std::vector<int32_t> counts = {0, 3, 40, 1, 17, 100, 9, 16, 0, 300, 64, 65};
  const Problem p = make_problem(rng, static_cast<int64_t>(counts.size()), 1040, 2064, counts);
  const int small = w4a16_config_id("w4a16_stream_m64n16_d8");
  for (const char* large_name : {"w4a16_wgmma_m128n64_s4", "w4a16_wgmma_m128n256_s4", "w4a16_swapab_m128n32k128_s4"}) {
    const int large = w4a16_config_id(large_name);
    const std::vector<ClassLaunch> both = {{small, 0, 16}, {large, 17}};
    const std::vector<uint16_t> y = run_gpu_launches(p, both, 1, size_t{64} << 20);
    check_against_reference(p, y, large, rng());
    const std::vector<uint16_t> y_small_only = run_gpu_launches(p, {{small, 0, 16}});
    const std::vector<uint16_t> y_small = run_gpu(p, small), y_large = run_gpu(p, large);
    for (size_t e = 0; e < counts.size(); ++e) {
      const bool is_small = counts[e] <= 16;
      for (int32_t r = p.offsets[e]; r < p.offsets[e + 1]; ++r) {
        for (int64_t c = 0; c < p.n; ++c) {
          const size_t i = static_cast<size_t>(r * p.n + c);
          ASSERT_EQ(y[i], is_small ? y_small[i] : y_large[i]) << large_name << ": expert " << e << " row " << r << " col " << c;
          ASSERT_EQ(y_small_only[i], is_small ? y_small[i] : uint16_t{0xFFFF})
              << "the small class alone: expert " << e << " (" << counts[e] << " rows) row " << r;
        }
      }
    }
  }
}

TEST(W4A16Gpu, EmptyBatchLaunchesNothing) {
  SKIP_WITHOUT_GPU();
  W4A16GroupedGemmArgs a;
  a.m_total = 0;
  a.n = 64;
  a.k = 64;
  a.n_experts = 4;
  w4a16_grouped_gemm(a, 0, nullptr);
  FP4MOE_CUDA_CHECK(cudaDeviceSynchronize());
}

}  // namespace
}  // namespace fp4moe::cuda::sm90
