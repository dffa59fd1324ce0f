// GpuMoeLayer: the MoE block of moe::MoeLayer on the GPU with BF16 activations:
//   router_logits (f32) -> route_topk (the CPU router's algorithm, kernels/cuda/moe/route_math.h)
//   -> dispatch_plan (offsets, row <-> (token, slot), on the device) -> gather x rows in expert order
//   -> gate_up grouped GEMM with the SwiGLU epilogue (act = silu(gate) * up) -> down grouped GEMM
//   -> combine per token in slot order (+ shared expert, the same GEMMs with E = 1). No atomics: the
//   output is bit-reproducible.
// Two expert-GEMM backends, everything else shared:
//   kNvfp4W4A16  sm90_nvfp4_w4a16_grouped_gemm, one launch per projection for all experts: gate and up
//                are one weight of 2I rows interleaved by 8 (w4a16_repack_gate_up) and the GEMM's
//                kSwiGlu epilogue writes act [rows, I] directly, with gate's and up's own global
//                scales (w_global_scales / w_global_scales_up; ModelOpt checkpoints often share them,
//                then both arrays hold the same values). forward() never synchronizes with the host
//                nor allocates: it can be captured in a CUDA graph for a fixed token count (all
//                scratch is preallocated for max_tokens).
//   kBf16Cublas  the benchmark peer: BF16 weights (the NVFP4 ones dequantized exactly), gate and up
//                stacked as [E, 2I, H] (gate first), one cublasGemmEx per non-empty expert and
//                projection, then the swiglu kernel. The per-expert row counts must be on the host
//                for that, so forward() copies the offsets back and SYNCHRONIZES the stream after the
//                dispatch: not capturable, and its time includes that sync (as any cuBLAS loop would).
// Scratch sizes come from GpuMoeScratchPlan (moe/gpu_moe_plan.h, CPU-tested), and forward() checks
// on the host, before each launch, that the kernel's output extent fits the buffer it writes.
// Tested by tests/moe/test_gpu_moe_layer.cpp (label gpu): kernels vs moe::route / DispatchPlan,
// the layer vs moe::MoeLayer::forward at 1, 7, 64, 300 tokens, golden MoE blocks, graph replay,
// determinism. Timed by `fp4moe bench moe` (tools/bench_moe.h).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kernels/cuda/cuda_handles.h"
#include "kernels/cuda/moe/device_buffer.h"
#include "kernels/cuda/moe/route_math.h"
#include "moe/config.h"
#include "moe/gpu_moe_plan.h"
#include "moe/moe_layer.h"
#include "tune/tune_cache.h"

struct cublasContext;

