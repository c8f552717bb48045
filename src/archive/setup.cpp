#include "archive/setup.hpp"
#include "archive/errors.hpp"
#include "archive/schema.hpp"

namespace ferry::archive {

namespace fs = std::filesystem;

Expected<Database> open_database(const fs::path& path, int flags, const std::string& name)
{
  return explained(Database::open(name.empty() ? path.string() : name, flags), path,
                   "open archive");
}

// One statement, so one read snapshot: a concurrent first open cannot be seen half-way.
SqliteResult<SchemaInfo> query_schema_info(Database& db)
{
  FERRY_TRY_ASSIGN(auto stmt, db.prepare("SELECT (SELECT user_version FROM pragma_user_version), "
                                         "(SELECT application_id FROM pragma_application_id), "
                                         "(SELECT count(*) FROM sqlite_master)"));
  FERRY_TRY_ASSIGN(const bool row, stmt.step());
  SchemaInfo info;
  if (row) {
    info.version = static_cast<int>(stmt.column_int(0));
    info.application = stmt.column_int(1);
    info.objects = stmt.column_int(2);
  }
  return info;
}

Expected<void> check_schema(const SchemaInfo& info, const fs::path& path)
{
  if (info.version > schema_version()) {
    return fail(ErrorKind::failed,
                "archive {} was written by a newer ferry (schema v{}, this ferry knows v{}); "
                "upgrade ferry or pass --archive NEW_PATH",
                path.string(), info.version, schema_version());
  }
  const bool foreign = info.application != 0 && info.application != application_id;
  if (foreign || (info.version == 0 && info.objects > 0)) {
    return fail(ErrorKind::failed,
                "{} is an SQLite database but not a ferry archive; ferry left it untouched — "
                "pass --archive NEW_PATH",
                path.string());
  }
  return {};
}

namespace {

// false for a lock that outlasted the wait; any other error explained.
Expected<bool> unless_locked(const SqliteError& error, const fs::path& path, std::string_view doing,
                             Database& db)
{
  if (error.locked()) {
    return false;
  }
  return archive_error(path, doing, error, &db);
}

// The steps after the archive's version, inside the caller's transaction. The version is read
// again there: a process that lost the race to create the archive sees the winner's work.
Expected<void> run_migrations(Database& db, const fs::path& path)
{
  FERRY_TRY_ASSIGN(auto info, explained(query_schema_info(db), path, "read archive", &db));
  FERRY_TRY(check_schema(info, path));
  for (const auto& step : migrations()) {
    if (step.to_version <= info.version) {
      continue;
    }
    FERRY_TRY(explained(db.exec(std::string(step.sql)), path,
                        fmt::format("upgrade archive to schema v{}", step.to_version), &db));
    FERRY_TRY(explained(db.exec(fmt::format("PRAGMA user_version = {}", step.to_version)), path,
                        "upgrade archive", &db));
  }
  return explained(db.exec("COMMIT"), path, "upgrade archive", &db);
}

// All migrations in one transaction; BEGIN IMMEDIATE takes the write lock first.
Expected<bool> migrate(Database& db, const fs::path& path)
{
  auto begun = retry_while_locked(db, [&] { return db.exec("BEGIN IMMEDIATE"); });
  if (!begun) {
    return unless_locked(begun.error(), path, "prepare archive", db);
  }
  auto migrated = run_migrations(db, path);
  if (!migrated) {
    (void)db.exec("ROLLBACK");
    return Unexpected{std::move(migrated).error()};
  }
  return true;
}

} // namespace

Expected<bool> set_up(Database& db, const fs::path& path, JournalMode journal)
{
  // Read before anything writes: a newer or foreign database is refused unchanged.
  auto info = retry_while_locked(db, [&] { return query_schema_info(db); });
  if (!info) {
    return unless_locked(info.error(), path, "read archive", db);
  }
  FERRY_TRY(check_schema(*info, path));

  // A small page cache: runs carry blobs of up to 16 MiB each, and the cache need not hold them.
  // The switch to WAL is refused at once (no busy handler) while another process opens the file.
  // A new archive gives back the space of pruned runs page by page (`ferry prune`); the setting
  // only takes before the first table exists.
  const std::string pragmas = fmt::format(
      "{}PRAGMA journal_mode = {}; PRAGMA synchronous = FULL; PRAGMA cache_size = -1024",
      info->objects == 0 ? "PRAGMA auto_vacuum = INCREMENTAL; " : "",
      journal == JournalMode::wal ? "WAL" : "OFF");
  auto configured = retry_while_locked(db, [&] { return db.exec(pragmas); });
  if (!configured) {
    return unless_locked(configured.error(), path, "open archive", db);
  }
  if (info->version < schema_version()) {
    return migrate(db, path);
  }
  return true;
}

} // namespace ferry::archive
