#include <algorithm>
#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <sstream>

#include <unistd.h>

#include "cli/targets.hpp"
#include "ferry/held.hpp"
#include "ferry/host_spec.hpp"
#include "ferry/sessions.hpp"
#include "ferry/text.hpp"
#include "ferry/util.hpp"

namespace ferry::cli {

namespace {

// The hosts of a comma-separated list. An empty one (`--host ""` from an unset variable, "a,,b")
// is refused: taking it for "no host" would run the job on this machine instead.
Expected<void> add_hosts(std::vector<std::string>& hosts, const std::string& list,
                         const std::string& where)
{
  std::size_t start = 0;
  while (start <= list.size()) {
    const auto comma = std::min(list.find(',', start), list.size());
    std::string host(trim(std::string_view(list).substr(start, comma - start)));
    if (host.empty()) {
      return fail(ErrorKind::usage,
                  "{} names an empty host ('{}'); give a host name, or --local to run here", where,
                  terminal_safe(list));
    }
    hosts.push_back(std::move(host));
    start = comma + 1;
  }
  return {};
}

// A host takes a line of a few dozen bytes: a bigger file is not a hosts file.
constexpr SmallFile k_hosts_file{"--hosts-file", std::uint64_t{8} << 20};

// `--hosts-file PATH`, or `-`: standard input, read to its end.
Expected<void> add_hosts_file(std::vector<std::string>& hosts, const std::string& path)
{
  const bool from_stdin = path == "-";
  const std::string name = from_stdin ? "- (standard input)" : path;
  FERRY_TRY_ASSIGN(const auto text, from_stdin ? read_small_fd(STDIN_FILENO, name, k_hosts_file)
                                               : read_small_file(path, k_hosts_file));
  std::istringstream in(text);
  std::string line;
  for (int number = 1; std::getline(in, line); ++number) {
    if (const auto hash = line.find('#'); hash != std::string::npos) {
      line.resize(hash);
    }
    if (!trim(line).empty()) { // a blank or comment line names no host, which is fine
      FERRY_TRY(add_hosts(hosts, line, fmt::format("{} line {}", name, number)));
    }
  }
  if (hosts.empty()) {
    return fail(ErrorKind::usage, "the hosts file {} names no host", name);
  }
  return {};
}

// Each host once, in the order first named; a repeat is worth a note, not a second run.
std::vector<std::string> without_repeats(const std::vector<std::string>& hosts,
                                         std::vector<std::string>& repeated)
{
  std::vector<std::string> once;
  for (const auto& host : hosts) {
    if (std::find(once.begin(), once.end(), host) == once.end()) {
      once.push_back(host);
    } else if (std::find(repeated.begin(), repeated.end(), host) == repeated.end()) {
      repeated.push_back(host);
    }
  }
  return once;
}

// One write per line, "ferry: HOST: TEXT", so lines of hosts connecting at once never mix.
std::function<void(std::string_view)> stderr_lines(const std::string& host, std::string kind)
{
  return [host = terminal_safe(host), kind = std::move(kind)](std::string_view text) {
    const std::string line = fmt::format("ferry: {}: {}{}\n", host, kind, terminal_safe(text));
    std::fwrite(line.data(), 1, line.size(), stderr);
  };
}

// The config file's defaults, where neither the options nor the host spec say otherwise.
void apply_config(SshTarget& ssh, const HostConfig& config)
{
  const auto spec = parse_host_spec(ssh.spec);
  if (spec && ((spec->user.empty() && config.ssh.user) || (spec->port == 0 && config.ssh.port))) {
    const std::string user = spec->user.empty() ? config.ssh.user.value_or("") : spec->user;
    const unsigned port = spec->port == 0 ? config.ssh.port.value_or(0) : spec->port;
    const bool bracket = spec->host.find(':') != std::string::npos;
    ssh.spec = fmt::format("{}{}{}", user.empty() ? "" : user + "@",
                           bracket ? "[" + spec->host + "]" : spec->host,
                           port == 0 ? "" : ":" + std::to_string(port));
  }
  if (ssh.identity.empty() && config.ssh.identity) {
    ssh.identity = *config.ssh.identity;
  }
  if (ssh.connect_timeout_s == 0 && config.ssh.connect_timeout_s) {
    ssh.connect_timeout_s = *config.ssh.connect_timeout_s;
  }
  if (ssh.remote_base.empty() && config.remote_base) {
    ssh.remote_base = *config.remote_base;
  }
}

} // namespace

void add_target_options(CLI::App& command, TargetOptions& target)
{
  command
      .add_option("--host", target.hosts,
                  "[user@]host[:port] or an ~/.ssh/config alias (repeatable, comma-separated)")
      ->group("Target");
  command.add_option("--hosts-file", target.hosts_file, "a file with one host a line (# comments)")
      ->group("Target");
  command.add_flag("--local", target.local, "run on this machine (the default with no host)")
      ->group("Target");
  command.add_option("--identity", target.identity, "private key file for public-key auth")
      ->group("SSH");
  command
      .add_option("--known-hosts", target.known_hosts,
                  "known_hosts file (default ~/.ssh/known_hosts)")
      ->group("SSH");
  command.add_option("--ssh-config", target.ssh_config, "ssh config file (default ~/.ssh/config)")
      ->group("SSH");
  command
      .add_flag("--accept-new-host-key", target.accept_new_host_key,
                "trust an unknown host key once and record it (a changed key is always refused)")
      ->group("SSH");
  command
      .add_option(
          "--connect-timeout", target.connect_timeout_s,
          "seconds to wait for a host (default: ConnectTimeout from the ssh config, else 10)")
      ->check(CLI::PositiveNumber)
      ->group("SSH");
  command.add_option("--retries", target.retries, "extra connect attempts on refused/timeout/DNS")
      ->capture_default_str()
      ->check(CLI::Range(0, 10))
      ->group("SSH");
  command
      .add_option("--persist", target.persist_s,
                  "seconds the host's connection stays open after the run for later runs to use "
                  "(0: none; default $FERRY_PERSIST, the config's ssh.persist, else 60)")
      ->check(CLI::Range(0, 7 * 24 * 3600))
      ->group("SSH");
  command
      .add_option("--remote-base", target.remote_base,
                  "run directory base on the host (default $HOME/.cache/ferry/runs)")
      ->group("SSH");
  add_slurm_options(command, target.slurm);
}

Expected<std::vector<std::string>> target_hosts(const TargetOptions& target)
{
  std::vector<std::string> hosts;
  for (const auto& item : target.hosts) {
    FERRY_TRY(add_hosts(hosts, item, "--host"));
  }
  if (!target.hosts_file.empty()) {
    FERRY_TRY(add_hosts_file(hosts, target.hosts_file));
  }
  for (const auto& host : hosts) {
    FERRY_TRY(parse_host_spec(host));
  }
  if (target.local && !hosts.empty()) {
    return fail(ErrorKind::usage, "--local and --host/--hosts-file exclude each other");
  }
  FERRY_TRY(check_slurm_combination(target, !hosts.empty()));
  return hosts;
}

// --persist, else $FERRY_PERSIST, else the config's ssh.persist, else the default.
Expected<int> persist_for(Context& ctx, const TargetOptions& target, const std::string& host)
{
  if (target.persist_s) {
    return *target.persist_s;
  }
  if (const char* env = std::getenv("FERRY_PERSIST"); env && *env) {
    int seconds = -1;
    const std::string_view text(env);
    const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), seconds);
    if (ec != std::errc{} || end != text.data() + text.size() || seconds < 0 ||
        seconds > 7 * 24 * 3600) {
      return fail(ErrorKind::usage,
                  "FERRY_PERSIST='{}': expected whole seconds from 0 to 604800 (0 keeps no "
                  "connection open)",
                  terminal_safe(text));
    }
    return seconds;
  }
  if (const auto config = ctx.user_config(); config) {
    if (const auto seconds = (*config)->for_host(host).ssh.persist_s) {
      return *seconds;
    }
  }
  return k_default_persist_s;
}

