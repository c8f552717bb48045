#include "run/targets.hpp"

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <unordered_map>

#include <fmt/ranges.h>
#include <unistd.h>

#include "ferry/held.hpp"
#include "ferry/host_spec.hpp"
#include "ferry/hostlist.hpp"
#include "ferry/text.hpp"
#include "ferry/util.hpp"

namespace ferry {

namespace {

// The hosts a command names, each entry of --host, --hosts-file and the groups expanded in turn.
class HostExpander {
public:
  explicit HostExpander(const UserConfig& config) : m_config(config) {}

  // A comma-separated list of hostlists and @groups. An empty entry (`--host ""` from an unset
  // variable, "a,,b") is refused: taking it for "no host" would run the job on this machine.
  Expected<void> add_list(const std::string& list, const std::string& where)
  {
    for (const auto& entry : split_hostlist(list)) {
      if (entry.empty()) {
        return fail(ErrorKind::usage,
                    "{} names an empty host ('{}'); give a host name, or --local to run here",
                    where, terminal_safe(list));
      }
      if (entry.front() == '@') {
        FERRY_TRY(add_group(entry.substr(1), where));
        continue;
      }
      auto expanded = expand_hostlist(entry);
      if (!expanded) {
        return fail(ErrorKind::usage, "{}: {}", where, expanded.error().message);
      }
      if (expanded->size() > k_max_hostlist_hosts - m_hosts.size()) {
        return fail(ErrorKind::usage, "{}: more than {} hosts in all (at '{}'); name fewer", where,
                    k_max_hostlist_hosts, terminal_safe(entry));
      }
      m_hosts.insert(m_hosts.end(), expanded->begin(), expanded->end());
    }
    return {};
  }

  std::vector<std::string>& hosts() { return m_hosts; }

private:
  Expected<void> add_group(const std::string& name, const std::string& where)
  {
    const auto group = m_config.groups.find(name);
    if (group == m_config.groups.end()) {
      return fail(ErrorKind::usage, "{}: no group @{}; {}", where, terminal_safe(name),
                  groups_are_defined());
    }
    if (const auto open = std::find(m_open.begin(), m_open.end(), name); open != m_open.end()) {
      std::vector<std::string> chain(open, m_open.end());
      chain.push_back(name);
      return fail(ErrorKind::usage, "group @{} names itself (@{}) in {}", terminal_safe(name),
                  terminal_safe(fmt::format("{}", fmt::join(chain, " -> @"))), config_file());
    }
    m_open.push_back(name);
    const std::string inside = fmt::format("group @{} in {}", terminal_safe(name), config_file());
    for (const auto& entry : group->second) {
      FERRY_TRY(add_list(entry, inside));
    }
    m_open.pop_back();
    return {};
  }

  std::string config_file() const
  {
    return (m_config.file.empty() ? default_user_config_path() : m_config.file).string();
  }

  std::string groups_are_defined() const
  {
    std::vector<std::string> known;
    for (const auto& [name, hosts] : m_config.groups) {
      known.push_back("@" + terminal_safe(name));
    }
    return fmt::format("groups are defined in the [groups] table of {} ({})", config_file(),
                       known.empty() ? std::string("it defines none")
                                     : fmt::format("known: {}", fmt::join(known, ", ")));
  }

