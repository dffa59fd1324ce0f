// What every GPU model's forward step shares (glm4_moe_cuda.cpp, glm5_cuda.cpp): the batch checks and
// row layout, the all-or-nothing KV block reservation, the host ints every step stages, the dense
// gated MLP, and the step's outputs (lm_head passes with the device argmax, the error flag, the
// per-expert counts copied without a sync, then one sync and the delivery into the SeqChunks).
// Tested through tests/model/test_gpu_model.cpp (both GPU models).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/moe/device_buffer.h"
#include "model/causal_lm.h"
#include "model/cuda/gpu_kv_cache.h"
#include "model/cuda/gpu_linear.h"

struct cublasContext;

namespace fp4moe::model::gpu_step {

struct CublasDeleter {
  void operator()(cublasContext* h) const;
};
struct PinnedDeleter {
  void operator()(void* p) const { cudaFreeHost(p); }
};
struct StreamDeleter {
  void operator()(CUstream_st* s) const { cudaStreamDestroy(s); }
};
struct EventDeleter {
  void operator()(CUevent_st* e) const { cudaEventDestroy(e); }
};

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
};

// Checks the batch (states of `owner`, distinct, non-empty, ids in the vocabulary, positions within
// n_positions, at most max_tokens tokens) naming the entry and the numbers, and lays out its rows.
StepBatch plan_step(std::span<const SeqChunk> batch, const void* owner, int64_t vocab, int64_t n_positions,
                    int64_t max_tokens);

// The KV blocks of the step's new tokens, all or nothing: returns the blocks each chunk took.
std::vector<int64_t> reserve_blocks(const std::vector<Chunk>& chunks);
void rollback_blocks(const std::vector<Chunk>& chunks, const std::vector<int64_t>& added);
int64_t max_blocks(const std::vector<Chunk>& chunks);  // >= 1

// The ints both models stage: tokens [T], positions [T], slots [T], q_start [S + 1], seq_lens [S],
// block tables [S, max_blocks] (-1 padded).
void fill_step_ints(std::span<const SeqChunk> batch, const StepBatch& step, int64_t max_blocks, int32_t* tokens,
                    int32_t* positions, int32_t* slots, int32_t* q_start, int32_t* seq_lens, int32_t* tables);

// down(silu(gate(h)) * up(h)) with the given scratch ([T, I] each).
struct GpuDenseMlp {
  GpuLinear gate, up, down;
  void forward(cublasContext* cublas, const __nv_bfloat16* h, int64_t n_tokens, __nv_bfloat16* gate_buf,
               __nv_bfloat16* up_buf, __nv_bfloat16* act, __nv_bfloat16* out, cudaStream_t stream) const;
};

// The step's outputs. Per step: copy_expert_offsets (optional), run_lm_head, then finish (the one sync).
class StepOutputs {
 public:
  static constexpr int64_t kLogitRowsPerPass = 256;  // lm_head rows per f32 logits pass

  explicit StepOutputs(int64_t vocab);
  uint32_t* error_flag() const { return err_.as<uint32_t>(); }

  // Copies each MoE layer's expert offsets [E + 1] to the host, asynchronously (traces).
  void copy_expert_offsets(const std::vector<const int32_t*>& d_offsets, int64_t n_experts, cudaStream_t stream);
  // The step's rows of h [T, hidden] (rows d_rows, gathered into `scratch`, >= kLogitRowsPerPass rows)
  // through the lm_head (f32, cuBLAS), their argmax on the device, and the logits rows the host wants.
  void run_lm_head(cublasContext* cublas, const GpuLinear& lm_head, const __nv_bfloat16* h, const int32_t* d_rows,
                   const StepBatch& step, int64_t hidden, __nv_bfloat16* scratch, cudaStream_t stream);
  // Synchronizes, fails naming the device errors (and clears the flag), writes the logits and
  // argmaxes into the batch, and appends the per-expert counts of `moe_layers` to the trace.
  void finish(std::span<const SeqChunk> batch, const StepBatch& step, const std::vector<size_t>& moe_layers,
              ForwardTrace* trace, cudaStream_t stream);

 private:
  int64_t vocab_;
  cuda::DeviceBuffer logits_, argmax_, err_;
  PinnedBuffer<float> h_logits_;
  PinnedBuffer<int32_t> h_argmax_, h_offsets_;
  PinnedBuffer<uint32_t> h_err_;
  int64_t n_experts_ = 0;
  bool offsets_copied_ = false;
};

// Appends "attention" and "mlp"/"moe" times per layer from events [2 * layers + 1] (event 2l at the
// layer's start, 2l + 1 after its attention, the last after the last layer) to the trace.
void trace_layer_times(const std::vector<std::unique_ptr<CUevent_st, EventDeleter>>& events,
                       const std::vector<bool>& is_moe, ForwardTrace* trace);

}  // namespace fp4moe::model::gpu_step
