// What every GPU model's forward step shares (glm4_moe_cuda.cpp, glm5_cuda.cpp): the batch checks and
// row layout, the all-or-nothing KV block reservation, the host ints every step stages, the dense
// gated MLP, and the step's outputs (lm_head passes with the device argmax, the error flag, the
// per-expert counts copied without a sync, then one sync and the delivery into the SeqChunks); and
// ModelCommon, what both models own alike (stream, cuBLAS handle, embedding, final norm, lm_head,
// timing events, decode graphs) with the step around their layers.
// Tested through tests/model/test_gpu_model.cpp (both GPU models).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <iosfwd>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "format/safetensors.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_handles.h"
#include "kernels/cuda/moe/device_buffer.h"
#include "kernels/cuda/ops/sampling.h"
#include "model/causal_lm.h"
#include "model/cuda/gpu_kv_cache.h"
#include "model/cuda/gpu_linear.h"
#include "model/registry.h"
#include "moe/gpu_moe_layer.h"
#include "tune/tune_cache.h"

struct cublasContext;

namespace fp4moe::model::gpu_step {

struct CublasDeleter {
  void operator()(cublasContext* h) const;
};
struct PinnedDeleter {
  void operator()(void* p) const { cudaFreeHost(p); }
};
using cuda::EventDeleter;
using cuda::StreamDeleter;

// A pinned host buffer of T, grown on demand.
template <typename T>
class PinnedBuffer {
 public:
  T* get(size_t n) {
    if (n > cap_) {
      void* p = nullptr;
      FP4MOE_CUDA_CHECK(cudaMallocHost(&p, std::max<size_t>(n, 64) * sizeof(T)));
      ptr_.reset(p);
      cap_ = std::max<size_t>(n, 64);
    }
    return static_cast<T*>(ptr_.get());
  }

