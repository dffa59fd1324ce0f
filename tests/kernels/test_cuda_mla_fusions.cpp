// The MLA decode step's fused launches against the launches they replace, bit for bit, on fresh random
// inputs (kernels/cuda/ops/mla_decode.h):
//   - mla_latent_norm_rope_append (kv_a norm + k_pe RoPE + cache append in one launch) vs rms_norm_bf16 +
//     rope_bf16 + mla_cache_append_bf16: the whole cache (slots -1 skipped, nothing else written) and the
//     error flags (a position outside the table, a slot past the cache); GLM-5 dims (rank 512, rope 64,
//     interleaved) and NeoX, and dims the fused kernel does not take (rank + rope not a multiple of 8: the
//     three launches run inside);
//   - mla_absorb_q with MlaQRope vs rope_bf16 on q first: q_lat bit for bit, both styles, and the flag of a
//     position outside the table;
//   - dsa_index_key_norm_rope_append (the indexer key's LayerNorm + RoPE + append) vs layer_norm_bf16 + rope_bf16 +
//     dsa_index_cache_append, the same way; an f32 index cache refused by name;
//   - mla_decode_attention writing mla_project_v's bf16 parts (latent_parts, into a poisoned workspace) vs the f32
//     latent and mla_project_v's own split: the output bit for bit, with one split (the attention CTAs) and several
//     (the merge), GLM-5 dims and small ones.
// Label gpu; without a usable GPU every case skips with the reason.
// Run: test_cuda_mla_fusions (FP4MOE_TEST_SEED=<n> replays a seed).
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/ops/device_errors.h"
#include "kernels/cuda/ops/dsa_indexer.h"
#include "kernels/cuda/ops/layer_norm.h"
#include "kernels/cuda/ops/mla_decode.h"
#include "kernels/cuda/ops/norm_rope.h"
#include "kernels/cuda_test_util.h"
#include "testing/testing.h"

