// The archive: byte-exact round trips, script dedup, lookups, filters, file modes, refusing
// what it must not touch, concurrent writers and a crash mid-record.
#include <atomic>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <random>
#include <sstream>
#include <thread>
#include <tuple>

#include <sqlite3.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>

#include "archive/schema.hpp"
#include "archive_test_support.hpp"
#include "ferry/archive.hpp"
#include "ferry/util.hpp"

namespace {

namespace fs = std::filesystem;
using namespace archive_test;
using ferry::Archive;
using ferry::ErrorKind;
using ferry::LogFilter;
using ferry::RunRecord;
using ferry::RunStatus;

} // namespace

TEST_CASE("archive: a run comes back byte for byte", "[archive]")
{
  TempDir tmp;
  const auto path = tmp / "archive.db";
  RunRecord run = make_run("20260102T030405Z-00000001");
  run.script = "#!/usr/bin/env python3\r\n# /// ferry\r\n# caf\xe9 \xff\xfe comment\r\n# "
               "///\r\nprint(1)\r\n";
  run.job_sha256 = ferry::sha256_hex(run.script);
  run.stdout_text = all_bytes();
  run.stderr_text = std::string("err\0with nul\n", 13) + "\x80\x81";
  run.result_bytes = "{\"a\": 1}\n  ";
  run.error = std::string("bad \xff byte");
  run.stdout_truncated = true;
  run.replay_of = "20250101T000000Z-deadbeef";
  run.warnings = {{{"code", "w1"}, {"message", "note"}}};
  {
    Archive archive = open_archive(path);
    record(archive, run);
  }
  for (int read_only = 0; read_only < 2; ++read_only) {
    auto archive = read_only ? Archive::open_read_only(path) : Archive::open(path);
    REQUIRE(archive);
    auto loaded = archive->load(run.run_id);
    REQUIRE(loaded);
    CHECK(loaded->script == run.script);
    CHECK(ferry::sha256_hex(loaded->script) == run.job_sha256);
    CHECK(loaded->stdout_text == run.stdout_text);
    CHECK(loaded->stderr_text == run.stderr_text);
    CHECK(loaded->result_bytes == run.result_bytes);
    CHECK(loaded->error == run.error);
    CHECK(loaded->result == run.result);
    CHECK(loaded->params == run.params);
    CHECK(loaded->target == run.target);
    CHECK(loaded->status == run.status);
    CHECK(loaded->exit_code == run.exit_code);
    CHECK(loaded->started_at == run.started_at);
    CHECK(loaded->duration_s == run.duration_s);
    CHECK(loaded->timings.exec == run.timings.exec);
    CHECK(loaded->replay_of == run.replay_of);
    CHECK(loaded->ferry_version == run.ferry_version);
    CHECK(loaded->script_name == run.script_name);
    CHECK(loaded->host_label == run.host_label);
    CHECK(loaded->stdout_truncated);
    CHECK(loaded->warnings == run.warnings);
  }
}

TEST_CASE("archive: empty outputs and a run without a result", "[archive]")
{
  TempDir tmp;
  Archive archive = open_archive(tmp / "archive.db");
  RunRecord run = make_run("20260102T030405Z-00000002", "probe", "local", RunStatus::error);
  run.stdout_text.clear();
  run.result_bytes.clear();
  run.result = nullptr;
  run.exit_code.reset();
  record(archive, run);
  auto loaded = archive.load("last");
  REQUIRE(loaded);
  CHECK(loaded->stdout_text.empty());
  CHECK(loaded->result_bytes.empty());
  CHECK(loaded->result.is_null());
  CHECK_FALSE(loaded->exit_code);
  CHECK(loaded->target == nlohmann::json{{"local", true}});
  CHECK(sql_text(tmp / "archive.db", "SELECT host FROM runs") == "local");
  CHECK(sql_int(tmp / "archive.db", "SELECT typeof(stdout) = 'blob' FROM runs") == 1);
}

TEST_CASE("archive: script bytes are stored once per sha256", "[archive]")
{
  TempDir tmp;
  const auto path = tmp / "archive.db";
  {
    Archive archive = open_archive(path);
    record(archive, make_run("20260102T030405Z-00000001"));
    record(archive, make_run("20260102T030406Z-00000002"));
    record(archive, make_run("20260102T030407Z-00000003", "other", "gpu1", RunStatus::ok,
                             "2026-01-02T03:04:07.000Z", "echo other\n"));
  }
  CHECK(sql_int(path, "SELECT count(*) FROM runs") == 3);
  CHECK(sql_int(path, "SELECT count(*) FROM scripts") == 2);
  auto archive = Archive::open(path);
  REQUIRE(archive);
  CHECK(archive->load("20260102T030406Z-00000002")->script == make_run("x").script);
  CHECK(archive->load("20260102T030407Z-00000003")->script == "echo other\n");
}

