#pragma once
// Sessions a long-lived process (`ferry mcp`) keeps: for each target, direct sessions kept
// connected after a batch and lent to the next one for a while (the handshake is paid once), as
// many as batches run there at once.
#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "ferry/fleet.hpp"
#include "run/targets.hpp"

namespace ferry {

struct PoolTarget {
  std::string label; // the name a batch picks it by ("gpu1", "local")
  SessionMaker make;
};

class SessionPool {
public:
  SessionPool(std::vector<PoolTarget> targets, std::chrono::steady_clock::duration idle_limit);
  SessionPool(const SessionPool&) = delete;
  SessionPool& operator=(const SessionPool&) = delete;

  [[nodiscard]] const std::vector<std::string>& labels() const { return m_labels; }

  // A connected idle session for `label` (unless `fresh`), else a new, unconnected one.
  [[nodiscard]] Lease borrow(const std::string& label, bool fresh);
  // Keeps a healthy, connected session for the next batch; anything else is dropped
  // (disconnected).
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
  std::map<std::string, SessionMaker> m_makers;
  std::chrono::steady_clock::duration m_idle_limit;
  std::mutex m_lock;
  std::map<std::string, std::vector<Idle>> m_idle;
};

// A batch's targets (labels the pool knows), their sessions borrowed from the pool.
class PooledSessions final : public SessionSource {
public:
  PooledSessions(SessionPool& pool, std::vector<std::string> labels)
      : m_pool(pool), m_labels(std::move(labels))
  {
  }
  [[nodiscard]] std::size_t targets() const override { return m_labels.size(); }
  [[nodiscard]] Lease borrow(std::size_t i, bool fresh) override
  {
    return m_pool.borrow(m_labels.at(i), fresh);
  }
  void give_back(std::size_t i, Lease lease, bool healthy) override
  {
    m_pool.give_back(m_labels.at(i), std::move(lease), healthy);
  }
  [[nodiscard]] std::string label(std::size_t i, const HostSession& /*session*/) const override
  {
    return m_labels.at(i);
  }
  [[nodiscard]] bool keeps_sessions() const override { return true; }

private:
  SessionPool& m_pool;
  std::vector<std::string> m_labels;
};

} // namespace ferry
