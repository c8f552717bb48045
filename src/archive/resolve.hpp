#pragma once
// Run references (docs/archive.md, "Naming a run"): the one place that turns what a user typed
// into a run id, for every command that takes one.
#include <filesystem>
#include <string>
#include <string_view>

#include "archive/sqlite.hpp"
#include "ferry/archive.hpp"

namespace ferry::archive {

// How many candidates an ambiguous reference lists.
inline constexpr int max_listed_candidates = 10;

[[nodiscard]] Expected<std::string> resolve_run(Database& db, const std::filesystem::path& path,
                                                std::string_view ref, const RunNarrowing& narrow);

// The invocation REF names: "last" (the newest run's that has one), an id, or a unique prefix
// of one. None, or an ambiguous prefix: ErrorKind::usage.
[[nodiscard]] Expected<std::string>
resolve_invocation(Database& db, const std::filesystem::path& path, std::string_view ref);

} // namespace ferry::archive
