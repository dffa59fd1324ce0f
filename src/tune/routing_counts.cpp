// Uniform and Zipf-skewed tokens-per-expert counts for the GEMM benchmarks (see routing_counts.h).
// Tested by tests/tune/test_tune_cache.cpp.
#include "tune/routing_counts.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "core/error.h"

namespace fp4moe::tune {

namespace {

uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Uniform in [0, 1) from the top 53 bits.
double uniform01(uint64_t& state) { return static_cast<double>(splitmix64(state) >> 11) * 0x1.0p-53; }

}  // namespace

std::vector<int32_t> uniform_counts(int64_t n_experts, int64_t tokens_per_expert) {
  FP4MOE_CHECK(n_experts >= 1 && tokens_per_expert >= 0 && tokens_per_expert <= std::numeric_limits<int32_t>::max())
      << "uniform_counts: E=" << n_experts << " tokens per expert=" << tokens_per_expert;
  return std::vector<int32_t>(static_cast<size_t>(n_experts), static_cast<int32_t>(tokens_per_expert));
}

std::vector<int32_t> zipf_counts(int64_t n_experts, int64_t total, double s, uint64_t seed) {
  FP4MOE_CHECK(n_experts >= 1 && total >= 0 && total <= std::numeric_limits<int32_t>::max() && s > 0)
      << "zipf_counts: E=" << n_experts << " total=" << total << " s=" << s;
  const size_t e = static_cast<size_t>(n_experts);
  uint64_t state = seed;
  // Rank -> expert: Fisher-Yates with the same generator.
  std::vector<size_t> expert_of_rank(e);
  std::iota(expert_of_rank.begin(), expert_of_rank.end(), size_t{0});
  for (size_t i = e - 1; i > 0; --i) {
    const size_t j = static_cast<size_t>(splitmix64(state) % (i + 1));
    std::swap(expert_of_rank[i], expert_of_rank[j]);
  }
  std::vector<double> cdf(e);
  double sum = 0;
  for (size_t r = 0; r < e; ++r) {
    sum += std::pow(static_cast<double>(r + 1), -s);
    cdf[r] = sum;
  }
  std::vector<int32_t> counts(e, 0);
  for (int64_t t = 0; t < total; ++t) {
    const double u = uniform01(state) * sum;
    size_t r = static_cast<size_t>(std::upper_bound(cdf.begin(), cdf.end(), u) - cdf.begin());
    r = std::min(r, e - 1);  // u < sum always; guards rounding at the top
    ++counts[expert_of_rank[r]];
  }
  return counts;
}

std::vector<int32_t> offsets_of(const std::vector<int32_t>& counts) {
  std::vector<int32_t> off(counts.size() + 1, 0);
  int64_t acc = 0;
  for (size_t i = 0; i < counts.size(); ++i) {
    FP4MOE_CHECK(counts[i] >= 0) << "offsets_of: count " << counts[i] << " of expert " << i << " is negative";
    acc += counts[i];
    FP4MOE_CHECK(acc <= std::numeric_limits<int32_t>::max()) << "offsets_of: total " << acc << " exceeds int32";
    off[i + 1] = static_cast<int32_t>(acc);
  }
  return off;
}

std::string describe_counts(const std::vector<int32_t>& counts) {
  if (counts.empty()) return "no experts";
  const auto [mn, mx] = std::minmax_element(counts.begin(), counts.end());
  const auto empty = std::count(counts.begin(), counts.end(), 0);
  return "max " + std::to_string(*mx) + ", min " + std::to_string(*mn) + ", " + std::to_string(empty) + " empty";
}

}  // namespace fp4moe::tune