namespace fp4moe::moe {

enum class GpuExpertGemm : uint8_t { kNvfp4W4A16, kBf16Cublas };

const char* gpu_expert_gemm_name(GpuExpertGemm g);  // "nvfp4_w4a16", "bf16_cublas"

// The routing fields of cfg for the router kernel.
cuda::moe::RouteParams route_params(const MoeConfig& cfg);

// E experts' [n, k] weights of one projection on the device.
struct GpuLinearStack {
  int64_t n_experts = 0, n = 0, k = 0;
  cuda::DeviceBuffer packed;         // NVFP4, the GEMM's kernel layout (w4a16_repack / _gate_up)
  cuda::DeviceBuffer scales;         // NVFP4 e4m3 block scales, the GEMM's kernel layout
  cuda::DeviceBuffer global_scales;  // NVFP4 f32 [E] (gate_up: gate_proj's weight_scale_2)
  cuda::DeviceBuffer global_scales_up;  // NVFP4 gate_up only: f32 [E], up_proj's weight_scale_2
  cuda::DeviceBuffer bf16;           // BF16 [E, n, k]
};

// The routed experts (E of them) or the shared expert (E = 1) as GEMM-ready stacks. gate_up has
// n = 2I rows: NVFP4 interleaved by 8 for the SwiGLU epilogue (w4a16_repack_gate_up), BF16 stacked
// (gate rows 0..I-1, up rows I..2I-1).
struct GpuMlpStack {
  int64_t n_experts = 0, hidden = 0, inter = 0;
  GpuLinearStack gate_up, down;
};

// Synthetic routing for dummy layers (benchmarks). With x ~ U(-1, 1) the router weights U(-a, a),
// a = 3 * logit_sd / sqrt(H), give logits ~ N(0, logit_sd^2) independent per (token, expert); the
// correction bias b_e = -zipf_s * 0.16 * ln(1 + e) then skews the choice sigmoid(logit) + b_e: since
// sigmoid(N(0, 1)) spreads like a Gumbel of scale ~0.16, expert e is chosen with probability roughly
// proportional to (1 + e)^-zipf_s (Gumbel-top-k). zipf_s = 0: uniform routing. The realized
// histogram is what counts: the benchmark measures and prints it.
struct GpuDummyRouting {
  double zipf_s = 0.0;
  double logit_sd = 1.0;
};

// The big transient buffers of forward(): gathered rows, the gate_up / SwiGLU / down outputs, the
// shared expert's, and the dequantized path's bf16 expert weights. All MoE layers of a model run one
// after another on the model's stream and none reads them after its forward, so the layers share
// one set (GpuMoeLayer::workspace() passed to the next layer's from_cpu / dummy): at GLM-5 widths
// and 4352 tokens a step that is ~1.1 GB once instead of per layer. Per layer stay the small
// routing buffers, incl. the expert offsets a step's trace copies after all layers ran. The side
// streams of the NVFP4 layers' concurrent launches are shared the same way (one set, not 6 streams
// a layer): each forward forks them from the caller's stream and joins them back before it returns.
struct GpuMoeWorkspace {
  cuda::DeviceBuffer xp, act, down_out, gu, shared_act, shared_out, shared_gu, w_scratch;
  // Row classes: class i >= 1 launches on class_sides[i - 1], forked from and joined back into the
  // caller's stream (capturable), so that the launches overlap and each one's tail fills with the
  // others' work instead of running one after the other.
  std::vector<cuda::SideStream> class_sides;
  // The shared expert (W4A16 GEMM, not the dequantized path, not under set_gemm_timing) on
  // shared_side, concurrent with the routed GEMMs, forked after the dispatch plan and joined before
  // the combine (capturable); the two split-K workspaces are the halves of w_scratch. At a glm5-shard
  // decode step of batch 64 the routed GEMMs stream at ~34% of HBM, and the shared expert's ~100 us
  // per layer fill that gap (3.71 -> 3.53 ms per step, BENCHMARKS.md 2026-12-04 fifteenth session).
  std::optional<cuda::SideStream> shared_side;
};

// Whether new GpuMoeLayers use expert row classes: true unless FP4MOE_MOE_ROW_CLASSES is "0".
bool gpu_moe_row_classes_default();

class GpuMoeLayer {
 public:
  GpuMoeLayer(GpuMoeLayer&&) noexcept;
  GpuMoeLayer& operator=(GpuMoeLayer&&) noexcept;
  ~GpuMoeLayer();

  // Uploads `layer` (kNvfp4W4A16: its experts must be NVFP4 without bias; kBf16Cublas: any format,
  // dequantized to BF16). Throws naming the part and the numbers, including the GEMM's refusal of a
  // shape (e.g. k % 64 != 0).
  // `share`: another layer's workspace(), used when each of its buffers is large enough (else this
  // layer allocates its own).
  static GpuMoeLayer from_cpu(const MoeLayer& layer, GpuExpertGemm gemm, int64_t max_tokens,
                              std::shared_ptr<GpuMoeWorkspace> share = nullptr);
  // Dummy weights made on the device from `seed` (NVFP4 codes/scales hashed; the BF16 layer holds
  // the exact dequantization of hashed NVFP4 weights of the same distribution). cfg must be the
  // sigmoid family with a correction bias (the routing is forced through it, see GpuDummyRouting).
  static GpuMoeLayer dummy(const MoeConfig& cfg, GpuExpertGemm gemm, int64_t max_tokens,
                           const GpuDummyRouting& routing, uint64_t seed,
                           std::shared_ptr<GpuMoeWorkspace> share = nullptr);

  // y[n_tokens, H] = MoE(x[n_tokens, H]), bf16 device pointers (16 B aligned), 0 <= n_tokens <= max_tokens.
  // Asynchronous on `stream` (kBf16Cublas: synchronizes once, see above). NVFP4 at prefill sizes
  // (gpu_moe_dequant_path: >= kNvfp4DequantMinRows rows per expert on average, not while the stream
  // is being captured) dequantizes each expert's weights to BF16 (w4a16_dequant_expert) and runs the
  // peer's cuBLAS GEMMs, with the same one host sync: the W4A16 GEMM is the faster one below that.
  void forward(const __nv_bfloat16* x, int64_t n_tokens, __nv_bfloat16* y, cudaStream_t stream);

