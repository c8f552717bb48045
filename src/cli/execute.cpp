#include "cli/execute.hpp"

#include <csignal>
#include <optional>

#include <unistd.h>

#include "cli/archive_config.hpp"
#include "ferry/archive.hpp"
#include "ferry/transport.hpp"
#include "run/archiving.hpp"

namespace ferry::cli {

namespace {

extern "C" void on_interrupt_signal(int /*signal*/)
{
  if (interrupt_requested()) {
    _exit(to_int(ExitCode::interrupted)); // a second signal: stop waiting for cleanup
  }
  request_interrupt();
}

// The archive the runs go into; an archive that cannot be opened is reported and the runs go
// on without it.
std::optional<Archive> open_archive(Context& ctx, bool archive)
{
  if (!archive) {
    return std::nullopt;
  }
  auto opened = Archive::open(ctx.archive_path());
  if (!opened) {
    ctx.reporter().error(
        {opened.error().kind, opened.error().message + " — runs go on, but they are not archived"});
    return std::nullopt;
  }
  return std::move(opened).value();
}

// `[archive] max_size` in the config: a problem is reported and changes nothing else (the runs
// are done and recorded).
void keep_within_configured_size(Context& ctx, ArchivingObserver& observer)
{
  auto max_size = configured_archive_max_size();
  if (!max_size) {
    ctx.reporter().error(
        {max_size.error().kind, max_size.error().message + " — the archive was not pruned"});
  } else if (*max_size) {
    observer.keep_within(**max_size, config_file_path().string());
  }
}

} // namespace

void install_interrupt_handlers()
{
  struct sigaction action {};
  action.sa_handler = on_interrupt_signal;
  sigemptyset(&action.sa_mask);
  sigaction(SIGINT, &action, nullptr);
  sigaction(SIGTERM, &action, nullptr);
  std::signal(SIGPIPE, SIG_IGN);
}

ExitCode execute_runs(Context& ctx, std::vector<std::unique_ptr<HostSession>>& sessions,
                      const std::vector<PlannedRun>& runs, const RunOptions& run_options,
                      const BatchOptions& batch, RunObserver& view)
{
  install_interrupt_handlers();
  auto archive = open_archive(ctx, batch.archive);
  ArchivingSettings settings;
  settings.archive = archive ? &*archive : nullptr;
  settings.on_error = [&ctx](const Error& error) { ctx.reporter().error(error); };
  settings.on_note = [&ctx](std::string_view text) { ctx.reporter().note(text); };
  ArchivingObserver observer(std::move(settings), view);
  RunOptions options = run_options;
  if (!options.invocation) {
    options.invocation = new_run_id(); // the id's form: when the invocation started
  }
  run_fleet(sessions, runs, batch.parallel, options, observer, batch.swept);
  if (observer.archived_any()) {
    keep_within_configured_size(ctx, observer);
  }
  std::fflush(stdout);
  return observer.exit_code();
}

} // namespace ferry::cli
