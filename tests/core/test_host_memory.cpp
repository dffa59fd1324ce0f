// host_memory_from: MemAvailable alone; a cgroup limit below it wins and is named, its reclaimable inactive file
// cache not counted as used; "max" and v1's ~2^63 are no limit; usage past the limit leaves 0; the lowest level
// decides. cgroup_memory_levels: the process's v2 / v1 cgroup and its ancestors from /proc/self/cgroup.
// host_memory_available reads something on this machine.
#include <gtest/gtest.h>

#include <map>
#include <string>

#include "core/host_memory.h"

namespace fp4moe {
namespace {

const std::string kMeminfo = "MemTotal:       32000000 kB\nMemFree:         1000000 kB\nMemAvailable:   20000000 kB\n";

TEST(HostMemory, MemAvailableAndCgroupLimits) {
  HostMemory m = host_memory_from(kMeminfo, {});
  EXPECT_DOUBLE_EQ(m.bytes, 20000000.0 * 1024);
  EXPECT_EQ(m.source, "MemAvailable");
  m = host_memory_from(kMeminfo,
                       {{"a/memory.max", "8000000000\n", "3000000000\n", "anon 1\ninactive_file 1000000000\n"}});
  EXPECT_DOUBLE_EQ(m.bytes, 6e9);  // 8 GB - (3 GB used - 1 GB reclaimable cache)
  EXPECT_EQ(m.source, "cgroup a/memory.max");
  m = host_memory_from(kMeminfo, {{"a", "max\n", "3000000000\n", ""}});
  EXPECT_EQ(m.source, "MemAvailable");
  m = host_memory_from(kMeminfo, {{"v1", "9223372036854771712\n", "5\n", "total_inactive_file 0\n"}});
  EXPECT_EQ(m.source, "MemAvailable");
  m = host_memory_from(kMeminfo, {{"a", "100\n", "200\n", ""}});
  EXPECT_DOUBLE_EQ(m.bytes, 0.0);
  // Two levels: the tighter one decides.
  m = host_memory_from(kMeminfo,
                       {{"leaf", "9000000000\n", "1000000000\n", ""}, {"parent", "4000000000\n", "1000000000\n", ""}});
  EXPECT_DOUBLE_EQ(m.bytes, 3e9);
  EXPECT_EQ(m.source, "cgroup parent");
  m = host_memory_from("", {});
  EXPECT_TRUE(m.source.empty());
  EXPECT_DOUBLE_EQ(m.bytes, 0.0);
}

TEST(HostMemory, CgroupLevelsFromProcSelfCgroup) {
  std::map<std::string, std::string> files = {
      {"/cg/cgroup.controllers", "cpu memory\n"},
      {"/cg/system.slice/x.service/memory.max", "1000\n"},
      {"/cg/system.slice/x.service/memory.current", "10\n"},
      {"/cg/system.slice/memory.max", "max\n"},
      {"/cg/system.slice/memory.current", "20\n"},
  };
  auto read = [&](const std::string& p) {
    auto it = files.find(p);
    return it == files.end() ? std::string() : it->second;
  };
  auto levels = cgroup_memory_levels("0::/system.slice/x.service\n", "/cg", read);
  ASSERT_EQ(levels.size(), 2u);  // the root has no memory.max
  EXPECT_EQ(levels[0].where, "/cg/system.slice/x.service/memory.max");
  EXPECT_EQ(levels[0].limit, "1000\n");
  EXPECT_EQ(levels[1].where, "/cg/system.slice/memory.max");
  EXPECT_DOUBLE_EQ(host_memory_from("", levels).bytes, 990.0);
  // v1: the memory controller's line, under root/memory.
  files = {{"/cg/memory/docker/abc/memory.limit_in_bytes", "500\n"},
           {"/cg/memory/docker/abc/memory.usage_in_bytes", "100\n"}};
  levels = cgroup_memory_levels("12:cpu,cpuacct:/docker/abc\n9:memory:/docker/abc\n", "/cg", read);
  ASSERT_EQ(levels.size(), 1u);
  EXPECT_EQ(levels[0].where, "/cg/memory/docker/abc/memory.limit_in_bytes");
  EXPECT_DOUBLE_EQ(host_memory_from("", levels).bytes, 400.0);
}

TEST(HostMemory, LiveReadFindsSomething) {
  const HostMemory m = host_memory_available();
  EXPECT_FALSE(m.source.empty());
  EXPECT_GT(m.bytes, 0.0) << m.source;
}

}  // namespace
}  // namespace fp4moe
