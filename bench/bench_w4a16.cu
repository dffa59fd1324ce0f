// Benchmark of sm90_nvfp4_w4a16_grouped_gemm against cuBLAS BF16 (cublasGemmStridedBatchedEx, uniform
// routing) on the GLM-5 expert shard: E=32, gate_up N=4096 K=6144 and down N=6144 K=2048, tokens per
// expert 1..256 (or --tokens a,b,c). Every shipped config is timed; the table shows the fastest
// (and the default config's time), TFLOP/s, GB/s of NVFP4 weight + scale bytes, the fraction of the
// HBM roofline (device-to-device copy bandwidth measured in the same run, bytes read + written) and of
// the BF16 tensor peak (780 TFLOP/s on an H200), the cuBLAS time and the speedup (cuBLAS time / ours).
// Method: CUDA events around each launch, 5 warm-ups, median of 30; weight sets rotate so the bytes
// touched between two launches of a set exceed 3x the L2 (read from the device).
// Run: bench_w4a16 [--tokens 1,2,8] [--runs 30]. Needs a Hopper GPU; exits non-zero on errors.
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "core/error.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/sm90/w4a16_grouped_gemm.h"

namespace {

using namespace fp4moe::cuda;
using namespace fp4moe::cuda::sm90;

constexpr double kBf16PeakFlops = 780e12;  // H200 cuBLAS BF16 measured on the device machine (H200.md)
constexpr int kWarmup = 5;

#define CUBLAS_CHECK(call)                                                                      \
  do {                                                                                          \
    const cublasStatus_t st_ = (call);                                                          \
    FP4MOE_CHECK(st_ == CUBLAS_STATUS_SUCCESS) << "cuBLAS error " << static_cast<int>(st_) << " in `" \
                                               << #call << "`";                                \
  } while (0)

// Deterministic pseudo-random fill (bytes), so cuBLAS does not run on zeros.
__global__ void fill_random_bytes(uint8_t* p, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    uint32_t h = static_cast<uint32_t>(i) * 2654435761u ^ seed;
    h ^= h >> 15;
    h *= 2246822519u;
    h ^= h >> 13;
    p[i] = static_cast<uint8_t>(h);
  }
}
// bf16 values in [-1, 1) (random bytes would include NaN/Inf patterns).
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
// e4m3 scales in a sane range (codes 0x20..0x3F: 2^-3 .. ~1.9).
__global__ void fill_scales(uint8_t* p, size_t n) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    p[i] = static_cast<uint8_t>(0x20 + (i * 7) % 32);
  }
}

template <typename T>
T* device_alloc(size_t count) {
  void* p = nullptr;
  FP4MOE_CUDA_CHECK(cudaMalloc(&p, std::max<size_t>(count, 1) * sizeof(T)));
  return static_cast<T*>(p);
}

// Median of `runs` timed launches of fn(i) (i rotates buffer sets), in microseconds.
template <typename Fn>
double time_median_us(int runs, int n_sets, Fn&& fn) {
  cudaEvent_t start, stop;
  FP4MOE_CUDA_CHECK(cudaEventCreate(&start));
  FP4MOE_CUDA_CHECK(cudaEventCreate(&stop));
  for (int i = 0; i < kWarmup; ++i) fn(i % n_sets);
  std::vector<double> us;
  for (int i = 0; i < runs; ++i) {
    FP4MOE_CUDA_CHECK(cudaEventRecord(start));
    fn(i % n_sets);
    FP4MOE_CUDA_CHECK(cudaEventRecord(stop));
    FP4MOE_CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0;
    FP4MOE_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    us.push_back(ms * 1000.0);
  }
  FP4MOE_CUDA_CHECK(cudaEventDestroy(start));
  FP4MOE_CUDA_CHECK(cudaEventDestroy(stop));
  std::sort(us.begin(), us.end());
  return us[us.size() / 2];
}

// HBM roofline of this run: a 4 GiB device-to-device copy, bytes read + written per second (median of 10).
double measure_copy_bandwidth() {
  const size_t bytes = size_t{2} << 30;
  uint8_t* a = device_alloc<uint8_t>(bytes);
  uint8_t* b = device_alloc<uint8_t>(bytes);
  FP4MOE_CUDA_CHECK(cudaMemset(a, 1, bytes));
  const double us = time_median_us(10, 1, [&](int) { FP4MOE_CUDA_CHECK(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice)); });
  FP4MOE_CUDA_CHECK(cudaFree(a));
  FP4MOE_CUDA_CHECK(cudaFree(b));
  return 2.0 * static_cast<double>(bytes) / (us * 1e-6);
}

