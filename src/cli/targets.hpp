#pragma once
#include <memory>
#include <vector>

#include "cli/cli.hpp"
#include "ferry/transport.hpp"

namespace ferry::cli {

// The hosts the TARGET options name (`--host`, `--hosts-file`, `--local`; none means local),
// checked before anything is contacted.
[[nodiscard]] Expected<std::vector<std::string>> target_hosts(const TargetOptions& target);

// One unconnected session per host (a host named twice gets one, with a note); with -v each SSH
// session tells its connection's story on stderr.
[[nodiscard]] Expected<std::vector<std::unique_ptr<HostSession>>>
make_sessions(Context& ctx, const TargetOptions& target);

} // namespace ferry::cli
