// engine::PrefixCache: the KV states of finished requests, kept so that a later request whose tokens
// start with the same prefix skips prefilling it (SGLang's radix cache, vLLM's automatic prefix
// caching). The engine owns one (EngineOptions::enable_prefix_cache, for models whose states
// implement KvState::copy_prefix).
//
// Granularity is the KV page: an entry is found by the chained hashes of its whole pages of tokens
// (page k's hash covers tokens [0, (k + 1) page)), so a lookup walks the request's pages once and a
// hit is always a whole number of pages, verified token by token (a hash collision costs a shorter
// hit, never a wrong one). A hit is copied out (KvState::copy_prefix: the CPU models copy the rows,
// the GPU models share the full pages, which are never written again), so entries are never
// modified and may be evicted at any time.
//
// Entries hold their KV blocks in the engine's KvBlockAllocator, charged like a running request's
// (a hit's request is charged its full length too: the accounting never promises memory a GPU
// pool might not have); they use blocks nothing else wants: the engine evicts the least recently
// used entry before it makes a request wait or preempts one. Not thread-safe (the inference thread
// owns it). Tested by tests/engine/test_prefix_cache.cpp and, through the engine,
// tests/engine/test_scheduler.cpp (PrefixCache*) and test_engine_models.cpp.
#pragma once

#include <cstdint>
#include <list>
#include <memory>
#include <span>
#include <unordered_map>
#include <vector>

#include "engine/kv_blocks.h"
#include "engine/sampler.h"
#include "model/causal_lm.h"

namespace fp4moe::engine {

class PrefixCache {
 public:
  explicit PrefixCache(int64_t page_size);
  ~PrefixCache();
  PrefixCache(const PrefixCache&) = delete;
  PrefixCache& operator=(const PrefixCache&) = delete;

  struct Hit {
    const model::KvState* kv = nullptr;  // the entry's state (valid until the next insert / evict)
    int64_t tokens = 0;                  // cached tokens, a multiple of the page size; 0 = miss
  };
  // The longest cached prefix of `tokens`, in whole pages, of at most max_tokens tokens; the entry
  // it comes from becomes the most recently used.
  Hit lookup(std::span<const TokenId> tokens, int64_t max_tokens);

  // Whether an entry holds all the whole pages of `tokens` (no use counted).
  bool covers(std::span<const TokenId> tokens);

  // Keeps `kv` (holding the KV of tokens[0 .. kv->length())) and takes the allocator blocks it is
  // charged (`blocks` is left empty; those past its whole pages are released at once). Returns false
  // and takes nothing (the caller releases the blocks; kv is dropped) when it holds no whole page or
  // an entry already covers all its whole pages.
  bool insert(std::span<const TokenId> tokens, std::unique_ptr<model::KvState> kv, std::vector<int32_t>& blocks,
              KvBlockAllocator& allocator);

  // Evicts the least recently used entry other than the one holding `keep` (a hit about to be copied),
  // releasing its blocks; false when there is none.
  bool evict_one(KvBlockAllocator& allocator, const model::KvState* keep = nullptr);
  void clear(KvBlockAllocator& allocator);

  int64_t n_entries() const { return static_cast<int64_t>(lru_.size()); }
  int64_t n_blocks() const { return n_blocks_; }       // allocator blocks its entries hold
  int64_t cached_tokens() const { return n_tokens_; }  // tokens its entries hold (whole pages)

 private:
  struct Entry {
    std::vector<TokenId> tokens;         // whole pages only
    std::unique_ptr<model::KvState> kv;  // holds at least tokens.size() tokens
    std::vector<int32_t> blocks;         // allocator blocks charged for it
    std::vector<uint64_t> page_hashes;   // chained, one per page
  };
  using Lru = std::list<Entry>;  // front = most recently used

  // The deepest verified entry holding whole pages of `tokens` (at most n_pages): its pages, 0 = none.
  int64_t longest(std::span<const TokenId> tokens, int64_t n_pages, Lru::iterator* found);
  void erase(Lru::iterator it, KvBlockAllocator& allocator);

  int64_t page_size_;
  Lru lru_;
  // Chained page hash -> the entries holding that page prefix.
  std::unordered_multimap<uint64_t, Lru::iterator> index_;
  int64_t n_blocks_ = 0;
  int64_t n_tokens_ = 0;
};

}  // namespace fp4moe::engine
