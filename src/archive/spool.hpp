#pragma once
// Runs that could not get into the archive because another process held its lock past the
// wait: each is kept in a file of its own beside the archive, and moved in by the next ferry
// that opens the archive for writing.
#include <filesystem>

#include "archive/sqlite.hpp"
#include "ferry/expected.hpp"
#include "ferry/run_record.hpp"

namespace ferry::archive {

// "<archive>.spool": a 0700 directory beside the archive.
[[nodiscard]] std::filesystem::path spool_dir(const std::filesystem::path& archive);

// Writes RUN to "<spool dir>/<run id>.run" (0600): a one-run archive with this ferry's schema,
// so every byte is kept as the archive keeps it. It gets that name only once complete.
[[nodiscard]] Expected<std::filesystem::path> spool_run(const std::filesystem::path& archive,
                                                        const RunRecord& run);

// Moves the spooled runs into DB, the archive at ARCHIVE (open for writing, schema current),
// each in one transaction, and removes each file once its run is committed. Waits for the
// archive's lock as DB's lock wait allows; what it cannot move now stays for the next ferry:
// files another process is moving, from a newer ferry, or that cannot be read.
void ingest_spool(Database& db, const std::filesystem::path& archive);

} // namespace ferry::archive
