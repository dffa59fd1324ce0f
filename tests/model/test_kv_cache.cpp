// ContiguousKvState: append / rows / commit / rollback / truncate bookkeeping and its errors; copy_prefix.
//   ctest --test-dir build -R KvCache
#include <gtest/gtest.h>

#include "core/error.h"
#include "model/kv_cache.h"

namespace fp4moe::model {
namespace {

TEST(KvCache, AppendCommitRollbackTruncate) {
  int owner = 0;
  ContiguousKvState st(&owner, 2, {4, 2});
  EXPECT_EQ(st.owner(), &owner);
  EXPECT_EQ(st.length(), 0);
  EXPECT_EQ(st.n_streams(), 2);
  EXPECT_EQ(st.width(0), 4);
  // A 3-token step: every (layer, stream) gets 3 rows, then commit.
  for (int64_t l = 0; l < 2; ++l) {
    for (int s = 0; s < 2; ++s) {
      float* p = st.append(l, s, 3);
      for (int64_t i = 0; i < 3 * st.width(s); ++i) p[i] = static_cast<float>(100 * l + 10 * s + i);
    }
  }
  st.commit(3);
  EXPECT_EQ(st.length(), 3);
  EXPECT_EQ(st.rows_in(1, 1), 3);
  EXPECT_EQ(st.rows(1, 1)[5], 115.0f);
  EXPECT_GE(st.bytes(), (3 * 4 + 3 * 2) * 2 * sizeof(float));

  // A failed step: layer 0 appended, layer 1 not; commit refuses, rollback restores.
  st.append(0, 0, 2);
  st.append(0, 1, 2);
  try {
    st.commit(2);
    FAIL() << "commit with a layer short of rows was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("layer 1 stream 0 holds 3 rows"), std::string::npos) << e.what();
  }
  st.rollback();
  EXPECT_EQ(st.rows_in(0, 0), 3);
  EXPECT_EQ(st.rows(0, 0)[11], 11.0f);

  st.truncate(1);
  EXPECT_EQ(st.length(), 1);
  EXPECT_EQ(st.rows_in(1, 0), 1);
  EXPECT_THROW(st.truncate(2), Error);
  EXPECT_THROW(st.append(2, 0, 1), Error);
  EXPECT_THROW(st.append(0, 2, 1), Error);
  EXPECT_THROW(ContiguousKvState(&owner, 0, {4}), Error);
  EXPECT_THROW(ContiguousKvState(&owner, 1, {0}), Error);
}

// copy_prefix (the engine's prefix cache): the first n rows of every (layer, stream), an independent
// state of the same owner; the source is untouched.
TEST(KvCache, CopyPrefixCopiesTheFirstRows) {
  int owner = 0;
  ContiguousKvState st(&owner, 2, {3, 1});
  for (int64_t l = 0; l < 2; ++l) {
    for (int s = 0; s < 2; ++s) {
      float* p = st.append(l, s, 5);
      for (int64_t i = 0; i < 5 * st.width(s); ++i) p[i] = static_cast<float>(1000 * l + 100 * s + i);
    }
  }
  st.commit(5);
  std::unique_ptr<KvState> copy = st.copy_prefix(3);
  auto* c = dynamic_cast<ContiguousKvState*>(copy.get());
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(c->owner(), &owner);
  EXPECT_EQ(c->length(), 3);
  for (int64_t l = 0; l < 2; ++l) {
    for (int s = 0; s < 2; ++s) {
      ASSERT_EQ(c->rows_in(l, s), 3);
      for (int64_t i = 0; i < 3 * st.width(s); ++i) EXPECT_EQ(c->rows(l, s)[i], st.rows(l, s)[i]);
    }
  }
  c->append(0, 0, 1)[0] = -1.0f;  // the copy grows on its own
  EXPECT_EQ(st.rows_in(0, 0), 5);
  EXPECT_EQ(st.rows(0, 0)[9], 9.0f);
  EXPECT_EQ(st.copy_prefix(0)->length(), 0);
  EXPECT_THROW(st.copy_prefix(6), Error);
}

}  // namespace
}  // namespace fp4moe::model
