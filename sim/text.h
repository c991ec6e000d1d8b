#pragma once
/// Small string helpers shared by the layers' messages (config keys, kernel.json names, CLI commands).
#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace nsim::sim {

/// `items` joined with `sep` between them.
std::string join(const std::vector<std::string>& items, std::string_view sep = ", ");

/// Levenshtein distance (insertions, deletions, substitutions of one byte each).
size_t edit_distance(std::string_view a, std::string_view b);

}  // namespace nsim::sim
