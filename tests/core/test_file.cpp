// read_file: contents round trip; a missing file names the path and the OS reason; a directory says so.
// check_writable_file: a directory, a path under a file and a missing parent are refused, naming the path; a new file
// in a directory, an existing file and (with create_parents) missing directories pass; nothing is created.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

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

// What is read whole is bounded (kMaxReadFileBytes): /dev/zero is refused naming it instead of exhausting memory (it
// was std::bad_alloc); a file of exactly the limit passes; a stream says what it is.
TEST(File, ReadsAreBounded) {
  auto path = std::filesystem::temp_directory_path() / "fp4moe_test_file_bound.bin";
  std::ofstream(path, std::ios::binary) << std::string(3000, 'x');
  EXPECT_EQ(read_file(path, 3000).size(), 3000u);
  try {
    read_file(path, 2999);
    FAIL() << "no throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(path.string() + ": more than 2999 bytes, the most fp4moe reads whole"),
              std::string::npos)
        << e.what();
  }
  std::filesystem::remove(path);
  try {
    read_file("/dev/zero", 5 << 20);
    FAIL() << "no throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("/dev/zero: more than 5242880 bytes"), std::string::npos) << e.what();
  }
  std::istringstream in(std::string(100, 'y'));
  EXPECT_EQ(read_stream(in, "standard input"), std::string(100, 'y'));
  std::istringstream big(std::string(100, 'y'));
  EXPECT_THROW(read_stream(big, "standard input", 99), Error);
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

// The helper throws `needle`'s message for `path`.
void expect_refused(const std::filesystem::path& path, bool create_parents, const std::string& needle) {
  try {
    check_writable_file(path, "--out", create_parents);
    ADD_FAILURE() << path << ": no throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

void expect_refused_rename(const std::filesystem::path& p, const std::string& want) {
  try {
    check_writable_file(p, "--out", false, /*via_rename=*/true);
    ADD_FAILURE() << p << " passed";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
  }
}

TEST(File, WritableFileCheckRefusesBadPaths) {
  namespace fs = std::filesystem;
  const fs::path tmp = fs::temp_directory_path();
  expect_refused(tmp, false, "--out " + tmp.string() + " is a directory, not a file");
  expect_refused("", false, "--out: the path is empty");
  const fs::path file = tmp / "fp4moe_writable_check_file";
  std::ofstream(file) << "x";
  expect_refused(
      file / "y.json", false,
      "--out " + (file / "y.json").string() + " cannot be written: " + file.string() + " is not a directory");
  expect_refused(file / "a" / "y.json", true, "cannot be written: " + file.string() + " is not a directory");
  const fs::path missing = tmp / "fp4moe_writable_check_missing";
  fs::remove_all(missing);
  expect_refused(missing / "y.json", false, "cannot be written: the directory " + missing.string() + " does not exist");
  // Passing paths; nothing is created on the way.
  EXPECT_NO_THROW(check_writable_file(file, "--out"));
  EXPECT_NO_THROW(check_writable_file(tmp / "fp4moe_writable_check_new.json", "--out"));
  EXPECT_NO_THROW(check_writable_file(missing / "a" / "y.json", "--out", /*create_parents=*/true));
  // via_rename: an existing file in a writable directory passes (the directory is what it checks; an unwritable
  // one cannot be made portably: root writes anywhere).
  EXPECT_NO_THROW(check_writable_file(file, "--out", false, /*via_rename=*/true));
  EXPECT_FALSE(fs::exists(missing));
  EXPECT_FALSE(fs::exists(tmp / "fp4moe_writable_check_new.json"));
  fs::remove(file);
}

// via_rename replaces what is at the path: a device (/dev/null) or FIFO is refused, a link is followed to its file
// (a dangling one to the file writing will create), and a loop is named.
TEST(File, RenameTargetsAreRegularFilesBehindTheirLinks) {
  namespace fs = std::filesystem;
  expect_refused_rename("/dev/null",
                        "--out /dev/null: /dev/null exists and is not a regular file (a directory, device");
  const fs::path tmp = fs::temp_directory_path() / ("fp4moe_links_" + std::to_string(::getpid()));
  fs::remove_all(tmp);
  fs::create_directories(tmp);
  std::ofstream(tmp / "file") << "x";
  fs::create_symlink("file", tmp / "rel");         // relative to its directory
  fs::create_symlink(tmp / "rel", tmp / "chain");  // a link to a link
  fs::create_symlink(tmp / "none", tmp / "dangling");
  fs::create_symlink("/dev/null", tmp / "to_device");
  fs::create_symlink(tmp / "loop_b", tmp / "loop_a");
  fs::create_symlink(tmp / "loop_a", tmp / "loop_b");
  EXPECT_EQ(follow_links(tmp / "file"), tmp / "file");
  EXPECT_EQ(follow_links(tmp / "rel"), tmp / "file");
  EXPECT_EQ(follow_links(tmp / "chain"), tmp / "file");
  EXPECT_EQ(follow_links(tmp / "dangling"), tmp / "none");
  EXPECT_NO_THROW(check_writable_file(tmp / "chain", "--out", false, /*via_rename=*/true));
  EXPECT_NO_THROW(check_writable_file(tmp / "dangling", "--out", false, /*via_rename=*/true));
  expect_refused_rename(tmp / "to_device",
                        (tmp / "to_device").string() + ": /dev/null exists and is not a regular file");
  expect_refused_rename(tmp / "loop_a", "more than 40 symbolic links (a loop)");
  fs::remove_all(tmp);
}

}  // namespace
}  // namespace fp4moe
