// engine::KvBlockAllocator: capacity in whole pages, growth block by block, all-or-nothing
// reservations, release, double-release detection.
#include <gtest/gtest.h>

#include "core/error.h"
#include "engine/kv_blocks.h"

namespace fp4moe::engine {
namespace {

TEST(KvBlocks, ReserveGrowRelease) {
  KvBlockAllocator a(100, 16);  // 6 whole pages: 96 tokens
  EXPECT_EQ(a.n_blocks(), 6);
  EXPECT_EQ(a.capacity_tokens(), 96);
  std::vector<int32_t> t1, t2;
  ASSERT_TRUE(a.reserve(t1, 17));  // 2 pages
  EXPECT_EQ(t1, (std::vector<int32_t>{0, 1}));
  ASSERT_TRUE(a.reserve(t1, 32));  // still 2
  EXPECT_EQ(t1.size(), 2u);
  ASSERT_TRUE(a.reserve(t2, 48));  // 3 pages
  EXPECT_EQ(a.n_free(), 1);
  EXPECT_FALSE(a.reserve(t1, 64)) << "needs 2 more pages, 1 free";
  EXPECT_EQ(t1.size(), 2u) << "a failed reservation takes nothing";
  ASSERT_TRUE(a.reserve(t1, 33));
  EXPECT_EQ(a.n_free(), 0);
  a.release(t2);
  EXPECT_TRUE(t2.empty());
  EXPECT_EQ(a.n_free(), 3);
  EXPECT_EQ(a.describe(), "used 3 / 6 blocks of 16 tokens");
  a.release(t1);
  EXPECT_EQ(a.n_free(), 6);
  std::vector<int32_t> again = {0};
  EXPECT_THROW(a.release(again), Error) << "block 0 is already free: a second release must fail";
  std::vector<int32_t> outside = {6};
  EXPECT_THROW(a.release(outside), Error);
}

TEST(KvBlocks, RejectsEmptyCapacity) {
  EXPECT_THROW(KvBlockAllocator(8, 16), Error);
  EXPECT_THROW(KvBlockAllocator(8, 0), Error);
}

}  // namespace
}  // namespace fp4moe::engine
