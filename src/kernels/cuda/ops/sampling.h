// Token sampling on the GPU: temperature, top-k, top-p and min-p over f32 logits rows, one CTA per
// row, the same draw as the CPU sampler (engine::sample_from, its reference): probabilities
// e_i = exp((z_i - max z) / T) in f64; the kept set is the first `keep` tokens in the order (z desc,
// id asc) with keep = min(top_k, the shortest prefix whose mass reaches (top_p - 1e-12) x the top-k
// mass, the tokens with e_i >= min_p x e_max (at least 1)); the token is the first kept one in id
// order at which u x (kept mass) is used up (the last kept token with e_i > 0 if rounding leaves a
// sliver). Penalties are applied by the caller (the engine keeps such requests on the host path).
//
// Inside the CTA (512 threads; the row is read from L2 a few times, never sorted):
//   - max z, then the kept-set boundary as (key K, r): every token with a larger order-preserving key
//     (dsa_ordered_key of z; NaN counts as -inf) is kept, and the r lowest ids among those equal to K:
//     a 4-pass 8-bit radix select on counts (dsa_radix_pick) for top-k and for the final keep, and on
//     f64 masses for top-p (where the cumulative mass crosses the target, then how many of the tied
//     group it takes);
//   - the draw: each thread owns a contiguous id range, block scans (CUB) give each range its kept
//     ties before it and its kept mass before it; the thread whose range holds u x mass walks it.
// Sums are in another order than the CPU's (f64 tree sums and atomics): results can differ from
// engine::sample_from only when u or top_p lies within ~1e-15 of a boundary.
// Tested by tests/kernels/test_cuda_sampling.cpp (GPU vs engine::sample_from on random rows, ties,
// -inf and NaN logits, every knob).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace fp4moe::cuda {

// One row to sample (device memory, filled by the host each step).
struct SampleSpec {
  double u = 0.0;            // the request's uniform draw in [0, 1) (engine::Sampler::next_uniform)
  double temperature = 1.0;  // > 0 (<= 0: the argmax, lowest id on ties)
  double top_p = 1.0;        // (0, 1]
  double min_p = 0.0;        // [0, 1]
  int32_t top_k = -1;        // <= 0: off
  int32_t row = 0;           // logits row
  int32_t out = 0;           // index into `out`
  int32_t pad = 0;
};

inline constexpr int kSampleThreads = 512;

// out[specs[i].out] = the token drawn from logits[specs[i].row * row_stride + 0 .. vocab) for each of
// the n_specs specs (device array). vocab >= 1. Asynchronous on `stream`; throws on bad arguments
// (naming them) or a launch error.
void sample_rows(const float* logits, int64_t vocab, int64_t row_stride, const SampleSpec* specs, int64_t n_specs,
                 int32_t* out, cudaStream_t stream);

}  // namespace fp4moe::cuda
