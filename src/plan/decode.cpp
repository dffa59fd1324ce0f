// Decode economics (formulas in decode.h). Tested by tests/plan/test_decode.cpp.
#include "plan/decode.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace fp4moe::plan {
namespace {

constexpr double kNvfp4Bytes = 0.5 + 1.0 / 16.0;
constexpr double kBf16Bytes = 2.0;

// Per-expert selection probabilities.
std::vector<double> selection_probabilities(const DecodeModel& m) {
  std::vector<double> p(static_cast<size_t>(m.n_experts), static_cast<double>(m.top_k) / static_cast<double>(m.n_experts));
  if (m.routing.empty()) return p;
  double sum = 0;
  for (double h : m.routing) sum += h;
  for (size_t e = 0; e < p.size(); ++e) p[e] = std::min(1.0, static_cast<double>(m.top_k) * m.routing[e] / sum);
  return p;
}

}  // namespace

void check_decode_model(const DecodeModel& m) {
  FP4MOE_CHECK(m.n_experts > 0 && m.top_k > 0 && m.hidden > 0 && m.intermediate > 0)
      << "decode model needs E, topk, H, I > 0 (got E=" << m.n_experts << " topk=" << m.top_k << " H=" << m.hidden
      << " I=" << m.intermediate << ")";
  FP4MOE_CHECK(m.top_k <= m.n_experts) << "topk=" << m.top_k << " > E=" << m.n_experts;
  FP4MOE_CHECK(m.ep >= 1 && m.n_experts % m.ep == 0) << "EP=" << m.ep << " must divide E=" << m.n_experts;
  if (!m.routing.empty()) {
    FP4MOE_CHECK(static_cast<int64_t>(m.routing.size()) == m.n_experts)
        << "routing histogram has " << m.routing.size() << " entries, E=" << m.n_experts;
    double sum = 0;
    for (double h : m.routing) {
      FP4MOE_CHECK(std::isfinite(h) && h >= 0) << "routing histogram has an entry " << h << " (not a finite count >= 0)";
      sum += h;
    }
    FP4MOE_CHECK(sum > 0) << "routing histogram sums to 0";
    FP4MOE_CHECK(std::isfinite(sum)) << "routing histogram sums past a double (" << sum << ")";
    // A token picks an expert at most once: no expert holds more than 1/topk of the routed tokens.
    const auto top = std::max_element(m.routing.begin(), m.routing.end());
    const double share = *top / sum;
    FP4MOE_CHECK(share <= 1.0 / static_cast<double>(m.top_k) * (1.0 + 1e-9))
        << "routing histogram: expert " << (top - m.routing.begin()) << " has " << *top << " of " << sum
        << " routed tokens (a share of " << share << "), more than 1/topk = " << 1.0 / static_cast<double>(m.top_k)
        << ": a token picks an expert at most once";
  }
}

int64_t binomial_quantile(int64_t n, double p, double q) {
  if (n <= 0 || p <= 0) return 0;
  if (p >= 1) return n;
  double cdf = 0;
  const double lp = std::log(p), lq = std::log1p(-p);
  // The walk starts t = 12 sd + 144 below the mean (or at 0): by Bernstein's inequality the mass below is at most
  // exp(-t^2 / (2 (sd^2 + t / 3))), and that exponent is >= 72 for every sd (mass < 6e-32), so the quantile is the
  // same and the walk takes O(sd + 144) steps instead of O(n p) (p near 1 included).
  const double mean = static_cast<double>(n) * p, sd = std::sqrt(mean * (1 - p));
  const auto x0 = static_cast<int64_t>(std::max(0.0, std::floor(mean - 12 * sd - 144)));
  for (int64_t x = x0; x <= n; ++x) {
    const double log_pmf = std::lgamma(static_cast<double>(n) + 1) - std::lgamma(static_cast<double>(x) + 1) -
                           std::lgamma(static_cast<double>(n - x) + 1) + static_cast<double>(x) * lp +
                           static_cast<double>(n - x) * lq;
    cdf += std::exp(log_pmf);
    if (cdf >= q - 1e-12) return x;
  }
  return n;
}

