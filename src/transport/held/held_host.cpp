#include "transport/held/held_host.hpp"

#include <algorithm>

namespace ferry::held {

namespace {

// How often hosts whose work waits for other hosts' requests look again.
constexpr auto k_others_look = std::chrono::milliseconds(50);

} // namespace

HeldHost::~HeldHost()
{
  if (session) {
    session->on_ahead_taken({});
  }
}

void HeldHost::end()
{
  ending = true;
  const std::lock_guard lock(mutex);
  for (auto& [run, stop] : m_launches) {
    stop.request_stop();
  }
}

void HeldHost::launching(std::uint64_t run, const StopToken& stop)
{
  const std::lock_guard lock(mutex);
  m_launches[run] = stop;
  if (ending) {
    stop.request_stop();
  }
}

void HeldHost::launched(std::uint64_t run)
{
  const std::lock_guard lock(mutex);
  m_launches.erase(run);
}

PreparePool::PreparePool(int threads)
{
  for (int i = 0; i < threads; ++i) {
    m_threads.emplace_back([this] { work(); });
  }
}

void PreparePool::want(const std::shared_ptr<HeldHost>& host, Wish wish)
{
  {
    const std::lock_guard lock(m_mutex);
    if (m_stopping) {
      return;
    }
    switch (wish) {
    case Wish::start:
      host->start_wanted = true;
      break;
    case Wish::standby:
      host->standby_wanted = true;
      break;
    case Wish::idle:
      host->idle_wanted = true;
      break;
    }
    if (wish != Wish::standby && !host->waits_since) {
      host->waits_since = Clock::now();
    }
    if (host->queued || host->working) {
      return; // the thread preparing it queues it again for this wish when it is done
    }
    host->queued = true;
    m_queue.push_back(host);
  }
  m_wake.notify_one();
}

void PreparePool::retire(std::shared_ptr<HeldHost> host)
{
  {
    const std::lock_guard lock(m_mutex);
    if (m_stopping) {
      return; // dropped here, by the caller
    }
    m_queue.push_back(std::move(host));
  }
  m_wake.notify_one();
}

void PreparePool::stop()
{
  std::deque<std::shared_ptr<HeldHost>> dropped;
  {
    const std::lock_guard lock(m_mutex);
    m_stopping = true;
    dropped.swap(m_queue);
  }
  m_wake.notify_all();
  for (auto& thread : m_threads) {
    if (thread.joinable()) {
      thread.join();
    }
  }
}

bool PreparePool::waits_for_others(const HeldHost& host, Clock::time_point now) const
{
  if (host.standby_wanted || host.ending || !host.waits_since ||
      now - *host.waits_since >= k_others_first_at_most) {
    return false;
  }
  return m_requests.load() > host.requests.load(); // another host's request is under way
}

std::shared_ptr<HeldHost> PreparePool::next_ready()
{
  const auto now = Clock::now();
  const auto it = std::find_if(m_queue.begin(), m_queue.end(),
                               [&](const auto& host) { return !waits_for_others(*host, now); });
  if (it == m_queue.end()) {
    return nullptr;
  }
  std::shared_ptr<HeldHost> host = std::move(*it);
  m_queue.erase(it);
  return host;
}

// One host at a time, by one thread at a time (two preparing one session would open two
// standbys): a sh standby first as it starts (for a run that comes meanwhile), then
// the python one; after a run, the next run's channel; when idle, the idle work. A host queued
// again meanwhile comes back at the queue's end, so no host waits for another's every wish.
void PreparePool::work()
{
  std::unique_lock lock(m_mutex);
  while (true) {
    m_wake.wait(lock, [this] { return m_stopping || !m_queue.empty(); });
    if (m_stopping) {
      return;
    }
    std::shared_ptr<HeldHost> host = next_ready();
    if (!host) {
      m_wake.wait_for(lock, k_others_look); // every queued host waits for others' requests
      continue;
    }
    host->waits_since.reset();
    const bool start = std::exchange(host->start_wanted, false);
    const bool idle = std::exchange(host->idle_wanted, false);
    const bool standby = std::exchange(host->standby_wanted, false);
    const bool prepare = std::exchange(host->queued, false) && (start || idle || standby);
    host->working = prepare;
    lock.unlock();
    if (prepare && !host->ending && host->session) {
      SshConnection& session = *host->session;
      if (idle) {
        session.prepare_idle();
      } else if (start) {
        session.prepare_ahead();
        session.prepare_interpreter();
      }
      session.prepare_ahead(); // nothing to do when a standby is there
    }
    lock.lock();
    if (std::exchange(host->working, false) && !host->queued &&
        (host->start_wanted || host->idle_wanted || host->standby_wanted)) {
      host->queued = true; // wished for while it was prepared
      m_queue.push_back(host);
      m_wake.notify_one();
    }
    lock.unlock();
    host.reset(); // a retired host's session is torn down here
    lock.lock();
  }
}

} // namespace ferry::held
