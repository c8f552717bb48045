#pragma once
// One tools/call: the job on each chosen target (in parallel, each on a pooled session), every
// run archived with the client that asked for it, the observer told as things happen.
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ferry/archive.hpp"
#include "ferry/fleet.hpp"
#include "mcp/host_pool.hpp"

namespace ferry::mcp {

struct CallSetup {
  const Job* job = nullptr;
  nlohmann::json params;
  std::vector<std::string> targets;
  RunOptions options;    // with the call's StopToken
  nlohmann::json client; // {"name","version"} for the records
};

struct CallOutcome {
  std::vector<RunRecord> runs; // in the order of setup.targets
  std::vector<bool> archived;
};

// Archive failures are noted on stderr and in the run's warnings; the runs go on.
[[nodiscard]] CallOutcome run_call(HostPool& pool, Archive* archive, const CallSetup& setup,
                                   RunObserver& observer);

} // namespace ferry::mcp
