// Glm4MoeForCausalLM on the CPU (see glm4_moe.h). One forward step runs every token of every
// sequence of the batch through each layer together (the MoE layers see them all at once); only
// attention is per sequence, over that sequence's KV cache. Tested by tests/model/test_glm4_moe.cpp.
#include "model/glm4_moe.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <optional>
#include <sstream>
#include <unordered_set>

#include "core/error.h"
#include "kernels/cpu/linear.h"
#include "kernels/cpu/thread_pool.h"
#include "model/kv_cache.h"
#include "model/ops.h"
#include "model/weights.h"
#include "moe/moe_layer.h"
#include "moe/weights.h"

namespace fp4moe::model {
namespace {

using kernels::cpu::LinearWeight;
using kernels::cpu::linear_forward;

constexpr int kStreamK = 0;
constexpr int kStreamV = 1;

struct Attention {
  LinearWeight q, k, v, o;
  std::vector<float> q_norm, k_norm;  // [head_dim] when use_qk_norm
};

struct Layer {
  std::string prefix;  // "model.layers.L"
  std::vector<float> input_norm, post_norm;
  Attention attn;
  std::optional<moe::GatedMlp> dense;
  std::optional<moe::MoeLayer> moe;
};

// Where one chunk's tokens sit in the step's token rows.
struct ChunkRows {
  ContiguousKvState* state = nullptr;
  int64_t row0 = 0;  // first row in the step
  int64_t n = 0;
  int64_t pos0 = 0;  // position of the first token
};

class Glm4MoeModel final : public CausalLM {
 public:
  Glm4MoeModel(const ModelConfig& config, const format::TensorStore& store, const LoadOptions& options);

  const ModelConfig& config() const override { return cfg_; }
  std::unique_ptr<KvState> new_state() const override {
    const int64_t w = cfg_.num_key_value_heads * cfg_.head_dim;
    return std::make_unique<ContiguousKvState>(this, cfg_.num_hidden_layers, std::vector<int64_t>{w, w});
  }
  void forward(std::span<const SeqChunk> batch, ForwardTrace* trace) override;
  void set_linear_observer(LinearInputObserver observer) override;
  size_t weight_bytes() const override;
  std::string describe() const override;

 private:
  void observe(const std::string& module, const float* x, int64_t rows, int64_t cols) const {
    if (observer_) observer_(module, x, rows, cols);
  }
  void attention(int64_t l, const std::vector<ChunkRows>& chunks, const std::vector<int32_t>& chunk_of_row,
                 const float* q, float* out) const;
  void run_layer(int64_t l, const std::vector<ChunkRows>& chunks, const std::vector<int32_t>& chunk_of_row,
                 const std::vector<float>& cos, const std::vector<float>& sin, std::vector<float>& x,
                 ForwardTrace* trace) const;

