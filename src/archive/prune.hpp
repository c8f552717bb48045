#pragma once
// `ferry prune` and `ferry log --stats`: choosing the runs that go, removing them with what only
// they used, and giving the space back.
#include <filesystem>
#include <vector>

#include "archive/sqlite.hpp"
#include "ferry/archive.hpp"

namespace ferry::archive {

// Which of NEWEST_FIRST (the runs `job`/`host` let through, newest first) OPTIONS remove, as
// indexes into it, oldest first. USED_BYTES: what the archive holds now, for `max_size`.
// `keep_last` alone removes all but the N newest; beside `started_before` or `max_size` it only
// protects them.
[[nodiscard]] std::vector<std::size_t> select_for_pruning(const std::vector<RunSize>& newest_first,
                                                          const PruneOptions& options,
                                                          std::uint64_t used_bytes);

// The caller has started the lock wait.
[[nodiscard]] Expected<PruneOutcome> prune_runs(Database& db, const std::filesystem::path& path,
                                                const PruneOptions& options);

[[nodiscard]] Expected<ArchiveStats> archive_stats(Database& db, const std::filesystem::path& path,
                                                   int largest);

} // namespace ferry::archive