namespace fp4moe::cuda {
namespace {

using gpu_test::bf;
using gpu_test::cbf;
using gpu_test::CublasHandle;
using gpu_test::device_alloc;
using gpu_test::download;
using gpu_test::random_bf16;
using gpu_test::upload;

// cos / sin tables [n_positions, rope / 2] of arbitrary angles (the kernels only read them).
struct RopeTables {
  std::vector<float> cos, sin;
  RopeTables(int64_t n_positions, int rope, std::mt19937_64& rng) {
    std::uniform_real_distribution<float> angle(-3.14159f, 3.14159f);
    for (int64_t i = 0; i < n_positions * rope / 2; ++i) {
      const float a = angle(rng);
      cos.push_back(std::cos(a));
      sin.push_back(std::sin(a));
    }
  }
};

uint32_t read_flag(const uint32_t* d) { return download(d, 1)[0]; }

// The appended tokens of a fused-append case: n_tokens distinct slots of a cache of n_slots (token `padded`
// gets -1: skipped) and positions in [0, n_positions).
struct AppendInputs {
  std::vector<int32_t> slots, pos;
};
AppendInputs append_inputs(int64_t n_tokens, int64_t n_slots, int64_t n_positions, size_t padded,
                           std::mt19937_64& rng) {
  AppendInputs in;
  in.slots.resize(static_cast<size_t>(n_slots));
  std::iota(in.slots.begin(), in.slots.end(), 0);
  std::shuffle(in.slots.begin(), in.slots.end(), rng);
  in.slots.resize(static_cast<size_t>(n_tokens));
  in.slots[padded] = -1;
  in.pos.resize(static_cast<size_t>(n_tokens));
  std::uniform_int_distribution<int32_t> pd(0, static_cast<int32_t>(n_positions - 1));
  for (int32_t& p : in.pos) p = pd(rng);
  return in;
}

// run(fused, positions, slots, cache_out, flags) the separate launches' way and the fused launch's way: with
// good inputs no flag, a cache the launches wrote, the same bits; with token bad_pos_at's position set to
// bad_pos and token bad_slot_at's slot to bad_slot, both flags on both sides and again the same bits.
template <class Run>
void expect_fused_equals_launches(const Run& run, const AppendInputs& in, const std::vector<uint16_t>& pool,
                                  size_t bad_pos_at, int32_t bad_pos, size_t bad_slot_at, int32_t bad_slot,
                                  const std::string& what) {
  std::vector<uint16_t> a, b;
  uint32_t fa = 0, fb = 0;
  run(false, in.pos, in.slots, a, fa);
  run(true, in.pos, in.slots, b, fb);
  ASSERT_EQ(fa, 0u) << describe_device_errors(fa);
  ASSERT_EQ(fb, 0u) << describe_device_errors(fb);
  ASSERT_NE(a, pool) << "the three launches wrote nothing";
  ASSERT_EQ(a, b) << what << " differs from its three launches";
  std::vector<int32_t> bad_positions = in.pos, bad_slots = in.slots;
  bad_positions[bad_pos_at] = bad_pos;
  bad_slots[bad_slot_at] = bad_slot;
  run(false, bad_positions, bad_slots, a, fa);
  run(true, bad_positions, bad_slots, b, fb);
  EXPECT_EQ(fa, kDeviceErrorRopePosition | kDeviceErrorKvSlot) << describe_device_errors(fa);
  EXPECT_EQ(fb, fa) << describe_device_errors(fb);
  EXPECT_EQ(a, b) << what << " differs from its three launches with a bad position / slot";
}

// fused_kernel: the dims take the one-launch kernel, which leaves kv as it was (the three launches normalize and
// rotate it in place), so the test tells which path ran.
void check_latent_append(int rank, int rope, int64_t stride, RopeStyle style, bool fused_kernel, std::mt19937_64& rng) {
  SCOPED_TRACE("rank " + std::to_string(rank) + " rope " + std::to_string(rope) + " stride " + std::to_string(stride) +
               (style == RopeStyle::kNeox ? " neox" : " interleaved"));
  const int64_t n_tokens = 37, page = 16, n_blocks = 5, n_positions = 50, W = rank + rope;
  const int64_t n_slots = n_blocks * page;
  const std::vector<uint16_t> kv = random_bf16(static_cast<size_t>(n_tokens * stride), rng, 2.0f);
  const std::vector<uint16_t> pool = random_bf16(static_cast<size_t>(n_slots * W), rng, 1.0f);
  std::vector<float> w(static_cast<size_t>(rank));
  std::uniform_real_distribution<float> wd(0.5f, 1.5f);
  for (float& x : w) x = wd(rng);
  const RopeTables tab(n_positions, rope, rng);
  const AppendInputs in = append_inputs(n_tokens, n_slots, n_positions, /*padded=*/3, rng);

  auto dw = upload(w);
  auto dcos = upload(tab.cos);
  auto dsin = upload(tab.sin);
  auto run = [&](bool fused, const std::vector<int32_t>& positions, const std::vector<int32_t>& sl,
                 std::vector<uint16_t>& cache_out, uint32_t& flags) {
    auto dkv = upload(kv);
    auto dpool = upload(pool);
    auto dpos = upload(positions);
    auto dsl = upload(sl);
    auto flag = device_alloc<uint32_t>(1);
    FP4MOE_CUDA_CHECK(cudaMemset(flag.get(), 0, 4));
    const MlaCacheView cache{bf(dpool.get()), n_blocks, page, rank, rope};
    if (fused) {
      const MlaLatentNormRope nr{dw.get(), 1e-6f, RopeAngles{dpos.get(), dcos.get(), dsin.get(), n_positions, style}};
      mla_latent_norm_rope_append(bf(dkv.get()), stride, n_tokens, nr, dsl.get(), cache, flag.get(), nullptr);
      FP4MOE_CUDA_CHECK(cudaDeviceSynchronize());
      EXPECT_EQ(download(dkv.get(), kv.size()) == kv, fused_kernel) << "kv changed: the three launches ran";
    } else {
      rms_norm_bf16(bf(dkv.get()), nullptr, dw.get(), n_tokens, rank, stride, 1e-6f, bf(dkv.get()), nullptr);
      rope_bf16(bf(dkv.get()), n_tokens, 1, stride, stride, rank, rope, style, dpos.get(), dcos.get(), dsin.get(),
                n_positions, flag.get(), nullptr);
      mla_cache_append_bf16(cbf(dkv.get()), stride, cbf(dkv.get() + rank), stride, n_tokens, dsl.get(), cache,
                            flag.get(), nullptr);
    }
    FP4MOE_CUDA_CHECK(cudaDeviceSynchronize());
    cache_out = download(dpool.get(), static_cast<size_t>(n_slots * W));
    flags = read_flag(flag.get());
  };
  expect_fused_equals_launches(run, in, pool, 5, static_cast<int32_t>(n_positions), 7, static_cast<int32_t>(n_slots),
                               "fused latent append");
}

TEST(CudaMlaFusions, LatentNormRopeAppendEqualsThreeLaunches) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(testing::test_seed());
  check_latent_append(512, 64, 576, RopeStyle::kInterleaved, true, rng);  // GLM-5: the fused kernel
  check_latent_append(512, 64, 600, RopeStyle::kNeox, true, rng);         // a wider token stride
  check_latent_append(256, 64, 320, RopeStyle::kInterleaved, true, rng);  // one 16 B piece a lane
  // 16 pieces: half the lanes hold none; 64 rotated pairs: two a lane.
  check_latent_append(128, 128, 256, RopeStyle::kInterleaved, true, rng);
  check_latent_append(32, 6, 40, RopeStyle::kInterleaved, false, rng);  // rank + rope = 38: the three launches
}

void check_q_rope(const MlaDecodeDims& dims, RopeStyle style, std::mt19937_64& rng) {
  SCOPED_TRACE("heads " + std::to_string(dims.n_heads) + " rope " + std::to_string(dims.qk_rope_head_dim) +
               (style == RopeStyle::kNeox ? " neox" : " interleaved"));
  const int64_t n = 9, n_positions = 40, qk = dims.qk_nope_head_dim + dims.qk_rope_head_dim;
  const int64_t W = dims.latent_width();
  const std::vector<uint16_t> q = random_bf16(static_cast<size_t>(n * dims.n_heads * qk), rng, 1.0f);
  const std::vector<uint16_t> kv_b = random_bf16(
      static_cast<size_t>(dims.n_heads) * (dims.qk_nope_head_dim + dims.v_head_dim) * dims.kv_lora_rank, rng, 0.1f);
  const RopeTables tab(n_positions, dims.qk_rope_head_dim, rng);
  std::vector<int32_t> pos(static_cast<size_t>(n));
  std::uniform_int_distribution<int32_t> pd(0, static_cast<int32_t>(n_positions - 1));
  for (int32_t& p : pos) p = pd(rng);
  auto dkvb = upload(kv_b);
  auto dcos = upload(tab.cos);
  auto dsin = upload(tab.sin);
  const CublasHandle cublas;
  auto run = [&](bool fused, const std::vector<int32_t>& positions, std::vector<float>& out, uint32_t& flags) {
    auto dq = upload(q);
    auto dpos = upload(positions);
    auto flag = device_alloc<uint32_t>(1);
    FP4MOE_CUDA_CHECK(cudaMemset(flag.get(), 0, 4));
    auto dqlat = device_alloc<float>(static_cast<size_t>(n * dims.n_heads * W));
    if (fused) {
      const MlaQRope qr{RopeAngles{dpos.get(), dcos.get(), dsin.get(), n_positions, style}, flag.get()};
      mla_absorb_q(cbf(dq.get()), cbf(dkvb.get()), dims, n, dqlat.get(), cublas.get(), nullptr, &qr);
    } else {
      rope_bf16(bf(dq.get()), n, dims.n_heads, dims.n_heads * qk, qk, dims.qk_nope_head_dim, dims.qk_rope_head_dim,
                style, dpos.get(), dcos.get(), dsin.get(), n_positions, flag.get(), nullptr);
      mla_absorb_q(cbf(dq.get()), cbf(dkvb.get()), dims, n, dqlat.get(), cublas.get(), nullptr);
    }
    FP4MOE_CUDA_CHECK(cudaDeviceSynchronize());
    out = download(dqlat.get(), static_cast<size_t>(n * dims.n_heads * W));
    flags = read_flag(flag.get());
  };
  std::vector<float> a, b;
  uint32_t fa = 0, fb = 0;
  run(false, pos, a, fa);
  run(true, pos, b, fb);
  ASSERT_EQ(fa, 0u);
  ASSERT_EQ(fb, 0u);
  auto same_bits = [](const std::vector<float>& x, const std::vector<float>& y) {
    return x.size() == y.size() && std::memcmp(x.data(), y.data(), x.size() * sizeof(float)) == 0;
  };
  ASSERT_TRUE(same_bits(a, b)) << "q_lat with the RoPE in the q_pe copy differs from RoPE first";
  std::vector<int32_t> bad = pos;
  bad[2] = -1;
  run(false, bad, a, fa);
  run(true, bad, b, fb);
  EXPECT_EQ(fa, kDeviceErrorRopePosition);
  EXPECT_EQ(fb, fa);
  EXPECT_TRUE(same_bits(a, b)) << "q_lat differs with a position outside the table";
}

TEST(CudaMlaFusions, AbsorbQRopeEqualsRopeFirst) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(testing::test_seed());
  check_q_rope(MlaDecodeDims{20, 512, 192, 64, 256, 0.07f}, RopeStyle::kInterleaved, rng);
  check_q_rope(MlaDecodeDims{4, 32, 32, 16, 32, 0.125f}, RopeStyle::kNeox, rng);
}

