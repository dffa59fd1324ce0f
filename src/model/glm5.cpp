// GlmMoeDsaForCausalLM on the CPU (see glm5.h). Tested by tests/model/test_glm5.cpp.
#include "model/glm5.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <optional>
#include <sstream>
#include <string>
#include <unordered_set>

#include "core/error.h"
#include "kernels/cpu/linear.h"
#include "model/dsa_indexer.h"
#include "model/ops.h"
#include "model/weights.h"
#include "moe/config.h"
#include "moe/mlp.h"
#include "moe/moe_layer.h"
#include "moe/weights.h"

namespace fp4moe::model {
namespace {

using kernels::cpu::LinearWeight;

// HF builds q_a_layernorm / kv_a_layernorm with DeepseekV3RMSNorm's default eps and the indexer's
// k_norm as nn.LayerNorm(eps=1e-6); neither reads rms_norm_eps (spec §4.2, §6.4).
constexpr float kLoraNormEps = 1e-6f;
constexpr float kIndexerKNormEps = 1e-6f;

struct Glm5Layer {
  int64_t index = 0;
  std::string prefix;  // "model.layers.L"
  std::vector<float> input_norm, post_norm;
  // MLA.
  LinearWeight q_a_proj;  // [q_lora, H]
  std::vector<float> q_a_norm;
  LinearWeight q_b_proj;   // [heads * qk_head_dim, q_lora]
  LinearWeight kv_a_proj;  // [kv_lora + rope, H]
  std::vector<float> kv_a_norm;
  std::vector<float> kv_b;  // kv_b_proj dequantized to f32 [heads * (nope + v), kv_lora] (absorbed form)
  int64_t kv_b_stored_bytes = 0;
  std::string kv_b_format;
  LinearWeight o_proj;  // [H, heads * v]
  // DSA indexer ("full" layers only).
  bool full_indexer = false;
  LinearWeight wq_b;          // [index_heads * index_dim, q_lora]
  LinearWeight wk;            // [index_dim, H]
  LinearWeight weights_proj;  // [index_heads, H]
  std::vector<float> k_norm_w, k_norm_b;
  // MLP.
  std::optional<moe::GatedMlp> dense;
  std::optional<moe::MoeLayer> moe;
};

class Glm5State : public KvState {
 public:
  Glm5State(const void* owner, const ModelConfig& c) : owner_(owner) {
    for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
      mla.emplace_back(static_cast<int>(c.kv_lora_rank), static_cast<int>(c.qk_rope_head_dim));
      index.emplace_back(c.indexer_types[static_cast<size_t>(l)] == "full" ? static_cast<int>(c.index_head_dim) : 0);
    }
  }
  int64_t length() const override { return length_; }
  void truncate(int64_t n) override {
    FP4MOE_CHECK(n >= 0 && n <= length_) << "truncating a GLM-5 KV state of " << length_ << " tokens to " << n;
    for (auto& m : mla) m.truncate(std::min(n, m.n_tokens()));
    for (auto& k : index) k.truncate(std::min(n, k.n_tokens()));
    length_ = n;
  }
  std::unique_ptr<KvState> copy_prefix(int64_t n) const override {
    auto out = std::make_unique<Glm5State>(*this);
    out->truncate(n);
    return out;
  }
  size_t bytes() const override {
    size_t b = 0;
    for (const auto& m : mla) b += static_cast<size_t>(m.n_tokens() * m.bytes_per_token());
    for (const auto& k : index) b += static_cast<size_t>(k.n_tokens() * k.head_dim()) * sizeof(float);
    return b;
  }

  const void* owner_;
  int64_t length_ = 0;
  std::vector<MlaLatentCache> mla;     // per layer
  std::vector<IndexerKeyCache> index;  // per layer (head_dim 0 and empty on "shared" layers)
};

std::string layer_prefix(int64_t l) { return "model.layers." + std::to_string(l); }

class Glm5Model final : public GlmMoeDsaModel {
 public:
  Glm5Model(const ModelConfig& config, const format::TensorStore& store, const LoadOptions& options);

