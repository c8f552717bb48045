#include <algorithm>
#include <climits>
#include <random>
#include <thread>

#include "archive/sqlite.hpp"

namespace ferry::archive {

namespace {
SqliteError error_of(sqlite3* db, int code)
{
  return {code, db != nullptr ? sqlite3_errmsg(db) : sqlite3_errstr(code)};
}

int checked_size(std::size_t size)
{
  return size > static_cast<std::size_t>(INT_MAX) ? -1 : static_cast<int>(size);
}

using Clock = std::chrono::steady_clock;

// 1, 2, 4 ... 64 ms, each between half and all of that at random: processes that met at one
// lock do not all come back at the same moment.
Clock::duration backoff_delay(int attempt)
{
  thread_local std::minstd_rand random(std::random_device{}());
  const int full_us = 1000 << std::clamp(attempt, 0, 6);
  std::uniform_int_distribution<int> pick(full_us / 2, full_us);
  return std::chrono::microseconds(pick(random));
}

void sleep_before_deadline(Clock::duration delay, Clock::time_point deadline)
{
  const auto now = Clock::now();
  if (now < deadline) {
    std::this_thread::sleep_for(std::min(delay, deadline - now));
  }
}

// SQLite's busy handler: wait and try again (non-zero) until the deadline.
extern "C" int wait_for_lock(void* context, int attempt)
{
  const auto* wait = static_cast<const Database::LockWait*>(context);
  if (Clock::now() >= wait->deadline) {
    return 0;
  }
  sleep_before_deadline(backoff_delay(attempt), wait->deadline);
  return 1;
}
} // namespace

SqliteResult<Database> Database::open(const std::string& path, int flags)
{
  sqlite3* handle = nullptr;
  const int rc = sqlite3_open_v2(path.c_str(), &handle, flags | SQLITE_OPEN_EXRESCODE, nullptr);
  Database db;
  db.m_db.reset(handle); // closed on every path, also when the open failed
  if (rc != SQLITE_OK) {
    return Unexpected{error_of(handle, rc)};
  }
  sqlite3_extended_result_codes(handle, 1);
  db.m_lock_wait = std::make_unique<LockWait>();
  db.start_lock_wait(std::chrono::milliseconds(0));
  sqlite3_busy_handler(handle, wait_for_lock, db.m_lock_wait.get());
  return db;
}

void Database::start_lock_wait(std::chrono::milliseconds budget)
{
  if (m_lock_wait) {
    m_lock_wait->start = Clock::now();
    m_lock_wait->deadline = m_lock_wait->start + budget;
  }
}

std::chrono::milliseconds Database::lock_waited() const
{
  if (!m_lock_wait) {
    return {};
  }
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - m_lock_wait->start);
}

bool Database::lock_wait_over() const
{
  return !m_lock_wait || Clock::now() >= m_lock_wait->deadline;
}

void Database::back_off(int attempt) const
{
  if (m_lock_wait) {
    sleep_before_deadline(backoff_delay(attempt), m_lock_wait->deadline);
  }
}

SqliteResult<> Database::exec(const std::string& sql)
{
  const int rc = sqlite3_exec(m_db.get(), sql.c_str(), nullptr, nullptr, nullptr);
  if (rc != SQLITE_OK) {
    return Unexpected{last_error()};
  }
  return {};
}

SqliteResult<Statement> Database::prepare(std::string_view sql)
{
  sqlite3_stmt* handle = nullptr;
  const int rc =
      sqlite3_prepare_v2(m_db.get(), sql.data(), checked_size(sql.size()), &handle, nullptr);
  Statement stmt;
  stmt.m_stmt.reset(handle);
  stmt.m_db = m_db.get();
  if (rc != SQLITE_OK) {
    return Unexpected{last_error()};
  }
  return stmt;
}

SqliteError Database::last_error() const
{
  return error_of(m_db.get(), sqlite3_extended_errcode(m_db.get()));
}

namespace {
void keep_first_error(std::optional<SqliteError>& slot, sqlite3* db, int rc)
{
  if (rc != SQLITE_OK && !slot) {
    slot = error_of(db, rc);
  }
}
} // namespace

Statement& Statement::bind(int index, std::string_view text)
{
  keep_first_error(m_bind_error, m_db,
                   sqlite3_bind_text64(m_stmt.get(), index, text.data(), text.size(),
                                       SQLITE_TRANSIENT, SQLITE_UTF8));
  return *this;
}

Statement& Statement::bind_blob(int index, std::string_view bytes)
{
  // SQLITE_STATIC: callers bind bytes that outlive the statement's step (stdout and stderr can
  // be 16 MiB each; a copy would double ferry's peak memory).
  // A zero-length blob still has to be a blob, not NULL: sqlite3_bind_blob64 with a null
  // pointer would store NULL.
  static const char empty = 0;
  const char* data = bytes.empty() ? &empty : bytes.data();
  keep_first_error(m_bind_error, m_db,
                   sqlite3_bind_blob64(m_stmt.get(), index, data, bytes.size(), SQLITE_STATIC));
  return *this;
}

