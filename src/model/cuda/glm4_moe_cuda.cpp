// Glm4MoeForCausalLM on the GPU (see gpu_models.h). Same weights and formulas as the CPU model
// (model/glm4_moe.cpp), BF16 activations: the residual stream is kept in bf16 and each RMSNorm adds
// the previous block's output into it (rms_norm_bf16 with a residual). Tested by
// tests/model/test_gpu_model.cpp.
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <sstream>

#include "core/dtype.h"
#include "core/error.h"
#include "kernels/cuda/cublas_check.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/moe/device_buffer.h"
#include "kernels/cuda/ops/norm_rope.h"
#include "kernels/cuda/ops/paged_attention.h"
#include "model/cuda/gpu_kv_cache.h"
#include "model/cuda/gpu_linear.h"
#include "model/cuda/gpu_models.h"
#include "model/cuda/gpu_step.h"
#include "model/glm4_moe.h"
#include "model/ops.h"
#include "model/weights.h"
#include "moe/gpu_moe_layer.h"
#include "moe/moe_layer.h"
#include "moe/weights.h"

namespace fp4moe::model {
namespace {

using cuda::DeviceBuffer;
using bf16 = __nv_bfloat16;

constexpr size_t kDecodeWorkspaceBytes = size_t{64} << 20;  // split-K attention workspace

struct GpuAttention {
  GpuLinear q, k, v, o;
  DeviceBuffer q_norm, k_norm;  // f32 [head_dim] when use_qk_norm
};

struct GpuLayer {
  std::string prefix;
  DeviceBuffer input_norm, post_norm;  // f32 [H]
  GpuAttention attn;
  std::optional<gpu_step::GpuDenseMlp> mlp;  // dense MLP
  std::optional<moe::GpuMoeLayer> moe;
  DeviceBuffer k_cache, v_cache;  // [n_blocks, page, n_kv, D] bf16
};

class Glm4MoeCudaModel final : public CausalLM {
 public:
  Glm4MoeCudaModel(const ModelConfig& config, const format::TensorStore& store, const LoadOptions& options);
  ~Glm4MoeCudaModel() override { common_.synchronize(); }

  const ModelConfig& config() const override { return cfg_; }
  std::unique_ptr<KvState> new_state() const override {
    return std::make_unique<GpuKvState>(this, pool_, kv_bytes_per_token());
  }
  void forward(std::span<const SeqChunk> batch, ForwardTrace* trace) override;
  bool supports_argmax() const override { return true; }
  void set_linear_observer(LinearInputObserver observer) override {
    FP4MOE_CHECK(!observer) << "the GPU model has no Linear input observer (calibrate with --device cpu)";
  }
  size_t weight_bytes() const override { return static_cast<size_t>(weight_bytes_); }
  int64_t kv_pool_tokens() const override { return pool_->n_blocks() * pool_->page_size(); }
  std::string describe_kv_pool() const override { return kv_pool_line_; }
  std::string describe() const override { return description_; }

 private:
  int64_t kv_bytes_per_token() const { return 2 * cfg_.num_hidden_layers * cfg_.num_key_value_heads * cfg_.head_dim * 2; }
  // Device pointers of one step's host ints (see forward()) and the step's shape as run.
  struct StepInts {
    const int32_t *pos, *slots, *q_start, *seq_lens, *tables;
    int64_t max_blocks, n_seqs, n_tokens, max_q_len, max_seq_len;
    bool decode_only;
  };
  void run_layer(size_t l, const StepInts& s);

