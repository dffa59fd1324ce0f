// placeholder: `fp4moe inspect` is being written.
#include "tools/commands.h"

namespace fp4moe::tools {

void register_inspect_command(CLI::App&) {}

}  // namespace fp4moe::tools