 private:
  std::unique_ptr<void, PinnedDeleter> ptr_;
  size_t cap_ = 0;
};

// A device buffer of at least n bytes (contents not kept; grown between steps, when the stream is idle).
void* grow_bytes(cuda::DeviceBuffer& b, size_t n);

// One sequence's share of the step: its state and where its tokens sit in the step's rows.
struct Chunk {
  GpuKvState* state = nullptr;
  int64_t row0 = 0, n = 0, pos0 = 0;
};

struct StepBatch {
  std::vector<Chunk> chunks;
  int64_t n_tokens = 0;
  int64_t max_q_len = 0, max_seq_len = 0;
  bool decode_only = true;  // every chunk one token
  // Token rows through the lm_head, in batch order: the chunks that want logits (all rows or the
  // last) or only the argmax of their last row; n_logit_rows of them are copied to the host.
  std::vector<int32_t> rows;
  std::vector<uint8_t> row_logits;
  int64_t n_logit_rows = 0;
  // Rows (indices into `rows`, ascending) whose token is sampled on the device, and how.
  std::vector<int64_t> sample_rows;
  std::vector<DeviceSampling> samples;
};

// Checks the batch (states of `owner`, distinct, non-empty, ids in the vocabulary, positions within
// n_positions, at most max_tokens tokens) naming the entry and the numbers, and lays out its rows.
StepBatch plan_step(std::span<const SeqChunk> batch, const void* owner, int64_t vocab, int64_t n_positions,
                    int64_t max_tokens);

// The KV blocks of the step's new tokens, all or nothing: returns the blocks each chunk took.
std::vector<int64_t> reserve_blocks(const std::vector<Chunk>& chunks);
void rollback_blocks(const std::vector<Chunk>& chunks, const std::vector<int64_t>& added);
int64_t max_blocks(const std::vector<Chunk>& chunks);  // >= 1

// The host ints of one step as run (padded to n_seqs sequences and tables of max_blocks blocks for a
// graph), in one buffer uploaded with one copy: tokens [T] | positions [T] | slots [T] |
// q_start [S + 1] | seq_lens [S] | tables [S, max_blocks] (-1 padded) | rows [R] (the lm_head's) |
// extra [n_extra] (GLM-5: the DSA selection offsets).
struct StepIntsLayout {
  int64_t n_tokens = 0, n_seqs = 0, max_blocks = 0, n_rows = 0, n_extra = 0;
  int64_t positions() const { return n_tokens; }
  int64_t slots() const { return 2 * n_tokens; }
  int64_t q_start() const { return 3 * n_tokens; }
  int64_t seq_lens() const { return q_start() + n_seqs + 1; }
  int64_t tables() const { return seq_lens() + n_seqs; }
  int64_t rows() const { return tables() + n_seqs * max_blocks; }
  int64_t extra() const { return rows() + n_rows; }
  size_t size() const { return static_cast<size_t>(extra() + n_extra); }
};

// Writes `step` into out[layout.size()]: its chunks, then layout.n_seqs - chunks padding sequences
// (empty: token 0, position 0, slot -1, one q row, seq_len 0, tables -1), the step's lm_head rows then
// padding rows up to layout.n_rows (each its own index), and `extra`.
void stage_step_ints(std::span<const SeqChunk> batch, const StepBatch& step, const StepIntsLayout& layout,
                     std::span<const int32_t> extra, int32_t* out);

// down(silu(gate(h)) * up(h)) with the given scratch ([T, I] each).
struct GpuDenseMlp {
  GpuLinear gate, up, down;
  std::vector<GpuLinear*> linears() { return {&gate, &up, &down}; }
  void forward(cublasContext* cublas, const __nv_bfloat16* h, int64_t n_tokens, __nv_bfloat16* gate_buf,
               __nv_bfloat16* up_buf, __nv_bfloat16* act, __nv_bfloat16* out, cudaStream_t stream) const;
};

// Loads `prefix`.mlp for max_tokens tokens a step into `moe` or `mlp` (a layer's feed-forward
// block): an MoE layer of moe_cfg when `is_moe` (NVFP4 experts on the W4A16 GEMM when
// `nvfp4_kernels`; a shape that GEMM refuses, named in `desc`, and BF16 experts on cuBLAS), else a
// dense gated MLP of `intermediate` (NVFP4 Linears on the W4A16 GEMM when `nvfp4_kernels`). Appends
// "MoE ..." or "dense MLP gate ..., up ..., down ..." to `desc` (the load log) and returns the bytes
// it put on the device (MoE: every expert, the shared one, the router). `moe_ws`: the MoE transient
// buffers every layer shares (null before the first MoE layer, which makes them).
int64_t load_ffn(const format::TensorStore& store, const std::string& prefix, bool is_moe, const moe::MoeConfig& moe_cfg,
                 int64_t hidden, int64_t intermediate, int64_t max_tokens, bool nvfp4_kernels,
                 std::shared_ptr<moe::GpuMoeWorkspace>& moe_ws, std::optional<GpuDenseMlp>& mlp,
                 std::optional<moe::GpuMoeLayer>& moe, std::ostream& desc);

// After a step, with non_finite[r] the NaN / Inf flag of the logits of step.rows[r] (cuda::argmax_rows): fails
// when a row is flagged, naming the batch entry and position of the first (model::fail_non_finite: a SequenceError
// when the flagged rows are all one entry's, so the engine fails that request alone; else an Error).
void check_finite_logits(const StepBatch& step, const uint32_t* non_finite);

// The step's outputs. Per step: copy_expert_offsets (optional), run_lm_head, then finish (the one sync).
// A captured decode step (DecodeGraphs) runs lm_head_pass inside its graph and copy_outputs after it.
class StepOutputs {
 public:
  static constexpr int64_t kLogitRowsPerPass = 256;  // lm_head rows per f32 logits pass

  // max_rows: the most rows one step sends through the lm_head (the device argmax buffer is sized
  // once, so a captured graph's pointer to it stays valid).
  StepOutputs(int64_t vocab, int64_t max_rows);
  uint32_t* error_flag() const { return err_.as<uint32_t>(); }

  // Copies each MoE layer's expert offsets [E + 1] to the host, asynchronously (traces).
  void copy_expert_offsets(const std::vector<const int32_t*>& d_offsets, int64_t n_experts, cudaStream_t stream);
  // The step's rows of h [T, hidden] (rows d_rows, gathered into `scratch`, >= kLogitRowsPerPass rows)
  // through the lm_head (f32, cuBLAS), their argmax on the device, and the logits rows the host wants.
  void run_lm_head(cublasContext* cublas, const GpuLinear& lm_head, const __nv_bfloat16* h, const int32_t* d_rows,
                   const StepBatch& step, int64_t hidden, __nv_bfloat16* scratch, cudaStream_t stream);
  // One pass of run_lm_head without the copies: rows d_rows[0, n) (n <= kLogitRowsPerPass) -> the
  // f32 logits [n, V] and the argmax of each on the device. Capturable.
  void lm_head_pass(cublasContext* cublas, const GpuLinear& lm_head, const __nv_bfloat16* h, const int32_t* d_rows,
                    int64_t n, int64_t hidden, __nv_bfloat16* scratch, cudaStream_t stream);
  // After one lm_head_pass over at least the step's rows (step.rows.size() <= kLogitRowsPerPass):
  // copies the logits rows and argmaxes the step wants to the host (asynchronously; finish reads them).
  void copy_outputs(const StepBatch& step, cudaStream_t stream);
  // Synchronizes, fails naming the device errors (and clears the flag) or the sequence whose logits
  // hold a NaN or Inf (check_finite_logits), writes the logits and argmaxes into the batch, and
  // appends the per-expert counts of `moe_layers` to the trace.
  void finish(std::span<const SeqChunk> batch, const StepBatch& step, const std::vector<size_t>& moe_layers,
              ForwardTrace* trace, cudaStream_t stream);

