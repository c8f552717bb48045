#include <mutex>

#include "archive/archive_file.hpp"
#include "archive/errors.hpp"
#include "archive/prune.hpp"
#include "archive/resolve.hpp"
#include "archive/schema.hpp"
#include "archive/setup.hpp"
#include "archive/spool.hpp"
#include "archive/sqlite.hpp"
#include "archive/store.hpp"
#include "ferry/archive.hpp"
#include "ferry/util.hpp"

namespace ferry {

namespace fs = std::filesystem;
using archive::archive_error;
using archive::Database;
using archive::explained;
using archive::SqliteError;
using archive::SqliteResult;
using archive::Statement;

namespace {

// Moving spooled runs in is worth a short wait at open, not a long one.
constexpr std::chrono::milliseconds ingest_wait{2'000};

// A reader of a WAL database needs its -shm file, which it cannot create in a directory it
// cannot write.
bool needs_shared_memory(const SqliteError& error)
{
  return error.primary() == SQLITE_READONLY || error.primary() == SQLITE_CANTOPEN;
}

bool has_unmerged_wal(const fs::path& path)
{
  std::error_code ec;
  const auto size = fs::file_size(path.string() + "-wal", ec);
  return !ec && size > 0;
}

// With no -wal holding runs not yet merged into it, the file alone is the whole archive: read
// it as immutable, which needs no -shm.
std::string immutable_uri(const fs::path& path)
{
  std::string uri = "file:";
  for (const char c : fs::absolute(path).string()) {
    if (c == '%' || c == '?' || c == '#') {
      uri += fmt::format("%{:02X}", static_cast<unsigned char>(c));
    } else {
      uri += c;
    }
  }
  return uri + "?immutable=1";
}

// The first read, with SQLite's own error.
SqliteResult<bool> probe(Database& db)
{
  FERRY_TRY_ASSIGN(auto stmt, db.prepare("PRAGMA user_version"));
  return stmt.step();
}

const SqliteError locked_error{SQLITE_BUSY, "database is locked"};

} // namespace

struct Archive::Impl {
  fs::path path;
  Database db;           // closed when a read-only open found no file
  bool writable = false; // opened with open()
  bool ready = false;    // the schema is there and current
  std::chrono::milliseconds lock_wait{};
  std::mutex mutex; // one SQLite connection: one transaction at a time

  // Whether there are runs to read. A writable archive that a lock kept from being set up at
  // open tries again (an error when the lock outlasts the wait again).
  Expected<bool> usable()
  {
    if (ready || !writable) {
      return ready;
    }
    db.start_lock_wait(lock_wait);
    FERRY_TRY_ASSIGN(ready, archive::set_up(db, path));
    if (!ready) {
      return archive_error(path, "open archive", locked_error, &db);
    }
    return true;
  }

  // Inside a transaction begun by the caller: the run, then COMMIT; ROLLBACK on any error.
  Expected<void> store(const RunRecord& run)
  {
    auto stored = archive::insert_run(db, path, run);
    if (stored) {
      stored = explained(db.exec("COMMIT"), path, fmt::format("record run {}", run.run_id), &db);
    }
    if (!stored) {
      (void)db.exec("ROLLBACK");
    }
    return stored;
  }

  // Archive::resolve with the mutex held.
  Expected<std::string> resolve(std::string_view ref, const RunNarrowing& narrow)
  {
    FERRY_TRY_ASSIGN(const bool is_usable, usable());
    if (!is_usable) {
      return fail(ErrorKind::usage, "no run '{}': archive {} holds no runs yet", ref,
                  path.string());
    }
    db.start_lock_wait(lock_wait);
    return archive::resolve_run(db, path, ref, narrow);
  }

