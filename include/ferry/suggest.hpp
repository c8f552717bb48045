#pragma once
// "Did you mean …?" for a mistyped command, job or parameter name: the closest known name by
// edit distance, when it is close enough to be a likely typo.
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace ferry {

// Optimal string alignment distance (insertions, deletions, substitutions and transpositions
// of adjacent bytes each cost 1).
[[nodiscard]] std::size_t edit_distance(std::string_view a, std::string_view b);

// The candidate closest to `word` when it is at most a quarter of the word's length away (at
// least 1, at most 3 edits), or has `word` as its prefix; ties go to the earlier candidate.
[[nodiscard]] std::optional<std::string> closest_name(std::string_view word,
                                                      const std::vector<std::string>& candidates);

// "; did you mean 'NAME'?" for closest_name, or "" when nothing is close.
[[nodiscard]] std::string did_you_mean(std::string_view word,
                                       const std::vector<std::string>& candidates);

} // namespace ferry
