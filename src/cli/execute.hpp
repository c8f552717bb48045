#pragma once
// Runs planned jobs on sessions for `run`, `check` and `replay`: every finished run is archived
// and handed to the command's view, and the outcome becomes the exit code.
#include "cli/cli.hpp"
#include "ferry/fleet.hpp"

namespace ferry::cli {

struct BatchOptions {
  bool archive = true;
  int parallel = 8;
  std::vector<std::string> swept; // --sweep keys: a column each in the summary
};

[[nodiscard]] ExitCode execute_runs(Context& ctx,
                                    std::vector<std::unique_ptr<HostSession>>& sessions,
                                    const std::vector<PlannedRun>& runs,
                                    const RunOptions& run_options, const BatchOptions& batch,
                                    RunObserver& view);

// Installs the SIGINT/SIGTERM handlers that ask running jobs to stop.
void install_interrupt_handlers();

} // namespace ferry::cli
