#include "archive/prune.hpp"
#include "archive/errors.hpp"

#include <map>

namespace ferry::archive {

namespace fs = std::filesystem;

namespace {

// A run's bytes: every column that can be big, and its record. length() of a BLOB reads no
// content, so this costs the same however large the outputs are.
constexpr std::string_view run_bytes_sql =
    "length(CAST(record AS BLOB)) + coalesce(length(params), 0) + coalesce(length(result), 0) + "
    "coalesce(length(result_bytes), 0) + length(stdout) + length(stderr)";

std::uint64_t file_bytes(const fs::path& path)
{
  std::error_code ec;
  std::uint64_t total = 0;
  for (const auto& file : {path, fs::path(path.string() + "-wal")}) {
    const auto size = fs::file_size(file, ec);
    total += ec ? 0 : size;
  }
  return total;
}

// The bytes of the pages in use: the file less the free pages a removal left.
SqliteResult<std::uint64_t> used_bytes(Database& db)
{
  FERRY_TRY_ASSIGN(auto stmt, db.prepare("SELECT ((SELECT page_count FROM pragma_page_count) - "
                                         "(SELECT freelist_count FROM pragma_freelist_count)) * "
                                         "(SELECT page_size FROM pragma_page_size)"));
  FERRY_TRY_ASSIGN(const bool row, stmt.step());
  return row ? static_cast<std::uint64_t>(stmt.column_int(0)) : 0;
}

RunSize size_from_row(const Statement& row)
{
  return {row.column_bytes(0), row.column_bytes(1), row.column_bytes(2), row.column_bytes(3),
          static_cast<std::uint64_t>(row.column_int(4))};
}

// The runs OPTIONS' job and host let through, newest first, with their sizes.
SqliteResult<std::vector<RunSize>> run_sizes(Database& db, const PruneOptions& options)
{
  std::string sql = fmt::format("SELECT run_id, job, host_label, started_at, {} FROM runs WHERE 1",
                                run_bytes_sql);
  if (options.job) {
    sql += " AND job = ?1";
  }
  if (options.host) {
    sql += " AND (host = ?2 OR host_label = ?2)";
  }
  sql += " ORDER BY started_at DESC, rowid DESC";
  FERRY_TRY_ASSIGN(auto stmt, db.prepare(sql));
  if (options.job) {
    stmt.bind(1, *options.job);
  }
  if (options.host) {
    stmt.bind(2, *options.host);
  }
  std::vector<RunSize> sizes;
  for (;;) {
    FERRY_TRY_ASSIGN(const bool row, stmt.step());
    if (!row) {
      return sizes;
    }
    sizes.push_back(size_from_row(stmt));
  }
}

// The chosen runs, with what the archive holds now.
SqliteResult<PruneOutcome> choose(Database& db, const PruneOptions& options)
{
  FERRY_TRY_ASSIGN(const auto sizes, run_sizes(db, options));
  FERRY_TRY_ASSIGN(const auto used, used_bytes(db));
  PruneOutcome outcome;
  for (const std::size_t i : select_for_pruning(sizes, options, used)) {
    outcome.removed.push_back(sizes[i]);
    outcome.removed_bytes += sizes[i].bytes;
  }
  return outcome;
}

// Where a blob (a row of `scripts`) served a run: its script, a file sent with it, or an output
// fetched from it. A blob that served several roles is counted under the first of these.
enum class BlobRole { script, file, output };

// The scripts of RUNS, by sha256: blobs that may go with them.
SqliteResult<std::map<std::string, BlobRole>> scripts_of(Database& db,
                                                         const std::vector<RunSize>& runs)
{
  std::map<std::string, BlobRole> roles;
  FERRY_TRY_ASSIGN(auto stmt, db.prepare("SELECT script_sha256 FROM runs WHERE run_id = ?1 "
                                         "AND script_sha256 IS NOT NULL"));
  for (const auto& run : runs) {
    stmt.reset();
    FERRY_TRY_ASSIGN(const bool row, stmt.bind(1, run.run_id).step());
    if (row) {
      roles.emplace(stmt.column_bytes(0), BlobRole::script);
    }
  }
  return roles;
}

// The file rows and invocation rows of runs that are gone (those just removed, and any an older
// ferry's prune left), the file rows' blobs' roles added to ROLES first.
SqliteResult<> remove_file_rows(Database& db, std::map<std::string, BlobRole>& roles)
{
  constexpr std::string_view gone = "run_id NOT IN (SELECT run_id FROM runs)";
  FERRY_TRY_ASSIGN(auto stmt, db.prepare(fmt::format("SELECT kind, sha256 FROM run_files WHERE "
                                                     "archived = 1 AND {} ORDER BY kind",
                                                     gone)));
  for (;;) {
    FERRY_TRY_ASSIGN(const bool row, stmt.step());
    if (!row) {
      break;
    }
    roles.try_emplace(stmt.column_bytes(1),
                      stmt.column_view(0) == "file" ? BlobRole::file : BlobRole::output);
  }
  FERRY_TRY(db.exec(fmt::format("DELETE FROM run_files WHERE {}", gone)));
  return db.exec(fmt::format("DELETE FROM run_invocations WHERE {}", gone));
}

void count_removed(PruneOutcome& outcome, BlobRole role)
{
  switch (role) {
  case BlobRole::script:
    ++outcome.scripts_removed;
    break;
  case BlobRole::file:
    ++outcome.files_removed;
    break;
  case BlobRole::output:
    ++outcome.outputs_removed;
    break;
  }
}

// Inside the caller's transaction: the chosen runs and their file rows, then every blob that no
// remaining run refers to by any role (its script, a file sent, an output kept), counted by the
// role it had. One that no run referred to at all counts as a script if it was stored with a
// script's name, else as a file.
SqliteResult<> remove(Database& db, PruneOutcome& outcome)
{
  FERRY_TRY_ASSIGN(auto roles, scripts_of(db, outcome.removed));
  FERRY_TRY_ASSIGN(auto stmt, db.prepare("DELETE FROM runs WHERE run_id = ?1"));
  for (const auto& run : outcome.removed) {
    stmt.reset();
    FERRY_TRY(stmt.bind(1, run.run_id).run());
  }
  FERRY_TRY(remove_file_rows(db, roles));
  FERRY_TRY_ASSIGN(auto unused,
                   db.prepare("DELETE FROM scripts WHERE sha256 NOT IN "
                              "(SELECT script_sha256 FROM runs WHERE script_sha256 IS NOT NULL) "
                              "AND sha256 NOT IN (SELECT sha256 FROM run_files WHERE archived = 1) "
                              "RETURNING sha256, name"));
  for (;;) {
    FERRY_TRY_ASSIGN(const bool row, unused.step());
    if (!row) {
      return {};
    }
    const auto known = roles.find(unused.column_bytes(0));
    const BlobRole unreferenced = unused.column_view(1).empty() ? BlobRole::file : BlobRole::script;
    count_removed(outcome, known != roles.end() ? known->second : unreferenced);
  }
}

SqliteResult<std::int64_t> auto_vacuum_mode(Database& db)
{
  FERRY_TRY_ASSIGN(auto stmt, db.prepare("PRAGMA auto_vacuum"));
  FERRY_TRY_ASSIGN(const bool row, stmt.step());
  return row ? stmt.column_int(0) : 0;
}

// The free pages back to the file system. An archive made before ferry created archives with
// auto_vacuum = INCREMENTAL is switched over by one whole VACUUM (which needs the lock once).
SqliteResult<> reclaim(Database& db)
{
  constexpr std::int64_t incremental = 2;
  FERRY_TRY_ASSIGN(const auto mode, auto_vacuum_mode(db));
  if (mode != incremental) {
    FERRY_TRY(db.exec("PRAGMA auto_vacuum = INCREMENTAL"));
    FERRY_TRY(retry_while_locked(db, [&] { return db.exec("VACUUM"); }));
  } else {
    FERRY_TRY(retry_while_locked(db, [&] { return db.exec("PRAGMA incremental_vacuum"); }));
  }
  // Shrinks the file itself; readers in the way only leave it for a later checkpoint.
  (void)db.exec("PRAGMA wal_checkpoint(TRUNCATE)");
  return {};
}

Expected<PruneOutcome> prune_in_transaction(Database& db, const fs::path& path,
                                            const PruneOptions& options)
{
  auto begun = retry_while_locked(db, [&] { return db.exec("BEGIN IMMEDIATE"); });
  if (!begun && begun.error().locked()) {
    return fail(ErrorKind::failed,
                "archive {} stayed locked by another process for {:.1f} s; nothing was pruned — "
                "try again",
                path.string(), static_cast<double>(db.lock_waited().count()) / 1000);
  }
  FERRY_TRY(explained(std::move(begun), path, "prune archive", &db));
  auto outcome = choose(db, options);
  SqliteResult<> done =
      outcome ? remove(db, *outcome) : SqliteResult<>(Unexpected{outcome.error()});
  if (done) {
    done = db.exec("COMMIT");
  }
  if (!done) {
    (void)db.exec("ROLLBACK");
    return archive_error(path, "prune archive", done.error(), &db);
  }
  return std::move(outcome).value();
}

} // namespace

std::vector<std::size_t> select_for_pruning(const std::vector<RunSize>& newest_first,
                                            const PruneOptions& options, std::uint64_t used_bytes)
{
  const std::size_t count = newest_first.size();
  const std::size_t kept =
      std::min(count, static_cast<std::size_t>(std::max(0, options.keep_last.value_or(0))));
  const bool keep_alone = options.keep_last && !options.started_before && !options.max_size;
  std::vector<bool> chosen(count, false);
  std::uint64_t remaining = used_bytes;
  for (std::size_t i = kept; i < count; ++i) {
    chosen[i] = keep_alone ||
                (options.started_before && newest_first[i].started_at < *options.started_before);
    remaining -= chosen[i] ? std::min(remaining, newest_first[i].bytes) : 0;
  }
  // Then the oldest of the rest until what is left fits.
  for (std::size_t i = count; options.max_size && i > kept && remaining > *options.max_size; --i) {
    if (!chosen[i - 1]) {
      chosen[i - 1] = true;
      remaining -= std::min(remaining, newest_first[i - 1].bytes);
    }
  }
  std::vector<std::size_t> oldest_first;
  for (std::size_t i = count; i > 0; --i) {
    if (chosen[i - 1]) {
      oldest_first.push_back(i - 1);
    }
  }
  return oldest_first;
}

Expected<PruneOutcome> prune_runs(Database& db, const fs::path& path, const PruneOptions& options)
{
  const std::uint64_t before = file_bytes(path);
  if (options.dry_run) {
    FERRY_TRY_ASSIGN(auto outcome, explained(choose(db, options), path, "read archive", &db));
    outcome.file_bytes_before = outcome.file_bytes_after = before;
    return outcome;
  }
  FERRY_TRY_ASSIGN(auto outcome, prune_in_transaction(db, path, options));
  outcome.file_bytes_before = before;
  if (!outcome.removed.empty()) {
    FERRY_TRY(explained(reclaim(db), path, "return the space of pruned runs", &db));
  }
  outcome.file_bytes_after = file_bytes(path);
  return outcome;
}

namespace {

SqliteResult<> count_runs(Database& db, ArchiveStats& stats)
{
  FERRY_TRY_ASSIGN(auto stmt, db.prepare("SELECT (SELECT count(*) FROM runs), "
                                         "(SELECT count(*) FROM scripts), "
                                         "(SELECT coalesce(min(started_at), '') FROM runs), "
                                         "(SELECT coalesce(max(started_at), '') FROM runs)"));
  FERRY_TRY_ASSIGN(const bool row, stmt.step());
  if (row) {
    stats.runs = stmt.column_int(0);
    stats.scripts = stmt.column_int(1);
    stats.oldest = stmt.column_bytes(2);
    stats.newest = stmt.column_bytes(3);
  }
  return {};
}

SqliteResult<> largest_runs(Database& db, ArchiveStats& stats, int largest)
{
  FERRY_TRY_ASSIGN(auto stmt,
                   db.prepare(fmt::format("SELECT run_id, job, host_label, started_at, {} AS bytes "
                                          "FROM runs ORDER BY bytes DESC, started_at DESC LIMIT ?1",
                                          run_bytes_sql)));
  stmt.bind(1, static_cast<std::int64_t>(largest));
  for (;;) {
    FERRY_TRY_ASSIGN(const bool row, stmt.step());
    if (!row) {
      return {};
    }
    stats.largest.push_back(size_from_row(stmt));
  }
}

} // namespace

Expected<ArchiveStats> archive_stats(Database& db, const fs::path& path, int largest)
{
  ArchiveStats stats;
  stats.file_bytes = file_bytes(path);
  FERRY_TRY_ASSIGN(stats.used_bytes, explained(used_bytes(db), path, "read archive", &db));
  FERRY_TRY(explained(count_runs(db, stats), path, "read archive", &db));
  FERRY_TRY(explained(largest_runs(db, stats, largest), path, "read archive", &db));
  return stats;
}

} // namespace ferry::archive
