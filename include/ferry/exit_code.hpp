#pragma once
// How ferry ends (docs/exit-codes.md). Only this header holds exit numbers: commands return an
// ExitCode or an Error, and one generic caller turns either into the process's status.
#include "ferry/expected.hpp"

namespace ferry {

enum class ExitCode : int {
  ok = 0,
  run_failed = 1,     // a run failed, timed out or gave a bad result; or an operation failed
  usage = 2,          // usage or validation error; nothing was contacted
  unreachable = 3,    // unreachable host, unknown/changed key, failed authentication
  replay_differs = 4, // `replay` ran but the result differs
  interrupted = 130,  // SIGINT/SIGTERM
};

[[nodiscard]] constexpr int to_int(ExitCode code)
{
  return static_cast<int>(code);
}

// The exit code an error of this kind ends ferry with.
[[nodiscard]] constexpr ExitCode exit_code_for(ErrorKind kind)
{
  switch (kind) {
  case ErrorKind::usage:
    return ExitCode::usage;
  case ErrorKind::unreachable:
    return ExitCode::unreachable;
  case ErrorKind::failed:
    return ExitCode::run_failed;
  }
  return ExitCode::run_failed;
}

} // namespace ferry