// n_seqs sequences of seq_len keys (one block table each), the given split: the project_v output through the
// f32 latent vs through the attention's own parts.
void check_parts(const MlaDecodeDims& dims, int64_t n_seqs, int64_t seq_len, const DecodeSplit& split,
                 std::mt19937_64& rng) {
  SCOPED_TRACE("heads " + std::to_string(dims.n_heads) + " rank " + std::to_string(dims.kv_lora_rank) + ", " +
               std::to_string(n_seqs) + " sequences, split " + split.to_string());
  const int64_t page = 64, W = dims.latent_width();
  const int64_t per_seq = (seq_len + page - 1) / page, n_blocks = n_seqs * per_seq;
  const std::vector<uint16_t> pool = random_bf16(static_cast<size_t>(n_blocks * page * W), rng, 1.0f);
  const std::vector<uint16_t> kv_b = random_bf16(
      static_cast<size_t>(dims.n_heads) * (dims.qk_nope_head_dim + dims.v_head_dim) * dims.kv_lora_rank, rng, 0.05f);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> q_lat(static_cast<size_t>(n_seqs * dims.n_heads * W));
  for (float& v : q_lat) v = nd(rng);
  std::vector<int32_t> table(static_cast<size_t>(n_blocks));
  std::iota(table.begin(), table.end(), 0);
  std::shuffle(table.begin(), table.end(), rng);
  std::vector<int32_t> lens(static_cast<size_t>(n_seqs), static_cast<int32_t>(seq_len));
  lens[0] = 1;  // a short sequence beside the long ones
  lens[1] = 0;  // a padded entry of a decode graph: zeros
  auto dpool = upload(pool);
  auto dkvb = upload(kv_b);
  auto dq = upload(q_lat);
  auto dtable = upload(table);
  auto dlens = upload(lens);
  auto flag = device_alloc<uint32_t>(1);
  FP4MOE_CUDA_CHECK(cudaMemset(flag.get(), 0, 4));
  const MlaCacheView cache{bf(dpool.get()), n_blocks, page, dims.kv_lora_rank, dims.qk_rope_head_dim};
  const size_t ws_bytes = mla_decode_workspace_bytes(n_seqs, dims, split);
  auto dws = device_alloc<float>(ws_bytes / 4 + 1);
  auto dlat = device_alloc<float>(static_cast<size_t>(n_seqs * dims.n_heads * dims.kv_lora_rank));
  const size_t n_out = static_cast<size_t>(n_seqs * dims.n_heads * dims.v_head_dim);
  const CublasHandle cublas;
  auto run = [&](bool parts, bool& wrote_parts) {
    const size_t pws_bytes = mla_project_v_workspace_bytes(n_seqs, dims);
    auto dpws = device_alloc<char>(pws_bytes);
    // Poisoned (0xFFFF: a bf16 NaN), so parts the attention leaves unwritten cannot pass as the earlier run's.
    FP4MOE_CUDA_CHECK(cudaMemset(dpws.get(), 0xFF, pws_bytes));
    auto dout = device_alloc<uint16_t>(n_out);
    FP4MOE_CUDA_CHECK(cudaMemset(dlat.get(), 0, static_cast<size_t>(n_seqs * dims.n_heads * dims.kv_lora_rank) * 4));
    __nv_bfloat16* p = parts ? mla_project_v_parts(dpws.get(), n_seqs, dims) : nullptr;
    EXPECT_EQ(parts, p != nullptr);
    wrote_parts = mla_decode_attention(dq.get(), cache, dtable.get(), per_seq, dlens.get(), n_seqs, dims, split,
                                       ws_bytes ? dws.get() : nullptr, dlat.get(), flag.get(), nullptr, p);
    mla_project_v(dlat.get(), cbf(dkvb.get()), dims, n_seqs, dpws.get(), bf(dout.get()), cublas.get(), nullptr,
                  wrote_parts);
    FP4MOE_CUDA_CHECK(cudaDeviceSynchronize());
    return download(dout.get(), n_out);
  };
  bool wrote_a = true, wrote_b = false;
  const std::vector<uint16_t> a = run(false, wrote_a);
  const std::vector<uint16_t> b = run(true, wrote_b);
  const uint32_t flags = read_flag(flag.get());
  ASSERT_EQ(flags, 0u) << describe_device_errors(flags);
  EXPECT_FALSE(wrote_a);
  EXPECT_TRUE(wrote_b) << "the parts were not written";
  ASSERT_EQ(a, b) << "project_v output through the attention's parts differs from the f32 latent's";
}

