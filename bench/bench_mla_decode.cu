// Benchmark of the MLA decode attention (mla_decode_attention: the wgmma CTA + the split merge) over its split-K
// choices, to check plan_mla_decode_split against measured times. GLM-5 dims (64 heads, kv_lora_rank 512, rope 64,
// bf16 cache in pages of --page-size tokens, the engine's default), one query token a sequence, every sequence
// --keys long (the kernel cuts each sequence by its own length, mla_decode_split_keys: equal lengths are the worst
// case of a plan). For each (sequences, keys) every distinct split of n = 1 .. kMaxDecodeSplits parts is timed
// (ceil(keys / n) rounded up to whole 64-key tiles, as the planner and the kernel cut them; no split empty); the
// planner's choice (plan_mla_decode_split for the device's SM count and --min-keys, the engine's
// --decode-split-min-keys default unless given) is marked "<- plan". Peer, same run and inputs: mla_prefill_attention
// (the mma.sync CTA, 2 an SM, 32-key tiles) with one query a sequence and its own planner's split: the kernel decode
// ran on before the wgmma CTA. Columns: CTAs (sequences x 4 head chunks x splits), waves (CTAs / (SMs x CTAs an SM)),
// time, and the bytes a step must move (the cache rows read once + q_lat read + the f32 latent written) per second and
// as a fraction of the HBM roofline (device-to-device copy bandwidth measured in the same run, read + written). The
// four head chunks of a sequence share its rows through L2, so the roofline counts them once. Method:
// tune/gpu_bench.h's (CUDA events, 5 warm-ups, median of --runs, --batch back-to-back launches a sample); caches rotate
// over enough sets that the other sets' bytes between two launches of a set are at least 3x the L2, so no launch finds
// its rows in L2 (a model step reads the cache after the layer's weights). Run: bench_mla_decode [--seqs
// 1,8,16,32,64,128]
// [--keys 1024,4096] [--runs 30] [--batch 10] [--page-size 16] [--min-keys 32]. Needs a Hopper GPU; exits non-zero on
// errors (device error flags included).
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "core/error.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/moe/device_buffer.h"
#include "kernels/cuda/ops/device_errors.h"
#include "kernels/cuda/ops/mla_decode.h"
#include "kernels/cuda/ops/mla_prefill.h"
#include "model/registry.h"
#include "tune/gpu_bench.h"
#include "tune/tune_cache.h"

namespace {

using namespace fp4moe;
using cuda::DeviceBuffer;

constexpr int kHeads = 64, kRank = 512, kRope = 64, kNope = 192, kV = 256;  // GLM-5
constexpr int kWidth = kRank + kRope;

// Deterministic values in [-1, 1): a hash of the index and a seed (no host-side generation of GBs of cache).
__device__ __forceinline__ float hash_unit(uint64_t i, uint32_t seed) {
  uint64_t x = i * 0x9E3779B97F4A7C15ull + seed;
  x ^= x >> 31;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 29;
  return static_cast<float>(x >> 40) * (2.0f / 16777216.0f) - 1.0f;
}
__global__ void fill_bf16(__nv_bfloat16* p, int64_t n, uint32_t seed) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    p[i] = __float2bfloat16(hash_unit(static_cast<uint64_t>(i), seed));
}
__global__ void fill_f32(float* p, int64_t n, uint32_t seed, float scale) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    p[i] = scale * hash_unit(static_cast<uint64_t>(i), seed);
}

// The inputs of one (sequences, keys) point: n_sets caches of n_seqs x keys rows, one block table (sequence s owns
// blocks s * pages .. s * pages + pages - 1 of every set), q_lat, the outputs and the largest split workspace.
struct Point {
  int64_t n_seqs = 0, keys = 0, page_size = 0, pages = 0;
  int n_sets = 0;
  std::vector<DeviceBuffer> caches;
  DeviceBuffer table, lens, q_start, q_lat, latent, workspace, flag;
  double step_bytes = 0;  // cache rows once + q_lat + latent