  // With set_gemm_timing(true) (default off) every forward records timing events on its stream
  // around the GEMM phases (graphs captured afterwards included), and last_gemm_times() gives the GPU
  // time of the last forward's phases in seconds: routed gate_up (every class launch, the SwiGLU
  // included), routed down, shared expert gate_up and down (0 without one). Read them once that
  // stream has been synchronized; all 0 before the first timed forward of >= 1 token and while off.
  // (`fp4moe analyze` turns them into per-GEMM rates: the GPU models trace them as parts
  // "moe.routed_gate_up", ... under --time-moe-gemms.) Off by default because the five event nodes
  // per layer cost a replayed glm5-shard decode step (3 MoE layers, batch 64) 3.96 vs 3.70 ms on the
  // H200 (BENCHMARKS.md 2026-12-04 thirteenth session, run 5). Set it before capturing graphs. While
  // on, the shared expert runs after the routed GEMMs on `stream` rather than beside them on
  // the workspace's shared_side, so that each phase is its own interval between events of one stream.
  struct GemmTimes {
    double routed_gate_up = 0, routed_down = 0, shared_gate_up = 0, shared_down = 0;
  };
  void set_gemm_timing(bool on) { gemm_timing_ = on; }
  bool gemm_timing() const { return gemm_timing_; }
  // Whether the last forward recorded the timing events (on, >= 1 token, and it completed).
  bool gemm_times_recorded() const { return timed_; }
  GemmTimes last_gemm_times() const;
  bool has_shared_expert() const { return has_shared_; }

  // What the last forward decided, copied to the host (synchronizes the device; for tests and benches).
  struct Routing {
    std::vector<float> logits;          // [n_tokens, E]
    std::vector<int32_t> topk_idx;      // [n_tokens, k]
    std::vector<float> topk_weights;    // [n_tokens, k]
    std::vector<int32_t> offsets;       // [E + 1]
    std::vector<int32_t> row_token;     // [n_tokens * k]
    std::vector<int32_t> entry_of;      // [n_tokens * k]
  };
  Routing download_routing(int64_t n_tokens) const;
  // The last forward's expert offsets [E + 1] on the device (valid until the next forward), so a
  // caller can copy them asynchronously (per-expert token counts without a host sync).
  const int32_t* device_expert_offsets() const { return offsets_.as<int32_t>(); }

  const MoeConfig& config() const { return cfg_; }
  // The transient buffers this layer uses (shared with the layers that were given it).
  const std::shared_ptr<GpuMoeWorkspace>& workspace() const { return ws_; }
  GpuExpertGemm gemm() const { return gemm_; }
  int64_t max_tokens() const { return max_tokens_; }
  bool capturable() const { return gemm_ == GpuExpertGemm::kNvfp4W4A16; }
  // Whether forward(n_tokens) (outside a capture) dequantizes the NVFP4 experts and runs cuBLAS.
  bool dequant_path(int64_t n_tokens) const {
    return dequant_reachable_ && gpu_moe_dequant_path(n_tokens, cfg_.top_k, cfg_.n_experts);
  }
  // Bytes one routed expert's weights occupy as the GEMMs read them (NVFP4: kernel-layout codes +
  // e4m3 scales, padding included, + global scale; BF16: 2 B per weight); the shared expert's (0
  // without one).
  int64_t routed_expert_bytes() const;
  int64_t shared_expert_bytes() const;
  // "nvfp4_w4a16 E=256 top-8 H=6144 I=2048 shared 2048 swiglu-epilogue, max 4096 tokens"
  // (gs gate != up when some expert's gate and up global scales differ; bf16_cublas: "swiglu-kernel")
  std::string describe() const;
  // The W4A16 config ids forward(n_tokens) launches for the routed experts' and the shared expert's
  // GEMMs (chosen for gpu_moe_tokens_per_expert, moe/gpu_moe_plan.h); for benchmarks that print them.
  // Without a chooser: cuda::sm90::w4a16_default_config. With one (set_config_chooser): the
  // autotuner's cached winner for the gate_up shape (E, 2 I, H) and the token bucket, else the
  // chooser's fallback (tune::ConfigChooser::choose_config: the planner's top choice, or what
  // set_fallback gave it; the GPU models give w4a16_default_config). Decided on the host, so a
  // captured graph keeps the config of its token count.
  void set_config_chooser(std::shared_ptr<const tune::ConfigChooser> chooser) { chooser_ = std::move(chooser); }
  int routed_gemm_config(int64_t n_tokens) const;
  int shared_gemm_config(int64_t n_tokens) const;

