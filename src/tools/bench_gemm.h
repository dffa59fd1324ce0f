// `fp4moe bench gemm`: sm90_nvfp4_w4a16_grouped_gemm against cuBLAS BF16 on MoE expert GEMMs.
// add_bench_gemm_command adds the `gemm` subcommand to a `bench` parent command (the parent is
// created by cmd_bench.cpp). Tested by tests/tune/test_cmd_tune.cpp (BenchGemmCli.*).
#pragma once

namespace CLI {
class App;
}

namespace fp4moe::tools {

void add_bench_gemm_command(CLI::App& bench);

}  // namespace fp4moe::tools
