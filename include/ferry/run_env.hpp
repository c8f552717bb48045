#pragma once
// The environment a job runs with (docs/job-file.md, "Environment"): the variables the job file,
// the user's config file and `--env` declare, ferry's FERRY_* variables, and a fixed few taken
// from the host's login environment. Nothing else is inherited, so a job sees the same set on
// every target.
#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "ferry/expected.hpp"

namespace ferry {

// Name -> value, in name order.
using EnvVars = std::map<std::string, std::string>;

// What the user's config file says for one host (docs/config.md).
struct HostSettings {
  std::map<std::string, std::string> interpreters; // job's interpreter -> the one to run
  EnvVars env;
};

// The variables taken from the host's environment when it has them (and every LC_*).
inline constexpr std::string_view k_inherited_env[] = {"PATH", "HOME", "USER", "LANG", "TERM"};

// `[A-Za-z_][A-Za-z0-9_]*`, and not FERRY_* (ferry's own).
[[nodiscard]] bool is_env_name(std::string_view name);

// A declared variable, checked: a usable name and a value without a NUL byte. `where` says
// where it was declared ("--env", "job.py:4").
[[nodiscard]] Expected<void> check_env_var(std::string_view name, std::string_view value,
                                           std::string_view where);

// `--env KEY=VALUE`, or `--env KEY`: ferry's own value of KEY, from `lookup` (getenv).
[[nodiscard]] Expected<void>
add_env_assignment(EnvVars& env, std::string_view assignment,
                   const std::function<const char*(const char*)>& lookup);

// A command line's `--env` options (`run`, `replay`), each checked; `--env KEY` takes ferry's own
// value (getenv).
[[nodiscard]] Expected<EnvVars> env_from_options(const std::vector<std::string>& assignments);

} // namespace ferry
