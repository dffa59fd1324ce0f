// GPU model kernels of kernels/cuda/ops/norm_rope.h against their CPU references (model/ops.h), on
// fresh random bf16 inputs (the CPU gets the same bf16 values as f32):
//   - rms_norm_bf16 with and without the fused residual add, dims 32..8200 incl. odd ones (the
//     16 B register-held paths, a warp a row for dims 8..1024 and a CTA a row for 1032..8192, in
//     multiples of 8 with 16 B aligned rows, and the element-by-element ones), 1/17/300 rows, a
//     row stride > dim, and y aliasing x: the written residual must equal bf16(x + r) bit
//     for bit; y within 2^-8 * |ref| + 1e-6 of model::rms_norm (one bf16 rounding, 2^-9 relative,
//     plus f32 sum-order differences far below it);
//   - rope_bf16 NeoX partial (GLM-4.5: first half of a 128-dim head) and interleaved (GLM-5: the 64
//     rope dims after 192 nope dims of each head; k_pe inside a wider row): bit for bit
//     model::rope_neox / rope_interleaved with the model::rope_cos_sin table (the kernel rounds each
//     product like the non-FMA x86-64 CPU build; elsewhere 1 bf16 ulp is allowed); an out-of-table
//     position sets kDeviceErrorRopePosition and leaves that token unchanged;
//   - embedding_bf16: exact rows, vectorized and not; an out-of-range id writes zeros and sets the flag;
//   - add_bias_bf16 (linear_ops.h): bit for bit bf16(y + b);
//   - argmax_rows (f32 and bf16 logits, one CTA per row and split into column parts): equal to
//     model::argmax (the sampler's greedy rule: lowest index on ties) on rows with many ties, -inf, +inf, NaNs (incl.
//     at index 0), vocab 151552 and odd sizes; each row's NaN / Inf flag (both paths) equal to
//     model::first_non_finite >= 0.
// Label gpu; without a usable GPU every case skips with the reason.
// Run: test_cuda_ops (FP4MOE_TEST_SEED=<n> replays a seed).
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/ops/device_errors.h"
#include "kernels/cuda/ops/linear_ops.h"
#include "kernels/cuda/ops/norm_rope.h"
#include "kernels/cuda_test_util.h"
#include "model/ops.h"
#include "testing/testing.h"

