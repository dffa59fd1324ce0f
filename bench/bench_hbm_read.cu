// How fast can the bytes of a decode-sized NVFP4 GEMM be read at all? Issue #5 asks the W4A16 stream
// kernel for >= 85% of the device-to-device copy bandwidth (read + write) over its weight + scale
// bytes; this benchmark measures the ceiling that read pattern can reach with no arithmetic, so a
// gap splits into "the memory system with this access pattern" and "the kernel's own work".
//
// Variants, each timed on the byte counts of the GLM-5 shard's gate_up (E=32, N=4096, K=6144) and
// down (N=6144, K=2048) in the kernel layout (w4a16_weight_layout.h), and gate_up at E=16 / 64 (does the
// fraction grow with the size, as the stream kernel's does: 58% at E=16, 76% at E=64, fourteenth
// session), median of --runs after 5
// warm-ups, CUDA events around each launch (tune/gpu_bench.h's method; sets rotate past 3x the L2):
//   ldg      grid-stride 16 B ld.global.nc per thread, UNROLL loads in flight, 256 threads, SMs x
//            {2, 4, 8} CTAs: the plain read bandwidth of the device.
//   ring     the stream kernel's access (sm90_nvfp4_w4a16_stream_kernel): CTAs of 4 warps, each warp
//            two row tiles' code chunks (512 B a chunk, contiguous along K) by 16 B cp.async per
//            lane into a ring of STAGES chunk slots a tile, the lane reading back its own 16 B, and
//            the tile's scale groups by __ldg a group ahead; one CTA per 8 row tiles of an expert,
//            CTAs per SM capped by padding the dynamic shared memory.
//   ring blocked  the same, on a layout where a CTA's 8 row tiles lie chunk by chunk (a CTA step reads
//            4 KB contiguous instead of 8 tiles' 512 B pieces 48 KB (gate_up) apart).
//   ring persistent  the same ring in SMs x {4, 5, 7} CTAs, each warp walking tile pairs with its ring
//            running on across them (no CTA turnover, no per-item prologue).
//   bulk     the same work items, codes by cp.async.bulk (one elected lane a warp, a whole scale
//            group = 8 chunks = 4 KB of a tile per copy, STAGES groups in flight, an mbarrier per slot).
// Each variant XORs what it read into a value it stores only when it equals a constant, so nothing
// is dropped by the compiler. Run: bench_hbm_read [--runs 30]. Needs a Hopper GPU.
#include <cuda_runtime_api.h>
#include <cutlass/arch/barrier.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "core/error.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/ptx.cuh"
#include "kernels/cuda/sm90/w4a16_weight_layout.h"
#include "tune/gpu_bench.h"

namespace {

using namespace fp4moe;
using fp4moe::cuda::sm90::kW4A16ScaleGroup;
using fp4moe::cuda::sm90::kW4A16TileBytes;

constexpr uint32_t kSinkValue = 0x9E3779B9u;  // stored only on this XOR: never in practice

__device__ __forceinline__ uint32_t xor16(uint4 v) { return v.x ^ v.y ^ v.z ^ v.w; }

template <int UNROLL>
__global__ void __launch_bounds__(256) hbm_read_ldg(const uint4* __restrict__ src, int64_t n16, uint32_t* sink) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  uint32_t acc = 0;
  int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  for (; i + (UNROLL - 1) * stride < n16; i += UNROLL * stride) {
    uint4 v[UNROLL];
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) v[u] = __ldg(src + i + u * stride);
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) acc ^= xor16(v[u]);
  }
  for (; i < n16; i += stride) acc ^= xor16(__ldg(src + i));
  if (acc == kSinkValue) *sink = acc;
}

struct TileStreams {  // one warp's two row tiles
  const uint8_t* codes[2];
  const uint8_t* scales[2];
  int64_t chunk_stride, group_stride;  // bytes from chunk kc to kc + 1 of a tile (group kg to kg + 1)
};

