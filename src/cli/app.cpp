#include <cstdio>
#include <exception>

#include "cli/cli.hpp"
#include "ferry/version.hpp"

namespace ferry::cli {

Reporter& Context::reporter()
{
  if (!m_reporter) {
    m_reporter = make_terminal_reporter();
  }
  return *m_reporter;
}

void Context::use_json(bool json, TerminalOptions terminal)
{
  m_reporter = json ? make_json_reporter(stdout, stderr, terminal.stream)
                    : make_terminal_reporter(stdout, stderr, terminal);
}

void on_chosen(CLI::App& command, Context& ctx, Action action)
{
  command.callback([&ctx, action = std::move(action)] { ctx.action = action; });
}

namespace {

void add_commands(CLI::App& app, Context& ctx)
{
  app.set_version_flag("--version", std::string(version()));
  app.add_option("--archive", ctx.global.archive_path,
                 "archive database (default $FERRY_ARCHIVE, $XDG_DATA_HOME/ferry/archive.db, "
                 "~/.local/share/ferry/archive.db)");
  app.add_option("--jobs-dir", ctx.global.jobs_dirs, "look for jobs here first (repeatable)");
  app.add_flag("-v,--verbose", ctx.global.verbose, "show each step with its time");
  app.require_subcommand(1);
  app.fallthrough();
  app.footer(R"(Examples:
  ferry run kv_calc -p model=qwen3.5-397b-a17b -p tp=8 -p kv_memory_gib=17.4
  ferry run gpu_probe --host gpu1,gpu2 --json
  ferry jobs kv_calc
  ferry check --host gpu1
  ferry log --job kv_calc --limit 5
  ferry replay last)");
  add_run_command(app, ctx);
  add_jobs_command(app, ctx);
  add_new_command(app, ctx);
  add_check_command(app, ctx);
  add_log_command(app, ctx);
  add_show_command(app, ctx);
  add_export_command(app, ctx);
  add_replay_command(app, ctx);
  add_mcp_command(app, ctx);
}

// The command's outcome as the process's exit status; an error is printed once, here.
int finish(Context& ctx, const Expected<ExitCode>& outcome)
{
  if (outcome) {
    return to_int(*outcome);
  }
  ctx.reporter().error(outcome.error());
  return to_int(exit_code_for(outcome.error().kind));
}

} // namespace

int cli_main(int argc, char** argv)
{
  CLI::App app{"ferry: run calculations and probes on remote hosts without a remote shell.\n"
               "A job is a file, its parameters are a file; both travel over SFTP, and the only "
               "thing a shell ever sees is `/bin/sh RUN_DIR/launch.sh`.",
               "ferry"};
  Context ctx;
  add_commands(app, ctx);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // CLI11 prints help, the version or the parse error itself.
    return app.exit(e) == 0 ? to_int(ExitCode::ok) : to_int(ExitCode::usage);
  }
  try {
    return finish(ctx, ctx.action ? ctx.action() : Expected<ExitCode>(ExitCode::ok));
  } catch (const std::exception& e) {
    return finish(ctx, Unexpected{Error{ErrorKind::failed, e.what()}});
  }
}

} // namespace ferry::cli
