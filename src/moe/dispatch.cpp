// DispatchPlan: stable counting sort of (token, slot) pairs by expert. See dispatch.h.
#include "moe/dispatch.h"

#include <algorithm>
#include <sstream>

#include "core/error.h"

namespace fp4moe::moe {

DispatchPlan DispatchPlan::build(const int32_t* topk_idx, int64_t n_tokens, int top_k, int n_experts) {
  FP4MOE_CHECK(n_tokens >= 0 && top_k >= 1 && n_experts >= 1)
      << "DispatchPlan: n_tokens=" << n_tokens << " top_k=" << top_k << " n_experts=" << n_experts;
  DispatchPlan p;
  p.n_experts = n_experts;
  p.top_k = top_k;
  p.n_tokens = n_tokens;
  const int64_t n = n_tokens * top_k;
  p.offsets.assign(static_cast<size_t>(n_experts) + 1, 0);
  for (int64_t i = 0; i < n; ++i) {
    const int32_t e = topk_idx[i];
    FP4MOE_CHECK(e >= 0 && e < n_experts)
        << "DispatchPlan: token " << i / top_k << " slot " << i % top_k << " routes to expert " << e
        << ", outside [0, " << n_experts << ")";
    ++p.offsets[e + 1];
  }
  for (int e = 0; e < n_experts; ++e) p.offsets[e + 1] += p.offsets[e];
  std::vector<int64_t> cursor(p.offsets.begin(), p.offsets.end() - 1);
  p.token.resize(static_cast<size_t>(n));
  p.slot.resize(static_cast<size_t>(n));
  p.entry_of.resize(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {  // increasing (token, slot): the sort is stable
    const int64_t entry = cursor[topk_idx[i]]++;
    p.token[entry] = static_cast<int32_t>(i / top_k);
    p.slot[entry] = static_cast<int32_t>(i % top_k);
    p.entry_of[i] = entry;
  }
  return p;
}

std::vector<int64_t> DispatchPlan::counts() const {
  std::vector<int64_t> c(static_cast<size_t>(n_experts));
  for (int e = 0; e < n_experts; ++e) c[e] = count(e);
  return c;
}

int64_t DispatchPlan::max_tokens_per_expert() const {
  int64_t m = 0;
  for (int e = 0; e < n_experts; ++e) m = std::max(m, count(e));
  return m;
}

double DispatchPlan::mean_tokens_per_expert() const {
  return n_experts > 0 ? static_cast<double>(n_entries()) / n_experts : 0.0;
}

int DispatchPlan::n_active_experts() const {
  int n = 0;
  for (int e = 0; e < n_experts; ++e) n += count(e) > 0 ? 1 : 0;
  return n;
}

void DispatchPlan::validate() const {
  const int64_t n = n_entries();
  FP4MOE_CHECK(static_cast<int64_t>(offsets.size()) == n_experts + 1)
      << "DispatchPlan: offsets has " << offsets.size() << " entries, expected E+1 = " << n_experts + 1;
  FP4MOE_CHECK(offsets.front() == 0 && offsets.back() == n)
      << "DispatchPlan: offsets run from " << offsets.front() << " to " << offsets.back() << ", expected 0 to "
      << n << " (tokens " << n_tokens << " x top-" << top_k << ")";
  FP4MOE_CHECK(static_cast<int64_t>(token.size()) == n && static_cast<int64_t>(slot.size()) == n &&
               static_cast<int64_t>(entry_of.size()) == n)
      << "DispatchPlan: token/slot/entry_of sizes " << token.size() << "/" << slot.size() << "/" << entry_of.size()
      << ", expected " << n;
  for (int e = 0; e < n_experts; ++e) {
    FP4MOE_CHECK(offsets[e] <= offsets[e + 1])
        << "DispatchPlan: offsets decrease at expert " << e << ": " << offsets[e] << " > " << offsets[e + 1];
    for (int64_t i = offsets[e]; i < offsets[e + 1]; ++i) {
      FP4MOE_CHECK(token[i] >= 0 && token[i] < n_tokens && slot[i] >= 0 && slot[i] < top_k)
          << "DispatchPlan: entry " << i << " (expert " << e << ") holds token " << token[i] << " slot " << slot[i]
          << ", outside " << n_tokens << " x " << top_k;
      const int64_t pair = static_cast<int64_t>(token[i]) * top_k + slot[i];
      FP4MOE_CHECK(entry_of[pair] == i)
          << "DispatchPlan: entry " << i << " is token " << token[i] << " slot " << slot[i] << " but entry_of["
          << pair << "] = " << entry_of[pair];
      if (i > offsets[e]) {
        const int64_t prev = static_cast<int64_t>(token[i - 1]) * top_k + slot[i - 1];
        FP4MOE_CHECK(prev < pair) << "DispatchPlan: expert " << e << " entries " << i - 1 << " and " << i
                                  << " are not in (token, slot) order: " << prev << " then " << pair;
      }
    }
  }
}

std::string DispatchPlan::summary() const {
  std::ostringstream os;
  os.setf(std::ios::fixed);
  os.precision(2);
  os << "tokens " << n_tokens << " top-" << top_k << " experts " << n_experts << ": active " << n_active_experts()
     << ", max " << max_tokens_per_expert() << ", mean " << mean_tokens_per_expert();
  return os.str();
}

}  // namespace fp4moe::moe
