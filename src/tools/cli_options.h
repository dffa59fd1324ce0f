// Command-line checks several subcommands share. Tested by tests/model/test_generate_cli.cpp (--seed, the sampling
// flags), tests/tools/test_bench_one_batch.cpp (values of fixed sets) and tests/tools/test_cmd_tokenize.cpp
// (--chat-template).
#pragma once

#include <CLI/CLI.hpp>

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <filesystem>
#include <initializer_list>
#include <string>
#include <system_error>
#include <utility>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/file.h"
#include "engine/chat_template.h"
#include "engine/sampler.h"
#include "format/json_file.h"

namespace fp4moe::tools {

// An unsigned 64-bit value written as decimal digits: CLI11 read "-1" as 2^64 - 1 and saturated 2^64 and past, so
// three different seeds gave one run. A usage error (exit 2) otherwise.
inline CLI::Validator unsigned_64() {
  return CLI::Validator(
      [](std::string& s) -> std::string {
        uint64_t v = 0;
        const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
        if (s.empty() || ec != std::errc() || end != s.data() + s.size())
          return "'" + s + "' is not an integer in [0, 2^64)";
        return {};
      },
      "");  // the option's own type name (UINT) stays in --help
}

// A value of a fixed set read by its parser (model::parse_load_format, engine::parse_schedule_policy, ...), which
// throws naming the accepted values: checked while CLI11 parses, so that a bad value is a usage error (exit 2, as a
// value outside an IsMember set) with the parser's message (its source location left out), before anything runs.
template <class Parse>
CLI::Validator parsed_by(Parse parse) {
  return CLI::Validator(
      [parse](std::string& s) -> std::string {
        try {
          parse(s);
          return {};
        } catch (const fp4moe::Error& e) {
          std::string message = e.what();
          const size_t at = message.rfind(" [");
          if (at != std::string::npos && message.back() == ']') message.resize(at);
          return message;
        }
      },
      "");
}

// The options that shape dummy weights (--dummy-weights, --dummy-seed) given without --load-format dummy: a usage
// error naming them (they were ignored, and the run read the checkpoint's weights).
inline void require_dummy_load(std::initializer_list<const CLI::Option*> options, const std::string& load_format) {
  if (load_format == "dummy") return;
  for (const CLI::Option* o : options) {
    if (o->count() > 0)
      throw CLI::ValidationError(
          o->get_name(), "shapes dummy weights: it needs --load-format dummy (got --load-format " + load_format +
                             ", which reads the checkpoint's weights)");
  }
}

// --chat-template (vLLM's flag; SGLang's for Jinja templates): a Jinja file's contents, a .json file's
// "chat_template" (a tokenizer_config.json, its string or the list entry named "default"), or the value itself when it
// is a template. A source without {{ }} or {% %} (an empty file, a misspelled path) is refused: it would be every
// chat's whole prompt; so are SGLang's JSON conversation files and its built-in template names, which are not read
// here. The source, and where it came from for errors.
inline std::pair<std::string, std::string> chat_template_source(const std::string& value) {
  const auto is_template = [](const std::string& s) {
    return s.find("{{") != std::string::npos || s.find("{%") != std::string::npos;
  };
  std::error_code ec;
  if (std::filesystem::is_regular_file(value, ec)) {
    std::string source = read_file(value);
    if (std::filesystem::path(value).extension() == ".json") {
      const nlohmann::json j = format::parse_json_text(source, value);
      FP4MOE_CHECK(j.is_object() && j.contains("chat_template"))
          << "--chat-template " << value
          << ": a .json file gives its template as \"chat_template\" (a string, or a list holding one named "
             "\"default\"), as a tokenizer_config.json does; SGLang's JSON conversation format (name / system / user "
             "/ sep_style) is not read here: give a Jinja template";
      source = engine::ChatTemplate::config_source(j, value).first;  // the string, or the list's "default"
    }
    FP4MOE_CHECK(is_template(source)) << "--chat-template " << value
                                      << " holds no {{ ... }} or {% ... %}: it is not a Jinja template (it would be "
                                         "every chat's whole prompt)";
    return {source, value};
  }
  FP4MOE_CHECK(is_template(value))
      << "--chat-template " << value.substr(0, 80)
      << " is neither a file nor a Jinja template (a template holds {{ ... }} or {% ... %}; SGLang's built-in "
         "template names such as chatml are not provided)";
  return {value, "--chat-template"};
}
// The --chat-template flag's template (chat_template_source, parsed), with the special tokens of `config` (a parsed
// tokenizer_config.json, or null) visible to it.
inline engine::ChatTemplate chat_template_from_flag(const std::string& value, const nlohmann::json& config) {
  const auto [source, origin] = chat_template_source(value);
  return engine::ChatTemplate::from_source(source, config, origin);
}

// Runs a validate() whose engine::FieldError names a field its flag is spelled after (top_p: --top-p), naming the
// flag instead: "--top-p 2 must be in (0, 1]" where validate says "top_p 2 ...".
template <class Check>
void with_flag_names(Check&& check) {
  try {
    check();
  } catch (const engine::FieldError& e) {
    std::string flag = "--" + e.field(), message = e.what();
    std::replace(flag.begin(), flag.end(), '_', '-');
    if (message.rfind(e.field(), 0) == 0) message = flag + message.substr(e.field().size());
    FP4MOE_FAIL() << message;
  }
}

// Sampling flags checked as the server checks a request's fields (engine::SamplingParams::validate: one definition of
// the ranges), before any model is loaded or server asked, and named as flags.
inline void check_sampling_flags(const engine::SamplingParams& sp) {
  with_flag_names([&] { sp.validate(INT32_MAX); });  // no token ids among the flags
}

}  // namespace fp4moe::tools
