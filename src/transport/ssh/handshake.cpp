#include "transport/ssh/handshake.hpp"

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <random>
#include <thread>

#include <fmt/format.h>

namespace ferry::ssh {

namespace {

using Clock = std::chrono::steady_clock;

// The handshakes under way in this process, and their slots.
class Handshakes {
public:
  // Waits for a slot (false: a stop came first); says once that it waits.
  bool take(const ConnectPlan& plan)
  {
    std::unique_lock lock(m_mutex);
    if (m_in_flight >= k_handshakes_at_once && plan.tell) {
      plan.tell(fmt::format("pacing: waits, {} handshakes in flight", m_in_flight));
    }
    // A stop is seen within 50 ms: it does not notify this condition.
    while (m_in_flight >= k_handshakes_at_once) {
      if (plan.stop.stop_requested()) {
        return false;
      }
      m_freed.wait_for(lock, std::chrono::milliseconds(50));
    }
    ++m_in_flight;
    return true;
  }
  void give_back()
  {
    {
      const std::lock_guard lock(m_mutex);
      --m_in_flight;
    }
    m_freed.notify_one();
  }

private:
  std::mutex m_mutex;
  std::condition_variable m_freed;
  int m_in_flight = 0;
};

Handshakes& handshakes()
{
  static Handshakes all;
  return all;
}

bool is_transient(std::string_view message)
{
  for (std::string_view needle : {"refused", "timed out", "Timeout", "resolve", "unreachable",
                                  "Name or service", "Temporary failure"}) {
    if (message.find(needle) != std::string_view::npos) {
      return true;
    }
  }
  return false;
}

// Sleeps `wait` unless a stop comes first (false then).
bool wait_unless_stopped(std::chrono::milliseconds wait, const StopToken& stop)
{
  const auto until = Clock::now() + wait;
  while (Clock::now() < until) {
    if (stop.stop_requested()) {
      return false;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return !stop.stop_requested();
}

Expected<void> attempt_in_slot(const ConnectPlan& plan,
                               const std::function<Expected<void>()>& attempt)
{
  if (!handshakes().take(plan)) {
    return fail(ErrorKind::failed, "{}: interrupted while waiting to connect", plan.label);
  }
  auto connected = attempt();
  handshakes().give_back();
  return connected;
}

} // namespace

Expected<void> connect_paced(const ConnectPlan& plan,
                             const std::function<Expected<void>()>& attempt,
                             const std::function<bool()>& may_retry)
{
  std::mt19937 jitter(std::random_device{}());
  int retried = 0;
  int drops = 0;
  for (;;) {
    auto connected = attempt_in_slot(plan, attempt);
    if (connected || plan.stop.stop_requested() || !may_retry() ||
        connected.error().kind != ErrorKind::unreachable) {
      return connected;
    }
    const Error& error = connected.error();
    std::chrono::milliseconds wait{};
    if (error.unreached == Unreached::refused) {
      // Many clients dropped at once must not come back in lockstep: 150-450 ms, doubling.
      if (drops == k_max_drops) {
        Error last = std::move(connected).error();
        last.message += fmt::format(" ({} times in a row)", drops + 1);
        return Unexpected{std::move(last)};
      }
      wait = std::chrono::milliseconds(std::uniform_int_distribution<int>(150, 450)(jitter)
                                       << std::min(drops++, 2));
      if (plan.tell) {
        plan.tell(fmt::format("the server dropped the connection {} (sshd MaxStartups?); again "
                              "in {:.1f} s",
                              error.message.find("before its banner") != std::string::npos
                                  ? "before its banner"
                                  : "during key exchange",
                              static_cast<double>(wait.count()) / 1000));
      }
    } else if (retried < plan.retries && is_transient(error.message)) {
      // 200-600 ms, doubling.
      wait = std::chrono::milliseconds(std::uniform_int_distribution<int>(200, 600)(jitter)
                                       << std::min(retried++, 3));
    } else {
      return connected;
    }
    if (!wait_unless_stopped(wait, plan.stop)) {
      return connected;
    }
  }
}

} // namespace ferry::ssh