// Row tiles 2 w, 2 w + 1 of the CTA's 8 (blockIdx.x = expert x row_tiles / 8 + block). BLOCKED: a
// layout where the 8 row tiles of a CTA's block lie chunk by chunk (chunk kc of tiles 0..7 = 4 KB
// contiguous, scales likewise a group at a time) instead of tile by tile (a tile's chunks contiguous).
template <bool BLOCKED>
__device__ __forceinline__ TileStreams warp_tiles(const uint8_t* codes, const uint8_t* scales, int k_chunks,
                                                  int k_groups, uint32_t warp, uint32_t lane) {
  TileStreams s;
  for (int h = 0; h < 2; ++h) {
    const int64_t block = blockIdx.x, t = 2 * warp + h;
    const int64_t code_unit = BLOCKED ? block * k_chunks * 8 + t : (block * 8 + t) * k_chunks;
    const int64_t scale_unit = BLOCKED ? block * k_groups * 8 + t : (block * 8 + t) * k_groups;
    s.codes[h] = codes + code_unit * kW4A16TileBytes + lane * 16;
    s.scales[h] = scales + scale_unit * kW4A16TileBytes + lane * 16;
  }
  s.chunk_stride = s.group_stride = (BLOCKED ? 8 : 1) * kW4A16TileBytes;
  return s;
}

// A warp's two code rings (tile 0's STAGES 512 B chunk slots, then tile 1's), as the stream kernel's:
// step i fills slot i % STAGES of both by one 16 B cp.async per lane and tile (one commit group);
// reading step i waits until at most STAGES - 2 groups are pending and XORs this lane's 16 B of both.
template <int STAGES>
struct CodeRing {
  static constexpr uint32_t kRing1 = STAGES * kW4A16TileBytes;
  uint32_t addr;       // this lane's 16 B in slot 0 of tile 0's ring (shared window)
  const uint8_t* ptr;  // the same, generic
  __device__ CodeRing(uint8_t* smem, uint32_t warp, uint32_t lane) {
    ptr = smem + warp * 2 * kRing1 + lane * 16;
    addr = fp4moe::cuda::ptx::smem_u32(ptr);
  }
  __device__ static uint32_t slot(int i) { return (static_cast<uint32_t>(i) % STAGES) * kW4A16TileBytes; }
  __device__ void load(int i, const void* src0, const void* src1, bool ok) const {
    fp4moe::cuda::ptx::cp_async_16(addr + slot(i), src0, ok);
    fp4moe::cuda::ptx::cp_async_16(addr + kRing1 + slot(i), src1, ok);
    fp4moe::cuda::ptx::cp_async_commit();
  }
  __device__ uint32_t read(int i) const {
    fp4moe::cuda::ptx::cp_async_wait<STAGES - 2>();
    return xor16(*reinterpret_cast<const uint4*>(ptr + slot(i))) ^
           xor16(*reinterpret_cast<const uint4*>(ptr + kRing1 + slot(i)));
  }
};

template <int STAGES, bool BLOCKED>
__global__ void __launch_bounds__(128)
    hbm_read_ring(const uint8_t* codes, const uint8_t* scales, int k_chunks, int k_groups, uint32_t* sink) {
  extern __shared__ __align__(128) uint8_t smem[];
  const uint32_t lane = threadIdx.x & 31u, warp = threadIdx.x >> 5;
  const TileStreams s = warp_tiles<BLOCKED>(codes, scales, k_chunks, k_groups, warp, lane);
  const CodeRing<STAGES> ring(smem, warp, lane);
  auto load = [&](int kc) {
    const bool ok = kc < k_chunks;
    const int64_t off = (ok ? kc : 0) * s.chunk_stride;
    ring.load(kc, s.codes[0] + off, s.codes[1] + off, ok);
  };
  for (int d = 0; d < STAGES - 1; ++d) load(d);
  uint32_t acc = 0;
  uint4 sg0 = __ldg(reinterpret_cast<const uint4*>(s.scales[0]));
  uint4 sg1 = __ldg(reinterpret_cast<const uint4*>(s.scales[1]));
  for (int kc = 0; kc < k_chunks; ++kc) {
    if (kc % kW4A16ScaleGroup == 0) {  // the next group's scales, a group ahead as the kernel
      acc ^= xor16(sg0) ^ xor16(sg1);
      const int kg = kc / static_cast<int>(kW4A16ScaleGroup) + 1;
      if (kg < k_groups) {
        sg0 = __ldg(reinterpret_cast<const uint4*>(s.scales[0] + kg * s.group_stride));
        sg1 = __ldg(reinterpret_cast<const uint4*>(s.scales[1] + kg * s.group_stride));
      }
    }
    acc ^= ring.read(kc);
    load(kc + STAGES - 1);
  }
  fp4moe::cuda::ptx::cp_async_wait<0>();
  if (acc == kSinkValue) *sink = acc;
}

