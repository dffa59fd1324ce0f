// FP4MOE_CHECK / FP4MOE_FAIL: the message carries the condition, the streamed values and file:line.
#include <gtest/gtest.h>

#include "core/error.h"

namespace fp4moe {
namespace {

TEST(Error, CheckPassesWithoutEvaluatingTheStream) {
  int evaluated = 0;
  auto count = [&] { return ++evaluated; };
  FP4MOE_CHECK(1 + 1 == 2) << count();
  EXPECT_EQ(evaluated, 0);
}

TEST(Error, CheckFailureCarriesConditionValuesAndLocation) {
  int k = 17;
  try {
    FP4MOE_CHECK(k % 16 == 0) << "K=" << k << " is not a multiple of 16";
    FAIL() << "no throw";
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("k % 16 == 0"), std::string::npos) << msg;
    EXPECT_NE(msg.find("K=17 is not a multiple of 16"), std::string::npos) << msg;
    EXPECT_NE(msg.find("test_error.cpp:"), std::string::npos) << msg;
  }
}

TEST(Error, FailWithoutCondition) {
  try {
    FP4MOE_FAIL() << "unknown dtype 'X9'";
    FAIL() << "no throw";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()).rfind("unknown dtype 'X9' [", 0), 0u) << e.what();
  }
}

}  // namespace
}  // namespace fp4moe
