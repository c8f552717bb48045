#include "ferry/run_env.hpp"

#include <algorithm>
#include <cstdlib>

#include "ferry/text.hpp"

namespace ferry {

bool is_env_name(std::string_view name)
{
  const auto word = [](char c) {
    return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || c == '_' || (c >= '0' && c <= '9');
  };
  return !name.empty() && !(name.front() >= '0' && name.front() <= '9') &&
         std::all_of(name.begin(), name.end(), word) && name.substr(0, 6) != "FERRY_";
}

Expected<void> check_env_var(std::string_view name, std::string_view value, std::string_view where)
{
  if (name.substr(0, 6) == "FERRY_") {
    return fail(ErrorKind::usage,
                "{}: {} is ferry's own variable (FERRY_* are set by ferry for every run); choose "
                "another name",
                where, terminal_safe(name));
  }
  if (!is_env_name(name)) {
    return fail(ErrorKind::usage,
                "{}: '{}' is not a usable environment variable name; use letters, digits and _ "
                "([A-Za-z_][A-Za-z0-9_]*)",
                where, terminal_safe(name));
  }
  if (value.find('\0') != std::string_view::npos) {
    return fail(ErrorKind::usage,
                "{}: the value of {} holds a NUL byte, which no environment can carry", where,
                name);
  }
  return {};
}

Expected<void> add_env_assignment(EnvVars& env, std::string_view assignment,
                                  const std::function<const char*(const char*)>& lookup)
{
  const auto equals = assignment.find('=');
  const std::string name(assignment.substr(0, equals));
  std::string value;
  if (equals != std::string_view::npos) {
    value = std::string(assignment.substr(equals + 1));
  } else {
    FERRY_TRY(check_env_var(name, "", "--env"));
    const char* own = lookup(name.c_str());
    if (own == nullptr) {
      return fail(ErrorKind::usage,
                  "--env {}: {} is not set in ferry's environment; export it, or give a value "
                  "with --env {}=VALUE",
                  name, name, name);
    }
    value = own;
  }
  FERRY_TRY(check_env_var(name, value, "--env"));
  env[name] = std::move(value);
  return {};
}

Expected<EnvVars> env_from_options(const std::vector<std::string>& assignments)
{
  EnvVars env;
  for (const auto& assignment : assignments) {
    FERRY_TRY(
        add_env_assignment(env, assignment, [](const char* name) { return std::getenv(name); }));
  }
  return env;
}

} // namespace ferry
