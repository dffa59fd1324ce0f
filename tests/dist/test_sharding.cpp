// The sharding math (dist/sharding.h): exhaustive small cases (every split is a partition, blocks
// contiguous and in rank order, the owner function inverts the ranges, GQA heads map to held KV
// heads), the GLM-5 numbers (256 experts on 8 ranks, 64 heads with MLA's one latent KV head), the
// exact error messages, and `fp4moe serve`'s refusal of --tp-size/--ep-size > 1
// (dist/serve_parallel.h). Run: build/tests/dist/test_dist --gtest_filter='Sharding*:Serve*'.
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "core/error.h"
#include "dist/serve_parallel.h"
#include "dist/sharding.h"
#include "testing/testing.h"

namespace fp4moe::dist {
namespace {

using fp4moe::testing::error_of;

TEST(Sharding, ParallelConfigRanks) {
  for (int tp : {1, 2, 3, 4, 6, 8}) {
    for (int ep = 1; ep <= tp; ++ep) {
      if (tp % ep != 0) {
        EXPECT_THROW(ParallelConfig::make(tp, ep), Error) << "tp " << tp << " ep " << ep;
        continue;
      }
      std::vector<int> seen(static_cast<size_t>(tp), 0);
      for (int r = 0; r < tp; ++r) {
        const ParallelConfig p = ParallelConfig::make(tp, ep, r);
        EXPECT_EQ(p.moe_tp_size() * p.ep_size, tp);
        EXPECT_GE(p.ep_rank(), 0);
        EXPECT_LT(p.ep_rank(), ep);
        EXPECT_EQ(p.ep_rank() * p.moe_tp_size() + p.moe_tp_rank(), r);  // (ep, moe-tp) enumerates the ranks
        ++seen[static_cast<size_t>(r)];
      }
      for (int c : seen) EXPECT_EQ(c, 1);
    }
  }
  EXPECT_EQ(ParallelConfig::make(8, 4, 3).to_string(), "rank 3/8 (tp 8, ep 4 x moe-tp 2)");
}

TEST(Sharding, ParallelConfigErrors) {
  EXPECT_NE(error_of([] { ParallelConfig::make(8, 3); }).find("--ep-size 3 does not divide --tp-size 8"),
            std::string::npos);
  EXPECT_NE(error_of([] { ParallelConfig::make(0, 1); }).find("--tp-size 0 must be >= 1"), std::string::npos);
  EXPECT_NE(error_of([] { ParallelConfig::make(2, 0); }).find("--ep-size 0 must be >= 1"), std::string::npos);
  EXPECT_NE(error_of([] { ParallelConfig::make(4, 2, 4); }).find("rank 4 outside [0, 4)"), std::string::npos);
  ParallelConfig p;
  p.world_size = 4;
  p.tp_size = 2;
  EXPECT_NE(error_of([&] { p.validate(); }).find("world size 4 != --tp-size 2"), std::string::npos);
}

TEST(Sharding, EvenSplitsPartition) {
  for (int64_t n = 0; n <= 48; ++n) {
    for (int parts = 1; parts <= 8; ++parts) {
      if (n % parts != 0) {
        EXPECT_THROW(even_split(n, parts, 0, "--tp-size", "things"), Error);
        continue;
      }
      int64_t next = 0;
      for (int i = 0; i < parts; ++i) {
        const Range r = even_split(n, parts, i, "--tp-size", "things");
        EXPECT_EQ(r.begin, next);
        EXPECT_EQ(r.size(), n / parts);
        next = r.end;
      }
      EXPECT_EQ(next, n);
    }
  }
}

TEST(Sharding, TokenRangesPartitionAnyCount) {
  for (int64_t n = 0; n <= 40; ++n) {
    for (int w = 1; w <= 8; ++w) {
      int64_t next = 0;
      for (int r = 0; r < w; ++r) {
        const Range t = token_range(n, w, r);
        EXPECT_EQ(t.begin, next) << "n " << n << " w " << w << " r " << r;
        EXPECT_TRUE(t.size() == n / w || t.size() == n / w + 1);
        EXPECT_EQ(t.size(), n / w + (r < n % w ? 1 : 0));
        next = t.end;
      }
      EXPECT_EQ(next, n);
    }
  }
}

TEST(Sharding, ExpertOwnershipSmallCases) {
  for (int E = 1; E <= 24; ++E) {
    for (int ep = 1; ep <= 8; ++ep) {
      if (E % ep != 0) {
        EXPECT_THROW(expert_range(E, ep, 0), Error);
        EXPECT_THROW(expert_owner(E, ep, 0), Error);
        continue;
      }
      for (int e = 0; e < E; ++e) {
        const int owner = expert_owner(E, ep, e);
        for (int j = 0; j < ep; ++j) EXPECT_EQ(expert_range(E, ep, j).contains(e), j == owner) << E << " " << ep << " " << e;
      }
    }
  }
}

TEST(Sharding, Glm5ExpertsOnEightRanks) {
  // GLM-5: 256 routed experts, 8 GPUs, ep 8: 32 contiguous experts each (SGLang's layout).
  for (int r = 0; r < 8; ++r) EXPECT_EQ(expert_range(256, 8, r), (Range{32 * r, 32 * r + 32}));
  EXPECT_EQ(expert_owner(256, 8, 0), 0);
  EXPECT_EQ(expert_owner(256, 8, 31), 0);
  EXPECT_EQ(expert_owner(256, 8, 32), 1);
  EXPECT_EQ(expert_owner(256, 8, 255), 7);
  // ep 4 x moe-tp 2: 64 experts per EP rank, each expert's 2048-wide intermediate split in 1024s.
  const ParallelConfig p = ParallelConfig::make(8, 4, 5);
  EXPECT_EQ(p.ep_rank(), 2);
  EXPECT_EQ(p.moe_tp_rank(), 1);
  EXPECT_EQ(expert_range(256, 4, p.ep_rank()), (Range{128, 192}));
  EXPECT_EQ(moe_intermediate_range(2048, p.moe_tp_size(), p.moe_tp_rank(), true), (Range{1024, 2048}));
  EXPECT_NO_THROW(validate_for_model(ParallelConfig::make(8, 8, 7),
                                     {256, 2048, 64, 1, 0, /*nvfp4=*/true}));
  EXPECT_EQ(error_of([] { validate_for_model(ParallelConfig::make(3, 3, 0), {256, 2048, 0, 0, 0, true}); })
                .find("--ep-size 3 does not divide 256 experts") != std::string::npos,
            true);
}

TEST(Sharding, LinearSplits) {
  // Column-parallel: rows; row-parallel: columns, NVFP4 only on 16-column blocks.
  EXPECT_EQ(column_parallel_rows(6144, 8, 3), (Range{2304, 3072}));
  EXPECT_EQ(row_parallel_cols(2048, 8, 7, true), (Range{1792, 2048}));
  EXPECT_EQ(row_parallel_cols(48, 2, 1, false), (Range{24, 48}));
  EXPECT_NE(error_of([] { row_parallel_cols(48, 2, 1, true); })
                .find("--tp-size 2: input features 48 / 2 = 24 is not a multiple of the NVFP4 block (16)"),
            std::string::npos);
  EXPECT_NE(error_of([] { column_parallel_rows(100, 3, 0); }).find("--tp-size 3 does not divide 100 output features"),
            std::string::npos);
  EXPECT_NE(error_of([] { moe_intermediate_range(96, 4, 0, true); })
                .find("moe intermediate 96 / moe-tp 4 = 24 is not a multiple of the NVFP4 block"),
            std::string::npos);
}

TEST(Sharding, AttentionHeadsExhaustive) {
  for (int kv = 1; kv <= 8; ++kv) {
    for (int group = 1; group <= 4; ++group) {
      const int q = kv * group;
      for (int tp = 1; tp <= 8; ++tp) {
        const bool ok = q % tp == 0 && (kv >= tp ? kv % tp == 0 : tp % kv == 0);
        if (!ok) {
          EXPECT_THROW(attention_heads(q, kv, tp, 0), Error) << "q " << q << " kv " << kv << " tp " << tp;
          continue;
        }
        std::vector<int> kv_holders(static_cast<size_t>(kv), 0);
        int64_t next_q = 0;
        for (int r = 0; r < tp; ++r) {
          const HeadShard h = attention_heads(q, kv, tp, r);
          SCOPED_TRACE("q " + std::to_string(q) + " kv " + std::to_string(kv) + " tp " + std::to_string(tp) +
                       " rank " + std::to_string(r) + ": " + h.to_string());
          EXPECT_EQ(h.q_heads.begin, next_q);
          next_q = h.q_heads.end;
          for (int64_t qh = h.q_heads.begin; qh < h.q_heads.end; ++qh) {
            EXPECT_TRUE(h.kv_heads.contains(qh / group)) << "q head " << qh << " needs kv head " << qh / group;
          }
          for (int64_t k = h.kv_heads.begin; k < h.kv_heads.end; ++k) ++kv_holders[static_cast<size_t>(k)];
          EXPECT_EQ(h.kv_replicas, kv >= tp ? 1 : tp / kv);
        }
        EXPECT_EQ(next_q, q);
        for (int c : kv_holders) EXPECT_EQ(c, kv >= tp ? 1 : tp / kv);  // each KV head on kv_replicas ranks
      }
    }
  }
}

TEST(Sharding, Glm5AndGlm45Heads) {
  // GLM-5 (MLA): 64 heads, one latent KV "head" replicated on all 8 ranks.
  const HeadShard h = attention_heads(64, 1, 8, 3);
  EXPECT_EQ(h.q_heads, (Range{24, 32}));
  EXPECT_EQ(h.kv_heads, (Range{0, 1}));
  EXPECT_EQ(h.kv_replicas, 8);
  // GLM-4.5: 96 heads, 8 KV heads on 8 ranks: 12 q heads + 1 KV head each.
  EXPECT_EQ(attention_heads(96, 8, 8, 5).to_string(), "q [60, 72) kv [5, 6) x1");
  EXPECT_NE(error_of([] { attention_heads(64, 1, 3, 0); }).find("--tp-size 3 does not divide 64 attention heads"),
            std::string::npos);
  EXPECT_NE(error_of([] { attention_heads(96, 12, 8, 0); }).find("--tp-size 8 does not divide 12 KV heads"),
            std::string::npos);
  EXPECT_NE(error_of([] { attention_heads(24, 3, 4, 0); }).find("--tp-size 4 with 3 KV heads"), std::string::npos);
}

TEST(ServeParallel, SingleDeviceAcceptedLargerRefused) {
  EXPECT_NO_THROW(check_serve_parallel(1, 1));
  const std::string e = error_of([] { check_serve_parallel(2, 1); });
  EXPECT_NE(e.find("--tp-size 2 --ep-size 1: multi-GPU serving"), std::string::npos) << e;
  EXPECT_NE(e.find("issue #7"), std::string::npos) << e;
  EXPECT_NE(e.find("2 GPUs ("), std::string::npos) << e;
  EXPECT_NE(e.find(visible_gpus_description()), std::string::npos) << e;
  EXPECT_NE(error_of([] { check_serve_parallel(8, 3); }).find("--ep-size 3 does not divide --tp-size 8"),
            std::string::npos);
  EXPECT_NE(error_of([] { check_serve_parallel(0, 1); }).find("--tp-size 0 must be >= 1"), std::string::npos);
}

}  // namespace
}  // namespace fp4moe::dist
