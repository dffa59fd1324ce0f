// read_file: contents round trip; a missing file names the path and the OS reason; a directory says so.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "core/file.h"

namespace fp4moe {
namespace {

TEST(File, ReadsBytesExactly) {
  auto path = std::filesystem::temp_directory_path() / "fp4moe_test_file.bin";
  const std::string bytes("a\0b\nc\xff", 6);
  std::ofstream(path, std::ios::binary) << bytes;
  EXPECT_EQ(read_file(path), bytes);
  std::filesystem::remove(path);
}

TEST(File, MissingFileNamesPathAndReason) {
  try {
    read_file("/nonexistent/fp4moe/x.json");
    FAIL() << "no throw";
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("cannot open /nonexistent/fp4moe/x.json: No such file or directory"), std::string::npos) << msg;
  }
}

// A directory is said to be one (reading it threw libstdc++'s "basic_filebuf::underflow ... Is a directory").
TEST(File, DirectoryIsNamed) {
  const auto dir = std::filesystem::temp_directory_path();
  try {
    read_file(dir);
    FAIL() << "no throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(dir.string() + " is a directory, not a file"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace fp4moe
