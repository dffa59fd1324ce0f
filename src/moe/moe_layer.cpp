// MoeLayer: router -> dispatch plan -> per-expert SwiGLU on dispatched rows -> weighted combine
// -> + shared expert. See moe_layer.h.
#include "moe/moe_layer.h"

#include <algorithm>
#include <cstring>
#include <numeric>

#include "core/error.h"
#include "kernels/cpu/thread_pool.h"
#include "moe/router.h"
#include "moe/weights.h"

namespace fp4moe::moe {

namespace {

void check_mlp(const GatedMlp& m, int64_t hidden, int64_t intermediate, const std::string& what) {
  FP4MOE_CHECK(m.gate.out_features == intermediate && m.gate.in_features == hidden &&
               m.up.out_features == intermediate && m.up.in_features == hidden && m.down.out_features == hidden &&
               m.down.in_features == intermediate)
      << what << ": expected gate/up [" << intermediate << ", " << hidden << "] and down [" << hidden << ", "
      << intermediate << "], found gate " << m.gate.describe() << ", up " << m.up.describe() << ", down "
      << m.down.describe();
}

}  // namespace

MoeLayer::MoeLayer(MoeConfig cfg, std::string prefix, kernels::cpu::LinearWeight router,
                   std::vector<float> correction_bias, std::vector<GatedMlp> experts, std::optional<GatedMlp> shared)
    : cfg_(cfg),
      prefix_(std::move(prefix)),
      router_(std::move(router)),
      correction_bias_(std::move(correction_bias)),
      experts_(std::move(experts)),
      shared_(std::move(shared)) {
  cfg_.validate();
  FP4MOE_CHECK(router_.out_features == cfg_.n_experts && router_.in_features == cfg_.hidden)
      << prefix_ << ".gate: router expected [" << cfg_.n_experts << ", " << cfg_.hidden << "], found "
      << router_.describe();
  const bool want_bias = cfg_.scoring == ScoringFunc::kSigmoid && cfg_.correction_bias;
  FP4MOE_CHECK(static_cast<int64_t>(correction_bias_.size()) == (want_bias ? cfg_.n_experts : 0))
      << prefix_ << ".gate.e_score_correction_bias: expected " << (want_bias ? cfg_.n_experts : 0)
      << " values for " << cfg_.to_string() << ", found " << correction_bias_.size();
  FP4MOE_CHECK(static_cast<int64_t>(experts_.size()) == cfg_.n_experts)
      << prefix_ << ".experts: expected " << cfg_.n_experts << " experts, found " << experts_.size();
  for (size_t e = 0; e < experts_.size(); ++e) {
    check_mlp(experts_[e], cfg_.hidden, cfg_.moe_intermediate, prefix_ + ".experts." + std::to_string(e));
  }
  FP4MOE_CHECK(shared_.has_value() == (cfg_.n_shared_experts > 0))
      << prefix_ << ".shared_experts: config has n_shared_experts=" << cfg_.n_shared_experts << " but the layer "
      << (shared_ ? "has" : "has no") << " shared expert";
  if (shared_) check_mlp(*shared_, cfg_.hidden, cfg_.shared_intermediate(), prefix_ + ".shared_experts");
}

std::vector<float> MoeLayer::load_correction_bias(const format::TensorStore& store, const std::string& prefix,
                                                  const MoeConfig& cfg) {
  std::vector<float> bias;
  if (cfg.scoring != ScoringFunc::kSigmoid || !cfg.correction_bias) return bias;
  const std::string name = prefix + ".gate.e_score_correction_bias";
  FP4MOE_CHECK(store.contains(name)) << name << ": missing from the checkpoint in " << store.dir().string()
                                     << " (expected F32 [" << cfg.n_experts << "])";
  const TensorView v = store.view(name);
  FP4MOE_CHECK((v.dtype == DType::kF32 || v.dtype == DType::kBF16) && v.shape == Shape{cfg.n_experts})
      << name << ": expected F32 [" << cfg.n_experts << "], found " << dtype_name(v.dtype) << " "
      << shape_to_string(v.shape);
  bias.resize(static_cast<size_t>(cfg.n_experts));
  if (v.dtype == DType::kF32) {
    std::memcpy(bias.data(), v.bytes.data(), bias.size() * 4);
  } else {
    auto src = v.as<uint16_t>();
    for (size_t e = 0; e < bias.size(); ++e) bias[e] = bf16_to_f32(src[e]);
  }
  return bias;
}

MoeLayer MoeLayer::load(const format::TensorStore& store, const std::string& prefix, const MoeConfig& cfg) {
  cfg.validate();
  auto router = load_linear(store, prefix + ".gate", cfg.n_experts, cfg.hidden);
  std::vector<float> bias = load_correction_bias(store, prefix, cfg);
  std::vector<GatedMlp> experts;
  experts.reserve(static_cast<size_t>(cfg.n_experts));
  for (int e = 0; e < cfg.n_experts; ++e) {
    experts.push_back(GatedMlp::load(store, prefix + ".experts." + std::to_string(e), cfg.hidden, cfg.moe_intermediate));
  }
  std::optional<GatedMlp> shared;
  if (cfg.n_shared_experts > 0) {
    shared = GatedMlp::load(store, prefix + ".shared_experts", cfg.hidden, cfg.shared_intermediate());
  }
  return MoeLayer(cfg, prefix, std::move(router), std::move(bias), std::move(experts), std::move(shared));
}

MoeLayer MoeLayer::random(const MoeConfig& cfg, kernels::cpu::WeightFormat format, uint64_t seed,
                          const std::string& prefix) {
  cfg.validate();
  // Router logits of a few units so that routing is decisive: weights ~ U(-a, a), a = 1/sqrt(H).
  auto router = random_linear(kernels::cpu::WeightFormat::kF32, cfg.n_experts, cfg.hidden, seed * 7919 + 1);
  std::vector<float> bias;
  if (cfg.scoring == ScoringFunc::kSigmoid && cfg.correction_bias) {
    auto b = random_linear(kernels::cpu::WeightFormat::kF32, 1, cfg.n_experts, seed * 7919 + 2);
    bias.assign(b.f32.begin(), b.f32.end());
  }
  std::vector<GatedMlp> experts;
  experts.reserve(static_cast<size_t>(cfg.n_experts));
  for (int e = 0; e < cfg.n_experts; ++e) {
    experts.push_back(GatedMlp::random(format, cfg.hidden, cfg.moe_intermediate, seed * 7919 + 16 + e,
                                       prefix + ".experts." + std::to_string(e)));
  }
  std::optional<GatedMlp> shared;
  if (cfg.n_shared_experts > 0) {
    shared = GatedMlp::random(format, cfg.hidden, cfg.shared_intermediate(), seed * 7919 + 3,
                              prefix + ".shared_experts");
  }
  return MoeLayer(cfg, prefix, std::move(router), std::move(bias), std::move(experts), std::move(shared));
}

void MoeLayer::forward(const float* x, int64_t n_tokens, float* y, MoeTrace* trace) const {
  FP4MOE_CHECK(n_tokens >= 0) << prefix_ << ": n_tokens=" << n_tokens << " must be >= 0";
  FP4MOE_CHECK(!experts_.empty()) << prefix_ << ": forward on an empty (default-constructed) MoeLayer";
  const int64_t H = cfg_.hidden;
  const int E = cfg_.n_experts;
  const int K = cfg_.top_k;
  const LinearInputObserver* observer = observer_ ? &observer_ : nullptr;

  // 1. Router logits in f32 and the routing decision.
  std::vector<float> logits(static_cast<size_t>(n_tokens * E));
  if (observer) (*observer)(prefix_ + ".gate", x, n_tokens, H);
  kernels::cpu::linear_forward(router_, x, n_tokens, logits.data());
  std::vector<int32_t> topk_idx(static_cast<size_t>(n_tokens * K));
  std::vector<float> topk_weights(static_cast<size_t>(n_tokens * K));
  route(cfg_, logits.data(), correction_bias_.empty() ? nullptr : correction_bias_.data(), n_tokens,
        topk_idx.data(), topk_weights.data());
  DispatchPlan plan = DispatchPlan::build(topk_idx.data(), n_tokens, K, E);

  // 2. Each expert on its dispatched rows; outputs land in plan (entry) order.
  std::vector<float> expert_out(static_cast<size_t>(plan.n_entries() * H));
  auto run_expert = [&](int e) {
    const int64_t begin = plan.offsets[e];
    const int64_t rows = plan.count(e);
    if (rows == 0) return;
    std::vector<float> xs(static_cast<size_t>(rows * H));
    for (int64_t r = 0; r < rows; ++r) {
      std::memcpy(xs.data() + r * H, x + static_cast<int64_t>(plan.token[begin + r]) * H, static_cast<size_t>(H) * 4);
    }
    experts_[e].forward(xs.data(), rows, expert_out.data() + begin * H, observer);
  };
  auto& pool = kernels::cpu::default_thread_pool();
  std::vector<int> active;
  for (int e = 0; e < E; ++e) {
    if (plan.count(e) > 0) active.push_back(e);
  }
  if (observer == nullptr && pool.n_threads() > 1 && static_cast<int>(active.size()) >= 2 * pool.n_threads()) {
    // One expert per task (the Linears inside run inline), largest first for balance.
    std::stable_sort(active.begin(), active.end(), [&](int a, int b) { return plan.count(a) > plan.count(b); });
    pool.parallel_for(static_cast<int64_t>(active.size()), [&](int64_t i) { run_expert(active[i]); });
  } else {
    for (int e : active) run_expert(e);  // the observer is called from this thread only
  }

  // 3. Combine in slot order, then the shared expert.
  if (shared_) {
    shared_->forward(x, n_tokens, y, observer);
  } else {
    std::fill(y, y + n_tokens * H, 0.0f);
  }
  std::vector<float> routed(static_cast<size_t>(H));
  for (int64_t t = 0; t < n_tokens; ++t) {
    std::fill(routed.begin(), routed.end(), 0.0f);
    for (int s = 0; s < K; ++s) {
      const float w = topk_weights[t * K + s];
      const float* o = expert_out.data() + plan.entry_of[t * K + s] * H;
      for (int64_t h = 0; h < H; ++h) routed[h] += w * o[h];
    }
    float* yt = y + t * H;
    for (int64_t h = 0; h < H; ++h) yt[h] = routed[h] + yt[h];  // routed + shared, as HF adds them
  }

  if (trace != nullptr) {
    trace->router_logits = std::move(logits);
    trace->topk_idx = std::move(topk_idx);
    trace->topk_weights = std::move(topk_weights);
    trace->plan = std::move(plan);
  }
}

}  // namespace fp4moe::moe
