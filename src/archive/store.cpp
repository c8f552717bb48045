#include <csignal>
#include <cstdlib>

#include "archive/errors.hpp"
#include "archive/store.hpp"
#include "ferry/util.hpp"

namespace ferry::archive {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// Test-only: FERRY_TEST_CRASH_IN_RECORD=after-script|after-run kills this process with SIGKILL
// at that step inside the recording transaction, so the tests can check that a crash
// mid-record leaves no half run and a sound database. Nothing else reads this variable.
void crash_here_if_asked(std::string_view step)
{
  const char* when = std::getenv("FERRY_TEST_CRASH_IN_RECORD");
  if (when != nullptr && step == when) {
    std::raise(SIGKILL);
  }
}

std::string host_of(const RunRecord& run)
{
  if (const auto host = run.target.find("host"); host != run.target.end() && host->is_string()) {
    return host->get<std::string>();
  }
  return "local";
}

// The run's JSON record without params, the result and the streams, which have columns of
// their own. Built from a copy that leaves the big members out. Every member is named in the
// binding, so one added to RunRecord stops this compiling until it is kept or left out here.
std::string small_record(const RunRecord& run)
{
  [[maybe_unused]] const auto& [run_id, job, job_sha256, target, params, status, exit_code, error,
                                result, stdout_text, stderr_text, stdout_truncated,
                                stderr_truncated, started_at, duration_s, timings, replay_of,
                                ferry_version, warnings, client, env, interpreter, options, files,
                                outputs, summary, gpus, detached, script, result_bytes, script_name,
                                blobs, host_label, unreachable, failure, invocation] = run;
  const RunRecord head{.run_id = run_id,
                       .job = job,
                       .job_sha256 = job_sha256,
                       .target = target,
                       .params = nlohmann::json::object(), // left out: a column of its own
                       .status = status,
                       .exit_code = exit_code,
                       .error = error,
                       .result = nullptr, // left out: a column of its own
                       .stdout_text = {},
                       .stderr_text = {},
                       .stdout_truncated = stdout_truncated,
                       .stderr_truncated = stderr_truncated,
                       .started_at = started_at,
                       .duration_s = duration_s,
                       .timings = timings,
                       .replay_of = replay_of,
                       .ferry_version = ferry_version,
                       .warnings = warnings,
                       .client = client,
                       .env = env,
                       .interpreter = interpreter,
                       .options = options,
                       .files = files,
                       .outputs = outputs,
                       .summary = summary,
                       .gpus = gpus,
                       .detached = detached,
                       .script = {},
                       .result_bytes = {},
                       .script_name = script_name,
                       .blobs = {},
                       .host_label = host_label,
                       .unreachable = unreachable,
                       .failure = failure,
                       .invocation = invocation};
  json record = to_json(head, false);
  record.erase("params");
  record.erase("result");
  return to_json_line(record);
}

// A JSON value's size as a line of text, and its first characters, from a first pass.
struct MeasuredJson {
  std::uint64_t size = 0;
  std::string head;
};

MeasuredJson measure(const json& value)
{
  constexpr std::size_t head_bytes = result_head_chars * 4; // 4 bytes at most per character
  MeasuredJson measured;
  stream_json_line(value, [&](std::string_view piece) {
    if (measured.head.size() < head_bytes) {
      measured.head.append(piece.substr(0, head_bytes - measured.head.size()));
    }
    measured.size += piece.size();
  });
  measured.head = first_chars(measured.head, result_head_chars);
  return measured;
}

// Serializes VALUE a second time, straight into the zeroblob its measure() sized.
SqliteResult<> write_json_blob(Database& db, const char* column, std::int64_t rowid,
                               const json& value)
{
  constexpr std::size_t chunk = 1 << 20;
  FERRY_TRY_ASSIGN(auto blob, BlobWriter::open(db, "runs", column, rowid));
  std::string buffer;
  std::uint64_t offset = 0;
  SqliteResult<> written;
  const auto flush = [&] {
    if (written && !buffer.empty()) {
      written = blob.write(offset, buffer);
    }
    offset += buffer.size();
    buffer.clear();
  };
  stream_json_line(value, [&](std::string_view piece) {
    buffer.append(piece);
    if (buffer.size() >= chunk) {
      flush();
    }
  });
  flush();
  FERRY_TRY(written);
  return blob.close();
}

SqliteResult<> insert_script(Database& db, const RunRecord& run, const std::string& sha256)
{
  FERRY_TRY_ASSIGN(auto stmt, db.prepare("INSERT INTO scripts(sha256, name, bytes) "
                                         "VALUES(?1, ?2, ?3) ON CONFLICT(sha256) DO NOTHING"));
  return stmt.bind(1, sha256).bind(2, run.script_name).bind_blob(3, run.script).run();
}

// The staged files' and archived outputs' bytes, once per sha256 (keyed by the bytes themselves).
SqliteResult<> insert_blobs(Database& db, const RunRecord& run)
{
  for (const auto& [sha256, bytes] : run.blobs) {
    FERRY_TRY_ASSIGN(auto stmt, db.prepare("INSERT INTO scripts(sha256, name, bytes) "
                                           "VALUES(?1, '', ?2) ON CONFLICT(sha256) DO NOTHING"));
    FERRY_TRY(stmt.bind(1, sha256_hex(bytes)).bind_blob(2, bytes).run());
  }
  return {};
}

// One run_files row per staged file and fetched output.
SqliteResult<> insert_file_rows(Database& db, const RunRecord& run)
{
  const std::pair<std::string_view, const json*> lists[] = {{"file", &run.files},
                                                            {"output", &run.outputs}};
  for (const auto& [kind, list] : lists) {
    for (const auto& item : *list) {
      FERRY_TRY_ASSIGN(auto stmt, db.prepare("INSERT INTO run_files(run_id, kind, path, mode, "
                                             "size, sha256, archived) "
                                             "VALUES(?1, ?2, ?3, ?4, ?5, ?6, ?7)"));
      const std::string sha256 = item.value("sha256", "");
      const bool archived = run.blobs.count(sha256) != 0;
      stmt.bind(1, run.run_id).bind(2, kind).bind(3, item.value("path", ""));
      if (const auto mode = item.find("mode"); mode != item.end() && mode->is_string()) {
        stmt.bind(4, static_cast<std::int64_t>(std::stoll(mode->get<std::string>(), nullptr, 8)));
      } else {
        stmt.bind_null(4);
      }
      stmt.bind(5, item.value("size", std::int64_t{0}))
          .bind(6, sha256)
          .bind(7, std::int64_t{archived ? 1 : 0});
      FERRY_TRY(stmt.run());
    }
  }
  return {};
}

// The row with its small columns set and every big one a zeroblob of the right size; its rowid.
SqliteResult<std::int64_t> insert_row(Database& db, const RunRecord& run,
                                      const std::optional<std::string>& script_sha256,
                                      std::uint64_t params_size,
                                      const std::optional<MeasuredJson>& result)
{
  const std::string host = host_of(run);
  FERRY_TRY_ASSIGN(auto stmt,
                   db.prepare(fmt::format("INSERT INTO runs({}) VALUES(?1, ?2, ?3, ?4, ?5, ?6, ?7, "
                                          "?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18, "
                                          "?19, ?20, ?21)",
                                          run_columns)));
  stmt.bind(1, run.run_id)
      .bind(2, run.job)
      .bind(3, run.job_sha256)
      .bind_optional(4, script_sha256)
      .bind(5, run.script_name)
      .bind(6, host)
      .bind(7, run.host_label.empty() ? host : run.host_label)
      .bind(8, to_string(run.status))
      .bind_optional(9, run.exit_code)
      .bind_optional(10, run.error)
      .bind(11, run.started_at)
      .bind(12, run.duration_s)
      .bind_optional(13, run.replay_of)
      .bind(14, run.ferry_version)
      .bind_optional(15, result ? std::optional(result->head) : std::nullopt)
      .bind(16, small_record(run))
      .bind_zeroblob(17, params_size)
      .bind_zeroblob(20, run.stdout_text.size())
      .bind_zeroblob(21, run.stderr_text.size());
  if (result) {
    stmt.bind_zeroblob(18, result->size);
  } else {
    stmt.bind_null(18);
  }
  if (run.result_bytes.empty()) {
    stmt.bind_null(19);
  } else {
    stmt.bind_zeroblob(19, run.result_bytes.size());
  }
  FERRY_TRY(stmt.run());
  return sqlite3_last_insert_rowid(db.handle());
}

SqliteResult<> insert_run_row(Database& db, const RunRecord& run,
                              const std::optional<std::string>& script_sha256)
{
  const std::uint64_t params_size = measure(run.params).size;
  std::optional<MeasuredJson> result;
  if (!run.result.is_null()) {
    result = measure(run.result);
  }
  FERRY_TRY_ASSIGN(const auto rowid, insert_row(db, run, script_sha256, params_size, result));
  // The large columns are filled in place, chunk by chunk, inside the same transaction.
  FERRY_TRY(write_json_blob(db, "params", rowid, run.params));
  if (result) {
    FERRY_TRY(write_json_blob(db, "result", rowid, run.result));
  }
  FERRY_TRY(write_blob(db, "runs", "result_bytes", rowid, run.result_bytes));
  FERRY_TRY(write_blob(db, "runs", "stdout", rowid, run.stdout_text));
  return write_blob(db, "runs", "stderr", rowid, run.stderr_text);
}

// The JSON text of column COLUMN, parsed where SQLite holds it (no copy of the text).
Expected<json> parse_column(const Statement& row, int column, std::string_view what,
                            const std::string& run_id, const fs::path& path)
{
  const std::string_view text = row.column_view(column);
  json value = json::parse(text.begin(), text.end(), nullptr, false);
  if (value.is_discarded()) {
    return fail(ErrorKind::failed,
                "archive {}: the {} of run {} is not valid JSON; the archive is damaged",
                path.string(), what, run_id);
  }
  return value;
}

} // namespace

