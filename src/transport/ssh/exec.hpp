#pragma once
#include <functional>
#include <string_view>

#include "ferry/expected.hpp"
#include "ferry/transport.hpp"
#include "transport/ssh/handles.hpp"
#include "transport/ssh/watchdog.hpp"

namespace ferry::ssh {

// Runs the request's shell-neutral command on a new channel of `session`, reading stdout and
// stderr together (neither blocks the other) until both close, and stops the job by the shared
// StopSchedule when ferry is interrupted or its backstop deadline passes.
// When the server refuses the channel, `free_a_channel` may close one of the session's other
// channels (returning true), and the open is tried once more.
[[nodiscard]] Expected<ExecOutcome> exec(ssh_session session, std::string_view label,
                                         const ExecRequest& request, CallWatchdog& watchdog,
                                         const std::function<bool()>& free_a_channel);

} // namespace ferry::ssh