// The ring without CTA turnover: SMs x per_sm CTAs, warp gw of n_warps takes tile pairs gw, gw + n_warps,
// ...; its ring runs on across pairs (the next pair's first chunks are in flight while the current
// pair's last ones are read), so a warp never waits for a fresh prologue.
template <int STAGES>
__global__ void __launch_bounds__(128)
    hbm_read_ring_persistent(const uint8_t* codes, const uint8_t* scales, int k_chunks, int k_groups, int n_pairs,
                             uint32_t* sink) {
  extern __shared__ __align__(128) uint8_t smem[];
  const uint32_t lane = threadIdx.x & 31u, warp = threadIdx.x >> 5;
  const int gw = static_cast<int>(blockIdx.x * 4 + warp), n_warps = static_cast<int>(gridDim.x * 4);
  const CodeRing<STAGES> ring(smem, warp, lane);
  const int my_pairs = gw < n_pairs ? (n_pairs - gw + n_warps - 1) / n_warps : 0;
  const int steps = my_pairs * k_chunks;
  auto code_ptr = [&](int step, int h) {  // step = i x k_chunks + kc over this warp's pairs
    const int64_t tile = 2 * static_cast<int64_t>(gw + (step / k_chunks) * n_warps) + h;
    return codes + (tile * k_chunks + step % k_chunks) * kW4A16TileBytes + lane * 16;
  };
  auto load = [&](int step) {
    const bool ok = step < steps;
    ring.load(step, ok ? code_ptr(step, 0) : codes, ok ? code_ptr(step, 1) : codes, ok);
  };
  for (int d = 0; d < STAGES - 1; ++d) load(d);
  uint32_t acc = 0;
  uint4 sg0 = make_uint4(0, 0, 0, 0), sg1 = sg0;
  for (int step = 0; step < steps; ++step) {
    const int kc = step % k_chunks;
    if (kc % kW4A16ScaleGroup == 0) {
      acc ^= xor16(sg0) ^ xor16(sg1);
      const int64_t tile = 2 * static_cast<int64_t>(gw + (step / k_chunks) * n_warps);
      const int64_t off = (tile * k_groups + kc / static_cast<int>(kW4A16ScaleGroup)) * kW4A16TileBytes + lane * 16;
      sg0 = __ldg(reinterpret_cast<const uint4*>(scales + off));
      sg1 = __ldg(reinterpret_cast<const uint4*>(scales + off + static_cast<int64_t>(k_groups) * kW4A16TileBytes));
    }
    acc ^= ring.read(step);
    load(step + STAGES - 1);
  }
  fp4moe::cuda::ptx::cp_async_wait<0>();
  acc ^= xor16(sg0) ^ xor16(sg1);
  if (acc == kSinkValue) *sink = acc;
}

// A scale group of one tile (8 chunks, 4 KB) per bulk copy; slot = group % STAGES, one mbarrier each.
template <int STAGES>
__global__ void __launch_bounds__(128)
    hbm_read_bulk(const uint8_t* codes, const uint8_t* scales, int k_chunks, int k_groups, uint32_t* sink) {
  using Barrier = cutlass::arch::ClusterTransactionBarrier;
  constexpr uint32_t kGroupBytes = kW4A16ScaleGroup * kW4A16TileBytes;
  extern __shared__ __align__(128) uint8_t smem[];
  const uint32_t lane = threadIdx.x & 31u, warp = threadIdx.x >> 5;
  uint8_t* ring = smem + warp * 2 * STAGES * kGroupBytes;
  uint64_t* bars = reinterpret_cast<uint64_t*>(smem + 4 * 2 * STAGES * kGroupBytes) + warp * STAGES;
  if (lane == 0) {
    for (int i = 0; i < STAGES; ++i) Barrier::init(&bars[i], 1);
    cutlass::arch::fence_barrier_init();
  }
  __syncwarp();
  // Codes from the tiles' starts (one lane copies whole groups), scales at this lane's 16 B.
  const TileStreams s = warp_tiles<false>(codes, scales, k_chunks, k_groups, warp, lane);
  const uint8_t* tile_codes[2] = {s.codes[0] - lane * 16, s.codes[1] - lane * 16};
  auto group_chunks = [&](int kg) {
    return min(static_cast<int>(kW4A16ScaleGroup), k_chunks - kg * static_cast<int>(kW4A16ScaleGroup));
  };
  auto load = [&](int kg) {
    if (lane != 0 || kg >= k_groups) return;
    const int slot = kg % STAGES;
    const uint32_t bytes = static_cast<uint32_t>(group_chunks(kg)) * kW4A16TileBytes;
    Barrier::arrive_and_expect_tx(&bars[slot], 2 * bytes);
    for (int h = 0; h < 2; ++h) {
      asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
                       fp4moe::cuda::ptx::smem_u32(ring + (2 * slot + h) * kGroupBytes)),
                   "l"(tile_codes[h] + static_cast<int64_t>(kg) * kGroupBytes), "r"(bytes),
                   "r"(fp4moe::cuda::ptx::smem_u32(&bars[slot]))
                   : "memory");
    }
  };
  for (int d = 0; d < STAGES; ++d) load(d);
  uint32_t acc = 0;
  for (int kg = 0; kg < k_groups; ++kg) {
    const int slot = kg % STAGES;
    const uint4 sg0 = __ldg(reinterpret_cast<const uint4*>(s.scales[0] + kg * s.group_stride));
    const uint4 sg1 = __ldg(reinterpret_cast<const uint4*>(s.scales[1] + kg * s.group_stride));
    Barrier::wait(&bars[slot], static_cast<uint32_t>(kg / STAGES) & 1u);
    const int chunks = group_chunks(kg);
    for (int j = 0; j < chunks; ++j) {
      for (int h = 0; h < 2; ++h) {
        acc ^= xor16(
            *reinterpret_cast<const uint4*>(ring + (2 * slot + h) * kGroupBytes + j * kW4A16TileBytes + lane * 16));
      }
    }
    acc ^= xor16(sg0) ^ xor16(sg1);
    __syncwarp();  // every lane read the slot before it is refilled
    load(kg + STAGES);
  }
  if (acc == kSinkValue) *sink = acc;
}

