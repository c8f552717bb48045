#pragma once
// The command line (docs/cli.md). Each command lives in its own file and registers itself on
// the app with an add_*_command function; the command returns an ExitCode or an Error to
// cli_main, which prints the error and ends ferry (no command decides an exit status itself).
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "slurm_cli.hpp" // relative: main.cpp sees only include/
#include "ferry/archive.hpp"
#include "ferry/exit_code.hpp"
#include "ferry/job.hpp"
#include "ferry/reporter.hpp"

namespace ferry::cli {

struct GlobalOptions {
  std::string archive_path; // empty: Archive::default_path()
  std::vector<std::string> jobs_dirs;
  bool verbose = false;
};

// Where to run: docs/cli.md, "Targets".
struct TargetOptions {
  std::vector<std::string> hosts;
  std::string hosts_file;
  bool local = false;
  std::string identity;
  std::string known_hosts;
  std::string ssh_config;
  bool accept_new_host_key = false;
  double connect_timeout_s = 0; // 0: ConnectTimeout from the ssh config, else 10 s
  std::string remote_base;      // default: $HOME/.cache/ferry/runs on the host
  int retries = 1;
  SlurmCli slurm; // --slurm LOGIN and its options (docs/slurm.md)
};

using Action = std::function<Expected<ExitCode>()>;

struct Context {
  GlobalOptions global;
  Action action; // the command the user chose, set when its options are parsed

  [[nodiscard]] JobPath job_path() const { return JobPath::from_environment(global.jobs_dirs); }
  [[nodiscard]] std::filesystem::path archive_path() const
  {
    return global.archive_path.empty() ? Archive::default_path()
                                       : std::filesystem::path(global.archive_path);
  }

  // The reporter every output goes through: the terminal one unless a command asked for JSON.
  [[nodiscard]] Reporter& reporter();
  // JSON Lines, or the terminal reporter (showing job output raw with `raw_output`).
  void use_json(bool json, bool raw_output = false);

private:
  std::unique_ptr<Reporter> m_reporter;
};

// Makes `action` the one to run when `command` is chosen.
void on_chosen(CLI::App& command, Context& ctx, Action action);

void add_target_options(CLI::App& command, TargetOptions& target);

void add_run_command(CLI::App& app, Context& ctx);
void add_jobs_command(CLI::App& app, Context& ctx);
void add_new_command(CLI::App& app, Context& ctx);
void add_check_command(CLI::App& app, Context& ctx);
void add_log_command(CLI::App& app, Context& ctx);
void add_show_command(CLI::App& app, Context& ctx);
void add_export_command(CLI::App& app, Context& ctx);
void add_replay_command(CLI::App& app, Context& ctx);

int cli_main(int argc, char** argv);

} // namespace ferry::cli
