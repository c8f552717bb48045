#pragma once
// What ferry asks the login node about the cluster itself, with fixed shell-neutral commands:
// whether the controller answers (before anything is staged), and for `check` the Slurm
// version, the partitions and the GPU gres of the nodes.
#include <string_view>

#include <nlohmann/json.hpp>

#include "ferry/expected.hpp"
#include "transport/ssh/remote.hpp"

namespace ferry::slurm {

// `scontrol ping` on the login node: a controller that is down is an unreachable target
// (exit 3), a login node without Slurm's commands an error.
// `scancel JOB_ID` (a checked id: digits, `_`), whatever the run's stop token says: an
// interrupted sweep's job array goes as a whole. Failures are ignored (the job may be gone).
void cancel_job(ssh::Remote& login, const std::string& job_id);
// squeue's state of JOB_ID (PENDING, RUNNING, COMPLETED, ...: a finished job stays listed for
// the controller's MinJobAge); empty when the controller no longer lists it.
[[nodiscard]] Expected<std::string> queue_state(ssh::Remote& login, const std::string& job_id,
                                                const StopToken& stop);
[[nodiscard]] Expected<void> ping_controller(ssh::Remote& login, std::string_view label,
                                             const StopToken& stop);

// {"version": "22.05.8", "partitions": [{"name", "default", "state", "nodes", "total_nodes"}],
//  "nodes": [{"name", "gres", "partitions", "state"}]}; what could not be read is left out.
[[nodiscard]] nlohmann::json describe_cluster(ssh::Remote& login, const StopToken& stop);

// "KEY=VALUE KEY=VALUE ..." lines of `scontrol -o show ...` as objects.
[[nodiscard]] nlohmann::json parse_scontrol_records(std::string_view text);

} // namespace ferry::slurm