  const ModelConfig& config() const override { return cfg_; }
  std::unique_ptr<KvState> new_state() const override { return std::make_unique<Glm5State>(this, cfg_); }
  void forward(std::span<const SeqChunk> batch, ForwardTrace* trace) override;
  void set_linear_observer(LinearInputObserver observer) override;
  void set_dsa_observer(DsaSelectionObserver observer) override { dsa_observer_ = std::move(observer); }
  void set_dsa_selection_override(DsaSelectionOverride source) override { dsa_override_ = std::move(source); }
  size_t weight_bytes() const override;
  std::string describe() const override;

 private:
  struct Batch {
    std::vector<Glm5State*> states;
    std::vector<int64_t> row0;   // first row of each chunk (+ total at the end)
    std::vector<int64_t> pos;    // absolute position of every row
    std::vector<float> cos, sin; // RoPE tables of every row [n_rows, qk_rope_head_dim / 2]
    // The batch entry and the position of a row (for the non-finite checks' messages).
    std::pair<int64_t, int64_t> entry_and_position(int64_t row) const {
      return {std::upper_bound(row0.begin(), row0.end(), row) - row0.begin() - 1, pos[static_cast<size_t>(row)]};
    }
  };

  void linear(const LinearWeight& w, const std::string& module, const float* x, int64_t n, float* y) const {
    if (observer_) observer_(module, x, n, w.in_features);
    kernels::cpu::linear_forward(w, x, n, y);
  }
  void attention(const Glm5Layer& L, std::span<const SeqChunk> batch, const Batch& b, const float* x,
                 std::vector<KeySelection>& shared_sel, float* out);
  void forward_impl(std::span<const SeqChunk> batch, const Batch& b, ForwardTrace* trace);
  // fail_non_finite (model/ops.h) for x [rows, H] of batch b, naming the row's batch entry and position.
  static void check_finite(const Batch& b, const float* x, int64_t H, const char* what);
  // One decoder layer on h [rows, H] in place (xn, y: scratch of h's size).
  void run_layer(const Glm5Layer& L, std::span<const SeqChunk> batch, const Batch& b,
                 std::vector<KeySelection>& shared_sel, std::vector<float>& h, std::vector<float>& xn,
                 std::vector<float>& y, ForwardTrace* trace);
  // RoPE on the rope dims [offset, offset + qk_rope_head_dim) of n_heads heads of batch row `row`.
  void rope(const Batch& b, int64_t row, float* x, int64_t n_heads, int64_t stride, int64_t offset,
            bool interleave) const;

