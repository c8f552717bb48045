#pragma once
// What happens to runs, as it happens, for whoever shows or keeps it (a reporter, the archive, an
// MCP server): the fleet (include/ferry/fleet.hpp) calls a RunObserver; reporters sit a layer
// below the runner, so the interface lives here, beside the record it hands over.
#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "ferry/output_stream.hpp"
#include "ferry/run_record.hpp"

namespace ferry {

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

} // namespace ferry
