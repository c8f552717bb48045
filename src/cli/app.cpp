#include <cstdio>
#include <exception>

#include "cli/cli.hpp"
#include "ferry/version.hpp"

namespace ferry::cli {

void print_error(std::string_view message)
{
  std::fflush(stdout);
  fmt::print(stderr, "ferry: error: {}\n", message);
}

int cli_main(int argc, char** argv)
{
  CLI::App app{"ferry: run calculations and probes on remote hosts without a remote shell.\n"
               "A job is a file, its parameters are a file; both travel over SFTP, and the only "
               "thing a shell ever sees is `/bin/sh RUN_DIR/launch.sh`.",
               "ferry"};
  Context ctx;
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

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);
    return code == 0 ? 0 : to_int(ExitCode::usage);
  } catch (const std::exception& e) {
    print_error(e.what());
    return 1;
  }
  return ctx.exit_code;
}

} // namespace ferry::cli
