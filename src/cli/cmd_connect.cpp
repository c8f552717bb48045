// `ferry connect HOST...`: the connection holder connects the hosts now, asking their
// keyboard-interactive prompts (a second factor) on this terminal, and keeps the sessions for
// later runs, which then need no terminal (docs/persistence.md).
#include <chrono>
#include <memory>

#include "cli/cli.hpp"
#include "ferry/held.hpp"
#include "ferry/text.hpp"
#include "ferry/util.hpp"

namespace ferry::cli {

namespace {

struct ConnectCommand {
  HostTargets target;
  std::vector<std::string> hosts;
};

// Each host's persist time, checked before any host is contacted.
Expected<std::vector<int>> persist_times(const ConnectCommand& cmd, const UserConfig& config,
                                         const std::vector<std::string>& hosts)
{
  std::vector<int> times;
  for (const auto& host : hosts) {
    FERRY_TRY_ASSIGN(const int seconds, persist_for(cmd.target, config, host));
    if (seconds == 0) {
      return fail(ErrorKind::usage,
                  "connect keeps {}'s connection for later runs, but its persist time is 0 "
                  "(--persist 0, FERRY_PERSIST=0 or the config's ssh.persist): give --persist "
                  "SECONDS",
                  terminal_safe(host));
    }
    times.push_back(seconds);
  }
  return times;
}

Expected<void> connect_one(const HostTargets& target, const UserConfig& config,
                           const std::string& host, int persist_s, bool verbose)
{
  const SshTarget ssh = ferry::ssh_target_for(target, config, host, verbose);
  FERRY_TRY_ASSIGN(auto direct, make_checked_ssh_session(ssh));
  return hold_connection(std::move(direct), ssh, persist_s);
}

Expected<ExitCode> run_connect(Context& ctx, ConnectCommand& cmd)
{
  FERRY_TRY_ASSIGN(const UserConfig* config, ctx.user_config());
  cmd.target.hosts = cmd.hosts;
  FERRY_TRY_ASSIGN(const auto named, named_hosts(cmd.target, *config));
  const auto hosts = each_host_once(named, [](std::string_view text) {
    std::fputs(fmt::format("ferry: {}\n", text).c_str(), stderr);
  });
  FERRY_TRY_ASSIGN(const auto persist, persist_times(cmd, *config, hosts));
  ExitCode code = ExitCode::ok;
  for (std::size_t i = 0; i < hosts.size(); ++i) {
    auto held = connect_one(cmd.target, *config, hosts[i], persist[i], ctx.global.verbose);
    if (!held) {
      std::fputs(fmt::format("ferry: error: {}\n", held.error().message).c_str(), stderr);
      if (code == ExitCode::ok || held.error().kind == ErrorKind::unreachable) {
        code = exit_code_for(held.error().kind);
      }
      continue;
    }
    const auto until = std::chrono::system_clock::now() + std::chrono::seconds(persist[i]);
    std::fputs(fmt::format("{}: held until {} ({} s after its last use)\n", terminal_safe(hosts[i]),
                           utc_iso(until), persist[i])
                   .c_str(),
               stdout);
  }
  return code;
}

} // namespace

void add_connect_command(CLI::App& app, Context& ctx)
{
  auto cmd = std::make_shared<ConnectCommand>();
  CLI::App* sub = app.add_subcommand(
      "connect", "Connect hosts now and keep their connections for later runs (--persist), "
                 "answering a second factor (keyboard-interactive) on this terminal");
  sub->add_option("host", cmd->hosts,
                  "[user@]host[:port], an ~/.ssh/config alias, a hostlist or @group")
      ->required();
  add_ssh_options(*sub, cmd->target);
  sub->footer(R"(A host that asks for a second factor (an OTP, Duo) asks it here once; runs
through the held connection need no terminal until it ends (--persist after its last use).

Examples:
  ferry connect login1
  ferry connect --persist 28800 login1 login2
  ferry run probe --host login1 --json)");
  on_chosen(*sub, ctx, [&ctx, cmd] { return run_connect(ctx, *cmd); });
}

} // namespace ferry::cli
