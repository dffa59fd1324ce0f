// DispatchPlan on random routing: counts sum, valid permutation and inverse, empty experts,
// stable (token, slot) order within an expert, zero tokens, and bad expert ids.
// Run: build/tests/moe/test_moe --gtest_filter='Dispatch*'.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>
#include <vector>

#include "core/error.h"
#include "moe/dispatch.h"
#include "testing/testing.h"

namespace fp4moe::moe {
namespace {

TEST(Dispatch, HandComputedExample) {
  // 3 tokens, top-2, 4 experts; expert 3 gets nothing.
  const int32_t idx[] = {2, 0, 0, 2, 1, 0};
  DispatchPlan p = DispatchPlan::build(idx, 3, 2, 4);
  p.validate();
  EXPECT_EQ(p.offsets, (std::vector<int64_t>{0, 3, 4, 6, 6}));
  EXPECT_EQ(p.token, (std::vector<int32_t>{0, 1, 2, 2, 0, 1}));
  EXPECT_EQ(p.slot, (std::vector<int32_t>{1, 0, 1, 0, 0, 1}));
  EXPECT_EQ(p.entry_of, (std::vector<int64_t>{4, 0, 1, 5, 3, 2}));
  EXPECT_EQ(p.counts(), (std::vector<int64_t>{3, 1, 2, 0}));
  EXPECT_EQ(p.max_tokens_per_expert(), 3);
  EXPECT_EQ(p.n_active_experts(), 3);
  EXPECT_DOUBLE_EQ(p.mean_tokens_per_expert(), 1.5);
  EXPECT_EQ(p.summary(), "tokens 3 top-2 experts 4: active 3, max 3, mean 1.50");
}

TEST(Dispatch, RandomRoutingProperties) {
  std::mt19937_64 rng(testing::test_seed());
  for (int trial = 0; trial < 200; ++trial) {
    const int E = std::uniform_int_distribution<int>(1, 300)(rng);
    const int k = std::uniform_int_distribution<int>(1, std::min(E, 9))(rng);
    const int64_t n = std::uniform_int_distribution<int64_t>(0, 300)(rng);
    // Route to a random subset of the experts (so some are empty), distinct per token.
    const int n_used = std::uniform_int_distribution<int>(k, E)(rng);
    std::vector<int32_t> used(E);
    std::iota(used.begin(), used.end(), 0);
    std::shuffle(used.begin(), used.end(), rng);
    used.resize(n_used);
    std::vector<int32_t> idx(n * k);
    for (int64_t t = 0; t < n; ++t) {
      std::shuffle(used.begin(), used.end(), rng);
      std::copy(used.begin(), used.begin() + k, idx.begin() + t * k);
    }
    SCOPED_TRACE(::testing::Message() << "E=" << E << " top-" << k << " tokens " << n);
    DispatchPlan p = DispatchPlan::build(idx.data(), n, k, E);
    ASSERT_NO_THROW(p.validate());
    std::vector<int64_t> counts = p.counts();
    ASSERT_EQ(std::accumulate(counts.begin(), counts.end(), int64_t{0}), n * k);
    std::vector<int64_t> expect(E, 0);
    for (int32_t e : idx) ++expect[e];
    ASSERT_EQ(counts, expect);
    for (int64_t pair = 0; pair < n * k; ++pair) {
      const int64_t entry = p.entry_of[pair];
      ASSERT_EQ(p.token[entry], pair / k);
      ASSERT_EQ(p.slot[entry], pair % k);
      const int32_t e = idx[pair];
      ASSERT_TRUE(entry >= p.offsets[e] && entry < p.offsets[e + 1]) << "pair " << pair;
    }
    ASSERT_EQ(p.n_active_experts(), static_cast<int>(std::count_if(expect.begin(), expect.end(),
                                                                  [](int64_t c) { return c > 0; })));
  }
}

TEST(Dispatch, ValidateCatchesCorruptionAndBuildRejectsBadIds) {
  const int32_t idx[] = {1, 0, 1, 2};
  DispatchPlan p = DispatchPlan::build(idx, 2, 2, 3);
  DispatchPlan swapped = p;
  std::swap(swapped.token[1], swapped.token[2]);  // breaks the stable order and the inverse
  EXPECT_THROW(swapped.validate(), Error);
  DispatchPlan bad_offsets = p;
  bad_offsets.offsets[1] = 3;
  EXPECT_THROW(bad_offsets.validate(), Error);
  const int32_t bad[] = {0, 3};
  try {
    DispatchPlan::build(bad, 1, 2, 3);
    FAIL() << "expert 3 of 3 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("token 0 slot 1 routes to expert 3, outside [0, 3)"), std::string::npos)
        << e.what();
  }
  DispatchPlan empty = DispatchPlan::build(nullptr, 0, 4, 8);
  empty.validate();
  EXPECT_EQ(empty.offsets, std::vector<int64_t>(9, 0));
  EXPECT_EQ(empty.max_tokens_per_expert(), 0);
}

}  // namespace
}  // namespace fp4moe::moe
