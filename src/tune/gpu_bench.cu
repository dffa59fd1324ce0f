// GPU timing for the autotuner and the GEMM benchmarks (see gpu_bench.h): event timing, the copy
// roofline, the W4A16 workload and the cuBLAS BF16 peer. Tested by tests/tune/test_autotune_gpu.cpp.
#include "tune/gpu_bench.h"

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <limits>
#include <numeric>

#include "core/error.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/moe/moe_kernels.h"
#include "kernels/cuda/cublas_check.h"
#include "kernels/cuda/sm90/w4a16_grouped_gemm.h"
#include "kernels/cuda/sm90/w4a16_weight_layout.h"
#include "tune/routing_counts.h"

namespace fp4moe::tune {

namespace {

// bf16 in [-1, 1) (random bit patterns would include NaN/Inf).
__global__ void fill_random_bf16(__nv_bfloat16* p, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    uint32_t h = static_cast<uint32_t>(i) * 2654435761u ^ seed;
    h ^= h >> 15;
    h *= 2246822519u;
    h ^= h >> 13;
    p[i] = __float2bfloat16(static_cast<float>(h & 0xFFFF) / 32768.0f - 1.0f);
  }
}

struct CudaFree {
  void operator()(void* p) const { cudaFree(p); }
};
using DeviceBytes = std::unique_ptr<uint8_t, CudaFree>;

// `bytes` of device memory (at least 16, so empty problems still get a valid aligned pointer).
DeviceBytes device_bytes(size_t bytes, const char* what) {
  void* p = nullptr;
  const cudaError_t err = cudaMalloc(&p, std::max<size_t>(bytes, 16));
  if (err != cudaSuccess) {
    cudaGetLastError();  // clear the sticky-free allocation error
    FP4MOE_FAIL() << "cudaMalloc of " << bytes << " B for " << what << " failed: " << cudaGetErrorName(err) << " ("
                  << cudaGetErrorString(err) << ")";
  }
  return DeviceBytes(static_cast<uint8_t*>(p));
}

template <typename T>
T* as(const DeviceBytes& b) {
  return reinterpret_cast<T*>(b.get());
}

// Weight sets so that one round over them touches > 3x L2 (at least 2).
int sets_for(double bytes_per_set) {
  const double l2 = static_cast<double>(device_l2_bytes());
  return static_cast<int>(std::max(2.0, std::floor(3.0 * l2 / std::max(bytes_per_set, 1.0)) + 1.0));
}

void check_counts(const GemmShape& shape, const std::vector<int32_t>& counts, int64_t max_m_total, const char* who) {
  FP4MOE_CHECK(static_cast<int64_t>(counts.size()) == shape.n_experts)
      << who << ": " << counts.size() << " counts for E=" << shape.n_experts << " experts";
  const int64_t total = std::accumulate(counts.begin(), counts.end(), int64_t{0});
  FP4MOE_CHECK(total <= max_m_total) << who << ": " << total << " token rows > the " << max_m_total
                                     << " the buffers of " << shape.to_string() << " were sized for";
}

}  // namespace

double time_median_us(const std::function<void(int)>& fn, int n_sets, const TimingOptions& opts) {
  FP4MOE_CHECK(opts.runs >= 1 && opts.warmup >= 0 && opts.batch >= 1 && n_sets >= 1)
      << "time_median_us: runs=" << opts.runs << " warmup=" << opts.warmup << " batch=" << opts.batch
      << " n_sets=" << n_sets << " (want runs >= 1, warmup >= 0, batch >= 1, n_sets >= 1)";
  cudaEvent_t start = nullptr, stop = nullptr;
  FP4MOE_CUDA_CHECK(cudaEventCreate(&start));
  FP4MOE_CUDA_CHECK(cudaEventCreate(&stop));
  std::vector<double> us;
  try {
    int call = 0;  // calls so far: the next call's set is call % n_sets
    for (; call < opts.warmup; ++call) fn(call % n_sets);
    for (int i = 0; i < opts.runs; ++i) {
      FP4MOE_CUDA_CHECK(cudaEventRecord(start, nullptr));
      for (int j = 0; j < opts.batch; ++j, ++call) fn(call % n_sets);
      FP4MOE_CUDA_CHECK(cudaEventRecord(stop, nullptr));
      FP4MOE_CUDA_CHECK(cudaEventSynchronize(stop));
      float ms = 0;
      FP4MOE_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
      us.push_back(static_cast<double>(ms) * 1000.0 / opts.batch);
    }
  } catch (...) {
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
    throw;
  }
  FP4MOE_CUDA_CHECK(cudaEventDestroy(start));
  FP4MOE_CUDA_CHECK(cudaEventDestroy(stop));
  std::sort(us.begin(), us.end());
  return us[us.size() / 2];
}

