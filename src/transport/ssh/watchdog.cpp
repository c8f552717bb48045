#include "transport/ssh/watchdog.hpp"

#include <sys/socket.h>

#include <fmt/format.h>

namespace ferry::ssh {

namespace {
// How often a stop request is looked at while a call is armed.
constexpr std::chrono::milliseconds k_poll{100};

double seconds(CallWatchdog::Clock::duration d)
{
  return std::chrono::duration<double>(d).count();
}
} // namespace

CallWatchdog::CallWatchdog(ssh_session session, Limits limits)
    : m_session(session), m_limits(limits)
{
}

CallWatchdog::~CallWatchdog()
{
  {
    std::lock_guard lock(m_mutex);
    m_quit = true;
  }
  m_changed.notify_all();
  if (m_thread.joinable()) {
    m_thread.join();
  }
}

CallWatchdog::Armed CallWatchdog::arm(std::string what, const StopToken* stop,
                                      std::optional<Clock::duration> limit)
{
  {
    std::lock_guard lock(m_mutex);
    m_armed = true;
    m_what = std::move(what);
    m_stop = stop;
    m_limit = limit.value_or(m_limits.call);
    m_deadline = Clock::now() + m_limit;
    if (!m_thread.joinable()) {
      m_thread = std::thread([this] { watch(); });
    }
  }
  m_changed.notify_all();
  return Armed(*this);
}

void CallWatchdog::disarm()
{
  std::lock_guard lock(m_mutex);
  m_armed = false;
  m_stop = nullptr;
}

std::optional<std::string> CallWatchdog::fired() const
{
  std::lock_guard lock(m_mutex);
  return m_fired;
}

void CallWatchdog::cut(std::string why)
{
  // shutdown(2), not close(2): the descriptor stays valid for the thread blocked on it, which
  // now reads EOF and fails its call.
  m_fired = std::move(why);
  const socket_t fd = ssh_get_fd(m_session);
  if (fd != SSH_INVALID_SOCKET) {
    ::shutdown(fd, SHUT_RDWR);
  }
}

void CallWatchdog::watch()
{
  std::unique_lock lock(m_mutex);
  std::optional<Clock::time_point> stop_seen;
  while (!m_quit) {
    if (!m_armed) {
      stop_seen.reset();
      m_changed.wait(lock, [this] { return m_quit || m_armed; });
      continue;
    }
    const auto now = Clock::now();
    if (m_stop != nullptr && m_stop->stop_requested() && !stop_seen) {
      stop_seen = now;
    }
    if (now >= m_deadline) {
      cut(fmt::format("{} took longer than {:.0f} s (the host stopped answering)", m_what,
                      seconds(m_limit)));
      m_armed = false;
    } else if (stop_seen && now - *stop_seen >= m_limits.stop_grace) {
      cut(fmt::format("{} was cut short: ferry was asked to stop", m_what));
      m_armed = false;
    } else {
      m_changed.wait_for(lock, k_poll);
    }
  }
}

} // namespace ferry::ssh
