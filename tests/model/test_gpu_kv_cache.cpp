// The GPU KV cache's block accounting (model/cuda/gpu_kv_cache.h, host only): blocks are taken as
// positions need them, given back by truncate and destruction, a short pool refuses with the
// numbers and takes nothing, rollback undoes a reserve, slots map positions through the block list,
// and double frees are caught. Random interleavings keep the pool's free count equal to the blocks
// no state holds. copy_prefix shares whole pages (counted holders; free when the last lets go) and a
// write into a shared page is refused. The pool sized from GPU memory (kv_tokens_for_memory,
// --mem-fraction-static): whole pages within the budget, the caps, and a budget short of a page refused
// with the numbers.
#include <gtest/gtest.h>

#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "core/error.h"
#include "model/cuda/gpu_kv_cache.h"
#include "testing/testing.h"

namespace fp4moe::model {
namespace {

TEST(GpuKvCache, ReserveCommitTruncateAndSlots) {
  auto pool = std::make_shared<KvBlockPool>(8, 16);
  GpuKvState s(nullptr, pool, 100);
  EXPECT_EQ(s.reserve(1), 1);  // position 0 needs block one
  s.commit(1);
  EXPECT_EQ(s.reserve(15), 0);  // positions 1..15 fit the same block
  s.commit(15);
  EXPECT_EQ(s.reserve(17), 2);  // 16..32 need two more
  s.commit(17);
  EXPECT_EQ(s.length(), 33);
  EXPECT_EQ(pool->n_free(), 5);
  EXPECT_EQ(s.bytes(), 3u * 16u * 100u);
  const auto& b = s.blocks();
  EXPECT_EQ(s.slot(0), b[0] * 16);
  EXPECT_EQ(s.slot(17), b[1] * 16 + 1);
  EXPECT_EQ(s.slot(32), b[2] * 16);
  EXPECT_THROW(s.slot(48), Error);
  s.truncate(16);  // keeps exactly one block
  EXPECT_EQ(s.blocks().size(), 1u);
  EXPECT_EQ(pool->n_free(), 7);
  s.truncate(0);
  EXPECT_EQ(pool->n_free(), 8);
  EXPECT_THROW(s.truncate(1), Error);
}

TEST(GpuKvCache, CopyPrefixSharesWholePagesUntilTheLastHolderLetsGo) {
  auto pool = std::make_shared<KvBlockPool>(8, 16);
  auto src = std::make_unique<GpuKvState>(nullptr, pool, 100);
  src->reserve(40);
  src->commit(40);  // 3 blocks
  EXPECT_EQ(pool->n_free(), 5);
  std::unique_ptr<KvState> copy = src->copy_prefix(39);
  auto* c = dynamic_cast<GpuKvState*>(copy.get());
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(c->length(), 32) << "rounded down to whole pages";
  ASSERT_EQ(c->blocks().size(), 2u);
  EXPECT_EQ(c->blocks()[0], src->blocks()[0]);
  EXPECT_EQ(c->blocks()[1], src->blocks()[1]);
  EXPECT_EQ(pool->holders(src->blocks()[0]), 2);
  EXPECT_EQ(pool->holders(src->blocks()[2]), 1);
  EXPECT_EQ(pool->n_free(), 5) << "nothing taken: the pages are shared";
  EXPECT_EQ(c->slot(17), src->slot(17));
  EXPECT_EQ(c->reserve(5), 1) << "the copy writes from position 32 on, into a block of its own";
  c->commit(5);
  EXPECT_NE(c->blocks()[2], src->blocks()[2]);
  EXPECT_EQ(pool->n_free(), 4);
  src.reset();  // the source goes (an evicted cache entry): the shared pages stay the copy's
  EXPECT_EQ(pool->n_free(), 5);
  EXPECT_EQ(pool->holders(c->blocks()[0]), 1);
  copy.reset();
  EXPECT_EQ(pool->n_free(), 8);

  // A state truncated into a shared page must not write there.
  GpuKvState a(nullptr, pool, 1);
  a.reserve(32);
  a.commit(32);
  std::unique_ptr<KvState> b = a.copy_prefix(32);
  a.truncate(20);
  try {
    a.reserve(1);
    FAIL() << "a write into a shared page was allowed";
  } catch (const Error& e) {
    const std::string w = e.what();
    EXPECT_NE(w.find("position 20 would be written into block"), std::string::npos) << w;
    EXPECT_NE(w.find("which 2 states share"), std::string::npos) << w;
  }
  b.reset();
  EXPECT_EQ(a.reserve(1), 0) << "no longer shared";
  EXPECT_THROW(pool->share({a.blocks()[0], 7}), Error) << "block 7 is free";
  EXPECT_EQ(pool->holders(a.blocks()[0]), 1) << "a failed share changes nothing";
}

TEST(GpuKvCache, ShortPoolRefusesWithNumbersAndTakesNothing) {
  auto pool = std::make_shared<KvBlockPool>(4, 16);
  GpuKvState a(nullptr, pool, 1), b(nullptr, pool, 1);
  EXPECT_EQ(a.reserve(48), 3);
  a.commit(48);
  try {
    b.reserve(32);
    FAIL() << "reserve beyond the pool succeeded";
  } catch (const Error& e) {
    const std::string w = e.what();
    EXPECT_NE(w.find("needs 2 more blocks of 16 tokens but only 1 of 4 are free"), std::string::npos) << w;
  }
  EXPECT_EQ(pool->n_free(), 1);
  EXPECT_TRUE(b.blocks().empty());
  const int64_t added = b.reserve(10);
  EXPECT_EQ(added, 1);
  b.rollback(added);
  EXPECT_EQ(pool->n_free(), 1);
  EXPECT_EQ(b.length(), 0);
}

TEST(GpuKvCache, DestructionReturnsBlocksAndDoubleFreeIsCaught) {
  auto pool = std::make_shared<KvBlockPool>(4, 2);
  {
    GpuKvState s(nullptr, pool, 1);
    s.reserve(5);
    s.commit(5);
    EXPECT_EQ(pool->n_free(), 1);
  }
  EXPECT_EQ(pool->n_free(), 4);
  std::vector<int32_t> got = pool->take(2);
  pool->give(got);
  EXPECT_THROW(pool->give(got), Error);
  EXPECT_THROW(pool->give({7}), Error);
  EXPECT_THROW(KvBlockPool(0, 16), Error);
}

TEST(GpuKvCache, RandomInterleavingsKeepTheAccountingExact) {
  std::mt19937_64 rng(testing::test_seed());
  auto pool = std::make_shared<KvBlockPool>(64, 4);
  std::vector<std::unique_ptr<GpuKvState>> states;
  for (int i = 0; i < 6; ++i) states.push_back(std::make_unique<GpuKvState>(nullptr, pool, 1));
  for (int it = 0; it < 5000; ++it) {
    GpuKvState& s = *states[rng() % states.size()];
    const int op = static_cast<int>(rng() % 4);
    if (op < 2) {
      const int64_t n = 1 + static_cast<int64_t>(rng() % 9);
      try {
        s.reserve(n);
        s.commit(n);
      } catch (const Error&) {
      }
    } else if (op == 2) {
      s.truncate(static_cast<int64_t>(rng() % (s.length() + 1)));
    } else {
      s.truncate(0);
    }
    int64_t held = 0;
    std::set<int32_t> all;
    for (const auto& st : states) {
      ASSERT_EQ(static_cast<int64_t>(st->blocks().size()), (st->length() + 3) / 4);
      held += static_cast<int64_t>(st->blocks().size());
      for (int32_t b : st->blocks()) ASSERT_TRUE(all.insert(b).second) << "block " << b << " held twice";
    }
    ASSERT_EQ(pool->n_free() + held, 64);
  }
}

// ---- the pool sized from GPU memory (--mem-fraction-static) ----

constexpr uint64_t kGiB = uint64_t{1} << 30, kMiB = uint64_t{1} << 20;

TEST(GpuKvMemory, BudgetIsFreeAfterLessTheReservedShareOfFreeBeforeInWholePages) {
  // 79 GiB free when the load began, 0.9 of it may hold everything; after the load 50 GiB are free:
  // 50 - 7.9 GiB less 8 buffers x 2 MiB for the cache.
  KvMemoryBudget b{50 * kGiB, 79 * kGiB, 80 * kGiB, 0.9, 4608, 16, INT64_MAX, 8};
  const int64_t tokens = kv_tokens_for_memory(b);
  const double budget = 50.0 * kGiB - 79.0 * kGiB * 0.1 - 8.0 * 2 * kMiB;
  EXPECT_EQ(tokens % 16, 0);
  EXPECT_LE(static_cast<double>(tokens) * 4608, budget);
  EXPECT_GT(static_cast<double>(tokens + 16) * 4608, budget);  // a page more would not fit
  // Random budgets: always whole pages, within the budget, a page short of overflowing it.
  std::mt19937_64 rng(testing::test_seed());
  for (int i = 0; i < 200; ++i) {
    KvMemoryBudget r;
    r.total_bytes = (1 + rng() % 192) * kGiB;
    r.free_before = 1 + rng() % r.total_bytes;
    r.free_after = rng() % (r.free_before + 1);
    r.fraction = 0.05 + 0.95 * static_cast<double>(rng() % 1000) / 999.0;
    r.bytes_per_token = 1 + static_cast<int64_t>(rng() % 200000);
    r.page_size = int64_t{1} << (rng() % 7);
    r.max_tokens = rng() % 2 ? INT64_MAX : 1 + static_cast<int64_t>(rng() % 100000);
    r.n_allocations = 1 + static_cast<int64_t>(rng() % 200);
    const double room = static_cast<double>(r.free_after) - static_cast<double>(r.free_before) * (1.0 - r.fraction) -
                        static_cast<double>(r.n_allocations) * 2 * kMiB;
    const double page_bytes = static_cast<double>(r.page_size * r.bytes_per_token);
    if (room < page_bytes) {
      EXPECT_THROW(kv_tokens_for_memory(r), Error);
      continue;
    }
    const int64_t t = kv_tokens_for_memory(r);
    SCOPED_TRACE(::testing::Message() << "after " << r.free_after << " before " << r.free_before << " fraction "
                                      << r.fraction << " bpt " << r.bytes_per_token << " page " << r.page_size
                                      << " cap " << r.max_tokens << " buffers " << r.n_allocations);
    EXPECT_EQ(t % r.page_size, 0);
    EXPECT_GE(t, r.page_size);
    EXPECT_LE(static_cast<double>(t) * static_cast<double>(r.bytes_per_token), room);
    EXPECT_LE(t, std::max(r.max_tokens, r.page_size));
    EXPECT_LT(t, int64_t{1} << 31);
    const bool capped = t + r.page_size > r.max_tokens || t + r.page_size > INT32_MAX;
    if (!capped) {
      EXPECT_GT(static_cast<double>(t + r.page_size) * static_cast<double>(r.bytes_per_token), room);
    }
  }
}

TEST(GpuKvMemory, CapsAreMaxTotalTokensAndTheInt32Slots) {
  // --max-total-tokens 20000 with room for millions: the cap, rounded down to pages.
  EXPECT_EQ(kv_tokens_for_memory({100 * kGiB, 139 * kGiB, 140 * kGiB, 0.9, 4608, 16, 20000, 8}), 20000 / 16 * 16);
  // A 2-byte-per-token cache in 100 GiB would pass 2^31 tokens: cut at the kernels' int32 slots.
  EXPECT_EQ(kv_tokens_for_memory({100 * kGiB, 139 * kGiB, 140 * kGiB, 0.9, 2, 16, INT64_MAX, 8}),
            int64_t{INT32_MAX} / 16 * 16);
}

TEST(GpuKvMemory, TooSmallAFractionIsRefusedWithTheNumbers) {
  // 80 GiB free before the load, 10 GiB after: 0.5 leaves 10 - 40 GiB less 4 MiB.
  try {
    kv_tokens_for_memory({10 * kGiB, 80 * kGiB, 81 * kGiB, 0.5, 4608, 16, INT64_MAX, 2});
    FAIL() << "a negative budget was accepted";
  } catch (const Error& e) {
    const std::string w = e.what();
    EXPECT_NE(w.find("--mem-fraction-static 0.5 leaves -30.00 GiB for the KV cache, less than one page (16 tokens x "
                     "4608 B)"),
              std::string::npos)
        << w;
    EXPECT_NE(w.find("of the 80.00 GiB free when the load began (the GPU has 81.00 GiB), 0.5 x 80.00 GiB = 40.00 GiB "
                     "may hold the weights, step buffers and KV cache, and the load took 70.00 GiB"),
              std::string::npos)
        << w;
    EXPECT_NE(w.find("raise it to at least 0.876"), std::string::npos) << w;  // (70 GiB + 4 MiB + 72 KiB) / 80 GiB
  }
  EXPECT_THROW(kv_tokens_for_memory({10 * kGiB, 80 * kGiB, 81 * kGiB, 0.0, 4608, 16, 100, 1}), Error);
  EXPECT_THROW(kv_tokens_for_memory({10 * kGiB, 80 * kGiB, 81 * kGiB, 1.5, 4608, 16, 100, 1}), Error);
  // The granularity alone can leave no room: 1 MiB free after the load with all of it allowed, 2 MiB a buffer.
  EXPECT_THROW(kv_tokens_for_memory({kMiB, 10 * kGiB, 11 * kGiB, 1.0, 16, 16, 100, 1}), Error);
  EXPECT_EQ(format_gib(512.0 * 1024 * 1024), "512.0 MiB");
}

}  // namespace
}  // namespace fp4moe::model