Expected<void> insert_run(Database& db, const fs::path& path, const RunRecord& run)
{
  const std::string doing = fmt::format("record run {}", run.run_id);
  std::optional<std::string> script_sha256;
  if (!run.script.empty()) {
    // Keyed by the bytes themselves, so a record whose job_sha256 is wrong cannot file its
    // script under another script's hash.
    script_sha256 = sha256_hex(run.script);
    FERRY_TRY(explained(insert_script(db, run, *script_sha256), path, doing, &db));
  }
  FERRY_TRY(explained(insert_blobs(db, run), path, doing, &db));
  crash_here_if_asked("after-script");
  auto inserted = insert_run_row(db, run, script_sha256);
  if (!inserted && inserted.error().code == SQLITE_CONSTRAINT_PRIMARYKEY) {
    return fail(ErrorKind::failed,
                "cannot record run {}: archive {} already holds a run with that id", run.run_id,
                path.string());
  }
  FERRY_TRY(explained(std::move(inserted), path, doing, &db));
  FERRY_TRY(explained(insert_file_rows(db, run), path, doing, &db));
  if (run.invocation) {
    FERRY_TRY_ASSIGN(auto stmt,
                     explained(db.prepare("INSERT INTO run_invocations(run_id, invocation) "
                                          "VALUES(?1, ?2)"),
                               path, doing, &db));
    FERRY_TRY(explained(stmt.bind(1, run.run_id).bind(2, *run.invocation).run(), path, doing, &db));
  }
  crash_here_if_asked("after-run");
  return {};
}

