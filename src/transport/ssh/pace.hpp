#pragma once
// libssh's connect and authentication calls run non-blocking during connect() so that Ctrl-C
// (or a stopped batch) ends a connect at once instead of after the whole connect timeout:
// each call is repeated while it answers "again", with a short wait on the session's socket in
// between, until it is done, the deadline passes or a stop is asked for; and when a connect
// ends so, the class of its failure.
#include <chrono>
#include <functional>
#include <string>

#include "ferry/transport.hpp"
#include "transport/ssh/handles.hpp"

namespace ferry::ssh {

struct Pace {
  StopToken stop;
  double timeout_s = 10;

  [[nodiscard]] std::chrono::steady_clock::time_point deadline() const
  {
    return std::chrono::steady_clock::now() +
           std::chrono::milliseconds(static_cast<long long>(timeout_s * 1000));
  }
};

enum class Waited { done, stopped, timed_out };

struct Stepped {
  Waited waited = Waited::done;
  int rc = 0; // the call's last answer
};

// Calls `step` until it answers something other than `again` (SSH_AGAIN or SSH_AUTH_AGAIN).
[[nodiscard]] Stepped step_until_done(ssh_session session, const Pace& pace, int again,
                                      const std::function<int()>& step);

// Why opening a connection failed, for a session whose ssh_connect gave up (`timed_out`: ferry's
// connect timeout passed): the class and the words that go after "HOST: ".
struct OpenFailure {
  Unreached unreached = Unreached::unreachable;
  std::string why;
};
[[nodiscard]] OpenFailure open_failure(ssh_session session, bool timed_out, double timeout_s);

} // namespace ferry::ssh
