#include "transport/held/held_host.hpp"

#include <algorithm>

namespace ferry::held {

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
    m_queue.push_front(std::move(host)); // its teardown waits for no other host's preparing
  }
  m_wake.notify_all(); // a thread that waits for a held-back host's time lets an ending one go
}

void PreparePool::first_run_began()
{
  const std::lock_guard lock(m_mutex);
  ++m_first_runs;
}

void PreparePool::first_run_ended()
{
  {
    const std::lock_guard lock(m_mutex);
    if (--m_first_runs > 0 || m_held_back.empty()) {
      return;
    }
  }
  m_wake.notify_all();
}

std::shared_ptr<HeldHost> PreparePool::next_host(std::optional<Clock::time_point>& next_look)
{
  const auto now = Clock::now();
  const auto waited_enough = [now](const HeldHost& host) {
    return now - *host.start_held_since >= k_start_waits_at_most;
  };
  // Held-back start work goes once no first run is under way, after its longest wait, or for a
  // host that is ending (its teardown is not held up).
  for (auto it = m_held_back.begin(); it != m_held_back.end();) {
    if (m_first_runs == 0 || waited_enough(**it) || (*it)->ending) {
      m_queue.push_back(std::move(*it));
      it = m_held_back.erase(it);
    } else {
      ++it;
    }
  }
  while (!m_queue.empty()) {
    std::shared_ptr<HeldHost> host = std::move(m_queue.front());
    m_queue.pop_front();
    if (host->start_wanted && m_first_runs > 0 && !host->ending) {
      if (!host->start_held_since) {
        host->start_held_since = now;
      }
      if (!waited_enough(*host)) {
        m_held_back.push_back(std::move(host)); // still queued: later wishes join it
        continue;
      }
    }
    host->start_held_since.reset();
    return host;
  }
  next_look.reset();
  for (const auto& host : m_held_back) {
    const auto at = *host->start_held_since + k_start_waits_at_most;
    next_look = next_look ? std::min(*next_look, at) : at;
  }
  return nullptr;
}

void PreparePool::stop()
{
  std::deque<std::shared_ptr<HeldHost>> dropped;
  std::deque<std::shared_ptr<HeldHost>> held_back;
  {
    const std::lock_guard lock(m_mutex);
    m_stopping = true;
    dropped.swap(m_queue);
    held_back.swap(m_held_back);
  }
  m_wake.notify_all();
  for (auto& thread : m_threads) {
    if (thread.joinable()) {
      thread.join();
    }
  }
}

// One host at a time, by one thread at a time (two preparing one session would open two
// standbys): a sh standby first as it starts (for a run that comes meanwhile), then
// the python one; after a run, the next run's channel; when idle, the idle work. A host queued
// again meanwhile comes back at the queue's end, so no host waits for another's every wish.
void PreparePool::work()
{
  std::unique_lock lock(m_mutex);
  while (true) {
    std::optional<Clock::time_point> next_look;
    std::shared_ptr<HeldHost> host;
    while (!m_stopping && !(host = next_host(next_look))) {
      if (next_look) {
        m_wake.wait_until(lock, *next_look);
      } else {
        m_wake.wait(lock);
      }
    }
    if (m_stopping) {
      return;
    }
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
