// GPU token sampling (see sampling.h): sample_rows_kernel, one CTA of kSampleThreads per spec.
#include "kernels/cuda/ops/sampling.h"

#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>
#include <cuda/functional>

#include <climits>

#include "core/error.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/ops/dsa_indexer.h"  // dsa_ordered_key, dsa_radix_pick

namespace fp4moe::cuda {

namespace {

constexpr int kT = kSampleThreads;
static_assert(kT >= 256, "one histogram bin per thread at least");

// The order key of a logit: NaN ranks as -inf. Key 0 is below every key (kept-set boundary "all").
__device__ __forceinline__ uint32_t key_of(float z) { return dsa_ordered_key(isnan(z) ? -INFINITY : z); }

// The logit of an order key (dsa_ordered_key inverted; the key of +-0 gives +0).
__device__ __forceinline__ float value_of(uint32_t k) {
  return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}

// e = exp((z - mx) / T) in f64 as engine::sample_from computes it; 0 for -inf and NaN.
__device__ __forceinline__ double weight(float z, float mx, double temperature) {
  return (isnan(z) || z == -INFINITY) ? 0.0 : exp((static_cast<double>(z) - static_cast<double>(mx)) / temperature);
}

// A thread's pending histogram update: consecutive hits on one bin are summed in registers and
// added with one shared atomic when the bin changes (most logits share the top digits, so a plain
// atomic per element serializes on one or two bins).
struct BinRun {
  uint32_t bin = 0xffffffffu;
  uint32_t n = 0;
  double mass = 0.0;
  __device__ __forceinline__ void add(uint32_t d, double m, uint32_t* hist_n, double* hist_m) {
    if (d != bin) {
      flush(hist_n, hist_m);
      bin = d;
    }
    ++n;
    mass += m;
  }
  __device__ __forceinline__ void flush(uint32_t* hist_n, double* hist_m) {
    if (n > 0) {
      atomicAdd(&hist_n[bin], n);
      if (hist_m != nullptr) atomicAdd(&hist_m[bin], mass);
    }
    n = 0;
    mass = 0.0;
  }
};

struct Shared {
  union {
    cub::BlockReduce<float, kT>::TempStorage rf;
    cub::BlockReduce<double, kT>::TempStorage rd;
    cub::BlockReduce<int64_t, kT>::TempStorage ri;
    cub::BlockScan<int64_t, kT>::TempStorage si;
    cub::BlockScan<double, kT>::TempStorage sd;
  } cub;
  uint32_t hist_n[256];
  double hist_m[256];
  uint32_t key;
  int64_t count;
  double mass;
  float fvalue;
  int64_t token;
};

// The n-th token (1-based) in the order (key desc, id asc): its key K and how many of the tokens
// with key K it takes (r, the lowest ids). 4 radix passes over the row's keys.
__device__ void select_nth(const float* z, int64_t V, int64_t n, Shared& s, uint32_t* K, int64_t* r) {
  uint32_t prefix = 0, mask = 0;
  int64_t remaining = n;
  for (int shift = 24; shift >= 0; shift -= 8) {
    if (threadIdx.x < 256) s.hist_n[threadIdx.x] = 0;
    __syncthreads();
    BinRun run;
    for (int64_t i = threadIdx.x; i < V; i += kT) {
      const uint32_t u = key_of(z[i]);
      if ((u & mask) == prefix) run.add((u >> shift) & 255u, 0.0, s.hist_n, nullptr);
    }
    run.flush(s.hist_n, nullptr);
    __syncthreads();
    if (threadIdx.x == 0) {
      int64_t n_greater = 0;
      const int d = dsa_radix_pick(s.hist_n, remaining, &n_greater);
      s.key = prefix | (static_cast<uint32_t>(d) << shift);
      s.count = remaining - n_greater;
    }
    __syncthreads();
    prefix = s.key;
    remaining = s.count;
    mask |= 255u << shift;
    __syncthreads();  // s.key / s.count are rewritten by the next pass
  }
  *K = prefix;
  *r = remaining;
}

// Within the kept set {key > Kk} + rk ties at key Kk (Kk = 0: every token), the length of the
// shortest prefix in order whose mass reaches `target` (set_size when rounding leaves it short).
__device__ int64_t top_p_keep(const float* z, int64_t V, float mx, double temperature, uint32_t Kk, int64_t rk,
                              double target, int64_t set_size, Shared& s) {
  const double e_k = Kk != 0 ? weight(value_of(Kk), mx, temperature) : 0.0;
  uint32_t prefix = 0, mask = 0;
  double above = 0.0;
  int64_t n_above = 0;
  for (int shift = 24; shift >= 0; shift -= 8) {
    if (threadIdx.x < 256) {
      s.hist_n[threadIdx.x] = 0;
      s.hist_m[threadIdx.x] = 0.0;
    }
    __syncthreads();
    BinRun run;
    for (int64_t i = threadIdx.x; i < V; i += kT) {
      const float zi = z[i];
      const uint32_t u = key_of(zi);
      if (u > Kk && (u & mask) == prefix) run.add((u >> shift) & 255u, weight(zi, mx, temperature), s.hist_n, s.hist_m);
    }
    run.flush(s.hist_n, s.hist_m);
    __syncthreads();
    if (threadIdx.x == 0) {
      if (Kk != 0 && (Kk & mask) == prefix) {  // the rk tied tokens of the top-k boundary
        const uint32_t d = (Kk >> shift) & 255u;
        s.hist_n[d] += static_cast<uint32_t>(rk);
        s.hist_m[d] += static_cast<double>(rk) * e_k;
      }
      int pick = -1;
      double acc = above;
      int64_t cnt = n_above;
      for (int d = 255; d >= 0; --d) {
        if (s.hist_n[d] == 0) continue;
        if (acc + s.hist_m[d] >= target) {
          pick = d;
          break;
        }
        acc += s.hist_m[d];
        cnt += s.hist_n[d];
      }
      s.count = pick < 0 ? -1 : cnt;
      s.key = prefix | (static_cast<uint32_t>(pick < 0 ? 0 : pick) << shift);
      s.mass = acc;
    }
    __syncthreads();
    const int64_t count = s.count;
    if (count < 0) return set_size;  // CTA-uniform
    prefix = s.key;
    above = s.mass;
    n_above = count;
    mask |= 255u << shift;
    __syncthreads();
  }
  // prefix: the key where the mass crosses; its tied tokens in the set all weigh e_p.
  const int64_t tied = s.hist_n[prefix & 255u];
  __syncthreads();  // hist_n is rewritten by the next select
  const double e_p = weight(value_of(prefix), mx, temperature);
  int64_t take = e_p > 0.0 ? static_cast<int64_t>(ceil((target - above) / e_p)) : tied;
  take = take < 1 ? 1 : (take > tied ? tied : take);
  return n_above + take < set_size ? n_above + take : set_size;
}

__global__ void __launch_bounds__(kT, 1) sample_rows_kernel(const float* __restrict__ logits, int64_t V,
                                                         int64_t row_stride, const SampleSpec* __restrict__ specs,
                                                         int32_t* __restrict__ out) {
  __shared__ Shared s;
  const SampleSpec spec = specs[blockIdx.x];
  const float* z = logits + static_cast<int64_t>(spec.row) * row_stride;
  const bool greedy = !(spec.temperature > 0.0) || spec.top_k == 1;

  // The largest logit (NaN skipped).
  float local_max = -INFINITY;
  for (int64_t i = threadIdx.x; i < V; i += kT) {
    const float zi = z[i];
    if (!isnan(zi)) local_max = fmaxf(local_max, zi);
  }
  const float block_max = cub::BlockReduce<float, kT>(s.cub.rf).Reduce(local_max, ::cuda::maximum<>{});
  if (threadIdx.x == 0) s.fvalue = block_max;
  __syncthreads();
  const float mx = s.fvalue;
  const double T = spec.temperature;

  // The kept set: every key > Kf, and the rf lowest ids with key Kf (Kf = 0: every token).
  uint32_t Kf = 0;
  int64_t rf = 0;
  if (greedy) {
    select_nth(z, V, 1, s, &Kf, &rf);
  } else {
    int64_t keep = V;
    uint32_t Kk = 0;
    int64_t rk = 0;
    const bool top_k = spec.top_k > 0 && spec.top_k < V;
    if (top_k) {
      keep = spec.top_k;
      select_nth(z, V, keep, s, &Kk, &rk);
    }
    if (spec.top_p < 1.0) {
      double m = 0.0;
      for (int64_t i = threadIdx.x; i < V; i += kT) {
        const float zi = z[i];
        if (key_of(zi) > Kk) m += weight(zi, mx, T);
      }
      const double set_mass = cub::BlockReduce<double, kT>(s.cub.rd).Sum(m);
      if (threadIdx.x == 0) s.mass = set_mass + (top_k ? static_cast<double>(rk) * weight(value_of(Kk), mx, T) : 0.0);
      __syncthreads();
      const double target = (spec.top_p - 1e-12) * s.mass;
      __syncthreads();
      keep = top_p_keep(z, V, mx, T, Kk, rk, target, keep, s);
    }
    if (spec.min_p > 0.0) {
      int64_t c = 0;
      for (int64_t i = threadIdx.x; i < V; i += kT) c += weight(z[i], mx, T) >= spec.min_p ? 1 : 0;
      const int64_t n_above_floor = cub::BlockReduce<int64_t, kT>(s.cub.ri).Sum(c);
      if (threadIdx.x == 0) s.count = n_above_floor;
      __syncthreads();
      const int64_t by_floor = s.count < 1 ? 1 : s.count;
      keep = by_floor < keep ? by_floor : keep;
      __syncthreads();
    }
    if (keep < V) {
      if (top_k && keep == spec.top_k) {
        Kf = Kk;
        rf = rk;
      } else {
        select_nth(z, V, keep, s, &Kf, &rf);
      }
    }
  }

  // The draw: thread t owns ids [b, e); its tied-at-Kf tokens before it and its kept mass before it
  // come from block scans; the thread whose range holds u x (kept mass) walks it.
  const int64_t per = (V + kT - 1) / kT;
  const int64_t b0 = static_cast<int64_t>(threadIdx.x) * per;
  const int64_t b = b0 < V ? b0 : V, e = b + per < V ? b + per : V;
  int64_t ties = 0;
  if (Kf != 0) {
    for (int64_t i = b; i < e; ++i) ties += key_of(z[i]) == Kf ? 1 : 0;
  }
  int64_t ties_before = 0;
  cub::BlockScan<int64_t, kT>(s.cub.si).ExclusiveSum(ties, ties_before);
  __syncthreads();
  const auto kept_weight = [&](int64_t i, int64_t& rank) -> double {  // 0 for a token not kept
    const float zi = z[i];
    const uint32_t u = key_of(zi);
    bool kept = u > Kf;
    if (u == Kf) kept = rank++ < rf;
    if (!kept) return 0.0;
    return greedy ? 1.0 : weight(zi, mx, T);
  };
  double m = 0.0;
  int64_t last = -1;
  {
    int64_t rank = ties_before;
    for (int64_t i = b; i < e; ++i) {
      const double w = kept_weight(i, rank);
      m += w;
      if (w > 0.0) last = i;
    }
  }
  double m_before = 0.0, total = 0.0;
  cub::BlockScan<double, kT>(s.cub.sd).ExclusiveSum(m, m_before, total);
  if (threadIdx.x == 0) s.token = LLONG_MAX;
  __syncthreads();
  const double target = greedy ? 0.0 : spec.u * total;
  if (m > 0.0 && m_before <= target && target < m_before + m) {
    double x = target - m_before;
    int64_t rank = ties_before, pick = last;
    for (int64_t i = b; i < e; ++i) {
      const double w = kept_weight(i, rank);
      if (w <= 0.0) continue;
      x -= w;
      if (x < 0.0) {
        pick = i;
        break;
      }
    }
    atomicMin(reinterpret_cast<unsigned long long*>(&s.token), static_cast<unsigned long long>(pick));
  }
  __syncthreads();
  const int64_t claimed = s.token;
  __syncthreads();
  // Nobody's range held the target (rounding at the end): the last kept token with weight > 0.
  const int64_t last_all = cub::BlockReduce<int64_t, kT>(s.cub.ri).Reduce(last, ::cuda::maximum<>{});
  if (threadIdx.x == 0) {
    const int64_t token = claimed != LLONG_MAX ? claimed : (last_all >= 0 ? last_all : 0);
    out[spec.out] = static_cast<int32_t>(token);
  }
}

}  // namespace

void sample_rows(const float* logits, int64_t vocab, int64_t row_stride, const SampleSpec* specs, int64_t n_specs,
                 int32_t* out, cudaStream_t stream) {
  FP4MOE_CHECK(vocab >= 1 && vocab <= INT32_MAX && row_stride >= vocab && n_specs >= 0 && n_specs <= INT32_MAX)
      << "sample_rows: vocab=" << vocab << " (1 .. 2^31-1), row_stride=" << row_stride << " (>= vocab), n_specs="
      << n_specs;
  if (n_specs == 0) return;
  FP4MOE_CHECK(logits != nullptr && specs != nullptr && out != nullptr)
      << "sample_rows: null pointer (logits " << static_cast<const void*>(logits) << ", specs "
      << static_cast<const void*>(specs) << ", out " << static_cast<const void*>(out) << ")";
  sample_rows_kernel<<<static_cast<unsigned>(n_specs), kT, 0, stream>>>(logits, vocab, row_stride, specs, out);
  FP4MOE_CUDA_CHECK(cudaGetLastError());
}

}  // namespace fp4moe::cuda
