#pragma once
// Where runs go, resolved in one place for every command that runs jobs (`run`, `check`,
// `replay`, `mcp`): the hosts the options name, how each is reached (the options, then the
// user's config file, then the ssh config), and the sessions to reach them.
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "ferry/sessions.hpp"
#include "ferry/transport.hpp"
#include "ferry/user_config.hpp"

namespace ferry {

// The SSH and local target options (docs/cli.md, "Targets").
struct HostTargets {
  std::vector<std::string> hosts; // --host, each maybe a comma-separated list
  std::string hosts_file;
  bool local = false;
  std::string identity;
  std::string known_hosts;
  std::string ssh_config;
  bool accept_new_host_key = false;
  double connect_timeout_s = 0; // 0: ConnectTimeout from the ssh config, else 10 s
  std::string remote_base;      // default: $HOME/.cache/ferry/runs on the host
  int retries = 1;
  std::optional<int> persist_s; // --persist: seconds a connection is kept after the run
};

// A line for the user ("gpu1 is named more than once; it runs once").
using NoteLine = std::function<void(std::string_view)>;

// The hosts `--host` and `--hosts-file` name, in order, repeats kept, each hostlist
// ("gpu[01-16]") and @group (`config`'s [groups]) expanded; checked before anything is
// contacted (an empty entry, a bad range or spec, an unknown group, more than
// k_max_hostlist_hosts, --local next to hosts: ErrorKind::usage).
[[nodiscard]] Expected<std::vector<std::string>> named_hosts(const HostTargets& target,
                                                             const UserConfig& config);

// Each host once, in the order first named; `note` hears of the repeats.
[[nodiscard]] std::vector<std::string> each_host_once(const std::vector<std::string>& hosts,
                                                      const NoteLine& note);

// How to reach `host`: the options, then the config file's `[hosts."…"]` defaults. With
// `verbose`, the connection tells its story on stderr. Keyboard-interactive prompts are asked
// on the user's terminal.
[[nodiscard]] SshTarget ssh_target_for(const HostTargets& target, const UserConfig& config,
                                       const std::string& host, bool verbose);

// --persist, else $FERRY_PERSIST, else the config's ssh.persist, else the default.
[[nodiscard]] Expected<int> persist_for(const HostTargets& target, const UserConfig& config,
                                        const std::string& host);

// One unconnected session per host named (each once), or the local one when none is: a held
// connection where persistence is on, else a direct one.
[[nodiscard]] Expected<std::vector<std::unique_ptr<HostSession>>>
make_host_sessions(const HostTargets& target, const UserConfig& config, bool verbose,
                   const NoteLine& note);

// Makes a new, unconnected session each time it is called.
using SessionMaker = std::function<std::unique_ptr<HostSession>()>;

// SSH sessions to `host`, as many as asked for: what a long-lived process that keeps its own
// sessions uses; they never prompt. Each goes through the session the user's holder keeps for
// the host when there is one (held by `ferry connect`, which answered a second factor), else
// connects directly; no holder is started for them (--persist 0 / FERRY_PERSIST=0: direct). The ssh
// config is read now: one ssh would refuse is a usage error here, before any host is contacted.
[[nodiscard]] Expected<SessionMaker> direct_sessions(const HostTargets& target,
                                                     const UserConfig& config,
                                                     const std::string& host, bool verbose);

} // namespace ferry
