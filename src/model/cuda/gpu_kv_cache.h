// The GPU model's paged KV cache: one pool of blocks per model (page_size tokens each), one K and V
// buffer per layer ([n_blocks, page_size, n_kv_heads, head_dim] bf16, kernels/cuda/ops/paged_attention.h),
// and per sequence a GpuKvState holding its block list. Blocks are taken when a step's tokens need
// them (take_for) and given back by truncate() and the state's destructor; the pool outlives its
// states (they share it). A block may be held by several states: copy_prefix() (the engine's prefix
// cache) shares a state's whole pages with a new state instead of copying them; the pool counts the
// holders, a block is free again when the last one gives it back, and a shared block is never
// written (a state only writes past its length, and a copy's length is a page boundary; reserve()
// checks it). A step that cannot get blocks fails naming the numbers, before anything
// is written, and leaves every state as it was.
// Tested by tests/model/test_gpu_kv_cache.cpp (the block accounting; no GPU needed for the pool
// logic, which is kept separate from the device buffers) and through tests/model/test_gpu_model.cpp.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "model/causal_lm.h"

namespace fp4moe::model {

// The KV pool sized from the GPU's memory, as SGLang's --mem-fraction-static sizes it (profile_max_num_token):
// `fraction` of the memory free when the model began to load (after the CUDA context; other processes' memory is
// not counted) may hold the weights, the step buffers and the KV cache together; measured once the weights and
// buffers are on the device, the cache gets free_after - free_before x (1 - fraction), less cudaMalloc's 2 MiB
// granularity for each of its n_allocations buffers, in whole pages, at most max_tokens (--max-total-tokens when
// given) and below 2^31 tokens (the kernels' int32 slots). Host arithmetic only (the models pass cudaMemGetInfo's
// numbers).
struct KvMemoryBudget {
  uint64_t free_after = 0;      // device memory free after the weights and buffers
  uint64_t free_before = 0;     // device memory free when the load began
  uint64_t total_bytes = 0;     // the device's memory (the messages)
  double fraction = 0.0;        // (0, 1]
  int64_t bytes_per_token = 0;  // KV bytes of one token over all layers
  int64_t page_size = 0;
  int64_t max_tokens = 0;     // cap (> 0)
  int64_t n_allocations = 1;  // the cache's buffers (one cudaMalloc each)
};
constexpr uint64_t kCudaMallocGranularity = uint64_t{2} << 20;
// The pool's tokens (a multiple of page_size, >= one page). Fails naming the fraction, the memory free before the
// load, what the load took and the fraction that would give one page, when the budget holds less than a page.
int64_t kv_tokens_for_memory(const KvMemoryBudget& b);
// "12.3 GiB" (MiB below 1 GiB): the memory numbers of the load log and the errors.
std::string format_gib(double bytes);

// Free-list accounting of n_blocks blocks (host only).
class KvBlockPool {
 public:
  KvBlockPool(int64_t n_blocks, int64_t page_size);
  int64_t n_blocks() const { return n_blocks_; }
  int64_t page_size() const { return page_size_; }
  int64_t n_free() const;
  // n blocks, or throws naming `n`, the free count and the pool size (nothing taken then).
  std::vector<int32_t> take(int64_t n);
  void give(const std::vector<int32_t>& blocks);   // one holder less each; fails on a free / foreign id
  void share(const std::vector<int32_t>& blocks);  // one holder more each (blocks in use)
  int32_t holders(int32_t block) const;            // 0 = free

 private:
  const int64_t n_blocks_, page_size_;
  mutable std::mutex mu_;
  std::vector<int32_t> free_;       // LIFO
  std::vector<int32_t> holders_;    // [n_blocks]
};

// One sequence's cache: its blocks in position order (block i holds positions i*page .. i*page+page-1).
class GpuKvState : public KvState {
 public:
  GpuKvState(const void* owner, std::shared_ptr<KvBlockPool> pool, int64_t bytes_per_token)
      : owner_(owner), pool_(std::move(pool)), bytes_per_token_(bytes_per_token) {}
  ~GpuKvState() override;
  GpuKvState(const GpuKvState&) = delete;
  GpuKvState& operator=(const GpuKvState&) = delete;

  int64_t length() const override { return length_; }
  void truncate(int64_t n_tokens) override;  // frees the blocks past n_tokens
  // Shares the whole pages of the first n_tokens (rounded down to a page) with a new state.
  std::unique_ptr<KvState> copy_prefix(int64_t n_tokens) const override;
  size_t bytes() const override {
    return static_cast<size_t>(blocks_.size()) * static_cast<size_t>(pool_->page_size() * bytes_per_token_);
  }

  const void* owner() const { return owner_; }
  const std::vector<int32_t>& blocks() const { return blocks_; }
  // Makes room for positions length() .. length() + n - 1 (takes blocks; throws when the pool is short,
  // taking nothing, or when the block of position length() is shared). Returns how many blocks were added, for
  // rollback().
  int64_t reserve(int64_t n);
  // Undoes the last reserve (gives its blocks back).
  void rollback(int64_t added_blocks);
  // After a successful step.
  void commit(int64_t n) { length_ += n; }
  // The cache slot (block * page_size + row) of position pos (< blocks * page_size).
  int32_t slot(int64_t pos) const;

 private:
  const void* owner_;
  std::shared_ptr<KvBlockPool> pool_;
  int64_t bytes_per_token_;
  std::vector<int32_t> blocks_;
  int64_t length_ = 0;
};

}  // namespace fp4moe::model
