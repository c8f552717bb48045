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

#include "ferry/archive.hpp"
#include "ferry/exit_code.hpp"
#include "ferry/job.hpp"
#include "ferry/reporter.hpp"
#include "ferry/user_config.hpp"
#include "run/environment.hpp"
#include "run/targets.hpp"
#include "slurm_cli.hpp" // relative: main.cpp sees only include/

namespace ferry::cli {

struct GlobalOptions {
  std::string archive_path; // empty: Archive::default_path()
  std::vector<std::string> jobs_dirs;
  bool verbose = false;
};

// Where to run: docs/cli.md, "Targets": the SSH and local targets (resolved in run/targets.hpp,
// for every command alike) and the Slurm one.
struct TargetOptions : HostTargets {
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

  // The user's config file, read once (docs/config.md); a bad file is a usage error.
  [[nodiscard]] Expected<const UserConfig*> user_config()
  {
    if (!m_config) {
      FERRY_TRY_ASSIGN(m_config, load_user_config(default_user_config_path()));
    }
    return &*m_config;
  }

  // The reporter every output goes through: the terminal one unless a command asked for JSON.
  [[nodiscard]] Reporter& reporter();
  // JSON Lines (with output events when `terminal.stream`), or the terminal reporter.
  void use_json(bool json, TerminalOptions terminal = {});

private:
  std::unique_ptr<Reporter> m_reporter;
  std::optional<UserConfig> m_config;
};

// Makes `action` the one to run when `command` is chosen.
void on_chosen(CLI::App& command, Context& ctx, Action action);

void add_target_options(CLI::App& command, TargetOptions& target);
// The SSH group of them (--identity ... --remote-base), for commands that name hosts only.
void add_ssh_options(CLI::App& command, HostTargets& target);
// --env and --interpreter (run/environment.hpp resolves them with the config file).
void add_environment_options(CLI::App& command, EnvironmentOptions& environment);

void add_run_command(CLI::App& app, Context& ctx);
void add_jobs_command(CLI::App& app, Context& ctx);
void add_new_command(CLI::App& app, Context& ctx);
void add_check_command(CLI::App& app, Context& ctx);
void add_log_command(CLI::App& app, Context& ctx);
void add_show_command(CLI::App& app, Context& ctx);
void add_export_command(CLI::App& app, Context& ctx);
void add_replay_command(CLI::App& app, Context& ctx);
void add_prune_command(CLI::App& app, Context& ctx);
void add_mcp_command(CLI::App& app, Context& ctx);
void add_completion_command(CLI::App& app, Context& ctx);
void add_connect_command(CLI::App& app, Context& ctx);
void add_disconnect_command(CLI::App& app, Context& ctx);
void add_detached_commands(CLI::App& app, Context& ctx); // attach, stop, ps
// `ferry __hold SPEC`: a connection holder (started by ferry itself; docs/persistence.md).
[[nodiscard]] int holder_main(std::string_view spec);

// The commands `ferry help` lists (hidden internal ones left out), and one of them by name.
[[nodiscard]] std::vector<const CLI::App*> visible_commands(const CLI::App& app);
[[nodiscard]] const CLI::App* find_command(const CLI::App& app, std::string_view name);
// An option that takes a value (`--host H`), as opposed to a flag or a positional.
[[nodiscard]] bool takes_value(const CLI::Option& option);
// "ferry 0.1.0 (libssh 0.10.6/openssl/zlib, SQLite 3.40.1)".
[[nodiscard]] std::string version_text();

// What an option's value or a positional argument stands for, as completion offers it.
enum class ValueKind {
  unknown, // not in the table: a test makes sure no option of ferry's is
  free_text,
  job,
  run,
  param,
  file,
  file_or_stdin,
  dir,
  host,
  choice,
  command,
};
struct CompletionKind {
  ValueKind kind = ValueKind::unknown;
  std::vector<std::string> choices; // for ValueKind::choice
};
[[nodiscard]] CompletionKind completion_kind(const CLI::Option& option);

// Every command and option, as ferry's own `--help` has them (cli_main builds the app with it).
void add_commands(CLI::App& app, Context& ctx);

// ferry(1) in roff, written to `file` (stdout when empty), from the same app as `--help`.
[[nodiscard]] int write_man_page(const CLI::App& app, const std::string& file);

// `ferry __complete -- WORDS…` (what the completion scripts ask) and `ferry __man [FILE]` (the
// man page, generated at build time): hidden commands answered before the command line is
// parsed. nullopt when `args` names neither.
[[nodiscard]] std::optional<int> run_internal_command(const CLI::App& app,
                                                      const std::vector<std::string>& args);

int cli_main(int argc, char** argv);

} // namespace ferry::cli
