#pragma once
// The Slurm target (docs/slurm.md): jobs run on cluster nodes that Slurm allocates, reached
// through a login node ferry can ssh to. Files travel over the login node's SFTP into a run
// directory on a filesystem the nodes share; the only command any shell sees is
// `/bin/sh RUN_DIR/.ferry-submit.sh`, which submits the job with sbatch and follows it.
#include <memory>
#include <vector>

#include "ferry/sessions.hpp"
#include "ferry/slurm_options.hpp"
#include "ferry/transport.hpp"

namespace ferry {

struct SlurmTarget {
  SshTarget login;               // the login node, as for --host
  SlurmOptions command_line;     // wins over the job's [slurm] table...
  SlurmOptions config;           // ...which wins over the user config file's
  int nodes = 1;                 // one session (and one record per run) per node
  bool describe_cluster = false; // `check`: also read the version, partitions and GPU gres
  // A sweep's points (one job, one node each): submitted as one job array of this many tasks
  // once every point is staged (0: one job per run). `array_throttle`: at most this many tasks
  // at once (sbatch's --array=...%M; 0: no bound).
  int array_points = 0;
  int array_throttle = 0;
  // `attach`/`stop` of a --detach run (docs/slurm.md, "Detached runs"): the session follows this
  // job ("4242", or "4242_3": task 3 of a sweep's array, `array_points` then its size), submitted
  // before, instead of submitting; ferry's Ctrl-C leaves it running, and cancel_detached_slurm_job
  // stops it.
  std::string detached_job;
};

// `nodes` sessions that share each run's allocation: one Slurm job per run, one node each.
[[nodiscard]] std::vector<std::unique_ptr<HostSession>>
make_slurm_sessions(const SlurmTarget& target);

// `ferry stop` of a detached run: scancel of the job `session` (a Slurm session made for
// `detached_job`) follows, that job alone; its launcher gets Slurm's TERM and stops the job as on a
// live run's Ctrl-C, then `launch` follows it to its end. Says what was sent; an error for a
// session of another target.
[[nodiscard]] Expected<std::string> cancel_detached_slurm_job(HostSession& session);

// `ps` of a detached run (`detached_job` set): pending or running (squeue's word for it, in lower
// case), finished (the job has ended and its run directory waits for `attach`) or gone (the
// directory is not there).
[[nodiscard]] Expected<std::string> detached_slurm_state(const SlurmTarget& target,
                                                         const std::string& run_dir);

} // namespace ferry