  ModelConfig cfg_;
  MlaDims mla_dims_;
  IndexerDims idx_dims_;
  std::vector<float> inv_freq_;
  std::vector<uint16_t> embed_;  // [vocab, H] bf16
  std::vector<float> final_norm_;
  LinearWeight lm_head_;
  std::vector<Glm5Layer> layers_;
  LinearInputObserver observer_;
  DsaSelectionObserver dsa_observer_;
  DsaSelectionOverride dsa_override_;
};

Glm5Model::Glm5Model(const ModelConfig& c, const format::TensorStore& store, const LoadOptions& options)
    : cfg_(c) {
  // The config's own rules (q LoRA, rope_type, MLA and indexer dims, indexer_types) are checked at parse time
  // (model/config.cpp), so `inspect` reports them too.
  mla_dims_ = {static_cast<int>(c.num_attention_heads), static_cast<int>(c.kv_lora_rank),
               static_cast<int>(c.qk_nope_head_dim), static_cast<int>(c.qk_rope_head_dim),
               static_cast<int>(c.v_head_dim)};
  idx_dims_ = {static_cast<int>(c.index_n_heads), static_cast<int>(c.index_head_dim),
               static_cast<int>(c.qk_rope_head_dim), static_cast<int>(c.index_topk)};
  inv_freq_ = rope_inv_freq(c.qk_rope_head_dim, c.rope_theta);

  const int64_t H = c.hidden_size, heads = c.num_attention_heads;
  const std::vector<uint64_t> layer_bytes = layer_tensor_bytes(store, c.num_hidden_layers);
  uint64_t total_bytes = 0;
  for (uint64_t v : layer_bytes) total_bytes += v;
  LoadProgress progress(store.dir().filename().string(), total_bytes, options.progress);
  embed_ = load_matrix_bf16(store, "model.embed_tokens.weight", c.vocab_size, H);
  final_norm_ = load_vector_f32(store, "model.norm.weight", H);
  if (c.tie_word_embeddings) {
    lm_head_ = LinearWeight::from_bf16(c.vocab_size, H, embed_);
  } else {
    lm_head_ = moe::load_linear(store, "lm_head", c.vocab_size, H);
  }
  progress.advance(layer_bytes.back());  // embeddings, final norm, lm_head (and unused MTP layers)

  const moe::MoeConfig moe_cfg = c.moe_config();
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    Glm5Layer L;
    L.index = l;
    L.prefix = layer_prefix(l);
    const std::string a = L.prefix + ".self_attn";
    L.input_norm = load_vector_f32(store, L.prefix + ".input_layernorm.weight", H);
    L.post_norm = load_vector_f32(store, L.prefix + ".post_attention_layernorm.weight", H);
    L.q_a_proj = moe::load_linear(store, a + ".q_a_proj", c.q_lora_rank, H, c.attention_bias);
    L.q_a_norm = load_vector_f32(store, a + ".q_a_layernorm.weight", c.q_lora_rank);
    L.q_b_proj = moe::load_linear(store, a + ".q_b_proj", heads * c.qk_head_dim, c.q_lora_rank);
    L.kv_a_proj = moe::load_linear(store, a + ".kv_a_proj_with_mqa", c.kv_lora_rank + c.qk_rope_head_dim, H,
                                   c.attention_bias);
    L.kv_a_norm = load_vector_f32(store, a + ".kv_a_layernorm.weight", c.kv_lora_rank);
    {
      const LinearWeight kv_b =
          moe::load_linear(store, a + ".kv_b_proj", heads * (c.qk_nope_head_dim + c.v_head_dim), c.kv_lora_rank);
      L.kv_b = kernels::cpu::dequantize(kv_b);
      L.kv_b_stored_bytes = kv_b.weight_bytes();
      L.kv_b_format = kv_b.describe();
    }
    L.o_proj = moe::load_linear(store, a + ".o_proj", H, heads * c.v_head_dim, c.attention_bias);
    L.full_indexer = c.indexer_types[static_cast<size_t>(l)] == "full";
    if (L.full_indexer) {
      const std::string ix = a + ".indexer";
      L.wq_b = moe::load_linear(store, ix + ".wq_b", c.index_n_heads * c.index_head_dim, c.q_lora_rank);
      L.wk = moe::load_linear(store, ix + ".wk", c.index_head_dim, H);
      L.weights_proj = moe::load_linear(store, ix + ".weights_proj", c.index_n_heads, H);
      L.k_norm_w = load_vector_f32(store, ix + ".k_norm.weight", c.index_head_dim);
      L.k_norm_b = load_vector_f32(store, ix + ".k_norm.bias", c.index_head_dim);
    }
    if (c.is_moe_layer(l)) {
      L.moe = moe::MoeLayer::load(store, L.prefix + ".mlp", moe_cfg);
    } else {
      L.dense = moe::GatedMlp::load(store, L.prefix + ".mlp", H, c.intermediate_size);
    }
    layers_.push_back(std::move(L));
    progress.advance(layer_bytes[static_cast<size_t>(l)]);
  }
  progress.finish();
}

void Glm5Model::rope(const Batch& b, int64_t row, float* x, int64_t n_heads, int64_t stride, int64_t offset,
                     bool interleave) const {
  const int64_t half = static_cast<int64_t>(inv_freq_.size());
  const float* c = b.cos.data() + row * half;
  const float* s = b.sin.data() + row * half;
  if (interleave) {
    rope_interleaved(x, n_heads, stride, offset, 2 * half, c, s);
  } else {
    rope_neox(x, n_heads, stride, offset, 2 * half, c, s);
  }
}

void Glm5Model::set_linear_observer(LinearInputObserver observer) {
  observer_ = std::move(observer);
  for (Glm5Layer& L : layers_) {
    if (!L.moe) continue;
    if (observer_) {
      L.moe->set_linear_input_observer([this](const std::string& m, const float* x, int64_t rows, int64_t cols) {
        if (observer_) observer_(m, x, rows, cols);
      });
    } else {
      L.moe->set_linear_input_observer({});
    }
  }
}

