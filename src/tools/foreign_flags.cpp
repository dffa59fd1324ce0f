#include "tools/foreign_flags.h"

#include <array>

namespace fp4moe::tools {

namespace {

struct Hint {
  std::string_view command;  // "" for any command
  std::string_view flag;
  std::string_view hint;
};

constexpr std::string_view kKernels =
    "fp4moe has one kernel set, planned per shape and GPU (fp4moe plan; fp4moe tune picks among the feasible configs)";
constexpr std::string_view kDataParallel =
    "data parallelism: run one fp4moe serve per GPU (or --tp-size group) behind a load balancer";

constexpr std::array kHints = {
    Hint{"fp4moe serve", "--max-num-batched-tokens",
         "vLLM's per-step token budget; here --chunked-prefill-size (prompt tokens a step over all requests) and "
         "--max-prefill-tokens"},
    Hint{"fp4moe serve", "--cuda-graph-bs",
         "SGLang's list of captured batch sizes; here --cuda-graph-max-bs N captures the padded sizes up to N on "
         "first use"},
    Hint{"fp4moe serve", "--dp", kDataParallel},
    Hint{"fp4moe serve", "--dp-size", kDataParallel},
    Hint{"fp4moe serve", "--data-parallel-size", kDataParallel},
    Hint{"fp4moe serve", "--pp-size",
         "pipeline parallelism is not implemented (--tp-size, --ep-size: docs/parallel.md)"},
    Hint{"fp4moe serve", "--pipeline-parallel-size",
         "pipeline parallelism is not implemented (--tp-size, --ep-size: docs/parallel.md)"},
    Hint{"", "--attention-backend", kKernels},
    Hint{"", "--moe-runner-backend", kKernels},
    Hint{"", "--fp4-gemm-backend", kKernels},
    Hint{"", "--sampling-backend", kKernels},
    Hint{"fp4moe serve", "--speculative-algorithm", "speculative decoding is not implemented"},
    Hint{"fp4moe serve", "--speculative-config", "speculative decoding is not implemented"},
    Hint{"fp4moe serve", "--enable-log-requests", "here --log-requests (SGLang's)"},
    Hint{"fp4moe serve", "--no-enable-chunked-prefill", "--chunked-prefill-size 0 turns chunked prefill off"},
    Hint{"fp4moe serve", "--enable-expert-parallel", "here --ep-size N spreads the routed experts over N ranks"},
    Hint{"fp4moe serve", "--enable-lora", "LoRA adapters are not supported"},
    Hint{"fp4moe serve", "--lora-paths", "LoRA adapters are not supported"},
};

}  // namespace

std::optional<std::string> foreign_flag_hint(std::string_view command, std::string_view flag) {
  for (const Hint& h : kHints) {
    if (h.flag == flag && (h.command.empty() || h.command == command)) return std::string(h.hint);
  }
  return std::nullopt;
}

}  // namespace fp4moe::tools
