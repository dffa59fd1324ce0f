// GpuMoeLayer: uploads a moe::MoeLayer (or makes dummy weights on the device) and runs the MoE block
// with the kernels of kernels/cuda/moe and the W4A16 grouped GEMM (or cuBLAS BF16 for the peer).
// See gpu_moe_layer.h. Tested by tests/moe/test_gpu_moe_layer.cpp (label gpu).
#include "moe/gpu_moe_layer.h"

#include <cublas_v2.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <random>
#include <sstream>
#include <string_view>

#include "core/dtype.h"
#include "core/error.h"
#include "kernels/cpu/linear.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cublas_check.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/moe/moe_kernels.h"
#include "kernels/cuda/nvfp4_dequant.h"
#include "kernels/cuda/sm90/w4a16_dequant.h"
#include "kernels/cuda/sm90/w4a16_grouped_gemm.h"

namespace fp4moe::moe {

namespace {

using cuda::DeviceBuffer;
using kernels::cpu::LinearWeight;
using kernels::cpu::WeightFormat;

// The one place where checkpoint-layout NVFP4 weights ([E, n, k/2] codes, [E, n, k/16] e4m3 scales)
// become the layout the grouped GEMM reads (sm90/w4a16_weight_layout.h, made by w4a16_repack on the
// host, once at load) and are uploaded into w.packed / w.scales.
void upload_gemm_layout(GpuLinearStack& w, const std::vector<uint8_t>& packed, const std::vector<uint8_t>& scales,
                        const std::string& what) {
  std::vector<uint8_t> codes_k, scales_k;
  cuda::sm90::w4a16_repack(packed.data(), scales.data(), w.n_experts, w.n, w.k, codes_k, scales_k, what.c_str());
  w.packed = DeviceBuffer::from_host(codes_k);
  w.scales = DeviceBuffer::from_host(scales_k);
}

// Uploads one NVFP4 Linear [n, k] per expert (all without bias) into `w`, in the kernel layout.
void upload_nvfp4(GpuLinearStack& w, const std::vector<const LinearWeight*>& experts, int64_t n, int64_t k,
                  const std::string& what) {
  const int64_t E = static_cast<int64_t>(experts.size());
  std::vector<uint8_t> packed(static_cast<size_t>(E * n * k / 2)), scales(static_cast<size_t>(E * n * k / 16));
  std::vector<float> gs(static_cast<size_t>(E));
  for (int64_t e = 0; e < E; ++e) {
    const LinearWeight& lw = *experts[e];
    FP4MOE_CHECK(lw.format == WeightFormat::kNVFP4 && !lw.has_bias() && lw.out_features == n && lw.in_features == k)
        << what << " expert " << e << ": the NVFP4 W4A16 path needs NVFP4 weights [" << n << ", " << k
        << "] without bias, found " << lw.describe();
    gs[e] = lw.global_scale;
    std::copy(lw.packed.begin(), lw.packed.end(), packed.begin() + e * n * (k / 2));
    std::copy(lw.scales.begin(), lw.scales.end(), scales.begin() + e * n * (k / 16));
  }
  w.n_experts = E;
  w.n = n;
  w.k = k;
  upload_gemm_layout(w, packed, scales, what);
  w.global_scales = DeviceBuffer::from_host(gs);
}

// Gate and up [inter, hidden] of each MLP as one kernel-layout weight of 2 inter rows interleaved by 8
// for the SwiGLU epilogue (w4a16_repack_gate_up), with gate's and up's global scales in
// w.global_scales / w.global_scales_up. Returns whether some expert's two scales differ.
bool upload_nvfp4_gate_up(GpuLinearStack& w, const std::vector<const GatedMlp*>& mlps, int64_t hidden, int64_t inter,
                          const std::string& what) {
  const int64_t E = static_cast<int64_t>(mlps.size()), cb = inter * hidden / 2, sb = inter * hidden / 16;
  std::vector<uint8_t> gate_codes(static_cast<size_t>(E * cb)), gate_scales(static_cast<size_t>(E * sb));
  std::vector<uint8_t> up_codes(gate_codes.size()), up_scales(gate_scales.size());
  std::vector<float> gs_gate(static_cast<size_t>(E)), gs_up(static_cast<size_t>(E));
  bool differ = false;
  for (int64_t e = 0; e < E; ++e) {
    for (const LinearWeight* lw : {&mlps[e]->gate, &mlps[e]->up}) {
      FP4MOE_CHECK(lw->format == WeightFormat::kNVFP4 && !lw->has_bias() && lw->out_features == inter &&
                   lw->in_features == hidden)
          << what << " expert " << e << ": the NVFP4 W4A16 path needs NVFP4 gate/up weights [" << inter << ", "
          << hidden << "] without bias, found " << lw->describe();
    }
    const LinearWeight &g = mlps[e]->gate, &u = mlps[e]->up;
    std::copy(g.packed.begin(), g.packed.end(), gate_codes.begin() + e * cb);
    std::copy(g.scales.begin(), g.scales.end(), gate_scales.begin() + e * sb);
    std::copy(u.packed.begin(), u.packed.end(), up_codes.begin() + e * cb);
    std::copy(u.scales.begin(), u.scales.end(), up_scales.begin() + e * sb);
    gs_gate[e] = g.global_scale;
    gs_up[e] = u.global_scale;
    differ = differ || g.global_scale != u.global_scale;
  }
  std::vector<uint8_t> codes_k, scales_k;
  cuda::sm90::w4a16_repack_gate_up(gate_codes.data(), gate_scales.data(), up_codes.data(), up_scales.data(), E, inter,
                                   hidden, codes_k, scales_k, what.c_str());
  w.n_experts = E;
  w.n = 2 * inter;
  w.k = hidden;
  w.packed = DeviceBuffer::from_host(codes_k);
  w.scales = DeviceBuffer::from_host(scales_k);
  w.global_scales = DeviceBuffer::from_host(gs_gate);
  w.global_scales_up = DeviceBuffer::from_host(gs_up);
  return differ;
}

// Uploads E Linears [n, k] (row blocks `row0 .. row0 + n` of a stack of `rows_per_expert` rows) as
// BF16 into `w` (the cuBLAS peer: gate_up stacks gate at row 0 and up at row inter).
struct LinearPart {
  const LinearWeight* w;
  int64_t row0;  // first row of the expert's block this Linear fills
};

void upload_bf16(GpuLinearStack& w, const std::vector<std::vector<LinearPart>>& experts, int64_t n, int64_t k,
                 const std::string& what) {
  const int64_t E = static_cast<int64_t>(experts.size());
  std::vector<uint16_t> host(static_cast<size_t>(E * n * k));
  for (int64_t e = 0; e < E; ++e) {
    for (const LinearPart& part : experts[e]) {
      FP4MOE_CHECK(!part.w->has_bias() && part.w->in_features == k)
          << what << " expert " << e << ": expected weights [*, " << k << "] without bias, found " << part.w->describe();
      const std::vector<float> f = kernels::cpu::dequantize(*part.w);  // exact ModelOpt order for NVFP4
      uint16_t* dst = host.data() + (e * n + part.row0) * k;
      for (size_t i = 0; i < f.size(); ++i) dst[i] = f32_to_bf16(f[i]);
    }
  }
  w.n_experts = E;
  w.n = n;
  w.k = k;
  w.bf16 = DeviceBuffer::from_host(host);
}

GpuMlpStack upload_mlps(const std::vector<const GatedMlp*>& mlps, GpuExpertGemm gemm, int64_t hidden,
                        int64_t inter, const std::string& what, bool& separate_up_scales) {
  GpuMlpStack s;
  s.n_experts = static_cast<int64_t>(mlps.size());
  s.hidden = hidden;
  s.inter = inter;
  if (gemm == GpuExpertGemm::kNvfp4W4A16) {
    std::vector<const LinearWeight*> down;
    for (const GatedMlp* m : mlps) down.push_back(&m->down);
    separate_up_scales = upload_nvfp4_gate_up(s.gate_up, mlps, hidden, inter, what + " gate_up") || separate_up_scales;
    upload_nvfp4(s.down, down, hidden, inter, what + " down");
  } else {
    std::vector<std::vector<LinearPart>> gate_up, down;
    for (const GatedMlp* m : mlps) {
      gate_up.push_back({{&m->gate, 0}, {&m->up, inter}});
      down.push_back({{&m->down, 0}});
    }
    upload_bf16(s.gate_up, gate_up, 2 * inter, hidden, what + " gate_up");
    upload_bf16(s.down, down, hidden, inter, what + " down");
  }
  return s;
}

// Dummy [E, n, k] weights: hashed codes, e4m3 scales in [0.5, 1.875], global scale 0.3 / sqrt(k)
// (weights of rms ~1 / sqrt(k), so activations stay O(1) through the layer). NVFP4: when the kernel
// layout has no padding (n % 16 == 0, k % 512 == 0: whole row tiles and scale groups) it is a
// permutation of the checkpoint bytes (for gate_up, of gate and up interleaved by 8 rows, itself a
// permutation), so hashed bytes written straight into it are random weights of the same
// distribution (no 5 GB host repack for E = 256); otherwise the checkpoint layout is made on the
// device, copied back and repacked (gate_up: rows 0..I-1 of each expert as gate, I..2I-1 as up,
// through w4a16_repack_gate_up). Gate and up get the same global scale, so gate_up leaves
// global_scales_up empty (the GEMM then uses global_scales for both halves). BF16: the exact
// dequantization of hashed checkpoint-layout bytes, stacked (same distribution, not the same values).
void dummy_stack(GpuLinearStack& w, GpuExpertGemm gemm, int64_t E, int64_t n, int64_t k, bool gate_up, uint64_t seed) {
  w.n_experts = E;
  w.n = n;
  w.k = k;
  const float gs = static_cast<float>(0.3 / std::sqrt(static_cast<double>(k)));
  const int64_t n_codes = E * n * k / 2, n_scales = E * n * k / 16;
  if (gemm == GpuExpertGemm::kNvfp4W4A16) {
    w.global_scales = DeviceBuffer::from_host(std::vector<float>(static_cast<size_t>(E), gs));
    if (n % 16 == 0 && k % 512 == 0) {
      const int64_t codes_k = cuda::sm90::w4a16_codes_bytes(E, n, k), scales_k = cuda::sm90::w4a16_scales_bytes(E, n, k);
      FP4MOE_CHECK(codes_k == n_codes && scales_k == n_scales)
          << "dummy weights [" << E << ", " << n << ", " << k << "]: kernel layout " << codes_k << " + " << scales_k
          << " B, expected no padding (" << n_codes << " + " << n_scales << " B)";
      w.packed = DeviceBuffer(static_cast<size_t>(codes_k));
      w.scales = DeviceBuffer(static_cast<size_t>(scales_k));
      cuda::moe::fill_hash_bytes(w.packed.as<uint8_t>(), codes_k, seed * 2 + 0, 0x00, 0xFF, nullptr);
      // Kernel-layout scale bytes (ue5m3, w4a16_weight_layout.h) of the e4m3 codes 0x30..0x3F.
      cuda::moe::fill_hash_bytes(w.scales.as<uint8_t>(), scales_k, seed * 2 + 1,
                                 static_cast<uint8_t>(cuda::sm90::w4a16_scale_byte(0x30)), 0x0F, nullptr);
      return;
    }
  }
  DeviceBuffer packed(static_cast<size_t>(n_codes)), scales(static_cast<size_t>(n_scales));
  cuda::moe::fill_hash_bytes(packed.as<uint8_t>(), n_codes, seed * 2 + 0, 0x00, 0xFF, nullptr);
  cuda::moe::fill_hash_bytes(scales.as<uint8_t>(), n_scales, seed * 2 + 1, 0x30, 0x0F, nullptr);
  if (gemm == GpuExpertGemm::kNvfp4W4A16) {
    const std::vector<uint8_t> codes_h = packed.to_host<uint8_t>(static_cast<size_t>(n_codes));
    const std::vector<uint8_t> scales_h = scales.to_host<uint8_t>(static_cast<size_t>(n_scales));
    if (!gate_up) {
      upload_gemm_layout(w, codes_h, scales_h, "dummy weight");
      return;
    }
    const int64_t inter = n / 2, cb = inter * k / 2, sb = inter * k / 16;
    std::vector<uint8_t> gc(static_cast<size_t>(E * cb)), gsc(static_cast<size_t>(E * sb)), uc(gc.size()), usc(gsc.size());
    for (int64_t e = 0; e < E; ++e) {  // expert e's rows: gate then up
      std::copy_n(codes_h.begin() + e * 2 * cb, cb, gc.begin() + e * cb);
      std::copy_n(codes_h.begin() + e * 2 * cb + cb, cb, uc.begin() + e * cb);
      std::copy_n(scales_h.begin() + e * 2 * sb, sb, gsc.begin() + e * sb);
      std::copy_n(scales_h.begin() + e * 2 * sb + sb, sb, usc.begin() + e * sb);
    }
    std::vector<uint8_t> codes_k, scales_k;
    cuda::sm90::w4a16_repack_gate_up(gc.data(), gsc.data(), uc.data(), usc.data(), E, inter, k, codes_k, scales_k,
                                     "dummy gate_up");
    w.packed = DeviceBuffer::from_host(codes_k);
    w.scales = DeviceBuffer::from_host(scales_k);
  } else {
    w.bf16 = DeviceBuffer(static_cast<size_t>(E * n * k) * 2);
    cuda::nvfp4_dequant_to_bf16(packed.as<uint8_t>(), scales.as<uint8_t>(), gs, E * n, k,
                                w.bf16.as<__nv_bfloat16>(), nullptr);
    FP4MOE_CUDA_CHECK(cudaDeviceSynchronize());  // before `packed` and `scales` are freed
  }
}

GpuMlpStack dummy_mlps(GpuExpertGemm gemm, int64_t E, int64_t hidden, int64_t inter, uint64_t seed) {
  GpuMlpStack s;
  s.n_experts = E;
  s.hidden = hidden;
  s.inter = inter;
  dummy_stack(s.gate_up, gemm, E, 2 * inter, hidden, /*gate_up=*/true, seed * 3 + 0);
  dummy_stack(s.down, gemm, E, hidden, inter, /*gate_up=*/false, seed * 3 + 1);
  return s;
}

int64_t stack_bytes(const GpuLinearStack& w, GpuExpertGemm gemm) {
  if (w.n_experts == 0) return 0;
  const int64_t nk = w.n * w.k;
  const int64_t n_global = w.global_scales_up.empty() ? 1 : 2;
  return gemm == GpuExpertGemm::kNvfp4W4A16
             ? (cuda::sm90::w4a16_codes_bytes(1, w.n, w.k) + cuda::sm90::w4a16_scales_bytes(1, w.n, w.k) + 4 * n_global)
             : nk * 2;
}

int64_t mlp_bytes_per_expert(const GpuMlpStack& s, GpuExpertGemm gemm) {
  return stack_bytes(s.gate_up, gemm) + stack_bytes(s.down, gemm);
}

// The GEMM arguments of one projection: gate_up with the SwiGLU epilogue (y = act [m, n / 2]; up's
// global scales, or gate's when the stack has none of its own), down plain (y [m, n]).
cuda::sm90::W4A16GroupedGemmArgs nvfp4_args(const GpuLinearStack& w, bool swiglu, const __nv_bfloat16* x, int64_t m,
                                            const int32_t* d_offsets, __nv_bfloat16* y) {
  cuda::sm90::W4A16GroupedGemmArgs a;
  a.x = x;
  a.expert_offsets = d_offsets;
  a.w_packed = w.packed.as<uint8_t>();
  a.w_scales = w.scales.as<uint8_t>();
  a.w_global_scales = w.global_scales.as<float>();
  if (swiglu) {
    a.epilogue = cuda::sm90::W4A16Epilogue::kSwiGlu;
    a.w_global_scales_up = w.global_scales_up.empty() ? w.global_scales.as<float>() : w.global_scales_up.as<float>();
  }
  a.y = y;
  a.m_total = m;
  a.n = w.n;
  a.k = w.k;
  a.n_experts = w.n_experts;
  return a;
}

// Throws unless `elems` elements of `elem_bytes` fit `buf` (the host-side guard before each launch).
void check_fits(const DeviceBuffer& buf, int64_t elems, size_t elem_bytes, const char* what) {
  FP4MOE_CHECK(elems >= 0 && static_cast<size_t>(elems) * elem_bytes <= buf.bytes())
      << "GpuMoeLayer::forward: " << what << " would write " << elems << " x " << elem_bytes << " B into a buffer of "
      << buf.bytes() << " B";
}

// Refuses, at construction, a shape the GEMM cannot run (its own message, e.g. k % 16), for every
// config the default chooser can return and the largest m_total (the grid grows with it).
void check_nvfp4_gemm(const GpuLinearStack& w, bool swiglu, int64_t max_rows, const std::string& what) {
  DeviceBuffer dummy_offsets(static_cast<size_t>(w.n_experts + 1) * 4);
  DeviceBuffer io(256);
  cuda::sm90::W4A16GroupedGemmArgs a =
      nvfp4_args(w, swiglu, io.as<__nv_bfloat16>(), max_rows, dummy_offsets.as<int32_t>(), io.as<__nv_bfloat16>());
  std::vector<int> ids;
  for (int64_t v = 1; v <= 256; ++v) {  // incl. the row classes' large tiles
    ids.push_back(cuda::sm90::w4a16_default_config(v, w.n_experts));
  }
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  for (int id : ids) {
    try {
      cuda::sm90::w4a16_check_problem(a, cuda::sm90::w4a16_config(id));
    } catch (const Error& err) {
      FP4MOE_FAIL() << what << " [E=" << w.n_experts << ", n=" << w.n << ", k=" << w.k
                    << "]: the W4A16 grouped GEMM refuses the shape: " << err.what();
    }
  }
}

// Y[m, n] = X[m, k] W[n, k]^T in BF16 with f32 accumulation (cuBLAS is column-major: Y^T = W X^T).
void cublas_bf16_gemm(cublasHandle_t h, const __nv_bfloat16* w, const __nv_bfloat16* x, int64_t m, int64_t n,
                      int64_t k, __nv_bfloat16* y) {
  const float alpha = 1.0f, beta = 0.0f;
  FP4MOE_CUBLAS_CHECK(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(n), static_cast<int>(m),
                                   static_cast<int>(k), &alpha, w, CUDA_R_16BF, static_cast<int>(k), x, CUDA_R_16BF,
                                   static_cast<int>(k), &beta, y, CUDA_R_16BF, static_cast<int>(n),
                                   CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

}  // namespace

const char* gpu_expert_gemm_name(GpuExpertGemm g) {
  return g == GpuExpertGemm::kNvfp4W4A16 ? "nvfp4_w4a16" : "bf16_cublas";
}

cuda::moe::RouteParams route_params(const MoeConfig& cfg) {
  cfg.validate();
  cuda::moe::RouteParams p;
  p.n_experts = cfg.n_experts;
  p.top_k = cfg.top_k;
  p.n_group = cfg.n_group;
  p.topk_group = cfg.topk_group;
  p.sigmoid = cfg.scoring == ScoringFunc::kSigmoid ? 1 : 0;
  p.has_bias = p.sigmoid && cfg.correction_bias ? 1 : 0;
  p.norm_topk_prob = cfg.norm_topk_prob ? 1 : 0;
  p.routed_scaling_factor = cfg.routed_scaling_factor;
  p.masked_fill_value = cfg.masked_fill_value;
  return p;
}

void GpuMoeLayer::CublasDestroy::operator()(cublasContext* h) const { cublasDestroy(h); }
void GpuMoeLayer::PinnedFree::operator()(int32_t* p) const { cudaFreeHost(p); }

GpuMoeLayer::GpuMoeLayer(GpuMoeLayer&&) noexcept = default;
GpuMoeLayer& GpuMoeLayer::operator=(GpuMoeLayer&&) noexcept = default;
GpuMoeLayer::~GpuMoeLayer() = default;

GpuMoeLayer GpuMoeLayer::from_cpu(const MoeLayer& layer, GpuExpertGemm gemm, int64_t max_tokens,
                                  std::shared_ptr<GpuMoeWorkspace> share) {
  const MoeConfig& cfg = layer.config();
  FP4MOE_CHECK(max_tokens >= 1) << layer.prefix() << ": GpuMoeLayer max_tokens=" << max_tokens << " must be >= 1";
  FP4MOE_CHECK(!layer.router().has_bias()) << layer.prefix() << ".gate: a router bias is not supported on the GPU ("
                                           << layer.router().describe() << ")";
  GpuMoeLayer g;
  g.cfg_ = cfg;
  g.gemm_ = gemm;
  g.max_tokens_ = max_tokens;
  g.route_ = route_params(cfg);
  g.router_w_ = DeviceBuffer::from_host(kernels::cpu::dequantize(layer.router()));
  if (g.route_.has_bias) g.bias_ = DeviceBuffer::from_host(layer.correction_bias());
  std::vector<const GatedMlp*> experts;
  for (const GatedMlp& m : layer.experts()) experts.push_back(&m);
  g.routed_ = upload_mlps(experts, gemm, cfg.hidden, cfg.moe_intermediate, layer.prefix() + ".experts",
                          g.separate_up_scales_);
  if (layer.shared()) {
    g.has_shared_ = true;
    g.shared_ = upload_mlps({&*layer.shared()}, gemm, cfg.hidden, cfg.shared_intermediate(),
                            layer.prefix() + ".shared_experts", g.separate_up_scales_);
  }
  g.allocate_scratch(std::move(share));
  // The uploads above are pageable cudaMemcpy calls, which may return before their DMA lands and are
  // not ordered with a cudaStreamNonBlocking stream: finish them before a forward can read them.
  FP4MOE_CUDA_CHECK(cudaDeviceSynchronize());
  return g;
}

GpuMoeLayer GpuMoeLayer::dummy(const MoeConfig& cfg, GpuExpertGemm gemm, int64_t max_tokens,
                               const GpuDummyRouting& routing, uint64_t seed,
                               std::shared_ptr<GpuMoeWorkspace> share) {
  cfg.validate();
  FP4MOE_CHECK(cfg.scoring == ScoringFunc::kSigmoid && cfg.correction_bias)
      << "GpuMoeLayer::dummy: the routing is forced through e_score_correction_bias, so the config must be the "
         "sigmoid family with a correction bias, got "
      << cfg.to_string();
  FP4MOE_CHECK(max_tokens >= 1) << "GpuMoeLayer::dummy: max_tokens=" << max_tokens << " must be >= 1";
  GpuMoeLayer g;
  g.cfg_ = cfg;
  g.gemm_ = gemm;
  g.max_tokens_ = max_tokens;
  g.route_ = route_params(cfg);
  std::mt19937_64 rng(seed);
  const double a = 3.0 * routing.logit_sd / std::sqrt(static_cast<double>(cfg.hidden));
  std::uniform_real_distribution<float> u(static_cast<float>(-a), static_cast<float>(a));
  std::vector<float> wg(static_cast<size_t>(cfg.n_experts * cfg.hidden));
  for (float& v : wg) v = u(rng);
  std::vector<float> bias(static_cast<size_t>(cfg.n_experts));
  for (int e = 0; e < cfg.n_experts; ++e) bias[e] = static_cast<float>(-routing.zipf_s * 0.16 * std::log1p(e));
  g.router_w_ = DeviceBuffer::from_host(wg);
  g.bias_ = DeviceBuffer::from_host(bias);
  g.routed_ = dummy_mlps(gemm, cfg.n_experts, cfg.hidden, cfg.moe_intermediate, seed * 16 + 1);
  if (cfg.n_shared_experts > 0) {
    g.has_shared_ = true;
    g.shared_ = dummy_mlps(gemm, 1, cfg.hidden, cfg.shared_intermediate(), seed * 16 + 2);
  }
  FP4MOE_CUDA_CHECK(cudaDeviceSynchronize());
  g.allocate_scratch(std::move(share));
  return g;
}

GpuMoeScratchPlan GpuMoeLayer::scratch_plan() const {
  GpuMoeScratchPlan p;
  p.max_tokens = max_tokens_;
  p.top_k = cfg_.top_k;
  p.n_experts = cfg_.n_experts;
  p.hidden = cfg_.hidden;
  p.inter = cfg_.moe_intermediate;
  p.has_shared = has_shared_;
  p.shared_inter = has_shared_ ? cfg_.shared_intermediate() : 0;
  p.bf16_gate_up = gemm_ == GpuExpertGemm::kBf16Cublas || dequant_reachable_;
  return p;
}

void GpuMoeLayer::allocate_scratch(std::shared_ptr<GpuMoeWorkspace> share) {
  const int64_t T = max_tokens_, K = cfg_.top_k, E = cfg_.n_experts, H = cfg_.hidden, I = cfg_.moe_intermediate;
  const int64_t R = T * K;
  FP4MOE_CHECK(H % 8 == 0 && I % 8 == 0 && E <= cuda::moe::kMaxDispatchExperts && R <= 0x7fffffff)
      << "GpuMoeLayer: H=" << H << " and I=" << I << " must be multiples of 8, E=" << E << " <= "
      << cuda::moe::kMaxDispatchExperts << ", max_tokens * top_k = " << R << " must fit int32";
  if (gemm_ == GpuExpertGemm::kNvfp4W4A16) {
    const std::string what = "GpuMoeLayer (" + cfg_.to_string() + ")";
    check_nvfp4_gemm(routed_.gate_up, true, R, what + " routed gate_up");
    check_nvfp4_gemm(routed_.down, false, R, what + " routed down");
    if (has_shared_) {
      check_nvfp4_gemm(shared_.gate_up, true, T, what + " shared gate_up");
      check_nvfp4_gemm(shared_.down, false, T, what + " shared down");
    }
  }
  dequant_reachable_ = gemm_ == GpuExpertGemm::kNvfp4W4A16 && gpu_moe_dequant_path(T, K, E);
  const GpuMoeScratchPlan plan = scratch_plan();
  const GpuMoeScratchPlan::Sizes c = plan.capacity();
  auto bytes = [](int64_t elems, size_t elem_bytes) { return static_cast<size_t>(elems) * elem_bytes; };
  logits_ = DeviceBuffer(bytes(c.logits, 4));
  topk_idx_ = DeviceBuffer(bytes(c.topk, 4));
  topk_w_ = DeviceBuffer(bytes(c.topk, 4));
  offsets_ = DeviceBuffer(bytes(c.offsets, 4));
  row_token_ = DeviceBuffer(bytes(c.rows, 4));
  entry_of_ = DeviceBuffer(bytes(c.rows, 4));
  shared_offsets_ = DeviceBuffer(2 * 4);
  const int64_t Is = has_shared_ ? cfg_.shared_intermediate() : 0;
  const size_t w_scratch_bytes = dequant_reachable_ ? static_cast<size_t>(std::max(2 * I * H, 2 * Is * H)) * 2 : 0;
  const struct {
    DeviceBuffer GpuMoeWorkspace::*buf;
    size_t bytes;
  } need[] = {{&GpuMoeWorkspace::xp, bytes(c.xp, 2)},
              {&GpuMoeWorkspace::act, bytes(c.act, 2)},
              {&GpuMoeWorkspace::down_out, bytes(c.down_out, 2)},
              {&GpuMoeWorkspace::gu, bytes(c.gu, 2)},
              {&GpuMoeWorkspace::shared_gu, bytes(c.shared_gu, 2)},
              {&GpuMoeWorkspace::shared_act, bytes(c.shared_act, 2)},
              {&GpuMoeWorkspace::shared_out, bytes(c.shared_out, 2)},
              {&GpuMoeWorkspace::w_scratch, w_scratch_bytes}};
  bool fits = share != nullptr;
  for (const auto& n : need) fits = fits && ((*share).*n.buf).bytes() >= n.bytes;
  if (fits) {
    ws_ = std::move(share);
  } else {
    ws_ = std::make_shared<GpuMoeWorkspace>();
    for (const auto& n : need) {
      if (n.bytes > 0) (*ws_).*n.buf = DeviceBuffer(n.bytes);
    }
  }
  if (gemm_ == GpuExpertGemm::kBf16Cublas || dequant_reachable_) {
    cublasHandle_t h = nullptr;
    FP4MOE_CUBLAS_CHECK(cublasCreate(&h));
    cublas_.reset(h);
    int32_t* p = nullptr;
    FP4MOE_CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&p), static_cast<size_t>(E + 1) * 4));
    host_offsets_.reset(p);
  }
  for (auto& ev : gemm_events_) {
    cudaEvent_t e = nullptr;
    FP4MOE_CUDA_CHECK(cudaEventCreate(&e));
    ev.reset(e);
  }
  if (gemm_ == GpuExpertGemm::kNvfp4W4A16) {  // the workspace's side streams (see GpuMoeWorkspace)
    if (ws_->class_sides.size() < kGpuMoeMaxRowClasses - 1) ws_->class_sides.resize(kGpuMoeMaxRowClasses - 1);
    if (!ws_->shared_side) ws_->shared_side.emplace();
  }
}

