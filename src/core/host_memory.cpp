#include "core/host_memory.h"

#include <cstdlib>
#include <fstream>
#include <sstream>

namespace fp4moe {
namespace {

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  if (!in.good()) return "";
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The leading unsigned number of `text` (after blanks), or -1.
double number(const std::string& text) {
  const char* begin = text.c_str();
  char* end = nullptr;
  const unsigned long long v = std::strtoull(begin, &end, 10);
  return end == begin ? -1.0 : static_cast<double>(v);
}

// The value of the line "<key> <n>" (or "<key>: <n>") of a stat / meminfo text, or -1.
double field(const std::string& text, const std::string& key) {
  size_t at = 0;
  while ((at = text.find(key, at)) != std::string::npos) {
    const bool line_start = at == 0 || text[at - 1] == '\n';
    const size_t after = at + key.size();
    if (line_start && after < text.size() && (text[after] == ' ' || text[after] == ':')) {
      return number(text.substr(after + (text[after] == ':' ? 1 : 0)));
    }
    at = after;
  }
  return -1.0;
}

}  // namespace

HostMemory host_memory_from(const std::string& meminfo, const std::vector<CgroupMemoryFiles>& cgroups) {
  HostMemory out;
  if (const double kb = field(meminfo, "MemAvailable"); kb >= 0) {
    out.bytes = kb * 1024.0;
    out.source = "MemAvailable";
  }
  for (const CgroupMemoryFiles& c : cgroups) {
    const double limit = c.limit.rfind("max", 0) == 0 ? -1.0 : number(c.limit);
    const double usage = number(c.usage);
    if (limit < 0 || usage < 0 || limit >= 1152921504606846976.0) continue;  // no limit (v1 writes ~2^63 for none)
    double inactive = field(c.stat, "inactive_file");
    if (inactive < 0) inactive = field(c.stat, "total_inactive_file");
    const double used = usage - (inactive > 0 && inactive < usage ? inactive : 0.0);
    const double left = limit > used ? limit - used : 0.0;
    if (out.source.empty() || left < out.bytes) {
      out.bytes = left;
      out.source = "cgroup " + c.where;
    }
  }
  return out;
}

std::vector<CgroupMemoryFiles> cgroup_memory_levels(const std::string& proc_self_cgroup, const std::string& root,
                                                    const std::function<std::string(const std::string&)>& read) {
  const bool v2 = !read(root + "/cgroup.controllers").empty();
  // The process's path in the hierarchy: v2's "0::<path>", v1's "<n>:<controllers with memory>:<path>".
  std::string rel;
  std::istringstream lines(proc_self_cgroup);
  for (std::string line; std::getline(lines, line);) {
    const size_t a = line.find(':'), b = a == std::string::npos ? a : line.find(':', a + 1);
    if (b == std::string::npos) continue;
    const std::string controllers = "," + line.substr(a + 1, b - a - 1) + ",";
    if (v2 ? line.compare(0, 3, "0::") == 0 : controllers.find(",memory,") != std::string::npos) {
      rel = line.substr(b + 1);
      break;
    }
  }
  const std::string base = v2 ? root : root + "/memory";
  const char* limit = v2 ? "/memory.max" : "/memory.limit_in_bytes";
  const char* usage = v2 ? "/memory.current" : "/memory.usage_in_bytes";
  std::vector<CgroupMemoryFiles> out;
  while (true) {  // the process's cgroup, then each ancestor up to the mount's root
    const std::string dir = base + (rel == "/" ? "" : rel);
    CgroupMemoryFiles c{dir + limit, read(dir + limit), read(dir + usage), read(dir + "/memory.stat")};
    if (!c.limit.empty()) out.push_back(std::move(c));
    if (rel.empty() || rel == "/") break;
    const size_t slash = rel.rfind('/');
    rel = slash == 0 || slash == std::string::npos ? "/" : rel.substr(0, slash);
  }
  return out;
}

HostMemory host_memory_available() {
  return host_memory_from(slurp("/proc/meminfo"), cgroup_memory_levels(slurp("/proc/self/cgroup"), "/sys/fs/cgroup",
                                                                       [](const std::string& p) { return slurp(p); }));
}

}  // namespace fp4moe