  Expected<RecordOutcome> spool(const RunRecord& run)
  {
    const double waited = static_cast<double>(db.lock_waited().count()) / 1000;
    RecordOutcome outcome;
    outcome.why = fmt::format("archive {} stayed locked by another process for {:.1f} s",
                              path.string(), waited);
    auto spooled = archive::spool_run(path, run);
    if (!spooled) {
      return fail(ErrorKind::failed,
                  "cannot record run {}: {}, and saving it beside the archive failed too: {}",
                  run.run_id, outcome.why, spooled.error().message);
    }
    outcome.spooled_to = std::move(spooled).value();
    return outcome;
  }
};

Archive::Archive(std::unique_ptr<Impl> impl) : m_impl(std::move(impl)) {}
Archive::Archive(Archive&&) noexcept = default;
Archive& Archive::operator=(Archive&&) noexcept = default;
Archive::~Archive() = default;

const fs::path& Archive::path() const
{
  return m_impl->path;
}

bool Archive::exists() const
{
  return static_cast<bool>(m_impl->db);
}

fs::path Archive::default_path()
{
  if (const std::string archive = env_or("FERRY_ARCHIVE", ""); !archive.empty()) {
    return archive;
  }
  // The XDG spec says to ignore a relative $XDG_DATA_HOME.
  if (const fs::path data = env_or("XDG_DATA_HOME", ""); data.is_absolute()) {
    return data / "ferry" / "archive.db";
  }
  return fs::path(home_dir()) / ".local" / "share" / "ferry" / "archive.db";
}

Expected<Archive> Archive::open(const fs::path& path, const ArchiveOptions& options)
{
  FERRY_TRY(archive::prepare_for_writing(path));
  auto impl = std::make_unique<Impl>();
  impl->path = path;
  impl->writable = true;
  impl->lock_wait = options.lock_wait;
  FERRY_TRY_ASSIGN(impl->db, archive::open_database(path, SQLITE_OPEN_READWRITE));
  impl->db.start_lock_wait(options.lock_wait);
  FERRY_TRY_ASSIGN(impl->ready, archive::set_up(impl->db, path));
  if (impl->ready) {
    impl->db.start_lock_wait(std::min(options.lock_wait, ingest_wait));
    archive::ingest_spool(impl->db, path);
  }
  return Archive(std::move(impl));
}

Expected<Archive> Archive::open_read_only(const fs::path& path, const ArchiveOptions& options)
{
  auto impl = std::make_unique<Impl>();
  impl->path = path;
  impl->lock_wait = options.lock_wait;
  FERRY_TRY_ASSIGN(auto exists, archive::check_for_reading(path));
  if (!exists) {
    return Archive(std::move(impl));
  }
  FERRY_TRY_ASSIGN(impl->db, archive::open_database(path, SQLITE_OPEN_READONLY));
  impl->db.start_lock_wait(options.lock_wait);
  if (const auto probed = probe(impl->db);
      !probed && needs_shared_memory(probed.error()) && !has_unmerged_wal(path)) {
    FERRY_TRY_ASSIGN(impl->db, archive::open_database(path, SQLITE_OPEN_READONLY | SQLITE_OPEN_URI,
                                                      immutable_uri(path)));
    impl->db.start_lock_wait(options.lock_wait);
  }
  FERRY_TRY_ASSIGN(
      auto info, explained(archive::query_schema_info(impl->db), path, "read archive", &impl->db));
  FERRY_TRY(archive::check_schema(info, path));
  if (info.version != 0 && info.version < archive::schema_version()) {
    return fail(ErrorKind::failed,
                "archive {} has schema v{} from an older ferry; it is upgraded to v{} the next "
                "time ferry records a run in it (which needs write access)",
                path.string(), info.version, archive::schema_version());
  }
  impl->ready = info.version != 0;
  return Archive(std::move(impl));
}

Expected<RecordOutcome> Archive::record(const RunRecord& run)
{
  std::lock_guard lock(m_impl->mutex);
  Database& db = m_impl->db;
  const fs::path& path = m_impl->path;
  if (!m_impl->writable) {
    return fail(ErrorKind::failed, "cannot record run {}: archive {} was opened read-only",
                run.run_id, path.string());
  }
  db.start_lock_wait(m_impl->lock_wait);
  if (!m_impl->ready) {
    FERRY_TRY_ASSIGN(m_impl->ready, archive::set_up(db, path));
  }
  if (m_impl->ready) {
    auto begun = retry_while_locked(db, [&] { return db.exec("BEGIN IMMEDIATE"); });
    if (begun) {
      FERRY_TRY(m_impl->store(run));
      return RecordOutcome{};
    }
    if (!begun.error().locked()) {
      return archive_error(path, fmt::format("record run {}", run.run_id), begun.error(), &db);
    }
  }
  // Another process held the lock for all of the wait.
  return m_impl->spool(run);
}

namespace {

// The validated filters of `log`: ErrorKind::usage for a bad one.
struct LogQuery {
  std::string sql;
  std::optional<std::string> since;
};

Expected<LogQuery> log_query(const LogFilter& filter, std::string_view columns)
{
  LogQuery query;
  if (filter.since) {
    FERRY_TRY_ASSIGN(query.since, normalize_since(*filter.since));
  }
  if (filter.status && !run_status_from(*filter.status)) {
    return fail(ErrorKind::usage, "--status '{}': expected one of {}", *filter.status,
                fmt::join(run_status_names(), ", "));
  }
  if (filter.limit < 0) {
    return fail(ErrorKind::usage, "--limit {}: expected 0 (no limit) or more", filter.limit);
  }
  // Which runs, chosen on the small columns and the indexes; only then their records (and
  // BLOBs), so a sort never drags stdout along.
  std::string which = "SELECT rowid FROM runs WHERE 1";
  if (filter.job) {
    which += " AND job = ?1";
  }
  if (filter.host) {
    which += " AND (host = ?2 OR host_label = ?2)";
  }
  if (filter.status) {
    which += " AND status = ?3";
  }
  if (query.since) {
    which += " AND started_at >= ?4";
  }
  if (filter.invocation) {
    which += " AND run_id IN (SELECT run_id FROM run_invocations WHERE invocation = ?6)";
  }
  which += " ORDER BY started_at DESC, rowid DESC";
  if (filter.limit > 0) {
    which += " LIMIT ?5";
  }
  query.sql =
      fmt::format("SELECT {} FROM runs WHERE rowid IN ({}) ORDER BY started_at DESC, rowid DESC",
                  columns, which);
  return query;
}

void bind_log_filter(Statement& stmt, const LogFilter& filter, const LogQuery& query)
{
  if (filter.job) {
    stmt.bind(1, *filter.job);
  }
  if (filter.host) {
    stmt.bind(2, *filter.host);
  }
  if (filter.status) {
    stmt.bind(3, *filter.status);
  }
  if (query.since) {
    stmt.bind(4, *query.since);
  }
  if (filter.invocation) {
    stmt.bind(6, *filter.invocation);
  }
  if (filter.limit > 0) {
    stmt.bind(5, static_cast<std::int64_t>(filter.limit));
  }
}

// Every row of `stmt`, each made into an item by FROM_ROW and handed to EACH as it is read.
template <typename FromRow, typename Each>
Expected<void> each_row(Statement& stmt, Database& db, const fs::path& path, FromRow from_row,
                        Each each)
{
  for (;;) {
    FERRY_TRY_ASSIGN(const bool row, explained(stmt.step(), path, "read archive", &db));
    if (!row) {
      return {};
    }
    FERRY_TRY_ASSIGN(auto item, from_row(stmt, path));
    FERRY_TRY(each(std::move(item)));
  }
}

// Every row of `stmt`, each made into a T by FROM_ROW.
template <typename T, typename FromRow>
Expected<std::vector<T>> read_rows(Statement& stmt, Database& db, const fs::path& path,
                                   FromRow from_row)
{
  std::vector<T> rows;
  FERRY_TRY(each_row(stmt, db, path, from_row, [&rows](T&& item) -> Expected<void> {
    rows.push_back(std::move(item));
    return {};
  }));
  return rows;
}

// The run with id RUN_ID (with its script's sha256); ErrorKind::failed when it is gone, which
// only a prune between resolving and loading can do.
Expected<std::pair<RunRecord, std::optional<std::string>>>
load_by_id(Database& db, const fs::path& path, const std::string& run_id)
{
  FERRY_TRY_ASSIGN(auto stmt,
                   explained(db.prepare(fmt::format("SELECT {}, script_sha256 FROM runs WHERE "
                                                    "run_id = ?1",
                                                    archive::record_columns)),
                             path, "read archive", &db));
  stmt.bind(1, run_id);
  FERRY_TRY_ASSIGN(const bool row, explained(stmt.step(), path, "read archive", &db));
  if (!row) {
    return fail(ErrorKind::failed, "run {} left archive {} while it was read (pruned?)", run_id,
                path.string());
  }
  FERRY_TRY_ASSIGN(auto run, archive::record_from_row(stmt, path));
  return std::pair{std::move(run), stmt.column_optional(archive::script_sha256_column)};
}

// The script bytes stored under SHA256; nothing when there is no such script.
SqliteResult<std::optional<std::string>> script_bytes(Database& db, const std::string& sha256)
{
  FERRY_TRY_ASSIGN(auto stmt, db.prepare("SELECT bytes FROM scripts WHERE sha256 = ?1"));
  FERRY_TRY_ASSIGN(const bool row, stmt.bind(1, sha256).step());
  return row ? std::optional(stmt.column_bytes(0)) : std::nullopt;
}

// The script of RUN filed under SHA256 is there and its bytes hash to SHA256.
Expected<void> verify_script(const RunRecord& run, const std::optional<std::string>& script,
                             const std::string& sha256, const fs::path& path)
{
  if (!script) {
    return fail(ErrorKind::failed,
                "the script of run {} (sha256 {}) is missing from archive {}; the archive was "
                "changed outside ferry — refusing to use it",
                run.run_id, sha256, path.string());
  }
  if (const std::string actual = sha256_hex(*script); actual != sha256) {
    return fail(ErrorKind::failed,
                "the archived script of run {} does not match its sha256: archive {} files it "
                "under {}, but its bytes hash to {}; the archive was changed outside ferry — "
                "refusing to use it",
                run.run_id, path.string(), sha256, actual);
  }
  return {};
}

// The bytes of RUN's staged files and archived outputs (run_files), into run.blobs; with
// `verify`, a missing blob or one whose bytes do not hash to its name is an error.
Expected<void> load_file_blobs(Database& db, RunRecord& run, bool verify, const fs::path& path)
{
  FERRY_TRY_ASSIGN(auto stmt,
                   explained(db.prepare("SELECT f.path, f.sha256, s.bytes FROM run_files f "
                                        "LEFT JOIN scripts s ON s.sha256 = f.sha256 "
                                        "WHERE f.run_id = ?1 AND f.archived = 1"),
                             path, "read archive", &db));
  stmt.bind(1, run.run_id);
  for (;;) {
    FERRY_TRY_ASSIGN(const bool row, explained(stmt.step(), path, "read archive", &db));
    if (!row) {
      return {};
    }
    const std::string sha256 = stmt.column_bytes(1);
    if (stmt.is_null(2)) {
      if (verify) {
        return fail(ErrorKind::failed,
                    "the file {} of run {} (sha256 {}) is missing from archive {}; the archive "
                    "was changed outside ferry — refusing to use it",
                    stmt.column_bytes(0), run.run_id, sha256, path.string());
      }
      continue;
    }
    std::string bytes = stmt.column_bytes(2);
    if (verify && sha256_hex(bytes) != sha256) {
      return fail(ErrorKind::failed,
                  "the archived file {} of run {} does not match its sha256 {}; the archive was "
                  "changed outside ferry — refusing to use it",
                  stmt.column_bytes(0), run.run_id, sha256);
    }
    run.blobs.emplace(sha256, std::move(bytes));
  }
}

} // namespace

Expected<std::vector<RunRecord>> Archive::log(const LogFilter& filter)
{
  std::vector<RunRecord> runs;
  FERRY_TRY(log_each(filter, [&runs](RunRecord&& run) -> Expected<void> {
    runs.push_back(std::move(run));
    return {};
  }));
  return runs;
}

// The runs are chosen and ordered by rowid first, then read one by one: a query that selected
// their records would sort them, BLOBs and all, in memory before it returned the first.
Expected<void> Archive::log_each(const LogFilter& filter,
                                 const std::function<Expected<void>(RunRecord&&)>& each)
{
  std::lock_guard lock(m_impl->mutex);
  Database& db = m_impl->db;
  const fs::path& path = m_impl->path;
  FERRY_TRY_ASSIGN(auto query, log_query(filter, "rowid"));
  FERRY_TRY_ASSIGN(const bool usable, m_impl->usable());
  if (!usable) {
    return {};
  }
  db.start_lock_wait(m_impl->lock_wait);
  FERRY_TRY_ASSIGN(auto which, explained(db.prepare(query.sql), path, "read archive", &db));
  bind_log_filter(which, filter, query);
  std::vector<std::int64_t> rowids;
  FERRY_TRY(each_row(
      which, db, path,
      [](const Statement& row, const fs::path&) -> Expected<std::int64_t> {
        return row.column_int(0);
      },
      [&rowids](std::int64_t rowid) -> Expected<void> {
        rowids.push_back(rowid);
        return {};
      }));
  FERRY_TRY_ASSIGN(auto stmt,
                   explained(db.prepare(fmt::format("SELECT {} FROM runs WHERE rowid = ?1",
                                                    filter.with_output
                                                        ? archive::record_columns
                                                        : archive::record_columns_without_output)),
                             path, "read archive", &db));
  for (const std::int64_t rowid : rowids) {
    stmt.reset();
    stmt.bind(1, rowid);
    // A run pruned since it was chosen is left out.
    FERRY_TRY(each_row(stmt, db, path, archive::record_from_row, each));
  }
  return {};
}

Expected<std::vector<RunSummary>> Archive::list(const LogFilter& filter)
{
  std::lock_guard lock(m_impl->mutex);
  Database& db = m_impl->db;
  const fs::path& path = m_impl->path;
  FERRY_TRY_ASSIGN(auto query, log_query(filter, archive::summary_columns));
  FERRY_TRY_ASSIGN(const bool usable, m_impl->usable());
  if (!usable) {
    return std::vector<RunSummary>{};
  }
  db.start_lock_wait(m_impl->lock_wait);
  FERRY_TRY_ASSIGN(auto stmt, explained(db.prepare(query.sql), path, "read archive", &db));
  bind_log_filter(stmt, filter, query);
  return read_rows<RunSummary>(stmt, db, path, archive::summary_from_row);
}

Expected<std::string> Archive::resolve(std::string_view ref, const RunNarrowing& narrow)
{
  std::lock_guard lock(m_impl->mutex);
  return m_impl->resolve(ref, narrow);
}

Expected<std::string> Archive::resolve_invocation(std::string_view ref)
{
  std::lock_guard lock(m_impl->mutex);
  FERRY_TRY_ASSIGN(const bool is_usable, m_impl->usable());
  if (!is_usable) {
    return fail(ErrorKind::usage, "no invocation '{}': archive {} holds no runs yet", ref,
                m_impl->path.string());
  }
  m_impl->db.start_lock_wait(m_impl->lock_wait);
  return archive::resolve_invocation(m_impl->db, m_impl->path, ref);
}

Expected<RunRecord> Archive::load(std::string_view ref, const LoadOptions& options)
{
  std::lock_guard lock(m_impl->mutex);
  Database& db = m_impl->db;
  const fs::path& path = m_impl->path;
  FERRY_TRY_ASSIGN(const auto run_id, m_impl->resolve(ref, options.narrow));
  FERRY_TRY_ASSIGN(auto picked, load_by_id(db, path, run_id));
  auto& [run, script_sha256] = picked;
  if (!run.files.empty() || !run.outputs.empty()) {
    FERRY_TRY(load_file_blobs(db, run, options.verify_blobs, path));
  }
  if (!script_sha256) {
    return std::move(run);
  }
  FERRY_TRY_ASSIGN(auto script,
                   explained(script_bytes(db, *script_sha256), path, "read archive", &db));
  if (options.verify_blobs) {
    FERRY_TRY(verify_script(run, script, *script_sha256, path));
  }
  run.script = std::move(script).value_or(std::string());
  return std::move(run);
}

Expected<PruneOutcome> Archive::prune(const PruneOptions& options)
{
  std::lock_guard lock(m_impl->mutex);
  if (!m_impl->writable) {
    return fail(ErrorKind::failed, "cannot prune archive {}: it was opened read-only",
                m_impl->path.string());
  }
  FERRY_TRY_ASSIGN(const bool usable, m_impl->usable());
  if (!usable) {
    return PruneOutcome{};
  }
  m_impl->db.start_lock_wait(m_impl->lock_wait);
  return archive::prune_runs(m_impl->db, m_impl->path, options);
}

Expected<ArchiveStats> Archive::stats(int largest)
{
  std::lock_guard lock(m_impl->mutex);
  FERRY_TRY_ASSIGN(const bool usable, m_impl->usable());
  if (!usable) {
    return ArchiveStats{};
  }
  m_impl->db.start_lock_wait(m_impl->lock_wait);
  return archive::archive_stats(m_impl->db, m_impl->path, largest);
}

} // namespace ferry

namespace ferry {

Expected<void> Archive::record_detached(const RunRecord& run)
{
  std::lock_guard lock(m_impl->mutex);
  Database& db = m_impl->db;
  const fs::path& path = m_impl->path;
  FERRY_TRY_ASSIGN(const bool is_usable, m_impl->usable());
  if (!is_usable || !m_impl->writable) {
    return fail(ErrorKind::failed, "cannot record detached run {}: archive {} is not writable",
                run.run_id, path.string());
  }
  db.start_lock_wait(m_impl->lock_wait);
  const std::string record = to_json_line(to_json(run, false));
  return explained(retry_while_locked(db,
                                      [&]() -> SqliteResult<> {
                                        FERRY_TRY_ASSIGN(
                                            auto stmt,
                                            db.prepare("INSERT OR REPLACE INTO detached_runs("
                                                       "run_id, host_label, started_at, record, "
                                                       "script) VALUES (?, ?, ?, ?, ?)"));
                                        stmt.bind(1, run.run_id)
                                            .bind(2, run.host_label)
                                            .bind(3, run.started_at)
                                            .bind(4, record)
                                            .bind_blob(5, run.script);
                                        return stmt.run();
                                      }),
                   path, fmt::format("record detached run {}", run.run_id), &db);
}

Expected<std::vector<RunRecord>> Archive::detached_runs()
{
  std::lock_guard lock(m_impl->mutex);
  Database& db = m_impl->db;
  const fs::path& path = m_impl->path;
  FERRY_TRY_ASSIGN(const bool is_usable, m_impl->usable());
  std::vector<RunRecord> runs;
  if (!is_usable) {
    return runs;
  }
  db.start_lock_wait(m_impl->lock_wait);
  FERRY_TRY_ASSIGN(auto stmt,
                   explained(db.prepare("SELECT record, script, host_label FROM detached_runs "
                                        "ORDER BY started_at DESC, run_id DESC"),
                             path, "read detached runs", &db));
  for (;;) {
    FERRY_TRY_ASSIGN(const bool row, explained(stmt.step(), path, "read detached runs", &db));
    if (!row) {
      break;
    }
    const auto parsed = nlohmann::json::parse(stmt.column_view(0), nullptr, false);
    auto run = run_record_from_json(parsed);
    if (!run) {
      return fail(ErrorKind::failed, "archive {}: a detached run's record is damaged: {}",
                  path.string(), run.error().message);
    }
    run->script = stmt.column_bytes(1);
    run->host_label = stmt.column_bytes(2);
    runs.push_back(std::move(*run));
  }
  return runs;
}

Expected<void> Archive::forget_detached(std::string_view run_id)
{
  std::lock_guard lock(m_impl->mutex);
  Database& db = m_impl->db;
  db.start_lock_wait(m_impl->lock_wait);
  return explained(
      retry_while_locked(db,
                         [&]() -> SqliteResult<> {
                           FERRY_TRY_ASSIGN(
                               auto stmt, db.prepare("DELETE FROM detached_runs WHERE run_id = ?"));
                           stmt.bind(1, run_id);
                           return stmt.run();
                         }),
      m_impl->path, fmt::format("forget detached run {}", run_id), &db);
}

} // namespace ferry
