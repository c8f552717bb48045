// Schema v2: what `log` lists comes from small columns, params and results have columns of
// their own written as they are serialized, v1 archives are migrated in place and read back the
// same; replay's blobs are checked against their sha256.
#include <fstream>
#include <string>
#include <vector>

#include "archive/schema.hpp"
#include "archive/store.hpp"
#include "archive_test_support.hpp"

namespace {

namespace fs = std::filesystem;
using namespace archive_test;
using ferry::LoadOptions;
using ferry::RunSummary;
using nlohmann::json;

// Params nested deeper than SQLite's JSON functions go (2000 levels).
json deep_params(int depth)
{
  json value = "bottom";
  for (int i = 0; i < depth; ++i) {
    value = json::array({std::move(value)});
  }
  return {{"deep", std::move(value)}};
}

std::vector<RunRecord> sample_runs()
{
  std::vector<RunRecord> runs;
  RunRecord odd = make_run("20260102T030401Z-00000001", "probe", "gpu1", ferry::RunStatus::ok,
                           "2026-01-02T03:04:01.000Z");
  odd.params = {{"text", "caf\xc3\xa9 \x1b[31m \u2028 \"q\" \\"},
                {"floats", {0.1, 1e300, -0.0, 2.5e-8}},
                {"ints", {18446744073709551615ULL, -9223372036854775807LL - 1}},
                {"nested", {{"a", {{"b", json::array()}}}, {"z", nullptr}}}};
  odd.result = {{"kv", {{"bf16", {{"max_tokens", 641164}}}}}, {"note", std::string(400, 'n')}};
  odd.result_bytes = odd.result.dump(2);
  odd.stdout_text = all_bytes();
  odd.error = std::string("bad \xff byte");
  odd.warnings = {{{"code", "w1"}, {"message", "note"}}};
  runs.push_back(odd);

  RunRecord failed = make_run("20260102T030402Z-00000002", "probe", "local",
                              ferry::RunStatus::failed, "2026-01-02T03:04:02.000Z");
  failed.result = nullptr;
  failed.result_bytes.clear();
  runs.push_back(failed);

  RunRecord deep = make_run("20260102T030403Z-00000003", "probe", "gpu2", ferry::RunStatus::ok,
                            "2026-01-02T03:04:03.000Z");
  deep.params = deep_params(2100);
  runs.push_back(deep);

  RunRecord scalar = make_run("20260102T030404Z-00000004", "probe", "gpu1", ferry::RunStatus::ok,
                              "2026-01-02T03:04:04.000Z", "echo other\n");
  scalar.result = "just a string \xc3\xa9";
  runs.push_back(scalar);
  return runs;
}

void bind_text(sqlite3_stmt* stmt, int index, const std::string& text)
{
  sqlite3_bind_text64(stmt, index, text.data(), text.size(), SQLITE_TRANSIENT, SQLITE_UTF8);
}

void bind_blob(sqlite3_stmt* stmt, int index, const std::string& bytes)
{
  sqlite3_bind_blob64(stmt, index, bytes.data(), bytes.size(), SQLITE_TRANSIENT);
}

// An archive as ferry with schema v1 wrote it: the record JSON carries params and the result.
void write_v1_archive(const fs::path& path, const std::vector<RunRecord>& runs)
{
  sqlite3* db = nullptr;
  REQUIRE(sqlite3_open(path.c_str(), &db) == SQLITE_OK);
  const std::string schema = std::string(ferry::archive::migrations()[0].sql) +
                             "PRAGMA user_version = 1; PRAGMA journal_mode = WAL;";
  REQUIRE(sqlite3_exec(db, schema.c_str(), nullptr, nullptr, nullptr) == SQLITE_OK);
  for (const auto& run : runs) {
    const std::string sha = ferry::sha256_hex(run.script);
    sqlite3_stmt* script = nullptr;
    REQUIRE(sqlite3_prepare_v2(db, "INSERT OR IGNORE INTO scripts VALUES(?1, ?2, ?3)", -1, &script,
                               nullptr) == SQLITE_OK);
    bind_text(script, 1, sha);
    bind_text(script, 2, run.script_name);
    bind_blob(script, 3, run.script);
    REQUIRE(sqlite3_step(script) == SQLITE_DONE);
    sqlite3_finalize(script);

    sqlite3_stmt* stmt = nullptr;
    REQUIRE(sqlite3_prepare_v2(
                db,
                "INSERT INTO runs(run_id, job, job_sha256, script_sha256, script_name, host, "
                "host_label, status, exit_code, error, started_at, duration_s, replay_of, "
                "ferry_version, record, result_bytes, stdout, stderr) VALUES(?1, ?2, ?3, ?4, ?5, "
                "?6, ?7, ?8, ?9, ?10, ?11, ?12, NULL, ?13, ?14, ?15, ?16, ?17)",
                -1, &stmt, nullptr) == SQLITE_OK);
    const std::string host = run.target.value("host", "local");
    const std::string strings[] = {
        run.run_id,      run.job, run.job_sha256, sha,
        run.script_name, host,    run.host_label, std::string(ferry::to_string(run.status))};
    for (int i = 0; i < 8; ++i) {
      bind_text(stmt, i + 1, strings[i]);
    }
    sqlite3_bind_int(stmt, 9, run.exit_code.value_or(0));
    run.error ? bind_text(stmt, 10, *run.error) : (void)sqlite3_bind_null(stmt, 10);
    bind_text(stmt, 11, run.started_at);
    sqlite3_bind_double(stmt, 12, run.duration_s);
    bind_text(stmt, 13, run.ferry_version);
    bind_text(stmt, 14, ferry::to_json_line(ferry::to_json(run, false)));
    run.result_bytes.empty() ? (void)sqlite3_bind_null(stmt, 15)
                             : bind_blob(stmt, 15, run.result_bytes);
    bind_blob(stmt, 16, run.stdout_text);
    bind_blob(stmt, 17, run.stderr_text);
    REQUIRE(sqlite3_step(stmt) == SQLITE_DONE);
    sqlite3_finalize(stmt);
  }
  sqlite3_close(db);
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
  CHECK(ferry::to_json_line(ferry::to_json(loaded)) == ferry::to_json_line(ferry::to_json(run)));
}

std::vector<std::string> listed(Archive& archive)
{
  auto summaries = archive.list({});
  REQUIRE(summaries);
  std::vector<std::string> lines;
  for (const auto& [run, head] : *summaries) {
    CHECK(run.params == json::object());
    CHECK(run.result.is_null());
    CHECK(run.stdout_text.empty());
    lines.push_back(fmt::format("{} {} {} {} {}", run.run_id, run.job, run.host_label,
                                ferry::to_string(run.status), head));
  }
  return lines;
}

long status_kib(const std::string& field)
{
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);) {
    if (line.rfind(field, 0) == 0) {
      return std::stol(line.substr(field.size()));
    }
  }
  return -1;
}