  ModelConfig cfg_;
  moe::MoeConfig moe_cfg_;
  int64_t rotary_dim_ = 0;
  std::vector<float> inv_freq_;
  std::vector<uint16_t> embed_;  // [vocab, hidden] bf16
  std::vector<Layer> layers_;
  std::vector<float> final_norm_;
  LinearWeight lm_head_;
  LinearInputObserver observer_;
};

Glm4MoeModel::Glm4MoeModel(const ModelConfig& config, const format::TensorStore& store, const LoadOptions& options)
    : cfg_(config) {
  moe_cfg_ = cfg_.moe_config();
  rotary_dim_ = cfg_.rotary_dim();
  inv_freq_ = rope_inv_freq(rotary_dim_, cfg_.rope_theta);
  const int64_t H = cfg_.hidden_size;
  const int64_t D = cfg_.head_dim;
  const int64_t n_q = cfg_.num_attention_heads * D;
  const int64_t n_kv = cfg_.num_key_value_heads * D;

  const std::vector<uint64_t> layer_bytes = layer_tensor_bytes(store, cfg_.num_hidden_layers);
  uint64_t total = 0;
  for (uint64_t b : layer_bytes) total += b;
  LoadProgress progress(store.dir().filename().string(), total, options.progress);

  embed_ = load_matrix_bf16(store, "model.embed_tokens.weight", cfg_.vocab_size, H);
  layers_.resize(static_cast<size_t>(cfg_.num_hidden_layers));
  for (int64_t l = 0; l < cfg_.num_hidden_layers; ++l) {
    Layer& L = layers_[static_cast<size_t>(l)];
    L.prefix = "model.layers." + std::to_string(l);
    const std::string a = L.prefix + ".self_attn.";
    L.input_norm = load_vector_f32(store, L.prefix + ".input_layernorm.weight", H);
    L.post_norm = load_vector_f32(store, L.prefix + ".post_attention_layernorm.weight", H);
    L.attn.q = moe::load_linear(store, a + "q_proj", n_q, H, cfg_.attention_bias);
    L.attn.k = moe::load_linear(store, a + "k_proj", n_kv, H, cfg_.attention_bias);
    L.attn.v = moe::load_linear(store, a + "v_proj", n_kv, H, cfg_.attention_bias);
    L.attn.o = moe::load_linear(store, a + "o_proj", H, n_q, false);
    if (cfg_.use_qk_norm) {
      L.attn.q_norm = load_vector_f32(store, a + "q_norm.weight", D);
      L.attn.k_norm = load_vector_f32(store, a + "k_norm.weight", D);
    }
    if (cfg_.is_moe_layer(l)) {
      L.moe = moe::MoeLayer::load(store, L.prefix + ".mlp", moe_cfg_);
    } else {
      L.dense = moe::GatedMlp::load(store, L.prefix + ".mlp", H, cfg_.intermediate_size);
    }
    progress.advance(layer_bytes[static_cast<size_t>(l)]);
  }
  final_norm_ = load_vector_f32(store, "model.norm.weight", H);
  if (cfg_.tie_word_embeddings) {
    lm_head_ = LinearWeight::from_bf16(cfg_.vocab_size, H, embed_);
  } else {
    lm_head_ = moe::load_linear(store, "lm_head", cfg_.vocab_size, H, false);
  }
  progress.advance(layer_bytes.back());
  progress.finish();
}

void Glm4MoeModel::set_linear_observer(LinearInputObserver observer) {
  observer_ = std::move(observer);
  for (Layer& L : layers_) {
    if (L.moe) L.moe->set_linear_input_observer(observer_);
  }
}

size_t Glm4MoeModel::weight_bytes() const {
  auto mlp_bytes = [](const moe::GatedMlp& m) {
    return static_cast<size_t>(m.gate.weight_bytes() + m.up.weight_bytes() + m.down.weight_bytes());
  };
  size_t b = embed_.size() * 2 + final_norm_.size() * 4;
  if (!cfg_.tie_word_embeddings) b += static_cast<size_t>(lm_head_.weight_bytes());
  for (const Layer& L : layers_) {
    b += (L.input_norm.size() + L.post_norm.size() + L.attn.q_norm.size() + L.attn.k_norm.size()) * 4;
    for (const LinearWeight* w : {&L.attn.q, &L.attn.k, &L.attn.v, &L.attn.o}) {
      b += static_cast<size_t>(w->weight_bytes()) + w->bias.size() * 4;
    }
    if (L.dense) b += mlp_bytes(*L.dense);
    if (L.moe) {
      b += static_cast<size_t>(L.moe->router().weight_bytes()) + L.moe->correction_bias().size() * 4;
      for (const auto& e : L.moe->experts()) b += mlp_bytes(e);
      if (L.moe->shared()) b += mlp_bytes(*L.moe->shared());
    }
  }
  return b;
}

std::string Glm4MoeModel::describe() const {
  std::ostringstream os;
  os << cfg_.summary() << "\n";
  os << "  rope: NeoX on " << rotary_dim_ << " of " << cfg_.head_dim << " dims, theta " << cfg_.rope_theta
     << (cfg_.use_qk_norm ? ", q/k RMSNorm" : "") << (cfg_.attention_bias ? ", q/k/v bias" : "") << "\n";
  os << "  moe: " << moe_cfg_.to_string() << "\n";
  for (const Layer& L : layers_) {
    os << "  " << L.prefix << ": q " << L.attn.q.describe() << ", k " << L.attn.k.describe() << ", v "
       << L.attn.v.describe() << ", o " << L.attn.o.describe() << "; ";
    if (L.dense) {
      os << "dense MLP gate " << L.dense->gate.describe() << ", up " << L.dense->up.describe() << ", down "
         << L.dense->down.describe();
    } else {
      const auto& e0 = L.moe->experts().front();
      os << "MoE router " << L.moe->router().describe() << ", " << L.moe->experts().size() << " experts (expert 0 gate "
         << e0.gate.describe() << ", down " << e0.down.describe() << ")";
      if (L.moe->shared()) os << ", shared gate " << L.moe->shared()->gate.describe();
    }
    os << "\n";
  }
  os << "  lm_head " << lm_head_.describe() << (cfg_.tie_word_embeddings ? " (tied)" : "") << "\n";
  os << "  weights in memory: " << weight_bytes() << " B";
  return os.str();
}

// Causal GQA attention of the step's queries q [T, n_heads * D] over each sequence's cache
// (which already holds this step's keys/values): out [T, n_heads * D].
void Glm4MoeModel::attention(int64_t l, const std::vector<ChunkRows>& chunks, const std::vector<int32_t>& chunk_of_row,
                             const float* q, float* out) const {
  const int64_t D = cfg_.head_dim;
  const int64_t n_heads = cfg_.num_attention_heads;
  const int64_t n_kv = cfg_.num_key_value_heads;
  const int64_t group = n_heads / n_kv;
  const int64_t T = static_cast<int64_t>(chunk_of_row.size());
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  kernels::cpu::default_thread_pool().parallel_for(T * n_heads, [&](int64_t task) {
    const int64_t t = task / n_heads;
    const int64_t h = task % n_heads;
    const ChunkRows& c = chunks[static_cast<size_t>(chunk_of_row[static_cast<size_t>(t)])];
    const int64_t n_keys = c.pos0 + (t - c.row0) + 1;  // causal: keys 0..pos
    const float* K = c.state->rows(l, kStreamK) + (h / group) * D;
    const float* V = c.state->rows(l, kStreamV) + (h / group) * D;
    const int64_t stride = n_kv * D;
    const float* qh = q + t * n_heads * D + h * D;
    thread_local std::vector<float> scores;
    scores.resize(static_cast<size_t>(n_keys));
    for (int64_t j = 0; j < n_keys; ++j) {
      const float* kj = K + j * stride;
      float s = 0.0f;
      for (int64_t d = 0; d < D; ++d) s += qh[d] * kj[d];
      scores[static_cast<size_t>(j)] = s * scale;
    }
    softmax_inplace(scores.data(), n_keys);
    float* oh = out + t * n_heads * D + h * D;
    for (int64_t d = 0; d < D; ++d) oh[d] = 0.0f;
    for (int64_t j = 0; j < n_keys; ++j) {
      const float p = scores[static_cast<size_t>(j)];
      const float* vj = V + j * stride;
      for (int64_t d = 0; d < D; ++d) oh[d] += p * vj[d];
    }
  });
}

// The batch entry and the position of a row of a step (for the non-finite checks' messages).
std::pair<int64_t, int64_t> entry_and_position(const std::vector<ChunkRows>& chunks,
                                               const std::vector<int32_t>& chunk_of_row, int64_t row) {
  const int32_t entry = chunk_of_row[static_cast<size_t>(row)];
  const ChunkRows& c = chunks[static_cast<size_t>(entry)];
  return {entry, c.pos0 + (row - c.row0)};
}

// fail_non_finite (model/ops.h) for x [rows, H] of a step, naming the row's batch entry and position.
void check_finite(const std::vector<ChunkRows>& chunks, const std::vector<int32_t>& chunk_of_row, const float* x,
                  int64_t H, const char* what) {
  check_finite_rows(x, static_cast<int64_t>(chunk_of_row.size()), H, what,
                    [&](int64_t row) { return entry_and_position(chunks, chunk_of_row, row); });
}

void Glm4MoeModel::run_layer(int64_t l, const std::vector<ChunkRows>& chunks, const std::vector<int32_t>& chunk_of_row,
                             const std::vector<float>& cos, const std::vector<float>& sin, std::vector<float>& x,
                             ForwardTrace* trace) const {
  const Layer& L = layers_[static_cast<size_t>(l)];
  const int64_t T = static_cast<int64_t>(chunk_of_row.size());
  const int64_t H = cfg_.hidden_size;
  const int64_t D = cfg_.head_dim;
  const int64_t n_heads = cfg_.num_attention_heads;
  const int64_t n_kv = cfg_.num_key_value_heads;
  const int64_t half = rotary_dim_ / 2;
  const std::string a = L.prefix + ".self_attn.";
  // Part timings only when traced (the engine exports them as layer_seconds_total).
  using Clock = std::chrono::steady_clock;
  const Clock::time_point t_attn = trace ? Clock::now() : Clock::time_point{};

  std::vector<float> h(static_cast<size_t>(T * H));
  rms_norm(x.data(), T, H, L.input_norm.data(), cfg_.rms_norm_eps, h.data());
  std::vector<float> q(static_cast<size_t>(T * n_heads * D));
  std::vector<float> k(static_cast<size_t>(T * n_kv * D));
  std::vector<float> v(static_cast<size_t>(T * n_kv * D));
  observe(a + "q_proj", h.data(), T, H);
  observe(a + "k_proj", h.data(), T, H);
  observe(a + "v_proj", h.data(), T, H);
  linear_forward(L.attn.q, h.data(), T, q.data());
  linear_forward(L.attn.k, h.data(), T, k.data());
  linear_forward(L.attn.v, h.data(), T, v.data());
  if (cfg_.use_qk_norm) {  // per head, before RoPE
    rms_norm(q.data(), T * n_heads, D, L.attn.q_norm.data(), cfg_.rms_norm_eps, q.data());
    rms_norm(k.data(), T * n_kv, D, L.attn.k_norm.data(), cfg_.rms_norm_eps, k.data());
  }
  for (int64_t t = 0; t < T; ++t) {
    const float* c = cos.data() + t * half;
    const float* s = sin.data() + t * half;
    rope_neox(q.data() + t * n_heads * D, n_heads, D, 0, rotary_dim_, c, s);
    rope_neox(k.data() + t * n_kv * D, n_kv, D, 0, rotary_dim_, c, s);
  }
  for (const ChunkRows& c : chunks) {
    std::copy_n(k.data() + c.row0 * n_kv * D, c.n * n_kv * D, c.state->append(l, kStreamK, c.n));
    std::copy_n(v.data() + c.row0 * n_kv * D, c.n * n_kv * D, c.state->append(l, kStreamV, c.n));
  }
  std::vector<float> o(static_cast<size_t>(T * n_heads * D));
  attention(l, chunks, chunk_of_row, q.data(), o.data());
  observe(a + "o_proj", o.data(), T, n_heads * D);
  linear_forward(L.attn.o, o.data(), T, h.data());
  check_finite(chunks, chunk_of_row, h.data(), H, "the attention output");
  for (size_t i = 0; i < x.size(); ++i) x[i] += h[i];
  const Clock::time_point t_mlp = trace ? Clock::now() : Clock::time_point{};
  if (trace) trace->layer_times.push_back({l, "attention", std::chrono::duration<double>(t_mlp - t_attn).count()});

  rms_norm(x.data(), T, H, L.post_norm.data(), cfg_.rms_norm_eps, h.data());
  std::vector<float> y(static_cast<size_t>(T * H));
  if (L.dense) {
    const LinearInputObserver* obs = observer_ ? &observer_ : nullptr;
    L.dense->forward(h.data(), T, y.data(), obs);
  } else {
    moe::MoeTrace mt;
    L.moe->forward(h.data(), T, y.data(), trace ? &mt : nullptr);
    if (trace) trace->moe_layers.push_back({l, mt.plan.counts()});
  }
  check_finite(chunks, chunk_of_row, y.data(), H, L.dense ? "the MLP output" : "the MoE output");
  for (size_t i = 0; i < x.size(); ++i) x[i] += y[i];
  if (trace) {
    trace->layer_times.push_back({l, L.dense ? "mlp" : "moe", std::chrono::duration<double>(Clock::now() - t_mlp).count()});
  }
}

void Glm4MoeModel::forward(std::span<const SeqChunk> batch, ForwardTrace* trace) {
  const int64_t H = cfg_.hidden_size;
  const int64_t V = cfg_.vocab_size;
  std::vector<ChunkRows> chunks;
  std::vector<int32_t> chunk_of_row;
  std::vector<int32_t> tokens;
  std::unordered_set<const KvState*> seen;
  for (size_t i = 0; i < batch.size(); ++i) {
    const SeqChunk& sc = batch[i];
    auto* st = dynamic_cast<ContiguousKvState*>(sc.state);
    FP4MOE_CHECK(st != nullptr && st->owner() == this)
        << "batch entry " << i << ": the KV state was not created by this model's new_state()";
    FP4MOE_CHECK(seen.insert(st).second) << "batch entry " << i << ": the same KV state appears twice in one step";
    FP4MOE_CHECK(!sc.tokens.empty()) << "batch entry " << i << ": no tokens";
    FP4MOE_CHECK(sc.argmax == nullptr) << "batch entry " << i << ": SeqChunk::argmax on a CPU model (supports_argmax() is false)";
    chunks.push_back({st, static_cast<int64_t>(tokens.size()), static_cast<int64_t>(sc.tokens.size()), st->length()});
    for (size_t j = 0; j < sc.tokens.size(); ++j) {
      const int32_t t = sc.tokens[j];
      FP4MOE_CHECK(t >= 0 && t < V) << "batch entry " << i << ": token id " << t << " at index " << j
                                    << " is outside the vocabulary [0, " << V << ")";
      tokens.push_back(t);
      chunk_of_row.push_back(static_cast<int32_t>(i));
    }
  }
  if (chunks.empty()) return;
  const int64_t T = static_cast<int64_t>(tokens.size());

  try {
    std::vector<float> x(static_cast<size_t>(T * H));
    const TensorView table{DType::kBF16, {cfg_.vocab_size, H},
                           {reinterpret_cast<const uint8_t*>(embed_.data()), embed_.size() * 2}};
    embedding_lookup(table, tokens, x.data());

    const int64_t half = rotary_dim_ / 2;
    std::vector<float> cos(static_cast<size_t>(T * half)), sin(static_cast<size_t>(T * half));
    for (const ChunkRows& c : chunks) {
      for (int64_t i = 0; i < c.n; ++i) {
        rope_cos_sin(inv_freq_, c.pos0 + i, cos.data() + (c.row0 + i) * half, sin.data() + (c.row0 + i) * half);
      }
    }
    for (int64_t l = 0; l < cfg_.num_hidden_layers; ++l) {
      try {
        run_layer(l, chunks, chunk_of_row, cos, sin, x, trace);
      } catch (const SequenceError& e) {
        throw SequenceError(e.entry(), "layer " + std::to_string(l) + ": " + e.what());
      } catch (const Error& e) {
        throw Error("layer " + std::to_string(l) + ": " + e.what());
      }
    }

    // Final norm and lm_head on the rows whose logits are wanted only.
    std::vector<int64_t> rows;
    for (size_t i = 0; i < batch.size(); ++i) {
      if (batch[i].logits == nullptr) continue;
      const ChunkRows& c = chunks[i];
      for (int64_t r = batch[i].all_logits ? c.row0 : c.row0 + c.n - 1; r < c.row0 + c.n; ++r) rows.push_back(r);
    }
    if (!rows.empty()) {
      const int64_t R = static_cast<int64_t>(rows.size());
      std::vector<float> hn(static_cast<size_t>(R * H));
      for (int64_t r = 0; r < R; ++r) {
        rms_norm(x.data() + rows[static_cast<size_t>(r)] * H, 1, H, final_norm_.data(), cfg_.rms_norm_eps,
                 hn.data() + r * H);
      }
      observe("lm_head", hn.data(), R, H);
      std::vector<float> logits(static_cast<size_t>(R * V));
      linear_forward(lm_head_, hn.data(), R, logits.data());
      // A non-finite final norm or lm_head gave NaN / Inf logits that sampled as token 0, silently.
      check_finite_rows(logits.data(), R, V, "the logits (model.norm, lm_head)", [&](int64_t k) {
        return entry_and_position(chunks, chunk_of_row, rows[static_cast<size_t>(k)]);
      });
      int64_t r = 0;
      for (size_t i = 0; i < batch.size(); ++i) {
        if (batch[i].logits == nullptr) continue;
        const int64_t n = batch[i].all_logits ? chunks[i].n : 1;
        std::copy_n(logits.data() + r * V, n * V, batch[i].logits);
        r += n;
      }
    }
    for (const ChunkRows& c : chunks) c.state->commit(c.n);
  } catch (...) {
    for (const ChunkRows& c : chunks) c.state->rollback();
    throw;
  }
}

}  // namespace

std::vector<WeightSpec> glm4_moe_manifest(const ModelConfig& c) {
  const int64_t H = c.hidden_size;
  const int64_t D = c.head_dim;
  const int64_t n_q = c.num_attention_heads * D;
  const int64_t n_kv = c.num_key_value_heads * D;
  std::vector<WeightSpec> m;
  m.push_back({"model.embed_tokens.weight", {c.vocab_size, H}, WeightRole::kEmbedding});
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l);
    const std::string a = p + ".self_attn.";
    m.push_back({p + ".input_layernorm.weight", {H}, WeightRole::kNorm});
    m.push_back({p + ".post_attention_layernorm.weight", {H}, WeightRole::kNorm});
    for (const auto& [name, out] : {std::pair<std::string, int64_t>{"q_proj", n_q}, {"k_proj", n_kv}, {"v_proj", n_kv}}) {
      m.push_back({a + name, {out, H}, WeightRole::kLinear});
      if (c.attention_bias) m.push_back({a + name + ".bias", {out}, WeightRole::kBias});
    }
    m.push_back({a + "o_proj", {H, n_q}, WeightRole::kLinear});
    if (c.use_qk_norm) {
      m.push_back({a + "q_norm.weight", {D}, WeightRole::kNorm});
      m.push_back({a + "k_norm.weight", {D}, WeightRole::kNorm});
    }
    auto mlp = [&](const std::string& prefix, int64_t inter) {
      m.push_back({prefix + ".gate_proj", {inter, H}, WeightRole::kLinear});
      m.push_back({prefix + ".up_proj", {inter, H}, WeightRole::kLinear});
      m.push_back({prefix + ".down_proj", {H, inter}, WeightRole::kLinear});
    };
    if (c.is_moe_layer(l)) {
      m.push_back({p + ".mlp.gate", {c.n_routed_experts, H}, WeightRole::kLinearBF16});
      m.push_back({p + ".mlp.gate.e_score_correction_bias", {c.n_routed_experts}, WeightRole::kF32Bias});
      for (int64_t e = 0; e < c.n_routed_experts; ++e) mlp(p + ".mlp.experts." + std::to_string(e), c.moe_intermediate_size);
      if (c.n_shared_experts > 0) mlp(p + ".mlp.shared_experts", c.moe_intermediate_size * c.n_shared_experts);
    } else {
      mlp(p + ".mlp", c.intermediate_size);
    }
  }
  m.push_back({"model.norm.weight", {H}, WeightRole::kNorm});
  if (!c.tie_word_embeddings) m.push_back({"lm_head", {c.vocab_size, H}, WeightRole::kLinearBF16});
  return m;
}

Architecture glm4_moe_architecture() {
  Architecture a;
  a.create = [](const ModelConfig& config, const format::TensorStore& store, const LoadOptions& options) {
    return std::unique_ptr<CausalLM>(new Glm4MoeModel(config, store, options));
  };
  a.manifest = glm4_moe_manifest;
  return a;
}

}  // namespace fp4moe::model
