#pragma once
// The environment and interpreter every run gets, resolved in one place for every command that
// runs jobs (`run`, `check`, `replay`, `mcp`): `--env`, `--interpreter`, and the user's config
// file's `[hosts."…"]` sections (env, interpreters), applied per host by the runner.
#include <map>
#include <string>
#include <vector>

#include "ferry/runner.hpp"
#include "ferry/user_config.hpp"

namespace ferry {

// What the command line (or `ferry mcp`'s) gives.
struct EnvironmentOptions {
  std::vector<std::string> env;          // --env KEY=VALUE | KEY
  std::vector<std::string> interpreters; // --interpreter NAME=PATH
};

// --interpreter NAME=PATH: the job's interpreter NAME runs as PATH on every host.
[[nodiscard]] Expected<std::map<std::string, std::string>>
interpreter_options(const std::vector<std::string>& assignments);

// Sets `options`' env, interpreters and host settings (the config file's, per host).
[[nodiscard]] Expected<void>
set_run_environment(RunOptions& options, const EnvironmentOptions& given, const UserConfig& config);

} // namespace ferry
