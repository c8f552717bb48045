#pragma once
// The exec channels of an SSH session: open one (making room when the server refuses it), start
// a command of shell-neutral tokens on it, and follow it to its end, reading stdout and stderr
// together (neither blocks the other) and stopping the job by the shared StopSchedule when ferry
// is interrupted or its backstop deadline passes.
// libssh sessions are not thread-safe, and several runs may share one: every libssh call here is
// made holding `lock`, which is released while the exec waits for data, so the session's other
// channels (and its SFTP calls) go on meanwhile.
#include <chrono>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>

#include <libssh/callbacks.h>

#include "ferry/expected.hpp"
#include "transport/exec_request.hpp"
#include "transport/ssh/handles.hpp"
#include "transport/ssh/watchdog.hpp"

namespace ferry::ssh {

// Filled from libssh's callbacks: the launcher's exit is known without blocking, so a job that
// exited while a stray process holds its output open does not keep ferry waiting.
struct ExitWatch {
  bool exited = false;
  std::optional<int> status;
  std::chrono::steady_clock::time_point at;
};
void on_exit_status(ssh_session, ssh_channel, int status, void* userdata);
void on_exit_signal(ssh_session, ssh_channel, const char*, int, const char*, const char*,
                    void* userdata);

// One exec channel with its exit callbacks, for the length of one run.
class ExecChannel {
public:
  ExecChannel(ssh_session session, ExitWatch& watch) : m_channel(ssh_channel_new(session))
  {
    m_callbacks.userdata = &watch;
    m_callbacks.channel_exit_status_function = on_exit_status;
    m_callbacks.channel_exit_signal_function = on_exit_signal;
    ssh_callbacks_init(&m_callbacks);
  }
  ExecChannel(const ExecChannel&) = delete;
  ExecChannel& operator=(const ExecChannel&) = delete;
  ~ExecChannel()
  {
    if (m_channel) {
      ssh_remove_channel_callbacks(m_channel.get(), &m_callbacks);
    }
  }

  [[nodiscard]] bool open() { return open_step() == SSH_OK; }
  // One step of the open: SSH_AGAIN while a non-blocking open waits for the server.
  [[nodiscard]] int open_step()
  {
    if (!m_channel) {
      return SSH_ERROR;
    }
    const int rc = ssh_channel_open_session(m_channel.get());
    if (rc == SSH_OK) {
      ssh_set_channel_callbacks(m_channel.get(), &m_callbacks);
    }
    return rc;
  }
  [[nodiscard]] ssh_channel get() const { return m_channel.get(); }

private:
  Channel m_channel;
  ssh_channel_callbacks_struct m_callbacks{};
};

// When the server refuses a channel, `free_a_channel` may free one of the session's other
// channels (returning true; it may wait, releasing the lock it is given), and the open is tried
// again.
using FreeAChannel = std::function<bool(std::unique_lock<std::mutex>&)>;

// Opens a channel by `try_open` (a new channel each call) and requests `exec_command` on it
// (`channel()`), bounded by the watchdog; an error says which step failed.
[[nodiscard]] Expected<void>
start_channel(ssh_session session, std::string_view label, const std::function<bool()>& try_open,
              const std::function<ssh_channel()>& channel, const std::string& exec_command,
              const ExecRequest& request, CallWatchdog& watchdog,
              std::unique_lock<std::mutex>& lock, const FreeAChannel& free_a_channel);

// The run's channel from its start on: reads it to its end, then takes the exit status. With
// `stayed` (a channel that may serve a later run), the run may end before the channel does: then
// *stayed is set, the code is the report's and the channel stays open for the next run.
[[nodiscard]] ExecOutcome follow(ssh_session session, ssh_channel channel, ExitWatch& watch,
                                 const ExecRequest& request, CallWatchdog& watchdog,
                                 std::unique_lock<std::mutex>& lock, bool* stayed = nullptr);

// `command` (shell-neutral tokens) on a new channel of its own, followed to its end; called
// holding `lock`.
[[nodiscard]] Expected<ExecOutcome>
exec_on_new_channel(ssh_session session, std::string_view label, const std::string& command,
                    const ExecRequest& request, CallWatchdog& watchdog,
                    std::unique_lock<std::mutex>& lock, const FreeAChannel& free_a_channel);

// The request's command on a new channel of its own, followed to its end.
[[nodiscard]] Expected<ExecOutcome> exec(ssh_session session, std::string_view label,
                                         const ExecRequest& request, CallWatchdog& watchdog,
                                         std::mutex& lock, const FreeAChannel& free_a_channel);

} // namespace ferry::ssh