TEST_CASE("archive: a run id is recorded once", "[archive]")
{
  TempDir tmp;
  Archive archive = open_archive(tmp / "archive.db");
  record(archive, make_run("20260102T030405Z-00000001"));
  auto again = archive.record(make_run("20260102T030405Z-00000001"));
  REQUIRE_FALSE(again);
  CHECK(contains(again.error().message, "already holds"));
  CHECK(archive.log({})->size() == 1);
}

TEST_CASE("archive: runs by id or unique prefix or last", "[archive]")
{
  TempDir tmp;
  Archive archive = open_archive(tmp / "archive.db");
  record(archive, make_run("20260102T030405Z-aaaa1111", "a", "gpu1", RunStatus::ok,
                           "2026-01-02T03:04:05.000Z"));
  record(archive, make_run("20260102T030405Z-aaaa2222", "b", "gpu1", RunStatus::ok,
                           "2026-01-02T03:04:05.500Z"));
  record(archive, make_run("20260103T000000Z-bbbb3333", "c", "gpu1", RunStatus::ok,
                           "2026-01-03T00:00:00.000Z"));
  // Recorded last but started earlier: "last" is the newest start.
  record(archive, make_run("20251231T000000Z-cccc4444", "d", "gpu1", RunStatus::ok,
                           "2025-12-31T00:00:00.000Z"));

  CHECK(archive.load("20260102T030405Z-aaaa2222")->job == "b");
  CHECK(archive.load("20260103")->job == "c");
  CHECK(archive.load("20260102T030405Z-aaaa1")->job == "a");
  CHECK(archive.load("last")->job == "c");

  auto ambiguous = archive.load("20260102T030405Z-aaaa");
  REQUIRE_FALSE(ambiguous);
  CHECK(ambiguous.error().kind == ErrorKind::usage);
  CHECK(contains(ambiguous.error().message, "ambiguous"));
  CHECK(contains(ambiguous.error().message, "20260102T030405Z-aaaa1111"));
  CHECK(contains(ambiguous.error().message, "20260102T030405Z-aaaa2222"));

  auto missing = archive.load("1999");
  REQUIRE_FALSE(missing);
  CHECK(missing.error().kind == ErrorKind::usage);
  CHECK(contains(missing.error().message, "ferry log"));
  CHECK(contains(missing.error().message, (tmp / "archive.db").string()));

  CHECK_FALSE(archive.load(""));
}

TEST_CASE("archive: last in an empty archive", "[archive]")
{
  TempDir tmp;
  Archive archive = open_archive(tmp / "archive.db");
  auto last = archive.load("last");
  REQUIRE_FALSE(last);
  CHECK(last.error().kind == ErrorKind::usage);
  CHECK(contains(last.error().message, "no runs"));
}