int GpuMoeLayer::routed_gemm_config(int64_t n_tokens) const {
  const int64_t tpe = gpu_moe_tokens_per_expert(n_tokens, cfg_.top_k, cfg_.n_experts);
  if (chooser_ != nullptr) {
    return chooser_->choose_config_id(tune::GemmShape{cfg_.n_experts, 2 * cfg_.moe_intermediate, cfg_.hidden}, tpe);
  }
  return cuda::sm90::w4a16_default_config(tpe, cfg_.n_experts);
}

int GpuMoeLayer::shared_gemm_config(int64_t n_tokens) const {
  const int64_t tpe = gpu_moe_tokens_per_expert(n_tokens, 1, 1);
  if (chooser_ != nullptr && cfg_.n_shared_experts > 0) {
    return chooser_->choose_config_id(tune::GemmShape{1, 2 * cfg_.shared_intermediate(), cfg_.hidden}, tpe);
  }
  return cuda::sm90::w4a16_default_config(tpe, 1);
}

bool gpu_moe_row_classes_default() {
  const char* v = std::getenv("FP4MOE_MOE_ROW_CLASSES");
  return v == nullptr || std::string_view(v) != "0";
}

std::vector<GpuMoeLayer::RoutedClass> GpuMoeLayer::routed_gemm_classes(int64_t n_tokens) const {
  const int c0 = routed_gemm_config(n_tokens);
  const int32_t t0 = static_cast<int32_t>(cuda::sm90::w4a16_config(c0).block_t);
  if (!row_classes_ || gemm_ != GpuExpertGemm::kNvfp4W4A16) return {RoutedClass{c0}};
  return gpu_moe_row_class_ladder(c0, t0, n_tokens, [this](int64_t rows) {
    const int id = cuda::sm90::w4a16_default_config(rows, cfg_.n_experts);
    return std::pair<int, int32_t>{id, static_cast<int32_t>(cuda::sm90::w4a16_config(id).block_t)};
  });
}

