#pragma once
// One tools/call: the job on each chosen target through the run loop every command uses
// (run_fleet, its sessions borrowed from the server's pool), every run archived with the client
// that asked for it, the observer told as things happen.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ferry/archive.hpp"
#include "ferry/fleet.hpp"
#include "run/archiving.hpp"
#include "run/session_pool.hpp"

namespace ferry::mcp {

// How many targets of one call run at once.
inline constexpr int k_parallel_targets = 8;

struct CallSetup {
  const Job* job = nullptr;
  nlohmann::json params;
  std::vector<std::string> targets;
  RunOptions options;    // with the call's StopToken
  nlohmann::json client; // {"name","version"} for the records
};

// Where a call's runs are archived.
struct CallArchive {
  Archive* archive = nullptr;
  std::optional<std::uint64_t> max_size; // `[archive] max_size` of the config file
  std::string config_file;
};

struct CallOutcome {
  std::vector<RunRecord> runs; // in the order of setup.targets
  std::vector<bool> archived;
};

// How a call's runs are archived: with the client that asked, problems noted on stderr and in
// the run's warnings.
[[nodiscard]] ArchivingSettings archiving_settings(const CallArchive& archive,
                                                   const nlohmann::json& client);

// Archive failures are noted on stderr and in the run's warnings; the runs go on.
[[nodiscard]] CallOutcome run_call(SessionPool& pool, const CallArchive& archive,
                                   const CallSetup& setup, RunObserver& observer);

} // namespace ferry::mcp
