#pragma once
/// Small string helpers shared by the layers' messages (config keys, kernel.json names, CLI commands).
#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace nsim::sim {

/// `items` joined with `sep` between them.
std::string join(const std::vector<std::string>& items, std::string_view sep = ", ");

/// The longest prefix of `s` of at most `max_bytes` bytes that does not end inside a UTF-8
/// sequence: a name clipped for a message stays valid UTF-8 (Python decodes messages strictly).
std::string_view clip_utf8(std::string_view s, size_t max_bytes);

/// Levenshtein distance (insertions, deletions, substitutions of one byte each).
size_t edit_distance(std::string_view a, std::string_view b);

}  // namespace nsim::sim
