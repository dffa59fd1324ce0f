// Command-line checks several subcommands share. Tested by tests/model/test_generate_cli.cpp (--seed).
#pragma once

#include <CLI/CLI.hpp>

#include <charconv>
#include <cstdint>
#include <string>

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

}  // namespace fp4moe::tools
