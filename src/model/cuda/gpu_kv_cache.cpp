// KvBlockPool and GpuKvState (see gpu_kv_cache.h). Tested by tests/model/test_gpu_kv_cache.cpp.
#include "model/cuda/gpu_kv_cache.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "core/error.h"

namespace fp4moe::model {

std::string format_gib(double bytes) {
  constexpr double kMiB = 1024.0 * 1024.0, kGiB = 1024.0 * kMiB;
  char buf[64];
  if (bytes < kGiB && bytes > -kGiB) {
    std::snprintf(buf, sizeof buf, "%.1f MiB", bytes / kMiB);
  } else {
    std::snprintf(buf, sizeof buf, "%.2f GiB", bytes / kGiB);
  }
  return buf;
}

int64_t kv_tokens_for_memory(const KvMemoryBudget& b) {
  FP4MOE_CHECK(b.fraction > 0.0 && b.fraction <= 1.0) << "--mem-fraction-static " << b.fraction << " must be in (0, 1]";
  FP4MOE_CHECK(b.bytes_per_token >= 1 && b.page_size >= 1 && b.max_tokens >= 1 && b.n_allocations >= 1 &&
               b.free_before >= 1 && b.free_before <= b.total_bytes && b.free_after <= b.total_bytes)
      << "KV memory budget: bytes_per_token=" << b.bytes_per_token << " page_size=" << b.page_size
      << " max_tokens=" << b.max_tokens << " n_allocations=" << b.n_allocations << " free before=" << b.free_before
      << " after=" << b.free_after << " total=" << b.total_bytes;
  const double before = static_cast<double>(b.free_before), after = static_cast<double>(b.free_after);
  const double loaded = before - after;  // the weights and step buffers (and whatever else took memory meanwhile)
  const double granularity = static_cast<double>(b.n_allocations) * static_cast<double>(kCudaMallocGranularity);
  const double budget = after - before * (1.0 - b.fraction) - granularity;
  const double page_bytes = static_cast<double>(b.page_size) * static_cast<double>(b.bytes_per_token);
  if (budget < page_bytes) {
    const double need = std::min(1.0, (loaded + granularity + page_bytes) / before);
    FP4MOE_FAIL() << "--mem-fraction-static " << b.fraction << " leaves " << format_gib(budget)
                  << " for the KV cache, less than one page (" << b.page_size << " tokens x " << b.bytes_per_token
                  << " B): of the " << format_gib(before) << " free when the load began (the GPU has "
                  << format_gib(static_cast<double>(b.total_bytes)) << "), " << b.fraction << " x "
                  << format_gib(before) << " = " << format_gib(before * b.fraction)
                  << " may hold the weights, step buffers and KV cache, and the load took " << format_gib(loaded)
                  << "; raise it to at least " << std::ceil(need * 1000.0) / 1000.0
                  << " or give --max-total-tokens without it";
  }
  const int64_t slot_limit = (int64_t{INT32_MAX} / b.page_size) * b.page_size;  // int32 cache slots
  const double fit = std::floor(budget / page_bytes) * static_cast<double>(b.page_size);
  int64_t tokens = fit >= static_cast<double>(slot_limit) ? slot_limit : static_cast<int64_t>(fit);
  const int64_t cap = std::max<int64_t>((b.max_tokens / b.page_size) * b.page_size, b.page_size);
  tokens = std::min({tokens, cap, slot_limit});
  return tokens;
}

KvBlockPool::KvBlockPool(int64_t n_blocks, int64_t page_size) : n_blocks_(n_blocks), page_size_(page_size) {
  FP4MOE_CHECK(n_blocks >= 1 && n_blocks <= INT32_MAX && page_size >= 1)
      << "KV block pool: n_blocks=" << n_blocks << " page_size=" << page_size << " (need n_blocks in [1, 2^31), page_size >= 1)";
  free_.reserve(static_cast<size_t>(n_blocks));
  for (int64_t b = n_blocks - 1; b >= 0; --b) free_.push_back(static_cast<int32_t>(b));  // block 0 first out
  holders_.assign(static_cast<size_t>(n_blocks), 0);
}

int64_t KvBlockPool::n_free() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int64_t>(free_.size());
}