std::string GpuMoeLayer::routed_gemm_description(int64_t n_tokens) const {
  const std::vector<RoutedClass> classes = routed_gemm_classes(n_tokens);
  std::string s;
  for (const RoutedClass& c : classes) {
    if (!s.empty()) s += " + ";
    s += cuda::sm90::w4a16_config_name(cuda::sm90::w4a16_config(c.config_id));
    if (classes.size() > 1) s += c.min_rows == 0 ? " <=" + std::to_string(c.max_rows) : " >" + std::to_string(c.min_rows - 1);
  }
  return s;
}

bool GpuMoeLayer::use_dequant_path(int64_t n_tokens, cudaStream_t stream) const {
  if (!dequant_reachable_ || !gpu_moe_dequant_path(n_tokens, cfg_.top_k, cfg_.n_experts)) return false;
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  FP4MOE_CUDA_CHECK(cudaStreamIsCapturing(stream, &capture));
  return capture == cudaStreamCaptureStatusNone;
}

// W4A16: act = SwiGLU(x W_gate_up^T) in one GEMM (the kSwiGlu epilogue), out = act W_down^T.
// cuBLAS (the BF16 peer, or NVFP4 dequantized expert by expert into ws_->w_scratch): gu = x W_gate_up^T
// per expert, act = swiglu(gu), out = act W_down^T per expert.
void GpuMoeLayer::run_mlp(const GpuMlpStack& w, const __nv_bfloat16* x, int64_t m, const int32_t* d_offsets,
                          const int32_t* h_offsets, const std::vector<RoutedClass>& classes, bool dequant,
                          __nv_bfloat16* gu, __nv_bfloat16* act, __nv_bfloat16* out, cudaEvent_t after_gate_up,
                          cudaEvent_t after_down, cudaStream_t stream, SplitKSpace splitk) {
  const int64_t H = w.hidden, I = w.inter;
  if (gemm_ == GpuExpertGemm::kNvfp4W4A16 && !dequant) {
    // w4a16_splitk_plan splits only launches with few CTAs (e.g. the shared expert at decode; not a
    // row class) and into no more parts than the workspace holds. Each class's launch writes its
    // experts' rows of act / out.
    for (const bool gate_up : {true, false}) {
      auto a = gate_up ? nvfp4_args(w.gate_up, true, x, m, d_offsets, act) : nvfp4_args(w.down, false, act, m, d_offsets, out);
      a.splitk_workspace = splitk.ptr;
      a.splitk_workspace_bytes = splitk.bytes;
      auto launch = [&](const RoutedClass& c, cudaStream_t on) {
        a.min_expert_rows = c.min_rows;
        a.max_expert_rows = c.max_rows;
        cuda::sm90::w4a16_grouped_gemm(a, c.config_id, on);
      };
      if (classes.size() == 1) {
        launch(classes[0], stream);
      } else {
        // The classes write disjoint rows (different experts): the later ones each on a side stream,
        // concurrent with the first, joined before the next GEMM reads act / out.
        std::vector<cuda::SideStream>& sides = ws_->class_sides;
        FP4MOE_CHECK(classes.size() <= sides.size() + 1)
            << "GpuMoeLayer: " << classes.size() << " row classes, streams for " << sides.size() + 1;
        for (size_t i = 1; i < classes.size(); ++i) launch(classes[i], sides[i - 1].fork(stream));
        launch(classes[0], stream);
        for (size_t i = 1; i < classes.size(); ++i) sides[i - 1].join(stream);
      }
      mark(gate_up ? after_gate_up : after_down, stream);
    }
    return;
  }
  // Expert e's bf16 weight: the peer's stack, or the dequantization (stream-ordered reuse of one buffer).
  auto weight = [&](const GpuLinearStack& s, int64_t e, bool gate_up) -> const __nv_bfloat16* {
    if (!dequant) return s.bf16.as<__nv_bfloat16>() + e * s.n * s.k;
    cuda::sm90::W4A16DequantArgs a;
    a.codes = s.packed.as<uint8_t>();
    a.scales = s.scales.as<uint8_t>();
    a.global_scales = s.global_scales.as<float>();
    a.global_scales_up = gate_up && !s.global_scales_up.empty() ? s.global_scales_up.as<float>() : nullptr;
    a.expert = e;
    a.n = s.n;
    a.k = s.k;
    a.gate_up = gate_up;
    a.out = ws_->w_scratch.as<__nv_bfloat16>();
    cuda::sm90::w4a16_dequant_expert(a, stream);
    return a.out;
  };
  cublasHandle_t h = cublas_.get();
  FP4MOE_CUBLAS_CHECK(cublasSetStream(h, stream));
  for (int64_t e = 0; e < w.n_experts; ++e) {
    const int64_t r0 = h_offsets[e], rows = h_offsets[e + 1] - h_offsets[e];
    if (rows == 0) continue;
    cublas_bf16_gemm(h, weight(w.gate_up, e, true), x + r0 * H, rows, 2 * I, H, gu + r0 * 2 * I);
  }
  cuda::moe::swiglu(gu, gu + I, 2 * I, m, I, act, stream);
  mark(after_gate_up, stream);
  for (int64_t e = 0; e < w.n_experts; ++e) {
    const int64_t r0 = h_offsets[e], rows = h_offsets[e + 1] - h_offsets[e];
    if (rows == 0) continue;
    cublas_bf16_gemm(h, weight(w.down, e, false), act + r0 * I, rows, H, I, out + r0 * H);
  }
  mark(after_down, stream);
}