std::string describe_timing(const TimingOptions& opts) {
  std::string s = "median of " + std::to_string(opts.runs) + " after " + std::to_string(opts.warmup) + " warm-ups";
  if (opts.batch > 1) s += ", a sample " + std::to_string(opts.batch) + " back-to-back launches (times per launch)";
  return s;
}

int64_t device_l2_bytes() {
  int device = 0, l2 = 0;
  FP4MOE_CUDA_CHECK(cudaGetDevice(&device));
  FP4MOE_CUDA_CHECK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, device));
  return l2;
}

double measure_copy_bandwidth() {
  const size_t bytes = size_t{1} << 30;
  DeviceBytes a = device_bytes(bytes, "copy-bandwidth source");
  DeviceBytes b = device_bytes(bytes, "copy-bandwidth destination");
  FP4MOE_CUDA_CHECK(cudaMemset(a.get(), 1, bytes));
  const double us = time_median_us(
      [&](int) { FP4MOE_CUDA_CHECK(cudaMemcpyAsync(b.get(), a.get(), bytes, cudaMemcpyDeviceToDevice, nullptr)); }, 1,
      TimingOptions{2, 10});
  return 2.0 * static_cast<double>(bytes) / (us * 1e-6);
}

// ---------------------------------------------------------------------------------------------
// W4A16Workload

struct W4A16Workload::Impl {
  GemmShape shape;
  int64_t max_m_total = 0, m_total = 0;
  size_t packed_bytes = 0, scale_bytes = 0;
  std::vector<DeviceBytes> packed, scales;
  DeviceBytes x, y, global_scales, offsets;
  DeviceBytes splitk;  // E = 1: the split-K workspace GpuLinear gives a dense Linear
  size_t splitk_bytes = 0;
};

W4A16Workload::W4A16Workload(const GemmShape& shape, int64_t max_m_total) : impl_(std::make_unique<Impl>()) {
  Impl& s = *impl_;
  FP4MOE_CHECK(shape.n_experts >= 1 && shape.n > 0 && shape.k > 0 && max_m_total >= 0)
      << "W4A16Workload: bad shape " << shape.to_string() << " max_m_total=" << max_m_total;
  s.shape = shape;
  s.max_m_total = max_m_total;
  // The kernel layout (w4a16_weight_layout.h): rows padded to 16, K to whole 64-k chunks and scale
  // groups; random codes are all finite e2m1 values whatever their arrangement.
  s.packed_bytes = static_cast<size_t>(cuda::sm90::w4a16_codes_bytes(shape.n_experts, shape.n, shape.k));
  s.scale_bytes = static_cast<size_t>(cuda::sm90::w4a16_scales_bytes(shape.n_experts, shape.n, shape.k));
  const int n_sets = sets_for(static_cast<double>(s.packed_bytes + s.scale_bytes));
  for (int i = 0; i < n_sets; ++i) {
    s.packed.push_back(device_bytes(s.packed_bytes, "NVFP4 weight codes"));
    s.scales.push_back(device_bytes(s.scale_bytes, "e4m3 weight scales"));
    // Codes: any byte (every e2m1 pattern is finite); scales: the kernel-layout bytes (ue5m3) of the
    // e4m3 codes 0x20..0x3F (2^-3 .. ~1.9).
    cuda::moe::fill_hash_bytes(s.packed.back().get(), static_cast<int64_t>(s.packed_bytes), 17u + static_cast<uint64_t>(i),
                               0x00, 0xFF, nullptr);
    cuda::moe::fill_hash_bytes(s.scales.back().get(), static_cast<int64_t>(s.scale_bytes), 0x5CA1Eu + static_cast<uint64_t>(i),
                               static_cast<uint8_t>(cuda::sm90::w4a16_scale_byte(0x20)), 0x1F, nullptr);
  }
  const size_t rows = static_cast<size_t>(max_m_total);
  s.x = device_bytes(rows * static_cast<size_t>(shape.k) * 2, "bf16 activations");
  s.y = device_bytes(rows * static_cast<size_t>(shape.n) * 2, "bf16 outputs");
  fill_random_bf16<<<1024, 256>>>(as<__nv_bfloat16>(s.x), rows * static_cast<size_t>(shape.k), 7u);
  FP4MOE_CUDA_CHECK(cudaGetLastError());
  // 1/(6 x 448): the global scale of a tensor whose absmax is 1 (NVFP4's two-level scaling).
  const std::vector<float> gs(static_cast<size_t>(shape.n_experts), 1.0f / 2688.0f);
  s.global_scales = device_bytes(gs.size() * sizeof(float), "global scales");
  FP4MOE_CUDA_CHECK(cudaMemcpy(s.global_scales.get(), gs.data(), gs.size() * sizeof(float), cudaMemcpyHostToDevice));
  s.offsets = device_bytes(static_cast<size_t>(shape.n_experts + 1) * sizeof(int32_t), "expert offsets");
  if (shape.n_experts == 1 && rows > 0) {
    s.splitk_bytes = static_cast<size_t>(cuda::sm90::kW4A16MaxSplitK) * rows * static_cast<size_t>(shape.n) * 4;
    s.splitk = device_bytes(s.splitk_bytes, "split-K workspace");
  }
  set_counts(std::vector<int32_t>(static_cast<size_t>(shape.n_experts), 0));
  FP4MOE_CUDA_CHECK(cudaDeviceSynchronize());
}