  Point(int64_t seqs, int64_t n_keys, int64_t page, int64_t l2_bytes) : n_seqs(seqs), keys(n_keys), page_size(page) {
    pages = (keys + page_size - 1) / page_size;
    const int64_t cache_bytes = n_seqs * pages * page_size * kWidth * 2;
    // The other sets' bytes between two launches of one set: (n_sets - 1) x cache_bytes >= 3 x L2.
    n_sets = static_cast<int>(std::clamp<int64_t>(1 + (3 * l2_bytes + cache_bytes - 1) / cache_bytes, 2, 257));
    for (int s = 0; s < n_sets; ++s) {
      caches.emplace_back(static_cast<size_t>(cache_bytes));
      fill_bf16<<<1024, 256>>>(caches.back().as<__nv_bfloat16>(), cache_bytes / 2, 17u + static_cast<uint32_t>(s));
      FP4MOE_CUDA_CHECK(cudaGetLastError());
    }
    std::vector<int32_t> tab(static_cast<size_t>(n_seqs * pages)),
        len(static_cast<size_t>(n_seqs), static_cast<int32_t>(keys));
    for (size_t i = 0; i < tab.size(); ++i) tab[i] = static_cast<int32_t>(i);
    std::vector<int32_t> qs(static_cast<size_t>(n_seqs + 1));
    for (size_t i = 0; i < qs.size(); ++i) qs[i] = static_cast<int32_t>(i);
    table = DeviceBuffer::from_host(tab);
    lens = DeviceBuffer::from_host(len);
    q_start = DeviceBuffer::from_host(qs);
    const int64_t q_elems = n_seqs * kHeads * kWidth;
    q_lat = DeviceBuffer(static_cast<size_t>(q_elems) * 4);
    // |q_lat . row| ~ sqrt(576) / 3 * 0.1 before the 1/sqrt(256) scale: softmax weights spread over many keys.
    fill_f32<<<256, 256>>>(q_lat.as<float>(), q_elems, 5u, 0.1f);
    FP4MOE_CUDA_CHECK(cudaGetLastError());
    latent = DeviceBuffer(static_cast<size_t>(n_seqs * kHeads * kRank) * 4);
    workspace = DeviceBuffer(cuda::mla_decode_workspace_bytes(n_seqs, dims(), {cuda::kMaxDecodeSplits, 64}));
    flag = DeviceBuffer(4);
    FP4MOE_CUDA_CHECK(cudaMemset(flag.as<void>(), 0, 4));
    FP4MOE_CUDA_CHECK(cudaDeviceSynchronize());
    step_bytes = static_cast<double>(n_seqs) * static_cast<double>(keys) * kWidth * 2 +
                 static_cast<double>(q_elems) * 4 + static_cast<double>(n_seqs * kHeads * kRank) * 4;
  }

  static cuda::MlaDecodeDims dims() {
    return {kHeads, kRank, kNope, kRope, kV, 1.0f / 16.0f};  // 1 / sqrt(nope + rope)
  }
  cuda::MlaCacheView cache(int set) const {
    return {caches[static_cast<size_t>(set)].as<__nv_bfloat16>(), n_seqs * pages, page_size, kRank, kRope};
  }
  void decode(const cuda::DecodeSplit& split, int set) {
    cuda::mla_decode_attention(q_lat.as<float>(), cache(set), table.as<int32_t>(), pages, lens.as<int32_t>(), n_seqs,
                               dims(), split, split.n_splits > 1 ? workspace.as<float>() : nullptr, latent.as<float>(),
                               flag.as<uint32_t>(), nullptr);
  }
  void peer(const cuda::DecodeSplit& split, int set) {
    cuda::MlaPrefillArgs a;
    a.q_lat = q_lat.as<float>();
    a.cache = cache(set);
    a.block_table = table.as<int32_t>();
    a.max_blocks_per_seq = pages;
    a.seq_lens = lens.as<int32_t>();
    a.q_start = q_start.as<int32_t>();
    a.n_seqs = n_seqs;
    a.n_tokens = n_seqs;
    a.max_q_len = 1;
    a.latent = latent.as<float>();
    a.error_flag = flag.as<uint32_t>();
    cuda::mla_prefill_attention(a, dims(), split, split.n_splits > 1 ? workspace.as<float>() : nullptr, nullptr);
  }
  // Throws naming `what` when a launch set a device error flag.
  void check(const std::string& what) {
    FP4MOE_CUDA_CHECK(cudaDeviceSynchronize());
    const uint32_t f = flag.to_host<uint32_t>(1)[0];
    FP4MOE_CHECK(f == 0) << what << ": device errors " << cuda::describe_device_errors(f);
  }
};