  const UserConfig& m_config;
  std::vector<std::string> m_hosts;
  std::vector<std::string> m_open; // the groups being expanded, outermost first
};

// A host takes a line of a few dozen bytes: a bigger file is not a hosts file.
constexpr SmallFile k_hosts_file{"--hosts-file", std::uint64_t{8} << 20};

// `--hosts-file PATH`, or `-`: standard input, read to its end.
Expected<void> add_hosts_file(HostExpander& hosts, const std::string& path)
{
  const bool from_stdin = path == "-";
  const std::string name = from_stdin ? "- (standard input)" : path;
  FERRY_TRY_ASSIGN(const auto text, from_stdin ? read_small_fd(STDIN_FILENO, name, k_hosts_file)
                                               : read_small_file(path, k_hosts_file));
  const std::size_t before = hosts.hosts().size();
  std::istringstream in(text);
  std::string line;
  for (int number = 1; std::getline(in, line); ++number) {
    if (const auto hash = line.find('#'); hash != std::string::npos) {
      line.resize(hash);
    }
    if (!trim(line).empty()) { // a blank or comment line names no host, which is fine
      FERRY_TRY(hosts.add_list(line, fmt::format("{} line {}", name, number)));
    }
  }
  if (hosts.hosts().size() == before) {
    return fail(ErrorKind::usage, "the hosts file {} names no host", name);
  }
  return {};
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

Expected<std::optional<int>> persist_from_environment()
{
  const char* env = std::getenv("FERRY_PERSIST");
  if (env == nullptr || *env == '\0') {
    return std::optional<int>();
  }
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
  return std::optional<int>(seconds);
}

} // namespace

Expected<std::vector<std::string>> named_hosts(const HostTargets& target, const UserConfig& config)
{
  HostExpander expander(config);
  for (const auto& item : target.hosts) {
    FERRY_TRY(expander.add_list(item, "--host"));
  }
  if (!target.hosts_file.empty()) {
    FERRY_TRY(add_hosts_file(expander, target.hosts_file));
  }
  auto hosts = std::move(expander.hosts());
  for (const auto& host : hosts) {
    FERRY_TRY(parse_host_spec(host));
  }
  if (target.local && !hosts.empty()) {
    return fail(ErrorKind::usage, "--local and --host/--hosts-file exclude each other");
  }
  return hosts;
}

std::vector<std::string> each_host_once(const std::vector<std::string>& hosts, const NoteLine& note)
{
  std::vector<std::string> once;
  std::vector<std::string> repeated;
  std::unordered_map<std::string_view, bool> seen; // host -> named again; a fleet is 100k hosts
  for (const auto& host : hosts) {
    const auto [at, first] = seen.try_emplace(host, false);
    if (first) {
      once.push_back(host);
    } else if (!at->second) {
      at->second = true;
      repeated.push_back(host);
    }
  }
  if (!note || repeated.empty()) {
    return once;
  }
  // A few repeats get a line each; many (two overlapping hostlists) get one line.
  constexpr std::size_t k_lines = 5;
  if (repeated.size() <= k_lines) {
    for (const auto& host : repeated) {
      note(fmt::format("{} is named more than once; it runs once", terminal_safe(host)));
    }
  } else {
    const std::size_t count = repeated.size();
    repeated.resize(k_lines);
    for (auto& host : repeated) {
      host = terminal_safe(host);
    }
    note(fmt::format("{} hosts are named more than once ({}, ...); each runs once", count,
                     fmt::join(repeated, ", ")));
  }
  return once;
}

Expected<int> persist_for(const HostTargets& target, const UserConfig& config,
                          const std::string& host)
{
  if (target.persist_s) {
    return *target.persist_s;
  }
  FERRY_TRY_ASSIGN(const auto from_environment, persist_from_environment());
  if (from_environment) {
    return *from_environment;
  }
  if (const auto seconds = config.for_host(host).ssh.persist_s) {
    return *seconds;
  }
  return k_default_persist_s;
}

SshTarget ssh_target_for(const HostTargets& target, const UserConfig& config,
                         const std::string& host, bool verbose)
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
  apply_config(ssh, config.for_host(host));
  ssh.warn = stderr_lines(host, "warning: ");
  ssh.prompt = terminal_prompter();
  if (verbose) {
    ssh.debug = stderr_lines(host, "");
  }
  return ssh;
}

Expected<SessionMaker> direct_sessions(const HostTargets& target, const UserConfig& config,
                                       const std::string& host, bool verbose)
{
  SshTarget ssh = ssh_target_for(target, config, host, verbose);
  ssh.prompt = nullptr; // a long-lived process (the MCP server) has nobody at a terminal
  FERRY_TRY(make_checked_ssh_session(ssh));
  FERRY_TRY_ASSIGN(const int persist_s, persist_for(target, config, host));
  // A host the user's holder keeps (`ferry connect` answered its second factor on a terminal)
  // is used through it; no holder is started for the server's own sessions.
  return SessionMaker([ssh = std::move(ssh), persist_s]() -> std::unique_ptr<HostSession> {
    auto direct = make_checked_ssh_session(ssh);
    if (!direct || persist_s <= 0) {
      return make_ssh_session(ssh);
    }
    return make_held_or_direct_session(std::move(*direct), ssh);
  });
}

Expected<std::vector<std::unique_ptr<HostSession>>> make_host_sessions(const HostTargets& target,
                                                                       const UserConfig& config,
                                                                       bool verbose,
                                                                       const NoteLine& note)
{
  FERRY_TRY_ASSIGN(const auto named, named_hosts(target, config));
  std::vector<std::unique_ptr<HostSession>> sessions;
  if (named.empty()) {
    sessions.push_back(make_local_session(LocalTarget{}));
    return sessions;
  }
  for (const auto& host : each_host_once(named, note)) {
    const SshTarget ssh = ssh_target_for(target, config, host, verbose);
    FERRY_TRY_ASSIGN(auto session, make_checked_ssh_session(ssh));
    FERRY_TRY_ASSIGN(const int persist_s, persist_for(target, config, host));
    if (persist_s > 0) {
      sessions.push_back(make_persistent_session(std::move(session), ssh, persist_s));
    } else {
      sessions.push_back(std::move(session));
    }
  }
  return sessions;
}

} // namespace ferry
