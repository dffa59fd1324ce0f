// GlmMoeDsaForCausalLM (GLM-5) on the GPU (see gpu_models.h). Same weights and formulas as the CPU
// model (model/glm5.cpp), BF16 activations with f32 math inside the kernels:
//   h      = RMSNorm_in(x + previous block output)           (residual kept in bf16, as GLM-4.5 GPU)
//   q      = q_b_proj(RMSNorm_qa(q_a_proj(h)))                [T, heads, nope | rope], RoPE on rope dims
//   c | pe = kv_a_proj(h); c = RMSNorm_kva(c); RoPE on pe    -> the paged latent cache (mla_decode.h)
//   full indexer layers: k = RoPE(LayerNorm(wk(h))) -> the paged index-key cache (same block ids);
//     when some sequence is longer than index_topk: q_i = RoPE(wq_b(qa)), w = weights_proj(h) and
//     dsa_index_select_topk writes the CSR selection; "shared" layers reuse it (the previous full
//     layer's, as on the CPU);
//   MLA absorbed: q_lat = [W_UK^T q_nope | q_pe], attention over [c | pe] (mla_decode_attention for a
//     dense decode-only step, else mla_prefill_attention with the selection or dense causal), out =
//     W_UV latent, o_proj; then the dense MLP or the GPU MoE layer.
// The step protocol (one upload of the host ints, one sync for logits / argmax / error flag / trace)
// is the GLM-4.5 GPU model's (glm4_moe_cuda.cpp). Tested by tests/model/test_gpu_model.cpp (label
// gpu: golden glm5_tiny{,_nvfp4} logits, teacher-forced steps vs the CPU model, prefill+decode ==
// full forward, a sparse DSA selection, the argmax path).
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <sstream>

#include "core/dtype.h"
#include "core/error.h"
#include "kernels/cpu/linear.h"
#include "kernels/cuda/cublas_check.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/moe/device_buffer.h"
#include "kernels/cuda/ops/dsa_indexer.h"
#include "kernels/cuda/ops/layer_norm.h"
#include "kernels/cuda/ops/mla_decode.h"
#include "kernels/cuda/ops/mla_prefill.h"
#include "kernels/cuda/ops/norm_rope.h"
#include "kernels/cuda/sm90/w4a16_grouped_gemm.h"
#include "model/cuda/gpu_kv_cache.h"
#include "model/cuda/gpu_linear.h"
#include "model/cuda/gpu_models.h"
#include "model/cuda/gpu_step.h"
#include "model/dsa_indexer.h"
#include "model/glm5.h"
#include "model/mla.h"
#include "model/ops.h"
#include "model/weights.h"
#include "moe/gpu_moe_layer.h"
#include "moe/moe_layer.h"
#include "moe/weights.h"

namespace fp4moe::model {
namespace {

using cuda::DeviceBuffer;
using bf16 = __nv_bfloat16;

// HF builds q_a_layernorm / kv_a_layernorm with DeepseekV3RMSNorm's default eps and the indexer's
// k_norm as nn.LayerNorm(eps=1e-6); neither reads rms_norm_eps (as model/glm5.cpp).
constexpr float kLoraNormEps = 1e-6f;
constexpr float kIndexerKNormEps = 1e-6f;

struct GpuIndexer {
  GpuLinear wq_b, wk, weights_proj;
  DeviceBuffer k_norm_w, k_norm_b;  // f32 [index_head_dim]
  DeviceBuffer k_cache;             // [n_blocks, page, index_head_dim] bf16
};

struct Glm5GpuLayer {
  std::string prefix;
  DeviceBuffer input_norm, post_norm;  // f32 [H]
  GpuLinear q_a, q_b, kv_a, o;
  DeviceBuffer q_a_norm, kv_a_norm;  // f32 [q_lora], [kv_lora]
  DeviceBuffer kv_b;                 // bf16 [heads * (nope + v), kv_lora] (dequantized kv_b_proj)
  std::optional<GpuIndexer> indexer;  // "full" layers
  std::optional<gpu_step::GpuDenseMlp> mlp;  // dense MLP
  std::optional<moe::GpuMoeLayer> moe;
  DeviceBuffer latent_cache;  // [n_blocks, page, kv_lora + rope] bf16
};

using gpu_step::grow_bytes;

// One step's attention plan, the same for every layer (shared layers reuse the full layer's keys).
struct StepPlan {
  bool dsa = false;          // some sequence is longer than index_topk: select keys on full layers
  bool decode_kernel = false;  // decode-only and dense: mla_decode_attention
  cuda::DecodeSplit split;
  size_t attn_workspace = 0;
  int64_t n_selected = 0;
};

class Glm5CudaModel final : public GlmMoeDsaModel {
 public:
  Glm5CudaModel(const ModelConfig& config, const format::TensorStore& store, const LoadOptions& options);
  ~Glm5CudaModel() override { common_.synchronize(); }

