// `fp4moe bench gemm|moe`: kernel-level benchmarks on the GPU against their peers measured in the
// same run (bench gemm: the NVFP4 W4A16 grouped GEMM vs cuBLAS BF16, tools/bench_gemm.h; bench moe:
// the fused NVFP4 MoE layer vs a BF16 cuBLAS MoE layer, tools/bench_moe.h). This file only creates
// the `bench` parent; each subcommand registers itself. Tested by tests/tools/test_bench_*.cpp.
#include <CLI/CLI.hpp>

#include "tools/bench_gemm.h"
#include "tools/bench_moe.h"
#include "tools/commands.h"

namespace fp4moe::tools {

void register_bench_command(CLI::App& app) {
  auto* bench = app.add_subcommand("bench", "GPU kernel benchmarks against cuBLAS BF16 peers (gemm, moe)");
  bench->require_subcommand(1);
  add_bench_gemm_command(*bench);
  add_bench_moe_command(*bench);
}

}  // namespace fp4moe::tools