TEST_CASE("archive: log filters and newest-first order", "[archive]")
{
  TempDir tmp;
  Archive archive = open_archive(tmp / "archive.db");
  const std::vector<std::tuple<std::string, std::string, RunStatus>> spec = {
      {"kv_calc", "gpu1", RunStatus::ok},    {"kv_calc", "gpu2", RunStatus::failed},
      {"gpu_probe", "gpu1", RunStatus::ok},  {"kv_calc", "gpu1", RunStatus::timeout},
      {"gpu_probe", "local", RunStatus::ok}, {"kv_calc", "gpu2", RunStatus::ok},
  };
  for (std::size_t i = 0; i < spec.size(); ++i) {
    const auto& [job, host, status] = spec[i];
    record(archive, make_run(fmt::format("2026010{}T000000Z-0000000{}", i + 1, i), job, host,
                             status, fmt::format("2026-01-0{}T00:00:00.000Z", i + 1)));
  }
  const auto ids = [&](LogFilter filter) {
    auto runs = archive.log(filter);
    REQUIRE(runs);
    std::vector<std::string> out;
    for (const auto& run : *runs) {
      out.push_back(run.run_id.substr(0, 8));
    }
    return out;
  };
  using V = std::vector<std::string>;
  CHECK(ids({}) == V{"20260106", "20260105", "20260104", "20260103", "20260102", "20260101"});
  CHECK(ids(filter_of([](LogFilter& f) { f.job = "kv_calc"; })) ==
        V{"20260106", "20260104", "20260102", "20260101"});
  CHECK(ids(filter_of([](LogFilter& f) { f.host = "gpu1"; })) ==
        V{"20260104", "20260103", "20260101"});
  CHECK(ids(filter_of([](LogFilter& f) { f.host = "local"; })) == V{"20260105"});
  CHECK(ids(filter_of([](LogFilter& f) { f.status = "ok"; })) ==
        V{"20260106", "20260105", "20260103", "20260101"});
  CHECK(ids(filter_of([](LogFilter& f) { f.since = "2026-01-04"; })) ==
        V{"20260106", "20260105", "20260104"});
  CHECK(ids(filter_of([](LogFilter& f) {
          f.job = "kv_calc";
          f.host = "gpu2";
          f.status = "ok";
        })) == V{"20260106"});
  CHECK(ids(filter_of([](LogFilter& f) { f.limit = 2; })) == V{"20260106", "20260105"});
  CHECK(ids(filter_of([](LogFilter& f) { f.limit = 0; })).size() == 6);
  CHECK(ids(filter_of([](LogFilter& f) { f.job = "nothing"; })).empty());

  auto with_output = archive.log(filter_of([](LogFilter& f) { f.limit = 1; }));
  REQUIRE(with_output);
  CHECK((*with_output)[0].stdout_text == "line 1\nline 2\n");
  CHECK((*with_output)[0].script.empty());
  auto without = archive.log(filter_of([](LogFilter& f) {
    f.limit = 1;
    f.with_output = false;
  }));
  REQUIRE(without);
  CHECK((*without)[0].stdout_text.empty());
  CHECK((*without)[0].result == nlohmann::json{{"answer", 42}});

  auto bad_status = archive.log(filter_of([](LogFilter& f) { f.status = "great"; }));
  REQUIRE_FALSE(bad_status);
  CHECK(bad_status.error().kind == ErrorKind::usage);
  auto bad_since = archive.log(filter_of([](LogFilter& f) { f.since = "yesterday"; }));
  REQUIRE_FALSE(bad_since);
  CHECK(bad_since.error().kind == ErrorKind::usage);
  CHECK_FALSE(archive.log(filter_of([](LogFilter& f) { f.limit = -1; })));
}

TEST_CASE("archive: since accepts dates and times and ages", "[archive]")
{
  using namespace std::chrono;
  const auto now = sys_days{year{2026} / 11 / 29} + hours{14} + minutes{12} + seconds{15};
  CHECK(*ferry::normalize_since("2026-11-29", now) == "2026-11-29T00:00:00.000Z");
  CHECK(*ferry::normalize_since("2026-11-29T14:12", now) == "2026-11-29T14:12:00.000Z");
  CHECK(*ferry::normalize_since("2026-11-29 14:12:15Z", now) == "2026-11-29T14:12:15.000Z");
  CHECK(*ferry::normalize_since("2026-11-29T14:12:15.5Z", now) == "2026-11-29T14:12:15.500Z");
  CHECK(*ferry::normalize_since("2h", now) == "2026-11-29T12:12:15.000Z");
  CHECK(*ferry::normalize_since("7d", now) == "2026-11-22T14:12:15.000Z");
  CHECK(*ferry::normalize_since("90m", now) == "2026-11-29T12:42:15.000Z");
  for (const char* bad : {"", "d", "yesterday", "2026-13-01", "2026-11-29T25:00", "2026/11/29",
                          "2026-11-29T14", "7y", "-3d"}) {
    INFO(bad);
    auto parsed = ferry::normalize_since(bad, now);
    REQUIRE_FALSE(parsed);
    CHECK(parsed.error().kind == ErrorKind::usage);
  }
}

TEST_CASE("archive: directory 0700 and file 0600 whatever the umask", "[archive]")
{
  TempDir tmp;
  const auto path = tmp / "a" / "b" / "archive.db";
  const mode_t old_umask = ::umask(0);
  {
    auto archive = Archive::open(path);
    ::umask(old_umask);
    REQUIRE(archive);
    record(*archive, make_run("20260102T030405Z-00000001"));
    CHECK(mode_of(path) == 0600);
    CHECK(mode_of(path.string() + "-wal") == 0600);
    CHECK(mode_of(path.string() + "-shm") == 0600);
  }
  CHECK(mode_of(tmp / "a") == 0700);
  CHECK(mode_of(tmp / "a" / "b") == 0700);
  CHECK(mode_of(path) == 0600);

  // An archive someone made world-readable is made private again.
  ::chmod(path.c_str(), 0644);
  REQUIRE(Archive::open(path));
  CHECK(mode_of(path) == 0600);
}