namespace fp4moe::cuda {
namespace {

using gpu_test::device_alloc;
using gpu_test::upload;
using gpu_test::random_bf16;
using gpu_test::to_f32;
using gpu_test::download;
using gpu_test::bf;

uint32_t read_flag(const uint32_t* d) { return download(d, 1)[0]; }
gpu_test::DevicePtr<uint32_t> zero_flag() {
  auto f = device_alloc<uint32_t>(1);
  FP4MOE_CUDA_CHECK(cudaMemset(f.get(), 0, 4));
  return f;
}

TEST(CudaRmsNorm, MatchesCpu) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(testing::test_seed());
  struct Case {
    int64_t rows, dim, stride;
    bool residual, alias;
  };
  const Case cases[] = {{1, 32, 32, false, false},
                        {17, 128, 128, true, false},
                        {300, 128, 160, false, true},
                        {5, 999, 1001, true, false},
                        {3, 1025, 1025, true, true},
                        {17, 5120, 5120, true, false},
                        {2, 6144, 6144, false, false},
                        {300, 6144, 6144, true, true},
                        {4, 1, 1, true, false},
                        {5, 2048, 2056, true, false},
                        {3, 8192, 8192, true, true},
                        {2, 8200, 8200, true, false},
                        // a warp a row, 16 B pieces: GLM-5's kv_a norm (512 of a 576-wide row, in place), a
                        // full 1024, and 264 = 33 pieces (lane 0 alone holds a second one)
                        {64, 512, 576, false, true},
                        {7, 1024, 1024, true, false},
                        {3, 264, 264, true, true},
                        // dim % 8 == 0 but rows 8 B apart from 16 B alignment: the element-by-element warp kernel
                        {5, 128, 132, true, false}};
  const float eps = 1e-5f;
  for (const Case& c : cases) {
    const std::string what = "rows=" + std::to_string(c.rows) + " dim=" + std::to_string(c.dim) + " stride=" +
                             std::to_string(c.stride) + (c.residual ? " +residual" : "") + (c.alias ? " y=x" : "");
    const size_t n = static_cast<size_t>(c.rows * c.stride);
    std::vector<uint16_t> x = random_bf16(n, rng, 2.0f), r = random_bf16(n, rng, 3.0f);
    std::vector<float> w(static_cast<size_t>(c.dim));
    std::uniform_real_distribution<float> wd(0.5f, 1.5f);
    for (float& v : w) v = wd(rng);
    auto dx = upload(x);
    auto dr = upload(r);
    auto dw = upload(w);
    auto dy = device_alloc<uint16_t>(n);
    FP4MOE_CUDA_CHECK(cudaMemset(dy.get(), 0, n * 2));
    __nv_bfloat16* y = c.alias ? bf(dx.get()) : bf(dy.get());
    rms_norm_bf16(bf(dx.get()), c.residual ? bf(dr.get()) : nullptr, dw.get(), c.rows, c.dim, c.stride, eps, y, nullptr);
    FP4MOE_CUDA_CHECK(cudaDeviceSynchronize());
    const std::vector<uint16_t> got = download(reinterpret_cast<uint16_t*>(y), n);
    const std::vector<uint16_t> got_r = download(dr.get(), n);
    for (int64_t row = 0; row < c.rows; ++row) {
      std::vector<float> s(static_cast<size_t>(c.dim)), ref(static_cast<size_t>(c.dim));
      for (int64_t i = 0; i < c.dim; ++i) {
        const size_t k = static_cast<size_t>(row * c.stride + i);
        float v = bf16_to_f32(x[k]);
        if (c.residual) {
          const uint16_t sb = f32_to_bf16(v + bf16_to_f32(r[k]));
          ASSERT_EQ(got_r[k], sb) << what << ": residual row " << row << " col " << i;
          v = bf16_to_f32(sb);
        }
        s[static_cast<size_t>(i)] = v;
      }
      model::rms_norm(s.data(), 1, c.dim, w.data(), eps, ref.data());
      for (int64_t i = 0; i < c.dim; ++i) {
        const float g = bf16_to_f32(got[static_cast<size_t>(row * c.stride + i)]);
        const float e = ref[static_cast<size_t>(i)];
        // Half a bf16 ulp is <= 2^-8 |e|; the 1.001 covers an f32 difference that flips the rounding.
        ASSERT_LE(std::fabs(g - e), std::ldexp(std::fabs(e), -8) * 1.001f + 1e-6f)
            << what << ": row " << row << " col " << i << " gpu " << g << " cpu " << e;
      }
      // Padding between rows is not written (only when y is a fresh buffer).
      if (!c.alias) {
        for (int64_t i = c.dim; i < c.stride; ++i) {
          ASSERT_EQ(got[static_cast<size_t>(row * c.stride + i)], 0) << what << ": padding col " << i << " written";
        }
      }
    }
  }
}

struct RopeCase {
  const char* name;
  RopeStyle style;
  int64_t n_tokens, n_heads, token_stride, head_stride, offset, rotary_dim;
};

TEST(CudaRope, MatchesCpuBitForBit) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(testing::test_seed());
  const RopeCase cases[] = {
      {"glm45 q: 96 heads x 128, NeoX on 64", RopeStyle::kNeox, 17, 96, 96 * 128, 128, 0, 64},
      {"glm45 k: 8 heads x 128, NeoX on 64", RopeStyle::kNeox, 300, 8, 8 * 128, 128, 0, 64},
      {"tiny: 4 heads x 32, NeoX on 16", RopeStyle::kNeox, 1, 4, 4 * 32, 32, 0, 16},
      {"glm5 q: 64 heads x (192 nope + 64 rope), interleaved", RopeStyle::kInterleaved, 17, 64, 64 * 256, 256, 192, 64},
      {"glm5 k_pe inside [512 c_kv | 64 k_pe] rows", RopeStyle::kInterleaved, 33, 1, 576, 576, 512, 64},
      {"neox full head", RopeStyle::kNeox, 5, 3, 3 * 64, 64, 0, 64},
  };
  const int64_t n_positions = 4096;
  for (const RopeCase& c : cases) {
    const int64_t half = c.rotary_dim / 2;
    const std::vector<float> inv = model::rope_inv_freq(c.rotary_dim, 10000.0f);
    std::vector<float> cos_t(static_cast<size_t>(n_positions * half)), sin_t(cos_t.size());
    for (int64_t p = 0; p < n_positions; ++p) model::rope_cos_sin(inv, p, cos_t.data() + p * half, sin_t.data() + p * half);
    std::vector<int32_t> pos(static_cast<size_t>(c.n_tokens));
    for (auto& p : pos) p = static_cast<int32_t>(rng() % n_positions);
    const bool bad = c.n_tokens > 2;  // one position outside the table
    if (bad) pos[1] = static_cast<int32_t>(n_positions);
    const size_t n = static_cast<size_t>(c.n_tokens * c.token_stride);
    const std::vector<uint16_t> x = random_bf16(n, rng, 4.0f);
    auto dx = upload(x);
    auto dpos = upload(pos);
    auto dcos = upload(cos_t);
    auto dsin = upload(sin_t);
    auto flag = zero_flag();
    rope_bf16(bf(dx.get()), c.n_tokens, c.n_heads, c.token_stride, c.head_stride, c.offset, c.rotary_dim, c.style,
              dpos.get(), dcos.get(), dsin.get(), n_positions, flag.get(), nullptr);
    FP4MOE_CUDA_CHECK(cudaDeviceSynchronize());
    const std::vector<uint16_t> got = download(dx.get(), n);
    EXPECT_EQ(read_flag(flag.get()), bad ? kDeviceErrorRopePosition : 0u) << c.name;
    std::vector<float> ref = to_f32(x);
    for (int64_t t = 0; t < c.n_tokens; ++t) {
      if (bad && t == 1) continue;
      float* row = ref.data() + t * c.token_stride;
      const float* co = cos_t.data() + pos[static_cast<size_t>(t)] * half;
      const float* si = sin_t.data() + pos[static_cast<size_t>(t)] * half;
      if (c.style == RopeStyle::kNeox) {
        model::rope_neox(row, c.n_heads, c.head_stride, c.offset, c.rotary_dim, co, si);
      } else {
        model::rope_interleaved(row, c.n_heads, c.head_stride, c.offset, c.rotary_dim, co, si);
      }
    }
#if defined(__x86_64__) && !defined(__FMA__)
    const int max_ulp = 0;
#else
    const int max_ulp = 1;  // the CPU build may fuse a*b - c*d
#endif
    for (size_t i = 0; i < n; ++i) {
      const int diff = std::abs(static_cast<int>(got[i]) - static_cast<int>(f32_to_bf16(ref[i])));
      ASSERT_LE(diff, max_ulp) << c.name << ": element " << i << " (token " << i / c.token_stride << ") gpu "
                               << bf16_to_f32(got[i]) << " cpu " << ref[i];
    }
  }
}

