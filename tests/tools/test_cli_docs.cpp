// docs/cli.md's --help blocks are the binary's: every command (the top level, each subcommand, bench's subcommands)
// has a `<!-- help: COMMAND -->` block equal to `fp4moe COMMAND --help`, the binary's path in its Usage line written
// `fp4moe`. scripts/update_cli_docs.py rewrites them; a flag added without that run fails here (the blocks had gone
// stale: six of twelve subcommands listed, a changed flag's text).
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "testing/testing.h"

namespace fp4moe::tools {
namespace {

std::string help_of(const std::string& command) {
  std::string out;
  EXPECT_EQ(
      testing::run_command(std::string(FP4MOE_CLI) + " " + command + (command.empty() ? "" : " ") + "--help", &out), 0)
      << command << ": " << out;
  while (!out.empty() && out.back() == '\n') out.pop_back();  // CLI11 ends with a blank line; the block does not
  out += '\n';
  return std::regex_replace(out, std::regex("Usage: \\S+"), "Usage: fp4moe", std::regex_constants::format_first_only);
}

// The names listed under "Subcommands:" in a help text.
std::vector<std::string> subcommands_of(const std::string& help) {
  std::vector<std::string> out;
  std::istringstream lines(help);
  bool in_list = false;
  for (std::string line; std::getline(lines, line);) {
    if (line == "Subcommands:") {
      in_list = true;
    } else if (in_list && line.rfind("  ", 0) == 0) {
      out.push_back(line.substr(2, line.find(' ', 2) - 2));
    } else if (in_list) {
      break;
    }
  }
  return out;
}

TEST(CliDocs, HelpBlocksAreTheBinarys) {
  std::ifstream f(std::string(FP4MOE_SOURCE_DIR) + "/docs/cli.md");
  ASSERT_TRUE(f.good());
  std::map<std::string, std::string> blocks;  // command -> the block's lines, each ending in '\n'
  const std::regex marker("^<!-- help: ?(.*?) -->$");
  for (std::string line; std::getline(f, line);) {
    std::smatch m;
    if (!std::regex_match(line, m, marker)) continue;
    const std::string command = m[1];
    ASSERT_TRUE(std::getline(f, line) && line == "```") << "the marker for '" << command << "' has no ``` block";
    std::string block;
    while (std::getline(f, line) && line != "```") block += line + "\n";
    EXPECT_TRUE(blocks.emplace(command, block).second) << "two blocks for '" << command << "'";
  }
  std::set<std::string> commands = {""};
  for (const std::string& sub : subcommands_of(help_of(""))) {
    commands.insert(sub);
    for (const std::string& subsub : subcommands_of(help_of(sub))) commands.insert(sub + " " + subsub);
  }
  EXPECT_GE(commands.size(), 13u);  // the listing was read
  for (const std::string& command : commands) {
    SCOPED_TRACE("fp4moe " + command + " --help");
    const auto it = blocks.find(command);
    if (it == blocks.end()) {
      ADD_FAILURE() << "docs/cli.md has no help block for '" << command << "' (add `<!-- help: " << command
                    << " -->` and a ``` block, then run scripts/update_cli_docs.py)";
      continue;
    }
    EXPECT_EQ(it->second, help_of(command)) << "docs/cli.md is stale: run scripts/update_cli_docs.py";
  }
  for (const auto& [command, block] : blocks)
    EXPECT_TRUE(commands.count(command)) << "docs/cli.md has a block for '" << command << "', not a command";
}

// `fp4moe --version` (what CLI tools answer) prints the first line of `fp4moe version` and exits 0.
TEST(CliDocs, VersionFlag) {
  std::string flag, command;
  ASSERT_EQ(testing::run_command(std::string(FP4MOE_CLI) + " --version", &flag), 0) << flag;
  ASSERT_EQ(testing::run_command(std::string(FP4MOE_CLI) + " version", &command), 0) << command;
  EXPECT_EQ(flag.rfind("fp4moe ", 0), 0u) << flag;
  EXPECT_EQ(flag.substr(0, flag.find('\n')), command.substr(0, command.find('\n'))) << flag << "\n" << command;
}

// cmake/git_commit.cmake (the commit in the build id, --version, /version): a checkout's short commit; "-dirty.<hash
// of the diff>" after it once a tracked file differs from the commit (untracked files do not count; another change,
// another hash); "unknown" outside a checkout (GIT_CEILING_DIRECTORIES keeps git from finding one above the temporary
// directory).
TEST(CliDocs, GitCommitStampMarksUncommittedChanges) {
  std::string git_version;
  if (testing::run_command("git --version 2>&1", &git_version) != 0) GTEST_SKIP() << "git is not installed";
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("fp4moe_git_commit_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir / "repo");
  const std::string repo = (dir / "repo").string(), header = (dir / "commit.h").string();
  auto stamp = [&](const std::string& source) {
    std::string out;
    EXPECT_EQ(testing::run_command("GIT_CEILING_DIRECTORIES=" + dir.string() + " " + std::string(FP4MOE_CMAKE) +
                                       " -DSOURCE_DIR=" + source + " -DOUTPUT=" + header + " -P " + FP4MOE_SOURCE_DIR +
                                       "/cmake/git_commit.cmake 2>&1",
                                   &out),
              0)
        << out;
    std::ifstream f(header);
    std::stringstream ss;
    ss << f.rdbuf();
    const std::string text = ss.str();
    const size_t at = text.find("#define FP4MOE_GIT_COMMIT \"");
    EXPECT_NE(at, std::string::npos) << text;
    const size_t from = at + 27;
    return text.substr(from, text.find('"', from) - from);
  };
  EXPECT_EQ(stamp((dir / "repo").string()), "unknown");  // not a checkout
  std::string out;
  ASSERT_EQ(testing::run_command("cd " + repo + " && git init -q && echo a > f && git add f && git -c user.name=t " +
                                     "-c user.email=t@t -c commit.gpgsign=false commit -qm init 2>&1 && git rev-parse " +
                                     "--short=12 HEAD",
                                 &out),
            0)
      << out;
  const std::string commit = out.substr(0, 12);
  EXPECT_EQ(stamp(repo), commit);
  std::ofstream(dir / "repo" / "untracked") << "x";
  EXPECT_EQ(stamp(repo), commit);  // untracked files are not the build's sources
  std::ofstream(dir / "repo" / "f") << "changed";
  const std::string dirty = stamp(repo);
  EXPECT_EQ(dirty.rfind(commit + "-dirty.", 0), 0u) << dirty;
  EXPECT_EQ(dirty.size(), commit.size() + 7 + 8) << dirty;
  EXPECT_EQ(stamp(repo), dirty);  // the same change, the same id
  std::ofstream(dir / "repo" / "f") << "changed otherwise";
  const std::string other = stamp(repo);
  EXPECT_EQ(other.rfind(commit + "-dirty.", 0), 0u) << other;
  EXPECT_NE(other, dirty);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace fp4moe::tools