TEST_CASE("archive: WAL and the schema version", "[archive]")
{
  TempDir tmp;
  const auto path = tmp / "archive.db";
  {
    open_archive(path);
  }
  CHECK(sql_int(path, "PRAGMA user_version") == ferry::archive::schema_version());
  CHECK(sql_int(path, "PRAGMA application_id") == ferry::archive::application_id);
  CHECK(sql_text(path, "PRAGMA journal_mode") == "wal");
  // Opening again changes nothing.
  {
    open_archive(path);
  }
  CHECK(sql_int(path, "PRAGMA user_version") == ferry::archive::schema_version());
}

TEST_CASE("archive: a newer schema is refused and left untouched", "[archive]")
{
  TempDir tmp;
  const auto path = tmp / "archive.db";
  {
    Archive archive = open_archive(path);
    record(archive, make_run("20260102T030405Z-00000001"));
  }
  const int newer = ferry::archive::schema_version() + 1;
  sql_exec(path, fmt::format("PRAGMA user_version = {}", newer));
  const std::string before = file_bytes(path);
  for (int read_only = 0; read_only < 2; ++read_only) {
    auto archive = read_only ? Archive::open_read_only(path) : Archive::open(path);
    REQUIRE_FALSE(archive);
    const std::string& message = archive.error().message;
    CHECK(contains(message, path.string()));
    CHECK(contains(message, "newer ferry"));
    CHECK(contains(message, fmt::format("schema v{}", newer)));
    CHECK(contains(message, "--archive"));
  }
  CHECK(file_bytes(path) == before);
}

TEST_CASE("archive: a file that is not an archive is refused and left untouched", "[archive]")
{
  TempDir tmp;
  SECTION("random bytes")
  {
    const auto path = tmp / "archive.db";
    std::mt19937 rng(42);
    std::string junk;
    for (int i = 0; i < 20000; ++i) {
      junk += static_cast<char>(rng());
    }
    REQUIRE(ferry::write_file_atomic(path, junk, 0600));
    for (int read_only = 0; read_only < 2; ++read_only) {
      auto archive = read_only ? Archive::open_read_only(path) : Archive::open(path);
      REQUIRE_FALSE(archive);
      CHECK(contains(archive.error().message, path.string()));
      CHECK(contains(archive.error().message, "untouched"));
    }
    CHECK(file_bytes(path) == junk);
    CHECK_FALSE(fs::exists(path.string() + "-wal"));
  }
  SECTION("a short text file")
  {
    const auto path = tmp / "notes.txt";
    REQUIRE(ferry::write_file_atomic(path, "my notes\n", 0644));
    REQUIRE_FALSE(Archive::open(path));
    CHECK(file_bytes(path) == "my notes\n");
  }
  SECTION("another program's SQLite database")
  {
    const auto path = tmp / "other.db";
    sql_exec(path, "CREATE TABLE t(x); INSERT INTO t VALUES(1)");
    const std::string before = file_bytes(path);
    auto archive = Archive::open(path);
    REQUIRE_FALSE(archive);
    CHECK(contains(archive.error().message, "not a ferry archive"));
    CHECK(file_bytes(path) == before);
  }
}

TEST_CASE("archive: damaged pages are reported and not overwritten", "[archive]")
{
  TempDir tmp;
  const auto path = tmp / "archive.db";
  {
    Archive archive = open_archive(path);
    for (int i = 0; i < 50; ++i) {
      record(archive, make_run(fmt::format("20260102T030405Z-{:08}", i)));
    }
  }
  // Keep the header page, scribble over every other one.
  std::string bytes = file_bytes(path);
  REQUIRE(bytes.size() > 8192);
  std::mt19937 rng(7);
  for (std::size_t i = 4096; i < bytes.size(); ++i) {
    bytes[i] = static_cast<char>(rng());
  }
  {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out << bytes;
  }
  auto archive = Archive::open_read_only(path);
  std::string message;
  if (!archive) {
    message = archive.error().message;
  } else {
    auto runs = archive->log({});
    REQUIRE_FALSE(runs);
    message = runs.error().message;
  }
  CHECK(contains(message, path.string()));
  CHECK(contains(message, "damaged"));
  CHECK(file_bytes(path) == bytes);
}