// How much a forked child's peak RSS grows while it runs WORK (which returns success).
template <typename F> long peak_growth_kib(const TempDir& tmp, F work)
{
  const int status = in_child([&] {
    // Writing 5 to clear_refs resets VmHWM, the peak, to the current RSS.
    std::ofstream("/proc/self/clear_refs") << "5";
    const long before = status_kib("VmRSS:");
    if (!work()) {
      return 2;
    }
    std::ofstream(tmp / "grown") << status_kib("VmHWM:") - before;
    return 0;
  });
  REQUIRE(WIFEXITED(status));
  REQUIRE(WEXITSTATUS(status) == 0);
  return std::stol(file_bytes(tmp / "grown"));
}

std::string head_of(const RunRecord& run)
{
  return run.result.is_null() ? std::string()
                              : ferry::archive::first_chars(ferry::to_json_line(run.result), 256);
}

} // namespace

TEST_CASE("archive: a v1 archive is migrated in place and every run reads back the same",
          "[archive][schema]")
{
  TempDir tmp;
  const auto v1_path = tmp / "v1.db";
  const auto fresh_path = tmp / "fresh.db";
  const auto runs = sample_runs();
  write_v1_archive(v1_path, runs);
  {
    Archive fresh = open_archive(fresh_path);
    for (const auto& run : runs) {
      record(fresh, run);
    }
  }
  // Reading needs the upgrade, which only a writer makes.
  REQUIRE_FALSE(Archive::open_read_only(v1_path));

  Archive migrated = open_archive(v1_path);
  CHECK(sql_int(v1_path, "PRAGMA user_version") == ferry::archive::schema_version());
  CHECK(sql_text(v1_path, "PRAGMA integrity_check") == "ok");
  for (const auto& run : runs) {
    INFO(run.run_id);
    auto loaded = migrated.load(run.run_id);
    REQUIRE(loaded);
    check_same_run(*loaded, run);
  }
  // Params and results left the record, but for the one SQLite's JSON functions cannot take
  // apart, which stays whole and reads as before.
  CHECK(sql_int(v1_path, "SELECT count(*) FROM runs WHERE params IS NULL") == 1);
  CHECK(sql_int(v1_path, "SELECT count(*) FROM runs WHERE instr(record, '\"params\"') > 0") == 1);
  CHECK(sql_int(fresh_path, "SELECT count(*) FROM runs WHERE instr(record, '\"params\"') > 0") ==
        0);

  Archive fresh = open_archive(fresh_path);
  const auto lines = listed(migrated);
  CHECK(lines == listed(fresh));
  REQUIRE(lines.size() == runs.size());
  for (std::size_t i = 0; i < runs.size(); ++i) {
    const auto& run = runs[runs.size() - 1 - i]; // newest first
    CHECK(contains(lines[i], run.run_id));
    CHECK(lines[i].substr(lines[i].size() - head_of(run).size()) == head_of(run));
  }
  CHECK(ferry_command(tmp, v1_path, "log").out == ferry_command(tmp, fresh_path, "log").out);
  CHECK(ferry_command(tmp, v1_path, "log --json").out ==
        ferry_command(tmp, fresh_path, "log --json").out);
  CHECK(ferry_command(tmp, v1_path, "show 20260102T030401Z --json").out ==
        ferry_command(tmp, fresh_path, "show 20260102T030401Z --json").out);
  record(migrated, make_run("20260102T030409Z-00000009"));
  CHECK(migrated.log({})->size() == runs.size() + 1);
}