W4A16Workload::~W4A16Workload() = default;

void W4A16Workload::set_counts(const std::vector<int32_t>& counts) {
  Impl& s = *impl_;
  check_counts(s.shape, counts, s.max_m_total, "W4A16Workload::set_counts");
  const std::vector<int32_t> off = offsets_of(counts);
  FP4MOE_CUDA_CHECK(cudaMemcpy(s.offsets.get(), off.data(), off.size() * sizeof(int32_t), cudaMemcpyHostToDevice));
  s.m_total = off.back();
}

void W4A16Workload::launch(int config_id, int set) {
  Impl& s = *impl_;
  FP4MOE_CHECK(set >= 0 && set < static_cast<int>(s.packed.size()))
      << "W4A16Workload::launch: weight set " << set << " of " << s.packed.size();
  cuda::sm90::W4A16GroupedGemmArgs a;
  a.x = as<__nv_bfloat16>(s.x);
  a.expert_offsets = as<int32_t>(s.offsets);
  a.w_packed = s.packed[static_cast<size_t>(set)].get();
  a.w_scales = s.scales[static_cast<size_t>(set)].get();
  a.w_global_scales = as<float>(s.global_scales);
  a.y = as<__nv_bfloat16>(s.y);
  a.m_total = s.m_total;
  a.n = s.shape.n;
  a.k = s.shape.k;
  a.n_experts = s.shape.n_experts;
  a.splitk_workspace = s.splitk_bytes > 0 ? as<float>(s.splitk) : nullptr;
  a.splitk_workspace_bytes = s.splitk_bytes;
  cuda::sm90::w4a16_grouped_gemm(a, config_id, nullptr);
}

double W4A16Workload::time_config_us(int config_id, const TimingOptions& opts) {
  return time_median_us([&](int set) { launch(config_id, set); }, n_sets(), opts);
}

int W4A16Workload::n_sets() const { return static_cast<int>(impl_->packed.size()); }
int64_t W4A16Workload::m_total() const { return impl_->m_total; }
const GemmShape& W4A16Workload::shape() const { return impl_->shape; }
double W4A16Workload::weight_bytes() const {
  return static_cast<double>(impl_->packed_bytes + impl_->scale_bytes);
}

// ---------------------------------------------------------------------------------------------
// CublasBf16Peer

struct CublasBf16Peer::Impl {
  GemmShape shape;
  int64_t max_m_total = 0;
  cublasHandle_t handle = nullptr;
  std::vector<DeviceBytes> w;  // [E, N, K] bf16 per set
  DeviceBytes x, y;
  std::vector<int32_t> counts, offsets;
  bool uniform = true;
};

