#include <fstream>

#include "cli/targets.hpp"
#include "ferry/host_spec.hpp"
#include "ferry/sessions.hpp"
#include "ferry/text.hpp"

namespace ferry::cli {

namespace {

void add_hosts(std::vector<std::string>& hosts, const std::string& list)
{
  std::size_t start = 0;
  while (start <= list.size()) {
    const auto comma = std::min(list.find(',', start), list.size());
    std::string host(trim(std::string_view(list).substr(start, comma - start)));
    if (!host.empty()) {
      hosts.push_back(std::move(host));
    }
    start = comma + 1;
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
      .add_option("--remote-base", target.remote_base,
                  "run directory base on the host (default $HOME/.cache/ferry/runs)")
      ->group("SSH");
  add_slurm_options(command, target.slurm);
}

Expected<std::vector<std::string>> target_hosts(const TargetOptions& target)
{
  std::vector<std::string> hosts;
  for (const auto& item : target.hosts) {
    add_hosts(hosts, item);
  }
  if (!target.hosts_file.empty()) {
    std::ifstream in(target.hosts_file);
    if (!in) {
      return fail(ErrorKind::usage, "cannot read the hosts file {} (--hosts-file)",
                  target.hosts_file);
    }
    std::string line;
    while (std::getline(in, line)) {
      if (const auto hash = line.find('#'); hash != std::string::npos) {
        line.resize(hash);
      }
      add_hosts(hosts, line);
    }
    if (hosts.empty()) {
      return fail(ErrorKind::usage, "the hosts file {} names no host", target.hosts_file);
    }
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

SshTarget ssh_target_for(const TargetOptions& target, const std::string& host)
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
  return ssh;
}

Expected<std::vector<std::unique_ptr<HostSession>>> make_sessions(const TargetOptions& target,
                                                                  std::span<const Job> jobs)
{
  FERRY_TRY_ASSIGN(auto hosts, target_hosts(target));
  if (!target.slurm.login.empty()) {
    return make_slurm_target_sessions(target, jobs);
  }
  std::vector<std::unique_ptr<HostSession>> sessions;
  if (hosts.empty()) {
    sessions.push_back(make_local_session(LocalTarget{}));
    return sessions;
  }
  for (const auto& host : hosts) {
    sessions.push_back(make_ssh_session(ssh_target_for(target, host)));
  }
  return sessions;
}

} // namespace ferry::cli
