// The planner: plan(problem, gpu) -> {chosen, ranked, rejected} for each GEMM of the problem.
// Pure (no GPU, no I/O except the FP4MOE_LOG_PLANS=1 log line), unit-tested on the CPU.
//
//   auto plans = fp4moe::plan::plan(fp4moe::plan::parse_problem("moe:E=256,topk=8,H=6144,I=2048"),
//                                   {1, 16, 4096}, fp4moe::plan::require_gpu("h200"), {});
//   plans[0].chosen->candidate.to_string();   // "w4a16_swapab_m128n8k256_s4"
//
// A rejection is a value: rule, bytes needed, limit, per-region breakdown and a complete message
//   "128x256x128 FINALIZE swap_ab=0: 3 stages x 27648 + epilogue 17408 + overhead 2048 = 102400 B
//    > 101376 B opt-in (sm_120) by 1024 B".
// When nothing fits, GemmPlan::error lists every candidate's shortfall, nearest first, and
// require_chosen() throws it as fp4moe::Error. Tested by tests/plan/test_planner.cpp.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "plan/cost_model.h"
#include "plan/gpu_table.h"
#include "plan/kernel_families.h"

namespace fp4moe::plan {

// A MoE layer (E experts, top-k, hidden H, expert intermediate I) or a single GEMM (M x N x K).
struct Problem {
  enum class Kind { kMoe, kGemm } kind = Kind::kMoe;
  int64_t n_experts = 0, top_k = 0, hidden = 0, intermediate = 0;  // MoE
  int64_t m = 0, n = 0, k = 0;                                      // GEMM
  std::string to_string() const;  // "moe:E=256,topk=8,H=6144,I=2048" / "gemm:M=..,N=..,K=.."
};

// Parses "moe:E=256,topk=8,H=6144,I=2048" or "gemm:M=128,N=4096,K=6144"; throws fp4moe::Error
// naming the bad field. Then check_problem.
Problem parse_problem(std::string_view text);
// Fails, naming `what` (the problem text or the model's config.json) and the numbers, unless the kernel can run the
// shape: every K (a MoE's H and I, a GEMM's K) a multiple of the NVFP4 block (16), every N a multiple of 8 (the
// W4A16 kernel's rules, plan::w4a16_k_refusal / w4a16_n_refusal), E <= 65536 and H, I, M, N, K <= 2^24 (so the cost
// model's tile counts fit 64 bits).
void check_problem(const Problem& p, std::string_view what);
// Parses "1,16,64" into counts (each >= 1); errors name `option` (the flag it came from) and the list.
std::vector<int64_t> parse_token_list(std::string_view text, std::string_view option = "--tokens");

// Expected number of experts that receive at least one of `tokens` tokens under uniform top-k
// routing: E x (1 - (1 - k/E)^tokens).
double expected_active_experts(int64_t n_experts, int64_t top_k, int64_t tokens);

// The GEMMs of a problem at a token count: a MoE gives gemm1 (gate+up: N = 2I, K = H) and gemm2
// (down: N = H, K = I, FINALIZE), over the expected active experts with their mean token count.
// A GEMM problem gives itself (M taken from `tokens` when tokens > 0).
std::vector<GemmProblem> gemms_of(const Problem& p, int64_t tokens);

struct PlanOptions {
  std::optional<KernelFamily> family;  // nullopt: default_family(gpu)
  CutlassRules rules = kCutlassB46b16d;
};

struct CandidateResult {
  TileCandidate candidate;
  SmemCheck smem;
  CostEstimate cost;
};

struct Rejection {
  TileCandidate candidate;
  std::string rule;      // "smem-opt-in", "builder-overflow", "builder-min-stages", "arch", "tile", "dispatch"
  uint32_t bytes_needed = 0;
  uint32_t limit = 0;
  std::vector<BreakdownItem> breakdown;
  std::string message;   // complete, with numbers
  std::string note;      // e.g. the CUTLASS builder's budget
  // Bytes over the limit; 0 when the rule is not about bytes (arch, tile, dispatch).
  int64_t shortfall() const { return bytes_needed > limit ? static_cast<int64_t>(bytes_needed) - limit : 0; }
  bool is_smem() const { return rule == "smem-opt-in" || rule == "builder-overflow" || rule == "builder-min-stages"; }
};

struct GemmPlan {
  GemmProblem problem;
  KernelFamily family = KernelFamily::kSm90W4A16;
  std::string gpu;                        // GpuSpec::name
  std::optional<CandidateResult> chosen;  // ranked.front()
  std::vector<CandidateResult> ranked;    // feasible, best first
  std::vector<Rejection> rejected;        // in candidate order
  std::string error;                      // set when nothing fits
};

// Plans one GEMM.
GemmPlan plan_gemm(const GemmProblem& problem, const GpuSpec& gpu, const PlanOptions& options);
// Plans every GEMM of `problem` at each token count (a GEMM problem with empty `tokens` uses its M).
std::vector<GemmPlan> plan(const Problem& problem, const std::vector<int64_t>& tokens, const GpuSpec& gpu,
                           const PlanOptions& options);

// The rejection of a candidate that does not run (check.fits == false).
Rejection make_rejection(const TileCandidate& c, const SmemCheck& check, const GpuSpec& gpu);
// "no <family> tile fits ..." with every rejection, nearest shortfall first.
std::string nothing_fits_message(const GemmPlan& p, const GpuSpec& gpu);
// The chosen candidate, or throws fp4moe::Error with GemmPlan::error.
const CandidateResult& require_chosen(const GemmPlan& p);

}  // namespace fp4moe::plan
