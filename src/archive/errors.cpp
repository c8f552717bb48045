#include <cerrno>
#include <cstring>

#include "archive/errors.hpp"

namespace ferry::archive {

namespace {

std::string quick_check_summary(Database* db)
{
  if (db == nullptr || !*db) {
    return {};
  }
  auto check = db->prepare("PRAGMA quick_check(3)");
  if (!check) {
    return {};
  }
  std::string lines;
  for (auto row = check->step(); row && *row; row = check->step()) {
    lines += lines.empty() ? "" : "; ";
    lines += check->column_bytes(0);
  }
  return lines.empty() || lines == "ok" ? std::string() : "; quick_check: " + lines;
}

std::string system_error(const Database* db)
{
  const int err = db != nullptr && *db ? sqlite3_system_errno(db->handle()) : 0;
  return err != 0 ? fmt::format(", {}", std::strerror(err)) : std::string();
}

// What kept the archive locked, and for how long this connection waited (not a fixed figure:
// the wait ends early when SQLite gives up at once).
std::string lock_holder(const Database* db)
{
  if (db == nullptr || !*db) {
    return "is locked by another process";
  }
  return fmt::format("stayed locked by another process for {:.1f} s",
                     static_cast<double>(db->lock_waited().count()) / 1000);
}

} // namespace

Unexpected<Error> archive_error(const std::filesystem::path& path, std::string_view doing,
                                const SqliteError& error, Database* db)
{
  const std::string p = path.string();
  const int err = db != nullptr && *db ? sqlite3_system_errno(db->handle()) : 0;
  const bool out_of_space = error.primary() == SQLITE_FULL ||
                            (error.primary() == SQLITE_IOERR && (err == ENOSPC || err == EDQUOT));
  if (out_of_space) {
    return fail(ErrorKind::failed,
                "cannot {}: the disk holding archive {} is full ({}{}); the archive is unchanged "
                "— free some space, or pass --archive PATH on another disk",
                doing, p, error.message, system_error(db));
  }
  switch (error.primary()) {
  case SQLITE_READONLY:
  case SQLITE_PERM:
  case SQLITE_AUTH:
    return fail(ErrorKind::failed,
                "cannot {}: archive {} is read-only ({}); make it and its directory writable, or "
                "pass --archive NEW_PATH",
                doing, p, error.message);
  case SQLITE_CORRUPT:
  case SQLITE_NOTADB:
    return fail(ErrorKind::failed,
                "cannot {}: archive {} is damaged ({}{}); ferry left it untouched — move it "
                "aside to start a new archive, or try `sqlite3 {} .recover`",
                doing, p, error.message, quick_check_summary(db), p);
  case SQLITE_BUSY:
  case SQLITE_LOCKED:
    return fail(ErrorKind::failed, "cannot {}: archive {} {}; try again when it has finished",
                doing, p, lock_holder(db));
  case SQLITE_CANTOPEN:
    return fail(ErrorKind::failed,
                "cannot {}: cannot open archive {} ({}{}); check that it and its directory exist "
                "and are writable, or pass --archive NEW_PATH",
                doing, p, error.message, system_error(db));
  case SQLITE_IOERR:
    return fail(ErrorKind::failed,
                "cannot {}: I/O error on archive {} ({}{}); check the disk, or pass --archive "
                "NEW_PATH",
                doing, p, error.message, system_error(db));
  default:
    return fail(ErrorKind::failed, "cannot {}: archive {}: {}", doing, p, error.message);
  }
}

} // namespace ferry::archive
