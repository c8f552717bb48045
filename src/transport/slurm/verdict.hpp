#pragma once
// How a Slurm job ended, as the submit script read it from scontrol/squeue (or sacct once the
// controller has forgotten the job), and what that means for ferry's run.
#include <optional>
#include <string>

#include "ferry/transport.hpp"

namespace ferry::slurm {

// The states a job does not leave (squeue's long names).
[[nodiscard]] bool is_final_state(std::string_view state);

struct JobEnd {
  std::string state = "UNKNOWN"; // COMPLETED, FAILED, TIMEOUT, CANCELLED, OUT_OF_MEMORY, ...
  std::optional<int> exit_code;  // of the batch script: "3:0" -> 3
  std::optional<int> signal;     // "0:15" -> 15
  std::string nodes;             // the job's node list ("n[1-2]"), empty when it had none
  std::string source;            // "scontrol", "sacct" or "none"
};

// "3:0" -> {3, 0}; nullopt for anything else.
[[nodiscard]] std::optional<std::pair<int, int>> parse_exit_code(std::string_view text);

// What ferry saw of the run on this node.
struct NodeRun {
  std::string run_dir;
  std::string node;              // where the launcher started; empty when it never did
  bool launcher_report = false;  // the launcher's last line came back
  bool stopped_by_ferry = false; // ferry cancelled the job (interrupt or its own deadline)
  int time_min = 0;              // the job's --time
};

// The batch script's status when a node cannot enter its run directory.
inline constexpr int k_no_run_dir_exit = 97;

// The target's verdict on the run; nullopt when the launcher's own report decides, as for any
// host.
[[nodiscard]] std::optional<ExecOutcome::Verdict> slurm_verdict(const JobEnd& end,
                                                                const NodeRun& run);

} // namespace ferry::slurm
