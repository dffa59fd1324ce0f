// core/names.h: edit distance and the closest-name hint.
#include "core/names.h"

#include <gtest/gtest.h>

namespace fp4moe {
namespace {

TEST(Names, EditDistanceCountsInsertionsDeletionsAndSubstitutions) {
  EXPECT_EQ(edit_distance("", ""), 0u);
  EXPECT_EQ(edit_distance("abc", ""), 3u);
  EXPECT_EQ(edit_distance("", "ab"), 2u);
  EXPECT_EQ(edit_distance("kitten", "sitting"), 3u);
  EXPECT_EQ(edit_distance("temprature", "temperature"), 1u);
  EXPECT_EQ(edit_distance("serve", "serv"), 1u);
  EXPECT_EQ(edit_distance("flaw", "lawn"), 2u);
  EXPECT_EQ(edit_distance("abc", "abc"), 0u);
}

TEST(Names, ClosestNameWithinAThirdOfTheName) {
  const std::vector<std::string> known = {"serve", "generate", "quantize", "inspect", "tokenize"};
  EXPECT_EQ(closest_name("serv", known), "serve");
  EXPECT_EQ(closest_name("generat", known), "generate");
  EXPECT_EQ(closest_name("quantise", known), "quantize");
  EXPECT_EQ(closest_name("frobnicate", known), std::nullopt);
  EXPECT_EQ(closest_name("", known), std::nullopt);  // 5+ edits from each, past the one a short name may differ by
  EXPECT_EQ(closest_name("x", {"y", "n"}), std::nullopt);      // too short to guess from
  EXPECT_EQ(closest_name("srve", {"seve", "serve"}), "seve");  // one edit allowed: the first on a tie
  EXPECT_EQ(closest_name("abc", {}), std::nullopt);
}

}  // namespace
}  // namespace fp4moe
