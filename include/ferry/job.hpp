#pragma once
// A job is one file: a script whose `/// ferry` comment block (TOML) declares its interpreter,
// timeout and typed parameters (docs/job-file.md).
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ferry/bundle.hpp"
#include "ferry/expected.hpp"
#include "ferry/slurm_options.hpp"

namespace ferry {

enum class ParamType { integer, floating, boolean, string, list, json };

[[nodiscard]] std::string_view to_string(ParamType type);

struct ParamSpec {
  std::string name;
  ParamType type = ParamType::string;
  ParamType items = ParamType::string; // element type when type == list
  std::optional<nlohmann::json> default_value;
  bool required = false;
  std::optional<nlohmann::json> choices; // a JSON array of allowed values (elements, for lists)
  std::string help;
  // `program = true`: the values name programs the job runs on the host; `choices` is then
  // required, and is the allow-list of plain program names (no path).
  bool program = false;
  // `pattern`: an ECMAScript regular expression every string value (list element) must match
  // whole: a parameter that names a thing on the host (a service) without being free text.
  std::optional<std::string> pattern;
};

// The most GPUs one run may ask for (`gpus`, --gpus).
inline constexpr int k_max_gpus = 64;

struct JobMeta {
  std::string description;
  std::string interpreter;
  int timeout_s = 300;
  std::vector<ParamSpec> params; // in declaration order
  // `result = "required"` (the default): a run that returns no result is `no-result`.
  bool result_required = true;
  // A JSON Schema (an object) the job's result follows; `ferry mcp` publishes it as the tool's
  // output schema.
  std::optional<nlohmann::json> result_schema;
  // `[env]`: variables the job runs with (docs/job-file.md); --env and the config file add to
  // them and win.
  std::map<std::string, std::string> env;
  // `volatile = ["/cwd", "/hostname"]`: JSON Pointers into the result whose values legitimately
  // vary from run to run; `replay` leaves them (and what is below them) out of its comparison.
  std::vector<std::string> volatile_pointers;
  // `summary = ["/tp", "/kv/*/max_tokens"]`: JSON Pointers to the result's headline figures
  // ("*": every member at its level), shown for a run in a sweep's table and by `ferry log`.
  std::vector<std::string> summary;
  // `files`: globs relative to the job file's directory, staged beside the job; `outputs`: globs
  // relative to the run directory, fetched after the run.
  std::vector<std::string> files;
  std::vector<std::string> outputs;
  SlurmOptions slurm; // what the job asks of a Slurm target (its `[slurm]` table)
  // `gpus = N` (1..k_max_gpus): free GPUs the launcher picks and locks on the host (0: none);
  // --gpus wins.
  int gpus = 0;
};

struct Job {
  std::string name;      // file name without extension
  std::string source;    // "built-in" or the file's path
  std::string file_name; // the name it travels under (its own file name)
  std::string bytes;     // exactly the file's bytes
  JobMeta meta;
  std::vector<BundleFile> files; // what travels beside it (resolve_job_files, or the archive)

  [[nodiscard]] const ParamSpec* param(std::string_view name) const;
};

// Parses a job from its bytes. `label` names the file in error messages.
[[nodiscard]] Expected<Job> parse_job(std::string name, std::string file_name, std::string source,
                                      std::string bytes);
[[nodiscard]] Expected<JobMeta> parse_job_meta(std::string_view bytes, std::string_view label);

// Whether the bytes hold a `/// ferry` opening line: only such files on the job path are jobs.
[[nodiscard]] bool has_job_block(std::string_view bytes);

// Where jobs are looked up, first match wins (docs/job-file.md).
struct JobPath {
  std::vector<std::filesystem::path> dirs; // --jobs-dir, $FERRY_JOBS_PATH, ./jobs, config dir
  bool builtins = true;
  // Why each of `dirs` is on the path ("--jobs-dir", "$FERRY_JOBS_PATH", ...); may be shorter.
  std::vector<std::string> origins;

  // The default path for the given --jobs-dir options and the environment. `cwd_jobs` false
  // leaves out ./jobs, whose jobs depend on the current directory (`ferry mcp`: the client's).
  [[nodiscard]] static JobPath from_environment(const std::vector<std::string>& jobs_dirs,
                                                bool cwd_jobs = true);
};

// `builtin:NAME` names the built-in job NAME whatever the job path holds.
inline constexpr std::string_view k_builtin_prefix = "builtin:";

// `spec` is a job name on the path, `builtin:NAME`, or a path to a job file.
[[nodiscard]] Expected<Job> find_job(const std::string& spec, const JobPath& path);

struct JobListing {
  std::string name;        // what runs it: the file's name, or builtin:NAME for a hidden built-in
  std::string source;      // the file's path, or "built-in"
  std::string description; // for a job that does not parse: "(not a valid job: FIRST LINE)"
  std::string interpreter; // empty when the job does not parse
  bool valid = true;
  std::string shadows;     // a file named like a built-in: "builtin:NAME"
  std::string shadowed_by; // a built-in that such a file hides: the file's path
};

struct JobScan {
  std::vector<JobListing> jobs;   // each name once (the first that wins), sorted by name, then any
                                  // built-in a file hides under builtin:NAME
  std::vector<std::string> notes; // files passed over: not jobs, or hidden by an earlier one
};

// Every job on the path, and what was passed over (for `-v`).
[[nodiscard]] JobScan scan_jobs(const JobPath& path);
// scan_jobs(path).jobs.
[[nodiscard]] std::vector<JobListing> list_jobs(const JobPath& path);

// A ready-to-edit job file (`ferry new`).
[[nodiscard]] std::string job_template(std::string_view name, std::string_view lang);

} // namespace ferry
