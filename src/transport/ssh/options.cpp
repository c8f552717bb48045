#include "transport/ssh/options.hpp"

#include <cmath>
#include <filesystem>

#include "ferry/host_spec.hpp"
#include "ferry/util.hpp"

namespace ferry::ssh {

namespace {

std::string get_string_option(ssh_session session, ssh_options_e option, std::string fallback)
{
  char* value = nullptr;
  if (ssh_options_get(session, option, &value) == SSH_OK) {
    fallback = value;
    ssh_string_free_char(value);
  }
  return fallback;
}

Expected<void> check_exists(const std::string& file, std::string_view what, std::string_view flag)
{
  std::error_code ec;
  if (!std::filesystem::exists(file, ec)) {
    return fail(ErrorKind::usage, "{} {} does not exist ({})", what, file, flag);
  }
  return {};
}

Expected<void> parse_config(ssh_session session, const SshTarget& target)
{
  const std::string config =
      target.ssh_config.empty() ? std::string() : expand_home(target.ssh_config);
  if (!config.empty()) {
    FERRY_TRY(check_exists(config, "ssh config", "--ssh-config"));
  }
  // ferry's default wait, before the config so that its ConnectTimeout wins over it.
  const long default_timeout_s = 10;
  ssh_options_set(session, SSH_OPTIONS_TIMEOUT, &default_timeout_s);
  if (ssh_options_parse_config(session, config.empty() ? nullptr : config.c_str()) != SSH_OK) {
    return fail(ErrorKind::usage, "{}: cannot parse the ssh config {}: {}", target.spec,
                config.empty() ? "~/.ssh/config" : config, ssh_get_error(session));
  }
  return {};
}

// What the command line says wins over the config.
Expected<void> apply_command_line(ssh_session session, const SshTarget& target,
                                  const HostSpec& spec)
{
  if (!spec.user.empty()) {
    ssh_options_set(session, SSH_OPTIONS_USER, spec.user.c_str());
  }
  if (spec.port != 0) { // after the config: libssh's config parser would override it
    ssh_options_set(session, SSH_OPTIONS_PORT, &spec.port);
  }
  const int nodelay = 1;
  ssh_options_set(session, SSH_OPTIONS_NODELAY, &nodelay);
  if (target.connect_timeout_s > 0) {
    const long timeout_s = std::max(1L, static_cast<long>(std::ceil(target.connect_timeout_s)));
    ssh_options_set(session, SSH_OPTIONS_TIMEOUT, &timeout_s);
  }
  if (!target.known_hosts.empty()) {
    const std::string file = expand_home(target.known_hosts);
    ssh_options_set(session, SSH_OPTIONS_KNOWNHOSTS, file.c_str());
    // An explicit file is the only one consulted: no system-wide list behind the user's back.
    ssh_options_set(session, SSH_OPTIONS_GLOBAL_KNOWNHOSTS, "/dev/null");
  }
  if (!target.identity.empty()) {
    const std::string file = expand_home(target.identity);
    FERRY_TRY(check_exists(file, "identity file", "--identity"));
    ssh_options_set(session, SSH_OPTIONS_ADD_IDENTITY, file.c_str());
  }
  return {};
}

} // namespace

std::string expand_home(const std::string& path)
{
  if (path.rfind("~/", 0) == 0) {
    return home_dir() + path.substr(1);
  }
  return path;
}

Expected<Resolved> configure(ssh_session session, const SshTarget& target)
{
  FERRY_TRY_ASSIGN(const auto spec, parse_host_spec(target.spec));
  ssh_options_set(session, SSH_OPTIONS_HOST, spec.host.c_str());
  if (!spec.user.empty()) {
    ssh_options_set(session, SSH_OPTIONS_USER, spec.user.c_str());
  }
  FERRY_TRY(parse_config(session, target));
  FERRY_TRY(apply_command_line(session, target, spec));

  Resolved resolved;
  resolved.host = get_string_option(session, SSH_OPTIONS_HOST, "");
  resolved.user = get_string_option(session, SSH_OPTIONS_USER, "");
  ssh_options_get_port(session, &resolved.port);
  resolved.known_hosts = get_string_option(
      session, SSH_OPTIONS_KNOWNHOSTS,
      expand_home(target.known_hosts.empty() ? "~/.ssh/known_hosts" : target.known_hosts));
  resolved.global_known_hosts =
      get_string_option(session, SSH_OPTIONS_GLOBAL_KNOWNHOSTS, "/etc/ssh/ssh_known_hosts");
  return resolved;
}

} // namespace ferry::ssh