void GpuMoeLayer::mark(CUevent_st* event, cudaStream_t stream) const {
  if (gemm_timing_) cuda::record_timing_event(event, stream);
}

GpuMoeLayer::GemmTimes GpuMoeLayer::last_gemm_times() const {
  GemmTimes t;
  if (!timed_) return t;
  double* parts[4] = {&t.routed_gate_up, &t.routed_down, &t.shared_gate_up, &t.shared_down};
  for (int i = 0; i < 4; ++i) {
    float ms = 0.0f;
    FP4MOE_CUDA_CHECK(cudaEventElapsedTime(&ms, gemm_events_[i].get(), gemm_events_[i + 1].get()));
    *parts[i] = static_cast<double>(ms) * 1e-3;
  }
  return t;
}

void GpuMoeLayer::forward(const __nv_bfloat16* x, int64_t n_tokens, __nv_bfloat16* y, cudaStream_t stream) {
  FP4MOE_CHECK(n_tokens >= 0 && n_tokens <= max_tokens_)
      << "GpuMoeLayer::forward: n_tokens=" << n_tokens << " outside [0, " << max_tokens_ << "] (max_tokens)";
  timed_ = false;  // until every timing event of this forward has been recorded (a throw below leaves it false)
  if (n_tokens == 0) return;
  const int64_t T = n_tokens, K = cfg_.top_k, E = cfg_.n_experts, H = cfg_.hidden;
  const int64_t R = T * K;
  // Host-side guard: what each kernel below writes (the plan's extents) fits the buffer it gets.
  const GpuMoeScratchPlan::Sizes wr = scratch_plan().writes(T);
  check_fits(logits_, wr.logits, 4, "router_logits -> logits");
  check_fits(topk_idx_, wr.topk, 4, "route_topk -> topk_idx");
  check_fits(topk_w_, wr.topk, 4, "route_topk -> topk_weights");
  check_fits(offsets_, wr.offsets, 4, "dispatch_plan -> offsets");
  check_fits(row_token_, wr.rows, 4, "dispatch_plan -> row_token");
  check_fits(entry_of_, wr.rows, 4, "dispatch_plan -> entry_of");
  check_fits(ws_->xp, wr.xp, 2, "gather_rows -> xp");
  check_fits(ws_->gu, wr.gu, 2, "gate_up (cuBLAS) -> gu");
  check_fits(ws_->act, wr.act, 2, "SwiGLU -> act");
  check_fits(ws_->down_out, wr.down_out, 2, "down -> down_out");
  check_fits(ws_->shared_gu, wr.shared_gu, 2, "shared gate_up (cuBLAS) -> shared_gu");
  check_fits(ws_->shared_act, wr.shared_act, 2, "shared SwiGLU -> shared_act");
  check_fits(ws_->shared_out, wr.shared_out, 2, "shared down -> shared_out");

  cuda::moe::router_logits(x, router_w_.as<float>(), T, H, static_cast<int>(E), logits_.as<float>(), stream);
  cuda::moe::route_topk(route_, logits_.as<float>(), route_.has_bias ? bias_.as<float>() : nullptr, T,
                        topk_idx_.as<int32_t>(), topk_w_.as<float>(), stream);
  cuda::moe::dispatch_plan(topk_idx_.as<int32_t>(), T, static_cast<int>(K), static_cast<int>(E),
                           offsets_.as<int32_t>(), row_token_.as<int32_t>(), entry_of_.as<int32_t>(),
                           shared_offsets_.as<int32_t>(), stream);
  const int32_t* h_offsets = nullptr;
  const bool dequant = use_dequant_path(T, stream);
  if (gemm_ == GpuExpertGemm::kBf16Cublas || dequant) {  // the cuBLAS paths' one host sync (see the header)
    FP4MOE_CUDA_CHECK(cudaMemcpyAsync(host_offsets_.get(), offsets_.as<int32_t>(), static_cast<size_t>(E + 1) * 4,
                                      cudaMemcpyDeviceToHost, stream));
    FP4MOE_CUDA_CHECK(cudaStreamSynchronize(stream));
    h_offsets = host_offsets_.get();
  }
  // The dequantized path's weight scratch is idle on the W4A16 path: the split-K workspace, all of it,
  // or a half each when the shared expert runs beside the routed GEMMs (the workspace's shared_side).
  const bool overlap = has_shared_ && gemm_ == GpuExpertGemm::kNvfp4W4A16 && !dequant && !gemm_timing_;
  const SplitKSpace whole{ws_->w_scratch.bytes() > 0 ? ws_->w_scratch.as<float>() : nullptr, ws_->w_scratch.bytes()};
  const size_t half = whole.bytes / 2 / 16 * 16;
  const SplitKSpace routed_splitk = overlap ? SplitKSpace{whole.ptr, half} : whole;
  const SplitKSpace shared_splitk =
      overlap && half > 0 ? SplitKSpace{reinterpret_cast<float*>(ws_->w_scratch.as<uint8_t>() + half), half} : whole;
  const int32_t shared_host_offsets[2] = {0, static_cast<int32_t>(T)};
  auto run_shared = [&](cudaStream_t on) {
    run_mlp(shared_, x, T, shared_offsets_.as<int32_t>(), shared_host_offsets, {RoutedClass{shared_gemm_config(T)}},
            dequant /* then T >= kNvfp4DequantMinRows too: T top_k / E >= 2048, top_k <= E */,
            ws_->shared_gu.as<__nv_bfloat16>(), ws_->shared_act.as<__nv_bfloat16>(),
            ws_->shared_out.as<__nv_bfloat16>(), gemm_events_[3].get(), gemm_events_[4].get(), on, shared_splitk);
  };
  // The shared expert reads x and shared_offsets_ (dispatch_plan): fork after it.
  if (overlap) run_shared(ws_->shared_side->fork(stream));
  cuda::moe::gather_rows(x, row_token_.as<int32_t>(), R, H, ws_->xp.as<__nv_bfloat16>(), stream);
  mark(gemm_events_[0].get(), stream);
  run_mlp(routed_, ws_->xp.as<__nv_bfloat16>(), R, offsets_.as<int32_t>(), h_offsets, routed_gemm_classes(T), dequant,
          ws_->gu.as<__nv_bfloat16>(), ws_->act.as<__nv_bfloat16>(), ws_->down_out.as<__nv_bfloat16>(),
          gemm_events_[1].get(), gemm_events_[2].get(), stream, routed_splitk);
  if (overlap) {
    ws_->shared_side->join(stream);
  } else if (has_shared_) {
    run_shared(stream);
  } else {
    mark(gemm_events_[3].get(), stream);
    mark(gemm_events_[4].get(), stream);
  }
  cuda::moe::combine(ws_->down_out.as<__nv_bfloat16>(), entry_of_.as<int32_t>(), topk_w_.as<float>(),
                     has_shared_ ? ws_->shared_out.as<__nv_bfloat16>() : nullptr, T, static_cast<int>(K), H, y, stream);
  timed_ = gemm_timing_;
}

