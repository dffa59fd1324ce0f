// Reports of plans: the text tables `fp4moe plan` prints, the JSON document of `--json` (schema
// "fp4moe.plan.v1", documented in docs/planner.md) with its structural validator, and the
// FlashInfer tactic blocklist of `--emit-blocklist`. Tested by tests/plan/test_report.cpp.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "plan/gpu_table.h"
#include "plan/planner.h"

namespace fp4moe::plan {

// What one `fp4moe plan` run covers.
struct PlanReport {
  ResolvedGpu gpu;
  KernelFamily family = KernelFamily::kSm90W4A16;
  CutlassRules rules = kCutlassB46b16d;
  Problem problem;
  std::vector<int64_t> tokens;        // empty: SMEM feasibility only
  std::vector<GemmPlan> plans;        // one per (token count, GEMM); empty without tokens
  // Token-independent feasibility of every candidate, per GEMM kind ("gemm1 (gate+up)", ...).
  struct Feasibility {
    std::string gemm;
    bool finalize = false;
    std::vector<CandidateResult> fits;  // cost unset
    std::vector<Rejection> rejected;
    std::vector<TileCandidate> order;   // all candidates in list order
    std::vector<SmemCheck> checks;      // parallel to order
  };
  std::vector<Feasibility> feasibility;
};

// Runs the planner for the report (feasibility for each GEMM kind, plans for each token count).
PlanReport make_report(const Problem& problem, const std::vector<int64_t>& tokens, const ResolvedGpu& gpu,
                       const PlanOptions& options);

std::string format_gpu(const ResolvedGpu& gpu);
std::string format_feasibility(const PlanReport& r);
std::string format_rejections(const PlanReport& r);
std::string format_plans(const PlanReport& r);
std::string format_report(const PlanReport& r);  // all of the above

nlohmann::json report_json(const PlanReport& r);
// Structural check of a report document against schema fp4moe.plan.v1: every problem found
// ("plans[2].chosen.stages: expected integer, got string"); empty when valid.
std::vector<std::string> validate_report_json(const nlohmann::json& j);

// FlashInfer tactic indices that fail on the report's GPU (SM120 family only; throws
// fp4moe::Error for other families), with a comment line per tactic.
struct Blocklist {
  std::vector<int> tactics;
  std::vector<std::string> reasons;  // parallel to tactics
};
Blocklist flashinfer_blocklist(const PlanReport& r);
std::string format_blocklist(const Blocklist& b);

}  // namespace fp4moe::plan
