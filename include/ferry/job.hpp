#pragma once
// A job is one file: a script whose `/// ferry` comment block (TOML) declares its interpreter,
// timeout and typed parameters (docs/job-file.md).
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

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
};

struct JobMeta {
  std::string description;
  std::string interpreter;
  int timeout_s = 300;
  std::vector<ParamSpec> params; // in declaration order
  SlurmOptions slurm;            // what the job asks of a Slurm target (its `[slurm]` table)
};

struct Job {
  std::string name;      // file name without extension
  std::string source;    // "built-in" or the file's path
  std::string file_name; // the name it travels under (its own file name)
  std::string bytes;     // exactly the file's bytes
  JobMeta meta;

  [[nodiscard]] const ParamSpec* param(std::string_view name) const;
};

// Parses a job from its bytes. `label` names the file in error messages.
[[nodiscard]] Expected<Job> parse_job(std::string name, std::string file_name, std::string source,
                                      std::string bytes);
[[nodiscard]] Expected<JobMeta> parse_job_meta(std::string_view bytes, std::string_view label);

// Where jobs are looked up, first match wins (docs/job-file.md).
struct JobPath {
  std::vector<std::filesystem::path> dirs; // --jobs-dir, $FERRY_JOBS_PATH, ./jobs, config dir
  bool builtins = true;

  // The default path for the given --jobs-dir options and the environment.
  [[nodiscard]] static JobPath from_environment(const std::vector<std::string>& jobs_dirs);
};

// `spec` is a job name on the path or a path to a job file.
[[nodiscard]] Expected<Job> find_job(const std::string& spec, const JobPath& path);

struct JobListing {
  std::string name;
  std::string source;
  std::string description;
};
// Every job on the path, each name once (the first that wins), sorted by name.
[[nodiscard]] std::vector<JobListing> list_jobs(const JobPath& path);

// A ready-to-edit job file (`ferry new`).
[[nodiscard]] std::string job_template(std::string_view name, std::string_view lang);

} // namespace ferry
