// placeholder: `fp4moe plan` is being written.
#include "tools/commands.h"

namespace fp4moe::tools {

void register_plan_command(CLI::App&) {}

}  // namespace fp4moe::tools