 private:
  // Copies the rows [r0, r0 + n) of the last pass that want logits, after `logit_row` rows copied before.
  // Rows d_rows[r0, r0 + n) (n <= kLogitRowsPerPass) -> logits_ [n, V], their argmax at argmax_[r0..] and
  // their NaN / Inf flags at non_finite_[r0..].
  void compute_pass(cublasContext* cublas, const GpuLinear& lm_head, const __nv_bfloat16* h, const int32_t* d_rows,
                    int64_t r0, int64_t n, int64_t hidden, __nv_bfloat16* scratch, cudaStream_t stream);
  void copy_pass_logits(const StepBatch& step, int64_t r0, int64_t n, int64_t& logit_row, cudaStream_t stream);
  void copy_argmax(int64_t n_rows, cudaStream_t stream);
  // The step's device-sampling specs to the device (once a step, before the passes).
  void upload_samples(const StepBatch& step, cudaStream_t stream);
  // After pass [r0, r0 + n) is in logits_: draws its sampled rows' tokens over their argmax.
  void sample_pass(const StepBatch& step, int64_t r0, int64_t n, cudaStream_t stream);

  int64_t vocab_;
  cuda::DeviceBuffer logits_, argmax_, argmax_parts_, err_;  // argmax_parts_: the split argmax's candidates
  cuda::DeviceBuffer non_finite_;                            // [max rows] each lm_head row's NaN / Inf flag
  cuda::DeviceBuffer sample_specs_;                           // [max rows] cuda::SampleSpec
  PinnedBuffer<cuda::SampleSpec> h_sample_specs_;
  PinnedBuffer<float> h_logits_;
  PinnedBuffer<int32_t> h_argmax_, h_offsets_;
  PinnedBuffer<uint32_t> h_err_, h_non_finite_;
  int64_t n_experts_ = 0;
  bool offsets_copied_ = false;
};


// Binds the model's stream and a fixed cuBLAS workspace of kCublasWorkspaceBytes to `cublas` (once,
// at construction: the GEMM calls keep the binding, see cuda::cublas_bind_stream), so that cuBLAS
// never allocates while a decode step is being captured.
inline constexpr size_t kCublasWorkspaceBytes = size_t{32} << 20;
void bind_cublas(cublasContext* cublas, cudaStream_t stream, cuda::DeviceBuffer& workspace);

// Captured decode steps (issue #7, `--cuda-graph-max-bs`). A decode-only step of S sequences runs as
// the CUDA graph of its key: the batch bucket (the smallest of 1, 2, 4, 8, 16, 24, ... (multiples of
// 8) >= S, up to max_bs) and the table bucket (block tables padded to a power of two >= the longest,
// which also fixes the attention's key split). The S_pad - S padding sequences are empty: token 0,
// position 0, KV slot -1 (not written), seq_len 0 (the attention kernels write zeros; stage_step_ints)
// and their rows go through the lm_head unread. A graph is captured the first time its key is met (from the same
// code as the eager step) and owns its input ints: the host stages them, one copy uploads them
// before the launch. A capture that fails (a call that cannot be captured) turns graphs off for the
// model with the reason (warning on stderr) and the step runs eagerly, so no request is lost.
// Models call clear() when they reallocate a buffer a graph baked in.
class DecodeGraphs {
 public:
  explicit DecodeGraphs(int64_t max_bs = 0);
  ~DecodeGraphs();
  DecodeGraphs(const DecodeGraphs&) = delete;
  DecodeGraphs& operator=(const DecodeGraphs&) = delete;

