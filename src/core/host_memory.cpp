#include "core/host_memory.h"

#include <cstdlib>
#include <fstream>
#include <sstream>

namespace fp4moe {
namespace {

std::optional<std::string> slurp(const char* path) {
  std::ifstream in(path);
  if (!in.good()) return std::nullopt;
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The leading unsigned number of `text` (after blanks), if any.
std::optional<double> number(const std::string& text) {
  const char* begin = text.c_str();
  char* end = nullptr;
  const unsigned long long v = std::strtoull(begin, &end, 10);
  if (end == begin) return std::nullopt;
  return static_cast<double>(v);
}

}  // namespace

HostMemory host_memory_from(const std::string& meminfo, const std::optional<std::string>& cgroup_limit,
                            const std::optional<std::string>& cgroup_usage, const std::string& cgroup_name) {
  HostMemory out;
  const std::string key = "MemAvailable:";
  if (const size_t at = meminfo.find(key); at != std::string::npos) {
    if (const auto kb = number(meminfo.substr(at + key.size()))) {  // "MemAvailable:   23421728 kB"
      out.bytes = *kb * 1024.0;
      out.source = "MemAvailable";
    }
  }
  if (cgroup_limit && cgroup_usage && cgroup_limit->rfind("max", 0) != 0) {
    const auto limit = number(*cgroup_limit), usage = number(*cgroup_usage);
    if (limit && usage && *limit < 1152921504606846976.0) {  // 2^60: cgroup v1 writes ~2^63 for "no limit"
      const double left = *limit > *usage ? *limit - *usage : 0.0;
      if (out.source.empty() || left < out.bytes) {
        out.bytes = left;
        out.source = "cgroup " + cgroup_name;
      }
    }
  }
  return out;
}

HostMemory host_memory_available() {
  const std::string meminfo = slurp("/proc/meminfo").value_or("");
  if (auto limit = slurp("/sys/fs/cgroup/memory.max")) {
    return host_memory_from(meminfo, limit, slurp("/sys/fs/cgroup/memory.current"), "memory.max");
  }
  return host_memory_from(meminfo, slurp("/sys/fs/cgroup/memory/memory.limit_in_bytes"),
                          slurp("/sys/fs/cgroup/memory/memory.usage_in_bytes"), "memory.limit_in_bytes");
}

}  // namespace fp4moe