TEST(CudaEmbedding, CopiesRowsAndFlagsBadIds) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(testing::test_seed());
  for (const int64_t dim : {int64_t{5120}, int64_t{33}, int64_t{8}}) {
    const int64_t vocab = 1000;
    const std::vector<uint16_t> table = random_bf16(static_cast<size_t>(vocab * dim), rng);
    for (const bool with_bad : {false, true}) {
      std::vector<int32_t> ids(17);
      for (auto& id : ids) id = static_cast<int32_t>(rng() % vocab);
      ids[0] = 0;
      ids[16] = static_cast<int32_t>(vocab - 1);
      if (with_bad) {
        ids[3] = static_cast<int32_t>(vocab);
        ids[7] = -1;
      }
      auto dt = upload(table);
      auto di = upload(ids);
      auto dout = device_alloc<uint16_t>(ids.size() * static_cast<size_t>(dim));
      FP4MOE_CUDA_CHECK(cudaMemset(dout.get(), 0xff, ids.size() * static_cast<size_t>(dim) * 2));
      auto flag = zero_flag();
      embedding_bf16(bf(dt.get()), vocab, dim, di.get(), static_cast<int64_t>(ids.size()), bf(dout.get()), flag.get(),
                     nullptr);
      FP4MOE_CUDA_CHECK(cudaDeviceSynchronize());
      const std::vector<uint16_t> got = download(dout.get(), ids.size() * static_cast<size_t>(dim));
      EXPECT_EQ(read_flag(flag.get()), with_bad ? kDeviceErrorTokenId : 0u) << "dim=" << dim;
      for (size_t t = 0; t < ids.size(); ++t) {
        const bool ok = ids[t] >= 0 && ids[t] < vocab;
        std::vector<float> ref(static_cast<size_t>(dim), 0.0f);
        if (ok) {
          const TensorView tv{DType::kBF16, {vocab, dim},
                              {reinterpret_cast<const uint8_t*>(table.data()), table.size() * 2}};
          model::embedding_lookup(tv, std::span<const int32_t>(&ids[t], 1), ref.data());
        }
        for (int64_t i = 0; i < dim; ++i) {
          ASSERT_EQ(got[t * static_cast<size_t>(dim) + static_cast<size_t>(i)], f32_to_bf16(ref[static_cast<size_t>(i)]))
              << "dim=" << dim << " token " << t << " id " << ids[t] << " col " << i;
        }
      }
    }
  }
}

