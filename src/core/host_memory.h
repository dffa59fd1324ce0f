// The host memory a new allocation can count on: the smaller of /proc/meminfo's MemAvailable and what the cgroup
// limits on the process leave (for its cgroup and each ancestor: v2 memory.max - (memory.current - inactive_file),
// v1 memory.limit_in_bytes - (usage_in_bytes - total_inactive_file); reclaimable file cache is not counted as used),
// so that an up-front "does it fit" check says no inside a container or a systemd MemoryMax rather than after an
// OOM kill. Tested by tests/core/test_host_memory.cpp (the parsing on fixed texts; the live read on this machine).
#pragma once

#include <functional>
#include <string>
#include <vector>

namespace fp4moe {

struct HostMemory {
  double bytes = 0;    // available; 0 when nothing could be read
  std::string source;  // "MemAvailable", "cgroup /sys/fs/cgroup/x/memory.max", ... (which bound decided)
};

// One cgroup level's files as text ("" when absent).
struct CgroupMemoryFiles {
  std::string where;  // e.g. "/sys/fs/cgroup/system.slice/x.service/memory.max", for HostMemory::source
  std::string limit;  // memory.max ("max": none) or memory.limit_in_bytes (>= 2^60: none)
  std::string usage;  // memory.current or memory.usage_in_bytes
  std::string stat;   // memory.stat (inactive_file / total_inactive_file)
};

// From the texts of /proc/meminfo and of the cgroup levels.
HostMemory host_memory_from(const std::string& meminfo, const std::vector<CgroupMemoryFiles>& cgroups);

// The levels of `proc_self_cgroup` (/proc/self/cgroup's text) under `root` ("/sys/fs/cgroup"): v2 (the "0::" line)
// when root has cgroup.controllers, else v1's memory controller under root/memory; each from the process's own
// cgroup up to the mount's root, read through `read` (a path -> its text, "" when absent).
std::vector<CgroupMemoryFiles> cgroup_memory_levels(const std::string& proc_self_cgroup, const std::string& root,
                                                    const std::function<std::string(const std::string&)>& read);

// The live values of this process.
HostMemory host_memory_available();

}  // namespace fp4moe
