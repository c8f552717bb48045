#pragma once
// Runs one job on one connected HostSession: stage, exec the launcher, fetch, clean up, and
// turn what happened into a RunRecord. Knows nothing of how the session reaches its host.
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "ferry/job.hpp"
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
  bool verbose = false; // `-v`: each step with its time on stderr
  StopToken stop;       // stopped: the runs end as on an interrupt (status interrupted)
  OutputSink on_output; // optional: the job's output as it arrives
  NoteSink on_note;     // optional: the target's notes about a run (a scheduler's queue state)
};

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
