#include "cli/targets.hpp"

namespace ferry::cli {

void add_target_options(CLI::App& command, TargetOptions& target)
{
  command
      .add_option("--host", target.hosts,
                  "[user@]host[:port], an ~/.ssh/config alias, a hostlist (gpu[01-16]) or "
                  "@group from the config file (repeatable, comma-separated)")
      ->group("Target");
  command
      .add_option("--hosts-file", target.hosts_file,
                  "a file with hosts, hostlists or @groups, one a line (# comments)")
      ->group("Target");
  command.add_flag("--local", target.local, "run on this machine (the default with no host)")
      ->group("Target");
  add_ssh_options(command, target);
  add_slurm_options(command, target.slurm);
}

void add_ssh_options(CLI::App& command, HostTargets& target)
{
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
}

Expected<std::vector<std::string>> target_hosts(const TargetOptions& target,
                                                const UserConfig& config)
{
  FERRY_TRY_ASSIGN(auto hosts, named_hosts(target, config));
  FERRY_TRY(check_slurm_combination(target, !hosts.empty()));
  return hosts;
}

SshTarget ssh_target_for(Context& ctx, const TargetOptions& target, const std::string& host)
{
  // The config file's mistakes were reported when make_sessions read it.
  const auto config = ctx.user_config();
  return ferry::ssh_target_for(target, config ? **config : UserConfig{}, host, ctx.global.verbose);
}

Expected<std::vector<std::unique_ptr<HostSession>>>
make_sessions(Context& ctx, const TargetOptions& target, std::span<const Job> jobs)
{
  FERRY_TRY_ASSIGN(const UserConfig* config, ctx.user_config()); // a mistake stops it here
  FERRY_TRY(target_hosts(target, *config));
  if (!target.slurm.login.empty()) {
    return make_slurm_target_sessions(ctx, target, jobs);
  }
  return make_host_sessions(target, *config, ctx.global.verbose,
                            [&ctx](std::string_view text) { ctx.reporter().note(text); });
}

} // namespace ferry::cli
