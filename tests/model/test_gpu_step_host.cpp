// The host side of the GPU models' step (model/cuda/gpu_step.h) that CUDA graphs rely on, without a
// GPU: the batch and table buckets of DecodeGraphs, and stage_step_ints' padded layout (empty
// padding sequences: token 0, position 0, slot -1, one q row, seq_len 0, tables -1; padding rows
// read their own index; the extra ints after the rows), with its refusal of a layout that does not
// hold the step. The GPU side (capture, replay vs eager) is test_gpu_model's GpuCudaGraphs.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "core/error.h"
#include "model/cuda/gpu_kv_cache.h"
#include "model/cuda/gpu_step.h"

namespace fp4moe::model::gpu_step {
namespace {

TEST(DecodeGraphsHost, BatchAndTableBuckets) {
  const auto g = DecodeGraphs::for_model(256, 4096);
  const std::vector<int64_t>& b = g->batch_buckets();
  ASSERT_EQ(b.size(), 35u);  // 1 2 4 8, then 16 .. 256 by 8
  EXPECT_EQ(b[4], 16);
  EXPECT_EQ(b.back(), 256);
  EXPECT_EQ(g->batch_bucket(1), 1);
  EXPECT_EQ(g->batch_bucket(3), 4);
  EXPECT_EQ(g->batch_bucket(9), 16);
  EXPECT_EQ(g->batch_bucket(250), 256);
  EXPECT_EQ(g->batch_bucket(257), 0);  // eager above the largest bucket
  EXPECT_EQ(g->batch_bucket(0), 0);
  // Capped by max_tokens_per_step; a cap off the grid of 8 is itself a bucket.
  EXPECT_EQ(DecodeGraphs::for_model(256, 20)->batch_buckets(), (std::vector<int64_t>{1, 2, 4, 8, 16, 20}));
  EXPECT_EQ(DecodeGraphs::for_model(6, 4096)->batch_buckets(), (std::vector<int64_t>{1, 2, 4, 6}));  // 5, 6 too
  EXPECT_EQ(DecodeGraphs::for_model(6, 4096)->batch_bucket(5), 6);
  EXPECT_EQ(DecodeGraphs::for_model(3, 4096)->batch_buckets(), (std::vector<int64_t>{1, 2, 3}));
  EXPECT_EQ(DecodeGraphs::for_model(0, 4096)->batch_bucket(1), 0);  // --cuda-graph-max-bs 0: off
  EXPECT_FALSE(DecodeGraphs::for_model(0, 4096)->enabled());
  EXPECT_EQ(DecodeGraphs::table_bucket(0), 1);
  EXPECT_EQ(DecodeGraphs::table_bucket(1), 1);
  EXPECT_EQ(DecodeGraphs::table_bucket(3), 4);
  EXPECT_EQ(DecodeGraphs::table_bucket(9), 16);
  EXPECT_EQ(describe_graphs(*DecodeGraphs::for_model(16, 4096), true),
            "CUDA graphs: decode batches 1 2 4 8 16 (captured on first use)");
  EXPECT_EQ(describe_graphs(*DecodeGraphs::for_model(0, 4096), true), "CUDA graphs: off (--cuda-graph-max-bs 0)");
}

TEST(StageStepInts, PadsADecodeStepForItsGraph) {
  const int owner = 0;
  auto pool = std::make_shared<KvBlockPool>(16, 4);  // pages of 4 tokens
  GpuKvState a(&owner, pool, 8), b(&owner, pool, 8);
  a.reserve(5);  // 5 tokens: 2 blocks
  a.commit(5);
  b.reserve(2);
  b.commit(2);
  const std::vector<int32_t> ta = {11}, tb = {22};
  int32_t am = -1;
  std::vector<float> logits(100);
  const SeqChunk batch[] = {{&a, ta, logits.data(), false}, {&b, tb, nullptr, false, &am}};
  const StepBatch step = plan_step(batch, &owner, 100, 64, 256);
  ASSERT_TRUE(step.decode_only);
  reserve_blocks(step.chunks);  // position 5 of a stays in block 2; b's position 2 in its block
  const StepIntsLayout l{4, 4, 4, 4, 2};  // padded to 4 sequences, tables of 4 blocks, 2 extra ints
  std::vector<int32_t> out(l.size(), 12345);
  const std::vector<int32_t> extra = {7, 9};
  stage_step_ints(batch, step, l, extra, out.data());
  const int32_t* p = out.data();
  EXPECT_EQ(std::vector<int32_t>(p, p + 4), (std::vector<int32_t>{11, 22, 0, 0}));                         // tokens
  EXPECT_EQ(std::vector<int32_t>(p + l.positions(), p + l.positions() + 4), (std::vector<int32_t>{5, 2, 0, 0}));
  EXPECT_EQ(std::vector<int32_t>(p + l.slots(), p + l.slots() + 4),
            (std::vector<int32_t>{a.slot(5), b.slot(2), -1, -1}));
  EXPECT_EQ(std::vector<int32_t>(p + l.q_start(), p + l.q_start() + 5), (std::vector<int32_t>{0, 1, 2, 3, 4}));
  EXPECT_EQ(std::vector<int32_t>(p + l.seq_lens(), p + l.seq_lens() + 4), (std::vector<int32_t>{6, 3, 0, 0}));
  const std::vector<int32_t> tables(p + l.tables(), p + l.tables() + 16);
  EXPECT_EQ(tables[0], a.blocks()[0]);
  EXPECT_EQ(tables[1], a.blocks()[1]);
  EXPECT_EQ(tables[2], -1);
  ASSERT_EQ(b.blocks().size(), 1u);  // positions 0..2 in one page of 4
  EXPECT_EQ(tables[4], b.blocks()[0]);
  for (size_t i = 5; i < 16; ++i) EXPECT_EQ(tables[i], -1) << i;  // b's unused width, then two padding rows
  EXPECT_EQ(std::vector<int32_t>(p + l.rows(), p + l.rows() + 4), (std::vector<int32_t>{0, 1, 2, 3}));
  EXPECT_EQ(std::vector<int32_t>(p + l.extra(), p + l.extra() + 2), extra);
  EXPECT_EQ(l.size(), static_cast<size_t>(4 * 3 + 5 + 4 + 16 + 4 + 2));

  // A layout that cannot hold the step (fewer sequences than chunks) is refused with the numbers.
  try {
    stage_step_ints(batch, step, StepIntsLayout{1, 1, 4, 1, 0}, {}, out.data());
    FAIL() << "a 1-sequence layout accepted a 2-sequence step";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("layout of 1 tokens / 1 sequences / 1 rows for a step of 2 / 2 / 2"),
              std::string::npos)
        << e.what();
  }
  rollback_blocks(step.chunks, {0, 0});
}

}  // namespace
}  // namespace fp4moe::model::gpu_step
