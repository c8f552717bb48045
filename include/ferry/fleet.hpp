#pragma once
// Many jobs on many hosts: one session per host (the handshake is paid once, jobs run one
// after another on it), at most `parallel` hosts at once, each session owned by one thread.
#include <memory>
#include <string>
#include <string_view>
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

// Which run an event is about.
struct RunRef {
  std::string_view host; // the name the user gave
  std::string_view job;
};

// What a batch of runs is about to be.
struct BatchInfo {
  std::size_t total = 0;          // runs
  std::size_t hosts = 0;          // targets
  std::vector<std::string> swept; // parameters swept over (`--sweep`), in order
};

// What happens to runs, as it happens: a reporter, the archive, an MCP server listen to this.
// The fleet calls it from worker threads, but never two calls at once.
class RunObserver {
public:
  virtual ~RunObserver() = default;
  // Before anything runs: how many runs there will be, on how many hosts.
  virtual void batch_started(const BatchInfo& /*batch*/) {}
  virtual void run_started(const RunRef& /*run*/) {}
  // Output of a running job as it arrives (after the launcher's own lines are taken out).
  virtual void run_output(const RunRef& /*run*/, OutputStream /*stream*/,
                          std::string_view /*bytes*/)
  {
  }
  // What the target says about a running job that is not its output (a scheduler's queue
  // state: "job 4242 pending: Resources").
  virtual void run_note(const RunRef& /*run*/, std::string_view /*text*/) {}
  // A run has ended; the observer may take what it needs from the record (or add to it).
  virtual void run_finished(RunRecord& record) = 0;
  virtual void progress(const FleetProgress& /*progress*/) {}
  // Every run has ended.
  virtual void batch_finished() {}
};

void run_fleet(std::vector<std::unique_ptr<HostSession>>& sessions,
               const std::vector<PlannedRun>& runs, int parallel, const RunOptions& options,
               RunObserver& observer, std::vector<std::string> swept = {});

} // namespace ferry
