// GLM-5 DSA selections in tests (GlmMoeDsaModel's hooks, model/glm5.h): a log of what a forward
// selected, keyed by (layer, absolute query position), and overrides built from a per-query rule or
// from such a log. Shared by the CPU GLM-5 test and the GPU model test.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <map>
#include <span>
#include <utility>
#include <vector>

#include "core/error.h"
#include "model/glm5.h"

namespace fp4moe::model::dsa_test {

// (layer, absolute position) -> the keys that query attends to.
using SelectionLog = std::map<std::pair<int64_t, int64_t>, std::vector<int32_t>>;

// Records the selections of every layer, or only of the "full" ones (include_reused false).
inline DsaSelectionObserver log_into(SelectionLog& log, bool include_reused = true) {
  return [&log, include_reused](int64_t layer, size_t, std::span<const int64_t> q_pos, const KeySelection& keys,
                                bool reused) {
    if (reused && !include_reused) return;
    ASSERT_EQ(keys.n_queries(), static_cast<int64_t>(q_pos.size()));
    for (size_t i = 0; i < q_pos.size(); ++i) {
      const auto k = keys.keys_of(static_cast<int64_t>(i));
      log[{layer, q_pos[i]}] = std::vector<int32_t>(k.begin(), k.end());
    }
  };
}

// An override whose keys for each query come from pick(layer, position).
inline DsaSelectionOverride selection_from(std::function<std::vector<int32_t>(int64_t, int64_t)> pick) {
  return [pick = std::move(pick)](int64_t layer, size_t, std::span<const int64_t> q_pos) {
    KeySelection k;
    k.offsets.push_back(0);
    for (int64_t p : q_pos) {
      const std::vector<int32_t> keys = pick(layer, p);
      k.idx.insert(k.idx.end(), keys.begin(), keys.end());
      k.offsets.push_back(static_cast<int64_t>(k.idx.size()));
    }
    return k;
  };
}

// An override replaying a log (the log must outlive it; a missing entry throws, naming it).
inline DsaSelectionOverride pinned_to(const SelectionLog& log) {
  return selection_from([&log](int64_t layer, int64_t p) {
    const auto it = log.find({layer, p});
    FP4MOE_CHECK(it != log.end()) << "no selection logged for layer " << layer << " position " << p;
    return it->second;
  });
}

}  // namespace fp4moe::model::dsa_test
