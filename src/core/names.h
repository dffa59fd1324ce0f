// The closest of a set of names to a misspelt one, for "did you mean" hints in errors (an unknown subcommand, an
// unknown sampling parameter). Tested by tests/core/test_names.cpp.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace fp4moe {

// Levenshtein distance: the fewest single-character insertions, deletions and substitutions from a to b.
size_t edit_distance(std::string_view a, std::string_view b);

// The candidate fewest edits from `name` when at most a third of name's characters (at least one) differ; the first
// such candidate on a tie; nullopt when none is that close, or name is shorter than 3 characters.
std::optional<std::string> closest_name(std::string_view name, const std::vector<std::string>& candidates);

}  // namespace fp4moe
