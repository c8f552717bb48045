#include "run/environment.hpp"

#include <memory>

#include "ferry/remote/shell_neutral.hpp"
#include "ferry/run_env.hpp"
#include "ferry/text.hpp"

namespace ferry {

Expected<std::map<std::string, std::string>>
interpreter_options(const std::vector<std::string>& assignments)
{
  std::map<std::string, std::string> interpreters;
  for (const auto& assignment : assignments) {
    const auto equals = assignment.find('=');
    const std::string name = assignment.substr(0, equals);
    const std::string path = equals == std::string::npos ? "" : assignment.substr(equals + 1);
    if (name.empty() || !is_shell_neutral_token(name) || !is_shell_neutral_token(path)) {
      return fail(ErrorKind::usage,
                  "--interpreter '{}': give NAME=PATH, both made only of [A-Za-z0-9/._-] (e.g. "
                  "--interpreter python3=/opt/venv/bin/python)",
                  terminal_safe(assignment));
    }
    interpreters[name] = path;
  }
  return interpreters;
}

Expected<void> set_run_environment(RunOptions& options, const EnvironmentOptions& given,
                                   const UserConfig& config)
{
  FERRY_TRY_ASSIGN(options.env, env_from_options(given.env));
  FERRY_TRY_ASSIGN(options.interpreters, interpreter_options(given.interpreters));
  // A copy: the options may outlive whoever read the file (a server's calls).
  options.host_settings = [config = std::make_shared<const UserConfig>(config)](
                              std::string_view host) { return config->for_host(host).settings; };
  return {};
}

} // namespace ferry