  // The graphs of a model: batches up to min(cuda_graph_max_bs, max_tokens_per_step, one lm_head pass).
  static std::unique_ptr<DecodeGraphs> for_model(int64_t cuda_graph_max_bs, int64_t max_tokens_per_step);

  bool enabled() const { return max_bs_ > 0 && disabled_reason_.empty(); }
  // The padded batch size of n_seqs sequences, 0 when graphs are off or n_seqs > max_bs.
  int64_t batch_bucket(int64_t n_seqs) const;
  static int64_t table_bucket(int64_t max_blocks);  // next power of two >= max(max_blocks, 1)
  const std::vector<int64_t>& batch_buckets() const { return buckets_; }

  // Uploads `host_ints` [n_ints] to the graph's input buffer and launches the graph of (bs, tb) on
  // `stream`, first capturing record(d_ints) when the key is new (record issues the step's device
  // work, reading its inputs from d_ints). False when the capture failed: graphs are then off
  // (disabled_reason()) and nothing was launched.
  bool launch(int64_t bs, int64_t tb, const int32_t* host_ints, size_t n_ints, cudaStream_t stream,
              const std::function<void(const int32_t* d_ints)>& record);
  void clear();
  size_t n_captured() const { return graphs_.size(); }
  const std::string& disabled_reason() const { return disabled_reason_; }

 private:
  struct Graph;
  int64_t max_bs_ = 0;
  std::vector<int64_t> buckets_;
  std::map<std::pair<int64_t, int64_t>, std::unique_ptr<Graph>> graphs_;
  std::string disabled_reason_;
};

// A step's device work, in the pieces run_step needs: `body` issues embedding .. final norm reading
// the step's ints from d_ints; `lm_head_pass` the single capturable lm_head pass of a padded decode
// step; `run_lm_head` the eager lm_head (passes and copies) of any other step.
struct StepWork {
  std::function<void(const int32_t* d_ints)> body, lm_head_pass, run_lm_head;
};

// Runs the work: as the graph of (bs, table_bucket) when bs > 0 (captured first when new); when bs
// is 0, or the capture failed, eagerly after uploading host_ints into `ints` (a padded step keeps
// its single lm_head pass). Returns whether a graph ran.
bool run_step(DecodeGraphs& graphs, int64_t bs, int64_t table_bucket, const int32_t* host_ints, size_t n_ints,
              cuda::DeviceBuffer& ints, const StepWork& work, cudaStream_t stream);

// A model's MoE layers, fixed at load: which layers are MoE (per-layer times), their device expert
// offsets [E + 1] (per-expert counts for traces; each buffer lives as long as its layer) and whether
// every one can be captured in a graph (the BF16 layer reads its offsets on the host).
struct MoeLayerList {
  std::vector<bool> is_moe;             // [layers]
  std::vector<size_t> layers;           // the MoE layers' indices
  std::vector<const int32_t*> offsets;  // and their device expert offsets
  std::vector<const moe::GpuMoeLayer*> gpu_layers;  // and the layers (their last GEMM times for traces)
  bool capturable = true;

