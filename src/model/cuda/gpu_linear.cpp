// GpuLinear (see gpu_linear.h). Tested by tests/model/test_gpu_model.cpp.
#include "model/cuda/gpu_linear.h"

#include <algorithm>
#include <set>
#include <sstream>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "kernels/cuda/cublas_check.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/ops/linear_ops.h"
#include "kernels/cuda/sm90/w4a16_dequant.h"
#include "kernels/cuda/sm90/w4a16_grouped_gemm.h"
#include "kernels/cuda/sm90/w4a16_weight_layout.h"
#include "tune/tune_cache.h"

namespace fp4moe::model {

namespace {

using cuda::DeviceBuffer;
using kernels::cpu::LinearWeight;
using kernels::cpu::WeightFormat;

cuda::sm90::W4A16GroupedGemmArgs w4a16_args(const DeviceBuffer& packed, const DeviceBuffer& scales,
                                            const DeviceBuffer& gs, const int32_t* offsets, const __nv_bfloat16* x,
                                            int64_t m, int64_t out, int64_t in, __nv_bfloat16* y) {
  cuda::sm90::W4A16GroupedGemmArgs a;
  a.x = x;
  a.expert_offsets = offsets;
  a.w_packed = packed.as<uint8_t>();
  a.w_scales = scales.as<uint8_t>();
  a.w_global_scales = gs.as<float>();
  a.y = y;
  a.m_total = m;
  a.n = out;
  a.k = in;
  a.n_experts = 1;
  return a;
}

// Whether config `id` takes an [out, in] Linear at m rows (w4a16_check_problem; no device memory
// is read: `dummy`, one small buffer a caller allocates once, only makes the pointers non-null and aligned).
bool takes_shape(const DeviceBuffer& dummy, int id, int64_t m, int64_t out, int64_t in, std::string* why) {
  try {
    cuda::sm90::w4a16_check_problem(
        w4a16_args(dummy, dummy, dummy, nullptr, dummy.as<__nv_bfloat16>(), m, out, in, dummy.as<__nv_bfloat16>()),
        cuda::sm90::w4a16_config(id));
  } catch (const Error& e) {
    if (why != nullptr) *why = e.what();
    return false;
  }
  return true;
}

}  // namespace

GpuLinear GpuLinear::upload(const LinearWeight& w, int64_t max_rows, const std::string& name, bool allow_nvfp4) {
  w.validate();
  FP4MOE_CHECK(max_rows >= 1) << name << ": GpuLinear max_rows=" << max_rows << " must be >= 1";
  GpuLinear g;
  g.name_ = name;
  g.out_ = w.out_features;
  g.in_ = w.in_features;
  g.max_rows_ = max_rows;
  bool nvfp4 = allow_nvfp4 && w.format == WeightFormat::kNVFP4;
  if (nvfp4) {
    // The W4A16 GEMM must take this shape for every default config forward() can pick, at max_rows;
    // else (e.g. out % 8 != 0) the exact BF16 dequantization through cuBLAS instead.
    std::set<int> ids;
    for (int64_t m = 1; m <= 128; ++m) ids.insert(cuda::sm90::w4a16_default_config(m, 1));
    ids.insert(cuda::sm90::w4a16_default_config(max_rows, 1));
    const DeviceBuffer dummy(256);
    for (int id : ids) nvfp4 = nvfp4 && takes_shape(dummy, id, max_rows, g.out_, g.in_, nullptr);
  }
  if (nvfp4) {
    g.path_ = Path::kNvfp4W4A16;
    std::vector<uint8_t> codes_k, scales_k;
    cuda::sm90::w4a16_repack(w.packed.data(), w.scales.data(), 1, g.out_, g.in_, codes_k, scales_k, name.c_str());
    g.packed_ = DeviceBuffer::from_host(codes_k);
    g.scales_ = DeviceBuffer::from_host(scales_k);
    g.global_scale_ = DeviceBuffer::from_host(std::vector<float>{w.global_scale});
  } else {
    g.path_ = Path::kBf16Cublas;
    std::vector<uint16_t> b;
    if (w.format == WeightFormat::kBF16) {
      b = w.bf16;
    } else {  // F32 rounds; NVFP4 dequantizes exactly (e2m1 x e4m3 x gs is a bf16 unless gs adds bits)
      const std::vector<float> f = kernels::cpu::dequantize(w);
      b.resize(f.size());
      std::transform(f.begin(), f.end(), b.begin(), f32_to_bf16);
    }
    g.bf16_ = DeviceBuffer::from_host(b);
  }
  if (w.has_bias()) {
    g.has_bias_ = true;
    g.bias_ = DeviceBuffer::from_host(w.bias);
  }
  return g;
}

void GpuLinear::forward(cublasContext* cublas, const __nv_bfloat16* x, int64_t m, __nv_bfloat16* y,
                        cudaStream_t stream) const {
  FP4MOE_CHECK(m >= 0 && m <= max_rows_) << name_ << ": " << m << " rows outside [0, " << max_rows_ << "] (max_rows)";
  if (m == 0) return;
  const bool dequant = dequant_path(m);  // no host sync: capturable, as the W4A16 path
  if (path_ == Path::kNvfp4W4A16 && !dequant) {
    // No expert offsets: one expert over rows [0, m), m a kernel argument (captured graphs replay theirs).
    auto a = w4a16_args(packed_, scales_, global_scale_, nullptr, x, m, out_, in_, y);
    // Its own workspace, or the dequantization scratch (idle below kLinearDequantMinRows rows).
    const cuda::DeviceBuffer* ws = splitk_workspace_ != nullptr ? splitk_workspace_.get() : dequant_scratch_.get();
    if (ws != nullptr) {  // the split-K partial sums
      a.splitk_workspace = ws->as<float>();
      a.splitk_workspace_bytes = ws->bytes();
    }
    cuda::sm90::w4a16_grouped_gemm(a, w4a16_config(m), stream);
  } else {
    const __nv_bfloat16* w = bf16_.as<__nv_bfloat16>();
    if (dequant) {
      cuda::sm90::W4A16DequantArgs a;
      a.codes = packed_.as<uint8_t>();
      a.scales = scales_.as<uint8_t>();
      a.global_scales = global_scale_.as<float>();
      a.n = out_;
      a.k = in_;
      a.out = dequant_scratch_->as<__nv_bfloat16>();
      cuda::sm90::w4a16_dequant_expert(a, stream);
      w = a.out;
    }
    const float alpha = 1.0f, beta = 0.0f;
    cuda::cublas_bind_stream(cublas, stream);
    // Column-major view: Y^T [out, m] = W [out, in] (stored [in, out] col-major, so OP_T) x X^T [in, m].
    FP4MOE_CUBLAS_CHECK(cublasGemmEx(cublas, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(out_), static_cast<int>(m),
                                     static_cast<int>(in_), &alpha, w, CUDA_R_16BF,
                                     static_cast<int>(in_), x, CUDA_R_16BF, static_cast<int>(in_), &beta, y,
                                     CUDA_R_16BF, static_cast<int>(out_), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  }
  if (has_bias_) cuda::add_bias_bf16(y, bias_.as<float>(), m, out_, out_, stream);
}

void GpuLinear::forward_f32(cublasContext* cublas, const __nv_bfloat16* x, int64_t m, float* y,
                            cudaStream_t stream) const {
  FP4MOE_CHECK(path_ == Path::kBf16Cublas && !has_bias_)
      << name_ << ": f32 output needs the BF16 cuBLAS path without bias (" << describe() << ")";
  FP4MOE_CHECK(m >= 0 && m <= max_rows_) << name_ << ": " << m << " rows outside [0, " << max_rows_ << "] (max_rows)";
  if (m == 0) return;
  const float alpha = 1.0f, beta = 0.0f;
  cuda::cublas_bind_stream(cublas, stream);
  FP4MOE_CUBLAS_CHECK(cublasGemmEx(cublas, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(out_), static_cast<int>(m),
                                   static_cast<int>(in_), &alpha, bf16_.as<__nv_bfloat16>(), CUDA_R_16BF,
                                   static_cast<int>(in_), x, CUDA_R_16BF, static_cast<int>(in_), &beta, y, CUDA_R_32F,
                                   static_cast<int>(out_), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

int64_t GpuLinear::device_bytes() const {
  const int64_t w = path_ == Path::kNvfp4W4A16
                        ? static_cast<int64_t>(packed_.bytes() + scales_.bytes() + global_scale_.bytes())
                        : static_cast<int64_t>(bf16_.bytes());
  return w + (has_bias_ ? out_ * 4 : 0);
}

bool GpuLinear::set_config_chooser(std::shared_ptr<const tune::ConfigChooser> chooser, std::string* why) {
  if (path_ != Path::kNvfp4W4A16 || chooser == nullptr) {
    chooser_ = nullptr;
    return true;
  }
  const tune::GemmShape shape{1, out_, in_};
  const int64_t last = tune::token_bucket(max_rows_);  // forward(m) looks up token_bucket(m) <= this
  const DeviceBuffer dummy(256);
  for (const int64_t bucket : tune::kTokenBuckets) {
    if (bucket > last) break;
    const int id = chooser->choose_config_id(shape, bucket);
    std::string reason;
    if (!takes_shape(dummy, id, max_rows_, out_, in_, &reason)) {
      if (why != nullptr) {
        *why = name_ + " " + shape.to_string() + ": the tune cache's config " +
               cuda::sm90::w4a16_config_name(cuda::sm90::w4a16_config(id)) + " for token bucket " +
               std::to_string(bucket) + " does not take it at " + std::to_string(max_rows_) + " rows (" + reason +
               "); it keeps the built-in defaults";
      }
      chooser_ = nullptr;
      return false;
    }
  }
  chooser_ = std::move(chooser);
  return true;
}

int GpuLinear::w4a16_config(int64_t m) const {
  return chooser_ != nullptr ? chooser_->choose_config_id(tune::GemmShape{1, out_, in_}, m)
                             : cuda::sm90::w4a16_default_config(m, 1);
}

bool GpuLinear::dequant_path(int64_t m) const {
  return path_ == Path::kNvfp4W4A16 && m >= kLinearDequantMinRows && dequant_scratch_ != nullptr &&
         dequant_scratch_->bytes() >= static_cast<size_t>(out_ * in_) * 2;
}

std::shared_ptr<cuda::DeviceBuffer> share_dequant_scratch(const std::vector<GpuLinear*>& linears) {
  int64_t elems = 0;
  for (const GpuLinear* l : linears) {
    if (l->path_ == GpuLinear::Path::kNvfp4W4A16) elems = std::max(elems, l->out_ * l->in_);
  }
  if (elems == 0) return nullptr;
  auto scratch = std::make_shared<cuda::DeviceBuffer>(static_cast<size_t>(elems) * 2);
  for (GpuLinear* l : linears) {
    if (l->path_ == GpuLinear::Path::kNvfp4W4A16) l->dequant_scratch_ = scratch;
  }
  return scratch;
}

std::string describe_dequant_scratch(const std::shared_ptr<cuda::DeviceBuffer>& scratch) {
  if (scratch == nullptr) return "";
  return "  prefill: NVFP4 Linears of >= " + std::to_string(kLinearDequantMinRows) +
         " rows dequantize to bf16 + cuBLAS (scratch " + std::to_string(scratch->bytes()) + " B)\n";
}

std::string GpuLinear::describe() const {
  std::ostringstream os;
  os << (path_ == Path::kNvfp4W4A16 ? "nvfp4_w4a16" : "bf16_cublas") << " [" << out_ << ", " << in_ << "]"
     << (has_bias_ ? " +bias" : "");
  return os.str();
}

}  // namespace fp4moe::model
