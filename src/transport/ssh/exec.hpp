#pragma once
#include <string_view>

#include "ferry/expected.hpp"
#include "ferry/transport.hpp"
#include "transport/ssh/handles.hpp"

namespace ferry::ssh {

// Runs the request's shell-neutral command on a new channel of `session`, reading stdout and
// stderr together (neither blocks the other) until both close, and stops the job by the shared
// StopSchedule when ferry is interrupted or its backstop deadline passes.
[[nodiscard]] Expected<ExecOutcome> exec(ssh_session session, std::string_view label,
                                         const ExecRequest& request);

} // namespace ferry::ssh
