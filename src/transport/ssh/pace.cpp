#include "transport/ssh/pace.hpp"

#include <poll.h>

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

} // namespace ferry::ssh
