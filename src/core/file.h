// Whole-file reading with errors that name the path and the OS reason. Tested by tests/core/test_file.cpp.
#pragma once

#include <filesystem>
#include <string>

namespace fp4moe {

// The file's bytes; throws fp4moe::Error "cannot open <path>: <strerror>" when it cannot be read, and
// "<path> is a directory, not a file" for a directory.
std::string read_file(const std::filesystem::path& path);

}  // namespace fp4moe
