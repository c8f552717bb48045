#pragma once
// Many jobs on many hosts: one session per host (the handshake is paid once, the host's jobs
// share it), at most `parallel` runs at once. The sessions come from a SessionSource: the
// command line's are made for the batch and end with it, a server's are kept for its next call.
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

// A session lent for one target's runs.
struct Lease {
  std::unique_ptr<HostSession> session;
  // Connected by an earlier batch (kept by the source): it may have died while idle, so a first
  // run that fails before anything was staged is tried again on a fresh session.
  bool connected = false;
};

// Where a batch's sessions come from: one per target, borrowed for the target's runs and given
// back after the last of them. Called from several threads at once.
class SessionSource {
public:
  virtual ~SessionSource() = default;
  [[nodiscard]] virtual std::size_t targets() const = 0;
  // A session for target `i`; `fresh`: a new one, not one kept from before.
  [[nodiscard]] virtual Lease borrow(std::size_t i, bool fresh) = 0;
  // The target's runs are done. `healthy` false: a run failed with an error, or connecting did;
  // the session is not kept.
  virtual void give_back(std::size_t i, Lease lease, bool healthy) = 0;
  // The name target `i`'s runs go by (their RunRef host and record's host_label).
  [[nodiscard]] virtual std::string label(std::size_t /*i*/, const HostSession& session) const
  {
    return session.label();
  }
  // Whether sessions outlive the batch (then the fleet cannot tell a session how many runs it
  // will be given in all).
  [[nodiscard]] virtual bool keeps_sessions() const { return false; }
};

// The sessions made for one batch, each lent once and disconnected when given back.
class SessionList final : public SessionSource {
public:
  explicit SessionList(std::vector<std::unique_ptr<HostSession>>& sessions) : m_sessions(sessions)
  {
  }
  [[nodiscard]] std::size_t targets() const override { return m_sessions.size(); }
  [[nodiscard]] Lease borrow(std::size_t i, bool /*fresh*/) override
  {
    return {std::move(m_sessions[i]), false};
  }
  void give_back(std::size_t /*i*/, Lease /*lease*/, bool /*healthy*/) override {}

private:
  std::vector<std::unique_ptr<HostSession>>& m_sessions;
};

void run_fleet(SessionSource& sessions, const std::vector<PlannedRun>& runs, int parallel,
               const RunOptions& options, RunObserver& observer,
               std::vector<std::string> swept = {});

// The same with sessions made for the batch (a SessionList).
void run_fleet(std::vector<std::unique_ptr<HostSession>>& sessions,
               const std::vector<PlannedRun>& runs, int parallel, const RunOptions& options,
               RunObserver& observer, std::vector<std::string> swept = {});

} // namespace ferry
