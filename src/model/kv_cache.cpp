// ContiguousKvState (see kv_cache.h). Tested by tests/model/test_kv_cache.cpp.
#include "model/kv_cache.h"

#include "core/error.h"

namespace fp4moe::model {

ContiguousKvState::ContiguousKvState(const void* owner, int64_t n_layers, std::vector<int64_t> stream_widths)
    : owner_(owner), n_layers_(n_layers), widths_(std::move(stream_widths)) {
  FP4MOE_CHECK(n_layers_ > 0 && !widths_.empty()) << "KV state with " << n_layers_ << " layers and "
                                                   << widths_.size() << " streams";
  for (int64_t w : widths_) FP4MOE_CHECK(w > 0) << "KV stream width " << w << " must be positive";
  bufs_.resize(static_cast<size_t>(n_layers_) * widths_.size());
}

std::vector<float>& ContiguousKvState::buf(int64_t layer, int stream) {
  FP4MOE_CHECK(layer >= 0 && layer < n_layers_ && stream >= 0 && stream < n_streams())
      << "KV cache (layer " << layer << ", stream " << stream << ") outside " << n_layers_ << " layers x "
      << n_streams() << " streams";
  return bufs_[static_cast<size_t>(layer) * widths_.size() + static_cast<size_t>(stream)];
}

const std::vector<float>& ContiguousKvState::buf(int64_t layer, int stream) const {
  return const_cast<ContiguousKvState*>(this)->buf(layer, stream);
}

void ContiguousKvState::truncate(int64_t n_tokens) {
  FP4MOE_CHECK(n_tokens >= 0 && n_tokens <= length_) << "truncate to " << n_tokens << " tokens of a KV cache holding "
                                                     << length_;
  length_ = n_tokens;
  rollback();
}

size_t ContiguousKvState::bytes() const {
  size_t total = 0;
  for (const auto& b : bufs_) total += b.capacity() * sizeof(float);
  return total;
}

std::unique_ptr<KvState> ContiguousKvState::copy_prefix(int64_t n_tokens) const {
  FP4MOE_CHECK(n_tokens >= 0 && n_tokens <= length_)
      << "copying the first " << n_tokens << " tokens of a KV cache holding " << length_;
  auto out = std::make_unique<ContiguousKvState>(owner_, n_layers_, widths_);
  for (size_t i = 0; i < bufs_.size(); ++i) {
    const auto n = static_cast<std::ptrdiff_t>(n_tokens * widths_[i % widths_.size()]);
    out->bufs_[i].assign(bufs_[i].begin(), bufs_[i].begin() + n);
  }
  out->length_ = n_tokens;
  return out;
}

float* ContiguousKvState::append(int64_t layer, int stream, int64_t n) {
  std::vector<float>& b = buf(layer, stream);
  const size_t old = b.size();
  b.resize(old + static_cast<size_t>(n * widths_[static_cast<size_t>(stream)]));
  return b.data() + old;
}

const float* ContiguousKvState::rows(int64_t layer, int stream) const { return buf(layer, stream).data(); }

int64_t ContiguousKvState::rows_in(int64_t layer, int stream) const {
  return static_cast<int64_t>(buf(layer, stream).size()) / widths_[static_cast<size_t>(stream)];
}

void ContiguousKvState::commit(int64_t n) {
  for (int64_t l = 0; l < n_layers_; ++l) {
    for (int s = 0; s < n_streams(); ++s) {
      FP4MOE_CHECK(rows_in(l, s) == length_ + n) << "KV commit of " << n << " tokens after " << length_
                                                 << ": layer " << l << " stream " << s << " holds " << rows_in(l, s)
                                                 << " rows";
    }
  }
  length_ += n;
}

void ContiguousKvState::rollback() {
  for (size_t i = 0; i < bufs_.size(); ++i) {
    const size_t keep = static_cast<size_t>(length_ * widths_[i % widths_.size()]);
    if (bufs_[i].size() > keep) bufs_[i].resize(keep);
  }
}

}  // namespace fp4moe::model