void Glm5Model::attention(const Glm5Layer& L, std::span<const SeqChunk> batch, const Batch& b, const float* x,
                          std::vector<KeySelection>& shared_sel, float* out) {
  const ModelConfig& c = cfg_;
  const int64_t n = b.row0.back();
  const int64_t heads = c.num_attention_heads, qk = c.qk_head_dim, nope = c.qk_nope_head_dim;
  const int64_t R = c.kv_lora_rank, rope_dim = c.qk_rope_head_dim;
  const std::string a = L.prefix + ".self_attn";

  std::vector<float> q_resid(static_cast<size_t>(n * c.q_lora_rank));
  linear(L.q_a_proj, a + ".q_a_proj", x, n, q_resid.data());
  rms_norm(q_resid.data(), n, c.q_lora_rank, L.q_a_norm.data(), kLoraNormEps, q_resid.data());
  std::vector<float> q(static_cast<size_t>(n * heads * qk));
  linear(L.q_b_proj, a + ".q_b_proj", q_resid.data(), n, q.data());
  std::vector<float> ckv(static_cast<size_t>(n * (R + rope_dim)));
  linear(L.kv_a_proj, a + ".kv_a_proj_with_mqa", x, n, ckv.data());
  std::vector<float> c_kv(static_cast<size_t>(n * R));
  for (int64_t r = 0; r < n; ++r) {
    float* row = ckv.data() + r * (R + rope_dim);
    rms_norm(row, 1, R, L.kv_a_norm.data(), kLoraNormEps, c_kv.data() + r * R);
    rope(b, r, row + R, 1, rope_dim, 0, c.rope_interleave);
    rope(b, r, q.data() + r * heads * qk, heads, qk, nope, c.rope_interleave);
  }
  if (observer_) observer_(a + ".kv_b_proj", c_kv.data(), n, R);

  // Indexer projections for every row: q [n, ih, id], k [n, id] (LayerNorm then RoPE on the leading
  // rope dims), w [n, ih] * ih^-0.5.
  std::vector<float> iq, ik, iw;
  if (L.full_indexer) {
    const int64_t ih = c.index_n_heads, id = c.index_head_dim;
    const std::string ix = a + ".indexer";
    iq.resize(static_cast<size_t>(n * ih * id));
    ik.resize(static_cast<size_t>(n * id));
    iw.resize(static_cast<size_t>(n * ih));
    linear(L.wq_b, ix + ".wq_b", q_resid.data(), n, iq.data());
    linear(L.wk, ix + ".wk", x, n, ik.data());
    layer_norm(ik.data(), n, id, L.k_norm_w.data(), L.k_norm_b.data(), kIndexerKNormEps, ik.data());
    linear(L.weights_proj, ix + ".weights_proj", x, n, iw.data());
    const float wscale = idx_dims_.weight_scale();
    for (float& v : iw) v *= wscale;
    for (int64_t r = 0; r < n; ++r) {
      rope(b, r, iq.data() + r * ih * id, ih, id, 0, c.indexer_rope_interleave);
      rope(b, r, ik.data() + r * id, 1, id, 0, c.indexer_rope_interleave);
    }
  }

  // Per sequence, one after another (the indexer and the attention are parallel inside): append
  // the new latents and indexer keys, select keys, attend.
  std::vector<float> attn(static_cast<size_t>(n * heads * c.v_head_dim));
  const size_t n_chunks = batch.size();
  for (size_t ci = 0; ci < n_chunks; ++ci) {
    Glm5State& st = *b.states[ci];
    const int64_t r0 = b.row0[ci], r1 = b.row0[ci + 1];
    MlaLatentCache& cache = st.mla[static_cast<size_t>(L.index)];
    for (int64_t r = r0; r < r1; ++r) cache.append(c_kv.data() + r * R, ckv.data() + r * (R + rope_dim) + R);
    std::span<const int64_t> q_pos(b.pos.data() + r0, static_cast<size_t>(r1 - r0));
    if (L.full_indexer) {
      IndexerKeyCache& kc = st.index[static_cast<size_t>(L.index)];
      for (int64_t r = r0; r < r1; ++r) kc.append(ik.data() + r * c.index_head_dim);
      if (dsa_override_) {
        shared_sel[ci] = dsa_override_(L.index, ci, q_pos);
        check_key_selection(shared_sel[ci], q_pos, c.index_topk,
                            "layer " + std::to_string(L.index) + " chunk " + std::to_string(ci) +
                                ": the DSA selection override");
      } else {
        shared_sel[ci] = dsa_select_topk(idx_dims_, iq.data() + r0 * c.index_n_heads * c.index_head_dim,
                                         iw.data() + r0 * c.index_n_heads, q_pos.data(), r1 - r0, kc);
      }
    } else {
      FP4MOE_CHECK(shared_sel[ci].n_queries() == r1 - r0)
          << "layer " << L.index << " is a \"shared\" DSA layer but no earlier full layer selected keys";
    }
    MlaAttentionArgs args{&mla_dims_, q.data() + r0 * heads * qk, q_pos.data(), r1 - r0, &cache, L.kv_b.data(),
                          &shared_sel[ci], attn.data() + r0 * heads * c.v_head_dim};
    mla_attention(args);
  }
  if (dsa_observer_) {
    for (size_t ci = 0; ci < n_chunks; ++ci) {
      std::span<const int64_t> q_pos(b.pos.data() + b.row0[ci], static_cast<size_t>(b.row0[ci + 1] - b.row0[ci]));
      dsa_observer_(L.index, ci, q_pos, shared_sel[ci], !L.full_indexer);
    }
  }
  linear(L.o_proj, a + ".o_proj", attn.data(), n, out);
}