  const ModelConfig& config() const override { return cfg_; }
  std::unique_ptr<KvState> new_state() const override {
    return std::make_unique<GpuKvState>(this, pool_, kv_bytes_per_token_);
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
  void set_dsa_observer(DsaSelectionObserver observer) override { dsa_observer_ = std::move(observer); }
  void set_dsa_selection_override(DsaSelectionOverride source) override { dsa_override_ = std::move(source); }

 private:
  // Device pointers of one step's host ints (see forward()).
  struct StepInts {
    const int32_t *pos, *slots, *q_start, *seq_lens, *tables, *sel_offsets;
    int64_t max_blocks, n_seqs, n_tokens, max_q_len, max_seq_len;
  };
  void run_layer(size_t l, const StepInts& s, const StepPlan& plan);
  // The selection hooks (tests): after layer l's selection (full layers, DSA steps) replace it with
  // the override's and report it to the observer; both synchronize the stream.
  void selection_hooks(size_t l, const StepPlan& plan);

  // Host copy of the step's rows for the hooks: per chunk its first row and query positions, the
  // CSR offsets of the selection (DSA steps) and the last full layer's selected keys.
  struct HostStep {
    std::vector<int64_t> row0;
    std::vector<std::vector<int64_t>> q_pos;
    std::vector<int32_t> sel_offsets;
    std::vector<int32_t> sel_idx;
  };
  HostStep host_step_;
  DsaSelectionObserver dsa_observer_;
  DsaSelectionOverride dsa_override_;

  ModelConfig cfg_;
  moe::MoeConfig moe_cfg_;
  GpuOptions gopt_;
  cuda::MlaDecodeDims mla_;
  cuda::DsaIndexerDims idx_;
  cuda::RopeStyle rope_style_ = cuda::RopeStyle::kInterleaved, index_rope_style_ = cuda::RopeStyle::kInterleaved;
  int64_t n_positions_ = 0, max_T_ = 0, kv_bytes_per_token_ = 0;
  gpu_step::ModelCommon common_;  // stream, cuBLAS, embedding, lm_head, outputs, events, graphs
  // The latent branch of each layer (kv_a_proj .. the latent cache append, and on full layers wk ..
  // the index-key cache append: both read only h) runs on kv_side_, forked from the stream after the
  // input norm and joined back before the indexer's selection and the attention, beside the q
  // branch (q_a_proj, its norm, q_b_proj, RoPE). Only when the branch's Linears run the W4A16 GEMM
  // (GpuLinear::w4a16_path): their split-K workspace is kv_splitk_, not the scratch the other
  // Linears share, and no cuBLAS handle is used on both streams. Capturable (event fork / join).
  std::optional<cuda::SideStream> kv_side_;
  std::shared_ptr<DeviceBuffer> kv_splitk_;
  DeviceBuffer cos_, sin_;  // f32 [n_positions, rope / 2]
  std::vector<Glm5GpuLayer> layers_;
  std::shared_ptr<KvBlockPool> pool_;
  int64_t weight_bytes_ = 0;
  std::string description_;
  std::string kv_pool_line_;  // describe_kv_pool()
  // Scratch for max_T_ tokens.
  DeviceBuffer resid_, h_, x_, qa_, q_, ckv_, q_lat_, latent_, proj_ws_, attn_, ik_, iq_, iw_, gate_, up_, act_;
  // Grown per step: the DSA selection and the workspaces.
  DeviceBuffer sel_idx_, dsa_workspace_, attn_workspace_;
};

Glm5CudaModel::Glm5CudaModel(const ModelConfig& config, const format::TensorStore& store, const LoadOptions& options)
    : cfg_(config), gopt_(options.gpu) {
  const ModelConfig& c = cfg_;
  FP4MOE_CHECK(c.q_lora_rank > 0) << c.source << ": q_lora_rank=" << c.q_lora_rank
                                  << "; GlmMoeDsaForCausalLM needs the q LoRA (q_a_proj/q_b_proj)";
  FP4MOE_CHECK(c.rope_type == "default") << c.source << ": rope_type \"" << c.rope_type
                                         << "\" is not implemented for GlmMoeDsaForCausalLM (only \"default\")";
  FP4MOE_CHECK((c.kv_lora_rank == 32 || c.kv_lora_rank == 64 || c.kv_lora_rank == 128 || c.kv_lora_rank == 256 ||
                c.kv_lora_rank == 512) &&
               c.qk_rope_head_dim >= 2 && c.qk_rope_head_dim <= 128 && c.qk_rope_head_dim % 2 == 0 &&
               c.qk_nope_head_dim >= 1 && c.v_head_dim >= 1)
      << c.source << ": MLA dims kv_lora_rank=" << c.kv_lora_rank << " (GPU: 32, 64, 128, 256 or 512), qk_rope_head_dim="
      << c.qk_rope_head_dim << " (even, <= 128), qk_nope_head_dim=" << c.qk_nope_head_dim << ", v_head_dim="
      << c.v_head_dim << " are not supported by the GPU MLA kernels";
  FP4MOE_CHECK(c.index_topk > 0 && c.index_n_heads > 0 &&
               (c.index_head_dim == 32 || c.index_head_dim == 64 || c.index_head_dim == 128 || c.index_head_dim == 256) &&
               c.index_head_dim >= c.qk_rope_head_dim)
      << c.source << ": indexer dims index_topk=" << c.index_topk << ", index_n_heads=" << c.index_n_heads
      << ", index_head_dim=" << c.index_head_dim << " (GPU: 32, 64, 128 or 256, >= qk_rope_head_dim "
      << c.qk_rope_head_dim << ")";
  FP4MOE_CHECK(static_cast<int64_t>(c.indexer_types.size()) == c.num_hidden_layers &&
               (c.num_hidden_layers == 0 || c.indexer_types[0] == "full"))
      << c.source << ": indexer_types must list " << c.num_hidden_layers << " layers starting with \"full\"";
  FP4MOE_CHECK(c.hidden_size % 8 == 0) << c.source << ": hidden_size " << c.hidden_size
                                       << " must be a multiple of 8 on the GPU";
  FP4MOE_CHECK(gopt_.max_tokens_per_step >= 1 && gopt_.kv_tokens >= 1 && gopt_.page_size >= 1)
      << "GPU model options: max_tokens_per_step=" << gopt_.max_tokens_per_step << " kv_tokens=" << gopt_.kv_tokens
      << " page_size=" << gopt_.page_size << " (all must be >= 1)";
  std::string why;
  FP4MOE_CHECK(cuda::cuda_device_available(&why)) << "--device cuda: no usable GPU (" << why << ")";

  const MlaDims md{static_cast<int>(c.num_attention_heads), static_cast<int>(c.kv_lora_rank),
                   static_cast<int>(c.qk_nope_head_dim), static_cast<int>(c.qk_rope_head_dim),
                   static_cast<int>(c.v_head_dim)};
  mla_ = {md.n_heads, md.kv_lora_rank, md.qk_nope_head_dim, md.qk_rope_head_dim, md.v_head_dim, md.softmax_scale()};
  const IndexerDims id{static_cast<int>(c.index_n_heads), static_cast<int>(c.index_head_dim),
                       static_cast<int>(c.qk_rope_head_dim), static_cast<int>(c.index_topk)};
  idx_ = {id.n_heads, id.head_dim, c.index_topk, id.softmax_scale(), id.weight_scale()};
  rope_style_ = c.rope_interleave ? cuda::RopeStyle::kInterleaved : cuda::RopeStyle::kNeox;
  index_rope_style_ = c.indexer_rope_interleave ? cuda::RopeStyle::kInterleaved : cuda::RopeStyle::kNeox;
  moe_cfg_ = c.moe_config();
  max_T_ = gopt_.max_tokens_per_step;
  const int64_t H = c.hidden_size, V = c.vocab_size, heads = c.num_attention_heads;
  const int64_t R = c.kv_lora_rank, rope = c.qk_rope_head_dim, latent_w = R + rope;

  common_.open();

  const std::vector<uint64_t> layer_bytes = layer_tensor_bytes(store, c.num_hidden_layers);
  uint64_t total = 0;
  for (uint64_t b : layer_bytes) total += b;
  LoadProgress progress(store.dir().filename().string(), total, options.progress);
  const bool fp4 = gopt_.nvfp4_kernels;

  weight_bytes_ += common_.load_embedding(store, V, H);
  std::ostringstream desc;
  desc << c.summary() << " on the GPU (" << cuda::cuda_device_description(common_.device) << ")\n";
  desc << "  MLA: heads " << heads << ", q_lora " << c.q_lora_rank << ", kv_lora " << R << ", qk " << c.qk_nope_head_dim
       << "+" << rope << ", v " << c.v_head_dim << "; DSA indexer " << c.index_n_heads << "x" << c.index_head_dim
       << " top-" << c.index_topk << "\n";
  layers_.resize(static_cast<size_t>(c.num_hidden_layers));
  std::shared_ptr<moe::GpuMoeWorkspace> moe_ws;  // one set of MoE transient buffers for every layer
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    Glm5GpuLayer& L = layers_[static_cast<size_t>(l)];
    L.prefix = "model.layers." + std::to_string(l);
    const std::string a = L.prefix + ".self_attn.";
    L.input_norm = DeviceBuffer::from_host(load_vector_f32(store, L.prefix + ".input_layernorm.weight", H));
    L.post_norm = DeviceBuffer::from_host(load_vector_f32(store, L.prefix + ".post_attention_layernorm.weight", H));
    L.q_a = GpuLinear::upload(moe::load_linear(store, a + "q_a_proj", c.q_lora_rank, H, c.attention_bias), max_T_,
                              a + "q_a_proj", fp4);
    L.q_a_norm = DeviceBuffer::from_host(load_vector_f32(store, a + "q_a_layernorm.weight", c.q_lora_rank));
    L.q_b = GpuLinear::upload(moe::load_linear(store, a + "q_b_proj", heads * c.qk_head_dim, c.q_lora_rank), max_T_,
                              a + "q_b_proj", fp4);
    L.kv_a = GpuLinear::upload(moe::load_linear(store, a + "kv_a_proj_with_mqa", latent_w, H, c.attention_bias),
                               max_T_, a + "kv_a_proj_with_mqa", fp4);
    L.kv_a_norm = DeviceBuffer::from_host(load_vector_f32(store, a + "kv_a_layernorm.weight", R));
    std::string kv_b_format;
    {
      const kernels::cpu::LinearWeight kv_b =
          moe::load_linear(store, a + "kv_b_proj", heads * (c.qk_nope_head_dim + c.v_head_dim), R);
      const std::vector<float> f = kernels::cpu::dequantize(kv_b);
      std::vector<uint16_t> b(f.size());
      for (size_t i = 0; i < f.size(); ++i) b[i] = f32_to_bf16(f[i]);
      L.kv_b = DeviceBuffer::from_host(b);
      kv_b_format = kv_b.describe();
    }
    L.o = GpuLinear::upload(moe::load_linear(store, a + "o_proj", H, heads * c.v_head_dim, c.attention_bias), max_T_,
                            a + "o_proj", fp4);
    weight_bytes_ += L.q_a.device_bytes() + L.q_b.device_bytes() + L.kv_a.device_bytes() + L.o.device_bytes() +
                     static_cast<int64_t>(L.kv_b.bytes());
    desc << "  " << L.prefix << ": q_a " << L.q_a.describe() << ", q_b " << L.q_b.describe() << ", kv_a "
         << L.kv_a.describe() << ", kv_b " << kv_b_format << " (bf16 on the device, absorbed), o " << L.o.describe();
    if (c.indexer_types[static_cast<size_t>(l)] == "full") {
      const std::string ix = a + "indexer.";
      GpuIndexer g;
      g.wq_b = GpuLinear::upload(moe::load_linear(store, ix + "wq_b", c.index_n_heads * c.index_head_dim, c.q_lora_rank),
                                 max_T_, ix + "wq_b", fp4);
      g.wk = GpuLinear::upload(moe::load_linear(store, ix + "wk", c.index_head_dim, H), max_T_, ix + "wk", fp4);
      g.weights_proj = GpuLinear::upload(moe::load_linear(store, ix + "weights_proj", c.index_n_heads, H), max_T_,
                                         ix + "weights_proj", fp4);
      g.k_norm_w = DeviceBuffer::from_host(load_vector_f32(store, ix + "k_norm.weight", c.index_head_dim));
      g.k_norm_b = DeviceBuffer::from_host(load_vector_f32(store, ix + "k_norm.bias", c.index_head_dim));
      weight_bytes_ += g.wq_b.device_bytes() + g.wk.device_bytes() + g.weights_proj.device_bytes();
      desc << ", indexer full (wq_b " << g.wq_b.describe() << ", wk " << g.wk.describe() << ")";
      L.indexer = std::move(g);
    } else {
      desc << ", indexer shared";
    }
    desc << "; ";
    weight_bytes_ += gpu_step::load_ffn(store, L.prefix, c.is_moe_layer(l), moe_cfg_, H, c.intermediate_size,
                                        max_T_, fp4, moe_ws, L.mlp, L.moe, desc);
    desc << "\n";
    kv_bytes_per_token_ += latent_w * 2 + (L.indexer ? c.index_head_dim * 2 : 0);
    progress.advance(layer_bytes[static_cast<size_t>(l)]);
  }
  weight_bytes_ += common_.load_head(store, H, c.tie_word_embeddings);
  progress.advance(layer_bytes.back());
  progress.finish();

