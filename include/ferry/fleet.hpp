#pragma once
// Many jobs on many hosts: one session per host (the handshake is paid once, jobs run one
// after another on it), at most `parallel` hosts at once, each session owned by one thread.
#include <functional>
#include <memory>
#include <vector>

#include "ferry/runner.hpp"
#include "ferry/transport.hpp"

namespace ferry {

struct PlannedRun {
  const Job* job = nullptr;
  nlohmann::json params;
};

struct FleetProgress {
  std::size_t total = 0;
  std::size_t done = 0;
  std::size_t failed = 0;
  std::size_t running = 0;
};

struct FleetCallbacks {
  // Called once per finished run, from worker threads but never two at once.
  std::function<void(RunRecord&)> on_done;
  // Called when the counts change (same lock as on_done).
  std::function<void(const FleetProgress&)> on_progress;
};

void run_fleet(std::vector<std::unique_ptr<HostSession>>& sessions,
               const std::vector<PlannedRun>& runs, int parallel, const RunOptions& options,
               const FleetCallbacks& callbacks);

} // namespace ferry