void Glm5Model::forward(std::span<const SeqChunk> batch, ForwardTrace* trace) {
  Batch b;
  b.row0.push_back(0);
  std::unordered_set<const KvState*> seen;
  for (size_t ci = 0; ci < batch.size(); ++ci) {
    const SeqChunk& ch = batch[ci];
    auto* st = dynamic_cast<Glm5State*>(ch.state);
    FP4MOE_CHECK(st != nullptr && st->owner_ == this)
        << "chunk " << ci << ": the KV state was not created by this GlmMoeDsaForCausalLM's new_state()";
    FP4MOE_CHECK(seen.insert(st).second) << "chunk " << ci << ": the same KV state appears twice in one batch";
    FP4MOE_CHECK(!ch.tokens.empty()) << "chunk " << ci << " has no tokens";
    FP4MOE_CHECK(ch.argmax == nullptr) << "batch entry " << ci << ": SeqChunk::argmax on a CPU model (supports_argmax() is false)";
    for (size_t i = 0; i < ch.tokens.size(); ++i) {
      FP4MOE_CHECK(ch.tokens[i] >= 0 && ch.tokens[i] < cfg_.vocab_size)
          << "chunk " << ci << " token " << i << " id " << ch.tokens[i] << " outside [0, " << cfg_.vocab_size << ")";
      b.pos.push_back(st->length() + static_cast<int64_t>(i));
    }
    b.states.push_back(st);
    b.row0.push_back(b.row0.back() + static_cast<int64_t>(ch.tokens.size()));
  }
  if (batch.empty()) return;
  const size_t half = inv_freq_.size();
  b.cos.resize(b.pos.size() * half);
  b.sin.resize(b.pos.size() * half);
  for (size_t r = 0; r < b.pos.size(); ++r) rope_cos_sin(inv_freq_, b.pos[r], b.cos.data() + r * half, b.sin.data() + r * half);
  try {
    forward_impl(batch, b, trace);
  } catch (...) {
    for (Glm5State* st : b.states) st->truncate(st->length());
    throw;
  }
  for (size_t ci = 0; ci < batch.size(); ++ci) b.states[ci]->length_ += static_cast<int64_t>(batch[ci].tokens.size());
}

void Glm5Model::check_finite(const Batch& b, const float* x, int64_t H, const char* what) {
  check_finite_rows(x, b.row0.back(), H, what, [&](int64_t row) { return b.entry_and_position(row); });
}

