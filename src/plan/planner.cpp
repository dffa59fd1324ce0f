// The planner (see planner.h). Tested by tests/plan/test_planner.cpp.
#include "plan/planner.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <set>
#include <sstream>
#include <string>
#include <utility>

#include "core/error.h"
#include "plan/w4a16_smem.h"

namespace fp4moe::plan {
namespace {

int64_t parse_int(std::string_view key, std::string_view value, std::string_view whole) {
  int64_t v = 0;
  FP4MOE_CHECK(!value.empty()) << "problem '" << whole << "': " << key << " has no value";
  for (char c : value) {
    FP4MOE_CHECK(c >= '0' && c <= '9') << "problem '" << whole << "': " << key << "=" << value << " is not a positive integer";
    v = v * 10 + (c - '0');
    FP4MOE_CHECK(v <= (int64_t{1} << 40)) << "problem '" << whole << "': " << key << "=" << value << " is too large";
  }
  FP4MOE_CHECK(v > 0) << "problem '" << whole << "': " << key << "=" << value << " must be >= 1";
  return v;
}

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

void log_plan_once(const GemmPlan& p) {
  static const bool enabled = [] {
    const char* v = std::getenv("FP4MOE_LOG_PLANS");
    return v != nullptr && std::string(v) == "1";
  }();
  if (!enabled) return;
  static std::mutex mu;
  static std::set<std::string> seen;
  std::ostringstream key;
  key << p.gpu << '|' << family_name(p.family) << '|' << p.problem.name << '|' << p.problem.n_groups << '|'
      << std::ceil(p.problem.m) << '|' << p.problem.n << '|' << p.problem.k;
  std::lock_guard<std::mutex> lock(mu);
  if (!seen.insert(key.str()).second) return;
  std::ostringstream line;
  line << "fp4moe plan: " << p.gpu << " " << family_name(p.family) << " " << p.problem.name << " groups=" << p.problem.n_groups
       << " m=" << std::ceil(p.problem.m) << " n=" << p.problem.n << " k=" << p.problem.k << ": ";
  if (p.chosen) {
    line << p.chosen->candidate.to_string() << " " << p.chosen->smem.stages << " stages " << p.chosen->smem.bytes << " B, est "
         << p.chosen->cost.time_us << " us";
  } else {
    line << "nothing fits";
  }
  std::fprintf(stderr, "%s\n", line.str().c_str());
}

}  // namespace

std::string Problem::to_string() const {
  std::ostringstream os;
  if (kind == Kind::kMoe) {
    os << "moe:E=" << n_experts << ",topk=" << top_k << ",H=" << hidden << ",I=" << intermediate;
  } else {
    os << "gemm:M=" << m << ",N=" << n << ",K=" << k;
  }
  return os.str();
}

Problem parse_problem(std::string_view text) {
  Problem p;
  const size_t colon = text.find(':');
  FP4MOE_CHECK(colon != std::string_view::npos)
      << "problem '" << text << "' must look like moe:E=256,topk=8,H=6144,I=2048 or gemm:M=128,N=4096,K=6144";
  const std::string kind = lower(text.substr(0, colon));
  FP4MOE_CHECK(kind == "moe" || kind == "gemm") << "problem '" << text << "': kind '" << kind << "' is not moe or gemm";
  p.kind = kind == "moe" ? Problem::Kind::kMoe : Problem::Kind::kGemm;
  std::string_view rest = text.substr(colon + 1);
  std::set<std::string> seen;
  while (!rest.empty()) {
    const size_t comma = rest.find(',');
    const std::string_view item = rest.substr(0, comma);
    rest = comma == std::string_view::npos ? std::string_view{} : rest.substr(comma + 1);
    const size_t eq = item.find('=');
    FP4MOE_CHECK(eq != std::string_view::npos) << "problem '" << text << "': '" << item << "' is not KEY=VALUE";
    const std::string key = lower(item.substr(0, eq));
    const int64_t v = parse_int(key, item.substr(eq + 1), text);
    FP4MOE_CHECK(seen.insert(key).second) << "problem '" << text << "': " << key << " given twice";
    if (p.kind == Problem::Kind::kMoe) {
      if (key == "e") p.n_experts = v;
      else if (key == "topk" || key == "k") p.top_k = v;
      else if (key == "h") p.hidden = v;
      else if (key == "i") p.intermediate = v;
      else FP4MOE_FAIL() << "problem '" << text << "': unknown MoE field '" << key << "' (expected E, topk, H, I)";
    } else {
      if (key == "m") p.m = v;
      else if (key == "n") p.n = v;
      else if (key == "k") p.k = v;
      else FP4MOE_FAIL() << "problem '" << text << "': unknown GEMM field '" << key << "' (expected M, N, K)";
    }
  }
  check_problem(p, "problem '" + std::string(text) + "'");
  return p;
}

void check_problem(const Problem& p, std::string_view what) {
  constexpr int64_t kMaxDim = int64_t{1} << 24, kMaxExperts = int64_t{1} << 16;
  if (p.kind == Problem::Kind::kMoe) {
    FP4MOE_CHECK(p.n_experts > 0 && p.top_k > 0 && p.hidden > 0 && p.intermediate > 0)
        << what << ": a MoE needs E, topk, H and I (got E=" << p.n_experts << " topk=" << p.top_k
        << " H=" << p.hidden << " I=" << p.intermediate << ")";
    FP4MOE_CHECK(p.top_k <= p.n_experts) << what << ": topk=" << p.top_k << " > E=" << p.n_experts;
    FP4MOE_CHECK(p.n_experts <= kMaxExperts && p.hidden <= kMaxDim && p.intermediate <= kMaxDim)
        << what << ": E=" << p.n_experts << ", H=" << p.hidden << ", I=" << p.intermediate << " is past E <= "
        << kMaxExperts << ", H, I <= " << kMaxDim;
    // H is the gate_up GEMM's K (and the down GEMM's N), I the down GEMM's K (2 I the gate_up GEMM's N).
    for (const auto& [name, k] : {std::pair{"H", p.hidden}, std::pair{"I", p.intermediate}}) {
      const std::string refusal = w4a16_k_refusal(k);
      FP4MOE_CHECK(refusal.empty()) << what << ": " << name << " (a K of the MoE GEMMs): " << refusal;
    }
  } else {
    FP4MOE_CHECK(p.n > 0 && p.k > 0) << what << ": a GEMM needs N and K (got N=" << p.n << " K=" << p.k << ")";
    FP4MOE_CHECK(p.m <= kMaxDim && p.n <= kMaxDim && p.k <= kMaxDim)
        << what << ": M=" << p.m << ", N=" << p.n << ", K=" << p.k << " is past " << kMaxDim;
    for (const std::string& refusal : {w4a16_k_refusal(p.k), w4a16_n_refusal(p.n)}) {
      FP4MOE_CHECK(refusal.empty()) << what << ": " << refusal;
    }
  }
}

std::vector<int64_t> parse_token_list(std::string_view text, std::string_view option) {
  std::vector<int64_t> out;
  std::string_view rest = text;
  while (!rest.empty()) {
    const size_t comma = rest.find(',');
    const std::string_view value = rest.substr(0, comma);
    int64_t v = 0;
    FP4MOE_CHECK(!value.empty()) << option << " '" << text << "': an entry is empty";
    for (char c : value) {
      FP4MOE_CHECK(c >= '0' && c <= '9') << option << " '" << text << "': " << value << " is not a positive integer";
      v = v * 10 + (c - '0');
      FP4MOE_CHECK(v <= (int64_t{1} << 40)) << option << " '" << text << "': " << value << " is too large";
    }
    FP4MOE_CHECK(v > 0) << option << " '" << text << "': " << value << " must be >= 1";
    out.push_back(v);
    rest = comma == std::string_view::npos ? std::string_view{} : rest.substr(comma + 1);
  }
  FP4MOE_CHECK(!out.empty()) << option << " '" << text << "' is empty";
  return out;
}

double expected_active_experts(int64_t n_experts, int64_t top_k, int64_t tokens) {
  const double e = static_cast<double>(n_experts);
  return e * (1.0 - std::pow(1.0 - static_cast<double>(top_k) / e, static_cast<double>(tokens)));
}

std::vector<GemmProblem> gemms_of(const Problem& p, int64_t tokens) {
  std::vector<GemmProblem> out;
  if (p.kind == Problem::Kind::kGemm) {
    GemmProblem g;
    g.name = "gemm";
    g.m = static_cast<double>(tokens > 0 ? tokens : std::max<int64_t>(p.m, 1));
    g.n = p.n;
    g.k = p.k;
    g.total_tokens = static_cast<int64_t>(g.m);
    out.push_back(g);
    return out;
  }
  FP4MOE_CHECK(tokens > 0) << "a MoE problem needs a token count (got " << tokens << ")";
  // tokens <= 2^40 (parse_token_list) and topk <= 2^16 (check_problem): the product fits, and bounds the tiles.
  FP4MOE_CHECK(tokens * p.top_k <= (int64_t{1} << 40))
      << tokens << " tokens x topk " << p.top_k << " = " << tokens * p.top_k << " routed tokens is past 2^40";
  const double active = std::max(1.0, expected_active_experts(p.n_experts, p.top_k, tokens));
  const int64_t groups = std::min<int64_t>(p.n_experts, static_cast<int64_t>(std::ceil(active - 1e-9)));
  const double m = static_cast<double>(tokens * p.top_k) / static_cast<double>(groups);
  GemmProblem g1{"gemm1 (gate+up)", groups, m, 2 * p.intermediate, p.hidden, false, tokens};
  GemmProblem g2{"gemm2 (down)", groups, m, p.hidden, p.intermediate, true, tokens};
  out.push_back(g1);
  out.push_back(g2);
  return out;
}

Rejection make_rejection(const TileCandidate& c, const SmemCheck& check, const GpuSpec& gpu) {
  Rejection r;
  r.candidate = c;
  r.rule = check.rule;
  r.bytes_needed = check.bytes;
  r.limit = check.limit;
  r.breakdown = check.breakdown;
  r.note = check.builder_note;
  std::ostringstream os;
  os << c.to_string() << ": ";
  if (r.is_smem()) {
    os << check.summary;
    if (check.bytes > check.limit) {
      os << " > " << check.limit << " B opt-in (" << gpu.sm_name() << ") by " << check.bytes - check.limit << " B";
    } else {
      os << " <= " << check.limit << " B opt-in (" << gpu.sm_name() << ")";
    }
    if (r.rule == "builder-min-stages") os << "; " << check.reason;
  } else if (r.rule == "dispatch") {
    os << check.reason << " (" << check.summary << ")";
  } else {
    os << check.reason;
  }
  r.message = os.str();
  return r;
}

GemmPlan plan_gemm(const GemmProblem& problem, const GpuSpec& gpu, const PlanOptions& options) {
  GemmPlan out;
  out.problem = problem;
  out.family = options.family.value_or(default_family(gpu));
  out.gpu = gpu.name;
  for (const TileCandidate& c : family_candidates(out.family, problem.finalize)) {
    const SmemCheck check = check_smem(c, gpu, options.rules);
    if (!check.fits) {
      out.rejected.push_back(make_rejection(c, check, gpu));
      continue;
    }
    out.ranked.push_back(CandidateResult{c, check, estimate_cost(c, problem, gpu)});
  }
  // Best estimate first; ties: less padding waste, the smaller on-chip time, more SMEM margin, name.
  std::stable_sort(out.ranked.begin(), out.ranked.end(), [](const CandidateResult& a, const CandidateResult& b) {
    if (a.cost.time_us != b.cost.time_us) return a.cost.time_us < b.cost.time_us;
    if (a.cost.padding_waste != b.cost.padding_waste) return a.cost.padding_waste < b.cost.padding_waste;
    if (a.cost.onchip_time_us != b.cost.onchip_time_us) return a.cost.onchip_time_us < b.cost.onchip_time_us;
    if (a.smem.margin() != b.smem.margin()) return a.smem.margin() > b.smem.margin();
    return a.candidate.to_string() < b.candidate.to_string();
  });
  if (!out.ranked.empty()) {
    out.chosen = out.ranked.front();
  } else {
    out.error = nothing_fits_message(out, gpu);
  }
  log_plan_once(out);
  return out;
}

std::vector<GemmPlan> plan(const Problem& problem, const std::vector<int64_t>& tokens, const GpuSpec& gpu,
                           const PlanOptions& options) {
  std::vector<GemmPlan> out;
  std::vector<int64_t> counts = tokens;
  if (counts.empty()) {
    FP4MOE_CHECK(problem.kind == Problem::Kind::kGemm) << "a MoE problem needs --tokens (e.g. 1,16,64,512,4096)";
    counts.push_back(0);
  }
  for (int64_t t : counts) {
    for (const GemmProblem& g : gemms_of(problem, t)) out.push_back(plan_gemm(g, gpu, options));
  }
  return out;
}

std::string nothing_fits_message(const GemmPlan& p, const GpuSpec& gpu) {
  std::vector<const Rejection*> order;
  for (const Rejection& r : p.rejected) order.push_back(&r);
  std::stable_sort(order.begin(), order.end(), [](const Rejection* a, const Rejection* b) {
    if (a->is_smem() != b->is_smem()) return a->is_smem();
    return a->shortfall() < b->shortfall();
  });
  std::ostringstream os;
  os << "no " << family_name(p.family) << " tile fits " << p.problem.name << " on " << gpu.name << " (" << gpu.sm_name()
     << ", opt-in " << gpu.smem_optin_per_block << " B); " << order.size() << " candidates, nearest first:";
  for (const Rejection* r : order) {
    os << "\n  ";
    if (r->is_smem()) os << "short by " << r->shortfall() << " B: ";
    else os << "[" << r->rule << "] ";
    os << r->message;
  }
  return os.str();
}

const CandidateResult& require_chosen(const GemmPlan& p) {
  if (!p.chosen) FP4MOE_FAIL() << p.error;
  return *p.chosen;
}

}  // namespace fp4moe::plan