  // Expert row classes (NVFP4 W4A16 path; on unless set_row_classes(false)). The routed config above is
  // chosen for the *mean* rows per expert; with skewed routing an expert far above the mean would run
  // through many of its token tiles, its weights read once per tile. So when an expert can hold more
  // rows than that config's token tile (n_tokens > block_t: a token picks an expert once), the routed
  // GEMMs launch twice, each launch skipping the other class's experts by their device-side counts
  // (W4A16GroupedGemmArgs::min/max_expert_rows; no host sync, capturable): experts with at most
  // block_t rows on the routed config, the rest on a ladder of tiles (gpu_moe_row_class_ladder: each
  // doubling of the token tile up to the default config for 4 x block_t rows, 64 to 256), every class
  // after the first on its own side stream concurrent with the first (forked and joined by events:
  // capturable). One launch otherwise.
  using RoutedClass = GpuMoeRowClass;
  // The default is on; FP4MOE_MOE_ROW_CLASSES=0 in the environment turns it off for new layers (A/B).
  std::vector<RoutedClass> routed_gemm_classes(int64_t n_tokens) const;
  void set_row_classes(bool on) { row_classes_ = on; }
  bool row_classes() const { return row_classes_; }
  // "w4a16_stream_m64n16_d8" or "w4a16_stream_m64n16_d8 <=16 + w4a16_wgmma_m128n64_s4 >16"
  std::string routed_gemm_description(int64_t n_tokens) const;

 private:
  GpuMoeLayer() = default;
  void allocate_scratch(std::shared_ptr<GpuMoeWorkspace> share);
  GpuMoeScratchPlan scratch_plan() const;
  // dequant: an NVFP4 layer's prefill path (each expert's weights dequantized into w_scratch_, then
  // cuBLAS, as the kBf16Cublas peer); needs h_offsets.
  // Records `after_gate_up` once act is complete and `after_down` once out is. The W4A16 GEMMs'
  // split-K workspace is `splitk` (a part of the idle w_scratch; empty: no split-K).
  struct SplitKSpace {
    float* ptr = nullptr;
    size_t bytes = 0;
  };
  void run_mlp(const GpuMlpStack& w, const __nv_bfloat16* x, int64_t m, const int32_t* d_offsets,
               const int32_t* h_offsets, const std::vector<RoutedClass>& classes, bool dequant, __nv_bfloat16* gu,
               __nv_bfloat16* act, __nv_bfloat16* out, cudaEvent_t after_gate_up, cudaEvent_t after_down,
               cudaStream_t stream, SplitKSpace splitk);
  // Whether forward(n_tokens) on `stream` takes the NVFP4 dequantized path (never while capturing).
  bool use_dequant_path(int64_t n_tokens, cudaStream_t stream) const;

  MoeConfig cfg_;
  std::shared_ptr<const tune::ConfigChooser> chooser_;
  GpuExpertGemm gemm_ = GpuExpertGemm::kNvfp4W4A16;
  int64_t max_tokens_ = 0;
  cuda::moe::RouteParams route_;
  cuda::DeviceBuffer router_w_;  // f32 [E, H]
  cuda::DeviceBuffer bias_;      // f32 [E] (sigmoid with correction bias)
  GpuMlpStack routed_;
  bool has_shared_ = false;
  GpuMlpStack shared_;
  bool separate_up_scales_ = false;  // some expert's gate and up weight_scale_2 differ (describe())

  // Scratch for max_tokens (T) tokens, R = T * top_k rows.
  cuda::DeviceBuffer logits_, topk_idx_, topk_w_, offsets_, row_token_, entry_of_, shared_offsets_;
  // ws_: xp [R, H], act [R, I], down_out [R, H], shared_act [T, Is], shared_out [T, H], the cuBLAS
  // gate_up outputs gu [R, 2I] and shared_gu [T, 2Is] (W4A16: SwiGLU epilogue, none), and w_scratch,
  // the dequantized path's one expert's bf16 gate_up or down.
  std::shared_ptr<GpuMoeWorkspace> ws_;
  bool dequant_reachable_ = false;     // NVFP4 and max_tokens reaches gpu_moe_dequant_path
  bool row_classes_ = gpu_moe_row_classes_default();  // routed_gemm_classes
  // kBf16Cublas and the dequantized path.
  struct CublasDestroy {
    void operator()(cublasContext* h) const;
  };
  struct PinnedFree {
    void operator()(int32_t* p) const;
  };
  std::unique_ptr<cublasContext, CublasDestroy> cublas_;
  std::unique_ptr<int32_t, PinnedFree> host_offsets_;  // pinned [E + 1]
  // last_gemm_times: before the routed gate_up, after it, after the routed down, after the shared
  // gate_up, after the shared down (timing events); timed_ once a forward recorded them.
  std::unique_ptr<CUevent_st, cuda::EventDeleter> gemm_events_[5];
  bool gemm_timing_ = false;
  bool timed_ = false;
  // Records a timing event on `stream` when gemm_timing_ (cuda::record_timing_event), else nothing.
  void mark(CUevent_st* event, cudaStream_t stream) const;
};

}  // namespace fp4moe::moe
