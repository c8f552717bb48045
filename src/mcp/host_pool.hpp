#pragma once
// The server's connections: for each target, sessions kept connected after a call and reused by
// the next one for a while (the handshake is paid once), as many as calls run there at once.
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "ferry/transport.hpp"

namespace ferry::mcp {

using SessionFactory = std::function<std::unique_ptr<HostSession>()>;

struct TargetEntry {
  std::string label; // the name clients pick it by ("gpu1", "local")
  SessionFactory make;
};

// A session lent to one call; the pool takes it back with give_back().
struct Lease {
  std::unique_ptr<HostSession> session;
  bool reused = false;         // it was connected by an earlier call
  double connect_s = 0;        // time spent connecting for this call
  std::optional<Error> failed; // connecting failed (the session is then unusable)
};

class HostPool {
public:
  HostPool(std::vector<TargetEntry> targets, std::chrono::steady_clock::duration idle_limit);
  HostPool(const HostPool&) = delete;
  HostPool& operator=(const HostPool&) = delete;

  [[nodiscard]] const std::vector<std::string>& labels() const { return m_labels; }

  // A connected session for `label`: an idle one, else a new one (connected here, so the call
  // waits for it, not the server).
  [[nodiscard]] Lease borrow(const std::string& label);
  // Connects the lease's session again (it died while idle).
  void reconnect(Lease& lease);
  // Keeps a healthy session for the next call; `healthy` false drops (disconnects) it.
  void give_back(const std::string& label, Lease lease, bool healthy);
  // Disconnects sessions idle for longer than the limit.
  void expire_idle();
  // Disconnects every idle session.
  void clear();

private:
  struct Idle {
    std::unique_ptr<HostSession> session;
    std::chrono::steady_clock::time_point since;
  };

  std::vector<std::string> m_labels;
  std::map<std::string, SessionFactory> m_factories;
  std::chrono::steady_clock::duration m_idle_limit;
  std::mutex m_lock;
  std::map<std::string, std::vector<Idle>> m_idle;
};

} // namespace ferry::mcp
