#include "core/file.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <istream>

#include "core/error.h"

namespace fp4moe {

std::string read_stream(std::istream& in, const std::string& what, uint64_t max_bytes) {
  constexpr size_t kChunk = size_t{1} << 20;
  std::string out;
  while (in.good()) {
    const size_t at = out.size();
    out.resize(at + kChunk);
    in.read(out.data() + at, static_cast<std::streamsize>(kChunk));
    out.resize(at + static_cast<size_t>(in.gcount()));
    FP4MOE_CHECK(out.size() <= max_bytes)
        << what << ": more than " << max_bytes << " bytes, the most fp4moe reads whole (a device such as /dev/zero, "
        << "or the wrong file?)";
  }
  FP4MOE_CHECK(!in.bad()) << "cannot read " << what;
  return out;
}

std::string read_file(const std::filesystem::path& path, uint64_t max_bytes) {
  std::error_code ec;
  FP4MOE_CHECK(!std::filesystem::is_directory(path, ec)) << path.string() << " is a directory, not a file";
  std::ifstream in(path, std::ios::binary);
  const int open_errno = errno;
  FP4MOE_CHECK(in.good()) << "cannot open " << path.string() << ": " << std::strerror(open_errno);
  return read_stream(in, path.string(), max_bytes);
}

void check_writable_file(const std::filesystem::path& path, const std::string& what, bool create_parents,
                         bool via_rename) {
  namespace fs = std::filesystem;
  const std::string head = what + " " + path.string();
  std::error_code ec;
  FP4MOE_CHECK(!path.empty()) << what << ": the path is empty";
  FP4MOE_CHECK(!fs::is_directory(path, ec)) << head << " is a directory, not a file";
  fs::path target = fs::absolute(path, ec);
  if (ec) target = path;
  if (via_rename) target = rename_target(target, head);
  if (via_rename || !fs::exists(target, ec)) {
    check_can_create_in(target.parent_path(), head, "written", create_parents);
    return;
  }
  const int writable = ::access(target.c_str(), W_OK), access_errno = errno;
  FP4MOE_CHECK(writable == 0) << head << " cannot be written: " << target.string() << " is not writable ("
                              << std::strerror(access_errno) << ")";
}

std::filesystem::path rename_target(const std::filesystem::path& path, const std::string& head) {
  const std::filesystem::path target = follow_links(path);
  std::error_code ec;
  const std::filesystem::file_status st = std::filesystem::status(target, ec);
  FP4MOE_CHECK(!std::filesystem::exists(st) || std::filesystem::is_regular_file(st))
      << head << ": " << target.string()
      << " exists and is not a regular file (a directory, device, FIFO or socket): the write would replace it";
  return target;
}

std::filesystem::path follow_links(const std::filesystem::path& path) {
  namespace fs = std::filesystem;
  fs::path p = path;
  for (int hops = 0; hops <= 40; ++hops) {
    std::error_code ec;
    if (!fs::is_symlink(fs::symlink_status(p, ec))) return p;
    const fs::path next = fs::read_symlink(p, ec);
    FP4MOE_CHECK(!ec) << path.string() << ": cannot read the link " << p.string() << ": " << ec.message();
    p = next.is_absolute() ? next : p.parent_path() / next;
  }
  FP4MOE_FAIL() << path.string() << ": more than 40 symbolic links (a loop)";
  return p;
}

void check_can_create_in(const std::filesystem::path& dir, const std::string& head, const std::string& verb,
                         bool walk_up) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::path up = dir;
  if (walk_up) {
    while (!fs::exists(up, ec) && up.has_parent_path() && up.parent_path() != up) up = up.parent_path();
  }
  FP4MOE_CHECK(fs::exists(up, ec)) << head << " cannot be " << verb << ": the directory " << up.string()
                                   << " does not exist";
  FP4MOE_CHECK(fs::is_directory(up, ec)) << head << " cannot be " << verb << ": " << up.string()
                                         << " is not a directory";
  const int writable = ::access(up.c_str(), W_OK), access_errno = errno;
  FP4MOE_CHECK(writable == 0) << head << " cannot be " << verb << ": " << up.string() << " is not writable ("
                              << std::strerror(access_errno) << ")";
}

}  // namespace fp4moe