// The split of `keys` into n parts of whole 64-key tiles (the planner's rounding), n reduced where a split would be
// empty.
cuda::DecodeSplit split_of(int64_t keys, int64_t n) {
  const int64_t kps = cuda::split_part_keys(keys, n, cuda::kMlaWgKeysPerTile);
  return {static_cast<int>((keys + kps - 1) / kps), kps};
}

int run(const std::vector<int64_t>& seqs_list, const std::vector<int64_t>& keys_list, int runs, int batch,
        int64_t page_size, int64_t min_keys) {
  std::string why;
  if (!cuda::cuda_device_available(&why)) {
    std::fprintf(stderr, "bench_mla_decode: no usable GPU: %s\n", why.c_str());
    return 1;
  }
  const tune::TimingOptions timing{5, runs, batch};
  const int n_sms = cuda::current_device_limits().sm_count;
  const int64_t l2 = tune::device_l2_bytes();
  std::printf(
      "bench_mla_decode: %s, L2 %lld MB, %s; GLM-5 MLA (64 heads, rank 512, rope 64), page %lld, plan min keys %lld\n",
      cuda::cuda_device_description(0).c_str(), static_cast<long long>(l2 >> 20), tune::describe_timing(timing).c_str(),
      static_cast<long long>(page_size), static_cast<long long>(min_keys));
  const double hbm_bps = tune::measure_copy_bandwidth();
  std::printf("HBM roofline (D2D copy, read + write, this run): %.2f TB/s\n", hbm_bps / 1e12);
  std::printf("%5s %6s | %6s %9s %6s %6s | %9s %7s %6s | %s\n", "seqs", "keys", "splits", "keys/spl", "CTAs", "waves",
              "time us", "GB/s", "%HBM", "");
  const int64_t chunks = (kHeads + cuda::kMlaHeadsPerCta - 1) / cuda::kMlaHeadsPerCta;
  for (const int64_t keys : keys_list) {
    for (const int64_t seqs : seqs_list) {
      Point pt(seqs, keys, page_size, l2);
      const cuda::DecodeSplit plan = cuda::plan_mla_decode_split(seqs, kHeads, keys, n_sms, min_keys);
      double best_us = 1e30, plan_us = 0;
      cuda::DecodeSplit best;
      int64_t last_n = 0;
      for (int64_t want = 1; want <= cuda::kMaxDecodeSplits; ++want) {
        const cuda::DecodeSplit s = split_of(keys, want);
        if (s.n_splits == last_n) continue;
        last_n = s.n_splits;
        const double us = tune::time_median_us([&](int set) { pt.decode(s, set); }, pt.n_sets, timing);
        pt.check("mla_decode_attention " + s.to_string());
        const bool is_plan = s.n_splits == plan.n_splits && s.keys_per_split == plan.keys_per_split;
        if (is_plan) plan_us = us;
        if (us < best_us) best_us = us, best = s;
        const int64_t ctas = seqs * chunks * s.n_splits;
        const double gbps = pt.step_bytes / (us * 1e-6) / 1e9;
        std::printf("%5lld %6lld | %6d %9lld %6lld %6.2f | %9.1f %7.0f %5.1f%% | %s\n", static_cast<long long>(seqs),
                    static_cast<long long>(keys), s.n_splits, static_cast<long long>(s.keys_per_split),
                    static_cast<long long>(ctas),
                    static_cast<double>(ctas) / (static_cast<double>(n_sms) * cuda::kMlaWgCtasPerSm), us, gbps,
                    100.0 * gbps * 1e9 / hbm_bps, is_plan ? "<- plan" : "");
      }
      if (plan_us == 0) {  // the planner picked a split the sweep does not hold (a hand-made one)
        plan_us = tune::time_median_us([&](int set) { pt.decode(plan, set); }, pt.n_sets, timing);
        pt.check("mla_decode_attention " + plan.to_string());
        if (plan_us < best_us) best_us = plan_us, best = plan;
        std::printf("%5lld %6lld | %6d %9lld %6s %6s | %9.1f %7s %6s | <- plan\n", static_cast<long long>(seqs),
                    static_cast<long long>(keys), plan.n_splits, static_cast<long long>(plan.keys_per_split), "", "",
                    plan_us, "", "");
      }
      const cuda::DecodeSplit peer_split = cuda::plan_mla_prefill_split(seqs, kHeads, keys, n_sms, min_keys);
      const double peer_us = tune::time_median_us([&](int set) { pt.peer(peer_split, set); }, pt.n_sets, timing);
      pt.check("mla_prefill_attention " + peer_split.to_string());
      std::printf(
          "  seqs %lld keys %lld: plan %s %.1f us (%.1f%% HBM), best %s %.1f us (plan / best %.3f); peer "
          "mma.sync CTA (mla_prefill_attention, %s) %.1f us, peer / plan %.2fx\n",
          static_cast<long long>(seqs), static_cast<long long>(keys), plan.to_string().c_str(), plan_us,
          100.0 * pt.step_bytes / (plan_us * 1e-6) / hbm_bps, best.to_string().c_str(), best_us, plan_us / best_us,
          peer_split.to_string().c_str(), peer_us, peer_us / plan_us);
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    std::vector<int64_t> seqs = {1, 8, 16, 32, 64, 128};
    std::vector<int64_t> keys = {1024, 4096};
    int runs = 30, batch = 10;
    int64_t page_size = fp4moe::model::GpuOptions{}.page_size;
    int64_t min_keys = fp4moe::model::GpuOptions{}.decode_split_min_keys;
    for (int i = 1; i < argc; ++i) {
      const std::string arg = argv[i];
      if (arg == "--seqs" && i + 1 < argc) {
        seqs = fp4moe::tune::parse_positive_list(argv[++i], "--seqs");
      } else if (arg == "--keys" && i + 1 < argc) {
        keys = fp4moe::tune::parse_positive_list(argv[++i], "--keys");
      } else if (arg == "--runs" && i + 1 < argc) {
        runs = std::max(1, std::atoi(argv[++i]));
      } else if (arg == "--batch" && i + 1 < argc) {
        batch = std::max(1, std::atoi(argv[++i]));
      } else if (arg == "--page-size" && i + 1 < argc) {
        page_size = std::max(1, std::atoi(argv[++i]));
      } else if (arg == "--min-keys" && i + 1 < argc) {
        min_keys = std::max(1, std::atoi(argv[++i]));
      } else {
        std::fprintf(stderr,
                     "usage: bench_mla_decode [--seqs 1,16,64] [--keys 1024,4096] [--runs 30] [--batch 10] "
                     "[--page-size 16] [--min-keys 32]\n");
        return 2;
      }
    }
    return run(seqs, keys, runs, batch, page_size, min_keys);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_mla_decode: %s\n", e.what());
    return 1;
  }
}
