// engine::KvBlockAllocator (see kv_blocks.h). Tested by tests/engine/test_kv_blocks.cpp.
#include "engine/kv_blocks.h"

#include "core/error.h"

namespace fp4moe::engine {

KvBlockAllocator::KvBlockAllocator(int64_t max_total_tokens, int64_t page_size)
    : page_size_(page_size), n_blocks_(page_size > 0 ? max_total_tokens / page_size : 0) {
  FP4MOE_CHECK(page_size >= 1) << "page_size " << page_size << " must be >= 1";
  FP4MOE_CHECK(n_blocks_ >= 1) << "max_total_tokens " << max_total_tokens << " holds no block of page_size "
                               << page_size << " tokens";
  FP4MOE_CHECK(n_blocks_ < (int64_t{1} << 31)) << "max_total_tokens " << max_total_tokens << " / page_size "
                                               << page_size << " = " << n_blocks_ << " blocks is too many";
  for (int64_t i = 0; i < n_blocks_; ++i) free_.insert(free_.end(), static_cast<int32_t>(i));
}

bool KvBlockAllocator::reserve(std::vector<int32_t>& table, int64_t n_tokens) {
  const int64_t need = blocks_for(n_tokens) - static_cast<int64_t>(table.size());
  if (need <= 0) return true;
  if (need > n_free()) return false;
  for (int64_t i = 0; i < need; ++i) {
    table.push_back(*free_.begin());
    free_.erase(free_.begin());
  }
  return true;
}

void KvBlockAllocator::release(std::vector<int32_t>& table) {
  for (int32_t b : table) {
    FP4MOE_CHECK(b >= 0 && b < n_blocks_ && !free_.count(b))
        << "KV block " << b << " released twice or outside [0, " << n_blocks_ << ")";
    free_.insert(b);
  }
  table.clear();
}

std::string KvBlockAllocator::describe() const {
  return "used " + std::to_string(n_used()) + " / " + std::to_string(n_blocks_) + " blocks of " +
         std::to_string(page_size_) + " tokens";
}

}  // namespace fp4moe::engine
