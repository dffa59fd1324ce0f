// The host side of the GPU models' step (model/cuda/gpu_step.h) that CUDA graphs rely on, without a
// GPU: the batch and table buckets of DecodeGraphs, and stage_step_ints' padded layout (empty
// padding sequences: token 0, position 0, slot -1, one q row, seq_len 0, tables -1; padding rows
// read their own index; the extra ints after the rows), with its refusal of a layout that does not
// hold the step; check_finite_logits' blame of a step's NaN / Inf logits rows on their batch entry. The GPU side
// (capture, replay vs eager) is test_gpu_model's GpuCudaGraphs.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <utility>
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

// The logits rows' NaN / Inf flags (cuda::argmax_rows, copied after the step) blame the batch entry and position of
// the first flagged row: a SequenceError when every flagged row is that entry's (the engine fails that request
// alone), else a plain Error counting the other entries.
TEST(CheckFiniteLogits, BlamesTheEntryOfTheFlaggedRows) {
  const int owner = 0;
  auto pool = std::make_shared<KvBlockPool>(16, 4);
  GpuKvState a(&owner, pool, 8), b(&owner, pool, 8), c(&owner, pool, 8);
  b.reserve(3);
  b.commit(3);
  const std::vector<int32_t> ta = {1, 2}, tb = {3, 4, 5}, tc = {6};
  int32_t ac = -1;
  std::vector<float> la(2 * 100), lb(100);
  // a: both rows' logits (prompt logprobs); b: its last row, at positions 3..5; c: the argmax only.
  const SeqChunk batch[] = {{&a, ta, la.data(), true}, {&b, tb, lb.data(), false}, {&c, tc, nullptr, false, &ac}};
  const StepBatch step = plan_step(batch, &owner, 100, 64, 256);
  ASSERT_EQ(step.rows, (std::vector<int32_t>{0, 1, 4, 5}));
  const auto failure = [&](std::vector<uint32_t> flags) -> std::pair<int64_t, std::string> {
    try {
      check_finite_logits(step, flags.data());
    } catch (const SequenceError& e) {
      return {e.entry(), e.what()};
    } catch (const Error& e) {
      return {-1, e.what()};
    }
    return {-2, ""};
  };
  EXPECT_EQ(failure({0, 0, 0, 0}).first, -2);
  const auto [entry_b, what_b] = failure({0, 0, 1, 0});
  EXPECT_EQ(entry_b, 1);
  EXPECT_EQ(what_b.rfind("the logits (model.norm, lm_head) of batch entry 1 at position 5 holds NaN or Inf: ", 0), 0u)
      << what_b;
  EXPECT_EQ(failure({0, 1, 0, 0}).first, 0);  // a's second row: entry 0, position 1
  EXPECT_NE(failure({0, 1, 0, 0}).second.find("of batch entry 0 at position 1 holds"), std::string::npos);
  EXPECT_EQ(failure({1, 1, 0, 0}).first, 0);  // two rows, one entry
  EXPECT_EQ(failure({0, 0, 0, 1}).first, 2);
  const auto [entry_all, what_all] = failure({1, 0, 1, 1});
  EXPECT_EQ(entry_all, -1);
  EXPECT_NE(what_all.find("of batch entry 0 at position 0 holds NaN or Inf (and rows of 2 other batch entries)"),
            std::string::npos)
      << what_all;
}

}  // namespace
}  // namespace fp4moe::model::gpu_step
