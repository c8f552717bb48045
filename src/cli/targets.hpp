#pragma once
// The command line's targets: the SSH and local ones as run/targets.hpp resolves them for every
// command, and --slurm.
#include <memory>
#include <vector>

#include "cli/cli.hpp"
#include "ferry/sessions.hpp"
#include "ferry/transport.hpp"

namespace ferry::cli {

// The hosts the TARGET options name (`--host`, `--hosts-file`, `--local`; none means local),
// hostlists and `config`'s @groups expanded, checked before anything is contacted.
[[nodiscard]] Expected<std::vector<std::string>> target_hosts(const TargetOptions& target,
                                                              const UserConfig& config);

// One unconnected session per host (a host named twice gets one, with a note); with -v each SSH
// session tells its connection's story on stderr. For --slurm, one per node (`jobs`' [slurm]
// tables may say how many).
[[nodiscard]] Expected<std::vector<std::unique_ptr<HostSession>>>
make_sessions(Context& ctx, const TargetOptions& target, std::span<const Job> jobs = {});

// How to reach `host` with the SSH options given.
[[nodiscard]] SshTarget ssh_target_for(Context& ctx, const TargetOptions& target,
                                       const std::string& host);

} // namespace ferry::cli
