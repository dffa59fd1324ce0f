// The shared pieces of the GPU models' forward step (see gpu_step.h). Tested through
// tests/model/test_gpu_model.cpp.
#include "model/cuda/gpu_step.h"

#include <cublas_v2.h>

#include <cstdio>
#include <ostream>
#include <sstream>
#include <unordered_set>

#include "core/error.h"
#include "kernels/cuda/cublas_check.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/moe/moe_kernels.h"
#include "kernels/cuda/ops/device_errors.h"
#include "kernels/cuda/ops/norm_rope.h"
#include "kernels/cuda/sm90/w4a16_grouped_gemm.h"
#include "model/ops.h"
#include "model/weights.h"
#include "moe/mlp.h"
#include "moe/moe_layer.h"
#include "moe/weights.h"
#include "tune/autotune.h"

namespace fp4moe::model::gpu_step {

using bf16 = __nv_bfloat16;

void CublasDeleter::operator()(cublasContext* h) const { cublasDestroy(h); }

void* grow_bytes(cuda::DeviceBuffer& b, size_t n) {
  n = std::max<size_t>(n, 4);
  if (b.bytes() < n) b = cuda::DeviceBuffer(n);
  return b.as<uint8_t>();
}

StepBatch plan_step(std::span<const SeqChunk> batch, const void* owner, int64_t vocab, int64_t n_positions,
                    int64_t max_tokens) {
  StepBatch s;
  std::unordered_set<const KvState*> seen;
  for (size_t i = 0; i < batch.size(); ++i) {
    const SeqChunk& sc = batch[i];
    auto* st = dynamic_cast<GpuKvState*>(sc.state);
    FP4MOE_CHECK(st != nullptr && st->owner() == owner)
        << "batch entry " << i << ": the KV state was not created by this model's new_state()";
    FP4MOE_CHECK(seen.insert(st).second) << "batch entry " << i << ": the same KV state appears twice in one step";
    FP4MOE_CHECK(!sc.tokens.empty()) << "batch entry " << i << ": no tokens";
    FP4MOE_CHECK(sc.sample == nullptr || (sc.argmax != nullptr && sc.logits == nullptr))
        << "batch entry " << i << ": device sampling writes to `argmax` and returns no logits";
    for (size_t j = 0; j < sc.tokens.size(); ++j) {
      FP4MOE_CHECK(sc.tokens[j] >= 0 && sc.tokens[j] < vocab) << "batch entry " << i << ": token id " << sc.tokens[j]
                                                              << " at index " << j << " is outside the vocabulary [0, "
                                                              << vocab << ")";
    }
    const int64_t n = static_cast<int64_t>(sc.tokens.size());
    FP4MOE_CHECK(st->length() + n <= n_positions)
        << "batch entry " << i << ": positions up to " << st->length() + n - 1 << " exceed max_position_embeddings "
        << n_positions;
    s.chunks.push_back({st, s.n_tokens, n, st->length()});
    s.n_tokens += n;
    s.max_q_len = std::max(s.max_q_len, n);
    s.max_seq_len = std::max(s.max_seq_len, st->length() + n);
    s.decode_only = s.decode_only && n == 1;
  }
  FP4MOE_CHECK(s.n_tokens <= max_tokens) << "GPU forward step of " << s.n_tokens
                                         << " tokens exceeds the model's max_tokens_per_step " << max_tokens
                                         << " (GpuOptions; the server sets it from --max-prefill-tokens)";
  for (size_t i = 0; i < batch.size(); ++i) {
    const Chunk& c = s.chunks[i];
    if (batch[i].logits != nullptr) {
      for (int64_t r = batch[i].all_logits ? c.row0 : c.row0 + c.n - 1; r < c.row0 + c.n; ++r) {
        s.rows.push_back(static_cast<int32_t>(r));
        s.row_logits.push_back(1);
        ++s.n_logit_rows;
      }
    } else if (batch[i].argmax != nullptr) {
      s.rows.push_back(static_cast<int32_t>(c.row0 + c.n - 1));
      s.row_logits.push_back(0);
      if (batch[i].sample != nullptr) {
        s.sample_rows.push_back(static_cast<int64_t>(s.rows.size()) - 1);
        s.samples.push_back(*batch[i].sample);
      }
    }
  }
  return s;
}

std::vector<int64_t> reserve_blocks(const std::vector<Chunk>& chunks) {
  std::vector<int64_t> added(chunks.size(), 0);
  try {
    for (size_t i = 0; i < chunks.size(); ++i) added[i] = chunks[i].state->reserve(chunks[i].n);
  } catch (...) {
    rollback_blocks(chunks, added);
    throw;
  }
  return added;
}

void rollback_blocks(const std::vector<Chunk>& chunks, const std::vector<int64_t>& added) {
  for (size_t i = 0; i < chunks.size(); ++i) chunks[i].state->rollback(added[i]);
}

int64_t max_blocks(const std::vector<Chunk>& chunks) {
  int64_t m = 1;
  for (const Chunk& c : chunks) m = std::max<int64_t>(m, static_cast<int64_t>(c.state->blocks().size()));
  return m;
}

void stage_step_ints(std::span<const SeqChunk> batch, const StepBatch& step, const StepIntsLayout& l,
                     std::span<const int32_t> extra, int32_t* out) {
  const auto S = static_cast<int64_t>(step.chunks.size()), R = static_cast<int64_t>(step.rows.size());
  FP4MOE_CHECK(l.n_seqs >= S && l.n_tokens >= step.n_tokens && l.n_tokens - step.n_tokens == l.n_seqs - S &&
               l.n_rows >= R && l.n_extra == static_cast<int64_t>(extra.size()))
      << "stage_step_ints: layout of " << l.n_tokens << " tokens / " << l.n_seqs << " sequences / " << l.n_rows
      << " rows for a step of " << step.n_tokens << " / " << S << " / " << R << " (padding is one token a sequence)";
  int32_t *tokens = out, *positions = out + l.positions(), *slots = out + l.slots(), *q_start = out + l.q_start(),
          *seq_lens = out + l.seq_lens(), *tables = out + l.tables(), *rows = out + l.rows();
  q_start[0] = 0;
  for (size_t i = 0; i < step.chunks.size(); ++i) {
    const Chunk& c = step.chunks[i];
    for (int64_t j = 0; j < c.n; ++j) {
      tokens[c.row0 + j] = batch[i].tokens[static_cast<size_t>(j)];
      positions[c.row0 + j] = static_cast<int32_t>(c.pos0 + j);
      slots[c.row0 + j] = c.state->slot(c.pos0 + j);
    }
    q_start[i + 1] = static_cast<int32_t>(c.row0 + c.n);
    seq_lens[i] = static_cast<int32_t>(c.pos0 + c.n);
    const std::vector<int32_t>& b = c.state->blocks();
    for (int64_t j = 0; j < l.max_blocks; ++j) {
      tables[static_cast<int64_t>(i) * l.max_blocks + j] = j < static_cast<int64_t>(b.size()) ? b[static_cast<size_t>(j)] : -1;
    }
  }
  for (int64_t i = S; i < l.n_seqs; ++i) {  // padding: one empty token each, after the step's tokens
    const int64_t t = step.n_tokens + (i - S);
    tokens[t] = 0;
    positions[t] = 0;
    slots[t] = -1;
    q_start[i + 1] = static_cast<int32_t>(t + 1);
    seq_lens[i] = 0;
    std::fill_n(tables + i * l.max_blocks, l.max_blocks, -1);
  }
  std::copy(step.rows.begin(), step.rows.end(), rows);
  for (int64_t r = R; r < l.n_rows; ++r) rows[r] = static_cast<int32_t>(r);
  std::copy(extra.begin(), extra.end(), out + l.extra());
}

void GpuDenseMlp::forward(cublasContext* cublas, const bf16* h, int64_t n_tokens, bf16* gate_buf, bf16* up_buf,
                          bf16* act, bf16* out, cudaStream_t stream) const {
  const int64_t I = gate.out_features();
  gate.forward(cublas, h, n_tokens, gate_buf, stream);
  up.forward(cublas, h, n_tokens, up_buf, stream);
  cuda::moe::swiglu(gate_buf, up_buf, I, n_tokens, I, act, stream);
  down.forward(cublas, act, n_tokens, out, stream);
}

int64_t load_ffn(const format::TensorStore& store, const std::string& prefix, bool is_moe, const moe::MoeConfig& moe_cfg,
                 int64_t hidden, int64_t intermediate, int64_t max_tokens, bool nvfp4_kernels,
                 std::shared_ptr<moe::GpuMoeWorkspace>& moe_ws, std::optional<GpuDenseMlp>& mlp,
                 std::optional<moe::GpuMoeLayer>& moe, std::ostream& desc) {
  if (is_moe) {
    const moe::MoeLayer cpu = moe::MoeLayer::load(store, prefix + ".mlp", moe_cfg);
    const bool experts_fp4 = cpu.experts().front().gate.format == kernels::cpu::WeightFormat::kNVFP4;
    if (nvfp4_kernels && experts_fp4) {
      try {
        moe = moe::GpuMoeLayer::from_cpu(cpu, moe::GpuExpertGemm::kNvfp4W4A16, max_tokens, moe_ws);
      } catch (const Error& e) {  // a shape the W4A16 GEMM refuses: the exact BF16 dequantization
        desc << "(W4A16 refused: " << e.what() << ") ";
      }
    }
    if (!moe) moe = moe::GpuMoeLayer::from_cpu(cpu, moe::GpuExpertGemm::kBf16Cublas, max_tokens, moe_ws);
    moe_ws = moe->workspace();
    desc << "MoE " << moe->describe();
    return moe->routed_expert_bytes() * moe_cfg.n_experts + moe->shared_expert_bytes() + moe_cfg.n_experts * hidden * 4;
  }
  const moe::GatedMlp m = moe::GatedMlp::load(store, prefix + ".mlp", hidden, intermediate);
  mlp = GpuDenseMlp{GpuLinear::upload(m.gate, max_tokens, prefix + ".mlp.gate_proj", nvfp4_kernels),
                    GpuLinear::upload(m.up, max_tokens, prefix + ".mlp.up_proj", nvfp4_kernels),
                    GpuLinear::upload(m.down, max_tokens, prefix + ".mlp.down_proj", nvfp4_kernels)};
  desc << "dense MLP gate " << mlp->gate.describe() << ", up " << mlp->up.describe() << ", down "
       << mlp->down.describe();
  return mlp->gate.device_bytes() + mlp->up.device_bytes() + mlp->down.device_bytes();
}

void check_finite_logits(const StepBatch& step, const uint32_t* non_finite) {
  const auto n_rows = static_cast<int64_t>(step.rows.size());
  int64_t first = 0;
  while (first < n_rows && non_finite[first] == 0) ++first;
  if (first == n_rows) return;
  // The rows are in batch order, each chunk's contiguous: a row's entry is the chunk holding its token (the rows are
  // visited in order, so the search resumes where it stopped).
  size_t chunk = 0;
  const auto locate = [&](int64_t r) {
    const int64_t token = step.rows[static_cast<size_t>(r)];
    while (chunk + 1 < step.chunks.size() && token >= step.chunks[chunk].row0 + step.chunks[chunk].n) ++chunk;
    const Chunk& c = step.chunks[chunk];
    return std::pair<int64_t, int64_t>{static_cast<int64_t>(chunk), c.pos0 + (token - c.row0)};
  };
  const auto [entry, position] = locate(first);
  const int64_t others = other_non_finite_entries(
      first, n_rows, entry, [&](int64_t r) { return non_finite[r] != 0; }, locate);
  fail_non_finite("the logits (model.norm, lm_head)", entry, position, -1, 0.0f, others);
}

StepOutputs::StepOutputs(int64_t vocab, int64_t max_rows)
    : vocab_(vocab),
      logits_(static_cast<size_t>(kLogitRowsPerPass * vocab) * 4),
      argmax_(static_cast<size_t>(std::max(max_rows, kLogitRowsPerPass)) * 4),
      argmax_parts_(static_cast<size_t>(cuda::kArgmaxWorkspaceCandidates) * sizeof(cuda::ArgmaxCandidate)),
      err_(4),
      non_finite_(static_cast<size_t>(std::max(max_rows, kLogitRowsPerPass)) * 4),
      sample_specs_(static_cast<size_t>(std::max(max_rows, kLogitRowsPerPass)) * sizeof(cuda::SampleSpec)) {
  FP4MOE_CUDA_CHECK(cudaMemset(err_.as<uint32_t>(), 0, 4));
}

void StepOutputs::copy_expert_offsets(const std::vector<const int32_t*>& d_offsets, int64_t n_experts,
                                      cudaStream_t stream) {
  n_experts_ = n_experts;
  offsets_copied_ = !d_offsets.empty();
  if (!offsets_copied_) return;
  const size_t per = static_cast<size_t>(n_experts + 1);
  int32_t* h = h_offsets_.get(d_offsets.size() * per);
  for (size_t m = 0; m < d_offsets.size(); ++m) {
    // Each MoE layer has its own offsets buffer, so each copy reads its own layer's step.
    FP4MOE_CUDA_CHECK(cudaMemcpyAsync(h + m * per, d_offsets[m], per * 4, cudaMemcpyDeviceToHost, stream));
  }
}

void StepOutputs::compute_pass(cublasContext* cublas, const GpuLinear& lm_head, const bf16* h, const int32_t* d_rows,
                               int64_t r0, int64_t n, int64_t hidden, bf16* scratch, cudaStream_t stream) {
  FP4MOE_CHECK(n >= 0 && n <= kLogitRowsPerPass) << "lm_head pass of " << n << " rows (at most " << kLogitRowsPerPass << ")";
  FP4MOE_CHECK(static_cast<size_t>(r0 + n) * 4 <= argmax_.bytes())
      << "lm_head over " << r0 + n << " rows exceeds the " << argmax_.bytes() / 4 << " argmax rows sized at load";
  if (n == 0) return;
  cuda::moe::gather_rows(h, d_rows + r0, n, hidden, scratch, stream);
  lm_head.forward_f32(cublas, scratch, n, logits_.as<float>(), stream);
  cuda::argmax_rows(logits_.as<float>(), n, vocab_, vocab_, argmax_.as<int32_t>() + r0,
                    argmax_parts_.as<cuda::ArgmaxCandidate>(), non_finite_.as<uint32_t>() + r0, stream);
}

void StepOutputs::lm_head_pass(cublasContext* cublas, const GpuLinear& lm_head, const bf16* h, const int32_t* d_rows,
                               int64_t n, int64_t hidden, bf16* scratch, cudaStream_t stream) {
  compute_pass(cublas, lm_head, h, d_rows, 0, n, hidden, scratch, stream);
}

void StepOutputs::copy_pass_logits(const StepBatch& step, int64_t r0, int64_t n, int64_t& logit_row,
                                   cudaStream_t stream) {
  const int64_t V = vocab_;
  float* h_logits = h_logits_.get(static_cast<size_t>(std::max<int64_t>(step.n_logit_rows, 1) * V));
  for (int64_t a = 0; a < n;) {  // copy each run of rows that want logits
    if (!step.row_logits[static_cast<size_t>(r0 + a)]) {
      ++a;
      continue;
    }
    int64_t b = a;
    while (b < n && step.row_logits[static_cast<size_t>(r0 + b)]) ++b;
    FP4MOE_CUDA_CHECK(cudaMemcpyAsync(h_logits + logit_row * V, logits_.as<float>() + a * V,
                                      static_cast<size_t>((b - a) * V) * 4, cudaMemcpyDeviceToHost, stream));
    logit_row += b - a;
    a = b;
  }
}

void StepOutputs::copy_argmax(int64_t n_rows, cudaStream_t stream) {
  int32_t* h_argmax = h_argmax_.get(static_cast<size_t>(std::max<int64_t>(n_rows, 1)));
  uint32_t* h_non_finite = h_non_finite_.get(static_cast<size_t>(std::max<int64_t>(n_rows, 1)));
  if (n_rows > 0) {
    FP4MOE_CUDA_CHECK(cudaMemcpyAsync(h_argmax, argmax_.as<int32_t>(), static_cast<size_t>(n_rows) * 4,
                                      cudaMemcpyDeviceToHost, stream));
    FP4MOE_CUDA_CHECK(cudaMemcpyAsync(h_non_finite, non_finite_.as<uint32_t>(), static_cast<size_t>(n_rows) * 4,
                                      cudaMemcpyDeviceToHost, stream));
  }
}

void StepOutputs::upload_samples(const StepBatch& step, cudaStream_t stream) {
  const size_t n = step.samples.size();
  if (n == 0) return;
  FP4MOE_CHECK(n * sizeof(cuda::SampleSpec) <= sample_specs_.bytes())
      << n << " sampled rows exceed the " << sample_specs_.bytes() / sizeof(cuda::SampleSpec) << " sized at load";
  cuda::SampleSpec* h = h_sample_specs_.get(n);
  for (size_t i = 0; i < n; ++i) {
    const DeviceSampling& d = step.samples[i];
    const int64_t r = step.sample_rows[i];
    h[i].u = d.u;
    h[i].temperature = d.temperature;
    h[i].top_p = d.top_p;
    h[i].min_p = d.min_p;
    h[i].top_k = static_cast<int32_t>(std::clamp<int64_t>(d.top_k, -1, INT32_MAX));
    h[i].row = static_cast<int32_t>(r % kLogitRowsPerPass);  // its row in the pass's logits
    h[i].out = static_cast<int32_t>(r);                       // its token in argmax_
  }
  FP4MOE_CUDA_CHECK(cudaMemcpyAsync(sample_specs_.as<void>(), h, n * sizeof(cuda::SampleSpec),
                                    cudaMemcpyHostToDevice, stream));
}

void StepOutputs::sample_pass(const StepBatch& step, int64_t r0, int64_t n, cudaStream_t stream) {
  const auto& rows = step.sample_rows;
  const auto first = std::lower_bound(rows.begin(), rows.end(), r0);
  const auto last = std::lower_bound(first, rows.end(), r0 + n);
  if (first == last) return;
  cuda::sample_rows(logits_.as<float>(), vocab_, vocab_, sample_specs_.as<cuda::SampleSpec>() + (first - rows.begin()),
                    last - first, argmax_.as<int32_t>(), stream);
}

void StepOutputs::run_lm_head(cublasContext* cublas, const GpuLinear& lm_head, const bf16* h, const int32_t* d_rows,
                              const StepBatch& step, int64_t hidden, bf16* scratch, cudaStream_t stream) {
  const int64_t R = static_cast<int64_t>(step.rows.size());
  upload_samples(step, stream);
  int64_t logit_row = 0;  // rows copied so far
  for (int64_t r0 = 0; r0 < R; r0 += kLogitRowsPerPass) {  // the argmax of each pass lands at its rows' offset
    const int64_t n = std::min(kLogitRowsPerPass, R - r0);
    compute_pass(cublas, lm_head, h, d_rows, r0, n, hidden, scratch, stream);
    sample_pass(step, r0, n, stream);
    copy_pass_logits(step, r0, n, logit_row, stream);
  }
  copy_argmax(R, stream);
}

void StepOutputs::copy_outputs(const StepBatch& step, cudaStream_t stream) {
  const int64_t R = static_cast<int64_t>(step.rows.size());
  FP4MOE_CHECK(R <= kLogitRowsPerPass) << "copy_outputs after one lm_head pass: " << R << " rows > "
                                       << kLogitRowsPerPass;
  upload_samples(step, stream);  // the graph drew the argmaxes; the sampled rows are drawn after it
  sample_pass(step, 0, R, stream);
  int64_t logit_row = 0;
  copy_pass_logits(step, 0, R, logit_row, stream);
  copy_argmax(R, stream);
}

void StepOutputs::finish(std::span<const SeqChunk> batch, const StepBatch& step, const std::vector<size_t>& moe_layers,
                         ForwardTrace* trace, cudaStream_t stream) {
  uint32_t* h_err = h_err_.get(1);
  FP4MOE_CUDA_CHECK(cudaMemcpyAsync(h_err, err_.as<uint32_t>(), 4, cudaMemcpyDeviceToHost, stream));
  FP4MOE_CUDA_CHECK(cudaStreamSynchronize(stream));
  if (*h_err != 0) {
    FP4MOE_CUDA_CHECK(cudaMemsetAsync(err_.as<uint32_t>(), 0, 4, stream));
    FP4MOE_CUDA_CHECK(cudaStreamSynchronize(stream));
    FP4MOE_FAIL() << "GPU forward step of " << step.n_tokens << " tokens: " << cuda::describe_device_errors(*h_err);
  }
  check_finite_logits(step, h_non_finite_.get(0));
  const int64_t V = vocab_;
  const float* h_logits = h_logits_.get(0);
  const int32_t* h_argmax = h_argmax_.get(0);
  int64_t r = 0, lr = 0;  // row, logits row
  for (size_t i = 0; i < batch.size(); ++i) {
    if (batch[i].logits != nullptr) {
      const int64_t n = batch[i].all_logits ? step.chunks[i].n : 1;
      std::copy_n(h_logits + lr * V, n * V, batch[i].logits);
      if (batch[i].argmax != nullptr) *batch[i].argmax = h_argmax[r + n - 1];
      r += n;
      lr += n;
    } else if (batch[i].argmax != nullptr) {
      *batch[i].argmax = h_argmax[r];
      ++r;
    }
  }
  if (trace != nullptr && offsets_copied_) {
    const size_t per = static_cast<size_t>(n_experts_ + 1);
    const int32_t* h_off = h_offsets_.get(0);
    for (size_t m = 0; m < moe_layers.size(); ++m) {
      MoeLayerTrace t;
      t.layer = static_cast<int64_t>(moe_layers[m]);
      const int32_t* o = h_off + m * per;
      for (int64_t e = 0; e < n_experts_; ++e) t.tokens_per_expert.push_back(o[e + 1] - o[e]);
      trace->moe_layers.push_back(std::move(t));
    }
  }
  offsets_copied_ = false;
}

void bind_cublas(cublasContext* cublas, cudaStream_t stream, cuda::DeviceBuffer& workspace) {
  workspace = cuda::DeviceBuffer(kCublasWorkspaceBytes);
  FP4MOE_CUBLAS_CHECK(cublasSetStream(cublas, stream));
  FP4MOE_CUBLAS_CHECK(cublasSetWorkspace(cublas, workspace.as<void>(), kCublasWorkspaceBytes));
}

struct DecodeGraphs::Graph {
  cuda::DeviceBuffer ints;
  size_t n_ints = 0;
  cudaGraphExec_t exec = nullptr;
  ~Graph() {
    if (exec != nullptr) cudaGraphExecDestroy(exec);
  }
};

DecodeGraphs::DecodeGraphs(int64_t max_bs) : max_bs_(std::max<int64_t>(max_bs, 0)) {
  for (int64_t b : {1, 2, 4, 8}) {
    if (b <= max_bs_) buckets_.push_back(b);
  }
  for (int64_t b = 16; b < max_bs_ + 8; b += 8) buckets_.push_back(std::min(b, max_bs_));
  if (max_bs_ > 0 && (buckets_.empty() || buckets_.back() < max_bs_)) buckets_.push_back(max_bs_);  // e.g. 6
  buckets_.erase(std::unique(buckets_.begin(), buckets_.end()), buckets_.end());
}

DecodeGraphs::~DecodeGraphs() = default;

std::unique_ptr<DecodeGraphs> DecodeGraphs::for_model(int64_t cuda_graph_max_bs, int64_t max_tokens_per_step) {
  return std::make_unique<DecodeGraphs>(
      std::min({cuda_graph_max_bs, max_tokens_per_step, StepOutputs::kLogitRowsPerPass}));
}

int64_t DecodeGraphs::batch_bucket(int64_t n_seqs) const {
  if (!enabled() || n_seqs < 1) return 0;
  const auto it = std::lower_bound(buckets_.begin(), buckets_.end(), n_seqs);
  return it == buckets_.end() ? 0 : *it;
}

int64_t DecodeGraphs::table_bucket(int64_t max_blocks) {
  int64_t b = 1;
  while (b < max_blocks) b *= 2;
  return b;
}

void DecodeGraphs::clear() { graphs_.clear(); }

bool DecodeGraphs::launch(int64_t bs, int64_t tb, const int32_t* host_ints, size_t n_ints, cudaStream_t stream,
                          const std::function<void(const int32_t* d_ints)>& record) {
  std::unique_ptr<Graph>& slot = graphs_[{bs, tb}];
  if (slot == nullptr || slot->n_ints != n_ints) {
    auto g = std::make_unique<Graph>();
    g->ints = cuda::DeviceBuffer(n_ints * 4);
    g->n_ints = n_ints;
    cudaGraph_t graph = nullptr;
    std::string failure;
    FP4MOE_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    try {
      record(g->ints.as<int32_t>());
    } catch (const std::exception& e) {
      failure = e.what();
    }
    const cudaError_t end = cudaStreamEndCapture(stream, &graph);
    if (failure.empty() && end != cudaSuccess) failure = std::string("cudaStreamEndCapture: ") + cudaGetErrorString(end);
    if (failure.empty()) {
      const cudaError_t inst = cudaGraphInstantiate(&g->exec, graph, 0);
      if (inst != cudaSuccess) failure = std::string("cudaGraphInstantiate: ") + cudaGetErrorString(inst);
    }
    if (graph != nullptr) cudaGraphDestroy(graph);
    if (!failure.empty()) {
      (void)cudaGetLastError();  // capture errors are not sticky; clear the last-error slot
      graphs_.clear();
      disabled_reason_ = "capturing the decode step of batch " + std::to_string(bs) + " failed: " + failure;
      std::fprintf(stderr, "fp4moe: CUDA graphs off, decode steps run eagerly (%s)\n", disabled_reason_.c_str());
      return false;
    }
    slot = std::move(g);
  }
  FP4MOE_CUDA_CHECK(cudaMemcpyAsync(slot->ints.as<int32_t>(), host_ints, n_ints * 4, cudaMemcpyHostToDevice, stream));
  FP4MOE_CUDA_CHECK(cudaGraphLaunch(slot->exec, stream));
  return true;
}

bool run_step(DecodeGraphs& graphs, int64_t bs, int64_t table_bucket, const int32_t* host_ints, size_t n_ints,
              cuda::DeviceBuffer& ints, const StepWork& work, cudaStream_t stream) {
  const bool graph = bs > 0 && graphs.launch(bs, table_bucket, host_ints, n_ints, stream, [&](const int32_t* di) {
    work.body(di);
    work.lm_head_pass(di);
  });
  if (graph) return true;
  auto* di = static_cast<int32_t*>(grow_bytes(ints, n_ints * 4));
  FP4MOE_CUDA_CHECK(cudaMemcpyAsync(di, host_ints, n_ints * 4, cudaMemcpyHostToDevice, stream));
  work.body(di);
  (bs > 0 ? work.lm_head_pass : work.run_lm_head)(di);
  return false;
}

void finish_step(StepOutputs& out, std::span<const SeqChunk> batch, const StepBatch& step, bool padded, bool graph,
                 const MoeLayerList& moe, int64_t n_experts,
                 const std::vector<std::unique_ptr<CUevent_st, EventDeleter>>& events, ForwardTrace* trace,
                 cudaStream_t stream) {
  if (padded) out.copy_outputs(step, stream);
  // Per-expert token counts of every MoE layer, copied without a sync (read after the one in finish).
  if (trace != nullptr) out.copy_expert_offsets(moe.offsets, n_experts, stream);
  out.finish(batch, step, moe.layers, trace, stream);
  if (trace != nullptr) {
    trace_layer_times(events, moe, trace);
    if (graph) ++trace->cuda_graph_steps;
  }
}

std::shared_ptr<const tune::ConfigChooser> w4a16_config_chooser() {
  auto chooser = std::make_shared<tune::ConfigChooser>(tune::TuneCache::load(tune::default_cache_path()),
                                                       tune::current_tune_key(), tune::current_gpu_spec());
  chooser->set_fallback([](const tune::GemmShape& shape,
                           int64_t tokens) { return cuda::sm90::w4a16_default_config(tokens, shape.n_experts); },
                        "built-in default");
  return chooser;
}

std::string describe_graphs(const DecodeGraphs& graphs, bool capturable) {
  if (!capturable) return "CUDA graphs: off (a BF16 MoE layer reads its expert offsets on the host)";
  if (graphs.batch_buckets().empty()) return "CUDA graphs: off (--cuda-graph-max-bs 0)";
  std::string s = "CUDA graphs: decode batches";
  for (int64_t b : graphs.batch_buckets()) s.append(" ").append(std::to_string(b));
  return s.append(" (captured on first use)");
}

void trace_layer_times(const std::vector<std::unique_ptr<CUevent_st, EventDeleter>>& events, const MoeLayerList& moe,
                       ForwardTrace* trace) {
  size_t m = 0;  // index into moe.gpu_layers
  for (size_t l = 0; l < moe.is_moe.size(); ++l) {
    float ms_attn = 0.0f, ms_mlp = 0.0f;
    FP4MOE_CUDA_CHECK(cudaEventElapsedTime(&ms_attn, events[2 * l].get(), events[2 * l + 1].get()));
    FP4MOE_CUDA_CHECK(cudaEventElapsedTime(&ms_mlp, events[2 * l + 1].get(), events[2 * l + 2].get()));
    const auto layer = static_cast<int64_t>(l);
    trace->layer_times.push_back({layer, "attention", ms_attn * 1e-3});
    trace->layer_times.push_back({layer, moe.is_moe[l] ? "moe" : "mlp", ms_mlp * 1e-3});
    if (!moe.is_moe[l]) continue;
    const moe::GpuMoeLayer& g = *moe.gpu_layers[m++];
    if (!g.gemm_times_recorded()) continue;
    const moe::GpuMoeLayer::GemmTimes t = g.last_gemm_times();
    trace->layer_times.push_back({layer, "moe.routed_gate_up", t.routed_gate_up});
    trace->layer_times.push_back({layer, "moe.routed_down", t.routed_down});
    if (g.has_shared_expert()) {
      trace->layer_times.push_back({layer, "moe.shared_gate_up", t.shared_gate_up});
      trace->layer_times.push_back({layer, "moe.shared_down", t.shared_down});
    }
  }
}

void rope_tables(int64_t rotary_dim, float theta, int64_t n_positions, cuda::DeviceBuffer& cos,
                 cuda::DeviceBuffer& sin) {
  const std::vector<float> inv_freq = rope_inv_freq(rotary_dim, theta);
  const int64_t half = rotary_dim / 2;
  std::vector<float> c(static_cast<size_t>(n_positions * half)), sn(c.size());
  for (int64_t p = 0; p < n_positions; ++p) rope_cos_sin(inv_freq, p, c.data() + p * half, sn.data() + p * half);
  cos = cuda::DeviceBuffer::from_host(c);
  sin = cuda::DeviceBuffer::from_host(sn);
}

void ModelCommon::open() {
  cudaStream_t s = nullptr;
  FP4MOE_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  stream.reset(s);
  cublasHandle_t h = nullptr;
  FP4MOE_CUBLAS_CHECK(cublasCreate(&h));
  cublas.reset(h);
  bind_cublas(h, s, cublas_workspace_);
  FP4MOE_CUDA_CHECK(cudaGetDevice(&device));
  FP4MOE_CUDA_CHECK(cudaDeviceGetAttribute(&n_sms, cudaDevAttrMultiProcessorCount, device));
  size_t total = 0;
  FP4MOE_CUDA_CHECK(cudaMemGetInfo(&free_at_open_, &total));
}

void ModelCommon::synchronize() const {
  if (stream) cudaStreamSynchronize(stream.get());
}

int64_t ModelCommon::load_embedding(const format::TensorStore& store, int64_t vocab, int64_t hidden) {
  vocab_ = vocab;
  embed = cuda::DeviceBuffer::from_host(load_matrix_bf16(store, "model.embed_tokens.weight", vocab, hidden));
  return static_cast<int64_t>(embed.bytes());
}

int64_t ModelCommon::load_head(const format::TensorStore& store, int64_t hidden, bool tied) {
  FP4MOE_CHECK(vocab_ > 0) << "ModelCommon::load_head before load_embedding (vocab " << vocab_ << ")";
  tied_ = tied;
  final_norm = cuda::DeviceBuffer::from_host(load_vector_f32(store, "model.norm.weight", hidden));
  const kernels::cpu::LinearWeight lm =
      tied ? kernels::cpu::LinearWeight::from_bf16(vocab_, hidden,
                                                   load_matrix_bf16(store, "model.embed_tokens.weight", vocab_, hidden))
           : moe::load_linear(store, "lm_head", vocab_, hidden, false);
  lm_head = GpuLinear::upload(lm, StepOutputs::kLogitRowsPerPass, "lm_head", /*allow_nvfp4=*/false);
  return tied ? 0 : lm_head.device_bytes();
}

void ModelCommon::create_events(size_t n) {
  for (size_t i = 0; i < n; ++i) {
    cudaEvent_t e = nullptr;
    FP4MOE_CUDA_CHECK(cudaEventCreate(&e));
    events.emplace_back(e);
  }
}

std::string ModelCommon::describe_lm_head() const {
  return "  lm_head " + lm_head.describe() + (tied_ ? " (tied)" : "") + "\n";
}

std::shared_ptr<KvBlockPool> ModelCommon::make_kv_pool(const GpuOptions& gopt, int64_t bytes_per_token,
                                                       int64_t n_allocations, std::string& note) const {
  int64_t tokens = gopt.kv_tokens;
  note.clear();
  if (gopt.mem_fraction_static > 0.0) {
    size_t free = 0, total = 0;
    FP4MOE_CUDA_CHECK(cudaMemGetInfo(&free, &total));
    tokens = kv_tokens_for_memory({free, free_at_open_, total, gopt.mem_fraction_static, bytes_per_token,
                                   gopt.page_size, gopt.kv_tokens, n_allocations});
    std::ostringstream o;
    o << " sized by --mem-fraction-static " << gopt.mem_fraction_static << " ("
      << format_gib(static_cast<double>(tokens) * static_cast<double>(bytes_per_token)) << "; "
      << format_gib(static_cast<double>(free_at_open_)) << " were free when the load began, the load took "
      << format_gib(static_cast<double>(free_at_open_) - static_cast<double>(free)) << ")";
    note = o.str();
  }
  return std::make_shared<KvBlockPool>((tokens + gopt.page_size - 1) / gopt.page_size, gopt.page_size);
}

std::string ModelCommon::describe_graphs() const { return gpu_step::describe_graphs(*graphs, moe_layers.capturable); }

void ModelCommon::run(std::span<const SeqChunk> batch, const StepBatch& step, int64_t gbs, const StepIntsLayout& layout,
                      std::span<const int32_t> extra, const Activations& act,
                      const std::function<void(const int32_t* d_ints)>& layers, int64_t n_experts,
                      ForwardTrace* trace) {
  const size_t n_ints = layout.size();
  int32_t* hi = h_ints_.get(n_ints);
  stage_step_ints(batch, step, layout, extra, hi);
  cudaStream_t st = stream.get();
  const int64_t H = act.hidden;
  StepWork work;
  work.body = [&](const int32_t* di) {
    cuda::embedding_bf16(embed.as<bf16>(), vocab_, H, di, layout.n_tokens, act.resid, out->error_flag(), st);
    layers(di);
    cuda::record_timing_event(events.back().get(), st);
    cuda::rms_norm_bf16(act.x, act.resid, final_norm.as<float>(), layout.n_tokens, H, H, act.eps, act.h, st);
  };
  work.lm_head_pass = [&](const int32_t* di) {
    out->lm_head_pass(cublas.get(), lm_head, act.h, di + layout.rows(), layout.n_rows, H, act.x, st);
  };
  work.run_lm_head = [&](const int32_t* di) {
    out->run_lm_head(cublas.get(), lm_head, act.h, di + layout.rows(), step, H, act.x, st);
  };
  const bool graph = run_step(*graphs, gbs, layout.max_blocks, hi, n_ints, ints_, work, st);
  finish_step(*out, batch, step, gbs > 0, graph, moe_layers, n_experts, events, trace, st);
}

}  // namespace fp4moe::model::gpu_step