// linear_ops.h: add_bias_bf16 equals bf16(float(y) + b) bit for bit on a strided view (the columns
// past n_cols untouched).
TEST(CudaLinearOps, AddBias) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(testing::test_seed());
  for (const auto& [rows, cols, ld] : {std::tuple<int64_t, int64_t, int64_t>{1, 8, 8}, {37, 131, 140}, {300, 4096, 4096}}) {
    const std::vector<uint16_t> y = random_bf16(static_cast<size_t>(rows * ld), rng);
    std::vector<float> bias(static_cast<size_t>(cols));
    std::normal_distribution<float> d(0.0f, 0.5f);
    for (float& b : bias) b = d(rng);
    auto dy = upload(y);
    auto db = upload(bias);
    add_bias_bf16(bf(dy.get()), db.get(), rows, cols, ld, nullptr);
    FP4MOE_CUDA_CHECK(cudaDeviceSynchronize());
    const std::vector<uint16_t> got = download(dy.get(), y.size());
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < ld; ++c) {
        const size_t i = static_cast<size_t>(r * ld + c);
        const uint16_t want = c < cols ? f32_to_bf16(bf16_to_f32(y[i]) + bias[static_cast<size_t>(c)]) : y[i];
        ASSERT_EQ(got[i], want) << "rows=" << rows << " cols=" << cols << " at (" << r << ", " << c << ")";
      }
    }
  }
  EXPECT_THROW(add_bias_bf16(bf(nullptr), nullptr, 1, 8, 4, nullptr), Error);
}

