#pragma once
// What a run on the Slurm target asks the scheduler for (docs/slurm.md): from the command line,
// the job's `[slurm]` table and the user config file. Every value is checked against a strict
// pattern when it is read, and options travel to sbatch inside a file, one per line, never
// through a shell.
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "ferry/expected.hpp"

namespace ferry {

struct SlurmOptions {
  std::optional<std::string> partition; // one or several, comma-separated
  std::optional<std::string> gres;      // per node: gpu:8, gpu:a100:2, ...
  std::optional<std::string> gpus;      // for the whole job: N or TYPE:N
  std::optional<int> time_min;          // --time in minutes
  std::optional<std::string> account;
  std::optional<int> nodes;
  std::vector<std::string> args; // further sbatch options: --NAME or --NAME=VALUE, allow-listed

  [[nodiscard]] bool empty() const;
};

inline constexpr int k_slurm_max_nodes = 64;
inline constexpr int k_slurm_max_time_min = 365 * 24 * 60;

// The keys of a `[slurm]` table (job file or config file): partition, gres, gpus, time, account,
// nodes, args. The error (kind usage) names the key and the accepted form, not the place.
[[nodiscard]] Expected<void> set_slurm_option(SlurmOptions& options, std::string_view key,
                                              const nlohmann::json& value);

// Each checker returns the value as sbatch gets it, or a usage error naming `what`.
[[nodiscard]] Expected<std::string> check_slurm_partition(std::string_view value,
                                                          std::string_view what);
[[nodiscard]] Expected<std::string> check_slurm_gres(std::string_view value, std::string_view what);
[[nodiscard]] Expected<std::string> check_slurm_gpus(std::string_view value, std::string_view what);
[[nodiscard]] Expected<std::string> check_slurm_account(std::string_view value,
                                                        std::string_view what);
[[nodiscard]] Expected<int> check_slurm_time(long long minutes, std::string_view what);
[[nodiscard]] Expected<int> check_slurm_nodes(long long nodes, std::string_view what);
// "--NAME" or "--NAME=VALUE" for an sbatch option ferry allows (docs/slurm.md lists them).
[[nodiscard]] Expected<std::string> check_slurm_arg(std::string_view arg, std::string_view what);

// `high` over `low`, field by field. gres and gpus are one request: the higher source's replaces
// the lower's. args merge by option name, the higher source's value winning.
[[nodiscard]] SlurmOptions merge_slurm_options(const SlurmOptions& high, const SlurmOptions& low);

// {"partition": ..., "gres": ..., "gpus": ..., "time": MIN, "account": ..., "nodes": N,
// "args": [...]}, absent fields left out: what the run record keeps for replay.
[[nodiscard]] nlohmann::json slurm_options_json(const SlurmOptions& options);
[[nodiscard]] Expected<SlurmOptions> slurm_options_from_json(const nlohmann::json& json);

// The sbatch options these stand for, one argument each ("--partition=gpu").
[[nodiscard]] std::vector<std::string> sbatch_options(const SlurmOptions& options);

// --time for a job whose own timeout is `timeout_s`: whole minutes that leave the launcher time
// to stop the job itself (its grace and a margin), at least 1.
[[nodiscard]] int slurm_minutes_for(int timeout_s, int grace_s);

} // namespace ferry