void Glm5Model::run_layer(const Glm5Layer& L, std::span<const SeqChunk> batch, const Batch& b,
                          std::vector<KeySelection>& shared_sel, std::vector<float>& h, std::vector<float>& xn,
                          std::vector<float>& y, ForwardTrace* trace) {
  const int64_t n = b.row0.back(), H = cfg_.hidden_size;
  // Part timings only when traced (the engine exports them as layer_seconds_total).
  using Clock = std::chrono::steady_clock;
  const Clock::time_point t_attn = trace ? Clock::now() : Clock::time_point{};
  rms_norm(h.data(), n, H, L.input_norm.data(), cfg_.rms_norm_eps, xn.data());
  attention(L, batch, b, xn.data(), shared_sel, y.data());
  check_finite(b, y.data(), H, "the attention output");
  for (size_t i = 0; i < h.size(); ++i) h[i] += y[i];
  const Clock::time_point t_mlp = trace ? Clock::now() : Clock::time_point{};
  if (trace)
    trace->layer_times.push_back({L.index, "attention", std::chrono::duration<double>(t_mlp - t_attn).count()});
  rms_norm(h.data(), n, H, L.post_norm.data(), cfg_.rms_norm_eps, xn.data());
  if (L.moe) {
    moe::MoeTrace mt;
    L.moe->forward(xn.data(), n, y.data(), trace ? &mt : nullptr);
    if (trace) trace->moe_layers.push_back({L.index, mt.plan.counts()});
  } else {
    moe::LinearInputObserver obs;
    if (observer_) {
      obs = [this](const std::string& m, const float* x, int64_t rows, int64_t cols) { observer_(m, x, rows, cols); };
    }
    L.dense->forward(xn.data(), n, y.data(), observer_ ? &obs : nullptr);
  }
  check_finite(b, y.data(), H, L.moe ? "the MoE output" : "the MLP output");
  for (size_t i = 0; i < h.size(); ++i) h[i] += y[i];
  if (trace) {
    trace->layer_times.push_back(
        {L.index, L.moe ? "moe" : "mlp", std::chrono::duration<double>(Clock::now() - t_mlp).count()});
  }
}

void Glm5Model::forward_impl(std::span<const SeqChunk> batch, const Batch& b, ForwardTrace* trace) {
  const int64_t n = b.row0.back(), H = cfg_.hidden_size;
  std::vector<int32_t> ids;
  for (const SeqChunk& ch : batch) ids.insert(ids.end(), ch.tokens.begin(), ch.tokens.end());
  std::vector<float> h(static_cast<size_t>(n * H)), xn(h.size()), y(h.size());
  const TensorView table{DType::kBF16, {cfg_.vocab_size, H},
                         {reinterpret_cast<const uint8_t*>(embed_.data()), embed_.size() * 2}};
  embedding_lookup(table, ids, h.data());

  std::vector<KeySelection> shared_sel(batch.size());
  for (const Glm5Layer& L : layers_) {
    try {
      run_layer(L, batch, b, shared_sel, h, xn, y, trace);
    } catch (const SequenceError& e) {
      throw SequenceError(e.entry(), "layer " + std::to_string(L.index) + ": " + e.what());
    } catch (const Error& e) {
      throw Error("layer " + std::to_string(L.index) + ": " + e.what());
    }
  }

  // Final norm and lm_head on the rows whose logits are wanted.
  std::vector<int64_t> rows;
  for (size_t ci = 0; ci < batch.size(); ++ci) {
    if (batch[ci].logits == nullptr) continue;
    for (int64_t r = batch[ci].all_logits ? b.row0[ci] : b.row0[ci + 1] - 1; r < b.row0[ci + 1]; ++r) rows.push_back(r);
  }
  if (rows.empty()) return;
  const int64_t m = static_cast<int64_t>(rows.size());
  std::vector<float> xf(static_cast<size_t>(m * H)), logits(static_cast<size_t>(m * cfg_.vocab_size));
  for (int64_t i = 0; i < m; ++i) {
    rms_norm(h.data() + rows[static_cast<size_t>(i)] * H, 1, H, final_norm_.data(), cfg_.rms_norm_eps,
             xf.data() + i * H);
  }
  linear(lm_head_, "lm_head", xf.data(), m, logits.data());
  // A non-finite final norm or lm_head gave NaN / Inf logits that sampled as token 0, silently.
  check_finite_rows(logits.data(), m, cfg_.vocab_size, "the logits (model.norm, lm_head)",
                    [&](int64_t k) { return b.entry_and_position(rows[static_cast<size_t>(k)]); });
  int64_t i = 0;
  for (size_t ci = 0; ci < batch.size(); ++ci) {
    if (batch[ci].logits == nullptr) continue;
    const int64_t k = batch[ci].all_logits ? b.row0[ci + 1] - b.row0[ci] : 1;
    std::copy(logits.begin() + i * cfg_.vocab_size, logits.begin() + (i + k) * cfg_.vocab_size, batch[ci].logits);
    i += k;
  }
}

