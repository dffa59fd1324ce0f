// docs/cli.md's --help blocks are the binary's: every command (the top level, each subcommand, bench's subcommands)
// has a `<!-- help: COMMAND -->` block equal to `fp4moe COMMAND --help`, the binary's path in its Usage line written
// `fp4moe`. scripts/update_cli_docs.py rewrites them; a flag added without that run fails here (the blocks had gone
// stale: six of twelve subcommands listed, a changed flag's text).
#include <gtest/gtest.h>

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

}  // namespace
}  // namespace fp4moe::tools
