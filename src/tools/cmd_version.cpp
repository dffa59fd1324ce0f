// `fp4moe version`: the build's version, commit and CUDA support.
#include <CLI/CLI.hpp>
#include <fmt/core.h>

#include "tools/commands.h"

namespace fp4moe::tools {

void register_version_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("version", "print the version, commit and build options");
  cmd->callback([] {
#ifdef FP4MOE_HAVE_CUDA
    const char* cuda = "yes (sm_90a)";
#else
    const char* cuda = "no";
#endif
    fmt::print("fp4moe {} (commit {}), CUDA kernels: {}\n", FP4MOE_VERSION, FP4MOE_GIT_COMMIT, cuda);
  });
}

}  // namespace fp4moe::tools
