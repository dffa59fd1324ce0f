// EpMoeLayer: expert-parallel MoE forward on the CPU over a Communicator. See ep_moe.h.
// Tested by tests/dist/test_ep_moe.cpp.
#include "dist/ep_moe.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <sstream>

#include "core/error.h"
#include "dist/tp_linear.h"
#include "kernels/cpu/thread_pool.h"
#include "moe/router.h"
#include "moe/weights.h"

namespace fp4moe::dist {

namespace {

using kernels::cpu::WeightFormat;

bool is_nvfp4(const moe::GatedMlp& m) {
  return m.gate.format == WeightFormat::kNVFP4 || m.up.format == WeightFormat::kNVFP4 ||
         m.down.format == WeightFormat::kNVFP4;
}

// The MoE-TP slice of one expert: gate/up keep rows `inter`, down keeps columns `inter` (its bias,
// if any, on MoE-TP rank 0 only).
moe::GatedMlp slice_expert(const moe::GatedMlp& full, Range inter, bool first) {
  if (inter.begin == 0 && inter.end == full.intermediate()) return full;
  moe::GatedMlp m;
  m.prefix = full.prefix;
  m.gate = slice_rows(full.gate, inter);
  m.up = slice_rows(full.up, inter);
  m.down = slice_cols(full.down, inter, first);
  return m;
}

}  // namespace

std::string_view moe_comm_strategy_name(MoeCommStrategy s) {
  switch (s) {
    case MoeCommStrategy::kAuto: return "auto";
    case MoeCommStrategy::kAllGather: return "all-gather";
    case MoeCommStrategy::kAllToAll: return "all-to-all";
  }
  return "?";
}

double all_to_all_traffic_fraction(int ep_size, int top_k) {
  FP4MOE_CHECK(ep_size >= 1 && top_k >= 1) << "all_to_all_traffic_fraction: ep " << ep_size << ", top-" << top_k;
  return 1.0 - std::pow(1.0 - 1.0 / ep_size, top_k);
}

StrategyChoice choose_moe_strategy(MoeCommStrategy requested, int64_t n_tokens_total, const ParallelConfig& p,
                                   int top_k) {
  p.validate();
  std::ostringstream why;
  if (requested == MoeCommStrategy::kAllGather) return {requested, "requested"};
  if (requested == MoeCommStrategy::kAllToAll) {
    FP4MOE_CHECK(p.moe_tp_size() == 1)
        << "MoE all-to-all needs --ep-size == --tp-size (each expert on one rank); --tp-size " << p.tp_size
        << " --ep-size " << p.ep_size << " splits each expert over " << p.moe_tp_size() << " ranks";
    return {requested, "requested"};
  }
  if (p.moe_tp_size() > 1) {
    why << "each expert is split over moe-tp " << p.moe_tp_size() << " ranks, which all need its tokens";
    return {MoeCommStrategy::kAllGather, why.str()};
  }
  if (p.ep_size == 1) return {MoeCommStrategy::kAllGather, "one EP rank: nothing to dispatch"};
  if (n_tokens_total < kAllToAllMinTokens) {
    why << n_tokens_total << " tokens < " << kAllToAllMinTokens << ": latency-bound, two fixed-size collectives";
    return {MoeCommStrategy::kAllGather, why.str()};
  }
  const double f = all_to_all_traffic_fraction(p.ep_size, top_k);
  why.setf(std::ios::fixed);
  why.precision(3);
  if (f <= kAllToAllMaxTrafficFraction) {
    why << n_tokens_total << " tokens >= " << kAllToAllMinTokens << " and all-to-all moves " << f
        << " of all-gather's rows (ep " << p.ep_size << ", top-" << top_k << ")";
    return {MoeCommStrategy::kAllToAll, why.str()};
  }
  why << "all-to-all would move " << f << " > " << kAllToAllMaxTrafficFraction << " of all-gather's rows (ep "
      << p.ep_size << ", top-" << top_k << ")";
  return {MoeCommStrategy::kAllGather, why.str()};
}

EpMoeLayer::EpMoeLayer(moe::MoeConfig cfg, ParallelConfig par, std::string prefix, kernels::cpu::LinearWeight router,
                       std::vector<float> correction_bias, std::vector<moe::GatedMlp> local_experts,
                       std::optional<moe::GatedMlp> shared)
    : cfg_(cfg),
      par_(par),
      prefix_(std::move(prefix)),
      router_(std::move(router)),
      correction_bias_(std::move(correction_bias)),
      local_experts_(std::move(local_experts)),
      shared_(std::move(shared)) {
  cfg_.validate();
  par_.validate();
  experts_ = expert_range(cfg_.n_experts, par_.ep_size, par_.ep_rank());
  const bool nvfp4 = !local_experts_.empty() && is_nvfp4(local_experts_.front());
  intermediate_ = moe_intermediate_range(cfg_.moe_intermediate, par_.moe_tp_size(), par_.moe_tp_rank(), nvfp4);
  FP4MOE_CHECK(router_.out_features == cfg_.n_experts && router_.in_features == cfg_.hidden)
      << prefix_ << ".gate: router expected [" << cfg_.n_experts << ", " << cfg_.hidden << "], found "
      << router_.describe();
  const bool want_bias = cfg_.scoring == moe::ScoringFunc::kSigmoid && cfg_.correction_bias;
  FP4MOE_CHECK(static_cast<int64_t>(correction_bias_.size()) == (want_bias ? cfg_.n_experts : 0))
      << prefix_ << ".gate.e_score_correction_bias: expected " << (want_bias ? cfg_.n_experts : 0) << " values, found "
      << correction_bias_.size();
  FP4MOE_CHECK(static_cast<int64_t>(local_experts_.size()) == experts_.size())
      << prefix_ << ": " << par_.to_string() << " owns experts [" << experts_.begin << ", " << experts_.end
      << ") but was given " << local_experts_.size();
  const int64_t I = intermediate_.size();
  for (size_t i = 0; i < local_experts_.size(); ++i) {
    const moe::GatedMlp& m = local_experts_[i];
    FP4MOE_CHECK(m.gate.out_features == I && m.gate.in_features == cfg_.hidden && m.up.out_features == I &&
                 m.up.in_features == cfg_.hidden && m.down.out_features == cfg_.hidden && m.down.in_features == I)
        << prefix_ << ".experts." << experts_.begin + static_cast<int64_t>(i) << " on " << par_.to_string()
        << ": expected gate/up [" << I << ", " << cfg_.hidden << "] and down [" << cfg_.hidden << ", " << I
        << "], found gate " << m.gate.describe() << ", up " << m.up.describe() << ", down " << m.down.describe();
  }
  FP4MOE_CHECK(shared_.has_value() == (cfg_.n_shared_experts > 0))
      << prefix_ << ".shared_experts: config has n_shared_experts=" << cfg_.n_shared_experts << " but the layer "
      << (shared_ ? "has" : "has no") << " shared expert";
}

EpMoeLayer EpMoeLayer::from_layer(const moe::MoeLayer& full, const ParallelConfig& p) {
  p.validate();
  const moe::MoeConfig& cfg = full.config();
  const Range experts = expert_range(cfg.n_experts, p.ep_size, p.ep_rank());
  const bool nvfp4 = is_nvfp4(full.experts().front());
  const Range inter = moe_intermediate_range(cfg.moe_intermediate, p.moe_tp_size(), p.moe_tp_rank(), nvfp4);
  std::vector<moe::GatedMlp> local;
  local.reserve(static_cast<size_t>(experts.size()));
  for (int64_t e = experts.begin; e < experts.end; ++e) {
    local.push_back(slice_expert(full.experts()[static_cast<size_t>(e)], inter, p.moe_tp_rank() == 0));
  }
  return EpMoeLayer(cfg, p, full.prefix(), full.router(), full.correction_bias(), std::move(local), full.shared());
}

EpMoeLayer EpMoeLayer::load(const format::TensorStore& store, const std::string& prefix, const moe::MoeConfig& cfg,
                            const ParallelConfig& p) {
  cfg.validate();
  p.validate();
  const Range experts = expert_range(cfg.n_experts, p.ep_size, p.ep_rank());
  auto router = moe::load_linear(store, prefix + ".gate", cfg.n_experts, cfg.hidden);
  std::vector<float> bias = moe::MoeLayer::load_correction_bias(store, prefix, cfg);
  std::vector<moe::GatedMlp> local;
  local.reserve(static_cast<size_t>(experts.size()));
  for (int64_t e = experts.begin; e < experts.end; ++e) {
    moe::GatedMlp full = moe::GatedMlp::load(store, prefix + ".experts." + std::to_string(e), cfg.hidden,
                                             cfg.moe_intermediate);
    const Range inter = moe_intermediate_range(cfg.moe_intermediate, p.moe_tp_size(), p.moe_tp_rank(), is_nvfp4(full));
    local.push_back(slice_expert(full, inter, p.moe_tp_rank() == 0));
  }
  std::optional<moe::GatedMlp> shared;
  if (cfg.n_shared_experts > 0) {
    shared = moe::GatedMlp::load(store, prefix + ".shared_experts", cfg.hidden, cfg.shared_intermediate());
  }
  return EpMoeLayer(cfg, p, prefix, std::move(router), std::move(bias), std::move(local), std::move(shared));
}

void EpMoeLayer::route_rows(const float* x, int64_t n, std::vector<int32_t>* idx, std::vector<float>* w) const {
  const int E = cfg_.n_experts, K = cfg_.top_k;
  std::vector<float> logits(static_cast<size_t>(n * E));
  kernels::cpu::linear_forward(router_, x, n, logits.data());
  idx->assign(static_cast<size_t>(n * K), 0);
  w->assign(static_cast<size_t>(n * K), 0.0f);
  moe::route(cfg_, logits.data(), correction_bias_.empty() ? nullptr : correction_bias_.data(), n, idx->data(),
             w->data());
}

int64_t EpMoeLayer::expert_partials(const float* x, int64_t n, const int32_t* idx, const float* w,
                                    float* partial) const {
  const int64_t H = cfg_.hidden;
  const int K = cfg_.top_k;
  const int n_local = static_cast<int>(experts_.size());
  // Stable counting sort of the owned (row, slot) pairs by local expert (like DispatchPlan).
  std::vector<int64_t> offsets(static_cast<size_t>(n_local) + 1, 0);
  for (int64_t i = 0; i < n * K; ++i) {
    if (experts_.contains(idx[i])) ++offsets[static_cast<size_t>(idx[i] - experts_.begin) + 1];
  }
  for (int e = 0; e < n_local; ++e) offsets[e + 1] += offsets[e];
  const int64_t n_pairs = offsets.back();
  std::vector<int64_t> cursor(offsets.begin(), offsets.end() - 1);
  std::vector<int64_t> entry_of(static_cast<size_t>(n * K), -1);
  std::vector<int64_t> row_of(static_cast<size_t>(n_pairs));
  for (int64_t i = 0; i < n * K; ++i) {
    if (!experts_.contains(idx[i])) continue;
    const int64_t entry = cursor[static_cast<size_t>(idx[i] - experts_.begin)]++;
    entry_of[static_cast<size_t>(i)] = entry;
    row_of[static_cast<size_t>(entry)] = i / K;
  }

  std::vector<float> out(static_cast<size_t>(n_pairs * H));
  auto run_expert = [&](int64_t e) {
    const int64_t begin = offsets[static_cast<size_t>(e)];
    const int64_t rows = offsets[static_cast<size_t>(e) + 1] - begin;
    if (rows == 0) return;
    std::vector<float> xs(static_cast<size_t>(rows * H));
    for (int64_t r = 0; r < rows; ++r) {
      std::memcpy(xs.data() + r * H, x + row_of[static_cast<size_t>(begin + r)] * H, static_cast<size_t>(H) * 4);
    }
    local_experts_[static_cast<size_t>(e)].forward(xs.data(), rows, out.data() + begin * H);
  };
  std::vector<int64_t> active;
  for (int64_t e = 0; e < n_local; ++e) {
    if (offsets[static_cast<size_t>(e) + 1] > offsets[static_cast<size_t>(e)]) active.push_back(e);
  }
  auto& pool = kernels::cpu::default_thread_pool();
  if (pool.n_threads() > 1 && static_cast<int64_t>(active.size()) >= 2 * pool.n_threads()) {
    pool.parallel_for(static_cast<int64_t>(active.size()), [&](int64_t i) { run_expert(active[static_cast<size_t>(i)]); });
  } else {
    for (int64_t e : active) run_expert(e);
  }

  // partial[row] = sum over the row's owned slots, in slot order, of w * out (as MoeLayer combines).
  for (int64_t t = 0; t < n; ++t) {
    float* pt = partial + t * H;
    std::fill(pt, pt + H, 0.0f);
    for (int s = 0; s < K; ++s) {
      const int64_t entry = entry_of[static_cast<size_t>(t * K + s)];
      if (entry < 0) continue;
      const float ws = w[t * K + s];
      const float* o = out.data() + entry * H;
      for (int64_t h = 0; h < H; ++h) pt[h] += ws * o[h];
    }
  }
  return n_pairs;
}

void EpMoeLayer::forward(const float* x_local, int64_t n_local, float* y_local, Communicator& comm,
                         MoeCommStrategy strategy, EpMoeStats* stats) const {
  FP4MOE_CHECK(!local_experts_.empty()) << prefix_ << ": forward on an empty (default-constructed) EpMoeLayer";
  FP4MOE_CHECK(comm.world_size() == par_.world_size && comm.rank() == par_.rank)
      << prefix_ << ": layer sharded for " << par_.to_string() << " but called on " << comm.describe();
  FP4MOE_CHECK(!comm.buffers_on_device()) << prefix_ << ": the CPU EpMoeLayer needs a host-buffer communicator, got "
                                          << comm.describe();
  FP4MOE_CHECK(n_local >= 0) << prefix_ << ": n_local " << n_local << " must be >= 0";
  const int64_t H = cfg_.hidden;
  const int W = par_.world_size;

  std::vector<int64_t> counts(static_cast<size_t>(W));
  comm.all_gather(&n_local, counts.data(), sizeof(int64_t));
  int64_t n_total = 0;
  for (int64_t c : counts) n_total += c;
  EpMoeStats local_stats;
  EpMoeStats& st = stats != nullptr ? *stats : local_stats;
  st = EpMoeStats{};
  st.n_tokens_total = n_total;
  st.choice = choose_moe_strategy(strategy, n_total, par_, cfg_.top_k);

  std::vector<float> routed(static_cast<size_t>(n_local * H));
  if (st.choice.strategy == MoeCommStrategy::kAllToAll) {
    forward_all_to_all(x_local, n_local, routed.data(), comm, &st);
  } else {
    forward_all_gather(x_local, n_local, counts, routed.data(), comm, &st);
  }
  if (shared_) {
    shared_->forward(x_local, n_local, y_local);
  } else {
    std::fill(y_local, y_local + n_local * H, 0.0f);
  }
  for (int64_t i = 0; i < n_local * H; ++i) y_local[i] = routed[static_cast<size_t>(i)] + y_local[i];
}

void EpMoeLayer::forward_all_gather(const float* x_local, int64_t n_local, const std::vector<int64_t>& counts,
                                    float* routed, Communicator& comm, EpMoeStats* stats) const {
  const int64_t H = cfg_.hidden;
  const int W = par_.world_size;
  const int64_t max_local = *std::max_element(counts.begin(), counts.end());
  if (max_local == 0) return;
  const int64_t block = max_local * H;  // every rank's slice padded to the largest

  std::vector<float> send(static_cast<size_t>(block), 0.0f);
  if (n_local > 0) std::memcpy(send.data(), x_local, static_cast<size_t>(n_local * H) * 4);
  std::vector<float> gathered(static_cast<size_t>(W * block));
  comm.all_gather(send.data(), gathered.data(), block * 4);
  int64_t n_total = 0;
  for (int64_t c : counts) n_total += c;
  std::vector<float> x_all(static_cast<size_t>(n_total * H));
  for (int64_t p = 0, row = 0; p < W; row += counts[static_cast<size_t>(p)], ++p) {
    std::memcpy(x_all.data() + row * H, gathered.data() + p * block, static_cast<size_t>(counts[p] * H) * 4);
  }
  stats->rows_sent = W > 1 ? n_local * (W - 1) : 0;

  std::vector<int32_t> idx;
  std::vector<float> w;
  route_rows(x_all.data(), n_total, &idx, &w);
  std::vector<float> partial(static_cast<size_t>(n_total * H));
  stats->rows_computed = expert_partials(x_all.data(), n_total, idx.data(), w.data(), partial.data());

  std::vector<float> padded(static_cast<size_t>(W * block), 0.0f);
  for (int64_t p = 0, row = 0; p < W; row += counts[static_cast<size_t>(p)], ++p) {
    std::memcpy(padded.data() + p * block, partial.data() + row * H, static_cast<size_t>(counts[p] * H) * 4);
  }
  std::vector<float> mine(static_cast<size_t>(block));
  comm.reduce_scatter_sum(padded.data(), mine.data(), block);
  if (n_local > 0) std::memcpy(routed, mine.data(), static_cast<size_t>(n_local * H) * 4);
}

void EpMoeLayer::forward_all_to_all(const float* x_local, int64_t n_local, float* routed, Communicator& comm,
                                    EpMoeStats* stats) const {
  const int64_t H = cfg_.hidden;
  const int K = cfg_.top_k;
  const int W = par_.world_size;
  FP4MOE_CHECK(par_.ep_size == W) << "all-to-all needs ep_size == world size, " << par_.to_string();

  std::vector<int32_t> idx;
  std::vector<float> w;
  route_rows(x_local, n_local, &idx, &w);

  // Each token goes once to each rank owning one of its experts, in (rank, token) order, with a
  // record of K expert ids (-1: not on that rank) and K weights.
  std::vector<std::vector<int64_t>> tokens_to(static_cast<size_t>(W));
  for (int64_t t = 0; t < n_local; ++t) {
    for (int p = 0; p < W; ++p) {
      for (int s = 0; s < K; ++s) {
        if (expert_owner(cfg_.n_experts, W, idx[static_cast<size_t>(t * K + s)]) == p) {
          tokens_to[static_cast<size_t>(p)].push_back(t);
          break;
        }
      }
    }
  }
  std::vector<int64_t> rows_to(static_cast<size_t>(W)), rows_from(static_cast<size_t>(W));
  int64_t n_send = 0;
  for (int p = 0; p < W; ++p) {
    rows_to[static_cast<size_t>(p)] = static_cast<int64_t>(tokens_to[static_cast<size_t>(p)].size());
    n_send += rows_to[static_cast<size_t>(p)];
    if (p != par_.rank) stats->rows_sent += rows_to[static_cast<size_t>(p)];
  }
  std::vector<float> send_x(static_cast<size_t>(n_send * H));
  std::vector<int32_t> send_idx(static_cast<size_t>(n_send * K), -1);
  std::vector<float> send_w(static_cast<size_t>(n_send * K), 0.0f);
  for (int64_t p = 0, row = 0; p < W; ++p) {
    for (int64_t t : tokens_to[static_cast<size_t>(p)]) {
      std::memcpy(send_x.data() + row * H, x_local + t * H, static_cast<size_t>(H) * 4);
      for (int s = 0; s < K; ++s) {
        const int32_t e = idx[static_cast<size_t>(t * K + s)];
        if (expert_owner(cfg_.n_experts, W, e) != p) continue;
        send_idx[static_cast<size_t>(row * K + s)] = e;
        send_w[static_cast<size_t>(row * K + s)] = w[static_cast<size_t>(t * K + s)];
      }
      ++row;
    }
  }

  // Counts first, then rows, expert ids and weights.
  const std::vector<int64_t> count_bytes(static_cast<size_t>(W), sizeof(int64_t));
  comm.all_to_all_v(rows_to.data(), count_bytes.data(), rows_from.data(), count_bytes.data());
  int64_t n_recv = 0;
  for (int64_t c : rows_from) n_recv += c;
  auto scaled = [](const std::vector<int64_t>& rows, int64_t bytes_per_row) {
    std::vector<int64_t> b(rows.size());
    for (size_t i = 0; i < rows.size(); ++i) b[i] = rows[i] * bytes_per_row;
    return b;
  };
  const auto sb_x = scaled(rows_to, H * 4), rb_x = scaled(rows_from, H * 4);
  const auto sb_k = scaled(rows_to, K * 4), rb_k = scaled(rows_from, K * 4);
  std::vector<float> recv_x(static_cast<size_t>(n_recv * H));
  std::vector<int32_t> recv_idx(static_cast<size_t>(n_recv * K));
  std::vector<float> recv_w(static_cast<size_t>(n_recv * K));
  comm.all_to_all_v(send_x.data(), sb_x.data(), recv_x.data(), rb_x.data());
  comm.all_to_all_v(send_idx.data(), sb_k.data(), recv_idx.data(), rb_k.data());
  comm.all_to_all_v(send_w.data(), sb_k.data(), recv_w.data(), rb_k.data());
  for (int64_t i = 0; i < n_recv * K; ++i) {
    const int32_t e = recv_idx[static_cast<size_t>(i)];
    FP4MOE_CHECK(e == -1 || experts_.contains(e))
        << prefix_ << ": " << par_.to_string() << " received row " << i / K << " for expert " << e << ", which it does not own";
  }

  std::vector<float> partial(static_cast<size_t>(n_recv * H));
  stats->rows_computed = expert_partials(recv_x.data(), n_recv, recv_idx.data(), recv_w.data(), partial.data());
  std::vector<float> back(static_cast<size_t>(n_send * H));
  comm.all_to_all_v(partial.data(), rb_x.data(), back.data(), sb_x.data());

  // routed[t] = sum over ranks in rank order of their partial (as the reduce-scatter adds them).
  std::fill(routed, routed + n_local * H, 0.0f);
  for (int64_t p = 0, row = 0; p < W; ++p) {
    for (int64_t t : tokens_to[static_cast<size_t>(p)]) {
      const float* b = back.data() + row * H;
      float* r = routed + t * H;
      for (int64_t h = 0; h < H; ++h) r[h] += b[h];
      ++row;
    }
  }
}

}  // namespace fp4moe::dist
