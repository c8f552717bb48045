#include "transport/held/held_host.hpp"

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
    std::shared_ptr<HeldHost> host = std::move(m_queue.front());
    m_queue.pop_front();
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
