#include "mcp/host_pool.hpp"

#include "ferry/util.hpp"

namespace ferry::mcp {

using Clock = std::chrono::steady_clock;

HostPool::HostPool(std::vector<TargetEntry> targets, Clock::duration idle_limit)
    : m_idle_limit(idle_limit)
{
  for (auto& target : targets) {
    m_labels.push_back(target.label);
    m_factories[target.label] = std::move(target.make);
  }
}

Lease HostPool::borrow(const std::string& label)
{
  {
    std::lock_guard guard(m_lock);
    auto& idle = m_idle[label];
    if (!idle.empty()) {
      Lease lease;
      lease.session = std::move(idle.back().session);
      lease.reused = true;
      idle.pop_back();
      return lease;
    }
  }
  Lease lease;
  lease.session = m_factories.at(label)();
  reconnect(lease);
  return lease;
}

void HostPool::reconnect(Lease& lease)
{
  const auto start = Clock::now();
  auto connected = lease.session->connect();
  lease.connect_s += seconds_since(start);
  lease.reused = false;
  if (connected) {
    lease.failed.reset();
  } else {
    lease.failed = connected.error();
  }
}

void HostPool::give_back(const std::string& label, Lease lease, bool healthy)
{
  if (!healthy || lease.failed || !lease.session) {
    return; // the session disconnects as the lease goes
  }
  std::lock_guard guard(m_lock);
  m_idle[label].push_back({std::move(lease.session), Clock::now()});
}

void HostPool::expire_idle()
{
  std::vector<std::unique_ptr<HostSession>> expired;
  {
    std::lock_guard guard(m_lock);
    const auto now = Clock::now();
    for (auto& [label, idle] : m_idle) {
      for (auto it = idle.begin(); it != idle.end();) {
        if (now - it->since < m_idle_limit) {
          ++it;
          continue;
        }
        expired.push_back(std::move(it->session));
        it = idle.erase(it);
      }
    }
  }
  // Disconnecting talks to the host: outside the lock.
}

void HostPool::clear()
{
  std::map<std::string, std::vector<Idle>> all;
  {
    std::lock_guard guard(m_lock);
    all.swap(m_idle);
  }
}

} // namespace ferry::mcp
