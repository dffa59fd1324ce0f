// Tokens per expert for the GEMM benchmarks: uniform (every expert gets the same count) or
// Zipf-skewed (a few hot experts, a long tail, some experts empty) with the same total. Needs no
// GPU. Tested by tests/tune/test_tune_cache.cpp (RoutingCounts.*).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace fp4moe::tune {

// n_experts copies of tokens_per_expert.
std::vector<int32_t> uniform_counts(int64_t n_experts, int64_t tokens_per_expert);

// A seeded draw of `total` tokens over `n_experts` experts: expert ranks are a random permutation,
// the expert of rank r (1-based) has probability r^-s / sum_j j^-s, and each token picks its expert
// independently (a multinomial draw). Sums to `total`; the same (n_experts, total, s, seed) gives
// the same counts on every platform (own generator: splitmix64 + inverse-CDF search).
std::vector<int32_t> zipf_counts(int64_t n_experts, int64_t total, double s, uint64_t seed);

// Exclusive prefix sums: n_experts + 1 offsets, offsets[0] = 0, offsets[E] = sum.
std::vector<int32_t> offsets_of(const std::vector<int32_t>& counts);

// "max 4511, min 0, 3 empty" for tables.
std::string describe_counts(const std::vector<int32_t>& counts);

}  // namespace fp4moe::tune