  // Layer: any struct with `std::optional<moe::GpuMoeLayer> moe`.
  template <typename Layer>
  static MoeLayerList of(const std::vector<Layer>& model_layers) {
    MoeLayerList m;
    for (size_t l = 0; l < model_layers.size(); ++l) {
      const auto& moe = model_layers[l].moe;
      m.is_moe.push_back(moe.has_value());
      if (!moe) continue;
      m.layers.push_back(l);
      m.offsets.push_back(moe->device_expert_offsets());
      m.gpu_layers.push_back(&*moe);
      m.capturable = m.capturable && moe->capturable();
    }
    return m;
  }
};

// The W4A16 config chooser of a GPU model's NVFP4 MoE layers and dense Linears, which is how the
// engine loads the tune cache at start: `fp4moe tune`'s winners at tune::default_cache_path()
// ($FP4MOE_TUNE_CACHE) for this device and build; where there is none for a shape and token bucket,
// the kernels' measured defaults (cuda::sm90::w4a16_default_config, what a layer or Linear without a
// chooser runs).
std::shared_ptr<const tune::ConfigChooser> w4a16_config_chooser();

// Gives every NVFP4 W4A16 MoE layer of `model_layers` (structs with `std::optional<moe::GpuMoeLayer>
// moe`) and every NVFP4 Linear of `linears` (the model's dense ones; GpuLinear::set_config_chooser)
// the chooser above; returns the load log's lines ("  W4A16 configs: ...; used by N MoE layers and M
// dense Linears\n", then one per Linear that refused the cache's pick), "" without either.
template <typename Layer>
std::string use_tune_cache(std::vector<Layer>& model_layers, const std::vector<GpuLinear*>& linears) {
  std::shared_ptr<const tune::ConfigChooser> chooser;
  int n_moe = 0, n_linears = 0;
  std::string refused;
  for (Layer& L : model_layers) {
    if (!L.moe || L.moe->gemm() != moe::GpuExpertGemm::kNvfp4W4A16) continue;
    if (!chooser) chooser = w4a16_config_chooser();
    L.moe->set_config_chooser(chooser);
    ++n_moe;
  }
  for (GpuLinear* g : linears) {
    if (g->path() != GpuLinear::Path::kNvfp4W4A16) continue;
    if (!chooser) chooser = w4a16_config_chooser();
    std::string why;
    if (g->set_config_chooser(chooser, &why)) {
      ++n_linears;
    } else {
      refused += "  W4A16 configs: " + why + "\n";
    }
  }
  if (!chooser) return "";
  return "  W4A16 configs: " + chooser->describe() + "; used by " + std::to_string(n_moe) + " MoE layers and " +
         std::to_string(n_linears) + " dense Linears\n" + refused;
}

// GpuOptions::time_moe_gemms: every MoE layer of `model_layers` records its GEMM phases' timing
// events (GpuMoeLayer::set_gemm_timing; before any graph is captured), which the trace reports as
// parts "moe.routed_gate_up", ...; returns the load log's line, "" when off or without MoE layers.
template <typename Layer>
std::string time_moe_gemms(std::vector<Layer>& model_layers, bool on) {
  bool any = false;
  for (Layer& L : model_layers) {
    if (!L.moe) continue;
    L.moe->set_gemm_timing(on);
    any = true;
  }
  return on && any ? "  MoE GEMM timing events on (--time-moe-gemms)\n" : "";
}

// After run_step: copies a padded step's outputs (padded = bs > 0), the MoE layers' per-expert counts
// for a trace, then StepOutputs::finish (the one sync, the delivery) and the per-layer times and
// graph count into the trace.
void finish_step(StepOutputs& out, std::span<const SeqChunk> batch, const StepBatch& step, bool padded, bool graph,
                 const MoeLayerList& moe, int64_t n_experts,
                 const std::vector<std::unique_ptr<CUevent_st, EventDeleter>>& events, ForwardTrace* trace,
                 cudaStream_t stream);

// "CUDA graphs: decode batches 1, 2, 4, 8, 16, ..., 256 (captured on first use)", or why they are off.
std::string describe_graphs(const DecodeGraphs& graphs, bool capturable);

// Appends "attention" and "mlp"/"moe" times per layer from events [2 * layers + 1] (event 2l at the
// layer's start, 2l + 1 after its attention, the last after the last layer) to the trace, and after
// each "moe" its GEMM phases (GpuMoeLayer::last_gemm_times): "moe.routed_gate_up", "moe.routed_down",
// and with a shared expert "moe.shared_gate_up", "moe.shared_down". After the step's sync.
void trace_layer_times(const std::vector<std::unique_ptr<CUevent_st, EventDeleter>>& events, const MoeLayerList& moe,
                       ForwardTrace* trace);

// The RoPE tables of `rotary_dim` dims and `theta` for positions [0, n_positions): f32 cos / sin
// [n_positions, rotary_dim / 2] (model/ops.h's rope_cos_sin), on the device.
void rope_tables(int64_t rotary_dim, float theta, int64_t n_positions, cuda::DeviceBuffer& cos,
                 cuda::DeviceBuffer& sin);

// What both GPU models own and do the same way. Load order: open() (the step stream, the cuBLAS handle
// bound to it with its workspace, the device and its SM count), load_embedding() before the layers,
// load_head() after them, then finish_load() (the step outputs, the MoE layer list, the decode graphs,
// the timing events). A step: with_blocks() around it, run() for its device work.
class ModelCommon {
 public:
  // The step's bf16 buffers run() works on ([max tokens, hidden] each) and the final norm's shape.
  struct Activations {
    __nv_bfloat16 *resid = nullptr, *h = nullptr, *x = nullptr;
    int64_t hidden = 0;
    float eps = 0.0f;
  };