TEST(CudaMlaFusions, AttentionPartsEqualProjectVSplit) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(testing::test_seed());
  const MlaDecodeDims glm5{64, 512, 192, 64, 256, 0.0625f};
  check_parts(glm5, 5, 300, DecodeSplit{1, 320}, rng);
  check_parts(glm5, 5, 300, DecodeSplit{3, 128}, rng);  // split: the merge writes the parts
  check_parts(MlaDecodeDims{20, 64, 32, 16, 32, 0.17f}, 3, 70, DecodeSplit{1, 96}, rng);
  check_parts(MlaDecodeDims{20, 64, 32, 16, 32, 0.17f}, 3, 70, DecodeSplit{2, 64}, rng);  // a merge block > rank
  // More sequences than one project_v pass holds: no parts region.
  EXPECT_EQ(mla_project_v_parts(reinterpret_cast<void*>(256), 257, glm5), nullptr);
  EXPECT_EQ(mla_project_v_parts(nullptr, 4, glm5), nullptr);
}

void check_index_key_append(int head_dim, int rope, int64_t stride, RopeStyle style, std::mt19937_64& rng) {
  SCOPED_TRACE("index head_dim " + std::to_string(head_dim) + " rope " + std::to_string(rope) + " stride " +
               std::to_string(stride) + (style == RopeStyle::kNeox ? " neox" : " interleaved"));
  const int64_t n_tokens = 29, page = 16, n_blocks = 4, n_positions = 30, n_slots = n_blocks * page;
  const std::vector<uint16_t> k = random_bf16(static_cast<size_t>(n_tokens * stride), rng, 3.0f);
  const std::vector<uint16_t> pool = random_bf16(static_cast<size_t>(n_slots * head_dim), rng, 1.0f);
  std::vector<float> w(static_cast<size_t>(head_dim)), b(static_cast<size_t>(head_dim));
  std::uniform_real_distribution<float> wd(0.5f, 1.5f), bd(-0.2f, 0.2f);
  for (float& x : w) x = wd(rng);
  for (float& x : b) x = bd(rng);
  const RopeTables tab(n_positions, rope, rng);
  const AppendInputs in = append_inputs(n_tokens, n_slots, n_positions, /*padded=*/0, rng);
  auto dw = upload(w);
  auto db = upload(b);
  auto dcos = upload(tab.cos);
  auto dsin = upload(tab.sin);
  auto run = [&](bool fused, const std::vector<int32_t>& positions, const std::vector<int32_t>& sl,
                 std::vector<uint16_t>& cache_out, uint32_t& flags) {
    auto dk = upload(k);
    auto dpool = upload(pool);
    auto dpos = upload(positions);
    auto dsl = upload(sl);
    auto flag = device_alloc<uint32_t>(1);
    FP4MOE_CUDA_CHECK(cudaMemset(flag.get(), 0, 4));
    const DsaIndexCacheView cache{dpool.get(), DType::kBF16, n_blocks, page, head_dim};
    if (fused) {
      const DsaKeyNormRope nr{dw.get(), db.get(), 1e-6f, rope,
                              RopeAngles{dpos.get(), dcos.get(), dsin.get(), n_positions, style}};
      dsa_index_key_norm_rope_append(bf(dk.get()), stride, n_tokens, nr, dsl.get(), cache, flag.get(), nullptr);
      FP4MOE_CUDA_CHECK(cudaDeviceSynchronize());
      EXPECT_EQ(download(dk.get(), k.size()), k) << "k changed: the three launches ran";
    } else {
      layer_norm_bf16(bf(dk.get()), dw.get(), db.get(), n_tokens, head_dim, stride, 1e-6f, bf(dk.get()), nullptr);
      rope_bf16(bf(dk.get()), n_tokens, 1, stride, stride, 0, rope, style, dpos.get(), dcos.get(), dsin.get(),
                n_positions, flag.get(), nullptr);
      dsa_index_cache_append(dk.get(), stride, n_tokens, dsl.get(), cache, flag.get(), nullptr);
    }
    FP4MOE_CUDA_CHECK(cudaDeviceSynchronize());
    cache_out = download(dpool.get(), static_cast<size_t>(n_slots * head_dim));
    flags = read_flag(flag.get());
  };
  expect_fused_equals_launches(run, in, pool, 4, -3, 6, static_cast<int32_t>(n_slots + 2), "fused index-key append");
}

