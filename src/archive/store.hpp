#pragma once
// One run in the archive's tables and back: the write inside a transaction, the row read back
// into a RunRecord. Shared by the archive and its spool files, which have the same schema.
#include <filesystem>
#include <functional>
#include <string>
#include <string_view>

#include "archive/sqlite.hpp"
#include "ferry/archive.hpp"
#include "ferry/expected.hpp"
#include "ferry/run_record.hpp"

namespace ferry::archive {

// Stores RUN and its script (once per sha256) inside the caller's transaction. Params and the
// result are written into their columns as they are serialized, never held whole as text.
[[nodiscard]] Expected<void> insert_run(Database& db, const std::filesystem::path& path,
                                        const RunRecord& run);

// Every column of a run, as INSERT lists them.
inline constexpr std::string_view run_columns =
    "run_id, job, job_sha256, script_sha256, script_name, host, host_label, status, exit_code, "
    "error, started_at, duration_s, replay_of, ferry_version, result_head, record, params, "
    "result, result_bytes, stdout, stderr";

// The columns record_from_row reads, in its order; `script_sha256` follows them in load().
inline constexpr std::string_view record_columns =
    "run_id, record, error, script_name, host_label, result_bytes, stdout, stderr, params, result";
inline constexpr std::string_view record_columns_without_output =
    "run_id, record, error, script_name, host_label, NULL, NULL, NULL, params, result";
inline constexpr int script_sha256_column = 10;

// A row selected with record_columns back into a RunRecord.
[[nodiscard]] Expected<RunRecord> record_from_row(const Statement& row,
                                                  const std::filesystem::path& path);

// The columns summary_from_row reads: what `log` prints, all before the big ones (SQLite reads
// a row's columns up to the last one asked for; even `params IS NULL` would load params).
inline constexpr std::string_view summary_columns =
    "run_id, record, error, script_name, host_label, result_head";

[[nodiscard]] Expected<RunSummary> summary_from_row(const Statement& row,
                                                    const std::filesystem::path& path);

// How many characters of the result's JSON line `result_head` keeps.
inline constexpr std::size_t result_head_chars = 256;

// The first `chars` characters (code points) of UTF-8 TEXT, as SQLite's substr() counts them.
[[nodiscard]] std::string first_chars(std::string_view text, std::size_t chars);

// Serializes VALUE exactly as to_json_line does, handing the text to SINK in pieces, so that a
// large value is never held whole as text.
void stream_json_line(const nlohmann::json& value,
                      const std::function<void(std::string_view)>& sink);

} // namespace ferry::archive