TEST_CASE("archive: read-only file or directory", "[archive]")
{
  TempDir tmp;
  const auto dir = tmp / "store";
  const auto path = dir / "archive.db";
  {
    Archive archive = open_archive(path);
    record(archive, make_run("20260102T030405Z-00000001"));
  }
  SECTION("read-only file")
  {
    REQUIRE(::chmod(path.c_str(), 0400) == 0);
    const std::string before = file_bytes(path);
    auto archive = Archive::open(path);
    REQUIRE_FALSE(archive);
    CHECK(contains(archive.error().message, path.string()));
    CHECK(contains(archive.error().message, "read-only"));
    CHECK(file_bytes(path) == before);
    // Reading still works.
    auto reader = Archive::open_read_only(path);
    REQUIRE(reader);
    CHECK(reader->load("last")->run_id == "20260102T030405Z-00000001");
  }
  SECTION("read-only directory")
  {
    REQUIRE(::chmod(dir.c_str(), 0500) == 0);
    auto archive = Archive::open(path);
    REQUIRE_FALSE(archive);
    CHECK(contains(archive.error().message, path.string()));
    CHECK(contains(archive.error().message, "read-only"));
    auto reader = Archive::open_read_only(path);
    REQUIRE(reader);
    CHECK(reader->log({})->size() == 1);
  }
  SECTION("no directory can be made")
  {
    const auto blocked = tmp / "file-not-dir";
    REQUIRE(ferry::write_file_atomic(blocked, "x", 0600));
    auto archive = Archive::open(blocked / "sub" / "archive.db");
    REQUIRE_FALSE(archive);
    CHECK(contains(archive.error().message, (blocked / "sub" / "archive.db").string()));
  }
}

TEST_CASE("archive: a missing archive reads as empty and is not created", "[archive]")
{
  TempDir tmp;
  const auto path = tmp / "none" / "archive.db";
  auto archive = Archive::open_read_only(path);
  REQUIRE(archive);
  CHECK_FALSE(archive->exists());
  CHECK(archive->log({})->empty());
  auto last = archive->load("last");
  REQUIRE_FALSE(last);
  CHECK(last.error().kind == ErrorKind::usage);
  CHECK_FALSE(archive->record(make_run("20260102T030405Z-00000001")));
  CHECK_FALSE(fs::exists(tmp / "none"));
}