  // RoPE table (qk_rope_head_dim, shared by MLA and the indexer) for every position the config allows.
  n_positions_ = c.max_position_embeddings;
  gpu_step::rope_tables(rope, c.rope_theta, n_positions_, cos_, sin_);

  int64_t inter = 8;
  for (const Glm5GpuLayer& L : layers_) {
    if (L.mlp) inter = std::max(inter, L.mlp->gate.out_features());
  }
  const auto bf16s = [this](int64_t per_token) { return static_cast<size_t>(max_T_ * per_token) * 2; };
  const auto f32s = [this](int64_t per_token) { return static_cast<size_t>(max_T_ * per_token) * 4; };
  resid_ = DeviceBuffer(bf16s(H));
  h_ = DeviceBuffer(bf16s(H));
  x_ = DeviceBuffer(bf16s(H));
  qa_ = DeviceBuffer(bf16s(c.q_lora_rank));
  q_ = DeviceBuffer(bf16s(heads * c.qk_head_dim));
  ckv_ = DeviceBuffer(bf16s(latent_w));
  q_lat_ = DeviceBuffer(f32s(heads * latent_w));
  latent_ = DeviceBuffer(f32s(heads * R));
  proj_ws_ = DeviceBuffer(cuda::mla_project_v_workspace_bytes(max_T_, mla_));
  attn_ = DeviceBuffer(bf16s(heads * c.v_head_dim));
  ik_ = DeviceBuffer(bf16s(c.index_head_dim));
  iq_ = DeviceBuffer(bf16s(c.index_n_heads * c.index_head_dim));
  iw_ = DeviceBuffer(bf16s(c.index_n_heads));
  gate_ = DeviceBuffer(bf16s(inter));
  up_ = DeviceBuffer(bf16s(inter));
  act_ = DeviceBuffer(bf16s(inter));
  std::vector<GpuLinear*> dense_linears;  // every Linear but the lm_head (the MoE layers hold their own)
  for (Glm5GpuLayer& L : layers_) {
    for (GpuLinear* g : {&L.q_a, &L.q_b, &L.kv_a, &L.o}) dense_linears.push_back(g);
    if (L.indexer) {
      for (GpuLinear* g : {&L.indexer->wq_b, &L.indexer->wk, &L.indexer->weights_proj}) dense_linears.push_back(g);
    }
    if (L.mlp) {
      for (GpuLinear* g : L.mlp->linears()) dense_linears.push_back(g);
    }
  }
  // One dequantization scratch for the NVFP4 Linears' prefill path (gpu_linear.h).
  desc << describe_dequant_scratch(share_dequant_scratch(dense_linears));
  {  // the latent branch's own split-K workspace and stream (see kv_side_)
    std::vector<GpuLinear*> branch;
    for (Glm5GpuLayer& L : layers_) {
      branch.push_back(&L.kv_a);
      if (L.indexer) branch.push_back(&L.indexer->wk);
    }
    int64_t widest = 0;
    for (const GpuLinear* g : branch) {
      if (g->path() == GpuLinear::Path::kNvfp4W4A16) widest = std::max(widest, g->out_features());
    }
    if (widest > 0) {  // K parts x rows below the dequantization threshold x out, f32
      const int64_t rows = std::min<int64_t>(max_T_, kLinearDequantMinRows - 1);
      kv_splitk_ = std::make_shared<DeviceBuffer>(static_cast<size_t>(cuda::sm90::kW4A16MaxSplitK * rows * widest) * 4);
      for (GpuLinear* g : branch) g->set_splitk_workspace(kv_splitk_);
      kv_side_.emplace();
      desc << "  latent branch (kv_a, indexer wk) on a second stream beside the q branch at decode sizes (< "
           << kLinearDequantMinRows << " rows; split-K workspace " << kv_splitk_->bytes() << " B)\n";
    }
  }
  desc << gpu_step::use_tune_cache(layers_, dense_linears);
  desc << gpu_step::time_moe_gemms(layers_, gopt_.time_moe_gemms);
  common_.finish_load(layers_, gopt_, max_T_);
  // The KV cache last: sized from GPU memory, it gets what the weights and buffers leave.
  std::string kv_note;
  int64_t n_cache_buffers = 0;  // a latent cache a layer, an index-key cache a full layer
  for (const Glm5GpuLayer& L : layers_) n_cache_buffers += L.indexer ? 2 : 1;
  pool_ = common_.make_kv_pool(gopt_, kv_bytes_per_token_, n_cache_buffers, kv_note);
  const int64_t pool_tokens = pool_->n_blocks() * gopt_.page_size;
  size_t cache_bytes_total = 0;
  for (Glm5GpuLayer& L : layers_) {
    L.latent_cache = DeviceBuffer(static_cast<size_t>(pool_tokens * latent_w) * 2);
    cache_bytes_total += L.latent_cache.bytes();
    if (L.indexer) {
      L.indexer->k_cache = DeviceBuffer(static_cast<size_t>(pool_tokens * c.index_head_dim) * 2);
      cache_bytes_total += L.indexer->k_cache.bytes();
    }
  }
  desc << common_.describe_lm_head();
  {
    std::ostringstream kv;
    kv << "KV cache: " << pool_->n_blocks() << " blocks x " << gopt_.page_size << " tokens (latent " << latent_w
       << " + index key " << c.index_head_dim << " on full layers, bf16: " << cache_bytes_total << " B)" << kv_note;
    kv_pool_line_ = kv.str();
  }
  desc << "  " << kv_pool_line_ << ", max " << max_T_ << " tokens per step\n";
  desc << "  " << common_.describe_graphs() << "\n";
  desc << "  weights on the device: " << weight_bytes_ << " B";
  description_ = desc.str();
  FP4MOE_CUDA_CHECK(cudaDeviceSynchronize());
}

void Glm5CudaModel::run_layer(size_t l, const StepInts& s, const StepPlan& plan) {
  Glm5GpuLayer& L = layers_[l];
  cudaStream_t st = common_.stream.get();
  cublasHandle_t cb = common_.cublas.get();
  const ModelConfig& c = cfg_;
  const int64_t T = s.n_tokens, H = c.hidden_size;
  const int64_t R = c.kv_lora_rank, rope = c.qk_rope_head_dim, latent_w = R + rope;
  const int64_t ih = c.index_n_heads, idim = c.index_head_dim, ql = c.q_lora_rank;
  bf16* resid = resid_.as<bf16>();
  bf16* h = h_.as<bf16>();
  bf16* x = x_.as<bf16>();  // the previous block's output (attention or MLP), added into resid by the norm
  uint32_t* err = common_.out->error_flag();
  const float* cos = cos_.as<float>();
  const float* sin = sin_.as<float>();

  cuda::record_timing_event(common_.events[2 * l].get(), st);
  if (l == 0) {
    cuda::rms_norm_bf16(resid, nullptr, L.input_norm.as<float>(), T, H, H, c.rms_norm_eps, h, st);
  } else {
    cuda::rms_norm_bf16(x, resid, L.input_norm.as<float>(), T, H, H, c.rms_norm_eps, h, st);
  }
  // The latent branch (see kv_side_): on kv_side_ when its Linears run the W4A16 GEMM at T rows.
  const bool side = kv_side_ && L.kv_a.w4a16_path(T) && (!L.indexer || L.indexer->wk.w4a16_path(T));
  const cudaStream_t ks = side ? kv_side_->fork(st) : st;
  // Latent: kv_a_proj -> [c_kv | k_pe] rows; kv_a_layernorm on c_kv, RoPE on k_pe, both into the cache
  // (one launch).
  bf16* ckv = ckv_.as<bf16>();
  L.kv_a.forward(cb, h, T, ckv, ks);
  const cuda::MlaCacheView cache{L.latent_cache.as<bf16>(), pool_->n_blocks(), pool_->page_size(),
                                 static_cast<int>(R), static_cast<int>(rope)};
  const cuda::RopeAngles angles{s.pos, cos, sin, n_positions_, rope_style_};
  const cuda::MlaLatentNormRope latent_nr{L.kv_a_norm.as<float>(), kLoraNormEps, angles};
  cuda::mla_latent_norm_rope_append(ckv, latent_w, T, latent_nr, s.slots, cache, err, ks);
  // DSA indexer (full layers): the key of every new token is cached.
  if (L.indexer) {
    GpuIndexer& g = *L.indexer;
    bf16* ik = ik_.as<bf16>();
    g.wk.forward(cb, h, T, ik, ks);
    // k_norm (LayerNorm) and RoPE on dims [0, rope), both into the index-key cache (one launch).
    const cuda::DsaIndexCacheView kc{g.k_cache.as<bf16>(), DType::kBF16, pool_->n_blocks(), pool_->page_size(),
                                     static_cast<int>(idim)};
    const cuda::DsaKeyNormRope key_nr{g.k_norm_w.as<float>(), g.k_norm_b.as<float>(), kIndexerKNormEps,
                                      static_cast<int>(rope),
                                      cuda::RopeAngles{s.pos, cos, sin, n_positions_, index_rope_style_}};
    cuda::dsa_index_key_norm_rope_append(ik, idim, T, key_nr, s.slots, kc, err, ks);
  }

  // q: q_a_proj -> q_a_layernorm (in place) -> q_b_proj; the RoPE of dims [nope, nope + rope) of each head is
  // mla_absorb_q's (below).
  bf16* qa = qa_.as<bf16>();
  bf16* q = q_.as<bf16>();
  L.q_a.forward(cb, h, T, qa, st);
  cuda::rms_norm_bf16(qa, nullptr, L.q_a_norm.as<float>(), T, ql, ql, kLoraNormEps, qa, st);
  L.q_b.forward(cb, qa, T, q, st);
  if (side) kv_side_->join(st);

  // DSA selection (full layers, when some sequence is longer than index_topk) over the cached keys.
  if (L.indexer) {
    GpuIndexer& g = *L.indexer;
    const cuda::DsaIndexCacheView kc{g.k_cache.as<bf16>(), DType::kBF16, pool_->n_blocks(), pool_->page_size(),
                                     static_cast<int>(idim)};
    if (plan.dsa) {
      bf16* iq = iq_.as<bf16>();
      bf16* iw = iw_.as<bf16>();
      g.wq_b.forward(cb, qa, T, iq, st);
      cuda::rope_bf16(iq, T, ih, ih * idim, idim, 0, rope, index_rope_style_, s.pos, cos, sin, n_positions_, err, st);
      g.weights_proj.forward(cb, h, T, iw, st);  // unscaled: the kernel folds in n_heads^-0.5
      cuda::DsaIndexerArgs ia;
      ia.q = iq;
      ia.w = iw;
      ia.cache = kc;
      ia.block_table = s.tables;
      ia.max_blocks_per_seq = s.max_blocks;
      ia.seq_lens = s.seq_lens;
      ia.q_start = s.q_start;
      ia.n_seqs = s.n_seqs;
      ia.n_tokens = T;
      ia.max_q_len = s.max_q_len;
      ia.max_seq_len = s.max_seq_len;
      ia.sel_offsets = s.sel_offsets;
      ia.n_selected = plan.n_selected;
      ia.sel_idx = sel_idx_.as<int32_t>();
      ia.error_flag = err;
      cuda::dsa_index_select_topk(ia, idx_, dsa_workspace_.as<float>(), dsa_workspace_.bytes(), st);
    }
  }
  selection_hooks(l, plan);

  // MLA, absorbed: q_lat rows, attention over the latent cache, W_UV, o_proj.
  float* q_lat = q_lat_.as<float>();
  float* latent = latent_.as<float>();
  float* ws = plan.split.n_splits > 1 ? attn_workspace_.as<float>() : nullptr;
  const cuda::MlaQRope q_rope{angles, err};
  cuda::mla_absorb_q(q, L.kv_b.as<bf16>(), mla_, T, q_lat, cb, st, &q_rope);
  bool parts_ready = false;  // the attention wrote mla_project_v's bf16 parts itself
  if (plan.decode_kernel) {
    // One query row per sequence (T == n_seqs), dense causal over all of its keys.
    parts_ready =
        cuda::mla_decode_attention(q_lat, cache, s.tables, s.max_blocks, s.seq_lens, s.n_seqs, mla_, plan.split, ws,
                                   latent, err, st, cuda::mla_project_v_parts(proj_ws_.as<void>(), T, mla_));
  } else {
    cuda::MlaPrefillArgs pa;
    pa.q_lat = q_lat;
    pa.cache = cache;
    pa.block_table = s.tables;
    pa.max_blocks_per_seq = s.max_blocks;
    pa.seq_lens = s.seq_lens;
    pa.q_start = s.q_start;
    pa.n_seqs = s.n_seqs;
    pa.n_tokens = T;
    pa.max_q_len = s.max_q_len;
    if (plan.dsa) {  // this step's selection, made by this layer or the last full layer before it
      pa.sel_offsets = s.sel_offsets;
      pa.sel_idx = sel_idx_.as<int32_t>();
      pa.n_selected = plan.n_selected;
    }
    pa.latent = latent;
    pa.error_flag = err;
    cuda::mla_prefill_attention(pa, mla_, plan.split, ws, st);
  }
  cuda::mla_project_v(latent, L.kv_b.as<bf16>(), mla_, T, proj_ws_.as<void>(), attn_.as<bf16>(), cb, st, parts_ready);
  L.o.forward(cb, attn_.as<bf16>(), T, x, st);
  cuda::record_timing_event(common_.events[2 * l + 1].get(), st);

  cuda::rms_norm_bf16(x, resid, L.post_norm.as<float>(), T, H, H, c.rms_norm_eps, h, st);
  if (L.moe) {
    L.moe->forward(h, T, x, st);
  } else {
    L.mlp->forward(cb, h, T, gate_.as<bf16>(), up_.as<bf16>(), act_.as<bf16>(), x, st);
  }
}

void Glm5CudaModel::selection_hooks(size_t l, const StepPlan& plan) {
  if (!dsa_observer_ && !dsa_override_) return;
  const bool full = layers_[l].indexer.has_value();
  HostStep& hs = host_step_;
  const auto layer = static_cast<int64_t>(l);
  if (full && plan.dsa) {
    const size_t n = static_cast<size_t>(plan.n_selected);
    hs.sel_idx.resize(n);
    FP4MOE_CUDA_CHECK(cudaMemcpyAsync(hs.sel_idx.data(), sel_idx_.as<int32_t>(), n * 4, cudaMemcpyDeviceToHost,
                                      common_.stream.get()));
    FP4MOE_CUDA_CHECK(cudaStreamSynchronize(common_.stream.get()));
    if (dsa_override_) {
      for (size_t ci = 0; ci < hs.q_pos.size(); ++ci) {
        const KeySelection keys = dsa_override_(layer, ci, hs.q_pos[ci]);
        check_key_selection(keys, hs.q_pos[ci], cfg_.index_topk,
                            "layer " + std::to_string(l) + " chunk " + std::to_string(ci) +
                                ": the DSA selection override");
        // Same per-query counts as the step's offsets (both min(index_topk, pos + 1)).
        std::copy(keys.idx.begin(), keys.idx.end(),
                  hs.sel_idx.begin() + hs.sel_offsets[static_cast<size_t>(hs.row0[ci])]);
      }
      FP4MOE_CUDA_CHECK(cudaMemcpyAsync(sel_idx_.as<int32_t>(), hs.sel_idx.data(), n * 4, cudaMemcpyHostToDevice,
                                        common_.stream.get()));
      FP4MOE_CUDA_CHECK(cudaStreamSynchronize(common_.stream.get()));
    }
  }
  if (!dsa_observer_) return;
  for (size_t ci = 0; ci < hs.q_pos.size(); ++ci) {
    const std::vector<int64_t>& q_pos = hs.q_pos[ci];
    KeySelection keys;
    keys.offsets.push_back(0);
    for (size_t i = 0; i < q_pos.size(); ++i) {
      if (plan.dsa) {  // the selection the attention used (this layer's or the last full layer's)
        const size_t row = static_cast<size_t>(hs.row0[ci]) + i;
        keys.idx.insert(keys.idx.end(), hs.sel_idx.begin() + hs.sel_offsets[row],
                        hs.sel_idx.begin() + hs.sel_offsets[row + 1]);
      } else {  // every query keeps all its causal keys (the CPU reports that explicitly, too)
        for (int64_t k = 0; k <= q_pos[i]; ++k) keys.idx.push_back(static_cast<int32_t>(k));
      }
      keys.offsets.push_back(static_cast<int64_t>(keys.idx.size()));
    }
    dsa_observer_(layer, ci, q_pos, keys, !full);
  }
}

void Glm5CudaModel::forward(std::span<const SeqChunk> batch, ForwardTrace* trace) {
  const gpu_step::StepBatch step = gpu_step::plan_step(batch, this, cfg_.vocab_size, n_positions_, max_T_);
  if (step.chunks.empty()) return;
  const int64_t T = step.n_tokens, S = static_cast<int64_t>(step.chunks.size());
  // KV blocks for the new tokens (all or nothing); one block table serves every layer's pools.
  common_.with_blocks(step, [&] {
    const int64_t max_blocks = gpu_step::max_blocks(step.chunks);
    const int64_t max_len = step.max_seq_len;
    const int64_t R = static_cast<int64_t>(step.rows.size());

    // The step's attention plan. DSA selection only when some query has more causal keys than
    // index_topk (else every query keeps all of them: dense, as the CPU's explicit full selection).
    StepPlan plan;
    plan.dsa = max_len > cfg_.index_topk;
    plan.decode_kernel = step.decode_only && !plan.dsa;
    // A dense decode step whose every row goes through the lm_head runs as a captured graph of its
    // padded shape (gpu_step::DecodeGraphs), unless the selection hooks (tests) want the host.
    const bool hooks = dsa_observer_ || dsa_override_;
    const int64_t gbs =
        plan.decode_kernel && !hooks && R == S && common_.moe_layers.capturable ? common_.graphs->batch_bucket(S) : 0;
    const int64_t S_run = gbs > 0 ? gbs : S, T_run = gbs > 0 ? gbs : T, R_run = gbs > 0 ? gbs : R;
    const int64_t mb_run = gbs > 0 ? gpu_step::DecodeGraphs::table_bucket(max_blocks) : max_blocks;
    const int64_t len_run = gbs > 0 ? mb_run * gopt_.page_size : max_len;  // keys the split is planned for

    std::vector<int32_t> sel_offsets;
    if (plan.dsa) {  // the selection's CSR offsets from each sequence's query rows and length
      std::vector<int32_t> h_qs_v(static_cast<size_t>(S + 1)), h_len_v(static_cast<size_t>(S));
      h_qs_v[0] = 0;
      for (size_t i = 0; i < step.chunks.size(); ++i) {
        h_qs_v[i + 1] = static_cast<int32_t>(step.chunks[i].row0 + step.chunks[i].n);
        h_len_v[i] = static_cast<int32_t>(step.chunks[i].pos0 + step.chunks[i].n);
      }
      sel_offsets = cuda::dsa_selection_offsets(h_len_v, h_qs_v, cfg_.index_topk);
      plan.n_selected = sel_offsets.back();
    }
    if (plan.decode_kernel) {
      plan.split =
          cuda::plan_mla_decode_split(S_run, mla_.n_heads, len_run, common_.n_sms, gopt_.decode_split_min_keys);
      plan.attn_workspace = cuda::mla_decode_workspace_bytes(S_run, mla_, plan.split);
    } else {
      const int64_t max_keys = plan.dsa ? std::min<int64_t>(cfg_.index_topk, max_len) : max_len;
      // A DSA decode step (one query per sequence) splits by --decode-split-min-keys like a dense decode step, for
      // the prefill kernel's CTA (2 an SM, 32-key tiles).
      plan.split = step.decode_only ? cuda::plan_mla_prefill_split(T, mla_.n_heads, max_keys, common_.n_sms,
                                                                   gopt_.decode_split_min_keys)
                                    : cuda::plan_mla_prefill_split(T, mla_.n_heads, max_keys, common_.n_sms);
      plan.attn_workspace = cuda::mla_prefill_workspace_bytes(T, mla_, plan.split);
    }
    // Grown while the stream is idle (the previous step ended with a sync); a graph that baked in
    // the old buffer is dropped.
    if (plan.split.n_splits > 1 && attn_workspace_.bytes() < plan.attn_workspace) {
      grow_bytes(attn_workspace_, plan.attn_workspace);
      common_.graphs->clear();
    }
    if (plan.dsa) {
      grow_bytes(sel_idx_, static_cast<size_t>(plan.n_selected) * 4);
      grow_bytes(dsa_workspace_, cuda::dsa_index_workspace_bytes(S, step.max_q_len, max_len));
    }

    // The step's ints as run (padded for a graph), the DSA selection offsets after them.
    const gpu_step::StepIntsLayout lay{T_run, S_run, mb_run, R_run, static_cast<int64_t>(sel_offsets.size())};
    const auto layers = [&](const int32_t* di) {
      StepInts s;
      s.pos = di + lay.positions();
      s.slots = di + lay.slots();
      s.q_start = di + lay.q_start();
      s.seq_lens = di + lay.seq_lens();
      s.tables = di + lay.tables();
      s.sel_offsets = plan.dsa ? di + lay.extra() : nullptr;
      s.max_blocks = mb_run;
      s.n_seqs = S_run;
      s.n_tokens = T_run;
      s.max_q_len = step.max_q_len;
      s.max_seq_len = len_run;
      for (size_t l = 0; l < layers_.size(); ++l) run_layer(l, s, plan);
    };

    if (hooks) {
      host_step_.row0.clear();
      host_step_.q_pos.clear();
      for (const gpu_step::Chunk& c : step.chunks) {
        host_step_.row0.push_back(c.row0);
        std::vector<int64_t> pos(static_cast<size_t>(c.n));
        for (int64_t i = 0; i < c.n; ++i) pos[static_cast<size_t>(i)] = c.pos0 + i;
        host_step_.q_pos.push_back(std::move(pos));
      }
      host_step_.sel_offsets = sel_offsets;
    }
    const gpu_step::ModelCommon::Activations act{resid_.as<bf16>(), h_.as<bf16>(), x_.as<bf16>(), cfg_.hidden_size,
                                                 cfg_.rms_norm_eps};
    common_.run(batch, step, gbs, lay, sel_offsets, act, layers, moe_cfg_.n_experts, trace);
  });
}

}  // namespace

std::unique_ptr<CausalLM> create_glm5_cuda(const ModelConfig& config, const format::TensorStore& store,
                                           const LoadOptions& options) {
  return std::make_unique<Glm5CudaModel>(config, store, options);
}

}  // namespace fp4moe::model
