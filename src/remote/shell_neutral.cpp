#include "ferry/remote/shell_neutral.hpp"

namespace ferry {

bool is_shell_neutral_token(std::string_view token)
{
  if (token.empty()) {
    return false;
  }
  for (const char c : token) {
    const bool ok = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
                    c == '/' || c == '.' || c == '_' || c == '-';
    if (!ok) {
      return false;
    }
  }
  return true;
}

bool is_shell_neutral_command(std::string_view command)
{
  std::size_t start = 0;
  while (true) {
    const std::size_t space = command.find(' ', start);
    if (!is_shell_neutral_token(command.substr(start, space - start))) {
      return false;
    }
    if (space == std::string_view::npos) {
      return true;
    }
    start = space + 1;
  }
}

Expected<std::string> shell_neutral_command(const std::vector<std::string>& argv)
{
  if (argv.empty()) {
    return fail(ErrorKind::failed, "internal: empty command");
  }
  std::string command;
  for (const auto& token : argv) {
    if (!is_shell_neutral_token(token)) {
      return fail(ErrorKind::failed,
                  "the remote command token '{}' has characters outside [A-Za-z0-9/._-], so a "
                  "login shell could reinterpret it; if it is the run directory, set remote_base "
                  "to a plain path",
                  token);
    }
    command += (command.empty() ? "" : " ") + token;
  }
  return command;
}

} // namespace ferry
