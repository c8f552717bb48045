#pragma once
// Getting an archive database ready: the schema read and checked, WAL switched on, older
// schemas migrated. Safe with any number of processes doing the same to the same file at once.
#include <filesystem>
#include <string>

#include "archive/sqlite.hpp"
#include "ferry/expected.hpp"

namespace ferry::archive {

// Opens the SQLite file at PATH (or the URI NAME when given) with FLAGS.
[[nodiscard]] Expected<Database> open_database(const std::filesystem::path& path, int flags,
                                               const std::string& name = {});

struct SchemaInfo {
  int version = 0;
  std::int64_t application = 0;
  std::int64_t objects = 0; // tables, indexes, ... in sqlite_master
};

[[nodiscard]] SqliteResult<SchemaInfo> query_schema_info(Database& db);

// Refuses what ferry must not touch: a newer schema, or an SQLite file that is not an archive.
[[nodiscard]] Expected<void> check_schema(const SchemaInfo& info,
                                          const std::filesystem::path& path);

// Checks the schema, switches to WAL (or to no journal, for a spool file written once), and
// migrates to this ferry's schema, retrying what another process's lock refused until DB's lock
// wait is spent. false: a lock outlasted the wait (nothing changed that is not complete);
// an error for anything else.
enum class JournalMode { wal, off };
[[nodiscard]] Expected<bool> set_up(Database& db, const std::filesystem::path& path,
                                    JournalMode journal = JournalMode::wal);

} // namespace ferry::archive
