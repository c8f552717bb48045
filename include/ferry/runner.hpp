#pragma once
// Runs one job on one connected HostSession: stage, exec the launcher, fetch, clean up, and
// turn what happened into a RunRecord. Knows nothing of how the session reaches its host.
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ferry/job.hpp"
#include "ferry/run_env.hpp"
#include "ferry/run_record.hpp"
#include "ferry/transport.hpp"

namespace ferry {

struct RunOptions {
  std::size_t output_cap = 16u << 20; // per stream
  std::size_t result_cap = 64u << 20; // result.json larger than this is a bad result
  std::optional<int> timeout_s;       // overrides the job's own
  int grace_s = 2;
  bool keep_remote = false;
  std::optional<std::string> replay_of;
  std::optional<std::string> invocation; // the id every run of one invocation shares
  bool verbose = false;                  // `-v`: each step with its time on stderr
  StopToken stop;       // stopped: the runs end as on an interrupt (status interrupted)
  OutputSink on_output; // optional: the job's output as it arrives
  // The job's environment and interpreter: the job's [env], then the host's settings from the
  // config file, then --env; --interpreter NAME=PATH wins over the config file's mapping.
  EnvVars env;
  std::map<std::string, std::string> interpreters;
  std::function<HostSettings(std::string_view host)> host_settings; // may be empty
  // Recorded only (the session applies it): the run directory base given, empty for the default.
  std::string remote_base;
  // Files back: `--fetch` globs (besides the job's `outputs`), where they go (`{run_id}` and
  // `{host}` replaced), and how many bytes of them per run the archive keeps.
  std::vector<std::string> fetch;
  std::string out_dir = "ferry-out/{run_id}/{host}";
  std::uint64_t archive_outputs_max = 16u << 20;
  NoteSink on_note; // optional: the target's notes about a run (a scheduler's queue state)
  // `--gpus N` (over the job's `gpus`): the launcher picks and locks N free GPUs on the host,
  // waiting up to `wait_gpus_s` for them (docs/run-protocol.md, "GPUs"). On a target whose
  // scheduler allocates GPUs (Slurm), a job's `gpus` becomes its GPU request instead.
  std::optional<int> gpus;
  int wait_gpus_s = 0;
  bool gpus_by_scheduler = false;
  // --detach: the run is started apart from ferry and its record says so (RunRecord::detached);
  // once finished, it waits this many seconds on the host for `ferry attach`.
  std::optional<long long> detach_keep_for_s;
};

// The record's "options" (docs/record.md): the options the run is made with, defaults applied,
// as `replay` reuses them. The one place that decides what a record keeps of them.
[[nodiscard]] nlohmann::json recorded_options(const RunOptions& options, const Job& job);

// `-v` output: "ferry: gpu1 kv_calc: upload 0.004 s".
void log_step(const RunOptions& options, std::string_view host, std::string_view job,
              std::string_view step, double seconds);

// A record for a run that never started (connect or key failure, interrupted before start).
[[nodiscard]] RunRecord unstarted_run(const Job& job, const nlohmann::json& params,
                                      const HostSession& session, RunStatus status,
                                      std::string error);

// The run: every failure ends up in the record, never as an exception.
[[nodiscard]] RunRecord run_job(HostSession& session, const Job& job, const nlohmann::json& params,
                                const RunOptions& options);

// `ferry attach` and `ferry stop`: a detached run (RunRecord::detached) followed to its end on
// `session`, then collected as a run that was never detached (outputs fetched, the run directory
// removed). `stop` sends the job TERM (KILL after the grace) first and records it interrupted.
struct Attached {
  enum class End {
    collected, // `record` is the run's final record
    detached,  // ferry was interrupted while it followed: the run goes on, nothing changed
    gone,      // the run directory is not on the host any more
  };
  End end = End::collected;
  RunRecord record;
};
[[nodiscard]] Expected<Attached> attach_run(HostSession& session, const Job& job, RunRecord record,
                                            const RunOptions& options, bool stop);

// The variables and the interpreter a run on `host` gets (see RunOptions).
struct JobSetup {
  EnvVars env;
  std::string interpreter;
};
[[nodiscard]] JobSetup job_setup(const Job& job, const RunOptions& options, std::string_view host);

// The file name the job travels under inside its run directory.
[[nodiscard]] std::string staged_job_file_name(const Job& job);

// The result (docs/job-file.md): result.json when present (must be JSON), else stdout when it is
// exactly one JSON document, else null. `bad` explains why a present result is unusable.
struct ParsedResult {
  nlohmann::json value;
  std::optional<std::string> bad;
};
[[nodiscard]] ParsedResult parse_result(const std::optional<std::string>& result_file,
                                        std::string_view stdout_text, std::size_t cap);

} // namespace ferry
