// The sharding math: contiguous even splits with errors that name the flag and the numbers.
// See sharding.h. Tested by tests/dist/test_sharding.cpp.
#include "dist/sharding.h"

#include <algorithm>
#include <sstream>

#include "core/error.h"

namespace fp4moe::dist {

namespace {

constexpr int64_t kNvfp4Block = 16;  // NVFP4 block scale granularity along K

}  // namespace

void ParallelConfig::validate() const {
  FP4MOE_CHECK(tp_size >= 1) << "--tp-size " << tp_size << " must be >= 1";
  FP4MOE_CHECK(ep_size >= 1) << "--ep-size " << ep_size << " must be >= 1";
  FP4MOE_CHECK(world_size == tp_size)
      << "world size " << world_size << " != --tp-size " << tp_size
      << ": one process per GPU, and the tensor-parallel group is the whole world";
  FP4MOE_CHECK(tp_size % ep_size == 0)
      << "--ep-size " << ep_size << " does not divide --tp-size " << tp_size
      << " (the experts are spread over ep ranks, each expert split over tp/ep ranks)";
  FP4MOE_CHECK(rank >= 0 && rank < world_size) << "rank " << rank << " outside [0, " << world_size << ")";
}

std::string ParallelConfig::to_string() const {
  std::ostringstream os;
  os << "rank " << rank << "/" << world_size << " (tp " << tp_size << ", ep " << ep_size << " x moe-tp "
     << moe_tp_size() << ")";
  return os.str();
}

ParallelConfig ParallelConfig::make(int tp_size, int ep_size, int rank) {
  ParallelConfig p;
  p.world_size = tp_size;
  p.tp_size = tp_size;
  p.ep_size = ep_size;
  p.rank = rank;
  p.validate();
  return p;
}

Range even_split(int64_t n, int parts, int part, const std::string& flag, const std::string& what) {
  FP4MOE_CHECK(parts >= 1) << flag << " " << parts << " must be >= 1";
  FP4MOE_CHECK(n >= 0) << what << ": count " << n << " must be >= 0";
  FP4MOE_CHECK(part >= 0 && part < parts) << flag << " " << parts << ": part " << part << " outside [0, " << parts << ")";
  FP4MOE_CHECK(n % parts == 0) << flag << " " << parts << " does not divide " << n << " " << what;
  const int64_t size = n / parts;
  return {part * size, (part + 1) * size};
}

Range token_range(int64_t n_tokens, int world_size, int rank) {
  FP4MOE_CHECK(n_tokens >= 0 && world_size >= 1 && rank >= 0 && rank < world_size)
      << "token_range: n_tokens " << n_tokens << ", world size " << world_size << ", rank " << rank;
  const int64_t base = n_tokens / world_size;
  const int64_t extra = n_tokens % world_size;
  const int64_t begin = rank * base + std::min<int64_t>(rank, extra);
  return {begin, begin + base + (rank < extra ? 1 : 0)};
}

Range expert_range(int n_experts, int ep_size, int ep_rank) {
  FP4MOE_CHECK(n_experts >= 1) << "n_experts " << n_experts << " must be >= 1";
  return even_split(n_experts, ep_size, ep_rank, "--ep-size", "experts");
}

int expert_owner(int n_experts, int ep_size, int expert) {
  FP4MOE_CHECK(ep_size >= 1 && n_experts % ep_size == 0)
      << "--ep-size " << ep_size << " does not divide " << n_experts << " experts";
  FP4MOE_CHECK(expert >= 0 && expert < n_experts) << "expert " << expert << " outside [0, " << n_experts << ")";
  return expert / (n_experts / ep_size);
}

Range moe_intermediate_range(int64_t moe_intermediate, int moe_tp_size, int moe_tp_rank, bool nvfp4) {
  const Range r = even_split(moe_intermediate, moe_tp_size, moe_tp_rank, "moe-tp (--tp-size / --ep-size)",
                             "moe intermediate size");
  FP4MOE_CHECK(!nvfp4 || moe_tp_size == 1 || r.size() % kNvfp4Block == 0)
      << "moe intermediate " << moe_intermediate << " / moe-tp " << moe_tp_size << " = " << r.size()
      << " is not a multiple of the NVFP4 block (16 columns of down_proj)";
  return r;
}

Range column_parallel_rows(int64_t out_features, int tp_size, int rank) {
  return even_split(out_features, tp_size, rank, "--tp-size", "output features");
}

Range row_parallel_cols(int64_t in_features, int tp_size, int rank, bool nvfp4) {
  const Range r = even_split(in_features, tp_size, rank, "--tp-size", "input features");
  FP4MOE_CHECK(!nvfp4 || tp_size == 1 || r.size() % kNvfp4Block == 0)
      << "--tp-size " << tp_size << ": input features " << in_features << " / " << tp_size << " = " << r.size()
      << " is not a multiple of the NVFP4 block (16)";
  return r;
}

std::string HeadShard::to_string() const {
  std::ostringstream os;
  os << "q [" << q_heads.begin << ", " << q_heads.end << ") kv [" << kv_heads.begin << ", " << kv_heads.end << ") x"
     << kv_replicas;
  return os.str();
}

HeadShard attention_heads(int n_q_heads, int n_kv_heads, int tp_size, int rank) {
  FP4MOE_CHECK(n_q_heads >= 1 && n_kv_heads >= 1 && n_q_heads % n_kv_heads == 0)
      << n_q_heads << " attention heads and " << n_kv_heads << " KV heads: the KV heads must divide the heads";
  HeadShard h;
  h.q_heads = even_split(n_q_heads, tp_size, rank, "--tp-size", "attention heads");
  if (n_kv_heads >= tp_size) {
    FP4MOE_CHECK(n_kv_heads % tp_size == 0) << "--tp-size " << tp_size << " does not divide " << n_kv_heads
                                            << " KV heads (and is not a multiple of them, for replication)";
    h.kv_heads = even_split(n_kv_heads, tp_size, rank, "--tp-size", "KV heads");
    h.kv_replicas = 1;
  } else {
    FP4MOE_CHECK(tp_size % n_kv_heads == 0)
        << "--tp-size " << tp_size << " with " << n_kv_heads << " KV heads: " << n_kv_heads
        << " does not divide " << tp_size << ", so the KV heads cannot be replicated evenly";
    h.kv_replicas = tp_size / n_kv_heads;
    const int kv = rank / h.kv_replicas;
    h.kv_heads = {kv, kv + 1};
  }
  return h;
}

void validate_for_model(const ParallelConfig& p, const ModelDims& m) {
  p.validate();
  if (m.n_experts > 0) {
    FP4MOE_CHECK(m.n_experts % p.ep_size == 0)
        << "--ep-size " << p.ep_size << " does not divide " << m.n_experts << " experts";
    moe_intermediate_range(m.moe_intermediate, p.moe_tp_size(), p.moe_tp_rank(), m.nvfp4);
  } else {
    FP4MOE_CHECK(p.ep_size == 1) << "--ep-size " << p.ep_size << " on a model without routed experts";
  }
  if (m.n_q_heads > 0) attention_heads(m.n_q_heads, m.n_kv_heads, p.tp_size, p.rank);
  if (m.dense_intermediate > 0) {
    column_parallel_rows(m.dense_intermediate, p.tp_size, p.rank);
    row_parallel_cols(m.dense_intermediate, p.tp_size, p.rank, m.nvfp4);
  }
}

}  // namespace fp4moe::dist