TEST_CASE("archive: params and results are stored as the JSON text to_json_line makes",
          "[archive][schema]")
{
  std::string long_text;
  for (int i = 0; i < 100000; ++i) {
    long_text += "x\xc3\xa9\"\\\n\x01";
  }
  const std::vector<json> values = {
      json::object(),
      nullptr,
      json("broken \xff\xfe utf-8 \xc3\x28 \xed\xa0\x80 end"),
      json{{"b", 1}, {"a", {1.5, -0.0, 1e-300, 12345678901234567ULL}}, {"s", long_text}},
      deep_params(300),
  };
  for (const auto& value : values) {
    std::string streamed;
    std::size_t pieces = 0;
    ferry::archive::stream_json_line(value, [&](std::string_view piece) {
      streamed += piece;
      ++pieces;
    });
    CHECK(streamed == ferry::to_json_line(value));
    CHECK(pieces >= 1);
  }

  TempDir tmp;
  const auto path = tmp / "archive.db";
  RunRecord run = make_run("20260102T030405Z-00000001");
  run.params = values[3];
  run.result = values[2];
  {
    Archive archive = open_archive(path);
    record(archive, run);
  }
  CHECK(sql_text(path, "SELECT CAST(params AS TEXT) FROM runs") == ferry::to_json_line(run.params));
  CHECK(sql_text(path, "SELECT CAST(result AS TEXT) FROM runs") == ferry::to_json_line(run.result));
  CHECK(sql_text(path, "SELECT result_head FROM runs") == head_of(run));
  CHECK(ferry::archive::first_chars("a\xc3\xa9z", 2) == "a\xc3\xa9");
  CHECK(ferry::archive::first_chars("ab", 5) == "ab");
}

TEST_CASE("archive: the listing reads no params or results or outputs", "[archive][schema]")
{
  TempDir tmp;
  const auto path = tmp / "archive.db";
  const auto runs = sample_runs();
  {
    Archive archive = open_archive(path);
    for (const auto& run : runs) {
      record(archive, run);
    }
  }
  // Garbage where the big columns are: whatever reads them fails; the listing does not.
  sql_exec(path, "UPDATE runs SET params = x'ff00', result = 'not json', stdout = x'00', "
                 "stderr = x'00', result_bytes = x'00'");
  auto archive = Archive::open_read_only(path);
  REQUIRE(archive);
  auto summaries = archive->list({});
  REQUIRE(summaries);
  REQUIRE(summaries->size() == runs.size());
  CHECK((*summaries)[0].run.run_id == runs.back().run_id);
  CHECK((*summaries)[0].result_head == head_of(runs.back()));
  CHECK((*summaries)[3].result_head == head_of(runs.front()));
  CHECK((*summaries)[3].run.error == runs.front().error);
  auto full = archive->log({});
  REQUIRE_FALSE(full);
  CHECK(contains(full.error().message, "not valid JSON"));
  const auto table = ferry_command(tmp, path, "log");
  CHECK(table.exit_code == 0);
  CHECK(contains(table.out, runs.front().run_id));
}

