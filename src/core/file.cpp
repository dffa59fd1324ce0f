#include "core/file.h"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "core/error.h"

namespace fp4moe {

std::string read_file(const std::filesystem::path& path) {
  std::error_code ec;
  FP4MOE_CHECK(!std::filesystem::is_directory(path, ec)) << path.string() << " is a directory, not a file";
  std::ifstream in(path, std::ios::binary);
  const int open_errno = errno;
  FP4MOE_CHECK(in.good()) << "cannot open " << path.string() << ": " << std::strerror(open_errno);
  std::ostringstream ss;
  ss << in.rdbuf();
  FP4MOE_CHECK(!in.bad()) << "cannot read " << path.string();
  return ss.str();
}

}  // namespace fp4moe
