// `fp4moe version`: the build's version, commit and CUDA support, and whether a usable GPU is
// visible (with the reason when not: scripts/test.sh prints it so that skipped GPU tests say why).
#include <CLI/CLI.hpp>
#include <fmt/core.h>

#include <string>

#include "fp4moe_git_commit.h"  // FP4MOE_GIT_COMMIT, generated at build time (cmake/git_commit.cmake)
#include "tools/commands.h"

#ifdef FP4MOE_HAVE_CUDA
#include "kernels/cuda/device.h"
#endif

namespace fp4moe::tools {

namespace {

std::string version_line() {
#ifdef FP4MOE_HAVE_CUDA
  const char* cuda = "yes (sm_90a)";
#else
  const char* cuda = "no";
#endif
  return fmt::format("fp4moe {} (commit {}), CUDA kernels: {}", FP4MOE_VERSION, FP4MOE_GIT_COMMIT, cuda);
}

}  // namespace

void register_version_command(CLI::App& app) {
  app.set_version_flag("--version", version_line(),
                       "Print the version and exit (`fp4moe version` also says which GPU)");
  auto* cmd = app.add_subcommand("version", "print the version, commit and build options");
  cmd->callback([] {
    fmt::print("{}\n", version_line());
#ifdef FP4MOE_HAVE_CUDA
    std::string why;
    if (cuda::cuda_device_available(&why)) {
      fmt::print("GPU: {}\n", cuda::cuda_device_description(0));
    } else {
      fmt::print("GPU: none usable ({}); tests labelled gpu skip\n", why);
    }
#else
    fmt::print("GPU: not built with CUDA; tests labelled gpu are not built\n");
#endif
  });
}

}  // namespace fp4moe::tools
