#include "mcp/call.hpp"

#include <algorithm>
#include <cstdio>

#include "ferry/text.hpp"
#include "run/archiving.hpp"

namespace ferry::mcp {

namespace {

void stderr_line(std::string_view kind, std::string_view text)
{
  const std::string line = fmt::format("ferry mcp: {}{}\n", kind, terminal_safe(text));
  std::fwrite(line.data(), 1, line.size(), stderr);
}

// Passes every event on to the call's reporter and keeps each target's record. A detached
// run's only output is the launcher's `detached PID` line: not the job's, so not passed on.
class Collector final : public RunObserver {
public:
  Collector(RunObserver& view, const std::vector<std::string>& targets, bool detached)
      : m_view(view), m_targets(targets), m_runs(targets.size()), m_detached(detached)
  {
  }

  void run_started(const RunRef& run) override { m_view.run_started(run); }
  void run_output(const RunRef& run, OutputStream stream, std::string_view bytes) override
  {
    if (!m_detached) {
      m_view.run_output(run, stream, bytes);
    }
  }
  void run_note(const RunRef& run, std::string_view text) override { m_view.run_note(run, text); }
  void progress(const FleetProgress& progress) override { m_view.progress(progress); }
  void run_finished(RunRecord& record) override
  {
    m_view.run_finished(record);
    const auto at = std::find(m_targets.begin(), m_targets.end(), record.host_label);
    if (at != m_targets.end()) {
      m_runs[static_cast<std::size_t>(at - m_targets.begin())] = record;
    }
  }

  [[nodiscard]] std::vector<RunRecord> take() { return std::move(m_runs); }

private:
  RunObserver& m_view;
  const std::vector<std::string>& m_targets;
  std::vector<RunRecord> m_runs;
  bool m_detached;
};

} // namespace

ArchivingSettings archiving_settings(const CallArchive& archive, const nlohmann::json& client)
{
  ArchivingSettings settings;
  settings.archive = archive.archive;
  settings.client = client;
  settings.on_error = [](const Error& error) { stderr_line("error: ", error.message); };
  settings.on_note = [](std::string_view text) { stderr_line("", text); };
  settings.not_archived_hint = "the client gets the run's result without a resource";
  settings.warn_in_record = true;
  return settings;
}

CallOutcome run_call(SessionPool& pool, const CallArchive& archive, const CallSetup& setup,
                     RunObserver& observer)
{
  Collector collector(observer, setup.targets, setup.options.detach_keep_for_s.has_value());
  ArchivingObserver archiving(archiving_settings(archive, setup.client), collector);
  PooledSessions sessions(pool, setup.targets);
  run_fleet(sessions, {{setup.job, setup.params}}, k_parallel_targets, setup.options, archiving);
  if (archive.max_size) {
    archiving.keep_within(*archive.max_size, archive.config_file);
  }
  CallOutcome outcome{collector.take(), {}};
  for (const auto& run : outcome.runs) {
    outcome.archived.push_back(archiving.archived(run.run_id));
  }
  return outcome;
}

} // namespace ferry::mcp