CublasBf16Peer::CublasBf16Peer(const GemmShape& shape, int64_t max_m_total) : impl_(std::make_unique<Impl>()) {
  Impl& s = *impl_;
  FP4MOE_CHECK(shape.n <= std::numeric_limits<int>::max() && shape.k <= std::numeric_limits<int>::max() &&
               max_m_total <= std::numeric_limits<int>::max())
      << "CublasBf16Peer: " << shape.to_string() << " with " << max_m_total << " rows exceeds cuBLAS's int sizes";
  s.shape = shape;
  s.max_m_total = max_m_total;
  FP4MOE_CUBLAS_CHECK(cublasCreate(&s.handle));
  const size_t w_elems = static_cast<size_t>(shape.n_experts * shape.n * shape.k);
  const int n_sets = sets_for(static_cast<double>(w_elems) * 2.0);
  for (int i = 0; i < n_sets; ++i) {
    s.w.push_back(device_bytes(w_elems * 2, "bf16 peer weights"));
    fill_random_bf16<<<1024, 256>>>(as<__nv_bfloat16>(s.w.back()), w_elems, 99u + static_cast<uint32_t>(i));
  }
  const size_t rows = static_cast<size_t>(max_m_total);
  s.x = device_bytes(rows * static_cast<size_t>(shape.k) * 2, "bf16 peer activations");
  s.y = device_bytes(rows * static_cast<size_t>(shape.n) * 2, "bf16 peer outputs");
  fill_random_bf16<<<1024, 256>>>(as<__nv_bfloat16>(s.x), rows * static_cast<size_t>(shape.k), 7u);
  FP4MOE_CUDA_CHECK(cudaGetLastError());
  FP4MOE_CUDA_CHECK(cudaDeviceSynchronize());
  set_counts(std::vector<int32_t>(static_cast<size_t>(shape.n_experts), 0));
}

CublasBf16Peer::~CublasBf16Peer() {
  if (impl_ && impl_->handle != nullptr) cublasDestroy(impl_->handle);
}

void CublasBf16Peer::set_counts(const std::vector<int32_t>& counts) {
  Impl& s = *impl_;
  check_counts(s.shape, counts, s.max_m_total, "CublasBf16Peer::set_counts");
  s.counts = counts;
  s.offsets = offsets_of(counts);
  s.uniform = std::all_of(counts.begin(), counts.end(), [&](int32_t c) { return c == counts.front(); });
}

double CublasBf16Peer::time_us(const TimingOptions& opts) {
  Impl& s = *impl_;
  const float alpha = 1.0f, beta = 0.0f;
  const int n = static_cast<int>(s.shape.n), k = static_cast<int>(s.shape.k);
  const auto* x = as<__nv_bfloat16>(s.x);
  auto* y = as<__nv_bfloat16>(s.y);
  // Y_e [t, N] (row-major) = X_e [t, K] W_e[N, K]^T; in cuBLAS's column-major terms
  // C [N x t] = op_T(W_e viewed as K x N) x (X_e viewed as K x t), ldc = N.
  return time_median_us(
      [&](int set) {
        const auto* w = as<__nv_bfloat16>(s.w[static_cast<size_t>(set)]);
        if (s.uniform) {
          const int t = s.counts.front();
          if (t == 0) return;
          FP4MOE_CUBLAS_CHECK(cublasGemmStridedBatchedEx(
              s.handle, CUBLAS_OP_T, CUBLAS_OP_N, n, t, k, &alpha, w, CUDA_R_16BF, k, s.shape.n * s.shape.k, x,
              CUDA_R_16BF, k, static_cast<long long>(t) * k, &beta, y, CUDA_R_16BF, n, static_cast<long long>(t) * n,
              static_cast<int>(s.shape.n_experts), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
          return;
        }
        for (size_t e = 0; e < s.counts.size(); ++e) {
          const int t = s.counts[e];
          if (t == 0) continue;
          const size_t row = static_cast<size_t>(s.offsets[e]);
          FP4MOE_CUBLAS_CHECK(cublasGemmEx(s.handle, CUBLAS_OP_T, CUBLAS_OP_N, n, t, k, &alpha,
                                           w + e * static_cast<size_t>(n) * k, CUDA_R_16BF, k, x + row * k,
                                           CUDA_R_16BF, k, &beta, y + row * n, CUDA_R_16BF, n, CUBLAS_COMPUTE_32F,
                                           CUBLAS_GEMM_DEFAULT));
        }
      },
      static_cast<int>(s.w.size()), opts);
}

std::string CublasBf16Peer::method() const {
  const Impl& s = *impl_;
  if (s.uniform) return "cublasGemmStridedBatchedEx";
  const auto active = std::count_if(s.counts.begin(), s.counts.end(), [](int32_t c) { return c > 0; });
  return "cublasGemmEx x" + std::to_string(active) + " (loop)";
}

}  // namespace fp4moe::tune
