// The archive when other processes hold its locks: what SQLite refuses at once is retried, and
// a lock that outlasts the wait is reported with the time actually waited.
#include <atomic>
#include <chrono>
#include <regex>
#include <thread>

#include "archive/schema.hpp"
#include "archive_test_support.hpp"

namespace {

namespace fs = std::filesystem;
using namespace archive_test;
using namespace std::chrono_literals;
using ferry::ArchiveOptions;

// A connection outside the Archive (another ferry, or someone in sqlite3) holding the archive's
// write lock until released.
class LockHolder {
public:
  explicit LockHolder(const fs::path& path)
  {
    REQUIRE(sqlite3_open(path.c_str(), &m_db) == SQLITE_OK);
    REQUIRE(sqlite3_exec(m_db, "BEGIN IMMEDIATE", nullptr, nullptr, nullptr) == SQLITE_OK);
  }
  ~LockHolder() { release(); }
  LockHolder(const LockHolder&) = delete;
  LockHolder& operator=(const LockHolder&) = delete;

  void release()
  {
    if (m_db != nullptr) {
      sqlite3_exec(m_db, "ROLLBACK", nullptr, nullptr, nullptr);
      sqlite3_close(m_db);
      m_db = nullptr;
    }
  }

private:
  sqlite3* m_db = nullptr;
};

ArchiveOptions waiting(std::chrono::milliseconds wait)
{
  ArchiveOptions options;
  options.lock_wait = wait;
  return options;
}

// The seconds a lock message says it waited, or -1.
double waited_seconds(const std::string& message)
{
  std::smatch match;
  static const std::regex waited("stayed locked by another process for ([0-9]+\\.[0-9]) s");
  return std::regex_search(message, match, waited) ? std::stod(match[1]) : -1;
}

} // namespace

TEST_CASE("archive: a lock SQLite refuses at once while the archive is created is waited for",
          "[archive][locks]")
{
  TempDir tmp;
  const auto path = tmp / "archive.db";
  // Another process is creating the archive: a new file, rollback journal, write lock taken.
  // SQLite then refuses the switch to WAL at once, without calling its busy handler.
  LockHolder holder(path);
  std::atomic<bool> opened{false};
  bool opened_before_release = true;
  std::thread releaser([&] {
    std::this_thread::sleep_for(300ms);
    opened_before_release = opened;
    holder.release();
  });
  auto archive = Archive::open(path, waiting(10s));
  opened = true;
  releaser.join();
  REQUIRE(archive);
  CHECK_FALSE(opened_before_release); // open waited for the lock rather than giving up
  record(*archive, make_run("20260102T030405Z-00000001"));
  CHECK(sql_text(path, "PRAGMA journal_mode") == "wal");
  CHECK(sql_int(path, "SELECT count(*) FROM runs") == 1);
  CHECK_FALSE(fs::exists(path.string() + ".spool"));
}

TEST_CASE("archive: a lock that outlasts the wait is an error saying how long it waited",
          "[archive][locks]")
{
  TempDir tmp;
  const auto path = tmp / "archive.db";
  LockHolder holder(path); // a new file another process holds locked while creating it
  auto archive = Archive::open(path, waiting(200ms));
  REQUIRE_FALSE(archive);
  const std::string& message = archive.error().message;
  INFO(message);
  CHECK(contains(message, path.string()));
  CHECK(waited_seconds(message) >= 0.2); // what it waited, not a fixed figure
  CHECK_FALSE(contains(message, "10 s"));
}
