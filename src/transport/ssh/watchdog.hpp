#pragma once
// Bounds blocking libssh calls. libssh's SFTP calls wait for the server without a timeout of
// their own (a stalled host, or an sftp-server blocked in open(2), hangs them forever), so while a
// call is armed a thread of the watchdog waits until the call's limit passes, or a stop is
// requested and a grace period passes, and then shuts the connection's socket down under the
// call: it fails at once instead of hanging. The connection is then dead, which is what it was.
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>

#include "ferry/transport.hpp"
#include "transport/ssh/handles.hpp"

namespace ferry::ssh {

class CallWatchdog {
public:
  using Clock = std::chrono::steady_clock;

  struct Limits {
    Clock::duration call = std::chrono::seconds(20);      // one blocking call, from its start
    Clock::duration stop_grace = std::chrono::seconds(2); // after a stop request
  };

  class [[nodiscard]] Armed {
  public:
    Armed() = default; // bounds nothing: for a step its caller already bounds
    explicit Armed(CallWatchdog& watchdog) : m_watchdog(&watchdog) {}
    Armed(Armed&& other) noexcept : m_watchdog(std::exchange(other.m_watchdog, nullptr)) {}
    Armed(const Armed&) = delete;
    Armed& operator=(const Armed&) = delete;
    Armed& operator=(Armed&&) = delete;
    ~Armed()
    {
      if (m_watchdog != nullptr) {
        m_watchdog->disarm();
      }
    }

  private:
    CallWatchdog* m_watchdog = nullptr;
  };

  CallWatchdog(ssh_session session, Limits limits);
  CallWatchdog(const CallWatchdog&) = delete;
  CallWatchdog& operator=(const CallWatchdog&) = delete;
  ~CallWatchdog();

  // Until the returned guard ends, `what` (e.g. "write /x/job.py") is bounded by `limit` (the
  // call limit when not given) and by `stop` (unless `stop` is null: cleanup runs even then).
  [[nodiscard]] Armed arm(std::string what, const StopToken* stop,
                          std::optional<Clock::duration> limit = std::nullopt);

  // Why the watchdog cut the connection, when it did ("write /x/job.py took longer than 20 s").
  [[nodiscard]] std::optional<std::string> fired() const;
  [[nodiscard]] const Limits& limits() const { return m_limits; }

private:
  void disarm();
  void watch();
  void cut(std::string why);

  ssh_session m_session;
  Limits m_limits;
  mutable std::mutex m_mutex;
  std::condition_variable m_changed;
  std::thread m_thread;
  bool m_quit = false;
  bool m_armed = false;
  std::string m_what;
  const StopToken* m_stop = nullptr;
  Clock::time_point m_deadline;
  Clock::duration m_limit{};
  std::optional<std::string> m_fired;
};

} // namespace ferry::ssh