Expected<RunRecord> record_from_row(const Statement& row, const fs::path& path)
{
  const std::string run_id = row.column_bytes(0);
  FERRY_TRY_ASSIGN(auto record, parse_column(row, 1, "record", run_id, path));
  auto parsed = run_record_from_json(record);
  if (!parsed) {
    return fail(ErrorKind::failed, "archive {}: {}", path.string(), parsed.error().message);
  }
  RunRecord run = std::move(parsed).value();
  run.error = row.column_optional(2); // the raw bytes, not the JSON's UTF-8-repaired copy
  run.script_name = row.column_bytes(3);
  run.host_label = row.column_bytes(4);
  run.result_bytes = row.column_bytes(5);
  run.stdout_text = row.column_bytes(6);
  run.stderr_text = row.column_bytes(7);
  if (row.is_null(8)) {
    return run; // a v1 record that kept its params and result (see the v2 migration)
  }
  FERRY_TRY_ASSIGN(run.params, parse_column(row, 8, "params", run_id, path));
  run.result = nullptr;
  if (!row.is_null(9)) {
    FERRY_TRY_ASSIGN(run.result, parse_column(row, 9, "result", run_id, path));
  }
  return run;
}

Expected<RunSummary> summary_from_row(const Statement& row, const fs::path& path)
{
  const std::string run_id = row.column_bytes(0);
  FERRY_TRY_ASSIGN(auto record, parse_column(row, 1, "record", run_id, path));
  auto parsed = run_record_from_json(record);
  if (!parsed) {
    return fail(ErrorKind::failed, "archive {}: {}", path.string(), parsed.error().message);
  }
  RunSummary summary{std::move(parsed).value(), row.column_bytes(5)};
  RunRecord& run = summary.run;
  run.error = row.column_optional(2);
  run.script_name = row.column_bytes(3);
  run.host_label = row.column_bytes(4);
  if (record.contains("params") && !run.result.is_null()) {
    // A v1 record kept whole (see the v2 migration): its result is in it.
    summary.result_head = first_chars(to_json_line(run.result), result_head_chars);
  }
  run.params = json::object();
  run.result = nullptr;
  return summary;
}

std::string first_chars(std::string_view text, std::size_t chars)
{
  std::size_t end = 0;
  for (std::size_t seen = 0; end < text.size(); ++end) {
    const bool starts_char = (static_cast<unsigned char>(text[end]) & 0xC0) != 0x80;
    if (starts_char && seen++ == chars) {
      break;
    }
  }
  return std::string(text.substr(0, end));
}

namespace {

class PieceAdapter final : public nlohmann::detail::output_adapter_protocol<char> {
public:
  explicit PieceAdapter(const std::function<void(std::string_view)>& sink) : m_sink(sink) {}
  void write_character(char c) override { m_sink(std::string_view(&c, 1)); }
  void write_characters(const char* s, std::size_t length) override
  {
    m_sink(std::string_view(s, length));
  }

private:
  const std::function<void(std::string_view)>& m_sink;
};

} // namespace

void stream_json_line(const json& value, const std::function<void(std::string_view)>& sink)
{
  // What json::dump(-1, ' ', false, replace), and so to_json_line, does, with another output.
  nlohmann::detail::serializer<json> serializer(std::make_shared<PieceAdapter>(sink), ' ',
                                                json::error_handler_t::replace);
  serializer.dump(value, false, false, 0);
}

} // namespace ferry::archive
