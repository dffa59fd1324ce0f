#include "core/names.h"

#include <algorithm>
#include <cstdint>

namespace fp4moe {

size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];  // row[i - 1][j - 1]
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

std::optional<std::string> closest_name(std::string_view name, const std::vector<std::string>& candidates) {
  if (name.size() < 3) return std::nullopt;  // one edit from a one- or two-letter word is most words of that size
  const size_t limit = std::max<size_t>(1, name.size() / 3);
  std::optional<std::string> best;
  size_t best_d = SIZE_MAX;
  for (const std::string& c : candidates) {
    if (const size_t d = edit_distance(name, c); d <= limit && d < best_d) {
      best_d = d;
      best = c;
    }
  }
  return best;
}

}  // namespace fp4moe
