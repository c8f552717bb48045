#pragma once
// One run of one job on one target: what `run --json`, `show --json` and the archive carry
// (docs/record.md).
#include <cstdio>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ferry/expected.hpp"

namespace ferry {

enum class RunStatus { ok, failed, timeout, bad_result, no_result, error, interrupted };

// Every status, in the order docs/record.md lists them.
inline constexpr RunStatus k_run_statuses[] = {
    RunStatus::ok,        RunStatus::failed, RunStatus::timeout,    RunStatus::bad_result,
    RunStatus::no_result, RunStatus::error,  RunStatus::interrupted};

[[nodiscard]] std::string_view to_string(RunStatus status);
// "unreachable", "refused", "timeout", "host-key", "auth" ("" for none), and back.
[[nodiscard]] std::string_view to_string(Unreached failure);
[[nodiscard]] std::optional<Unreached> unreached_from(std::string_view text);
// The names of k_run_statuses, for messages, help, completion and schemas.
[[nodiscard]] std::vector<std::string> run_status_names();
[[nodiscard]] std::optional<RunStatus> run_status_from(std::string_view text);

struct Timings {
  double connect = 0;
  double upload = 0;
  double exec = 0;
  double fetch = 0;
};

struct RunRecord {
  std::string run_id;
  std::string job;
  std::string job_sha256;
  nlohmann::json target =
      nlohmann::json::object(); // {"host","user","port","host_key_sha256"} | {"local":true}
  nlohmann::json params = nlohmann::json::object();
  RunStatus status = RunStatus::error;
  std::optional<int> exit_code;
  std::optional<std::string> error;
  nlohmann::json result;   // null when there is none
  std::string stdout_text; // raw bytes as they came back (capped)
  std::string stderr_text;
  bool stdout_truncated = false;
  bool stderr_truncated = false;
  std::string started_at; // ISO 8601 UTC
  double duration_s = 0;
  Timings timings;
  std::optional<std::string> replay_of;
  std::string ferry_version;
  nlohmann::json warnings = nlohmann::json::array(); // ferry's own notes about the run
  // {"name","version"} of the MCP client that asked for the run (`ferry mcp`); null for runs
  // the command line started, and then absent from the JSON record.
  nlohmann::json client;
  // The names (never the values) of the variables the job was given, and the interpreter that
  // ran it (after the config file and --interpreter).
  std::vector<std::string> env;
  std::string interpreter;
  // The effective options the run was made with (docs/record.md, "options"): what `replay`
  // runs with again. An empty object for runs recorded before ferry kept them.
  nlohmann::json options = nlohmann::json::object();
  // Files staged beside the job, [{"path","mode","size","sha256"}], and files fetched back,
  // [{"path","size","sha256","archived"}]; absent from the JSON record when empty.
  nlohmann::json files = nlohmann::json::array();
  nlohmann::json outputs = nlohmann::json::array();
  // The job's headline figures (its `summary` pointers), [{"name","value"}] in the order the job
  // declares them: what a sweep's table and `ferry log` show of the result. Null when the job
  // declares none (then absent from the JSON record).
  nlohmann::json summary;
  // The GPUs the launcher picked and locked for the job (--gpus), [{"index","uuid"}]; absent from
  // the JSON record when empty.
  nlohmann::json gpus = nlohmann::json::array();
  // A detached run not yet collected (`ferry run --detach`): where it runs and what attach needs
  // ({"run_dir","sentinel","end_marker","keep_for_s","fetch","out_dir","archive_outputs_max"});
  // the JSON record's status is then `running`. Null for every other record.
  nlohmann::json detached;

  // Not part of the JSON record: the exact bytes that ran, the name they travelled under, and
  // the result file's bytes as they came back.
  std::string script;
  std::string result_bytes;
  std::string script_name;
  // Not part of the JSON record: the bytes of the staged files and of the archived outputs, by
  // sha256 (each stored once in the archive).
  std::map<std::string, std::string> blobs;
  std::string host_label;   // what the user called the target ("gpu1", "local")
  bool unreachable = false; // the host could not be reached or trusted (exit 3)
  // Why (the JSON record's "failure"); `none` for a host that was reached.
  Unreached failure = Unreached::none;
  // The id every run of one ferry invocation shares (`ferry log --invocation`,
  // `ferry run --retry-failed`); absent from runs recorded before ferry kept it.
  std::optional<std::string> invocation;
};

// The values of RESULT at POINTERS (a job's `summary`), [{"name","value"}] in their order. A
// token "*" stands for every member (or element) at its level. Each is named by the tokens "*"
// matched and its last token ("/kv/*/max_tokens" -> "bf16/max_tokens"); one the result lacks
// is left out.
[[nodiscard]] nlohmann::json result_summary(const nlohmann::json& result,
                                            const std::vector<std::string>& pointers);
// The summary as one line for a table: "bf16/max_tokens=641164 fp8_e4m3/max_tokens=1282328".
[[nodiscard]] std::string summary_text(const nlohmann::json& summary);

// A fresh run id: "<UTC compact>-<8 random hex>".
[[nodiscard]] std::string new_run_id();

// Invalid UTF-8 in stdout/stderr is replaced (U+FFFD) in JSON; the archive keeps raw bytes.
[[nodiscard]] nlohmann::json to_json(const RunRecord& record, bool with_streams = true);
[[nodiscard]] Expected<RunRecord> run_record_from_json(const nlohmann::json& json);

// One JSON Lines line (no trailing newline), invalid UTF-8 replaced.
[[nodiscard]] std::string to_json_line(const nlohmann::json& json);

// Writes the record as one JSON line to `out`, streaming stdout and stderr straight from the
// record (no copy of them is built), with `extra` members added. Invalid UTF-8 becomes U+FFFD.
void write_json_line(std::FILE* out, const RunRecord& record,
                     const nlohmann::json& extra = nlohmann::json::object());

// The bytes of params.json as the job receives it (and as `export` writes it back).
[[nodiscard]] std::string params_file_bytes(const nlohmann::json& params);

// `text` as a JSON string literal written to `out` in chunks.
void write_json_string(std::FILE* out, std::string_view text);

} // namespace ferry