struct Shape {
  const char* name;
  int64_t n, k;
};

int run(const std::vector<int>& tokens_list, int runs) {
  std::string why;
  if (!cuda_device_available(&why)) {
    std::fprintf(stderr, "bench_w4a16: no usable GPU: %s\n", why.c_str());
    return 1;
  }
  int device = 0, l2 = 0;
  FP4MOE_CUDA_CHECK(cudaGetDevice(&device));
  FP4MOE_CUDA_CHECK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, device));
  std::printf("bench_w4a16: %s, L2 %d MB, median of %d after %d warm-ups\n", cuda_device_description(device).c_str(),
              l2 >> 20, runs, kWarmup);
  cublasHandle_t cublas;
  CUBLAS_CHECK(cublasCreate(&cublas));
  const double hbm_bps = measure_copy_bandwidth();
  std::printf("HBM roofline (D2D copy, read + write, this run): %.2f TB/s; BF16 peak used: %.0f TFLOP/s\n",
              hbm_bps / 1e12, kBf16PeakFlops / 1e12);

  const int64_t n_experts = 32;
  const int max_tokens = *std::max_element(tokens_list.begin(), tokens_list.end());
  const Shape shapes[] = {{"gate_up", 4096, 6144}, {"down", 6144, 2048}};
  std::printf("%-8s %6s %6s %5s | %-28s %9s %9s %7s %7s %7s %9s | %9s %7s\n", "shape", "N", "K", "tok/e", "best config",
              "time us", "TFLOP/s", "GB/s", "%HBM", "%bf16pk", "dflt us", "cuBLAS us", "speedup");
  for (const Shape& s : shapes) {
    const size_t w_bytes = static_cast<size_t>(n_experts * s.n * s.k / 2);
    const size_t sc_bytes = static_cast<size_t>(n_experts * s.n * s.k / 16);
    const size_t bf16_w = static_cast<size_t>(n_experts * s.n * s.k);
    // Enough sets that one round touches > 3x L2 (at least 2).
    const int n_sets = static_cast<int>(std::max<size_t>(2, (3 * static_cast<size_t>(l2)) / (w_bytes + sc_bytes) + 1));
    const int n_sets_bf16 = static_cast<int>(std::max<size_t>(2, (3 * static_cast<size_t>(l2)) / (bf16_w * 2) + 1));
    std::vector<uint8_t*> packed(n_sets), scales(n_sets);
    std::vector<__nv_bfloat16*> w16(n_sets_bf16);
    for (int i = 0; i < n_sets; ++i) {
      packed[i] = device_alloc<uint8_t>(w_bytes);
      scales[i] = device_alloc<uint8_t>(sc_bytes);
      fill_random_bytes<<<1024, 256>>>(packed[i], w_bytes, 17u + i);
      fill_scales<<<1024, 256>>>(scales[i], sc_bytes);
    }
    for (int i = 0; i < n_sets_bf16; ++i) {
      w16[i] = device_alloc<__nv_bfloat16>(bf16_w);
      fill_random_bf16<<<1024, 256>>>(w16[i], bf16_w, 99u + i);
    }
    const size_t max_m = static_cast<size_t>(n_experts * max_tokens);
    __nv_bfloat16* x = device_alloc<__nv_bfloat16>(max_m * s.k);
    __nv_bfloat16* y = device_alloc<__nv_bfloat16>(max_m * s.n);
    fill_random_bf16<<<1024, 256>>>(x, max_m * s.k, 7u);
    std::vector<float> gs_host(static_cast<size_t>(n_experts), 1.0f / 2688.0f);
    float* gs = device_alloc<float>(gs_host.size());
    FP4MOE_CUDA_CHECK(cudaMemcpy(gs, gs_host.data(), gs_host.size() * 4, cudaMemcpyHostToDevice));
    int32_t* offsets = device_alloc<int32_t>(static_cast<size_t>(n_experts + 1));
    FP4MOE_CUDA_CHECK(cudaGetLastError());

    for (int tokens : tokens_list) {
      std::vector<int32_t> off(static_cast<size_t>(n_experts + 1));
      for (int64_t e = 0; e <= n_experts; ++e) off[static_cast<size_t>(e)] = static_cast<int32_t>(e * tokens);
      FP4MOE_CUDA_CHECK(cudaMemcpy(offsets, off.data(), off.size() * 4, cudaMemcpyHostToDevice));
      const int64_t m_total = n_experts * tokens;
      W4A16GroupedGemmArgs a;
      a.x = x;
      a.expert_offsets = offsets;
      a.w_global_scales = gs;
      a.y = y;
      a.m_total = m_total;
      a.n = s.n;
      a.k = s.k;
      a.n_experts = n_experts;
      double best_us = 1e30, default_us = 0;
      int best_cfg = -1;
      const int default_cfg = w4a16_default_config(tokens);
      for (int cfg = 0; cfg < w4a16_num_configs(); ++cfg) {
        const double us = time_median_us(runs, n_sets, [&](int set) {
          a.w_packed = packed[static_cast<size_t>(set)];
          a.w_scales = scales[static_cast<size_t>(set)];
          w4a16_grouped_gemm(a, cfg, nullptr);
        });
        if (us < best_us) {
          best_us = us;
          best_cfg = cfg;
        }
        if (cfg == default_cfg) default_us = us;
      }
      const float alpha = 1.0f, beta = 0.0f;
      const double cublas_us = time_median_us(runs, n_sets_bf16, [&](int set) {
        // Y_e [tokens, N] (row-major) = X_e [tokens, K] W_e[N, K]^T, i.e. column-major
        // C [N x tokens] = W^T(op T of the [K x N] column-major view) x X^T.
        CUBLAS_CHECK(cublasGemmStridedBatchedEx(cublas, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(s.n), tokens,
                                                static_cast<int>(s.k), &alpha, w16[static_cast<size_t>(set)], CUDA_R_16BF,
                                                static_cast<int>(s.k), s.n * s.k, x, CUDA_R_16BF, static_cast<int>(s.k),
                                                static_cast<long long>(tokens) * s.k, &beta, y, CUDA_R_16BF,
                                                static_cast<int>(s.n), static_cast<long long>(tokens) * s.n,
                                                static_cast<int>(n_experts), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
      });
      const double flops = 2.0 * static_cast<double>(m_total) * s.n * s.k;
      const double bytes = static_cast<double>(w_bytes + sc_bytes);
      const double gbps = bytes / (best_us * 1e-6) / 1e9;
      const double tflops = flops / (best_us * 1e-6) / 1e12;
      std::printf("%-8s %6lld %6lld %5d | %-28s %9.1f %9.1f %7.0f %6.1f%% %6.2f%% %9.1f | %9.1f %6.2fx\n", s.name,
                  static_cast<long long>(s.n), static_cast<long long>(s.k), tokens,
                  w4a16_config_name(w4a16_config(best_cfg)).c_str(), best_us, tflops, gbps,
                  100.0 * gbps * 1e9 / hbm_bps, 100.0 * tflops * 1e12 / kBf16PeakFlops, default_us, cublas_us,
                  cublas_us / best_us);
    }
    for (auto* p : packed) FP4MOE_CUDA_CHECK(cudaFree(p));
    for (auto* p : scales) FP4MOE_CUDA_CHECK(cudaFree(p));
    for (auto* p : w16) FP4MOE_CUDA_CHECK(cudaFree(p));
    FP4MOE_CUDA_CHECK(cudaFree(x));
    FP4MOE_CUDA_CHECK(cudaFree(y));
    FP4MOE_CUDA_CHECK(cudaFree(gs));
    FP4MOE_CUDA_CHECK(cudaFree(offsets));
  }
  CUBLAS_CHECK(cublasDestroy(cublas));
  return 0;
}

std::vector<int> parse_list(const char* s) {
  std::vector<int> out;
  std::string cur;
  for (const char* c = s;; ++c) {
    if (*c == ',' || *c == '\0') {
      FP4MOE_CHECK(!cur.empty()) << "bench_w4a16: bad --tokens list '" << s << "'";
      out.push_back(std::atoi(cur.c_str()));
      FP4MOE_CHECK(out.back() >= 1) << "bench_w4a16: tokens per expert must be >= 1, got '" << cur << "'";
      cur.clear();
      if (*c == '\0') break;
    } else {
      cur += *c;
    }
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    std::vector<int> tokens = {1, 2, 4, 8, 16, 32, 64, 128, 256};
    int runs = 30;
    for (int i = 1; i < argc; ++i) {
      const std::string arg = argv[i];
      if (arg == "--tokens" && i + 1 < argc) {
        tokens = parse_list(argv[++i]);
      } else if (arg == "--runs" && i + 1 < argc) {
        runs = std::max(1, std::atoi(argv[++i]));
      } else {
        std::fprintf(stderr, "usage: bench_w4a16 [--tokens 1,2,8] [--runs 30]\n");
        return 2;
      }
    }
    return run(tokens, runs);
  } catch (const fp4moe::Error& e) {
    std::fprintf(stderr, "bench_w4a16: %s\n", e.what());
    return 1;
  }
}
