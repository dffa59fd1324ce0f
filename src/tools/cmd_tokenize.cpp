// `fp4moe tokenize`: the model's tokenizer and chat template from the command line, like llama.cpp's
// llama-tokenize.
//
//   fp4moe tokenize --tokenizer DIR --text "Hello <|user|>"      #      51 -> 'H' ... one token a line
//   fp4moe tokenize --tokenizer DIR --file prompt.txt --ids-only  # [51, 484, ...]
//   fp4moe tokenize --tokenizer DIR --text "hi" --json            # {"ids": [...], "tokens": [...], ...}
//   fp4moe tokenize --tokenizer DIR --decode 7,210,83,84          # <|user|>\nhi
//   fp4moe tokenize --tokenizer DIR --chat messages.json          # rendered prompt, then its ids
//
// DIR holds tokenizer.json and tokenizer_config.json. Tested by tests/engine (the library) and by
// running it on shared/golden/tokenizer.
#include <CLI/CLI.hpp>
#include <fmt/core.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/file.h"
#include "format/json_file.h"
#include "engine/chat_template.h"
#include "engine/tokenizer.h"
#include "engine/tokenizer_text.h"
#include "server/protocol.h"
#include "tools/cli_options.h"
#include "tools/commands.h"

namespace fp4moe::tools {

namespace {

struct TokenizeOptions {
  std::string tokenizer_dir;
  std::string text;
  bool text_given = false;  // --text was given (its text may be empty: it tokenizes to no ids)
  bool file_given = false, decode_given = false;
  std::string file;
  bool from_stdin = false;
  std::string decode;
  std::string chat;
  bool json = false;
  bool ids_only = false;
  bool show_count = false;
  bool no_parse_special = false;
  bool add_special_tokens = false;
  bool skip_special_tokens = false;
  bool no_generation_prompt = false;
  std::string chat_template;  // --chat-template (empty: the tokenizer folder's)
};

// Standard input whole (bounded as read_file); a read error (stdin a directory, a closed descriptor) is named: the
// stream reports one as the end of the input.
std::string read_stdin() {
  std::string text = read_stream(std::cin, "standard input");
  FP4MOE_CHECK(!std::ferror(stdin)) << "cannot read standard input: " << std::strerror(errno);
  return text;
}

// A token's bytes for display: printable text as is, control bytes and split UTF-8 as \xNN.
std::string display_piece(const std::string& bytes) {
  std::string out;
  size_t i = 0;
  while (i < bytes.size()) {
    const auto b = static_cast<uint8_t>(bytes[i]);
    const auto bad = engine::text::find_invalid_utf8(bytes.substr(i, 4));
    const bool complete_char = b >= 0x80 && (!bad.has_value() || *bad > 0);
    if (b >= 0x20 && b < 0x7F) {
      out.push_back(static_cast<char>(b));
      ++i;
    } else if (complete_char) {
      const size_t n = b >= 0xF0 ? 4 : b >= 0xE0 ? 3 : 2;
      out.append(bytes, i, n);
      i += n;
    } else if (b == '\n') {
      out += "\\n";
      ++i;
    } else if (b == '\t') {
      out += "\\t";
      ++i;
    } else {
      out += fmt::format("\\x{:02x}", b);
      ++i;
    }
  }
  return out;
}

std::vector<engine::TokenId> parse_ids(const std::string& list) {
  std::vector<engine::TokenId> ids;
  std::string item;
  std::stringstream ss(list);
  while (std::getline(ss, item, ',')) {
    const size_t b = item.find_first_not_of(" []\t\n");
    const size_t e = item.find_last_not_of(" []\t\n");
    if (b == std::string::npos) continue;
    const std::string s = item.substr(b, e - b + 1);
    size_t used = 0;
    long long v = 0;
    try {
      v = std::stoll(s, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    FP4MOE_CHECK(used == s.size() && v >= 0 && v < (1LL << 31)) << "--decode: '" << s << "' is not a token id";
    ids.push_back(static_cast<engine::TokenId>(v));
  }
  FP4MOE_CHECK(!ids.empty()) << "--decode '" << list << "' holds no token id";
  return ids;
}

void print_ids(const engine::Tokenizer& tok, const std::vector<engine::TokenId>& ids, const TokenizeOptions& o) {
  if (o.ids_only) {
    std::string line = "[";
    for (size_t i = 0; i < ids.size(); ++i) line += (i ? ", " : "") + std::to_string(ids[i]);
    fmt::print("{}]\n", line);
  } else {
    for (engine::TokenId id : ids) fmt::print("{:>6} -> '{}'\n", id, display_piece(tok.token_bytes(id)));
  }
  if (o.show_count) fmt::print("Total number of tokens: {}\n", ids.size());
}

nlohmann::ordered_json ids_json(const engine::Tokenizer& tok, const std::vector<engine::TokenId>& ids) {
  nlohmann::ordered_json tokens = nlohmann::ordered_json::array();
  for (engine::TokenId id : ids) tokens.push_back(tok.id_to_token(id));
  return {{"ids", ids}, {"tokens", tokens}, {"n_tokens", ids.size()}};
}

void run_tokenize(const TokenizeOptions& o) {
  const int n_modes = o.text_given + o.file_given + o.from_stdin + o.decode_given + !o.chat.empty();
  FP4MOE_CHECK(n_modes == 1) << "give exactly one of --text, --file, --stdin, --decode, --chat (got " << n_modes << ")";
  const engine::Tokenizer tok = engine::Tokenizer::load(o.tokenizer_dir);
  const engine::EncodeOptions encode_options{.add_special_tokens = o.add_special_tokens,
                                             .parse_special = !o.no_parse_special};

  if (o.decode_given) {
    const std::vector<engine::TokenId> ids = parse_ids(o.decode);
    for (engine::TokenId id : ids) {
      FP4MOE_CHECK(id < tok.vocab_size()) << "--decode: id " << id << " is outside the vocabulary (size "
                                          << tok.vocab_size() << ")";
    }
    const std::string text = tok.decode(ids, {.skip_special_tokens = o.skip_special_tokens});
    if (o.json) {
      nlohmann::ordered_json out = ids_json(tok, ids);
      out["text"] = text;
      fmt::print("{}\n", out.dump(2));
    } else {
      fmt::print("{}\n", text);
      if (o.show_count) fmt::print("Total number of tokens: {}\n", ids.size());  // (it was ignored here)
    }
    return;
  }

  if (!o.chat.empty()) {
    // Either a bare list of messages or an OpenAI request body {"messages": [...], "tools": [...]}: checked and
    // rendered as the server's /v1/chat/completions checks and renders it (a message without a role rendered as
    // nothing here while the server refused it).
    const std::string text = read_file(o.chat);
    nlohmann::json body = format::parse_json_text(text, o.chat);
    if (!body.is_object()) body = nlohmann::json{{"messages", std::move(body)}};
    if (o.no_generation_prompt) body["add_generation_prompt"] = false;
    std::string rendered;
    try {
      server::ParsedRequest req = server::parse_request(server::Endpoint::kChat, body);
      server::restore_key_order(req, text);  // tools in the file's key order, as the server renders them
      const engine::ChatTemplate tmpl = [&] {
        if (o.chat_template.empty()) return engine::ChatTemplate::load(o.tokenizer_dir);
        return chat_template_from_flag(o.chat_template, tok.config());
      }();
      rendered = server::render_chat(tmpl, req);
    } catch (const server::ApiError& e) {
      FP4MOE_FAIL() << o.chat << ": " << e.message;
    }
    const std::vector<engine::TokenId> ids = tok.encode(rendered, encode_options);
    if (o.json) {
      nlohmann::ordered_json out = {{"rendered", rendered}};
      const nlohmann::ordered_json tokens = ids_json(tok, ids);  // named: items() must not outlive it
      for (const auto& [k, v] : tokens.items()) out[k] = v;
      fmt::print("{}\n", out.dump(2));
    } else {
      fmt::print("{}\n", rendered);
      fmt::print("--- {} tokens\n", ids.size());
      print_ids(tok, ids, o);
    }
    return;
  }

  const std::string text = o.text_given ? o.text : o.from_stdin ? read_stdin() : read_file(o.file);
  std::vector<engine::TokenId> ids;
  try {
    ids = tok.encode(text, encode_options);
  } catch (const fp4moe::Error& e) {  // e.g. invalid UTF-8 at a byte offset: say of which input
    throw fp4moe::Error((o.text_given ? std::string("--text") : o.from_stdin ? std::string("standard input") : o.file) +
                        ": " + e.what());
  }
  if (o.json) {
    nlohmann::ordered_json out = ids_json(tok, ids);
    out["text"] = text;
    fmt::print("{}\n", out.dump(2));
  } else {
    print_ids(tok, ids, o);
  }
}

}  // namespace

void register_tokenize_command(CLI::App& app) {
  auto options = std::make_shared<TokenizeOptions>();
  auto* cmd = app.add_subcommand("tokenize", "tokenize text, decode ids or render a chat with a model's tokenizer");
  cmd->add_option("--tokenizer", options->tokenizer_dir, "folder with tokenizer.json (and tokenizer_config.json)")
      ->required();
  CLI::Option* text = cmd->add_option("--text", options->text, "text to tokenize");
  CLI::Option* file = cmd->add_option("--file", options->file, "file whose contents to tokenize");
  cmd->add_flag("--stdin", options->from_stdin, "tokenize standard input");
  CLI::Option* decode = cmd->add_option("--decode", options->decode, "comma-separated token ids to decode, e.g. 1,2,3");
  CLI::Option* chat =
      cmd->add_option("--chat", options->chat,
                      "JSON file with a list of messages (or {\"messages\": [...], \"tools\": [...]}) to render "
                      "with the chat template (generation prompt on) and tokenize");
  cmd->add_flag("--json", options->json, "print JSON (ids, token strings, text)");
  cmd->add_flag("--ids-only,--ids", options->ids_only, "print only the ids, as [1, 2, 3]");
  cmd->add_flag("--show-count", options->show_count, "print the number of tokens at the end");
  cmd->add_flag("--no-parse-special", options->no_parse_special, "treat special-token text as plain text");
  cmd->add_flag("--add-special-tokens", options->add_special_tokens, "apply the post-processor (BOS etc.)");
  cmd->add_flag("--skip-special-tokens", options->skip_special_tokens, "--decode: leave special tokens out");
  cmd->add_flag("--no-generation-prompt", options->no_generation_prompt, "--chat: without add_generation_prompt");
  cmd->add_option("--chat-template", options->chat_template,
                  "--chat: this template instead of the tokenizer's (a Jinja file, or the template itself; as serve's)")
      ->needs(chat);
  cmd->callback([options, text, file, decode] {
    options->text_given = text->count() > 0;
    options->file_given = file->count() > 0;
    options->decode_given = decode->count() > 0;
    run_tokenize(*options);
  });
}

}  // namespace fp4moe::tools
