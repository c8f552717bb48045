#include "ferry/suggest.hpp"

#include <algorithm>

#include <fmt/format.h>

namespace ferry {

std::size_t edit_distance(std::string_view a, std::string_view b)
{
  // Three rows of the dynamic-programming table: the transposition looks two rows back.
  std::vector<std::size_t> before(b.size() + 1);
  std::vector<std::size_t> previous(b.size() + 1);
  std::vector<std::size_t> current(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) {
    previous[j] = j;
  }
  for (std::size_t i = 1; i <= a.size(); ++i) {
    current[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
      current[j] = std::min({previous[j] + 1, current[j - 1] + 1, previous[j - 1] + cost});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1]) {
        current[j] = std::min(current[j], before[j - 2] + 1);
      }
    }
    std::swap(before, previous);
    std::swap(previous, current);
  }
  return previous[b.size()];
}

std::optional<std::string> closest_name(std::string_view word,
                                        const std::vector<std::string>& candidates)
{
  const std::size_t allowed = std::clamp<std::size_t>(word.size() / 4, 1, 3);
  std::optional<std::string> best;
  std::size_t best_distance = allowed + 1;
  for (const auto& candidate : candidates) {
    if (candidate == word) {
      continue;
    }
    const bool prefix = !word.empty() && candidate.size() > word.size() &&
                        std::string_view(candidate).substr(0, word.size()) == word;
    // A prefix counts as one edit: "kv" finds "kv_calc", but a closer typo still wins.
    const std::size_t distance = prefix ? 1 : edit_distance(word, candidate);
    if (distance < best_distance) {
      best = candidate;
      best_distance = distance;
    }
  }
  return best;
}

std::string did_you_mean(std::string_view word, const std::vector<std::string>& candidates)
{
  const auto name = closest_name(word, candidates);
  return name ? fmt::format("; did you mean '{}'?", *name) : std::string();
}

} // namespace ferry
