#pragma once
// Thin RAII over the SQLite C API: a connection, a prepared statement, and errors that keep the
// SQLite result code so the archive can tell "disk full" from "corrupt" from "read-only".
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include <sqlite3.h>

#include "ferry/expected.hpp"

namespace ferry::archive {

struct SqliteError {
  int code = SQLITE_ERROR; // extended result code
  std::string message;     // sqlite3_errmsg at the time

  [[nodiscard]] int primary() const { return code & 0xff; }
  // Another connection held a lock this one needed.
  [[nodiscard]] bool locked() const
  {
    return primary() == SQLITE_BUSY || primary() == SQLITE_LOCKED;
  }
};

// The result of one SQLite operation: its value, or the error SQLite gave.
template <typename T = void> using SqliteResult = Expected<T, SqliteError>;

class Statement;

class Database {
public:
  // flags: SQLITE_OPEN_* (SQLITE_OPEN_EXRESCODE is always added).
  [[nodiscard]] static SqliteResult<Database> open(const std::string& path, int flags);

  Database() = default;

  // One or more statements without results (sqlite3_exec).
  [[nodiscard]] SqliteResult<> exec(const std::string& sql);
  [[nodiscard]] SqliteResult<Statement> prepare(std::string_view sql);
  [[nodiscard]] SqliteError last_error() const;

  // From now on, waits at most `budget` in all for other connections' locks: SQLite's busy
  // handler waits inside a call, retry_while_locked() between calls that SQLite failed at once.
  void start_lock_wait(std::chrono::milliseconds budget);
  // Time since start_lock_wait: how long the current operation has been kept waiting, at most.
  [[nodiscard]] std::chrono::milliseconds lock_waited() const;
  [[nodiscard]] bool lock_wait_over() const;
  // Sleeps before retry number `attempt` (growing, jittered, never past the budget).
  void back_off(int attempt) const;

  [[nodiscard]] sqlite3* handle() const { return m_db.get(); }
  [[nodiscard]] explicit operator bool() const { return m_db != nullptr; }

  struct LockWait {
    std::chrono::steady_clock::time_point start;
    std::chrono::steady_clock::time_point deadline;
  };

private:
  struct Closer {
    void operator()(sqlite3* db) const { sqlite3_close_v2(db); }
  };
  std::unique_ptr<sqlite3, Closer> m_db;
  // On the heap: SQLite's busy handler keeps a pointer to it across moves of the Database.
  std::unique_ptr<LockWait> m_lock_wait;
};

// Runs `attempt` (returning SqliteResult<T>) again while it fails because another connection
// holds a lock and the wait budget is not spent. SQLite returns SQLITE_BUSY at once, without
// its busy handler, in a few places: switching to WAL while another process opens the file,
// a WAL being recovered, a lock upgrade that would deadlock.
template <typename F> auto retry_while_locked(Database& db, F attempt) -> decltype(attempt())
{
  for (int tries = 0;; ++tries) {
    auto result = attempt();
    if (result || !result.error().locked() || db.lock_wait_over()) {
      return result;
    }
    db.back_off(tries);
  }
}

// Writes into one (zeroblob-sized) BLOB in place, so a large value never sits whole in a row
// record in memory (SQLite's INSERT would build one).
class BlobWriter {
public:
  [[nodiscard]] static SqliteResult<BlobWriter> open(Database& db, const char* table,
                                                     const char* column, std::int64_t rowid);
  BlobWriter() = default;

  // At byte `offset` of the blob; the blob keeps its size.
  [[nodiscard]] SqliteResult<> write(std::uint64_t offset, std::string_view bytes);
  // Closes the handle; its error, if any.
  [[nodiscard]] SqliteResult<> close();

private:
  struct Closer {
    void operator()(sqlite3_blob* blob) const { sqlite3_blob_close(blob); }
  };
  std::unique_ptr<sqlite3_blob, Closer> m_blob;
  Database* m_db = nullptr;
};

// Writes `bytes` into the (zeroblob-sized) column of row `rowid` with a BlobWriter.
[[nodiscard]] SqliteResult<> write_blob(Database& db, const char* table, const char* column,
                                        std::int64_t rowid, std::string_view bytes);

class Statement {
public:
  Statement() = default;

  // Binds by 1-based index; text and blobs are copied (SQLITE_TRANSIENT).
  Statement& bind(int index, std::string_view text);
  // The bytes must stay alive until the statement has run (bound without a copy).
  Statement& bind_blob(int index, std::string_view bytes);
  // A blob of `size` zero bytes, to be filled afterwards with write_blob.
  Statement& bind_zeroblob(int index, std::uint64_t size);
  Statement& bind(int index, std::int64_t value);
  Statement& bind(int index, double value);
  Statement& bind_null(int index);
  // NULL when empty.
  Statement& bind_optional(int index, const std::optional<std::string>& text);
  Statement& bind_optional(int index, const std::optional<int>& value);

  // true: a row is ready; false: done. The first failed bind, or the step's own error.
  [[nodiscard]] SqliteResult<bool> step();
  // Runs a statement that returns no rows.
  [[nodiscard]] SqliteResult<> run();
  void reset();

  [[nodiscard]] bool is_null(int column) const;
  [[nodiscard]] std::int64_t column_int(int column) const;
  [[nodiscard]] double column_double(int column) const;
  // Text or blob bytes exactly as stored.
  [[nodiscard]] std::string column_bytes(int column) const;
  // The same bytes without a copy; valid until the next step, reset or column call.
  [[nodiscard]] std::string_view column_view(int column) const;
  [[nodiscard]] std::optional<std::string> column_optional(int column) const;

private:
  friend class Database;
  struct Finalizer {
    void operator()(sqlite3_stmt* stmt) const { sqlite3_finalize(stmt); }
  };
  std::unique_ptr<sqlite3_stmt, Finalizer> m_stmt;
  sqlite3* m_db = nullptr;
  std::optional<SqliteError> m_bind_error; // the first bind that failed, reported by step()
};

} // namespace ferry::archive