DecodeRow decode_row(const DecodeModel& m, const GpuSpec& gpu, int64_t concurrency) {
  check_decode_model(m);
  FP4MOE_CHECK(concurrency >= 1 && concurrency <= kMaxDecodeConcurrency)
      << "concurrency must be in [1, " << kMaxDecodeConcurrency << "] (got " << concurrency << ")";
  const std::vector<double> p = selection_probabilities(m);
  const double t = static_cast<double>(concurrency);
  const int64_t per_rank = m.n_experts / m.ep;
  const bool fp4 = gpu.fp4_dense_tflops > 0;
  const double peak = (fp4 ? gpu.fp4_dense_tflops : gpu.bf16_dense_tflops) * 1e12;
  const double a_bytes = fp4 ? kNvfp4Bytes : kBf16Bytes;
  const double h = static_cast<double>(m.hidden), i = static_cast<double>(m.intermediate);

  DecodeRow r;
  r.concurrency = concurrency;
  r.tokens_per_expert_mean = t * static_cast<double>(m.top_k) / static_cast<double>(m.n_experts);
  // Quantiles over experts of their token counts: for uniform routing every expert has the same
  // Binomial(T, k/E); with a histogram, the quantile of the per-expert p50/p99 is reported.
  if (m.routing.empty()) {
    r.tokens_per_expert_p50 = static_cast<double>(binomial_quantile(concurrency, p[0], 0.50));
    r.tokens_per_expert_p99 = static_cast<double>(binomial_quantile(concurrency, p[0], 0.99));
  } else {
    std::vector<double> p50s, p99s;
    for (double pe : p) {
      p50s.push_back(static_cast<double>(binomial_quantile(concurrency, pe, 0.50)));
      p99s.push_back(static_cast<double>(binomial_quantile(concurrency, pe, 0.99)));
    }
    std::sort(p50s.begin(), p50s.end());
    std::sort(p99s.begin(), p99s.end());
    r.tokens_per_expert_p50 = p50s[p50s.size() / 2];
    r.tokens_per_expert_p99 = p99s[std::min(p99s.size() - 1, static_cast<size_t>(std::ceil(0.99 * p99s.size())) - 1)];
  }
  // Rank 0 holds experts [0, E/EP); with uniform routing every rank is the same.
  for (int64_t e = 0; e < per_rank; ++e) {
    r.active_experts_per_rank += 1.0 - std::pow(1.0 - p[static_cast<size_t>(e)], t);
    r.tokens_per_rank += t * p[static_cast<size_t>(e)];
  }
  const double w1 = 2 * i * h * kNvfp4Bytes, w2 = i * h * kNvfp4Bytes;
  r.gemm1_bytes = r.active_experts_per_rank * w1 + r.tokens_per_rank * (h * a_bytes + 2 * i * kBf16Bytes);
  r.gemm2_bytes = r.active_experts_per_rank * w2 + r.tokens_per_rank * (i * a_bytes + h * kBf16Bytes);
  r.gemm1_flops = 2 * r.tokens_per_rank * 2 * i * h;
  r.gemm2_flops = 2 * r.tokens_per_rank * i * h;
  r.bytes = r.gemm1_bytes + r.gemm2_bytes;
  r.flops = r.gemm1_flops + r.gemm2_flops;
  const double mem_s = r.bytes / (gpu.hbm_gbps * 1e9);
  const double compute_s = r.flops / peak;
  r.time_us = std::max(mem_s, compute_s) * 1e6;
  r.bound = mem_s >= compute_s ? "hbm" : "compute";
  r.arithmetic_intensity = r.flops / r.bytes;
  r.utilization = r.flops / (r.time_us * 1e-6) / peak;
  return r;
}

std::vector<DecodeRow> decode_table(const DecodeModel& m, const GpuSpec& gpu, const std::vector<int64_t>& concurrencies) {
  std::vector<DecodeRow> out;
  for (int64_t c : concurrencies) out.push_back(decode_row(m, gpu, c));
  return out;
}

int64_t concurrency_for_utilization(const DecodeModel& m, const GpuSpec& gpu, double target, int64_t max_concurrency) {
  FP4MOE_CHECK(target > 0 && target <= 1) << "target utilization must be in (0, 1], got " << target;
  // Utilization grows with concurrency (weights are amortized over more tokens): bisect.
  if (decode_row(m, gpu, max_concurrency).utilization < target) return -1;
  int64_t lo = 1, hi = max_concurrency;
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (decode_row(m, gpu, mid).utilization >= target) hi = mid;
    else lo = mid + 1;
  }
  return lo;
}

}  // namespace fp4moe::plan
