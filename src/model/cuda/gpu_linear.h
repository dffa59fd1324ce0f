// GpuLinear: one dense Linear y[m, out] = x[m, in] W^T (+ bias) of the GPU model, BF16 activations.
//   - NVFP4 weights stay NVFP4 on the device in the W4A16 kernel layout (w4a16_repack, E = 1) and
//     run through sm90_nvfp4_w4a16_grouped_gemm with expert offsets {0, m} (set by a kernel, so a
//     captured CUDA graph replays its own m);
//   - BF16 (or F32, rounded to bf16) weights run through cublasGemmEx (bf16 in, f32 accumulate).
// An NVFP4 Linear with a dequantization scratch (share_dequant_scratch) runs steps of at least
// kLinearDequantMinRows rows (prefill chunks) as w4a16_dequant_expert into the scratch +
// cublasGemmEx (no host sync: capturable): the W4A16 GEMM is the slower one there. Below that the
// same scratch is the W4A16 GEMM's split-K workspace (w4a16_splitk_plan: a long-K Linear at decode
// fills the GPU with K parts instead of out / 64 CTAs).
// The W4A16 config of an m-row forward is the tune cache's winner for (E = 1, out, in) at m's token
// bucket when the model gave the Linear its config chooser (set_config_chooser: `fp4moe tune --model`
// times these shapes), else w4a16_default_config(m, 1).
// A shape the W4A16 GEMM refuses (out % 8, in % 16) falls back to the BF16 path with the exact
// dequantized weight; describe() says which path each Linear took. The f32 bias is added by
// add_bias_bf16 after the GEMM. The lm_head writes f32 logits (forward_f32, cuBLAS only).
// Tested by tests/model/test_gpu_model.cpp (label gpu) through the whole model vs the golden logits
// and the CPU model.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kernels/cpu/linear.h"
#include "kernels/cuda/moe/device_buffer.h"

struct cublasContext;

namespace fp4moe::tune {
class ConfigChooser;
}

namespace fp4moe::model {

// Rows from which an NVFP4 Linear dequantizes and runs cuBLAS. Decode batches stay on the W4A16 GEMM:
// the dequantization re-reads and rewrites the whole weight every step (2.56 B per weight), and with
// the switch at 128 rows the glm5-shard decode step at batch 256 went from 12.93 to 13.89 ms on the
// H200 (BENCHMARKS.md, fifth session), while prefill chunks of 8192+ tokens gained (217 -> 160 ms).
inline constexpr int64_t kLinearDequantMinRows = 512;

class GpuLinear {
 public:
  enum class Path : uint8_t { kNvfp4W4A16, kBf16Cublas };

  GpuLinear() = default;
  // Uploads `w`. `max_rows` bounds m in forward (checked there; the W4A16 grid is validated for it).
  // `name` names the Linear in errors and describe().
  static GpuLinear upload(const kernels::cpu::LinearWeight& w, int64_t max_rows, const std::string& name,
                          bool allow_nvfp4 = true);

  // y[m, out] (bf16, row stride out) = x[m, in] W^T + bias. m in [0, max_rows].
  void forward(cublasContext* cublas, const __nv_bfloat16* x, int64_t m, __nv_bfloat16* y,
               cudaStream_t stream) const;
  // f32 output (cuBLAS path only: the lm_head).
  void forward_f32(cublasContext* cublas, const __nv_bfloat16* x, int64_t m, float* y, cudaStream_t stream) const;

  int64_t out_features() const { return out_; }
  int64_t in_features() const { return in_; }
  Path path() const { return path_; }
  int64_t device_bytes() const;  // weight + scales (+ bias) as stored on the device
  std::string describe() const;  // "q_proj nvfp4_w4a16 [4096, 6144] +bias"
  // Whether forward(m) dequantizes to the scratch and runs cuBLAS.
  bool dequant_path(int64_t m) const;
  // Whether forward(m) runs the W4A16 GEMM: no cuBLAS handle, no dequantization scratch, only the
  // split-K workspace. With one of its own (set_splitk_workspace) such a forward may run on another
  // stream beside the other Linears' (the GLM-5 model's latent branch).
  bool w4a16_path(int64_t m) const { return path_ == Path::kNvfp4W4A16 && !dequant_path(m); }
  // The W4A16 GEMM's split-K workspace: `ws` instead of the shared dequantization scratch (nullptr:
  // that scratch again). w4a16_splitk_plan cuts no more K parts than it holds.
  void set_splitk_workspace(std::shared_ptr<cuda::DeviceBuffer> ws) { splitk_workspace_ = std::move(ws); }
  // The W4A16 configs from `chooser` (the model's, tune::ConfigChooser with the built-in defaults as
  // its fallback) instead of w4a16_default_config. Refused, keeping the defaults, when a config it picks
  // for a token bucket up to max_rows does not take this Linear's shape at max_rows (a hand-edited
  // cache): returns false with the reason in *why. A BF16 Linear ignores it (returns true).
  bool set_config_chooser(std::shared_ptr<const tune::ConfigChooser> chooser, std::string* why);
  // The config id an m-row forward on the W4A16 GEMM launches.
  int w4a16_config(int64_t m) const;

 private:
  std::string name_;
  Path path_ = Path::kBf16Cublas;
  int64_t out_ = 0, in_ = 0, max_rows_ = 0;
  cuda::DeviceBuffer bf16_;     // kBf16Cublas: [out, in]
  cuda::DeviceBuffer packed_, scales_, global_scale_;  // kNvfp4W4A16
  cuda::DeviceBuffer bias_;     // f32 [out] or empty
  bool has_bias_ = false;
  std::shared_ptr<cuda::DeviceBuffer> dequant_scratch_;  // kNvfp4W4A16: bf16 [out, in] at least, shared
  std::shared_ptr<cuda::DeviceBuffer> splitk_workspace_;  // set_splitk_workspace, else nullptr
  std::shared_ptr<const tune::ConfigChooser> chooser_;    // set_config_chooser, else nullptr (the defaults)

  friend std::shared_ptr<cuda::DeviceBuffer> share_dequant_scratch(const std::vector<GpuLinear*>& linears);
};

// One bf16 scratch for the largest NVFP4 Linear of `linears`, given to each NVFP4 one (they run one
// at a time on the model's stream); nullptr when none is NVFP4.
std::shared_ptr<cuda::DeviceBuffer> share_dequant_scratch(const std::vector<GpuLinear*>& linears);
// The model description's line for it ("" without one).
std::string describe_dequant_scratch(const std::shared_ptr<cuda::DeviceBuffer>& scratch);

}  // namespace fp4moe::model