TEST(CudaMlaFusions, IndexKeyNormRopeAppendEqualsThreeLaunches) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(testing::test_seed());
  check_index_key_append(128, 64, 128, RopeStyle::kInterleaved, rng);  // GLM-5's indexer keys
  check_index_key_append(64, 64, 72, RopeStyle::kNeox, rng);           // every dim rotated, a wider stride
  check_index_key_append(32, 8, 32, RopeStyle::kInterleaved, rng);
  check_index_key_append(128, 128, 136, RopeStyle::kNeox, rng);  // 64 rotated pairs: two a lane
  // An f32 cache is refused by name.
  auto dk = device_alloc<uint16_t>(64);
  auto dslot = device_alloc<int32_t>(1);
  auto dcache = device_alloc<float>(64);
  const DsaIndexCacheView f32_cache{dcache.get(), DType::kF32, 1, 1, 64};
  const float* f = dcache.get();
  const DsaKeyNormRope nr{f, f, 1e-6f, 8, RopeAngles{dslot.get(), f, f, 1, RopeStyle::kNeox}};
  try {
    dsa_index_key_norm_rope_append(bf(dk.get()), 64, 1, nr, dslot.get(), f32_cache,
                                   reinterpret_cast<uint32_t*>(dslot.get()), nullptr);
    FAIL() << "an f32 index cache was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("F32"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace fp4moe::cuda
