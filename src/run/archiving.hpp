#pragma once
// The one observer that archives runs, for every command that runs jobs and for `ferry mcp`:
// each finished run is recorded before the view sees it, and the tally makes the exit code.
#include <cstdint>
#include <functional>
#include <set>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "ferry/archive.hpp"
#include "ferry/exit_code.hpp"
#include "ferry/fleet.hpp"

namespace ferry {

struct ArchivingSettings {
  Archive* archive = nullptr; // none: the runs are not archived
  nlohmann::json client;      // the MCP client that asked for the runs, in each record; null: none
  // A problem with the archive (the runs go on), and what the user should know (a run spooled
  // to a file, old runs pruned).
  std::function<void(const Error&)> on_error;
  std::function<void(std::string_view)> on_note;
  // Said after the archive's message when it refused a run.
  std::string not_archived_hint = "this run's result is still shown below";
  // A refused run also carries a `not-archived` warning (for a reader of the record alone).
  bool warn_in_record = false;
};

class ArchivingObserver final : public RunObserver {
public:
  ArchivingObserver(ArchivingSettings settings, RunObserver& view);

  void batch_started(const BatchInfo& batch) override { m_view.batch_started(batch); }
  void run_started(const RunRef& run) override { m_view.run_started(run); }
  void run_note(const RunRef& run, std::string_view text) override { m_view.run_note(run, text); }
  void run_output(const RunRef& run, OutputStream stream, std::string_view bytes) override
  {
    m_view.run_output(run, stream, bytes);
  }
  void progress(const FleetProgress& progress) override { m_view.progress(progress); }
  void batch_finished() override { m_view.batch_finished(); }
  void run_finished(RunRecord& record) override;

  // `[archive] max_size` (`config_file` says where it was set): the oldest runs go once the
  // archive outgrows it, the newest always stays. Only after a run went into the archive.
  void keep_within(std::uint64_t max_size, std::string_view config_file);

  // The run went into the archive (not into a spool file, not refused).
  [[nodiscard]] bool archived(std::string_view run_id) const;
  [[nodiscard]] bool archived_any() const { return !m_archived.empty(); }

  // interrupted, else unreachable, else run_failed when any run was not ok, else ok.
  [[nodiscard]] ExitCode exit_code() const;

private:
  void record(RunRecord& record);

  ArchivingSettings m_settings;
  RunObserver& m_view;
  std::set<std::string, std::less<>> m_archived;
  bool m_failed = false;
  bool m_unreachable = false;
  bool m_interrupted = false;
};

} // namespace ferry