TEST_CASE("archive: 8 processes record at once and lose nothing", "[archive][concurrency]")
{
  TempDir tmp;
  const auto path = tmp / "archive.db";
  constexpr int writers = 8;
  constexpr int runs_each = 25;
  // No connection is open across fork(): each child opens its own, as ferry processes do,
  // and the archive does not exist yet, so the first opens race to create it too.
  std::vector<pid_t> children;
  for (int w = 0; w < writers; ++w) {
    const pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      auto archive = Archive::open(path);
      if (!archive) {
        fmt::print(stderr, "writer {}: {}\n", w, archive.error().message);
        std::_Exit(2);
      }
      for (int i = 0; i < runs_each; ++i) {
        RunRecord run = make_run(fmt::format("20260102T030405Z-{:02}{:06}", w, i));
        run.stdout_text = std::string(static_cast<std::size_t>(1000 * (i + 1)), 'x');
        if (i % 5 == 0) {
          run.script = fmt::format("echo writer {}\n", w); // some new scripts, some shared
        }
        if (auto stored = archive->record(run); !stored) {
          fmt::print(stderr, "writer {}: {}\n", w, stored.error().message);
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
  CHECK(sql_int(path, "SELECT count(*) FROM runs") == writers * runs_each);
  CHECK(sql_int(path, "SELECT count(*) FROM scripts") == writers + 1);
  CHECK(sql_text(path, "PRAGMA integrity_check") == "ok");
  auto archive = Archive::open(path);
  REQUIRE(archive);
  CHECK(archive->log(filter_of([](LogFilter& f) { f.limit = 0; }))->size() == writers * runs_each);
}

TEST_CASE("archive: a crash while recording leaves no half run", "[archive][crash]")
{
  for (const char* step : {"after-script", "after-run"}) {
    DYNAMIC_SECTION(step)
    {
      TempDir tmp;
      const auto path = tmp / "archive.db";
      {
        Archive archive = open_archive(path);
        record(archive, make_run("20260102T030405Z-00000001"));
      }
      const int status = in_child([&] {
        ::setenv("FERRY_TEST_CRASH_IN_RECORD", step, 1);
        auto archive = Archive::open(path);
        if (!archive) {
          return 2;
        }
        // Big enough to spill out of SQLite's page cache into the WAL before the commit.
        RunRecord run =
            make_run("20260102T030406Z-00000002", "probe", "gpu1", RunStatus::ok,
                     "2026-01-02T03:04:06.000Z", "a new script\n" + std::string(3 << 20, 's'));
        run.stdout_text = std::string(8 << 20, 'o');
        (void)archive->record(run);
        return 0; // not reached: the hook kills the process
      });
      REQUIRE(WIFSIGNALED(status));
      CHECK(WTERMSIG(status) == SIGKILL);

      CHECK(sql_text(path, "PRAGMA integrity_check") == "ok");
      CHECK(sql_int(path, "SELECT count(*) FROM runs") == 1);
      CHECK(sql_int(path, "SELECT count(*) FROM scripts") == 1);
      Archive archive = open_archive(path);
      CHECK_FALSE(archive.load("20260102T030406Z-00000002"));
      record(archive, make_run("20260102T030407Z-00000003"));
      CHECK(archive.log({})->size() == 2);
    }
  }
}

TEST_CASE("archive: a write that runs out of space is reported and rolled back", "[archive]")
{
  TempDir tmp;
  const auto path = tmp / "archive.db";
  {
    Archive archive = open_archive(path);
    record(archive, make_run("20260102T030405Z-00000001"));
  }
  const auto message_file = tmp / "message";
  const int status = in_child([&] {
    auto archive = Archive::open(path);
    if (!archive) {
      return 2;
    }
    // RLIMIT_FSIZE stands in for a full disk: writes past it come up short.
    ::signal(SIGXFSZ, SIG_IGN);
    const rlimit limit{100'000, 100'000};
    ::setrlimit(RLIMIT_FSIZE, &limit);
    RunRecord run = make_run("20260102T030406Z-00000002");
    run.stdout_text = std::string(4 << 20, 'o');
    auto stored = archive->record(run);
    if (stored) {
      return 3;
    }
    const rlimit unlimited{RLIM_INFINITY, RLIM_INFINITY};
    ::setrlimit(RLIMIT_FSIZE, &unlimited);
    std::ofstream(message_file) << stored.error().message;
    return 0;
  });
  REQUIRE(WIFEXITED(status));
  REQUIRE(WEXITSTATUS(status) == 0);
  const std::string message = file_bytes(message_file);
  INFO(message);
  CHECK(contains(message, path.string()));
  CHECK(contains(message, "20260102T030406Z-00000002"));
  CHECK((contains(message, "full") || contains(message, "I/O error")));
  CHECK(sql_text(path, "PRAGMA integrity_check") == "ok");
  CHECK(sql_int(path, "SELECT count(*) FROM runs") == 1);
  Archive archive = open_archive(path);
  record(archive, make_run("20260102T030407Z-00000003"));
}

TEST_CASE("archive: one Archive shared by threads", "[archive][concurrency]")
{
  TempDir tmp;
  Archive archive = open_archive(tmp / "archive.db");
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 20; ++i) {
        if (!archive.record(make_run(fmt::format("20260102T030405Z-{}{:07}", t, i)))) {
          ++failures;
        }
      }
    });
  }
  for (auto& thread : threads) {
    thread.join();
  }
  CHECK(failures == 0);
  CHECK(archive.log(filter_of([](LogFilter& f) { f.limit = 0; }))->size() == 80);
}

TEST_CASE("archive: default path follows FERRY_ARCHIVE and XDG_DATA_HOME", "[archive]")
{
  const auto saved = [](const char* name) -> std::optional<std::string> {
    const char* value = std::getenv(name);
    return value ? std::optional<std::string>(value) : std::nullopt;
  };
  const auto archive_env = saved("FERRY_ARCHIVE");
  const auto data_env = saved("XDG_DATA_HOME");
  const auto home_env = saved("HOME");
  ::setenv("FERRY_ARCHIVE", "/x/a.db", 1);
  CHECK(Archive::default_path() == fs::path("/x/a.db"));
  ::unsetenv("FERRY_ARCHIVE");
  ::setenv("XDG_DATA_HOME", "/data", 1);
  CHECK(Archive::default_path() == fs::path("/data/ferry/archive.db"));
  ::setenv("XDG_DATA_HOME", "relative", 1);
  ::setenv("HOME", "/home/u", 1);
  CHECK(Archive::default_path() == fs::path("/home/u/.local/share/ferry/archive.db"));
  const auto restore = [](const char* name, const std::optional<std::string>& value) {
    value ? ::setenv(name, value->c_str(), 1) : ::unsetenv(name);
  };
  restore("FERRY_ARCHIVE", archive_env);
  restore("XDG_DATA_HOME", data_env);
  restore("HOME", home_env);
}

