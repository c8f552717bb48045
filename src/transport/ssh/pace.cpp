#include "transport/ssh/pace.hpp"

#include <poll.h>

#include <fmt/format.h>

#include "ferry/text.hpp"

namespace ferry::ssh {

Stepped step_until_done(ssh_session session, const Pace& pace, int again,
                        const std::function<int()>& step)
{
  const auto deadline = pace.deadline();
  for (;;) {
    const int rc = step();
    if (rc != again) {
      return {Waited::done, rc};
    }
    // A server that hung up (MaxAuthTries, say) leaves libssh answering "again" for ever.
    if ((ssh_get_status(session) & (SSH_CLOSED | SSH_CLOSED_ERROR)) != 0) {
      return {Waited::done, SSH_ERROR};
    }
    if (pace.stop.stop_requested()) {
      return {Waited::stopped, rc};
    }
    if (std::chrono::steady_clock::now() >= deadline) {
      return {Waited::timed_out, rc};
    }
    // Wake up when the server sends something, and at least every 50 ms to look at the stop
    // flag and at a socket that is still connecting (which never turns readable).
    const socket_t fd = ssh_get_fd(session);
    if (fd >= 0) {
      pollfd p{fd, POLLIN, 0};
      ::poll(&p, 1, 50);
    } else {
      ::poll(nullptr, 0, 50);
    }
  }
}

OpenFailure open_failure(ssh_session session, bool timed_out, double timeout_s)
{
  if (timed_out) {
    return {Unreached::timeout, fmt::format("timed out after {} s", timeout_s)};
  }
  const std::string said = terminal_safe(ssh_get_error(session));
  // The socket was connected (a refused connect reads "Connection refused"), and the server
  // closed it: sshd does so past MaxStartups, after an "Exceeded MaxStartups" line (9.x) or
  // without a word.
  const bool closed = said.find("disconnected") != std::string::npos ||
                      said.find("reset by peer") != std::string::npos ||
                      said.find("MaxStartups") != std::string::npos;
  if (closed) {
    const char* banner_line = ssh_get_serverbanner(session);
    const bool banner = banner_line != nullptr && std::string_view(banner_line).starts_with("SSH-");
    return {Unreached::refused,
            fmt::format("the server dropped the connection {} (sshd MaxStartups?): {}",
                        banner ? "during key exchange" : "before its banner", said)};
  }
  return {Unreached::unreachable, said};
}

} // namespace ferry::ssh
