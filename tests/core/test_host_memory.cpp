// host_memory_from: MemAvailable alone; a cgroup limit below it wins and is named; "max" and v1's ~2^63 are no
// limit; usage past the limit leaves 0. host_memory_available reads something on this machine.
#include <gtest/gtest.h>

#include <string>

#include "core/host_memory.h"

namespace fp4moe {
namespace {

const std::string kMeminfo = "MemTotal:       32000000 kB\nMemFree:         1000000 kB\nMemAvailable:   20000000 kB\n";

TEST(HostMemory, MemAvailableAndCgroupLimits) {
  HostMemory m = host_memory_from(kMeminfo, std::nullopt, std::nullopt, "memory.max");
  EXPECT_DOUBLE_EQ(m.bytes, 20000000.0 * 1024);
  EXPECT_EQ(m.source, "MemAvailable");
  m = host_memory_from(kMeminfo, std::string("8000000000\n"), std::string("3000000000\n"), "memory.max");
  EXPECT_DOUBLE_EQ(m.bytes, 5e9);
  EXPECT_EQ(m.source, "cgroup memory.max");
  m = host_memory_from(kMeminfo, std::string("max\n"), std::string("3000000000\n"), "memory.max");
  EXPECT_EQ(m.source, "MemAvailable");
  m = host_memory_from(kMeminfo, std::string("9223372036854771712\n"), std::string("5\n"), "memory.limit_in_bytes");
  EXPECT_EQ(m.source, "MemAvailable");
  m = host_memory_from(kMeminfo, std::string("100\n"), std::string("200\n"), "memory.max");
  EXPECT_DOUBLE_EQ(m.bytes, 0.0);
  EXPECT_EQ(m.source, "cgroup memory.max");
  m = host_memory_from("", std::nullopt, std::nullopt, "memory.max");
  EXPECT_TRUE(m.source.empty());
  EXPECT_DOUBLE_EQ(m.bytes, 0.0);
}

TEST(HostMemory, LiveReadFindsSomething) {
  const HostMemory m = host_memory_available();
  EXPECT_FALSE(m.source.empty());
  EXPECT_GT(m.bytes, 0.0) << m.source;
}

}  // namespace
}  // namespace fp4moe