size_t Glm5Model::weight_bytes() const {
  size_t bytes = embed_.size() * 2 + final_norm_.size() * 4 + static_cast<size_t>(lm_head_.weight_bytes());
  auto mlp_bytes = [](const moe::GatedMlp& m) {
    return static_cast<size_t>(m.gate.weight_bytes() + m.up.weight_bytes() + m.down.weight_bytes());
  };
  for (const Glm5Layer& L : layers_) {
    bytes += (L.input_norm.size() + L.post_norm.size() + L.q_a_norm.size() + L.kv_a_norm.size() + L.k_norm_w.size() +
              L.k_norm_b.size()) * 4;
    for (const LinearWeight* w : {&L.q_a_proj, &L.q_b_proj, &L.kv_a_proj, &L.o_proj, &L.wq_b, &L.wk, &L.weights_proj})
      bytes += static_cast<size_t>(w->weight_bytes());
    bytes += L.kv_b.size() * 4;
    if (L.dense) bytes += mlp_bytes(*L.dense);
    if (L.moe) {
      bytes += static_cast<size_t>(L.moe->router().weight_bytes()) + L.moe->correction_bias().size() * 4;
      for (const auto& e : L.moe->experts()) bytes += mlp_bytes(e);
      if (L.moe->shared()) bytes += mlp_bytes(*L.moe->shared());
    }
  }
  return bytes;
}

std::string Glm5Model::describe() const {
  std::ostringstream o;
  o << cfg_.summary() << "\n";
  o << "  MLA: heads " << cfg_.num_attention_heads << ", q_lora " << cfg_.q_lora_rank << ", kv_lora "
    << cfg_.kv_lora_rank << ", qk " << cfg_.qk_nope_head_dim << "+" << cfg_.qk_rope_head_dim << ", v "
    << cfg_.v_head_dim << ", RoPE " << (cfg_.rope_interleave ? "interleaved" : "half-split") << " theta "
    << cfg_.rope_theta << "; DSA indexer " << cfg_.index_n_heads << "x" << cfg_.index_head_dim << " top-"
    << cfg_.index_topk << "\n";
  o << "  embed_tokens BF16 [" << cfg_.vocab_size << ", " << cfg_.hidden_size << "], lm_head "
    << lm_head_.describe() << "\n";
  for (const Glm5Layer& L : layers_) {
    o << "  layer " << L.index << ": q_a " << L.q_a_proj.describe() << ", q_b " << L.q_b_proj.describe() << ", kv_a "
      << L.kv_a_proj.describe() << ", kv_b " << L.kv_b_format << " (kept as f32 for the absorbed form), o "
      << L.o_proj.describe();
    if (L.full_indexer) {
      o << ", indexer full (wq_b " << L.wq_b.describe() << ", wk " << L.wk.describe() << ")";
    } else {
      o << ", indexer shared";
    }
    if (L.dense) o << ", dense MLP " << L.dense->gate.describe();
    if (L.moe) {
      o << ", MoE " << L.moe->config().to_string();
      if (!L.moe->experts().empty()) o << " experts " << L.moe->experts()[0].gate.describe();
    }
    o << "\n";
  }
  return o.str();
}

}  // namespace

std::unique_ptr<CausalLM> create_glm_moe_dsa(const ModelConfig& config, const format::TensorStore& store,
                                             const LoadOptions& options) {
  return std::make_unique<Glm5Model>(config, store, options);
}