struct Weights {
  std::string name;
  int64_t n_experts, n, k;
  int64_t codes_bytes() const { return fp4moe::cuda::sm90::w4a16_codes_bytes(n_experts, n, k); }
  int64_t scales_bytes() const { return fp4moe::cuda::sm90::w4a16_scales_bytes(n_experts, n, k); }
  int64_t bytes() const { return codes_bytes() + scales_bytes(); }
};

struct Row {
  std::string variant;
  double us;
};

int run(int runs) {
  std::string why;
  if (!fp4moe::cuda::cuda_device_available(&why)) {
    std::fprintf(stderr, "bench_hbm_read: no usable GPU: %s\n", why.c_str());
    return 1;
  }
  int sms = 0;
  FP4MOE_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  int smem_per_sm = 0;
  FP4MOE_CUDA_CHECK(cudaDeviceGetAttribute(&smem_per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, 0));
  const tune::TimingOptions timing{5, runs};
  std::printf("bench_hbm_read: %s, %d SMs, L2 %lld MB, %s\n", fp4moe::cuda::cuda_device_description(0).c_str(), sms,
              static_cast<long long>(tune::device_l2_bytes() >> 20), tune::describe_timing(timing).c_str());
  const double copy_bps = tune::measure_copy_bandwidth();
  std::printf("HBM roofline (D2D copy, read + write, this run): %.2f TB/s\n", copy_bps / 1e12);
  std::printf("%-8s %10s | %-26s %9s %8s %7s\n", "shape", "MB", "variant", "time us", "TB/s", "%copy");

  uint32_t* sink = nullptr;
  FP4MOE_CUDA_CHECK(cudaMalloc(&sink, sizeof(uint32_t)));
  const std::vector<Weights> shapes = {{"gate_up", 32, 4096, 6144},
                                       {"down", 32, 6144, 2048},
                                       {"E16 g_up", 16, 4096, 6144},
                                       {"E64 g_up", 64, 4096, 6144}};
  for (const Weights& w : shapes) {
    const int64_t bytes = w.bytes();
    // Sets (codes then scales, one allocation each) rotating past 3x the L2.
    const int n_sets = static_cast<int>(3 * tune::device_l2_bytes() / bytes) + 1;
    std::vector<uint8_t*> sets(static_cast<size_t>(n_sets));
    for (uint8_t*& p : sets) {
      FP4MOE_CUDA_CHECK(cudaMalloc(&p, static_cast<size_t>(bytes)));
      FP4MOE_CUDA_CHECK(cudaMemset(p, 0x5A, static_cast<size_t>(bytes)));
    }
    const int k_chunks = static_cast<int>(fp4moe::cuda::sm90::w4a16_k_chunks(w.k));
    const int k_groups = static_cast<int>(fp4moe::cuda::sm90::w4a16_k_groups(w.k));
    const int ctas = static_cast<int>(w.n_experts * fp4moe::cuda::sm90::w4a16_row_tiles(w.n) / 8);
    FP4MOE_CHECK(fp4moe::cuda::sm90::w4a16_row_tiles(w.n) % 8 == 0) << w.name << ": row tiles not a multiple of 8";
    std::vector<Row> rows;
    auto time = [&](const std::string& variant, const std::function<void(uint8_t*)>& launch) {
      const double us = tune::time_median_us([&](int set) { launch(sets[static_cast<size_t>(set)]); }, n_sets, timing);
      FP4MOE_CUDA_CHECK(cudaGetLastError());
      rows.push_back({variant, us});
    };
    for (int per_sm : {2, 4, 8}) {
      time("ldg unroll4 " + std::to_string(per_sm) + " CTAs/SM", [&](uint8_t* p) {
        hbm_read_ldg<4><<<sms * per_sm, 256>>>(reinterpret_cast<const uint4*>(p), bytes / 16, sink);
      });
    }
    // The kernel's dynamic shared memory: `bytes`, padded so that at most `per_sm` CTAs fit an SM (1 KB
    // reserved per CTA), opted in.
    auto smem_for = [&](auto kernel, int bytes, int per_sm) {
      const int smem = std::max(bytes, smem_per_sm / per_sm - 1024 - 64);
      FP4MOE_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
      return smem;
    };
    const int ring_bytes_per_stage = 4 * 2 * static_cast<int>(kW4A16TileBytes);  // 4 warps x 2 tiles
    auto ring_variant = [&](auto kernel, int stages, int per_sm, const char* layout = "") {
      const int smem = smem_for(kernel, stages * ring_bytes_per_stage, per_sm);
      time("ring d" + std::to_string(stages) + layout + " " + std::to_string(per_sm) + " CTAs/SM",
           [&](uint8_t* p) { kernel<<<ctas, 128, smem>>>(p, p + w.codes_bytes(), k_chunks, k_groups, sink); });
    };
    for (int per_sm : {3, 5, 7}) ring_variant(hbm_read_ring<8, false>, 8, per_sm);
    ring_variant(hbm_read_ring<4, false>, 4, 7);
    ring_variant(hbm_read_ring<12, false>, 12, 4);
    for (int per_sm : {5, 7}) ring_variant(hbm_read_ring<8, true>, 8, per_sm, " blocked");
    for (int per_sm : {4, 5, 7}) {
      auto kernel = hbm_read_ring_persistent<8>;
      const int smem = smem_for(kernel, 8 * ring_bytes_per_stage, per_sm);
      time("ring d8 persistent " + std::to_string(per_sm) + "/SM", [&](uint8_t* p) {
        kernel<<<sms * per_sm, 128, smem>>>(p, p + w.codes_bytes(), k_chunks, k_groups, ctas * 4, sink);
      });
    }
    auto bulk_variant = [&](auto kernel, int stages, int per_sm) {
      const int ring = 4 * 2 * stages * static_cast<int>(kW4A16ScaleGroup * kW4A16TileBytes) + 4 * stages * 8;
      const int smem = smem_for(kernel, ring, per_sm);
      time("bulk 4KB x" + std::to_string(stages) + " " + std::to_string(per_sm) + " CTAs/SM",
           [&](uint8_t* p) { kernel<<<ctas, 128, smem>>>(p, p + w.codes_bytes(), k_chunks, k_groups, sink); });
    };
    bulk_variant(hbm_read_bulk<1>, 1, 5);
    bulk_variant(hbm_read_bulk<2>, 2, 3);
    bulk_variant(hbm_read_bulk<2>, 2, 2);
    for (const Row& r : rows) {
      const double bps = static_cast<double>(bytes) / (r.us * 1e-6);
      std::printf("%-8s %10.1f | %-26s %9.1f %8.2f %6.1f%%\n", w.name.c_str(), static_cast<double>(bytes) / 1e6,
                  r.variant.c_str(), r.us, bps / 1e12, 100.0 * bps / copy_bps);
    }
    for (uint8_t* p : sets) FP4MOE_CUDA_CHECK(cudaFree(p));
  }
  FP4MOE_CUDA_CHECK(cudaFree(sink));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    int runs = 30;
    for (int i = 1; i < argc; ++i) {
      const std::string arg = argv[i];
      if (arg == "--runs" && i + 1 < argc) {
        runs = std::max(1, std::atoi(argv[++i]));
      } else {
        std::fprintf(stderr, "usage: bench_hbm_read [--runs 30]\n");
        return 2;
      }
    }
    return run(runs);
  } catch (const fp4moe::Error& e) {
    std::fprintf(stderr, "bench_hbm_read: %s\n", e.what());
    return 1;
  }
}
