#include <climits>

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
} // namespace

SqliteStatus Database::open(const std::string& path, int flags, Database& out)
{
  sqlite3* db = nullptr;
  const int rc = sqlite3_open_v2(path.c_str(), &db, flags | SQLITE_OPEN_EXRESCODE, nullptr);
  out.m_db.reset(db);
  if (rc != SQLITE_OK) {
    SqliteError error = error_of(db, rc);
    out.m_db.reset();
    return error;
  }
  sqlite3_extended_result_codes(db, 1);
  return std::nullopt;
}

SqliteStatus Database::exec(const std::string& sql)
{
  const int rc = sqlite3_exec(m_db.get(), sql.c_str(), nullptr, nullptr, nullptr);
  if (rc != SQLITE_OK) {
    return error_of(m_db.get(), sqlite3_extended_errcode(m_db.get()));
  }
  return std::nullopt;
}

SqliteStatus Database::prepare(std::string_view sql, Statement& out)
{
  sqlite3_stmt* stmt = nullptr;
  const int rc =
      sqlite3_prepare_v2(m_db.get(), sql.data(), checked_size(sql.size()), &stmt, nullptr);
  out.m_stmt.reset(stmt);
  out.m_db = m_db.get();
  out.m_bind_error.reset();
  if (rc != SQLITE_OK) {
    return error_of(m_db.get(), sqlite3_extended_errcode(m_db.get()));
  }
  return std::nullopt;
}

SqliteError Database::last_error() const
{
  return error_of(m_db.get(), sqlite3_extended_errcode(m_db.get()));
}

namespace {
void keep_first_error(SqliteStatus& slot, sqlite3* db, int rc)
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

SqliteStatus write_blob(Database& db, const char* table, const char* column, std::int64_t rowid,
                        std::string_view bytes)
{
  if (bytes.empty()) {
    return std::nullopt;
  }
  sqlite3_blob* blob = nullptr;
  int rc = sqlite3_blob_open(db.handle(), "main", table, column, rowid, 1, &blob);
  constexpr std::size_t chunk = 1 << 20;
  for (std::size_t done = 0; rc == SQLITE_OK && done < bytes.size(); done += chunk) {
    const std::size_t n = std::min(chunk, bytes.size() - done);
    rc = sqlite3_blob_write(blob, bytes.data() + done, static_cast<int>(n), static_cast<int>(done));
  }
  SqliteStatus status;
  if (rc != SQLITE_OK) {
    status = db.last_error();
  }
  sqlite3_blob_close(blob);
  return status;
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

SqliteStatus Statement::step(bool& has_row)
{
  has_row = false;
  if (m_bind_error) {
    return m_bind_error;
  }
  const int rc = sqlite3_step(m_stmt.get());
  if (rc == SQLITE_ROW) {
    has_row = true;
    return std::nullopt;
  }
  if (rc == SQLITE_DONE) {
    return std::nullopt;
  }
  return error_of(m_db, sqlite3_extended_errcode(m_db));
}

SqliteStatus Statement::run()
{
  bool has_row = false;
  if (auto error = step(has_row)) {
    return error;
  }
  return std::nullopt;
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
