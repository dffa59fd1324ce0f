// The host memory a new allocation can count on: the smaller of /proc/meminfo's MemAvailable and what the
// process's cgroup limit leaves (v2 memory.max - memory.current, v1 memory.limit_in_bytes - usage_in_bytes), so
// that an up-front "does it fit" check says no inside a container with a limit rather than after an OOM kill.
// Tested by tests/core/test_host_memory.cpp (the parsing on fixed texts; the live read on this machine).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace fp4moe {

struct HostMemory {
  double bytes = 0;    // available; 0 when nothing could be read
  std::string source;  // "MemAvailable", "cgroup memory.max", ... (which bound decided)
};

// From the texts of /proc/meminfo and of the cgroup limit and usage files (nullopt: absent). A limit of "max" or
// one at or above 2^60 (v1's "unlimited") is no limit.
HostMemory host_memory_from(const std::string& meminfo, const std::optional<std::string>& cgroup_limit,
                            const std::optional<std::string>& cgroup_usage, const std::string& cgroup_name);

// The live values of this process (cgroup v2 at /sys/fs/cgroup, else v1 at /sys/fs/cgroup/memory).
HostMemory host_memory_available();

}  // namespace fp4moe
