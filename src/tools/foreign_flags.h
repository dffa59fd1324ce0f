// What fp4moe has for another server's flag that a command does not take (SGLang's launch_server, vLLM's serve,
// sglang.bench_serving): main.cpp names an unknown option with this hint, else with the command's closest option.
// Flags fp4moe takes as they are meant are options of their commands (cmd_serve.cpp's add_compat_options and
// aliases), not here. Tested by tests/server/test_server_e2e.cpp (ServerE2E.OtherServersFlags).
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace fp4moe::tools {

// `command`: the command path as main.cpp prints it ("fp4moe serve"); `flag`: "--name" as given (before any '=').
std::optional<std::string> foreign_flag_hint(std::string_view command, std::string_view flag);

}  // namespace fp4moe::tools
