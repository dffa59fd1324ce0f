// Tests for `fp4moe tokenize` end to end: the real binary on the golden tokenizer (--ids-only, the
// llama-tokenize style listing, --json, --decode, --chat) and its errors (exit code 1 with the numbers).
// Run: ctest -R test_cmd_tokenize.
#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "testing/testing.h"

namespace fp4moe::tools {
namespace {

std::string tokenize_cmd(const std::string& args) {
  return std::string(FP4MOE_CLI) + " tokenize --tokenizer " + testing::shared_path("golden/tokenizer").string() + " " +
         args;
}

TEST(CmdTokenize, IdsOnlyAndListing) {
  std::string out;
  ASSERT_EQ(testing::run_command(tokenize_cmd("--text 'Hello, world!' --ids-only --show-count"), &out), 0) << out;
  EXPECT_EQ(out, "[51, 484, 345, 23, 329, 280, 1728, 12]\nTotal number of tokens: 8\n");
  ASSERT_EQ(testing::run_command(tokenize_cmd("--text 'Hi 机'"), &out), 0) << out;
  // llama-tokenize's layout: id right-aligned to 6, then the token's bytes (split UTF-8 escaped).
  EXPECT_NE(out.find("   232 -> ' '\n"), std::string::npos) << out;
  EXPECT_NE(out.find("  2784 -> '\\xe6\\x9c'\n"), std::string::npos) << out;
}

TEST(CmdTokenize, JsonDecodeAndChat) {
  const nlohmann::json cases = [] {
    std::ifstream in(testing::shared_path("golden/tokenizer/encode_cases.json"));
    return nlohmann::json::parse(in);
  }();
  std::string out;
  ASSERT_EQ(testing::run_command(tokenize_cmd("--text '<|user|>' --json"), &out), 0) << out;
  const nlohmann::json j = nlohmann::json::parse(out);
  EXPECT_EQ(j["ids"], nlohmann::json::array({7}));
  EXPECT_EQ(j["tokens"][0], "<|user|>");

  ASSERT_EQ(testing::run_command(tokenize_cmd("--decode 7,210,83,84 --skip-special-tokens"), &out), 0) << out;
  EXPECT_EQ(out, "\nhi\n");
  ASSERT_EQ(testing::run_command(tokenize_cmd("--decode 7,210,83,84 --skip-special-tokens --show-count"), &out), 0);
  EXPECT_EQ(out, "\nhi\nTotal number of tokens: 4\n");  // --show-count was ignored with --decode

  const auto path = std::filesystem::temp_directory_path() /
                    ("fp4moe_chat_" + std::to_string(std::random_device{}()) + ".json");
  std::ofstream(path) << cases["chat"]["messages"].dump();
  ASSERT_EQ(testing::run_command(tokenize_cmd("--chat " + path.string() + " --json"), &out), 0) << out;
  const nlohmann::json chat = nlohmann::json::parse(out);
  EXPECT_EQ(chat["rendered"], cases["chat"]["rendered"]);
  EXPECT_EQ(chat["ids"], cases["chat"]["ids"]);
  // The same messages as a request body render the same.
  std::ofstream(path) << nlohmann::json{{"messages", cases["chat"]["messages"]}}.dump();
  ASSERT_EQ(testing::run_command(tokenize_cmd("--chat " + path.string() + " --json"), &out), 0) << out;
  EXPECT_EQ(nlohmann::json::parse(out)["rendered"], cases["chat"]["rendered"]);
  // Messages the server's /v1/chat/completions refuses are refused, naming the message (they rendered as nothing but
  // the generation prompt, exit 0).
  for (const auto& [messages, message] : std::vector<std::pair<std::string, std::string>>{
           {R"([{"content": "hi"}])", "messages[0].role must be a string"},
           {"[1, 2]", "messages[0] must be an object, got 1"},
           {"[]", "messages must be a non-empty list"},
           {R"([{"role": "user"}])", "messages[0].content is required for a user message"}}) {
    std::ofstream(path) << messages;
    EXPECT_EQ(testing::run_command(tokenize_cmd("--chat " + path.string()), &out), 1) << messages << ": " << out;
    EXPECT_NE(out.find(path.string() + ": " + message), std::string::npos) << messages << ": " << out;
  }
  // --chat-template: another template (inline or a file), as serve's flag; without --chat a usage error.
  std::ofstream(path) << R"([{"role": "user", "content": "hi"}])";
  ASSERT_EQ(testing::run_command(tokenize_cmd("--chat " + path.string() +
                                              " --json --chat-template '{% for m in messages %}[{{ m.content }}]{% "
                                              "endfor %}'"),
                                 &out),
            0)
      << out;
  EXPECT_EQ(nlohmann::json::parse(out)["rendered"], "[hi]");
  EXPECT_EQ(testing::run_command(tokenize_cmd("--text hi --chat-template x"), &out), 2) << out;
  EXPECT_NE(out.find("--chat-template requires --chat"), std::string::npos) << out;
  EXPECT_EQ(testing::run_command(tokenize_cmd("--chat " + path.string() + " --chat-template no-such-file"), &out), 1);
  EXPECT_NE(out.find("--chat-template no-such-file is neither a file nor a Jinja template"), std::string::npos) << out;
  EXPECT_EQ(testing::run_command(tokenize_cmd("--chat " + path.string() + " --chat-template chatml"), &out), 1);
  EXPECT_NE(out.find("built-in template names such as chatml are not provided"), std::string::npos) << out;
  // A .json file: a tokenizer_config.json's chat_template; SGLang's conversation format and an empty file are refused
  // (they rendered as every chat's whole prompt).
  const auto tmpl = std::filesystem::temp_directory_path() / ("fp4moe_tmpl_" + std::to_string(std::random_device{}()));
  std::ofstream(tmpl.string() + ".json")
      << nlohmann::json{{"chat_template", "{% for m in messages %}({{ m.content }}){% endfor %}"}}.dump();
  ASSERT_EQ(testing::run_command(
                tokenize_cmd("--chat " + path.string() + " --json --chat-template " + tmpl.string() + ".json"), &out),
            0)
      << out;
  EXPECT_EQ(nlohmann::json::parse(out)["rendered"], "(hi)");
  std::ofstream(tmpl.string() + ".json")
      << R"({"name": "x", "system": "", "user": ["<u>", "</u>"], "sep_style": "CHATML"})";
  EXPECT_EQ(testing::run_command(
                tokenize_cmd("--chat " + path.string() + " --chat-template " + tmpl.string() + ".json"), &out),
            1);
  EXPECT_NE(out.find("SGLang's JSON conversation format"), std::string::npos) << out;
  std::ofstream(tmpl.string() + ".jinja") << "";
  EXPECT_EQ(testing::run_command(
                tokenize_cmd("--chat " + path.string() + " --chat-template " + tmpl.string() + ".jinja"), &out),
            1);
  EXPECT_NE(out.find("holds no {{ ... }} or {% ... %}: it is not a Jinja template"), std::string::npos) << out;
  std::filesystem::remove(tmpl.string() + ".json");
  std::filesystem::remove(tmpl.string() + ".jinja");
  std::filesystem::remove(path);
}

// A request body's tools render in the file's key order, as the server renders them (restore_key_order): a template
// that prints them with tojson shows "b" before "a" as written (sorted, the token counts differed from the server's).
TEST(CmdTokenize, ChatToolsKeepTheirKeyOrder) {
  const auto dir =
      std::filesystem::temp_directory_path() / ("fp4moe_tok_tools_" + std::to_string(std::random_device{}()));
  std::filesystem::create_directories(dir);
  std::filesystem::copy_file(testing::shared_path("golden/tokenizer/tokenizer.json"), dir / "tokenizer.json");
  std::ofstream(dir / "tokenizer_config.json")
      << nlohmann::json{{"chat_template", "{{ tools | tojson }}|{% for m in messages %}{{ m.content }}{% endfor %}"}}
             .dump();
  const auto chat = dir / "chat.json";
  std::ofstream(chat) << R"({"messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function", )"
                         R"("function": {"name": "f", "parameters": {"properties": {"b": {}, "a": {}}}}}]})";
  std::string out;
  ASSERT_EQ(testing::run_command(std::string(FP4MOE_CLI) + " tokenize --tokenizer " + dir.string() + " --chat " +
                                     chat.string() + " --json",
                                 &out),
            0)
      << out;
  const std::string rendered = nlohmann::json::parse(out)["rendered"];
  EXPECT_LT(rendered.find("\"b\""), rendered.find("\"a\"")) << rendered;
  EXPECT_LT(rendered.find("\"type\""), rendered.find("\"function\"")) << rendered;
  EXPECT_NE(rendered.find("|hi"), std::string::npos) << rendered;
  std::filesystem::remove_all(dir);
}

TEST(CmdTokenize, ErrorsCarryNumbers) {
  std::string out;
  // Invalid UTF-8 names its input (the file), not only the byte.
  const std::string bad = (std::filesystem::temp_directory_path() / "fp4moe_tokenize_bad_utf8.txt").string();
  std::ofstream(bad) << "ab\xff" << "cd";
  EXPECT_EQ(testing::run_command(tokenize_cmd("--file " + bad), &out), 1);
  EXPECT_NE(out.find(bad + ": cannot tokenize: invalid UTF-8 at byte 2 of 5"), std::string::npos) << out;
  std::filesystem::remove(bad);
  // Standard input that cannot be read (here a directory) is named; it read as empty input (exit 0, no ids).
  EXPECT_EQ(testing::run_command(tokenize_cmd("--stdin < /tmp"), &out), 1) << out;
  EXPECT_NE(out.find("cannot read standard input: Is a directory"), std::string::npos) << out;
  EXPECT_EQ(testing::run_command(tokenize_cmd("--text a --decode 1"), &out), 1);
  EXPECT_NE(out.find("give exactly one of --text, --file, --stdin, --decode, --chat (got 2)"), std::string::npos) << out;
  EXPECT_EQ(testing::run_command(tokenize_cmd("--decode 1,5000"), &out), 1);
  EXPECT_NE(out.find("id 5000 is outside the vocabulary (size 4096)"), std::string::npos) << out;
  // --tokenizer names the folder: its tokenizer.json file is named as such, a missing folder as missing.
  const std::string tok_dir = testing::shared_path("golden/tokenizer").string();
  EXPECT_EQ(testing::run_command(
                std::string(FP4MOE_CLI) + " tokenize --text a --tokenizer " + tok_dir + "/tokenizer.json 2>&1", &out),
            1);
  EXPECT_NE(out.find("fp4moe: error: " + tok_dir +
                     "/tokenizer.json is a file, not a tokenizer folder (one holding "
                     "tokenizer.json and, optionally, tokenizer_config.json): give " +
                     tok_dir + "\n"),
            std::string::npos)
      << out;
  EXPECT_EQ(
      testing::run_command(std::string(FP4MOE_CLI) + " tokenize --text a --tokenizer /nonexistent/tok 2>&1", &out), 1);
  EXPECT_NE(out.find("fp4moe: error: tokenizer folder /nonexistent/tok does not exist\n"), std::string::npos) << out;
  // An empty --text is text (no ids), not a missing option; a --decode list of no ids is an error, not "".
  EXPECT_EQ(testing::run_command(tokenize_cmd("--text '' --ids"), &out), 0) << out;
  EXPECT_EQ(out, "[]\n");
  EXPECT_EQ(testing::run_command(tokenize_cmd("--decode ,,"), &out), 1);
  EXPECT_NE(out.find("--decode ',,' holds no token id"), std::string::npos) << out;
  EXPECT_EQ(testing::run_command(tokenize_cmd("--decode ''"), &out), 2);  // an empty option value: a usage error
  EXPECT_NE(out.find("--decode: is empty"), std::string::npos) << out;
  EXPECT_EQ(testing::run_command(tokenize_cmd("--decode 1,x"), &out), 1);
  EXPECT_NE(out.find("'x' is not a token id"), std::string::npos) << out;
}

// Command-line usage errors exit 2 (as argparse and getopt tools do; CLI11's own codes were 105-114), with CLI11's
// message; --help exits 0.
TEST(CmdTokenize, UsageErrorsExitTwo) {
  std::string out;
  EXPECT_EQ(testing::run_command(tokenize_cmd("--no-such-flag 2>&1"), &out), 2) << out;
  EXPECT_NE(out.find("--no-such-flag"), std::string::npos) << out;
  EXPECT_EQ(testing::run_command(std::string(FP4MOE_CLI) + " 2>&1", &out), 2) << out;
  EXPECT_NE(out.find("A subcommand is required"), std::string::npos) << out;
  // A first word that is no subcommand is named, with the closest one.
  EXPECT_EQ(testing::run_command(std::string(FP4MOE_CLI) + " tokenise --text a 2>&1", &out), 2) << out;
  EXPECT_NE(out.find("fp4moe: unknown subcommand 'tokenise' (did you mean 'tokenize'?); the subcommands are version, "),
            std::string::npos)
      << out;
  EXPECT_EQ(testing::run_command(std::string(FP4MOE_CLI) + " frobnicate 2>&1", &out), 2) << out;
  EXPECT_NE(out.find("unknown subcommand 'frobnicate'; the subcommands are"), std::string::npos) << out;
  EXPECT_EQ(testing::run_command(std::string(FP4MOE_CLI) + " bench gem 2>&1", &out), 2) << out;  // a nested one too
  EXPECT_NE(out.find("fp4moe bench: unknown subcommand 'gem' (did you mean 'gemm'?); the subcommands are gemm, moe "
                     "(fp4moe bench --help)"),
            std::string::npos)
      << out;
  EXPECT_EQ(testing::run_command(tokenize_cmd("--help"), &out), 0) << out;
  EXPECT_NE(out.find("--decode"), std::string::npos) << out;
}

}  // namespace
}  // namespace fp4moe::tools