// The `log`, `show` and `export` commands against an archive made through the library.
namespace {

RunRecord binary_run()
{
  RunRecord run = make_run("20260102T030405Z-0badc0de");
  run.script = "#!/bin/sh\r\n# /// ferry\r\n# ///\r\n# \xff\xfe not utf-8 \xc3\x28\r\necho hi\r\n";
  run.job_sha256 = ferry::sha256_hex(run.script);
  run.stdout_text.clear();
  for (int i = 0; i < 40; ++i) {
    run.stdout_text += fmt::format("line {}\n", i);
  }
  run.stdout_text += all_bytes();
  run.stderr_text = std::string("\0\x1b[31mred\r\n", 11);
  run.result_bytes = "{\"answer\":   42}\n";
  return run;
}

} // namespace

TEST_CASE("ferry show and export give back the archived bytes", "[archive][cli]")
{
  TempDir tmp;
  const auto path = tmp / "archive.db";
  const RunRecord run = binary_run();
  {
    Archive archive = open_archive(path);
    record(archive, make_run("20260101T000000Z-00000001", "other", "gpu1", RunStatus::ok,
                             "2026-01-01T00:00:00.000Z"));
    record(archive, run);
  }
  auto script = ferry_command(tmp, path, "show 20260102 --script");
  CHECK(script.exit_code == 0);
  CHECK(script.out == run.script);
  CHECK(ferry_command(tmp, path, "show last --stdout").out == run.stdout_text);
  CHECK(ferry_command(tmp, path, "show last --stderr").out == run.stderr_text);
  CHECK(nlohmann::json::parse(ferry_command(tmp, path, "show last --params").out) == run.params);
  CHECK(nlohmann::json::parse(ferry_command(tmp, path, "show last --result").out) == run.result);
  const auto json = nlohmann::json::parse(ferry_command(tmp, path, "show last --json").out);
  CHECK(json["run_id"] == run.run_id);
  CHECK(json["params"] == run.params);

  const auto page = ferry_command(tmp, path, "show 20260102T030405Z-0badc0de");
  CHECK(page.exit_code == 0);
  CHECK(contains(page.out, "lines omitted"));
  CHECK(contains(page.out, "line 0"));
  CHECK_FALSE(contains(page.out, "\x1b")); // escape sequences are shown, not sent
  CHECK(contains(page.out, "\\x1b[31mred"));

  const auto dir = tmp / "export";
  const auto exported = ferry_command(tmp, path, fmt::format("export last '{}'", dir.string()));
  CHECK(exported.exit_code == 0);
  CHECK(file_bytes(dir / "script") == run.script);
  CHECK(file_bytes(dir / "stdout") == run.stdout_text);
  CHECK(file_bytes(dir / "stderr") == run.stderr_text);
  CHECK(file_bytes(dir / "result.json") == run.result_bytes);
  CHECK(nlohmann::json::parse(file_bytes(dir / "params.json")) == run.params);
  CHECK(nlohmann::json::parse(file_bytes(dir / "run.json"))["run_id"] == run.run_id);

  // A second export into the same directory overwrites nothing.
  REQUIRE(ferry::write_file_atomic(dir / "script", "mine", 0644));
  const auto again = ferry_command(tmp, path, fmt::format("export last '{}'", dir.string()));
  CHECK(again.exit_code == 2);
  CHECK(contains(again.err, "does not overwrite"));
  CHECK(file_bytes(dir / "script") == "mine");
}

