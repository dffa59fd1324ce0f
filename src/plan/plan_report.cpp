// Text, JSON and blocklist reports of plans (see plan_report.h). Tested by
// tests/plan/test_report.cpp and tests/tools/test_cmd_plan.cpp.
#include "plan/plan_report.h"

#include <fmt/format.h>

#include <algorithm>
#include <sstream>

#include "core/error.h"

namespace fp4moe::plan {
namespace {

using nlohmann::json;

const char* gemm_key(const std::string& name) {
  if (name.rfind("gemm1", 0) == 0) return "gemm1";
  if (name.rfind("gemm2", 0) == 0) return "gemm2";
  return "gemm";
}

json candidate_json(const TileCandidate& c, const SmemCheck& s, bool gemm2) {
  json j;
  j["tile"] = c.to_string();
  j["m"] = c.tile_m();
  j["n"] = c.tile_n();
  j["k"] = c.tile_k();
  j["swap_ab"] = c.swap_ab();
  j["epilogue"] = c.family == KernelFamily::kSm90W4A16 ? json(nullptr) : json(fusion_name(c.cutlass.epilogue));
  j["stages"] = s.stages;
  j["bytes"] = s.bytes;
  j["limit"] = s.limit;
  j["fits"] = s.fits;
  j["margin"] = s.margin();
  j["summary"] = s.summary;
  j["rule"] = s.rule.empty() ? json(nullptr) : json(s.rule);
  j["reason"] = s.reason.empty() ? json(nullptr) : json(s.reason);
  j["builder_note"] = s.builder_note.empty() ? json(nullptr) : json(s.builder_note);
  json breakdown = json::array();
  for (const BreakdownItem& b : s.breakdown) breakdown.push_back({{"name", b.name}, {"bytes", b.bytes}});
  j["breakdown"] = breakdown;
  const int tactic = flashinfer_tactic(c, gemm2);
  j["flashinfer_tactic"] = tactic < 0 ? json(nullptr) : json(tactic);
  return j;
}

std::string yes_no(bool b) { return b ? "yes" : "NO"; }

}  // namespace

PlanReport make_report(const Problem& problem, const std::vector<int64_t>& tokens, const ResolvedGpu& gpu,
                       const PlanOptions& options) {
  PlanReport r;
  r.gpu = gpu;
  r.family = options.family.value_or(default_family(gpu.spec));
  r.rules = options.rules;
  r.problem = problem;
  r.tokens = tokens;
  PlanOptions opts = options;
  opts.family = r.family;
  std::vector<std::pair<std::string, bool>> kinds;
  if (problem.kind == Problem::Kind::kMoe) {
    kinds = {{"gemm1 (gate+up)", false}, {"gemm2 (down)", true}};
  } else {
    kinds = {{"gemm", false}};
  }
  for (const auto& [name, finalize] : kinds) {
    PlanReport::Feasibility f;
    f.gemm = name;
    f.finalize = finalize;
    for (const TileCandidate& c : family_candidates(r.family, finalize)) {
      const SmemCheck check = check_smem(c, gpu.spec, opts.rules);
      f.order.push_back(c);
      f.checks.push_back(check);
      if (check.fits) f.fits.push_back(CandidateResult{c, check, {}});
      else f.rejected.push_back(make_rejection(c, check, gpu.spec));
    }
    r.feasibility.push_back(std::move(f));
  }
  if (!tokens.empty() || problem.kind == Problem::Kind::kGemm) r.plans = plan(problem, tokens, gpu.spec, opts);
  return r;
}

std::string format_gpu(const ResolvedGpu& g) {
  const GpuSpec& s = g.spec;
  std::string out = fmt::format("GPU {} ({}, {}): {} SMs, SMEM {} B per SM, opt-in {} B per block, reserved {} B; {}\n",
                                s.name, s.product, s.sm_name(), s.n_sms, s.smem_per_sm, s.smem_optin_per_block,
                                s.smem_reserved_per_block, s.features_string());
  out += fmt::format("  source: {}{}\n", s.source, g.from_runtime ? " (overridden by the CUDA runtime)" : "");
  for (const std::string& d : g.disagreements) out += fmt::format("  runtime disagrees with the table: {}\n", d);
  return out;
}

std::string format_feasibility(const PlanReport& r) {
  std::string out;
  for (const PlanReport::Feasibility& f : r.feasibility) {
    out += fmt::format("\n{} — {} on {} ({}, opt-in {} B){}\n", f.gemm, family_name(r.family), r.gpu.spec.name,
                       r.gpu.spec.sm_name(), r.gpu.spec.smem_optin_per_block,
                       r.family == KernelFamily::kSm90W4A16 ? "" : fmt::format(", {}", r.rules.name));
    out += fmt::format("  {:<34} {:>6} {:>8} {:>5} {:>7}  {}\n", "tile", "stages", "bytes", "fits", "margin", "reason");
    for (size_t i = 0; i < f.order.size(); ++i) {
      const SmemCheck& s = f.checks[i];
      std::string reason = s.rule.empty() ? "" : s.rule + ": " + s.reason;
      out += fmt::format("  {:<34} {:>6} {:>8} {:>5} {:>7}  {}\n", f.order[i].to_string(), s.stages, s.bytes, yes_no(s.fits),
                         s.margin(), reason);
    }
  }
  return out;
}

std::string format_rejections(const PlanReport& r) {
  std::string out;
  std::vector<std::string> seen;
  for (const PlanReport::Feasibility& f : r.feasibility) {
    for (const Rejection& rej : f.rejected) {
      if (std::find(seen.begin(), seen.end(), rej.message) != seen.end()) continue;
      seen.push_back(rej.message);
      out += fmt::format("  [{}] {}\n", rej.rule, rej.message);
      if (!rej.note.empty()) out += fmt::format("      {}\n", rej.note);
    }
  }
  if (out.empty()) return "\nEvery candidate fits.\n";
  return "\nWhy the rejected candidates do not run:\n" + out;
}

std::string format_plans(const PlanReport& r) {
  if (r.plans.empty()) return "";
  std::string out = fmt::format("\nPlans (cost model: docs/planner.md; est = roofline estimate per GEMM):\n");
  out += fmt::format("  {:>6} {:<16} {:>7} {:>9} {:<34} {:>6} {:>8} {:>9} {:<9} {:>6}  {}\n", "tokens", "gemm", "experts",
                     "tok/exp", "chosen", "stages", "bytes", "est_us", "bound", "waste", "runner-up");
  for (const GemmPlan& p : r.plans) {
    if (!p.chosen) {
      out += fmt::format("  {:>6} {:<16} {:>7} {:>9.2f} nothing fits — {}\n", p.problem.total_tokens, p.problem.name,
                         p.problem.n_groups, p.problem.m, p.error);
      continue;
    }
    const CandidateResult& c = *p.chosen;
    const std::string runner_up =
        p.ranked.size() > 1 ? fmt::format("{} ({:.1f} us)", p.ranked[1].candidate.to_string(), p.ranked[1].cost.time_us) : "-";
    out += fmt::format("  {:>6} {:<16} {:>7} {:>9.2f} {:<34} {:>6} {:>8} {:>9.1f} {:<9} {:>5.0f}%  {}\n", p.problem.total_tokens,
                       p.problem.name, p.problem.n_groups, p.problem.m, c.candidate.to_string(), c.smem.stages, c.smem.bytes,
                       c.cost.time_us, c.cost.bound, 100.0 * c.cost.padding_waste, runner_up);
  }
  return out;
}

std::string format_report(const PlanReport& r) {
  return format_gpu(r.gpu) + fmt::format("Problem {}\n", r.problem.to_string()) + format_feasibility(r) + format_rejections(r) +
         format_plans(r);
}

json report_json(const PlanReport& r) {
  json j;
  j["schema"] = "fp4moe.plan.v1";
  const GpuSpec& g = r.gpu.spec;
  json features = json::array();
  for (auto [f, n] : {std::pair{kMmaSync, "mma.sync"}, {kWgmma, "wgmma"}, {kTcgen05, "tcgen05"},
                      {kBlockScaledFp4, "block-scaled-fp4"}, {kTma, "tma"}, {kFp8, "fp8"}}) {
    if (g.has(f)) features.push_back(n);
  }
  j["gpu"] = {{"name", g.name},
              {"product", g.product},
              {"sm", g.sm},
              {"smem_per_sm", g.smem_per_sm},
              {"smem_optin_per_block", g.smem_optin_per_block},
              {"smem_reserved_per_block", g.smem_reserved_per_block},
              {"n_sms", g.n_sms},
              {"features", features},
              {"source", g.source},
              {"from_runtime", r.gpu.from_runtime},
              {"disagreements", r.gpu.disagreements}};
  j["kernel"] = family_name(r.family);
  j["cutlass_rules"] = r.family == KernelFamily::kSm90W4A16 ? json(nullptr) : json(r.rules.name);
  j["problem"] = r.problem.to_string();
  j["tokens"] = r.tokens;
  json candidates = json::array();
  for (const PlanReport::Feasibility& f : r.feasibility) {
    for (size_t i = 0; i < f.order.size(); ++i) {
      json c = candidate_json(f.order[i], f.checks[i], f.finalize);
      c["gemm"] = gemm_key(f.gemm);
      std::string message;
      if (!f.checks[i].fits) message = make_rejection(f.order[i], f.checks[i], g).message;
      c["message"] = message.empty() ? json(nullptr) : json(message);
      candidates.push_back(c);
    }
  }
  j["candidates"] = candidates;
  json plans = json::array();
  for (const GemmPlan& p : r.plans) {
    json pj;
    pj["gemm"] = gemm_key(p.problem.name);
    pj["tokens"] = p.problem.total_tokens;
    pj["groups"] = p.problem.n_groups;
    pj["tokens_per_group"] = p.problem.m;
    pj["n"] = p.problem.n;
    pj["k"] = p.problem.k;
    if (p.chosen) {
      const CandidateResult& c = *p.chosen;
      pj["chosen"] = {{"tile", c.candidate.to_string()}, {"stages", c.smem.stages},     {"bytes", c.smem.bytes},
                      {"est_us", c.cost.time_us},        {"bound", c.cost.bound},       {"padding_waste", c.cost.padding_waste},
                      {"waves", c.cost.waves},           {"tiles", c.cost.tiles}};
    } else {
      pj["chosen"] = nullptr;
    }
    json ranked = json::array();
    for (const CandidateResult& c : p.ranked) ranked.push_back({{"tile", c.candidate.to_string()}, {"est_us", c.cost.time_us}});
    pj["ranked"] = ranked;
    pj["error"] = p.error.empty() ? json(nullptr) : json(p.error);
    plans.push_back(pj);
  }
  j["plans"] = plans;
  return j;
}

std::vector<std::string> validate_report_json(const json& j) {
  std::vector<std::string> problems;
  auto type_name = [](const json& v) { return std::string(v.type_name()); };
  // expect(obj, key, kind, path): kind is one of "string", "integer", "number", "boolean",
  // "array", "object", with "?" suffix allowing null.
  auto expect = [&](const json& obj, const std::string& key, std::string kind, const std::string& path) {
    const bool nullable = !kind.empty() && kind.back() == '?';
    if (nullable) kind.pop_back();
    if (!obj.is_object() || !obj.contains(key)) {
      problems.push_back(path + key + ": missing");
      return;
    }
    const json& v = obj.at(key);
    if (nullable && v.is_null()) return;
    const bool ok = (kind == "string" && v.is_string()) || (kind == "integer" && v.is_number_integer()) ||
                    (kind == "number" && v.is_number()) || (kind == "boolean" && v.is_boolean()) ||
                    (kind == "array" && v.is_array()) || (kind == "object" && v.is_object());
    if (!ok) problems.push_back(path + key + ": expected " + kind + ", got " + type_name(v));
  };
  if (!j.is_object()) return {"document: expected object, got " + type_name(j)};
  expect(j, "schema", "string", "");
  if (j.contains("schema") && j["schema"].is_string() && j["schema"] != "fp4moe.plan.v1") {
    problems.push_back("schema: expected \"fp4moe.plan.v1\", got " + j["schema"].dump());
  }
  expect(j, "gpu", "object", "");
  if (j.contains("gpu") && j["gpu"].is_object()) {
    const json& g = j["gpu"];
    for (const char* k : {"name", "product", "source"}) expect(g, k, "string", "gpu.");
    for (const char* k : {"sm", "smem_per_sm", "smem_optin_per_block", "smem_reserved_per_block", "n_sms"}) expect(g, k, "integer", "gpu.");
    expect(g, "features", "array", "gpu.");
    expect(g, "from_runtime", "boolean", "gpu.");
    expect(g, "disagreements", "array", "gpu.");
  }
  expect(j, "kernel", "string", "");
  expect(j, "cutlass_rules", "string?", "");
  expect(j, "problem", "string", "");
  expect(j, "tokens", "array", "");
  expect(j, "candidates", "array", "");
  if (j.contains("candidates") && j["candidates"].is_array()) {
    for (size_t i = 0; i < j["candidates"].size(); ++i) {
      const json& c = j["candidates"][i];
      const std::string p = "candidates[" + std::to_string(i) + "].";
      for (const char* k : {"gemm", "tile", "summary"}) expect(c, k, "string", p);
      for (const char* k : {"m", "n", "k", "stages", "bytes", "limit", "margin"}) expect(c, k, "integer", p);
      for (const char* k : {"swap_ab", "fits"}) expect(c, k, "boolean", p);
      for (const char* k : {"epilogue", "rule", "reason", "builder_note", "message"}) expect(c, k, "string?", p);
      expect(c, "flashinfer_tactic", "integer?", p);
      expect(c, "breakdown", "array", p);
      if (c.contains("breakdown") && c["breakdown"].is_array()) {
        int64_t sum = 0;
        for (size_t b = 0; b < c["breakdown"].size(); ++b) {
          const std::string bp = p + "breakdown[" + std::to_string(b) + "].";
          expect(c["breakdown"][b], "name", "string", bp);
          expect(c["breakdown"][b], "bytes", "integer", bp);
          if (c["breakdown"][b].contains("bytes") && c["breakdown"][b]["bytes"].is_number_integer()) sum += c["breakdown"][b]["bytes"].get<int64_t>();
        }
        if (c.contains("bytes") && c["bytes"].is_number_integer() && !c["breakdown"].empty() && sum != c["bytes"].get<int64_t>()) {
          problems.push_back(p + "breakdown: sums to " + std::to_string(sum) + ", bytes is " + c["bytes"].dump());
        }
      }
      if (c.contains("fits") && c["fits"].is_boolean() && !c["fits"].get<bool>() && c.contains("message") && c["message"].is_null()) {
        problems.push_back(p + "message: a candidate that does not fit must carry a message");
      }
    }
  }
  expect(j, "plans", "array", "");
  if (j.contains("plans") && j["plans"].is_array()) {
    for (size_t i = 0; i < j["plans"].size(); ++i) {
      const json& pl = j["plans"][i];
      const std::string p = "plans[" + std::to_string(i) + "].";
      expect(pl, "gemm", "string", p);
      for (const char* k : {"tokens", "groups", "n", "k"}) expect(pl, k, "integer", p);
      expect(pl, "tokens_per_group", "number", p);
      expect(pl, "chosen", "object?", p);
      expect(pl, "ranked", "array", p);
      expect(pl, "error", "string?", p);
      if (pl.contains("chosen") && pl["chosen"].is_object()) {
        const json& c = pl["chosen"];
        const std::string cp = p + "chosen.";
        for (const char* k : {"tile", "bound"}) expect(c, k, "string", cp);
        for (const char* k : {"stages", "bytes", "waves", "tiles"}) expect(c, k, "integer", cp);
        for (const char* k : {"est_us", "padding_waste"}) expect(c, k, "number", cp);
      }
      if (pl.contains("chosen") && pl["chosen"].is_null() && pl.contains("error") && pl["error"].is_null()) {
        problems.push_back(p + "error: a plan without a chosen tile must carry an error");
      }
    }
  }
  return problems;
}

Blocklist flashinfer_blocklist(const PlanReport& r) {
  FP4MOE_CHECK(r.family == KernelFamily::kCutlassSm120)
      << "--emit-blocklist covers FlashInfer's SM120 CUTLASS MoE tactics (--kernel cutlass-sm120-moe); got "
      << family_name(r.family);
  Blocklist b;
  // GEMM1 and GEMM2 tactics, whatever the problem kind: FlashInfer numbers both stages.
  for (bool gemm2 : {false, true}) {
    for (const TileCandidate& c : family_candidates(r.family, gemm2)) {
      const SmemCheck s = check_smem(c, r.gpu.spec, r.rules);
      if (s.fits) continue;
      b.tactics.push_back(flashinfer_tactic(c, gemm2));
      b.reasons.push_back(std::string(gemm2 ? "gemm2 " : "gemm1 ") + make_rejection(c, s, r.gpu.spec).message);
    }
  }
  return b;
}

std::string format_blocklist(const Blocklist& b) {
  std::string out =
      "# FlashInfer SM120 CUTLASS MoE tactics that fail on this GPU (GEMM1 tactics 0-19, GEMM2 20-59;\n"
      "# tile order per docs/planner.md, \"FlashInfer tactic numbers\").\n";
  for (size_t i = 0; i < b.tactics.size(); ++i) out += fmt::format("# {:>2}: {}\n", b.tactics[i], b.reasons[i]);
  std::string list;
  for (size_t i = 0; i < b.tactics.size(); ++i) {
    if (i != 0) list += ',';
    list += std::to_string(b.tactics[i]);
  }
  out += "FLASHINFER_TACTICS_BLOCKLIST=" + list + "\n";
  return out;
}

}  // namespace fp4moe::plan
