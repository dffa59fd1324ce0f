// The fp4moe subcommands. Each lives in its own cmd_<name>.cpp and registers itself on the app;
// main.cpp calls every register function. A command reports bad input by throwing fp4moe::Error.
#pragma once

namespace CLI {
class App;
}

namespace fp4moe::tools {

void register_version_command(CLI::App& app);  // also `fp4moe --version` (the first line of `fp4moe version`)
void register_inspect_command(CLI::App& app);
void register_quantize_command(CLI::App& app);
void register_plan_command(CLI::App& app);
void register_tokenize_command(CLI::App& app);
void register_generate_command(CLI::App& app);
void register_bench_one_batch_command(CLI::App& app);
void register_serve_command(CLI::App& app);
void register_bench_serving_command(CLI::App& app);
void register_tune_command(CLI::App& app);
void register_bench_command(CLI::App& app);
void register_analyze_command(CLI::App& app);

}  // namespace fp4moe::tools
