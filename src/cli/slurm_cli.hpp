#pragma once
// The Slurm target on the command line (docs/slurm.md): `--slurm LOGIN` and the options that go
// with it, the user config file's [slurm] table, and what `check` and `replay` add for it.
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "ferry/job.hpp"
#include "ferry/run_record.hpp"
#include "ferry/slurm_options.hpp"
#include "ferry/transport.hpp"

namespace ferry::cli {

struct TargetOptions;
struct Context;

struct SlurmCli {
  std::string login; // --slurm LOGIN
  std::string partition;
  std::string gres;
  std::string gpus;
  std::string account;
  std::optional<long long> time_min; // given: checked, even 0
  std::optional<long long> nodes;
  std::vector<std::string> args; // --slurm-arg
  // Set by commands, not options: `check` describes the cluster; `replay` re-submits with the
  // archived run's options (below the command line's).
  bool describe_cluster = false;
  std::optional<SlurmOptions> archived;
  // `run`: a sweep of one job, as one job array of this many points (one node each), at most
  // `array_throttle` tasks at once (0: no bound).
  int array_points = 0;
  int array_throttle = 0;

  [[nodiscard]] bool options_given() const;
};

void add_slurm_options(CLI::App& command, SlurmCli& slurm);

// Refuses Slurm options without --slurm, and --slurm together with --host/--hosts-file/--local.
[[nodiscard]] Expected<void> check_slurm_combination(const TargetOptions& target, bool hosts_given);

// One session per node of the Slurm target, the options checked and the config file read first.
// `jobs` are the runs' jobs: their [slurm] tables may say how many nodes.
[[nodiscard]] Expected<std::vector<std::unique_ptr<HostSession>>>
make_slurm_target_sessions(Context& ctx, const TargetOptions& target, std::span<const Job> jobs);

// The user config file: $XDG_CONFIG_HOME/ferry/config.toml, else ~/.config/ferry/config.toml.
[[nodiscard]] std::string user_config_path();
// Its [slurm] table (nothing when there is no file), checked like a job's.
[[nodiscard]] Expected<SlurmOptions> config_slurm_options(const std::string& path);

// How many sessions may run at once: all nodes of a Slurm allocation must (they share it).
[[nodiscard]] int batch_parallel(const TargetOptions& target, int parallel, std::size_t sessions);

// `replay`: the archived run's Slurm target, unless the command line names another target.
void use_archived_slurm_target(TargetOptions& target, const RunRecord& original);

// `attach`/`stop` of a detached run on a Slurm target (docs/slurm.md, "Detached runs"): a
// session on its login node, connected, that follows the job the record names; nullptr for a
// run on another target. `ssh`: the SSH options given now.
[[nodiscard]] Expected<std::unique_ptr<HostSession>>
detached_slurm_session(Context& ctx, const HostTargets& ssh, const RunRecord& run);

// `ps`: what a detached Slurm run is now (pending, running, finished, gone; `unreachable: WHY`
// when the login node or squeue does not answer); nullopt for a run on another target.
[[nodiscard]] std::optional<std::string> detached_slurm_ps(Context& ctx, const HostTargets& ssh,
                                                           const RunRecord& run);

// `check`: the line for a run on the Slurm target; nullopt for other targets.
[[nodiscard]] std::optional<std::string> slurm_check_text(const RunRecord& record);

} // namespace ferry::cli
