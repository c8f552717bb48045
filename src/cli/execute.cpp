#include "cli/execute.hpp"

#include <csignal>
#include <optional>

#include <unistd.h>

#include "cli/archive_config.hpp"
#include "ferry/archive.hpp"
#include "ferry/transport.hpp"

namespace ferry::cli {

namespace {

extern "C" void on_interrupt_signal(int /*signal*/)
{
  if (interrupt_requested()) {
    _exit(to_int(ExitCode::interrupted)); // a second signal: stop waiting for cleanup
  }
  request_interrupt();
}

// Archives every finished run before the view sees it, and keeps the tally for the exit code.
class ArchivingObserver final : public RunObserver {
public:
  ArchivingObserver(Context& ctx, RunObserver& view, bool archive) : m_ctx(ctx), m_view(view)
  {
    if (!archive) {
      return;
    }
    auto opened = Archive::open(ctx.archive_path());
    if (opened) {
      m_archive.emplace(std::move(opened).value());
    } else {
      ctx.reporter().error({opened.error().kind,
                            opened.error().message + " — runs go on, but they are not archived"});
    }
  }

  void batch_started(const BatchInfo& batch) override { m_view.batch_started(batch); }
  void run_started(const RunRef& run) override { m_view.run_started(run); }
  void run_note(const RunRef& run, std::string_view text) override { m_view.run_note(run, text); }
  void run_output(const RunRef& run, OutputStream stream, std::string_view bytes) override
  {
    m_view.run_output(run, stream, bytes);
  }
  void progress(const FleetProgress& progress) override { m_view.progress(progress); }
  void batch_finished() override { m_view.batch_finished(); }

  void run_finished(RunRecord& record) override
  {
    if (m_archive) {
      auto stored = m_archive->record(record);
      m_recorded |= stored && !stored->spooled_to;
      if (!stored) {
        m_ctx.reporter().error(
            {stored.error().kind,
             stored.error().message + " — this run's result is still shown below"});
      } else if (stored->spooled_to) {
        m_ctx.reporter().note(fmt::format(
            "{}; run {} was saved to {} instead, and goes into the archive the next time ferry "
            "opens it to record a run",
            stored->why, record.run_id, stored->spooled_to->string()));
      }
    }
    // The bytes of the run's files are in the archive now; views keep records, not bytes.
    record.blobs.clear();
    m_failed |= record.status != RunStatus::ok;
    m_unreachable |= record.unreachable;
    m_interrupted |= record.status == RunStatus::interrupted;
    m_view.run_finished(record);
  }

  // `[archive] max_size` in the config: the oldest runs go once the archive outgrows it. A
  // problem is reported and changes nothing else: the runs are done and recorded.
  void keep_within_configured_size()
  {
    if (!m_archive || !m_recorded) {
      return;
    }
    auto max_size = configured_archive_max_size();
    if (!max_size) {
      m_ctx.reporter().error(
          {max_size.error().kind, max_size.error().message + " — the archive was not pruned"});
      return;
    }
    if (!*max_size) {
      return;
    }
    // The newest run stays, so the run just made can be looked at whatever the size says.
    PruneOptions options;
    options.keep_last = 1;
    options.max_size = **max_size;
    auto pruned = m_archive->prune(options);
    if (!pruned) {
      m_ctx.reporter().error({pruned.error().kind, pruned.error().message});
    } else if (!pruned->removed.empty()) {
      m_ctx.reporter().note(
          fmt::format("archive over its max_size of {} ({}): removed the {} oldest run{} ({})",
                      size_text(**max_size), config_file_path().string(), pruned->removed.size(),
                      pruned->removed.size() == 1 ? "" : "s", size_text(pruned->removed_bytes)));
    }
  }

  [[nodiscard]] ExitCode exit_code() const
  {
    if (m_interrupted || interrupt_requested()) {
      return ExitCode::interrupted;
    }
    if (m_unreachable) {
      return ExitCode::unreachable;
    }
    return m_failed ? ExitCode::run_failed : ExitCode::ok;
  }

private:
  Context& m_ctx;
  RunObserver& m_view;
  std::optional<Archive> m_archive;
  bool m_recorded = false; // a run went into the archive (not into a spool file)
  bool m_failed = false;
  bool m_unreachable = false;
  bool m_interrupted = false;
};

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
  ArchivingObserver observer(ctx, view, batch.archive);
  run_fleet(sessions, runs, batch.parallel, run_options, observer, batch.swept);
  observer.keep_within_configured_size();
  std::fflush(stdout);
  return observer.exit_code();
}

} // namespace ferry::cli
