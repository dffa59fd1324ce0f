// EpMoeLayer: the expert-parallel MoE block on the CPU, built on moe::MoeLayer's pieces (router,
// DispatchPlan, GatedMlp). Rank r owns the routed experts of EP rank r / moe_tp (dist/sharding.h),
// with their intermediate slice when moe_tp = tp/ep > 1; the router and the shared expert are
// replicated.
//
// Tokens are sharded: each rank passes the tokens it holds (x_local [n_local, H], any n_local >= 0,
// different per rank; with tensor-parallel attention, where every rank holds the whole batch, pass
// token_range(n, world, rank) and all-gather the outputs). Routing is a per-token function of the
// replicated router, so every rank that routes a token decides the same experts and weights.
// Two ways to dispatch and combine:
//  - kAllGather: all-gather every rank's tokens (padded to the largest slice), every rank routes
//    all N tokens, runs its experts on the ones routed to them, and reduce-scatters its partial
//    outputs (weighted sums over its experts) back to the token owners.
//  - kAllToAll: each rank routes its own tokens and sends each token once to every rank owning
//    one of its experts (with the expert ids and weights), all-to-all; the receiver runs its
//    experts and returns one weighted partial row per (token, rank), all-to-all back. Needs moe_tp 1.
// Both combine the same way: routed[t] = sum over ranks (in rank order) of that rank's partial,
// a partial being sum over the token's slots on that rank (in slot order) of w * expert(x). So the
// two strategies agree exactly, and world size 1 is bit-identical to MoeLayer::forward; with
// several ranks only the grouping of the routed sum changes (moe_tp > 1: also each expert's
// down_proj sum is split), hence last-bits differences.
// The shared expert runs once per token, on the rank that holds the token (data-parallel over
// tokens, weights replicated: it is one expert, small next to E routed ones); y = routed + shared.
// The rule choosing the strategy (kAuto) is choose_moe_strategy below.
// Tested by tests/dist/test_ep_moe.cpp (2- and 4-rank simulations vs MoeLayer::forward, random
// NVFP4/BF16 layers and the golden glm4_moe_tiny_nvfp4 MoE block).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "dist/communicator.h"
#include "dist/sharding.h"
#include "format/safetensors.h"
#include "moe/moe_layer.h"

namespace fp4moe::dist {

enum class MoeCommStrategy : uint8_t { kAuto, kAllGather, kAllToAll };

std::string_view moe_comm_strategy_name(MoeCommStrategy s);  // "auto", "all-gather", "all-to-all"

// kAuto picks all-to-all from this many tokens (summed over ranks) when it moves enough less data.
inline constexpr int64_t kAllToAllMinTokens = 256;
// ... namely when its expected per-rank traffic is at most this fraction of all-gather's.
inline constexpr double kAllToAllMaxTrafficFraction = 0.75;

// Expected traffic of all-to-all relative to all-gather + reduce-scatter, per rank and direction,
// for uniformly random routing: all-gather moves N (W-1)/W rows; all-to-all sends each token to
// each other rank with probability 1 - (1 - 1/W)^k, i.e. N/W (W-1) (1 - (1-1/W)^k) rows. Ratio:
// 1 - (1 - 1/W)^k (W = ep_size, k = top_k). W 8, k 8: 0.656; W 4, k 8: 0.900; W 2: ~1.
double all_to_all_traffic_fraction(int ep_size, int top_k);

struct StrategyChoice {
  MoeCommStrategy strategy = MoeCommStrategy::kAllGather;
  std::string reason;
};

// The rule. A requested strategy other than kAuto is honoured (kAllToAll with moe_tp > 1 throws:
// an expert split over several ranks needs all of them to see its tokens). kAuto:
//  - all-gather when moe_tp > 1 or ep_size == 1;
//  - all-gather when n_tokens_total < kAllToAllMinTokens (decode-sized batches): latency rules,
//    and all-gather + reduce-scatter are two fixed-size collectives, while all-to-all needs a count
//    exchange and per-peer messages first;
//  - otherwise all-to-all when all_to_all_traffic_fraction(ep, k) <= kAllToAllMaxTrafficFraction
//    (it saves a quarter of the volume or more: ep 8 with top-8), else all-gather.
// n_tokens_total is the same on every rank, so every rank picks the same strategy.
StrategyChoice choose_moe_strategy(MoeCommStrategy requested, int64_t n_tokens_total, const ParallelConfig& p,
                                   int top_k);

// What one forward did (for tests and logs).
struct EpMoeStats {
  StrategyChoice choice;
  int64_t n_tokens_total = 0;  // over all ranks
  int64_t rows_sent = 0;       // token rows this rank sent to other ranks (dispatch)
  int64_t rows_computed = 0;   // (row, local expert) pairs this rank ran
};

class EpMoeLayer {
 public:
  EpMoeLayer() = default;
  // This rank's shard of a full layer (its experts, their intermediate slice; router and shared
  // expert copied). Every rank must use the same full layer.
  static EpMoeLayer from_layer(const moe::MoeLayer& full, const ParallelConfig& p);
  // Loads only this rank's experts (then slices their intermediate for moe_tp > 1), the router,
  // the correction bias and the shared expert from a checkpoint; prefix = "model.layers.1.mlp".
  static EpMoeLayer load(const format::TensorStore& store, const std::string& prefix, const moe::MoeConfig& cfg,
                         const ParallelConfig& p);

  // y_local[n_local, H] = MoE(x_local[n_local, H]) for this rank's tokens. Collective: every rank
  // of `comm` calls it (n_local may be 0). comm must match the ParallelConfig (rank, world size).
  void forward(const float* x_local, int64_t n_local, float* y_local, Communicator& comm,
               MoeCommStrategy strategy = MoeCommStrategy::kAuto, EpMoeStats* stats = nullptr) const;

  const moe::MoeConfig& config() const { return cfg_; }
  const ParallelConfig& parallel() const { return par_; }
  Range experts() const { return experts_; }            // owned expert ids
  Range intermediate() const { return intermediate_; }  // slice of each owned expert's intermediate
  const std::vector<moe::GatedMlp>& local_experts() const { return local_experts_; }

 private:
  EpMoeLayer(moe::MoeConfig cfg, ParallelConfig par, std::string prefix, kernels::cpu::LinearWeight router,
             std::vector<float> correction_bias, std::vector<moe::GatedMlp> local_experts,
             std::optional<moe::GatedMlp> shared);

  // Router logits -> top-k ids and weights for n rows of x.
  void route_rows(const float* x, int64_t n, std::vector<int32_t>* idx, std::vector<float>* w) const;
  // For every (row, slot) of `idx` whose expert is owned here, runs the expert on x's row; then
  // partial[row] = sum over those slots in slot order of w * out (0 when none). partial [n, H].
  int64_t expert_partials(const float* x, int64_t n, const int32_t* idx, const float* w, float* partial) const;
  void forward_all_gather(const float* x_local, int64_t n_local, const std::vector<int64_t>& counts, float* routed,
                          Communicator& comm, EpMoeStats* stats) const;
  void forward_all_to_all(const float* x_local, int64_t n_local, float* routed, Communicator& comm,
                          EpMoeStats* stats) const;

  moe::MoeConfig cfg_;
  ParallelConfig par_;
  std::string prefix_;
  kernels::cpu::LinearWeight router_;
  std::vector<float> correction_bias_;
  Range experts_;
  Range intermediate_;
  std::vector<moe::GatedMlp> local_experts_;  // experts_.size() of them
  std::optional<moe::GatedMlp> shared_;
};

}  // namespace fp4moe::dist
