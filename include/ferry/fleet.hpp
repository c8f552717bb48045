#pragma once
// Many jobs on many hosts: one session per host (the handshake is paid once, the host's jobs
// share it), at most `parallel` runs at once. The sessions come from a SessionSource: the
// command line's are made for the batch and end with it, a server's are kept for its next call.
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "ferry/run_observer.hpp"
#include "ferry/runner.hpp"
#include "ferry/transport.hpp"

namespace ferry {

struct PlannedRun {
  const Job* job = nullptr;
  nlohmann::json params;
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
