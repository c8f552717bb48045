#pragma once

namespace ferry {

// SPEC "Exit codes".
enum class ExitCode : int {
  ok = 0,
  run_failed = 1,     // a run failed, timed out or gave a bad result
  usage = 2,          // usage or validation error; nothing was contacted
  unreachable = 3,    // unreachable host, unknown/changed key, failed authentication
  replay_differs = 4, // `replay` ran but the result differs
  interrupted = 130,  // SIGINT/SIGTERM
};

[[nodiscard]] constexpr int to_int(ExitCode code) { return static_cast<int>(code); }

} // namespace ferry
