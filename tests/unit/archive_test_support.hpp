#pragma once
// Shared by the archive's unit tests: a private temp dir, a sample run, direct SQLite access,
// a forked child, the ferry binary.
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>

#include <sqlite3.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>

#include "ferry/archive.hpp"
#include "ferry/util.hpp"

namespace archive_test {

namespace fs = std::filesystem;
using ferry::Archive;
using ferry::ErrorKind;
using ferry::LogFilter;
using ferry::RunRecord;
using ferry::RunStatus;

class TempDir {
public:
  TempDir()
  {
    std::string pattern = (fs::temp_directory_path() / "ferry-archive-test-XXXXXX").string();
    if (::mkdtemp(pattern.data()) == nullptr) {
      throw std::runtime_error("mkdtemp failed");
    }
    m_path = pattern;
  }
  ~TempDir()
  {
    std::error_code ec;
    // Tests make things read-only; give the owner back write access so removal works.
    for (auto it = fs::recursive_directory_iterator(m_path, ec);
         it != fs::recursive_directory_iterator(); it.increment(ec)) {
      ::chmod(it->path().c_str(), it->is_directory(ec) ? 0700 : 0600);
    }
    ::chmod(m_path.c_str(), 0700);
    fs::remove_all(m_path, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  [[nodiscard]] const fs::path& path() const { return m_path; }
  [[nodiscard]] fs::path operator/(const std::string& name) const { return m_path / name; }

private:
  fs::path m_path;
};

inline std::string all_bytes()
{
  std::string bytes;
  for (int i = 0; i < 256; ++i) {
    bytes += static_cast<char>(i);
  }
  return bytes + "\xff\xfe invalid \xc3\x28 utf-8 \xed\xa0\x80\n";
}

inline RunRecord make_run(std::string id, std::string job = "probe", std::string host = "gpu1",
                          RunStatus status = RunStatus::ok,
                          std::string started = "2026-01-02T03:04:05.678Z",
                          std::string script = "#!/bin/sh\n# /// ferry\n# ///\necho hi\n")
{
  RunRecord run;
  run.run_id = std::move(id);
  run.job = std::move(job);
  run.script = std::move(script);
  run.job_sha256 = ferry::sha256_hex(run.script);
  run.script_name = run.job + ".sh";
  if (host == "local") {
    run.target = {{"local", true}};
  } else {
    run.target = {{"host", host}, {"user", "ops"}, {"port", 22}, {"host_key_sha256", "abc"}};
  }
  run.host_label = host;
  run.params = {{"tp", 8}, {"kv_dtype", {"bf16", "fp8_e4m3"}}};
  run.status = status;
  run.exit_code = status == RunStatus::ok ? 0 : 1;
  if (status != RunStatus::ok) {
    run.error = "it went wrong";
  }
  run.result_bytes = R"({"answer": 42})";
  run.result = nlohmann::json::parse(run.result_bytes);
  run.stdout_text = "line 1\nline 2\n";
  run.stderr_text = "";
  run.started_at = std::move(started);
  run.duration_s = 0.25;
  run.timings = {0.1, 0.05, 0.08, 0.02};
  run.ferry_version = "0.1.0-test";
  return run;
}

inline Archive open_archive(const fs::path& path)
{
  auto archive = Archive::open(path);
  if (!archive) {
    FAIL("open " << path << ": " << archive.error().message);
  }
  return std::move(archive).value();
}

inline void record(Archive& archive, const RunRecord& run)
{
  auto stored = archive.record(run);
  if (!stored) {
    FAIL("record " << run.run_id << ": " << stored.error().message);
  }
}

inline std::string file_bytes(const fs::path& path)
{
  std::ifstream in(path, std::ios::binary);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

// A single integer from SQL run directly with SQLite, outside the Archive.
inline long long sql_int(const fs::path& db_path, const std::string& sql)
{
  sqlite3* db = nullptr;
  REQUIRE(sqlite3_open_v2(db_path.c_str(), &db, SQLITE_OPEN_READONLY, nullptr) == SQLITE_OK);
  sqlite3_stmt* stmt = nullptr;
  REQUIRE(sqlite3_prepare_v2(db, sql.c_str(), -1, &stmt, nullptr) == SQLITE_OK);
  long long value = -1;
  if (sqlite3_step(stmt) == SQLITE_ROW) {
    value = sqlite3_column_int64(stmt, 0);
  }
  sqlite3_finalize(stmt);
  sqlite3_close(db);
  return value;
}

inline std::string sql_text(const fs::path& db_path, const std::string& sql)
{
  sqlite3* db = nullptr;
  REQUIRE(sqlite3_open_v2(db_path.c_str(), &db, SQLITE_OPEN_READONLY, nullptr) == SQLITE_OK);
  sqlite3_stmt* stmt = nullptr;
  REQUIRE(sqlite3_prepare_v2(db, sql.c_str(), -1, &stmt, nullptr) == SQLITE_OK);
  std::string value;
  if (sqlite3_step(stmt) == SQLITE_ROW) {
    value = reinterpret_cast<const char*>(sqlite3_column_text(stmt, 0));
  }
  sqlite3_finalize(stmt);
  sqlite3_close(db);
  return value;
}

inline void sql_exec(const fs::path& db_path, const std::string& sql)
{
  sqlite3* db = nullptr;
  REQUIRE(sqlite3_open(db_path.c_str(), &db) == SQLITE_OK);
  REQUIRE(sqlite3_exec(db, sql.c_str(), nullptr, nullptr, nullptr) == SQLITE_OK);
  sqlite3_close(db);
}

inline mode_t mode_of(const fs::path& path)
{
  struct stat st {};
  REQUIRE(::stat(path.c_str(), &st) == 0);
  return st.st_mode & 07777;
}

// Runs `child` in a forked process; returns its wait status.
template <typename F> int in_child(F child)
{
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    int code = 1;
    try {
      code = child();
    } catch (...) {
      code = 99;
    }
    std::_Exit(code);
  }
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  return status;
}

template <typename F> LogFilter filter_of(F set)
{
  LogFilter filter;
  set(filter);
  return filter;
}

inline bool contains(const std::string& text, const std::string& part)
{
  return text.find(part) != std::string::npos;
}

struct CommandResult {
  int exit_code = -1;
  std::string out;
  std::string err;
};

inline CommandResult ferry_command(const TempDir& tmp, const fs::path& archive,
                                   const std::string& args)
{
  const auto out = tmp / "cmd.out";
  const auto err = tmp / "cmd.err";
  const std::string command =
      fmt::format("'{}' --archive '{}' {} >'{}' 2>'{}' </dev/null", FERRY_BINARY, archive.string(),
                  args, out.string(), err.string());
  const int status = std::system(command.c_str());
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, file_bytes(out), file_bytes(err)};
}

} // namespace archive_test