Statement& Statement::bind_zeroblob(int index, std::uint64_t size)
{
  keep_first_error(m_bind_error, m_db, sqlite3_bind_zeroblob64(m_stmt.get(), index, size));
  return *this;
}

SqliteResult<BlobWriter> BlobWriter::open(Database& db, const char* table, const char* column,
                                          std::int64_t rowid)
{
  sqlite3_blob* handle = nullptr;
  const int rc = sqlite3_blob_open(db.handle(), "main", table, column, rowid, 1, &handle);
  BlobWriter writer;
  writer.m_blob.reset(handle);
  writer.m_db = &db;
  if (rc != SQLITE_OK) {
    return Unexpected{db.last_error()};
  }
  return writer;
}

SqliteResult<> BlobWriter::write(std::uint64_t offset, std::string_view bytes)
{
  constexpr std::size_t chunk = 1 << 20;
  for (std::size_t done = 0; done < bytes.size(); done += chunk) {
    const std::size_t n = std::min(chunk, bytes.size() - done);
    const std::uint64_t at = offset + done;
    if (at + n > static_cast<std::uint64_t>(INT_MAX)) {
      return Unexpected{SqliteError{SQLITE_TOOBIG, "blob larger than 2 GiB"}};
    }
    if (sqlite3_blob_write(m_blob.get(), bytes.data() + done, static_cast<int>(n),
                           static_cast<int>(at)) != SQLITE_OK) {
      return Unexpected{m_db->last_error()};
    }
  }
  return {};
}

SqliteResult<> BlobWriter::close()
{
  if (sqlite3_blob_close(m_blob.release()) != SQLITE_OK) {
    return Unexpected{m_db->last_error()};
  }
  return {};
}

SqliteResult<> write_blob(Database& db, const char* table, const char* column, std::int64_t rowid,
                          std::string_view bytes)
{
  if (bytes.empty()) {
    return {};
  }
  FERRY_TRY_ASSIGN(auto blob, BlobWriter::open(db, table, column, rowid));
  FERRY_TRY(blob.write(0, bytes));
  return blob.close();
}

Statement& Statement::bind(int index, std::int64_t value)
{
  keep_first_error(m_bind_error, m_db, sqlite3_bind_int64(m_stmt.get(), index, value));
  return *this;
}

Statement& Statement::bind(int index, double value)
{
  keep_first_error(m_bind_error, m_db, sqlite3_bind_double(m_stmt.get(), index, value));
  return *this;
}

Statement& Statement::bind_null(int index)
{
  keep_first_error(m_bind_error, m_db, sqlite3_bind_null(m_stmt.get(), index));
  return *this;
}

Statement& Statement::bind_optional(int index, const std::optional<std::string>& text)
{
  return text ? bind(index, std::string_view(*text)) : bind_null(index);
}

Statement& Statement::bind_optional(int index, const std::optional<int>& value)
{
  return value ? bind(index, static_cast<std::int64_t>(*value)) : bind_null(index);
}

SqliteResult<bool> Statement::step()
{
  if (m_bind_error) {
    return Unexpected{*m_bind_error};
  }
  const int rc = sqlite3_step(m_stmt.get());
  if (rc == SQLITE_ROW) {
    return true;
  }
  if (rc == SQLITE_DONE) {
    return false;
  }
  return Unexpected{error_of(m_db, sqlite3_extended_errcode(m_db))};
}

SqliteResult<> Statement::run()
{
  FERRY_TRY(step());
  return {};
}

void Statement::reset()
{
  sqlite3_reset(m_stmt.get());
  sqlite3_clear_bindings(m_stmt.get());
  m_bind_error.reset();
}

bool Statement::is_null(int column) const
{
  return sqlite3_column_type(m_stmt.get(), column) == SQLITE_NULL;
}

std::int64_t Statement::column_int(int column) const
{
  return sqlite3_column_int64(m_stmt.get(), column);
}

double Statement::column_double(int column) const
{
  return sqlite3_column_double(m_stmt.get(), column);
}

std::string Statement::column_bytes(int column) const
{
  return std::string(column_view(column));
}

std::string_view Statement::column_view(int column) const
{
  // sqlite3_column_blob before sqlite3_column_bytes: the documented order that avoids a
  // text/blob conversion.
  const void* data = sqlite3_column_blob(m_stmt.get(), column);
  const int size = sqlite3_column_bytes(m_stmt.get(), column);
  if (data == nullptr || size <= 0) {
    return {};
  }
  return {static_cast<const char*>(data), static_cast<std::size_t>(size)};
}

std::optional<std::string> Statement::column_optional(int column) const
{
  if (is_null(column)) {
    return std::nullopt;
  }
  return column_bytes(column);
}

} // namespace ferry::archive
