#include "run/session_pool.hpp"

namespace ferry {

using Clock = std::chrono::steady_clock;

SessionPool::SessionPool(std::vector<PoolTarget> targets, Clock::duration idle_limit)
    : m_idle_limit(idle_limit)
{
  for (auto& target : targets) {
    m_labels.push_back(target.label);
    m_makers[target.label] = std::move(target.make);
  }
}

Lease SessionPool::borrow(const std::string& label, bool fresh)
{
  if (!fresh) {
    std::lock_guard guard(m_lock);
    auto& idle = m_idle[label];
    if (!idle.empty()) {
      Lease lease{std::move(idle.back().session), true};
      idle.pop_back();
      return lease;
    }
  }
  return {m_makers.at(label)(), false};
}

void SessionPool::give_back(const std::string& label, Lease lease, bool healthy)
{
  if (!healthy || !lease.connected || !lease.session || m_idle_limit <= Clock::duration::zero()) {
    return; // the session disconnects as the lease goes
  }
  std::lock_guard guard(m_lock);
  m_idle[label].push_back({std::move(lease.session), Clock::now()});
}

void SessionPool::expire_idle()
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
  // Disconnecting talks to the host: outside the lock, as `expired` goes.
}

void SessionPool::clear()
{
  std::map<std::string, std::vector<Idle>> all;
  {
    std::lock_guard guard(m_lock);
    all.swap(m_idle);
  }
}

} // namespace ferry
