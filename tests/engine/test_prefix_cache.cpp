// engine::PrefixCache on scripted states (tests/engine/scripted_model.h): hits are whole pages of a
// verified prefix, capped by the caller; entries without a whole page, or covered by another, are not
// kept; an entry extending another replaces it; eviction is least recently used first, spares the
// hit being copied, and gives every block back. The engine's use of it: test_scheduler.cpp
// (PrefixCache*) and test_engine_models.cpp.
#include <gtest/gtest.h>

#include <numeric>
#include <random>

#include "engine/prefix_cache.h"
#include "engine/scripted_model.h"

namespace fp4moe::engine {
namespace {

using testing::ScriptedState;

std::vector<TokenId> iota_tokens(int64_t n, TokenId first = 0) {
  std::vector<TokenId> t(static_cast<size_t>(n));
  std::iota(t.begin(), t.end(), first);
  return t;
}

// A state that has forwarded `tokens` and the allocator blocks a request holding it would be charged
// (one more token reserved, as the engine does).
struct Held {
  std::unique_ptr<model::KvState> kv;
  std::vector<int32_t> blocks;
};
Held held(KvBlockAllocator& a, const std::vector<TokenId>& tokens) {
  auto s = std::make_unique<ScriptedState>();
  s->tokens = tokens;
  Held h{std::move(s), {}};
  EXPECT_TRUE(a.reserve(h.blocks, static_cast<int64_t>(tokens.size()) + 1));
  return h;
}

bool insert(PrefixCache& c, KvBlockAllocator& a, const std::vector<TokenId>& tokens) {
  Held h = held(a, tokens);
  const bool kept = c.insert(tokens, std::move(h.kv), h.blocks, a);
  if (!kept) a.release(h.blocks);
  EXPECT_TRUE(h.blocks.empty());
  return kept;
}

const std::vector<int32_t>& tokens_of(const model::KvState* kv) {
  return dynamic_cast<const ScriptedState&>(*kv).tokens;
}

TEST(PrefixCache, HitsAreWholeVerifiedPagesWithinTheCap) {
  KvBlockAllocator a(1024, 16);
  PrefixCache c(16);
  const auto t = iota_tokens(50);
  ASSERT_TRUE(insert(c, a, t));
  EXPECT_EQ(c.n_entries(), 1);
  EXPECT_EQ(c.cached_tokens(), 48) << "3 whole pages of 50 tokens";
  EXPECT_EQ(c.n_blocks(), 3) << "the 4th block (tokens 48-50) went back at once";
  EXPECT_EQ(a.n_used(), 3);

  PrefixCache::Hit h = c.lookup(t, 49);
  EXPECT_EQ(h.tokens, 48);
  ASSERT_NE(h.kv, nullptr);
  EXPECT_EQ(tokens_of(h.kv), iota_tokens(48)) << "the entry's state was truncated to its pages";
  EXPECT_EQ(c.lookup(t, 47).tokens, 32) << "the cap rounds down to pages";
  EXPECT_EQ(c.lookup(iota_tokens(40), 100).tokens, 32) << "a shorter request: its own whole pages";
  auto other = t;
  other[20] = 999;  // second page differs
  EXPECT_EQ(c.lookup(other, 100).tokens, 16);
  other[3] = 999;
  EXPECT_EQ(c.lookup(other, 100).tokens, 0);
  EXPECT_EQ(c.lookup(iota_tokens(15), 100).tokens, 0) << "less than a page";
}

TEST(PrefixCache, KeepsOnlyWhatAddsAPage) {
  KvBlockAllocator a(1024, 16);
  PrefixCache c(16);
  EXPECT_FALSE(insert(c, a, iota_tokens(15))) << "no whole page";
  ASSERT_TRUE(insert(c, a, iota_tokens(40)));
  EXPECT_FALSE(insert(c, a, iota_tokens(33))) << "its 2 pages are in the 40-token entry";
  EXPECT_FALSE(insert(c, a, iota_tokens(47))) << "still 2 whole pages";
  EXPECT_EQ(c.n_entries(), 1);
  ASSERT_TRUE(insert(c, a, iota_tokens(64))) << "extends it by 2 pages: replaces it";
  EXPECT_EQ(c.n_entries(), 1);
  EXPECT_EQ(c.cached_tokens(), 64);
  EXPECT_EQ(a.n_used(), 4) << "the replaced entry's blocks went back";
  auto branch = iota_tokens(64);
  branch[40] = 7;  // shares 2 pages, then differs: a second entry
  ASSERT_TRUE(insert(c, a, branch));
  EXPECT_EQ(c.n_entries(), 2);
  EXPECT_EQ(c.lookup(branch, 100).tokens, 64);
  EXPECT_EQ(tokens_of(c.lookup(branch, 100).kv)[40], 7);
  EXPECT_EQ(tokens_of(c.lookup(iota_tokens(64), 100).kv)[40], 40);
  c.clear(a);
  EXPECT_EQ(c.n_entries(), 0);
  EXPECT_EQ(c.n_blocks(), 0);
  EXPECT_EQ(a.n_used(), 0);
}

TEST(PrefixCache, EvictsLeastRecentlyUsedSparingTheHit) {
  KvBlockAllocator a(1024, 8);
  PrefixCache c(8);
  const auto x = iota_tokens(16, 0), y = iota_tokens(16, 100), z = iota_tokens(16, 200);
  ASSERT_TRUE(insert(c, a, x));
  ASSERT_TRUE(insert(c, a, y));
  ASSERT_TRUE(insert(c, a, z));
  EXPECT_EQ(a.n_used(), 6);
  EXPECT_EQ(c.lookup(x, 100).tokens, 16);            // x is now the most recent: y is the oldest
  const model::KvState* keep = c.lookup(y, 100).kv;  // y the most recent, z the oldest
  ASSERT_TRUE(c.evict_one(a, keep));
  EXPECT_EQ(c.lookup(z, 100).tokens, 0) << "z was the least recently used";
  const model::KvState* x_kv = c.lookup(x, 100).kv;  // order now x, y
  ASSERT_TRUE(c.evict_one(a, x_kv)) << "y goes although x is older: x is the hit being copied";
  EXPECT_EQ(c.lookup(y, 100).tokens, 0);
  EXPECT_EQ(c.lookup(x, 100).tokens, 16);
  EXPECT_FALSE(c.evict_one(a, c.lookup(x, 100).kv)) << "only the kept entry is left";
  EXPECT_TRUE(c.evict_one(a));
  EXPECT_EQ(a.n_used(), 0);
  EXPECT_FALSE(c.evict_one(a));
}

// Random prompts over a small alphabet (many shared prefixes): every hit equals the longest whole-page
// prefix some kept entry shares with the request, found by brute force.
TEST(PrefixCache, RandomHitsAreTheLongestSharedPrefix) {
  std::mt19937_64 rng(20261205);
  KvBlockAllocator a(1 << 20, 4);
  PrefixCache c(4);
  std::vector<std::vector<TokenId>> kept;
  for (int i = 0; i < 300; ++i) {
    std::vector<TokenId> t(1 + rng() % 40);
    for (auto& v : t) v = static_cast<TokenId>(rng() % 3);
    int64_t best = 0;
    for (const auto& k : kept) {
      int64_t n = 0;
      while (n < static_cast<int64_t>(std::min(k.size(), t.size())) && k[n] == t[n]) ++n;
      best = std::max(best, std::min<int64_t>(n, static_cast<int64_t>(k.size())) / 4 * 4);
    }
    const int64_t cap = static_cast<int64_t>(t.size()) - 1;
    PrefixCache::Hit h = c.lookup(t, cap);
    ASSERT_EQ(h.tokens, std::min(best, cap / 4 * 4)) << "request " << i;
    if (h.tokens > 0) {
      const auto& got = tokens_of(h.kv);
      ASSERT_TRUE(std::equal(t.begin(), t.begin() + h.tokens, got.begin()));
    }
    if (insert(c, a, t)) kept.push_back(std::vector<TokenId>(t.begin(), t.begin() + t.size() / 4 * 4));
    // Entries an insert replaced hold nothing the new one does not, so `kept` may keep them.
  }
  EXPECT_EQ(a.n_used(), c.n_blocks());
}

}  // namespace
}  // namespace fp4moe::engine
