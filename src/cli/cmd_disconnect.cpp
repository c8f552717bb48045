// `ferry disconnect`: ends the sessions the connection holder keeps open between runs
// (docs/persistence.md), and `ferry __hold`, the holder itself.
#include <algorithm>
#include <memory>
#include <set>

#include "cli/cli.hpp"
#include "cli/execute.hpp"
#include "ferry/held.hpp"
#include "ferry/text.hpp"

namespace ferry::cli {

namespace {

struct DisconnectCommand {
  std::vector<std::string> hosts;
  bool all = false;
  bool list = false;
  bool json = false;
};

nlohmann::json as_json(const HeldConnection& held, bool ended)
{
  return {{"host", held.label}, {"pid", held.pid}, {"since", held.since}, {"ended", ended}};
}

Expected<ExitCode> run_disconnect(const DisconnectCommand& cmd)
{
  if (cmd.hosts.empty() && !cmd.all && !cmd.list) {
    return fail(ErrorKind::usage, "disconnect needs a HOST, --all or --list (`ferry disconnect "
                                  "--list` shows the connections held)");
  }
  if (cmd.all && !cmd.hosts.empty()) {
    return fail(ErrorKind::usage, "disconnect takes HOSTs or --all, not both");
  }
  nlohmann::json out = nlohmann::json::array();
  std::string text;
  std::set<std::string> matched;
  for (const auto& held : held_connections()) {
    const bool chosen =
        cmd.all || std::find(cmd.hosts.begin(), cmd.hosts.end(), held.label) != cmd.hosts.end();
    const bool ended = !cmd.list && chosen && end_held(held);
    if (!cmd.list && !chosen) {
      continue;
    }
    matched.insert(held.label);
    out.push_back(as_json(held, ended));
    text += fmt::format("{}{} (process {}, since {})\n", ended ? "disconnected " : "",
                        terminal_safe(held.label), held.pid, held.since);
  }
  for (const auto& host : cmd.hosts) {
    if (!matched.contains(host)) {
      text += fmt::format("no connection held for {}\n", terminal_safe(host));
    }
  }
  if (cmd.json) {
    std::fputs((out.dump() + "\n").c_str(), stdout);
  } else {
    if (out.empty() && cmd.hosts.empty()) {
      text += "no connection held\n";
    }
    std::fputs(text.c_str(), stdout);
  }
  return ExitCode::ok;
}

} // namespace

void add_disconnect_command(CLI::App& app, Context& ctx)
{
  auto cmd = std::make_shared<DisconnectCommand>();
  CLI::App* sub = app.add_subcommand(
      "disconnect", "End the connections kept open between runs (--persist), or list them");
  sub->add_option("host", cmd->hosts, "hosts as named to ferry run (repeatable)");
  sub->add_flag("--all", cmd->all, "end every connection held for you");
  sub->add_flag("--list", cmd->list, "list the connections held; end none");
  sub->add_flag("--json", cmd->json, "the connections as one JSON array");
  sub->footer(R"(Examples:
  ferry disconnect gpu1
  ferry disconnect --all
  ferry disconnect --list)");
  on_chosen(*sub, ctx, [cmd] { return run_disconnect(*cmd); });
}

int holder_main(std::string_view spec)
{
  install_interrupt_handlers();
  return held::run_holder(spec);
}

} // namespace ferry::cli