  void open();
  void synchronize() const;  // waits for the stream's work (the models' destructors)
  // "model.embed_tokens.weight", bf16 [vocab, hidden]; returns its bytes.
  int64_t load_embedding(const format::TensorStore& store, int64_t vocab, int64_t hidden);
  // "model.norm.weight" and the lm_head (BF16 on cuBLAS; the embedding's matrix when `tied`); returns
  // the bytes the lm_head adds to the device (0 when tied).
  int64_t load_head(const format::TensorStore& store, int64_t hidden, bool tied);
  // After the layers (structs with `std::optional<moe::GpuMoeLayer> moe`): outputs for max_tokens
  // rows, the MoE layer list, the decode graphs (gopt.cuda_graph_max_bs), 2 x layers + 1 events.
  template <typename Layer>
  void finish_load(const std::vector<Layer>& layers, const GpuOptions& gopt, int64_t max_tokens) {
    out = std::make_unique<StepOutputs>(vocab_, max_tokens);
    moe_layers = MoeLayerList::of(layers);
    graphs = DecodeGraphs::for_model(gopt.cuda_graph_max_bs, max_tokens);
    create_events(2 * layers.size() + 1);
  }
  // The load log's lines on the lm_head (ends "\n") and on the graphs (no newline).
  std::string describe_lm_head() const;
  std::string describe_graphs() const;
  // The KV block pool, made after the weights and step buffers are on the device: gopt.kv_tokens tokens (rounded
  // up to pages) or, with gopt.mem_fraction_static > 0, what that share of the GPU's memory leaves
  // (kv_tokens_for_memory, gopt.kv_tokens the cap). `note`: how it was sized, for the load log ("" when fixed).
  // n_allocations: the cache's buffers. The fraction's share is of the memory free when open() ran (SGLang's).
  std::shared_ptr<KvBlockPool> make_kv_pool(const GpuOptions& gopt, int64_t bytes_per_token, int64_t n_allocations,
                                            std::string& note) const;

  // Reserves the step's KV blocks (all or nothing), runs fn, commits the chunks' tokens; when fn
  // throws, waits for the stream, gives the blocks back and rethrows (nothing of the step is kept).
  template <typename Fn>
  void with_blocks(const StepBatch& step, Fn&& fn) {
    const std::vector<int64_t> added = reserve_blocks(step.chunks);
    try {
      fn();
      for (const Chunk& c : step.chunks) c.state->commit(c.n);
    } catch (...) {
      cudaStreamSynchronize(stream.get());
      rollback_blocks(step.chunks, added);
      throw;
    }
  }
  // Stages the step's ints (layout: as run, padded for a graph when gbs > 0; `extra` after them) and
  // issues the step's device work, d_ints its ints on the device: the embedding into act.resid,
  // `layers`, the last timing event, the final norm (adds the last block's output act.x into act.resid,
  // normalized into act.h), the lm_head over the step's rows (act.x its gather scratch); as the graph
  // of (gbs, layout.max_blocks) when gbs > 0 (run_step). Then finish_step (the one sync, the outputs
  // into the batch, the trace).
  void run(std::span<const SeqChunk> batch, const StepBatch& step, int64_t gbs, const StepIntsLayout& layout,
           std::span<const int32_t> extra, const Activations& act,
           const std::function<void(const int32_t* d_ints)>& layers, int64_t n_experts, ForwardTrace* trace);

  std::unique_ptr<CUstream_st, StreamDeleter> stream;
  std::unique_ptr<cublasContext, CublasDeleter> cublas;
  int device = 0;
  int n_sms = 1;
  cuda::DeviceBuffer embed;       // bf16 [V, H]
  cuda::DeviceBuffer final_norm;  // f32 [H]
  GpuLinear lm_head;
  std::unique_ptr<StepOutputs> out;                               // lm_head outputs, error flag, expert counts
  std::vector<std::unique_ptr<CUevent_st, EventDeleter>> events;  // [2 * layers + 1]
  std::unique_ptr<DecodeGraphs> graphs;                           // captured decode steps
  MoeLayerList moe_layers;                                        // fixed at load

 private:
  void create_events(size_t n);

  int64_t vocab_ = 0;
  bool tied_ = false;
  size_t free_at_open_ = 0;  // device memory free once the context, stream and cuBLAS handle existed
  cuda::DeviceBuffer cublas_workspace_;
  cuda::DeviceBuffer ints_;  // the step's ints on the device (eager steps)
  PinnedBuffer<int32_t> h_ints_;
};

}  // namespace fp4moe::model::gpu_step