SshTarget ssh_target_for(Context& ctx, const TargetOptions& target, const std::string& host)
{
  SshTarget ssh;
  ssh.spec = host;
  ssh.identity = target.identity;
  ssh.known_hosts = target.known_hosts;
  ssh.ssh_config = target.ssh_config;
  ssh.accept_new_host_key = target.accept_new_host_key;
  ssh.connect_timeout_s = target.connect_timeout_s;
  ssh.retries = target.retries;
  ssh.remote_base = target.remote_base;
  // The config file's defaults (its mistakes were reported when make_sessions read it).
  if (const auto config = ctx.user_config(); config) {
    apply_config(ssh, (*config)->for_host(host));
  }
  ssh.warn = stderr_lines(host, "warning: ");
  if (ctx.global.verbose) {
    ssh.debug = stderr_lines(host, "");
  }
  return ssh;
}

Expected<std::vector<std::unique_ptr<HostSession>>>
make_sessions(Context& ctx, const TargetOptions& target, std::span<const Job> jobs)
{
  FERRY_TRY_ASSIGN(const auto named, target_hosts(target));
  FERRY_TRY(ctx.user_config()); // a mistake in the config file stops the command here
  if (!target.slurm.login.empty()) {
    return make_slurm_target_sessions(ctx, target, jobs);
  }
  std::vector<std::unique_ptr<HostSession>> sessions;
  if (named.empty()) {
    sessions.push_back(make_local_session(LocalTarget{}));
    return sessions;
  }
  std::vector<std::string> repeated;
  const auto hosts = without_repeats(named, repeated);
  for (const auto& host : repeated) {
    ctx.reporter().note(
        fmt::format("{} is named more than once; it runs once", terminal_safe(host)));
  }
  for (const auto& host : hosts) {
    const SshTarget ssh = ssh_target_for(ctx, target, host);
    FERRY_TRY_ASSIGN(auto session, make_checked_ssh_session(ssh));
    FERRY_TRY_ASSIGN(const int persist_s, persist_for(ctx, target, host));
    if (persist_s > 0) {
      sessions.push_back(make_persistent_session(std::move(session), ssh, persist_s));
    } else {
      sessions.push_back(std::move(session));
    }
  }
  return sessions;
}

} // namespace ferry::cli
