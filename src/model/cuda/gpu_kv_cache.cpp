// KvBlockPool and GpuKvState (see gpu_kv_cache.h). Tested by tests/model/test_gpu_kv_cache.cpp.
#include "model/cuda/gpu_kv_cache.h"

#include "core/error.h"

namespace fp4moe::model {

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