  ModelConfig cfg_;
  moe::MoeConfig moe_cfg_;
  GpuOptions gopt_;
  int64_t rotary_dim_ = 0, n_positions_ = 0, max_T_ = 0;
  gpu_step::ModelCommon common_;  // stream, cuBLAS, embedding, lm_head, outputs, events, graphs
  DeviceBuffer cos_, sin_;        // f32 [n_positions, rotary / 2]
  std::vector<GpuLayer> layers_;
  std::shared_ptr<KvBlockPool> pool_;
  int64_t weight_bytes_ = 0;
  std::string description_;
  std::string kv_pool_line_;  // describe_kv_pool()
  // Scratch for max_T_ tokens.
  DeviceBuffer resid_, h_, x_, q_, k_, v_, attn_, gate_, up_, act_, workspace_;
};

Glm4MoeCudaModel::Glm4MoeCudaModel(const ModelConfig& config, const format::TensorStore& store,
                                   const LoadOptions& options)
    : cfg_(config), gopt_(options.gpu) {
  FP4MOE_CHECK(cfg_.rope_type == "default") << cfg_.source << ": rope_type \"" << cfg_.rope_type
                                            << "\" is not implemented (only \"default\")";
  FP4MOE_CHECK(gopt_.max_tokens_per_step >= 1 && gopt_.kv_tokens >= 1 && gopt_.page_size >= 1)
      << "GPU model options: max_tokens_per_step=" << gopt_.max_tokens_per_step << " kv_tokens=" << gopt_.kv_tokens
      << " page_size=" << gopt_.page_size << " (all must be >= 1)";
  std::string why;
  FP4MOE_CHECK(cuda::cuda_device_available(&why)) << "--device cuda: no usable GPU (" << why << ")";
  moe_cfg_ = cfg_.moe_config();
  rotary_dim_ = cfg_.rotary_dim();
  max_T_ = gopt_.max_tokens_per_step;
  const int64_t H = cfg_.hidden_size, D = cfg_.head_dim, V = cfg_.vocab_size;
  const int64_t n_q = cfg_.num_attention_heads * D, n_kv = cfg_.num_key_value_heads * D;
  FP4MOE_CHECK(D % 32 == 0 && D >= 32 && D <= 128)
      << cfg_.source << ": head_dim " << D << " is not supported by the GPU attention (a multiple of 32 in [32, 128])";
  FP4MOE_CHECK(H % 8 == 0) << cfg_.source << ": hidden_size " << H << " must be a multiple of 8 on the GPU";

  common_.open();

  const std::vector<uint64_t> layer_bytes = layer_tensor_bytes(store, cfg_.num_hidden_layers);
  uint64_t total = 0;
  for (uint64_t b : layer_bytes) total += b;
  LoadProgress progress(store.dir().filename().string(), total, options.progress);
  const bool fp4 = gopt_.nvfp4_kernels;

  weight_bytes_ += common_.load_embedding(store, V, H);
  std::ostringstream desc;
  desc << cfg_.summary() << " on the GPU (" << cuda::cuda_device_description(common_.device) << ")\n";
  layers_.resize(static_cast<size_t>(cfg_.num_hidden_layers));
  std::shared_ptr<moe::GpuMoeWorkspace> moe_ws;  // one set of MoE transient buffers for every layer
  for (int64_t l = 0; l < cfg_.num_hidden_layers; ++l) {
    GpuLayer& L = layers_[static_cast<size_t>(l)];
    L.prefix = "model.layers." + std::to_string(l);
    const std::string a = L.prefix + ".self_attn.";
    L.input_norm = DeviceBuffer::from_host(load_vector_f32(store, L.prefix + ".input_layernorm.weight", H));
    L.post_norm = DeviceBuffer::from_host(load_vector_f32(store, L.prefix + ".post_attention_layernorm.weight", H));
    L.attn.q = GpuLinear::upload(moe::load_linear(store, a + "q_proj", n_q, H, cfg_.attention_bias), max_T_, a + "q_proj", fp4);
    L.attn.k = GpuLinear::upload(moe::load_linear(store, a + "k_proj", n_kv, H, cfg_.attention_bias), max_T_, a + "k_proj", fp4);
    L.attn.v = GpuLinear::upload(moe::load_linear(store, a + "v_proj", n_kv, H, cfg_.attention_bias), max_T_, a + "v_proj", fp4);
    L.attn.o = GpuLinear::upload(moe::load_linear(store, a + "o_proj", H, n_q, false), max_T_, a + "o_proj", fp4);
    if (cfg_.use_qk_norm) {
      L.attn.q_norm = DeviceBuffer::from_host(load_vector_f32(store, a + "q_norm.weight", D));
      L.attn.k_norm = DeviceBuffer::from_host(load_vector_f32(store, a + "k_norm.weight", D));
    }
    desc << "  " << L.prefix << ": q " << L.attn.q.describe() << ", k " << L.attn.k.describe() << ", v "
         << L.attn.v.describe() << ", o " << L.attn.o.describe() << "; ";
    weight_bytes_ += L.attn.q.device_bytes() + L.attn.k.device_bytes() + L.attn.v.device_bytes() + L.attn.o.device_bytes();
    weight_bytes_ += gpu_step::load_ffn(store, L.prefix, cfg_.is_moe_layer(l), moe_cfg_, H, cfg_.intermediate_size,
                                        max_T_, fp4, moe_ws, L.mlp, L.moe, desc);
    desc << "\n";
    progress.advance(layer_bytes[static_cast<size_t>(l)]);
  }
  weight_bytes_ += common_.load_head(store, H, cfg_.tie_word_embeddings);
  progress.advance(layer_bytes.back());
  progress.finish();

  // RoPE table for every position the config allows.
  n_positions_ = cfg_.max_position_embeddings;
  gpu_step::rope_tables(rotary_dim_, cfg_.rope_theta, n_positions_, cos_, sin_);

  int64_t inter = 1;
  for (const GpuLayer& L : layers_) {
    if (L.mlp) inter = std::max(inter, L.mlp->gate.out_features());
  }
  const auto bf16s = [](int64_t n) { return static_cast<size_t>(n) * 2; };
  resid_ = DeviceBuffer(bf16s(max_T_ * H));
  h_ = DeviceBuffer(bf16s(max_T_ * H));
  x_ = DeviceBuffer(bf16s(max_T_ * H));
  q_ = DeviceBuffer(bf16s(max_T_ * n_q));
  k_ = DeviceBuffer(bf16s(max_T_ * n_kv));
  v_ = DeviceBuffer(bf16s(max_T_ * n_kv));
  attn_ = DeviceBuffer(bf16s(max_T_ * n_q));
  gate_ = DeviceBuffer(bf16s(max_T_ * inter));
  up_ = DeviceBuffer(bf16s(max_T_ * inter));
  act_ = DeviceBuffer(bf16s(max_T_ * inter));
  std::vector<GpuLinear*> dense_linears;  // every Linear but the lm_head (the MoE layers hold their own)
  for (GpuLayer& L : layers_) {
    for (GpuLinear* g : {&L.attn.q, &L.attn.k, &L.attn.v, &L.attn.o}) dense_linears.push_back(g);
    if (L.mlp) {
      for (GpuLinear* g : L.mlp->linears()) dense_linears.push_back(g);
    }
  }
  // One dequantization scratch for the NVFP4 Linears' prefill path (gpu_linear.h).
  desc << describe_dequant_scratch(share_dequant_scratch(dense_linears));
  desc << gpu_step::use_tune_cache(layers_, dense_linears);
  desc << gpu_step::time_moe_gemms(layers_, gopt_.time_moe_gemms);
  common_.finish_load(layers_, gopt_, max_T_);
  workspace_ = DeviceBuffer(kDecodeWorkspaceBytes);
  // The KV cache last: sized from GPU memory, it gets what the weights and buffers leave.
  std::string kv_note;
  pool_ = common_.make_kv_pool(gopt_, kv_bytes_per_token(), 2 * static_cast<int64_t>(layers_.size()), kv_note);
  const size_t cache_bytes = static_cast<size_t>(pool_->n_blocks() * gopt_.page_size * n_kv) * 2;
  for (GpuLayer& L : layers_) {
    L.k_cache = DeviceBuffer(cache_bytes);
    L.v_cache = DeviceBuffer(cache_bytes);
  }
  desc << common_.describe_lm_head();
  kv_pool_line_ = "KV cache: " + std::to_string(pool_->n_blocks()) + " blocks x " + std::to_string(gopt_.page_size) +
                  " tokens (" + std::to_string(cache_bytes * 2 * layers_.size()) + " B)" + kv_note;
  desc << "  " << kv_pool_line_ << ", max " << max_T_ << " tokens per step\n";
  desc << "  " << common_.describe_graphs() << "\n";
  desc << "  weights on the device: " << weight_bytes_ << " B";
  description_ = desc.str();
  FP4MOE_CUDA_CHECK(cudaDeviceSynchronize());
}

void Glm4MoeCudaModel::run_layer(size_t l, const StepInts& s) {
  GpuLayer& L = layers_[l];
  const int64_t T = s.n_tokens, n_seqs = s.n_seqs, max_blocks = s.max_blocks, max_seq_len = s.max_seq_len;
  const int32_t *d_pos = s.pos, *d_slots = s.slots, *d_seq_lens = s.seq_lens, *d_tables = s.tables;
  cudaStream_t st = common_.stream.get();
  cublasHandle_t cb = common_.cublas.get();
  const int64_t H = cfg_.hidden_size, D = cfg_.head_dim;
  const int64_t nh = cfg_.num_attention_heads, nkv = cfg_.num_key_value_heads;
  const float eps = cfg_.rms_norm_eps;
  bf16* resid = resid_.as<bf16>();
  bf16* h = h_.as<bf16>();
  bf16* x = x_.as<bf16>();  // the previous block's output (attention or MLP), added into resid by the norm
  uint32_t* err = common_.out->error_flag();

  cuda::record_timing_event(common_.events[2 * l].get(), st);
  if (l == 0) {
    cuda::rms_norm_bf16(resid, nullptr, L.input_norm.as<float>(), T, H, H, eps, h, st);
  } else {
    cuda::rms_norm_bf16(x, resid, L.input_norm.as<float>(), T, H, H, eps, h, st);
  }
  bf16* q = q_.as<bf16>();
  bf16* k = k_.as<bf16>();
  bf16* v = v_.as<bf16>();
  L.attn.q.forward(cb, h, T, q, st);
  L.attn.k.forward(cb, h, T, k, st);
  L.attn.v.forward(cb, h, T, v, st);
  if (cfg_.use_qk_norm) {
    cuda::rms_norm_bf16(q, nullptr, L.attn.q_norm.as<float>(), T * nh, D, D, eps, q, st);
    cuda::rms_norm_bf16(k, nullptr, L.attn.k_norm.as<float>(), T * nkv, D, D, eps, k, st);
  }
  cuda::rope_bf16(q, T, nh, nh * D, D, 0, rotary_dim_, cuda::RopeStyle::kNeox, d_pos, cos_.as<float>(),
                  sin_.as<float>(), n_positions_, err, st);
  cuda::rope_bf16(k, T, nkv, nkv * D, D, 0, rotary_dim_, cuda::RopeStyle::kNeox, d_pos, cos_.as<float>(),
                  sin_.as<float>(), n_positions_, err, st);
  cuda::PagedKvCacheView cache{L.k_cache.as<bf16>(), L.v_cache.as<bf16>(), pool_->n_blocks(), pool_->page_size(), nkv, D};
  cuda::kv_cache_append_bf16(k, nkv * D, v, nkv * D, T, d_slots, cache, err, st);

  cuda::PagedAttentionArgs args;
  args.q = q;
  args.cache = cache;
  args.block_table = d_tables;
  args.max_blocks_per_seq = max_blocks;
  args.seq_lens = d_seq_lens;
  args.n_seqs = n_seqs;
  args.n_heads = nh;
  args.scale = 1.0f / std::sqrt(static_cast<float>(D));
  args.out = attn_.as<bf16>();
  args.error_flag = err;
  if (s.decode_only) {
    cuda::DecodeSplit split =
        cuda::plan_decode_split(n_seqs, nh, nkv, max_seq_len, common_.n_sms, gopt_.decode_split_min_keys);
    split = cuda::cap_decode_split(split, n_seqs, nh, D, max_seq_len, workspace_.bytes());
    cuda::paged_attention_decode_bf16(args, split, workspace_.as<float>(), st);
  } else {
    cuda::paged_attention_prefill_bf16(args, s.q_start, T, s.max_q_len, st);
  }
  L.attn.o.forward(cb, attn_.as<bf16>(), T, x, st);
  cuda::record_timing_event(common_.events[2 * l + 1].get(), st);

  cuda::rms_norm_bf16(x, resid, L.post_norm.as<float>(), T, H, H, eps, h, st);
  if (L.moe) {
    L.moe->forward(h, T, x, st);
  } else {
    L.mlp->forward(cb, h, T, gate_.as<bf16>(), up_.as<bf16>(), act_.as<bf16>(), x, st);
  }
}

void Glm4MoeCudaModel::forward(std::span<const SeqChunk> batch, ForwardTrace* trace) {
  const gpu_step::StepBatch step = gpu_step::plan_step(batch, this, cfg_.vocab_size, n_positions_, max_T_);
  if (step.chunks.empty()) return;
  const int64_t T = step.n_tokens, S = static_cast<int64_t>(step.chunks.size());
  common_.with_blocks(step, [&] {
    const int64_t max_blocks = gpu_step::max_blocks(step.chunks);
    const int64_t R = static_cast<int64_t>(step.rows.size());
    // A decode step whose every row goes through the lm_head runs as a captured graph of its padded
    // shape (gpu_step::DecodeGraphs): S_run sequences, tables of mb_run blocks, the attention split
    // planned for mb_run pages of keys.
    const int64_t gbs =
        step.decode_only && R == S && common_.moe_layers.capturable ? common_.graphs->batch_bucket(S) : 0;
    const int64_t S_run = gbs > 0 ? gbs : S, T_run = gbs > 0 ? gbs : T, R_run = gbs > 0 ? gbs : R;
    const int64_t mb_run = gbs > 0 ? gpu_step::DecodeGraphs::table_bucket(max_blocks) : max_blocks;
    const int64_t len_run = gbs > 0 ? mb_run * gopt_.page_size : step.max_seq_len;

    const gpu_step::StepIntsLayout lay{T_run, S_run, mb_run, R_run, 0};  // the step's ints as run
    const auto layers = [&](const int32_t* di) {
      StepInts s;
      s.pos = di + lay.positions();
      s.slots = di + lay.slots();
      s.q_start = di + lay.q_start();
      s.seq_lens = di + lay.seq_lens();
      s.tables = di + lay.tables();
      s.max_blocks = mb_run;
      s.n_seqs = S_run;
      s.n_tokens = T_run;
      s.max_q_len = step.max_q_len;
      s.max_seq_len = len_run;
      s.decode_only = step.decode_only;
      for (size_t l = 0; l < layers_.size(); ++l) run_layer(l, s);
    };
    const gpu_step::ModelCommon::Activations act{resid_.as<bf16>(), h_.as<bf16>(), x_.as<bf16>(), cfg_.hidden_size,
                                                 cfg_.rms_norm_eps};
    common_.run(batch, step, gbs, lay, {}, act, layers, moe_cfg_.n_experts, trace);
  });
}

}  // namespace

std::unique_ptr<CausalLM> create_glm4_moe_cuda(const ModelConfig& config, const format::TensorStore& store,
                                               const LoadOptions& options) {
  return std::make_unique<Glm4MoeCudaModel>(config, store, options);
}

void register_gpu_models() {
  register_cuda_factory(kArchGlm4Moe, create_glm4_moe_cuda);
  register_cuda_factory(kArchGlmMoeDsa, create_glm5_cuda);
}

}  // namespace fp4moe::model