std::vector<int32_t> KvBlockPool::take(int64_t n) {
  std::lock_guard<std::mutex> lock(mu_);
  FP4MOE_CHECK(n >= 0 && n <= static_cast<int64_t>(free_.size()))
      << "KV cache: a step needs " << n << " more blocks of " << page_size_ << " tokens but only " << free_.size()
      << " of " << n_blocks_ << " are free (raise the KV capacity or lower --max-total-tokens)";
  std::vector<int32_t> out(free_.end() - n, free_.end());
  free_.resize(free_.size() - static_cast<size_t>(n));
  for (int32_t b : out) holders_[static_cast<size_t>(b)] = 1;
  return out;
}

void KvBlockPool::give(const std::vector<int32_t>& blocks) {
  std::lock_guard<std::mutex> lock(mu_);
  for (int32_t b : blocks) {
    FP4MOE_CHECK(b >= 0 && b < n_blocks_ && holders_[static_cast<size_t>(b)] > 0)
        << "KV cache: block " << b << " given back but it is not in use (pool of " << n_blocks_ << ")";
    if (--holders_[static_cast<size_t>(b)] == 0) free_.push_back(b);
  }
}

void KvBlockPool::share(const std::vector<int32_t>& blocks) {
  std::lock_guard<std::mutex> lock(mu_);
  for (int32_t b : blocks) {
    FP4MOE_CHECK(b >= 0 && b < n_blocks_ && holders_[static_cast<size_t>(b)] > 0)
        << "KV cache: block " << b << " shared but it is not in use (pool of " << n_blocks_ << ")";
  }
  for (int32_t b : blocks) ++holders_[static_cast<size_t>(b)];
}

int32_t KvBlockPool::holders(int32_t b) const {
  std::lock_guard<std::mutex> lock(mu_);
  FP4MOE_CHECK(b >= 0 && b < n_blocks_) << "KV cache: block " << b << " outside the pool of " << n_blocks_;
  return holders_[static_cast<size_t>(b)];
}

GpuKvState::~GpuKvState() {
  try {
    pool_->give(blocks_);
  } catch (...) {  // a destructor must not throw; the check above cannot fail for our own blocks
  }
}

void GpuKvState::truncate(int64_t n) {
  FP4MOE_CHECK(n >= 0 && n <= length_) << "truncating a GPU KV state of " << length_ << " tokens to " << n;
  const int64_t page = pool_->page_size();
  const size_t keep = static_cast<size_t>((n + page - 1) / page);
  if (keep < blocks_.size()) {
    pool_->give(std::vector<int32_t>(blocks_.begin() + static_cast<std::ptrdiff_t>(keep), blocks_.end()));
    blocks_.resize(keep);
  }
  length_ = n;
}

std::unique_ptr<KvState> GpuKvState::copy_prefix(int64_t n) const {
  FP4MOE_CHECK(n >= 0 && n <= length_) << "copying the first " << n << " tokens of a GPU KV state of " << length_;
  const int64_t page = pool_->page_size();
  auto out = std::make_unique<GpuKvState>(owner_, pool_, bytes_per_token_);
  out->blocks_.assign(blocks_.begin(), blocks_.begin() + static_cast<std::ptrdiff_t>(n / page));
  pool_->share(out->blocks_);
  out->length_ = n / page * page;
  return out;
}

int64_t GpuKvState::reserve(int64_t n) {
  const int64_t page = pool_->page_size();
  if (n > 0 && length_ % page != 0) {
    const int32_t b = blocks_.at(static_cast<size_t>(length_ / page));
    FP4MOE_CHECK(pool_->holders(b) == 1) << "GPU KV state: position " << length_ << " would be written into block " << b
                                         << ", which " << pool_->holders(b) << " states share";
  }
  const int64_t need = (length_ + n + page - 1) / page - static_cast<int64_t>(blocks_.size());
  if (need <= 0) return 0;
  const std::vector<int32_t> got = pool_->take(need);
  blocks_.insert(blocks_.end(), got.begin(), got.end());
  return need;
}

void GpuKvState::rollback(int64_t added) {
  if (added <= 0) return;
  pool_->give(std::vector<int32_t>(blocks_.end() - added, blocks_.end()));
  blocks_.resize(blocks_.size() - static_cast<size_t>(added));
}

int32_t GpuKvState::slot(int64_t pos) const {
  const int64_t page = pool_->page_size();
  FP4MOE_CHECK(pos >= 0 && pos / page < static_cast<int64_t>(blocks_.size()))
      << "GPU KV state: position " << pos << " has no block (" << blocks_.size() << " blocks of " << page << ")";
  return static_cast<int32_t>(blocks_[static_cast<size_t>(pos / page)] * page + pos % page);
}

}  // namespace fp4moe::model