std::vector<WeightSpec> glm_moe_dsa_manifest(const ModelConfig& c) {
  const int64_t H = c.hidden_size, heads = c.num_attention_heads;
  std::vector<WeightSpec> m;
  m.push_back({"model.embed_tokens.weight", {c.vocab_size, H}, WeightRole::kEmbedding});
  m.push_back({"model.norm.weight", {H}, WeightRole::kNorm});
  if (!c.tie_word_embeddings) m.push_back({"lm_head", {c.vocab_size, H}, WeightRole::kLinearBF16});
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const std::string p = layer_prefix(l), a = p + ".self_attn";
    m.push_back({p + ".input_layernorm.weight", {H}, WeightRole::kNorm});
    m.push_back({p + ".post_attention_layernorm.weight", {H}, WeightRole::kNorm});
    m.push_back({a + ".q_a_proj", {c.q_lora_rank, H}, WeightRole::kLinear});
    m.push_back({a + ".q_a_layernorm.weight", {c.q_lora_rank}, WeightRole::kNorm});
    m.push_back({a + ".q_b_proj", {heads * c.qk_head_dim, c.q_lora_rank}, WeightRole::kLinear});
    m.push_back({a + ".kv_a_proj_with_mqa", {c.kv_lora_rank + c.qk_rope_head_dim, H}, WeightRole::kLinear});
    m.push_back({a + ".kv_a_layernorm.weight", {c.kv_lora_rank}, WeightRole::kNorm});
    m.push_back({a + ".kv_b_proj",
                 {heads * (c.qk_nope_head_dim + c.v_head_dim), c.kv_lora_rank},
                 WeightRole::kLinear,
                 /*gpu_gemm=*/false});
    m.push_back({a + ".o_proj", {H, heads * c.v_head_dim}, WeightRole::kLinear});
    if (c.attention_bias) {
      m.push_back({a + ".q_a_proj.bias", {c.q_lora_rank}, WeightRole::kBias});
      m.push_back({a + ".kv_a_proj_with_mqa.bias", {c.kv_lora_rank + c.qk_rope_head_dim}, WeightRole::kBias});
      m.push_back({a + ".o_proj.bias", {H}, WeightRole::kBias});
    }
    if (c.indexer_types[static_cast<size_t>(l)] == "full") {
      const std::string ix = a + ".indexer";
      m.push_back({ix + ".wq_b", {c.index_n_heads * c.index_head_dim, c.q_lora_rank}, WeightRole::kLinear});
      m.push_back({ix + ".wk", {c.index_head_dim, H}, WeightRole::kLinear});
      m.push_back({ix + ".k_norm.weight", {c.index_head_dim}, WeightRole::kNorm});
      m.push_back({ix + ".k_norm.bias", {c.index_head_dim}, WeightRole::kBias});
      m.push_back({ix + ".weights_proj", {c.index_n_heads, H}, WeightRole::kLinearBF16});
    }
    const std::string mlp = p + ".mlp";
    if (c.is_moe_layer(l)) {
      const int64_t I = c.moe_intermediate_size;
      m.push_back({mlp + ".gate", {c.n_routed_experts, H}, WeightRole::kLinearBF16});
      m.push_back({mlp + ".gate.e_score_correction_bias", {c.n_routed_experts}, WeightRole::kF32Bias});
      for (int64_t e = 0; e < c.n_routed_experts; ++e) {
        const std::string ex = mlp + ".experts." + std::to_string(e);
        m.push_back({ex + ".gate_proj", {I, H}, WeightRole::kLinear});
        m.push_back({ex + ".up_proj", {I, H}, WeightRole::kLinear});
        m.push_back({ex + ".down_proj", {H, I}, WeightRole::kLinear});
      }
      if (c.n_shared_experts > 0) {
        const int64_t Is = I * c.n_shared_experts;
        m.push_back({mlp + ".shared_experts.gate_proj", {Is, H}, WeightRole::kLinear});
        m.push_back({mlp + ".shared_experts.up_proj", {Is, H}, WeightRole::kLinear});
        m.push_back({mlp + ".shared_experts.down_proj", {H, Is}, WeightRole::kLinear});
      }
    } else {
      m.push_back({mlp + ".gate_proj", {c.intermediate_size, H}, WeightRole::kLinear});
      m.push_back({mlp + ".up_proj", {c.intermediate_size, H}, WeightRole::kLinear});
      m.push_back({mlp + ".down_proj", {H, c.intermediate_size}, WeightRole::kLinear});
    }
  }
  return m;
}

Architecture glm_moe_dsa_architecture() { return {create_glm_moe_dsa, glm_moe_dsa_manifest}; }

}  // namespace fp4moe::model
