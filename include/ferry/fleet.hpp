#pragma once
// Many jobs on many hosts: one session per host (the handshake is paid once, jobs run one
// after another on it), at most `parallel` hosts at once, each session owned by one thread.
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "ferry/run_observer.hpp"
#include "ferry/runner.hpp"
#include "ferry/transport.hpp"

namespace ferry {

struct PlannedRun {
  const Job* job = nullptr;
  nlohmann::json params;
};

void run_fleet(std::vector<std::unique_ptr<HostSession>>& sessions,
               const std::vector<PlannedRun>& runs, int parallel, const RunOptions& options,
               RunObserver& observer, std::vector<std::string> swept = {});

} // namespace ferry
