// The sharding math of tensor and expert parallelism, as pure functions (no communication).
//
// One process per GPU; the world is the tensor-parallel group: world_size == tp_size ranks.
//  - Attention and dense layers are split over all tp_size ranks: column-parallel Linears keep a
//    contiguous block of output rows, row-parallel Linears keep the matching block of input
//    columns and all-reduce their outputs. Q heads split evenly; KV heads split evenly when
//    n_kv_heads >= tp_size, else each KV head is replicated on tp_size / n_kv_heads ranks
//    (the ranks whose Q heads use it).
//  - MoE layers spread the routed experts over ep_size ranks (ep_size divides tp_size and the
//    expert count), in contiguous blocks like SGLang: EP rank j owns experts
//    [j*E/ep, (j+1)*E/ep). The remaining factor moe_tp_size = tp_size / ep_size splits each
//    expert's intermediate dimension (gate/up rows, down columns), as SGLang's moe_tp does.
//    Rank r is EP rank r / moe_tp_size and MoE-TP rank r % moe_tp_size.
// Every error names the flag and the numbers, e.g. "--ep-size 3 does not divide 256 experts".
// Tested by tests/dist/test_sharding.cpp (exhaustive small cases and the GLM-5 numbers).
#pragma once

#include <cstdint>
#include <string>

namespace fp4moe::dist {

// [begin, end) of a contiguous block.
struct Range {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t size() const { return end - begin; }
  bool contains(int64_t i) const { return i >= begin && i < end; }
  bool operator==(const Range&) const = default;
};

struct ParallelConfig {
  int world_size = 1;  // processes (= GPUs); must equal tp_size
  int rank = 0;        // 0 .. world_size-1
  int tp_size = 1;     // --tp-size: attention / dense layers are split over this many ranks
  int ep_size = 1;     // --ep-size: routed experts are spread over this many ranks; divides tp_size

  int moe_tp_size() const { return ep_size > 0 ? tp_size / ep_size : 0; }
  int ep_rank() const { return rank / moe_tp_size(); }
  int moe_tp_rank() const { return rank % moe_tp_size(); }
  bool is_single() const { return world_size == 1; }

  // Sizes >= 1, world_size == tp_size, ep_size divides tp_size, rank in range. Throws naming them.
  void validate() const;
  // "rank 3/8 (tp 8, ep 4 x moe-tp 2)"
  std::string to_string() const;

  // A validated config for rank `rank` of a world of tp_size processes.
  static ParallelConfig make(int tp_size, int ep_size, int rank = 0);
};

// The shape facts a model contributes to the validation.
struct ModelDims {
  int n_experts = 0;             // routed experts (0: no MoE layer)
  int64_t moe_intermediate = 0;  // per routed expert
  int n_q_heads = 0;             // attention heads (0: skip the attention check)
  int n_kv_heads = 0;            // key/value heads (MLA: 1 latent, replicated)
  int64_t dense_intermediate = 0;  // dense MLP intermediate (0: none)
  bool nvfp4 = false;            // NVFP4 weights: K splits must be multiples of 16 elements
};

// Checks that `p` can shard a model of these dimensions; throws naming the flag and numbers:
// "--ep-size 3 does not divide 256 experts", "--tp-size 3 does not divide 64 attention heads",
// "--tp-size 8 with 3 KV heads: ...", "moe intermediate 2048 / moe-tp 3 ..." and the NVFP4
// 16-element K granularity of the row-parallel splits.
void validate_for_model(const ParallelConfig& p, const ModelDims& m);

// Part `part` of `n` split into `parts` equal contiguous blocks. `what` names the quantity in the
// error when parts does not divide n, e.g. "--tp-size 3 does not divide 64 attention heads".
Range even_split(int64_t n, int parts, int part, const std::string& flag, const std::string& what);

// Tokens of a batch split over ranks as evenly as possible (the first n % world ranks get one
// more); used to hand each rank its slice of a replicated batch. Never throws for n >= 0.
Range token_range(int64_t n_tokens, int world_size, int rank);

// --- Experts -----------------------------------------------------------------------------------
// Experts owned by EP rank `ep_rank`: [ep_rank*E/ep, (ep_rank+1)*E/ep).
Range expert_range(int n_experts, int ep_size, int ep_rank);
// The EP rank that owns expert e.
int expert_owner(int n_experts, int ep_size, int expert);
// The slice of each expert's intermediate dimension kept by MoE-TP rank `moe_tp_rank`
// (gate/up output rows and down input columns). NVFP4: the size must be a multiple of 16.
Range moe_intermediate_range(int64_t moe_intermediate, int moe_tp_size, int moe_tp_rank, bool nvfp4);

// --- Linears -----------------------------------------------------------------------------------
// Column-parallel Linear [out, in]: rank keeps output rows `out_range` (all input columns).
Range column_parallel_rows(int64_t out_features, int tp_size, int rank);
// Row-parallel Linear [out, in]: rank keeps input columns `in_range` (all output rows); the
// partial outputs are all-reduced. NVFP4: the slice must be a multiple of 16 columns (a block).
Range row_parallel_cols(int64_t in_features, int tp_size, int rank, bool nvfp4);

// --- Attention heads ---------------------------------------------------------------------------
struct HeadShard {
  Range q_heads;      // Q heads of this rank
  Range kv_heads;     // KV heads of this rank (one head when replicated)
  int kv_replicas = 1;  // ranks holding each of these KV heads (tp / n_kv when n_kv < tp, else 1)
  std::string to_string() const;  // "q [8, 16) kv [1, 2) x1"
};
// Throws unless tp divides n_q_heads, and tp divides n_kv_heads or n_kv_heads divides tp.
// Every Q head of the rank uses a KV head the rank holds (GQA group = n_q / n_kv heads).
HeadShard attention_heads(int n_q_heads, int n_kv_heads, int tp_size, int rank);

}  // namespace fp4moe::dist
