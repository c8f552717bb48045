// The archive when other processes hold its locks: what SQLite refuses at once is retried, a
// run that cannot get the lock within the wait is spooled beside the archive byte for byte, and
// the next ferry that opens the archive for writing moves it in. Nothing is lost.
#include <atomic>
#include <chrono>
#include <regex>
#include <thread>
#include <vector>

#include "archive/schema.hpp"
#include "archive_test_support.hpp"

namespace {

namespace fs = std::filesystem;
using namespace archive_test;
using namespace std::chrono_literals;
using ferry::ArchiveOptions;
using ferry::RecordOutcome;

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

// A run whose every byte field holds bytes a text path would change.
RunRecord odd_run(const std::string& id)
{
  RunRecord run = make_run(id);
  run.script = "#!/bin/sh\r\n# /// ferry\r\n# ///\r\n# \xff\xfe\r\necho hi\r\n";
  run.job_sha256 = ferry::sha256_hex(run.script);
  run.stdout_text = all_bytes();
  run.stderr_text = std::string("\0\x1b[31mred\r\n", 11);
  run.result_bytes = "{\"answer\":   42}\n  ";
  run.error = std::string("bad \xff byte");
  run.params = {{"text", "caf\xc3\xa9 \x1b \u2028"}, {"n", 0.1}, {"big", 18446744073709551615ULL}};
  run.warnings = {{{"code", "w1"}, {"message", "note"}}};
  return run;
}

void check_same_run(const RunRecord& loaded, const RunRecord& run)
{
  CHECK(loaded.script == run.script);
  CHECK(loaded.stdout_text == run.stdout_text);
  CHECK(loaded.stderr_text == run.stderr_text);
  CHECK(loaded.result_bytes == run.result_bytes);
  CHECK(loaded.error == run.error);
  CHECK(loaded.script_name == run.script_name);
  CHECK(loaded.host_label == run.host_label);
  CHECK(ferry::to_json(loaded) == ferry::to_json(run));
}

std::vector<fs::path> files_in(const fs::path& dir)
{
  std::vector<fs::path> files;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    files.push_back(entry.path());
  }
  return files;
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

TEST_CASE("archive: a run the lock keeps out is spooled byte for byte and moved in later",
          "[archive][locks]")
{
  TempDir tmp;
  const auto path = tmp / "archive.db";
  {
    Archive archive = open_archive(path);
    record(archive, make_run("20260102T030405Z-00000001"));
  }
  RunRecord run = odd_run("20260102T030406Z-00000002");
  run.files = nlohmann::json::array({{{"path", "data/a.csv"},
                                      {"mode", "0600"},
                                      {"size", 3},
                                      {"sha256", ferry::sha256_hex("a,1")}}});
  run.blobs = {{ferry::sha256_hex("a,1"), "a,1"}};
  RecordOutcome outcome;
  {
    LockHolder holder(path);
    auto archive = Archive::open(path, waiting(300ms));
    REQUIRE(archive);
    auto stored = archive->record(run);
    REQUIRE(stored);
    outcome = *stored;
  }
  REQUIRE(outcome.spooled_to);
  const fs::path spooled = *outcome.spooled_to;
  INFO(outcome.why);
  CHECK(spooled.parent_path() == fs::path(path.string() + ".spool"));
  CHECK(spooled.filename() == run.run_id + ".run");
  CHECK(mode_of(spooled) == 0600);
  CHECK(mode_of(spooled.parent_path()) == 0700);
  CHECK(contains(outcome.why, path.string()));
  CHECK(waited_seconds(outcome.why) >= 0.3); // what it waited, not a fixed figure
  CHECK_FALSE(contains(outcome.why, "10 s"));
  CHECK(sql_int(path, "SELECT count(*) FROM runs") == 1);

  {
    Archive archive = open_archive(path); // the next writer moves it in
    auto loaded = archive.load(run.run_id);
    REQUIRE(loaded);
    check_same_run(*loaded, run);
    CHECK(loaded->files == run.files); // its files came in with it
    CHECK(loaded->blobs == run.blobs);
  }
  CHECK(sql_int(path, "SELECT count(*) FROM run_files") == 1);
  CHECK_FALSE(fs::exists(spooled));
  CHECK(files_in(spooled.parent_path()).empty());
  CHECK(sql_int(path, "SELECT count(*) FROM runs") == 2);
  CHECK(sql_text(path, "PRAGMA integrity_check") == "ok");
}

TEST_CASE("archive: an archive locked through all of open is set up by a later record",
          "[archive][locks]")
{
  TempDir tmp;
  const auto path = tmp / "archive.db";
  LockHolder holder(path); // a new file another process holds locked while creating it
  auto archive = Archive::open(path, waiting(200ms));
  REQUIRE(archive);

  auto read = archive->load("last");
  REQUIRE_FALSE(read);
  INFO(read.error().message);
  CHECK(contains(read.error().message, path.string()));
  CHECK(waited_seconds(read.error().message) >= 0.2);

  const RunRecord first = odd_run("20260102T030405Z-00000001");
  auto spooled = archive->record(first);
  REQUIRE(spooled);
  CHECK(spooled->spooled_to);

  holder.release();
  auto direct = archive->record(make_run("20260102T030406Z-00000002"));
  REQUIRE(direct);
  CHECK_FALSE(direct->spooled_to);
  CHECK(sql_int(path, "SELECT count(*) FROM runs") == 1);

  Archive again = open_archive(path);
  auto loaded = again.load(first.run_id);
  REQUIRE(loaded);
  check_same_run(*loaded, first);
  CHECK(again.log({})->size() == 2);
}

TEST_CASE("archive: writers that cannot get the lock in time lose nothing", "[archive][locks]")
{
  TempDir tmp;
  const auto path = tmp / "archive.db";
  constexpr int writers = 12;
  constexpr int runs_each = 4;
  // A wait far shorter than a write of several MiB takes: most runs are spooled, some by
  // processes that are at the same time moving others' spooled runs in.
  std::vector<pid_t> children;
  for (int w = 0; w < writers; ++w) {
    const pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      for (int i = 0; i < runs_each; ++i) {
        auto archive = Archive::open(path, waiting(20ms));
        RunRecord run = make_run(fmt::format("20260102T030405Z-{:02}{:06}", w, i));
        run.stdout_text = std::string(std::size_t{2} << 20, static_cast<char>('a' + w));
        if (!archive || !archive->record(run)) {
          std::_Exit(3);
        }
      }
      std::_Exit(0);
    }
    children.push_back(pid);
  }
  for (const pid_t pid : children) {
    int status = 0;
    REQUIRE(::waitpid(pid, &status, 0) == pid);
    CHECK(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 0);
  }
  Archive archive = open_archive(path);
  CHECK(sql_int(path, "SELECT count(*) FROM runs") == writers * runs_each);
  CHECK(sql_int(path, "SELECT count(DISTINCT run_id) FROM runs") == writers * runs_each);
  CHECK(files_in(path.string() + ".spool").empty());
  auto loaded = archive.load(fmt::format("20260102T030405Z-{:02}{:06}", 7, 3));
  REQUIRE(loaded);
  CHECK(loaded->stdout_text == std::string(std::size_t{2} << 20, 'h'));
  CHECK(sql_text(path, "PRAGMA integrity_check") == "ok");
}

