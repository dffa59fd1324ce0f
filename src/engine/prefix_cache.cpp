// engine::PrefixCache (see prefix_cache.h). Tested by tests/engine/test_prefix_cache.cpp.
#include "engine/prefix_cache.h"

#include <algorithm>

#include "core/error.h"

namespace fp4moe::engine {

namespace {

// Page k's chained hash: a mix of page k - 1's and page k's tokens.
uint64_t page_hash(uint64_t prev, std::span<const TokenId> page) {
  uint64_t h = 1469598103934665603ULL ^ prev;
  for (TokenId t : page) h = (h ^ static_cast<uint32_t>(t)) * 1099511628211ULL;
  h ^= h >> 29;
  h *= 0xbf58476d1ce4e5b9ULL;
  return h ^ (h >> 32);
}

}  // namespace

PrefixCache::PrefixCache(int64_t page_size) : page_size_(page_size) {
  FP4MOE_CHECK(page_size >= 1) << "prefix cache page size " << page_size << " must be >= 1";
}

PrefixCache::~PrefixCache() = default;

int64_t PrefixCache::longest(std::span<const TokenId> tokens, int64_t n_pages, Lru::iterator* found) {
  // Walk the pages while some entry holds the prefix so far (an entry holding k + 1 pages holds the
  // first k too), remembering each depth's hash; then verify from the deepest depth down.
  std::vector<uint64_t> hashes;
  uint64_t h = 0;
  for (int64_t k = 0; k < n_pages; ++k) {
    h = page_hash(h, tokens.subspan(static_cast<size_t>(k * page_size_), static_cast<size_t>(page_size_)));
    if (index_.find(h) == index_.end()) break;
    hashes.push_back(h);
  }
  for (int64_t k = static_cast<int64_t>(hashes.size()); k >= 1; --k) {
    const size_t n = static_cast<size_t>(k * page_size_);
    auto [b, e] = index_.equal_range(hashes[static_cast<size_t>(k - 1)]);
    for (auto it = b; it != e; ++it) {
      const Entry& entry = *it->second;
      if (entry.tokens.size() >= n &&
          std::equal(tokens.begin(), tokens.begin() + static_cast<std::ptrdiff_t>(n), entry.tokens.begin())) {
        *found = it->second;
        return k;
      }
    }
  }
  return 0;
}

PrefixCache::Hit PrefixCache::lookup(std::span<const TokenId> tokens, int64_t max_tokens) {
  const int64_t n_pages = std::min<int64_t>(static_cast<int64_t>(tokens.size()), max_tokens) / page_size_;
  if (n_pages <= 0 || lru_.empty()) return {};
  Lru::iterator it;
  const int64_t pages = longest(tokens, n_pages, &it);
  if (pages == 0) return {};
  lru_.splice(lru_.begin(), lru_, it);  // most recently used (iterators stay valid)
  return {it->kv.get(), pages * page_size_};
}

bool PrefixCache::covers(std::span<const TokenId> tokens) {
  const int64_t n_pages = static_cast<int64_t>(tokens.size()) / page_size_;
  Lru::iterator it;
  return longest(tokens, n_pages, &it) == n_pages;
}

bool PrefixCache::insert(std::span<const TokenId> tokens, std::unique_ptr<model::KvState> kv,
                         std::vector<int32_t>& blocks, KvBlockAllocator& allocator) {
  FP4MOE_CHECK(kv != nullptr) << "prefix cache: insert without a KV state";
  FP4MOE_CHECK(allocator.page_size() == page_size_)
      << "prefix cache of " << page_size_ << "-token pages used with an allocator of " << allocator.page_size();
  const int64_t n_pages = std::min<int64_t>(kv->length(), static_cast<int64_t>(tokens.size())) / page_size_;
  Lru::iterator covering;
  if (n_pages == 0 || longest(tokens, n_pages, &covering) == n_pages) {
    if (n_pages > 0) lru_.splice(lru_.begin(), lru_, covering);
    return false;
  }
  const int64_t n = n_pages * page_size_;
  Entry entry;
  entry.tokens.assign(tokens.begin(), tokens.begin() + static_cast<std::ptrdiff_t>(n));
  kv->truncate(n);  // a GPU state gives its partial page back to the pool now
  entry.kv = std::move(kv);
  if (static_cast<int64_t>(blocks.size()) > n_pages) {
    std::vector<int32_t> tail(blocks.begin() + static_cast<std::ptrdiff_t>(n_pages), blocks.end());
    allocator.release(tail);
    blocks.resize(static_cast<size_t>(n_pages));
  }
  entry.blocks = std::move(blocks);
  blocks.clear();
  uint64_t h = 0;
  for (int64_t k = 0; k < n_pages; ++k) {
    h = page_hash(h, std::span<const TokenId>(entry.tokens)
                         .subspan(static_cast<size_t>(k * page_size_), static_cast<size_t>(page_size_)));
    entry.page_hashes.push_back(h);
  }
  // Entries the new one extends hold nothing it does not: drop them.
  std::vector<Lru::iterator> covered;
  for (int64_t k = 0; k < n_pages; ++k) {
    auto [b, e] = index_.equal_range(entry.page_hashes[static_cast<size_t>(k)]);
    for (auto it = b; it != e; ++it) {
      const Entry& old = *it->second;
      if (static_cast<int64_t>(old.page_hashes.size()) == k + 1 &&
          std::equal(old.tokens.begin(), old.tokens.end(), entry.tokens.begin())) {
        covered.push_back(it->second);
      }
    }
  }
  for (Lru::iterator it : covered) erase(it, allocator);

  n_blocks_ += static_cast<int64_t>(entry.blocks.size());
  n_tokens_ += n;
  lru_.push_front(std::move(entry));
  for (uint64_t ph : lru_.front().page_hashes) index_.emplace(ph, lru_.begin());
  return true;
}

void PrefixCache::erase(Lru::iterator it, KvBlockAllocator& allocator) {
  for (uint64_t ph : it->page_hashes) {
    auto [b, e] = index_.equal_range(ph);
    for (auto j = b; j != e; ++j) {
      if (j->second == it) {
        index_.erase(j);
        break;
      }
    }
  }
  n_blocks_ -= static_cast<int64_t>(it->blocks.size());
  n_tokens_ -= static_cast<int64_t>(it->tokens.size());
  allocator.release(it->blocks);
  lru_.erase(it);
}

bool PrefixCache::evict_one(KvBlockAllocator& allocator, const model::KvState* keep) {
  for (auto it = lru_.rbegin(); it != lru_.rend(); ++it) {
    if (it->kv.get() == keep) continue;
    erase(std::prev(it.base()), allocator);
    return true;
  }
  return false;
}

void PrefixCache::clear(KvBlockAllocator& allocator) {
  while (evict_one(allocator)) {
  }
}

}  // namespace fp4moe::engine