TEST_CASE("ferry log lists runs and errors have the right exit codes", "[archive][cli]")
{
  TempDir tmp;
  const auto path = tmp / "archive.db";
  {
    Archive archive = open_archive(path);
    record(archive, make_run("20260101T000000Z-00000001", "kv_calc", "gpu1", RunStatus::ok,
                             "2026-01-01T00:00:00.000Z"));
    record(archive, make_run("20260102T000000Z-00000002", "gpu_probe", "gpu2", RunStatus::failed,
                             "2026-01-02T00:00:00.000Z"));
    record(archive, binary_run());
  }
  const auto table = ferry_command(tmp, path, "log");
  CHECK(table.exit_code == 0);
  CHECK(contains(table.out, "20260101T000000Z-00000001"));
  CHECK(contains(table.out, "it went wrong"));
  CHECK(table.out.find("0badc0de") < table.out.find("00000002"));

  const auto lines = ferry_command(tmp, path, "log --json --limit 2");
  CHECK(lines.exit_code == 0);
  std::istringstream in(lines.out);
  std::vector<nlohmann::json> records;
  for (std::string line; std::getline(in, line);) {
    records.push_back(nlohmann::json::parse(line));
  }
  REQUIRE(records.size() == 2);
  CHECK(records[0]["run_id"] == "20260102T030405Z-0badc0de");
  CHECK(records[0]["stdout"].get<std::string>().rfind("line 0\n", 0) == 0);
  CHECK(records[1]["status"] == "failed");

  const auto filtered = ferry_command(tmp, path, "log --job kv_calc --json");
  CHECK(filtered.out.find("00000001") != std::string::npos);
  CHECK(filtered.out.find("00000002") == std::string::npos);

  CHECK(ferry_command(tmp, path, "log --status great").exit_code == 2);
  CHECK(ferry_command(tmp, path, "log --since someday").exit_code == 2);
  const auto unknown = ferry_command(tmp, path, "show 1999");
  CHECK(unknown.exit_code == 2);
  CHECK(contains(unknown.err, "ferry log"));
  CHECK(ferry_command(tmp, path, "show 2026").exit_code == 2); // ambiguous
  CHECK(ferry_command(tmp, path, "show last --script --stdout").exit_code == 2);

  sql_exec(path, fmt::format("PRAGMA user_version = {}", ferry::archive::schema_version() + 1));
  const auto newer = ferry_command(tmp, path, "log");
  CHECK(newer.exit_code == 1);
  CHECK(contains(newer.err, "newer ferry"));
  CHECK(contains(newer.err, path.string()));
}

TEST_CASE("archive: a run's files and outputs are stored once per sha256 and verified",
          "[archive][bundle]")
{
  TempDir tmp;
  const auto path = tmp / "archive.db";
  const auto with_files = [](std::string id) {
    RunRecord run = make_run(std::move(id));
    run.files = nlohmann::json::array({{{"path", "data/a.csv"},
                                        {"mode", "0600"},
                                        {"size", 3},
                                        {"sha256", ferry::sha256_hex("a,1")}}});
    run.outputs = nlohmann::json::array({{{"path", "out/r.txt"},
                                          {"size", 1},
                                          {"sha256", ferry::sha256_hex("r")},
                                          {"archived", true}},
                                         {{"path", "big.bin"},
                                          {"size", 99},
                                          {"sha256", ferry::sha256_hex("big")},
                                          {"archived", false}}});
    run.blobs = {{ferry::sha256_hex("a,1"), "a,1"}, {ferry::sha256_hex("r"), "r"}};
    return run;
  };
  {
    Archive archive = open_archive(path);
    record(archive, with_files("20260102T030405Z-00000001"));
    record(archive, with_files("20260102T030406Z-00000002"));
  }
  CHECK(sql_int(path, "SELECT count(*) FROM run_files") == 6);
  CHECK(sql_int(path, "SELECT count(*) FROM run_files WHERE archived = 1") == 4);
  CHECK(sql_int(path, "SELECT count(*) FROM scripts") == 3); // the script, a,1 and r
  CHECK(sql_int(path, "SELECT mode FROM run_files WHERE kind = 'file' LIMIT 1") == 0600);
  {
    auto archive = Archive::open(path);
    REQUIRE(archive);
    auto loaded = archive->load("20260102T030405Z-00000001",
                                ferry::LoadOptions{.verify_blobs = true, .narrow = {}});
    REQUIRE(loaded);
    CHECK(loaded->files == with_files("x").files);
    CHECK(loaded->outputs == with_files("x").outputs);
    CHECK(loaded->blobs == with_files("x").blobs);
  }
  sql_exec(path, "UPDATE scripts SET bytes = 'tampered' WHERE sha256 = '" +
                     ferry::sha256_hex("a,1") + "'");
  auto archive = Archive::open(path);
  REQUIRE(archive);
  auto refused = archive->load("20260102T030405Z-00000001",
                               ferry::LoadOptions{.verify_blobs = true, .narrow = {}});
  REQUIRE_FALSE(refused);
  CHECK_THAT(refused.error().message, Catch::Contains("does not match its sha256"));
}