GpuMoeLayer::Routing GpuMoeLayer::download_routing(int64_t n_tokens) const {
  FP4MOE_CHECK(n_tokens >= 0 && n_tokens <= max_tokens_)
      << "GpuMoeLayer::download_routing: n_tokens=" << n_tokens << " outside [0, " << max_tokens_ << "]";
  FP4MOE_CUDA_CHECK(cudaDeviceSynchronize());
  const size_t T = static_cast<size_t>(n_tokens), K = static_cast<size_t>(cfg_.top_k),
               E = static_cast<size_t>(cfg_.n_experts);
  Routing r;
  r.logits = logits_.to_host<float>(T * E);
  r.topk_idx = topk_idx_.to_host<int32_t>(T * K);
  r.topk_weights = topk_w_.to_host<float>(T * K);
  r.offsets = offsets_.to_host<int32_t>(E + 1);
  r.row_token = row_token_.to_host<int32_t>(T * K);
  r.entry_of = entry_of_.to_host<int32_t>(T * K);
  return r;
}

int64_t GpuMoeLayer::routed_expert_bytes() const { return mlp_bytes_per_expert(routed_, gemm_); }

int64_t GpuMoeLayer::shared_expert_bytes() const { return has_shared_ ? mlp_bytes_per_expert(shared_, gemm_) : 0; }

std::string GpuMoeLayer::describe() const {
  std::ostringstream os;
  os << gpu_expert_gemm_name(gemm_) << " E=" << cfg_.n_experts << " top-" << cfg_.top_k << " H=" << cfg_.hidden
     << " I=" << cfg_.moe_intermediate << " shared " << (has_shared_ ? cfg_.shared_intermediate() : 0)
     << (gemm_ == GpuExpertGemm::kNvfp4W4A16 ? " swiglu-epilogue" : " swiglu-kernel")
     << (separate_up_scales_ ? " (gs gate != up)" : "") << ", max " << max_tokens_ << " tokens";
  return os.str();
}

}  // namespace fp4moe::moe