TEST_CASE("archive: processes moving spooled runs in at once add each run once", "[archive][locks]")
{
  TempDir tmp;
  const auto path = tmp / "archive.db";
  {
    open_archive(path);
  }
  {
    LockHolder holder(path);
    auto archive = Archive::open(path, waiting(20ms));
    REQUIRE(archive);
    for (int i = 0; i < 12; ++i) {
      auto stored = archive->record(make_run(fmt::format("20260102T030405Z-{:08}", i)));
      REQUIRE(stored);
      REQUIRE(stored->spooled_to);
    }
  }
  REQUIRE(files_in(path.string() + ".spool").size() == 12);
  std::vector<pid_t> children;
  for (int c = 0; c < 4; ++c) {
    const pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      std::_Exit(Archive::open(path) ? 0 : 2);
    }
    children.push_back(pid);
  }
  for (const pid_t pid : children) {
    int status = 0;
    REQUIRE(::waitpid(pid, &status, 0) == pid);
    CHECK(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 0);
  }
  CHECK(sql_int(path, "SELECT count(*) FROM runs") == 12);
  CHECK(files_in(path.string() + ".spool").empty());
}

TEST_CASE("archive: spool files a dead ferry left are moved in and others stay where they are",
          "[archive][locks]")
{
  TempDir tmp;
  const auto path = tmp / "archive.db";
  const auto dir = fs::path(path.string() + ".spool");
  {
    open_archive(path);
  }
  {
    LockHolder holder(path);
    auto archive = Archive::open(path, waiting(20ms));
    REQUIRE(archive);
    for (int i = 0; i < 3; ++i) {
      REQUIRE(archive->record(make_run(fmt::format("20260102T030405Z-{:08}", i))));
    }
  }
  // A process id that is surely gone: a child that has exited and been reaped.
  const pid_t gone = [] {
    const pid_t pid = ::fork();
    if (pid == 0) {
      std::_Exit(0);
    }
    ::waitpid(pid, nullptr, 0);
    return pid;
  }();
  const auto spooled = [&](int i) { return dir / fmt::format("20260102T030405Z-{:08}.run", i); };
  // Being moved in by a ferry that died, by a live one (pid 1), and a half-written spool file.
  fs::rename(spooled(0), spooled(0).string() + fmt::format(".claimed-{}", gone));
  fs::rename(spooled(1), spooled(1).string() + ".claimed-1");
  REQUIRE(ferry::write_file_atomic(dir / fmt::format("x.tmp-{}", gone), "half", 0600));
  REQUIRE(ferry::write_file_atomic(dir / "junk.run", "not an archive", 0600));
  const int newer = ferry::archive::schema_version() + 1;
  sql_exec(spooled(2), fmt::format("PRAGMA user_version = {}", newer));

  open_archive(path);
  CHECK(sql_int(path, "SELECT count(*) FROM runs") == 1);
  CHECK(sql_text(path, "SELECT run_id FROM runs") == "20260102T030405Z-00000000");
  CHECK(fs::exists(spooled(1).string() + ".claimed-1"));
  CHECK(fs::exists(spooled(2)));
  CHECK(fs::exists(dir / "junk.run"));
  CHECK_FALSE(fs::exists(dir / fmt::format("x.tmp-{}", gone)));
  CHECK(files_in(dir).size() == 3);
}

TEST_CASE("archive: a run that can be neither archived nor spooled is an error saying both",
          "[archive][locks]")
{
  TempDir tmp;
  const auto path = tmp / "archive.db";
  {
    open_archive(path);
  }
  REQUIRE(ferry::write_file_atomic(path.string() + ".spool", "in the way", 0600));
  LockHolder holder(path);
  auto archive = Archive::open(path, waiting(100ms));
  REQUIRE(archive);
  auto stored = archive->record(make_run("20260102T030405Z-00000001"));
  REQUIRE_FALSE(stored);
  const std::string& message = stored.error().message;
  INFO(message);
  CHECK(contains(message, "20260102T030405Z-00000001"));
  CHECK(waited_seconds(message) >= 0.1);
  CHECK(contains(message, path.string() + ".spool"));
}
