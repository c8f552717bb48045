#pragma once
// Runs planned jobs on sessions and reports them: human blocks or JSON Lines, the archive, the
// progress line, the exit code. Shared by `run`, `check` and `replay`.
#include <functional>

#include "cli/cli.hpp"
#include "ferry/fleet.hpp"

namespace ferry::cli {

struct ReportOptions {
  bool json = false;
  bool archive = true;
  bool quiet_stdout = false; // `check`: the caller prints its own view
  int parallel = 8;
};

// Returns the exit code per SPEC; `on_record` sees every finished record (after archiving).
int execute_runs(Context& ctx, std::vector<std::unique_ptr<HostSession>>& sessions,
                 const std::vector<PlannedRun>& runs, const RunOptions& run_options,
                 const ReportOptions& report, const std::function<void(const RunRecord&)>& on_record = {});

// Installs the SIGINT/SIGTERM handlers that ask running jobs to stop.
void install_interrupt_handlers();

// "{"gpus":[…]}" shortened to `width` characters for a table cell.
[[nodiscard]] std::string result_digest(const RunRecord& record, std::size_t width = 60);
// The same from the result as one JSON line, or its start (empty: no result).
[[nodiscard]] std::string result_digest(const RunRecord& record, std::string_view result_line,
                                        std::size_t width);

} // namespace ferry::cli