TEST_CASE("archive: recording a run copies none of its params and listing reads none",
          "[archive][memory]")
{
  TempDir tmp;
  const auto path = tmp / "archive.db";
  constexpr std::size_t params_size = std::size_t{64} << 20;
  const auto record_big_run = [&] {
    RunRecord run = make_run("20260102T030405Z-00000001");
    run.params = {{"blob", std::string(params_size, 'p')}, {"n", 1}};
    return peak_growth_kib(tmp, [&] {
      auto archive = Archive::open(path);
      return archive && archive->record(run);
    });
  };
  const long recording = record_big_run();
  INFO("peak RSS grew by " << recording << " KiB while recording 64 MiB of params");
  // A copy of the params (as JSON, as text, or in a row SQLite builds) would be 64 MiB more.
  // Under AddressSanitizer every allocation carries redzones and shadow: 8 MiB more allowed.
#if defined(__SANITIZE_ADDRESS__)
  constexpr long k_slack_kib = 8 * 1024;
#else
  constexpr long k_slack_kib = 0;
#endif
  CHECK(recording < 24 * 1024 + k_slack_kib);

  const long listing = peak_growth_kib(tmp, [&] {
    auto archive = Archive::open_read_only(path);
    return archive && archive->list({}) && archive->list({})->size() == 1;
  });
  INFO("peak RSS grew by " << listing << " KiB while listing it");
  CHECK(listing < 8 * 1024 + k_slack_kib);

  Archive archive = open_archive(path);
  auto loaded = archive.load("last");
  REQUIRE(loaded);
  CHECK(loaded->params["blob"].get_ref<const std::string&>().size() == params_size);
}

TEST_CASE("archive: a blob that no longer matches its sha256 is refused when verified",
          "[archive][schema]")
{
  TempDir tmp;
  const auto path = tmp / "archive.db";
  const RunRecord run = make_run("20260102T030405Z-00000001");
  {
    Archive archive = open_archive(path);
    record(archive, run);
  }
  Archive archive = open_archive(path);
  REQUIRE(archive.load(run.run_id, LoadOptions{.verify_blobs = true, .narrow = {}}));

  sql_exec(path, "UPDATE scripts SET bytes = CAST('#!/bin/sh\necho tampered\n' AS BLOB)");
  auto tampered = archive.load(run.run_id, LoadOptions{.verify_blobs = true, .narrow = {}});
  REQUIRE_FALSE(tampered);
  INFO(tampered.error().message);
  CHECK(tampered.error().kind == ErrorKind::failed);
  CHECK(contains(tampered.error().message, run.run_id));
  CHECK(contains(tampered.error().message, path.string()));
  CHECK(contains(tampered.error().message, "does not match its sha256"));
  CHECK(contains(tampered.error().message, ferry::sha256_hex(run.script)));
  // Unverified reads (show, export) still give the bytes as they are, to look at.
  CHECK(archive.load(run.run_id)->script == "#!/bin/sh\necho tampered\n");

  sql_exec(path, "DELETE FROM scripts");
  auto missing = archive.load(run.run_id, LoadOptions{.verify_blobs = true, .narrow = {}});
  REQUIRE_FALSE(missing);
  CHECK(contains(missing.error().message, "missing"));
}

TEST_CASE("archive: a detached run waits apart from the runs until it is collected",
          "[archive][schema][detach]")
{
  TempDir tmp;
  const auto path = tmp / "archive.db";
  RunRecord running = make_run("20260102T030405Z-0000000d");
  running.detached = {{"run_dir", "/home/u/.cache/ferry/runs/ferry-x"}, {"keep_for_s", 60}};
  running.script = "#!/bin/sh\necho detached\n";
  Archive archive = open_archive(path);
  REQUIRE(archive.record_detached(running));
  CHECK(to_json(running)["status"] == "running");
  auto waiting = archive.detached_runs();
  REQUIRE(waiting);
  REQUIRE(waiting->size() == 1);
  CHECK(waiting->front().run_id == running.run_id);
  CHECK(waiting->front().detached == running.detached);
  CHECK(waiting->front().script == running.script);
  CHECK(waiting->front().host_label == running.host_label);
  CHECK_FALSE(archive.resolve(running.run_id)); // not among the finished runs
  RunRecord collected = running;
  collected.detached = nullptr;
  record(archive, collected);
  REQUIRE(archive.forget_detached(running.run_id));
  CHECK(archive.detached_runs()->empty());
  CHECK(archive.load(running.run_id)->status == collected.status);
  CHECK(to_json(*archive.load(running.run_id)).count("detached") == 0);
}