TEST(CudaArgmax, MatchesCpuGreedyOnTiesAndNaNs) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(testing::test_seed());
  struct Case {
    int64_t rows, cols, stride;
  };
  for (const Case c : {Case{1, 1, 1}, Case{17, 151552, 151552}, Case{5, 300, 301}, Case{64, 1000, 1024},
                       Case{1, 154880, 154880}, Case{2, 9000, 9001}, Case{600, 20000, 20000}}) {
    std::vector<float> x(static_cast<size_t>(c.rows * c.stride), 7.0f);  // padding would win if read
    for (int64_t r = 0; r < c.rows; ++r) {
      float* row = x.data() + r * c.stride;
      const int kind = static_cast<int>(r % 4);
      for (int64_t i = 0; i < c.cols; ++i) {
        row[i] = kind == 0 ? std::normal_distribution<float>(0.0f, 3.0f)(rng)
                           : static_cast<float>(static_cast<int>(rng() % 7)) - 3.0f;  // ties
        row[i] = bf16_to_f32(f32_to_bf16(row[i]));  // the same values in both dtypes
      }
      if (kind == 2 && c.cols > 3) {
        row[rng() % c.cols] = NAN;
        row[c.cols - 1] = -INFINITY;
      }
      if (kind == 3) row[0] = NAN;  // the CPU keeps index 0
      if (kind == 1 && r % 8 == 5) row[rng() % c.cols] = INFINITY;  // wins, and flags the row
    }
    std::vector<uint16_t> xb(x.size());
    for (size_t i = 0; i < x.size(); ++i) xb[i] = f32_to_bf16(x[i]);
    auto dx = upload(x);
    auto dxb = upload(xb);
    auto out = device_alloc<int32_t>(static_cast<size_t>(c.rows));
    auto outb = device_alloc<int32_t>(static_cast<size_t>(c.rows));
    argmax_rows(dx.get(), c.rows, c.cols, c.stride, out.get(), nullptr);
    argmax_rows(bf(dxb.get()), c.rows, c.cols, c.stride, outb.get(), nullptr);
    // The split path (column parts + merge): workspace poisoned so stale candidates would show.
    auto ws = device_alloc<ArgmaxCandidate>(static_cast<size_t>(kArgmaxWorkspaceCandidates));
    FP4MOE_CUDA_CHECK(cudaMemset(ws.get(), 0x7f, kArgmaxWorkspaceCandidates * sizeof(ArgmaxCandidate)));
    auto outs = device_alloc<int32_t>(static_cast<size_t>(c.rows));
    // The rows' NaN / Inf flags, from the split path and from the one-CTA-a-row path (no workspace); poisoned.
    auto flags = device_alloc<uint32_t>(static_cast<size_t>(c.rows));
    auto flags1 = device_alloc<uint32_t>(static_cast<size_t>(c.rows));
    auto out1 = device_alloc<int32_t>(static_cast<size_t>(c.rows));
    FP4MOE_CUDA_CHECK(cudaMemset(flags.get(), 0x7f, static_cast<size_t>(c.rows) * 4));
    FP4MOE_CUDA_CHECK(cudaMemset(flags1.get(), 0x7f, static_cast<size_t>(c.rows) * 4));
    argmax_rows(dx.get(), c.rows, c.cols, c.stride, outs.get(), ws.get(), flags.get(), nullptr);
    argmax_rows(dx.get(), c.rows, c.cols, c.stride, out1.get(), nullptr, flags1.get(), nullptr);
    FP4MOE_CUDA_CHECK(cudaDeviceSynchronize());
    const std::vector<uint32_t> got_flags = download(flags.get(), static_cast<size_t>(c.rows));
    const std::vector<uint32_t> got_flags1 = download(flags1.get(), static_cast<size_t>(c.rows));
    const std::vector<int32_t> got1 = download(out1.get(), static_cast<size_t>(c.rows));
    const std::vector<int32_t> got = download(out.get(), static_cast<size_t>(c.rows));
    const std::vector<int32_t> gotb = download(outb.get(), static_cast<size_t>(c.rows));
    const std::vector<int32_t> gots = download(outs.get(), static_cast<size_t>(c.rows));
    const int64_t parts = argmax_split_parts(c.rows, c.cols);
    for (int64_t r = 0; r < c.rows; ++r) {
      const int64_t ref = model::argmax(x.data() + r * c.stride, c.cols);
      ASSERT_EQ(got[static_cast<size_t>(r)], ref) << "f32 rows=" << c.rows << " cols=" << c.cols << " row " << r;
      ASSERT_EQ(gotb[static_cast<size_t>(r)], ref) << "bf16 rows=" << c.rows << " cols=" << c.cols << " row " << r;
      ASSERT_EQ(gots[static_cast<size_t>(r)], ref)
          << "f32 split into " << parts << " parts, rows=" << c.rows << " cols=" << c.cols << " row " << r;
      ASSERT_EQ(got1[static_cast<size_t>(r)], ref) << "f32 with flags, rows=" << c.rows << " row " << r;
      const uint32_t want_flag = model::first_non_finite(x.data() + r * c.stride, c.cols) >= 0 ? 1u : 0u;
      ASSERT_EQ(got_flags[static_cast<size_t>(r)], want_flag) << "split flags, rows=" << c.rows << " row " << r;
      ASSERT_EQ(got_flags1[static_cast<size_t>(r)], want_flag) << "one-CTA flags, rows=" << c.rows << " row " << r;
    }
    if (parts > 1) {
      EXPECT_LE(c.rows * parts, kArgmaxWorkspaceCandidates);  // one CTA per row needs none
    }
    if (c.rows == 1 && c.cols == 154880) {
      EXPECT_EQ(parts, 37);  // GLM-5's vocabulary at batch 1: 37 CTAs
    }
    if (c.rows == 600) {
      EXPECT_EQ(parts, 1);
    }
  }
}

}  // namespace
}  // namespace fp4moe::cuda
