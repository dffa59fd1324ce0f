// engine::KvBlockAllocator: the paged KV accounting of the serving engine. Capacity is
// n_blocks = max_total_tokens / page_size blocks of page_size tokens; a request holds a list of
// block ids covering the tokens it has in the KV cache (ceil(tokens / page_size) blocks) and
// grows it block by block. The CPU model stores each sequence's KV contiguously
// (model/kv_cache.h), so the block ids are not addresses there: the allocator bounds memory and
// decides admission and preemption; a GPU paged cache will index its pages with the same ids.
// Free blocks are handed out lowest id first (deterministic). Not thread-safe (the inference
// thread owns it). Tested by tests/engine/test_kv_blocks.cpp.
#pragma once

#include <cstdint>
#include <set>
#include <string>
#include <vector>

namespace fp4moe::engine {

class KvBlockAllocator {
 public:
  KvBlockAllocator(int64_t max_total_tokens, int64_t page_size);

  int64_t page_size() const { return page_size_; }
  int64_t n_blocks() const { return n_blocks_; }
  int64_t n_free() const { return static_cast<int64_t>(free_.size()); }
  int64_t n_used() const { return n_blocks_ - n_free(); }
  int64_t capacity_tokens() const { return n_blocks_ * page_size_; }
  int64_t blocks_for(int64_t n_tokens) const { return (n_tokens + page_size_ - 1) / page_size_; }

  // Grows `table` to cover n_tokens; false (table unchanged) when not enough blocks are free.
  bool reserve(std::vector<int32_t>& table, int64_t n_tokens);
  // Returns every block of `table` and clears it.
  void release(std::vector<int32_t>& table);

  std::string describe() const;  // "used U / N blocks of P tokens"

 private:
  int64_t page_size_;
  int64_t n_blocks_;
  std::set<int32_t> free_;
};

}  // namespace fp4moe::engine
